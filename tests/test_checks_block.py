"""Tests for chapter 05's exercise checks: the reference and rewrites pass, and each realistic
mistake is rejected with the hint that names it (tests/test_checks_all.py runs every check on a
stub and on its reference)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from check_helpers import assert_rejected, run, stub

from transformer_course.block import (
    LayerNorm,
    TransformerBlock,
    block_parameter_count,
    input_gradient_norms,
)
from transformer_course.checks.block import (
    ParallelBlock,
    check_gelu_tanh,
    check_input_gradient_norms,
    check_layer_norm,
    check_parallel_block,
    check_predict_block_parameters,
    check_transformer_block,
)


def test_check_prints_one_line(capsys):
    check_gelu_tanh(stub)
    assert capsys.readouterr().out.startswith("⏳ Exercise 5.2 (my_gelu_tanh): not done")
    check_layer_norm(LayerNorm)
    assert capsys.readouterr().out == (
        "✅ Exercise 5.1 (LayerNorm): passed - the rest of the chapter uses yours\n")


# ---------------------------------------------------------------- 5.1 LayerNorm (build)


def _layer_norm_with(teaching):
    """A LayerNorm whose teaching path is ``teaching(self, x)``."""

    class Candidate(LayerNorm):
        def forward(self, x):
            if self.fast:
                return super().forward(x)
            return teaching(self, x)

    return Candidate


def _formula(self, x, var=None, eps=None, dim=-1):
    mean = x.mean(dim, keepdim=True)
    var = (x - mean).pow(2).mean(dim, keepdim=True) if var is None else var
    y = (x - mean) / torch.sqrt(var + (self.eps if eps is None else eps)) * self.weight
    return y if self.bias is None else y + self.bias


def test_layer_norm_reference_and_a_rewrite_pass():
    assert run(check_layer_norm, LayerNorm).passed
    rewrite = _layer_norm_with(
        lambda self, x: _formula(self, x, var=x.var(-1, keepdim=True, correction=0))
    )
    assert run(check_layer_norm, rewrite).passed


def _in_place(self, x):
    x -= x.mean(-1, keepdim=True)
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight + self.bias


@pytest.mark.parametrize(
    ("teaching", "hint"),
    [
        (
            lambda self, x: _formula(self, x, var=x.var(-1, keepdim=True)),
            "divided the variance by C - 1",
        ),
        (
            lambda self, x: (
                (x - x.mean(-1, keepdim=True))
                / (x.std(-1, keepdim=True, correction=0) + self.eps)
                * self.weight
                + self.bias
            ),
            "(std + eps), as source 2",
        ),
        (lambda self, x: _formula(self, x, dim=0), "not over the batch"),
        (lambda self, x: F.layer_norm(x, (self.d_model,), eps=self.eps), "then multiply by weight"),
        (lambda self, x: _formula(self, x, eps=1e-5), "use self.eps"),
        (
            lambda self, x: (
                (x - x.mean(-1, keepdim=True))
                / torch.sqrt(x.var(-1, keepdim=True, correction=0) + self.eps)
                * self.weight
                + self.bias
            ),
            "self.bias is None",
        ),
        (_in_place, "do not change x in place"),
        (lambda self, x: _formula(self, x).detach(), "cut off from weight and bias"),
    ],
)
def test_layer_norm_mistakes_are_named(teaching, hint):
    assert_rejected(check_layer_norm, _layer_norm_with(teaching), hint)


# ---------------------------------------------------------------- 5.2 GELU (tanh, debug)

C = math.sqrt(2 / math.pi)


def test_gelu_tanh_reference_passes():
    assert run(
        check_gelu_tanh, lambda x: 0.5 * x * (1 + torch.tanh(C * (x + 0.044715 * x**3)))
    ).passed


@pytest.mark.parametrize(
    ("buggy", "hint"),
    [
        # the chapter's planted bug: sqrt(2 * pi) for sqrt(2 / pi)
        (
            lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 * math.pi) * (x + 0.044715 * x**3))),
            "sqrt(2 / pi)",
        ),
        (lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))), "that is the exact GELU"),
        (lambda x: 0.5 * x * (1 + torch.tanh(C * x)), "0.044715 x³ term is missing"),
        (lambda x: x * (1 + torch.tanh(C * (x + 0.044715 * x**3))), "multiply by 0.5"),
        (lambda x: 0.5 * x * (1 + torch.tanh(C * (x + 0.044715 * x**2))), "not x squared"),
        (lambda x: torch.relu(x), "values differ from 0.5 x"),
        (lambda x: 0.5 * x.float() * (1 + torch.tanh(C * (x.float() + 0.044715 * x.float()**3))),
         "float64 input should give float64"),
        # PyTorch's own GELU, which the chapter names two cells above: right values, not the exercise
        (lambda x: F.gelu(x, approximate="tanh"), "calls PyTorch's GELU"),
        (lambda x: torch.nn.GELU(approximate="tanh")(x), "calls PyTorch's GELU"),
    ],
)
def test_gelu_tanh_mistakes_are_named(buggy, hint):
    assert_rejected(check_gelu_tanh, buggy, hint)


def test_gelu_tanh_in_place_change_is_named():
    def in_place(x):
        return x.mul_(0.5 * (1 + torch.tanh(C * (x + 0.044715 * x**3))))

    assert_rejected(check_gelu_tanh, in_place, "do not change x in place")


# ---------------------------------------------------------------- 5.3 the block's forward (build)


def _block_with(forward):
    class Candidate(TransformerBlock):
        def forward(self, x, mask=None, cache=None):
            return forward(self, x, mask, cache)

    return Candidate


def _right(b, x, mask, cache):
    if b.norm == "pre":
        x = x + b.attn(b.ln1(x), mask=mask, cache=cache)
        return x + b.mlp(b.ln2(x))
    x = b.ln1(x + b.attn(x, mask=mask, cache=cache))
    return b.ln2(x + b.mlp(x))


def _ln1_twice(b, x, mask, cache):  # sources 0 and 4
    if b.norm == "pre":
        x = x + b.attn(b.ln1(x), mask=mask, cache=cache)
        return x + b.mlp(b.ln1(x))
    x = b.ln1(x + b.attn(x, mask=mask, cache=cache))
    return b.ln1(x + b.mlp(x))


def _always_post(b, x, mask, cache):
    x = b.ln1(x + b.attn(x, mask=mask, cache=cache))
    return b.ln2(x + b.mlp(x))


def _always_pre(b, x, mask, cache):
    x = x + b.attn(b.ln1(x), mask=mask, cache=cache)
    return x + b.mlp(b.ln2(x))


def _no_residual(b, x, mask, cache):
    if b.norm == "pre":
        return b.mlp(b.ln2(b.attn(b.ln1(x), mask=mask, cache=cache)))
    return b.ln2(b.mlp(b.ln1(b.attn(x, mask=mask, cache=cache))))


def _residual_on_normalised(b, x, mask, cache):  # pre-norm that adds the normalised x
    if b.norm == "post":
        return _right(b, x, mask, cache)
    h = b.ln1(x)
    x = h + b.attn(h, mask=mask, cache=cache)
    h = b.ln2(x)
    return h + b.mlp(h)


def _ignores_mask(b, x, mask, cache):
    return _right(b, x, None, cache)


def _ignores_cache(b, x, mask, cache):
    return _right(b, x, mask, None)


def _in_place(b, x, mask, cache):
    if b.norm == "pre":
        x += b.attn(b.ln1(x), mask=mask, cache=cache)
        x += b.mlp(b.ln2(x))
        return x
    return _right(b, x, mask, cache)


def _no_attention_residual(b, x, mask, cache):
    if b.norm == "pre":
        x = b.attn(b.ln1(x), mask=mask, cache=cache)
        return x + b.mlp(b.ln2(x))
    x = b.ln1(b.attn(x, mask=mask, cache=cache))
    return b.ln2(x + b.mlp(x))


def _post_without_attention_residual(b, x, mask, cache):
    return _no_attention_residual(b, x, mask, cache) if b.norm == "post" else _right(b, x, mask, cache)


def test_block_reference_and_rewrite_pass():
    assert run(check_transformer_block, TransformerBlock).passed
    assert run(check_transformer_block, _block_with(_right)).passed


@pytest.mark.parametrize(
    ("forward", "hint"),
    [
        (_ln1_twice, "using block.ln1 twice is the bug in sources 0 and 4"),
        (_always_post, "with norm='pre' normalise each sublayer's input"),
        (_always_pre, "with norm='post' normalise after each addition"),
        (_no_residual, "the residual connection"),
        (_residual_on_normalised, "not to the normalised ln1(x)"),
        (_ignores_mask, "pass mask=mask on to self.attn"),
        (_ignores_cache, "pass cache=cache on to self.attn"),
        (_in_place, "do not change x in place"),
        (_no_attention_residual, "the attention sublayer needs its residual: x = x + attn(ln1(x))"),
        (_post_without_attention_residual, "needs its residual: x = ln1(x + attn(x))"),
        (lambda b, x, mask, cache: x, "differs from the block's definition"),
    ],
)
def test_block_mistakes_are_named(forward, hint):
    assert_rejected(check_transformer_block, _block_with(forward), hint)


def test_block_crash_is_reported():
    assert_rejected(check_transformer_block, _block_with(lambda b, x, mask, cache: b.attention(x)),
                    "your code raised AttributeError")


# ---------------------------------------------------------------- 5.4 predict: a GPT-2 block


def test_block_parameters_prediction_passes():
    assert run(check_predict_block_parameters, lambda: 7_087_872).passed
    assert run(check_predict_block_parameters, lambda: block_parameter_count(768)).passed
    assert run(
        check_predict_block_parameters,
        lambda: sum(p.numel() for p in TransformerBlock(768, 12).parameters()),
    ).passed


@pytest.mark.parametrize(
    ("answer", "hint"),
    [
        (12 * 768**2 + 2 * 768, "count the bias vectors too"),
        (12 * 768**2 + 9 * 768, "include the two LayerNorms"),
        (12 * 768**2, "count the biases and the two LayerNorms"),
        (11 * 768**2 + 14 * 768, "output projection proj"),
        (6 * 768**2 + 11 * 768, "hidden width is 4C"),
        (12 * 7_087_872, "GPT-2 small's 12 blocks together"),
        ("7,087,872", "return a whole number"),
        (7_087_873, "add up attention"),
    ],
)
def test_block_parameters_mistakes_are_named(answer, hint):
    assert_rejected(check_predict_block_parameters, lambda: answer, hint)


# ---------------------------------------------------------------- 5.5 gradient norms (build)


def test_input_gradient_norms_reference_passes():
    assert run(check_input_gradient_norms, input_gradient_norms).passed


def _with_backward(layers, x, grad_output):
    """Right numbers, but .backward() fills every parameter's .grad."""
    h = x.detach().requires_grad_(True)
    inputs = []
    for layer in layers:
        h.retain_grad()
        inputs.append(h)
        h = layer(h)
    h.backward(grad_output)
    return torch.stack([t.grad.norm() for t in inputs])


def _on_callers_x(layers, x, grad_output):
    h = x.requires_grad_(True)
    inputs = []
    for layer in layers:
        inputs.append(h)
        h = layer(h)
    return torch.stack([g.norm() for g in torch.autograd.grad(h, inputs, grad_outputs=grad_output)])


def _with_history(layers, x, grad_output):
    h = x.detach().requires_grad_(True)
    inputs = []
    for layer in layers:
        inputs.append(h)
        h = layer(h)
    grads = torch.autograd.grad(h, inputs, grad_outputs=grad_output, create_graph=True)
    return torch.stack([g.norm() for g in grads])


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
        (_with_backward, "the layers' parameters got a .grad"),
        (_on_callers_x, "switched on requires_grad of the caller's x"),
        (_with_history, "without autograd history"),
        (
            lambda layers, x, g: input_gradient_norms(layers, x, g).flip(0),
            "put the bottom layer first",
        ),
        (_at_outputs, "at each layer's input, not its output"),
        (
            lambda layers, x, g: input_gradient_norms(layers, x, torch.ones_like(g)),
            "start the backward pass from grad_output",
        ),
        (lambda layers, x, g: input_gradient_norms(layers, x, g) ** 2, "not its square"),
        (lambda layers, x, g: input_gradient_norms(layers, x, g)[:-1], "one number per layer"),
    ],
)
def test_input_gradient_norms_mistakes_are_named(buggy, hint):
    assert_rejected(check_input_gradient_norms, buggy, hint)


# ---------------------------------------------------------------- 5.6 the parallel block (extend)


def _parallel_with(forward):
    class Candidate(TransformerBlock):
        def forward(self, x, mask=None, cache=None):
            return forward(self, x, mask, cache)

    return Candidate


def _parallel_right(b, x, mask, cache):
    h = b.ln1(x)
    return x + b.attn(h, mask=mask, cache=cache) + b.mlp(h)


def test_parallel_block_reference_and_a_rewrite_pass():
    assert run(check_parallel_block, ParallelBlock).passed
    assert run(check_parallel_block, _parallel_with(_parallel_right)).passed


def test_the_parallel_block_is_not_the_sequential_one_with_the_same_weights():
    torch.manual_seed(0)
    sequential = TransformerBlock(16, n_head=2).eval()
    parallel = ParallelBlock(16, n_head=2).eval()
    parallel.load_state_dict(sequential.state_dict())
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        h = parallel.ln1(x)
        torch.testing.assert_close(parallel(x), x + parallel.attn(h) + parallel.mlp(h))
        assert (parallel(x) - sequential(x)).abs().max() > 0.01


@pytest.mark.parametrize(
    ("forward", "hint"),
    [
        (lambda b, x, mask, cache: TransformerBlock.forward(b, x, mask, cache), "section 5's sequential block"),
        (lambda b, x, mask, cache: (a := x + b.attn(b.ln1(x), mask=mask, cache=cache)) + b.mlp(b.ln1(a)),
         "the MLP reads the attention's result"),
        (lambda b, x, mask, cache: x + b.attn(b.ln1(x), mask=mask, cache=cache) + b.mlp(b.ln2(x)),
         "not self.ln2"),
        (lambda b, x, mask, cache: (h := b.ln1(x)) + b.attn(h, mask=mask, cache=cache) + b.mlp(h),
         "not to the normalised ln1(x)"),
        (lambda b, x, mask, cache: b.attn(h := b.ln1(x), mask=mask, cache=cache) + b.mlp(h), "residual is missing"),
        (lambda b, x, mask, cache: x + b.attn(b.ln1(x), mask=mask, cache=cache), "the MLP's output is missing"),
        (lambda b, x, mask, cache: x + b.mlp(b.ln1(x)), "the attention's output is missing"),
        (lambda b, x, mask, cache: _parallel_right(b, x, None, cache), "pass mask=mask on to self.attn"),
        (lambda b, x, mask, cache: _parallel_right(b, x, mask, None), "pass cache=cache on to self.attn"),
    ],
)
def test_parallel_block_mistakes_are_named(forward, hint):
    assert_rejected(check_parallel_block, _parallel_with(forward), hint)
