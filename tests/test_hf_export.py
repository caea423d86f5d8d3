"""Tests for transformer_course.hf_export (issue 37): the course's models exported to folders that
Hugging Face `transformers` loads offline, and the round trip proven on them.

Each exported folder is loaded back with `AutoModelForCausalLM` and `AutoTokenizer` (no network): the
logits equal ours within 1e-5 and the greedy continuation equals `generate(..., temperature=0.0)` token
for token, for the two trained models the course ships and for small random models of every option
`transformers` can express; the others are refused naming the option.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline  # noqa: E402

from transformer_course import cli  # noqa: E402
from transformer_course import hf_export as E  # noqa: E402
from transformer_course.assistant import ChatTokenizer, render_chat  # noqa: E402
from transformer_course.checkpoint import save_checkpoint  # noqa: E402
from transformer_course.config import GPTConfig  # noqa: E402
from transformer_course.course_model import load_chat_model, load_course_model  # noqa: E402
from transformer_course.generation import generate  # noqa: E402
from transformer_course.llama import load_hf_llama  # noqa: E402
from transformer_course.modern import build_gpt  # noqa: E402
from transformer_course.presplit import GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN  # noqa: E402
from transformer_course.pretrained import from_pretrained  # noqa: E402
from transformer_course.tokenization import BPETokenizer, CharTokenizer  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

TOL = 1e-5
CHARS = CharTokenizer(list("\n !',.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _load(folder):
    return AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def _round_trip(ours, hf, ids: list[int], new: int, eos_id: int | None = None) -> None:
    """Logits within TOL on `ids`, and `new` greedy tokens equal (stopping at `eos_id` as HF does)."""
    idx = torch.tensor([ids])
    with torch.no_grad():
        mine, theirs = ours(idx)[0], hf(idx).logits
    assert (mine - theirs).abs().max().item() <= TOL
    expected = generate(ours, idx, new, temperature=0.0, eos_id=eos_id)[0].tolist()
    got = hf.generate(idx, max_new_tokens=new, do_sample=False)[0].tolist()
    assert got == expected


def test_the_course_model_round_trips_through_the_command(tmp_path, capsys):
    folder = tmp_path / "course"
    assert cli.main(["export", "--to", str(folder)]) == 0  # the shipped chapter 06 model by default
    assert "AutoModelForCausalLM" in capsys.readouterr().out
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "README.md"} <= {p.name for p in folder.iterdir()}
    course = load_course_model()
    hf, tok = _load(folder)
    assert type(hf).__name__ == "GPT2LMHeadModel"
    text = "ROMEO:\nWhat light through yonder window breaks?"
    ids = course.tokenizer.encode(text)
    assert tok(text)["input_ids"] == ids and tok.decode(ids) == text
    _round_trip(course.model, hf, ids[:16], 64 - 16)
    # the pipeline end to end: the prompt and our greedy continuation
    prompt = "JULIET:\n"
    out = pipeline("text-generation", model=str(folder))(prompt, max_new_tokens=30, do_sample=False)
    ours = generate(course.model, torch.tensor([course.tokenizer.encode(prompt)]), 30, temperature=0.0)
    assert out[0]["generated_text"] == course.tokenizer.decode(ours[0].tolist())
    card = (folder / "README.md").read_text()
    history = course.history
    for needle in ("GPT2LMHeadModel", "805,504 parameters", "load_shakespeare", '"max_iters": 1500',
                   f"{history.val_loss[-1]:.4f}", f"{history.train_loss[0]:.4f}"):
        assert needle in card


def test_the_chat_model_round_trips_with_its_chat_template(tmp_path):
    folder = tmp_path / "chat"
    assert cli.main(["export", "--model", "sft", "--to", str(folder)]) == 0
    chat = load_chat_model()
    hf, tok = _load(folder)
    conversation = [{"role": "user", "content": "upper: hello"}, {"role": "assistant", "content": "HELLO"},
                    {"role": "user", "content": "reverse: night"}]
    for messages, prompt in ((conversation, True), (conversation[:2], False)):
        expected = render_chat(messages, chat.tokenizer, generation_prompt=prompt)[0]
        got = tok.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=True)
        assert list(getattr(got, "input_ids", got)) == expected
    with pytest.raises(Exception, match="user or assistant"):
        tok.apply_chat_template([{"role": "system", "content": "be brief"}], tokenize=False)
    ids = render_chat(conversation, chat.tokenizer, generation_prompt=True)[0]
    _round_trip(chat.model, hf, ids, 20, eos_id=chat.tokenizer.end_id)
    question = [{"role": "user", "content": "upper: night"}]
    reply = pipeline("text-generation", model=str(folder))(question, max_new_tokens=20, do_sample=False)
    ids = render_chat(question, chat.tokenizer, generation_prompt=True)[0]
    ours = generate(chat.model, torch.tensor([ids]), 20, temperature=0.0, eos_id=chat.tokenizer.end_id)[0]
    answer = chat.tokenizer.decode(ours[len(ids):].tolist()).removesuffix("<|end|>")
    assert reply[0]["generated_text"][-1] == {"role": "assistant", "content": answer} and answer == "NIGHT"
    config = json.loads((folder / "generation_config.json").read_text())
    assert config["eos_token_id"] == chat.tokenizer.end_id
    card = (folder / "README.md").read_text()
    assert "make_tasks" in card and "held_out_exact_match" in card and "Fine-tuning loss" in card


def _randomise(model, seed: int, std: float = 0.3):
    """Every weight ~ N(0, std), norm gains ~ N(1, 0.1): no near-ties for greedy decoding to break."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            gain = name.endswith(("ln1.weight", "ln2.weight", "ln_f.weight"))
            p.copy_((1.0 if gain else 0.0) + (0.1 if gain else std) * torch.randn(p.shape, generator=gen))
    return model.eval()


BASE = GPTConfig(vocab_size=len(CHARS.chars), block_size=32, n_layer=2, n_head=4, d_model=32)
LLAMA = replace(BASE, positional="rope", normalization="rmsnorm", mlp="swiglu", bias=False, tie_weights=False)
CONFIGS = {
    "learned, tied, biases": BASE,
    "sinusoidal, untied, no biases, exact gelu": replace(BASE, positional="sinusoidal", tie_weights=False, bias=False),
    "learned, relu, grouped kv heads, d_ff, eps": replace(BASE, activation="relu", n_kv_head=2, d_ff=48, eps=1e-6,
                                                          vocab_size=BASE.vocab_size + 5),
    "gelu_tanh, no biases": replace(BASE, activation="gelu_tanh", bias=False),
    "llama: rope, rmsnorm, swiglu, gqa, untied": replace(LLAMA, n_kv_head=2, rope_base=500.0, eps=1e-6),
    "llama: tied, biases, d_ff": replace(LLAMA, tie_weights=True, bias=True, d_ff=40),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_random_models_round_trip(name, tmp_path):
    cfg = CONFIGS[name]
    model = _randomise(build_gpt(cfg), seed=len(name))
    E.export(model, CHARS, tmp_path)
    hf, tok = _load(tmp_path)
    assert type(hf).__name__ == ("LlamaForCausalLM" if cfg.positional == "rope" else "GPT2LMHeadModel")
    ids = tok("To be, or not to be")["input_ids"]
    assert ids == CHARS.encode("To be, or not to be")
    _round_trip(model, hf, ids, cfg.block_size - len(ids))
    with torch.no_grad():  # the whole context, every position
        full = torch.randint(0, cfg.vocab_size, (2, cfg.block_size), generator=torch.Generator().manual_seed(1))
        assert (model(full)[0] - hf(full).logits).abs().max().item() <= TOL


def test_exported_folders_load_back_into_the_course_loaders(tmp_path):
    """The inverse of chapters 08 and 10: their loaders read what export wrote, to the same logits."""
    gpt2 = _randomise(build_gpt(replace(BASE, activation="gelu_tanh")), seed=3)
    llama = _randomise(build_gpt(replace(LLAMA, n_kv_head=1)), seed=4)
    idx = torch.tensor([CHARS.encode("Now is the winter")])
    for model, load in ((gpt2, from_pretrained), (llama, load_hf_llama)):
        folder = E.export(model, CHARS, tmp_path / load.__name__)
        with torch.no_grad():
            assert torch.allclose(load(folder)(idx)[0], model(idx)[0], atol=TOL, rtol=0)


@pytest.mark.parametrize("pattern", [GPT4_SPLIT_PATTERN, GPT2_SPLIT_PATTERN, None])
def test_bpe_tokenizers_give_our_ids(pattern):
    text = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 3
            + "Don't you 've 12345 numbers   spaces\ttabs\r\n café naïve 東京 🎭 the end.")
    bpe = BPETokenizer.train(text, 320, pattern=pattern, special_tokens=["<|endoftext|>"])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=E.hf_tokenizer(bpe), clean_up_tokenization_spaces=False)
    for sample in (text, "  leading and trailing  ", "Tabs\tand\nnew lines\n\n", "Unseen: ÆØÅ 🤖 x² 3.14159",
                   "a<|endoftext|>b"):
        ids = bpe.encode(sample, allowed_special="all")
        assert tok(sample)["input_ids"] == ids, sample
        assert tok.decode(ids) == bpe.decode(ids)
    chat = ChatTokenizer(CHARS)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=E.hf_tokenizer(chat))
    assert tok("<|user|>Hi<|end|><|assistant|>")["input_ids"] == chat.encode("<|user|>Hi<|end|><|assistant|>")


@pytest.mark.parametrize(("change", "named"), [
    ({"norm": "post"}, "norm='post'"),
    ({"positional": "rope"}, "normalization='layernorm', mlp='plain'"),
    ({"normalization": "rmsnorm", "positional": "learned", "mlp": "swiglu"}, "positional='learned'"),
])
def test_what_transformers_cannot_compute_is_refused_naming_the_option(change, named, tmp_path, capsys):
    model = build_gpt(replace(BASE, **change))
    with pytest.raises(E.ExportError, match=named.replace("(", r"\(")):
        E.export(model, CHARS, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    path = save_checkpoint(tmp_path / "ck.pt", model, tokenizer=CHARS)
    assert cli.main(["export", "--checkpoint", str(path), "--to", str(tmp_path / "cli")]) == 2
    assert named in capsys.readouterr().err


def test_a_checkpoint_without_a_tokenizer_is_refused(tmp_path):
    path = save_checkpoint(tmp_path / "ck.pt", build_gpt(BASE))
    with pytest.raises(E.ExportError, match="no tokenizer"):
        E.export_checkpoint(path, tmp_path / "out")


# ---------------------------------------------------------------- issue 55: the exporter's safety
def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_a_folder_that_is_not_an_earlier_export_is_refused_untouched(tmp_path, capsys):
    folder = tmp_path / "theirs"
    folder.mkdir()
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"someone else's shard")
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {"a": "model-00001-of-00002.safetensors"}}')
    (folder / "README.md").write_text("their card")
    before = _files(folder)
    model = _randomise(build_gpt(BASE), seed=1)
    with pytest.raises(E.ExportError, match="not empty and not an earlier export"):
        E.export(model, CHARS, folder)
    assert _files(folder) == before
    assert cli.main(["export", "--to", str(folder)]) == 2
    assert "not an earlier export" in _one_line(capsys.readouterr().err)
    assert _files(folder) == before and sorted(p.name for p in folder.iterdir()) == sorted(before)


def test_an_earlier_export_is_replaced_and_only_the_files_it_wrote(tmp_path):
    folder = tmp_path / "out"
    chat = ChatTokenizer(CHARS)
    E.export(_randomise(build_gpt(replace(BASE, vocab_size=chat.vocab_size)), seed=2), chat, folder)
    manifest = json.loads((folder / E.MANIFEST).read_text())
    assert "chat_template.jinja" in manifest["files"] and "model.safetensors" in manifest["files"]
    (folder / "notes.txt").write_text("mine")  # a file the exporter did not write: kept as it is
    model = _randomise(build_gpt(BASE), seed=3)
    E.export(model, CHARS, folder)  # a plain tokenizer: the earlier chat template, the export's own, goes
    assert not (folder / "chat_template.jinja").exists() and (folder / "notes.txt").read_text() == "mine"
    hf, tok = _load(folder)
    assert tok.chat_template is None
    _round_trip(model, hf, CHARS.encode("To be"), 4)
    written = json.loads((folder / E.MANIFEST).read_text())["files"]
    assert "notes.txt" not in written and set(written) == set(_files(folder)) - {"notes.txt", E.MANIFEST}
    # a file the export wrote, changed since, is someone's work: refused, nothing written
    (folder / "README.md").write_text("my own card")
    before = _files(folder)
    with pytest.raises(E.ExportError, match=r"README\.md changed since"):
        E.export(model, CHARS, folder)
    assert _files(folder) == before
    # a file of a name the export writes, that the export did not write: refused
    (folder / "README.md").unlink()
    E.export(model, CHARS, folder)
    (folder / "chat_template.jinja").write_text("theirs")
    before = _files(folder)
    with pytest.raises(E.ExportError, match=r"chat_template\.jinja was not written by"):
        E.export(_randomise(build_gpt(replace(BASE, vocab_size=chat.vocab_size)), seed=2), chat, folder)
    assert _files(folder) == before


def test_a_manifest_naming_files_outside_the_folder_is_not_an_export(tmp_path):
    folder = tmp_path / "out"
    E.export(build_gpt(BASE), CHARS, folder)
    outside = tmp_path / "precious.txt"
    outside.write_text("keep")
    manifest = json.loads((folder / E.MANIFEST).read_text())
    manifest["files"]["../precious.txt"] = E.file_sha256(outside)
    (folder / E.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(E.ExportError, match="not an earlier export"):
        E.export(build_gpt(BASE), CHARS, folder)
    assert outside.read_text() == "keep"


def test_an_empty_to_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "README.md").write_text("the project's own readme")
    assert cli.main(["export", "--to", ""]) == 2
    assert "--to is empty" in _one_line(capsys.readouterr().err)
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]
    assert (tmp_path / "README.md").read_text() == "the project's own readme"
    with pytest.raises(E.ExportError, match="--to is empty"):
        E.export(build_gpt(BASE), CHARS, "")


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_every_exported_file_follows_the_umask(tmp_path, mask):
    import os
    import stat

    tok = ChatTokenizer(CHARS) if mask == 0o002 else CHARS  # a chat model writes chat_template.jinja too
    model = build_gpt(replace(BASE, vocab_size=tok.vocab_size))
    old = os.umask(mask)
    try:
        folder = E.export(model, tok, tmp_path / "a" / "b")
    finally:
        os.umask(old)
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in folder.iterdir()}
    assert set(modes.values()) == {oct(0o666 & ~mask)}, modes
    assert "model.safetensors" in modes and stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~mask


def _snippet(folder) -> str:
    import re

    card = (folder / "README.md").read_text()
    code = re.search(r"## Use\n.*?```python\n(.*?)```", card, re.S).group(1)
    assert "PATH/TO/THIS/FOLDER" in code
    return code.replace("PATH/TO/THIS/FOLDER", str(folder))


SNIPPET_MODELS = {
    "gpt2, 32 tokens": (BASE, CHARS),
    "llama, 16 tokens": (replace(LLAMA, block_size=16), CHARS),
    "chat, 24 tokens": (replace(BASE, block_size=24, vocab_size=CHARS.vocab_size + 3), ChatTokenizer(CHARS)),
    "no capitals, 8 tokens": (replace(BASE, block_size=8, vocab_size=5), CharTokenizer(list("abcde"))),
    "chat, 4 tokens": (replace(BASE, block_size=4, vocab_size=8), ChatTokenizer(CharTokenizer(list("abcde")))),
}


@pytest.mark.parametrize("name", list(SNIPPET_MODELS))
def test_the_model_cards_snippet_runs(name, tmp_path, capsys):
    """The card's own code, run as written (transformers, offline, from the exported folder): it keeps the
    prompt and the new tokens within the model's context (was: max_new_tokens=100 past 64: IndexError)."""
    cfg, tok = SNIPPET_MODELS[name]
    folder = E.export(_randomise(build_gpt(cfg), seed=5), tok, tmp_path / "model")
    code = _snippet(folder)
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.strip()
    assert f"at most {cfg.block_size} tokens" in (folder / "README.md").read_text()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_are_refused_naming_the_tensor(value, tmp_path):
    model = build_gpt(BASE)
    with torch.no_grad():
        model.blocks[1].mlp.fc.weight[3, 2] = value
    with pytest.raises(E.ExportError, match=r"'blocks\.1\.mlp\.fc\.weight' holds 1 (NaN|infinite) value"):
        E.export(model, CHARS, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # (checkpoint files holding such weights are refused by their loader)


def test_a_lora_model_before_merge_lora_is_refused_saying_so(tmp_path):
    from transformer_course.lora import add_lora, merge_lora

    model = add_lora(_randomise(build_gpt(BASE), seed=6), rank=2)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "B") and isinstance(module.B, torch.nn.Parameter):
                module.B.normal_(0, 0.1)
    with pytest.raises(E.ExportError, match=r"LoRA adapters .*blocks\.0\.attn\.qkv.*merge_lora"):
        E.export(model, CHARS, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    merged = merge_lora(model).eval()
    hf, _ = _load(E.export(merged, CHARS, tmp_path / "out"))
    _round_trip(merged, hf, CHARS.encode("Now is"), 8)


def test_a_dangling_link_is_refused_saying_what_it_is(tmp_path, capsys):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    assert cli.main(["export", "--to", str(link)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "symbolic link to a missing target" in line and "File exists" not in line
    assert link.is_symlink() and not (tmp_path / "missing").exists()
    with pytest.raises(E.ExportError, match="symbolic link to a missing target"):
        E.export(build_gpt(BASE), CHARS, link)
