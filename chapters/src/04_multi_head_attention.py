# %% [markdown]
# # Chapter 04: multi-head attention, from a loop of heads to one fused call
#
# **What this chapter builds.** Chapter 03 built one attention head: every position asks one question
# (its query), compares it with every earlier position's key and takes a weighted mean of their values.
# Here we run several heads side by side and combine them, in three versions of the same function:
#
# 1. a **loop** over separate `AttentionHead`s, their outputs concatenated and mixed by an output
#    projection W_o (the textbook picture);
# 2. a **batched** version: one packed projection, cut into heads with `view` and `transpose`, all
#    heads attended at once, and stitched back together;
# 3. a **fused** version that hands the attention itself to PyTorch's
#    `F.scaled_dot_product_attention`.
#
# We prove they compute the same thing, check the result against `torch.nn.MultiheadAttention`, look
# at what different heads learn to attend to, measure the three on this CPU, and add the **KV cache**
# that chapter 07 uses to generate text quickly.
#
# **You will be able to** explain every reshape in multi-head attention, convert weights between the
# loop and the packed layout, build the shifted causal mask a KV cache needs, and read per-head
# attention maps.
#
# **From earlier chapters** (imported from the package, not rewritten): `causal_mask`,
# `scaled_dot_product_attention` and `AttentionHead` from chapter 03 (`transformer_course.attention`).
#
# **Shapes.** B batch, T time (new positions), L cached positions, T_total = L + T,
# C = d_model channels, nh heads, hs = C // nh head size.

# %%
#| default_exp multihead

# %%
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.attention import AttentionHead, causal_mask, scaled_dot_product_attention

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## 1. Why more than one head?
#
# For each query, a head produces *one* softmax over the keys and so *one* weighted mean of the values.
# If a word needs two different things from its context (in "Write a poem about a man fishing on a
# river bank", *Write* relates to the nearby *poem* and to the far-away *fishing*), one head must blur
# them into a single average. Multi-head attention gives the layer several independent question/answer
# systems: head h has its own W_q^h, W_k^h, W_v^h, so it can learn its own notion of "relevant".
#
# To keep the cost of the layer the same as one wide head, each head works in a smaller space of
# hs = C / nh channels. The nh outputs [B, T, hs] are laid side by side into [B, T, C] and multiplied
# by one more learned matrix, W_o (C x C), so that what the heads found can be mixed:
#
# $$\text{MultiHead}(X) = \big[\text{head}_1, \ldots, \text{head}_{nh}\big]\, W_o, \qquad
#   \text{head}_h = \text{Attention}(X W_q^h,\; X W_k^h,\; X W_v^h).$$

# %% [markdown]
# ## 2. The loop version
#
# Take the tiny batch from seed 000: two sequences of six tokens ("The sun dipped below the horizon",
# ", painting the sky with hues"), each token already a 4-number vector, so x is [B, T, C] = [2, 6, 4].
# With nh = 2 heads, each head has hs = 4 / 2 = 2 channels.

# %%
x_seed = torch.tensor([
    [[0.4553, 0.3277, 0.4210, 0.6628], [0.0874, 0.3216, 0.2850, 0.1438], [0.8880, 0.2221, 0.6271, 0.8234],
     [0.9180, 0.8070, 0.4281, 0.1977], [0.4874, 0.9018, 0.4258, 0.1630], [0.0441, 0.1988, 0.6751, 0.8757]],
    [[0.9347, 0.9255, 0.6341, 0.0567], [0.7656, 0.2911, 0.6161, 0.0123], [0.4200, 0.3295, 0.1863, 0.7694],
     [0.3197, 0.9724, 0.6066, 0.2184], [0.4521, 0.9276, 0.3951, 0.1281], [0.7899, 0.7894, 0.2245, 0.2889]],
])
print("x:", tuple(x_seed.shape), "= [B, T, C]")

# %% [markdown]
# The loop version is exactly the picture: a list of chapter-03 heads, run one after another on the
# same input, concatenated along the channel axis, then projected by W_o. It is exported too, but only
# as the baseline the faster versions are tested and timed against.

# %%
#| export
"""Multi-head causal self-attention (chapter 04), with the KV cache used for generation.

Builds on chapter 03 (`attention.py`): a head there maps x [B, T, C] to [B, T, hs]. Here nh heads run
side by side on slices of one packed projection, are merged back to [B, T, C] and mixed by an output
projection W_o. Shapes: B batch, T new positions, L cached positions, T_total = L + T,
C = d_model channels, nh heads, hs = C // nh head size.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.attention import AttentionHead, causal_mask, scaled_dot_product_attention


def _check_sizes(d_model, n_head) -> None:
    for name, value in (("d_model", d_model), ("n_head", n_head)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if d_model % n_head:
        divisors = [h for h in range(1, d_model + 1) if d_model % h == 0]
        raise ValueError(
            f"d_model={d_model} is not divisible by n_head={n_head}: every head gets d_model // n_head "
            f"channels, so choose n_head among the divisors of {d_model} ({', '.join(map(str, divisors[:10]))}"
            f"{', ...' if len(divisors) > 10 else ''}) or change d_model"
        )

# %%
#| export
class LoopedMultiHeadAttention(nn.Module):
    """The scaffold: nh separate chapter-03 `AttentionHead`s, run one after another, concatenated,
    then mixed by W_o. x [B, T, C] -> [B, T, C].

    Same function as `MultiHeadAttention` (see `pack_heads`), kept only as the baseline that tests and
    benchmarks compare with. Use `MultiHeadAttention` in models.
    """

    def __init__(self, d_model: int, n_head: int, bias: bool = True, causal: bool = True) -> None:
        super().__init__()
        _check_sizes(d_model, n_head)
        hs = d_model // n_head
        self.heads = nn.ModuleList(AttentionHead(d_model, hs, causal=causal) for _ in range(n_head))
        self.proj = nn.Linear(d_model, d_model, bias=bias)  # W_o

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.cat([head(x, mask) for head in self.heads], dim=-1)  # nh x (B, T, hs) -> (B, T, C)
        return self.proj(y)  # (B, T, C)

# %%
looped = LoopedMultiHeadAttention(d_model=4, n_head=2)
per_head = [head(x_seed) for head in looped.heads]
print("each head:   ", [tuple(y.shape) for y in per_head], "= [B, T, hs]")
concatenated = torch.cat(per_head, dim=-1)
print("concatenated:", tuple(concatenated.shape), "= [B, T, C]")
out_loop = looped(x_seed)
print("after W_o:   ", tuple(out_loop.shape), "= [B, T, C], same shape as the input")
assert torch.equal(out_loop, looped.proj(concatenated))

# %% [markdown]
# Each head is chapter 03's computation. Seed 000 works one row of one head by hand: the last token,
# *horizon*, with query (0.9100, 0.3448) against the six keys and values it lists. Let us redo it with
# chapter 03's function.

# %%
q_horizon = torch.tensor([[0.9100, 0.3448]])  # [T_q = 1, hs = 2]
k_seed = torch.tensor([[0.0921, 0.9907], [0.5637, 0.7303], [0.1860, 0.4071],
                       [0.8067, 0.1776], [0.7002, 0.6632], [0.9094, 0.3594]])  # [T_k = 6, hs]
v_seed = torch.tensor([[0.5637, 0.4056], [0.9803, 0.0100], [0.4111, 0.3980],
                       [0.6882, 0.9797], [0.5551, 0.7583], [0.3060, 0.2141]])  # [T_k, hs]
print("raw scores q.k:       ", (q_horizon @ k_seed.T)[0])
out_h, w_h = scaled_dot_product_attention(q_horizon, k_seed, v_seed)
print("weights (scaled):     ", w_h[0])
print("output:               ", out_h[0])
w_unscaled = torch.softmax(q_horizon @ k_seed.T, dim=-1)
print("softmax without 1/√hs:", w_unscaled[0], "->", (w_unscaled @ v_seed)[0])

# %% [markdown]
# The raw scores match the seed (0.4254 ... 0.9515). **The seed's weights do not**: it says it divides
# the scores by √hs = √2, but its printed row (0.1252, 0.1758, 0.1115, 0.1812, 0.1945, 0.2119) and output
# (0.5863, 0.4673) are the softmax of the *unscaled* scores, the last line above. With the scaling it
# describes, the weights are flatter and the output is the one chapter 03's function gives.

# %% [markdown]
# ## 3. One projection, split into heads
#
# The loop runs nh small matrix products where one big one would do. Stack every head's W_q^h on top
# of each other and you get one C x C matrix: a single `nn.Linear(C, C)` computes the queries of *all*
# heads at once, head h's in channels h·hs .. (h+1)·hs - 1. The same holds for keys and values, so one
# `nn.Linear(C, 3C)` (called `qkv`) produces all three, packed as [q | k | v].
#
# What is left is bookkeeping: move the head index next to the batch index so that one batched matrix
# product treats (batch, head) pairs as independent problems. Seed 003's sizes: B = 4 sequences of
# T = 16 tokens, C = 64, nh = 4 heads of hs = 16.

# %%
B, T, C, nh = 4, 16, 64, 4
hs = C // nh
x = torch.randn(B, T, C)
qkv = nn.Linear(C, 3 * C)
q, k, v = qkv(x).split(C, dim=-1)
print(f"x                    {tuple(x.shape)}  [B, T, C]")
print(f"q = x W_q            {tuple(q.shape)}  [B, T, C], all heads' queries side by side")
q4 = q.view(B, T, nh, hs)
print(f"q.view(B, T, nh, hs) {tuple(q4.shape)}  [B, T, nh, hs], channels cut into heads")
qh = q4.transpose(1, 2)
print(f".transpose(1, 2)     {tuple(qh.shape)}  [B, nh, T, hs], heads next to the batch")

# %%
kh = k.view(B, T, nh, hs).transpose(1, 2)
vh = v.view(B, T, nh, hs).transpose(1, 2)
scores = qh @ kh.transpose(-2, -1) / hs**0.5
print(f"scores = q kᵀ / √hs  {tuple(scores.shape)}  [B, nh, T, T]")
weights = torch.softmax(scores.masked_fill(~causal_mask(T), float("-inf")), dim=-1)
a = weights @ vh
print(f"weights @ v          {tuple(a.shape)}  [B, nh, T, hs]")

# %% [markdown]
# Seed 003 calls the scores' shape [batch_size, num_heads, context_length, head_size]. That is a slip
# hidden by its numbers: with T = hs = 16 both readings give [4, 4, 16, 16]. The last axis of the scores
# runs over *keys*, so it has length T. Make T differ from hs and the difference shows:

# %%
T_short = 10
q_short = q[:, :T_short].reshape(B, T_short, nh, hs).transpose(1, 2)
k_short = k[:, :T_short].reshape(B, T_short, nh, hs).transpose(1, 2)
print("q per head:", tuple(q_short.shape), "= [B, nh, T, hs]")
print("scores:    ", tuple((q_short @ k_short.transpose(-2, -1)).shape), "= [B, nh, T, T], not [B, nh, T, hs]")

# %% [markdown]
# Back to one tensor per token: undo the transpose ([B, T, nh, hs]) and glue the last two axes into C.
# `transpose` does not move any data, it only swaps strides, so the result is not *contiguous* and
# `view` refuses to merge the axes. `reshape` copies when it has to (or call `.contiguous()` first):

# %%
a_t = a.transpose(1, 2)
print(f"a.transpose(1, 2)    {tuple(a_t.shape)}  [B, T, nh, hs], contiguous: {a_t.is_contiguous()}")
try:
    a_t.view(B, T, C)
except RuntimeError as e:
    print("view fails:", str(e).split(".")[0])
merged = a_t.reshape(B, T, C)
print(f".reshape(B, T, C)    {tuple(merged.shape)}  [B, T, C], then W_o: {tuple(nn.Linear(C, C)(merged).shape)}")

# %% [markdown]
# Seed 003 ends by calling this "the output of the single-head attention"; it is the output of the
# whole multi-head layer. Seed 004 does the same split in Julia with `reshape(Q, dim ÷ nheads, nheads, ...)`:
# Julia stores arrays column-major, so its first axis varies fastest, and that reshape is our
# `view(B, T, nh, hs)` read backwards.
#
# One reshape that *looks* equivalent is wrong: `view(B, nh, T, hs)` directly, without the transpose.
# It has the right shape but cuts the memory in the wrong order, so a "head" gets pieces of several
# tokens. With B = 1, T = 3, C = 4, nh = 2 and channels numbered 0..11:

# %%
tiny = torch.arange(12.0).view(1, 3, 4)  # token t holds channels 4t .. 4t+3
print("right, head 0:\n", tiny.view(1, 3, 2, 2).transpose(1, 2)[0, 0])
print("wrong, head 0:\n", tiny.view(1, 2, 3, 2)[0, 0])

# %% [markdown]
# In the right split, head 0 sees the first half of each of the 3 tokens. In the wrong one its row 1
# is (2, 3), the *second* half of token 0: the rows are no longer tokens. Both helpers go into the
# package:

# %%
#| export
def split_heads(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """[B, T, C] -> [B, nh, T, hs]: head h gets channels h*hs .. (h+1)*hs - 1 of every token (a view)."""
    if x.ndim != 3:
        raise ValueError(f"split_heads needs x of shape [B, T, C], got {tuple(x.shape)}")
    B, T, C = x.shape
    _check_sizes(C, n_head)
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, nh, T, hs)


def merge_heads(y: torch.Tensor) -> torch.Tensor:
    """[B, nh, T, hs] -> [B, T, C]: the inverse of `split_heads`, the heads' outputs side by side."""
    if y.ndim != 4:
        raise ValueError(f"merge_heads needs y of shape [B, nh, T, hs], got {tuple(y.shape)}")
    B, nh, T, hs = y.shape
    # after transpose the memory is not in (B, T, C) order, so .view would fail; reshape copies
    return y.transpose(1, 2).reshape(B, T, nh * hs)  # (B, T, C)

# %%
assert torch.equal(split_heads(q, nh), qh) and torch.equal(merge_heads(a), merged)
assert torch.equal(merge_heads(split_heads(x, nh)), x)
for h in range(nh):  # head h owns channels h*hs .. (h+1)*hs - 1 of every token
    assert torch.equal(split_heads(x, nh)[:, h], x[..., h * hs:(h + 1) * hs])
print("merge_heads(split_heads(x)) == x; head h owns channels h*hs .. (h+1)*hs - 1")

# %% [markdown]
# ## 4. Generating with a KV cache: the causal mask gets a past
#
# When a model generates text it runs again for every new token. Without help, step n recomputes the
# keys and values of all n earlier positions, although none of them changed: with a causal mask, an
# earlier position never looks at a later one. A **KV cache** keeps each layer's keys and values and
# appends only the new positions' ones, so each step projects just the new token(s).
#
# That changes the mask. If the cache holds L positions and T new queries arrive, query t sits at
# position L + t and may see keys 0 .. L + t: the causal triangle moves L columns to the right, and
# every cached position is visible.

# %%
#| export
def causal_mask_with_past(T: int, past: int = 0, device=None) -> torch.Tensor:
    """Bool [T, past + T]: True where new query t (at position past + t) may attend key j, j <= past + t.

    With ``past == 0`` this is chapter 03's `causal_mask(T)`. With ``past`` cached positions the
    triangle shifts right by ``past`` columns: every new query sees all cached keys.
    """
    try:
        past = operator.index(past)
    except TypeError:
        raise TypeError(f"past must be an int (the number of cached positions), got {type(past).__name__}") from None
    if past < 0:
        raise ValueError(f"past must be >= 0 (the number of cached positions), got {past}")
    seen = torch.ones(T, past, dtype=torch.bool, device=device)  # cached keys: all in the past
    return torch.cat([seen, causal_mask(T, device=device)], dim=1)  # (T, past + T)

# %%
print("L = 3 cached, T = 2 new: rows are new queries (positions 3 and 4), columns keys 0..4")
print(causal_mask_with_past(2, past=3).int())
print("a top-left triangle over the same [2, 5] scores:")
print(torch.ones(2, 5, dtype=torch.bool).tril().int())

# %% [markdown]
# The second grid is what `F.scaled_dot_product_attention(..., is_causal=True)` builds when queries and
# keys have different lengths: its triangle starts in the top-left corner. Query 0 (really at position
# 3) would see only key 0. That is fine with no cache (L = 0, square scores) and harmless for a single
# new query (T = 1: it sees everything), but wrong for several new queries after a past. Here is the
# error in numbers, on one head with L = 3, T = 2:

# %%
g = torch.Generator().manual_seed(1)
q5, k5, v5 = (torch.randn(1, 1, 5, 8, generator=g) for _ in range(3))  # positions 0..4
full, _ = scaled_dot_product_attention(q5, k5, v5, causal_mask(5))
shifted = F.scaled_dot_product_attention(q5[:, :, 3:], k5, v5, attn_mask=causal_mask_with_past(2, past=3))
top_left = F.scaled_dot_product_attention(q5[:, :, 3:], k5, v5, is_causal=True)
print("explicit shifted mask = full sequence's last 2 rows:", torch.allclose(shifted, full[:, :, 3:], atol=1e-6))
print("is_causal=True        = full sequence's last 2 rows:", torch.allclose(top_left, full[:, :, 3:], atol=1e-6),
      f"(off by up to {(top_left - full[:, :, 3:]).abs().max():.2f})")

# %% [markdown]
# The cache itself is a small object per layer: `update(k, v)` appends the new positions along the
# time axis (dim 2 of [B, nh, T, hs]) and returns everything so far.

# %%
#| export
class KVCache:
    """One layer's key/value cache: keys and values [B, nh, L, hs] of positions 0 .. L-1.

    ``update(k, v)`` appends the new positions' keys and values along time (dim 2) and returns all of
    them, so new queries attend to the whole past without recomputing it. Memory grows by
    2 * B * nh * hs * element_size bytes per position (keys and values).
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None  # (B, nh, L, hs)
        self.v: torch.Tensor | None = None  # (B, nh, L, hs)

    @property
    def length(self) -> int:
        """L, the number of cached positions (0 when empty)."""
        return 0 if self.k is None else self.k.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached keys and values."""
        if self.k is None:
            return 0
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def reset(self) -> None:
        """Forget every cached position (before starting a new sequence)."""
        self.k = self.v = None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v [B, nh, T_new, hs]; return all keys and values so far, [B, nh, L + T_new, hs]."""
        if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)) or k.ndim != 4 or k.shape != v.shape:
            shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in (k, v)]
            raise ValueError(f"KVCache.update needs k and v of one shape [B, nh, T_new, hs], got {shapes[0]} and {shapes[1]}")
        if self.k is None:
            self.k, self.v = k, v
            return k, v
        old = self.k
        if (old.shape[0], old.shape[1], old.shape[3]) != (k.shape[0], k.shape[1], k.shape[3]) or (old.dtype, old.device) != (k.dtype, k.device):
            raise ValueError(
                f"KVCache holds [B, nh, L, hs] = {tuple(old.shape)} ({old.dtype}, {old.device}) but got "
                f"{tuple(k.shape)} ({k.dtype}, {k.device}): batch, heads, head size, dtype and device must "
                "stay the same; call reset() (or use a new cache) for a new batch"
            )
        self.k = torch.cat([old, k], dim=2)  # (B, nh, L + T_new, hs)
        self.v = torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def __repr__(self) -> str:
        shape = None if self.k is None else list(self.k.shape)
        return f"KVCache(length={self.length}, k/v shape={shape}, nbytes={self.nbytes})"

# %%
cache = KVCache()
for n_new in (3, 1, 2):
    k_all, v_all = cache.update(torch.zeros(2, 4, n_new, 16), torch.zeros(2, 4, n_new, 16))
    print(f"appended {n_new}: k_all {tuple(k_all.shape)}, {cache}")
assert cache.length == 6 and cache.nbytes == 2 * 2 * 4 * 6 * 16 * 4  # k and v, 4 bytes per float32
try:
    cache.update(torch.zeros(3, 4, 1, 16), torch.zeros(3, 4, 1, 16))  # a different batch size
except ValueError as e:
    print("ValueError:", e)

# %% [markdown]
# ## 5. `MultiHeadAttention`: the layer the rest of the course uses
#
# Now everything goes into one module with the names later chapters rely on: `qkv` (the packed
# C -> 3C projection, [q | k | v] with heads contiguous inside each) and `proj` (W_o). The attention
# itself has two interchangeable paths with the same parameters, chosen by `fast`:
#
# - `fast=True` (default) calls PyTorch's fused `F.scaled_dot_product_attention`, which never builds
#   the [B, nh, T, T] weight tensor in full (see the measurements below). It uses the kernel's own
#   `is_causal` triangle only where that is right: no cache, or a single new query;
#   otherwise it gets the explicit shifted mask.
# - `fast=False`, the teaching path, calls chapter 03's function and keeps the weights
#   [B, nh, T, T_total] in `.last_weights` for plots.
#
# An optional extra bool `mask` (True = may attend, e.g. to hide padding) is combined with the causal
# one. A query whose every key is hidden gets a zero output on both paths, never NaN.

# %%
#| export
def _check_mask(mask, target: tuple[int, int, int, int]) -> None:
    """An extra mask must be bool (True = may attend) and broadcast to [B, nh, T, T_total]."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        kind = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(
            f"mask must be a bool tensor (True = may attend), got {kind}: turn an additive mask of 0 and "
            "-inf into one with `mask == 0`, and a 0/1 mask with `mask.bool()`"
        )
    try:
        fits = torch.broadcast_shapes(mask.shape, target) == torch.Size(target)
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to [B, nh, T, T_total] = {target}; "
            "a key-padding mask [B, T_total] needs head and query axes: mask[:, None, None, :]"
        )

# %%
#| export
class MultiHeadAttention(nn.Module):
    """Causal multi-head self-attention: x [B, T, C] -> [B, T, C].

    ``qkv`` (C -> 3C, output [q | k | v], heads contiguous inside each) makes every head's queries,
    keys and values in one product; `split_heads` gives head h its hs = C // nh channels; attention runs
    on all heads at once; `merge_heads` lays the heads side by side and ``proj`` (W_o, C -> C) mixes
    them. ``fast=True`` uses ``F.scaled_dot_product_attention``; ``fast=False`` uses chapter 03's
    function and keeps the weights [B, nh, T, T_total] in ``.last_weights``. Same parameters either way.
    """

    def __init__(self, d_model: int, n_head: int, dropout: float = 0.0, bias: bool = True,
                 causal: bool = True, fast: bool = True) -> None:
        super().__init__()
        _check_sizes(d_model, n_head)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model, self.n_head, self.head_size = d_model, n_head, d_model // n_head
        self.dropout, self.causal, self.fast = dropout, causal, fast
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)  # W_q, W_k, W_v of every head, packed
        self.proj = nn.Linear(d_model, d_model, bias=bias)  # W_o
        self.resid_dropout = nn.Dropout(dropout)
        self.last_weights: torch.Tensor | None = None  # (B, nh, T, T_total), teaching path only

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, cache: KVCache | None = None) -> torch.Tensor:
        """x [B, T, C] -> [B, T, C]. ``mask``: extra bool mask broadcastable to [B, nh, T, T_total].

        ``cache``: a `KVCache` holding L earlier positions; the T new queries sit at positions
        L .. L+T-1 and see keys 0 .. L+t. The cache is updated in place.
        """
        if not isinstance(x, torch.Tensor) or x.ndim != 3 or x.shape[-1] != self.d_model or x.shape[1] == 0:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"MultiHeadAttention expects x of shape [B, T >= 1, {self.d_model}] (d_model={self.d_model}), got {shape}")
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (split_heads(t, self.n_head) for t in (q, k, v))  # 3 x (B, nh, T, hs)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, nh, T_total, hs), T_total = L + T
        if mask is not None:
            _check_mask(mask, (B, self.n_head, T, k.shape[2]))
        attend = self._attend_fast if self.fast else self._attend_teaching
        y = attend(q, k, v, mask)  # (B, nh, T, hs)
        return self.resid_dropout(self.proj(merge_heads(y)))  # (B, T, C)

    def _allowed(self, T: int, T_total: int, mask, device) -> torch.Tensor | None:
        """Causal (shifted by the cache) and extra masks combined; None when everything is allowed."""
        allowed = causal_mask_with_past(T, T_total - T, device=device) if self.causal else None
        if mask is not None:
            allowed = mask if allowed is None else allowed & mask
        return allowed

    def _attend_fast(self, q, k, v, mask):
        T, T_total = q.shape[2], k.shape[2]
        p = self.dropout if self.training else 0.0
        self.last_weights = None
        if mask is None and (not self.causal or T == 1 or T == T_total):
            # is_causal's triangle is aligned top-left: right with no cache (T == T_total);
            # a single new query may see every key, so it needs no mask at all
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=self.causal and T == T_total)
        allowed = self._allowed(T, T_total, mask, q.device)
        has_key = allowed.any(dim=-1, keepdim=True)  # a row hidden entirely (padding) is given all keys...
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~has_key, dropout_p=p)
        return y.masked_fill(~has_key, 0.0)  # ...so the kernel stays finite, then its output is zeroed

    def _attend_teaching(self, q, k, v, mask):
        allowed = self._allowed(q.shape[2], k.shape[2], mask, q.device)
        p = self.dropout if self.training else 0.0
        y, weights = scaled_dot_product_attention(q, k, v, allowed, dropout_p=p)
        self.last_weights = weights.detach()  # (B, nh, T, T_total)
        return y  # (B, nh, T, hs)

    def extra_repr(self) -> str:
        return f"n_head={self.n_head}, head_size={self.head_size}, causal={self.causal}, fast={self.fast}"

# %%
mha = MultiHeadAttention(d_model=64, n_head=4)
print(mha)
print("output:", tuple(mha(x).shape), "parameters:", sum(p.numel() for p in mha.parameters()))
for bad in ({"d_model": 64, "n_head": 5}, {"d_model": 10, "n_head": 4}):
    try:
        MultiHeadAttention(**bad)
    except ValueError as e:
        print("ValueError:", e)

# %% [markdown]
# ## 6. Proof: the loop and the batched layer are the same function
#
# To prove it, copy the loop's weights into the packed layout and compare outputs. Head h's
# `query.weight` is [hs, C]; stacked for h = 0..nh-1 they form W_q [C, C], and [W_q; W_k; W_v] is
# `qkv.weight` [3C, C]. The heads have no bias, so `qkv.bias` becomes zero; W_o is copied as it is.

# %%
#| export
@torch.no_grad()
def pack_heads(looped: LoopedMultiHeadAttention, fast: bool = True) -> MultiHeadAttention:
    """A `MultiHeadAttention` computing the same function as ``looped``, its weights copied in.

    Rows h*hs .. (h+1)*hs - 1 of W_q (the first C rows of ``qkv.weight`` [3C, C]) are head h's
    ``query.weight``; likewise W_k and W_v. The heads have no bias, so ``qkv.bias`` is zero.
    """
    heads = list(looped.heads)
    d_model = heads[0].d_model
    mha = MultiHeadAttention(d_model, len(heads), bias=looped.proj.bias is not None, causal=heads[0].causal, fast=fast)
    mha.to(looped.proj.weight)  # same dtype and device
    w = [torch.cat([getattr(h, name).weight for h in heads]) for name in ("query", "key", "value")]  # 3 x (C, C)
    mha.qkv.weight.copy_(torch.cat(w))  # (3C, C)
    if mha.qkv.bias is not None:
        mha.qkv.bias.zero_()
    mha.proj.load_state_dict(looped.proj.state_dict())
    return mha

# %%
torch.manual_seed(0)
looped = LoopedMultiHeadAttention(d_model=64, n_head=4)
x = torch.randn(4, 16, 64)
for fast in (False, True):
    packed = pack_heads(looped, fast=fast)
    diff = (packed(x) - looped(x)).abs().max().item()
    print(f"fast={fast!s:5}  loop and batched agree within 1e-6: {diff < 1e-6}")
    assert diff < 1e-6

# %% [markdown]
# The largest difference is a few float32 roundings (1e-7): same function, different order of
# additions. In the other direction, the loop's head h *is* a slice of the packed layer; there is
# nothing a loop of heads can compute that the batched layer cannot.
