"""`transformer-course report`: a card for a chapter 06 checkpoint and for a chat model, one clear line
and exit status 2 for a bad or missing checkpoint, an HTML page that holds its plots and agrees with its
Markdown twin, and the shipped models' card regenerated and compared with the stored one
(benchmarks/results/report_card/report.json), a figure beyond its tolerance named."""

import json
import re
from pathlib import Path

import pytest
import torch

from transformer_course import report_card
from transformer_course.assistant import ChatTokenizer, add_chat_tokens, save_chat_model
from transformer_course.checkpoint import save_checkpoint
from transformer_course.cli import main
from transformer_course.config import GPTConfig
from transformer_course.course_model import load_course_model
from transformer_course.model import GPT

STORED = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "report_card" / "report.json"


def _tiny_gpt() -> GPT:
    torch.manual_seed(0)
    vocab = load_course_model().tokenizer.vocab_size
    return GPT(GPTConfig(vocab_size=vocab, block_size=64, n_layer=1, n_head=2, d_model=16)).eval()


def _report(tmp_path, path) -> tuple[str, str, dict]:
    assert main(["report", "--checkpoint", str(path), "--out", str(tmp_path / "card"), "--threads", "1"]) == 0
    out = tmp_path / "card"
    page, twin = (out / "report.html").read_text(), (out / "report.md").read_text()
    return page, twin, json.loads((out / "report.json").read_text())


def _numbers(text: str) -> list[str]:
    return re.findall(r"\d+\.\d+%|\d+ / \d+", text)


def test_a_chapter_06_checkpoint_gets_its_card(tmp_path):
    path = save_checkpoint(tmp_path / "checkpoint.pt", _tiny_gpt(), tokenizer=load_course_model().tokenizer)
    page, twin, data = _report(tmp_path, path)
    assert [c["kind"] for c in data["cards"]] == ["base"]
    assert "next character (held-out plays)" in twin and "bits per character" in twin
    assert page.count("data:image/png;base64,") == 1 and "<img" in page and "src=\"http" not in page
    assert _numbers(page) == _numbers(twin)  # the page and its twin hold the same figures
    assert 0 < data["figures"]["checkpoint/bits_per_char"] < 10


def test_a_chat_model_gets_its_card(tmp_path):
    base = load_course_model()
    tiny = add_chat_tokens(_tiny_gpt())
    path = save_chat_model(tmp_path / "chat.pt", tiny, ChatTokenizer(base.tokenizer))
    page, twin, data = _report(tmp_path, path)
    tasks = [row["task"] for row in data["cards"][0]["tasks"]]
    assert tasks == ["upper (chapter 11)", "reverse (chapter 11)", "count (chapter 11)", "speaker (chapter 11)",
                     "strange words (chapter 12)"]
    assert {"pass_at_1", "pass_at_8"} == set(data["cards"][0]["pass_at"])
    assert "pass@8" in page and "Greedy replies" in twin


@pytest.mark.parametrize("content, words", [(None, "no checkpoint at"), (b"not a checkpoint", "cannot be read")])
def test_bad_or_missing_checkpoint_is_one_line_and_status_2(tmp_path, capsys, content, words):
    path = tmp_path / "model.pt"
    if content is not None:
        path.write_bytes(content)
    assert main(["report", "--checkpoint", str(path), "--out", str(tmp_path / "card")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and err.startswith("transformer-course report: error:")
    assert not (tmp_path / "card").exists()


def test_compare_names_the_figure_that_moved():
    stored = {"SFT/speaker (chapter 11)/exact_match": 0.18, "base/bits_per_char": 2.719, "SFT/pass_at_8": 0.65}
    assert report_card.compare(dict(stored), stored) == []
    moved = report_card.compare({**stored, "base/bits_per_char": 2.75, "SFT/pass_at_8": 0.66}, stored)
    assert len(moved) == 1 and moved[0].startswith("base/bits_per_char: 2.75, stored 2.719")
    assert report_card.compare({"base/bits_per_char": 2.719}, stored)[0].endswith("missing (stored 0.18)")


def test_the_shipped_models_card_matches_the_stored_one(tmp_path):
    """Regenerates the card of the four shipped models (about 40 s on 2 cores) and compares every figure."""
    report_card.run_report(None, tmp_path, progress=False)
    got = json.loads((tmp_path / "report.json").read_text())["figures"]
    stored = json.loads(STORED.read_text())["figures"]
    problems = report_card.compare(got, stored)
    assert not problems, "the report card moved beyond its tolerance:\n" + "\n".join(problems)


def test_the_harness_agrees_with_the_report_card(tmp_path, monkeypatch):
    """EleutherAI's lm-evaluation-harness, on the exports of the shipped SFT and base models and the offline
    tasks `harness_tasks` writes: exact match identical to the stored card's, bits per character within
    0.005 (about a minute; skipped where lm_eval is not installed: pip install "lm-eval[hf]==0.4.13")."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    from transformer_course.course_model import ASSETS
    from transformer_course.hf_export import export_checkpoint

    names = report_card.harness_tasks(tmp_path / "tasks")
    stored = json.loads(STORED.read_text())["figures"]
    newline = load_course_model().tokenizer.encode("\n")[0]
    for model, file, tasks, extra in [("SFT", "shakespeare_chat", names[:-1], ""),
                                      ("base", "shakespeare_char", names[-1:], f",prefix_token_id={newline}")]:
        folder = export_checkpoint(ASSETS / f"{file}.pt", tmp_path / file)
        results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={folder},dtype=float32{extra}",
                                          tasks=tasks, task_manager=TaskManager(include_path=str(tmp_path / "tasks")),
                                          batch_size=32, device="cpu")["results"]
        for task in tasks:
            if task == "course_plays":
                got, want = results[task]["bits_per_byte,none"], stored[f"{model}/bits_per_char"]
                assert abs(got - want) < 0.005, (task, got, want)
            else:
                kind = task.removeprefix("course_")
                row = "strange words (chapter 12)" if kind == "strange" else f"{kind} (chapter 11)"
                assert results[task]["exact_match,none"] == pytest.approx(stored[f"{model}/{row}/exact_match"],
                                                                           abs=1e-9), task


def test_the_harness_through_serve_agrees_with_the_report_card(tmp_path, monkeypatch):
    """The same harness against `transformer-course serve` (lm-eval's OpenAI-compatible `local-completions`
    model, prompts sent as text): on the shipped SFT model every exact-match task's score is the stored card's.
    The plays' bits per character need the prompt's log-probabilities, which the server does not give (it
    refuses `echo` and `logprobs` by name), so that task stays with the exported model above."""
    import threading

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm_eval = pytest.importorskip("lm_eval")
    pytest.importorskip("fastapi")
    from lm_eval.tasks import TaskManager

    from transformer_course import serve
    from transformer_course.course_model import load_chat_model

    names = [n for n in report_card.harness_tasks(tmp_path / "tasks") if n != "course_plays"]
    started = threading.Event()
    server = serve.server(serve.chat_served(load_chat_model(), "shakespeare_chat", "the chat model"), started.set)
    sock = serve.listen("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        assert started.wait(60), "the server did not start"
        args = (f"model=shakespeare_chat,base_url={serve.url(sock)}/v1/completions,tokenized_requests=False,"
                "tokenizer_backend=None,max_retries=1,num_concurrent=4")
        results = lm_eval.simple_evaluate(model="local-completions", model_args=args, tasks=names,
                                          task_manager=TaskManager(include_path=str(tmp_path / "tasks")))["results"]
    finally:
        server.should_exit = True
        thread.join(60)
    stored = json.loads(STORED.read_text())["figures"]
    for task in names:
        kind = task.removeprefix("course_")
        row = "strange words (chapter 12)" if kind == "strange" else f"{kind} (chapter 11)"
        assert results[task]["exact_match,none"] == pytest.approx(stored[f"SFT/{row}/exact_match"], abs=1e-9), task


# ---------------------------------------------------------------- --out: the user's folder (issue 55, round 2)
@pytest.fixture
def tiny_checkpoint(tmp_path):
    return save_checkpoint(tmp_path / "checkpoint.pt", _tiny_gpt(), tokenizer=load_course_model().tokenizer)


def _refused(args, capsys, words) -> str:
    capsys.readouterr()  # what came before
    assert main(["report", *args, "--threads", "1"]) == 2
    err = capsys.readouterr().err.strip()  # the progress bar's lines, if measured, then the error
    said = [line for line in err.splitlines() if line.startswith("transformer-course")]
    assert said == err.splitlines()[-1:] and words in said[0], err
    return said[0]


def test_out_a_file_or_a_dangling_link_is_one_line_before_anything_is_measured(tmp_path, capsys, monkeypatch,
                                                                               tiny_checkpoint):
    """--out naming a file said "[Errno 17] File exists" (a dangling link too), after the whole measurement."""
    monkeypatch.setattr(report_card, "measure", lambda *a: pytest.fail("measured before --out was checked"))
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    _refused(["--checkpoint", str(tiny_checkpoint), "--out", str(mine)], capsys, "is a file, not a folder")
    assert mine.read_text() == "mine"
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    _refused(["--checkpoint", str(tiny_checkpoint), "--out", str(tmp_path / "gone")], capsys, "which does not exist")
    _refused(["--checkpoint", str(tiny_checkpoint), "--out", ""], capsys, "--out is empty")


@pytest.mark.parametrize("name", ["report.md", "report.json", "reliability_checkpoint.png"])
def test_a_file_of_the_user_is_never_overwritten(tmp_path, capsys, monkeypatch, tiny_checkpoint, name):
    """A folder holding the user's report.md (or any name the card writes) had it overwritten silently."""
    monkeypatch.setattr(report_card, "measure", lambda *a: pytest.fail("measured before --out was checked"))
    out = tmp_path / "card"
    out.mkdir()
    (out / name).write_text("the user's own")
    (out / "other.txt").write_text("kept")
    _refused(["--checkpoint", str(tiny_checkpoint), "--out", str(out)], capsys,
             f"already holds {name}, a file this command did not write")
    assert (out / name).read_text() == "the user's own" and sorted(p.name for p in out.iterdir()) == sorted(
        [name, "other.txt"])


def test_a_link_in_the_folder_is_not_written_through(tmp_path, capsys, tiny_checkpoint):
    """report.json a symbolic link to the user's file: the card's JSON was written into that file."""
    precious = tmp_path / "precious.txt"
    precious.write_text("precious")
    out = tmp_path / "card"
    out.mkdir()
    (out / "report.json").symlink_to(precious)
    _refused(["--checkpoint", str(tiny_checkpoint), "--out", str(out)], capsys, "report.json, a symbolic link")
    assert precious.read_text() == "precious"


def test_an_earlier_card_is_replaced_unless_it_was_edited(tmp_path, capsys, tiny_checkpoint):
    out = tmp_path / "card"
    (out / "other.txt").parent.mkdir()
    (out / "other.txt").write_text("kept")
    for _ in range(2):  # the second run replaces the first run's files
        _report(tmp_path, tiny_checkpoint)
    assert (out / "other.txt").read_text() == "kept"
    edited = (out / "report.md").read_text() + "\nmy notes on this card\n"
    (out / "report.md").write_text(edited)
    _refused(["--checkpoint", str(tiny_checkpoint), "--out", str(out)], capsys, "report.md, a file this command "
             "wrote, changed since")
    assert (out / "report.md").read_text() == edited


def test_a_card_stored_before_the_hashes_were_kept_is_replaced(tmp_path):
    """benchmarks/results/report_card/report.json has no "files": its own names are known from its cards."""
    import shutil

    out = tmp_path / "stored"
    shutil.copytree(STORED.parent, out)
    cards = json.loads((out / "report.json").read_text())["cards"][:1]
    report_card.write_report(cards, out, where="a test")
    assert "a test" in (out / "report.md").read_text()
    assert set(json.loads((out / "report.json").read_text())["files"]) == {
        "report.md", "report.html", f"reliability_{cards[0]['name']}.png"}


def test_a_full_disk_leaves_the_earlier_card_whole(tmp_path, capsys, monkeypatch, tiny_checkpoint):
    """A full disk wrote part of the card: a report.html cut at 8,192 bytes beside a new report.md. Every file
    is now written beside its name first, then moved over it."""
    import errno
    import os

    _report(tmp_path, tiny_checkpoint)
    out = tmp_path / "card"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = os.fdopen

    class Full:
        def __init__(self, handle, mode):
            self.file = real(handle, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, data):
            if len(data) > 8192:
                self.file.write(data[:8192])
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.file.write(data)

        def __getattr__(self, name):
            return getattr(self.file, name)

    monkeypatch.setattr(report_card.os, "fdopen", Full)
    _refused(["--checkpoint", str(tiny_checkpoint), "--out", str(out)], capsys,
             "(No space left on device): no file in it was changed")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no .partial file left either


def test_a_read_only_folder_is_said_before_anything_is_measured(tmp_path, capsys, monkeypatch, tiny_checkpoint):
    """Root writes into a chmod 555 folder, so a read-only disk is imitated: the probe's file is refused."""
    import errno

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(report_card, "measure", lambda *a: pytest.fail("measured before --out was checked"))
    monkeypatch.setattr(report_card.tempfile, "TemporaryFile", read_only)
    _refused(["--checkpoint", str(tiny_checkpoint), "--out", str(tmp_path / "card")], capsys,
             f"cannot write into --out {tmp_path / 'card'} (Read-only file system)")


def test_ctrl_c_while_measuring_is_one_line_status_130_and_writes_nothing(tmp_path, capsys, monkeypatch,
                                                                         tiny_checkpoint):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(report_card, "measure", interrupted)
    assert main(["report", "--checkpoint", str(tiny_checkpoint), "--out", str(tmp_path / "card")]) == 130
    said = [line for line in capsys.readouterr().err.splitlines() if "transformer-course" in line]
    assert said == ["transformer-course report: stopped (Ctrl-C); nothing was written"]
    assert not (tmp_path / "card").exists()


def test_harness_tasks_leave_the_users_files_alone(tmp_path):
    data = report_card.load_data()
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "course_upper.yaml").write_text("the user's own task")
    with pytest.raises(ValueError, match="--harness-tasks .* already holds course_upper.yaml, a file this command"):
        report_card.harness_tasks(folder, data)
    assert [p.name for p in folder.iterdir()] == ["course_upper.yaml"]
    (folder / "course_upper.yaml").unlink()
    names = report_card.harness_tasks(folder, data)
    assert report_card.harness_tasks(folder, data) == names  # its own files: replaced
    with pytest.raises(ValueError, match="is a file, not a folder"):
        report_card.harness_tasks(folder / "course_upper.yaml", data)


def test_harness_tasks_in_a_folder_whose_name_yaml_would_misread(tmp_path):
    """A folder named "runs: #2" wrote `test: /.../runs: #2/course_upper.jsonl`, which YAML cannot read (or reads
    as another path): each path is a quoted scalar now."""
    yaml = pytest.importorskip("yaml")
    folder = tmp_path / "runs: #2 'x'"
    for name in report_card.harness_tasks(folder, report_card.load_data()):
        task = yaml.safe_load((folder / f"{name}.yaml").read_text())
        path = Path(task["dataset_kwargs"]["data_files"]["test"])
        assert path == folder.resolve() / f"{name}.jsonl" and path.is_file(), task


def test_a_chat_model_whose_context_is_too_short_is_said_so(tmp_path, capsys):
    """A chat model of context 8 failed with "sequence of length 31 is longer than block_size 8: crop it to its
    last 8 tokens", which the user of `report` cannot do."""
    torch.manual_seed(0)
    base = load_course_model()
    short = add_chat_tokens(GPT(GPTConfig(vocab_size=base.tokenizer.vocab_size, block_size=8, n_layer=1, n_head=2,
                                          d_model=16)).eval())
    path = save_chat_model(tmp_path / "short.pt", short, ChatTokenizer(base.tokenizer))
    err = _refused(["--checkpoint", str(path), "--out", str(tmp_path / "card")], capsys, "short.pt: its context of "
                   "8 tokens cannot hold the card's longest question")
    assert "needs a context of at least" in err
    assert not (tmp_path / "card").exists()  # the folder made for it is gone again
