# %% [markdown]
# # Chapter 08: loading the real GPT-2 into our GPT
#
# Chapters 02 to 07 built a GPT piece by piece and trained a small one on Shakespeare. Is it *the*
# GPT, or only something that looks like it? The strongest test is to take weights that someone else
# trained with their own code, OpenAI's GPT-2, and check that our model, given exactly those numbers,
# computes exactly the same outputs as a widely used reference implementation: the
# `GPT2LMHeadModel` of Hugging Face `transformers`.
#
# **You will build**
# - the heart of the translator yourself: the table that sends every tensor name of Hugging Face's
#   GPT-2 checkpoint layout (a `config.json` plus `model.safetensors`) to our parameter names, and says
#   which tensors must be transposed on the way (Exercise 8.2); the chapter's loader runs on your table;
# - `read_hf_gpt2(path_or_name)`, which reads a folder or downloads a checkpoint from the Hugging Face
#   Hub and refuses bad files with errors that name the problem, and on it
#   `from_pretrained(path_or_name)`, which builds our GPT from what it read;
# - an offline proof: a small randomly initialised GPT-2 made with `transformers`, saved to disk,
#   loaded into our GPT, and compared logit by logit, block by block, and token by token in greedy
#   generation.
#
# **You will be able to** explain each place where the two codebases store the same model
# differently (a transposed weight, a packed matrix, a missing head, an approximate GELU, an epsilon),
# and run the 124M-parameter GPT-2 with our own code when a network connection is available.
#
# **Your turn** four times: predict which forgotten transpose goes unnoticed (8.1), build the name map
# (8.2), debug a reader of the packed query-key-value matrix written for another model family (8.3),
# and extend the loader into an exporter that hands our GPT to `transformers` (8.4).
#
# **It needs** `MultiHeadAttention` (chapter 04, its packed `qkv` layer), `TransformerBlock` with
# the `"gelu_tanh"` activation (chapter 05), `GPT` and `GPTConfig` (chapter 06) and `generate`
# (chapter 07). It also needs the optional packages `transformers` and `safetensors`
# (`pip install 'transformer-course[pretrained]'`). Nothing here needs the network: the real GPT-2
# section says so plainly when it is offline and the rest of the chapter carries on.

# %%
#| default_exp pretrained

# %%
import math
import os
import tempfile
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

torch.set_printoptions(precision=4, sci_mode=False)
torch.manual_seed(0)
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
warnings.filterwarnings("ignore", module="transformers")

import transformers  # noqa: E402

transformers.logging.set_verbosity_error()  # no version-dependent warnings in the stored outputs
transformers.utils.logging.disable_progress_bar()

from transformer_course import GPT, GPTConfig, generate  # noqa: E402

# %% [markdown]
# ## 1. GPT-2 is the model we built
#
# GPT-2 (Radford et al. 2019) is a decoder-only transformer with exactly the choices our `GPTConfig`
# can express: learned position embeddings, pre-norm blocks (LayerNorm *before* attention and before
# the MLP, plus a final LayerNorm `ln_f`), biases everywhere, an MLP four times as wide as the model,
# GELU, and an output layer that shares its weights with the token embedding. It came in four sizes
# that differ only in depth, width and number of heads; all of them read 1,024 tokens of context and
# use the same 50,257-token BPE vocabulary.
#
# Only the storage differs, and the module this chapter exports translates it:
#
# - Hugging Face's GPT-2 keeps its linear layers in `Conv1D` modules whose weight is `[in, out]`
#   (`y = x @ W + b`); `nn.Linear` keeps `[out, in]` (`y = x @ W.T + b`), so those weights are transposed;
# - query, key and value are packed in one `c_attn` matrix as `[q | k | v]`, heads contiguous inside
#   each: the layout of our `MultiHeadAttention.qkv`, so it loads as one block;
# - the language-model head is not stored: it is the token embedding (tied weights);
# - config names differ (`n_embd` -> `d_model`, `n_positions` -> `block_size`, `layer_norm_epsilon` ->
#   `eps`, `activation_function` "gelu_new" -> "gelu_tanh").

# %%
#| export
"""Load GPT-2 weights saved in Hugging Face's layout into the course's `GPT` (exported from chapter 08).

GPT-2 is the model chapters 02-06 built; only the storage differs: `Conv1D` weights [in, out] are
transposed to `nn.Linear`'s [out, in], the head is the token embedding, config names are translated.
Shapes: B batch, T time, C = d_model channels, V vocabulary, L layers.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path

import torch

from transformer_course.arguments import read_json
from transformer_course.config import GPTConfig
from transformer_course.model import GPT

# %% [markdown]
# Chapter 06 already wrote the four sizes down as presets (`PRESETS["gpt2"]` and friends). Source 3
# (chapter 00 lists the sources) gives the depths of the family as 12, 24, 36 and 48 blocks; that is
# right. Chapter 06's `count_parameters` works the size out from the configuration with a formula;
# building each model on PyTorch's `meta` device (shapes only, no memory) and counting its tensors
# checks the formula without allocating gigabytes. The smallest model is the famous "124M" (the GPT-2
# paper's table says 117M; chapter 06 compares the paper's figures with the released weights).

# %%
from transformer_course.model import PRESETS, count_parameters


def built_parameters(cfg) -> int:
    with torch.device("meta"):
        model = GPT(cfg)
    return sum(p.numel() for p in model.parameters())  # a tied weight is counted once


for size in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"):
    cfg = PRESETS[size]
    built = built_parameters(cfg)
    print(f"{size:12} {cfg.n_layer:3} blocks {cfg.n_head:3} heads  d_model {cfg.d_model:5}  "
          f"{built / 1e6:8.1f}M parameters  (formula agrees: {built == count_parameters(cfg)})")

# %% [markdown]
# ## 2. A GPT-2 we can build offline
#
# The real weights are a 550 MB download. To prove the loader without the network we make our own
# GPT-2 with `transformers`: a tiny one (2 blocks, `d_model` 64, 4 heads, a vocabulary of 512,
# 128 positions), random but fixed by a seed, saved with `save_pretrained` in the layout of the Hub's
# checkpoints (`config.json` and `model.safetensors`).
#
# A detail matters here. A freshly initialised GPT-2 has LayerNorm weights of exactly 1 and biases of
# exactly 0. A loader that swapped `ln_1` with `ln_2`, or forgot every bias, would still pass a test
# on such a model. And with the usual initial spread of 0.02 every logit is nearly the same, so greedy
# generation repeats one token over and over, which proves little. So the stand-in draws **every** tensor at
# random with a spread of 0.1 (LayerNorm weights around 1): no parameter can be mixed up unnoticed.
# Not much larger, though: our tolerance of 1e-5 is absolute, and float32 carries about seven
# significant digits, so the hidden values must stay small (here a few units) for 1e-5 to be a fair
# test rather than a coin toss on rounding.

# %%
#| export
def make_hf_stand_in(vocab_size: int = 512, n_positions: int = 128, n_embd: int = 64, n_layer: int = 2,
                     n_head: int = 4, seed: int = 0, std: float = 0.1, **config):
    """A small random Hugging Face `GPT2LMHeadModel` (eval mode) to test loaders without the network.

    Every parameter is drawn from N(0, std) (LayerNorm weights from N(1, std)), so a mix-up between
    any two tensors changes the outputs. Extra `config` fields go to `GPT2Config`.
    """
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        raise ImportError("make_hf_stand_in needs transformers: pip install 'transformer-course[pretrained]'") from e
    cfg = GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer,
                     n_head=n_head, **config)
    model = GPT2LMHeadModel(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # overwrite transformers' initialisation; the tied lm_head shares wte's tensor
        for name, p in model.named_parameters():
            mean = 1.0 if re.search(r"ln_\w+\.weight$", name) else 0.0
            p.copy_(mean + std * torch.randn(p.shape, generator=gen))
    return model

# %%
hf = make_hf_stand_in()
workdir = tempfile.TemporaryDirectory()
folder = Path(workdir.name) / "tiny-gpt2"
hf.save_pretrained(folder)
print(sorted(p.name for p in folder.iterdir()))

# %% [markdown]
# Why a spread of 0.1 and not transformers' usual 0.02? Greedy generation from the same three-token
# prompt shows it:

# %%
start = torch.tensor([[1, 2, 3]])
for spread in (0.02, 0.1):
    model = make_hf_stand_in(std=spread)
    out = model.generate(start, max_new_tokens=30, do_sample=False, pad_token_id=0,
                         attention_mask=torch.ones_like(start))
    print(f"spread {spread}: {len(set(out[0, 3:].tolist())):2} different tokens in 30 greedy steps")

# %% [markdown]
# What is inside `model.safetensors`? Plain named tensors. We read them with `safetensors` (a format
# that, unlike a pickled `.bin` file, cannot run code when it is opened) and list block 0 plus the
# tensors outside the blocks.

# %%
from safetensors.torch import load_file

hf_tensors = load_file(folder / "model.safetensors")
print(len(hf_tensors), "tensors")
for name, t in hf_tensors.items():
    if ".h.1." not in name:
        print(f"  {name:38} {tuple(t.shape)}")

# %% [markdown]
# Compare this with our GPT's parameter names and shapes for the same sizes. Three differences jump
# out: the names, the shapes of every weight matrix inside the blocks (`[64, 192]` there, `[192, 64]`
# here), and one tensor that only we have: `lm_head.weight`.

# %%
stand_in_cfg = GPTConfig(vocab_size=512, block_size=128, n_layer=2, n_head=4, d_model=64,
                         activation="gelu_tanh")
for name, t in GPT(stand_in_cfg).state_dict().items():
    if ".1." not in name:
        print(f"  {name:28} {tuple(t.shape)}")

# %% [markdown]
# ## 3. Two ways to store one linear layer
#
# OpenAI wrote GPT-2 in TensorFlow, with every linear layer of a block in a function it called
# `conv1d` (a convolution one position wide is just a dense layer): its weight is stored as
# `[1, in, out]`, used as `[in, out]`, and it computes `x @ W + b`. Hugging Face kept the name and the
# layout in a small module, `Conv1D`, and every weight matrix inside a GPT-2 block lives in one:
# `attn.c_attn`, `attn.c_proj`, `mlp.c_fc` and `mlp.c_proj`. PyTorch's `nn.Linear`, which our GPT
# uses, keeps `[out, in]` and computes `x @ W.T + b`. Same kind of layer, the other storage order:

# %%
from transformers.pytorch_utils import Conv1D

conv = hf.transformer.h[0].mlp.c_fc
linear = torch.nn.Linear(64, 256)
x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
assert isinstance(conv, Conv1D)
with torch.no_grad():
    print("Conv1D    weight", tuple(conv.weight.shape), "= [in, out], computes x @ W + b:  ",
          torch.allclose(conv(x), x @ conv.weight + conv.bias, atol=1e-6))
    print("nn.Linear weight", tuple(linear.weight.shape), "= [out, in], computes x @ W.T + b:",
          torch.allclose(linear(x), x @ linear.weight.T + linear.bias, atol=1e-6))

# %% [markdown]
# The embeddings `wte` and `wpe` are lookup tables, one row per token or position, stored the same way
# on both sides. LayerNorm weights and all biases are vectors: a vector has no storage order to get
# wrong. And the missing `lm_head`? GPT-2 scores the next token with the token embedding itself (the
# two are *tied*, more on that in section 6), so the file does not store it twice; our loader will
# point our `lm_head` at the loaded `wte`.
#
# Before writing the translation, a prediction. Suppose a loader copies the four `Conv1D` weights of
# a block as they are, without transposing them, into our `nn.Linear`s. PyTorch's `load_state_dict`
# refuses a tensor whose shape differs from the parameter's. Which of the four would it accept
# without a word?

# %%
from transformer_course.checks.pretrained import (
    check_hf_key_map,
    check_predict_silent_transpose,
    check_split_qkv,
    check_to_hf_state_dict,
)


# Your turn - Exercise 8.1 (★☆☆, predict): which forgotten transpose goes unnoticed?
def my_prediction() -> set[str]:
    """The names, among "attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight" and
    "mlp.c_proj.weight", that an untransposed copy would load without any error (C = 64 here)."""
    ### BEGIN SOLUTION
    return {"attn.c_proj.weight"}
    ### END SOLUTION


check_predict_silent_transpose(my_prediction)

# %% [markdown]
# The answer, read off the file: a `[in, out]` weight fits an `[out, in]` parameter exactly when it is
# square.

# %%
for name in ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"):
    rows, cols = hf_tensors[f"transformer.h.0.{name}"].shape
    print(f"  {name:20} file [{rows:3}, {cols:3}], we keep [{cols:3}, {rows:3}]: "
          f"{'loads untransposed without an error' if rows == cols else 'refused untransposed'}")

# %% [markdown]
# So the attention's output projection is the trap: loading it untransposed is a **silent** bug, and
# section 6 measures how much damage it does. The other three cannot be forgotten unnoticed.
#
# ## 4. The map
#
# The whole translation fits in one table: every Hugging Face name, the name it gets in our model, and
# whether the tensor must be transposed. The loader in the next section turns the table into tensors.
#
# **Your turn - Exercise 8.2 (★★☆, build).** Write `hf_key_map(n_layer)`: a dict from every tensor
# name of the file, *without* the `transformer.` prefix (the loader strips it, because some files have
# it and some do not), to a pair `(our name, transpose?)`. Read the names off the two listings above:
# `wte.weight`, `wpe.weight`, `ln_f.weight`, `ln_f.bias` outside the blocks, then twelve tensors for each
# block `h.0.` ... `h.<n_layer - 1>.`, which become `blocks.0.` ... in our model; modules with the same
# job have names that look alike. `transpose?` is `True` exactly for the `Conv1D` weights. No entry for
# `lm_head.weight` (it is not in the file). For the stand-in, `n_layer = 2`: 4 + 12 x 2 = 28 entries.

# %%
#| export
# Your turn - Exercise 8.2 (★★☆, build): the map from GPT-2's tensor names to ours.
def hf_key_map(n_layer: int) -> dict[str, tuple[str, bool]]:
    """Every GPT-2 parameter name (without "transformer.") -> (our name, transpose?), 4 + 12 L entries."""
    ### BEGIN SOLUTION
    # Hugging Face name inside block i -> (our name inside blocks.i, stored by a Conv1D so transpose?)
    per_block = {
        "ln_1.weight": ("ln1.weight", False),
        "ln_1.bias": ("ln1.bias", False),
        "attn.c_attn.weight": ("attn.qkv.weight", True),  # [C, 3C] -> [3C, C]
        "attn.c_attn.bias": ("attn.qkv.bias", False),
        "attn.c_proj.weight": ("attn.proj.weight", True),  # [C, C]: square, so a missed transpose is silent
        "attn.c_proj.bias": ("attn.proj.bias", False),
        "ln_2.weight": ("ln2.weight", False),
        "ln_2.bias": ("ln2.bias", False),
        "mlp.c_fc.weight": ("mlp.fc.weight", True),  # [C, 4C] -> [4C, C]
        "mlp.c_fc.bias": ("mlp.fc.bias", False),
        "mlp.c_proj.weight": ("mlp.proj.weight", True),  # [4C, C] -> [C, 4C]
        "mlp.c_proj.bias": ("mlp.proj.bias", False),
    }
    table = {
        "wte.weight": ("embed.token.weight", False),
        "wpe.weight": ("embed.position.weight", False),
        "ln_f.weight": ("ln_f.weight", False),
        "ln_f.bias": ("ln_f.bias", False),
    }
    for i in range(n_layer):
        table.update({f"h.{i}.{hf}": (f"blocks.{i}.{ours}", t) for hf, (ours, t) in per_block.items()})
    return table
    ### END SOLUTION

# %%
hf_key_map = check_hf_key_map(hf_key_map).use

# %% [markdown]
# From here on the chapter's loader reads your table (or the package's, if the check above did not
# pass). For the stand-in:

# %%
table = hf_key_map(n_layer=2)
print(len(table), "tensors to map (4 outside the blocks + 12 per block),",
      sum(transpose for _, transpose in table.values()), "of them transposed (4 Conv1D weights per block)")

# %% [markdown]
# ## 5. The loader
#
# First the configuration: Hugging Face's names become ours, and any GPT-2 variant our model cannot
# express (cross-attention, a different MLP width, attention scaled per layer, an unknown activation)
# is refused by name rather than loaded wrongly. Dropout is set to 0: a loaded model is for inference.

# %%
#| export
# Hugging Face `activation_function` -> our FeedForward activation.
# "gelu_new" (GPT-2's own) and "gelu_pytorch_tanh" are the same tanh approximation of GELU.
HF_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


def config_from_hf(hf: Mapping) -> GPTConfig:
    """A Hugging Face GPT-2 `config.json` (as a dict) -> `GPTConfig` for inference (dropout 0).

    A variant our GPT does not build raises `ValueError` naming the field.
    """
    if hf.get("model_type", "gpt2") != "gpt2":
        raise ValueError(f"config.json describes a {hf['model_type']!r} model; from_pretrained reads GPT-2 only")
    missing = [k for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head") if k not in hf]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}: is it a GPT-2 config?")
    act = hf.get("activation_function", "gelu_new")
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"activation_function {act!r} is not supported; use one of {', '.join(HF_ACTIVATIONS)}")
    if hf.get("n_inner") not in (None, 4 * hf["n_embd"]):
        raise ValueError(f"n_inner={hf['n_inner']} is not supported: our MLP is 4 * n_embd = {4 * hf['n_embd']} wide")
    for name, default, needed in [("add_cross_attention", False, False), ("scale_attn_weights", True, True),
                                  ("scale_attn_by_inverse_layer_idx", False, False)]:
        if bool(hf.get(name, default)) != needed:
            raise ValueError(f"{name}={hf[name]} is a GPT-2 variant our GPT does not build (it needs {needed})")
    return GPTConfig(
        vocab_size=hf["vocab_size"], block_size=hf["n_positions"], n_layer=hf["n_layer"],
        n_head=hf["n_head"], d_model=hf["n_embd"], dropout=0.0, bias=True, positional="learned",
        norm="pre", activation=HF_ACTIVATIONS[act], tie_weights=bool(hf.get("tie_word_embeddings", True)),
        eps=float(hf.get("layer_norm_epsilon", 1e-5)),
    )

# %%
hf_config = hf.config.to_dict()
print({k: hf_config[k] for k in ("n_embd", "n_positions", "n_layer", "n_head", "vocab_size",
                                  "activation_function", "layer_norm_epsilon", "tie_word_embeddings")})
print(config_from_hf(hf_config))
try:
    config_from_hf({**hf_config, "n_inner": 100})
except ValueError as e:
    print("ValueError:", e)

# %% [markdown]
# Then the tensors. The loader strips the optional `transformer.` prefix, skips the old mask buffers,
# transposes the `Conv1D` weights, and checks every name and shape against the model it fills. An
# unknown tensor, a missing one, or one of the wrong shape is an error that names it: a checkpoint is
# never half-loaded.

# %%
#| export
# saved by GPT2LMHeadModel as "transformer.h.0...", by GPT2Model (the Hub's "gpt2") as "h.0..."
_PREFIX = "transformer."
# old files carry the causal mask as a buffer: not a weight, skipped
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


def _names(names: list[str], n: int = 6) -> str:
    return ", ".join(names[:n]) + (f" ... ({len(names) - n} more)" if len(names) > n else "")


def convert_hf_state_dict(hf_sd: Mapping[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """GPT-2 tensors renamed, transposed and checked for `model.load_state_dict` (`model`: our `GPT`
    built from `config_from_hf` of the same checkpoint).

    Unknown, missing or wrongly shaped tensors raise `ValueError` naming them. A tied `lm_head.weight`
    is `wte.weight` (a stored copy must equal it); an untied one is read from the file.
    """
    L = len(model.blocks)
    table = hf_key_map(L)
    tensors = {k.removeprefix(_PREFIX): v for k, v in hf_sd.items() if not k.endswith(_IGNORED_SUFFIXES)}
    head = tensors.pop("lm_head.weight", None)
    if unknown := sorted(set(tensors) - set(table)):
        raise ValueError(f"unknown keys in the checkpoint (a GPT-2 with n_layer={L} has none of them): "
                         f"{_names(unknown)}")
    if missing := sorted(set(table) - set(tensors)):
        raise ValueError(f"missing keys in the checkpoint (a GPT-2 with n_layer={L} needs them): {_names(missing)}")
    target = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for hf_name, (ours, transpose) in table.items():
        w = tensors[hf_name].T if transpose else tensors[hf_name]
        if w.shape != target[ours].shape:
            raise ValueError(f"{hf_name} has shape {tuple(tensors[hf_name].shape)}, but {ours} needs "
                             f"{tuple(target[ours].shape)}{' (transposed)' if transpose else ''}: "
                             "does config.json belong to these weights?")
        out[ours] = w.to(torch.float32).contiguous()
    if model.lm_head.weight is model.embed.token.weight:  # tied
        if head is not None and not torch.equal(head.to(torch.float32), out["embed.token.weight"]):
            raise ValueError("lm_head.weight differs from wte.weight, but config.json says tie_word_embeddings=True")
        out["lm_head.weight"] = out["embed.token.weight"]
    elif head is None:
        raise ValueError("missing keys in the checkpoint: lm_head.weight (tie_word_embeddings=False needs it)")
    else:
        out["lm_head.weight"] = head.to(torch.float32).contiguous()
    return out

# %% [markdown]
# Reading the files: `model.safetensors` is preferred (also split into shards with an index, as large
# checkpoints are). An old `pytorch_model.bin` is a pickle, and unpickling can run arbitrary code, so
# it is only read with `weights_only=True`, which accepts tensors and nothing else.

# %%
#| export
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def read_hf_state_dict(folder: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint folder: safetensors (one file or sharded) preferred, else
    `pytorch_model.bin` read with `weights_only=True`. Checked as untrusted data (`check_hf_tensors`)."""
    folder = Path(folder)
    single, index, pickled = (folder / name for name in _WEIGHT_FILES)
    if single.is_file() or index.is_file():
        from safetensors.torch import load_file

        if single.is_file():
            return check_hf_tensors(single, load_file)
        tensors: dict[str, torch.Tensor] = {}
        for shard in hf_shards(index):
            tensors.update(check_hf_tensors(folder / shard, load_file))
        return tensors
    if pickled.is_file():
        return check_hf_tensors(pickled, lambda f: torch.load(f, map_location="cpu", weights_only=True))
    raise FileNotFoundError(f"no weights in {folder}: expected one of {', '.join(_WEIGHT_FILES)}")

# %% [markdown]
# A folder is untrusted data too: a hand-edited `config.json` can ask for a model of a trillion parameters, a
# file can hold NaN, a tensor can be missing or have another shape. The helpers below (shared with chapter
# 10's Llama loader) check each before anything is allocated and raise `HFCheckpointError`, a `ValueError`
# that names the file and the key or field.

# %%
#| export
MAX_HF_SIZE = 1 << 24  # the largest vocabulary, width, depth or context a config.json may ask for


class HFCheckpointError(ValueError):
    """A Hugging Face folder that cannot be loaded; the message names the file and the key or field."""


def read_hf_config(folder: Path, sizes: tuple[str, ...]) -> dict:
    """``folder``/config.json as a dict whose ``sizes`` fields (when present) are whole numbers in 1..MAX_HF_SIZE."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {folder}: save the model with save_pretrained(folder)")
    try:
        hf = read_json(path, "a Hugging Face config", max_depth=16)
    except ValueError as e:
        raise HFCheckpointError(str(e)) from None
    if not isinstance(hf, dict):
        raise HFCheckpointError(f"{path} holds a JSON {type(hf).__name__}, not an object of config fields")
    for name in sizes:
        value = hf.get(name)
        bad = isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_HF_SIZE
        if value is not None and bad:
            raise HFCheckpointError(f"{path}: {name} must be a whole number in 1..{MAX_HF_SIZE:,}, got {value!r}")
    return hf


def hf_config(make, hf: Mapping, folder: Path) -> GPTConfig:
    """``make(hf)`` (config_from_hf, config_from_llama), its errors naming config.json."""
    try:
        return make(hf)
    except (ValueError, TypeError, KeyError) as e:
        problem = f"lacks the field {e}" if isinstance(e, KeyError) else str(e)
        raise HFCheckpointError(f"{Path(folder) / 'config.json'}: {problem}") from None


def check_hf_fits(build, config: GPTConfig, folder: Path) -> None:
    """Refuse a config whose model (counted on the meta device: nothing allocated) needs more than twice
    the bytes of the weight files (16-bit numbers at least)."""
    with torch.device("meta"):
        n = sum(p.numel() for p in build(config).parameters())
    files = [Path(folder) / f for f in _WEIGHT_FILES if (Path(folder) / f).is_file()]
    have = sum(f.stat().st_size for f in files)
    if files and 2 * n > have + (1 << 20):
        raise HFCheckpointError(f"{Path(folder) / 'config.json'} describes a model of {n:,} parameters (at least "
                                f"{2 * n:,} bytes) but {', '.join(f.name for f in files)} hold {have:,} bytes: does "
                                "config.json belong to these weights?")


def hf_shards(index: Path) -> list[str]:
    """The shard files a model.safetensors.index.json names (plain file names beside it)."""
    try:
        shards = read_json(index, "a safetensors index", max_depth=4)["weight_map"].values()
    except (ValueError, TypeError, KeyError, AttributeError):
        raise HFCheckpointError(f"{index} is not a safetensors index: it needs a weight_map object") from None
    if any(not isinstance(f, str) or Path(f).name != f or f in ("", ".", "..") for f in shards):
        raise HFCheckpointError(f"{index}: weight_map may only name files beside it")
    return sorted(set(shards))


def check_hf_tensors(path: Path, read) -> dict[str, torch.Tensor]:
    """``read(path)``: a dict of named, finite tensors, or an HFCheckpointError naming the file and the key."""
    if not path.is_file():
        raise HFCheckpointError(f"{path} is missing")
    try:
        tensors = read(path)
    except Exception as e:  # safetensors' and pickle's own errors: a corrupted or foreign file
        raise HFCheckpointError(f"{path} cannot be read as weights ({type(e).__name__}: {e})") from None
    if not isinstance(tensors, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                for k, v in tensors.items()):
        raise HFCheckpointError(f"{path} does not hold a dict of named tensors")
    for key, value in tensors.items():
        if value.is_floating_point() and not bool(value.isfinite().all()):
            raise HFCheckpointError(f"{path}: tensor {key!r} holds NaN or infinite values")
    return tensors


def load_hf_weights(model: torch.nn.Module, convert, folder: Path) -> None:
    """``model.load_state_dict(convert())``, each missing, unknown or misshapen tensor named with the folder's
    weight file."""
    where = next((Path(folder) / f for f in _WEIGHT_FILES if (Path(folder) / f).is_file()), Path(folder))
    try:
        state = convert()
    except HFCheckpointError:
        raise
    except ValueError as e:
        raise HFCheckpointError(f"{where}: {e}") from None
    target = model.state_dict()
    for key in sorted(set(target) | set(state)):
        if key not in state or key not in target:
            raise HFCheckpointError(f"{where}: {'missing' if key in target else 'unexpected'} tensor {key!r}")
        if state[key].shape != target[key].shape:
            raise HFCheckpointError(f"{where}: {key} has shape {tuple(state[key].shape)}, the config needs "
                                    f"{tuple(target[key].shape)}: does config.json belong to these weights?")
    model.load_state_dict(state)

# %% [markdown]
# A name that is not a folder is looked up on the Hugging Face Hub ("gpt2", "gpt2-medium",
# "openai-community/gpt2", ...) through `huggingface_hub`, which keeps a local cache. Without a network
# the download must fail fast and clearly, not hang: the cache is tried first, then one short
# connection attempt decides, and `HF_HUB_OFFLINE=1` skips the attempt altogether.

# %%
#| export
_HUB_HOST = "huggingface.co"
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")  # "gpt2", "openai-community/gpt2"


class HubUnavailableError(ConnectionError):
    """The checkpoint is not in the local cache and the Hugging Face Hub cannot be reached."""


def hub_reachable(timeout: float = 2.0) -> bool:
    """True when huggingface.co accepts a connection within `timeout` s and HF_HUB_OFFLINE is unset."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # a direct probe says nothing behind a proxy: let huggingface_hub try, with its timeout
    try:
        socket.create_connection((_HUB_HOST, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def download_hf_gpt2(name: str = "gpt2", timeout: float = 2.0, cache_dir: str | os.PathLike | None = None) -> Path:
    """A local folder with Hub checkpoint `name`'s config.json and safetensors, cached after the first time.

    Raises `HubUnavailableError` at once when the files are not cached and the Hub is unreachable.
    """
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as e:
        raise ImportError("downloading GPT-2 needs huggingface_hub: "
                          "pip install 'transformer-course[pretrained]'") from e
    patterns = ["config.json", "model.safetensors", "model.safetensors.index.json", "model-*.safetensors"]
    try:
        return Path(snapshot_download(name, allow_patterns=patterns, cache_dir=cache_dir, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    offline = HubUnavailableError(
        f"cannot download {name!r}: {_HUB_HOST} is not reachable and the weights are not cached. "
        "Run this once with a network connection (about 550 MB for 'gpt2'), or pass a local "
        "folder holding config.json and model.safetensors."
    )
    if not hub_reachable(timeout):
        raise offline
    try:
        return Path(snapshot_download(name, allow_patterns=patterns, cache_dir=cache_dir, etag_timeout=timeout))
    except LocalEntryNotFoundError as e:  # the connection failed on the way
        raise offline from e


def _resolve(path_or_name: str | os.PathLike) -> Path:
    path = Path(path_or_name).expanduser()
    if path.is_dir():
        return path
    name = str(path_or_name)
    if path.exists() or name.startswith((".", "/", "~")) or not _REPO_ID.fullmatch(name):
        raise FileNotFoundError(f"{name} is neither a folder holding config.json and the weights "
                                "nor a Hub name such as 'gpt2'")
    return download_hf_gpt2(name)

# %% [markdown]
# And the reader that puts it together: the folder (or the Hub's cached download), its configuration
# and its tensors. `from_pretrained(path_or_name)` then builds chapter 06's `GPT` from the
# configuration and loads the tensors through `convert_hf_state_dict`.

# %%
#| export
def read_hf_gpt2(path_or_name: str | os.PathLike = "gpt2") -> tuple[GPTConfig, dict[str, torch.Tensor]]:
    """(`config_from_hf` of config.json, tensors under Hugging Face's names) of a GPT-2 checkpoint.

    `path_or_name`: a local folder (config.json and the weights) or a Hub name such as "gpt2"
    (downloaded once, then cached).
    """
    folder = _resolve(path_or_name)
    hf = read_hf_config(folder, ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner"))
    config = hf_config(config_from_hf, hf, folder)
    check_hf_fits(GPT, config, folder)
    return config, read_hf_state_dict(folder)


def from_pretrained(path_or_name: str | os.PathLike = "gpt2") -> GPT:
    """OpenAI's GPT-2 weights in our `GPT` (eval mode), from a local Hugging Face folder (config.json,
    model.safetensors or pytorch_model.bin) or a Hub name such as "gpt2". A folder that cannot be loaded
    raises `HFCheckpointError` (a ValueError) naming the file and the key or field."""
    folder = _resolve(path_or_name)
    config, tensors = read_hf_gpt2(folder)
    model = GPT(config)
    load_hf_weights(model, lambda: convert_hf_state_dict(tensors, model), folder)
    return model.eval()

# %% [markdown]
# The package's `from_pretrained` runs the package's copies of these functions. In this notebook we load with
# the ones defined above, so that the name map in use is yours:

# %%
def load_gpt2(path_or_name) -> GPT:
    """What `from_pretrained(path_or_name)` does, with this notebook's functions (and your hf_key_map)."""
    config, tensors = read_hf_gpt2(path_or_name)
    model = GPT(config)
    model.load_state_dict(convert_hf_state_dict(tensors, model))
    return model.eval()

# %% [markdown]
# Bad inputs, each refused with a message that says what is wrong. The checkpoint here is the stand-in
# with one tensor renamed, one removed, and one of the wrong size; then a folder with no checkpoint.

# %%
renamed = {k.replace("h.1.ln_2", "h.1.ln_3"): v for k, v in hf_tensors.items()}
removed = {k: v for k, v in hf_tensors.items() if not k.endswith("h.0.mlp.c_fc.bias")}
resized = {**hf_tensors, "transformer.wpe.weight": torch.zeros(64, 64)}
for label, tensors in [("renamed", renamed), ("removed", removed), ("resized", resized)]:
    try:
        convert_hf_state_dict(tensors, GPT(stand_in_cfg))
    except ValueError as e:
        print(f"{label}: {e}")
try:
    load_gpt2(Path(workdir.name))
except FileNotFoundError as e:
    print("folder without config.json:", str(e).replace(workdir.name, "<tmp>"))

# %% [markdown]
# ## 6. Five gotchas, each checked
#
# ### Gotcha 1: the square `Conv1D` weight
#
# Section 3 found the trap: of a block's four `Conv1D` weights, only the attention's output projection
# `c_proj` is square, `[C, C]`, so only its forgotten transpose loads without an error. Everything
# runs, and the model is wrong. We load the stand-in with `load_gpt2`, then plant that bug by hand
# and measure the damage.

# %%
ours = load_gpt2(folder)
idx = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    reference = hf(idx).logits
    good = ours(idx)[0]
    for block in ours.blocks:
        block.attn.proj.weight.copy_(block.attn.proj.weight.T.clone())  # the bug
    bad = ours(idx)[0]
    for block in ours.blocks:
        block.attn.proj.weight.copy_(block.attn.proj.weight.T.clone())  # undo it
print("c_proj transposed:        logits within 1e-5 of HF:", torch.allclose(good, reference, atol=1e-5, rtol=0))
print(f"forgot c_proj's transpose: max |logit difference| = {(bad - reference).abs().max():.2f}")

# %% [markdown]
# ### Gotcha 2: one packed matrix for query, key and value
#
# GPT-2 computes the queries, keys and values of all heads with a single matrix `c_attn` of width
# `3C`. Its output is three parts side by side, `[q | k | v]`, each `C` wide, and inside each part the
# `nh` heads sit next to each other, `hs = C / nh` columns per head. Chapter 04 packed our
# `MultiHeadAttention.qkv` the same way on purpose, so the packed matrix loads as one piece (after the
# transpose).
#
# Not every model family packs it like that. GPT-NeoX and Megatron-LM group the columns **per head**
# instead: head 0's query, key and value, then head 1's, and so on (`[q0 k0 v0 | q1 k1 v1 | ...]`).
# A reader written for one layout and used on the other raises no error, because the shapes are the
# same. Below is such a reader, ported from a NeoX loader, inside a small harness that runs a Hugging
# Face attention layer by hand: `c_attn`, then the split into heads, chapter 03's attention, the heads
# merged again, then `c_proj`. Hugging Face's own layer says whether the split is right.

# %%
from transformer_course.attention import causal_mask, scaled_dot_product_attention
from transformer_course.multihead import merge_heads, split_heads


def attention_from_c_attn(attn, x, n_head, split):
    """Run HF attention layer `attn` on x [B, T, C] by hand, reading c_attn's output with `split`."""
    T = x.shape[1]
    packed = x @ attn.c_attn.weight + attn.c_attn.bias  # (B, T, 3C), Conv1D: x @ W + b
    q, k, v = split(packed, n_head)  # (B, nh, T, hs) each
    out, _ = scaled_dot_product_attention(q, k, v, causal_mask(T))  # (B, nh, T, hs)
    return attn.c_proj(merge_heads(out))  # (B, T, C)


def split_qkv_neox(packed, n_head):
    """packed [B, T, 3C] -> (q, k, v), each [B, nh, T, hs]."""
    B, T, three_c = packed.shape
    per_head = packed.view(B, T, n_head, 3, three_c // (3 * n_head))  # (B, T, nh, 3, hs)
    q, k, v = per_head.permute(3, 0, 2, 1, 4)  # 3 x (B, nh, T, hs)
    return q, k, v


block0 = hf.transformer.h[0]
x = block0.ln_1(hf.transformer.wte(idx) + hf.transformer.wpe(torch.arange(16)))
with torch.no_grad():
    theirs = block0.attn(x)[0]
    mine = attention_from_c_attn(block0.attn, x, 4, split_qkv_neox)
print("shapes agree:", mine.shape == theirs.shape, "| matches HF attention:", torch.allclose(mine, theirs, atol=1e-5))

# %% [markdown]
# **Your turn - Exercise 8.3 (★★☆, debug).** Fix the reader for GPT-2's layout: from `packed`,
# `[B, T, 3C]` laid out as `[q | k | v]`, return the per-head queries, keys and values, each
# `[B, nh, T, hs]`. Chapter 04's `split_heads` (imported above) may help. The cell after the check
# runs the harness again with your reader.

# %%
# Your turn - Exercise 8.3 (★★☆, debug): read GPT-2's packed q | k | v.
def my_split_qkv(packed: torch.Tensor, n_head: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """packed [B, T, 3C] laid out as [q | k | v] -> (q, k, v), each [B, nh, T, hs] with hs = C / nh."""
    ### BEGIN SOLUTION
    C = packed.shape[-1] // 3
    q, k, v = (split_heads(t, n_head) for t in packed.split(C, dim=-1))  # (B, nh, T, hs) each
    return q, k, v
    ### END SOLUTION


split_qkv = check_split_qkv(my_split_qkv).use

# %%
with torch.no_grad():
    mine = attention_from_c_attn(block0.attn, x, 4, split_qkv)
print("with the fixed reader, matches HF attention:", torch.allclose(mine, theirs, atol=1e-5))

# %% [markdown]
# ### Gotcha 3: the output layer is not in the file
#
# The list of tensors above has no `lm_head`. GPT-2 ties its output layer to the token embedding: the
# logits are `ln_f(h) @ wteᵀ`, so the matrix that turns a token id into a vector also scores every
# token as the next one (Press and Wolf, 2017). For the 124M model that one `[50257, 768]` matrix is
# 38.6 million parameters, nearly a third of the model, stored once. Our `GPT` ties the same way when
# `tie_weights=True`, so once the loader has filled our token embedding from `wte`, `lm_head.weight`
# *is* that tensor, not a copy.

# %%
print("lm_head.weight is embed.token.weight:", ours.lm_head.weight is ours.embed.token.weight)
print("equal to the file's wte:", torch.equal(ours.lm_head.weight, hf_tensors["transformer.wte.weight"]))
with torch.no_grad():
    h = hf.transformer(idx).last_hidden_state  # already passed through ln_f
print("HF logits = ln_f(h) @ wte.T:", torch.allclose(h @ hf_tensors["transformer.wte.weight"].T, reference, atol=1e-5))
gpt2_cfg = PRESETS["gpt2"]
print(f"124M GPT-2: the tied matrix holds {gpt2_cfg.vocab_size * gpt2_cfg.d_model / 1e6:.1f}M of "
      f"{count_parameters(gpt2_cfg) / 1e6:.1f}M parameters")

# %% [markdown]
# ### Gotcha 4: GPT-2's GELU is the tanh approximation
#
# GELU is `x · Φ(x)`, with Φ the standard normal distribution function (computed with `erf`). GPT-2's
# code, like GPT-1's before it, used instead the cheaper approximation proposed in the GELU
# paper (Hendrycks and Gimpel, 2016): `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`. Hugging Face calls it `"gelu_new"`; our
# `FeedForward` calls it `"gelu_tanh"`. The two curves are hard to tell apart, but "hard to tell
# apart" is not "equal", and our proof uses a tolerance of 1e-5.

# %%
xs = torch.linspace(-6, 6, 2001)
gap = F.gelu(xs, approximate="tanh") - F.gelu(xs)
print(f"largest |tanh GELU - exact GELU| on [-6, 6]: {gap.abs().max():.1e} at |x| = {xs[gap.abs().argmax()].abs():.2f}")
fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3))
a1.plot(xs, F.gelu(xs), label="exact (erf)")
a1.plot(xs, F.gelu(xs, approximate="tanh"), "--", label="tanh approximation")
a1.set_title("GELU"), a1.legend()
a2.plot(xs, gap)
a2.set_title("tanh approximation - exact")
plt.show()

# %% [markdown]
# Load the very same weights into a GPT that uses the exact GELU instead, and the logits move by far
# more than our tolerance:

# %%
exact = GPT(GPTConfig(vocab_size=512, block_size=128, n_layer=2, n_head=4, d_model=64, activation="gelu")).eval()
exact.load_state_dict(convert_hf_state_dict(hf_tensors, exact))
with torch.no_grad():
    wrong_gelu = exact(idx)[0]
print(f"exact GELU instead of tanh: max |logit difference| = {(wrong_gelu - reference).abs().max():.1e}")

# %% [markdown]
# ### Gotcha 5: LayerNorm's epsilon, and where it goes
#
# GPT-2's LayerNorms use ε = 1e-5 (`layer_norm_epsilon` in `config.json`), the same default as ours.
# Source 2 writes the normalisation as `(x - μ) / (σ + ε)`. That is **not** what GPT-2, PyTorch
# or our `LayerNorm` compute: ε goes *inside* the square root, `(x - μ) / √(σ² + ε)`, and σ² is the
# plain (biased) variance, dividing by C, not C - 1. On a typical input source 2's formula is close,
# but not within our tolerance; on an input with a small spread (a nearly constant vector) it is far off.

# %%
ln = hf.transformer.h[0].ln_1
def source_2_layernorm(x, ln):  # source 2's formula: eps added to the standard deviation
    mu, sigma = x.mean(-1, keepdim=True), x.std(-1, keepdim=True, unbiased=False)
    return (x - mu) / (sigma + ln.eps) * ln.weight + ln.bias

def true_layernorm(x, ln):  # eps inside the square root, biased variance
    mu, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
    return (x - mu) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias

g = torch.Generator().manual_seed(5)
with torch.no_grad():
    for label, v in [("typical input", torch.randn(4, 64, generator=g)), ("spread 0.003", 0.003 * torch.randn(4, 64, generator=g))]:
        print(f"{label:14}: sqrt(var + eps) matches HF: {torch.allclose(true_layernorm(v, ln), ln(v), atol=1e-5)};"
              f"  source 2's (sigma + eps) is off by {(source_2_layernorm(v, ln) - ln(v)).abs().max():.1e}")

# %% [markdown]
# ## 7. The proof
#
# Same weights, same inputs, and the same outputs within 1e-5, first for the logits of a batch of two
# sequences of 16 tokens, from a model loaded afresh with the package's `from_pretrained` (which
# gives exactly what this notebook's `load_gpt2` gives):

# %%
from transformer_course import pretrained  # the package's module, not this notebook's cells

ours = pretrained.from_pretrained(folder)
with torch.no_grad():
    logits, _ = ours(idx)
    print("from_pretrained equals load_gpt2:", torch.equal(logits, load_gpt2(folder)(idx)[0]))
print("logits", tuple(logits.shape), "within 1e-5 of HF:", torch.allclose(logits, reference, atol=1e-5, rtol=0))
print("our first logits :", logits[0, 0, :5])
print("HF's first logits:", reference[0, 0, :5])

# %% [markdown]
# Next the residual stream after every block. `block_outputs` records what each block of our model
# returns during one ordinary forward pass, with forward hooks, so no code is duplicated.
# `transformers` returns the same stream with `output_hidden_states=True`, with one quirk worth
# knowing: its **last** entry has already been through the final LayerNorm `ln_f`.

# %%
#| export
def block_outputs(model: torch.nn.Module, idx: torch.Tensor) -> list[torch.Tensor]:
    """The residual stream after the embedding and after each block: L + 1 tensors [B, T, C].

    Recorded by forward hooks during one ordinary `model(idx)` call.
    """
    seen: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _in, out: seen.append(out)) for m in (model.embed, *model.blocks)]
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return seen

# %%
mine = block_outputs(ours, idx)
with torch.no_grad():
    theirs = hf(idx, output_hidden_states=True).hidden_states
    mine[-1] = ours.ln_f(mine[-1])  # HF's last entry is after ln_f
for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
    name = "embedding" if i == 0 else f"block {i - 1}" + (" + ln_f" if i == len(mine) - 1 else "")
    print(f"{name:16} {tuple(a.shape)} within 1e-5: {torch.allclose(a, b, atol=1e-5, rtol=0)}")

# %% [markdown]
# Finally, inside one block, side by side. Forward hooks on both models catch each intermediate value
# of block 0: the LayerNorm, the packed q|k|v, the heads' output before and after the projection, the
# MLP's expansion, its GELU and its contraction. Both columns show the first three numbers of
# position 0; the plot shows the largest difference at each stage.

# %%
# our block's module -> the Hugging Face module holding the same weights, read off the name map (8.2)
hf_module = {ours.removeprefix("blocks.0.").rpartition(".")[0]: name.removeprefix("h.0.").rpartition(".")[0]
             for name, (ours, _) in hf_key_map(1).items() if name.startswith("h.0.")}
STAGES = [  # (label, our module, take the module's input instead of its output?)
    ("ln1", "ln1", False), ("packed qkv", "attn.qkv", False), ("heads, concatenated", "attn.proj", True),
    ("attention out", "attn.proj", False), ("ln2", "ln2", False), ("mlp fc", "mlp.fc", False),
    ("GELU(fc)", "mlp.proj", True), ("mlp out", "mlp.proj", False),
]

def capture(block, names_inputs):
    store, hooks = {}, []
    for key, (name, use_input) in names_inputs.items():
        def hook(_m, inp, out, key=key, use_input=use_input):
            store[key] = (inp[0] if use_input else out[0] if isinstance(out, tuple) else out).detach()
        hooks.append(block.get_submodule(name).register_forward_hook(hook))
    return store, hooks

# %%
ours_vals, h1 = capture(ours.blocks[0], {label: (name, inp) for label, name, inp in STAGES})
hf_vals, h2 = capture(hf.transformer.h[0], {label: (hf_module[name], inp) for label, name, inp in STAGES})
with torch.no_grad():
    ours(idx), hf(idx)
for hook in h1 + h2:
    hook.remove()
first3 = lambda t: " ".join(f"{v:8.3f}" for v in t[0, 0, :3].tolist())
print(f"{'stage':20} {'shape':13} {'ours':^26}   {'Hugging Face':^26}  within 1e-5")
for label, *_ in STAGES:
    a, b = ours_vals[label], hf_vals[label]
    print(f"{label:20} {str(tuple(a.shape)):13} {first3(a):26}   {first3(b):26}  {torch.allclose(a, b, atol=1e-5, rtol=0)}")

# %%
diffs = [(ours_vals[s[0]] - hf_vals[s[0]]).abs().max().item() for s in STAGES]
fig, ax = plt.subplots(figsize=(9, 3))
ax.bar([s[0] for s in STAGES], [max(d, 1e-10) for d in diffs])
ax.axhline(1e-5, color="red", linestyle="--", label="tolerance 1e-5")
ax.set_yscale("log"), ax.set_ylabel("max |ours - HF|"), ax.legend()
ax.set_title("Block 0, stage by stage: differences are float32 rounding")
plt.xticks(rotation=30, ha="right")
plt.show()

# %% [markdown]
# ### Generation, token for token
#
# Equal logits should give equal greedy text. Our `generate` (chapter 07) with `temperature=0` picks
# the most likely token each step, reusing the KV cache; `transformers`' `generate(do_sample=False)`
# does the same with its own cache. Forty new tokens for two prompts of five tokens:

# %%
prompt = idx[:, :5]
ours_tokens = generate(ours, prompt, max_new_tokens=40, temperature=0, use_cache=True)
hf_tokens = hf.generate(prompt, max_new_tokens=40, do_sample=False, pad_token_id=0,
                        attention_mask=torch.ones_like(prompt))
print("identical, token for token:", torch.equal(ours_tokens, hf_tokens))
print("ours:", ours_tokens[0, 5:25].tolist())
print("HF:  ", hf_tokens[0, 5:25].tolist())

# %% [markdown]
# ### The way back: our GPT inside `transformers`
#
# The translation also works in the other direction. A GPT made by our own code with GPT-2's choices,
# for instance one trained as in chapter 06 but with biases on and `activation="gelu_tanh"` (the `tiny`
# preset turns biases off), can be handed to `transformers` and run by its `generate`, its pipelines,
# or anything else built on `GPT2LMHeadModel`.
#
# **Your turn - Exercise 8.4 (★★☆, extend).** Write `my_to_hf_state_dict(model)`: for one of our `GPT`s
# shaped like GPT-2 (learned positions, pre-norm, biases, tied head), the dict of tensors that a
# `GPT2LMHeadModel` of the same sizes accepts with `load_state_dict`. Its names are those of
# `GPT2LMHeadModel(...).state_dict()`: the body's tensors with the `transformer.` prefix, plus
# `lm_head.weight`, which that `state_dict` lists even though it is the same tensor as `wte`. Each
# weight must be in the layout its module expects. The map you built in 8.2, read backwards, does most
# of the work. The cell after the check gives a fresh GPT of ours, with every weight drawn at random, to
# `transformers`.

# %%
# Your turn - Exercise 8.4 (★★☆, extend): export our GPT in Hugging Face's GPT-2 layout.
def my_to_hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """Our GPT (GPT-2's shape) -> {"transformer.wte.weight": ..., ..., "lm_head.weight": ...} for GPT2LMHeadModel."""
    ### BEGIN SOLUTION
    ours = model.state_dict()
    out = {}
    for hf_name, (name, transpose) in hf_key_map(len(model.blocks)).items():
        t = ours[name].detach()
        out["transformer." + hf_name] = (t.T if transpose else t).contiguous()
    out["lm_head.weight"] = ours["lm_head.weight"].detach()
    return out
    ### END SOLUTION


to_hf_state_dict = check_to_hf_state_dict(my_to_hf_state_dict).use

# %%
torch.manual_seed(7)
fresh = GPT(stand_in_cfg).eval()  # our initialisation, then every tensor moved at random
with torch.no_grad():
    for p in fresh.parameters():
        p.add_(0.1 * torch.randn_like(p))
hf_twin = make_hf_stand_in(seed=1)  # same sizes, other numbers: about to be overwritten
hf_twin.load_state_dict(to_hf_state_dict(fresh))
with torch.no_grad():
    same = torch.allclose(hf_twin(idx).logits, fresh(idx)[0], atol=1e-5, rtol=0)
print("transformers, holding our GPT's weights, computes our logits within 1e-5:", same)

# %% [markdown]
# How fast is each? Hugging Face's `generate` is a general tool: logits processors, stopping criteria
# and cache objects that serve every model on the Hub run at every step. Ours does one thing. The cell
# below times both on the stand-in, on one thread and by CPU time (the work done, which other programs
# on a busy machine do not inflate); its figures vary from machine to machine, so they are not part of
# the stored outputs that the course checks.
#
# `benchmarks/bench_decode.py` repeats the race for models up to GPT-2's size and writes
# `benchmarks/results/decode.md` and `.json`; the stored figures from the machine it last ran on follow
# the timing cell. Next to each race it measures a **bound**: the machine's speed of reading memory,
# divided by the bytes of weights (and cache) a decode step must read. At one sequence every weight is
# read once per token, so no implementation, ours or Hugging Face's, can beat that bound; for GPT-2's
# size both come close to it, and only fewer bytes per weight would go faster. The optional appendix
# chapter at the end of the course works this out and tries bf16 weights.

# %%
import time


def tokens_per_cpu_second(run, n_new=64, repeats=3):
    run()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return prompt.shape[0] * n_new / best

# %%
# NBVAL_IGNORE_OUTPUT
threads = torch.get_num_threads()
torch.set_num_threads(1)
ours_speed = tokens_per_cpu_second(lambda: generate(ours, prompt, 64, temperature=0))
hf_speed = tokens_per_cpu_second(lambda: hf.generate(prompt, max_new_tokens=64, do_sample=False, pad_token_id=0,
                                                     attention_mask=torch.ones_like(prompt)))
torch.set_num_threads(threads)
print(f"ours {ours_speed:,.0f}, HF {hf_speed:,.0f} tokens per CPU second: {ours_speed / hf_speed:.1f}x")

# %%
# NBVAL_IGNORE_OUTPUT
# (printed from a file that `make bench` rewrites on the machine it runs on)
import json  # noqa: E402
from pathlib import Path  # noqa: E402

stored = Path("../benchmarks/results/decode.json")
race = json.loads(stored.read_text()) if stored.is_file() else {"rows": []}  # a copy of the notebook alone has none
if race["rows"]:
    print(f"{race['meta']['cpu']}, {race['meta']['threads']} thread, stored {race['meta']['written']}, "
          f"memory read at {race['meta']['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s\n")
    print(f"{'model':36s} {'params':>7s} {'ours/HF':>8s} {'same tokens':>11s} {'share of the bound':>18s}")
for r in race["rows"]:
    print(f"{r['model']:36s} {r['params'] / 1e6:6.1f}M {r['vs_hf']:7.2f}x {str(r['same_tokens']):>11s} "
          f"{r['fraction_of_bound']:18.2f}")
if not race["rows"]:
    print(f"no stored benchmark at {stored}: run benchmarks/bench_decode.py in the course's folder")

# %% [markdown]
# ## 8. The real GPT-2 (124M)
#
# Everything above used a stand-in. With a network connection, the cell below downloads OpenAI's
# 124M-parameter GPT-2 from the Hub once (about 550 MB, then cached), loads it into our GPT, tokenizes
# a prompt with GPT-2's own BPE vocabulary (tiktoken's `"gpt2"` encoding, also a download on first
# use), and continues it greedily. Offline it says so in one line and the chapter goes on: the
# stand-in has already shown that the same code gives the same numbers as `transformers`.

# %%
from transformer_course import get_encoding

try:
    gpt2, enc = pretrained.from_pretrained("gpt2"), get_encoding("gpt2")
except (ConnectionError, RuntimeError) as e:  # HubUnavailableError is a ConnectionError; RuntimeError: tiktoken's
    gpt2 = None
    print("Offline, so the real GPT-2 is skipped:", e)
if gpt2 is not None:
    start = torch.tensor([enc.encode("The transformer architecture is")])
    out = generate(gpt2, start, max_new_tokens=30, temperature=0)
    print(f"{gpt2.num_parameters():,} parameters")
    print(enc.decode(out[0].tolist()))

# %% [markdown]
# Online, the same comparison as in section 7 can be made on the real weights: Hugging Face's model
# reads the very same cached files.

# %%
if gpt2 is None:
    print("Offline: nothing to compare.")
else:
    from transformers import GPT2LMHeadModel

    reference_gpt2 = GPT2LMHeadModel.from_pretrained(download_hf_gpt2("gpt2")).eval()
    with torch.no_grad():
        ours_logits, hf_logits = gpt2(start)[0], reference_gpt2(start).logits
    print(f"largest |logit difference| on {start.shape[1]} tokens: {(ours_logits - hf_logits).abs().max():.1e}"
          f" (logits span {hf_logits.min():.0f} .. {hf_logits.max():.0f})")

# %% [markdown]
# ## Quick check

# %%
from transformer_course.quiz import Question, quiz

quiz([
    Question("Hugging Face's GPT-2 stores c_fc.weight as [768, 3072]. Why does our loader transpose it?",
             options=["To make it contiguous in memory",
                      "Conv1D computes x @ W + b with W as [in, out]; nn.Linear keeps [out, in] and computes x @ W.T + b",
                      "Because GPT-2 was trained on transposed text"],
             answer=1, explain="Same numbers, opposite storage convention, inherited from the TensorFlow original."),
    Question("Why does the stand-in draw every tensor at random, LayerNorm weights and biases included?",
             options=["To make the download smaller",
                      "So that a loader that swaps or skips any tensor changes the outputs and fails the proof",
                      "Because transformers cannot initialise a GPT-2"],
             answer=1, explain="With LayerNorm weights all 1 and biases all 0, swapping ln_1 and ln_2 would go unseen."),
    Question("The checkpoint has no lm_head.weight. Where do the output layer's weights come from?",
             options=["They are the token embedding wte (tied weights)", "They are initialised at random",
                      "They are the position embedding wpe"],
             answer=0, explain="GPT-2 scores the next token with ln_f(h) @ wte.T; one matrix serves both ends."),
    Question("Loading GPT-2's weights into a GPT with the exact (erf) GELU gives ...",
             options=["identical logits", "logits that differ by more than our 1e-5 tolerance", "NaN logits"],
             answer=1, explain="GPT-2 was trained with the tanh approximation; the small gap grows through the layers."),
])

# %% [markdown]
# ## Summary
#
# - GPT-2 is the model chapters 02 to 06 built; loading its weights only means translating names,
#   transposing `Conv1D` weights ([in, out] to [out, in]), and loading the packed `c_attn` as our
#   packed `qkv` (same [q | k | v] layout, heads contiguous). You wrote the name map; the loader ran
#   on it. Of the four transposes per block, only the square `attn.c_proj` can be forgotten silently.
# - A reader written for another family's packing (per head, as in GPT-NeoX) gives the right shapes
#   and the wrong attention: only a comparison with the reference finds it.
# - The output layer is tied to the token embedding, so the file does not store it; our `lm_head`
#   *is* `embed.token.weight`.
# - GPT-2 uses the tanh approximation of GELU and LayerNorm with ε = 1e-5 inside the square root;
#   the exact GELU, or source 2's `σ + ε`, would move the outputs beyond a 1e-5 tolerance.
# - On a random GPT-2 built with `transformers`, our model matches the reference logits, every
#   block's output and every intermediate value within 1e-5, and greedy generation token for token.
# - The map read backwards exports our own GPT in GPT-2's layout, and `transformers` computes the
#   same logits from it.
# - `from_pretrained("gpt2")` runs the real 124M model when a network connection is there, and says so
#   clearly when it is not.
#
# **Exported to `transformer_course/pretrained.py`:** `from_pretrained`, `read_hf_gpt2` (which
# `from_pretrained` builds on), `config_from_hf`, `convert_hf_state_dict`, `read_hf_state_dict`, `hf_key_map`, `download_hf_gpt2`,
# `hub_reachable`, `HubUnavailableError`, `block_outputs`, `make_hf_stand_in`, `HF_ACTIVATIONS`.
