"""Tests for transformer_course.positional (chapter 02): token embeddings and positional encodings.

References: the formula evaluated with Python's ``math`` module, Hugging Face's XLM implementation
of the same table, the table printed in seed 003 (positions 0-15, C = 64, six decimals), PyTorch's
own ``nn.Embedding`` / ``F.one_hot``, and hand-worked values.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_course import InputEmbedding, sinusoidal_positional_encoding
from transformer_course.positional import (
    POSITIONAL_KINDS,
    position_shift_matrix,
    sinusoidal_frequencies,
)

F64 = torch.float64

# Seed 003's printed "Position Embedding Look-Up Table": rows = positions 0..15, columns 0-9 and 54-63.
SEED_003_COLUMNS = list(range(10)) + list(range(54, 64))
SEED_003_ROWS = [
    "0.000000 1.000000 0.000000 1.000000 0.000000 1.000000 0.000000 1.000000 0.000000 1.000000 "
    "0.000000 1.000000 0.000000 1.000000 0.000000 1.000000 0.000000 1.000000 0.000000 1.000000",
    "0.841471 0.540302 0.681561 0.731761 0.533168 0.846009 0.409309 0.912396 0.310984 0.950415 "
    "0.000422 1.000000 0.000316 1.000000 0.000237 1.000000 0.000178 1.000000 0.000133 1.000000",
    "0.909297 -0.416147 0.997480 0.070948 0.902131 0.431463 0.746904 0.664932 0.591127 0.806578 "
    "0.000843 1.000000 0.000632 1.000000 0.000474 1.000000 0.000356 1.000000 0.000267 1.000000",
    "0.141120 -0.989992 0.778273 -0.627927 0.993253 -0.115966 0.953635 0.300967 0.812649 0.582754 "
    "0.001265 0.999999 0.000949 1.000000 0.000711 1.000000 0.000533 1.000000 0.000400 1.000000",
    "-0.756802 -0.653644 0.141539 -0.989933 0.778472 -0.627680 0.993281 -0.115730 0.953581 0.301137 "
    "0.001687 0.999999 0.001265 0.999999 0.000949 1.000000 0.000711 1.000000 0.000533 1.000000",
    "-0.958924 0.283662 -0.571127 -0.820862 0.323935 -0.946079 0.858896 -0.512150 0.999947 -0.010342 "
    "0.002108 0.999998 0.001581 0.999999 0.001186 0.999999 0.000889 1.000000 0.000667 1.000000",
    "-0.279415 0.960170 -0.977396 -0.211416 -0.230368 -0.973104 0.574026 -0.818837 0.947148 -0.320796 "
    "0.002530 0.999997 0.001897 0.999998 0.001423 0.999999 0.001067 0.999999 0.000800 1.000000",
    "0.656987 0.753902 -0.859313 0.511449 -0.713721 -0.700430 0.188581 -0.982058 0.800422 -0.599437 "
    "0.002952 0.999996 0.002214 0.999998 0.001660 0.999999 0.001245 0.999999 0.000933 1.000000",
    "0.989358 -0.145500 -0.280228 0.959933 -0.977262 -0.212036 -0.229904 -0.973213 0.574318 -0.818632 "
    "0.003374 0.999994 0.002530 0.999997 0.001897 0.999998 0.001423 0.999999 0.001067 0.999999",
    "0.412118 -0.911130 0.449194 0.893434 -0.939824 0.341660 -0.608108 -0.793854 0.291259 -0.956644 "
    "0.003795 0.999993 0.002846 0.999996 0.002134 0.999998 0.001600 0.999999 0.001200 0.999999",
    "-0.544021 -0.839072 0.937633 0.347628 -0.612937 0.790132 -0.879767 -0.475405 -0.020684 -0.999786 "
    "0.004217 0.999991 0.003162 0.999995 0.002371 0.999997 0.001778 0.999998 0.001334 0.999999",
    "-0.999990 0.004426 0.923052 -0.384674 -0.097276 0.995257 -0.997283 -0.073661 -0.330575 -0.943780 "
    "0.004639 0.999989 0.003478 0.999994 0.002609 0.999997 0.001956 0.999998 0.001467 0.999999",
    "-0.536573 0.843854 0.413275 -0.910606 0.448343 0.893862 -0.940067 0.340989 -0.607683 -0.794179 "
    "0.005060 0.999987 0.003795 0.999993 0.002846 0.999996 0.002134 0.999998 0.001600 0.999999",
    "0.420167 0.907447 -0.318216 -0.948018 0.855881 0.517173 -0.718144 0.695895 -0.824528 -0.565821 "
    "0.005482 0.999985 0.004111 0.999992 0.003083 0.999995 0.002312 0.999997 0.001734 0.999998",
    "0.990607 0.136737 -0.878990 -0.476839 0.999823 -0.018796 -0.370395 0.928874 -0.959605 -0.281349 "
    "0.005904 0.999983 0.004427 0.999990 0.003320 0.999995 0.002490 0.999997 0.001867 0.999998",
    "0.650288 -0.759688 -0.968206 0.250154 0.835838 -0.548975 0.042249 0.999107 -0.999519 0.031022 "
    "0.006325 0.999980 0.004743 0.999989 0.003557 0.999994 0.002667 0.999996 0.002000 0.999998",
]


def math_reference(n_positions: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """The paper's formula, one entry at a time with Python's math module (float64)."""
    rows = []
    for p in range(n_positions):
        row = []
        for j in range(d_model):
            angle = p / base ** ((j - j % 2) / d_model)  # columns 2i and 2i+1 share exponent 2i/C
            row.append(math.sin(angle) if j % 2 == 0 else math.cos(angle))
        rows.append(row)
    return torch.tensor(rows, dtype=F64)


# --- sinusoidal_positional_encoding -------------------------------------------------------------


def test_hand_worked_values():
    pe = sinusoidal_positional_encoding(3, 4, dtype=F64)
    # C = 4: pair 0 turns 1 rad per position, pair 1 turns 10000^(-2/4) = 0.01 rad per position
    expected = torch.tensor(
        [
            [0.0, 1.0, 0.0, 1.0],
            [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
            [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)],
        ],
        dtype=F64,
    )
    torch.testing.assert_close(pe, expected, atol=1e-15, rtol=0)


@pytest.mark.parametrize(("n", "d"), [(1, 2), (16, 64), (50, 6), (200, 128)])
def test_matches_math_module(n, d):
    torch.testing.assert_close(sinusoidal_positional_encoding(n, d, dtype=F64), math_reference(n, d), atol=1e-12,
                               rtol=0)
    torch.testing.assert_close(sinusoidal_positional_encoding(n, d), math_reference(n, d).float(), atol=1e-6, rtol=0)


def test_matches_hugging_face_xlm():
    xlm = pytest.importorskip("transformers.models.xlm.modeling_xlm")
    out = torch.empty(100, 64)
    xlm.create_sinusoidal_embeddings(100, 64, out)
    torch.testing.assert_close(sinusoidal_positional_encoding(100, 64), out, atol=1e-6, rtol=0)


def test_reproduces_seed_003_table():
    printed = torch.tensor([[float(x) for x in row.split()] for row in SEED_003_ROWS], dtype=F64)
    ours = sinusoidal_positional_encoding(16, 64, dtype=F64)[:, SEED_003_COLUMNS]
    # every printed entry within one unit of the sixth decimal
    assert (ours - printed).abs().max() <= 1e-6
    rounded = torch.round(ours * 1e6) / 1e6
    flips = ((rounded - printed).abs() > 1e-9).nonzero().tolist()
    assert len(flips) == 14  # the chapter reports 306 of 320 equal after rounding
    for p, j in flips:
        col = SEED_003_COLUMNS[j]
        exact = math_reference(16, 64)[p, col].item()
        assert round(exact, 6) == pytest.approx(rounded[p, j].item(), abs=1e-12)  # ours rounds as math does
        # the source's digit differs only where the true value is within ~2 float32 ulps of a boundary
        boundary = (math.floor(exact * 1e6) + 0.5) / 1e6
        assert abs(exact - boundary) < 2e-7


def test_float32_result_is_the_rounded_float64_table():
    pe32 = sinusoidal_positional_encoding(2048, 64)
    assert pe32.dtype == torch.float32
    torch.testing.assert_close(pe32, sinusoidal_positional_encoding(2048, 64, dtype=F64).float(), atol=0, rtol=0)


def test_default_dtype_is_respected():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    try:
        assert sinusoidal_positional_encoding(4, 8).dtype == F64
    finally:
        torch.set_default_dtype(previous)


def test_frequencies_and_wavelengths():
    omega = sinusoidal_frequencies(64)
    assert omega.shape == (32,) and omega.dtype == F64
    assert omega[0] == 1.0
    torch.testing.assert_close(omega[1:] / omega[:-1], torch.full((31,), 10000 ** (-2 / 64), dtype=F64))
    assert 2 * math.pi / omega[-1].item() == pytest.approx(2 * math.pi * 10000 ** (62 / 64))


def test_other_base():
    torch.testing.assert_close(
        sinusoidal_positional_encoding(10, 8, base=500.0, dtype=F64), math_reference(10, 8, base=500.0),
        atol=1e-12, rtol=0
    )


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), half=st.integers(1, 64))
def test_bounded_and_constant_length(n, half):
    pe = sinusoidal_positional_encoding(n, 2 * half, dtype=F64)
    assert pe.shape == (n, 2 * half)
    assert pe.abs().max() <= 1.0
    torch.testing.assert_close(pe.norm(dim=1), torch.full((n,), math.sqrt(half), dtype=F64))
    assert torch.equal(pe[0], torch.tensor([0.0, 1.0] * half, dtype=F64))


@settings(max_examples=30, deadline=None)
@given(p=st.integers(0, 5000), k=st.integers(-2000, 2000), half=st.integers(1, 48))
def test_shift_matrix_moves_any_position(p, k, half):
    d = 2 * half
    if p + k < 0:
        k = -p
    pe = sinusoidal_positional_encoding(max(p, p + k) + 1, d, dtype=F64)
    M = position_shift_matrix(k, d, dtype=F64)
    torch.testing.assert_close(M @ pe[p], pe[p + k], atol=1e-9, rtol=0)
    torch.testing.assert_close(M @ M.T, torch.eye(d, dtype=F64), atol=1e-12, rtol=0)  # a rotation


def test_shift_matrices_compose_and_invert():
    d = 16
    M3, M4, M7 = (position_shift_matrix(k, d, dtype=F64) for k in (3, 4, 7))
    torch.testing.assert_close(M3 @ M4, M7)
    torch.testing.assert_close(position_shift_matrix(-3, d, dtype=F64), M3.T)
    torch.testing.assert_close(position_shift_matrix(0, d, dtype=F64), torch.eye(d, dtype=F64))


def test_dot_product_depends_only_on_the_gap():
    pe = sinusoidal_positional_encoding(600, 64, dtype=F64)
    dots = pe @ pe.T
    omega = sinusoidal_frequencies(64)
    for k in (0, 1, 7, 100, 399):
        closed_form = torch.cos(k * omega).sum()
        diagonal = torch.diagonal(dots, offset=k)
        torch.testing.assert_close(diagonal, closed_form.expand_as(diagonal), atol=1e-9, rtol=0)
    assert dots[0, 0] == pytest.approx(32.0)
    assert (dots[0, 1:200] < dots[0, 0]).all()


def test_every_position_has_a_distinct_code():
    pe = sinusoidal_positional_encoding(20_000, 64, dtype=F64)
    # distance between codes depends only on the gap, so comparing with position 0 covers all pairs
    assert (pe[1:] - pe[0]).norm(dim=1).min() > 1.0


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: sinusoidal_positional_encoding(16, 63), ValueError, r"d_model must be even .* got 63.*such as 64"),
        (lambda: sinusoidal_positional_encoding(16, 0), ValueError, r"d_model must be a whole number >= 1, got 0"),
        (lambda: sinusoidal_positional_encoding(0, 64), ValueError, r"n_positions must be a whole number >= 1, got 0"),
        (lambda: sinusoidal_positional_encoding(16.0, 64), ValueError,
         r"n_positions must be a whole number >= 1, got 16.0"),
        (lambda: sinusoidal_positional_encoding(True, 64), ValueError,
         r"n_positions must be a whole number >= 1, got True"),
        (lambda: sinusoidal_positional_encoding(16, 64, base=1.0), ValueError,
         r"base must be a finite number > 1.0, got 1.0: the paper uses 10000.0"),
        (lambda: sinusoidal_positional_encoding(16, 64, base=float("inf")), ValueError, r"base must be"),
        (lambda: position_shift_matrix(1.5, 8), ValueError, r"offset must be a whole number, got 1.5"),
        (lambda: position_shift_matrix(2, 7), ValueError, r"d_model must be even"),
    ],
)
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --- InputEmbedding -----------------------------------------------------------------------------


def make(kind="learned", V=50, C=8, block=12, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    return InputEmbedding(V, C, block, positional=kind, dropout=dropout)


def ids(B=3, T=12, V=50, seed=1):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def test_contract_attributes():
    learned = make("learned")
    assert isinstance(learned.token, torch.nn.Embedding) and learned.token.weight.shape == (50, 8)
    assert isinstance(learned.position, torch.nn.Embedding) and learned.position.weight.shape == (12, 8)
    assert set(learned.state_dict()) == {"token.weight", "position.weight"}
    sinus = make("sinusoidal")
    assert sinus.position is None
    assert sinus.pe.shape == (12, 8) and not sinus.pe.requires_grad
    assert set(sinus.state_dict()) == {"token.weight"}  # the buffer is non-persistent
    assert [n for n, _ in sinus.named_parameters()] == ["token.weight"]
    assert POSITIONAL_KINDS == ("learned", "sinusoidal")


@pytest.mark.parametrize("kind", POSITIONAL_KINDS)
def test_forward_is_token_row_plus_position_row(kind):
    emb = make(kind)
    x = ids()
    out = emb(x)
    assert out.shape == (3, 12, 8)
    positions = emb.position.weight if kind == "learned" else sinusoidal_positional_encoding(12, 8)
    expected = F.embedding(x, emb.token.weight) + positions[None]
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    # the same through the one-hot product
    via_one_hot = F.one_hot(x, 50).float() @ emb.token.weight + positions
    torch.testing.assert_close(out, via_one_hot, atol=1e-6, rtol=0)


def test_seed_003_shapes():
    emb = InputEmbedding(100_277, 64, block_size=16)
    batch = torch.tensor(
        [[627, 1383, 88861, 279, 1989, 315, 25607, 16940, 65931, 323, 32097, 11, 584, 26458, 13520, 449]]).repeat(4, 1)
    assert emb(batch).shape == (4, 16, 64)


@pytest.mark.parametrize("kind", POSITIONAL_KINDS)
@pytest.mark.parametrize("split", [1, 5, 11])
def test_start_pos_matches_one_pass(kind, split):
    emb = make(kind)
    x = ids()
    whole = emb(x)
    pieces = torch.cat([emb(x[:, :split]), emb(x[:, split:], start_pos=split)], dim=1)
    torch.testing.assert_close(pieces, whole, atol=0, rtol=0)
    one_at_a_time = torch.cat([emb(x[:, t : t + 1], start_pos=t) for t in range(12)], dim=1)
    torch.testing.assert_close(one_at_a_time, whole, atol=0, rtol=0)


def test_positions_method():
    emb = make("sinusoidal")
    torch.testing.assert_close(emb.positions(4, start_pos=3), sinusoidal_positional_encoding(12, 8)[3:7])
    assert emb.positions(0, start_pos=12).shape == (0, 8)


def test_gradients_reach_only_used_rows():
    emb = make("learned")
    x = torch.tensor([[1, 4, 4, 9]])
    emb(x).sum().backward()
    used = (emb.token.weight.grad.abs().sum(1) > 0).nonzero().flatten().tolist()
    assert used == [1, 4, 9]
    assert torch.equal(emb.token.weight.grad[4], 2 * torch.ones(8))  # id 4 appears twice
    pos_used = (emb.position.weight.grad.abs().sum(1) > 0).nonzero().flatten().tolist()
    assert pos_used == [0, 1, 2, 3]


def test_dropout_train_and_eval():
    emb = make("sinusoidal", dropout=0.5)
    x = ids(B=8)
    emb.train()
    zeros = (emb(x) == 0).float().mean().item()
    assert 0.4 < zeros < 0.6
    emb.eval()
    torch.testing.assert_close(emb(x), emb.token(x) + emb.pe, atol=0, rtol=0)


def test_buffer_follows_dtype_and_is_rebuilt_on_load():
    emb = make("sinusoidal").double()
    assert emb.pe.dtype == F64 and emb(ids()).dtype == F64
    fresh = make("sinusoidal", seed=5)
    fresh.load_state_dict(make("sinusoidal").state_dict())
    torch.testing.assert_close(fresh(ids()), make("sinusoidal")(ids()))


def test_int32_ids_and_empty_sequence():
    emb = make()
    torch.testing.assert_close(emb(ids().int()), emb(ids()))
    assert emb(torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0, 8)


def test_odd_width_is_fine_with_learned_positions():
    assert InputEmbedding(10, 7, 4)(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 7)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda e: e(torch.tensor([[3, 50]])), ValueError,
         r"token id 50 is outside the vocabulary: ids must be in 0\.\.49 \(vocab_size=50\).*vocab_size >= 51"),
        (lambda e: e(torch.tensor([[-1, 2]])), ValueError, r"token id -1 is outside the vocabulary"),
        (lambda e: e(torch.zeros(1, 13, dtype=torch.long)), ValueError,
         r"positions 0\.\.12 do not fit: this embedding holds positions 0\.\.11 \(block_size=12\).*idx\[:, -12:\]"),
        (lambda e: e(torch.zeros(1, 3, dtype=torch.long), start_pos=10), ValueError,
         r"positions 10\.\.12 do not fit.*last 2 tokens"),
        (lambda e: e(torch.zeros(1, 1, dtype=torch.long), start_pos=12), ValueError,
         r"positions 12\.\.12 do not fit.*fresh cache"),
        (lambda e: e(torch.zeros(1, 1, dtype=torch.long), start_pos=-1), ValueError,
         r"start_pos must be a whole number >= 0, got -1"),
        (lambda e: e(torch.zeros(1, 1, dtype=torch.long), start_pos=1.0), ValueError,
         r"start_pos must be a whole number >= 0, got 1.0"),
        (lambda e: e(torch.zeros(5, dtype=torch.long)), ValueError,
         r"idx must have shape \[B, T\].*got \(5,\): add a batch dimension with idx\[None\]"),
        (lambda e: e(torch.zeros(1, 2, 3, dtype=torch.long)), ValueError, r"idx must have shape \[B, T\]"),
        (lambda e: e(torch.zeros(1, 3)), TypeError,
         r"token ids must be integers, got dtype torch.float32: convert with idx.long\(\)"),
        (lambda e: e([[1, 2]]), TypeError, r"idx must be a tensor of token ids"),
    ],
)
@pytest.mark.parametrize("kind", POSITIONAL_KINDS)
def test_bad_input(kind, call, error, match):
    with pytest.raises(error, match=match):
        call(make(kind))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"positional": "rotary"}, ValueError, r"positional must be one of 'learned', 'sinusoidal', got 'rotary'"),
        ({"dropout": 1.0}, ValueError, r"dropout must be a finite number >= 0.0 and < 1.0, got 1.0: a probability"),
        ({"dropout": -0.1}, ValueError, r"dropout must be a finite number >= 0.0 and < 1.0, got -0.1"),
        ({"vocab_size": 0}, ValueError, r"vocab_size must be a whole number >= 1, got 0"),
        ({"block_size": 2.5}, ValueError, r"block_size must be a whole number >= 1, got 2.5"),
        ({"d_model": 7, "positional": "sinusoidal"}, ValueError, r"d_model must be even .*\(positional='learned'\)"),
    ],
)
def test_bad_construction(kwargs, error, match):
    args = {"vocab_size": 10, "d_model": 8, "block_size": 4} | kwargs
    with pytest.raises(error, match=match):
        InputEmbedding(**args)


def test_public_names():
    import transformer_course

    assert transformer_course.InputEmbedding is InputEmbedding
    assert transformer_course.sinusoidal_positional_encoding is sinusoidal_positional_encoding
