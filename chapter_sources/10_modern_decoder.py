# %% [markdown]
# # 10 · From GPT-2 to a modern decoder: RMSNorm, SwiGLU, RoPE and grouped-query attention
#
# The GPT of chapter 06 is GPT-2's design from 2019. The open models people download today (Llama,
# Mistral, Qwen, Gemma) are still decoder-only transformers with the same residual stream, the same
# causal attention and the same next-token loss, but four parts have changed:
#
# | part | GPT-2 (chapters 02-06) | a modern decoder |
# |---|---|---|
# | normalisation | LayerNorm: centre, scale, gain, shift | **RMSNorm**: scale and gain only |
# | MLP | `proj(gelu(fc(x)))`, hidden width 4C | **SwiGLU**: `proj(silu(gate(x)) * up(x))`, hidden width 8C/3 or wider |
# | positions | a learned vector added to each token | **rotary positions (RoPE)**: q and k turned by an angle that grows with the position |
# | keys and values | one key/value head per query head | **grouped-query attention**: a few key/value heads, each shared by a group of query heads |
#
# The right-hand column is Llama's choice; the other families differ in details (Gemma, for one, puts
# GELU rather than SiLU in its gated MLP).
#
# **In this chapter you will** write RMSNorm (Exercise 10.1), fix a broken table of rotation speeds
# (10.2), write the rotation itself (10.3), predict the size of a KV cache (10.4), assemble the four
# parts into chapter 06's `GPT` yourself (10.5, ★★★: one class then makes both GPT-2 and a Llama-style
# decoder), add Mistral's sliding-window mask (10.6) and design the cache that goes with it (10.7, ★★★).
# Your assembly, with your RMSNorm and your
# rotation inside, then loads the weights of a Hugging Face `LlamaForCausalLM` and gives its outputs to
# 1e-5.
#
# **You need** chapter 02 (a position shift is a rotation of channel pairs), chapter 04 (heads and the
# KV cache), chapter 05 (LayerNorm and the MLP), chapter 06 (`GPTConfig` and `GPT`), chapter 07
# (`generate`) and chapter 08 (loading Hugging Face weights). It also needs the optional package
# `transformers` for the last part (`pip install 'transformer-course[pretrained]'`).

# %%
#| default_exp modern

# %%
import math
import warnings

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

torch.set_printoptions(precision=4, sci_mode=False)
torch.manual_seed(0)
warnings.filterwarnings("ignore", module="transformers")
import transformers

transformers.logging.set_verbosity_error()  # its log messages would vary between versions

# %% [markdown]
# ## 1. RMSNorm: LayerNorm without the centring
#
# LayerNorm (chapter 05) does two things to each token's C numbers: it subtracts their mean, and it
# divides by their standard deviation; then a learned gain γ and shift β follow. Zhang and Sennrich
# (2019) asked which half matters. Their hypothesis, which their experiments support (RMSNorm trained
# about as well as LayerNorm): the division. Keeping every token's vector at a fixed size is what
# steadies training; moving its mean to zero adds little, and the shift β is one more vector the next
# linear layer could learn anyway. **RMSNorm** keeps only the division, by the root
# mean square of the numbers, `rms(x) = sqrt(mean(x²) + eps)`, and the gain:
#
# `y = x / rms(x) · g`
#
# In arithmetic it is a little cheaper than LayerNorm: no mean to subtract, one reduction instead of
# two, no shift to add. It also has half the parameters of LayerNorm with a shift. Llama, Mistral,
# Qwen and Gemma all use it. `eps` was 1e-6 in the first Llama and is 1e-5 in Llama 2 and 3 (their
# configs' `rms_norm_eps`), as in GPT-2's LayerNorm.
#
# Arithmetic is not the whole cost. The RMSNorm you write here is a chain of separate PyTorch
# operations (square, mean, square root, division, gain), each a pass over the numbers, while chapter
# 05's LayerNorm hands its whole formula to one fused kernel, `F.layer_norm`. Measured on the course's
# CPU, the plain RMSNorm is the slower of the two, and section 8 shows the consequence: in the same
# time, the model with RMSNorm makes fewer steps than the GPT-2 style model. The saving in arithmetic
# shows only once RMSNorm, too, runs as one fused kernel, as it does in the libraries that train and
# serve large models.
#
# The numbers are computed in float32 even when the model runs in bfloat16 (a mean of squares of
# 4,096 bf16 numbers loses too many digits), then turned back into the input's type before the gain,
# as Hugging Face's Llama does.

# %%
#| export
"""From GPT-2 to a modern decoder (chapter 10): RMSNorm, the SwiGLU MLP, rotary positions (RoPE) and
grouped-query attention, the four parts in which Llama, Mistral and Qwen differ from chapter 06's GPT.

Each part is a choice of `GPTConfig` (`normalization`, `mlp`, `positional="rope"`, `n_kv_head`) and a
module that plugs into chapter 04's attention and chapter 05's block: `build_gpt(cfg)` assembles one
`GPT` of them, so GPT-2 and a Llama-style decoder are the same classes with other parts.
Shapes: B batch, T new positions, L cached positions, C = d_model channels, nh query heads, nkv
key/value heads, hs = C // nh head size, H the MLP's hidden width, P the positions a table holds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.arguments import choice, real_number, whole_number
from transformer_course.block import LayerNorm, TransformerBlock
from transformer_course.config import GPTConfig
from transformer_course.model import GPT
from transformer_course.positional import InputEmbedding

# %% [markdown]
# **Your turn.** Write `RMSNorm.forward`: x [..., C] to y [..., C], each row divided by its root mean
# square (eps inside the square root, the mean over the last dimension), computed in float32 and
# returned in x's dtype, then times `self.weight` [C]. The check compares it with the formula and
# with `torch.nn.RMSNorm` on rows with a non-zero mean, with a small and a large eps (so an eps in the
# wrong place shows) and on a single row without a batch dimension, then feeds it bfloat16 rows to see
# that it computes in float32 and answers in bfloat16.

# %%
#| export
# Your turn - Exercise 10.1 (★☆☆, build): RMSNorm.
class RMSNorm(nn.Module):
    """Root-mean-square normalisation (Zhang & Sennrich 2019), the norm of Llama, Mistral and Qwen.

    LayerNorm without the centring and without the shift: each row of C numbers is divided by its root
    mean square sqrt(mean(x²) + eps), computed in float32 and returned in the input's dtype, then
    multiplied by the learned gain ``weight`` (g [C], starts at 1). [..., C] -> [..., C].
    """

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.d_model = whole_number(d_model, "d_model")
        self.eps = real_number(eps, "eps", low=0, low_open=True, hint="the first Llama used 1e-6, Llama 2 and 3 1e-5")
        self.weight = nn.Parameter(torch.ones(d_model))  # g [C]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        x32 = x.float()
        rms = torch.sqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return (x32 / rms).to(x.dtype) * self.weight  # (..., C)
        ### END SOLUTION

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"

# %%
from transformer_course.checks.modern import (
    check_predict_kv_bytes,
    check_rms_norm,
    check_rope_frequencies,
    check_modern_parts,
    check_rolling_kv_cache,
    check_rotate_halves,
    check_sliding_window_mask,
)

RMSNorm = check_rms_norm(RMSNorm).use

# %% [markdown]
# A hand-worked row: x = (1, 7, 1, 7). The mean of the squares is (1 + 49 + 1 + 49) / 4 = 25, so
# rms = 5 and RMSNorm gives (0.2, 1.4, 0.2, 1.4). LayerNorm first moves the mean, 4, to zero:
# (-3, 3, -3, 3), whose standard deviation is 3, and gives (-1, 1, -1, 1). RMSNorm keeps the direction
# of the vector and only fixes its length; LayerNorm also removes the part along (1, 1, ..., 1).

# %%
row = torch.tensor([[1.0, 7.0, 1.0, 7.0]])
by_hand = torch.tensor([[0.2, 1.4, 0.2, 1.4]])
print("RMSNorm  :", RMSNorm(4)(row).detach())
print("LayerNorm:", LayerNorm(4, eps=1e-6)(row).detach())
print("equal to the hand-worked row within 1e-6:", torch.allclose(RMSNorm(4)(row), by_hand, atol=1e-6))

# %% [markdown]
# And with PyTorch's own `torch.nn.RMSNorm` (PyTorch 2.4 and later), given the same random gain:

# %%
torch.manual_seed(1)
ours, theirs = RMSNorm(64), nn.RMSNorm(64, eps=1e-6)
with torch.no_grad():
    ours.weight.normal_(1.0, 0.1)
    theirs.weight.copy_(ours.weight)
x = 3 * torch.randn(2, 5, 64) + 1
diff = (ours(x) - theirs(x)).abs().max().item()
print(f"RMSNorm vs torch.nn.RMSNorm, within 1e-6: {diff < 1e-6}")
print(f"parameters: RMSNorm {sum(p.numel() for p in ours.parameters())}, "
      f"LayerNorm {sum(p.numel() for p in LayerNorm(64).parameters())}")

# %% [markdown]
# ## 2. SwiGLU: a gated MLP with the same number of parameters
#
# GPT-2's MLP widens each token to 4C numbers, applies GELU to each, and narrows back: two matrices.
# The **gated** MLP of PaLM and Llama (Shazeer 2020) computes two widenings of the same token, passes
# one through **SiLU**, `silu(z) = z · sigmoid(z)` (smooth like GELU and of a similar shape, though not
# the same curve: the plot below shows both), and multiplies the two element by element. "Gate" is the
# usual name for the first, but it is not a gate that lets through a fraction between 0 and 1:
# `silu(gate(x))` grows without bound for large inputs and dips below 0 for negative ones, so it can
# amplify or flip the sign of `up(x)`. The product is a learned multiplicative interaction between two
# projections of the same token. Then the narrowing:
#
# `SwiGLU(x) = proj( silu(gate(x)) ⊙ up(x) )`, with `gate`, `up`: C → H and `proj`: H → C.
#
# Three matrices instead of two. To keep the parameter count of the 4C MLP, the hidden width shrinks
# by 2/3: `3 · C · H = 2 · C · 4C` gives **H = 8C/3**, rounded up to a multiple of a small number so
# the matrices tile well (the first Llama rounds to a multiple of 256; we round to 8). `swiglu_hidden`
# computes it. Later models do not all keep the 4C MLP's count: Llama 3 8B and Mistral 7B widen their
# 4,096 channels to 14,336, that is 3.5C.

# %%
#| export
def swiglu_hidden(d_model: int, multiple_of: int = 8) -> int:
    """SwiGLU's hidden width H: the 8C/3 that gives 3·C·H = 2·C·4C (a 4C GELU MLP's parameters),
    taken down to a whole number and then up to a multiple of ``multiple_of`` (Llama 1 and 2's rule)."""
    C = whole_number(d_model, "d_model")
    m = whole_number(multiple_of, "multiple_of")
    return m * -(-(8 * C // 3) // m)  # ceil(floor(8C/3) / m) · m


class SwiGLU(nn.Module):
    """The gated MLP of PaLM and Llama (Shazeer 2020): ``proj(silu(gate(x)) * up(x))``.

    ``gate`` and ``up`` widen C -> H (default `swiglu_hidden(C)`), ``proj`` narrows H -> C; SiLU(z) =
    z·sigmoid(z). No biases by default (Llama has none). [..., C] -> [..., C] (hidden [..., H]).
    """

    def __init__(self, d_model: int, d_ff: int | None = None, bias: bool = False, dropout: float = 0.0):
        super().__init__()
        self.d_model = whole_number(d_model, "d_model")
        self.d_ff = swiglu_hidden(d_model) if d_ff is None else whole_number(d_ff, "d_ff")
        real_number(dropout, "dropout", low=0, high=1, high_open=True)
        self.gate = nn.Linear(d_model, self.d_ff, bias=bias)
        self.up = nn.Linear(d_model, self.d_ff, bias=bias)
        self.proj = nn.Linear(self.d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.silu(self.gate(x)) * self.up(x)))  # (..., C)

# %% [markdown]
# When 3 divides C and 8C/3 is already a multiple of 8 (C = 96 gives H = 256), the counts are equal;
# otherwise the rounding adds a little (C = 128 gives H = 344, not 341.3):

# %%
from transformer_course.block import FeedForward

for C in (96, 128, 768):
    plain = sum(p.numel() for p in FeedForward(C, bias=False).parameters())
    gated = sum(p.numel() for p in SwiGLU(C).parameters())
    print(f"C={C:4d}: GELU MLP 4C={4 * C:5d}: {plain:>10,}   SwiGLU H={swiglu_hidden(C):5d}: {gated:>10,}"
          f"   ({gated / plain - 1:+.1%})")

# %% [markdown]
# SwiGLU against a plain reference: the formula written with `sigmoid` and the three weight matrices.

# %%
torch.manual_seed(2)
mlp = SwiGLU(32)
x = torch.randn(3, 32)
g, u, d = mlp.gate.weight, mlp.up.weight, mlp.proj.weight
z = x @ g.T
reference = (z * torch.sigmoid(z) * (x @ u.T)) @ d.T
print(f"SwiGLU vs the written-out formula, within 1e-6: {(mlp(x) - reference).abs().max().item() < 1e-6}")

z = torch.linspace(-5, 5, 201)
fig, ax = plt.subplots(figsize=(5, 2.6))
ax.plot(z, F.silu(z), label="SiLU  z·sigmoid(z)")
ax.plot(z, F.gelu(z), "--", label="GELU  z·Φ(z)")
ax.set(xlabel="z", title="SiLU and GELU: similar, not equal")
ax.legend()
plt.show()

# %% [markdown]
# ## 3. Rotary positions: turn q and k, not the token
#
# Chapter 02 showed that the sinusoidal code of position p + k is the code of position p turned, pair
# of channels by pair of channels, through angles k·θ_i: a shift in position is a rotation. **RoPE**
# (Su et al. 2021) uses that directly, inside attention. Nothing is added to the token vectors; instead
# each head's query and key at position p are split into hs/2 pairs of channels, and pair i is turned
# by the angle p·θ_i. The dot product of two turned vectors depends only on the *difference* of their
# angles, so the score of a query at position m with a key at position n depends on the two vectors
# and on m - n, never on m and n themselves. Attention becomes relative, and nothing has to be learned
# for it.
#
# The speeds follow the sinusoidal code: pair i turns by θ_i = base^(-2i/hs) radians per position,
# base 10000 (the paper's value, kept by Llama 1 and 2; Llama 3 raised it to 500,000 and Mistral 7B
# v0.2 to 1,000,000, so that the slow pairs stretch over longer contexts). Pair 0 turns one radian per
# position; at base 10000 the last pair turns so slowly that it takes tens of thousands of positions
# to go round once. The fast pairs tell neighbours apart, the slow ones distances across the whole
# context.
#
# Here is a version of that table with a bug, as it is easy to write:

# %%
def buggy_rope_frequencies(head_size: int, base: float = 10000.0) -> torch.Tensor:
    return 1.0 / base ** (torch.arange(head_size // 2).float() / head_size)


slowest = buggy_rope_frequencies(64)[-1].item()
print(f"slowest pair, hs=64: {slowest:.5f} rad per position, once round every {2 * math.pi / slowest:,.0f} positions")
print(f"the paper's slowest pair: {10000 ** (-62 / 64):.6f} rad per position, "
      f"once round every {2 * math.pi / 10000 ** (-62 / 64):,.0f} positions")

# %% [markdown]
# **Your turn (debug).** The buggy table's slowest pair goes round every few hundred positions (the
# cell above), so positions that far apart look alike to it, and a model with a context of 4,096 tokens loses its sense of long
# distances. Find the mistake and write the fixed `rope_frequencies`: [hs // 2] float32 speeds, pair i
# turning by base^(-2i/hs) radians per position. (Compute it as 1 / base^(...), in float32, as the
# Hugging Face code does, so the tables agree bit for bit.)

# %%
#| export
# Your turn - Exercise 10.2 (★☆☆, debug): the rotation speeds.
def rope_frequencies(head_size: int, base: float = 10000.0) -> torch.Tensor:
    """RoPE's speeds θ [hs // 2] (float32): pair i turns by base^(-2i/hs) radians per position."""
    hs = whole_number(head_size, "head_size")
    if hs % 2:
        raise ValueError(f"rotary positions turn pairs of channels, so the head size must be even, got {hs}: "
                         "choose d_model and n_head so that d_model // n_head is even")
    base = real_number(base, "base", low=1, low_open=True, hint="RoPE's base is 10000 in the paper")
    ### BEGIN SOLUTION
    return 1.0 / base ** (torch.arange(0, hs, 2).float() / hs)  # (hs/2,)
    ### END SOLUTION

# %%
rope_frequencies = check_rope_frequencies(rope_frequencies).use

# %% [markdown]
# The angle of pair i at position p is p·θ_i. Each pair's wavelength (the positions it takes to go
# round once, 2π/θ_i) grows geometrically from 2π to about 2π·base:

# %%
theta = rope_frequencies(64)
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3))
positions = torch.arange(64)
left.imshow(torch.outer(positions.float(), theta).remainder(2 * math.pi).T, aspect="auto", cmap="twilight")
left.set(xlabel="position p", ylabel="pair i", title="angle p·θ_i (mod 2π), hs = 64")
right.semilogy(2 * math.pi / theta, "o-", label="rope_frequencies")
right.semilogy(2 * math.pi / buggy_rope_frequencies(64), "x--", label="the buggy table")
right.set(xlabel="pair i", ylabel="positions per turn", title="wavelength of each pair")
right.legend()
plt.show()

# %% [markdown]
# Now the rotation itself. Which channels make a pair? The paper pairs neighbours, (0, 1), (2, 3), ...
# (**interleaved pairs**; Meta's original Llama code does this with complex numbers). GPT-NeoX and
# Hugging Face's Llama pair channel i with channel i + hs/2 (**split halves**; in their code, the
# helper `rotate_half`). Both are rotations of pairs by the same angles; they differ only in which
# channels are called a pair, so weights trained with one convention must be reordered to be used
# with the other (Hugging Face's conversion script permutes the rows of W_q and W_k).
#
# **Your turn.** Write `rotate_halves(x, cos, sin)`: x [..., T, hs], cos and sin [T, hs/2] (row t
# holds cos and sin of the angles of position t). Pair i is (x_i, x_{i+hs/2}) = (a, b); turned by
# angle φ it becomes (a cos φ - b sin φ, a sin φ + b cos φ). Return the turned vectors [..., T, hs],
# first components in the first half, second components in the second.

# %%
#| export
# Your turn - Exercise 10.3 (★★☆, build): the rotation, split-halves convention.
def rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn pair i = (x_i, x_{i + hs/2}) by the angle whose cosine and sine are cos[t, i], sin[t, i].

    The split-halves convention of GPT-NeoX and Hugging Face's Llama. x [..., T, hs]; cos, sin
    [T, hs/2], broadcast over the leading dimensions. Returns [..., T, hs].
    """
    if x.shape[-1] % 2 or cos.shape != sin.shape or cos.shape[-1] * 2 != x.shape[-1]:
        raise ValueError(f"rotate_halves needs x [..., T, hs] with hs even and cos, sin [T, hs/2], got "
                         f"x {tuple(x.shape)}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)}")
    ### BEGIN SOLUTION
    a, b = x.chunk(2, dim=-1)  # (..., T, hs/2) each: first and second channel of every pair
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)  # (..., T, hs)
    ### END SOLUTION

# %%
rotate_halves = check_rotate_halves(rotate_halves).use

# %% [markdown]
# The interleaved convention needs no new code: reorder the channels so that each neighbour pair
# (2i, 2i+1) lands at (i, i + hs/2), rotate by halves, and put the channels back.
# `RotaryEmbedding` holds the cos and sin tables of every position up to the model's context, computed
# **once** when the model is built and kept as buffers (they follow the model to the GPU, are not
# trained and are not saved); each forward pass only reads the rows of its positions. It works up to
# `max_positions` and refuses positions past it: rotary angles beyond the trained length are angles
# the model never saw, and stretching them (the "rope scaling" of long-context models) is a change of
# the table this chapter does not make.

# %%
#| export
def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The interleaved convention of the RoPE paper: pair i = (x_{2i}, x_{2i+1}). Same shapes as
    `rotate_halves`; computed as it, on the channels reordered evens first, then put back."""
    hs = x.shape[-1]
    order = torch.cat([torch.arange(0, hs, 2), torch.arange(1, hs, 2)])  # (hs,): 0, 2, 4, ..., 1, 3, 5, ...
    return rotate_halves(x[..., order], cos, sin)[..., torch.argsort(order)]  # (..., T, hs)


ROPE_CONVENTIONS = {"halves": rotate_halves, "pairs": rotate_pairs}


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021) for heads of size hs and positions 0 .. P - 1.

    ``cos`` and ``sin`` [P, hs/2] (angle p·θ_i, θ from `rope_frequencies`) are computed once, here, as
    non-persistent buffers. ``forward(x [..., T, hs], start)`` turns row t by the angles of position
    start + t. ``convention``: "halves" (Hugging Face's Llama) or "pairs" (the paper).
    """

    def __init__(self, head_size: int, max_positions: int, base: float = 10000.0, convention: str = "halves"):
        super().__init__()
        theta = rope_frequencies(head_size, base)  # (hs/2,); checks head_size and base
        self.head_size, self.base = head_size, float(base)
        self.max_positions = whole_number(max_positions, "max_positions")
        self.convention = choice(convention, "convention", ROPE_CONVENTIONS)
        angles = torch.outer(torch.arange(max_positions).float(), theta)  # (P, hs/2)
        self.register_buffer("cos", angles.cos(), persistent=False)  # (P, hs/2)
        self.register_buffer("sin", angles.sin(), persistent=False)  # (P, hs/2)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        T = x.shape[-2]
        start = whole_number(start, "start", low=0)
        if start + T > self.max_positions:
            raise ValueError(f"positions {start}..{start + T - 1} are past the table's {self.max_positions} "
                             "positions: crop the input, or build the model with a larger block_size")
        cos, sin = self.cos[start:start + T], self.sin[start:start + T]  # (T, hs/2)
        return ROPE_CONVENTIONS[self.convention](x.float(), cos, sin).to(x.dtype)  # (..., T, hs)

    def extra_repr(self) -> str:
        return f"head_size={self.head_size}, max_positions={self.max_positions}, convention={self.convention!r}"

# %% [markdown]
# The promise of RoPE, checked: put one query vector q at every position m and one key vector k at
# every position n, and the score table `score[m, n] = rope(q, m) · rope(k, n)` must be constant along
# each diagonal (m - n fixed), for any pair of positions, in both conventions and at any even head size.

# %%
def score_table(rope: RotaryEmbedding, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[P, P]: q placed at every position m, k at every position n, their dot product after rotation."""
    P = rope.max_positions
    return rope(q.expand(P, -1)) @ rope(k.expand(P, -1)).T


torch.manual_seed(3)
for hs in (2, 8, 64):
    for convention in ("halves", "pairs"):
        s = score_table(RotaryEmbedding(hs, 48, convention=convention), torch.randn(hs), torch.randn(hs))
        worst = max((s.diagonal(d) - s.diagonal(d)[0]).abs().max().item() for d in range(-47, 48))
        print(f"hs={hs:2d} {convention:6s}: q·k depends only on m - n (48 positions), within 1e-4: {worst < 1e-4}")

# %% [markdown]
# The two conventions are different functions of the same vector, and the same function once the
# channels are reordered; and Hugging Face's own `apply_rotary_pos_emb` agrees with ours:

# %%
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

rope_h, rope_p = RotaryEmbedding(8, 16), RotaryEmbedding(8, 16, convention="pairs")
x = torch.randn(1, 2, 16, 8)  # (B, nh, T, hs)
order = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])
print("pairs == halves on the same x:", torch.allclose(rope_p(x), rope_h(x)))
print("pairs == halves on reordered channels, within 1e-6:",
      torch.allclose(rope_p(x)[..., order], rope_h(x[..., order]), atol=1e-6))
cos2, sin2 = rope_h.cos.repeat(1, 2), rope_h.sin.repeat(1, 2)  # HF keeps [T, hs]: the angles twice
hf_q, _ = apply_rotary_pos_emb(x, x, cos2[None], sin2[None])
print("halves == transformers' apply_rotary_pos_emb, within 1e-6:", torch.allclose(rope_h(x), hf_q, atol=1e-6))

# %% [markdown]
# An odd head size has a channel with no partner, and is refused:

# %%
try:
    RotaryEmbedding(7, 16)
except ValueError as e:
    print(e)

# %% [markdown]
# ## 4. Grouped-query attention: fewer key and value heads
#
# Generating a token reads the whole KV cache of every layer (appendix 90 measures why that matters:
# decoding one sequence is limited by memory reads, not arithmetic). Its size is, for each layer, keys and values (2) of every
# batch row, key/value head, position and channel:
#
# `bytes = 2 · n_layer · B · n_kv_head · T · hs · bytes per number`
#
# **Multi-query attention** (Shazeer 2019) gives all query heads a single key head and a single value
# head; **grouped-query attention** (Ainslie et al. 2023) takes the middle way: `n_kv_head` key/value
# heads, each shared by a group of `n_head // n_kv_head` consecutive query heads. Llama 2 70B (64
# query heads) and Llama 3 8B (32 query heads) both use 8 key/value heads. The queries keep all their
# heads. The cache shrinks by `n_head / n_kv_head`, and so do the key and value projections W_k and
# W_v, their parameters and the arithmetic they cost; W_q and the output projection stay as they were.

# %%
# Your turn - Exercise 10.4 (★☆☆, predict): the size of a KV cache.
def my_prediction() -> int:
    """A decoder with 2 layers, 8 query heads and 2 key/value heads of size 16, in float32, has
    processed 10 positions of one sequence. How many bytes does its KV cache hold?"""
    ### BEGIN SOLUTION
    return 2 * 2 * 1 * 2 * 10 * 16 * 4
    ### END SOLUTION


check_predict_kv_bytes(my_prediction)

# %% [markdown]
# Chapter 04's Exercise 4.7 wrote the sharing itself: query head h reads key/value head
# h // (nh // nkv), so heads 0 .. g-1 share head 0, heads g .. 2g-1 head 1, and so on (g = nh // nkv).
# Here it is as a function of the package, the plain way, a copy per query head, that the teaching
# path of attention uses; the fused path below shares without copying.

# %%
#| export
def share_kv_heads(kv: torch.Tensor, n_head: int) -> torch.Tensor:
    """[B, nkv, T, hs] -> [B, nh, T, hs]: query head h reads key/value head h // (nh // nkv), so each
    group of nh // nkv consecutive query heads shares one key/value head."""
    if kv.ndim != 4 or isinstance(n_head, bool) or not isinstance(n_head, int) or n_head % kv.shape[1]:
        raise ValueError(f"share_kv_heads needs kv [B, nkv, T, hs] and n_head a multiple of nkv, got "
                         f"{tuple(kv.shape)} and n_head={n_head!r}")
    return kv.repeat_interleave(n_head // kv.shape[1], dim=1)  # (B, nh, T, hs)

# %% [markdown]
# The attention layer is chapter 04's `MultiHeadAttention`, told `n_kv_head`: its packed `qkv` is then
# C → (nh + 2·nkv)·hs, [q | k | v] with nkv key and value heads (Hugging Face's `q_proj`, `k_proj`,
# `v_proj` one under the other; `proj` is their `o_proj`). Given a `RotaryEmbedding` as `rope`, it turns
# q and k by their positions *before* the keys go into the cache: a key's angle depends only on its own
# position, which never changes, so the cache keeps turned keys and no step turns them again.
#
# `fast=True` hands everything to `F.scaled_dot_product_attention` with `enable_gqa=True`. Its fused
# kernels read each key/value head for its whole group and copy nothing; when PyTorch has to fall back
# to its plain implementation (on the CPU it does so whenever dropout is on, as in training with
# `dropout > 0`), that path repeats K and V for every query head, as `share_kv_heads` does, and the
# saving is in the cache only. `fast=False` is the teaching path: each
# key/value head repeated for its group, as `share_kv_heads` does, then chapter 03's attention, keeping
# the weights in `.last_weights`.

# %%
#| export
def kv_cache_bytes(n_layer: int, n_kv_head: int, head_size: int, n_positions: int, batch: int = 1,
                   bytes_per_number: int = 4) -> int:
    """Bytes of a KV cache: keys and values (2) of every layer, batch row, key/value head, position, channel."""
    return 2 * n_layer * batch * n_kv_head * n_positions * head_size * bytes_per_number

# %% [markdown]
# Three checks. The teaching path, written with `share_kv_heads` and chapter 03's attention, gives
# what the layer gives. The fused path (no copies) equals the teaching path (copies). And with rotary
# positions, feeding a sequence one token at a time through the cache gives what the whole sequence gives
# at once, and the cache holds turned keys.

# %%
from transformer_course.attention import causal_mask, scaled_dot_product_attention
from transformer_course.multihead import KVCache, MultiHeadAttention, merge_heads, split_heads

torch.manual_seed(4)
rope = RotaryEmbedding(8, 16)
fast = MultiHeadAttention(32, 4, bias=False, n_kv_head=2, rope=rope)
teaching = MultiHeadAttention(32, 4, bias=False, fast=False, n_kv_head=2, rope=rope)
teaching.load_state_dict(fast.state_dict())
x = torch.randn(2, 9, 32)
q, k, v = fast.qkv(x).split([32, 16, 16], dim=2)  # nh·hs query, nkv·hs key and value channels
q, k, v = rope(split_heads(q, 4)), rope(split_heads(k, 2)), split_heads(v, 2)
by_hand, _ = scaled_dot_product_attention(q, share_kv_heads(k, 4), share_kv_heads(v, 4), causal_mask(9))
by_hand = fast.proj(merge_heads(by_hand))
print(f"share_kv_heads + chapter 03's attention equals the layer, within 1e-6: {(by_hand - fast(x)).abs().max().item() < 1e-6}")
print(f"fused (enable_gqa) equals teaching, within 1e-6: {(fast(x) - teaching(x)).abs().max().item() < 1e-6}")

# %%
cache = KVCache()
steps = torch.cat([fast(x[:, t:t + 1], cache=cache) for t in range(9)], dim=1)  # one position at a time
print(f"cached, one token at a time, equals the whole sequence, within 1e-5: {(steps - fast(x)).abs().max().item() < 1e-5}")
turned_keys = rope(split_heads(fast.qkv(x)[..., 32:48], 2))  # the key channels, (B, nkv, T, hs)
print(f"the cache holds the turned keys {list(cache.k.shape)}, within 1e-6: {(cache.k - turned_keys).abs().max().item() < 1e-6}")
print(f"teaching path's weights: {list(teaching(x).shape)} output, {list(teaching.last_weights.shape)} weights")

# %% [markdown]
# The memory saved, computed and measured. Two models of the same width and depth, one with a key/value
# head per query head and one with 2 for 8, each fill their cache with 64 positions; `KVCache.nbytes`
# counts the bytes of the tensors it holds.

# %%
from transformer_course.modern import build_gpt  # section 5 writes it; the package's copy until then

for n_kv in (8, 2, 1):
    cfg = GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=8, d_model=128, bias=False,
                    positional="rope", normalization="rmsnorm", mlp="swiglu", n_kv_head=n_kv)
    model = build_gpt(cfg).eval()
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.zeros(1, 64, dtype=torch.long), cache=cache)
    measured = sum(c.nbytes for c in cache)
    formula = kv_cache_bytes(cfg.n_layer, n_kv, cfg.head_size, 64)
    print(f"n_kv_head={n_kv}: formula {formula:>7,} bytes, measured {measured:>7,} bytes, "
          f"multi-head's cache is {kv_cache_bytes(4, 8, 16, 64) // formula}x this")

# %% [markdown]
# ## 5. One GPT class, two architectures
#
# The last cell already used it: chapter 06's `GPTConfig` has the four choices as fields, and their
# defaults are GPT-2's, so every earlier chapter builds exactly the model it built before.
#
# | field | GPT-2 (default) | Llama-style |
# |---|---|---|
# | `normalization` | `"layernorm"` | `"rmsnorm"` |
# | `mlp` | `"plain"` (4C, `activation`) | `"swiglu"` (`d_ff`, default 8C/3 rounded) |
# | `positional` | `"learned"` (or `"sinusoidal"`) | `"rope"` (`rope_base`) |
# | `n_kv_head` | None (one per query head) | a divisor of `n_head` |
#
# There is no second model: chapter 06's `GPT(cfg, parts=(embedding, blocks, final_norm))` runs any
# embedding, any list of blocks and any final norm it is given, and chapter 05's `TransformerBlock`
# already takes the pieces that differ: `make_norm=` (a function C -> norm module) for `ln1` and `ln2`,
# `mlp=` (a module, or None for its own GELU MLP), `n_kv_head=` and `rope=` for its attention (see
# `help(TransformerBlock)`). Chapter 02's `InputEmbedding` takes `positional=None` for a model without a
# position code. The KV cache, `generate`, training and checkpoints work unchanged: they only call
# `model(idx, cache=...)`.
#
# ### Your turn: assemble the modern decoder
#
# Write `modern_parts(cfg)`: the embedding, the `nn.ModuleList` of `cfg.n_layer` blocks and the final
# norm of the model `cfg` describes, for any `GPTConfig` (GPT-2's, a Llama-style one, or any mix of the
# four choices). No recipe this time: the table above says what each field asks for. One design rule:
# the rotary tables exist once per model, so all blocks share a single `RotaryEmbedding`. The check
# builds `GPT(cfg, parts=modern_parts(cfg))` for four configs, compares its parameter names and shapes
# with the package's assembly, loads the package's values into yours and compares the logits; it names
# what is missing. From here on, every model of the chapter is built by your `modern_parts`, with your
# `RMSNorm` and your rotation inside.

# %%
#| export
def make_norm(normalization: str, d_model: int, eps: float, bias: bool = False, fast: bool = True) -> nn.Module:
    """RMSNorm(C, eps) for "rmsnorm", chapter 05's LayerNorm(C, eps, bias, fast) for "layernorm"."""
    choice(normalization, "normalization", ("layernorm", "rmsnorm"))
    return RMSNorm(d_model, eps) if normalization == "rmsnorm" else LayerNorm(d_model, eps=eps, bias=bias, fast=fast)

# %%
#| export
# Your turn - Exercise 10.5 (★★★, build): the modern decoder, assembled.
def modern_parts(cfg: GPTConfig) -> tuple[InputEmbedding, nn.ModuleList, nn.Module]:
    """`GPT`'s embedding, blocks and final norm for ``cfg``: chapter 05's blocks with this chapter's
    parts as the config asks; the blocks share one `RotaryEmbedding` (one cos/sin table per model)."""
    ### BEGIN SOLUTION
    rope = RotaryEmbedding(cfg.head_size, cfg.block_size, cfg.rope_base) if cfg.positional == "rope" else None
    embed = InputEmbedding(cfg.vocab_size, cfg.d_model, cfg.block_size, None if rope else cfg.positional, cfg.dropout)

    def norm(C: int) -> nn.Module:
        return make_norm(cfg.normalization, C, cfg.eps, cfg.bias, cfg.fast)

    blocks = nn.ModuleList(TransformerBlock(
        cfg.d_model, cfg.n_head, cfg.dropout, cfg.bias, cfg.norm, cfg.activation, cfg.fast, cfg.eps, d_ff=cfg.d_ff,
        n_kv_head=cfg.n_kv_head, rope=rope, make_norm=norm,
        mlp=SwiGLU(cfg.d_model, cfg.d_ff, cfg.bias, cfg.dropout) if cfg.mlp == "swiglu" else None,
    ) for _ in range(cfg.n_layer))
    return embed, blocks, norm(cfg.d_model)
    ### END SOLUTION

# %%
modern_parts = check_modern_parts(modern_parts).use

# %%
#| export
def build_gpt(cfg: GPTConfig) -> GPT:
    """Chapter 06's `GPT` with this chapter's parts: any `GPTConfig`, GPT-2's or a Llama-style one."""
    return GPT(cfg, parts=modern_parts(cfg))

# %% [markdown]
# GPT-2 and a Llama-style decoder of the same width and depth, built by one class. The parameter count
# worked out from the config matches the module; the Llama-style one is smaller, even with an output
# head of its own (`tie_weights=False`), because its key and value projections have a quarter of the
# width and it has no position table and no biases:

# %%
from transformer_course.model import count_parameters

base = dict(vocab_size=65, block_size=64, n_layer=4, n_head=8, d_model=96)
gpt2_style = GPTConfig(**base)
llama_style = GPTConfig(**base, bias=False, positional="rope", normalization="rmsnorm", mlp="swiglu", n_kv_head=2,
                        tie_weights=False, eps=1e-6)
for name, cfg in (("GPT-2 style", gpt2_style), ("Llama style", llama_style)):
    model = build_gpt(cfg)
    assert model.num_parameters() == count_parameters(cfg)
    print(f"{name}: {model.num_parameters():,} parameters, block: {type(model.blocks[0]).__name__}")
print(build_gpt(llama_style).blocks[0])

# %% [markdown]
# `generate` (chapter 07) works on both; with the cache it gives the tokens it gives without, and the
# logits of a cached forward pass are those of a full one:

# %%
from transformer_course.generation import generate

torch.manual_seed(5)
for name, cfg in (("GPT-2 style", gpt2_style), ("Llama style", llama_style)):
    model = build_gpt(cfg).eval()
    prompt = torch.randint(0, 65, (2, 5))
    cached = generate(model, prompt, 20, temperature=0)
    same = torch.equal(cached, generate(model, prompt, 20, temperature=0, use_cache=False))
    cache = model.new_cache()
    with torch.no_grad():
        model(cached[:, :12], cache=cache)
        step, _ = model(cached[:, 12:], cache=cache)
        full, _ = model(cached)
    close = (step - full[:, 12:]).abs().max().item() < 1e-5
    print(f"{name}: greedy tokens with cache == without: {same}; cached logits == recomputed, within 1e-5: {close}")

# %% [markdown]
# ## 6. Parity with the real thing: Hugging Face's Llama
#
# As chapter 08 did for GPT-2, a loader reads the weights of a Hugging Face `LlamaForCausalLM` into our
# `GPT`. The names map one to one (`q_proj`, `k_proj`, `v_proj` → `attn.qkv` one under the other, `gate_proj` → `mlp.gate`, `down_proj` →
# `mlp.proj`, `input_layernorm` → `ln1`, ...), nothing is transposed (Llama uses `nn.Linear`), and
# the head is either tied to the embedding or stored (`tie_word_embeddings`). Options our model does
# not have are refused by name rather than silently ignored. The proof runs offline, on a small random
# Llama built by `transformers` (2 layers, width 64, 4 query heads, 2 key/value heads, a vocabulary of
# 256), whose weights are all drawn at random so that any mix-up shows.

# %%
#| export llama
# Load Hugging Face `LlamaForCausalLM` weights into the course's `GPT` (exported from chapter 10).
# Llama is chapter 10's modern decoder: RMSNorm, SwiGLU, rotary positions in the split-halves convention,
# grouped-query attention, no biases. Its tensors are `nn.Linear` weights [out, in] like ours, so the
# loader renames and copies; it refuses, naming the option, what our model does not compute: rope
# scaling, biases, another activation, a head size other than d_model // n_head, other architectures.
import os
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from transformer_course import modern  # modern.build_gpt, not a bare build_gpt: the notebook keeps section 5's
from transformer_course.config import GPTConfig
from transformer_course.model import GPT

_LAYER = {  # Hugging Face's name inside model.layers.{i} -> ours inside blocks.{i}
    "input_layernorm.weight": "ln1.weight",
    "self_attn.q_proj.weight": "attn.q",  # q, k, v: one under the other in attn.qkv.weight
    "self_attn.k_proj.weight": "attn.k",
    "self_attn.v_proj.weight": "attn.v",
    "self_attn.o_proj.weight": "attn.proj.weight",
    "post_attention_layernorm.weight": "ln2.weight",
    "mlp.gate_proj.weight": "mlp.gate.weight",
    "mlp.up_proj.weight": "mlp.up.weight",
    "mlp.down_proj.weight": "mlp.proj.weight",
}
_OUTSIDE = {"model.embed_tokens.weight": "embed.token.weight", "model.norm.weight": "ln_f.weight",
            "lm_head.weight": "lm_head.weight"}


def make_llama_stand_in(vocab_size: int = 256, hidden_size: int = 64, n_layer: int = 2, n_head: int = 4,
                        n_kv_head: int = 2, intermediate_size: int = 176, max_positions: int = 128,
                        seed: int = 0, std: float = 0.1, **config):
    """A small random Hugging Face `LlamaForCausalLM` (eval mode) to test the loader without the network.

    Every weight is drawn from N(0, std), the RMSNorm gains from N(1, std). Extra ``config`` fields go
    to `LlamaConfig`. Needs `transformers`.
    """
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        raise ImportError("make_llama_stand_in needs transformers: pip install 'transformer-course[pretrained]'") from e
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=n_layer,
                      num_attention_heads=n_head, num_key_value_heads=n_kv_head,
                      intermediate_size=intermediate_size, max_position_embeddings=max_positions, **config)
    model = LlamaForCausalLM(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1.0 if name.endswith("norm.weight") else 0.0) + std * torch.randn(p.shape, generator=gen))
    return model


def _rope_type(hf: Mapping) -> tuple[str, float]:
    """(rope type, base) from transformers 5's ``rope_parameters`` or 4's ``rope_scaling``/``rope_theta``."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    kinds = (params.get("rope_type"), scaling.get("rope_type"), scaling.get("type"))
    kind = next((k for k in kinds if k not in (None, "default")), "default")
    return kind, float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def config_from_llama(hf: Mapping) -> GPTConfig:
    """Our `GPTConfig` for a Hugging Face Llama config (``config.to_dict()`` or config.json)."""
    arch = hf.get("architectures") or ["LlamaForCausalLM"]
    if hf.get("model_type") != "llama" or arch != ["LlamaForCausalLM"]:
        raise ValueError(f"this loader reads LlamaForCausalLM checkpoints, got model_type={hf.get('model_type')!r}, "
                         f"architectures={arch}: other architectures differ in ways it does not handle")
    kind, base = _rope_type(hf)
    if kind != "default":
        raise ValueError(f"rope scaling {kind!r} is not supported: RotaryEmbedding uses the plain speeds "
                         "base^(-2i/hs); load a checkpoint without rope_scaling")
    for option in ("attention_bias", "mlp_bias"):
        if hf.get(option):
            raise ValueError(f"{option}=True is not supported: the course's Llama-style blocks have no biases there")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={hf['hidden_act']!r} is not supported: SwiGLU uses silu")
    C, nh = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, C // nh):
        raise ValueError(f"head_dim={hf['head_dim']} is not supported: "
                         f"our heads have d_model // n_head = {C // nh} channels")
    return GPTConfig(vocab_size=hf["vocab_size"], block_size=hf["max_position_embeddings"],
                     n_layer=hf["num_hidden_layers"], n_head=nh, d_model=C, bias=False, positional="rope",
                     tie_weights=bool(hf.get("tie_word_embeddings", False)), eps=float(hf["rms_norm_eps"]),
                     normalization="rmsnorm", mlp="swiglu", n_kv_head=hf.get("num_key_value_heads") or nh,
                     d_ff=hf["intermediate_size"], rope_base=base)


def convert_llama_state_dict(state: Mapping[str, torch.Tensor], cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """Hugging Face Llama tensors -> our `GPT`'s state dict (float32). Unknown or missing names are errors."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        layer = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
        if name.endswith("rotary_emb.inv_freq"):
            continue  # older checkpoints store RoPE's speeds; we compute them (RotaryEmbedding)
        if layer and layer[2] in _LAYER:
            out[f"blocks.{layer[1]}.{_LAYER[layer[2]]}"] = tensor.to(torch.float32)
        elif name in _OUTSIDE:
            out[_OUTSIDE[name]] = tensor.to(torch.float32)
        else:
            raise ValueError(f"unexpected tensor {name!r} in the checkpoint: not a weight of LlamaForCausalLM "
                             "without biases (attention_bias / mlp_bias)")
    if cfg.tie_weights:
        head, embed = out.pop("lm_head.weight", None), out.get("embed.token.weight")
        if head is not None and embed is not None and not torch.equal(head, embed):
            raise ValueError("tie_word_embeddings=True but lm_head.weight differs from embed_tokens.weight: "
                             "the config does not describe these weights")
        out["lm_head.weight"] = embed
    expected = {f"blocks.{i}.{ours}" for i in range(cfg.n_layer) for ours in _LAYER.values()} | set(_OUTSIDE.values())
    missing = sorted(expected - {k for k, v in out.items() if v is not None})
    if missing:
        why = ("tie_word_embeddings=True takes the output layer from model.embed_tokens.weight" if cfg.tie_weights
               else "tie_word_embeddings=False needs lm_head.weight")
        raise ValueError(f"missing tensors in the checkpoint: {missing[:4]}{' ...' if len(missing) > 4 else ''}"
                         + (f" ({why})" if {"lm_head.weight", "embed.token.weight"} & set(missing) else ""))
    for i in range(cfg.n_layer):  # chapter 04's packed projection: [q | k | v]
        out[f"blocks.{i}.attn.qkv.weight"] = torch.cat([out.pop(f"blocks.{i}.attn.{p}") for p in "qkv"])
    return out


def load_hf_llama(source) -> GPT:
    """Our `GPT`, in eval mode, holding a Hugging Face Llama: a `LlamaForCausalLM` object, or a local
    folder with config.json and model.safetensors (or pytorch_model.bin). A folder that cannot be loaded
    raises chapter 08's `HFCheckpointError` (a ValueError) naming the file and the key or field."""
    if isinstance(source, (str, os.PathLike)):
        from transformer_course import pretrained as hf

        folder = Path(source)
        sizes = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "intermediate_size", "max_position_embeddings", "head_dim")
        cfg = hf.hf_config(config_from_llama, hf.read_hf_config(folder, sizes), folder)
        hf.check_hf_fits(modern.build_gpt, cfg, folder)  # before reading or allocating anything
        state, model = hf.read_hf_state_dict(folder), modern.build_gpt(cfg)
        hf.load_hf_weights(model, lambda: convert_llama_state_dict(state, cfg), folder)
        return model.eval()
    if not (hasattr(source, "config") and hasattr(source, "state_dict")):
        raise TypeError(f"load_hf_llama takes a LlamaForCausalLM or a folder, got {type(source).__name__}")
    cfg = config_from_llama(source.config.to_dict())
    model = modern.build_gpt(cfg)
    model.load_state_dict(convert_llama_state_dict(source.state_dict(), cfg))
    return model.eval()

# %% [markdown]
# The stand-in, loaded; then the residual stream after the embedding and after every block, and the
# logits, compared with Hugging Face's own forward pass. (Hugging Face's last "hidden state" is taken
# after the final norm, so ours gets `ln_f` there too.)

# %%
from transformer_course.llama import config_from_llama, load_hf_llama, make_llama_stand_in
from transformer_course.pretrained import block_outputs

hf = make_llama_stand_in()
ours = build_gpt(config_from_llama(hf.config.to_dict()))  # section 5's build_gpt: your modern_parts
ours.load_state_dict(load_hf_llama(hf).state_dict())  # the loader's weights (the package's assembly)
print(ours.cfg)
idx = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(6))
with torch.no_grad():
    theirs = hf(idx, output_hidden_states=True)
    stream = block_outputs(ours, idx)
    stream[-1] = ours.ln_f(stream[-1])
    logits, _ = ours(idx)
for i, (a, b) in enumerate(zip(stream, theirs.hidden_states, strict=True)):
    print(f"hidden state {i}: within 1e-5: {(a - b).abs().max().item() < 1e-5}")
print(f"logits {list(logits.shape)}: within 1e-5: {(logits - theirs.logits).abs().max().item() < 1e-5}")

# %% [markdown]
# And generation: greedy decoding with our cached loop gives the tokens of `transformers`' `generate`.

# %%
prompt = idx[:, :4]
mine = generate(ours, prompt, 16, temperature=0)
with torch.no_grad():
    reference = hf.generate(prompt, max_new_tokens=16, do_sample=False, attention_mask=torch.ones_like(prompt))
print("greedy tokens identical:", torch.equal(mine, reference))

# %% [markdown]
# Everything above ran on your code. Counting the calls during one more forward pass and one generation
# (the counters are forward hooks on the model's norms and rotary embeddings, whose class is this
# notebook's `RotaryEmbedding`, turning q and k with your `rotate_halves`):

# %%
calls = {"RMSNorm": 0, "RotaryEmbedding": 0}


def count(name):
    def hook(module, inputs, output):
        calls[name] += 1
    return hook


hooks = [m.register_forward_hook(count(type(m).__name__)) for m in ours.modules()
         if type(m) in (RMSNorm, RotaryEmbedding)]
with torch.no_grad():
    ours(idx)
generate(ours, prompt, 4, temperature=0)
for hook in hooks:
    hook.remove()
print("the model's norms are this notebook's RMSNorm (yours if 10.1 passed):",
      all(type(m) is RMSNorm for m in (ours.blocks[0].ln1, ours.blocks[0].ln2, ours.ln_f)))
print("its rotation is this notebook's (your rotate_halves if 10.3 passed):",
      type(ours.blocks[0].attn.rope) is RotaryEmbedding and ROPE_CONVENTIONS["halves"] is rotate_halves)
print("calls in one forward pass and a 4-token generation:", calls)

# %% [markdown]
# Options our model does not compute are refused by name:

# %%
good = hf.config.to_dict()
changes = {
    "rope scaling": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
    "attention bias": {"attention_bias": True},
    "another architecture": {"model_type": "mistral", "architectures": ["MistralForCausalLM"]},
}
for name, change in changes.items():
    try:
        config_from_llama({**good, **change})
    except ValueError as e:
        print(f"{name}: {e}")

# %% [markdown]
# ## 7. Your turn: Mistral's sliding window
#
# The first Mistral 7B (v0.1) added one more change: each query attends to at most the last `window`
# positions (itself included; 4,096 there), not to the whole past. Later Mistral 7B releases, from
# v0.2 on, dropped it for full attention over a longer context, so a sliding window is a choice, not
# part of every modern decoder. Information still travels further, one window per layer, but the
# attention cost of each new token and the KV cache stop growing with the context.
#
# **Your turn (extend).** Write `sliding_window_mask(T, window, past=0)`: bool [T, past + T], True
# where new query t (at position past + t) may attend key j: j ≤ past + t (causal) and
# past + t - j < window. With `window` ≥ past + T it is chapter 04's `causal_mask_with_past`.

# %%
# Your turn - Exercise 10.6 (★★☆, extend): Mistral's sliding-window mask.
def sliding_window_mask(T: int, window: int, past: int = 0) -> torch.Tensor:
    """Bool [T, past + T]: query t (position past + t) may attend key j when 0 <= past + t - j < window."""
    ### BEGIN SOLUTION
    query = torch.arange(past, past + T)[:, None]  # (T, 1): the new queries' positions
    key = torch.arange(past + T)[None, :]  # (1, past + T)
    distance = query - key
    return (distance >= 0) & (distance < window)  # (T, past + T)
    ### END SOLUTION


check_sliding_window_mask(sliding_window_mask)

# %% [markdown]
# ### A cache that stops growing
#
# With a window, a generated token never looks further back than `window` positions, so a cache that
# keeps more is memory spent on keys no query will read. Mistral 7B v0.1 keeps a fixed **rolling
# buffer** of `window` positions per layer instead: its cache is the same size at token 100,000 as at
# token 4,096.
#
# **Your turn (extend, ★★★).** Design `RollingKVCache(window)`, a cache that `MultiHeadAttention`
# accepts in place of chapter 04's `KVCache` when a sequence is fed one token at a time, as in
# generation. What the attention layer asks of a cache (read its `forward`): `cache.length` and
# `cache.update(k, v)`. Here:
#
# - `update(k, v)` gets the new position's key and value, [B, nkv, 1, hs], already turned by their
#   position, and returns the keys and values that position's query may attend, [B, nkv, S, hs];
# - `length` is what the attention layer reads it as;
# - what the cache keeps between calls must not grow with the sequence.
#
# There is no recipe: the design is the exercise. The check feeds keys that carry their position,
# measures what your cache holds after 12 and after 24 positions, and runs it inside chapter 04's
# attention with rotary positions and two key/value heads, one token at a time, against the whole
# sequence under the sliding-window mask.

# %%
# Your turn - Exercise 10.7 (★★★, extend): a rolling KV cache.
class RollingKVCache:
    """A KV cache for a sliding window of `window` positions, fed one position per update.

    update(k, v): k, v [B, nkv, 1, hs] -> keys, values [B, nkv, S, hs] the new query may attend.
    length: see MultiHeadAttention.forward. What it keeps does not grow with the sequence.
    """

    def __init__(self, window: int) -> None:
        ### BEGIN SOLUTION
        self.window, self.length = window, 0  # length: positions seen, the next one's position
        self.k = self.v = None  # (B, nkv, window, hs) each, made at the first update
        ### END SOLUTION

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ### BEGIN SOLUTION
        if self.k is None:
            self.k = k.new_zeros(*k.shape[:2], self.window, k.shape[3])  # (B, nkv, window, hs)
            self.v = v.new_zeros(self.k.shape)
        slot = self.length % self.window  # once full, the slot of the oldest position
        self.k[:, :, slot], self.v[:, :, slot] = k[:, :, 0], v[:, :, 0]
        self.length += 1
        held = min(self.length, self.window)
        # slot order, not position order: one query's softmax sums over its keys in any order,
        # and each key was turned by its own position before it came in
        return self.k[:, :, :held], self.v[:, :, :held]  # (B, nkv, held, hs)
        ### END SOLUTION


rolling = check_rolling_kv_cache(RollingKVCache)

# %% [markdown]
# With your cache in every layer of the Llama-style model of section 5 (random weights), greedy
# decoding one token at a time. A window as long as the context changes nothing: the tokens are
# `generate`'s. A window of 16 holds a quarter of what chapter 04's cache holds at the 64th token, and
# would hold the same at any length (this model's rotation table stops at 64 positions).

# %%
def greedy_rolling(model, first_token: torch.Tensor, n_new: int, window: int):
    """Greedy decoding from one token [B, 1], one position per step, a RollingKVCache per layer."""
    caches = [RollingKVCache(window) for _ in model.blocks]
    idx = first_token
    with torch.no_grad():
        for _ in range(n_new):
            logits, _ = model(idx[:, -1:], cache=caches)  # (B, 1, V)
            idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)  # (B, T + 1)
    return idx, caches


def held_bytes(cache) -> int:
    """Bytes of the tensors a cache keeps in its attributes."""
    return sum(t.untyped_storage().nbytes() for t in vars(cache).values() if isinstance(t, torch.Tensor))


if rolling.passed:
    torch.manual_seed(7)
    windowed = build_gpt(llama_style).eval()
    first = torch.randint(0, 65, (2, 1))
    tokens, _ = greedy_rolling(windowed, first, 63, window=64)
    same = torch.equal(tokens, generate(windowed, first, 63, temperature=0))
    print("window = context, the tokens of generate:", same)
    _, caches = greedy_rolling(windowed, first, 63, window=16)
    full = windowed.new_cache()
    with torch.no_grad():
        windowed(tokens, cache=full)
    print(f"bytes held at token 64: rolling caches (window 16) {sum(map(held_bytes, caches)):,}, "
          f"chapter 04's {sum(c.nbytes for c in full):,}")
else:
    print("pass Exercise 10.7 to generate with your cache")

# %% [markdown]
# ## 8. Does it matter?
#
# Every check so far says the parts are *correct*; none says they are *better*. To find out,
# `benchmarks/bench_modern.py` trains six models of chapter 06's tiny shape on Shakespeare with
# chapter 06's recipe, each for the same wall time on one CPU thread, from the same seeds and on the
# same batches: GPT-2 style, Llama style, and GPT-2 style with one modern part added at a time. Equal
# time, not equal steps, because that is what a person with one machine can spend: a part that
# learns more per step but makes each step slower has to earn its cost. They also have (nearly) equal
# parameter counts: rotary positions drop the position table and two key/value heads instead of four
# drop a quarter of the attention weights, so those models get a wider MLP (the `d_ff` column) to
# make up the difference.
#
# Training all six twice takes about eight minutes, too long for a notebook, so the cell below reads
# the results the script stored on the machine it names. Run `python benchmarks/bench_modern.py` in
# the course's folder to measure your own.

# %%
# NBVAL_IGNORE_OUTPUT
# (read from a file that `python benchmarks/bench_modern.py` rewrites on the machine it runs on)
import json
from pathlib import Path

stored = Path("../benchmarks/results/modern.json")
ablation = json.loads(stored.read_text()) if stored.is_file() else None  # a copy of the notebook alone has none
if ablation is None:
    print(f"no stored results at {stored}: run `python benchmarks/bench_modern.py` in the course's folder "
          "(about eight minutes), then run this cell again")
else:
    meta, labels, seeds = ablation["meta"], ablation["labels"], ablation["meta"]["seeds"]
    runs = {(r["model"], r["seed"]): r for r in ablation["runs"]}
    print(f"{meta['machine']}, torch {meta['torch']}, {meta['threads']} thread, {meta['seconds']:g} s per run, "
          f"seeds {seeds}\n")
    final = {m: sum(runs[m, s]["val_loss"] for s in seeds) / len(seeds) for m in labels}
    w = max(map(len, labels.values()))
    print(f"{'model':{w}s} {'parameters':>10s} {'steps':>13s} {'val loss':>9s} {'vs GPT-2 style':>15s}")
    for m, label in labels.items():
        steps = " / ".join(str(runs[m, s]["steps"]) for s in seeds)
        vs = "" if m == "gpt2" else f"{final[m] - final['gpt2']:+.3f}"
        print(f"{label:{w}s} {runs[m, seeds[0]]['parameters']:10,} {steps:>13s} {final[m]:9.3f} {vs:>15s}")

# %% [markdown]
# The validation curves of the same runs (solid: first seed, dashed: second), against the wall time
# they were given and against the steps they made in it:

# %%
# NBVAL_IGNORE_OUTPUT
# (drawn from the same stored file; nothing to draw without it)
if ablation is not None:
    fig, (by_time, by_step) = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for i, (m, label) in enumerate(labels.items()):
        for s, style in zip(seeds, ("-", "--"), strict=False):
            r = runs[m, s]  # from the first evaluation on: step 0's loss (ln 76) would flatten the plot
            kw = dict(color=f"C{i}", ls=style, label=label if s == seeds[0] else None)
            by_time.plot(r["eval_seconds"][1:], r["val_curve"][1:], **kw)
            by_step.plot(r["eval_step"][1:], r["val_curve"][1:], **kw)
    by_time.set(xlabel="wall time (s)", ylabel="validation loss (nats)", title="Equal wall time")
    by_step.set(xlabel="step", title="The same runs by step")
    for style, seed in zip(("-", "--"), ("first seed", "second seed"), strict=False):
        by_step.plot([], [], color="grey", ls=style, label=seed)  # what solid and dashed mean
    by_time.legend(fontsize=8)
    by_step.legend(fontsize=8)
    plt.show()

# %% [markdown]
# **What the numbers show, and what they cannot.** In the stored run one part stands out: rotary
# positions. Both models that have them end well below the GPT-2 style model, by several times the
# spread between seeds, and they are ahead at equal steps as well (the last column of
# `benchmarks/results/modern.md`), although they made fewer steps: a learned position table starts as
# noise and has to be learned from the data, while a rotation tells every head the distance between
# two tokens from the first step. RMSNorm, SwiGLU and grouped-query attention on their own end within
# a few hundredths of the GPT-2 style model, some ahead and some behind. At equal steps they are level
# or slightly ahead, but the chapter's modern blocks make fewer steps in the same time on this CPU
# (the steps column), and at equal wall time that cost counts.
#
# Read them with care. Each model has 0.8 M parameters and trained for half a minute, two seeds each,
# on a CPU other programs were using: the two seeds of one model already end up to a few hundredths
# apart, so a smaller difference between models is not evidence of anything. Nothing here says what
# happens at scale either: the papers behind these parts measured them on far larger models trained far
# longer. And grouped-query attention was never meant to lower the loss: it gives up a little quality
# for a much smaller KV cache (section 4). What the experiment does show is how to ask the question
# fairly: one change at a time, equal parameters, equal time, the same data, more than one seed, and
# a look at both the time axis and the step axis.

# %% [markdown]
# ## Bad input gets a clear message

# %%
bad_calls = {
    "n_head not divisible by n_kv_head": lambda: GPTConfig(65, 64, 2, n_head=6, d_model=96, n_kv_head=4),
    "odd head size with RoPE": lambda: GPTConfig(65, 64, 2, n_head=4, d_model=36, positional="rope"),
    "post-norm with modern parts": lambda: GPTConfig(65, 64, 2, 4, 64, norm="post", normalization="rmsnorm"),
    "past the rotary table": lambda: RotaryEmbedding(8, 16)(torch.zeros(1, 1, 4, 8), start=14),
    "chapter 06's GPT alone, with RMSNorm": lambda: GPT(GPTConfig(65, 64, 2, 4, 64, normalization="rmsnorm")),
}
for name, call in bad_calls.items():
    try:
        call()
    except ValueError as e:
        print(f"{name}: {e}")

# %% [markdown]
# ## Quick check

# %%
from transformer_course.quiz import Question, quiz

quiz([
    Question("What does RMSNorm leave out of LayerNorm?",
             ["The division by a spread", "The subtraction of the mean (and the shift β)", "The learned gain"],
             answer=1, explain="RMSNorm divides by the root mean square and multiplies by a gain; nothing is centred."),
    Question("Why does a SwiGLU MLP use a hidden width of about 8C/3 instead of 4C?",
             ["SiLU needs fewer units than GELU", "It has three matrices, so 3·C·H = 2·C·4C keeps the parameter count",
              "To make the head size even"],
             answer=1, explain="Three C×H matrices of width 8C/3 hold as many numbers as two of width 4C."),
    Question("With rotary positions, what does the score of a query at position m and a key at n depend on?",
             ["Only on m", "On m and n separately", "On the two vectors and m - n only"],
             answer=2, explain="Turning both by their angles leaves a dot product that sees only the difference of the angles."),
    Question("A model has 32 query heads and 8 key/value heads. What shrinks, and by how much?",
             ["The KV cache, 4x", "The number of query heads, 4x", "The parameters of the MLP, 4x"],
             answer=0, explain="Keys and values are stored per key/value head: 8 instead of 32 (W_k and W_v "
                               "shrink 4x too)."),
])

# %% [markdown]
# ## Summary
#
# - **RMSNorm** divides each token's vector by its root mean square and multiplies by a gain: LayerNorm
#   without the centring and the shift. You wrote it; it equals `torch.nn.RMSNorm` to 1e-6.
# - **SwiGLU** multiplies one widening of the token by SiLU of another (a learned product, not a 0-1
#   gate); with three matrices, the hidden width 8C/3 keeps the parameters of GPT-2's 4C MLP.
# - **RoPE** turns each head's query and key pairs by angles p·θ_i, θ_i = base^(-2i/hs) (you fixed a
#   table that got the exponent wrong, and wrote the rotation); the scores then depend only on the
#   distance between positions, checked for every pair of 48 positions. Hugging Face's Llama pairs
#   split halves, the paper neighbours: the same rotation on reordered channels. The cos/sin tables are
#   made once per model, and the cache keeps turned keys.
# - **Grouped-query attention** shares each key/value head among a group of query heads; at
#   `n_kv_head == n_head` it is chapter 04's attention, and the KV cache (and W_k, W_v) shrink by
#   n_head / n_kv_head, by the formula and as measured. PyTorch's fused kernels share without copying.
# - One `GPT` class builds GPT-2 and a Llama-style decoder from `GPTConfig`, with the parts your
#   `modern_parts` assembles; the cache and `generate` work for both, and a Hugging Face
#   `LlamaForCausalLM`'s weights, loaded into your assembly, give its hidden states and logits within
#   1e-5 and the same greedy tokens, on your RMSNorm and your rotation (counted).
# - **Sliding windows** (Mistral 7B v0.1): each query sees the last `window` positions (your mask), and
#   a cache of fixed size serves them one token at a time (the cache you designed): at window 16 it
#   held a quarter of what chapter 04's cache holds at the 64th token.
# - **Does it matter?** Six models of equal size trained for equal time, one modern part at a time
#   (`benchmarks/bench_modern.py`, stored results): how to compare architectures fairly, and why half a
#   minute on a CPU with two seeds can show a trend but not settle it.
#
# Exported to `transformer_course/modern.py`: `RMSNorm`, `swiglu_hidden`, `SwiGLU`, `rope_frequencies`,
# `rotate_halves`, `rotate_pairs`, `RotaryEmbedding`, `share_kv_heads`, `kv_cache_bytes`, `make_norm`,
# `modern_parts`, `build_gpt` (grouped-query attention is chapter 04's `MultiHeadAttention(n_kv_head=...)`,
# the block chapter 05's `TransformerBlock`); and to `transformer_course/llama.py`: `make_llama_stand_in`,
# `config_from_llama`, `convert_llama_state_dict`, `load_hf_llama`.
