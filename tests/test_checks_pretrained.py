"""The chapter 08 checks accept the reference, reject realistic mistakes with the right hint, and
report a stub that raises NotImplementedError as "not done"."""

import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.checks import CheckOutcome
from transformer_course.checks.pretrained import (
    check_gelu_tanh,
    check_linear_from_conv1d,
    check_load_block,
    check_split_qkv,
)

ALL_CHECKS = [check_linear_from_conv1d, check_split_qkv, check_gelu_tanh, check_load_block]


def run(check_fn, candidate) -> CheckOutcome:
    return check_fn(candidate, quiet=True)


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise: write me")


@pytest.mark.parametrize("check_fn", ALL_CHECKS)
def test_stub_is_not_done(check_fn):
    outcome = run(check_fn, stub)
    assert outcome.status == "not done"
    assert outcome.exercise == check_fn.exercise


# ---------------------------------------------------------------- 8.1


def _linear(weight, bias, transform=lambda W: W.T, copy_bias=True):
    n_in, n_out = weight.shape
    layer = nn.Linear(n_in, n_out)
    with torch.no_grad():
        layer.weight.copy_(transform(weight))
        if copy_bias:
            layer.bias.copy_(bias)
    return layer


def _linear_no_transpose(weight, bias):
    layer = nn.Linear(*weight.shape)
    layer.weight.data = weight.clone()  # [in, out] kept as it is
    layer.bias.data = bias.clone()
    return layer


def test_linear_reference_passes():
    assert run(check_linear_from_conv1d, _linear).passed


@pytest.mark.parametrize("candidate, hint", [
    (_linear_no_transpose, "transpose the Conv1D weight"),
    (lambda W, b: _linear(W, b, transform=lambda W: W.reshape(W.shape[1], W.shape[0])), "reshape"),
    (lambda W, b: _linear(W, b, copy_bias=False), "copy b into layer.bias"),
    (lambda W, b: nn.Linear(W.shape[0], W.shape[1], bias=False), "has no bias"),
    (lambda W, b: _linear(W, b, transform=lambda W: W.T.contiguous() if W.shape[0] != W.shape[1] else W),
     "square weight was copied as it is"),
])
def test_linear_mistakes_are_named(candidate, hint):
    outcome = run(check_linear_from_conv1d, candidate)
    assert outcome.status == "failed"
    assert hint in outcome.message


# ---------------------------------------------------------------- 8.2


def _split(packed, n_head):
    B, T, C3 = packed.shape
    C = C3 // 3
    return tuple(t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in packed.split(C, dim=-1))


def test_split_reference_passes():
    assert run(check_split_qkv, _split).passed


def _interleaved(packed, n_head):
    B, T, C3 = packed.shape
    return tuple(packed.view(B, T, n_head, 3, C3 // 3 // n_head).permute(3, 0, 2, 1, 4))


@pytest.mark.parametrize("candidate, hint", [
    (_interleaved, "split into three C-wide parts first"),
    (lambda p, nh: tuple(t.view(p.shape[0], p.shape[1], nh, -1) for t in p.split(p.shape[-1] // 3, -1)),
     "add .transpose(1, 2)"),
    (lambda p, nh: tuple(t.reshape(p.shape[0], nh, p.shape[1], -1) for t in p.split(p.shape[-1] // 3, -1)),
     "view as [B, T, nh, hs], then transpose(1, 2)"),
    (lambda p, nh: (_split(p, nh)[0],) * 3, "k equals q"),
    (lambda p, nh: _split(p, nh)[:2], "return three tensors"),
])
def test_split_mistakes_are_named(candidate, hint):
    outcome = run(check_split_qkv, candidate)
    assert outcome.status == "failed"
    assert hint in outcome.message


# ---------------------------------------------------------------- 8.3

_C = math.sqrt(2 / math.pi)


def test_gelu_reference_passes():
    assert run(check_gelu_tanh, lambda x: 0.5 * x * (1 + torch.tanh(_C * (x + 0.044715 * x**3)))).passed


@pytest.mark.parametrize("candidate, hint", [
    (F.gelu, "exact (erf) GELU"),
    (lambda x: 0.5 * x * (1 + torch.tanh(x + 0.044715 * x**3)), "scaled by √(2/π)"),
    (lambda x: 0.5 * x * (1 + torch.tanh(_C * x)), "cubic term is missing"),
    (lambda x: x * (1 + torch.tanh(_C * (x + 0.044715 * x**3))), "twice too large"),
    (lambda x: 0.5 * x * (1 + torch.tanh(_C * (x + 0.44715 * x**3))), "differs from the tanh approximation"),
])
def test_gelu_mistakes_are_named(candidate, hint):
    outcome = run(check_gelu_tanh, candidate)
    assert outcome.status == "failed"
    assert hint in outcome.message


# ---------------------------------------------------------------- 8.4

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="exercise 8.4 compares with transformers' GPT2Block")

NAMES = {  # HF name -> (our name, transpose?)
    "ln_1.weight": ("ln1.weight", False), "ln_1.bias": ("ln1.bias", False),
    "attn.c_attn.weight": ("attn.qkv.weight", True), "attn.c_attn.bias": ("attn.qkv.bias", False),
    "attn.c_proj.weight": ("attn.proj.weight", True), "attn.c_proj.bias": ("attn.proj.bias", False),
    "ln_2.weight": ("ln2.weight", False), "ln_2.bias": ("ln2.bias", False),
    "mlp.c_fc.weight": ("mlp.fc.weight", True), "mlp.c_fc.bias": ("mlp.fc.bias", False),
    "mlp.c_proj.weight": ("mlp.proj.weight", True), "mlp.c_proj.bias": ("mlp.proj.bias", False),
}


def _load_block(block, tensors, names=NAMES, skip_transpose=()):
    params = dict(block.named_parameters())
    for hf_name, (ours, transpose) in names.items():
        t = tensors[hf_name]
        params[ours].copy_(t.T if transpose and hf_name not in skip_transpose else t)


@needs_transformers
def test_load_block_reference_passes():
    assert run(check_load_block, _load_block).passed


SWAPPED_LN = {**NAMES, "ln_1.weight": ("ln2.weight", False), "ln_2.weight": ("ln1.weight", False)}


@pytest.mark.parametrize("candidate, hint", [
    (lambda b, t: _load_block(b, t, skip_transpose={"attn.c_proj.weight"}), "holds attn.c_proj.weight untransposed"),
    (lambda b, t: _load_block(b, t, names=SWAPPED_LN), "ln1.weight holds ln_2.weight"),
    (lambda b, t: _load_block(b, t, names={k: v for k, v in NAMES.items() if "bias" not in k}),
     "ln1.bias differs from ln_1.bias"),
])
@needs_transformers
def test_load_block_mistakes_are_named(candidate, hint):
    outcome = run(check_load_block, candidate)
    assert outcome.status == "failed"
    assert hint in outcome.message


def test_load_block_without_transformers_says_what_to_install(monkeypatch):
    import transformer_course.checks.pretrained as checks

    def missing():
        raise ImportError("make_hf_stand_in needs transformers")

    monkeypatch.setattr(checks, "_reference_block", missing)
    outcome = run(check_load_block, lambda block, tensors: None)
    assert outcome.status == "failed"
    assert "pip install 'transformer-course[pretrained]'" in outcome.message
