"""The report card of a course model (hand-written, not exported; chapter 13's measurements):
`transformer-course report [--checkpoint PATH] [--out DIR]`.

One card per model: its size and recipe, bits per character on the held-out plays, each task's exact
match with its Wilson interval and its chance and majority baselines, pass@k, calibration (a
reliability diagram and its expected calibration error), a few greedy replies, and the decode speed
on this machine (named). A base model (chapter 06) is asked its own task, the next character of the
held-out plays; a chat model (chapters 11-12) chapter 11's four tasks and chapter 12's strange words.
`write_report` writes ``report.html`` (plots embedded as base64 PNG), its Markdown twin ``report.md``
(plots beside it as PNG files) and ``report.json`` (every figure, for `compare`).
"""

from __future__ import annotations

import base64
import collections
import hashlib
import html
import io
import json
import os
import platform
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

SHIPPED = (("base", "shakespeare_char"), ("SFT", "shakespeare_chat"), ("DPO", "shakespeare_dpo"),
           ("GRPO", "shakespeare_grpo"))
HELD_CHARS = 32_000  # held-out characters scored: the start of chapter 06's validation split (the last 10%)
STRANGE_WORDS, SAMPLES, KS = 400, 8, (1, 8)  # chapter 12's held-out strange words; replies sampled per word
PROMPTS = ("upper: gentle", "reverse: qzkvb", "count: mirth", "who says: I do beseech you, sir,")
DECODE_TOKENS = 128
# how far a regenerated figure may move from the stored card (a figure's name ends with its key)
TOLERANCE = {"bits_per_char": 0.01, "perplexity": 0.1, "exact_match": 0.02, "pass_at_1": 0.04, "pass_at_8": 0.04,
             "ece": 0.02, "parameters": 0}


@dataclass
class Subject:
    """A model to report on: `kind` "base" (predicts characters) or "chat" (a ChatTokenizer)."""

    name: str
    kind: str
    model: torch.nn.Module
    tokenizer: object
    recipe: dict = field(default_factory=dict)
    source: str = ""


def _recipe(facts: dict) -> dict:
    """The recipe entries worth a line on the card, from a manifest or a checkpoint's facts."""
    keep = ("preset", "steps", "lr", "beta", "sft_weight", "kl_coef", "pairs", "final_val_loss")
    recipe = {k: facts[k] for k in keep if k in facts}
    if isinstance(facts.get("recipe"), dict) and "function" in facts["recipe"]:
        recipe["trained by"] = facts["recipe"]["function"]
    if isinstance(facts.get("train_config"), dict):
        config = facts["train_config"]
        recipe.update({k: config[k] for k in ("max_iters", "batch_size", "learning_rate") if k in config})
    return recipe


def shipped_subjects() -> list[Subject]:
    """The course's shipped base, SFT, DPO and GRPO models (SHA-256 checked)."""
    from .course_model import load_chat_model, load_course_model, manifest

    base = load_course_model()
    subjects = [Subject("base", "base", base.model, base.tokenizer, _recipe(manifest()), "shakespeare_char.pt")]
    for name, file in SHIPPED[1:]:
        chat = load_chat_model(shipped=file)
        subjects.append(Subject(name, "chat", chat.model, chat.tokenizer, _recipe(chat.manifest), f"{file}.pt"))
    return subjects


def subject_from(path) -> Subject:
    """A checkpoint of chapter 06 (`save_checkpoint`, `transformer-course train`) or a chat model
    (`save_chat_model`, chapters 11-12), read by chapter 11's export reader (every check of the loaders)."""
    from .assistant import ChatTokenizer
    from .hf_export import read_for_export

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}: give a file written by `transformer-course train` "
                                "(checkpoint.pt) or by save_chat_model")
    model, tokenizer, facts = read_for_export(path)
    recipe = _recipe({**(facts.get("facts") or {}), "train_config": facts.get("train_config")})
    kind = "chat" if isinstance(tokenizer, ChatTokenizer) else "base"
    return Subject(path.stem, kind, model.eval(), tokenizer, recipe, path.name)


def _chars(subject: Subject) -> int | None:
    """How many logits are characters (a chat model's turn tokens are not)."""
    return subject.tokenizer.base.vocab_size if subject.kind == "chat" else None


def _row(task: str, right: int, n: int, chance: float | None, majority: float | None) -> dict:
    from .evaluation import wilson_interval

    low, high = wilson_interval(right, n)
    return {"task": task, "right": right, "n": n, "exact_match": right / n, "low": low, "high": high,
            "chance": chance, "majority": majority}


def _held_ids(subject: Subject, held_text: str) -> torch.Tensor:
    return torch.tensor(subject.tokenizer.encode(held_text[: HELD_CHARS + 1]))


def _bits(subject: Subject, ids: torch.Tensor) -> dict:
    from .evaluation import heldout_bits

    per_id = heldout_bits(subject.model, ids, chars=_chars(subject))
    bits = per_id * len(ids) / (HELD_CHARS + 1)  # per character, whatever a token holds
    return {"bits_per_char": bits, "perplexity": 2 ** bits}


def _base_tasks(subject: Subject, ids: torch.Tensor, train_text: str) -> tuple[list[dict], dict]:
    """The next character of the held-out plays as a task: top-1 exact match, its baselines, calibration."""
    from .evaluation import next_char_confidence

    confidence, right = next_char_confidence(subject.model, ids, _chars(subject))
    top = collections.Counter(train_text).most_common(1)[0][0]
    targets = ids[1: len(right) + 1]
    majority = float((targets == torch.tensor(subject.tokenizer.encode(top))[0]).double().mean())
    chance = 1 / subject.model.cfg.vocab_size
    row = _row("next character (held-out plays)", int(right.sum()), len(right), chance, majority)
    return [row], _calibration(confidence, right, "the probability of its most likely next character")


def _chat_tasks(subject: Subject, tasks, strange) -> tuple[list[dict], dict, dict]:
    """Chapter 11's four tasks and chapter 12's strange words: exact match, pass@k, calibration."""
    from .evaluation import baselines, pass_at_k, pass_counts, reply_confidence, task_counts

    rows = []
    for kind, (right, n) in task_counts(subject.model, subject.tokenizer, tasks.held).items():
        floor = baselines(tasks.train[kind], tasks.held[kind])
        rows.append(_row(f"{kind} (chapter 11)", right, n, floor["chance"], floor["majority"]))
    confidence, right = reply_confidence(subject.model, subject.tokenizer, strange)
    rows.append(_row("strange words (chapter 12)", int(right.sum()), len(strange), None, 0.0))
    counts = pass_counts(subject.model, subject.tokenizer, strange, SAMPLES)
    passes = {f"pass_at_{k}": sum(pass_at_k(SAMPLES, c, k) for c in counts) / len(counts) for k in KS}
    return rows, passes, _calibration(confidence, right, "the probability of its whole greedy reply")


def _calibration(confidence: torch.Tensor, right: torch.Tensor, what: str) -> dict:
    from .evaluation import calibration_error, reliability_bins

    mean_conf, share, count = reliability_bins(confidence, right, 10)
    return {"what": what, "ece": calibration_error(mean_conf, share, count), "mean_confidence": mean_conf.tolist(),
            "share_right": share.tolist(), "count": count.tolist()}


def _samples(subject: Subject) -> list[tuple[str, str]]:
    from .assistant import answers
    from .generation import generate

    if subject.kind == "chat":
        return list(zip(PROMPTS, answers(subject.model, subject.tokenizer, list(PROMPTS)), strict=True))
    prompt = "ROMEO:\n"
    idx = torch.tensor([subject.tokenizer.encode(prompt)])
    out = generate(subject.model, idx, 120, temperature=0.0)[0, idx.shape[1]:].tolist()
    return [(prompt, subject.tokenizer.decode(out))]


def machine() -> str:
    """This machine in words: CPU, cores, PyTorch threads and release."""
    from .course_model import _cpu_name

    return (f"{_cpu_name()} ({os.cpu_count()} CPUs), {torch.get_num_threads()} PyTorch thread(s), "
            f"torch {torch.__version__}, Python {platform.python_version()}")


@torch.no_grad()
def _decode_speed(subject: Subject) -> float:
    """Tokens per second, greedy with the KV cache, one sequence of DECODE_TOKENS after a one-token prompt."""
    from .generation import generate

    idx = torch.zeros(1, 1, dtype=torch.long)
    generate(subject.model, idx, 8, temperature=0.0)  # warm up
    began = time.perf_counter()
    generate(subject.model, idx, DECODE_TOKENS, temperature=0.0)
    return DECODE_TOKENS / (time.perf_counter() - began)


def _check_chat_context(subject: Subject, data: dict) -> None:
    """A ValueError, before anything is measured, when a chat model's context cannot hold the card's longest
    question with its turn markers (the model itself would fail on it, naming no fix)."""
    from .assistant import render_chat

    prompts = [e.prompt for examples in data["tasks"].held.values() for e in examples]
    prompts += [e.prompt for e in data["strange"]] + list(PROMPTS)
    need = max(len(render_chat([{"role": "user", "content": p}], subject.tokenizer, True)[0]) for p in prompts)
    if subject.model.cfg.block_size < need:
        raise ValueError(f"{subject.source}: its context of {subject.model.cfg.block_size} tokens cannot hold the "
                         f"card's longest question ({need} tokens with its turn markers; chapter 11's tasks and "
                         f"chapter 12's strange words): a chat model's card needs a context of at least {need}")


def measure(subject: Subject, data: dict, progress=None) -> dict:
    """Every figure of `subject`'s card. `data`: the texts and task sets (`load_data`)."""
    step = progress.update if progress is not None else (lambda n=1: None)
    if subject.kind == "chat":
        _check_chat_context(subject, data)
    ids = _held_ids(subject, data["held_text"])
    cfg = subject.model.cfg
    card = {"name": subject.name, "kind": subject.kind, "source": subject.source, "recipe": subject.recipe,
            "parameters": sum(p.numel() for p in subject.model.parameters()),
            "shape": f"{cfg.n_layer} layers x {cfg.n_head} heads, width {cfg.d_model}, context {cfg.block_size}, "
                     f"{cfg.vocab_size} ids", **_bits(subject, ids)}
    step()
    if subject.kind == "chat":
        card["tasks"], card["pass_at"], card["calibration"] = _chat_tasks(subject, data["tasks"], data["strange"])
    else:
        card["tasks"], card["calibration"] = _base_tasks(subject, ids, data["train_text"])
        card["pass_at"] = {}
    step()
    card["samples"], card["tokens_per_second"] = _samples(subject), _decode_speed(subject)
    step()
    return card


def load_data() -> dict:
    """The held-out plays (chapter 06's split), chapter 11's tasks and chapter 12's strange words."""
    from .assistant import make_tasks
    from .data import load_shakespeare, train_val_split
    from .preferences import HELD_OUT_SEED, strange_words

    text = load_shakespeare()
    train_text, held_text = train_val_split(text)
    return {"train_text": train_text, "held_text": held_text, "tasks": make_tasks(text),
            "strange": strange_words(STRANGE_WORDS, seed=HELD_OUT_SEED)}


def reliability_png(card: dict) -> bytes:
    """The card's reliability diagram as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cal = card["calibration"]
    used = [i for i, n in enumerate(cal["count"]) if n]
    fig, ax = plt.subplots(figsize=(4.2, 3.4), dpi=80)
    ax.plot([0, 1], [0, 1], "--", color="grey", label="calibrated")
    ax.plot([cal["mean_confidence"][i] for i in used], [cal["share_right"][i] for i in used], "o-", label=card["name"])
    total = sum(cal["count"])
    ax.bar([(i + 0.5) / 10 for i in range(10)], [n / total for n in cal["count"]], width=0.09, alpha=0.25,
           label="share of answers")
    ax.set(xlabel="the model's probability", ylabel="share right", title=f"{card['name']}: ECE {cal['ece']:.3f}")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def figures(cards: list[dict]) -> dict[str, float]:
    """Every number of the cards that a regenerated card is compared on, by name ("SFT/upper (chapter
    11)/exact_match", "base/bits_per_char")."""
    out = {}
    for card in cards:
        name = card["name"]
        out.update({f"{name}/{k}": card[k] for k in ("parameters", "bits_per_char", "perplexity")})
        out.update({f"{name}/{row['task']}/exact_match": row["exact_match"] for row in card["tasks"]})
        out.update({f"{name}/{k}": v for k, v in card["pass_at"].items()})
        out[f"{name}/calibration/ece"] = card["calibration"]["ece"]
    return out


def compare(got: dict[str, float], stored: dict[str, float]) -> list[str]:
    """One line per figure beyond its TOLERANCE (or missing): empty when the cards agree."""
    problems = [f"{name}: missing (stored {want})" for name, want in stored.items() if name not in got]
    for name, value in got.items():
        if name in stored:
            tol = TOLERANCE[name.rsplit("/", 1)[1]]
            if abs(value - stored[name]) > tol:
                problems.append(f"{name}: {value:.4g}, stored {stored[name]:.4g} (tolerance {tol:g})")
    return problems


def _percent(x: float | None) -> str:
    return "" if x is None else f"{x:.1%}"


def _card_lines(card: dict, image: str) -> list[str]:
    """One card in Markdown (`image`: the file name of its reliability diagram)."""
    recipe = ", ".join(f"{k} {v}" for k, v in card["recipe"].items()) or "not recorded"
    lines = [f"## {card['name']} ({card['kind']} model, `{card['source']}`)", "",
             f"- Size: {card['parameters']:,} parameters; {card['shape']}.", f"- Recipe: {recipe}.",
             f"- Held-out plays: **{card['bits_per_char']:.3f} bits per character** (perplexity "
             f"{card['perplexity']:.2f}) over the first {HELD_CHARS:,} characters of chapter 06's validation split.",
             f"- Decode speed: {card['tokens_per_second']:,.0f} tokens per second (greedy, KV cache, batch 1).", "",
             "| task | exact match | 95% interval (Wilson) | right / asked | chance | majority |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['task']} | {_percent(r['exact_match'])} | {r['low']:.1%} - {r['high']:.1%} | {r['right']} / "
              f"{r['n']} | {_percent(r['chance'])} | {_percent(r['majority'])} |" for r in card["tasks"]]
    if card["pass_at"]:
        lines += ["", f"pass@k on the {STRANGE_WORDS} strange words ({SAMPLES} replies sampled at temperature 1 per "
                  "word, unbiased estimator): " + ", ".join(f"pass@{k.rsplit('_', 1)[1]} {v:.1%}"
                                                            for k, v in card["pass_at"].items()) + "."]
    cal = card["calibration"]
    lines += ["", f"Calibration ({cal['what']}): expected calibration error **{cal['ece']:.3f}**.", "",
              f"![reliability diagram of {card['name']}]({image})", "", "Greedy replies:", ""]
    lines += [f"- `{prompt!r}` -> `{reply!r}`" for prompt, reply in card["samples"]]
    return lines + [""]


def markdown(cards: list[dict], where: str, images: list[str]) -> str:
    head = ["# Report card", "", f"Measured on {where}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
            "Exact match: greedy replies equal to the one right answer. Intervals: Wilson's, 95%, over the "
            "questions asked (not over training runs). Chance: one of the distinct training answers at random; "
            "majority: the commonest training answer, always. Written by `transformer-course report` (chapter 13).", ""]
    return "\n".join(head + [line for card, image in zip(cards, images, strict=True)
                             for line in _card_lines(card, image)])


def _html_from_markdown(text: str, pngs: dict[str, bytes]) -> str:
    """The Markdown of `markdown` as one HTML page, images inlined (base64): headings, lists, tables,
    bold and code, which is all the card uses."""
    import re

    def inline(s: str) -> str:
        s = html.escape(s)
        s = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", s)
        return re.sub(r"`(.+?)`", r"<code>\1</code>", s)

    body, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            if not set(line) <= set("|-: "):
                rows.append([c.strip() for c in line.strip("|").split("|")])
            continue
        if rows:
            cells = ["".join(f"<{t}>{inline(c)}</{t}>" for c in r) for t, r in
                     [("th", rows[0])] + [("td", r) for r in rows[1:]]]
            body.append("<table>" + "".join(f"<tr>{c}</tr>" for c in cells) + "</table>")
            rows = []
        if image := re.fullmatch(r"!\[(.*)\]\((.*)\)", line):
            data = base64.b64encode(pngs[image[2]]).decode()
            body.append(f'<img alt="{html.escape(image[1])}" src="data:image/png;base64,{data}">')
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{inline(line[level:].strip())}</h{level}>")
        elif line.startswith("- "):
            body.append(f"<ul><li>{inline(line[2:])}</li></ul>")
        elif line:
            body.append(f"<p>{inline(line)}</p>")
    style = ("body{font-family:sans-serif;max-width:900px;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}td:first-child{text-align:left}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Report card</title><style>{style}</style>"
            f"</head><body>\n" + "\n".join(body) + "\n</body></html>\n")


# ---------------------------------------------------------------- writing into the user's folder
def _image_name(card_name: str) -> str:
    """The reliability diagram's file name: the card's name, each character but letters, digits, '.', '_' and
    '-' made '_' (a file name read back from Markdown, whatever the checkpoint's file was called)."""
    return f"reliability_{re.sub(r'[^A-Za-z0-9._-]', '_', card_name)}.png"


def report_files(names: list[str]) -> list[str]:
    """The files a report card of the cards `names` writes."""
    return ["report.html", "report.md", "report.json", *(_image_name(n) for n in names)]


def _earlier_files(out: Path, manifest: str) -> dict[str, str | None]:
    """The files an earlier run wrote into `out`, name -> SHA-256 of what it wrote, from its `manifest` (None:
    known by name only, a card written before the hashes were kept); {} when there is no such run."""
    path = out / manifest
    try:
        data = None if path.is_symlink() or not path.is_file() else json.loads(path.read_bytes())
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        return {}
    if isinstance(data.get("files"), dict):
        return {**{str(k): v for k, v in data["files"].items()}, manifest: None}
    if manifest == "report.json" and isinstance(data.get("cards"), list) and "figures" in data:
        return dict.fromkeys(report_files([str(c.get("name")) for c in data["cards"] if isinstance(c, dict)]))
    return {}


def check_out(out, names: list[str], manifest: str, flag: str = "--out") -> Path:
    """The folder `out` (made if need be), once it is known that the files `names` can be written into it
    without losing anything this command did not write: a name already there must be a file of an earlier run
    (`manifest` lists it), unchanged since. A ValueError or OSError naming `flag` and the fix otherwise."""
    out = Path(out)
    if out.is_symlink() and not out.exists():
        raise ValueError(f"{flag} {out} is a symbolic link to {os.readlink(out)}, which does not exist: give a folder")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{flag} {out} is a file, not a folder: give a folder (it will hold {', '.join(names)})")
    earlier = _earlier_files(out, manifest) if out.is_dir() else {}
    for name in names:
        path = out / name
        if not (path.exists() or path.is_symlink()):
            continue
        if path.is_symlink() or not path.is_file():
            why = "a symbolic link" if path.is_symlink() else "a folder"
        elif name not in earlier:
            why = "a file this command did not write"
        elif earlier[name] is not None and hashlib.sha256(path.read_bytes()).hexdigest() != earlier[name]:
            why = "a file this command wrote, changed since"
        else:
            continue
        raise ValueError(f"{flag} {out} already holds {name}, {why}: it is left as it is, and nothing was written; "
                         "give a new or empty folder, or an earlier run's, or move that file away")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):  # a real file: permissions, read-only disks
            pass
    except OSError as error:
        raise OSError(f"cannot write into {flag} {out} ({error.strerror or error}): choose a folder you can write "
                      "to") from None
    return out


def write_files(out: Path, files: dict[str, bytes], flag: str = "--out") -> None:
    """Write `files` (name -> contents) into the folder `out`, each whole: all are written beside their names
    first, then each moved over its name, so a full disk leaves no half-written file (nor any new one)."""
    temps: dict[str, str] = {}
    replaced: list[str] = []
    try:
        for name, data in files.items():
            handle, temps[name] = tempfile.mkstemp(dir=out, prefix=f".{name}.", suffix=".partial")
            with os.fdopen(handle, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
        for name in list(temps):
            os.replace(temps.pop(name), out / name)
            replaced.append(name)
    except OSError as error:
        done = f"only {', '.join(replaced)} replaced" if replaced else "no file in it was changed"
        raise OSError(f"cannot write into {flag} {out} ({error.strerror or error}): {done}; free some space or "
                      "choose another folder") from None
    finally:
        for temp in temps.values():
            try:
                os.unlink(temp)
            except OSError:
                pass


def write_report(cards: list[dict], out, where: str | None = None) -> tuple[Path, Path]:
    """Write report.html, report.md, report.json and the PNGs into the folder `out` (`check_out`: nothing this
    command did not write is replaced); (html, md) paths. report.json keeps the SHA-256 of the others."""
    out = check_out(out, report_files([card["name"] for card in cards]), "report.json")
    where = where or machine()
    pngs = {_image_name(card["name"]): reliability_png(card) for card in cards}
    text = markdown(cards, where, list(pngs))
    files = {**pngs, "report.md": text.encode("utf-8"),
             "report.html": _html_from_markdown(text, pngs).encode("utf-8")}
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    files["report.json"] = json.dumps({"machine": where, "figures": figures(cards), "cards": cards,
                                       "files": digests}, indent=1).encode("utf-8")
    write_files(out, files)
    return out / "report.html", out / "report.md"


def run_report(checkpoint=None, out="report_card", progress: bool = True) -> tuple[Path, Path]:
    """Measure the shipped models (`checkpoint` None) or the model in `checkpoint`, with a progress bar,
    and write their report card into `out` (checked before anything is measured; a folder made for it and
    left empty, by Ctrl-C say, is removed)."""
    from tqdm.auto import tqdm

    subjects = shipped_subjects() if checkpoint is None else [subject_from(checkpoint)]
    made = not os.path.lexists(out)
    folder = check_out(out, report_files([subject.name for subject in subjects]), "report.json")
    try:
        data = load_data()
        with tqdm(total=3 * len(subjects), desc="report card", unit="step", disable=not progress) as bar:
            cards = [measure(subject, data, bar) for subject in subjects]
        return write_report(cards, folder)
    except BaseException:
        if made:
            try:
                folder.rmdir()  # only if still empty
            except OSError:
                pass
        raise


# ---------------------------------------------------------------- the field's harness as a second opinion
_GENERATE = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["<|end|>"]
  do_sample: false
  max_gen_toks: {tokens}
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""
TASKS_MANIFEST = "course_tasks.json"  # what `harness_tasks` wrote, with each file's SHA-256
_ROLLING = """task: course_plays
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: bits_per_byte
    aggregation: bits_per_byte
    higher_is_better: false
"""


def _yaml_path(path: Path) -> str:
    """`path` as a YAML scalar whatever its characters (": ", "#", quotes): a JSON string is YAML's double-quoted."""
    return json.dumps(str(path))


def harness_tasks(folder, data: dict | None = None) -> list[str]:
    """Write the card's tasks into `folder` as an offline custom task set of EleutherAI's
    lm-evaluation-harness (a YAML and a JSONL per task, and TASKS_MANIFEST: what was written, so that a
    second run replaces its own files only; nothing is downloaded), and return the task names.

    course_upper, course_reverse, course_count, course_speaker (chapter 11's held-out examples) and
    course_strange (chapter 12's strange words) are greedy exact match on prompts written in the chat
    format, for an exported chat model; course_plays is the held-out plays as one document, for bits per
    byte (= per character: the plays are ASCII). Run::

        lm_eval run --model hf --model_args pretrained=EXPORT,dtype=float32 --include_path FOLDER --tasks ...

    A base model's export declares no beginning-of-text token, which the harness puts before every
    log-likelihood request: give it one with ``prefix_token_id=ID``, the id of "\\n". The exact-match tasks
    also run against `transformer-course serve` (``--model local-completions --model_args
    model=NAME,base_url=http://HOST:PORT/v1/completions,tokenized_requests=False,tokenizer_backend=None``);
    course_plays needs the prompt's log-probabilities, which the server does not give.
    """
    from .assistant import SPECIALS

    data = data or load_data()
    user, assistant, end = SPECIALS
    sets = {f"course_{kind}": (examples, 16) for kind, examples in data["tasks"].held.items()}
    sets["course_strange"] = (data["strange"], 12)
    names = [*sets, "course_plays"]
    folder = check_out(folder, [f"{n}.{e}" for n in names for e in ("yaml", "jsonl")] + [TASKS_MANIFEST],
                       TASKS_MANIFEST, "--harness-tasks").resolve()
    files = {}
    for name, (examples, tokens) in sets.items():
        rows = [{"prompt": f"{user}{e.prompt}{end}{assistant}", "answer": e.answer} for e in examples]
        files[f"{name}.jsonl"] = "".join(json.dumps(r) + "\n" for r in rows)
        files[f"{name}.yaml"] = _GENERATE.format(name=name, data=_yaml_path(folder / f"{name}.jsonl"), tokens=tokens)
    # the characters heldout_bits predicts: those after the first of the HELD_CHARS + 1 the card reads
    files["course_plays.jsonl"] = json.dumps({"text": data["held_text"][1: HELD_CHARS + 1]}) + "\n"
    files["course_plays.yaml"] = _ROLLING.format(data=_yaml_path(folder / "course_plays.jsonl"))
    written = {name: text.encode("utf-8") for name, text in files.items()}
    written[TASKS_MANIFEST] = json.dumps({"written_by": "transformer-course report --harness-tasks", "files": {
        name: hashlib.sha256(data).hexdigest() for name, data in written.items()}}, indent=1).encode("utf-8")
    write_files(folder, written, "--harness-tasks")
    return names
