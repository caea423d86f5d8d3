# %% [markdown]
# # Chapter 05: the transformer block
#
# A GPT is one unit repeated many times: the **transformer block**. This chapter builds it from the
# pieces you already have and the three it still needs:
#
# - **`LayerNorm`**, written from scratch and matched against PyTorch's;
# - **`FeedForward`**, the small two-layer network applied to every position, with ReLU or GELU;
# - **residual connections** and the **`TransformerBlock`** itself, with the normalisation placed
#   before each sublayer (GPT-2, "pre-norm") or after it (the 2017 paper, "post-norm").
#
# By the end you will be able to count a block's parameters from a formula, explain why residual
# connections let gradients reach the bottom of a deep stack (and measure it), and spot a bug that
# appears in two of the sources this course was written from.
#
# **You build it.** You write LayerNorm's formula, the block's forward pass and the probe that
# measures gradients in a deep stack, each before the chapter shows code for it; when your version
# passes its check, the rest of the chapter runs on it. You also fix a mistyped GELU, predict a
# block's size, and extend the chapter with the parallel block of GPT-J and PaLM.
#
# **Needs:** `MultiHeadAttention` from chapter 04 (which uses chapter 03's attention).
# **Exports:** `transformer_course/block.py`.

# %%
#| default_exp block

# %%
import copy
import math

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from IPython.display import display
from torch import nn

from transformer_course.checks.block import (
    check_gelu_tanh,
    check_input_gradient_norms,
    check_layer_norm,
    check_parallel_block,
    check_predict_block_parameters,
    check_transformer_block,
)

torch.set_printoptions(precision=4)
_ = torch.manual_seed(0)

# %%
#| export
"""The transformer block: layer normalisation, the position-wise feed-forward network, and the
residual block around them and chapter 04's multi-head attention, [B, T, C] -> [B, T, C].

Shapes: B batch, T time, C = d_model channels, d_ff the feed-forward width (4C by default), nh heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.arguments import choice, real_number, whole_number
from transformer_course.attention import check_input
from transformer_course.multihead import KVCache, MultiHeadAttention

NORMS = ("pre", "post")  # where the LayerNorm sits: GPT-2 (pre) or the 2017 paper (post)
ACTIVATIONS = ("relu", "gelu", "gelu_tanh")  # 2017 paper, exact GELU, GPT-2's tanh approximation

# %% [markdown]
# ## 1. The block at a glance
#
# A block has two **sublayers**. Attention lets every position gather information from the earlier
# positions; the feed-forward network then transforms each position on its own. Each sublayer is
# wrapped the same way: normalise, transform, and *add the result back* to what came in. In GPT-2's
# arrangement:
#
# ```
#  x ─┬─► LN1 ─► attention ─►(+)─┬─► LN2 ─► feed-forward ─►(+)─► out
#     └───────────────────────────┘└──────────────────────────┘
#         residual connection          residual connection
# ```
#
# The output has the input's shape `[B, T, C]`, which is what lets us stack blocks.
#
# Our running example is the small batch from source 0 (the text "The sun dipped below the
# horizon, painting the sky with hues"): two sequences of six tokens, each token already embedded
# with its position as a 4-number vector, so `[B, T, C] = [2, 6, 4]`.

# %%
x_seed = torch.tensor([
    [[0.4553, 0.3277, 0.4210, 0.6628], [0.0874, 0.3216, 0.2850, 0.1438],   # The, sun
     [0.8880, 0.2221, 0.6271, 0.8234], [0.9180, 0.8070, 0.4281, 0.1977],   # dipped, below
     [0.4874, 0.9018, 0.4258, 0.1630], [0.0441, 0.1988, 0.6751, 0.8757]],  # the, horizon
    [[0.9347, 0.9255, 0.6341, 0.0567], [0.7656, 0.2911, 0.6161, 0.0123],   # ",", painting
     [0.4200, 0.3295, 0.1863, 0.7694], [0.3197, 0.9724, 0.6066, 0.2184],   # the, sky
     [0.4521, 0.9276, 0.3951, 0.1281], [0.7899, 0.7894, 0.2245, 0.2889]],  # with, hues
])
print("x_seed:", tuple(x_seed.shape), "= [B, T, C]")

# %% [markdown]
# ## 2. Layer normalisation
#
# Deep networks train badly when the scale of the numbers flowing through them drifts from layer to
# layer. Layer normalisation resets the scale **of each token vector separately**: take the C
# numbers of one token, compute their mean $\mu$ and variance $\sigma^2$, and map each number to
#
# $$y = \gamma \odot \frac{x - \mu}{\sqrt{\sigma^2 + \varepsilon}} + \beta .$$
#
# After the division the token's numbers have mean 0 and variance 1. Two learned vectors of length C,
# the *gain* $\gamma$ (starts at 1) and the *bias* $\beta$ (starts at 0), then let the network choose
# another scale and offset per channel if that helps. The small $\varepsilon = 10^{-5}$ keeps the
# division finite for a token whose numbers are all equal ($\sigma = 0$).
#
# Source 2 draws tokens as the *columns* of a `[C, T]` matrix and so says "per column"; in our
# `[B, T, C]` layout a token is a row, and we normalise over the last dimension. Nothing mixes
# tokens or batch items (unlike batch normalisation), so the layer behaves the same in training and
# when generating one sequence at a time.
#
# A worked example, the token "The" = (0.4553, 0.3277, 0.4210, 0.6628), with γ = 1 and β = 0:
#
# | step | value |
# |---|---|
# | mean μ | 1.8668 / 4 = 0.4667 |
# | x − μ | (−0.0114, −0.1390, −0.0457, 0.1961) |
# | variance σ² (mean of the squares, divided by C = 4) | 0.0600 / 4 = 0.0150 |
# | √(σ² + ε) | √0.01501 = 0.1225 |
# | normalised | (−0.0931, −1.1346, −0.3730, 1.6007) |
#
# The normalised numbers have mean 0; their variance is 0.9993, just short of 1, because this token's
# own variance is small enough that the ε under the square root is not entirely negligible.
#
# Note the variance divides by C, the number of values (the "biased" variance). Dividing by C − 1, as
# statistics courses (and `torch.var`'s default) do for a sample, gives 0.0600 / 3 = 0.0200 here: for
# C = 4 a visible difference, and not what `nn.LayerNorm` or GPT-2 compute.

# %% [markdown]
# Now the module. It takes input of any shape `[..., C]`; the block that holds it checks its input
# once, at its entry (a layer inside a model does not re-check what the model already checked).
#
# `LayerNorm` has two paths with the same parameters. The fast one (the default) hands everything to
# PyTorch's `F.layer_norm`. The teaching path, `fast=False`, is yours to write: the formula above,
# step by step, on an input `x [..., C]` of any number of leading dimensions.
#
# - The mean and the variance are taken over the last dimension only, one token at a time; keep that
#   dimension (size 1) so that they broadcast against `x`: shapes [..., 1].
# - The variance divides by C, and ε (`self.eps`) goes inside the square root.
# - Then scale by `self.weight` (γ, [C]) and shift by `self.bias` (β, [C]), which is `None` when the
#   module was built with `bias=False`.
#
# Do not change `x` in place. The check compares your path with PyTorch's on ordinary tokens, on a token
# whose numbers are all equal, with another ε and without a bias.

# %%
#| export
# Your turn - Exercise 5.1 (★☆☆, build): LayerNorm's formula, step by step.
class LayerNorm(nn.Module):
    """Layer normalisation over the last dimension (Ba, Kiros and Hinton, 2016): [..., C] -> [..., C].

    ``y = (x - mean) / sqrt(var + eps) * weight + bias``, the variance divided by C, as in
    ``nn.LayerNorm`` and GPT-2. ``bias=False``: no β (``bias`` is None). ``fast=True`` calls
    ``F.layer_norm``; ``fast=False`` computes the formula step by step (same parameters and result).
    """

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True, fast: bool = True):
        super().__init__()
        self.d_model = whole_number(d_model, "d_model")
        self.fast = fast
        self.eps = real_number(eps, "eps", low=0.0, low_open=True, hint="GPT-2 uses 1e-5")
        self.weight = nn.Parameter(torch.ones(d_model))  # γ [C]
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None  # β [C]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fast:
            return F.layer_norm(x, (self.d_model,), self.weight, self.bias, self.eps)  # (..., C)
        ### BEGIN SOLUTION
        mean = x.mean(dim=-1, keepdim=True)  # (..., 1)
        centred = x - mean  # (..., C)
        var = centred.pow(2).mean(dim=-1, keepdim=True)  # (..., 1), divides by C
        y = centred / torch.sqrt(var + self.eps) * self.weight  # (..., C)
        return y if self.bias is None else y + self.bias
        ### END SOLUTION

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}, bias={self.bias is not None}, fast={self.fast}"

# %%
LayerNorm = check_layer_norm(LayerNorm).use

# %% [markdown]
# From here on `LayerNorm` is your class if it passed (the package's otherwise), and every block of
# the chapter is built from it. First the worked example, on the teaching path:

# %%
worked = torch.tensor([-0.0931, -1.1346, -0.3730, 1.6007])  # the table above
got = LayerNorm(4, fast=False)(x_seed)[0, 0].detach()
print("'The' normalised:", got)
print("equal to the worked example within 1e-4:", torch.allclose(got, worked, atol=1e-4))

# %% [markdown]
# Our module against PyTorch's `nn.LayerNorm`, with random gains and biases so that γ and β are
# really tested, on the seed batch and on a larger batch of wilder numbers:

# %%
def paired_layer_norms(C: int, seed: int = 0):
    """Our LayerNorm and nn.LayerNorm with the same random γ and β."""
    ours, ref = LayerNorm(C, fast=False), nn.LayerNorm(C)  # the step-by-step formula
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p_ours, p_ref in ((ours.weight, ref.weight), (ours.bias, ref.bias)):
            p_ours.copy_(torch.randn(C, generator=g))
            p_ref.copy_(p_ours)
    return ours, ref

ours, ref = paired_layer_norms(4)
x_wild = 3.0 + 10.0 * torch.randn(8, 32, 64, generator=torch.Generator().manual_seed(1))
ours64, ref64 = paired_layer_norms(64)
for name, a, b in (("seed batch", ours(x_seed), ref(x_seed)), ("[8, 32, 64]", ours64(x_wild), ref64(x_wild))):
    diff = (a - b).abs().max().item()
    print(f"{name:12s} equal to nn.LayerNorm within 1e-5: {diff < 1e-5}")  # float32, any CPU's kernels
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)

# %% [markdown]
# That was the teaching path, `fast=False`: four separate operations (mean, centre, variance,
# scale), each a pass over the data with its own intermediate tensor, and as many again in the
# backward pass. The default, `fast=True`, hands the same formula and the same parameters to
# PyTorch's fused `F.layer_norm`, which makes one pass. Chapter 06 trains with it; the two agree in
# the output and in every gradient:

# %%
teach, fused = LayerNorm(64, fast=False), LayerNorm(64)
fused.load_state_dict(ours64.state_dict())
teach.load_state_dict(ours64.state_dict())
x_a = x_wild.clone().requires_grad_(True)
x_b = x_wild.clone().requires_grad_(True)
upstream = torch.randn(x_wild.shape, generator=torch.Generator().manual_seed(3))
for module, xi in ((teach, x_a), (fused, x_b)):
    (module(xi) * upstream).sum().backward()
pairs = {"output": (teach(x_wild), fused(x_wild)), "dL/dx": (x_a.grad, x_b.grad),
         "dL/dγ": (teach.weight.grad, fused.weight.grad), "dL/dβ": (teach.bias.grad, fused.bias.grad)}
for name, (a, b) in pairs.items():
    relative = ((a - b).abs().max() / b.abs().max()).item()  # a few 1e-7: rounding, in a different order
    print(f"{name:7s} teaching and fused agree to within a millionth of the largest entry: {relative < 1e-6}")
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)

# %% [markdown]
# ### Source 2 puts ε in the wrong place
#
# Source 2 writes the normalisation as $(x - \mu) / (\sigma + \varepsilon)$. PyTorch, TensorFlow
# and GPT-2 all use $(x - \mu) / \sqrt{\sigma^2 + \varepsilon}$. The correct output is
# $(\sigma + \varepsilon) / \sqrt{\sigma^2 + \varepsilon}$ times source 2's: almost exactly 1 when the
# token's spread $\sigma$ is much larger than $\sqrt{\varepsilon} \approx 0.003$, and far below 1 when
# it is not.

# %%
def source2_factor(sigma, eps=1e-5):
    """Correct LayerNorm output / source 2's, for a token of standard deviation sigma (γ = 1, β = 0)."""
    return (sigma + eps) / torch.sqrt(sigma**2 + eps)

spreads = x_seed.std(dim=-1, correction=0)  # [B, T]: each token's σ
correct = LayerNorm(4, fast=False)(x_seed).detach()
source2 = correct / source2_factor(spreads)[..., None]  # what source 2's formula gives
gap = (source2 - correct).abs().max().item()
print(f"seed batch (token spreads {spreads.min().item():.2f} to {spreads.max().item():.2f}): largest difference {gap:.1e}")
for spread in (1.0, 0.1, 0.01, 0.003, 0.001):
    print(f"token spread {spread:<6}: the correct output is {source2_factor(torch.tensor(spread)).item():.4f} x source 2's")

# %% [markdown]
# On the seed batch the error is a few times $10^{-4}$: small, but hundreds of times the $10^{-6}$
# we demand of a re-implementation, so a model trained with one formula and run with the other
# drifts. For tokens whose numbers are nearly equal the two disagree by a factor of 3 or more. The
# picture shows the factor against the spread:

# %%
sigmas = torch.logspace(-5, 0, 200)
factor = source2_factor(sigmas)  # correct output / source 2's
fig, ax = plt.subplots(figsize=(6, 3))
ax.semilogx(sigmas, factor)
ax.axvline(1e-5**0.5, color="grey", ls=":", label="σ = √ε ≈ 0.003")
ax.set_xlabel("token's standard deviation σ")
ax.set_ylabel("correct / source 2's")
ax.set_title("How far source 2's LayerNorm is from the real one")
ax.legend()
plt.show()

# %% [markdown]
# ## 3. The feed-forward network
#
# After attention has mixed information *between* positions, each position is processed on its own
# by a small two-layer network: widen the C numbers to a hidden width $d_{ff}$, apply a nonlinearity,
# and project back to C:
#
# $$\mathrm{FFN}(x) = \mathrm{proj}(\,\mathrm{act}(\mathrm{fc}(x))\,).$$
#
# The same weights are used at every position ("position-wise"). The hidden width is four times
# C in the 2017 paper (512 → 2048), in GPT-2 (768 → 3072) and in our sources (source 0: 4 → 16;
# source 3: 64 → 256). Most of a block's parameters live here.
#
# One correction to source 3, which says the network's input and output are "attention scores":
# they are not. The attention weights stay inside the attention sublayer; what reaches the
# feed-forward network is each token's C-number vector (the input plus attention's contribution).

# %%
#| export
_ACTIVATION_LAYERS = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,  # exact: x * Φ(x), Φ the standard normal CDF (via erf)
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # GPT-2's approximation ("gelu_new" in HF)
}


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``proj(act(fc(x)))``: [..., C] -> [..., d_ff] -> [..., C].

    ``fc`` widens C -> d_ff (default 4C, as in the 2017 paper and GPT-2), ``proj`` narrows back;
    ``dropout`` applies to the output (GPT-2's residual dropout).
    """

    def __init__(self, d_model: int, d_ff: int | None = None, activation: str = "gelu",
                 dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.d_model = whole_number(d_model, "d_model")
        self.d_ff = 4 * d_model if d_ff is None else whole_number(d_ff, "d_ff")
        self.activation = choice(activation, "activation", ACTIVATIONS)
        real_number(dropout, "dropout", low=0.0, high=1.0, high_open=True)
        self.fc = nn.Linear(d_model, self.d_ff, bias=bias)
        self.act = _ACTIVATION_LAYERS[activation]()
        self.proj = nn.Linear(self.d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc(x))  # (..., d_ff)
        return self.dropout(self.proj(h))  # (..., C)

# %% [markdown]
# Source 0's network on source 0's batch (4 → 16 → 4, ReLU), and source 3's size (64 → 256 → 64).
# The parameter count is two weight matrices plus two bias vectors: $2 \cdot C \cdot 4C + 4C + C$.

# %%
for C in (4, 64):
    ffn = FeedForward(C, activation="relu")
    counted = sum(p.numel() for p in ffn.parameters())
    formula = 2 * C * 4 * C + 4 * C + C
    print(f"C={C:3d}: fc {tuple(ffn.fc.weight.shape)}, proj {tuple(ffn.proj.weight.shape)}, "
          f"{counted:,} parameters (formula {formula:,})")
    assert counted == formula
ffn = FeedForward(4, activation="relu")
print("seed batch:", tuple(x_seed.shape), "->", tuple(ffn(x_seed).shape))

# %% [markdown]
# "Position-wise" is a checkable claim: change one token and only that token's output changes.

# %%
x_changed = x_seed.clone()
x_changed[0, 3] += 1.0  # change the token "below"
moved = (ffn(x_changed) - ffn(x_seed)).abs().amax(dim=-1).detach()  # [B, T]: how much each output moved
print("largest change per position:\n", moved)
assert moved[0, 3] > 0 and moved.flatten().count_nonzero() == 1

# %% [markdown]
# ### The activation: ReLU and GELU
#
# ReLU, $\max(0, x)$, has a corner at 0 and passes no gradient for negative inputs. GELU (Hendrycks
# and Gimpel, 2016) weights each input by the probability that a standard normal variable falls
# below it: $\mathrm{GELU}(x) = x\,\Phi(x) = \tfrac{x}{2}\left(1 + \mathrm{erf}(x/\sqrt{2})\right)$.
# It is smooth, close to ReLU far from 0, and dips slightly below zero for negative inputs. GPT-2
# computed it with a cheaper tanh formula,
# $\tfrac{x}{2}\left(1 + \tanh\!\left(\sqrt{2/\pi}\,(x + 0.044715\,x^3)\right)\right)$.
# The exact formula written out, against PyTorch:

# %%
def gelu_exact(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))

xs = torch.linspace(-6, 6, 2001, dtype=torch.float64)
print("exact formula: equal to PyTorch's GELU within 1e-12 (float64):", (gelu_exact(xs) - F.gelu(xs)).abs().max().item() < 1e-12)
print(f"GELU's minimum: {gelu_exact(xs).min().item():.4f} at x = {xs[gelu_exact(xs).argmin()].item():.2f}")

# %% [markdown]
# ### Spot the bug: GPT-2's GELU, typed in a hurry
#
# Here is the tanh formula as someone typed it. It runs, and its curve has the right general shape:
# zero at 0, close to x for large x, close to 0 for very negative x.

# %%
def gelu_tanh_with_a_bug(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh approximation of GELU, elementwise (same shape as x)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 * math.pi) * (x + 0.044715 * x**3)))

# %% [markdown]
# But compared with PyTorch's `F.gelu(x, approximate="tanh")` it is far off, and it is too close to
# ReLU: its dip below zero is a third as deep, and at x = 1 it gives almost 1.

# %%
buggy, right = gelu_tanh_with_a_bug(xs), F.gelu(xs, approximate="tanh")
gap = (buggy - right).abs()
print("equal to PyTorch's tanh GELU within 1e-6:", gap.max().item() < 1e-6)
# the gap is the same at -x and x (an even function), so either may come out first: name both
print(f"largest gap {gap.max().item():.3f} at x = ±{xs[gap.argmax()].abs().item():.2f}")
print(f"minimum: {buggy.min().item():.4f} (PyTorch's: {right.min().item():.4f})")
one = torch.tensor(1.0, dtype=torch.float64)
print(f"at x = 1: {gelu_tanh_with_a_bug(one).item():.4f} (PyTorch's: {F.gelu(one, approximate='tanh').item():.4f})")

# %%
# Your turn - Exercise 5.2 (★☆☆, debug): fix GPT-2's tanh GELU.
def my_gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh approximation of GELU, elementwise (same shape as x): the cell above, fixed."""
    ### BEGIN SOLUTION
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    ### END SOLUTION


gelu_tanh = check_gelu_tanh(my_gelu_tanh).use

# %% [markdown]
# A wrong constant inside the tanh changes how fast the curve turns from 0 to x, and nothing crashes;
# only a comparison with a trusted implementation finds it. With the formula fixed (yours, if it
# passed), the two GELUs and ReLU:

# %%
print(f"exact vs tanh: largest gap {(gelu_exact(xs) - gelu_tanh(xs)).abs().max().item():.1e}")
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
for name, y in (("ReLU", F.relu(xs)), ("GELU (exact)", gelu_exact(xs)), ("GELU (tanh)", gelu_tanh(xs))):
    ax1.plot(xs, y, label=name, ls="--" if "tanh" in name else "-")
ax1.set_xlim(-4, 3)
ax1.set_ylim(-0.5, 3)
ax1.legend()
ax1.set_title("activations")
ax2.plot(xs, gelu_exact(xs) - gelu_tanh(xs))
ax2.set_title("exact GELU minus tanh GELU")
plt.show()

# %% [markdown]
# The two GELUs differ by less than $5 \cdot 10^{-4}$: irrelevant when training from scratch, but
# when we load GPT-2's trained weights (chapter 08) we must use the formula it was trained with, so
# `FeedForward` offers both (`"gelu"`, `"gelu_tanh"`) as well as `"relu"`.

# %% [markdown]
# ## 4. Residual connections
#
# A residual (or skip) connection computes $y = x + f(x)$: the sublayer $f$ proposes a *change* to
# its input instead of replacing it. Its derivative is $\partial y / \partial x = I + \partial f /
# \partial x$, so during backpropagation the gradient arriving at $y$ reaches $x$ directly, plus
# whatever $f$ adds.
#
# Source 0 says the addition "distributes the gradient equally" to its two inputs. Equal, yes, but
# not shared out: an addition hands the *whole* incoming gradient to each input.

# %%
a = torch.tensor(2.0, requires_grad=True)
b = torch.tensor(-1.0, requires_grad=True)
(a + b).backward(torch.tensor(5.0))  # incoming gradient 5
print(f"gradient at a: {a.grad.item()}, at b: {b.grad.item()} (copied, not halved)")

# %% [markdown]
# Source 4 makes the argument for depth: the derivative of $f(f(\dots f(x)))$ is the product of
# the derivatives of every step, so if each factor is below 1 the product shrinks geometrically.
# Twenty steps of $f(h) = \tfrac12\tanh(h)$, whose slope is at most ½, against twenty steps of
# $h + \tfrac12 \tanh(h)$, whose slope is at least 1:

# %%
def chain_gradient(step, depth=20, x0=0.3):
    x = torch.tensor(x0, requires_grad=True)
    h = x
    for _ in range(depth):
        h = step(h)
    h.backward()
    return x.grad.item()

print(f"plain:    d out / d x = {chain_gradient(lambda h: 0.5 * torch.tanh(h)):.3g}")
print(f"residual: d out / d x = {chain_gradient(lambda h: h + 0.5 * torch.tanh(h)):.3g}")

# %% [markdown]
# The plain chain passes back a millionth of the gradient. The residual chain keeps it (here it
# even grows, because every step's slope is above 1; section 7 looks at the real block).
#
# ## 5. The block, two ways
#
# The 2017 paper puts the normalisation *after* the residual addition ("Add & Norm", sources 3
# and 4): `x = LN(x + sublayer(x))`, and so did GPT-1's code. GPT-2 moved it to the *input* of each
# sublayer, `x = x + sublayer(LN(x))`, and added one more LayerNorm after the last block (`ln_f`,
# chapter 06).
# With pre-norm the residual stream itself is never normalised inside the stack: there is a clean
# identity path from the top of the network to the bottom. (Source 2 says a softmax follows the
# last block; what follows is that final LayerNorm, then the output layer; the softmax comes only
# at the very end, on the logits.)
#
# `TransformerBlock` supports both through `norm="pre"` (the default) or `norm="post"`. Dropout, when
# used, sits at the end of each sublayer (inside attention's and the feed-forward's output).
#
# The constructor below builds the four parts, `self.ln1`, `self.attn` (chapter 04's
# `MultiHeadAttention`), `self.ln2` and `self.mlp` (the `FeedForward` above). Its forward pass is yours:
# given `x [B, T, C]`, follow `self.norm` ("pre" or "post") and return `[B, T, C]`. The attention
# sublayer also receives the optional `mask` and `cache` arguments: pass both on to `self.attn` (as
# `mask=` and `cache=`), so that padding masks and chapter 07's KV cache work through the block. The
# check builds blocks whose two LayerNorms hold different values, so it notices which one you use
# where.

# %%
#| export
# Your turn - Exercise 5.3 (★★☆, build): the block's forward pass, pre-norm and post-norm.
class TransformerBlock(nn.Module):
    """One decoder block, [B, T, C] -> [B, T, C]: causal self-attention, then the feed-forward
    network, each in a residual connection with a LayerNorm.

    ``norm="pre"`` (GPT-2):        ``x = x + attn(ln1(x))``,  ``x = x + mlp(ln2(x))``
    ``norm="post"`` (2017 paper):  ``x = ln1(x + attn(x))``,  ``x = ln2(x + mlp(x))``

    ``mask`` (bool, broadcastable to [B, nh, T, T_total]) and ``cache`` go to the attention.
    Chapter 10's parts plug in by keyword: ``make_norm(d_model)`` builds ``ln1`` and ``ln2`` (default:
    this chapter's LayerNorm), ``mlp`` replaces the FeedForward (of width ``d_ff``, default 4C),
    ``n_kv_head`` and ``rope`` go to the attention.
    """

    def __init__(self, d_model: int, n_head: int, dropout: float = 0.0, bias: bool = True,
                 norm: str = "pre", activation: str = "gelu", fast: bool = True, eps: float = 1e-5,
                 *, d_ff: int | None = None, n_kv_head: int | None = None, rope: nn.Module | None = None,
                 make_norm=None, mlp: nn.Module | None = None):
        super().__init__()
        self.d_model = whole_number(d_model, "d_model")
        self.norm = choice(norm, "norm", NORMS)
        make_norm = make_norm or (lambda C: LayerNorm(C, eps=eps, bias=bias, fast=fast))
        self.ln1 = make_norm(d_model)
        self.attn = MultiHeadAttention(d_model, n_head, dropout=dropout, bias=bias, causal=True, fast=fast,
                                       n_kv_head=n_kv_head, rope=rope)
        self.attn.checks_input = False  # forward checks x; the attention trusts it
        self.checks_input = True  # False once an owner (chapter 06's GPT) checks the input
        self.ln2 = make_norm(d_model)
        self.mlp = mlp if mlp is not None else FeedForward(d_model, d_ff, activation, dropout, bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, cache: KVCache | None = None) -> torch.Tensor:
        if self.checks_input:
            check_input(x, self.d_model, "TransformerBlock")
        ### BEGIN SOLUTION
        if self.norm == "pre":
            x = x + self.attn(self.ln1(x), mask=mask, cache=cache)  # (B, T, C)
            x = x + self.mlp(self.ln2(x))  # (B, T, C)
        else:
            x = self.ln1(x + self.attn(x, mask=mask, cache=cache))  # (B, T, C)
            x = self.ln2(x + self.mlp(x))  # (B, T, C)
        return x
        ### END SOLUTION

    def extra_repr(self) -> str:
        return f"norm={self.norm!r}"

# %%
TransformerBlock = check_transformer_block(TransformerBlock).use

# %% [markdown]
# Source 0's block on source 0's batch: 4 channels, 2 heads of size 2.

# %%
torch.manual_seed(0)
block = TransformerBlock(d_model=4, n_head=2)
print(block)
with torch.no_grad():
    out = block(x_seed)
print("in", tuple(x_seed.shape), "-> out", tuple(out.shape))
print("output for 'horizon':", out[0, 5])

# %% [markdown]
# Is it right? PyTorch ships an independent implementation of the same block,
# `nn.TransformerEncoderLayer`, where `norm_first=True` is pre-norm and `norm_first=False` is
# post-norm. Its attention packs the query, key and value weights as `[q | k | v]` like ours, so we
# can copy our weights into it and compare outputs under a causal mask, for both placements.

# %%
def as_torch_layer(block: TransformerBlock, n_head: int) -> nn.TransformerEncoderLayer:
    """PyTorch's encoder layer holding a copy of ``block``'s weights (exact GELU, no dropout)."""
    layer = nn.TransformerEncoderLayer(
        block.d_model, n_head, dim_feedforward=block.mlp.d_ff, dropout=0.0, activation="gelu",
        layer_norm_eps=block.ln1.eps, batch_first=True, norm_first=block.norm == "pre")
    theirs_to_ours = {"self_attn.in_proj_": "attn.qkv.", "self_attn.out_proj.": "attn.proj.",
                      "linear1.": "mlp.fc.", "linear2.": "mlp.proj.", "norm1.": "ln1.", "norm2.": "ln2."}
    ours = block.state_dict()
    layer.load_state_dict({t + p: ours[o + p] for t, o in theirs_to_ours.items() for p in ("weight", "bias")})
    return layer.eval()  # load_state_dict is strict: every one of its 12 tensors came from the block

# %%
x = torch.randn(3, 10, 32, generator=torch.Generator().manual_seed(3))
future = ~torch.ones(10, 10, dtype=torch.bool).tril()  # PyTorch's convention: True = may NOT attend
for norm in ("pre", "post"):
    torch.manual_seed(4)
    block32 = TransformerBlock(32, n_head=4, norm=norm)
    with torch.no_grad():  # random γ and β, so the two norms are really tested
        for ln in (block32.ln1, block32.ln2):
            ln.weight.normal_(1.0, 0.2)
            ln.bias.normal_(0.0, 0.2)
    ref_out = as_torch_layer(block32, n_head=4)(x, src_mask=future)
    diff = (block32(x) - ref_out).abs().max().item()
    print(f"norm={norm}: equal to nn.TransformerEncoderLayer within 1e-5: {diff < 1e-5}")
    assert diff < 1e-5

# %% [markdown]
# Causality survives the block: changing the last token leaves every earlier output unchanged.

# %%
x2 = x.clone()
x2[:, -1] += 1.0
moved = (block32(x2) - block32(x)).abs().amax(dim=(0, 2)).detach()  # [T]
print("largest change per position:", moved)
assert (moved[:-1] == 0).all() and moved[-1] > 0

# %% [markdown]
# When generating text (chapter 07) the model sees one new token at a time and keeps earlier keys
# and values in chapter 04's `KVCache`. The block passes the cache to its attention; feeding the
# tokens one by one through a cache must give what the full sequence gives.

# %%
from transformer_course.multihead import KVCache

for norm in ("pre", "post"):
    torch.manual_seed(5)
    blk = TransformerBlock(32, n_head=4, norm=norm).eval()
    cache = KVCache()
    steps = torch.cat([blk(x[:, t:t + 1], cache=cache) for t in range(x.shape[1])], dim=1)
    diff = (steps - blk(x)).abs().max().item()
    print(f"norm={norm}: token by token with a cache = all at once within 1e-5: {diff < 1e-5}; cache holds {cache.length} positions")
    assert diff < 1e-5

# %% [markdown]
# ### Counting parameters
#
# How big is a block? Every parameter sits in one of six places: `attn.qkv` (C → 3C) and `attn.proj`
# (C → C), `mlp.fc` (C → 4C) and `mlp.proj` (4C → C), and the two LayerNorms, each with a gain γ and a
# bias β of C numbers. A Linear from n_in to n_out holds n_in · n_out weights and, with biases, n_out
# biases. Work it out before the next cells count it for you.

# %%
# Your turn - Exercise 5.4 (★☆☆, predict): the size of one GPT-2 small block.
def my_prediction() -> int:
    """Parameters in TransformerBlock(d_model=768, n_head=12) with biases (GPT-2 small's block)?"""
    ### BEGIN SOLUTION
    return 12 * 768**2 + 13 * 768
    ### END SOLUTION


check_predict_block_parameters(my_prediction)

# %% [markdown]
# <details><summary><b>The count, once you have answered</b> (click to open)</summary>
#
# For width C (any number of heads, since the heads split C between them):
#
# | part | weights | biases |
# |---|---|---|
# | attention `qkv` (C → 3C) and `proj` (C → C) | $4C^2$ | $4C$ |
# | feed-forward `fc` (C → 4C) and `proj` (4C → C) | $8C^2$ | $5C$ |
# | two LayerNorms (γ, β) | $2C$ | $2C$ |
#
# In total $12C^2 + 13C$, or $12C^2 + 2C$ with `bias=False`. For GPT-2 small (C = 768) that is
# 7,087,872 per block, and GPT-2 small has 12 blocks. Two thirds of a block's weights are in the
# feed-forward network.
#
# </details>

# %%
#| export
def block_parameter_count(d_model: int, bias: bool = True) -> int:
    """Number of parameters in ``TransformerBlock(d_model, n_head, bias=bias)`` for any ``n_head``.

    12 C² + 13 C with biases, 12 C² + 2 C without (the LayerNorms keep their gains).
    """
    C, b = whole_number(d_model, "d_model"), (1 if bias else 0)
    attention = C * 3 * C + b * 3 * C + C * C + b * C  # qkv and proj
    feed_forward = C * 4 * C + b * 4 * C + 4 * C * C + b * C  # fc and proj
    layer_norms = 2 * (C + b * C)  # ln1 and ln2: gain and bias each
    return attention + feed_forward + layer_norms

# %%
for C, nh, where in ((4, 2, "source 0"), (64, 4, "source 3"), (768, 12, "GPT-2 small")):
    for bias in (True, False):
        counted = sum(p.numel() for p in TransformerBlock(C, nh, bias=bias).parameters())
        formula = block_parameter_count(C, bias=bias)
        print(f"{where:12s} C={C:3d} bias={bias!s:5}: module {counted:>9,}  formula {formula:>9,}")
        assert counted == formula == 12 * C * C + (13 if bias else 2) * C

# %% [markdown]
# The 2017 paper's base model (its Table 3; source 4 quotes the first two numbers) has 6 layers in
# the encoder and 6 in the decoder, 8 heads, C = 512, a feed-forward width of 2048 = 4C, ReLU and
# biases. Its encoder layer is exactly our post-norm block with `activation="relu"`, and holds
# 3,152,384 parameters; a decoder layer adds the cross-attention of chapter 09.

# %%
paper_layer = TransformerBlock(512, n_head=8, norm="post", activation="relu")
paper_count = sum(p.numel() for p in paper_layer.parameters())
print(f"one encoder layer of the paper's base model: {paper_count:,} parameters; six of them: {6 * paper_count:,}")
assert paper_count == block_parameter_count(512) == 3_152_384

# %% [markdown]
# ### Dropout
#
# Every module in this course takes a `dropout` probability, off by default. Dropout (Srivastava et
# al., 2014) fights overfitting: during training, each number passing through an `nn.Dropout(p)` is
# set to zero with probability p, independently, and the survivors are multiplied by `1/(1 - p)`,
# so that the expected value of every number is unchanged. In evaluation mode (`module.eval()`) it
# does nothing at all, so a trained model computes the same output every time.

# %%
drop = nn.Dropout(p=0.1)  # a fresh module is in training mode
ones = torch.ones(100_000)
torch.manual_seed(0)
dropped = drop(ones)
share_zeroed = (dropped == 0).float().mean().item()
survivors = dropped[dropped != 0]
print("training mode: share set to zero within 0.005 of p = 0.1:", abs(share_zeroed - 0.1) < 0.005)
print(f"training mode: every survivor is 1/(1 - p) = {1 / 0.9:.4f}:", torch.allclose(survivors, torch.full_like(survivors, 1 / 0.9)))
print("training mode: the mean stays within 0.01 of 1:", abs(dropped.mean().item() - 1) < 0.01)
drop.eval()
print("evaluation mode: the input comes back unchanged:", torch.equal(drop(ones), ones))

# %% [markdown]
# Where does it go? Source 4 says the original transformer applies dropout "after each layer norm".
# The paper says otherwise (section 5.4, "Residual Dropout"): it drops the *output of each
# sublayer*, before that output is added to the sublayer's input and normalised, and the sums of
# token embeddings and position codes (chapter 02's `InputEmbedding`), with p = 0.1 in the base
# model. That is where our block drops: at the end of `attn` (after its output projection) and of
# `mlp`, before the `x +`. Like GPT-1's code, nanoGPT and Hugging Face's GPT-2, our attention also
# drops attention weights (chapter 03's `dropout_p`); OpenAI's released GPT-2 code has no dropout at
# all. A block with dropout is random in training mode and, in evaluation mode,
# computes exactly what the same weights compute without dropout:

# %%
torch.manual_seed(3)
with_drop = TransformerBlock(32, n_head=4, dropout=0.1)
without = TransformerBlock(32, n_head=4, dropout=0.0)
without.load_state_dict(with_drop.state_dict())
x_drop = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(4))
print("training mode: two calls differ:", not torch.equal(with_drop(x_drop), with_drop(x_drop)))
_ = with_drop.eval(), without.eval()
print("evaluation mode: equal to the block without dropout:", torch.equal(with_drop(x_drop), without(x_drop)))

# %% [markdown]
# ## 6. Spot the bug: the first LayerNorm, twice
#
# Source 0's block computes the second sublayer as `x + ffwd(layer_norm1(x))`, and source 4's
# (post-norm, in Julia) applies `norm_1` after *both* sublayers. Either way the second LayerNorm
# is built and never used. What does that do?

# %% [markdown]
# We can make the bug without writing a forward pass: point the block's `ln2` at its `ln1`. The block's
# own forward then normalises both sublayers with `ln1`, which is what both sources do (for a pre-norm
# block, source 0's; for a post-norm one, source 4's).

# %%
def with_ln1_twice(block: TransformerBlock) -> TransformerBlock:
    """A copy of ``block`` with the two sources' bug: both sublayers use ln1, ln2 is never called."""
    buggy = copy.deepcopy(block)
    buggy.ln2 = buggy.ln1  # one module in both places
    return buggy

torch.manual_seed(6)
fresh = TransformerBlock(32, n_head=4)
diff = (with_ln1_twice(fresh)(x) - fresh(x)).abs().max().item()
print(f"freshly built block: buggy vs correct output differ by {diff}")

# %% [markdown]
# Not at all, on a freshly built block: both LayerNorms start with γ = 1 and β = 0, so they compute
# the same function. Any test run on an untrained model passes. The damage appears in training:
# `ln2` never receives a gradient, and `ln1`'s γ and β are pulled two ways, since one setting must
# serve both sublayers. We train the correct block and the buggy one for 50 steps on a toy
# regression task and compare.

# %%
def train_briefly(ln1_twice=False, steps=50, seed=7):
    """Train a fresh block (with the bug when ``ln1_twice``); return it, its own ln2, the input, the loss."""
    torch.manual_seed(seed)
    blk = TransformerBlock(32, n_head=4)
    own_ln2 = blk.ln2  # with the bug, built but never called
    if ln1_twice:
        blk.ln2 = blk.ln1
    g = torch.Generator().manual_seed(seed)
    xb, target = torch.randn(4, 10, 32, generator=g), torch.randn(4, 10, 32, generator=g)
    opt = torch.optim.Adam(blk.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(blk(xb), target)
        loss.backward()
        opt.step()
    return blk, own_ln2, xb, loss.item()

good, good_ln2, xb, good_loss = train_briefly()
bad, bad_ln2, _, bad_loss = train_briefly(ln1_twice=True)
print(f"after 50 steps: loss {good_loss:.4f} (correct) vs {bad_loss:.4f} (ln1 twice)")
print(f"ln2 moved from its start by: {(good_ln2.weight - 1).abs().max().item():.4f} (correct), "
      f"{(bad_ln2.weight - 1).abs().max().item():.4f} (ln1 twice)")
print(f"in the trained correct block, ln1 instead of ln2 changes the output by "
      f"{(with_ln1_twice(good)(xb) - good(xb)).abs().max().item():.4f}")

# %% [markdown]
# The loss hardly suffers on this toy task, and that is what makes the bug dangerous: nothing
# crashes and the model still learns, only it is not the model that was written down. The buggy
# model has 2C parameters that never train (its `ln2` is still exactly at its starting
# values), and once the two LayerNorms have learned different settings, swapping one for the other
# is a real change to the output: load trained weights (GPT-2's, in chapter 08) into a model with
# this bug and it no longer computes what it was trained to compute. Source 4's post-norm version has the same flaw. The lesson goes
# beyond this bug: a check at initialisation cannot tell apart modules that start out identical, so
# the tests of this chapter (and Exercise 5.3's check) give the two LayerNorms different values first.
#
# ## 7. Experiment: how much gradient reaches the bottom of a deep stack?
#
# Section 4 showed the idea on a scalar chain; now the real thing. We stack 24 freshly built blocks
# of width 64, send a fixed random gradient $g = \partial L / \partial\,\text{out}$ into the top, and
# record how large the gradient is at the input of each block, relative to $\lVert g \rVert$. Five
# variants: pre-norm and post-norm blocks as built above; the same two with the `x +` of both
# residual connections removed; and, to isolate source 4's chain-rule argument, a block with
# neither residual connections nor LayerNorms.
#
# The measuring instrument is yours to write: `input_gradient_norms(layers, x, grad_output)`. It runs
# the stack bottom to top, starting from `x`, and keeps the input of every layer: x_0 = x, x_1 = the
# output of layer 0, and so on. Then it asks autograd for dL/dx_l for every l at once, where the
# gradient arriving at the stack's output is `grad_output` (not the gradient of a sum), and returns
# the norm of each: a float tensor [len(layers)], bottom first, with no autograd history.
#
# - Start from a copy of `x` that requires gradients and is cut off from whatever made `x`.
# - Leave the layers' parameters alone: their `.grad` must stay as it was. A call to `.backward()`
#   would accumulate into every parameter's `.grad`; `torch.autograd.grad(outputs, inputs,
#   grad_outputs=...)` hands the gradients back instead of storing them.
# - The list of layers is checked for you; saying something clear when `grad_output` does not have
#   the output's shape is up to you.

# %%
#| export
# Your turn - Exercise 5.5 (★★★, build): measure the gradient reaching each layer's input.
def input_gradient_norms(layers, x: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    """Norms [len(layers)] of dL/dx_l, the gradient reaching the input x_l of each layer in a stack.

    ``layers`` (applied in order, bottom first) map x [B, T, C] to an output shaped like
    ``grad_output``, the upstream gradient dL/d(out). The layers' parameter gradients are untouched.
    """
    layers = list(layers)
    if not layers:
        raise ValueError("input_gradient_norms needs at least one layer")
    ### BEGIN SOLUTION
    h = x.detach().requires_grad_(True)
    inputs = []
    for layer in layers:
        inputs.append(h)
        h = layer(h)
    if h.shape != grad_output.shape:
        raise ValueError(f"grad_output has shape {tuple(grad_output.shape)} but the stack's output has "
                         f"shape {tuple(h.shape)}; pass one upstream gradient per output number")
    grads = torch.autograd.grad(h, inputs, grad_outputs=grad_output)
    return torch.stack([g.norm() for g in grads]).detach()
    ### END SOLUTION

# %%
input_gradient_norms = check_input_gradient_norms(input_gradient_norms).use

# %% [markdown]
# The three altered blocks need no new code: without its residual connections a block is just its
# sublayers applied one after another, in the order its norm placement says.

# %%
def no_residual(block: TransformerBlock) -> nn.Sequential:
    """The block's sublayers in a row, the two `x +` removed (this experiment only)."""
    if block.norm == "pre":
        return nn.Sequential(block.ln1, block.attn, block.ln2, block.mlp)
    return nn.Sequential(block.attn, block.ln1, block.mlp, block.ln2)


def bare(block: TransformerBlock) -> nn.Sequential:
    """Neither residual connections nor LayerNorms: attention, then the feed-forward network."""
    return nn.Sequential(block.attn, block.mlp)


VARIANTS = {  # name -> (norm placement, what becomes of each fresh block)
    "pre-norm, residual": ("pre", lambda block: block),
    "post-norm, residual": ("post", lambda block: block),
    "pre-norm, no residual": ("pre", no_residual),
    "post-norm, no residual": ("post", no_residual),
    "no residual, no LayerNorm": ("pre", bare),
}

# %%
def stack_gradients(variant, depth=24, C=64, seed=0):
    """Relative gradient norm at the input of each of ``depth`` fresh blocks, bottom first."""
    norm, alter = VARIANTS[variant]
    torch.manual_seed(seed)
    layers = [alter(TransformerBlock(C, n_head=4, norm=norm)) for _ in range(depth)]
    g = torch.Generator().manual_seed(seed + 1)
    x, grad_out = torch.randn(4, 16, C, generator=g), torch.randn(4, 16, C, generator=g)
    return input_gradient_norms(layers, x, grad_out) / grad_out.norm()

measured = {name: stack_gradients(name) for name in VARIANTS}
print(f"{'':27s}{'block 0 (bottom)':>17s}{'block 12':>10s}{'block 23 (top)':>16s}")
for name, norms in measured.items():
    print(f"{name:27s}{norms[0].item():17.3g}{norms[12].item():10.3g}{norms[23].item():16.3g}")

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
for name, norms in measured.items():
    right.semilogy(range(len(norms)), norms.clamp_min(1e-30), marker="o", ms=3, label=name)
    if "no LayerNorm" not in name:
        left.plot(range(len(norms)), norms, marker="o", ms=3, label=name)
left.set_ylim(bottom=0)
left.set_title("the four variants with LayerNorms (linear scale)")
right.set_title("all five, log scale (zeros drawn at 1e-30)")
for ax in (left, right):
    ax.set_xlabel("block (0 = bottom, nearest the embeddings)")
left.set_ylabel("‖dL/d input‖ / ‖dL/d out‖")
left.legend(fontsize=8)
plt.show()

# %% [markdown]
# Read each line from right (top) to left (bottom), the way the gradient travels:
#
# - **No residual, no LayerNorm**: the gradient must pass through all 48 sublayers' Jacobians, and
#   with PyTorch's default initialisation each one shrinks it. The product collapses to nothing
#   long before the bottom: this is source 4's $f'(x)\,f'(f(x)) \cdots$ argument in a real network.
# - **Residual connections** (pre- or post-norm) keep the gradient from shrinking on the way down
#   (at the bottom it is 0.9 to 1.7 times its size at the top): the identity path carries it past
#   every block, and each block adds its own contribution on top, which is why the pre-norm line
#   rises towards the bottom.
# - **LayerNorm without residuals** also stops the collapse at this depth, for a different reason:
#   it divides by the size of its input, so a layer that shrank its output gets its gradient scaled
#   back up. But the size now wanders from block to block (it depends on every Jacobian in the
#   chain), where the residual lines are smooth.
#
# At initialisation, and measured this way, pre- and post-norm look alike. Their difference shows
# in training. GPT-2's paper (Radford et al., 2019) moved the LayerNorm to the input of each
# sublayer "similar to a pre-activation residual network" (He et al., 2016) and gave no other
# reason. The analysis came a year later: Xiong et al. (2020, "On Layer Normalization in the
# Transformer Architecture") showed that at initialisation a post-norm stack has large gradients
# for the parameters near its output, so it needs a learning-rate warm-up to train stably, and a
# pre-norm stack does not.
#
# We can see it on a small scale. Two language models of 6 blocks (C = 64) on Shakespeare's
# characters, identical except for the norm placement, trained for 150 steps with Adam at a fixed
# learning rate of 0.01, no warm-up (about 15 seconds):

# %%
from transformer_course.data import load_shakespeare
from transformer_course.tokenization import CharTokenizer

shakespeare = load_shakespeare()[:200_000]
char_tok = CharTokenizer.from_text(shakespeare)
char_data = torch.tensor(char_tok.encode(shakespeare))


class TinyLM(nn.Module):
    """Embeddings, `depth` blocks and an output layer (plus a final LayerNorm when pre-norm): ids [B, T] -> logits [B, T, V]."""

    def __init__(self, norm, depth=6, C=64, T=32, V=char_tok.vocab_size):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.Sequential(*[TransformerBlock(C, n_head=4, norm=norm) for _ in range(depth)])
        self.ln_f = LayerNorm(C) if norm == "pre" else nn.Identity()  # post-norm already ends in a LayerNorm
        self.head = nn.Linear(C, V)

    def forward(self, idx):
        return self.head(self.ln_f(self.blocks(self.tok(idx) + self.pos(torch.arange(idx.shape[1])))))

# %%
def train_tiny(norm, steps=150, lr=1e-2):
    """Train a TinyLM with Adam at a constant learning rate; return the mean loss of the last 20 steps."""
    torch.manual_seed(0)
    model, batches = TinyLM(norm), torch.Generator().manual_seed(1)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        start = torch.randint(0, len(char_data) - 33, (16,), generator=batches)
        x, y = (torch.stack([char_data[i + o : i + o + 32] for i in start]) for o in (0, 1))
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return sum(losses[-20:]) / 20

threads = torch.get_num_threads()
torch.set_num_threads(1)  # one thread: much faster than two on a busy 2-core CPU
final_loss = {norm: train_tiny(norm) for norm in NORMS}
torch.set_num_threads(threads)
freq = torch.bincount(char_data).float() / len(char_data)  # how often each character occurs
context_free = -(freq[freq > 0] * freq[freq > 0].log()).sum().item()  # the loss of predicting by frequency alone
print(f"predicting every character by its frequency alone: loss {context_free:.2f}")
print("pre-norm ends below 2.6:", final_loss["pre"] < 2.6)
print("post-norm ends within 0.1 of the frequency-only loss:", abs(final_loss["post"] - context_free) < 0.1)

# %% [markdown]
# At this learning rate the pre-norm model learns; the post-norm one, from the same start, gets
# stuck at the level of a model that ignores the context. With a warm-up or a smaller learning
# rate the post-norm model trains too (try `lr=1e-3`): the difference is how much care it needs,
# one reason why most decoders since GPT-2 put the norm first.
#
# Explore depth and variants yourself (the widget draws when you change a control; below it, the
# view for 8 bare blocks):

# %%
def plot_stack_gradients(variant, depth, ax=None):
    norms = stack_gradients(variant, depth)
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    ax.semilogy(range(depth), norms.clamp_min(1e-30), marker="o", ms=3, label="‖dL/dx‖ at the block's input")
    ax.set_xlabel("block (0 = bottom)")
    ax.set_ylabel("relative gradient norm (log)")
    ax.set_title(f"{depth} blocks: {variant}")
    ax.legend(fontsize=8)
    return norms

def gradient_explorer():
    variant = widgets.Dropdown(options=list(VARIANTS), description="block")
    depth = widgets.IntSlider(value=12, min=2, max=32, description="depth")
    out = widgets.Output()
    def update(_=None):
        with out:
            out.clear_output(wait=True)
            plot_stack_gradients(variant.value, depth.value)
            plt.show()
    for w in (variant, depth):
        w.observe(update, names="value")
    return widgets.VBox([widgets.HBox([variant, depth]), out])

# %%
display(gradient_explorer())  # move the controls to draw
norms = plot_stack_gradients("no residual, no LayerNorm", 8)  # one view, stored with the notebook
plt.show()
print("relative gradient at each block, bottom first:", norms)

# %% [markdown]
# ## 8. Stretch: the parallel block
#
# Our block runs its two sublayers one after the other: the feed-forward network reads what attention
# has just added. GPT-J (2021) and PaLM (2022) rearranged this. Both sublayers read the *same*
# normalised input, and both outputs are added to the residual stream in one go:
#
# $$y = x + \mathrm{attn}(\mathrm{LN}(x)) + \mathrm{mlp}(\mathrm{LN}(x)).$$
#
# Nothing waits for attention any more, and since the attention's `qkv` projection and the MLP's `fc`
# now read one tensor, they can be one matrix multiplication. The PaLM paper credits this with about
# 15% faster training at its largest sizes, at the price of a small loss in quality that it saw at
# 8 B parameters and not at 62 B. It is a different function, not a faster way to compute ours.
#
# **Your turn.** Write `ParallelBlock`, a `TransformerBlock` (same parameters, same constructor) whose
# forward pass is the parallel one, pre-norm only. The docstring says what goes in and out; the check
# gives its two LayerNorms different values, so it sees which one you use, and runs it with a padding
# mask and token by token with a KV cache, as chapter 07 will.

# %%
# Your turn - Exercise 5.6 (★★☆, extend): the parallel block.
class ParallelBlock(TransformerBlock):
    """A pre-norm block whose attention and MLP both read ln1(x) and are both added to x (GPT-J, PaLM);
    ln2 is not used. forward(x [B, T, C], mask=None, cache=None) -> [B, T, C], as TransformerBlock's."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        ### BEGIN SOLUTION
        h = self.ln1(x)
        return x + self.attn(h, mask=mask, cache=cache) + self.mlp(h)
        ### END SOLUTION


ParallelBlock = check_parallel_block(ParallelBlock).use

# %% [markdown]
# Two facts to confirm with the class (yours if it passed). With the very same weights, the parallel
# block computes something else than the sequential one, so a model must be trained in the form it
# will run in. And the fusion is real: one matrix holding `attn.qkv`'s rows over `mlp.fc`'s, applied
# once to the shared normalised input, gives both sublayers' first products.

# %%
sequential = TransformerBlock(64, n_head=4).eval()
parallel = ParallelBlock(64, n_head=4).eval()
parallel.load_state_dict(sequential.state_dict())  # the same parameters, ln2 included (unused)
x_blocks = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(5))
with torch.no_grad():
    gap = (parallel(x_blocks) - sequential(x_blocks)).abs().max().item()
    print("same weights, different outputs (largest gap above 0.1):", gap > 0.1)
    h = parallel.ln1(x_blocks)  # (B, T, C): what both sublayers read
    W = torch.cat([parallel.attn.qkv.weight, parallel.mlp.fc.weight])  # (3C + 4C, C)
    b = torch.cat([parallel.attn.qkv.bias, parallel.mlp.fc.bias])  # (3C + 4C,)
    qkv, up = F.linear(h, W, b).split([3 * 64, 4 * 64], dim=-1)  # one product, then split
    print("one fused product = qkv(h) and fc(h) within 1e-5:",
          torch.allclose(qkv, parallel.attn.qkv(h), atol=1e-5), torch.allclose(up, parallel.mlp.fc(h), atol=1e-5))
print("rows of the fused matrix:", W.shape[0], "= 3C + 4C for C = 64")

# %% [markdown]
# ## 9. Bad input
#
# Every module says what is wrong and how to fix it:

# %%
tries = {
    "wrong width": lambda: TransformerBlock(32, n_head=4)(torch.randn(2, 5, 16)),
    "no batch dimension": lambda: TransformerBlock(32, n_head=4)(torch.randn(5, 32)),
    "LayerNorm width (PyTorch's own message)": lambda: LayerNorm(8)(torch.randn(3, 6)),
    "unknown norm": lambda: TransformerBlock(32, n_head=4, norm="sandwich"),
    "unknown activation": lambda: FeedForward(32, activation="swish"),
    "token ids, not vectors": lambda: TransformerBlock(32, n_head=4)(torch.zeros(2, 5, 32, dtype=torch.long)),
}
for what, attempt in tries.items():
    try:
        attempt()
    except (ValueError, TypeError, RuntimeError) as e:
        print(f"{what}: {e}")
    else:
        raise AssertionError(f"{what}: no error was raised")

# %% [markdown]
# ## 10. Looking ahead: the heads of a trained GPT
#
# Chapter 06 stacks 4 of these blocks, 4 heads each, into a GPT and trains it on Shakespeare's
# characters; the course ships the result (`load_course_model`, trained once with chapter 06's
# recipe). What did its 16 heads learn? Chapter 03 built two kinds of head by hand: one that looks
# by *position* (the previous word) and one that looks by *content* (the same word). We switch the
# model's attention to the teaching path (`fast=False`), which keeps every layer's weights, run it on
# 40 windows of 64 characters from the held-out tenth of the text, and measure two things for each
# head: the mean weight a query puts at a fixed offset `d` behind it (0 is itself, 1 the character
# before, ...), and the share of its weight that goes to spaces and line breaks.

# %%
from transformer_course.course_model import load_course_model
from transformer_course.data import train_val_split
from transformer_course.viz import plot_attention

course = load_course_model()
gpt, char_tokenizer = course.model, course.tokenizer
for blk in gpt.blocks:
    blk.attn.fast = False  # the teaching path keeps the weights in .last_weights
held_out = train_val_split(load_shakespeare())[1]  # the text the model was not trained on
windows = torch.tensor([char_tokenizer.encode(held_out[i : i + 64]) for i in range(0, 64 * 40, 64)])  # (40, 64)
with torch.no_grad():
    gpt(windows)
heads = torch.stack([blk.attn.last_weights for blk in gpt.blocks])  # (layers, B, nh, T, T)
t = torch.arange(8, 64)  # queries with at least 8 characters before them
at_offset = torch.stack([heads[..., t, t - d].mean(dim=(1, 3)) for d in range(8)], dim=-1)  # (layers, nh, 8)
boundary = torch.isin(windows, torch.tensor(char_tokenizer.encode(" \n")))  # (B, T): spaces and line breaks
on_boundary = (heads * boundary[None, :, None, None, :]).sum(-1)[..., 8:].mean(dim=(1, 3))  # (layers, nh)
print("layers, heads:", tuple(on_boundary.shape), "| share of spaces and line breaks among the characters below 25%:",
      boundary.float().mean().item() < 0.25)

# %%
fig, (ax_off, ax_space) = plt.subplots(1, 2, figsize=(10, 3.4))
for ax, values, title in ((ax_off, at_offset.max(-1).values, "largest mean weight at one fixed offset"),
                          (ax_space, on_boundary, "share of weight on spaces and line breaks")):
    im = ax.imshow(values, cmap="Blues", vmin=0, vmax=1)
    ax.set(xlabel="head", ylabel="layer", title=title, xticks=range(4), yticks=range(4))
    fig.colorbar(im, ax=ax)
plt.tight_layout()
plt.show()

# %% [markdown]
# Two heads stand out. **Layer 0, head 0** is a position head: on average about half of a query's
# weight lands exactly one character back, whatever that character is, the job of chapter 03's
# previous-word head. **Layer 1, head 0** is a content head: no offset gets much weight, but the
# spaces and line breaks, under a fifth of the characters, get most of it. It looks for the last word
# boundary, wherever that is.

# %%
position_head, content_head = (0, 0), (1, 0)  # (layer, head)
print("layer 0 head 0: more than 40% of the weight at offset 1:", at_offset[0, 0, 1].item() > 0.4,
      "| offset 1 is its largest:", at_offset[0, 0].argmax().item() == 1)
print("layer 1 head 0: no offset above 25%:", at_offset[1, 0].max().item() < 0.25,
      "| more than 60% of the weight on spaces and line breaks:", on_boundary[1, 0].item() > 0.6)
line_chars = [repr(c)[1:-1] for c in held_out[:32]]
fig, axes = plt.subplots(1, 2, figsize=(14, 6))
for ax, (layer, h), name in zip(axes, (position_head, content_head), ("position head", "content head"), strict=True):
    plot_attention(heads[layer, 0, h, :32, :32], line_chars, ax=ax, title=f"layer {layer}, head {h}: {name}")
plt.tight_layout()
plt.show()

# %% [markdown]
# **Which layer learns what?** Source 2 says lower layers learn low-level features and higher ones
# high-level abstractions. That is a tendency found by probing trained models, not a rule built into
# the architecture. Tenney, Das and Pavlick (2019, "BERT Rediscovers the Classical NLP Pipeline")
# found part-of-speech information easiest to read out of BERT's lower layers and relations further
# up, with much overlap. Some behaviour needs depth: an *induction head*, which continues a pattern
# seen earlier in the text, works with a previous-token head in an earlier layer (Elhage et al., 2021;
# Olsson et al., 2022). But every block reads from and writes to the same residual stream (section 4),
# so a later layer can use anything an earlier one wrote, and nothing forces a neat hierarchy. In our
# small model, the two clearest heads happen to sit in its two lowest layers.

# %% [markdown]
# ## Quick check

# %%
from transformer_course.quiz import Question, quiz

quiz([
    Question("Over which numbers does LayerNorm compute its mean and variance?",
             ["Over the batch, for each channel", "Over the C channels of each token, separately",
              "Over all positions of a sequence", "Over the whole [B, T, C] tensor"],
             answer=1, explain="Each token vector is normalised on its own, so nothing depends on other tokens or batch items."),
    Question("A pre-norm block computes...",
             ["x = LN(x + attn(x))", "x = x + attn(LN(x))", "x = attn(LN(x))", "x = LN(attn(x)) + x"],
             answer=1, explain="GPT-2 normalises the sublayer's input and adds the result to the untouched x."),
    Question("Which part of a block holds most of its parameters?",
             ["The attention's qkv projection", "The feed-forward network", "The two LayerNorms", "The attention's output projection"],
             answer=1, explain="fc and proj hold 8C² of the block's 12C² weights; qkv has 3C², W_o C², the LayerNorms only 4C numbers."),
    Question("Source 0 uses layer_norm1 before both sublayers. Why does a test on a freshly built model not notice?",
             ["Because LayerNorm has no parameters", "Because both LayerNorms start as γ = 1, β = 0 and compute the same thing",
              "Because the feed-forward network ignores its input's scale", "It does notice: the output shape changes"],
             answer=1, explain="The two only diverge once training moves their parameters, and the unused ln2 never trains."),
])

# %% [markdown]
# ## Summary
#
# - **LayerNorm** normalises each token's C numbers to mean 0 and variance 1 (variance divided by C,
#   ε inside the square root), then applies a learned gain and bias. Yours matches `nn.LayerNorm`
#   within $10^{-6}$; source 2's $(\sigma + \varepsilon)$ version does not. (Chapter 10 builds
#   RMSNorm, which drops the centring and β.)
# - **FeedForward** widens each token to 4C, applies ReLU or GELU (exact or GPT-2's tanh
#   approximation, which differ by under $5 \cdot 10^{-4}$), and projects back, the same way at every
#   position. A wrong constant in the GELU formula runs without complaint; only a comparison with a
#   trusted implementation finds it.
# - **Residual connections** add each sublayer's output to its input, so the gradient has a direct
#   path down the stack: through 24 fresh blocks it arrives at the bottom undiminished (0.9 to 1.7
#   times its size at the top), while a stack with neither residuals nor LayerNorms loses it entirely. **Pre-norm** (GPT-2)
#   keeps that path free of LayerNorms; **post-norm** (2017) puts one on it after every sublayer, and
#   at a learning rate of 0.01 without warm-up our 6-block post-norm model stayed at the loss of
#   predicting by frequency alone while the pre-norm one learned.
# - The **parallel block** (GPT-J, PaLM) lets both sublayers read the same normalised input and adds
#   both outputs at once: another function with the same weights, whose two input projections fuse
#   into one matrix product.
# - **Dropout** zeroes each number with probability p in training and scales the rest by 1/(1 - p);
#   in evaluation it does nothing. The paper drops each sublayer's output before the residual
#   addition (not after the LayerNorm, as source 4 says), and so does our block.
# - A block has $12C^2 + 13C$ parameters (7,087,872 for GPT-2 small).
# - Using the first LayerNorm twice (sources 0 and 4) is invisible at initialisation and wrong
#   after training, so checks of a block give its two LayerNorms different values first.
# - The course's trained GPT has a position head (layer 0, head 0: the previous character) and a
#   content head (layer 1, head 0: the last space or line break), told apart by measurement.
#
# Exported to `transformer_course/block.py`: `LayerNorm`, `FeedForward`, `TransformerBlock`,
# `block_parameter_count`, `input_gradient_norms`, and the option lists `NORMS` and `ACTIVATIONS`.
# Chapter 06 stacks these blocks into a GPT and trains it.
