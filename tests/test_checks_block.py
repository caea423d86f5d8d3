"""Tests for chapter 05's exercise checks: the reference passes, a stub is "not done", and each
realistic mistake is rejected with the hint that names it."""

from __future__ import annotations

import math

import pytest
import torch

from transformer_course.block import block_parameter_count, input_gradient_norms
from transformer_course.checks import CheckOutcome
from transformer_course.checks._core import FAILED, NOT_DONE, PASSED
from transformer_course.checks.block import (
    check_block_forward,
    check_block_parameter_count,
    check_gelu_tanh,
    check_input_gradient_norms,
    check_layer_norm,
)


def _run(check, fn) -> CheckOutcome:
    return check(fn, quiet=True)


def _stub(*args, **kwargs):
    raise NotImplementedError("Exercise 5.x: your code here")


def _assert_fails(outcome: CheckOutcome, hint: str) -> None:
    assert outcome.status == FAILED, outcome.line()
    assert hint in outcome.message, outcome.message


@pytest.mark.parametrize(
    "check",
    [check_layer_norm, check_gelu_tanh, check_block_parameter_count, check_block_forward, check_input_gradient_norms],
)
def test_stub_is_not_done(check):
    assert _run(check, _stub).status == NOT_DONE


def test_check_prints_one_line(capsys):
    check_gelu_tanh(_stub)
    assert capsys.readouterr().out.startswith("⏳ Exercise 5.2 (my_gelu_tanh): not done")


def test_checks_do_not_disturb_the_global_random_state():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    for check, fn in ((check_block_forward, lambda b, x: b(x)), (check_input_gradient_norms, input_gradient_norms)):
        assert _run(check, fn).status == PASSED
    assert torch.equal(torch.rand(3), expected)


# ---------------------------------------------------------------- 5.1 layer norm


def _ln_reference(x, weight, bias, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def test_layer_norm_reference_passes():
    assert _run(check_layer_norm, _ln_reference).status == PASSED


@pytest.mark.parametrize(
    ("buggy", "hint"),
    [
        (lambda x, w, b, eps=1e-5: (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + eps) * w + b,
         "divided the variance by C - 1"),
        (lambda x, w, b, eps=1e-5: (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True, correction=0) + eps) * w + b,
         "(std + eps), as seed 002"),
        (lambda x, w, b, eps=1e-5: (x - x.mean(0, keepdim=True)) / torch.sqrt(x.var(0, keepdim=True, correction=0) + eps) * w + b,
         "not over the batch"),
        (lambda x, w, b, eps=1e-5: (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, correction=0) + eps),
         "then multiply by weight"),
        (lambda x, w, b, eps=1e-5: (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True, correction=0) * w + b,
         "gave NaN or inf: add eps inside the square root"),
        (lambda x, w, b, eps=1e-5: _ln_reference(x, w, b),  # ignores eps
         "use the eps argument"),
    ],
)
def test_layer_norm_mistakes_are_named(buggy, hint):
    _assert_fails(_run(check_layer_norm, buggy), hint)


def test_layer_norm_in_place_change_is_named():
    def in_place(x, w, b, eps=1e-5):
        x -= x.mean(-1, keepdim=True)
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w + b

    _assert_fails(_run(check_layer_norm, in_place), "do not change x in place")


# ---------------------------------------------------------------- 5.2 GELU (tanh)

C = math.sqrt(2 / math.pi)


def test_gelu_tanh_reference_passes():
    assert _run(check_gelu_tanh, lambda x: 0.5 * x * (1 + torch.tanh(C * (x + 0.044715 * x**3)))).status == PASSED


@pytest.mark.parametrize(
    ("buggy", "hint"),
    [
        (lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))), "that is the exact GELU"),
        (lambda x: 0.5 * x * (1 + torch.tanh(C * x)), "0.044715 x³ term is missing"),
        (lambda x: x * (1 + torch.tanh(C * (x + 0.044715 * x**3))), "multiply by 0.5"),
        (lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 * math.pi) * (x + 0.044715 * x**3))), "sqrt(2 / pi)"),
        (lambda x: 0.5 * x * (1 + torch.tanh(C * (x + 0.044715 * x**2))), "not x squared"),
        (lambda x: torch.relu(x), "values differ from 0.5 x"),
    ],
)
def test_gelu_tanh_mistakes_are_named(buggy, hint):
    _assert_fails(_run(check_gelu_tanh, buggy), hint)


# ---------------------------------------------------------------- 5.3 parameter count


def test_parameter_count_reference_passes():
    assert _run(check_block_parameter_count, block_parameter_count).status == PASSED


@pytest.mark.parametrize(
    ("buggy", "hint"),
    [
        (lambda C, bias=True: 12 * C * C + 2 * C, "count the bias vectors too"),
        (lambda C, bias=True: 12 * C * C + 13 * C, "with bias=False the Linear layers and LayerNorms have no bias"),
        (lambda C, bias=True: 12 * C * C + (9 * C if bias else 0), "include the two LayerNorms"),
        (lambda C, bias=True: 12 * C * C + (13 * C if bias else 0), "LayerNorms still have their gains"),
        (lambda C, bias=True: 11 * C * C + (12 * C if bias else 0) + 2 * C, "output projection proj"),
        (lambda C, bias=True: 6 * C * C + (7 * C if bias else 0) + 2 * C, "hidden width is 4C"),
        (lambda C, bias=True: float(block_parameter_count(C, bias)), "return a whole number"),
        (lambda C, bias=True: block_parameter_count(C, bias) + 1, "expected"),
    ],
)
def test_parameter_count_mistakes_are_named(buggy, hint):
    _assert_fails(_run(check_block_parameter_count, buggy), hint)


# ---------------------------------------------------------------- 5.4 block forward


def _forward_reference(block, x):
    if block.norm == "pre":
        x = x + block.attn(block.ln1(x))
        return x + block.mlp(block.ln2(x))
    x = block.ln1(x + block.attn(x))
    return block.ln2(x + block.mlp(x))


def test_block_forward_reference_passes():
    assert _run(check_block_forward, _forward_reference).status == PASSED


def _ln1_twice(block, x):  # seeds 000 and 004
    if block.norm == "pre":
        x = x + block.attn(block.ln1(x))
        return x + block.mlp(block.ln1(x))
    x = block.ln1(x + block.attn(x))
    return block.ln1(x + block.mlp(x))


def _always_post(block, x):
    x = block.ln1(x + block.attn(x))
    return block.ln2(x + block.mlp(x))


def _always_pre(block, x):
    x = x + block.attn(block.ln1(x))
    return x + block.mlp(block.ln2(x))


def _no_residual(block, x):
    if block.norm == "pre":
        return block.mlp(block.ln2(block.attn(block.ln1(x))))
    return block.ln2(block.mlp(block.ln1(block.attn(x))))


def _residual_on_normalised(block, x):
    h = block.ln1(x)
    h = block.ln2(h + block.attn(h))
    return h + block.mlp(h)


@pytest.mark.parametrize(
    ("buggy", "hint"),
    [
        (_ln1_twice, "using block.ln1 twice is the bug in seeds 000 and 004"),
        (_always_post, "with norm='pre' normalise each sublayer's input"),
        (_always_pre, "with norm='post' normalise after each addition"),
        (_no_residual, "the residual connection"),
        (_residual_on_normalised, "not to the normalised ln1(x)"),
        (lambda block, x: x, "differs from block(x)"),
    ],
)
def test_block_forward_mistakes_are_named(buggy, hint):
    _assert_fails(_run(check_block_forward, buggy), hint)


def test_block_forward_crash_is_reported():
    outcome = _run(check_block_forward, lambda block, x: block.attention(x))
    _assert_fails(outcome, "your code raised AttributeError")


# ---------------------------------------------------------------- 5.5 gradient norms


def test_input_gradient_norms_reference_passes():
    assert _run(check_input_gradient_norms, input_gradient_norms).status == PASSED


def _with_backward(layers, x, grad_output):
    """A correct alternative using .backward and retain_grad."""
    h = x.detach().requires_grad_(True)
    inputs = []
    for layer in layers:
        h.retain_grad()
        inputs.append(h)
        h = layer(h)
    h.backward(grad_output)
    return torch.stack([t.grad.norm() for t in inputs])


def test_input_gradient_norms_backward_variant_passes():
    assert _run(check_input_gradient_norms, _with_backward).status == PASSED


def _at_outputs(layers, x, grad_output):
    h = x
    outputs = []
    for layer in layers:
        h = layer(h)
        outputs.append(h)
    grads = torch.autograd.grad(h, outputs, grad_outputs=grad_output)
    return torch.stack([g.norm() for g in grads])


@pytest.mark.parametrize(
    ("buggy", "hint"),
    [
        (lambda layers, x, g: input_gradient_norms(layers, x, g).flip(0), "put the bottom layer first"),
        (_at_outputs, "at each layer's input, not its output"),
        (lambda layers, x, g: input_gradient_norms(layers, x, torch.ones_like(g)), "start the backward pass from grad_output"),
        (lambda layers, x, g: input_gradient_norms(layers, x, g) ** 2, "not its square"),
        (lambda layers, x, g: input_gradient_norms(layers, x, g)[:-1], "one number per layer"),
    ],
)
def test_input_gradient_norms_mistakes_are_named(buggy, hint):
    _assert_fails(_run(check_input_gradient_norms, buggy), hint)
