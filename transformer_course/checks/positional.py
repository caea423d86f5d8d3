"""Checks for chapter 02's exercises: embeddings and positional encoding (hand-written).

Each check runs the learner's function against the package's reference on ordinary and edge inputs
and, when the answer is wrong, recognises the usual slips (positions counted from 1, sine and cosine
swapped, the column index in the exponent, a rotation the wrong way round, ...) and names them.
"""

from __future__ import annotations

import torch

from ..positional import position_shift_matrix, sinusoidal_positional_encoding
from ._core import CheckFailed, check, expect, expect_close

_F64 = torch.float64


def _as_tensor(out, what: str) -> torch.Tensor:
    expect(isinstance(out, torch.Tensor), f"return a torch.Tensor ({what}), got {type(out).__name__}")
    expect(not out.dtype.is_complex and out.dtype != torch.bool, f"return real numbers ({what}), got {out.dtype}")
    return out.detach().to(_F64)


def _close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, atol=atol, rtol=0)


def _first_mismatch(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-5) -> tuple[int, ...]:
    bad = ((got - want).abs() > atol).nonzero()
    return tuple(bad[0].tolist())


# --- Exercise 2.1 ---------------------------------------------------------------------------------


@check("2.1", "one_hot_embedding")
def check_one_hot_embedding(fn) -> None:
    """``fn(ids [B, T], table [V, C]) -> [B, T, C]`` must equal ``table[ids]``."""
    table = torch.randn(7, 3, generator=torch.Generator().manual_seed(0))  # V = 7, C = 3
    with_last = torch.tensor([[0, 6, 2], [3, 3, 1]])  # contains the largest id V - 1 = 6
    without_last = torch.tensor([[1, 4, 2, 0, 4]])  # largest id 4 < V - 1
    for ids in (with_last, without_last):
        try:
            out = fn(ids, table)
        except RuntimeError as error:
            if "dtype" in str(error):
                raise CheckFailed(
                    "F.one_hot returns integers (torch.long) but the table holds floats: convert the "
                    "one-hot vectors with .to(table.dtype) (or .float()) before multiplying"
                ) from None
            if ids is without_last:
                raise CheckFailed(
                    "it works when the ids include the largest one (V - 1) and fails when they do not: "
                    "F.one_hot guesses the vector length from the largest id it sees; pass "
                    "num_classes=table.shape[0]"
                ) from None
            raise
        got = _as_tensor(out, "[B, T, C]")
        B, T = ids.shape
        V, C = table.shape
        expect(
            tuple(got.shape) != (B, T, V),
            f"you returned the one-hot vectors [B, T, V] = {[B, T, V]}: multiply them by the table "
            f"[V, C] to get [B, T, C] = {[B, T, C]}",
        )
        expect(tuple(got.shape) == (B, T, C), f"expected shape [B, T, C] = {[B, T, C]}, got {list(got.shape)}")
        want = table[ids].to(_F64)
        if not _close(got, want):
            b, t, _ = _first_mismatch(got, want)
            raise CheckFailed(
                f"out[{b}, {t}] should be row {ids[b, t].item()} of the table (the id at that place), "
                f"but it is not"
            )


# --- Exercise 2.2 ---------------------------------------------------------------------------------


def _literal_seed_001(n_positions: int, d_model: int) -> torch.Tensor:
    """The slip of seed 001: column j uses the exponent 2j/C instead of 2*floor(j/2)/C."""
    j = torch.arange(d_model, dtype=_F64)
    angles = torch.arange(n_positions, dtype=_F64)[:, None] / 10000 ** (2 * j / d_model)
    return torch.where(j % 2 == 0, torch.sin(angles), torch.cos(angles))


@check("2.2", "sinusoidal")
def check_sinusoidal(fn) -> None:
    """``fn(n_positions, d_model)`` must equal :func:`sinusoidal_positional_encoding` (position 0 first)."""
    for n, d in ((16, 64), (5, 6)):
        got = _as_tensor(fn(n, d), "[n_positions, d_model]")
        expect(
            tuple(got.shape) != (d, n) or n == d,
            f"rows are positions and columns dimensions: expected [n_positions, d_model] = {[n, d]}, "
            f"you returned [d_model, n_positions] = {[d, n]}",
        )
        expect(tuple(got.shape) == (n, d), f"expected shape [n_positions, d_model] = {[n, d]}, got {list(got.shape)}")
        want = sinusoidal_positional_encoding(n, d, dtype=_F64)
        if _close(got, want):
            continue
        expect(
            not _close(got, sinusoidal_positional_encoding(n + 1, d, dtype=_F64)[1:]),
            "your row 0 is position 1: count positions from 0, so the first row is [0, 1, 0, 1, ...] "
            "(sin 0 = 0, cos 0 = 1); seed 004 counts from 1",
        )
        swap = torch.arange(d).view(-1, 2).flip(1).flatten()  # 1, 0, 3, 2, ...
        expect(
            not _close(got, want[:, swap]),
            "sine and cosine are swapped: even columns (0, 2, ...) take the sine and odd columns the "
            "cosine, so row 0 reads [0, 1, 0, 1, ...]",
        )
        expect(
            not _close(got, _literal_seed_001(n, d)),
            f"columns 2i and 2i+1 must share one frequency, 10000^(-2i/d_model); you put the column "
            f"index j in place of 2i (exponent 2j/d_model), as seed 001's formula reads. PE[1, 2] "
            f"should be {want[1, 2].item():.6f}, yours is {got[1, 2].item():.6f}",
        )
        p, j = _first_mismatch(got, want)
        raise CheckFailed(
            f"PE[{p}, {j}] (n_positions={n}, d_model={d}) should be {want[p, j].item():.6f}, yours is "
            f"{got[p, j].item():.6f}: {'sin' if j % 2 == 0 else 'cos'}({p} * 10000^(-{j - j % 2}/{d}))"
        )


# --- Exercise 2.3 ---------------------------------------------------------------------------------


@check("2.3", "shift_matrix")
def check_shift_matrix(fn) -> None:
    """``fn(offset, d_model)`` must return M [C, C] with PE[p + offset] = M @ PE[p]."""
    for offset, d in ((3, 8), (-2, 8), (10, 64), (0, 4)):
        got = _as_tensor(fn(offset, d), "[d_model, d_model]")
        expect(tuple(got.shape) == (d, d), f"expected shape [d_model, d_model] = {[d, d]}, got {list(got.shape)}")
        want = position_shift_matrix(offset, d, dtype=_F64)
        if _close(got, want):
            continue
        expect(
            offset == 0 or not _close(got, want.T),
            f"your matrix moves codes backwards (PE[p] -> PE[p - {offset}]): in each 2x2 block put "
            "+sin(k*w) in the top-right corner (row 2i, column 2i+1) and -sin(k*w) bottom-left",
        )
        expect(
            not _close(got, torch.diag(want.diagonal())),
            "only the cosines are there: a rotation also mixes each sine with its cosine partner "
            "through the off-diagonal +sin(k*w) and -sin(k*w) of each 2x2 block",
        )
        pe = sinusoidal_positional_encoding(40, d, dtype=_F64)  # (40, C)
        lo = max(0, -offset)
        moved = pe[lo : 40 - max(0, offset)] @ got.T  # row p -> M @ PE[p]
        expect_close(
            moved,
            pe[lo + offset : 40 - max(0, offset) + offset],
            f"M @ PE[p] should equal PE[p + {offset}] (d_model={d}); each pair (2i, 2i+1) turns by "
            f"{offset} * 10000^(-2i/d_model) radians",
            atol=1e-5,
        )
        raise CheckFailed(
            f"M @ PE[p] matches PE[p + {offset}] on the positions tried, but M (d_model={d}) is not the "
            "block-diagonal rotation: 2x2 blocks [[cos, sin], [-sin, cos]] on the diagonal, zeros elsewhere"
        )


# --- Exercise 2.4 ---------------------------------------------------------------------------------


@check("2.4", "dot_by_offset")
def check_dot_by_offset(fn) -> None:
    """``fn(offsets [K], d_model) -> [K]`` must give PE[p] . PE[p + k] for each gap k."""
    for d in (64, 8):
        offsets = torch.tensor([0, 1, 2, 5, 17, 100, -3])
        got = _as_tensor(fn(offsets, d), "[K]")
        expect(tuple(got.shape) == (len(offsets),), f"expected one number per offset, shape {[len(offsets)]}, got {list(got.shape)}")
        pe = sinusoidal_positional_encoding(110, d, dtype=_F64)  # (110, C)
        want = torch.stack([pe[5] @ pe[5 + k] for k in offsets.tolist()])  # start at p = 5
        if _close(got, want, atol=1e-5):
            continue
        expect(
            abs(got[0].item() - d) > 1e-6,
            f"at gap 0 the dot product is a row's squared length, d_model/2 = {d // 2} (each pair gives "
            f"sin^2 + cos^2 = 1); you got {d}: there are d_model/2 frequencies, not d_model",
        )
        omega = 10000 ** (-torch.arange(0, d, 2, dtype=_F64) / d)
        sines = torch.sin(offsets.to(_F64)[:, None] * omega).sum(1)
        expect(
            not _close(got, sines, atol=1e-5),
            "sin(p*w) sin(q*w) + cos(p*w) cos(q*w) = cos((q - p) * w): sum cosines of the gap, not sines",
        )
        expect_close(got, want, f"the dot product at each gap is sum_i cos(k * w_i) over the d_model/2 pairs (d_model={d})", atol=1e-5)


# --- Exercise 2.5 ---------------------------------------------------------------------------------


@check("2.5", "embed")
def check_embed_with_offset(fn) -> None:
    """``fn(idx [B, T], token_table [V, C], position_table [block, C], start_pos=0) -> [B, T, C]``."""
    g = torch.Generator().manual_seed(0)
    token_table = torch.randn(11, 4, generator=g)  # (V, C)
    position_table = torch.randn(8, 4, generator=g)  # (block_size, C)
    idx = torch.tensor([[3, 7, 1], [0, 2, 6]])  # ids < block_size, so a position-by-id slip runs
    for start_pos in (0, 3, 5):
        out = fn(idx, token_table, position_table) if start_pos == 0 else fn(idx, token_table, position_table, start_pos)
        got = _as_tensor(out, "[B, T, C]")
        expect(tuple(got.shape) == (2, 3, 4), f"expected shape [B, T, C] = [2, 3, 4], got {list(got.shape)}")
        want = (token_table[idx] + position_table[start_pos : start_pos + 3]).to(_F64)
        if _close(got, want):
            continue
        expect(
            not _close(got, (token_table[idx] + position_table[idx]).to(_F64)),
            "position rows are chosen by where a token sits (its index t along T), not by its id",
        )
        expect(
            not _close(got, (token_table[idx] + position_table[:3]).to(_F64)),
            f"with start_pos={start_pos} the first token sits at position {start_pos}: add rows "
            f"start_pos .. start_pos+T-1 of the position table; you used rows 0 .. T-1",
        )
        expect(
            not _close(got, token_table[idx].to(_F64)),
            "the position vectors are missing: add position_table[start_pos : start_pos + T] to the token rows",
        )
        b, t, _ = _first_mismatch(got, want)
        raise CheckFailed(
            f"out[{b}, {t}] should be token_table[{idx[b, t].item()}] + position_table[{start_pos + t}] "
            f"(start_pos={start_pos})"
        )
