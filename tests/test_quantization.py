"""Chapter 14's weight quantization: int8 per output channel and int4 per group against PyTorch's own
quantizer and hand-worked numbers, the quantized Linear against F.linear, and the FBGEMM int8 kernel
against the plain path on the shipped model."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from transformer_course.course_model import load_course_model
from transformer_course.generation import generate
from transformer_course.quantization import (
    QuantLinear,
    dequantize_int4,
    dequantize_int8,
    model_weight_bytes,
    quantize_int4,
    quantize_int8,
    quantize_model,
)


@pytest.fixture(scope="module")
def course():
    return load_course_model()


def test_int8_matches_pytorchs_per_channel_quantizer():
    w = torch.randn(32, 48, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.01, 3, 32)[:, None]
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (32,)
    assert torch.allclose(scale, w.abs().amax(1) / 127)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torch.quantize_per_channel(w, scale.double(), torch.zeros(32, dtype=torch.long), 0, torch.qint8)
    assert torch.equal(q, theirs.int_repr())
    assert bool(((dequantize_int8(q, scale) - w).abs() <= scale[:, None] / 2 + 1e-7).all())


def test_int8_hand_worked_row_and_zero_row():
    q, scale = quantize_int8(torch.tensor([[0.50, -1.27, 0.02], [0.0, 0.0, 0.0]]))
    assert q.tolist() == [[50, -127, 2], [0, 0, 0]]
    assert torch.allclose(scale, torch.tensor([0.01, 1.0]))


def test_int4_groups_hand_worked_and_error_bound():
    q, scale = quantize_int4(torch.tensor([[0.7, -0.14, 3.5, 0.5]]), 2)
    assert q.tolist() == [[7, -1, 7, 1]] and torch.allclose(scale, torch.tensor([[0.1, 0.5]]))
    w = torch.randn(16, 128, generator=torch.Generator().manual_seed(1))
    for group in (32, 64):
        q, scale = quantize_int4(w, group)
        assert scale.shape == (16, 128 // group) and int(q.abs().max()) <= 7
        step = scale.repeat_interleave(group, dim=1)
        assert bool(((dequantize_int4(q, scale) - w).abs() <= step / 2 + 1e-7).all())


@pytest.mark.parametrize("call, match", [
    (lambda: quantize_int4(torch.randn(4, 48), 32), "does not divide the 48 inputs"),
    (lambda: quantize_int8(torch.randn(4)), r"float weight \[N, K\]"),
    (lambda: quantize_int8(torch.zeros(2, 2, dtype=torch.long)), "float weight"),
    (lambda: QuantLinear(torch.nn.Linear(64, 8), bits=4, kernel=True), "kernel=True runs the int8 kernel"),
    (lambda: QuantLinear(torch.nn.Linear(64, 8), bits=3), "bits must be 8 or 4"),
])
def test_bad_input_is_refused_with_the_fix(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("bits, group", [(8, 32), (4, 32), (4, 64)])
def test_quant_linear_plain_path_equals_f_linear_on_the_dequantized_weight(bits, group):
    linear = torch.nn.Linear(128, 24)
    ql = QuantLinear(linear, bits, group)
    x = torch.randn(3, 5, 128, generator=torch.Generator().manual_seed(2))
    want = F.linear(x, ql.dequantized(), linear.bias.detach())
    assert torch.allclose(ql(x), want, atol=1e-5, rtol=1e-5)
    values, scales = ql.weight_bytes()
    assert values == 24 * 128 * bits / 8 and scales == 4 * (24 if bits == 8 else 24 * 128 // group)


def test_kernel_and_plain_int8_agree_on_the_shipped_model(course):
    """The FBGEMM path also rounds each input vector to int8: logits within 2% of their range of the plain
    int8 path's, and greedy choices equal on at least 95% of positions (float32's greedy text as prefix)."""
    model, tok = course.model, course.tokenizer
    plain, fast = quantize_model(model, 8), quantize_model(model, 8, kernel=True)
    agree, total = 0, 0
    for prompt in ("ROMEO:\n", "JULIET:\n", "KING HENRY:\n", "HAMLET:\n"):
        start = torch.tensor([tok.encode(prompt)])
        ids = generate(model, start, 64 - start.shape[1], temperature=0)
        with torch.no_grad():
            lp, lf = plain(ids)[0], fast(ids)[0]
        assert (lp - lf).abs().max() < 0.02 * (lp.max() - lp.min())
        agree += int((lp.argmax(-1) == lf.argmax(-1)).sum())
        total += ids.shape[1]
    assert agree / total >= 0.95


def test_int8_weights_keep_the_shipped_models_greedy_choices(course):
    model, tok = course.model, course.tokenizer
    q8 = quantize_model(model, 8)
    ids = generate(model, torch.tensor([tok.encode("ROMEO:\n")]), 57, temperature=0)
    with torch.no_grad():
        assert (model(ids)[0].argmax(-1) == q8(ids)[0].argmax(-1)).float().mean() >= 0.95


def test_weight_int8pack_mm_exists_and_agrees_with_the_plain_path():
    """PyTorch's weight-only int8 kernel (the benchmark times it): present in this torch, and it computes
    x @ (q * scale)^T."""
    assert hasattr(torch, "_weight_int8pack_mm")
    linear = torch.nn.Linear(64, 32, bias=False)
    ql = QuantLinear(linear, 8)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(torch._weight_int8pack_mm(x, ql.q, ql.scale), ql(x), atol=1e-4, rtol=1e-4)


def test_quantize_model_copies_and_counts_bytes(course):
    model = course.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q4 = quantize_model(model, 4, 32)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    quants = [m for m in q4.modules() if isinstance(m, QuantLinear)]
    assert len(quants) == len(linears) and not any(isinstance(m, torch.nn.Linear) for m in q4.modules())
    parts = model_weight_bytes(q4)
    assert parts["values"] == sum(m.weight.numel() for m in linears) / 2
    assert parts["scales"] == sum(m.weight.numel() for m in linears) / 32 * 4
