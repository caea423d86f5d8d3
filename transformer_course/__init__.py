"""Build a GPT-style decoder-only transformer from nothing, one Jupyter chapter at a time (hand-written).

The package has three parts (docs/architecture.md draws them):

- the library, at top level: the modules the chapters export, in chapter order (``tokenization``, ``bpe``,
  ``presplit`` 01; ``positional`` 02; ``attention`` 03; ``multihead`` 04; ``block`` 05; ``config``,
  ``model``, ``training``, ``checkpoint`` 06; ``generation`` 07; ``pretrained`` 08; ``encoder_decoder``,
  ``dates`` 09; ``modern``, ``llama`` 10; ``parallel``, ``performance`` 90) and the hand-written support
  they use (``arguments``, ``runtime``, ``data``, ``viz``);
- ``checks``: one module of exercise checks per chapter, on one shared vocabulary (``checks._core``);
- ``classroom``: the teacher's tools (student edition, grading in a sandbox), with ``cli`` the command line.

A module generated from a chapter says so on its first line and names the one file to edit
(``chapter_sources/NN_name.py``). Public names are imported lazily (PEP 562): ``import transformer_course``
is quick and a chapter's module loads when one of its names is first used, e.g.
``from transformer_course import GPT, GPTConfig, generate, CharTokenizer``.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _installed_version

try:  # one source of truth: pyproject.toml's version, as pip installed it
    __version__ = _installed_version("transformer-course")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

# public name -> module that defines it (docs/architecture.md: the layers; docs/contract.md: every name)
_PUBLIC = {
    # chapter 01 (exported)
    "CharTokenizer": "tokenization",
    "BPETokenizer": "tokenization",
    "get_encoding": "tokenization",
    # chapter 02 (exported)
    "sinusoidal_positional_encoding": "positional",
    "InputEmbedding": "positional",
    # chapter 03 (exported)
    "scaled_dot_product_attention": "attention",
    "causal_mask": "attention",
    "AttentionHead": "attention",
    # chapter 04 (exported)
    "MultiHeadAttention": "multihead",
    "KVCache": "multihead",
    # chapter 05 (exported)
    "LayerNorm": "block",
    "FeedForward": "block",
    "TransformerBlock": "block",
    # chapter 06 (exported)
    "GPTConfig": "config",
    "GPT": "model",
    "TrainConfig": "config",
    "train": "training",
    "save_checkpoint": "checkpoint",
    "load_checkpoint": "checkpoint",
    # chapter 07 (exported)
    "generate": "generation",
    "stream": "generation",
    # chapter 09 (exported)
    "EncoderDecoder": "encoder_decoder",
    "Seq2SeqConfig": "encoder_decoder",
    "CrossAttention": "encoder_decoder",
    # hand-written support code
    "load_shakespeare": "data",
    "train_val_split": "data",
    "get_batch": "data",
    "seed_everything": "runtime",
    "pick_device": "runtime",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'transformer_course' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # cache: later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
