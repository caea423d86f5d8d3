"""Build a GPT-style decoder-only transformer from nothing, one Jupyter chapter at a time, offline on a laptop CPU.

Modules:

- `transformer_course.arguments`: Argument checks shared by every module (hand-written, not exported): one wording for one mistake.
- `transformer_course.attention`: Scaled dot-product attention, the causal mask, and one attention head. Attention is softmax(q kᵀ / √d_k) v (Vaswani et al. 2017, section 3.2.1). Shapes: B batch, T time, C = d_model channels, hs head size; T_q / T_k query / key positions, d_k the width of queries and keys, d_v the width of values.
- `transformer_course.block`: The transformer block: layer normalisation, the position-wise feed-forward network, and the residual block around them and chapter 04's multi-head attention, [B, T, C] -> [B, T, C].
- `transformer_course.checks.attention`: Checks for chapter 03's exercises (single-head attention). Hand-written.
- `transformer_course.checks.block`: Checks for chapter 05's exercises (the transformer block). Hand-written.
- `transformer_course.checks.encoder_decoder`: Checks for chapter 09's exercises (encoder-decoder and cross-attention). Hand-written.
- `transformer_course.checks.generation`: Checks for chapter 07's exercises (generation, sampling and the KV cache). Hand-written.
- `transformer_course.checks.model`: Checks for chapter 06's exercises (the GPT model and its training).
- `transformer_course.checks.modern`: Checks for chapter 10's exercises (the modern decoder: RMSNorm, RoPE, grouped-query attention). Hand-written.
- `transformer_course.checks.multihead`: Checks for chapter 04's exercises (multi-head attention). Hand-written.
- `transformer_course.checks.positional`: Checks for chapter 02's exercises: embeddings and positional encoding (hand-written).
- `transformer_course.checks.pretrained`: Checks for chapter 08's exercises (loading GPT-2 weights). Hand-written.
- `transformer_course.checks.tokenization`: Checks for chapter 01's exercises (tokenization). Hand-written.
- `transformer_course.classroom`: Classroom tools: the student edition of the chapters, and grading of student notebooks (hand-written).
- `transformer_course.cli`: The ``transformer-course`` command (hand-written, not exported).
- `transformer_course.course_model`: The course's trained models: trained once by the course's own code and shipped inside the package (hand-written, not exported).
- `transformer_course.data`: Training data for the course: Shakespeare's plays as plain text, and batches of token ids.
- `transformer_course.distributed`: Data-parallel training under ``torchrun`` (hand-written; taught in the appendix chapter 90).
- `transformer_course.encoder_decoder`: The encoder-decoder transformer of Vaswani et al. (2017), built on chapters 03-05 (chapter 09).
- `transformer_course.environment`: What the course needs installed, and whether this environment has it (hand-written, not exported).
- `transformer_course.exercise_cells`: Exercise cells: how the student edition, the leak check and the grader find and name an exercise (hand-written).
- `transformer_course.faults`: Test-only fault injection (hand-written, not exported): a process fails or kills itself at a chosen point, so the tests of crashes and restarts trigger their fault by a count of events, never by a timer.
- `transformer_course.generation`: Generation: turn a GPT's logits into text, one token at a time (exported from chapter 07).
- `transformer_course.grading`: Grading handed-in notebooks: which exercises passed, failed, are not done, were not run or are missing (hand-written).
- `transformer_course.grading_sandbox`: Run one handed-in notebook for the grader: a fresh kernel, one time limit for the whole notebook and, where Linux allows it, a sandbox (hand-written).
- `transformer_course.leak_check`: The leak check: does a student edition reproduce a solution somewhere else in its notebook? (hand-written)
- `transformer_course.model`: The whole GPT: an embedding, a stack of transformer blocks, a final LayerNorm and a language-model head that gives every position one logit per vocabulary entry (chapter 06, which also writes `config.py`, `training.py` and `checkpoint.py`). Shapes: B batch, T time (positions), C = d_model channels, V vocabulary size.
- `transformer_course.modern`: From GPT-2 to a modern decoder (chapter 10): RMSNorm, the SwiGLU MLP, rotary positions (RoPE) and grouped-query attention, the four parts in which Llama, Mistral and Qwen differ from chapter 06's GPT.
- `transformer_course.multihead`: Multi-head causal self-attention (chapter 04), with the KV cache used for generation.
- `transformer_course.performance`: Performance helpers (the appendix): how fast this machine reads memory, and a bf16-weights copy of a model for decoding.
- `transformer_course.positional`: Token embeddings and positional encodings: token ids [B, T] -> input vectors [B, T, C].
- `transformer_course.pretrained`: Load GPT-2 weights saved in Hugging Face's layout into the course's `GPT` (exported from chapter 08).
- `transformer_course.quiz`: Quick self-test questions at the end of each chapter, as an offline ipywidgets quiz.
- `transformer_course.tokenization`: Tokenization: text to integer ids and back. A text of T tokens becomes T ids in 0..V-1 (V the vocabulary size). `CharTokenizer`: one id per distinct character. `BPETokenizer`: byte-level byte-pair encoding (Sennrich et al. 2016; GPT-2, Radford et al. 2019) on the merge loop of `bpe.py` and the pre-splitting of `presplit.py` (both exported from this chapter too); trained, encoded in flat memory however long the text (`encode_stream`), loaded from untrusted files with checks, built from a tiktoken vocabulary (`from_tiktoken`) or turned into a fast `tiktoken.Encoding` with identical ids (`to_tiktoken`). `get_encoding`: tiktoken's encodings; "cl100k_base" (GPT-4) works offline.
- `transformer_course.viz`: Plotting helpers shared by several chapters (hand-written, not exported)."""

# The docstring above is written by nbdev-export (one line per module, from each module's docstring).
#
# Public names are imported lazily (PEP 562): ``import transformer_course`` is quick and each
# chapter's module loads when one of its names is first used, e.g.
#     from transformer_course import GPT, GPTConfig, generate, CharTokenizer
# Modules generated from a notebook say so on their first line: edit the notebook, not the module.

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _installed_version

try:  # one source of truth: pyproject.toml's version, as pip installed it
    __version__ = _installed_version("transformer-course")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

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
