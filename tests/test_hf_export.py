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
