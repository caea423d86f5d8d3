"""Checks for chapter 08's exercises (loading GPT-2 weights). Hand-written.

Each check runs the learner's function next to the package's reference on ordinary and edge inputs
and names the likely mistake in words. See ``transformer_course.checks`` for how checks report.
Exercise 8.4 compares with Hugging Face's own GPT-2 block, so it needs ``transformers``.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..multihead import split_heads
from ._core import check, expect, expect_close

__all__ = ["check_gelu_tanh", "check_linear_from_conv1d", "check_load_block", "check_split_qkv"]


def _randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _close(a, b, atol: float = 1e-6) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=atol)


# ---------------------------------------------------------------- 8.1 Conv1D -> nn.Linear


@check("8.1", "my_linear_from_conv1d")
def check_linear_from_conv1d(fn):
    """``fn(weight [in, out], bias [out]) -> nn.Linear(in, out)`` computing ``x @ weight + bias``."""
    for n_in, n_out, seed in ((3, 5, 0), (4, 4, 1)):  # a rectangular and a square weight
        W, b, x = _randn(n_in, n_out, seed=seed), _randn(n_out, seed=seed + 10), _randn(6, n_in, seed=seed + 20)
        layer = fn(W, b)
        expect(isinstance(layer, nn.Linear), f"return an nn.Linear, got {type(layer).__name__}")
        expect(tuple(layer.weight.shape) == (n_out, n_in),
               f"nn.Linear keeps its weight as [out, in] = {(n_out, n_in)}, got {tuple(layer.weight.shape)}: "
               "transpose the Conv1D weight")
        expect(layer.bias is not None, "the layer has no bias: build nn.Linear(in, out, bias=True) and copy b into it")
        w = layer.weight.detach()
        expect(not (n_in == n_out and _close(w, W)),
               "the square weight was copied as it is: a [C, C] weight fits either way, but Conv1D's [in, out] "
               "still has to be transposed to nn.Linear's [out, in]")
        expect(not (n_in != n_out and _close(w, W.reshape(n_out, n_in))),
               "reshape (or view) keeps the numbers in memory order and scrambles the matrix: use W.T to transpose")
        expect(_close(layer.bias.detach(), b), "the bias differs from the Conv1D bias: copy b into layer.bias")
        with torch.no_grad():
            expect_close(layer(x), x @ W + b, "the layer does not compute x @ W + b", atol=1e-5)


# ---------------------------------------------------------------- 8.2 the packed q | k | v


@check("8.2", "my_split_qkv")
def check_split_qkv(fn):
    """``fn(packed [B, T, 3C], n_head) -> (q, k, v)``, each [B, nh, T, hs], from GPT-2's [q | k | v]."""
    B, T, C, nh = 2, 5, 12, 3
    hs = C // nh
    packed = _randn(B, T, 3 * C, seed=0)
    got = fn(packed, nh)
    expect(isinstance(got, tuple | list) and len(got) == 3, "return three tensors: (q, k, v)")
    want = [split_heads(t, nh) for t in packed.split(C, dim=-1)]
    for name, g in zip("qkv", got, strict=True):
        expect(isinstance(g, torch.Tensor), f"{name} should be a tensor, got {type(g).__name__}")
        expect(tuple(g.shape) != (B, T, nh, hs),
               f"{name} is [B, T, nh, hs]: the heads must come before time, [B, nh, T, hs]; add .transpose(1, 2)")
        expect(tuple(g.shape) == (B, nh, T, hs), f"{name} should be [B, nh, T, hs] = {(B, nh, T, hs)}, got {tuple(g.shape)}")
    interleaved = packed.view(B, T, nh, 3, hs).permute(3, 0, 2, 1, 4)  # per head [q_h k_h v_h]: not GPT-2
    expect(not _close(got[0], interleaved[0]),
           "this reads each head's q, k and v side by side; GPT-2 packs [q | k | v]: the first C columns are "
           "every head's query, so split into three C-wide parts first, then into heads")
    regrouped = packed.split(C, dim=-1)[0].reshape(B, nh, T, hs)
    expect(not _close(got[0], regrouped),
           "view/reshape straight to [B, nh, T, hs] mixes positions and heads: view as [B, T, nh, hs], then transpose(1, 2)")
    for name, g, w in zip("qkv", got, want, strict=True):
        expect(not (name != "q" and _close(g, want[0])), f"{name} equals q: take the second C columns for k, the third for v")
        expect_close(g, w, f"{name} differs from the reference split")


# ---------------------------------------------------------------- 8.3 GPT-2's GELU

_C = math.sqrt(2 / math.pi)


@check("8.3", "my_gelu_tanh")
def check_gelu_tanh(fn):
    """``fn(x) -> 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))``, elementwise, any shape."""
    x = torch.linspace(-5, 5, 401, dtype=torch.float64)
    got = fn(x)
    expect(isinstance(got, torch.Tensor) and got.shape == x.shape,
           "return a tensor of the input's shape (the activation is elementwise)")
    expect(not _close(got, F.gelu(x), atol=1e-9),
           "this is the exact (erf) GELU; GPT-2 uses the tanh approximation 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))")
    expect(not _close(got, 0.5 * x * (1 + torch.tanh(x + 0.044715 * x**3)), atol=1e-9),
           "the tanh's argument must be scaled by √(2/π) ≈ 0.7979")
    expect(not _close(got, 0.5 * x * (1 + torch.tanh(_C * x)), atol=1e-9),
           "the cubic term is missing: tanh(√(2/π)·(x + 0.044715·x³))")
    expect(not _close(got, x * (1 + torch.tanh(_C * (x + 0.044715 * x**3))), atol=1e-9),
           "the result is twice too large: the formula starts with 0.5·x")
    expect_close(got, F.gelu(x, approximate="tanh"), "differs from the tanh approximation of GELU", atol=1e-6)
    batch = _randn(2, 3, 4, seed=0)
    expect_close(fn(batch), F.gelu(batch, approximate="tanh"), "works on a vector but not on a [B, T, C] batch",
                 atol=1e-5)


# ---------------------------------------------------------------- 8.4 one whole block


def _reference_block(seed: int = 0):
    """Hugging Face's GPT2Block (C 32, 4 heads, every tensor random) and its tensors by HF name."""
    from ..pretrained import make_hf_stand_in

    hf = make_hf_stand_in(vocab_size=16, n_positions=16, n_embd=32, n_layer=1, n_head=4, seed=seed)
    block = hf.transformer.h[0]
    return block, {k: v.detach().clone() for k, v in block.state_dict().items() if k not in ("attn.bias", "attn.masked_bias")}


@check("8.4", "my_load_block")
def check_load_block(fn):
    """``fn(block: TransformerBlock, tensors: dict)`` copies one GPT-2 block's 12 tensors into ``block``."""
    from ..block import TransformerBlock
    from ..pretrained import _BLOCK_KEYS

    try:
        hf_block, tensors = _reference_block()
    except ImportError:
        expect(False, "this check compares with transformers' GPT2Block: pip install 'transformer-course[pretrained]'")
    ours = TransformerBlock(32, 4, activation="gelu_tanh").eval()
    with torch.no_grad():
        fn(ours, {k: v.clone() for k, v in tensors.items()})
    params = dict(ours.named_parameters())
    for hf_name, (name, transpose) in _BLOCK_KEYS.items():
        got, stored = params[name].detach(), tensors[hf_name]
        want = stored.T if transpose else stored
        if _close(got, want):
            continue
        expect(not (transpose and _close(got, stored)),
               f"{name} holds {hf_name} untransposed: Conv1D stores [in, out], nn.Linear [out, in]; use .T")
        other = next((k for k, t in tensors.items() if k != hf_name and _close(got, t)), None)
        expect(other is None, f"{name} holds {other}, not {hf_name}: check the name map (ln_1 -> ln1, ln_2 -> ln2, ...)")
        expect(False, f"{name} differs from {hf_name}{' transposed' if transpose else ''}")
    x = _randn(2, 7, 32, seed=1)
    with torch.no_grad():
        out = hf_block(x)
        out = out[0] if isinstance(out, tuple) else out
        expect_close(ours(x), out, "the block's output differs from Hugging Face's GPT2Block", atol=1e-5)
