"""`generate` and `chat` with chapter 14's `--draft` and `--quantize`, probed as a careless user would (issue 55,
second round): a draft that reads a shorter context than the model, a draft file that is not a model of the
right kind, and Ctrl-C while the text is being written. Each ends in one line and its exit status, never a
traceback nor a message that seems to speak of the model's own --checkpoint."""

import pytest
import torch

from transformer_course import cli, generation
from transformer_course.checkpoint import save_checkpoint
from transformer_course.config import GPTConfig
from transformer_course.course_model import load_course_model
from transformer_course.model import GPT


@pytest.fixture(scope="module")
def tokenizer():
    return load_course_model().tokenizer


def tiny(path, tokenizer, block_size: int):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=block_size, n_layer=1, n_head=2, d_model=16))
    return save_checkpoint(path, model.eval(), tokenizer=tokenizer)


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_draft_with_a_shorter_context_is_refused_before_any_text(tmp_path, capsys, tokenizer):
    """A draft of context 16 for a model of 64 wrote 16 tokens, then failed with "sequence of length 17 (16
    cached + 1 new) is longer than block_size 16: crop it to its last 0 tokens", of no option."""
    model, draft = tiny(tmp_path / "model.pt", tokenizer, 64), tiny(tmp_path / "draft.pt", tokenizer, 16)
    args = ["generate", "--checkpoint", str(model), "--prompt", "ROMEO", "--max-new-tokens", "80", "--temperature",
            "0", "--threads", "1", "--draft", str(draft)]
    assert cli.main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == "", captured.out  # refused before any text
    assert captured.err.strip().splitlines() == ["transformer-course generate: error: the draft reads at most 16 "
                                                 "tokens and the target 64: a draft needs a context at least as "
                                                 "long as the target's"], captured.err
    longer = tiny(tmp_path / "longer.pt", tokenizer, 128)  # a longer context is fine
    assert cli.main([*args[:-1], str(longer)]) == 0
    assert capsys.readouterr().out.startswith("ROMEO")


def test_a_draft_that_is_not_a_checkpoint_is_said_of_draft(tmp_path, capsys, tokenizer):
    """The loader's message named the file only: "x.pt is not a transformer-course checkpoint", as if of the
    model's own --checkpoint."""
    model = tiny(tmp_path / "model.pt", tokenizer, 64)
    junk = tmp_path / "notes.pt"
    junk.write_bytes(b"not a model")
    torch.save({"a": 1}, tmp_path / "dict.pt")
    for path in (junk, tmp_path / "dict.pt"):
        assert cli.main(["generate", "--checkpoint", str(model), "--prompt", "a", "--max-new-tokens", "3",
                         "--draft", str(path)]) == 2
        assert one_line(capsys).startswith(f"transformer-course generate: error: --draft {path}: ")


def test_a_chat_draft_that_is_a_text_checkpoint_is_said_of_draft(tmp_path, capsys, tokenizer, monkeypatch):
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("upper: a\n"))
    text = tiny(tmp_path / "text.pt", tokenizer, 64)
    assert cli.main(["chat", "--draft", str(text), "--threads", "1"]) == 2
    err = one_line(capsys)
    assert err.startswith(f"transformer-course chat: error: --draft {text}: ") and "not a chat model" in err, err


@pytest.mark.parametrize("extra", [[], ["--draft", "prompt-lookup"], ["--quantize", "int8"]])
def test_ctrl_c_while_generating_is_one_line_and_status_130(capsys, monkeypatch, extra):
    """Ctrl-C during `generate` printed a KeyboardInterrupt traceback of 20 lines (with or without --draft);
    it ends as chat, train and serve do now: one line, status 130 (128 + SIGINT)."""
    import transformer_course.speculative as speculative

    def interrupted(*args, **kwargs):
        yield [0]
        raise KeyboardInterrupt

    monkeypatch.setattr(generation, "stream", interrupted)
    monkeypatch.setattr(speculative, "speculative_stream", lambda *a, **k: (t[0] for t in interrupted()))
    assert cli.main(["generate", "--prompt", "ROMEO", "--max-new-tokens", "50", "--threads", "1", *extra]) == 130
    captured = capsys.readouterr()
    assert captured.err.strip() == "transformer-course generate: stopped (Ctrl-C)", captured.err
    assert captured.out.startswith("ROMEO")


@pytest.mark.parametrize("command", [["generate", "--prompt", "a"], ["report"], ["chat"]])
def test_threads_beyond_four_per_cpu_are_refused_before_any_is_made(capsys, monkeypatch, command):
    """--threads 100000 ended in a segmentation fault (OpenMP could not make them), with no word of why."""
    import os

    from transformer_course import runtime

    monkeypatch.setattr(runtime, "set_threads", lambda n: pytest.fail(f"{n} threads were asked of PyTorch"))
    most = 4 * (os.cpu_count() or 1)
    assert cli.main([*command, "--threads", "100000"]) == 2
    err = one_line(capsys)
    assert f"--threads 100000: this machine has {most // 4} CPUs" in err and f"give at most {most}" in err, err


def test_generate_reads_a_chapter_10_checkpoint_and_draft(tmp_path, capsys, tokenizer):
    """`generate` refused a chapter 10 checkpoint ("load it with load_checkpoint(path, ...build_gpt)", a library
    call), as a model and as a --draft, though `serve` and `report` read it. The greedy text with a draft is the
    model's own."""
    from transformer_course.modern import build_gpt

    def modern(path, n_layer):
        torch.manual_seed(0)
        cfg = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layer=n_layer, n_head=2, d_model=16,
                        positional="rope", normalization="rmsnorm", mlp="swiglu", n_kv_head=1, bias=False)
        return save_checkpoint(path, build_gpt(cfg).eval(), tokenizer=tokenizer)

    model, draft = modern(tmp_path / "model.pt", 2), modern(tmp_path / "draft.pt", 1)
    base = ["generate", "--checkpoint", str(model), "--prompt", "ROMEO", "--max-new-tokens", "40", "--temperature",
            "0", "--threads", "1"]
    texts = []
    for extra in ([], ["--draft", str(draft)], ["--draft", "prompt-lookup"]):
        assert cli.main([*base, *extra]) == 0, capsys.readouterr().err
        texts.append(capsys.readouterr().out)
    assert texts[0].startswith("ROMEO") and len(texts[0]) > 40 and texts[1] == texts[0] == texts[2]
