# %% [markdown]
# # Chapter 03: one attention head, step by step
#
# > Scaled dot-product attention, the causal mask, and one attention head. Attention is
# > softmax(q kᵀ / √d_k) v (Vaswani et al. 2017, section 3.2.1). Shapes: B batch, T time,
# > C = d_model channels, hs head size; T_q / T_k query / key positions, d_k the width of queries and
# > keys, d_v the width of values.
#
# **What this chapter builds.** The one operation that makes a transformer a transformer:
# *attention*. Every position in a sequence asks a question (its query), every position offers a
# label (its key) and some content (its value); each position then takes a weighted average of the
# contents, weighted by how well its question matches each label. We build it one step at a time,
# check every step, and end with three pieces that the rest of the course imports:
# `causal_mask`, `scaled_dot_product_attention` and the `AttentionHead` module.
#
# **What you will be able to do.**
# - say what attention is for, and compute it by hand for one word of a real sentence;
# - explain what queries, keys and values are and why each is its own linear projection;
# - show with an experiment why the scores are divided by √d_k;
# - build causal and padding masks, and make a fully masked row give zeros instead of NaN;
# - read attention heatmaps, and tell a position-based head from a content-based one;
# - give a head a preference for recent tokens without any position code (ALiBi);
# - compute attention tile by tile with an online softmax, as FlashAttention does.
#
# **Your turns.** You write `causal_mask` (Exercise 3.2) and `scaled_dot_product_attention` (3.4)
# yourself, before any code of them appears, and the rest of the chapter (the attention head, the
# heatmaps) runs on your versions. You also repair scores that mix up features and positions (3.1),
# predict what a mask does to equal scores (3.3), build the distance bias of ALiBi (3.5), and, as a
# ★★★ stretch, attention that never holds the `[T, T]` score matrix (3.6, the idea of FlashAttention).
#
# **What it needs.** Chapter 02's idea of an input vector per token (`[B, T, C]`), and, in one
# demonstration, its sinusoidal position code. Token ids are not needed: we split sentences into
# words by hand.
#
# Shapes, as everywhere in the course: `B` batch, `T` time (sequence length), `C` = `d_model`
# channels, `hs` head size; `T_q` and `T_k` count queries and keys, `d_k` is the width of queries and
# keys, `d_v` the width of values.

# %%
#| default_exp attention

# %%
import math

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from IPython.display import display
from torch import nn

from transformer_course.checks.attention import (
    check_alibi_bias,
    check_attention,
    check_attention_scores,
    check_causal_mask,
    check_predict_equal_scores,
    check_tiled_attention,
    largest_tensor,
)
from transformer_course.runtime import seed_everything
from transformer_course.viz import plot_attention

torch.set_printoptions(precision=4, sci_mode=False)
_ = seed_everything(0)

# %% [markdown]
# The next cell opens the module this chapter exports, `transformer_course/attention.py`. Each
# later cell marked `#| export` adds one piece to it, right where that piece is explained.

# %%
#| export
import math

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.arguments import real_number, whole_number

_MASKED = float("-inf")  # a masked key's score: exp(-inf) = 0, exactly zero weight (no magic -1e9)

# %% [markdown]
# ## 1. What attention is for
#
# Take the sentence *"The sun dipped below the horizon"* and suppose the model must guess the word
# after *"The sun dipped below the"*. Not every earlier word helps equally: *sun* and *dipped*
# say a lot about what comes next, *the* says little. Attention is the mechanism that lets the
# position being predicted decide, from the data, **which earlier positions to draw on and how
# much**.
#
# A second example shows why this matters for meaning. The word *bank* means the side of a river in
# *"write a poem about a man fishing on a river bank"* and a place for money in *"write a poem about
# a man applying for a loan in a bank"*. A token embedding (chapter 02) gives *bank* one fixed
# vector whatever the sentence. Attention lets *bank* pull in information from *river* and
# *fishing*, or from *loan*, and so end up with a vector that depends on its context.
#
# To try this we need vectors for the words. Real models learn them; here we invent a tiny
# 4-dimensional embedding by hand, one column per made-up feature, so the numbers are easy to read.

# %%
features = ["water", "money", "person", "grammar"]
toy = {  # hand-made inputs for the demonstration, not learned
    "write": [0, 0, 1.2, 0.4], "a": [0, 0, 0, 2], "poem": [0.2, 0, 0.6, 0], "about": [0, 0, 0, 1.6],
    "man": [0, 0, 2, 0], "fishing": [1.8, 0, 1, 0], "on": [0, 0, 0, 1.6], "river": [2, 0, 0, 0],
    "bank": [1.4, 1.4, 0, 0], "applying": [0, 1, 1.2, 0], "for": [0, 0, 0, 1.6], "loan": [0, 2, 0, 0],
    "in": [0, 0, 0, 1.6],
}
river_words = "write a poem about a man fishing on a river bank".split()
loan_words = "write a poem about a man applying for a loan in a bank".split()
X_river = torch.tensor([toy[w] for w in river_words])  # (T, C) = (11, 4)
X_loan = torch.tensor([toy[w] for w in loan_words])  # (13, 4)
print(X_river.shape, X_loan.shape)

# %% [markdown]
# **Similarity by dot product.** How related is *bank* to each word? The dot product of two
# vectors (multiply them feature by feature, add up) is large when they point the same way and are
# long, zero when they share no feature. Cosine similarity would throw away the length, and a
# distance would need more work; the dot product is one multiply-add per feature.
# The scores are divided by √C (here √4 = 2) for a reason section 4 makes clear.

# %%
def bank_scores(X: torch.Tensor) -> torch.Tensor:
    """Scores [T] of the last word (bank) against every word, scaled by 1/sqrt(C)."""
    bank = X[-1]  # (C,)
    return (X * bank).sum(dim=-1) / math.sqrt(X.shape[-1])  # (T, C) * (C,) -> (T, C) -> (T,)


scores_river = bank_scores(X_river)
for word, s in zip(river_words, scores_river.tolist(), strict=True):
    print(f"{word:>8} {s:6.2f}")

# %% [markdown]
# *a* scores 0 with *bank*: they share no feature. *river* and *fishing* score high, and *bank*
# matches itself best: its own vector is part of the blend.
#
# **Scores to weights.** The softmax turns any row of scores into positive weights that sum to 1,
# keeping their order: `softmax(s)_j = exp(s_j) / Σ_i exp(s_i)`. **Weights to a new vector.** The
# new vector for *bank* is the weighted average of all the word vectors.

# %%
for name, X, words in (("river", X_river, river_words), ("loan", X_loan, loan_words)):
    w = torch.softmax(bank_scores(X), dim=-1)  # (T,), sums to 1
    new_bank = w @ X  # (C,): weighted average of the rows of X
    top = w.topk(3)
    print(f"{name:>5} sentence: weights sum to {w.sum().item():.4f}; largest on",
          [(words[i], round(v, 3)) for v, i in zip(top.values.tolist(), top.indices.tolist(), strict=True)])
    print("       new 'bank' =", dict(zip(features, [round(v, 3) for v in new_bank.tolist()], strict=True)))

# %% [markdown]
# A score of 0 is not a weight of 0. The softmax gives every word `exp(score)`, and `exp(0) = 1`:
# the three *a* share no feature with *bank*, yet they still take part of its weight and pull its new
# vector towards their "grammar" feature. Only a score of −∞ (section 5) removes a word.

# %%
w_a = torch.softmax(scores_river, dim=-1)[[i for i, w in enumerate(river_words) if w == "a"]]  # (3,)
print("weight of each 'a':", [round(v, 3) for v in w_a.tolist()], "| the three together:", round(w_a.sum().item(), 2))
print("the three a's take more than a tenth of bank's weight:", w_a.sum().item() > 0.1)

# %%
w_river, w_loan = (torch.softmax(bank_scores(X), dim=-1) for X in (X_river, X_loan))
bank_river, bank_loan = w_river @ X_river, w_loan @ X_loan
assert bank_river[0] > bank_river[1] and bank_loan[1] > bank_loan[0]  # water wins by the river, money by the loan
print("the same 'bank' vector left the two sentences leaning different ways:",
      f"water - money = {(bank_river[0] - bank_river[1]).item():+.3f} vs {(bank_loan[0] - bank_loan[1]).item():+.3f}")

# %% [markdown]
# ## 2. Queries, keys and values
#
# Above, one vector per word played three parts at once: the thing asking (*bank*), the thing
# being compared against (every word), and the thing being averaged. A soft dictionary look-up
# gives these parts names:
#
# | name | role in the look-up | informal reading |
# |---|---|---|
# | **query** `q` | the request the current position makes | the question it asks |
# | **key** `k` | the label each position is matched on | the label on its drawer |
# | **value** `v` | what each position hands over when it is picked | the drawer's contents |
#
# A Python `dict` returns the value of the one key equal to the query. Attention returns a
# *blend* of all values, each weighted by how well its key matches the query. When one key matches
# far better than the rest, the blend is that key's value and attention behaves like a `dict`:

# %%
keys = torch.eye(3)  # three keys, one per axis
values = torch.tensor([[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]])
query = torch.tensor([0.1, 0.9, 0.0])  # closest to key 1
def four(t: torch.Tensor) -> str:  # 4 decimals, printed alike by every PyTorch release
    return "[" + ", ".join(f"{x:.4f}" for x in t.tolist()) + "]"
for sharpness in (1.0, 30.0):
    weights = torch.softmax(sharpness * (keys * query).sum(dim=-1), dim=-1)  # one dot product per key
    print(f"sharpness {sharpness:4.0f}: weights {four(weights)}, result {four(weights @ values)}")

# %% [markdown]
# The sharp look-up returns key 1's value `[0, 10]` almost exactly; the gentle one blends all
# three. One of our sources describes the value as a measure of how much a match matters; that is
# not right: the *weight* carries the importance, the value is only the content passed on.
#
# **Why three separate projections?** In a real model the query, key and value are not the raw
# embedding. Each is a linear map of it: `q = x W_qᵀ`, `k = x W_kᵀ`, `v = x W_vᵀ`, three bias-free
# `nn.Linear(C, hs)` layers whose weights are learned. A pronoun such as *it* looks for a noun
# earlier in the sentence, but a noun is found for *being* a noun, not for looking for one: the
# question and the label are different things, so they get different projections, and a third one
# chooses what is passed on. The projections also
# pick the head size `hs`, usually `C / n_heads` (chapter 04 runs several heads side by side).
#
# Here is the input of our first source's worked example: a batch of 2 sequences of 6 tokens, each
# a 4-dimensional vector, fed to one head with `head_size = 2`.

# %%
inp = torch.tensor([
    [[0.4553, 0.3277, 0.4210, 0.6628], [0.0874, 0.3216, 0.2850, 0.1438], [0.8880, 0.2221, 0.6271, 0.8234],
     [0.9180, 0.8070, 0.4281, 0.1977], [0.4874, 0.9018, 0.4258, 0.1630], [0.0441, 0.1988, 0.6751, 0.8757]],
    [[0.9347, 0.9255, 0.6341, 0.0567], [0.7656, 0.2911, 0.6161, 0.0123], [0.4200, 0.3295, 0.1863, 0.7694],
     [0.3197, 0.9724, 0.6066, 0.2184], [0.4521, 0.9276, 0.3951, 0.1281], [0.7899, 0.7894, 0.2245, 0.2889]],
])  # (B, T, C) = (2, 6, 4): "The sun dipped below the horizon" and ", painting the sky with hues"
query_proj, key_proj, value_proj = (nn.Linear(4, 2, bias=False) for _ in range(3))
q, k, v = (proj(inp).detach() for proj in (query_proj, key_proj, value_proj))  # (B, T, hs) each
print("weight", tuple(query_proj.weight.shape), "-> q", tuple(q.shape), "k", tuple(k.shape), "v", tuple(v.shape))
assert torch.allclose(q, inp @ query_proj.weight.T)  # nn.Linear stores W as [out, in] = [hs, C]

# %% [markdown]
# ## 3. The worked example, number for number
#
# The source does not print its projection weights, so its `q`, `k`, `v` cannot be recomputed from
# `inp`; it does print, for the first sequence, every key and value and the query of the last word,
# *horizon*. We start from those.

# %%
q_horizon = torch.tensor([0.9100, 0.3448])  # (hs,)
k_seq = torch.tensor([[0.0921, 0.9907], [0.5637, 0.7303], [0.1860, 0.4071],
                      [0.8067, 0.1776], [0.7002, 0.6632], [0.9094, 0.3594]])  # (T, hs)
v_seq = torch.tensor([[0.5637, 0.4056], [0.9803, 0.0100], [0.4111, 0.3980],
                      [0.6882, 0.9797], [0.5551, 0.7583], [0.3060, 0.2141]])  # (T, hs)
words = ["the", "sun", "dipped", "below", "the", "horizon"]
raw = (k_seq * q_horizon).sum(dim=-1)  # (T,): one dot product per key
print("q·k for horizon and each key:", raw)

# %% [markdown]
# That is the source's row, `0.4254 0.7648 0.3096 0.7953 0.8659 0.9515`. Its code then multiplies
# by `head_size ** -0.5` (1/√2), masks the future (nothing to mask: *horizon* is the last word) and
# takes the softmax. But the weights it prints come from the **unscaled** row:

# %%
w_unscaled = torch.softmax(raw, dim=-1)
w_scaled = torch.softmax(raw / math.sqrt(2), dim=-1)
print("softmax(q·kᵀ)      :", w_unscaled)
print("softmax(q·kᵀ / √2) :", w_scaled)
seed_row = torch.tensor([0.1252, 0.1758, 0.1115, 0.1812, 0.1945, 0.2119])  # as printed by the source
print("source's row matches the unscaled weights:", torch.allclose(w_unscaled, seed_row, atol=5e-5),
      "| the scaled ones:", torch.allclose(w_scaled, seed_row, atol=5e-5))

# %% [markdown]
# The output is the weighted average of the values. The source prints `(0.5863, 0.4673)`. Its
# weights are unscaled, and it evidently multiplied the weights *after* rounding them to four
# decimals, which reproduces both of its numbers; at full precision the first one is 0.5862:

# %%
print("rounded unscaled weights @ v:", w_unscaled.round(decimals=4) @ v_seq)
print("unscaled weights @ v        :", w_unscaled @ v_seq)
print("scaled weights @ v (correct):", w_scaled @ v_seq)
assert [round(x, 4) for x in (w_scaled @ v_seq).tolist()] == [0.5863, 0.4658]

# %% [markdown]
# So, with the 1/√2 scale that the source's own code applies, *horizon*'s weights are
# `0.1368 0.1740 0.1261 0.1778 0.1868 0.1985` and its output is **(0.5863, 0.4658)**: the second
# number differs from the source's 0.4673. The scale flattens the weights a little (the largest
# falls from 0.2119 to 0.1985); with two dimensions it hardly matters, but section 4 shows that
# with realistic head sizes it decides whether attention can learn at all.

# %% [markdown]
# ### Every query against every key, at once
#
# The worked example scored one query. A sequence has `T_q` queries, and attention needs all
# `T_q × T_k` scores: a matrix whose entry `(i, j)` is the dot product of query row `i` with key row
# `j`, divided by √d_k. Written as one matrix product, it is a one-liner. Here is such a one-liner,
# with a slip that turns up in more than one tutorial:

# %%
def scores_all_at_once(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Scaled scores [T_q, T_k] for q [T_q, d_k] and k [T_k, d_k]. (It has one bug.)"""
    return q @ k / math.sqrt(q.shape[-1])

# %% [markdown]
# Two symptoms. With as many positions as features (4 and 4) it runs and returns a `[4, 4]` matrix
# that looks right; but a score compares one query with one key, so listing the same keys in another
# order should only move the columns around, and it does not. And on the worked example's sizes (6
# positions, `d_k = 2`) it does not run at all:

# %%
g4 = torch.Generator().manual_seed(4)
q4, k4 = torch.randn(4, 4, generator=g4), torch.randn(4, 4, generator=g4)  # 4 positions, d_k = 4
s4 = scores_all_at_once(q4, k4)
order = torch.tensor([2, 0, 3, 1])  # the same four keys, listed in another order
print("shape", tuple(s4.shape), "| reordering the keys just reorders the columns:",
      torch.allclose(scores_all_at_once(q4, k4[order]), s4[:, order]))
try:
    scores_all_at_once(q[0], k[0])  # (6, 2) and (6, 2): the first sequence's random projections
except RuntimeError as e:
    print("6 positions, d_k = 2: RuntimeError:", e)

# %% [markdown]
# ### Your turn
#
# Find the slip (write out which index of `q` meets which index of `k` in `q @ k`), and write the
# fixed version. It must also work for a batch: `q` is `[..., T_q, d_k]` and `k` is `[..., T_k, d_k]`,
# where the leading dimensions (batch, and in chapter 04 heads) are carried along untouched.

# %%
# Your turn - Exercise 3.1 (★☆☆, debug): scores that compare every query with every key.
def fixed_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Scaled scores [..., T_q, T_k] = q kᵀ / √d_k for q [..., T_q, d_k] and k [..., T_k, d_k] (any leading dims)."""
    ### BEGIN SOLUTION
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    ### END SOLUTION


check_attention_scores(fixed_scores)

# %% [markdown]
# Source 4 makes a slip of the same family in Julia, where a sequence is stored the other way round,
# `[dim × ntokens]`, one *column* per token. Its head computes `α = softmax(Q*K' / √dim)`: with
# columns for tokens, `Q*K'` is `[dim × dim]` and sums over the *positions*, so it compares features
# with features, not tokens with tokens. In that layout the scores are `K'*Q` (`[ntokens × ntokens]`,
# keys down the rows, which is why its softmax runs over `dims=1`), and the output is `V*α`. As the
# seed declares its input, a batch `[dim × ntokens × batch_size]`, the line stops at once: Julia has
# no `'` (adjoint) for a 3-D array. On one sequence, a matrix, it is worse than the slip above,
# because it never fails loudly: the next line, `α*V`, multiplies `[dim × dim]` by
# `[dim × ntokens]`, which fits at every size, and returns a result of the right shape. The same
# computation in PyTorch, on the worked example's first sequence (6 tokens, 2 features):

# %%
Qc, Kc, Vc = q[0].T, k[0].T, v[0].T  # (hs, T) each: source 4's layout, one column per token
alpha_seed = torch.softmax(Qc @ Kc.T / math.sqrt(Qc.shape[0]), dim=0)  # Julia's Q*K': (hs, hs)
alpha_right = torch.softmax(Kc.T @ Qc / math.sqrt(Qc.shape[0]), dim=0)  # K'*Q: (T_k, T_q)
print("Q*K':", tuple(alpha_seed.shape), "-> α*V:", tuple((alpha_seed @ Vc).shape),
      "| K'*Q:", tuple(alpha_right.shape), "-> V*α:", tuple((Vc @ alpha_right).shape))
key_query_pairs = all(torch.isclose((Kc.T @ Qc)[j, i], Kc[:, j] @ Qc[:, i]) for i in range(6) for j in range(6))
print("entry (j, i) of K'*Q compares key j with query i:", key_query_pairs)
print("the two outputs agree:", torch.allclose(alpha_seed @ Vc, Vc @ alpha_right))

# %% [markdown]
# ## 4. Why divide by √d_k
#
# A score is a sum of `d_k` products `q_i k_i`. Suppose the entries of `q` and `k` are independent
# with mean 0 and variance 1, the assumption of the paper's own argument (a footnote to its section 3.2.1). Then each
# product has variance 1 and the sum has variance `d_k`: the **spread of the scores grows like
# √d_k**. Dividing by √d_k brings it back to about 1 whatever the head size. Let us measure it.
#
# (Variance 1 is not where a GPT starts. Chapter 06 initialises the projection weights from
# N(0, 0.02²), so from inputs of variance 1 (what a LayerNorm hands attention) each entry of `q` has
# variance `C · 0.02²`, about 0.05 for `C = 128`, and the scores start close to 0 (the cell after the
# next one measures it). Training grows the projections; the scale keeps the scores of a trained head
# of any size in the range the softmax handles well.)

# %%
g = torch.Generator().manual_seed(0)
head_sizes = [2, 4, 8, 16, 32, 64, 128, 256, 512]
spread = {}
for d in head_sizes:
    qs, ks = torch.randn(4000, d, generator=g), torch.randn(4000, d, generator=g)
    dots = (qs * ks).sum(-1)  # 4000 independent q·k
    spread[d] = (dots.std().item(), (dots / math.sqrt(d)).std().item())
    print(f"d_k={d:4d}  std(q·k) = {spread[d][0]:6.2f}  (√d_k = {math.sqrt(d):5.2f})   std(q·k/√d_k) = {spread[d][1]:.2f}")
assert all(abs(s / math.sqrt(d) - 1) < 0.1 and abs(t - 1) < 0.1 for d, (s, t) in spread.items())

# %%
C_gpt, hs_gpt = 128, 32  # chapter 06's small model: width 128, 4 heads of 32
x_ln = torch.randn(4000, C_gpt, generator=g)  # inputs of variance 1, as a LayerNorm hands them over
W_q, W_k = (0.02 * torch.randn(hs_gpt, C_gpt, generator=g) for _ in range(2))  # N(0, 0.02²) weights
q_init, k_init = x_ln @ W_q.T, x_ln @ W_k.T  # (4000, hs)
print(f"variance of a query entry at initialisation within 0.01 of C · 0.02² = {C_gpt * 0.02**2:.3f}:",
      abs(q_init.var().item() - C_gpt * 0.02**2) < 0.01)
print("scaled scores at initialisation have a spread below 0.1:",
      ((q_init * k_init).sum(-1) / math.sqrt(hs_gpt)).std().item() < 0.1)

# %% [markdown]
# Why is a large spread bad? The softmax exaggerates differences: when scores are tens apart, it
# puts nearly all the weight on the largest one. The row becomes (almost) one-hot, and a one-hot
# softmax has (almost) zero gradient: the derivative of `p_j` with respect to its score is
# `p_j (1 - p_j)`, which vanishes when `p_j` is 0 or 1. The model then cannot learn to move its
# attention. We measure both for 16 keys: the average largest weight of a row, and `1 - Σ p_j²`,
# which is 0 for a one-hot row and close to 1 for a spread-out one. (It is the sum of the
# `p_j (1 - p_j)` above, the trace of the softmax's Jacobian: a simple gauge of how much the weights
# can still respond to their scores.)

# %%
def softmax_stats(scores: torch.Tensor) -> tuple[float, float]:
    """Mean largest weight and mean 1 - Σ p² over the rows of scores [N, T]."""
    p = torch.softmax(scores, dim=-1)
    return p.max(-1).values.mean().item(), (1 - (p**2).sum(-1)).mean().item()


saturation = {}
for d in head_sizes:
    qs, ks = torch.randn(500, 1, d, generator=g), torch.randn(500, 16, d, generator=g)
    dots = (qs * ks).sum(-1)  # (500, 1, d) * (500, 16, d) -> (500, 16): 500 queries, 16 keys each
    saturation[d] = softmax_stats(dots) + softmax_stats(dots / math.sqrt(d))
    print(f"d_k={d:4d}  unscaled: max weight {saturation[d][0]:.2f}, 1-Σp² {saturation[d][1]:.2f}"
          f"   scaled: max weight {saturation[d][2]:.2f}, 1-Σp² {saturation[d][3]:.2f}")

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
ax1.loglog(head_sizes, [spread[d][0] for d in head_sizes], "o-", color="C0", label="q·k")
ax1.loglog(head_sizes, [spread[d][1] for d in head_sizes], "s-", color="C1", label="q·k / √d_k")
ax1.loglog(head_sizes, [math.sqrt(d) for d in head_sizes], "k:", label="√d_k")
ax1.set(xlabel="head size d_k", ylabel="standard deviation of the score", title="Scores spread like √d_k")
ax2.semilogx(head_sizes, [saturation[d][0] for d in head_sizes], "o-", color="C0", label="max weight, unscaled")
ax2.semilogx(head_sizes, [saturation[d][2] for d in head_sizes], "s-", color="C1", label="max weight, scaled")
ax2.semilogx(head_sizes, [saturation[d][1] for d in head_sizes], "o--", color="C0", label="1 - Σp², unscaled")
ax2.semilogx(head_sizes, [saturation[d][3] for d in head_sizes], "s--", color="C1", label="1 - Σp², scaled")
ax2.set(xlabel="head size d_k", ylim=(0, 1), title="Unscaled softmax saturates (16 keys)")
for ax in (ax1, ax2):
    ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %%
d_big = head_sizes[-1]
assert saturation[d_big][0] > 0.8 and saturation[d_big][2] < 0.5  # unscaled: nearly one-hot; scaled: spread
print(f"at d_k={d_big}: the unscaled rows put {saturation[d_big][0]:.0%} of the weight on one key on average;"
      f" scaled rows {saturation[d_big][2]:.0%}")

# %% [markdown]
# With the scale, the statistics stay flat whatever the head size: the softmax sees scores of the
# same size in a head of 2 or of 512. (One source divides by √d_model instead. That is the same
# thing only when the query has the model's full width; after projecting to a head of size `hs`,
# the sum has `hs` terms, and √hs = √d_k is the right divisor. It is the one the paper uses.)
#
# Source 4 calls the scale a detail that "isn't particularly important". The measurement says
# otherwise: without it, the scores of a head of 512 spread √(512 / 2) = 16 times wider than those of
# a head of 2, and at 512 the unscaled rows put 94% of their weight on one key: nearly one-hot, with
# nearly no gradient. The paper introduced the scale for exactly that reason (its section 3.2.1).

# %% [markdown]
# ## 5. Masks: who may look at whom
#
# A language model predicts the next token from the ones before it. During training it sees the
# whole sequence at once, so if position 2 could attend to position 3 it would simply read the
# answer. A **causal mask** forbids it: query `i` may attend key `j` only when `j <= i`. We store
# masks as bool tensors, **True = may attend**, the convention of `torch.nn.functional`'s attention.
# One row per query, one column per key; for `T = 4`, with True written as 1:
#
# ```
# query 0:  1 0 0 0
# query 1:  1 1 0 0
# query 2:  1 1 1 0
# query 3:  1 1 1 1
# ```
#
# ### Your turn
#
# Build `causal_mask(T, device=None)`: a bool tensor `[T, T]`, True on and below the diagonal,
# created on `device` (None: the default device, the CPU) so that it lives where the scores it will
# mask live. The cell checks `T` for you. Once your mask passes, every later cell of the chapter uses
# it, the attention head included.

# %%
#| export
# Your turn - Exercise 3.2 (★☆☆, build): the causal mask.
def causal_mask(T: int, device=None) -> torch.Tensor:
    """Bool [T, T]: True where query i may attend key j, that is j <= i (lower triangle and diagonal)."""
    T = whole_number(T, "T", hint="the sequence length")
    ### BEGIN SOLUTION
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()
    ### END SOLUTION

# %%
causal_mask = check_causal_mask(causal_mask).use
print(causal_mask(6).int())
assert all(causal_mask(6)[i, j] == (j <= i) for i in range(6) for j in range(6))

# %% [markdown]
# How does a mask remove a key? Not by zeroing its score: a score of 0 still gets weight
# `exp(0) = 1` in the softmax. Instead the masked scores are set to **−∞**, since `exp(−∞) = 0`.
# Writing the mask as a matrix `M` that holds 0 where attention is allowed and −∞ elsewhere, one
# source writes attention as `softmax(q kᵀ / √d_k + M) v`; our bool mask says the same thing.
# (Another source adds `M` *before* dividing by √d_k; with −∞ that makes no difference.) Here is
# one query's row of four scores whose last two keys are hidden, once by a score of 0 and once by
# −∞, next to the two visible keys on their own:

# %%
visible = torch.tensor([1.5, 0.5])  # the scores of the two keys the query may see
for name, hidden in (("0", 0.0), ("-inf", float("-inf"))):
    row = torch.cat([visible, torch.full((2,), hidden)])  # (4,)
    print(f"hidden keys scored {name:>4}: weights {torch.softmax(row, dim=-1)}")
print("the visible keys alone:  weights", torch.softmax(visible, dim=-1))

# %% [markdown]
# With −∞ the hidden keys get exactly 0, and the visible ones share the weight exactly as if the
# hidden keys were not there at all. (One source draws masked cells as "scores of 0": the *scores*
# are −∞; the *weights* are 0.)
#
# ### Your turn
#
# Query 2 of a causal head over `T = 5` positions happens to give every key the same score, 7.0
# (before masking, keys 3 and 4 included). Predict its five weights before running the next cells.

# %%
# Your turn - Exercise 3.3 (★☆☆, predict): a causal row of equal scores.
def my_prediction() -> list[float]:
    """Query 2 of a causal head, T = 5, every score 7.0: its weights on keys 0, 1, 2, 3 and 4."""
    ### BEGIN SOLUTION
    return [1 / 3, 1 / 3, 1 / 3, 0.0, 0.0]
    ### END SOLUTION


check_predict_equal_scores(my_prediction)

# %%
print("query 2 may see keys:", causal_mask(5)[2].tolist())
row2 = torch.tensor([7.0, 7.0, 7.0, float("-inf"), float("-inf")])  # equal scores, the future hidden
print("its weights:", torch.softmax(row2, dim=-1))

# %% [markdown]
# Equal scores share the weight equally among the keys a query may see, and the size of the scores
# does not matter: the softmax depends only on their differences. An untrained head is not far from
# this, as section 8 shows: its weights spread almost evenly over the past.
#
# The causal mask is one kind of mask; one source calls it a kind of padding, but the two are
# different masks, often used together.
#
# **Padding masks.** To batch sentences of different lengths we pad the short ones with filler
# tokens. The filler must not be attended to, so a padding mask hides those **keys** (columns). It is
# usually stored per sequence as `keep [B, T]` and needs a query axis to broadcast to `[B, T_q, T_k]`:
# `keep[:, None, :]`. Combined with the causal mask by `&`, a position may be attended when it is
# both in the past and real.
#
# Source 1 says that a text shorter than the context is "padded with zeros", and stops there. Zeros
# are not a mask. A zero key scores 0 against every query, and a score of 0 gets the weight
# `exp(0) = 1` (section 1), so the filler takes a share of every row; its value is zero too, so
# that share is simply lost and every output shrinks. Here is *bank* from section 1 with its
# sentence padded by five zero vectors to a context of 16, without and with a mask:

# %%
X_padded = torch.cat([X_river, torch.zeros(5, 4)])  # (16, C): 11 words, then 5 zero vectors of filler
is_word = torch.arange(16) < len(river_words)  # (16,) True for the real words
pad_scores = X_padded @ X_river[-1] / math.sqrt(4)  # (16,): bank's query against all 16 keys
w_zeros = torch.softmax(pad_scores, dim=-1)  # zero padding, no mask
w_masked = torch.softmax(pad_scores.masked_fill(~is_word, float("-inf")), dim=-1)  # with a mask
print(f"zero padding, no mask: the 5 zero vectors take {w_zeros[~is_word].sum().item():.0%} of bank's weight")
print("no mask: bank's new vector equals the unpadded one:", torch.allclose(w_zeros @ X_padded, bank_river))
print("with the mask: equal within 1e-6:", (w_masked @ X_padded - bank_river).abs().max().item() < 1e-6)

# %% [markdown]
# **The fully masked row.** With padding on the *left*, the first query of a padded sequence is
# itself padding and, being causal, may see only itself: every key in its row is masked. The softmax
# of a row of −∞ is `0 / 0`, which is NaN, and a single NaN spreads through every later layer:

# %%
row = torch.full((4,), float("-inf"))
print("softmax of a fully masked row:", torch.softmax(row, dim=-1))

# %% [markdown]
# Attention must therefore give such a row zero weights, so that the query gets a zero output. That
# is harmless: those positions are padding, and their output is ignored. PyTorch's own
# `F.scaled_dot_product_attention` has done the same since version 2.5 (2024); earlier versions
# return NaN for such a row. The course needs PyTorch 2.13, so section 6 can compare ours with it
# on exactly such a batch.
#
# ## 6. `scaled_dot_product_attention`
#
# Now everything goes into one function that handles all queries, and any batch dimensions, at once.
# Before computing, it checks its inputs, so that a shape mistake gives a message naming the shapes,
# not a cryptic error from deep inside `matmul`. These checks are written for you:

# %%
#| export
def _check_qkv(q, k, v) -> torch.Size:
    """Validate q [..., T_q, d_k], k [..., T_k, d_k], v [..., T_k, d_v]; return the broadcast batch shape."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim < 2:
            raise ValueError(f"{name} needs at least 2 dims [..., T, d], got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must hold floating-point numbers, got {t.dtype}; convert it with .float()")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same last dim d_k, got q {tuple(q.shape)} and k {tuple(k.shape)}; "
                         "project both to the same head size")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of positions T_k (dim -2), got k {tuple(k.shape)} and "
                         f"v {tuple(v.shape)}; each key needs one value")
    try:
        return torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(f"the batch dims of q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} "
                         "do not broadcast: everything before the last two dims must match (or be 1)") from None

# %% [markdown]
# A mask is checked too: it must be bool (an additive float mask of 0 and −∞ is a common
# alternative, and mixing the two conventions silently would be a nasty bug) and it must broadcast
# to the scores' shape.

# %%
#| export
def check_mask(mask, scores_shape: tuple) -> None:
    """Raise unless ``mask`` is a bool tensor that broadcasts to the scores' shape [..., T_q, T_k].

    The one mask check of every attention in the package (chapters 03, 04, 09).
    """
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a bool torch.Tensor (True = may attend), got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (True = may attend), got dtype {mask.dtype}: turn an additive "
                        "mask of 0 and -inf into one with `mask == 0`, and a 0/1 mask with `mask.bool()`")
    try:
        fits = torch.broadcast_shapes(mask.shape, scores_shape) == torch.Size(scores_shape)
    except RuntimeError:
        fits = False
    if not fits:
        between = len(scores_shape) - 2  # the axes between batch and keys: heads (if any), queries
        fix = {1: "a query axis: mask[:, None, :]", 2: "head and query axes: mask[:, None, None, :]"}.get(between)
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' shape [..., T_q, T_k] "
                         f"= {tuple(scores_shape)}" + (f"; a key-padding mask [B, T_k] needs {fix}" if fix else ""))

# %% [markdown]
# Two options mirror PyTorch's `F.scaled_dot_product_attention`: `scale` (default 1/√d_k; we use
# it to show unscaled attention) and `dropout_p`, which randomly drops attention weights during
# training (chapter 05 shows what dropout does). The weights it returns are the pattern *before* dropout, for plotting.
#
# ### Your turn
#
# Write the heart of `scaled_dot_product_attention`: the attention weights `[..., T_q, T_k]`. The
# cell validates the inputs, and the two lines after your code apply dropout and multiply the
# weights by `v`. Your code must leave `weights` such that
#
# 1. the scores compare every query with every key (as in Exercise 3.1), multiplied by `scale`, or by
#    1/√d_k when `scale` is None;
# 2. where `mask` (when given) is False, a key is hidden: its score becomes −∞ (the module keeps it
#    in `_MASKED`). The mask broadcasts against the scores: it may be `[T_q, T_k]`, `[B, 1, T_k]`, ...;
# 3. the weights are the softmax of the scores over the keys;
# 4. a row whose every key is hidden has all-zero weights, not NaN, and the other rows stay as they
#    are; gradients must stay finite too (the check runs a backward pass through such a row).
#
# Worked numbers from section 3: for *horizon*, the weights are `0.1368 0.1740 0.1261 0.1778 0.1868
# 0.1985` with the default scale and the source's `0.1252 0.1758 0.1115 0.1812 0.1945 0.2119` with
# `scale=1.0`. Once your function passes, the attention head of section 7 and every heatmap after it
# run on it.

# %%
#| export
# Your turn - Exercise 3.4 (★★☆, build): scaled dot-product attention.
def scaled_dot_product_attention(q, k, v, mask=None, *, scale: float | None = None, dropout_p: float = 0.0):
    """Attention of queries over keys: returns ``(out [..., T_q, d_v], weights [..., T_q, T_k])``.

    q [..., T_q, d_k], k [..., T_k, d_k], v [..., T_k, d_v]; the leading dims (batch, heads) broadcast.
    mask: optional bool, broadcastable to [..., T_q, T_k], True where a query may attend a key.
    scale: default 1/√d_k. The weights are taken before dropout; a row whose every key is masked
    gets zero weights and a zero output, never NaN.
    """
    batch = _check_qkv(q, k, v)
    T_q, T_k = q.shape[-2], k.shape[-2]
    if mask is not None:
        check_mask(mask, (*batch, T_q, T_k))
    real_number(dropout_p, "dropout_p", low=0.0, high=1.0, high_open=True)
    # the attention weights [..., T_q, T_k] from q, k, mask and scale
    ### BEGIN SOLUTION
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T_q, T_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, _MASKED)
    weights = torch.softmax(scores, dim=-1)  # (..., T_q, T_k), rows sum to 1
    if mask is not None:
        # a row with every key masked is softmax(-inf, ..., -inf) = 0/0 = NaN: make it all zeros
        weights = weights.masked_fill(~mask, 0.0)
    ### END SOLUTION
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights  # (..., T_q, T_k)
    return dropped @ v, weights  # (..., T_q, d_v), (..., T_q, T_k)

# %%
scaled_dot_product_attention = check_attention(scaled_dot_product_attention).use

# %% [markdown]
# It reproduces the worked example (with and without the scale), and agrees with PyTorch's own
# implementation on a batch with a padding-and-causal mask that leaves one row fully masked:

# %%
out_scaled, w = scaled_dot_product_attention(q_horizon[None], k_seq, v_seq)  # one query: [1, hs]
out_seed, _ = scaled_dot_product_attention(q_horizon[None], k_seq, v_seq, scale=1.0)
print("horizon, scaled  :", out_scaled[0], " weights", w[0])
print("horizon, unscaled:", out_seed[0])
assert torch.allclose(out_scaled[0], w_scaled @ v_seq) and torch.allclose(out_seed[0], w_unscaled @ v_seq)

# %%
qb, kb, vb = (torch.randn(3, 7, 5, generator=g) for _ in range(3))  # (B, T, d)
keep = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]]).bool()
mask = causal_mask(7) & keep[:, None, :]  # (B, T, T): causal and not padding; row 0 of sequence 1 is empty
out, w = scaled_dot_product_attention(qb, kb, vb, mask)
ours_vs_torch = (out - F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask)).abs().max().item()
print(f"within 1e-6 of torch: {ours_vs_torch < 1e-6}; any NaN: {out.isnan().any().item()}")
print("fully masked query (sequence 1, position 0): weights", w[1, 0], "output", out[1, 0])
assert ours_vs_torch < 1e-6 and not out.isnan().any()

# %% [markdown]
# The test suite (`tests/test_attention.py`) repeats the comparison with PyTorch for 60 random
# combinations of shapes, batch dimensions and masks, to within 1e-6, and checks that gradients stay finite
# through a fully masked row. Bad input gets a message that says what is wrong and how to fix it:

# %%
bad_calls = {
    "k narrower than q": lambda: scaled_dot_product_attention(torch.zeros(2, 5, 4), torch.zeros(2, 5, 3), torch.zeros(2, 5, 4)),
    "fewer values than keys": lambda: scaled_dot_product_attention(torch.zeros(5, 4), torch.zeros(6, 4), torch.zeros(5, 4)),
    "0/1 float mask": lambda: scaled_dot_product_attention(torch.zeros(6, 2), torch.zeros(6, 2), torch.zeros(6, 2), causal_mask(6).float()),
    "padding mask without a query axis": lambda: scaled_dot_product_attention(qb, kb, vb, keep),
}
for name, call in bad_calls.items():
    try:
        call()
    except (ValueError, TypeError) as e:
        print(f"{name}: {type(e).__name__}: {e}\n")

# %% [markdown]
# ## 7. One attention head as a module
#
# An attention head is the three projections and the attention, packaged as an `nn.Module`. It
# takes `x [B, T, C]` and returns `[B, T, hs]`: every position gets a new vector that blends the
# values of the positions it may see. Like the attention function, it first checks its input, with a
# check that chapters 04, 05 and 09's layers reuse.

# %%
#| export
def check_input(x, d_model: int, who: str, *, name: str = "input") -> None:
    """Raise unless ``x`` is a float tensor [B, T >= 1, d_model].

    The one input check of the package's layers (chapters 03, 04, 05 and 09).
    """
    want = f"[B, T >= 1, {d_model}]"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{who} expects a torch.Tensor {want}, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{who} needs floating-point input, got {x.dtype}; token ids go through the "
                        "embedding first (chapter 02), other tensors can be converted with .float()")
    if x.ndim != 3 or x.shape[1] == 0 or x.shape[-1] != d_model:
        fix = "; add a batch dimension with x.unsqueeze(0)" if x.ndim == 2 else ""
        raise ValueError(f"{who} was built for d_model={d_model}: its {name} must have shape {want}, "
                         f"got {tuple(x.shape)}{fix}")


class AttentionHead(nn.Module):
    """One head of self-attention: x [B, T, C] -> [B, T, hs].

    Bias-free ``query``, ``key``, ``value`` (C -> hs). ``forward``'s optional bool ``mask`` [B, T, T]
    (True = may attend) is combined with the causal one; ``last_weights`` [B, T, T] keeps the last
    call's weights, detached, for plotting.
    """

    def __init__(self, d_model: int, head_size: int, causal: bool = True, dropout: float = 0.0):
        super().__init__()
        self.d_model, self.head_size = whole_number(d_model, "d_model"), whole_number(head_size, "head_size")
        self.causal = causal
        self.dropout = real_number(dropout, "dropout", low=0.0, high=1.0, high_open=True)
        self.query = nn.Linear(d_model, head_size, bias=False)
        self.key = nn.Linear(d_model, head_size, bias=False)
        self.value = nn.Linear(d_model, head_size, bias=False)
        self.last_weights: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        check_input(x, self.d_model, "AttentionHead")
        B, T, _ = x.shape
        q, k, v = self.query(x), self.key(x), self.value(x)  # (B, T, hs) each
        if mask is not None:
            check_mask(mask, (B, T, T))
        if self.causal:
            causal = causal_mask(T, device=x.device)  # (T, T)
            mask = causal if mask is None else mask & causal
        out, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p=self.dropout if self.training else 0.0)
        self.last_weights = weights.detach()  # (B, T, T)
        return out  # (B, T, hs)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, head_size={self.head_size}, causal={self.causal}, dropout={self.dropout}"

# %% [markdown]
# The head on the worked example's input `(2, 6, 4)` with `head_size = 2`, and the same result
# computed from its weights by hand:

# %%
torch.manual_seed(0)
head = AttentionHead(d_model=4, head_size=2)
print(head)
out = head(inp)
print("out", tuple(out.shape), "weights", tuple(head.last_weights.shape))
q_h, k_h, v_h = (inp @ proj.weight.T for proj in (head.query, head.key, head.value))  # (B, T, hs)
by_hand, _ = scaled_dot_product_attention(q_h, k_h, v_h, causal_mask(6))
assert torch.allclose(out, by_hand, atol=1e-6)
print("module and hand computation agree:", torch.allclose(out, by_hand, atol=1e-6), "| horizon's output:", out[0, -1])

# %% [markdown]
# **Causality, tested.** Whatever we write after position `t` must not change the outputs at
# positions `0..t`. We change the last three tokens of each sequence and compare; the test suite
# runs the same check for random lengths and positions.

# %%
changed = inp.clone()
changed[:, 3:] = torch.rand(2, 3, 4, generator=g)
before, after = head(inp), head(changed)
print("outputs at positions 0..2 unchanged:", torch.allclose(before[:, :3], after[:, :3]),
      "| positions 3..5 changed:", not torch.allclose(before[:, 3:], after[:, 3:]))
assert torch.allclose(before[:, :3], after[:, :3]) and not torch.allclose(before[:, 3:], after[:, 3:])

# %% [markdown]
# **Padding, tested.** Cut the second sequence to its first four tokens and batch it next to the
# full first one, right-padded with two filler vectors. With the padding mask, the real tokens'
# outputs are exactly what they are without any padding at all:

# %%
lengths = torch.tensor([6, 4])
padded = inp.clone()
padded[1, 4:] = 9.0  # filler: any values at all
keep = torch.arange(6)[None, :] < lengths[:, None]  # (B, T)
out = head(padded, keep[:, None, :])
on_padding = head.last_weights[1, :, 4:].sum().item()  # weight the short sequence put on its filler
alone = head(inp[1:, :4])  # the short sequence on its own, no padding
print("real tokens match the unpadded run:", torch.allclose(out[1, :4], alone[0], atol=1e-6))
print("total weight on padding keys:", on_padding)
assert torch.allclose(out[1, :4], alone[0], atol=1e-6) and on_padding == 0

# %% [markdown]
# ## 8. Looking at attention on a sentence
#
# Heatmaps show attention at a glance: one row per query, one column per key, darker = more weight.
# A freshly initialised head has no reason to prefer any key, so its map is a washed-out lower
# triangle; trained heads show structure (chapter 05 ends by plotting the heads of the GPT the course
# ships, trained with chapter 06's recipe, and finds one of each kind built here). To see what it can
# look like *now*, we build two heads by hand on a real line, each with one job:
#
# - a **previous-word head** that uses only positions. Chapter 02 showed that shifting the
#   sinusoidal code by one position is a fixed rotation matrix (`position_shift_matrix`). With the
#   query projection set to "rotate back one position" and the key projection to "identity", the
#   query of position `t` *is* the code of position `t − 1`, and matches that key best;
# - a **same-word head** that uses only the words: with one-hot word vectors as queries and keys, a
#   word matches earlier copies of itself, wherever they are. This is the position-robust look-up of
#   one of our sources: the key is the same wherever the word sits, so the match is too.
#
# Each input vector is a one-hot word vector followed by the 16-dimensional position code. A `gain`
# multiplies the query projection: the dot product of two position codes changes only a little from
# one position to the next, and the gain turns that small difference into a clear choice. (The code
# of `t − 1` is equally similar to the codes of `t` and `t − 2`, since the similarity depends on the
# distance only; the gain makes both lose clearly to `t − 1`.)

# %%
from transformer_course.positional import position_shift_matrix, sinusoidal_positional_encoding

line = "to be , or not to be , that is the question"  # Hamlet, act 3, scene 1
tokens = line.split()
vocab = sorted(set(tokens))
n_pos = 16


def embed_line(words: list[str]) -> torch.Tensor:
    """[1, T, C]: each word's one-hot vector over `vocab`, followed by the position code."""
    one_hot = F.one_hot(torch.tensor([vocab.index(w) for w in words]), len(vocab)).float()  # (T, V_words)
    return torch.cat([one_hot, sinusoidal_positional_encoding(len(words), n_pos)], dim=-1)[None]


x_line = embed_line(tokens)  # (1, T, C)
C = x_line.shape[-1]
print(f"{len(tokens)} tokens, {len(vocab)} distinct words, C = {len(vocab)} + {n_pos} = {C}")

# %%
def hand_built_head(kind: str, gain: float) -> AttentionHead:
    """An AttentionHead whose weights are set by hand: 'previous' (positions) or 'same' (words).

    ``gain`` multiplies the query projection: the larger it is, the sharper the head's choice.
    """
    head = AttentionHead(C, C)
    pos, word = slice(len(vocab), C), slice(0, len(vocab))
    part = pos if kind == "previous" else word
    with torch.no_grad():
        for proj in (head.query, head.key, head.value):
            proj.weight.zero_()
        head.query.weight[part, part] = gain * (position_shift_matrix(-1, n_pos) if kind == "previous" else torch.eye(len(vocab)))
        head.key.weight[part, part] = torch.eye(part.stop - part.start)
        head.value.weight.copy_(torch.eye(C))
    return head

# %%
torch.manual_seed(0)
heads = {"previous word": hand_built_head("previous", gain=60.0), "same word": hand_built_head("same", gain=20.0),
         "untrained": AttentionHead(C, 8)}
line_weights = {}
for name, h in heads.items():
    h(x_line)
    line_weights[name] = h.last_weights[0]  # (T, T)
fig, axes = plt.subplots(1, 3, figsize=(16, 5))
for ax, (name, w) in zip(axes, line_weights.items(), strict=True):
    plot_attention(w, tokens, ax=ax, title=f"{name} head")
plt.tight_layout()
plt.show()

# %%
prev = line_weights["previous word"]
assert (prev[1:].argmax(-1) == torch.arange(len(tokens) - 1)).all()  # every query's top key is the one before
same = line_weights["same word"]
for t in (5, 6, 7):  # the second "to", "be", ","
    earlier = [j for j in range(t) if tokens[j] == tokens[t]]
    print(f"query {t} {tokens[t]!r}: weight on earlier {tokens[t]!r} at {earlier} = {same[t, earlier].sum().item():.3f},"
          f" on itself {same[t, t].item():.3f}")
on_previous = prev.diagonal(-1)  # weight of query i+1 on key i
print("previous-word head: weight on the previous token, mean", round(on_previous.mean().item(), 3),
      "smallest", round(on_previous.min().item(), 3))
assert on_previous.min() > 0.9

# %% [markdown]
# **Moving the words does not change the matches.** One of our sources argues that attention is
# robust to where things sit: a plain feed-forward layer has separate weights for every input
# position, so a pattern learned at position 2 must be learned again at position 3, while a query
# matches a key by their contents. Put three words in front of the line, so every word moves three
# places, and compare the score of the second *to* (query) against the first *to* (key), and of the
# second *to* against the word before it:

# %%
shifted = ["that", "is", "the"] + tokens
x_shifted = embed_line(shifted)


def score(head: AttentionHead, x: torch.Tensor, i: int, j: int) -> float:
    """The scaled score of query i against key j in ``head`` for the input x [1, T, C]."""
    with torch.no_grad():
        return (head.query(x)[0, i] @ head.key(x)[0, j]).item() / math.sqrt(head.head_size)


for name, (i, j) in (("same word", (5, 0)), ("previous word", (5, 4)), ("untrained", (5, 0))):
    before, after = score(heads[name], x_line, i, j), score(heads[name], x_shifted, i + 3, j + 3)
    print(f"{name:>13} head, query {tokens[i]!r} vs key {tokens[j]!r}: {before:8.4f} before the shift, {after:8.4f} after")

# %%
for name, (i, j) in (("same word", (5, 0)), ("previous word", (5, 4))):
    assert abs(score(heads[name], x_line, i, j) - score(heads[name], x_shifted, i + 3, j + 3)) < 1e-4
assert abs(score(heads["untrained"], x_line, 5, 0) - score(heads["untrained"], x_shifted, 8, 3)) > 1e-3

# %% [markdown]
# The same-word head's score is unchanged because it reads only the word part. The previous-word
# head's score is unchanged too, for a different reason: the similarity of two sinusoidal codes
# depends only on the distance between the positions (chapter 02), and the distance did not change.
# The untrained head mixes in absolute positions, so its score moves. Which of these a trained
# head does is up to training; attention makes the position-free choice *possible*.

# %% [markdown]
# The previous-word head puts most of each row's weight one step left of the diagonal (the first
# token has only itself). The same-word head splits the second *to* between both copies of *to*,
# whatever their distance. The untrained head spreads its weight almost evenly: learning is what
# gives a head a job.
#
# Pick a query word and a head below to see where it looks.

# %%
def draw_query_weights(head_name: str, query: int) -> torch.Tensor:
    """Bar chart of one query's weights [T] in one of the heads above; returns the weights."""
    w = line_weights[head_name][query]
    fig, ax = plt.subplots(figsize=(8, 2.6))
    ax.bar(range(len(tokens)), w.numpy(), color="tab:blue")
    ax.set_xticks(range(len(tokens)), [f"{j}:{t}" for j, t in enumerate(tokens)], rotation=45)
    ax.set(ylim=(0, 1), ylabel="weight", title=f"{head_name} head, query {query} {tokens[query]!r}")
    plt.show()
    return w

# %%
def attention_explorer() -> widgets.VBox:
    """Dropdowns for the head and the query token; redraws the bar chart when either changes."""
    head_pick = widgets.Dropdown(options=list(line_weights), description="head")
    query_pick = widgets.Dropdown(options=[(f"{i}: {t}", i) for i, t in enumerate(tokens)], value=6, description="query")
    canvas = widgets.Output()

    def update(_=None):
        with canvas:
            canvas.clear_output(wait=True)
            draw_query_weights(head_pick.value, query_pick.value)

    head_pick.observe(update, names="value")
    query_pick.observe(update, names="value")
    return widgets.VBox([widgets.HBox([head_pick, query_pick]), canvas])

# %%
display(attention_explorer())
shown = draw_query_weights("previous word", 6)  # the widget's starting view, stored with the notebook

# %%
print("query 6 ('be') in the previous-word head: top key", repr(tokens[shown.argmax().item()]), "at", shown.argmax().item())
assert shown.argmax().item() == 5

# %% [markdown]
# ## 9. Beyond the chapter: recency without a position code (ALiBi)
#
# The previous-word head needed a position code in its input to know who sits where. *ALiBi*
# (attention with linear biases, Press, Smith and Lewis, 2022) gives attention a sense of distance
# without any position code at all: it adds to every score a penalty that grows with the distance
# between query and key,
#
# $$\text{score}_{ij} = \frac{q_i \cdot k_j}{\sqrt{d_k}} - m\,(i - j) \qquad (j \le i),$$
#
# with a fixed slope `m > 0` (each head of a multi-head layer gets its own, `1/2, 1/4, 1/8, ...`, so
# some heads look far and others near). Nothing is learned and nothing depends on a table, so it works
# for sequences of any length.
#
# The penalty and the causal mask fit in one **additive** float mask `[T, T]`, the other convention
# mentioned in section 6: it is added to the scaled scores, 0 changes nothing and −∞ hides a key.
# PyTorch's `F.scaled_dot_product_attention` accepts such a float mask as `attn_mask`.
#
# ### Your turn
#
# Build `alibi_bias(T, slope)`: a float tensor `[T, T]` whose entry `(i, j)` is `-slope * (i - j)`
# when `j <= i` and −∞ when `j > i`. Worked numbers: `alibi_bias(3, 0.5)` is
#
# ```
# [[ 0.0, -inf, -inf],
#  [-0.5,  0.0, -inf],
#  [-1.0, -0.5,  0.0]]
# ```

# %%
# Your turn - Exercise 3.5 (★★☆, extend): the ALiBi distance bias, as an additive causal mask.
def alibi_bias(T: int, slope: float) -> torch.Tensor:
    """Float [T, T]: -slope * (i - j) where key j may be seen by query i (j <= i), -inf where j > i."""
    ### BEGIN SOLUTION
    distance = torch.arange(T)[:, None] - torch.arange(T)[None, :]  # (T, T): i - j
    bias = -slope * distance.float()
    return torch.where(causal_mask(T), bias, torch.tensor(float("-inf")))
    ### END SOLUTION


alibi_bias = check_alibi_bias(alibi_bias).use

# %% [markdown]
# A head whose scores are all equal (Exercise 3.3) spreads its weight evenly over the past. Add the
# ALiBi bias and the same head leans towards the recent tokens: each step back multiplies a key's
# weight by `exp(-m)`, about one half for the slope 0.7 used here. PyTorch's attention, given the
# bias as `attn_mask`, computes the same blend:

# %%
T_line = len(tokens)
bias = alibi_bias(T_line, slope=0.7)  # (T, T)
recency = torch.softmax(bias, dim=-1)  # equal scores plus the bias: the weights of a content-blind head
x_words = x_line[..., : len(vocab)]  # (1, T, V_words): the words only, no position code
zeros = torch.zeros(1, T_line, 4)  # queries and keys that score every pair the same
out_torch = F.scaled_dot_product_attention(zeros, zeros, x_words, attn_mask=bias)
print("PyTorch with attn_mask=bias blends the values with these weights, within 1e-6:",
      (out_torch[0] - recency @ x_words[0]).abs().max().item() < 1e-6)
print("each row's weights fall with distance:", all((recency[i, : i + 1].diff() > 0).all().item() for i in range(T_line)))
print("the last query's weights on itself and the 3 keys before it:", [round(w, 2) for w in recency[-1, -4:].flip(0).tolist()])
fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
plot_attention(line_weights["untrained"], tokens, ax=axes[0], title="untrained head")
plot_attention(recency, tokens, ax=axes[1], title="equal scores + ALiBi bias (slope 0.7)")
plt.tight_layout()
plt.show()

# %% [markdown]
# The bias exists for every length, so a model trained with it meets nothing unfamiliar in a longer
# text: far keys only get a larger penalty. The last query of a 12-token text and of a 1,000-token
# text puts almost the same weights on its nearest keys:

# %%
near_12 = torch.softmax(alibi_bias(12, 0.7), dim=-1)[-1, -4:]
near_1000 = torch.softmax(alibi_bias(1000, 0.7), dim=-1)[-1, -4:]
print("weights on the last 4 keys, T = 12 vs T = 1000, within 0.001:", (near_12 - near_1000).abs().max().item() < 1e-3)

# %% [markdown]
# ## 10. Beyond the chapter: attention without the T × T matrix
#
# `scaled_dot_product_attention` builds every query's score against every key: a `[T, T]` matrix per
# head. At T = 1,024 that is about a million numbers, at T = 32,768 a billion, and it is read and
# written several times (scale, mask, softmax, weights times values). FlashAttention (Dao et al.,
# 2022) computes the same output without ever holding that matrix: it walks over the keys a tile at a
# time and keeps, for each query, just enough to finish the softmax later. On a GPU the tiles live in
# the small, fast memory next to the arithmetic units, which is where its speed comes from; PyTorch's
# own `F.scaled_dot_product_attention` uses such tiled kernels on both GPUs and CPUs.
#
# The trick that makes one pass possible is the **online softmax** (Milakov and Gimelshein, 2018). A
# careful softmax subtracts the row's largest score before taking exponentials, since `exp` of a
# score in the hundreds overflows float32 (`torch.softmax` does this for us); subtracting any
# constant leaves the weights unchanged. So it needs the row's maximum before any exponential, and
# the sum of all exponentials before any weight is final. Both can be kept as running values that are
# corrected when a later tile changes them: if the running maximum grows from `m` to `m'`, everything
# summed so far was measured against `m` and is simply multiplied by `exp(m - m')`.
#
# ### Your turn
#
# Write `tiled_attention(q, k, v, tile, causal=False)`: for `q [..., T_q, d]`, `k [..., T_k, d]` and
# `v [..., T_k, d_v]` it returns what `scaled_dot_product_attention` would, `[..., T_q, d_v]`, but never
# computes more than the scores of all queries against one tile of `tile` keys. With `causal=True`
# (then `T_q = T_k`), query `i` sees keys `j <= i`. The check compares your output with full attention
# in float64, with tiles that do not divide T, with scores large enough to overflow a careless `exp`,
# and it measures the largest tensor your function computes (`largest_tensor`: every operation's
# output, temporaries included).

# %%
# Your turn - Exercise 3.6 (★★★, extend): attention tile by tile.
def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: int, causal: bool = False) -> torch.Tensor:
    """softmax(q kᵀ / √d) v [..., T_q, d_v] for q [..., T_q, d], k [..., T_k, d], v [..., T_k, d_v], computed over
    tiles of `tile` keys without the [T_q, T_k] score matrix; causal: query i sees keys j <= i."""
    ### BEGIN SOLUTION
    scale = 1 / math.sqrt(q.shape[-1])
    best = q.new_full((*q.shape[:-1], 1), float("-inf"))  # (..., T_q, 1) the largest score seen so far
    total = q.new_zeros((*q.shape[:-1], 1))  # (..., T_q, 1) sum of exp(score - best)
    mixed = q.new_zeros((*q.shape[:-1], v.shape[-1]))  # (..., T_q, d_v) sum of exp(score - best) * value
    for start in range(0, k.shape[-2], tile):
        scores = q @ k[..., start:start + tile, :].transpose(-2, -1) * scale  # (..., T_q, tile)
        if causal:
            later = torch.arange(start, start + scores.shape[-1]) > torch.arange(q.shape[-2])[:, None]
            scores = scores.masked_fill(later, float("-inf"))
        new_best = torch.maximum(best, scores.amax(-1, keepdim=True))
        weights = torch.exp(scores - new_best)  # (..., T_q, tile), not yet normalised
        shrink = torch.exp(best - new_best)  # (..., T_q, 1): the old sums were measured against best
        total = total * shrink + weights.sum(-1, keepdim=True)
        mixed = mixed * shrink + weights @ v[..., start:start + tile, :]
        best = new_best
    return mixed / total
    ### END SOLUTION


tiled_attention = check_tiled_attention(tiled_attention).use

# %% [markdown]
# The same output as the full computation, from a fraction of the memory. Here one head over a text of
# 1,024 tokens, in tiles of 128 keys, against the chapter's function and PyTorch's:

# %%
g_tiles = torch.Generator().manual_seed(7)
q_long, k_long, v_long = (torch.randn(1024, 64, generator=g_tiles) for _ in range(3))  # (T, hs) each
out_full, largest_full = largest_tensor(scaled_dot_product_attention, q_long, k_long, v_long, causal_mask(1024))
out_tiled, largest_tiled = largest_tensor(tiled_attention, q_long, k_long, v_long, 128, causal=True)
out_torch = F.scaled_dot_product_attention(q_long, k_long, v_long, is_causal=True)
print("tiled = full within 1e-5:", torch.allclose(out_tiled, out_full[0], atol=1e-5),
      "| tiled = PyTorch's within 1e-5:", torch.allclose(out_tiled, out_torch, atol=1e-5))
print(f"largest tensor computed: full {largest_full:,} numbers ({4 * largest_full / 2**20:.1f} MiB in float32), "
      f"tiled {largest_tiled:,} ({4 * largest_tiled / 2**20:.2f} MiB)")

# %% [markdown]
# The full version's largest tensor is the `[T, T]` matrix (the mask and the weights are as large);
# the tiled one's is the scores of all queries against one tile, `[T, 128]`, and it stays that size
# however long the text grows. The arithmetic is the same (every query still meets every key it may
# see), so on a CPU the gain is memory, not time. Chapter 04 splits attention into heads, and
# chapter 07 caches keys and values; FlashAttention's tiles fit both.

# %% [markdown]
# ## Quick check

# %%
from transformer_course.quiz import Question, quiz

quiz([
    Question("With left padding, a padded query may attend no key at all. What does scaled_dot_product_attention give it?",
             ["Zero weights and a zero output", "NaN weights", "Equal weights on every key", "An error"],
             answer=0, explain="softmax of a row of −∞ is 0/0 = NaN; the function sets such a row's weights to 0, so its output is 0."),
    Question("Why are the scores divided by √d_k?",
             ["To make them positive", "Their spread grows like √d_k, and a wide spread saturates the softmax",
              "To save memory", "So that the weights sum to 1"],
             answer=1, explain="q·k sums d_k products; its standard deviation is about √d_k. A near one-hot softmax has almost no gradient."),
    Question("In a causal head, what does the output at position 2 depend on?",
             ["Positions 0, 1 and 2", "Position 2 only", "Every position", "Positions 2 and after"],
             answer=0, explain="Query 2 may attend keys j <= 2, and the output mixes only their values."),
    Question("A padding mask `keep` of shape [B, T] goes into attention with scores [B, T, T]. What should you pass?",
             ["keep[:, None, :]", "keep[:, :, None]", "keep", "~keep"],
             answer=0, explain="Padding hides keys (the last axis); the new middle axis broadcasts over the queries."),
])

# %% [markdown]
# ## Summary
#
# - Attention lets each position build its new vector as a weighted average of the values of the
#   positions it may see; the weights are the softmax of query-key dot products.
# - Queries, keys and values are three bias-free linear projections of the same input, so a token can
#   look for one thing, be found by another, and pass on a third.
# - The scores are divided by √d_k because their spread grows like √d_k; without it the softmax
#   saturates (at d_k = 512 most of a row's weight sits on one key) and gradients vanish.
# - A score of 0 still gets weight (`exp(0) = 1`): words unrelated to the query, and zero-padding
#   without a mask (source 1), take a share of every row.
# - Masks are bool, True = may attend; masked scores become −∞ so they get exactly zero weight. The
#   causal mask hides the future, padding masks hide filler keys, and a fully masked row returns
#   zeros instead of NaN (as PyTorch's own attention does from version 2.5).
# - Our worked example's source printed softmax weights without the 1/√2 scale its own code applies;
#   the correct output for *horizon* is (0.5863, 0.4658).
# - The scores pair every query row with every key row. A product that pairs the features of `q` with
#   the positions of `k` runs only when the two counts happen to be equal, and is wrong even then;
#   source 4's `Q*K'` (tokens as columns) compares features with features and, on one sequence,
#   runs at every size (on its declared batch it stops: Julia has no adjoint of a 3-D array).
# - ALiBi replaces the position code by a penalty on distance, added to the scores as a float mask
#   (0 changes nothing, −∞ hides); it exists for every length.
# - The online softmax keeps a running maximum and running sums, rescaled by `exp(m - m')` when the
#   maximum grows, so attention can visit the keys a tile at a time: the same output, and memory for
#   `[T, tile]` scores instead of `[T, T]` (FlashAttention's idea).
#
# **Exported to `transformer_course/attention.py`:** `causal_mask(T, device=None)`,
# `scaled_dot_product_attention(q, k, v, mask=None, *, scale=None, dropout_p=0.0) -> (out, weights)`
# and `AttentionHead(d_model, head_size, causal=True, dropout=0.0)`, with the checks every later
# attention reuses, `check_mask(mask, scores_shape)` and `check_input(x, d_model, who)`. Chapter 04
# runs several heads side by side in one `MultiHeadAttention`.
