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
# **You build it.** You write `split_heads`, `merge_heads` and the shifted causal mask yourself, each
# before the chapter shows any code for it; a check under each says what is wrong in
# words, and when yours passes, the rest of the chapter (the layer, the proofs, the pictures) runs on
# your code. Along the way you predict a shape, copy a loop of heads into the packed layer to prove the
# two equal, fix a bug two published sources share, and extend the layer to grouped-query attention.
#
# **From earlier chapters** (imported from the package, not rewritten): `causal_mask`,
# `scaled_dot_product_attention` and `AttentionHead` from chapter 03 (`transformer_course.attention`),
# and chapter 02's `InputEmbedding` for a small trained example.
#
# **Shapes.** B batch, T time (new positions), L cached positions, T_total = L + T,
# C = d_model channels, nh heads, hs = C // nh head size.
#
# **Sources.** "Source 0" (and 1, 3, 4) names one of the published walkthroughs of the transformer this
# chapter was checked against (chapter 00 lists all five); we reuse their examples and numbers, and
# where one of them gets something wrong we say so and show the right result.

# %%
#| default_exp multihead

# %%
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.attention import AttentionHead, causal_mask, scaled_dot_product_attention
from transformer_course.checks.multihead import (
    check_causal_mask_with_past,
    check_grouped_query_attention,
    check_heads_attention,
    check_merge_heads,
    check_pack_heads,
    check_predict_scores_shape,
    check_split_heads,
)

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
# Take the tiny batch from source 0: two sequences of six tokens ("The sun dipped below the horizon",
# ", painting the sky with hues"), each token already a 4-number vector, so x is [B, T, C] = [2, 6, 4].
# With nh = 2 heads, each head has hs = 4 / 2 = 2 channels.

# %%
x_src = torch.tensor([
    [[0.4553, 0.3277, 0.4210, 0.6628], [0.0874, 0.3216, 0.2850, 0.1438], [0.8880, 0.2221, 0.6271, 0.8234],
     [0.9180, 0.8070, 0.4281, 0.1977], [0.4874, 0.9018, 0.4258, 0.1630], [0.0441, 0.1988, 0.6751, 0.8757]],
    [[0.9347, 0.9255, 0.6341, 0.0567], [0.7656, 0.2911, 0.6161, 0.0123], [0.4200, 0.3295, 0.1863, 0.7694],
     [0.3197, 0.9724, 0.6066, 0.2184], [0.4521, 0.9276, 0.3951, 0.1281], [0.7899, 0.7894, 0.2245, 0.2889]],
])
print("x:", tuple(x_src.shape), "= [B, T, C]")

# %% [markdown]
# The loop version is exactly the picture: a list of chapter-03 heads, run one after another on the
# same input, concatenated along the channel axis, then projected by W_o. It is a scaffold: it lives
# in this notebook only, as the baseline the faster versions are proved and timed against.

# %%
#| export
"""Multi-head causal self-attention (chapter 04), with the KV cache used for generation.

nh of chapter 03's heads side by side, on slices of one packed projection, mixed by W_o.
Shapes: B batch, T new positions, L cached positions, T_total = L + T, C = d_model channels,
nh heads, hs = C // nh head size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.arguments import check_heads, real_number, whole_number
from transformer_course.attention import causal_mask, check_input, check_mask, scaled_dot_product_attention

# %%
class LoopedMultiHeadAttention(nn.Module):
    """The scaffold: nh separate chapter-03 `AttentionHead`s, run one after another, concatenated,
    then mixed by W_o. x [B, T, C] -> [B, T, C]. Not in the package: models use `MultiHeadAttention`."""

    def __init__(self, d_model: int, n_head: int, bias: bool = True, causal: bool = True) -> None:
        super().__init__()
        hs = d_model // n_head
        self.heads = nn.ModuleList(AttentionHead(d_model, hs, causal=causal) for _ in range(n_head))
        self.proj = nn.Linear(d_model, d_model, bias=bias)  # W_o

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.cat([head(x, mask) for head in self.heads], dim=-1)  # nh x (B, T, hs) -> (B, T, C)
        return self.proj(y)  # (B, T, C)

# %%
looped = LoopedMultiHeadAttention(d_model=4, n_head=2)
per_head = [head(x_src) for head in looped.heads]
print("each head:   ", [tuple(y.shape) for y in per_head], "= [B, T, hs]")
concatenated = torch.cat(per_head, dim=-1)
print("concatenated:", tuple(concatenated.shape), "= [B, T, C]")
out_loop = looped(x_src)
print("after W_o:   ", tuple(out_loop.shape), "= [B, T, C], same shape as the input")
assert torch.equal(out_loop, looped.proj(concatenated))

# %% [markdown]
# Each head is chapter 03's computation. Source 0 works one row of one head by hand: the last token,
# *horizon*, with query (0.9100, 0.3448) against the six keys and values it lists. Let us redo it with
# chapter 03's function.

# %%
q_horizon = torch.tensor([[0.9100, 0.3448]])  # [T_q = 1, hs = 2]
k_src = torch.tensor([[0.0921, 0.9907], [0.5637, 0.7303], [0.1860, 0.4071],
                      [0.8067, 0.1776], [0.7002, 0.6632], [0.9094, 0.3594]])  # [T_k = 6, hs]
v_src = torch.tensor([[0.5637, 0.4056], [0.9803, 0.0100], [0.4111, 0.3980],
                      [0.6882, 0.9797], [0.5551, 0.7583], [0.3060, 0.2141]])  # [T_k, hs]
print("raw scores q.k:       ", (q_horizon @ k_src.T)[0])
out_h, w_h = scaled_dot_product_attention(q_horizon, k_src, v_src)
print("weights (scaled):     ", w_h[0])
print("output:               ", out_h[0])
w_unscaled = torch.softmax(q_horizon @ k_src.T, dim=-1)
print("softmax without 1/√hs:", w_unscaled[0], "->", (w_unscaled @ v_src)[0])

# %% [markdown]
# The raw scores match the source (0.4254 ... 0.9515). **Its weights do not**: it says it divides
# the scores by √hs = √2, but its printed row (0.1252, 0.1758, 0.1115, 0.1812, 0.1945, 0.2119) and output
# (0.5863, 0.4673) are the softmax of the *unscaled* scores, the last line above (up to rounding in the
# fourth decimal, as the source rounds its inputs). With the scaling it
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
# product treats (batch, head) pairs as independent problems. Source 3's sizes: B = 4 sequences of
# T = 16 tokens, C = 64, nh = 4 heads of hs = 16.

# %%
B, T, C, nh = 4, 16, 64, 4
hs = C // nh
x = torch.randn(B, T, C)
qkv = nn.Linear(C, 3 * C)
q, k, v = qkv(x).split(C, dim=-1)
print(f"x         {tuple(x.shape)}  [B, T, C]")
print(f"q = x W_q {tuple(q.shape)}  [B, T, C], all heads' queries side by side")

# %% [markdown]
# **Splitting into heads.** `split_heads(x, n_head)` turns [B, T, C] into [B, nh, T, hs]. For every
# batch item and every head it must hold a [T, hs] table whose row t is *token t's* slice for that
# head: channels h·hs .. (h+1)·hs - 1. A worked example with B = 1, T = 3, C = 4, nh = 2, the twelve
# numbers labelled 0..11 in memory order (token t holds 4t .. 4t+3):
#
# | | token 0 | token 1 | token 2 |
# |---|---|---|---|
# | head 0 (channels 0, 1) | 0, 1 | 4, 5 | 8, 9 |
# | head 1 (channels 2, 3) | 2, 3 | 6, 7 | 10, 11 |
#
# so the answer has shape [1, 2, 3, 2] and its head 0 is [[0, 1], [4, 5], [8, 9]].
#
# Think in two moves: first give the channel axis its own structure (nh groups of hs channels, which
# are already next to each other in memory), then bring the head axis in front of the time axis.
# Beware of a shortcut with the right shape and the wrong content: reading the twelve numbers straight
# into [1, 2, 3, 2] makes head 0's rows (0, 1), (2, 3), (4, 5). Its second row is the second half of
# token 0, so its rows are no longer tokens. No copy of the data is needed (a view will do), and your
# function must work for any B, T, C and any nh that divides C. The argument checks are written for you
# above the marked region.

# %%
#| export
# Your turn - Exercise 4.1 (★☆☆, build): split the channels into heads.
def split_heads(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """[B, T, C] -> [B, nh, T, hs]: head h gets channels h*hs .. (h+1)*hs - 1 of every token (a view)."""
    if x.ndim != 3:
        raise ValueError(f"split_heads needs x of shape [B, T, C], got {tuple(x.shape)}")
    if type(n_head) is not int or n_head < 1 or x.shape[-1] % n_head:  # well-formed calls skip the check
        check_heads(x.shape[-1], n_head)
    ### BEGIN SOLUTION
    B, T, C = x.shape
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, nh, T, hs)
    ### END SOLUTION

# %%
split_heads = check_split_heads(split_heads).use

# %% [markdown]
# From here on, every cell that cuts a tensor into heads calls `split_heads`: yours if it passed, the
# package's otherwise. The worked example, and source 3's queries:

# %%
tiny = torch.arange(12.0).view(1, 3, 4)  # token t holds 4t .. 4t+3
print("head 0:", split_heads(tiny, 2)[0, 0].tolist(), " head 1:", split_heads(tiny, 2)[0, 1].tolist())
qh, kh, vh = (split_heads(t, nh) for t in (q, k, v))
print(f"split_heads(q, {nh}) {tuple(qh.shape)}  [B, nh, T, hs], heads next to the batch")
for h in range(nh):  # head h owns channels h*hs .. (h+1)*hs - 1 of every token
    assert torch.equal(qh[:, h], q[..., h * hs:(h + 1) * hs])
print("head h of split_heads(q) = channels h*hs .. (h+1)*hs - 1 of q, for every h")

# %% [markdown]
# Now chapter 03's function runs every head of every sequence in one call: it works on the last two
# axes and treats the leading [B, nh] as a batch of independent problems.
#
# Source 3 states that the attention scores of this example have shape
# [batch_size, num_heads, context_length, head_size]. Its own numbers cannot tell: with T = hs = 16,
# that reading and the right one print the same shape. So take a shorter sequence: the first T = 10
# tokens of the same batch, still 4 heads of hs = 16.

# %%
# Your turn - Exercise 4.2 (★☆☆, predict): the shape of the attention scores.
def my_prediction() -> tuple[int, ...]:
    """B = 4 sequences of T = 10 tokens, C = 64, 4 heads of 16: the shape of the scores (and weights)?"""
    ### BEGIN SOLUTION
    return (4, 4, 10, 10)
    ### END SOLUTION


check_predict_scores_shape(my_prediction)

# %%
T_short = 10
q10, k10, v10 = (split_heads(t[:, :T_short], nh) for t in (q, k, v))
a10, w10 = scaled_dot_product_attention(q10, k10, v10, causal_mask(T_short))
print("q, k, v per head:", tuple(q10.shape), "= [B, nh, T, hs]")
print("weights:         ", tuple(w10.shape), "= [B, nh, T, T], one row per query, one column per key")
print("output:          ", tuple(a10.shape), "= [B, nh, T, hs]")

# %% [markdown]
# The last axis of the scores runs over *keys*, so it has length T, not hs: source 3's label is a
# slip that its choice T = hs hides.
#
# **Merging the heads back.** `merge_heads(y)` undoes the split: [B, nh, T, hs] -> [B, T, C], each
# token's row made of head 0's hs numbers, then head 1's, and so on. Worked example: if head 0 holds
# rows (0, 1), (2, 3), (4, 5) and head 1 holds (6, 7), (8, 9), (10, 11), then token 0 is
# (0, 1, 6, 7), token 1 is (2, 3, 8, 9) and token 2 is (4, 5, 10, 11).
#
# Two traps. Reading the memory of [1, 2, 3, 2] straight as [1, 3, 4] has the right shape but gives
# token 0 = (0, 1, 2, 3): all of head 0, three positions' worth mixed into one token. And once you have
# moved axes, the tensor's memory is no longer in the new order (swapping axes only changes the
# strides), so an operation that merely reinterprets memory will refuse to merge axes; one that copies
# when it must will not. Source 3 goes one step further, multiplies the merged heads by W_o, and
# calls that product "the output of the single-head attention": A·W_o is the output of the whole
# multi-head layer, every head's result mixed by W_o, not of any single head.

# %%
#| export
# Your turn - Exercise 4.3 (★☆☆, build): merge the heads back.
def merge_heads(y: torch.Tensor) -> torch.Tensor:
    """[B, nh, T, hs] -> [B, T, C]: the inverse of `split_heads`, the heads' outputs side by side."""
    if y.ndim != 4:
        raise ValueError(f"merge_heads needs y of shape [B, nh, T, hs], got {tuple(y.shape)}")
    ### BEGIN SOLUTION
    B, nh, T, hs = y.shape
    # after transpose the memory is not in (B, T, C) order, so .view would fail; reshape copies
    return y.transpose(1, 2).reshape(B, T, nh * hs)  # (B, T, C)
    ### END SOLUTION

# %%
merge_heads = check_merge_heads(merge_heads).use

# %%
print("tokens of merge_heads(split_heads(tiny)):", merge_heads(split_heads(tiny, 2))[0].tolist())
merged = merge_heads(a10)
print(f"merge_heads(output) {tuple(merged.shape)} [B, T, C]; after W_o: {tuple(nn.Linear(C, C)(merged).shape)}")
print("merge_heads(split_heads(x)) == x:", torch.equal(merge_heads(split_heads(x, nh)), x))

# %% [markdown]
# Source 4 does the same split in Julia with `reshape(Q, dim ÷ nheads, nheads, ...)`: Julia stores
# arrays column-major, so its first axis varies fastest, and that reshape lists our axes [.., nh, hs]
# backwards. Both helpers go into the package, and the layer below uses them.

# %% [markdown]
# ## 4. Generating with a KV cache: the causal mask gets a past
#
# When a model generates text it runs again for every new token. Without help, step n recomputes the
# keys and values of all n earlier positions, although none of them changed: with a causal mask, an
# earlier position never looks at a later one. A **KV cache** keeps each layer's keys and values and
# appends only the new positions' ones, so each step projects just the new token(s).
#
# That changes the mask. If the cache holds L positions and T new queries arrive, the scores are
# [T, L + T]: one row per new query, one column per key, cached keys first. New query t sits at
# position L + t, so it may see keys 0 .. L + t: every cached key, and the new ones up to itself. With
# L = 3 cached and T = 2 new positions (1 = may attend):
#
# | | key 0 | key 1 | key 2 | key 3 | key 4 |
# |---|---|---|---|---|---|
# | new query 0 (position 3) | 1 | 1 | 1 | 1 | 0 |
# | new query 1 (position 4) | 1 | 1 | 1 | 1 | 1 |
#
# With no cache (L = 0) it must be chapter 03's `causal_mask(T)`, and it must accept `device` like that
# function does. The check of `past` is written for you.

# %%
#| export
# Your turn - Exercise 4.4 (★★☆, build): the causal mask when `past` positions are cached.
def causal_mask_with_past(T: int, past: int = 0, device=None) -> torch.Tensor:
    """Bool [T, past + T]: True where new query t (at position past + t) may attend key j, j <= past + t.

    Chapter 03's `causal_mask(T)` shifted right by ``past`` columns: every cached key is visible.
    """
    past = whole_number(past, "past", low=0, hint="the number of cached positions")
    ### BEGIN SOLUTION
    seen = torch.ones(T, past, dtype=torch.bool, device=device)  # cached keys: all in the past
    return torch.cat([seen, causal_mask(T, device=device)], dim=1)  # (T, past + T)
    ### END SOLUTION

# %%
causal_mask_with_past = check_causal_mask_with_past(causal_mask_with_past).use

# %%
print("L = 3 cached, T = 2 new: rows are new queries (positions 3 and 4), columns keys 0..4")
print(causal_mask_with_past(2, past=3).int())
print("a top-left triangle over the same [2, 5] scores:")
print(torch.ones(2, 5, dtype=torch.bool).tril().int())

# %% [markdown]
# The second grid is what `F.scaled_dot_product_attention(..., is_causal=True)` builds when queries and
# keys have different lengths: its triangle starts in the top-left corner. Query 0 (really at position
# 3) would see only key 0. That is right with no cache (L = 0, square scores) and wrong after a past,
# even for a single new query (T = 1), which it would also give key 0 only. A single new query needs no
# mask at all (every key is in its past), and the layer below passes it none. Here is the error in
# numbers, on one head with L = 3 and T = 2, then T = 1:

# %%
g = torch.Generator().manual_seed(1)
q5, k5, v5 = (torch.randn(1, 1, 5, 8, generator=g) for _ in range(3))  # positions 0..4
full, _ = scaled_dot_product_attention(q5, k5, v5, causal_mask(5))
shifted = F.scaled_dot_product_attention(q5[:, :, 3:], k5, v5, attn_mask=causal_mask_with_past(2, past=3))
top_left = F.scaled_dot_product_attention(q5[:, :, 3:], k5, v5, is_causal=True)
print("explicit shifted mask = full sequence's last 2 rows:", torch.allclose(shifted, full[:, :, 3:], atol=1e-6))
print("is_causal=True        = full sequence's last 2 rows:", torch.allclose(top_left, full[:, :, 3:], atol=1e-6))
last_causal = F.scaled_dot_product_attention(q5[:, :, 4:], k5, v5, is_causal=True)
last_open = F.scaled_dot_product_attention(q5[:, :, 4:], k5, v5)  # no mask: all five keys
print("T = 1, is_causal=True = full sequence's last row:", torch.allclose(last_causal, full[:, :, 4:], atol=1e-6),
      "| no mask:", torch.allclose(last_open, full[:, :, 4:], atol=1e-6))

# %% [markdown]
# The cache itself is a small object per layer: `update(k, v)` appends the new positions along the
# time axis (dim 2 of [B, nh, T, hs]) and returns everything so far. It keeps them in buffers with room
# to spare, so appending one position writes one position. The obvious alternative, `torch.cat` of the
# past and the new, copies the whole past into a freshly allocated tensor at every step: work that grows
# with the past, and new memory for the system to hand out each time (for GPT-2 small near its full
# context, that is the whole cache of every layer, tens of megabytes, per token; section 9 computes its
# size). When the room runs out the buffers double, so a cache of L positions is copied fewer than
# log2(L) times in all; a model that knows its longest context
# (chapter 06's `GPT.new_cache`) asks for that much room at once.

# %%
#| export
class KVCache:
    """One layer's key/value cache: keys and values [B, nh, L, hs] of positions 0 .. L-1.

    ``update(k, v)`` appends the new positions (time is dim 2) and returns all of them. They live in
    buffers [B, nh, room, hs] with room for ``capacity`` positions (None: what the first update needs),
    doubled when full, so an append copies only the new positions. ``k`` and ``v`` are views of the
    filled part; ``nbytes`` = 2 * B * nh * L * hs * element_size.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = whole_number(capacity, "capacity", none_ok=True, hint="the positions to make room for")
        self.reset()  # empty: the buffers _k and _v [B, nh, room, hs] come with the first update

    @property
    def k(self) -> torch.Tensor | None:
        """Cached keys [B, nh, L, hs], None when empty."""
        return None if self._k is None else self._k[:, :, : self._length]

    @property
    def v(self) -> torch.Tensor | None:
        """Cached values [B, nh, L, hs], None when empty."""
        return None if self._v is None else self._v[:, :, : self._length]

    @property
    def length(self) -> int:
        """L, the number of cached positions."""
        return self._length

    @property
    def nbytes(self) -> int:
        return 0 if self._k is None else 2 * self.k.numel() * self._k.element_size()

    def reset(self) -> None:
        """Forget every cached position (before a new sequence)."""
        self._k = self._v = None
        self._length = 0

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v [B, nh, T_new, hs]; return all keys and values so far, [B, nh, L + T_new, hs]."""
        if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)) or k.ndim != 4 or k.shape != v.shape:
            shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in (k, v)]
            raise ValueError("KVCache.update needs k and v of one shape [B, nh, T_new, hs], "
                             f"got {shapes[0]} and {shapes[1]}")
        B, nh, T_new, hs = k.shape
        L, need, old_k, old_v = self._length, self._length + T_new, self._k, self._v
        if old_k is not None and ((old_k.shape[0], old_k.shape[1], old_k.shape[3], old_k.dtype, old_k.device)
                                  != (B, nh, hs, k.dtype, k.device)):
            raise ValueError(f"KVCache holds [B, nh, L, hs] = {tuple(self.k.shape)} ({old_k.dtype}, {old_k.device}) "
                             f"but got {tuple(k.shape)} ({k.dtype}, {k.device}): batch, heads, head size, dtype and "
                             "device must stay the same; call reset() for a new batch")
        if old_k is None or need > old_k.shape[2]:  # (re)allocate: own buffers, never views of qkv's output
            room = max(need, self.capacity or 0, 2 * old_k.shape[2] if old_k is not None else 0)
            self._k, self._v = k.new_empty(B, nh, room, hs), v.new_empty(B, nh, room, hs)
            if L:  # the one copy of the past, each time the room doubles
                self._k[:, :, :L], self._v[:, :, :L] = old_k[:, :, :L], old_v[:, :, :L]
        self._k[:, :, L:need], self._v[:, :, L:need] = k, v  # (B, nh, T_new, hs) written in place
        self._length = need
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
# - `fast=True` (default) calls PyTorch's fused `F.scaled_dot_product_attention`, which on this CPU
#   does not store the full [B, nh, T, T] weights (see the measurements below). It uses the kernel's own
#   `is_causal` triangle only where that is right (no cache), passes no mask at all for a single new
#   query, and otherwise gives the kernel the explicit shifted mask.
# - `fast=False`, the teaching path, calls chapter 03's function and keeps the weights
#   [B, nh, T, T_total] in `.last_weights` for plots.
#
# Both paths sit in one public method, `attend(q, k, v, mask)`, which takes heads already split
# ([B, nh, T, hs] queries, [B, nh, T_total, hs] keys and values); `forward` projects, splits, calls it,
# merges and mixes. Chapter 09's cross-attention reuses `attend` with keys and values from elsewhere.
# An optional extra bool `mask` (True = may attend, e.g. to hide padding) is combined with the causal
# one, and checked by chapter 03's `check_mask`. A query whose every key is hidden gets a zero output
# on both paths, never NaN.
#
# The layer keeps no causal-mask buffer of a fixed size: each call builds the mask for its own T (and
# cache length), so the layer itself has no maximum length. The limit comes from the position
# embedding (chapter 02's `block_size`), which says so when it is exceeded.

# %%
#| export
class MultiHeadAttention(nn.Module):
    """Causal multi-head self-attention: x [B, T, C] -> [B, T, C].

    ``qkv`` (C -> (nh + 2·nkv)·hs, output [q | k | v], heads contiguous inside each), ``proj`` (W_o,
    C -> C). ``n_kv_head`` nkv (None: nh) key/value heads, each shared by nh // nkv query heads
    (chapter 10); ``rope`` (chapter 10's rotary embedding) turns q and k by their positions before
    the keys are cached. ``fast=True`` uses ``F.scaled_dot_product_attention``; ``fast=False`` uses
    chapter 03's function and keeps the weights [B, nh, T, T_total] in ``.last_weights``.
    """

    def __init__(self, d_model: int, n_head: int, dropout: float = 0.0, bias: bool = True, causal: bool = True,
                 fast: bool = True, *, n_kv_head: int | None = None, rope: nn.Module | None = None) -> None:
        super().__init__()
        C, nh, nkv = check_heads(d_model, n_head, n_kv_head)
        self.d_model, self.n_head, self.n_kv_head, self.head_size = C, nh, nkv, C // nh
        self.dropout = real_number(dropout, "dropout", low=0.0, high=1.0, high_open=True)
        self.causal, self.fast, self.rope = causal, fast, rope
        self.qkv = nn.Linear(C, (nh + 2 * nkv) * self.head_size, bias=bias)  # W_q, W_k, W_v, packed
        self.proj = nn.Linear(C, C, bias=bias)  # W_o
        self.resid_dropout = nn.Dropout(dropout)
        self.last_weights: torch.Tensor | None = None  # (B, nh, T, T_total), teaching path only
        self.checks_input = True  # False once an owner (chapter 05's block) checks x before calling

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, cache: KVCache | None = None) -> torch.Tensor:
        """x [B, T, C] -> [B, T, C]. ``mask``: extra bool mask broadcastable to [B, nh, T, T_total].

        ``cache`` (updated in place) holds L earlier positions: the new queries sit at L .. L+T-1.
        """
        if self.checks_input:
            check_input(x, self.d_model, "MultiHeadAttention")
        nh, nkv, hs = self.n_head, self.n_kv_head, self.head_size
        q, k, v = self.qkv(x).split([nh * hs, nkv * hs, nkv * hs], dim=2)  # (B, T, nh·hs), 2 x (B, T, nkv·hs)
        q, k, v = split_heads(q, nh), split_heads(k, nkv), split_heads(v, nkv)  # (B, heads, T, hs)
        if self.rope is not None:
            start = 0 if cache is None else cache.length
            q, k = self.rope(q, start), self.rope(k, start)  # turned by positions start .. start+T-1
        if cache is not None:
            k, v = cache.update(k, v)  # (B, nkv, T_total, hs), T_total = L + T
        y = self.attend(q, k, v, mask)  # (B, nh, T, hs)
        return self.resid_dropout(self.proj(merge_heads(y)))  # (B, T, C)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor | None = None) -> torch.Tensor:
        """Every head at once: q [B, nh, T, hs], k and v [B, nkv, T_total, hs] -> [B, nh, T, hs].

        The queries are the last T of the T_total positions. ``mask`` (bool, broadcastable to
        [B, nh, T, T_total]) is combined with the shifted causal mask; a query whose every key is
        masked gets a zero output on both paths.
        """
        B, nh, T, _ = q.shape
        T_total, shared = k.shape[2], k.shape[1] != nh  # shared: nkv < nh key/value heads
        if mask is not None:
            check_mask(mask, (B, nh, T, T_total))
        p = self.dropout if self.training else 0.0
        self.last_weights = None  # the teaching path below keeps the weights
        if self.fast and mask is None and (not self.causal or T == 1 or T == T_total):
            # is_causal's triangle is aligned top-left: right with no cache (T == T_total);
            # a single new query may see every key, so it needs no mask at all
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, enable_gqa=shared,
                                                  is_causal=self.causal and T == T_total)
        allowed = causal_mask_with_past(T, T_total - T, device=q.device) if self.causal else None
        if mask is not None:
            allowed = mask if allowed is None else allowed & mask  # (B or 1, nh or 1, T, T_total)
        if not self.fast:  # the teaching path: each key/value head copied for its group of queries
            k, v = (t.repeat_interleave(nh // t.shape[1], dim=1) for t in (k, v))  # (B, nh, T_total, hs)
            y, weights = scaled_dot_product_attention(q, k, v, allowed, dropout_p=p)
            self.last_weights = weights.detach()  # (B, nh, T, T_total)
            return y  # (B, nh, T, hs)
        has_key = allowed.any(dim=-1, keepdim=True)  # a row hidden entirely (padding) is given all keys...
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~has_key, dropout_p=p, enable_gqa=shared)
        return y.masked_fill(~has_key, 0.0)  # ...so the kernel stays finite, then its output is zeroed

    def extra_repr(self) -> str:
        kv = f", n_kv_head={self.n_kv_head}" if self.n_kv_head != self.n_head else ""
        return f"n_head={self.n_head}{kv}, head_size={self.head_size}, causal={self.causal}, fast={self.fast}"

# %%
mha = MultiHeadAttention(d_model=64, n_head=4)
print(mha)
print("output:", tuple(mha(x).shape), "parameters:", sum(p.numel() for p in mha.parameters()))
for bad in ({"d_model": 64, "n_head": 5}, {"d_model": 10, "n_head": 4}):
    try:
        MultiHeadAttention(**bad)
    except ValueError as e:
        print("ValueError:", e)
try:
    mha(torch.randn(4, 16, 32))  # 32 channels into a 64-channel layer
except ValueError as e:
    print("ValueError:", e)

# %% [markdown]
# ## 6. Proof: the loop and the batched layer are the same function
#
# To prove it, copy the loop's weights into the packed layout and compare outputs. That copy is yours
# to write: `pack_heads(heads, proj, fast=True)` takes the loop's chapter-03 heads and its W_o and
# returns a `MultiHeadAttention` computing the same function. It is a tool for this proof, not part of
# the package. What you need to know about the layouts:
#
# - `nn.Linear` stores its weight as [out_features, in_features], so head h's `query.weight` is
#   [hs, C]: row i makes output channel i of that head's query.
# - The packed layer's query channels h·hs .. (h+1)·hs - 1 belong to head h, so W_q [C, C] is the
#   heads' query weights one under the other, head 0 first. W_k and W_v are built the same way, and
#   `qkv.weight` [3C, C] is W_q, then W_k, then W_v (grouped by kind, not by head).
# - The heads have no bias (chapter 03's `AttentionHead` is bias-free), but `qkv` has one when the
#   layer has biases, and it starts random: it must become zero. W_o (`proj`) is copied as it is.
#
# The function runs under `torch.no_grad()`, so copying into a parameter in place is allowed; the
# new layer is made for you, with the loop's sizes, bias setting, dtype and device.

# %%
# Your turn - Exercise 4.5 (★★☆, extend): pack a loop of heads into one layer.
@torch.no_grad()
def pack_heads(heads: list[AttentionHead], proj: nn.Linear, fast: bool = True) -> MultiHeadAttention:
    """A `MultiHeadAttention` computing what ``heads`` (run side by side, concatenated) and W_o ``proj`` compute.

    Rows h*hs .. (h+1)*hs - 1 of W_q (the first C rows of ``qkv.weight`` [3C, C]) are head h's
    ``query.weight``; likewise W_k and W_v. The heads have no bias, so ``qkv.bias`` is zero.
    """
    heads = list(heads)
    mha = MultiHeadAttention(heads[0].d_model, len(heads), bias=proj.bias is not None, causal=heads[0].causal, fast=fast)
    mha.to(proj.weight)  # same dtype and device
    ### BEGIN SOLUTION
    w = [torch.cat([getattr(h, name).weight for h in heads]) for name in ("query", "key", "value")]  # 3 x (C, C)
    mha.qkv.weight.copy_(torch.cat(w))  # (3C, C)
    if mha.qkv.bias is not None:
        mha.qkv.bias.zero_()
    mha.proj.load_state_dict(proj.state_dict())
    ### END SOLUTION
    return mha

# %%
pack_heads = check_pack_heads(pack_heads).use

# %%
torch.manual_seed(0)
looped = LoopedMultiHeadAttention(d_model=64, n_head=4)
x = torch.randn(4, 16, 64)
for fast in (False, True):
    packed = pack_heads(looped.heads, looped.proj, fast=fast)
    diff = (packed(x) - looped(x)).abs().max().item()
    print(f"fast={fast!s:5}  loop and batched agree within 1e-6: {diff < 1e-6}")
    assert diff < 1e-6

# %% [markdown]
# The largest difference is a few float32 roundings (1e-7): same function, different order of
# additions. In the other direction, the loop's head h *is* a slice of the packed layer; there is
# nothing a loop of heads can compute that the batched layer cannot.

# %% [markdown]
# ## 7. Fast path and teaching path: one function
#
# The two paths of `MultiHeadAttention` share every parameter, so switching `fast` on the same module
# must not change the output. The teaching path also keeps the weights, which should look like chapter
# 03's: every row sums to 1 and nothing above the diagonal (the future) gets weight.

# %%
torch.manual_seed(0)
mha = MultiHeadAttention(d_model=64, n_head=4).eval()
x = torch.randn(2, 12, 64)
y_fast = mha(x)
mha.fast = False
y_teach = mha(x)
w = mha.last_weights
print("fast and teaching agree within 1e-6:", torch.allclose(y_fast, y_teach, atol=1e-6))
print("weights:", tuple(w.shape), "= [B, nh, T, T]; rows sum to 1:", torch.allclose(w.sum(-1), torch.ones(2, 4, 12)),
      "; weight on the future:", w.triu(1).abs().max().item())

# %% [markdown]
# **Padding.** Sequences in a batch often have different lengths and are padded to the longest. The
# extra `mask` hides the pad positions as keys. With *left* padding a real problem appears: in the
# first sequence below, positions 0-2 are pads, so query 0 may look only at key 0 (causal) and key 0 is
# hidden too. Its row has no allowed key at all: softmax over nothing is 0/0 = NaN, unless handled.
# Both paths return zero attention for such a row (the layer's output there is just W_o's bias).
#
# (Source 3 describes the causal mask as "essentially sequence padding". They are two different
# masks: the causal one hides *later* positions, a padding mask hides positions that hold no real token.
# A batch of padded sequences needs both, which is why the layer combines them.)

# %%
keep = torch.ones(2, 12, dtype=torch.bool)
keep[0, :3] = False  # sequence 0 is left-padded with 3 pads
pad_mask = keep[:, None, None, :]  # [B, 1, 1, T_total]: hide pad keys for every head and query
outs = {}
for fast in (True, False):
    mha.fast = fast
    outs[fast] = mha(x, mask=pad_mask)
print("no NaN:", all(torch.isfinite(o).all().item() for o in outs.values()),
      "| paths agree:", torch.allclose(outs[True], outs[False], atol=1e-6),
      "| query 0 of sequence 0 = W_o bias:", torch.allclose(outs[True][0, 0], mha.proj.bias, atol=1e-6))

# %% [markdown]
# ## 8. The same result as `torch.nn.MultiheadAttention`
#
# PyTorch's own layer packs its input projection exactly as we do (`in_proj_weight` is
# [W_q; W_k; W_v], [3C, C]), so our weights copy straight across. One trap: its bool `attn_mask` means
# the opposite of ours, True = *may not* attend, so we pass `~causal_mask(T)`.

# %%
ref = nn.MultiheadAttention(64, 4, batch_first=True).eval()
with torch.no_grad():
    ref.in_proj_weight.copy_(mha.qkv.weight)
    ref.in_proj_bias.copy_(mha.qkv.bias)
    ref.out_proj.weight.copy_(mha.proj.weight)
    ref.out_proj.bias.copy_(mha.proj.bias)
want, _ = ref(x, x, x, attn_mask=~causal_mask(12), need_weights=False)
for fast in (True, False):
    mha.fast = fast
    print(f"fast={fast!s:5}  equals torch.nn.MultiheadAttention within 1e-6:", torch.allclose(mha(x), want, atol=1e-6))

# %% [markdown]
# ### Spot the bug: a multi-head attention from two sources
#
# Source 1 writes the masked multi-head formula, and source 4 its code, in a way that looks right
# and runs without complaint. Here it is in our notation, with our layer's weights and our helpers:

# %%
def heads_attention_with_a_bug(layer: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """x [B, T, C] -> [B, T, C] through ``layer``'s qkv and proj, all heads at once (causal, no cache)."""
    B, T, C = x.shape
    q, k, v = (split_heads(t, layer.n_head) for t in layer.qkv(x).split(C, dim=-1))  # 3 x (B, nh, T, hs)
    y, _ = scaled_dot_product_attention(q, k, v, causal_mask(T), scale=C**-0.5)  # (B, nh, T, hs)
    return layer.proj(merge_heads(y))  # (B, T, C)

# %% [markdown]
# The symptom: with 4 heads it agrees neither with our layer nor with PyTorch's, yet with a single
# head it agrees exactly. Whatever is wrong must depend on the number of heads.

# %%
mha.fast = True
print("4 heads: equals torch.nn.MultiheadAttention within 1e-6:", torch.allclose(heads_attention_with_a_bug(mha, x), want, atol=1e-6))
print("4 heads: equals our layer within 1e-6:              ", torch.allclose(heads_attention_with_a_bug(mha, x), mha(x), atol=1e-6))
one_head = MultiHeadAttention(64, n_head=1).eval()
print("1 head:  equals our layer within 1e-6:              ", torch.allclose(heads_attention_with_a_bug(one_head, x), one_head(x), atol=1e-6))

# %%
# Your turn - Exercise 4.6 (★☆☆, debug): fix the multi-head attention above.
def my_heads_attention(layer: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """x [B, T, C] -> [B, T, C]: what ``layer(x)`` computes (causal, no cache), written like the cell above, fixed."""
    ### BEGIN SOLUTION
    B, T, C = x.shape
    q, k, v = (split_heads(t, layer.n_head) for t in layer.qkv(x).split(C, dim=-1))  # 3 x (B, nh, T, hs)
    y, _ = scaled_dot_product_attention(q, k, v, causal_mask(T), scale=layer.head_size**-0.5)  # (B, nh, T, hs)
    return layer.proj(merge_heads(y))  # (B, T, C)
    ### END SOLUTION


check_heads_attention(my_heads_attention)

# %% [markdown]
# **Which √ to divide by?** Each head compares vectors of hs numbers, so its scores must be divided by
# √hs (Vaswani et al. 2017, section 3.2.2: d_k = d_model / h), which is what chapter 03's function does
# when given no `scale`. Sources 1 and 4 divide by √d_model, the full width; with a single head the
# two are the same number, which is why the bug hides there. With 4 heads, 1/√C makes every score half
# as large as it should be, so every softmax is flatter than intended: the layer still trains, but it is
# not the transformer of the paper (nor of GPT-2 or PyTorch), and weights trained with one cannot be
# loaded into the other.
#
# Source 4 also calls the scaling a detail that does not matter much. It matters: a dot product of hs
# numbers of spread about 1 has a spread of about √hs, so without the division the scores of a wide
# head are large, the softmax puts almost all the weight on one key, and its gradient almost vanishes
# (chapter 03 measures both). Dividing by √d_model instead, as sources 1 and 4 do, errs the other
# way: the scores come out too small and the weights too flat.

# %% [markdown]
# ## 9. The KV cache inside the layer
#
# `forward(x, cache=...)` projects only the new positions, appends their keys and values to the
# cache, and attends with the shifted mask. Fed in any pieces, one token at a time or in chunks, the
# layer must give exactly what it gives for the whole sequence at once:

# %%
def run_in_pieces(layer, x, sizes):
    """Feed x [B, T, C] through layer in consecutive chunks of the given sizes, sharing one cache."""
    cache, outs, start = KVCache(), [], 0
    for n in sizes:
        outs.append(layer(x[:, start:start + n], cache=cache))
        start += n
    return torch.cat(outs, dim=1), cache

for fast in (True, False):
    mha.fast = fast
    whole = mha(x)
    for sizes in ([1] * 12, [5, 1, 6], [3, 3, 3, 3]):
        pieces, cache = run_in_pieces(mha, x, sizes)
        print(f"fast={fast!s:5} chunks {str(sizes):38} equal to whole: {torch.allclose(pieces, whole, atol=1e-6)}, cache length {cache.length}")

# %% [markdown]
# What does a cache cost? Each position stores a key and a value of C numbers per layer:
# 2 · C · 4 bytes in float32. For GPT-2 small (12 layers, 12 heads of 64, up to 1,024 positions) we can
# fill one layer's cache and measure it:

# %%
gpt2_layer = KVCache()
gpt2_layer.update(torch.zeros(1, 12, 1024, 64), torch.zeros(1, 12, 1024, 64))
per_layer = gpt2_layer.nbytes
print(f"one layer, 1,024 positions: {per_layer / 2**20:.1f} MiB; 12 layers: {12 * per_layer / 2**20:.1f} MiB per sequence")
print(f"per position, all layers: {12 * per_layer / 1024 / 1024:.1f} KiB")

# %% [markdown]
# That is the price of not recomputing the past; chapter 07 measures what it buys. Exercise 4.7, at the
# end of the chapter, builds one way large models shrink it: let several query heads share one
# key/value head.

# %% [markdown]
# ## 10. What do different heads attend to?
#
# With random weights the heads' attention maps mean nothing. To see heads *specialise*, we train a
# tiny model on a task that needs three different lookups. The input is a sequence of random digits;
# at every position the model must output three things: the previous digit, the digit two back, and
# the first digit of the sequence. The model is chapter 02's `InputEmbedding` (token + learned
# position), one `MultiHeadAttention` with 4 heads and a linear read-out; there is no residual
# connection, so everything the read-out knows has come through attention.

# %%
from transformer_course.positional import InputEmbedding  # noqa: E402

V_TOY, T_TOY = 10, 12


class LookupModel(nn.Module):
    """idx [B, T] -> logits [B, T, 3, V] for (previous, two back, first) digit."""

    def __init__(self, d_model: int = 32, n_head: int = 4):
        super().__init__()
        self.embed = InputEmbedding(V_TOY, d_model, block_size=T_TOY)
        self.attn = MultiHeadAttention(d_model, n_head)
        self.readout = nn.Linear(d_model, 3 * V_TOY)

    def forward(self, idx):
        return self.readout(self.attn(self.embed(idx))).view(*idx.shape, 3, V_TOY)

# %%
def lookup_targets(idx):
    """[B, T] -> [B, T, 3]: previous, two back, first digit (a position with no such digit uses itself)."""
    t = torch.arange(idx.shape[1])
    prev, back2 = idx[:, (t - 1).clamp(min=0)], idx[:, (t - 2).clamp(min=0)]
    return torch.stack([prev, back2, idx[:, :1].expand_as(idx)], dim=-1)

print("digits 7 3 5 1 -> rows: previous, two back, first; one column per position")
print(lookup_targets(torch.tensor([[7, 3, 5, 1]]))[0].T)

# %%
torch.manual_seed(0)
gen = torch.Generator().manual_seed(0)
model = LookupModel()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(150):
    idx = torch.randint(0, V_TOY, (64, T_TOY), generator=gen)
    loss = F.cross_entropy(model(idx).reshape(-1, V_TOY), lookup_targets(idx).reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
model.eval()
test_idx = torch.randint(0, V_TOY, (256, T_TOY), generator=gen)
with torch.no_grad():
    accuracy = (model(test_idx).argmax(-1) == lookup_targets(test_idx)).float().mean((0, 1))
print(f"loss after 150 steps: {loss.item():.3f}; accuracy (previous, two back, first): {[round(a, 2) for a in accuracy.tolist()]}")

# %% [markdown]
# Now switch the trained layer to the teaching path to get its weights, [B, nh, T, T], and measure how
# much each head puts, on average, on four places: the query's own position, one back, two back,
# and position 0 (for queries from position 3 on, so that "first" never coincides with "one or two back").

# %%
model.attn.fast = False
with torch.no_grad():
    model(test_idx)
head_w = model.attn.last_weights.mean(0)  # [nh, T, T], averaged over 256 sequences
patterns = {
    "self": lambda w: w.diagonal(0).mean(),
    "one back": lambda w: w.diagonal(-1).mean(),
    "two back": lambda w: w.diagonal(-2).mean(),
    "first": lambda w: w[3:, 0].mean(),
}
share = torch.tensor([[float(f(head_w[h])) for f in patterns.values()] for h in range(4)])  # [nh, 4]
print("head | " + " | ".join(f"{p:>8}" for p in patterns) + " | mostly")
for h in range(4):
    print(f"{h:4} | " + " | ".join(f"{s:8.2f}" for s in share[h]) + f" | {list(patterns)[share[h].argmax()]}")
for task in ("one back", "two back", "first"):
    assert share[:, list(patterns).index(task)].max() > 0.7, f"no head specialised in {task}"

# %% [markdown]
# Each lookup the task needs has a head that puts most of its weight on that place, learned from
# nothing but the loss. No single head could serve all three: it has one softmax per query. A fourth
# head is not needed by the task; what it learns depends on the random start (often a blurred copy of one of the
# others). The maps below show one test sequence; the slider picks another.

# %%
import ipywidgets as widgets  # noqa: E402
from IPython.display import display  # noqa: E402

from transformer_course.viz import plot_heatmap  # noqa: E402


def draw_heads(seq: int) -> None:
    """Heatmaps of every head's weights [T, T] for test sequence ``seq`` (rows: queries, columns: keys)."""
    digits = [str(d) for d in test_idx[seq].tolist()]
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.8))
    for h, ax in enumerate(axes):
        plot_heatmap(model.attn.last_weights[seq, h], ax, row_labels=digits, col_labels=digits, cmap="Blues",
                     vmin=0.0, vmax=1.0, colorbar=False, title=f"head {h}: {list(patterns)[share[h].argmax()]}")
        ax.set_xlabel("key")
    axes[0].set_ylabel("query")
    fig.tight_layout()
    plt.show()

# %%
def head_explorer() -> widgets.VBox:
    """A slider over test sequences; redraws the four heads' maps."""
    seq = widgets.IntSlider(value=0, min=0, max=len(test_idx) - 1, description="sequence")
    canvas = widgets.Output()

    def update(_=None):
        with canvas:
            canvas.clear_output(wait=True)
            draw_heads(seq.value)

    seq.observe(update, names="value")
    return widgets.VBox([seq, canvas])

# %%
display(head_explorer())
draw_heads(0)  # the widget's starting view, stored with the notebook

# %% [markdown]
# ## 11. Measured: loop, batched and fused on this CPU
#
# `benchmarks/bench_attention.py` times the three versions (same weights, checked to agree first) for
# sequence lengths 64 to 1,024 with d_model 256 and 8 heads, and records the peak memory each call
# allocates. It runs PyTorch on one thread and counts CPU time, the work done, because wall time on a
# shared machine swings with whatever else runs. Run it yourself with
# `python benchmarks/bench_attention.py`; the chapter plots the figures stored in
# `benchmarks/results/attention.json` (**this machine's figures**: yours will differ, the ratios less so).

# %%
# NBVAL_IGNORE_OUTPUT
# (printed from a file that `make bench` rewrites on the machine it runs on)
import json  # noqa: E402
from pathlib import Path  # noqa: E402

bench = json.loads(Path("../benchmarks/results/attention.json").read_text())
rows = bench["rows"]
lengths = sorted({r["T"] for r in rows})
series = {v: {r["T"]: r for r in rows if r["variant"] == v} for v in ("loop", "batched", "fused")}
print(f"d_model {bench['meta']['d_model']}, {bench['meta']['n_head']} heads, batch {bench['meta']['batch']}, torch {bench['meta']['torch']}")

# %%
fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4))
for name, by_T in series.items():
    ax_t.plot(lengths, [by_T[T]["ms"] for T in lengths], "o-", label=name)
    ax_m.plot(lengths, [by_T[T]["peak_mib"] for T in lengths], "o-", label=name)
for ax, label in ((ax_t, "CPU time per call (ms)"), (ax_m, "peak memory per call (MiB)")):
    ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel=label)
    ax.set_xticks(lengths, [str(T) for T in lengths])
    ax.legend()
fig.suptitle("Multi-head attention, d_model 256, 8 heads (this machine's figures)")
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
# (figures from benchmarks/results/attention.json, which `make bench` rewrites)
T_max = lengths[-1]
lo, ba, fu = (series[v][T_max] for v in ("loop", "batched", "fused"))
print(f"at T = {T_max}: loop / fused time {lo['ms'] / fu['ms']:.1f}x, batched / fused time {ba['ms'] / fu['ms']:.1f}x")
print(f"             batched / fused memory {ba['peak_mib'] / fu['peak_mib']:.1f}x, loop / fused memory {lo['peak_mib'] / fu['peak_mib']:.1f}x")
growth = {v: series[v][T_max]["peak_mib"] / series[v][lengths[-2]]["peak_mib"] for v in series}
print(f"memory growth from T = {lengths[-2]} to {T_max}: " + ", ".join(f"{v} {g:.1f}x" for v, g in growth.items()))
print("batched faster than loop at T =", [T for T in lengths if series["batched"][T]["ms"] < series["loop"][T]["ms"]])
fused_fastest = all(series["fused"][T]["ms"] < min(series["loop"][T]["ms"], series["batched"][T]["ms"]) for T in lengths)
print("fused is the fastest at every measured length:", fused_fastest)

# %% [markdown]
# How to read it. Doubling T doubles the fused kernel's memory (it works through the keys in blocks and
# never holds the whole [T, T] score matrix) but roughly quadruples the others'. The batched version
# materialises the full [B, nh, T, T] scores, their masked copy and the softmax at once. The loop makes
# those temporaries for one head at a time, but every chapter-03 head keeps its weights for plotting
# (`last_weights`), so by the last head it holds all nh of them anyway: a lower peak, the same T² growth.
#
# For time, batching the heads removes per-call overhead, which matters most at short lengths; at long
# lengths the cost is in the T² tensors, and the batched version, writing several full copies of them,
# can fall behind the loop (the lengths where it is faster are listed above). Fusing removes the T²
# tensors themselves.

# %% [markdown]
# ## 12. Stretch: grouped-query attention
#
# The KV cache stores a key and a value per head. Large models (Llama 2 70B, Mistral) shrink it by
# giving the nh query heads only n_kv < nh key/value heads: query heads are split into n_kv consecutive
# groups of nh / n_kv, and each group shares one key/value head (n_kv = 1 is *multi-query* attention).
# The cache shrinks by nh / n_kv. Write the causal attention for this layout: q [B, nh, T, hs], k and v
# [B, n_kv, T, hs]. With nh = 4 and n_kv = 2, query heads 0 and 1 use key/value head 0, query heads 2
# and 3 use key/value head 1. How to get there from what you have built is yours to find; the check
# names the usual slips.

# %%
# Your turn - Exercise 4.7 (★★★, extend): grouped-query attention.
def my_grouped_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [B, nh, T, hs], k and v [B, n_kv, T, hs] -> [B, nh, T, hs]; query head h uses kv head h // (nh // n_kv)."""
    ### BEGIN SOLUTION
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, nh, T, hs)
    out, _ = scaled_dot_product_attention(q, k, v, causal_mask(q.shape[2]))
    return out
    ### END SOLUTION


check_grouped_query_attention(my_grouped_query_attention)

# %% [markdown]
# ## Quick check

# %%
from transformer_course.quiz import Question, quiz  # noqa: E402

quiz([
    Question("A layer has d_model = 64 and 4 heads. How many parameters does it have (with biases)?",
             ["4,160", "16,640", "12,480", "65,536"],
             answer=1, explain="qkv: 64 x 192 + 192 = 12,480; proj (W_o): 64 x 64 + 64 = 4,160; together 16,640 = 4C² + 4C, whatever the number of heads."),
    Question("Why does merging heads need .reshape (or .contiguous().view) after transpose(1, 2)?",
             ["transpose copies the data into a new layout",
              "transpose only swaps strides, so the memory is not in [B, T, nh, hs] order and view cannot merge the axes",
              "view only works on 3-D tensors",
              "reshape is faster than view"],
             answer=1, explain="view reinterprets memory as it is; after a transpose the elements of one token are not adjacent, so a copy is needed."),
    Question("A KV cache holds L = 5 positions and 3 new tokens arrive together. Which keys may new query 0 attend?",
             ["key 0 only", "keys 0 to 5", "keys 5 to 7", "all 8 keys"],
             answer=1, explain="New query 0 sits at position L + 0 = 5, so it sees keys 0..5. is_causal=True would wrongly give it key 0 only."),
    Question("Each head's scores are divided by...",
             ["√d_model", "√(head size)", "the number of heads", "√T"],
             answer=1, explain="A head's q·k sums hs products, so √hs keeps the spread near 1; dividing by √d_model (sources 1 and 4) over-flattens the softmax."),
])

# %% [markdown]
# ## Summary
#
# - Multi-head attention runs nh heads of width hs = C / nh on the same input, puts their outputs side
#   by side and mixes them with W_o. Each head has its own softmax, so each can look somewhere else:
#   trained on a three-lookup task, separate heads learned "one back", "two back" and "first".
# - Stacking the heads' projections gives one packed `qkv` Linear (C -> 3C, [q | k | v], heads
#   contiguous in each); `split_heads` makes the heads a batch axis ([B, nh, T, hs]) and `merge_heads`
#   undoes it, and both must keep each row a token. We proved the loop (a scaffold that stays in this
#   notebook) and the batched layer are the same function by copying weights (`pack_heads`), and
#   matched `torch.nn.MultiheadAttention` (whose bool mask is inverted).
# - The sources' slips, corrected: source 0's printed weights skip the 1/√hs it describes; source 3's
#   scores are [B, nh, T, T], not [B, nh, T, hs]; sources 1 and 4 scale by √d_model instead of √hs,
#   a bug that only shows with more than one head.
# - With a KV cache of L positions, new query t sees keys 0..L+t: the causal triangle shifts right, which
#   `is_causal=True` (top-left aligned) gets wrong for several new queries. Fed in any pieces, the cached
#   layer equals the uncached one.
# - Measured on this CPU (`benchmarks/results/attention.md`): the fused kernel was the fastest at every
#   length from 64 to 1,024, and its memory grew linearly in T while the batched version's grew with T².
#   The ratios, from the stored figures:

# %%
# NBVAL_IGNORE_OUTPUT
# (figures from benchmarks/results/attention.json, which `make bench` rewrites)
for T_b in (lengths[0], lengths[-1]):
    lo, ba, fu = (series[v][T_b] for v in ("loop", "batched", "fused"))
    print(f"T = {T_b:4}: time loop / fused {lo['ms'] / fu['ms']:.1f}x, batched / fused {ba['ms'] / fu['ms']:.1f}x; "
          f"memory batched / fused {ba['peak_mib'] / fu['peak_mib']:.1f}x")

# %% [markdown]
# **Exported to `transformer_course.multihead`:** `MultiHeadAttention`, `KVCache`, `split_heads`,
# `merge_heads`, `causal_mask_with_past`. The loop of heads and `pack_heads` stay in this notebook.
