"""Checks for chapter 02's exercises (embeddings and positional encoding). Hand-written.

Each names the usual slips (one-hot vectors of the wrong length, positions counted from 1, sine and cosine swapped, all
the sines first, a rotation the wrong way round, ...); the private references ``_one_hot_embedding`` and
``_grid_positional_encoding`` (2.1, 2.6) are not part of the package's API."""

import math

import torch
import torch.nn.functional as F

from ..positional import position_shift_matrix, sinusoidal_positional_encoding
from ._core import check, close, expect, expect_close, expect_known_crash, expect_match, expect_numbers, expect_tensor

__all__ = ["check_grid_code", "check_one_hot_embedding", "check_predict_embedding_grad",
           "check_predict_row_length", "check_shift_matrix", "check_sinusoidal"]

_F64 = torch.float64


def _real64(out, what: str) -> torch.Tensor:
    """The learner's tensor of real numbers, in float64 for the comparisons (rtol=0 throughout)."""
    expect_tensor(out, what=f"a torch.Tensor ({what})")
    expect(not out.dtype.is_complex and out.dtype != torch.bool, f"return real numbers ({what}), got {out.dtype}")
    return out.detach().to(_F64)


# --- Exercise 2.1 (debug) -------------------------------------------------------------------------
def _one_hot_embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Reference for 2.1: ids [B, T] -> one_hot(ids, V) @ table [V, C] = [B, T, C]."""
    return F.one_hot(ids, num_classes=table.shape[0]).to(table.dtype) @ table


_ONE_HOT_CRASHES = [  # 2.1's usual crashes: integer one-hots; a length guessed from the ids (when they lack V - 1)
    ("dtype", "F.one_hot returns integers (torch.long) but the table holds floats: convert the one-hot vectors with "
     ".to(table.dtype) (or .float()) before multiplying"),
    ("", "it works when the ids include the largest one (V - 1) and fails when they do not: F.one_hot guesses the "
     "vector length from the largest id it sees; pass num_classes=table.shape[0]"),
]


@check("2.1", "fixed_one_hot_embedding", reference=_one_hot_embedding)
def check_one_hot_embedding(fn) -> None:
    """``fn(ids [B, T], table [V, C]) -> [B, T, C]`` must equal ``table[ids]`` for any ids in 0..V-1."""
    table = torch.randn(7, 3, generator=torch.Generator().manual_seed(0))  # V = 7, C = 3
    with_last = torch.tensor([[0, 6, 2], [3, 3, 1]])  # contains the largest id V - 1 = 6
    without_last = torch.tensor([[1, 4, 2, 0, 4]])  # largest id 4 < V - 1
    single = torch.tensor([[0]])  # one token, id 0: F.one_hot alone would make vectors of length 1
    for ids in (with_last, without_last, single):
        crashes = _ONE_HOT_CRASHES[:1] if ids is with_last else _ONE_HOT_CRASHES
        got = _real64(expect_known_crash(fn, ids, table, known=crashes), "[B, T, C]")
        (B, T), (V, C) = ids.shape, table.shape
        expect(tuple(got.shape) != (B, T, V), f"you returned the one-hot vectors [B, T, V] = {[B, T, V]}: multiply "
                                              f"them by the table [V, C] to get [B, T, C] = {[B, T, C]}")
        expect(tuple(got.shape) == (B, T, C), f"expected shape [B, T, C] = {[B, T, C]}, got {list(got.shape)}")
        expect_match(got, table[ids].to(_F64), rtol=0, otherwise=lambda b, t, _: f"out[{b}, {t}] should be row "
                     f"{ids[b, t].item()} of the table (the id at that place), but it is not")  # noqa: B023


# --- Exercise 2.2 (predict) -----------------------------------------------------------------------
@check("2.2", "embedding gradient")
def check_predict_embedding_grad(fn) -> None:
    """``fn() -> (g1, g4, g0)``: the entries of rows 1, 4 and 0 of the table's gradient."""
    g1, g4, g0 = expect_numbers(fn(), 3, "return 3 numbers (the gradient entries of rows 1, 4 and 0)")
    expect(abs(g0) < 1e-9, "id 0 is not in the batch, so row 0 takes no part in the sum: its gradient is exactly 0")
    expect(abs(g4 - 1) < 1e-6, "row 4 is looked up once and each of its entries is added once into the sum, so each "
                               f"entry's gradient is 1 (you said {g4:g})")
    expect(abs(g1 - 1) > 1e-6, "id 1 appears twice in the batch: each lookup adds the row into the sum once more, and "
                               "the gradients of the two uses add up")
    expect(abs(g1 - 2) < 1e-6, f"id 1 is looked up twice, each time contributing 1: row 1's gradient is 2, not {g1:g}")


# --- Exercise 2.3 (build) -------------------------------------------------------------------------
def _literal_seed_001(n_positions: int, d_model: int) -> torch.Tensor:
    """The slip of source 1: column j uses the exponent 2j/C instead of 2*floor(j/2)/C."""
    j = torch.arange(d_model, dtype=_F64)
    angles = torch.arange(n_positions, dtype=_F64)[:, None] / 10000 ** (2 * j / d_model)
    return torch.where(j % 2 == 0, torch.sin(angles), torch.cos(angles))


def _sines_first(pe: torch.Tensor) -> torch.Tensor:
    """The table laid out [all sines | all cosines] instead of interleaved."""
    return torch.cat([pe[:, 0::2], pe[:, 1::2]], dim=1)


def _expect_table(got: torch.Tensor, n: int, d: int) -> None:
    """2.3's table for n positions of width d, its usual slips named."""
    want = sinusoidal_positional_encoding(n, d, dtype=_F64)
    swap = torch.arange(d).view(-1, 2).flip(1).flatten()  # 1, 0, 3, 2, ...
    expect_match(got, want, lambda: [
        ("your row 0 is position 1: count positions from 0, so the first row is [0, 1, 0, 1, ...] (sin 0 = 0, "
         "cos 0 = 1); source 4 counts from 1", sinusoidal_positional_encoding(n + 1, d, dtype=_F64)[1:]),
        ("sine and cosine are swapped: even columns (0, 2, ...) take the sine and odd columns the cosine, so row 0 "
         "reads [0, 1, 0, 1, ...]", want[:, swap]),
        ("you put all the sines first and all the cosines after them; here the columns alternate: pair i fills "
         "columns 2i (sine) and 2i+1 (cosine), so row 0 reads [0, 1, 0, 1, ...] (assign to pe[:, 0::2] and "
         "pe[:, 1::2])", _sines_first(want)),
        ("columns 2i and 2i+1 must share one frequency, 10000^(-2i/d_model); you put the column index j in place of "
         "2i (exponent 2j/d_model), as source 1's formula reads. PE[1, 2] "
         f"should be {want[1, 2].item():.6f}, yours is {got[1, 2].item():.6f}", _literal_seed_001(n, d)),
    ], lambda p, j: f"PE[{p}, {j}] (n_positions={n}, d_model={d}) should be {want[p, j].item():.6f}, yours is "
       f"{got[p, j].item():.6f}: {'sin' if j % 2 == 0 else 'cos'}({p} * 10000^(-{j - j % 2}/{d}))", rtol=0)


@check("2.3", "sinusoidal_positional_encoding", reference=sinusoidal_positional_encoding)
def check_sinusoidal(fn) -> None:
    """``fn(n_positions, d_model, base=10000.0, *, dtype=None)`` must equal the package's table."""
    for n, d in ((16, 64), (5, 6), (1, 4)):
        out = fn(n, d)
        got = _real64(out, "[n_positions, d_model]")
        expect(tuple(got.shape) != (d, n) or n == d, "rows are positions and columns dimensions: expected "
               f"[n_positions, d_model] = {[n, d]}, you returned [d_model, n_positions] = {[d, n]}")
        expect(tuple(got.shape) == (n, d), f"expected shape [n_positions, d_model] = {[n, d]}, got {list(got.shape)}")
        _expect_table(got, n, d)
        expect(out.dtype == torch.get_default_dtype(), "without a dtype, return the table in torch's default dtype "
               f"({torch.get_default_dtype()}), got {out.dtype}: end with .to(dtype or torch.get_default_dtype())")
    got = _real64(fn(6, 8, base=100.0), "[n_positions, d_model]")
    expect(close(got, sinusoidal_positional_encoding(6, 8, base=100.0, dtype=_F64), rtol=0), "with base=100.0 the "
           "table should use the frequencies 100^(-2i/d_model): use the frequencies omega computed from `base` "
           "rather than a hard-coded 10000")
    out = fn(1000, 16, dtype=_F64)
    expect(isinstance(out, torch.Tensor) and out.dtype == _F64, "with dtype=torch.float64, "
           f"return a float64 table, got {getattr(out, 'dtype', type(out).__name__)}")
    want = sinusoidal_positional_encoding(1000, 16, dtype=_F64)
    worst = (out.detach() - want).abs().max().item() if out.shape == want.shape else math.inf
    expect(worst < 1e-9, f"with dtype=torch.float64 your table differs from the exact one by up to {worst:.1g} "
           "(positions 0..999): compute the angles in float64 (torch.arange(n_positions, dtype=torch.float64)) and "
           "convert only at the end; float32 keeps about 7 digits, so an angle of 999 radians loses the fourth decimal")


# --- Exercise 2.4 (predict) -----------------------------------------------------------------------
@check("2.4", "row length")
def check_predict_row_length(fn) -> None:
    """``fn() -> float``: the length of a row of the C = 64 table (the same for every position)."""
    (got,) = expect_numbers([fn()], 1, "return 1 numbers (one length)")
    if abs(got - math.sqrt(32)) < 0.01:
        return
    expect(abs(got - 32) > 0.01, "32 is the squared length (one per pair); the length is its square root, √32")
    expect(abs(got - 8) > 0.01, "√64 = 8 would need every one of the 64 entries to be ±1; in each pair sin² + cos² = "
                                "1, so the squared length is 1 per pair, 32 pairs")
    expect(abs(got - 1) > 0.01, "each pair contributes 1 to the *squared* length (sin² + cos² = 1), and there are 32 "
                                "pairs")
    expect(got < 100, "the entries stay within [-1, 1] however large p is: the length does not grow with the position")
    expect(False, f"not {got:g}: add up sin² + cos² over the 32 (sin, cos) pairs of one row, then take the square root")


# --- Exercise 2.5 (build) -------------------------------------------------------------------------
def _expect_shift(got: torch.Tensor, offset: int, d: int) -> None:
    """2.5's matrix for one offset and width, its usual slips named."""
    want = position_shift_matrix(offset, d, dtype=_F64)
    if close(got, want, rtol=0):
        return
    expect(offset == 0 or not close(got, want.T, rtol=0), f"your matrix moves codes backwards (PE[p] -> "
           f"PE[p - {offset}]): in each 2x2 block put +sin(k*w) in the top-right corner (row 2i, column 2i+1) and "
           "-sin(k*w) bottom-left")
    expect(not close(got, torch.diag(want.diagonal()), rtol=0), "only the cosines are there: a rotation also mixes "
           "each sine with its cosine partner through the off-diagonal +sin(k*w) and -sin(k*w) of each 2x2 block")
    pe = sinusoidal_positional_encoding(40, d, dtype=_F64)  # (40, C)
    lo, hi = max(0, -offset), 40 - max(0, offset)
    expect_close(pe[lo:hi] @ got.T, pe[lo + offset : hi + offset],  # row p -> M @ PE[p]
                 f"M @ PE[p] should equal PE[p + {offset}] (d_model={d}); each pair (2i, 2i+1) turns by {offset} * "
                 "10000^(-2i/d_model) radians", atol=1e-5)
    expect(False, f"M @ PE[p] matches PE[p + {offset}] on the positions tried, but M (d_model={d}) is not the "
           "block-diagonal rotation: 2x2 blocks [[cos, sin], [-sin, cos]] on the diagonal, zeros elsewhere")


@check("2.5", "position_shift_matrix", reference=position_shift_matrix)
def check_shift_matrix(fn) -> None:
    """``fn(offset, d_model, base=10000.0, *, dtype=None)`` must return M [C, C] with PE[p + offset] = M @ PE[p]."""
    for offset, d in ((3, 8), (-2, 8), (10, 64), (0, 4)):
        got = _real64(fn(offset, d), "[d_model, d_model]")
        expect(tuple(got.shape) == (d, d), f"expected shape [d_model, d_model] = {[d, d]}, got {list(got.shape)}")
        _expect_shift(got, offset, d)
    out = fn(2, 8)
    expect(out.dtype == torch.get_default_dtype(), "without a dtype, return the matrix in torch's "
           f"default dtype ({torch.get_default_dtype()}), got {out.dtype}")
    got = _real64(fn(2, 8, base=100.0), "[d_model, d_model]")
    expect(close(got, position_shift_matrix(2, 8, base=100.0, dtype=_F64), rtol=0), "with base=100.0 the angles are "
           "offset * 100^(-2i/d_model): use omega (computed from `base`), not a hard-coded 10000")
    out = fn(37, 64, dtype=_F64)
    expect(isinstance(out, torch.Tensor) and out.dtype == _F64, "with dtype=torch.float64, "
           f"return a float64 matrix, got {getattr(out, 'dtype', type(out).__name__)}")
    worst = (out.detach() - position_shift_matrix(37, 64, dtype=_F64)).abs().max().item()
    expect(worst < 1e-12, f"with dtype=torch.float64 your matrix is off by up to {worst:.1g}: build it in float64 "
           "(omega already is) and convert only at the end")


# --- Exercise 2.6 (extend) ------------------------------------------------------------------------
def _grid_positional_encoding(height: int, width: int, d_model: int) -> torch.Tensor:
    """Reference for 2.6: [height * width, d_model]; patch (r, c) is row r * width + c; its first
    d_model/2 columns are the 1-D code of r (width d_model/2), the last d_model/2 that of c."""
    rows = sinusoidal_positional_encoding(height, d_model // 2)  # (H, C/2)
    cols = sinusoidal_positional_encoding(width, d_model // 2)  # (W, C/2)
    r, c = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")  # (H, W) each
    return torch.cat([rows[r.flatten()], cols[c.flatten()]], dim=1)  # (H*W, C)


def _grid_mistakes(want: torch.Tensor, H: int, W: int, d: int) -> list:
    half = d // 2
    column_major = want.view(H, W, d).transpose(0, 1).reshape(H * W, d)
    return [
        ("the halves are swapped: the first d_model/2 columns encode the row r, the last d_model/2 the column c",
         torch.cat([want[:, half:], want[:, :half]], dim=1)),
        # a grid of one row or one column reads the same in either order
        *([] if H == 1 or W == 1 else [
            ("your patches are in column-major order: patch (r, c) must be row r * width + c of the result (row by "
             "row, as flattening an image [height, width] gives); yours is at c * height + r", column_major)]),
        ("you gave each patch the 1-D code of its flat index r * width + c: then the last patch of a row and the first "
         "of the next look like neighbours although they sit at opposite ends of the grid; encode r and c separately "
         "(d_model/2 columns each)", sinusoidal_positional_encoding(H * W, d).to(_F64)),
        ("you interleaved the row and column codes column by column; put them side by side instead: [code of r | code "
         "of c]", torch.stack([want[:, :half], want[:, half:]], dim=-1).flatten(1)),
    ]


@check("2.6", "grid_positional_encoding", reference=_grid_positional_encoding)
def check_grid_code(fn) -> None:
    """``fn(height, width, d_model) -> [height * width, d_model]``: a sinusoidal code for grid positions."""
    for H, W, d in ((3, 5, 8), (4, 4, 16), (1, 6, 4), (5, 1, 4)):
        got = _real64(fn(H, W, d), "[height * width, d_model]")
        expect(tuple(got.shape) != (H, W, d),
               f"flatten the grid: one row per patch, [height * width, d_model] = {[H * W, d]}, not {[H, W, d]}")
        expect(tuple(got.shape) != (H * W, 2 * d), "each half of the vector is a 1-D code of width d_model/2, so the "
               "two together have d_model columns; you used width d_model for each half")
        expect(tuple(got.shape) == (H * W, d),
               f"expected shape [height * width, d_model] = {[H * W, d]}, got {list(got.shape)}")
        want = _grid_positional_encoding(H, W, d).to(_F64)
        expect_match(got, want, lambda: _grid_mistakes(want, H, W, d), rtol=0,  # noqa: B023
                     otherwise=lambda i, j: _grid_miss(got, want, H, W, d, i, j))  # noqa: B023


def _grid_miss(got, want, H: int, W: int, d: int, i: int, j: int) -> str:
    """2.6's hint for the first wrong entry [i, j]: the patch it belongs to, and the code it should hold."""
    r, c = divmod(i, W)
    part = f"the row r = {r}" if j < d // 2 else f"the column c = {c}"
    return (f"row {i} of the result is patch (r, c) = ({r}, {c}) with height={H}, width={W}, d_model={d}: column {j} "
            f"encodes {part}, with the 1-D code of width d_model/2 = {d // 2}; entry [{i}, {j}] should be "
            f"{want[i, j].item():.4f}, yours is {got[i, j].item():.4f}")
