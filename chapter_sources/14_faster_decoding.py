# %% [markdown]
# # 14 · Faster decoding: weights in fewer bits, and drafts the model checks
#
# > Make batch-1 decoding faster in two ways: store the weights in int8 (one scale per output channel) or
# > int4 (one scale per group of inputs), so that a decode step reads fewer bytes; and let a cheap draft
# > propose several tokens that the model scores in one pass, with a rule that keeps the model's own
# > distribution exactly.
#
# Chapter 07's decoder, with its KV cache, reads every weight of the model once for every token it writes.
# At batch 1 that read is the whole cost: `benchmarks/results/decode.md` measures the course's decoder at
# 0.82 to 0.94 of the **float32 read bound** (memory bandwidth divided by the bytes of the weights) at
# GPT-2 124M's shapes. That bound is not a law of nature; it is what reading 4 bytes a weight costs. Two
# ideas move past it:
#
# - **Read fewer bytes.** Keep each weight as an 8-bit or 4-bit integer and a few float scales: 4 to 6
#   times fewer bytes a token. Rounding changes the model a little; we measure how little.
# - **Do more with each read.** A decode step that scores 5 positions reads the weights once, as a step that
#   scores 1 does. If something cheap guesses the next few tokens, the model can check all the guesses in
#   one pass and keep the ones it agrees with. Done right (**speculative decoding**, Leviathan et al. 2023;
#   Chen et al. 2023), the text has exactly the distribution the model alone would sample.
#
# **In this chapter you will** quantize a weight matrix to int8 with one scale per output channel
# (Exercise 14.1) and to int4 with one scale per group of inputs (14.2), measure what rounding costs on the
# course's model, see why activations are harder to round than weights, predict how many bits a weight
# costs once its scales are counted (14.3), run int8 weights through a real integer kernel, write the
# acceptance rule of speculative decoding (14.4) and test it statistically, fix a draft that copies from
# the prompt (14.5), work out the acceptance rate a draft needs to pay for itself (14.6), and pack two int4
# values into each byte (14.7).
#
# **You need** chapter 07 (the KV cache, sampling with temperature, top-k and top-p) and chapter 06 (the
# GPT and the shipped model); chapter 11's chat model appears at the end.

# %%
#| default_exp quantization

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from transformer_course.assistant import bits_per_char, exact_match, make_tasks, render_chat
from transformer_course.course_model import load_chat_model, load_course_model
from transformer_course.data import load_shakespeare, train_val_split
from transformer_course.generation import generate

torch.set_printoptions(precision=4, sci_mode=False)
torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: the timings below compare like with like, and a shared CPU stays usable
ckpt = load_course_model()  # chapter 06's shipped model (SHA-256 checked)
model, tok = ckpt.model, ckpt.tokenizer
val_ids = torch.tensor(tok.encode(train_val_split(load_shakespeare())[1]))  # the held-out tenth of the plays
print(f"{model.num_parameters():,} parameters, {len(val_ids):,} held-out characters")

# %% [markdown]
# ## 1. Where the bytes go
#
# A decode step at batch 1 multiplies one vector by every weight matrix: each weight is read once and used
# in one multiply-add. A CPU core does tens of multiply-adds in the time memory delivers one 4-byte float,
# so the arithmetic waits on the reads. Count what one step reads, for the course's model and for a model of
# GPT-2 124M's shapes (12 blocks, C = 768, 50,257 tokens, tied embedding): the weight matrices, the
# key/value cache of the positions so far, and the one row of each embedding table the step looks up.

# %%
def bytes_read(n_layer, C, V, T, weight_bits=32.0):
    """Bytes one decode step reads: the block matrices (12 C² per block) and the LM head (V × C) at
    `weight_bits` a weight, and the KV cache of T positions (float32 keys and values)."""
    weights = (12 * C * C * n_layer + V * C) * weight_bits / 8
    cache = 2 * n_layer * T * C * 4
    return weights, cache


for name, shape in [("course model", (4, 128, 65, 64)), ("GPT-2 124M shapes", (12, 768, 50257, 1024))]:
    w, c = bytes_read(*shape)
    print(f"{name:18}: weights {w / 1e6:7.2f} MB, KV cache at the full context {c / 1e6:6.2f} MB "
          f"({c / (w + c):.0%} of the read)")

# %% [markdown]
# At GPT-2's size the weights are about 500 MB and the cache of a full 1,024-token context 75 MB: at batch
# 1 the weights dominate, so making them smaller is what pays. (With many sequences decoded at once, each
# sequence has its own cache and the weights are shared, and the cache takes over; that is another story.)
# The course's model is so small (3 MB) that it sits in the CPU's caches, and per-step overheads, not
# reads, set its speed: the speed measurements of this chapter are made at GPT-2's shapes, in the
# benchmark.
#
# ## 2. int8: one scale per output channel
#
# Store a weight matrix W [N, K] (N outputs, K inputs: `nn.Linear`'s layout) as integers q in -127..127
# and one float **scale** per output channel (per row), with W ≈ q · scale. **Symmetric**: 0 stays exactly
# 0, and the row's largest |w| maps to 127, so no weight is clipped. A row w = [0.50, -1.27, 0.02] has
# largest |w| 1.27, scale 0.01, q = [50, -127, 2]; dequantized, [0.50, -1.27, 0.02]. Each weight moves by
# at most half a step, scale / 2. One scale per row works because a linear layer's output n is
# Σ_k x_k · W[n, k] = scale_n · Σ_k x_k · q[n, k]: the scale factors out of the sum, so an integer kernel
# can multiply integers and scale the N outputs at the end.
#
# **Exercise 14.1 (★☆☆, build).** Write `quantize_int8(w)`: w [N, K] float -> (q int8 [N, K], scale
# float32 [N]). Round to the nearest integer (`torch.round`), keep q inside -127..127, and give a row of
# zeros the scale 1 (any scale would do; 0 would divide by zero).

# %%
#| export
"""Weight quantization (chapter 14): symmetric int8 with one scale per output channel, int4 with one
scale per group of inputs, a Linear that keeps its weight quantized (a plain path, and an int8 path
through PyTorch's FBGEMM kernel) and a copy of a GPT whose Linear layers hold quantized weights.
Shapes: a weight W [N, K] has N outputs (rows) and K inputs; G inputs a group; x [..., K] -> [..., N]."""

import copy
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.arguments import whole_number

INT8_MAX = 127  # int8 values -127..127 (symmetric: -128 unused)
INT4_MAX = 7  # int4 values -7..7 (symmetric: -8 unused)


def _check_weight(w) -> torch.Tensor:
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w must be a float weight [N, K] (nn.Linear's layout), got {type(w).__name__} "
                         f"{tuple(getattr(w, 'shape', ()))}")
    return w


# %%
#| export
# Your turn - Exercise 14.1 (★☆☆, build): int8 weights, one scale per output channel.
def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q int8 [N, K] in -127..127, scale float32 [N]), w ≈ q * scale[:, None]: each row's
    largest |w| becomes ±127; a row of zeros gets scale 1."""
    w = _check_weight(w)
    ### BEGIN SOLUTION
    top = w.detach().float().abs().amax(dim=1)
    scale = torch.where(top > 0, top / INT8_MAX, torch.ones_like(top))
    q = torch.round(w.detach().float() / scale[:, None]).clamp(-INT8_MAX, INT8_MAX)
    return q.to(torch.int8), scale
    ### END SOLUTION


# %%
from transformer_course.checks.decoding import check_quantize_int8

quantize_int8 = check_quantize_int8(quantize_int8).use

# %% [markdown]
# Dequantizing is the product back: `dequantize_int8(q, scale)`. On the worked row, and on a real matrix
# of the course's model (the first block's attention projections), the largest error is half a step:

# %%
#| export
def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(q int8 [N, K], scale [N]) -> float32 [N, K]: q · scale, row by row."""
    return q.float() * scale[:, None]


# %%
q, scale = quantize_int8(torch.tensor([[0.50, -1.27, 0.02]]))
print(q, scale)
W = model.blocks[0].attn.qkv.weight.detach()
q, scale = quantize_int8(W)
err = (dequantize_int8(q, scale) - W).abs()
print(f"W {tuple(W.shape)}: largest error / half a step <= 1: {bool((err <= scale[:, None] / 2 + 1e-7).all())}")
print(f"typical weight {W.abs().mean():.3f}, typical error {err.mean():.5f}")

# %% [markdown]
# ## 3. int4: one scale per group of inputs
#
# Four bits leave 15 symmetric levels, -7..7: sixteen times coarser steps than int8's. With one scale per
# row, one large weight sets the step for all K weights of its row, and the small ones round to 0. The cure
# is more scales: one per **group** of G consecutive inputs in a row (G = 32 or 64 is usual; GPTQ and
# llama.cpp's Q4 formats work this way), so a large weight coarsens only its own group. The scales cost
# something too; Exercise 14.3 counts it.
#
# **Exercise 14.2 (★★☆, build, no recipe).** Write `quantize_int4(w, group=32)`: w [N, K] -> (q int8
# [N, K] holding values in -7..7, scale float32 [N, K // group]), with w[n, k] ≈ q[n, k] · scale[n, k //
# group]. It is Exercise 14.1's idea applied group by group, with a different largest level. For
# w = [[0.7, -0.14, 3.5, 0.5]] and groups of 2: scales [0.1, 0.5], q [[7, -1, 7, 1]].

# %%
#| export
def _check_group(w: torch.Tensor, group: int) -> int:
    group = whole_number(group, "group", low=1, hint="the inputs that share one scale, 32 or 64 as a rule")
    if w.shape[1] % group:
        raise ValueError(f"group {group} does not divide the {w.shape[1]} inputs of w {tuple(w.shape)}: "
                         "choose a divisor of K, such as 32 or 64")
    return group


# %%
#| export
# Your turn - Exercise 14.2 (★★☆, build): int4 weights, one scale per group of inputs.
def quantize_int4(w: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q int8 [N, K] holding -7..7, scale float32 [N, K // group]), w[n, k] ≈ q[n, k] *
    scale[n, k // group]: each group's largest |w| becomes ±7; a group of zeros gets scale 1."""
    w = _check_weight(w)
    group = _check_group(w, group)
    ### BEGIN SOLUTION
    N, K = w.shape
    groups = w.detach().float().reshape(N, K // group, group)
    top = groups.abs().amax(dim=2)
    scale = torch.where(top > 0, top / INT4_MAX, torch.ones_like(top))
    q = torch.round(groups / scale[..., None]).clamp(-INT4_MAX, INT4_MAX)
    return q.to(torch.int8).reshape(N, K), scale
    ### END SOLUTION


# %%
from transformer_course.checks.decoding import check_quantize_int4

quantize_int4 = check_quantize_int4(quantize_int4).use

# %%
#| export
def dequantize_int4(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(q int8 [N, K] holding -7..7, scale [N, K // G]) -> float32 [N, K]: each group of G times its scale."""
    N, K = q.shape
    return (q.float().reshape(N, scale.shape[1], -1) * scale[..., None]).reshape(N, K)


# %% [markdown]
# How much does the group size matter? Quantize the same matrix with one scale per row (a group of all K
# inputs) and with groups of 64 and 32, and compare the mean error with the weights' typical size:

# %%
for g in (W.shape[1], 64, 32):
    qg, sg = quantize_int4(W, g)
    rel = (dequantize_int4(qg, sg) - W).abs().mean() / W.abs().mean()
    print(f"int4, groups of {g:3}: mean error {rel:.0%} of the mean |w|")
print(f"int8, per row      : mean error {err.mean() / W.abs().mean():.1%} of the mean |w|")

# %% [markdown]
# ## 4. Bits per weight, counted honestly
#
# A scale is a float32: 32 bits. int8 with one scale per row of K inputs stores 8 bits a weight plus 32
# bits shared by K weights; int4 with groups of G stores 4 bits plus 32 shared by G.
#
# **Exercise 14.3 (★☆☆, predict).** At GPT-2's shapes (K = 768 inputs for the attention and the first MLP
# matrix), how many bits does one weight cost, scales included, with int8 per row, and with int4 in groups
# of 32? Return the two numbers (round to 3 decimals if you like).

# %%
# Your turn - Exercise 14.3 (★☆☆, predict): bits per weight, scales included.
def my_bits_per_weight() -> tuple[float, float]:
    """(int8 with one float32 scale per row of 768, int4 with one float32 scale per group of 32)."""
    ### BEGIN SOLUTION
    return 8 + 32 / 768, 4 + 32 / 32
    ### END SOLUTION


# %%
from transformer_course.checks.decoding import check_predict_bits_per_weight

check_predict_bits_per_weight(my_bits_per_weight)

# %% [markdown]
# <details><summary>The answer (open after you have answered)</summary>
#
# So int4 in groups of 32 costs 5 bits, 6.4 times fewer than float32, not 8 times; groups of 64 cost 4.5
# bits. (Formats that store the scales in 16 bits halve that overhead.)
#
# </details>
#
# For GPT-2's weight matrices:

# %%
for label, bits in [("float32", 32.0), ("int8, per row", 8 + 32 / 768), ("int4, groups of 64", 4.5),
                    ("int4, groups of 32", 5.0)]:
    w, c = bytes_read(12, 768, 50257, 512, bits)
    print(f"{label:19}: weights {w / 1e6:6.1f} MB, read per token at 512 positions {(w + c) / 1e6:6.1f} MB, "
          f"read bound x{bytes_read(12, 768, 50257, 512)[0] / w:.1f} of float32's (weights only)")

# %% [markdown]
# ## 5. What rounding costs
#
# `quantize_model(model, bits, group)` returns a copy of a GPT in which every `nn.Linear` (attention, MLP
# and the LM head) is a `QuantLinear` holding q and its scales; the embedding tables and the norms stay
# float32 (a step reads one row of each table, so they cost little). It uses the quantizer it is given:
# yours, when your exercises passed. Two measurements: **bits per character** on the held-out tenth of the
# plays (chapter 06's measure; lower is better), and **greedy agreement**: feed the float32 model's own
# greedy text to both models and count the positions where their argmax is the same (so that one early
# difference does not count the rest of the text as different).

# %%
#| export
class QuantLinear(nn.Module):
    """An nn.Linear whose weight [N, K] is kept quantized: x [..., K] -> [..., N].

    ``bits=8``: q int8 [N, K], scale [N]; ``bits=4``: q int8 [N, K] holding -7..7 (one byte a value here;
    packing two a byte is Exercise 14.7), scale [N, K // group]. ``kernel=True`` (int8 only) runs PyTorch's
    FBGEMM int8 linear (``torch.ops.quantized.linear_dynamic``), which also rounds each input row to int8
    on the fly; otherwise a plain float path. ``quantize``: the function that makes (q, scale)."""

    def __init__(self, linear: nn.Linear, bits: int = 8, group: int = 32, kernel: bool = False, quantize=None):
        super().__init__()
        if bits not in (8, 4):
            raise ValueError(f"bits must be 8 or 4, got {bits!r}")
        if kernel and bits != 8:
            raise ValueError("kernel=True runs the int8 kernel: use bits=8, or kernel=False for int4")
        w = linear.weight.detach()
        self.bits, self.group, self.kernel = bits, group, kernel
        self.out_features, self.in_features = w.shape
        quantize = quantize or (quantize_int8 if bits == 8 else lambda v: quantize_int4(v, group))
        q, scale = quantize(w)
        self.register_buffer("q", q)
        self.register_buffer("scale", scale.float())
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        self._packed = _fbgemm_pack(q, self.scale, self.bias) if kernel else None

    def dequantized(self) -> torch.Tensor:
        """The float32 weight [N, K] that q and its scales stand for."""
        return dequantize_int8(self.q, self.scale) if self.bits == 8 else dequantize_int4(self.q, self.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is not None:
            flat = torch.ops.quantized.linear_dynamic(x.reshape(-1, self.in_features).float(), self._packed)
            return flat.reshape(*x.shape[:-1], self.out_features)
        if self.bits == 8:  # the scale factors out of each output's sum
            y = F.linear(x, self.q.to(x.dtype)) * self.scale
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.dequantized(), self.bias)

    def weight_bytes(self) -> tuple[float, int]:
        """(bytes of q at `bits` a value, bytes of the float32 scales)."""
        return self.q.numel() * self.bits / 8, self.scale.numel() * 4

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, int{self.bits}"
                f"{'' if self.bits == 8 else f', group={self.group}'}{', kernel' if self.kernel else ''}")


def _fbgemm_pack(q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
    """q int8 [N, K] and scale [N] as FBGEMM's packed int8 weight (per output channel, zero point 0)."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        raise RuntimeError("this PyTorch build has no FBGEMM int8 kernel: use kernel=False (the plain path)")
    with warnings.catch_warnings():  # PyTorch 2.10+ marks quantized tensors deprecated; 2.7 to 2.13 have them
        warnings.filterwarnings("ignore", message=".*quantize.*deprecated", category=UserWarning)
        w = torch.quantize_per_channel(dequantize_int8(q, scale), scale.double(),
                                       torch.zeros(len(scale), dtype=torch.long), 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(w, bias)


def quantize_model(model: nn.Module, bits: int = 8, group: int = 32, kernel: bool = False, quantize=None):
    """A copy of `model` (a GPT) with every nn.Linear replaced by a QuantLinear (see there); the embedding
    tables and the norms stay float32, and `model` itself is left as it was."""
    if bits == 4:
        group = whole_number(group, "group", low=1, hint="the inputs that share one scale, 32 or 64 as a rule")
    out = copy.deepcopy(model).eval()
    for module in list(out.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, QuantLinear(child, bits, group, kernel, quantize))
    return out


def model_weight_bytes(model: nn.Module) -> dict[str, float]:
    """Bytes a decode step reads for the weights of `model`: "values" (quantized), "scales" and "float"
    (every other parameter, read whole, except an embedding table, of which a step reads one row)."""
    values = scales = floats = 0.0
    for module in model.modules():
        if isinstance(module, QuantLinear):
            v, s = module.weight_bytes()
            values, scales = values + v, scales + s
        elif isinstance(module, nn.Embedding):
            floats += module.weight[0].numel() * module.weight.element_size()
        else:
            floats += sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
    return {"values": values, "scales": scales, "float": floats}


# %%
def greedy_agreement(reference, other, prompt="ROMEO:\n"):
    """The share of positions where `other`'s argmax equals `reference`'s, both fed reference's greedy
    text (a full 64-character context)."""
    start = torch.tensor([tok.encode(prompt)])
    ids = generate(reference, start, 64 - start.shape[1], temperature=0)
    with torch.no_grad():
        return (reference(ids)[0].argmax(-1) == other(ids)[0].argmax(-1)).float().mean().item()


models = {"float32": model, "int8, per row": quantize_model(model, 8, quantize=quantize_int8),
          "int4, groups of 32": quantize_model(model, 4, 32, quantize=lambda w: quantize_int4(w, 32)),
          "int4, per row": quantize_model(model, 4, 128, quantize=lambda w: quantize_int4(w, 128))}
prompts = ("ROMEO:\n", "JULIET:\n", "KING HENRY:\n", "First Citizen:\n", "HAMLET:\n", "LADY MACBETH:\n")
for name, m in models.items():
    bpc = bits_per_char(m, val_ids, batches=10)
    agree = sum(greedy_agreement(model, m, p) for p in prompts) / len(prompts)
    print(f"{name:19}: {bpc:.3f} bits per character, greedy choices equal to float32's: {agree:.0%}")

# %% [markdown]
# int8 costs nothing measurable on this model: the same bits per character, the same greedy choices. int4
# costs something: in groups of 32 about 0.005 bits per character, with one scale per row about three times
# as much, so the groups earn their extra bit a weight. Greedy agreement (about 340 positions) does not
# separate the two int4 variants: both change a few choices in a hundred, and which ones is close to chance
# where the two likeliest characters are nearly tied. The benchmark (section 7) measures agreement on a
# model of GPT-2's shapes with random weights.
#
# The other shipped model, chapter 11's chat model (the same size, fine-tuned), measured on what it is
# for: exact match on its held-out tasks, 100 of each kind:

# %%
chat = load_chat_model()
cmodel, ctok = chat.model, chat.tokenizer
held = make_tasks(load_shakespeare()).held
for name, m in [("float32", cmodel), ("int8, per row", quantize_model(cmodel, 8, quantize=quantize_int8)),
                ("int4, groups of 32", quantize_model(cmodel, 4, 32, quantize=lambda w: quantize_int4(w, 32)))]:
    print(f"{name:19}: " + ", ".join(f"{kind} {score:.0%}" for kind, score in exact_match(m, ctok, held).items()))

# %% [markdown]
# On what the chat model is for, int8 changes no answer, and int4 in groups of 32 one reversed word
# in a hundred.
#
# ## 6. Why activations are harder
#
# Weights are fixed, so their scales are chosen once, row by row or group by group, offline. The inputs of
# a layer (the activations) change with every token, and an integer matrix multiply wants them in integers
# too: their scale must be chosen on the fly, and one scale per token vector is what kernels offer (a scale
# per input channel would not factor out of the sum over k). The step is set by the vector's largest
# value, so what matters is how far the largest value stands above the typical one. Activations of trained
# transformers have a few **outlier channels**, large at every position (Dettmers et al. 2022, LLM.int8(),
# find channels 20 to 100 times the rest in models of billions of parameters). The course's model is small,
# but the inputs of its last MLP projection (after the GELU) already show the pattern:

# %%
acts = {}
hook = model.blocks[3].mlp.proj.register_forward_hook(lambda m, inp, out: acts.update(x=inp[0].detach()))
with torch.no_grad():
    model(torch.stack([val_ids[i * 64:(i + 1) * 64] for i in range(16)]))  # 16 windows of the held-out text
hook.remove()
x = acts["x"].reshape(-1, acts["x"].shape[-1])  # [1024 positions, 512 channels]
peak = x.abs().amax(0)  # [512]: each channel's largest |value|
plt.figure(figsize=(8, 2.5))
plt.bar(range(len(peak)), peak.numpy(), width=1.0)
plt.xlabel("input channel")
plt.ylabel("largest |x|")
plt.title("Inputs of block 3's MLP projection over 1,024 positions: some channels dwarf the rest")
plt.show()

# %% [markdown]
# Compare the same layer's weight rows (quantized per row) with its input vectors (quantized per position):
# how far above the typical |value| the largest one stands, how many of the 127 int8 levels a typical value
# then gets, and the mean rounding error relative to the mean |value|:

# %%
def int8_rows(v):
    """(largest / median |value| of a row, mean |error| / mean |value|) when each row of v gets its own scale
    (your quantize_int8, which does exactly that)."""
    ratio = (v.abs().amax(1) / v.abs().median(1).values).median().item()
    return ratio, ((dequantize_int8(*quantize_int8(v)) - v).abs().mean() / v.abs().mean()).item()


w_ratio, w_err = int8_rows(model.blocks[3].mlp.proj.weight.detach())
a_ratio, a_err = int8_rows(x)
print(f"weights, per row      : largest / median {w_ratio:3.0f}, a typical value gets {127 / w_ratio:4.1f} levels, "
      f"error {w_err:.1%}")
print(f"activations, per token: largest / median {a_ratio:3.0f}, a typical value gets {127 / a_ratio:4.1f} levels, "
      f"error {a_err:.1%}")
print(f"the activations' rounding error is more than twice the weights': {a_err > 2 * w_err}")

# %% [markdown]
# The same int8 format loses more on the activations. Remedies exist (LLM.int8() keeps the outlier
# channels in float16; SmoothQuant moves their size into the weights); this chapter takes the simpler
# road: it rounds the weights and keeps the activations in float32 on the plain path (**weight-only**
# quantization). Section 7's fast int8 kernel does round each input vector to int8, one
# scale per vector, and its greedy agreement is measured for that reason.
#
# ## 7. A fast path that is real
#
# Storing int8 saves memory; it saves time only if a kernel multiplies by the int8 weights without first
# writing them out as float32 (the plain path's `F.linear(x, q.float())` does exactly that, and is slower
# than float32). PyTorch ships two int8 CPU kernels:
#
# - `torch._weight_int8pack_mm(x, q, scale)` (weight-only: float inputs, int8 weights, one scale a row).
#   It is correct, but on the CPUs measured it is several times *slower* than float32 at these shapes, so
#   the package does not use it (the benchmark's table shows it).
# - FBGEMM's `torch.ops.quantized.linear_dynamic` (the engine behind `torch.ao`'s dynamic quantization):
#   int8 weights with one scale a row, packed for the CPU's vector units, and each input vector rounded to
#   int8 with its own scale on the fly, as section 6 warned. `QuantLinear(..., kernel=True)` uses it with
#   your q and scales.
#
# The two paths agree on the course model as follows (logits can differ a little, because the kernel also
# rounds the inputs; the test suite checks the same at a stated tolerance):

# %%
fast = quantize_model(model, 8, kernel=True, quantize=quantize_int8)
plain = models["int8, per row"]
with torch.no_grad():
    lp, lf = plain(val_ids[:64][None])[0], fast(val_ids[:64][None])[0]
print(f"largest logit difference < 2% of the logits' range: {bool((lp - lf).abs().max() < 0.02 * (lp.max() - lp.min()))}")
agree = sum(greedy_agreement(plain, fast, p) for p in prompts) / len(prompts)
print(f"greedy choices equal to the plain int8 path's >= 95%: {agree >= 0.95}")

# %% [markdown]
# The benchmark (`benchmarks/bench_quantization.py`) runs float32, the int8 kernel, the plain int8 path,
# int4 and `_weight_int8pack_mm` at GPT-2 124M's shapes, batch 1, one thread, with each format's read
# bound. Its stored table, from whatever machine last ran it:

# %%
# NBVAL_IGNORE_OUTPUT
# the benchmark's stored tables (make bench rewrites them, on whatever machine runs it)
for bench_topic in ("quantization", "speculative"):
    bench_file = Path(f"../benchmarks/results/{bench_topic}.md")
    print(bench_file.read_text() if bench_file.exists() else f"run `python benchmarks/bench_{bench_topic}.py`", "\n")

# %% [markdown]
# ## 8. Speculative decoding: guess, then check in one pass
#
# A decode step at batch 1 reads the weights to score one position. Scoring k + 1 positions reads them
# once too, and costs little more while the step is bound by the reads. So: let a cheap **draft** guess the
# next k tokens d₁..d_k, then run the model (the **target**) once on the last token and the k guesses. That
# one pass gives the target's distribution p₀ before d₁, p₁ before d₂, ..., p_k after d_k. Walk along the
# guesses and keep each the target is happy with; at the first one it is not, replace it by a token of the
# target's choosing and throw the rest away. Every round adds at least one token, and up to k + 1.
#
# With greedy decoding "happy" is simple: keep d_i when it is the target's argmax. With sampling, the rule
# must make every token come out with the target's probabilities, whatever the draft guessed. Write q_i
# for the draft's distribution from which d_i was drawn (for a draft that does not sample, q_i puts all
# its mass on d_i). The rule (Leviathan et al. 2023, Chen et al. 2023):
#
# - keep d_i with probability min(1, p_i(d_i) / q_i(d_i)): always when the target likes d_i at least as
#   much as the draft, otherwise in proportion;
# - at the first d_i not kept, draw the replacement from the **residual** max(0, p_i − q_i), normalised to
#   sum to 1: the target's probability the draft under-proposed;
# - when all k are kept, draw one more token from p_k: the pass computed it anyway.
#
# Why it is exact, for one position: token x comes out by being drafted and kept, q(x)·min(1, p(x)/q(x)) =
# min(q(x), p(x)), or by a rejection then a draw from the residual. The chance of a rejection is
# 1 − Σ min(p, q) = Σ max(0, p − q), which is exactly the residual's total, so the second way gives
# max(0, p(x) − q(x)). The two add to min(p, q) + max(0, p − q) = p(x).
#
# **Exercise 14.4 (★★☆, build).** Write `verify(p, q, drafted, generator)`: p [k + 1, V] the target's
# probabilities, q [k, V] the draft's, drafted [k] the guesses; return a LongTensor [n + 1]: the n guesses
# kept, then the one token drawn from the target's side. Draw every random number from `generator`
# (`torch.rand((), generator=generator)`, `torch.multinomial(..., 1, generator=generator)`). If a residual
# sums to 0 (p equals q at that position, up to rounding), draw from p_i.

# %%
#| export speculative
"""Speculative decoding (chapter 14): a cheap draft proposes k tokens, the target scores them all in one
pass, and a rejection rule keeps or replaces each so that the text is distributed exactly as the target's
own sampling (greedy: exactly the target's greedy text). Drafts: a smaller model (`ModelDraft`, e.g.
`early_exit` of the target) or `prompt_lookup` (the tokens that followed the last n-gram's earlier
occurrence). One sequence (batch 1). Shapes: k drafted tokens, V vocabulary size, T positions."""

import copy
from collections.abc import Iterator
from dataclasses import replace

import torch
from torch import nn

from transformer_course.arguments import whole_number
from transformer_course.generation import _never_sampled, _probs, check_sampling


def _check_verify_args(p: torch.Tensor, q: torch.Tensor, drafted: torch.Tensor) -> int:
    k = drafted.numel() if isinstance(drafted, torch.Tensor) else -1
    if k < 0 or p.dim() != 2 or q.dim() != 2 or p.shape[0] != k + 1 or q.shape != (k, p.shape[1]):
        raise ValueError(f"verify needs p [k + 1, V], q [k, V] and drafted [k]; got p {tuple(p.shape)}, "
                         f"q {tuple(q.shape)}, drafted {tuple(getattr(drafted, 'shape', ()))}")
    return k


# %%
#| export speculative
# Your turn - Exercise 14.4 (★★☆, build): keep or replace each drafted token.
def verify(p: torch.Tensor, q: torch.Tensor, drafted: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """p [k + 1, V]: the target's next-token probabilities before each drafted token and after the last;
    q [k, V]: the draft's, from which drafted [k] came. -> LongTensor [n + 1]: the first n drafted tokens
    (each kept with probability min(1, p/q)), then one token from the residual max(0, p - q) at the first
    rejection, or from p[k] when all k were kept."""
    k = _check_verify_args(p, q, drafted)
    ### BEGIN SOLUTION
    drafted = drafted.reshape(-1).long()
    for i in range(k):
        t = int(drafted[i])
        if float(torch.rand((), generator=generator)) * float(q[i, t]) < float(p[i, t]):
            continue  # kept: u < p / q, written without the division
        residual = (p[i] - q[i]).clamp(min=0)
        if float(residual.sum()) <= 0:
            residual = p[i]
        last = torch.multinomial(residual / residual.sum(), 1, generator=generator)
        return torch.cat([drafted[:i], last])
    return torch.cat([drafted, torch.multinomial(p[k], 1, generator=generator)])
    ### END SOLUTION


# %%
from transformer_course.checks.decoding import check_verify

verify = check_verify(verify).use

# %% [markdown]
# A check on a few cases is not a proof that the output has the target's distribution. The test suite
# (`tests/test_speculative.py`) runs `distribution_test`: a target and a draft that are small Markov
# chains over 4 tokens (the next token's distribution depends on the last one), speculative decoding of
# the first two tokens with k = 2, repeated many times with a seeded generator, and the 16 pair frequencies
# compared with the target's exact pair probabilities by a chi-square test and by their total-variation
# distance. It passes for a right `verify` and fails for the two usual mistakes, each of which is only a
# few characters away from the right rule: keeping a guess when p > q (instead of with probability
# min(1, p/q)), and drawing the replacement from p instead of the residual. Run here on your `verify`
# and on the two mistakes (their code is in the checks' module, so as not to spell out yours):

# %%
#| export speculative
def distribution_test(verify_fn, draws: int = 20000, seed: int = 0, k: int = 2) -> dict:
    """Sample the first two tokens `draws` times by speculative decoding with `verify_fn`, from a fixed
    target and draft (Markov chains over 4 tokens, start token 0); compare the pair frequencies with the
    target's exact pair probabilities. -> {"tv": total-variation distance, "p_value": the chi-square
    test's, "passed": p_value > 0.001 and tv < 0.05}."""
    target = torch.tensor([[0.50, 0.30, 0.15, 0.05], [0.10, 0.20, 0.30, 0.40],
                           [0.25, 0.25, 0.25, 0.25], [0.05, 0.05, 0.10, 0.80]], dtype=torch.float64)
    draft = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.40, 0.30, 0.20, 0.10],
                          [0.10, 0.10, 0.70, 0.10], [0.30, 0.30, 0.30, 0.10]], dtype=torch.float64)
    g = torch.Generator().manual_seed(whole_number(seed, "seed", low=0))
    counts = torch.zeros(4, 4, dtype=torch.float64)
    for _ in range(whole_number(draws, "draws", low=1)):
        out = [0]
        while len(out) < 3:  # the start token and two more
            guesses = [out[-1]]
            for _ in range(k):
                guesses.append(int(torch.multinomial(draft[guesses[-1]], 1, generator=g)))
            drafted = torch.tensor(guesses[1:])
            new = verify_fn(target[guesses], draft[guesses[:-1]], drafted, g)
            out += [int(t) for t in new]
        counts[out[1], out[2]] += 1
    want = target[0][:, None] * target * draws  # [4, 4]: P(a) P(b | a), times the draws
    chi2 = float(((counts - want) ** 2 / want).sum())
    p_value = float(torch.special.gammaincc(torch.tensor(15 / 2, dtype=torch.float64),
                                            torch.tensor(chi2 / 2, dtype=torch.float64)))
    tv = float((counts / draws - want / draws).abs().sum() / 2)
    return {"tv": tv, "p_value": p_value, "passed": p_value > 0.001 and tv < 0.05}


# %%
from transformer_course.checks.decoding import accept_if_p_above_q, resample_from_p

for name, fn in [("your verify", verify), ("keep when p > q", accept_if_p_above_q),
                 ("replacement drawn from p", resample_from_p)]:
    r = distribution_test(fn, draws=6000)
    print(f"{name:25}: total variation {'< 0.05' if r['tv'] < 0.05 else '>= 0.05'}, "
          f"chi-square p-value {'> 0.001' if r['p_value'] > 0.001 else '< 0.001'} -> "
          f"{'the target distribution' if r['passed'] else 'NOT the target distribution'}")

# %% [markdown]
# ## 9. Drafts
#
# A draft must be much cheaper than the target and often right. Two kinds, both in the package:
#
# - **A smaller model.** Real systems pair a large model with a small one of the same family (same
#   tokenizer). The course ships one model size, so the draft here is the target cut short: its first
#   blocks, then its own final norm and LM head (**early exit**, as LayerSkip and other self-speculative
#   methods do). `early_exit(model, n_layer)` builds it, sharing no state with the target; it costs
#   n_layer / 4 of the target's blocks and needs no training.
# - **Prompt lookup.** Text often repeats itself: a reply that quotes the question, code that reuses
#   names. Find the last n tokens of the context earlier in the context and propose what followed them
#   there (Saxena 2023, "prompt lookup decoding"). It costs almost nothing and proposes nothing when there
#   is no match.
#
# `speculative_generate(target, draft, idx, n, k, temperature, ...)` runs the rounds: it keeps the target's
# KV cache and, after each round, cuts it back to the tokens kept (the rejected guesses' keys and values
# must not stay). With `temperature=0` its text must equal `generate`'s exactly:

# %%
#| export speculative
def trim_cache(cache: list, length: int) -> None:
    """Cut every layer's KV cache (chapter 04's KVCache) back to its first `length` positions, so the
    rejected guesses' keys and values are never attended to. The buffers stay; only the length moves."""
    for layer in cache:
        layer._length = min(layer.length, length)


class ModelDraft:
    """A small GPT as the draft: proposes k tokens by sampling from its own distribution (the same
    temperature, top-k and top-p as the target), with a KV cache of its own, cut back after each round."""

    def __init__(self, model: nn.Module):
        self.model, self.cache = model.eval(), None

    def reset(self) -> None:
        self.cache = self.model.new_cache()

    @torch.no_grad()
    def propose(self, ctx: list[int], k: int, probs_of, generator) -> tuple[list[int], torch.Tensor | None]:
        """ctx: the token ids so far -> (k guesses, q [k, V] the distributions they were drawn from)."""
        new, tokens, qs = ctx[self.cache[0].length:], [], []
        for _ in range(k):
            logits = self.model(torch.tensor([new]), cache=self.cache, last_only=True)[0][0]  # [1, V]
            q = probs_of(logits)[0]
            tokens.append(int(torch.multinomial(q, 1, generator=generator)))
            qs.append(q)
            new = tokens[-1:]
        return tokens, torch.stack(qs) if qs else None

    def kept(self, length: int) -> None:
        """The first `length` tokens of the context are final: forget the cache past them."""
        trim_cache(self.cache, length)


def early_exit(model: nn.Module, n_layer: int) -> nn.Module:
    """A copy of the GPT `model` with only its first `n_layer` blocks (then its final norm and LM head):
    a draft that costs n_layer / model.cfg.n_layer of the blocks and needs no training."""
    whole_number(n_layer, "n_layer", low=1, high=len(model.blocks) - 1,
                 hint="the blocks the draft keeps: fewer than the target's")
    draft = copy.deepcopy(model).eval()
    draft.blocks = nn.ModuleList(list(draft.blocks)[:n_layer])
    draft.cfg = replace(draft.cfg, n_layer=n_layer)
    return draft


# %% [markdown]
# The other draft, prompt lookup, is yours to repair. This version finds the last n tokens of the context
# (n = `max_ngram` down to 1), looks for them earlier, and returns the k tokens that followed; yet as a
# draft it never proposes anything:

# %%
def buggy_prompt_lookup(ctx, k, max_ngram=3):
    for n in range(min(max_ngram, len(ctx) - 1), 0, -1):
        tail = ctx[-n:]
        for start in range(len(ctx) - n, -1, -1):  # the latest occurrence first
            if ctx[start:start + n] == tail:
                return ctx[start + n:start + n + k]
    return []


text = tok.encode("to be or not to be, that is the question: to be")
print("proposed:", repr(tok.decode(buggy_prompt_lookup(text, 6))), "(expected ', that')")

# %% [markdown]
# **Exercise 14.5 (★☆☆, debug).** Fix it: `prompt_lookup(ctx, k, max_ngram=3)` returns the (up to) k
# tokens that followed the *latest earlier* occurrence of the context's last n tokens, trying n =
# `max_ngram` first, then shorter; [] when no n-gram recurs. On the line above it must propose ", that".

# %%
#| export speculative
# Your turn - Exercise 14.5 (★☆☆, debug): propose what followed the last n-gram before.
def prompt_lookup(ctx: list[int], k: int, max_ngram: int = 3) -> list[int]:
    """ctx: token ids -> up to k ids that followed the latest earlier occurrence of ctx's last n ids
    (n = max_ngram down to 1); [] when none recurs."""
    ### BEGIN SOLUTION
    for n in range(min(max_ngram, len(ctx) - 1), 0, -1):
        tail = ctx[-n:]
        for start in range(len(ctx) - n - 1, -1, -1):  # the latest occurrence first, not the tail itself
            if ctx[start:start + n] == tail:
                return ctx[start + n:start + n + k]
    return []
    ### END SOLUTION


# %%
from transformer_course.checks.decoding import check_prompt_lookup

prompt_lookup = check_prompt_lookup(prompt_lookup).use

# %%
#| export speculative
class PromptLookupDraft:
    """Prompt lookup as a draft: `lookup(ctx, k, max_ngram)` proposes; a guess it copies is certain, so
    its q is one-hot (a kept guess is then kept with probability p(guess))."""

    def __init__(self, max_ngram: int = 3, lookup=None):
        self.max_ngram, self.lookup = max_ngram, lookup or prompt_lookup

    def reset(self) -> None:
        pass

    def propose(self, ctx: list[int], k: int, probs_of, generator) -> tuple[list[int], torch.Tensor | None]:
        tokens = [int(t) for t in self.lookup(ctx, k, self.max_ngram)][:k] if k else []
        return tokens, None  # None: one-hot rows, made by the caller at the vocabulary's size

    def kept(self, length: int) -> None:
        pass


def _check_draft(draft, target) -> None:
    if isinstance(draft, nn.Module):
        raise ValueError("draft must be ModelDraft(model) or PromptLookupDraft(), not a bare model: wrap it")
    if not all(hasattr(draft, m) for m in ("reset", "propose", "kept")):
        raise ValueError(f"draft {type(draft).__name__} has no reset/propose/kept: use ModelDraft or PromptLookupDraft")
    small = getattr(draft, "model", None)
    if small is not None and small.cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError(f"the draft's vocabulary ({small.cfg.vocab_size} ids) is not the target's "
                         f"({target.cfg.vocab_size}): a draft must use the target's tokenizer")
    if small is not None and small.cfg.block_size < target.cfg.block_size:  # its cache would overflow mid-text
        raise ValueError(f"the draft reads at most {small.cfg.block_size} tokens and the target "
                         f"{target.cfg.block_size}: a draft needs a context at least as long as the target's")


# %%
#| export speculative
def speculative_stream(target: nn.Module, draft, idx: torch.Tensor, max_new_tokens: int, k: int = 4,
                       temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                       generator: torch.Generator | None = None, eos_id: int | None = None, *, allowed=None,
                       verify_fn=None, stats: dict | None = None) -> Iterator[int]:
    """Yield up to `max_new_tokens` token ids after the prompt idx [1, T], by speculative decoding: the
    text has the distribution of `generation.stream(target, ...)` with the same settings (temperature 0:
    the same tokens). `draft`: ModelDraft or PromptLookupDraft; k guesses a round. `stats` (a dict) gets
    "rounds", "drafted", "kept". Past block_size the context is cropped and each token is one plain step."""
    check_sampling(temperature, top_k, top_p)
    _check_draft(draft, target)
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.size(0) != 1 or idx.numel() == 0:
        raise ValueError(f"speculative decoding takes one prompt, idx [1, T] with T >= 1, got "
                         f"{tuple(getattr(idx, 'shape', ()))}: decode a batch one row at a time")
    whole_number(k, "k", low=1, hint="the tokens the draft guesses per round")
    whole_number(max_new_tokens, "max_new_tokens", low=0)
    never = _never_sampled(allowed, target.cfg.vocab_size, idx.device)

    def probs_of(logits: torch.Tensor) -> torch.Tensor:  # logits [n, V] -> probabilities [n, V]
        logits = logits if never is None else logits.masked_fill(never, float("-inf"))
        return _probs(logits.float(), temperature, top_k, top_p)

    generator = torch.Generator().manual_seed(0) if generator is None else generator
    stats = {} if stats is None else stats
    stats.update(rounds=0, drafted=0, kept=0)
    return _rounds(target, draft, [int(t) for t in idx[0]], max_new_tokens, k, probs_of, generator,
                   verify_fn or verify, eos_id, stats)


@torch.no_grad()
def _rounds(target, draft, ctx, max_new, k, probs_of, generator, verify_fn, eos_id, stats) -> Iterator[int]:
    """The loop behind speculative_stream: each round drafts, scores in one pass, keeps, cuts the caches."""
    block, made, cache, fed = target.cfg.block_size, 0, target.new_cache(), 0
    draft.reset()
    while made < max_new:
        if len(ctx) > block:  # cropped: no room for guesses, one plain step on the last block_size tokens
            logits = target(torch.tensor([ctx[-block:]]), last_only=True)[0][0]
            new = torch.multinomial(probs_of(logits)[0], 1, generator=generator).tolist()
        else:
            guess_room = min(k, block - len(ctx), max_new - made - 1)
            drafted, q = draft.propose(ctx, guess_room, probs_of, generator) if guess_room > 0 else ([], None)
            feed = ctx[fed:] + drafted
            logits = target(torch.tensor([feed]), cache=cache)[0][0, -(len(drafted) + 1):]  # [n + 1, V]
            p = probs_of(logits)
            if q is None:  # a draft that does not sample: all its mass on each guess
                q = torch.nn.functional.one_hot(torch.tensor(drafted, dtype=torch.long), p.shape[1]).to(p.dtype)
            new = [int(t) for t in verify_fn(p, q.to(p.dtype), torch.tensor(drafted, dtype=torch.long), generator)]
            fed = len(ctx) + len(new) - 1  # the context and the kept guesses are in the cache, not the last token
            trim_cache(cache, fed)
            stats.update(rounds=stats["rounds"] + 1, drafted=stats["drafted"] + len(drafted),
                         kept=stats["kept"] + len(new) - 1)
        for t in new[:max_new - made]:
            ctx.append(t)
            made += 1
            yield t
            if t == eos_id:
                return
        draft.kept(len(ctx) - 1)


def speculative_generate(target: nn.Module, draft, idx: torch.Tensor, max_new_tokens: int, k: int = 4,
                         temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                         generator: torch.Generator | None = None, eos_id: int | None = None, *, allowed=None,
                         verify_fn=None, stats: dict | None = None) -> torch.Tensor:
    """`speculative_stream`'s tokens after idx [1, T]: LongTensor [1, T + new] (see there)."""
    steps = speculative_stream(target, draft, idx, max_new_tokens, k, temperature, top_k, top_p, generator,
                               eos_id, allowed=allowed, verify_fn=verify_fn, stats=stats)
    return torch.cat([idx, torch.tensor([list(steps)], dtype=torch.long).reshape(1, -1)], dim=1)


# %% [markdown]
# Greedy first: the course model, three prompts, 120 new characters (past its 64-character context, where
# each token is one plain step), with an early-exit draft of 2 of its 4 blocks and with prompt lookup, k = 4:

# %%
small = early_exit(model, 2)
for prompt in ("ROMEO:\n", "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n", "KING HENRY:\n"):
    idx = torch.tensor([tok.encode(prompt)])
    plain_text = generate(model, idx, 120, temperature=0)
    for name, d in [("early exit (2 blocks)", ModelDraft(small)), ("prompt lookup", PromptLookupDraft(3, prompt_lookup))]:
        stats = {}
        spec = speculative_generate(model, d, idx, 120, k=4, temperature=0, stats=stats)
        print(f"{prompt.splitlines()[0]:12} {name:22} same text as generate: {torch.equal(spec, plain_text)}")

# %% [markdown]
# The acceptance rate (guesses kept / guesses made) and the tokens each target pass yields decide the
# speed-up. With an acceptance rate a per guess (taken as independent), a round of k guesses yields
# 1 + a + a² + ... + a^k tokens on average. Measured on the course model, greedy, within its 64-token
# context, for the chat model's tasks (reply to "upper: word", "reverse: word", "count: word"): how often
# does each draft guess right?

# %%
for kind in ("upper", "reverse", "count"):
    for name, make in [("early exit (2 of 4 blocks)", lambda: ModelDraft(early_exit(cmodel, 2))),
                       ("prompt lookup", lambda: PromptLookupDraft(3, prompt_lookup))]:
        drafted = kept = same = 0
        for ex in held[kind][:15]:
            ids = torch.tensor([render_chat(ex.messages(False), ctok, generation_prompt=True)[0]])
            stats = {}
            out = speculative_generate(cmodel, make(), ids, 12, k=4, eos_id=ctok.end_id, stats=stats)
            ref = generate(cmodel, ids, out.shape[1] - ids.shape[1], temperature=0)
            drafted, kept, same = drafted + stats["drafted"], kept + stats["kept"], same + torch.equal(out, ref)
        print(f"{kind:8} {name:27} acceptance {kept / max(drafted, 1):.1f}, same replies as generate: {same}/15")

# %% [markdown]
# The early-exit draft guesses right one time in ten to one in five on these short replies, too rarely to pay
# for itself (section 10). Prompt lookup proposes nothing useful: "upper: word" answers in capitals and
# "reverse: word" backwards, so the characters of the question, which is all this character-level model's
# tokens are, do not continue into the answer; and "count" answers a number. The chat tasks do not copy
# from the question after all. (Prompt lookup pays on long texts that quote their context: edits of code,
# answers that cite a document.) Whatever the draft proposes, every reply is the target's own.
#
# With sampling, the replies are not the same text (the random numbers are used differently), but they
# have the same distribution: that is what `distribution_test` established for `verify`. Here the two
# samplers, each run 200 times on a question the model is unsure about ("who says" a line of a play) at
# temperature 1, give frequencies of the replies that differ by no more than chance does:

# %%
question = held["speaker"][0].prompt  # who speaks a line: the model is unsure, so its replies vary
ids = torch.tensor([render_chat([{"role": "user", "content": question}], ctok, generation_prompt=True)[0]])
chat_draft = ModelDraft(early_exit(cmodel, 2))
plain_counts, spec_counts = {}, {}
for seed in range(200):
    a = generate(cmodel, ids, 12, temperature=1.0, eos_id=ctok.end_id, generator=torch.Generator().manual_seed(seed))
    b = speculative_generate(cmodel, chat_draft, ids, 12, k=3, temperature=1.0, eos_id=ctok.end_id,
                             generator=torch.Generator().manual_seed(10_000 + seed))
    for counts, out in ((plain_counts, a), (spec_counts, b)):
        reply = ctok.decode(out[0, ids.shape[1]:].tolist()).split("<|end|>")[0]
        counts[reply] = counts.get(reply, 0) + 1
top = sorted(plain_counts, key=lambda r: (-plain_counts[r], r))[:5]
print(f"{question!r}: reply, times from generate / from speculative_generate, of 200 each")
for reply in top:
    print(f"  {reply!r:12} {plain_counts[reply]:4} / {spec_counts.get(reply, 0):4}")

# %% [markdown]
# ## 10. What it buys: acceptance against cost
#
# A round costs one target pass over k + 1 positions (c_k times a one-token step; close to 1 while the
# step is bound by reading the weights) plus k draft steps (each d times a target step). It yields on
# average E_k = 1 + a + ... + a^k tokens, so the speed-up over the target alone is E_k / (c_k + k·d).
# **Break-even** is the acceptance rate at which that ratio is 1: below it, speculative decoding is slower.
# The benchmark measures c and d at GPT-2's shapes and the acceptance rates of real drafts, and times the
# whole thing (its table is printed in section 7). One measurement there surprised us: on the CPU measured,
# a float32 pass over 2 to 9 new positions costs about **2** one-token steps, not about 1. A one-token step
# multiplies a vector by each matrix (a matrix-vector product that streams the weights once); from two
# positions on, PyTorch calls a matrix-matrix kernel instead, which on this CPU takes about twice as long
# per weight (such kernels usually rearrange the weights into blocks before multiplying, and at a handful
# of rows that extra pass is not paid back). So c is about 2 for every k, and a draft must be right often
# to pay. The int8 copy of the target (d about 0.3) is right almost always on the benchmark's model.
#
# **Exercise 14.6 (★★☆, predict).** Take the measured costs: a target pass over k + 1 = 5 positions costs
# c = 2.0 one-token steps, and a draft step costs d = 0.3 of a target step. With k = 4 guesses a round, what
# acceptance rate a must the draft reach for speculative decoding to be exactly as fast as the target alone?
# (No closed form: solve it numerically, a few lines of bisection, or by trying values.) Then look at the
# chat model's acceptance rates of section 9 and decide whether the early-exit draft could pay there.

# %%
# Your turn - Exercise 14.6 (★★☆, predict): the break-even acceptance rate.
def my_break_even() -> float:
    """The acceptance rate a at which k = 4 guesses a round, c = 2.0 and d = 0.3 break even."""
    ### BEGIN SOLUTION
    low, high = 0.0, 1.0
    for _ in range(60):  # the tokens a round yields grow with a: bisection on yield - cost
        mid = (low + high) / 2
        low, high = (mid, high) if sum(mid ** i for i in range(5)) < 2.0 + 4 * 0.3 else (low, mid)
    return high
    ### END SOLUTION


# %%
from transformer_course.checks.decoding import check_predict_break_even

check_predict_break_even(my_break_even)

# %% [markdown]
# <details><summary>The answer (open after you have answered)</summary>
#
# About 0.77: a draft must be right more than three times in four. The early-exit draft's 0.1-0.2 is far
# below that, and on this CPU it would slow decoding down; the benchmark's int8 draft, right nearly always,
# clears it.
#
# </details>
#
# **Exercise 14.7 (★★☆, extend).** Section 3 stored each int4 value in a whole byte, which wastes half the
# memory the format was meant to save. Write `pack_int4(q)`: q int8 [N, K] holding -7..7 (K even) -> uint8
# [N, K // 2], two values a byte: the value of the even column k in the low four bits and that of column
# k + 1 in the high four bits, each as its 4-bit two's complement (-1 is 0b1111, -7 is 0b1001). The check
# unpacks your bytes with its own code.

# %%
# Your turn - Exercise 14.7 (★★☆, extend): two int4 values a byte.
def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q int8 [N, K] with values in -7..7, K even -> uint8 [N, K // 2]: column 2j in the low nibble, 2j + 1
    in the high nibble, two's complement."""
    ### BEGIN SOLUTION
    nibbles = (q.to(torch.int16) & 0xF).to(torch.uint8)  # two's complement in 4 bits
    return nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)
    ### END SOLUTION


# %%
from transformer_course.checks.decoding import check_pack_int4

check_pack_int4(pack_int4)

# %% [markdown]
# ## 11. On the command line
#
# `transformer-course generate` and `transformer-course chat` take `--quantize int8` (the FBGEMM path) and
# `--draft prompt-lookup` or `--draft PATH` (a smaller model with the same tokenizer: a checkpoint for
# `generate`, a chat model for `chat`). Both run on the CPU. `decoding_setup` turns the two options into
# the model to decode with and the draft, and refuses what cannot work in one line:

# %%
#| export speculative
def decoding_setup(model: nn.Module, quantize: str | None = None, draft: str | None = None, *, load=None,
                   device=None) -> tuple[nn.Module, object]:
    """The command line's `--quantize` and `--draft` -> (the model to decode with, a draft or None).
    quantize: None or "int8" (`quantization.quantize_model(model, 8, kernel=True)`); draft: None,
    "prompt-lookup", or the path of a smaller model with the same vocabulary, read by `load(path) -> model`
    (default: chapter 06's `load_checkpoint`, of a chapter 06 or 10 model; the chat command passes its chat-model
    loader). CPU only."""
    from transformer_course.quantization import quantize_model

    if quantize not in (None, "int8"):
        raise ValueError(f"--quantize {quantize!r}: only int8 has a fast kernel here; give --quantize int8")
    if (quantize or draft) and device is not None and str(device) != "cpu":
        raise ValueError(f"--quantize and --draft run on the CPU, not {device}: add --device cpu")
    if draft is None or draft == "prompt-lookup":
        small = PromptLookupDraft() if draft else None
    else:
        small = ModelDraft(_load_draft(draft, load))
        _check_draft(small, model)
    return (quantize_model(model, 8, kernel=True) if quantize else model), small


def _load_draft(path: str, load) -> nn.Module:
    """The model in the file `path`, read by `load` (default: a checkpoint's model)."""
    from pathlib import Path

    if not Path(path).is_file():
        raise ValueError(f"--draft {path}: no such file; give a smaller model's file, or --draft prompt-lookup")
    try:
        if load is None:
            from transformer_course.checkpoint import load_checkpoint
            from transformer_course.modern import build_gpt

            return load_checkpoint(path, build_gpt, map_location="cpu").model  # chapter 06's GPT or chapter 10's
        return load(path)
    except (ValueError, OSError) as error:  # said of --draft, not of the model's own --checkpoint
        raise ValueError(f"--draft {path}: {error}") from None


def speculative_reply_stream(model: nn.Module, tok, messages: list[dict], draft, max_new_tokens: int = 24,
                             temperature: float = 0.0, top_k: int | None = None, k: int = 4,
                             generator: torch.Generator | None = None) -> Iterator[str]:
    """`assistant.reply_stream` by speculative decoding with `draft`: the same replies (greedy) or the same
    distribution of replies (sampling), one piece of text per token, until <|end|>."""
    from transformer_course.assistant import fit_history, render_chat

    kept = fit_history(messages, tok, model.cfg.block_size, max_new_tokens)
    ids = torch.tensor([render_chat(kept, tok, generation_prompt=True)[0]])
    allowed = [*range(tok.base.vocab_size), tok.end_id]
    for nxt in speculative_stream(model, draft, ids, max_new_tokens, k, temperature, top_k, generator=generator,
                                  eos_id=tok.end_id, allowed=allowed):
        if nxt == tok.end_id:
            return
        yield tok.decode([nxt])


# %%
for args in [dict(quantize="int4"), dict(draft="prompt-lookup", device="cuda"), dict(draft="no/such/file.pt")]:
    try:
        decoding_setup(model, **args)
    except ValueError as e:
        print(e)
fast_model, lookup = decoding_setup(cmodel, "int8", "prompt-lookup")
print("upper: gentle ->", "".join(speculative_reply_stream(fast_model, ctok, [{"role": "user", "content": "upper: gentle"}],
                                                          lookup)))

# %% [markdown]
# ## Check your understanding

# %%
from transformer_course.quiz import Question, quiz

quiz([
    Question("Why does int8 make batch-1 decoding faster on a CPU?",
             ["Integer arithmetic is faster than float arithmetic", "A step reads a quarter of the bytes, and "
              "reading the weights is what a step waits for", "The model has fewer parameters"],
             answer=1, explain="At batch 1 each weight is read once and used once: the read sets the time."),
    Question("Why does int4 need one scale per group of inputs rather than per row?",
             ["With 15 levels, one large weight per row would round the rest of the row to 0 or ±1",
              "Because int4 cannot store negative numbers", "Groups make the kernel simpler"],
             answer=0, explain="The step is the group's largest |w| / 7; small groups keep large weights local."),
    Question("A draft proposes d with q(d) = 0.6 where the target has p(d) = 0.3. What happens?",
             ["d is always rejected, since p < q", "d is kept with probability 0.5; otherwise a token is drawn "
              "from max(0, p - q), normalised", "d is kept, then a token is drawn from p"],
             answer=1, explain="Keep with min(1, p/q) = 0.5; a rejection draws from the residual."),
    Question("Why can speculative decoding be slower than the target alone?",
             ["The draft's guesses change the output", "When guesses are often wrong, the draft's steps and the "
              "wider target pass cost more than the tokens they add", "Because the KV cache must be rebuilt"],
             answer=1, explain="Below break-even acceptance, a round costs more than the tokens it yields."),
])

# %% [markdown]
# ## Summary
#
# - At batch 1 a decode step reads every weight once; the float32 read bound is the bandwidth divided by
#   4 bytes a weight. Fewer bytes a weight raise the bound; scoring several positions per read makes
#   better use of it.
# - **int8** with one scale per output channel (you wrote it) costs nothing measurable on the course
#   model; **int4** needs one scale per group of inputs (you wrote it): groups of 32 cost about 0.005 bits
#   per character where one scale per row costs about three times as much. Counted with their float32
#   scales they cost more than 8 and 4 bits a weight (you predicted how much more), and packing two int4
#   values a byte (you wrote it) is what makes int4's saving real.
# - **Activations** are harder: their scale is chosen on the fly, and a few outlier channels set it for
#   all. Weight-only quantization keeps them in float; the fast int8 kernel rounds them too, and its
#   greedy agreement is measured.
# - The int8 kernel that pays on a CPU is FBGEMM's (`QuantLinear(kernel=True)`): about 3.6 times
#   float32's tokens/s at GPT-2's shapes on the CPU measured, greedy choices unchanged on the benchmark's
#   model. PyTorch's weight-only `_weight_int8pack_mm` is several times slower than float32 there.
# - **Speculative decoding**: a draft guesses k tokens, the target scores them in one pass, and the rule
#   you wrote (keep with probability min(1, p/q), else draw from the residual max(0, p − q)) keeps the
#   target's distribution exactly: greedy text identical, sampled text passing a chi-square test that
#   the two usual mistakes fail. Drafts: the target cut short (early exit), prompt lookup (which you
#   repaired; the chat tasks turned out not to copy from the question) and, in the benchmark, the target's
#   own int8 copy.
# - The speed-up is E_k / (c + k·d). On the CPU measured a float32 pass over several positions costs about
#   two one-token steps, so a draft must be right most of the time to break even (you worked out how
#   often); the int8 draft is, the early-exit draft of the small chat model is not.
#
# Exported to `transformer_course/quantization.py`: `INT8_MAX`, `INT4_MAX`, `quantize_int8`,
# `dequantize_int8`, `quantize_int4`, `dequantize_int4`, `QuantLinear`, `quantize_model`,
# `model_weight_bytes`; and to `transformer_course/speculative.py`: `verify`, `distribution_test`,
# `trim_cache`, `ModelDraft`, `early_exit`, `prompt_lookup`, `PromptLookupDraft`, `speculative_stream`,
# `speculative_generate`, `decoding_setup`, `speculative_reply_stream`.
