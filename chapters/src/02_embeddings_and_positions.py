# %% [markdown]
# # Chapter 02: embeddings and positional encoding
#
# **What this chapter builds.** The first layer of the GPT: the module that turns token ids
# `[B, T]` into vectors `[B, T, C]`. It has two parts: a *token embedding* (a learned table with one
# row per vocabulary entry) and a *position code* (either a second learned table or fixed sine and
# cosine waves), added together.
#
# **What you will be able to do.** Explain why a lookup table is the same thing as multiplying a
# one-hot vector by a matrix; compute the sinusoidal encoding from its formula and check it against a
# published table; say what makes sinusoids a good position code (bounded, distinct, shift = rotation,
# similarity that fades with distance); and use `InputEmbedding`, which chapter 06's GPT is built on.
#
# **What it needs.** Chapter 01's idea of token ids (integers `0 .. V-1`). Nothing else.
#
# Shapes, as everywhere in the course: `B` batch, `T` time (sequence length), `C` = `d_model`
# channels, `V` vocabulary size.

# %%
#| default_exp positional

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from transformer_course.runtime import seed_everything

torch.set_printoptions(precision=4, sci_mode=False)
_ = seed_everything(0)

# %% [markdown]
# ## The module
#
# The exported code comes first so the chapter can use it; each part is then taken apart and
# checked in the sections that follow.

# %%
#| export
"""Token embeddings and positional encodings: token ids [B, T] -> input vectors [B, T, C].

A learned lookup table gives every token a vector; a position code tells the model where in the
sequence each token sits. The position code is either a second learned table or the fixed sine and
cosine waves of Vaswani et al., "Attention Is All You Need" (2017), section 3.5, with position 0
first. Exported from chapters/02_embeddings_and_positions.ipynb.

Shapes: B batch, T time (sequence length), C = d_model channels, V vocabulary size.
"""

from __future__ import annotations

import torch
from torch import nn

POSITIONAL_KINDS = ("learned", "sinusoidal")


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value

# %%
#| export
def sinusoidal_frequencies(d_model: int, base: float = 10000.0) -> torch.Tensor:
    """Angular frequencies [C/2] (float64) of the sinusoidal code, one per (sin, cos) column pair.

    Pair i (columns 2i and 2i+1) turns by w_i = base^(-2i/C) radians per position, so its
    wavelength is 2*pi*base^(2i/C) positions: 2*pi for the first pair, about 2*pi*base for the last.
    """
    _check_int("d_model", d_model, 1)
    if d_model % 2:
        raise ValueError(
            f"d_model must be even for the sinusoidal encoding, got {d_model}: its columns come in "
            f"(sin, cos) pairs that share one frequency. Use an even width such as {d_model + 1}, "
            "or learned positions (positional='learned'), which accept any width"
        )
    if not isinstance(base, (int, float)) or isinstance(base, bool) or not base > 1:
        raise ValueError(f"base must be a number > 1 (the paper uses 10000.0), got {base!r}")
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # 0, 2, 4, ..., C-2
    return float(base) ** (-two_i / d_model)


def sinusoidal_positional_encoding(
    n_positions: int, d_model: int, base: float = 10000.0, *, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The fixed position code [n_positions, C]; row p encodes position p (position 0 first).

    PE[p, 2i] = sin(p * w_i) and PE[p, 2i+1] = cos(p * w_i) with w_i = base^(-2i/C)
    (see :func:`sinusoidal_frequencies`). Computed in float64, returned in ``dtype`` (default: torch's
    default dtype). ``d_model`` must be even.
    """
    _check_int("n_positions", n_positions, 1)
    omega = sinusoidal_frequencies(d_model, base)  # (C/2,)
    angles = torch.arange(n_positions, dtype=torch.float64)[:, None] * omega  # (n, C/2)
    pe = torch.empty(n_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)  # even columns: sine
    pe[:, 1::2] = torch.cos(angles)  # odd columns: cosine of the same angle
    return pe.to(dtype or torch.get_default_dtype())

# %%
#| export
def position_shift_matrix(
    offset: int, d_model: int, base: float = 10000.0, *, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The matrix M [C, C] with PE[p + offset] = M @ PE[p] for every position p.

    It is block diagonal: each (sin, cos) pair is rotated by the angle offset * w_i. It depends on the
    offset only, not on p, which is why a linear layer can read relative positions off the code.
    """
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset must be an int (positive, zero or negative), got {type(offset).__name__}")
    phi = offset * sinusoidal_frequencies(d_model, base)  # (C/2,) rotation angle of each pair
    cos, sin = torch.cos(phi), torch.sin(phi)
    even = torch.arange(0, d_model, 2)
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    m[even, even], m[even, even + 1] = cos, sin  # sin(a+b) = sin a cos b + cos a sin b
    m[even + 1, even], m[even + 1, even + 1] = -sin, cos  # cos(a+b) = cos a cos b - sin a sin b
    return m.to(dtype or torch.get_default_dtype())

# %%
#| export
class InputEmbedding(nn.Module):
    """Token ids [B, T] -> token vector + position vector, then dropout: [B, T, C].

    - ``token``: ``nn.Embedding(V, C)``, one learned row per vocabulary entry.
    - ``positional="learned"``: ``position`` is ``nn.Embedding(block_size, C)``, one learned row per
      position (GPT-2's choice).
    - ``positional="sinusoidal"``: the fixed code of :func:`sinusoidal_positional_encoding`, kept as
      the non-persistent buffer ``pe`` [block_size, C] (not trained, not saved); ``position`` is None.

    ``forward(idx, start_pos=0)`` places the T tokens at positions ``start_pos .. start_pos+T-1``, so
    a model that has already seen ``start_pos`` tokens (the KV cache) can embed only the new ones.
    """

    def __init__(
        self, vocab_size: int, d_model: int, block_size: int, positional: str = "learned", dropout: float = 0.0
    ):
        super().__init__()
        self.vocab_size = _check_int("vocab_size", vocab_size, 1)
        self.d_model = _check_int("d_model", d_model, 1)
        self.block_size = _check_int("block_size", block_size, 1)
        if positional not in POSITIONAL_KINDS:
            raise ValueError(f"positional must be one of {POSITIONAL_KINDS}, got {positional!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise ValueError(f"dropout is a probability in [0, 1), got {dropout!r}")
        self.positional = positional
        self.token = nn.Embedding(vocab_size, d_model)  # (V, C)
        if positional == "learned":
            self.position = nn.Embedding(block_size, d_model)  # (block_size, C)
        else:
            self.position = None
            pe = sinusoidal_positional_encoding(block_size, d_model)  # (block_size, C)
            self.register_buffer("pe", pe, persistent=False)  # rebuilt from the formula, never saved
        self.drop = nn.Dropout(dropout)

    def extra_repr(self) -> str:
        return f"positional={self.positional!r}, block_size={self.block_size}"

    def positions(self, T: int, start_pos: int = 0) -> torch.Tensor:
        """Position vectors [T, C] for positions start_pos .. start_pos+T-1 (clear error past block_size)."""
        _check_int("T", T, 0)
        _check_int("start_pos", start_pos, 0)
        end = start_pos + T
        if end > self.block_size:
            raise ValueError(
                f"positions {start_pos}..{end - 1} do not fit: this embedding holds positions "
                f"0..{self.block_size - 1} (block_size={self.block_size}). Crop the input to its last "
                f"{self.block_size - start_pos} tokens (idx[:, -{self.block_size - start_pos}:]) "
                "or build the model with a larger block_size"
            )
        if self.position is None:
            return self.pe[start_pos:end]  # (T, C)
        pos = torch.arange(start_pos, end, device=self.position.weight.device)  # (T,)
        return self.position(pos)  # (T, C)

    def _check_ids(self, idx) -> None:
        if not isinstance(idx, torch.Tensor):
            raise TypeError(f"idx must be a tensor of token ids [B, T], got {type(idx).__name__}: use torch.tensor(ids)")
        if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
            raise TypeError(f"token ids must be integers, got dtype {idx.dtype}: convert with idx.long()")
        if idx.ndim != 2:
            fix = ": add a batch dimension with idx[None]" if idx.ndim == 1 else ""
            raise ValueError(f"idx must have shape [B, T] (batch, time), got {tuple(idx.shape)}{fix}")
        if idx.numel() == 0:
            return
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"token id {bad} is outside the vocabulary: ids must be in 0..{self.vocab_size - 1} "
                f"(vocab_size={self.vocab_size}). Check that the tokenizer matches the model, or build "
                f"it with vocab_size >= {max(hi + 1, self.vocab_size)} (largest id + 1)"
            )

    def forward(self, idx: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """idx [B, T] integer token ids -> [B, T, C] = token[idx] + position[start_pos : start_pos+T]."""
        self._check_ids(idx)
        T = idx.shape[1]
        tok = self.token(idx)  # (B, T, C)
        pos = self.positions(T, start_pos)  # (T, C), broadcast over the batch
        return self.drop(tok + pos)  # (B, T, C)

# %% [markdown]
# (The rest of the chapter comes next.)

# %%
emb = InputEmbedding(vocab_size=100, d_model=8, block_size=16, positional="sinusoidal")
x = emb(torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(0)))
print(tuple(x.shape))
