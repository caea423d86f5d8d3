"""The course's trained models: trained once by the course's own code and shipped inside the package
(hand-written, not exported).

Chapters after 06 start from these instead of training again, so a learner meets models that already
work, the chapters run faster, and their stored outputs do not depend on how a training run rounds on
one CPU or another (training repeats millions of float32 operations whose last bits depend on the
instruction set; loading a file does not).

- ``shakespeare_char``: chapter 06's character-level GPT, exactly its recipe: ``PRESETS["tiny"]``
  (4 blocks, 4 heads, C = 128, context 64, no biases; about 0.8 M parameters) trained with
  ``TRAIN_PRESETS["tiny"]`` (1,500 AdamW steps of 12 x 64 characters, peak learning rate 2e-3) in
  float32 on the CPU, model and batch seed ``SEED``. Chapter 07 onwards: `load_course_model`.
- ``shakespeare_chat``: chapter 11's assistant: ``shakespeare_char`` with the three turn tokens
  (`assistant.add_chat_tokens`), fully fine-tuned by `assistant.finetune` (masked SFT) for
  ``CHAT_STEPS`` steps on conversations of 1 to ``CHAT_TURNS`` exchanges of `assistant.make_tasks`.
  Chapter 11 and ``transformer-course chat``: `load_chat_model`.
- ``shakespeare_chat_lora``: chapter 11's rank-8 LoRA adapter of ``shakespeare_char`` (`lora.add_lora`),
  trained for ``LORA_STEPS`` steps on single questions (chapter 11 compares it with full SFT on those).
  `load_lora_adapter`.
- ``dates_iso``: chapter 09's encoder-decoder (`dates.new_dates_model`), trained by `dates.train_dates`
  for 1,200 steps on 60,000 dates. Chapter 09: `load_dates_model`.

Each file sits in ``assets/`` beside a manifest (``NAME.json``: SHA-256, recipe, losses, the machine
it was trained on), and is checked against that SHA-256 before it is read, then read through chapter 06's
`checkpoint.read_state` as every file of the package is (weights_only=True, finite weights). Rebuild
both (about three minutes on a 2-core CPU) with::

    .venv/bin/python tools/build_course_model.py

A rebuild on another CPU gives models of the same quality, not the same bits.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import torch

from .runtime import file_sha256

ASSETS = Path(__file__).resolve().parent / "assets"
PRESET = "tiny"
SEED = 1337
SAMPLE_PROMPT = "ROMEO:\n"
SAMPLE_TOKENS = 120
DATES_STEPS = 1200
DATES_FORMAT = 1
REBUILD = ".venv/bin/python tools/build_course_model.py"
CHAT_STEPS, CHAT_LR, CHAT_TURNS = 1000, 1e-3, 3  # chapter 11's full fine-tune, on conversations of 1-3 exchanges
LORA_STEPS, LORA_LR, LORA_RANK = 2500, 5e-3, 8  # chapter 11's adapter
DPO_STEPS, DPO_BETA, DPO_LR, DPO_SFT_WEIGHT = 300, 0.1, 2e-5, 1.0  # chapter 12's DPO model
DPO_WORDS = 3000  # the strange words its preference pairs are drawn from
GRPO_STEPS, GRPO_LR, GRPO_KL, GRPO_EVAL_EVERY = 200, 1e-4, 0.04, 25  # chapter 12's GRPO model


def manifest(name: str = "shakespeare_char") -> dict:
    """A shipped model's manifest: SHA-256, recipe, losses and the machine it was trained on."""
    path = ASSETS / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"the course model's manifest {path} is missing: reinstall the package "
                                f"or rebuild the models with `{REBUILD}`")
    return json.loads(path.read_text())


def _verified(name: str) -> Path:
    """The path of shipped model `name`, after checking it against its manifest's SHA-256."""
    expected = manifest(name)["sha256"]
    path = ASSETS / f"{name}.pt"
    if not path.is_file():
        raise FileNotFoundError(f"the course model {path} is missing: reinstall the package or rebuild it "
                                f"with `{REBUILD}`")
    if (actual := file_sha256(path)) != expected:
        raise ValueError(f"the course model {path} does not match its manifest (SHA-256 {actual[:12]}..., "
                         f"expected {expected[:12]}...): the file is damaged or was replaced; reinstall the "
                         f"package or rebuild it with `{REBUILD}`")
    return path


def load_course_model(map_location="cpu"):
    """Chapter 06's trained GPT, as a `checkpoint.Checkpoint`: ``.model`` (eval mode), ``.tokenizer`` (a
    CharTokenizer), ``.config``, ``.train_config`` and ``.history`` of its run."""
    from .checkpoint import load_checkpoint

    return load_checkpoint(_verified("shakespeare_char"), map_location=map_location)


@dataclass
class DatesModel:
    """Chapter 09's trained encoder-decoder: the model (eval mode) and the loss of every training step."""

    model: torch.nn.Module
    losses: list[float]


def _shipped_file(what: str, writer: str, **entries):
    """What `checkpoint.read_state` expects of a shipped model (a `what` file `writer` wrote): one that
    is damaged is rebuilt, not retrained."""
    from .checkpoint import SavedFile

    return SavedFile(what, writer, missing=f"reinstall the package or rebuild it with `{REBUILD}`",
                     redo=f"reinstall the package or rebuild it with `{REBUILD}`", **entries)


def _used(path: Path, kind, build):
    """``build()``, its errors (a bad entry, weights that do not fit) raised as a CheckpointError naming
    `path` and the fix of `kind` (a `checkpoint.SavedFile`)."""
    from .checkpoint import CheckpointError

    try:
        return build()
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        detail = " ".join(str(error).split()).rstrip(". ")  # load_state_dict's lines, on one line
        raise CheckpointError(f"{kind.name} {path} cannot be used: {detail}; {kind.redo}") from None


def _numbers(values, entry: str) -> list[float]:
    """`values` as floats, if it is a list of numbers (not bools); else a ValueError naming `entry`."""
    if not isinstance(values, list) or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise ValueError(f"its entry {entry} must be a list of numbers, got {values!r:.60}")
    return [float(v) for v in values]


def load_dates_model() -> DatesModel:
    """Chapter 09's encoder-decoder, trained by `dates.train_dates` for 1,200 steps."""
    from .checkpoint import read_state
    from .encoder_decoder import EncoderDecoder, Seq2SeqConfig

    path = _verified("dates_iso")
    kind = _shipped_file("dates model", "course_model.build_dates_model", keys=("format", "config", "model", "losses"),
                         version=DATES_FORMAT)
    state = read_state(path, kind)

    def build() -> DatesModel:
        model = EncoderDecoder(Seq2SeqConfig(**state["config"]))
        model.load_state_dict(state["model"])
        return DatesModel(model=model.eval(), losses=_numbers(state["losses"], "losses"))

    return _used(path, kind, build)


@dataclass
class ChatModel:
    """A chat model (chapter 11): the GPT (eval mode), its ChatTokenizer, the SFT losses, and the
    manifest of a shipped model (None for a user's file)."""

    model: torch.nn.Module
    tokenizer: object
    losses: list[float]
    manifest: dict | None = None


SHIPPED_CHAT_MODELS = ("shakespeare_chat", "shakespeare_dpo", "shakespeare_grpo")  # chapters 11 and 12


_CHAT_KEYS = ("format", "config", "model", "tokenizer")  # what save_chat_model writes (and "losses")


def _chat_file(shipped: bool):
    """The `checkpoint.SavedFile` a chat model is read as: a shipped model, or a user's file."""
    from .assistant import CHAT_FORMAT
    from .checkpoint import SavedFile

    if shipped:
        return _shipped_file("chat model", "assistant.save_chat_model", keys=_CHAT_KEYS, version=CHAT_FORMAT)
    return SavedFile("chat model", "save_chat_model", _CHAT_KEYS, CHAT_FORMAT,
                     missing="give a file written by save_chat_model (chapter 11)",
                     redo="delete it and save the model again with save_chat_model (chapter 11), or use an older copy")


def _not_a_chat_model(state) -> str:
    """More words for a file that is not a chat model, when it is one of chapter 06's checkpoints."""
    if isinstance(state, dict) and "model_config" in state:
        return (": it is a checkpoint of a text model (save_checkpoint); load it with load_checkpoint, or "
                "fine-tune it into a chat model as chapter 11 does")
    return ""


def load_chat_model(path=None, shipped: str = "shakespeare_chat") -> ChatModel:
    """A chat model written by `assistant.save_chat_model`; `path` None: the shipped one named `shipped`
    (one of SHIPPED_CHAT_MODELS: chapter 11's SFT model, chapter 12's DPO and GRPO models), checked
    against its manifest's SHA-256. Read through `checkpoint.read_state`, as checkpoints are; a file
    that cannot be used raises `checkpoint.CheckpointError` naming it and the fix."""
    from .assistant import ChatTokenizer
    from .checkpoint import MAX_PARAMETERS, _check_size, read_state  # chapter 06's checks, for every file
    from .config import GPTConfig
    from .model import GPT
    from .modern import build_gpt

    if shipped not in SHIPPED_CHAT_MODELS:
        raise ValueError(f"no shipped chat model {shipped!r}: choose one of {SHIPPED_CHAT_MODELS}")
    name, shipped = shipped, path is None
    path = _verified(name) if shipped else Path(path)
    kind = _chat_file(shipped)
    state = read_state(path, kind, explain=_not_a_chat_model)

    def build() -> ChatModel:
        cfg = GPTConfig.from_dict(state["config"])
        tokenizer = ChatTokenizer.from_dict(state["tokenizer"])
        if tokenizer.vocab_size != cfg.vocab_size:
            raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids, the model {cfg.vocab_size}")
        losses = _numbers(state.get("losses", []), "losses")
        _check_size(cfg, state["model"], MAX_PARAMETERS)  # before a model of that size is built
        model = build_gpt(cfg) if cfg.needs_modern_parts else GPT(cfg)
        model.load_state_dict(state["model"])
        return ChatModel(model.eval(), tokenizer, losses, manifest(name) if shipped else None)

    return _used(path, kind, build)


@dataclass
class LoraAdapter:
    """Chapter 11's shipped LoRA adapter: its tensors (`lora.adapter_state`), rank and manifest."""

    state: dict
    rank: int
    manifest: dict


def load_lora_adapter() -> LoraAdapter:
    """The rank-8 adapter the course ships; apply it with `lora.load_adapter(lora.add_lora(
    assistant.add_chat_tokens(base), rank, train_rows_from=V), adapter.state)`."""
    from .checkpoint import read_state

    path = _verified("shakespeare_chat_lora")
    # the file is the adapter's tensors and nothing else (lora.adapter_state, saved by runtime.atomic_save)
    state = read_state(path, _shipped_file("LoRA adapter", "course_model.build_chat_models", weights=None))
    info = manifest("shakespeare_chat_lora")
    return LoraAdapter(state=state, rank=int(info["rank"]), manifest=info)


def greedy_sample(checkpoint, prompt: str = SAMPLE_PROMPT, max_new_tokens: int = SAMPLE_TOKENS) -> str:
    """The GPT's greedy continuation of `prompt` (no randomness: the same text on every machine)."""
    from .generation import generate

    tok = checkpoint.tokenizer
    idx = torch.tensor([tok.encode(prompt)], dtype=torch.long)
    return tok.decode(generate(checkpoint.model, idx, max_new_tokens, temperature=0.0)[0].tolist())


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _write_manifest(out_dir: Path, name: str, path: Path, wall_seconds: float, **facts) -> None:
    info = {"file": path.name, "sha256": file_sha256(path), "bytes": path.stat().st_size, **facts,
            "built": {"command": REBUILD, "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                      "cpu": _cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "python": platform.python_version(), "wall_seconds": round(wall_seconds, 1)}}
    (out_dir / f"{name}.json").write_text(json.dumps(info, indent=2) + "\n")


def build_course_model(out_dir: Path = ASSETS, *, max_iters: int | None = None, progress: bool = True) -> Path:
    """Train chapter 06's GPT with its recorded recipe; write ``shakespeare_char.pt`` and its manifest
    into `out_dir` (the package's assets by default). `max_iters` shortens the run (tests)."""
    from .checkpoint import load_checkpoint, save_checkpoint
    from .config import PRESETS, TRAIN_PRESETS
    from .data import load_shakespeare, train_val_split
    from .model import GPT
    from .runtime import seed_everything
    from .tokenization import CharTokenizer
    from .training import encode_corpus, train

    out_dir = Path(out_dir)
    text = load_shakespeare()
    tokenizer = CharTokenizer.from_text(text)
    train_data, val_data = train_val_split(encode_corpus(tokenizer, text))
    cfg = replace(TRAIN_PRESETS[PRESET], seed=SEED, device="cpu", bf16=False, progress=progress,
                  **({"max_iters": max_iters} if max_iters else {}))
    seed_everything(SEED)
    model = GPT(replace(PRESETS[PRESET], vocab_size=tokenizer.vocab_size))
    history = train(model, train_data, val_data, cfg)
    path = save_checkpoint(out_dir / "shakespeare_char.pt", model, step=history.step[-1] + 1, train_config=cfg,
                           tokenizer=tokenizer, history=history)
    sample = greedy_sample(load_checkpoint(path))
    _write_manifest(out_dir, "shakespeare_char", path, history.wall_seconds, parameters=model.num_parameters(),
                    preset=PRESET, seed=SEED, train_config=cfg.to_dict(), steps=history.step[-1] + 1,
                    final_train_loss=round(history.train_loss[-1], 4), final_val_loss=round(history.val_loss[-1], 4),
                    greedy_sample={"prompt": SAMPLE_PROMPT, "max_new_tokens": SAMPLE_TOKENS, "text": sample})
    return path


def build_dates_model(out_dir: Path = ASSETS, *, steps: int = DATES_STEPS, progress: bool = True) -> Path:
    """Train chapter 09's encoder-decoder with `dates.train_dates` (chapter 09's data: 60,000 dates,
    2,000 held out) and write ``dates_iso.pt`` and its manifest, with the held-out exact-match rate."""
    import time

    from .dates import (
        BOS,
        EOS,
        SOURCE_CHARS,
        TARGET_CHARS,
        decode_ids,
        encode_batch,
        make_examples,
        new_dates_model,
        train_dates,
    )
    from .runtime import atomic_save

    out_dir = Path(out_dir)
    test_pairs = make_examples(2000, seed=1)
    train_pairs = make_examples(60_000, seed=2, exclude={s for s, _ in test_pairs})
    began = time.perf_counter()
    model = new_dates_model(seed=0)
    losses = train_dates(model, train_pairs, steps=steps, progress=progress)
    wall = time.perf_counter() - began
    path = atomic_save({"format": DATES_FORMAT, "config": model.cfg.to_dict(), "model": model.state_dict(),
                        "losses": losses}, out_dir / "dates_iso.pt")
    with torch.no_grad():
        out = model.greedy_decode(encode_batch([s for s, _ in test_pairs], SOURCE_CHARS), BOS, EOS)
    correct = sum(decode_ids(row.tolist(), TARGET_CHARS) == t for row, (_, t) in zip(out, test_pairs, strict=True))
    _write_manifest(out_dir, "dates_iso", path, wall, parameters=sum(p.numel() for p in model.parameters()),
                    recipe={"function": "transformer_course.dates.train_dates", "steps": steps, "batch_size": 64,
                            "lr": 3e-3, "model_seed": 0, "batch_seed": 3, "train_examples": 60_000},
                    final_loss=round(sum(losses[-100:]) / 100, 5), held_out_exact_match=correct / len(test_pairs))
    return path


def build_chat_models(out_dir: Path = ASSETS, *, chat_steps: int = CHAT_STEPS, progress: bool = True) -> Path:
    """Fine-tune chapter 11's chat model from ``shakespeare_char`` (``shakespeare_chat.pt``) on conversations
    of 1 to CHAT_TURNS exchanges, with a manifest holding its held-out exact match per kind, the same by
    turn (`assistant.exact_match_by_turn`) and Shakespeare bits per character."""
    import time

    from .assistant import add_chat_tokens, exact_match, finetune, save_chat_model

    out_dir = Path(out_dir)
    base, tok, tasks, val, bits = _chat_setup()
    began = time.perf_counter()
    model = add_chat_tokens(base.model)
    losses = finetune(model, tasks, tok, chat_steps, lr=CHAT_LR, seed=1, progress=progress, turns=CHAT_TURNS)
    wall = time.perf_counter() - began
    path = save_chat_model(out_dir / "shakespeare_chat.pt", model.eval(), tok, losses)
    recipe = {"function": "transformer_course.assistant.finetune", "steps": chat_steps, "lr": CHAT_LR,
              "batch_size": 32, "seed": 1, "turns": CHAT_TURNS, "tasks": "assistant.make_tasks(load_shakespeare())"}
    _write_manifest(out_dir, "shakespeare_chat", path, wall, parameters=model.num_parameters(), recipe=recipe,
                    held_out_exact_match=exact_match(model, tok, tasks.held),
                    held_out_exact_match_by_turn=_by_turn(model, tok, tasks.held), bits_per_char=bits(model))
    return path


def build_lora_adapter(out_dir: Path = ASSETS, *, lora_steps: int = LORA_STEPS, progress: bool = True) -> Path:
    """Train chapter 11's rank-8 LoRA adapter of ``shakespeare_char`` (``shakespeare_chat_lora.pt``) on single
    questions, with a manifest holding its held-out exact match per kind and Shakespeare bits per character."""
    import time

    from .assistant import add_chat_tokens, exact_match, finetune
    from .lora import adapter_state, add_lora, trainable_parameters
    from .runtime import atomic_save

    out_dir = Path(out_dir)
    base, tok, tasks, val, bits = _chat_setup()
    began = time.perf_counter()
    adapted = add_lora(add_chat_tokens(base.model), rank=LORA_RANK, train_rows_from=base.tokenizer.vocab_size)
    finetune(adapted, tasks, tok, lora_steps, lr=LORA_LR, seed=1, progress=progress)
    wall = time.perf_counter() - began
    lora_path = atomic_save(adapter_state(adapted), out_dir / "shakespeare_chat_lora.pt")
    recipe = {"function": "transformer_course.assistant.finetune", "steps": lora_steps, "lr": LORA_LR,
              "batch_size": 32, "seed": 1, "tasks": "assistant.make_tasks(load_shakespeare())", "rank": LORA_RANK}
    _write_manifest(out_dir, "shakespeare_chat_lora", lora_path, wall, parameters=trainable_parameters(adapted),
                    rank=LORA_RANK, recipe=recipe, held_out_exact_match=exact_match(adapted.eval(), tok, tasks.held),
                    bits_per_char=bits(adapted))
    return lora_path


def _chat_setup():
    """(base model, ChatTokenizer, TaskSet, held-out Shakespeare ids, bits(model) -> the manifest's entry)."""
    from .assistant import ChatTokenizer, bits_per_char, make_tasks
    from .data import load_shakespeare, train_val_split

    base = load_course_model()
    text = load_shakespeare()
    tok, tasks = ChatTokenizer(base.tokenizer), make_tasks(text)
    val = train_val_split(torch.tensor(base.tokenizer.encode(text[-200_000:])))[1]
    chars = base.tokenizer.vocab_size
    base_bits = round(bits_per_char(base.model, val, chars=chars), 4)

    def bits(model) -> dict:
        return {"base": base_bits, "fine_tuned": round(bits_per_char(model, val, chars=chars), 4),
                "over": f"the {chars} characters (assistant.bits_per_char(..., chars={chars}))"}

    return base, tok, tasks, val, bits


def _by_turn(model, tok, held) -> dict:
    """`assistant.exact_match_by_turn` with string keys, as JSON stores them."""
    from .assistant import exact_match_by_turn

    return {str(turn): scores for turn, scores in exact_match_by_turn(model, tok, held).items()}


def build_preference_models(out_dir: Path = ASSETS, *, dpo_steps: int = DPO_STEPS, grpo_steps: int = GRPO_STEPS,
                            progress: bool = True) -> Path:
    """Train chapter 12's two models from ``shakespeare_chat``: DPO on pairs of its own replies to strange
    words (``shakespeare_dpo.pt``) and GRPO with the exact-match checker (``shakespeare_grpo.pt``), each
    with a manifest holding held-out strange-word accuracy (greedy and pass@1) before and after, chapter
    11's held-out exact match before and after, and the training curves."""
    import copy
    import time

    from .assistant import exact_match, make_tasks, save_chat_model
    from .data import load_shakespeare
    from .preferences import HELD_OUT_SEED, accuracy, dpo, pass_at_1, preference_pairs, strange_words

    out_dir = Path(out_dir)
    chat = load_chat_model()
    sft, tok = chat.model, chat.tokenizer
    tasks = make_tasks(load_shakespeare())
    held = strange_words(400, seed=HELD_OUT_SEED)
    avoid = frozenset(t.prompt.split(": ", 1)[1] for t in held)

    def scores(model) -> dict:
        return {"greedy": accuracy(model, tok, held), "pass_at_1": pass_at_1(model, tok, held)}

    before, em_before = scores(sft), exact_match(sft, tok, tasks.held)
    common = {"held_out": f"preferences.strange_words(400, seed={HELD_OUT_SEED})", "before": before,
              "exact_match_before": em_before, "exact_match_by_turn_before": _by_turn(sft, tok, tasks.held)}
    torch.manual_seed(0)
    began = time.perf_counter()
    pairs = preference_pairs(sft, tok, strange_words(DPO_WORDS, seed=1, avoid=avoid), seed=1)
    policy = copy.deepcopy(sft)
    history = dpo(policy, sft, tok, pairs, dpo_steps, beta=DPO_BETA, lr=DPO_LR, sft_weight=DPO_SFT_WEIGHT, seed=1,
                  progress=progress)
    wall = time.perf_counter() - began
    path = save_chat_model(out_dir / "shakespeare_dpo.pt", policy.eval(), tok, history["loss"])
    _write_manifest(out_dir, "shakespeare_dpo", path, wall, parameters=policy.num_parameters(),
                    recipe={"function": "transformer_course.preferences.dpo", "seed": 1, "batch_size": 32,
                            "pairs_from": f"preferences.strange_words({DPO_WORDS}, seed=1)"},
                    steps=dpo_steps, beta=DPO_BETA, lr=DPO_LR, sft_weight=DPO_SFT_WEIGHT, pairs=len(pairs), **common,
                    after=scores(policy), exact_match_after=exact_match(policy, tok, tasks.held),
                    exact_match_by_turn_after=_by_turn(policy, tok, tasks.held),
                    history={k: [round(v, 4) for v in vals] for k, vals in history.items()})
    policy, history, curve, wall = _grpo_with_curve(sft, tok, grpo_steps, scores, before, avoid, progress)
    rl_path = save_chat_model(out_dir / "shakespeare_grpo.pt", policy.eval(), tok, [])
    _write_manifest(out_dir, "shakespeare_grpo", rl_path, wall, parameters=policy.num_parameters(),
                    recipe={"function": "transformer_course.rewards.grpo", "seed": 1, "tasks_per_step": 16,
                            "group": 8, "inner_steps": 2, "clip": 0.2, "check": "preferences.is_right"},
                    steps=grpo_steps, lr=GRPO_LR, kl_coef=GRPO_KL, **common, after=curve[-1] | {},
                    exact_match_after=exact_match(policy, tok, tasks.held),
                    exact_match_by_turn_after=_by_turn(policy, tok, tasks.held), curve=curve,
                    reward=[round(v, 4) for v in history["reward"]], kl=[round(v, 5) for v in history["kl"]])
    return path


def _grpo_with_curve(sft, tok, steps: int, scores, before: dict, avoid, progress: bool):
    """GRPO from a copy of ``sft`` (``scores(model)`` -> its held-out scores, ``before`` those of ``sft``),
    scored every GRPO_EVAL_EVERY steps and at the last -> (policy, history, curve, wall seconds without the
    scoring)."""
    import copy
    import time

    from .rewards import grpo

    torch.manual_seed(0)
    policy, curve, evaluating = copy.deepcopy(sft), [{"step": 0, **before}], 0.0

    def measure(step: int, _history: dict) -> None:
        nonlocal evaluating
        if step % GRPO_EVAL_EVERY == 0 or step == steps:
            start = time.perf_counter()
            curve.append({"step": step, **scores(policy)})
            policy.train()
            evaluating += time.perf_counter() - start

    began = time.perf_counter()
    history = grpo(policy, sft, tok, steps, lr=GRPO_LR, kl_coef=GRPO_KL, seed=1, avoid=avoid,
                   progress=progress, on_step=measure)
    return policy, history, curve, time.perf_counter() - began - evaluating
