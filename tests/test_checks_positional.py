"""The chapter 02 checks accept the reference and reject planted bugs with the right hint
(tests/test_checks_all.py runs every check on a stub and on its reference)."""

import math
import re

import pytest
import torch
import torch.nn.functional as F
from check_helpers import assert_rejected, run

from transformer_course.checks import positional as checks
from transformer_course.positional import (
    position_shift_matrix,
    sinusoidal_frequencies,
    sinusoidal_positional_encoding,
)

F64 = torch.float64


def test_check_prints_one_line(capsys):
    checks.check_sinusoidal(sinusoidal_positional_encoding)
    assert capsys.readouterr().out == (
        "✅ Exercise 2.3 (sinusoidal_positional_encoding): passed - the rest of the chapter uses "
        "yours\n"
    )


# --- 2.1 one-hot embedding (debug) --------------------------------------------------------------


def test_one_hot_reference_passes():
    assert run(checks.check_one_hot_embedding, checks._one_hot_embedding).passed
    assert run(
        checks.check_one_hot_embedding, lambda ids, table: table[ids]
    ).passed  # the lookup is equal too
    assert run(
        checks.check_one_hot_embedding, lambda ids, table: torch.eye(table.shape[0])[ids] @ table
    ).passed


def test_one_hot_the_chapters_buggy_version():
    """The cell the chapter shows: F.one_hot without num_classes."""
    assert_rejected(
        checks.check_one_hot_embedding,
        lambda ids, table: F.one_hot(ids).float() @ table,
        re.compile(r"guesses the vector length .* num_classes=table\.shape\[0\]"),
    )


def test_one_hot_length_from_the_batch_plus_one():
    """Another way to size the vectors from the batch instead of the table."""
    assert_rejected(
        checks.check_one_hot_embedding,
        lambda ids, table: F.one_hot(ids, int(ids.max()) + 1).float() @ table,
        "guesses the vector length",
    )


def test_one_hot_left_as_integers():
    assert_rejected(
        checks.check_one_hot_embedding,
        lambda ids, table: F.one_hot(ids, table.shape[0]) @ table,
        re.compile(r"F\.one_hot returns integers .* \.to\(table\.dtype\)"),
    )


def test_one_hot_not_multiplied():
    assert_rejected(
        checks.check_one_hot_embedding,
        lambda ids, table: F.one_hot(ids, table.shape[0]).float(),
        "you returned the one-hot vectors [B, T, V]",
    )


def test_one_hot_rows_shuffled_between_batch_and_time():
    def mixed_up(ids, table):
        B, T = ids.shape
        flat = F.one_hot(ids.T.reshape(-1), table.shape[0]).float() @ table  # time-major order
        return flat.view(B, T, -1)  # ... read back as batch-major

    assert_rejected(
        checks.check_one_hot_embedding, mixed_up, "out[0, 1] should be row 6 of the table"
    )


# --- 2.2 predict: the embedding gradient --------------------------------------------------------


def test_grad_prediction_right():
    assert run(checks.check_predict_embedding_grad, lambda: (2.0, 1.0, 0.0)).passed
    assert run(checks.check_predict_embedding_grad, lambda: torch.tensor([2, 1, 0])).passed


def test_grad_prediction_ignores_repeats():
    assert_rejected(
        checks.check_predict_embedding_grad, lambda: (1.0, 1.0, 0.0), "id 1 appears twice"
    )


def test_grad_prediction_every_row_moves():
    assert_rejected(
        checks.check_predict_embedding_grad, lambda: (1.0, 1.0, 1.0), "row 0 takes no part"
    )


def test_grad_prediction_wrong_count():
    assert_rejected(checks.check_predict_embedding_grad, lambda: (2.0, 1.0), "return 3 numbers")


def test_grad_prediction_row_4_confused():
    assert_rejected(
        checks.check_predict_embedding_grad, lambda: (2.0, 4.0, 0.0), "row 4 is looked up once"
    )


# --- 2.3 sinusoidal table (build) ---------------------------------------------------------------


def test_sinusoidal_reference_passes():
    assert run(checks.check_sinusoidal, sinusoidal_positional_encoding).passed


def test_sinusoidal_counted_from_one():
    def one_based(n, d, base=10000.0, *, dtype=None):
        return sinusoidal_positional_encoding(n + 1, d, base, dtype=dtype)[1:]

    assert_rejected(
        checks.check_sinusoidal, one_based, "your row 0 is position 1: count positions from 0"
    )


def test_sinusoidal_sin_cos_swapped():
    def swapped(n, d, base=10000.0, *, dtype=None):
        pe = sinusoidal_positional_encoding(n, d, base, dtype=dtype)
        return torch.stack([pe[:, 1::2], pe[:, 0::2]], dim=-1).flatten(1)

    assert_rejected(checks.check_sinusoidal, swapped, "sine and cosine are swapped")


def test_sinusoidal_all_sines_first():
    def concatenated(n, d, base=10000.0, *, dtype=None):
        angles = torch.arange(n, dtype=F64)[:, None] * sinusoidal_frequencies(d, base)
        return torch.cat([angles.sin(), angles.cos()], dim=1).to(dtype or torch.get_default_dtype())

    assert_rejected(checks.check_sinusoidal, concatenated, "all the sines first")


def test_sinusoidal_column_index_in_exponent():
    def seed_001(n, d, base=10000.0, *, dtype=None):
        j = torch.arange(d, dtype=F64)
        angles = torch.arange(n, dtype=F64)[:, None] / 10000 ** (2 * j / d)
        return torch.where(j % 2 == 0, angles.sin(), angles.cos()).float()

    assert_rejected(
        checks.check_sinusoidal,
        seed_001,
        re.compile(r"must share one frequency.*PE\[1, 2\] should be 0\.681561, yours is 0\.533168"),
    )


def test_sinusoidal_transposed():
    assert_rejected(
        checks.check_sinusoidal,
        lambda n, d, base=10000.0, *, dtype=None: (
            sinusoidal_positional_encoding(n, d, base, dtype=dtype).T
        ),
        "you returned [d_model, n_positions]",
    )


def test_sinusoidal_base_typo_names_an_entry():
    def wrong_base(n, d, base=10000.0, *, dtype=None):
        return sinusoidal_positional_encoding(n, d, base=1000.0, dtype=dtype)

    assert_rejected(
        checks.check_sinusoidal,
        wrong_base,
        "PE[1, 2] (n_positions=16, d_model=64) should be 0.681561",
    )


def test_sinusoidal_base_ignored():
    def hard_coded(n, d, base=10000.0, *, dtype=None):
        return sinusoidal_positional_encoding(n, d, dtype=dtype)

    assert_rejected(
        checks.check_sinusoidal,
        hard_coded,
        re.compile(r"with base=100\.0 .* rather than a hard-coded 10000"),
    )


def test_sinusoidal_computed_in_float32():
    def in_float32(n, d, base=10000.0, *, dtype=None):
        angles = (
            torch.arange(n, dtype=torch.float32)[:, None] * sinusoidal_frequencies(d, base).float()
        )
        pe = torch.empty(n, d)
        pe[:, 0::2], pe[:, 1::2] = angles.sin(), angles.cos()
        return pe.to(dtype or torch.get_default_dtype())

    assert_rejected(checks.check_sinusoidal, in_float32, "compute the angles in float64")


def test_sinusoidal_dtype_ignored():
    def always_float32(n, d, base=10000.0, *, dtype=None):
        return sinusoidal_positional_encoding(n, d, base)

    assert_rejected(
        checks.check_sinusoidal, always_float32, "with dtype=torch.float64, return a float64 table"
    )


def test_sinusoidal_float64_by_default():
    def always_float64(n, d, base=10000.0, *, dtype=None):
        return sinusoidal_positional_encoding(n, d, base, dtype=F64)

    assert_rejected(
        checks.check_sinusoidal,
        always_float64,
        "without a dtype, return the table in torch's default dtype",
    )


# --- 2.4 predict: the length of a row -----------------------------------------------------------


def test_row_length_prediction_right():
    assert run(checks.check_predict_row_length, lambda: math.sqrt(32)).passed
    assert run(checks.check_predict_row_length, lambda: 5.66).passed


@pytest.mark.parametrize(
    ("answer", "hint"),
    [
        (32.0, "squared length"),
        (8.0, "√64 = 8 would need"),
        (1.0, "*squared* length"),
        (100_000.0, "does not grow with the position"),
        (4.0, "add up sin² + cos²"),
    ],
)
def test_row_length_prediction_wrong(answer, hint):
    assert_rejected(checks.check_predict_row_length, lambda: answer, hint)


# --- 2.5 shift matrix (build) -------------------------------------------------------------------


def test_shift_reference_passes():
    assert run(checks.check_shift_matrix, position_shift_matrix).passed


def test_shift_rotating_backwards():
    assert_rejected(
        checks.check_shift_matrix,
        lambda k, d, base=10000.0, *, dtype=None: position_shift_matrix(k, d, base, dtype=dtype).T,
        "moves codes backwards",
    )


def test_shift_only_cosines():
    assert_rejected(
        checks.check_shift_matrix,
        lambda k, d, base=10000.0, *, dtype=None: torch.diag(
            position_shift_matrix(k, d, base, dtype=dtype).diagonal()
        ),
        "only the cosines are there",
    )


def test_shift_exponent_without_the_factor_two():
    def half_exponent(
        k, d, base=10000.0, *, dtype=None
    ):  # pair i turns by k * 10000^(-i/d) instead of k * 10000^(-2i/d)
        phi = k / 10000 ** (torch.arange(d // 2, dtype=F64) / d)
        m = torch.zeros(d, d, dtype=F64)
        for i in range(d // 2):
            c, s = phi[i].cos(), phi[i].sin()
            m[2 * i, 2 * i], m[2 * i, 2 * i + 1], m[2 * i + 1, 2 * i], m[2 * i + 1, 2 * i + 1] = (
                c,
                s,
                -s,
                c,
            )
        return m.to(dtype or torch.get_default_dtype())

    assert_rejected(checks.check_shift_matrix, half_exponent, "M @ PE[p] should equal PE[p + 3]")


def test_shift_built_in_float32():
    def in_float32(k, d, base=10000.0, *, dtype=None):
        return position_shift_matrix(k, d, base).to(dtype or torch.get_default_dtype())

    assert_rejected(checks.check_shift_matrix, in_float32, "build it in float64")


def test_shift_base_ignored():
    assert_rejected(
        checks.check_shift_matrix,
        lambda k, d, base=10000.0, *, dtype=None: position_shift_matrix(k, d, dtype=dtype),
        "with base=100.0",
    )


# --- 2.6 grid code (extend) ---------------------------------------------------------------------


def test_grid_reference_passes():
    assert run(checks.check_grid_code, checks._grid_positional_encoding).passed


def test_grid_worked_numbers():
    grid = checks._grid_positional_encoding(2, 3, 4)
    expected = torch.tensor([math.sin(1), math.cos(1), math.sin(2), math.cos(2)])
    torch.testing.assert_close(grid[5], expected)


def _halves(H, W, d):
    rows = sinusoidal_positional_encoding(H, d // 2)
    cols = sinusoidal_positional_encoding(W, d // 2)
    return rows, cols


def test_grid_halves_swapped():
    def swapped(H, W, d):
        rows, cols = _halves(H, W, d)
        return torch.cat([cols[None].expand(H, W, -1), rows[:, None].expand(H, W, -1)], -1).reshape(
            H * W, d
        )

    assert_rejected(checks.check_grid_code, swapped, "the halves are swapped")


def test_grid_column_major():
    def column_major(H, W, d):
        rows, cols = _halves(H, W, d)
        return torch.cat([rows[None].expand(W, H, -1), cols[:, None].expand(W, H, -1)], -1).reshape(
            H * W, d
        )

    assert_rejected(checks.check_grid_code, column_major, "column-major order")


def test_grid_flat_index():
    assert_rejected(
        checks.check_grid_code,
        lambda H, W, d: sinusoidal_positional_encoding(H * W, d),
        "1-D code of its flat index",
    )


def test_grid_full_width_halves():
    def too_wide(H, W, d):
        rows, cols = sinusoidal_positional_encoding(H, d), sinusoidal_positional_encoding(W, d)
        return torch.cat([rows[:, None].expand(H, W, -1), cols[None].expand(H, W, -1)], -1).reshape(
            H * W, 2 * d
        )

    assert_rejected(checks.check_grid_code, too_wide, "you used width d_model for each half")


def test_grid_not_flattened():
    def unflattened(H, W, d):
        return checks._grid_positional_encoding(H, W, d).view(H, W, d)

    assert_rejected(checks.check_grid_code, unflattened, "flatten the grid")


def test_grid_interleaved():
    def interleaved(H, W, d):
        g = checks._grid_positional_encoding(H, W, d)
        return torch.stack([g[:, : d // 2], g[:, d // 2 :]], dim=-1).flatten(1)

    assert_rejected(checks.check_grid_code, interleaved, "interleaved the row and column codes")


def test_grid_row_code_from_the_width():
    def wrong_frequencies(H, W, d):  # the row half built with width d (its first d/2 columns)
        rows = sinusoidal_positional_encoding(H, d)[:, : d // 2]
        cols = sinusoidal_positional_encoding(W, d // 2)
        return torch.cat([rows[:, None].expand(H, W, -1), cols[None].expand(H, W, -1)], -1).reshape(
            H * W, d
        )

    assert_rejected(
        checks.check_grid_code, wrong_frequencies, re.compile(r"column \d+ encodes the row r")
    )
