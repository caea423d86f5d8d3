"""The appendix's opt-in bf16 decode weights (`transformer_course.performance.bf16_weights`), tested
against the plain float32 path."""

from __future__ import annotations

import pytest
import torch

from transformer_course.generation import generate
from transformer_course.model import GPT, GPTConfig
from transformer_course.performance import bf16_weights, read_bandwidth

CFG = GPTConfig(vocab_size=60, block_size=32, n_layer=2, n_head=2, d_model=32)


def _model(tie: bool = True) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**CFG.__dict__, "tie_weights": tie})).eval()


def test_the_copy_has_bf16_linear_weights_and_the_original_is_untouched():
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    bf16 = bf16_weights(model)
    assert bf16 is not model and not bf16.training
    linears = [m for m in bf16.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    for name, p in bf16.state_dict().items():  # the bf16 weights are fp32's, rounded
        assert torch.equal(p.float(), before[name].to(p.dtype).float()), name


def test_logits_are_float32_and_close_to_the_plain_path():
    for tie in (True, False):
        model = _model(tie)
        bf16 = bf16_weights(model)
        idx = torch.randint(0, CFG.vocab_size, (3, 20), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            plain, rounded = model(idx)[0], bf16(idx)[0]
        assert rounded.dtype == torch.float32
        torch.testing.assert_close(rounded, plain, atol=0.05, rtol=0.05)


def test_rounding_to_bf16_then_fp32_math_gives_the_same_logits():
    """Exactly what it computes: fp32 weights rounded to bf16 and used in bf16 products equal the same
    products done by hand."""
    model = _model()
    bf16 = bf16_weights(model)
    x = torch.randn(2, 5, CFG.d_model, generator=torch.Generator().manual_seed(2))
    layer, plain = bf16.blocks[0].mlp.fc, model.blocks[0].mlp.fc
    with torch.no_grad():
        expected = torch.nn.functional.linear(x.bfloat16(), plain.weight.bfloat16(), plain.bias.bfloat16()).float()
        assert torch.equal(layer(x), expected)


def test_cached_generation_works_and_draws_nothing_from_the_global_rng():
    model = _model()
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    bf16 = bf16_weights(model)
    prompt = torch.tensor([[1, 2, 3]])
    out = generate(bf16, prompt, 10, temperature=0)
    assert out.shape == (1, 13) and torch.equal(out[:, :3], prompt)
    assert torch.equal(torch.rand(1), expected)



@pytest.mark.parametrize("bad, named", [(dict(n_bytes=1000), "n_bytes"), (dict(n_bytes=2.0**20), "n_bytes"),
                                        (dict(n_bytes=2**20, repeats=0), "repeats"), (dict(repeats=True), "repeats")])
def test_read_bandwidth_refuses_what_would_measure_nothing(bad, named):
    with pytest.raises(ValueError, match=named):
        read_bandwidth(**bad)


def test_read_bandwidth_measures_a_positive_finite_rate():
    rate = read_bandwidth(n_bytes=2**20, repeats=2)
    assert isinstance(rate, float) and 0 < rate < float("inf")
