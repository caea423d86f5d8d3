"""The chapter 02 checks accept the reference, reject planted bugs with the right hint, and report stubs as not done."""

import re

import pytest
import torch
import torch.nn.functional as F

from transformer_course.checks import positional as checks
from transformer_course.positional import position_shift_matrix, sinusoidal_positional_encoding

F64 = torch.float64


def run(check, fn):
    return check(fn, quiet=True)


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise: write me")


def assert_rejected(check, fn, hint_regex):
    outcome = run(check, fn)
    assert outcome.status == "failed", outcome.line()
    assert re.search(hint_regex, outcome.message), outcome.message


ALL_CHECKS = [
    checks.check_one_hot_embedding,
    checks.check_sinusoidal,
    checks.check_shift_matrix,
    checks.check_dot_by_offset,
    checks.check_embed_with_offset,
]


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
def test_stub_is_not_done(check):
    outcome = run(check, stub)
    assert outcome.status == "not done"
    assert outcome.line().startswith(f"⏳ Exercise {check.exercise} ")


def test_check_prints_one_line(capsys):
    checks.check_sinusoidal(lambda n, d: sinusoidal_positional_encoding(n, d))
    assert capsys.readouterr().out == "✅ Exercise 2.2 (sinusoidal): passed\n"


# --- 2.1 one-hot embedding ----------------------------------------------------------------------


def one_hot_reference(ids, table):
    return F.one_hot(ids, num_classes=table.shape[0]).to(table.dtype) @ table


def test_one_hot_reference_passes():
    assert run(checks.check_one_hot_embedding, one_hot_reference).passed
    assert run(checks.check_one_hot_embedding, lambda ids, table: table[ids]).passed  # the lookup is equal too


def test_one_hot_without_num_classes():
    assert_rejected(
        checks.check_one_hot_embedding,
        lambda ids, table: F.one_hot(ids).float() @ table,
        r"guesses the vector length .* num_classes=table\.shape\[0\]",
    )


def test_one_hot_left_as_integers():
    assert_rejected(
        checks.check_one_hot_embedding,
        lambda ids, table: F.one_hot(ids, table.shape[0]) @ table,
        r"F\.one_hot returns integers .* \.to\(table\.dtype\)",
    )


def test_one_hot_not_multiplied():
    assert_rejected(
        checks.check_one_hot_embedding,
        lambda ids, table: F.one_hot(ids, table.shape[0]).float(),
        r"you returned the one-hot vectors \[B, T, V\]",
    )


def test_one_hot_rows_shuffled_between_batch_and_time():
    def mixed_up(ids, table):
        B, T = ids.shape
        flat = F.one_hot(ids.T.reshape(-1), table.shape[0]).float() @ table  # time-major order
        return flat.view(B, T, -1)  # ... read back as batch-major

    assert_rejected(checks.check_one_hot_embedding, mixed_up, r"out\[0, 1\] should be row 6 of the table")


# --- 2.2 sinusoidal table -----------------------------------------------------------------------


def sinusoidal_reference(n, d):
    return sinusoidal_positional_encoding(n, d)


def test_sinusoidal_reference_passes():
    assert run(checks.check_sinusoidal, sinusoidal_reference).passed


def test_sinusoidal_counted_from_one():
    def one_based(n, d):
        return sinusoidal_positional_encoding(n + 1, d)[1:]

    assert_rejected(checks.check_sinusoidal, one_based, r"your row 0 is position 1: count positions from 0")


def test_sinusoidal_sin_cos_swapped():
    def swapped(n, d):
        pe = sinusoidal_positional_encoding(n, d)
        return torch.stack([pe[:, 1::2], pe[:, 0::2]], dim=-1).flatten(1)

    assert_rejected(checks.check_sinusoidal, swapped, r"sine and cosine are swapped")


def test_sinusoidal_column_index_in_exponent():
    def seed_001(n, d):
        j = torch.arange(d, dtype=F64)
        angles = torch.arange(n, dtype=F64)[:, None] / 10000 ** (2 * j / d)
        return torch.where(j % 2 == 0, angles.sin(), angles.cos())

    assert_rejected(
        checks.check_sinusoidal, seed_001, r"must share one frequency.*PE\[1, 2\] should be 0\.681561, yours is 0\.533168"
    )


def test_sinusoidal_transposed():
    assert_rejected(checks.check_sinusoidal, lambda n, d: sinusoidal_reference(n, d).T, r"you returned \[d_model, n_positions\]")


def test_sinusoidal_base_typo_names_an_entry():
    def wrong_base(n, d):
        return sinusoidal_positional_encoding(n, d, base=1000.0)

    assert_rejected(checks.check_sinusoidal, wrong_base, r"PE\[1, 2\] \(n_positions=16, d_model=64\) should be 0\.681561")


# --- 2.3 shift matrix ---------------------------------------------------------------------------


def test_shift_reference_passes():
    assert run(checks.check_shift_matrix, lambda k, d: position_shift_matrix(k, d)).passed


def test_shift_rotating_backwards():
    assert_rejected(checks.check_shift_matrix, lambda k, d: position_shift_matrix(k, d).T, r"moves codes backwards")


def test_shift_only_cosines():
    assert_rejected(
        checks.check_shift_matrix, lambda k, d: torch.diag(position_shift_matrix(k, d).diagonal()), r"only the cosines are there"
    )


def test_shift_exponent_without_the_factor_two():
    def half_exponent(k, d):  # pair i turns by k * 10000^(-i/d) instead of k * 10000^(-2i/d)
        phi = k / 10000 ** (torch.arange(d // 2, dtype=F64) / d)
        m = torch.zeros(d, d, dtype=F64)
        for i in range(d // 2):
            c, s = phi[i].cos(), phi[i].sin()
            m[2 * i, 2 * i], m[2 * i, 2 * i + 1], m[2 * i + 1, 2 * i], m[2 * i + 1, 2 * i + 1] = c, s, -s, c
        return m

    assert_rejected(checks.check_shift_matrix, half_exponent, r"M @ PE\[p\] should equal PE\[p \+ 3\]")


# --- 2.4 dot product by offset ------------------------------------------------------------------


def omega(d):
    return 10000 ** (-torch.arange(0, d, 2, dtype=F64) / d)


def test_dot_reference_passes():
    assert run(checks.check_dot_by_offset, lambda k, d: torch.cos(k.to(F64)[:, None] * omega(d)).sum(1)).passed


def test_dot_counts_each_frequency_twice():
    assert_rejected(
        checks.check_dot_by_offset,
        lambda k, d: 2 * torch.cos(k.to(F64)[:, None] * omega(d)).sum(1),
        r"at gap 0 the dot product is a row's squared length, d_model/2 = 32",
    )


def test_dot_sums_sines():
    assert_rejected(
        checks.check_dot_by_offset, lambda k, d: torch.sin(k.to(F64)[:, None] * omega(d)).sum(1), r"sum cosines of the gap, not sines"
    )


def test_dot_forgets_negative_offsets_are_symmetric():
    def clipped(k, d):
        return torch.cos(k.clamp(min=0).to(F64)[:, None] * omega(d)).sum(1)

    assert_rejected(checks.check_dot_by_offset, clipped, r"sum_i cos\(k \* w_i\)")


# --- 2.5 embedding with start_pos ---------------------------------------------------------------


def embed_reference(idx, tok, pos, start_pos=0):
    return tok[idx] + pos[start_pos : start_pos + idx.shape[1]]


def test_embed_reference_passes():
    assert run(checks.check_embed_with_offset, embed_reference).passed


def test_embed_ignores_start_pos():
    assert_rejected(
        checks.check_embed_with_offset,
        lambda idx, tok, pos, start_pos=0: tok[idx] + pos[: idx.shape[1]],
        r"with start_pos=3 the first token sits at position 3",
    )


def test_embed_positions_by_id():
    assert_rejected(
        checks.check_embed_with_offset, lambda idx, tok, pos, start_pos=0: tok[idx] + pos[idx], r"not by its id"
    )


def test_embed_without_positions():
    assert_rejected(checks.check_embed_with_offset, lambda idx, tok, pos, start_pos=0: tok[idx], r"position vectors are missing")


def test_embed_no_default_start_pos_crashes_with_location():
    outcome = run(checks.check_embed_with_offset, lambda idx, tok, pos, start_pos: tok[idx])
    assert outcome.status == "failed" and "TypeError" in outcome.message
