"""Issue 40: a model whose vocabulary holds ids its tokenizer cannot decode (a BPE's special tokens leave ids
unused; a model's vocabulary larger than its tokenizer's) never samples them when ``generate`` or ``stream``
gets ``allowed=tokenizer`` (or the ids), so decoding never ends with "unknown token id"."""

import pytest
import torch

from transformer_course.generation import generate, stream
from transformer_course.model import GPT, GPTConfig
from transformer_course.tokenization import BPETokenizer, CharTokenizer

END = "<|end|>"


def _gapped() -> BPETokenizer:
    """Bytes 0..255 and one special token at 300: ids 256..299 decode to nothing."""
    return BPETokenizer({}, special_tokens={END: 300})


def _model(vocab: int, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=vocab, block_size=16, n_layer=1, n_head=2, d_model=16)).eval()


def test_without_allowed_a_gap_id_is_sampled_and_decoding_fails():
    tok = _gapped()
    out = generate(_model(tok.vocab_size), torch.tensor([tok.encode("ab")]), 60, temperature=2.0)
    gap = [i for i in out[0].tolist() if 256 <= i < 300]
    assert gap  # the situation of the issue: 44 of 301 ids cannot be decoded
    with pytest.raises(ValueError, match="unknown token id"):
        tok.decode(out[0].tolist())


@pytest.mark.parametrize("temperature, knobs", [(2.0, {}), (1.0, {"top_k": 200}), (1.5, {"top_p": 0.99}), (0, {})])
def test_allowed_tokenizer_never_samples_an_id_it_cannot_decode(temperature, knobs):
    tok = _gapped()
    model = _model(tok.vocab_size)
    with torch.no_grad():  # make the forbidden ids the favourites: greedy would pick one
        model.lm_head.weight[256:300] = 0
        model.lm_head.weight[256:300, 0] = 1e3
    idx = torch.tensor([tok.encode("ab"), tok.encode("cd")])
    for use_cache in (True, False):
        out = generate(model, idx, 80, temperature, use_cache=use_cache, allowed=tok, **knobs)
        assert not any(256 <= i < 300 for i in out.flatten().tolist())
        assert all(isinstance(tok.decode(row), str) for row in out.tolist())


def test_a_model_larger_than_its_character_tokenizer():
    tok = CharTokenizer.from_text("abcdefg hij\n")  # 12 ids; the model has 17
    out = generate(_model(17, seed=3), torch.tensor([tok.encode("abc")]), 100, temperature=3.0, allowed=tok)
    assert max(out[0].tolist()) < 12
    assert tok.decode(out[0].tolist())


def test_allowed_as_ids_and_stream():
    model = _model(20, seed=1)
    out = generate(model, torch.tensor([[1, 2]]), 30, temperature=0, allowed={5})
    assert out[0, 2:].tolist() == [5] * 30
    steps = [int(s[0]) for s in stream(model, torch.tensor([[1, 2]]), 30, temperature=1.0, allowed=[4, 7, 25])]
    assert set(steps) <= {4, 7}  # 25 is past the model's vocabulary: never sampled anyway


@pytest.mark.parametrize("allowed, match", [
    ([25, 30], "none of the allowed ids is in the model's vocabulary 0..19"),
    ([1, "2"], "an allowed token id must be a whole number"),
    ([-1], "an allowed token id must be a whole number >= 0"),
])
def test_bad_allowed_is_named(allowed, match):
    with pytest.raises(ValueError, match=match):
        generate(_model(20), torch.tensor([[1]]), 3, allowed=allowed)
