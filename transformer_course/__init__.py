"""transformer-course: a decoder-only transformer (GPT) built from nothing, one chapter at a time.

The public names below are imported lazily (PEP 562), so ``import transformer_course`` is quick and
each chapter's module loads only when one of its names is first used::

    from transformer_course import GPT, GPTConfig, generate, CharTokenizer

Every module named "exported" below is generated from a notebook in ``chapters/``: edit the notebook,
not the module (its first line says which notebook).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it (DESIGN.md, "Public API")
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
    "GPTConfig": "model",
    "GPT": "model",
    "TrainConfig": "training",
    "train": "training",
    "save_checkpoint": "training",
    "load_checkpoint": "training",
    # chapter 07 (exported)
    "generate": "generation",
    "stream": "generation",
    # chapter 08 (exported)
    "load_hf_gpt2": "pretrained",
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
