"""Checks for chapter 05's exercises (the transformer block). Hand-written.

Each check runs the learner's function against ``transformer_course.block`` (or PyTorch) on
ordinary and edge inputs, and when the answer is wrong, tries the usual mistakes one by one to
name the likely one. Checks build their own small modules under a forked random state, so they
never disturb the notebook's random numbers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._core import check, expect, expect_close


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _close(a, b, atol: float = 1e-5) -> bool:
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), atol=atol, rtol=1e-5))


def _tensor(got, what: str) -> torch.Tensor:
    expect(isinstance(got, torch.Tensor), f"{what} must return a torch.Tensor, got {type(got).__name__}")
    return got


# ---------------------------------------------------------------------------------------------
# 5.1 layer normalisation


def _ln_variants(x, weight, bias, eps):
    """(hint, output) for the usual mistakes in writing layer normalisation."""
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True, correction=0)
    x_hat = (x - mean) / torch.sqrt(var + eps)
    return [
        ("you divided the variance by C - 1 (torch.var's default); layer normalisation divides by C: "
         "use x.var(-1, correction=0) or (x - mean).pow(2).mean(-1)",
         (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + eps) * weight + bias),
        ("you divided by (std + eps), as seed 002 writes it; eps belongs inside the square root: "
         "(x - mean) / sqrt(var + eps)",
         (x - mean) / (var.sqrt() + eps) * weight + bias),
        ("normalise over the last dimension (dim=-1, one token's C numbers), not over the batch",
         (x - x.mean(0, keepdim=True)) / torch.sqrt(x.var(0, keepdim=True, correction=0) + eps) * weight + bias),
        ("normalise over the last dimension (dim=-1, one token's C numbers), not over the positions",
         (x - x.mean(-2, keepdim=True)) / torch.sqrt(x.var(-2, keepdim=True, correction=0) + eps) * weight + bias),
        ("the normalised values are right, but then multiply by weight (γ) and add bias (β)", x_hat),
        ("weight (γ) multiplies and bias (β) is added, not the other way round", x_hat * bias + weight),
        ("you normalised by the variance instead of the standard deviation: take its square root",
         (x - mean) / (var + eps) * weight + bias),
    ]


def _expect_layer_norm(got, x, weight, bias, eps: float) -> None:
    """Pass if ``got`` is layer_norm(x); otherwise name the first known mistake it matches."""
    want = F.layer_norm(x, (x.shape[-1],), weight, bias, eps=eps)
    if _close(got, want):
        return
    variants = _ln_variants(x, weight, bias, eps)
    if eps != 1e-5:
        variants.insert(0, (f"with eps={eps} the result is wrong: use the eps argument instead of a fixed 1e-5",
                            F.layer_norm(x, (x.shape[-1],), weight, bias, eps=1e-5)))
    for hint, variant in variants:
        expect(not _close(got, variant), hint)
    expect_close(got, want, f"with eps={eps} the values differ from (x - mean) / sqrt(var + eps) * weight + bias "
                            "over the last dimension")


@check("5.1", "my_layer_norm")
def check_layer_norm(fn):
    """``fn(x [..., C], weight [C], bias [C], eps=1e-5) -> [..., C]``."""
    g = _generator(51)
    x = 1.0 + 2.0 * torch.randn(3, 5, 8, generator=g)
    weight, bias = 1.0 + 0.5 * torch.randn(8, generator=g), 0.5 * torch.randn(8, generator=g)
    x_before = x.clone()
    got = _tensor(fn(x, weight, bias), "my_layer_norm")
    expect(torch.equal(x, x_before), "do not change x in place: compute a new tensor")
    expect(tuple(got.shape) == tuple(x.shape), f"keep the input's shape {tuple(x.shape)}, got {tuple(got.shape)}")
    _expect_layer_norm(got, x, weight, bias, 1e-5)
    # a token whose numbers are all equal: the variance is 0, eps keeps it finite
    flat = torch.full((2, 8), 3.0)
    got_flat = _tensor(fn(flat, weight, bias), "my_layer_norm")
    expect(bool(torch.isfinite(got_flat).all()),
           "a token whose numbers are all equal (variance 0) gave NaN or inf: add eps inside the square root")
    expect_close(got_flat, F.layer_norm(flat, (8,), weight, bias, eps=1e-5),
                 "a token whose numbers are all equal normalises to 0, so the output must equal bias")
    # a large eps makes eps's place in the formula visible (seed 002's (std + eps))
    _expect_layer_norm(_tensor(fn(x, weight, bias, eps=0.5), "my_layer_norm"), x, weight, bias, 0.5)
    # another width and a 2-D input
    wide = torch.randn(4, 64, generator=g) * 5.0 - 2.0
    expect_close(fn(wide, torch.ones(64), torch.zeros(64)), F.layer_norm(wide, (64,)),
                 "a [4, 64] input is normalised wrongly: work over the last dimension for any shape")


# ---------------------------------------------------------------------------------------------
# 5.2 GPT-2's tanh GELU


@check("5.2", "my_gelu_tanh")
def check_gelu_tanh(fn):
    """``fn(x) -> 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, elementwise."""
    x = torch.linspace(-5.0, 5.0, 201).reshape(3, 67)
    x_before = x.clone()
    got = _tensor(fn(x), "my_gelu_tanh")
    expect(torch.equal(x, x_before), "do not change x in place: compute a new tensor")
    expect(tuple(got.shape) == tuple(x.shape), f"keep the input's shape {tuple(x.shape)}, got {tuple(got.shape)}")
    want = F.gelu(x, approximate="tanh")
    if not _close(got, want):
        c = math.sqrt(2.0 / math.pi)
        variants = [
            ("that is the exact GELU (with erf); this exercise asks for GPT-2's tanh approximation",
             F.gelu(x)),
            ("the 0.044715 x³ term is missing inside the tanh: tanh(sqrt(2/pi) * (x + 0.044715 * x**3))",
             0.5 * x * (1 + torch.tanh(c * x))),
            ("the result is twice too large: multiply by 0.5", x * (1 + torch.tanh(c * (x + 0.044715 * x**3)))),
            ("the constant in front is sqrt(2 / pi) ≈ 0.798, not sqrt(2 * pi) or 2 / pi",
             0.5 * x * (1 + torch.tanh(math.sqrt(2 * math.pi) * (x + 0.044715 * x**3)))),
            ("the constant in front is sqrt(2 / pi) ≈ 0.798, not sqrt(2 * pi) or 2 / pi",
             0.5 * x * (1 + torch.tanh(2 / math.pi * (x + 0.044715 * x**3)))),
            ("the cubic term is 0.044715 * x**3 (x cubed), not x squared",
             0.5 * x * (1 + torch.tanh(c * (x + 0.044715 * x**2)))),
        ]
        for hint, variant in variants:
            expect(not _close(got, variant), hint)
        expect_close(got, want, "the values differ from 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³)))")


# ---------------------------------------------------------------------------------------------
# 5.3 parameter count


@check("5.3", "my_block_parameter_count")
def check_block_parameter_count(fn):
    """``fn(d_model, bias=True) -> int``: the parameters of one TransformerBlock."""
    from transformer_course.block import block_parameter_count

    for bias in (True, False):
        for C in (64, 4, 768):
            got = fn(C, bias=bias)
            expect(isinstance(got, int) and not isinstance(got, bool),
                   f"return a whole number (int), got {type(got).__name__} {got!r}")
            want = block_parameter_count(C, bias=bias)
            if got == want:
                continue
            b = 1 if bias else 0
            known = {
                12 * C * C + 2 * C: "count the bias vectors too (qkv 3C, attention proj C, fc 4C, mlp proj C, "
                                    "and each LayerNorm's β)",
                12 * C * C + 13 * C: "with bias=False the Linear layers and LayerNorms have no bias vectors",
                12 * C * C + b * 9 * C: "include the two LayerNorms: each has a gain γ of C numbers (and a bias β of C "
                                        "when bias=True)",
                12 * C * C: "with bias=False the LayerNorms still have their gains γ (C numbers each)",
                11 * C * C + b * 12 * C + 2 * C: "attention has an output projection proj (C -> C, plus C biases) "
                                                 "besides qkv",
                6 * C * C + b * 7 * C + 2 * C: "the feed-forward hidden width is 4C: fc is C -> 4C and proj 4C -> C",
                9 * C * C + b * 10 * C + 2 * C: "qkv maps C to 3C (queries, keys and values): 3C² weights, not C²",
            }
            hint = known.get(got, f"for d_model={C}, bias={bias} expected {want:,}, got {got:,}: add up attention "
                                  "(qkv and proj), feed-forward (fc and proj) and the two LayerNorms")
            expect(False, hint)


# ---------------------------------------------------------------------------------------------
# 5.4 the block's forward pass


def _distinct_block(norm: str, seed: int):
    """A small TransformerBlock whose two LayerNorms differ (so using the wrong one shows)."""
    from transformer_course.block import TransformerBlock

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = TransformerBlock(16, n_head=2, norm=norm).eval()
        with torch.no_grad():
            for ln in (block.ln1, block.ln2):
                ln.weight.normal_(1.0, 0.5)
                ln.bias.normal_(0.0, 0.5)
    return block


def _block_variants(block, x):
    """(hint, output) for the usual mistakes in a block's forward pass."""
    attn, mlp, ln1, ln2 = block.attn, block.mlp, block.ln1, block.ln2
    twice = "the second sublayer must use block.ln2; using block.ln1 twice is the bug in seeds 000 and 004"
    pre = x + attn(ln1(x))  # after the first pre-norm sublayer
    post = ln1(x + attn(x))  # after the first post-norm sublayer
    if block.norm == "pre":
        h = ln1(x)
        on_normed = ln2(h + attn(h))
        return [
            (twice, pre + mlp(ln1(pre))),
            ("with norm='pre' normalise each sublayer's input and add to the un-normalised x: "
             "x = x + attn(ln1(x)), then x = x + mlp(ln2(x)); you normalised after the addition (post-norm)",
             ln2(post + mlp(post))),
            ("add each sublayer's output back to its input (the residual connection): x = x + attn(ln1(x))",
             mlp(ln2(attn(ln1(x))))),
            ("the residual adds to the original x, not to the normalised ln1(x)", on_normed + mlp(on_normed)),
            ("the feed-forward sublayer needs its own residual: x = x + mlp(ln2(x))", mlp(ln2(pre))),
        ]
    return [
        (twice, ln1(post + mlp(post))),
        ("with norm='post' normalise after each addition: x = ln1(x + attn(x)), then x = ln2(x + mlp(x)); "
         "you normalised the sublayers' inputs (pre-norm)", pre + mlp(ln2(pre))),
        ("add each sublayer's output back to its input (the residual connection): x = ln1(x + attn(x))",
         ln2(mlp(ln1(attn(x))))),
        ("the feed-forward sublayer needs its own residual: x = ln2(x + mlp(x))", ln2(mlp(post))),
    ]


@check("5.4", "my_block_forward")
def check_block_forward(fn):
    """``fn(block, x [B, T, C]) -> [B, T, C]`` equal to ``block(x)`` for pre- and post-norm blocks."""
    x = torch.randn(2, 5, 16, generator=_generator(54))
    for seed, norm in enumerate(("pre", "post")):
        block = _distinct_block(norm, seed)
        with torch.no_grad():
            got = _tensor(fn(block, x.clone()), "my_block_forward")
            expect(tuple(got.shape) == tuple(x.shape), f"keep the shape [B, T, C] = {tuple(x.shape)}, got {tuple(got.shape)}")
            want = block(x)
            if not _close(got, want):
                for hint, variant in _block_variants(block, x):
                    expect(not _close(got, variant), hint)
                expect_close(got, want, f"with norm={norm!r} the output differs from block(x)")


# ---------------------------------------------------------------------------------------------
# 5.5 gradient reaching each layer


def _gradient_stack(seed: int):
    """Four small layers of clearly different gains, so order and off-by-one mistakes show."""
    from torch import nn

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers = []
        for gain in (0.5, 2.0, 0.8, 1.5):
            linear = nn.Linear(8, 8)
            with torch.no_grad():
                linear.weight.mul_(gain * 3.0)
            layers.append(nn.Sequential(linear, nn.Tanh()))
    return layers


@check("5.5", "my_input_gradient_norms")
def check_input_gradient_norms(fn):
    """``fn(layers, x, grad_output) -> Tensor[len(layers)]``: norm of dL/d(input of each layer)."""
    from transformer_course.block import input_gradient_norms

    layers = _gradient_stack(55)
    g = _generator(55)
    x, grad_out = torch.randn(3, 5, 8, generator=g), torch.randn(3, 5, 8, generator=g)
    got = _tensor(fn(layers, x.clone(), grad_out.clone()), "my_input_gradient_norms")
    expect(got.ndim == 1 and got.numel() == len(layers),
           f"return one number per layer: shape [{len(layers)}], got {tuple(got.shape)}")
    got = got.detach()
    want = input_gradient_norms(layers, x, grad_out)
    if not _close(got, want, atol=1e-4):
        with torch.enable_grad():
            outputs_side = torch.cat([input_gradient_norms(layers[1:], _through(layers[:1], x), grad_out), grad_out.norm()[None]])
        variants = [
            ("put the bottom layer first: entry 0 belongs to layers[0], the layer that receives x", want.flip(0)),
            ("record the gradient at each layer's input, not its output: entry 0 is the gradient at x itself",
             outputs_side),
            ("start the backward pass from grad_output (out.backward(grad_output) or "
             "torch.autograd.grad(out, inputs, grad_outputs=grad_output)), not from out.sum()",
             input_gradient_norms(layers, x, torch.ones_like(grad_out))),
            ("return the norm of each gradient, not its square", want.pow(2)),
        ]
        for hint, variant in variants:
            expect(not _close(got, variant, atol=1e-4), hint)
        expect_close(got, want, "the gradient norms differ from the reference", atol=1e-4)
    # a stack of transformer blocks works too
    from transformer_course.block import TransformerBlock

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(56)
        blocks = [TransformerBlock(16, n_head=2) for _ in range(3)]
    xb, gb = torch.randn(2, 4, 16, generator=g), torch.randn(2, 4, 16, generator=g)
    got = _tensor(fn(blocks, xb, gb), "my_input_gradient_norms").detach()
    expect_close(got, input_gradient_norms(blocks, xb, gb),
                 "on a stack of 3 TransformerBlocks the norms differ from the reference", atol=1e-4)


def _through(layers, x):
    for layer in layers:
        x = layer(x)
    return x.detach()
