"""Checks for chapter 05's exercises (the transformer block). Hand-written.

When an answer is wrong, the usual mistakes are tried one by one (the tables of (hint, what the mistake gives) below) to
name the likely one. Checks build their own small modules under :func:`fresh_rng`, so they never disturb the notebook's
random numbers. 5.2 (debug) and 5.6 (extend) have the small references :func:`gelu_tanh` and :class:`ParallelBlock`."""

import contextlib
import math

import torch
import torch.nn.functional as F

from .. import block as _lib
from ._core import check, expect, expect_answer, expect_close, expect_runs, expect_tensor, expect_unchanged, fresh_rng

__all__ = ["ParallelBlock", "check_gelu_tanh", "check_input_gradient_norms", "check_layer_norm",
           "check_parallel_block", "check_predict_block_parameters", "check_transformer_block", "gelu_tanh"]


_WIDE = "a [4, 64] input is normalised wrongly: work over the last dimension for any shape"
_BY_C = "normalise over the last dimension (dim=-1, one token's C numbers), not over the"
_generator = lambda seed: torch.Generator().manual_seed(seed)


def _output(module, x, what: str, before=None, in_place=None, shape: str = "the input's shape") -> torch.Tensor:
    """``module(x)``, a tensor of x's shape; x left as it was (``before``, or as it is now) or the hint ``in_place``."""
    before = x.clone() if before is None else before
    got = expect_tensor(module(x), what=what)
    expect_unchanged(x, before, in_place)
    expect(tuple(got.shape) == tuple(x.shape), f"keep {shape} {tuple(x.shape)}, got {tuple(got.shape)}")
    return got


# ---------------------------------------------------------------- 5.1 layer normalisation (build: LayerNorm.forward)
def _ln_mistakes(x, weight, bias, eps):
    """(hint, output) for the usual mistakes in writing layer normalisation."""
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, correction=0)
    x_hat = (x - mean) / torch.sqrt(var + eps)

    def normalised_over(dim):
        centred = x - x.mean(dim, keepdim=True)
        return centred / torch.sqrt(x.var(dim, keepdim=True, correction=0) + eps) * weight + bias

    return [
        ("you divided the variance by C - 1 (torch.var's default); layer normalisation divides by C: use "
         "x.var(-1, correction=0) or (x - mean).pow(2).mean(-1)",
         (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + eps) * weight + bias),
        ("you divided by (std + eps), as source 2 writes it; eps belongs inside the square root: "
         "(x - mean) / sqrt(var + eps)", (x - mean) / (var.sqrt() + eps) * weight + bias),
        (f"{_BY_C} batch", normalised_over(0)),
        (f"{_BY_C} positions", normalised_over(-2)),
        ("the normalised values are right, but then multiply by weight (γ) and add bias (β)", x_hat),
        ("weight (γ) multiplies and bias (β) is added, not the other way round", x_hat * bias + weight),
        ("you normalised by the variance instead of the standard deviation: take its square root",
         (x - mean) / (var + eps) * weight + bias),
    ]


def _expect_layer_norm(got, x, weight, bias, eps: float) -> None:
    """Pass if ``got`` is layer_norm(x); otherwise name the first known mistake it matches."""
    mistakes = _ln_mistakes(x, weight, bias, eps)
    if eps != 1e-5:
        mistakes.insert(0, (f"with eps={eps} the result is wrong: use self.eps instead of a fixed 1e-5",
                            F.layer_norm(x, (x.shape[-1],), weight, bias, eps=1e-5)))
    expect_close(got, F.layer_norm(x, (x.shape[-1],), weight, bias, eps=eps), f"with eps={eps} the values differ from "
                 "(x - mean) / sqrt(var + eps) * weight + bias over the last dimension", mistakes=mistakes)


def _layer_norm(cls, C: int, seed: int, **kwargs):
    """``cls(C, fast=False, **kwargs)`` with random gain (and bias), under a fresh random state."""
    with fresh_rng(seed):
        ln = cls(C, fast=False, **kwargs)
        with torch.no_grad():
            ln.weight.copy_(1.0 + 0.5 * torch.randn(C))
            if ln.bias is not None:
                ln.bias.copy_(0.5 * torch.randn(C))
    return ln


@check("5.1", "LayerNorm", reference=_lib.LayerNorm)
def check_layer_norm(cls):
    """``cls(C, eps, bias, fast=False)(x [..., C]) -> [..., C]``: the step-by-step formula."""
    what, g = "a tensor from LayerNorm(fast=False)", _generator(51)
    x = 1.0 + 2.0 * torch.randn(3, 5, 8, generator=g)
    ln = _layer_norm(cls, 8, seed=51)
    weight, bias = ln.weight.detach(), None if ln.bias is None else ln.bias.detach()
    with torch.no_grad():
        got = _output(ln, x, what)
    _expect_layer_norm(got, x, weight, bias, 1e-5)
    flat = torch.full((2, 8), 3.0)  # a token whose numbers are all equal: the variance is 0, eps keeps it finite
    with torch.no_grad():
        got_flat = expect_tensor(ln(flat), what=what)
    expect(bool(torch.isfinite(got_flat).all()), "a token whose numbers are all equal (variance 0) gave NaN or inf: "
                                                 "add eps inside the square root")
    expect_close(got_flat, F.layer_norm(flat, (8,), weight, bias, eps=1e-5), "a token whose numbers are all equal "
                 "normalises to 0, so the output must equal bias")
    wide_eps = _layer_norm(cls, 8, seed=51, eps=0.5)  # a large eps shows eps's place (source 2's (std + eps))
    with torch.no_grad():
        _expect_layer_norm(expect_tensor(wide_eps(x), what=what), x, weight, bias, 0.5)
    no_bias = _layer_norm(cls, 8, seed=52, bias=False)  # without a bias: self.bias is None
    wide = torch.randn(4, 64, generator=g) * 5.0 - 2.0  # another width and a 2-D input
    with torch.no_grad():
        got_nb = expect_runs(no_bias, x, errors=TypeError, hint="with bias=False, self.bias is None: add it only "
                                                                "when it exists")
        expect_close(got_nb, F.layer_norm(x, (8,), no_bias.weight.detach(), None, eps=1e-5),
                     "with bias=False the output is the normalised x times weight, with nothing added")
        expect_close(cls(64, fast=False)(wide), F.layer_norm(wide, (64,)), _WIDE)
    ln.zero_grad()  # the output must stay connected to γ and β, or they never learn
    out = ln(x)
    expect(isinstance(out, torch.Tensor) and out.requires_grad, "the output is cut off from weight and bias, so they "
           "could never learn: no .detach(), .item() or torch.no_grad() inside forward")
    out.sum().backward()
    expect(ln.weight.grad is not None and ln.bias.grad is not None and bool(ln.weight.grad.abs().sum() > 0),
           "weight (γ) and bias (β) get no gradient: use self.weight and self.bias in the formula")


# ---------------------------------------------------------------- 5.2 GPT-2's tanh GELU (debug)
def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh approximation of GELU, elementwise: the chapter's fallback when 5.2 is not done (the formula
    itself, as the exercise asks: the check refuses a call of F.gelu)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


class _GeluCalled(Exception):
    pass


@contextlib.contextmanager
def _without_torch_gelu():
    """F.gelu (and nn.GELU, which calls it) raise while the learner's function runs."""
    def refused(*args, **kwargs):
        raise _GeluCalled

    saved, F.gelu = F.gelu, refused
    try:
        yield
    finally:
        F.gelu = saved


def _gelu_mistakes(x):
    """(hint, output) for the usual slips in writing the tanh GELU."""
    c, cubic = math.sqrt(2.0 / math.pi), x + 0.044715 * x**3
    constant = "the constant in front is sqrt(2 / pi) ≈ 0.798, not sqrt(2 * pi) or 2 / pi"
    return [
        ("that is the exact GELU (with erf); this exercise asks for GPT-2's tanh approximation", F.gelu(x)),
        ("the 0.044715 x³ term is missing inside the tanh: tanh(sqrt(2/pi) * (x + 0.044715 * x**3))",
         0.5 * x * (1 + torch.tanh(c * x))),
        ("the result is twice too large: multiply by 0.5", x * (1 + torch.tanh(c * cubic))),
        (constant, 0.5 * x * (1 + torch.tanh(math.sqrt(2 * math.pi) * cubic))),
        (constant, 0.5 * x * (1 + torch.tanh(2 / math.pi * cubic))),
        ("the cubic term is 0.044715 * x**3 (x cubed), not x squared",
         0.5 * x * (1 + torch.tanh(c * (x + 0.044715 * x**2)))),
    ]


@check("5.2", "my_gelu_tanh", reference=gelu_tanh)
def check_gelu_tanh(fn):
    """``fn(x) -> 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, elementwise."""
    what = "a tensor from my_gelu_tanh"
    x = torch.linspace(-5.0, 5.0, 201).reshape(3, 67)
    x_before = x.clone()
    try:
        with _without_torch_gelu():
            fn(x)
    except _GeluCalled:
        expect(False, "my_gelu_tanh calls PyTorch's GELU (F.gelu or nn.GELU): write the formula of the cell above "
                      "with torch.tanh, fixed, so you know what GPT-2 computes")
    got = _output(fn, x, what, before=x_before)
    expect_close(got, F.gelu(x, approximate="tanh"), "the values differ from 0.5 x (1 + tanh(sqrt(2/pi) (x + "
                 "0.044715 x³)))", mistakes=_gelu_mistakes(x))
    x64 = torch.linspace(-6.0, 6.0, 101, dtype=torch.float64)
    got64 = expect_tensor(fn(x64), what=what)
    expect(got64.dtype == torch.float64, f"a float64 input should give float64 output, got {got64.dtype}")
    expect_close(got64, F.gelu(x64, approximate="tanh"), "in float64 the values differ from PyTorch's tanh GELU",
                 atol=1e-10, rtol=1e-10)


# ---------------------------------------------------------------- 5.3 the block's forward pass (build)
def _distinct_block(cls, norm: str, seed: int, d_model: int = 16, n_head: int = 2):
    """A small ``cls`` block whose two LayerNorms differ (so using the wrong one shows)."""
    with fresh_rng(seed):
        block = cls(d_model, n_head=n_head, norm=norm).eval()
        with torch.no_grad():
            for ln in (block.ln1, block.ln2):
                ln.weight.normal_(1.0, 0.5)
                ln.bias.normal_(0.0, 0.5)
    return block


def _block_mistakes(block, x):
    """(hint, output) for the usual mistakes in a block's forward pass."""
    attn, mlp, ln1, ln2 = block.attn, block.mlp, block.ln1, block.ln2
    twice = "the second sublayer must use block.ln2; using block.ln1 twice is the bug in sources 0 and 4"
    residual = "add each sublayer's output back to its input (the residual connection): x = "
    pre = x + attn(ln1(x))  # after the first pre-norm sublayer
    post = ln1(x + attn(x))  # after the first post-norm sublayer
    if block.norm == "pre":
        h = ln1(x)
        on_normed = ln2(h + attn(h))
        return [
            (twice, pre + mlp(ln1(pre))),
            ("with norm='pre' normalise each sublayer's input and add to the un-normalised x: x = x + attn(ln1(x)), "
             "then x = x + mlp(ln2(x)); you normalised after the addition (post-norm)", ln2(post + mlp(post))),
            (f"{residual}x + attn(ln1(x))", mlp(ln2(attn(ln1(x))))),
            ("the residual adds to the original x, not to the normalised ln1(x)", on_normed + mlp(on_normed)),
            ("the feed-forward sublayer needs its own residual: x = x + mlp(ln2(x))", mlp(ln2(pre))),
            ("the attention sublayer needs its residual: x = x + attn(ln1(x)), not x = attn(ln1(x))",
             (a := attn(ln1(x))) + mlp(ln2(a))),
        ]
    return [
        (twice, ln1(post + mlp(post))),
        ("with norm='post' normalise after each addition: x = ln1(x + attn(x)), then x = ln2(x + mlp(x)); you "
         "normalised the sublayers' inputs (pre-norm)", pre + mlp(ln2(pre))),
        (f"{residual}ln1(x + attn(x))", ln2(mlp(ln1(attn(x))))),
        ("the feed-forward sublayer needs its own residual: x = ln2(x + mlp(x))", ln2(mlp(post))),
        ("the attention sublayer needs its residual: x = ln1(x + attn(x)), not x = ln1(attn(x))",
         ln2((a := ln1(attn(x))) + mlp(a))),
    ]


def _package_copy(block):
    """The package's TransformerBlock holding ``block``'s weights (the reference output)."""
    with fresh_rng():
        ref = _lib.TransformerBlock(block.d_model, n_head=block.attn.n_head, norm=block.norm).eval()
    ref.load_state_dict(block.state_dict())
    return ref


@check("5.3", "TransformerBlock", reference=_lib.TransformerBlock)
def check_transformer_block(cls):
    """``cls(d_model, n_head, norm=...)(x [B, T, C], mask=None, cache=None)`` equal to the package's block."""
    x = torch.randn(2, 5, 16, generator=_generator(54))
    for seed, norm in enumerate(("pre", "post")):
        with torch.no_grad():
            block = _distinct_block(cls, norm, seed)
            ref, where = _package_copy(block), f" (norm={norm!r})"
            want = _expect_forward(block, x, ref, "a tensor from TransformerBlock.forward", "the caller's tensor "
                                   "changes; write x = x + ... instead", f"with norm={norm!r} the output differs "
                                   "from the block's definition", _block_mistakes(block, x))
            _expect_mask_and_cache(block, x, want, lambda mask: ref(x, mask=mask), "a tensor from "  # noqa: B023
                                   "TransformerBlock.forward", where, ", so generation (chapter 07) can use it")


def _expect_forward(block, x, want, what: str, in_place: str, hint: str, mistakes) -> torch.Tensor:
    """The shared first steps of 5.3 and 5.6: x left as it was, its shape kept, ``want`` (a tensor, or the reference
    block to run on x) matched or the mistake named; returns the right output."""
    got = _output(block, x, what, in_place=f"do not change x in place (x += ...): {in_place}",
                  shape="the shape [B, T, C] =")
    want = want if isinstance(want, torch.Tensor) else want(x)
    expect_close(got, want, hint, mistakes=mistakes)
    return want


def _expect_mask_and_cache(block, x, want, masked, what: str, where: str = "", why: str = "") -> None:
    """5.3 and 5.6: a left-padded batch (``masked(mask)`` is the right output) and token by token with a KV cache
    (the whole sequence's output ``want``)."""
    from transformer_course.multihead import KVCache

    keep = torch.ones(2, 5, dtype=torch.bool)
    keep[0, :2] = False  # sequence 0 is left-padded with 2 pads
    pad_mask = keep[:, None, None, :]  # [B, 1, 1, T]
    expect_close(expect_tensor(block(x, mask=pad_mask), what=what), masked(pad_mask),
                 f"with a padding mask{where} the output differs",
                 mistakes=[("the padding mask made no difference: pass mask=mask on to self.attn", want)])
    cache = KVCache()
    steps = [expect_tensor(block(x[:, t:t + 1], cache=cache), what=what) for t in range(x.shape[1])]
    expect(cache.length == x.shape[1], f"the KV cache stayed empty: pass cache=cache on to self.attn{why}")
    expect_close(torch.cat(steps, dim=1), want, f"token by token with a cache{where} the output differs from the "
                                                "whole sequence at once")


# ---------------------------------------------------------------- 5.4 the size of one GPT-2 small block (predict)
@check("5.4", "my_prediction")
def check_predict_block_parameters(fn):
    """``fn() -> int``: the parameters of ``TransformerBlock(768, 12)`` with biases."""
    got = fn()
    expect(isinstance(got, (int, float)) and not isinstance(got, bool) and float(got).is_integer(),
           f"return a whole number (int), got {type(got).__name__} {got!r}")
    got, C = int(got), 768
    want = _lib.block_parameter_count(C)
    expect_answer(got, want, [
        ("count the bias vectors too (qkv 3C, attention proj C, fc 4C, mlp proj C, and each LayerNorm's β)",
         12 * C * C + 2 * C),
        ("include the two LayerNorms: each has a gain γ and a bias β of C numbers", 12 * C * C + 9 * C),
        ("count the biases and the two LayerNorms (γ and β, C numbers each) too", 12 * C * C),
        ("attention has an output projection proj (C -> C, plus C biases) besides qkv", 11 * C * C + 12 * C + 2 * C),
        ("the feed-forward hidden width is 4C: fc is C -> 4C and proj 4C -> C", 6 * C * C + 7 * C + 4 * C),
        ("qkv maps C to 3C (queries, keys and values): 3C² weights, not C²", 10 * C * C + 11 * C + 4 * C),
        ("that is GPT-2 small's 12 blocks together; the question asks for one block", 12 * want),
    ], f"not {got:,}: add up attention (qkv and proj), the feed-forward network (fc and proj) and the two LayerNorms, "
       "weights and biases")


# ---------------------------------------------------------------- 5.5 gradient reaching each layer (build)
def _gradient_stack(seed: int):
    """Four small layers of clearly different gains, so order and off-by-one mistakes show."""
    layers = []
    with fresh_rng(seed):
        for gain in (0.5, 2.0, 0.8, 1.5):
            linear = torch.nn.Linear(8, 8)
            with torch.no_grad():
                linear.weight.mul_(gain * 3.0)
            layers.append(torch.nn.Sequential(linear, torch.nn.Tanh()))
    return layers


def _norm_mistakes(layers, x, grad_out, want):
    """(hint, norms) for the usual mistakes in collecting the gradient norms."""
    def at_outputs():  # the norms one layer up: the gradient at each output, grad_output's last
        with torch.enable_grad():
            above = _lib.input_gradient_norms(layers[1:], layers[0](x).detach(), grad_out)
        return torch.cat([above, grad_out.norm()[None]])

    return [
        ("put the bottom layer first: entry 0 belongs to layers[0], the layer that receives x", want.flip(0)),
        ("record the gradient at each layer's input, not its output: entry 0 is the gradient at x itself", at_outputs),
        ("start the backward pass from grad_output (torch.autograd.grad(out, inputs, grad_outputs=grad_output)), not "
         "from out.sum()", _lib.input_gradient_norms(layers, x, torch.ones_like(grad_out))),
        ("return the norm of each gradient, not its square", want.pow(2)),
    ]


@check("5.5", "input_gradient_norms", reference=_lib.input_gradient_norms)
def check_input_gradient_norms(fn):
    """``fn(layers, x, grad_output) -> Tensor[len(layers)]``: norm of dL/d(input of each layer)."""
    norms, what = _lib.input_gradient_norms, "a tensor from input_gradient_norms"
    layers, g = _gradient_stack(55), _generator(55)
    x, grad_out = torch.randn(3, 5, 8, generator=g), torch.randn(3, 5, 8, generator=g)
    x_arg = x.clone()
    got = expect_tensor(fn(layers, x_arg, grad_out.clone()), what=what)
    expect(not x_arg.requires_grad, "your code switched on requires_grad of the caller's x: work on a copy, "
                                    "x.detach().requires_grad_(True)")
    expect(all(p.grad is None for layer in layers for p in layer.parameters()), "the layers' parameters got a "
           ".grad: leave them untouched, with torch.autograd.grad(out, inputs, grad_outputs=grad_output) instead of "
           ".backward()")
    expect(got.ndim == 1 and got.numel() == len(layers),
           f"return one number per layer: shape [{len(layers)}], got {tuple(got.shape)}")
    expect(not got.requires_grad, "return the norms without autograd history (.detach())")
    want = norms(layers, x, grad_out)
    expect_close(got, want, "the gradient norms differ from the reference", atol=1e-4,
                 mistakes=_norm_mistakes(layers, x, grad_out, want))
    with fresh_rng(56):  # a stack of transformer blocks works too, and a stack of one
        blocks = [_lib.TransformerBlock(16, n_head=2) for _ in range(3)]
    xb, gb = torch.randn(2, 4, 16, generator=g), torch.randn(2, 4, 16, generator=g)
    expect_close(expect_tensor(fn(blocks, xb, gb), what=what).detach(), norms(blocks, xb, gb),
                 "on a stack of 3 TransformerBlocks the norms differ from the reference", atol=1e-4)
    expect_close(expect_tensor(fn(layers[:1], x, grad_out), what=what).detach(), norms(layers[:1], x, grad_out),
                 "a stack of one layer gives a wrong norm", atol=1e-4)


# ---------------------------------------------------------------- 5.6 the parallel block (extend)
class ParallelBlock(_lib.TransformerBlock):
    """GPT-J's and PaLM's block: attention and the MLP read the same normalised input and both outputs join the
    residual stream at once, x + attn(ln1(x)) + mlp(ln1(x)); ``ln2`` is unused.
    ``forward(x [B, T, C], mask=None, cache=None) -> [B, T, C]``, as ``TransformerBlock``'s."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        h = self.ln1(x)  # (B, T, C): one normalisation for both sublayers
        return x + self.attn(h, mask=mask, cache=cache) + self.mlp(h)


def _parallel_mistakes(block, x):
    """(hint, output) for the usual mistakes in a parallel block's forward pass."""
    attn, mlp, ln1, ln2 = block.attn, block.mlp, block.ln1, block.ln2
    h = ln1(x)
    after_attn = x + attn(h)
    return [
        ("that is section 5's sequential block: in the parallel block the MLP reads ln1(x), the same normalised input "
         "as attention, not the attention's result", after_attn + mlp(ln2(after_attn))),
        ("the MLP reads the attention's result here; both sublayers read ln1(x) and are added to x together",
         after_attn + mlp(ln1(after_attn))),
        ("one normalisation serves both sublayers: self.mlp(self.ln1(x)), not self.ln2", after_attn + mlp(ln2(x))),
        ("add both outputs to x itself (the residual stream), not to the normalised ln1(x)", h + attn(h) + mlp(h)),
        ("the residual is missing: x + attn(ln1(x)) + mlp(ln1(x))", attn(h) + mlp(h)),
        ("the MLP's output is missing: add mlp(ln1(x)) as well", after_attn),
        ("the attention's output is missing: add attn(ln1(x)) as well", x + mlp(h)),
    ]


@check("5.6", "ParallelBlock", reference=ParallelBlock)
def check_parallel_block(cls):
    """``cls(d_model, n_head)``: a ``TransformerBlock`` whose ``forward(x, mask=None, cache=None)`` is
    x + attn(ln1(x)) + mlp(ln1(x))."""
    x = torch.randn(2, 5, 16, generator=_generator(56))
    with torch.no_grad():
        block = _distinct_block(cls, "pre", seed=6)
        h = block.ln1(x)
        want = _expect_forward(block, x, x + block.attn(h) + block.mlp(h), "a tensor from ParallelBlock.forward",
                               "write x + ... instead", "the output differs from x + attn(ln1(x)) + mlp(ln1(x))",
                               _parallel_mistakes(block, x))
        _expect_mask_and_cache(block, x, want, lambda mask: x + block.attn(h, mask=mask) + block.mlp(h),
                               "a tensor from ParallelBlock.forward")
