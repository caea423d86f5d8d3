"""Tests for transformer_course.attention (chapter 03): against PyTorch's own attention, numbers
worked out by hand, properties (causality, no NaN from masks) and bad-input messages."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_course.attention import (
    AttentionHead,
    causal_mask,
    check_mask,
    scaled_dot_product_attention,
)

# ---------------------------------------------------------------- causal_mask


def test_causal_mask_small_by_hand():
    expected = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(3), expected)


@pytest.mark.parametrize("T", [1, 2, 7])
def test_causal_mask_is_lower_triangle(T):
    m = causal_mask(T)
    assert m.dtype == torch.bool and m.shape == (T, T)
    for i in range(T):
        for j in range(T):
            assert bool(m[i, j]) == (j <= i)


@pytest.mark.parametrize("T, error, match", [(0, ValueError, "T must be a whole number >= 1, got 0"),
                                             (2.5, ValueError, "got 2.5: the sequence length")])
def test_causal_mask_rejects_bad_length(T, error, match):
    with pytest.raises(error, match=match):
        causal_mask(T)


# ---------------------------------------------------------------- hand-worked example (seed 000)

Q_HORIZON = torch.tensor([0.9100, 0.3448], dtype=torch.float64)
K = torch.tensor(
    [[0.0921, 0.9907], [0.5637, 0.7303], [0.1860, 0.4071], [0.8067, 0.1776], [0.7002, 0.6632], [0.9094, 0.3594]],
    dtype=torch.float64,
)
V = torch.tensor(
    [[0.5637, 0.4056], [0.9803, 0.0100], [0.4111, 0.3980], [0.6882, 0.9797], [0.5551, 0.7583], [0.3060, 0.2141]],
    dtype=torch.float64,
)


def test_horizon_row_unscaled_matches_seed():
    """Seed 000's softmax row and output come from the unscaled scores (scale=1)."""
    out, w = scaled_dot_product_attention(Q_HORIZON[None], K, V, scale=1.0)
    assert torch.allclose(Q_HORIZON @ K.T, torch.tensor([0.4254, 0.7648, 0.3096, 0.7953, 0.8659, 0.9515],
                                                        dtype=torch.float64), atol=5e-5)
    assert torch.allclose(w[0], torch.tensor([0.1252, 0.1758, 0.1115, 0.1812, 0.1945, 0.2119], dtype=torch.float64),
                          atol=5e-5)
    assert torch.allclose(out[0], torch.tensor([0.5862, 0.4673], dtype=torch.float64), atol=5e-5)


def test_horizon_row_scaled_by_hand():
    """With the 1/sqrt(2) scale the seed's own code applies, worked out term by term."""
    scores = [sum(a * b for a, b in zip(Q_HORIZON.tolist(), key, strict=True)) / math.sqrt(2) for key in K.tolist()]
    exps = [math.exp(s) for s in scores]
    weights = [e / sum(exps) for e in exps]
    expected = [sum(w * v[c] for w, v in zip(weights, V.tolist(), strict=True)) for c in range(2)]
    out, w = scaled_dot_product_attention(Q_HORIZON[None], K, V)
    assert torch.allclose(w[0], torch.tensor(weights, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(out[0], torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    assert [round(x, 4) for x in expected] == [0.5863, 0.4658]


# ---------------------------------------------------------------- against torch.nn.functional


@settings(max_examples=60, deadline=None)
@given(
    batch=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    T_q=st.integers(1, 9),
    T_k=st.integers(1, 9),
    d_k=st.integers(1, 16),
    d_v=st.integers(1, 16),
    mask_kind=st.sampled_from(["none", "random", "causal", "padding"]),
    seed=st.integers(0, 2**16),
)
def test_matches_torch_sdpa(batch, T_q, T_k, d_k, d_v, mask_kind, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, T_q, d_k, generator=g)
    k = torch.randn(*batch, T_k, d_k, generator=g)
    v = torch.randn(*batch, T_k, d_v, generator=g)
    if mask_kind == "none":
        mask = None
    elif mask_kind == "random":  # full shape, may contain fully masked rows
        mask = torch.rand(*batch, T_q, T_k, generator=g) < 0.7
    elif mask_kind == "causal":
        mask = torch.ones(T_q, T_k, dtype=torch.bool).tril()  # broadcast over the batch
    else:  # key padding: [*batch, 1, T_k]
        mask = torch.rand(*batch, 1, T_k, generator=g) < 0.8
    out, w = scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert out.shape == ref.shape == (*batch, T_q, d_v)
    assert w.shape == (*batch, T_q, T_k)
    assert torch.allclose(out, ref, atol=1e-6, rtol=1e-5)
    assert not torch.isnan(out).any() and not torch.isnan(w).any()


def test_matches_torch_sdpa_float64_and_broadcast_heads():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 5, 8, dtype=torch.float64, generator=g)  # (B, nh, T, hs)
    k = torch.randn(2, 4, 7, 8, dtype=torch.float64, generator=g)
    v = torch.randn(2, 4, 7, 3, dtype=torch.float64, generator=g)
    mask = torch.rand(2, 1, 1, 7, generator=g) < 0.8  # one padding mask shared by all heads and queries
    mask[..., 0] = True
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(out, ref, atol=1e-12)


def test_custom_scale_matches_torch():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(3, 6, 4, generator=g) for _ in range(3))
    out, _ = scaled_dot_product_attention(q, k, v, scale=0.3)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, scale=0.3), atol=1e-6)


# ---------------------------------------------------------------- masks: weights, zeros, no NaN


def test_weights_rows_sum_to_one_and_masked_are_zero():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 6, 4, generator=g) for _ in range(3))
    _, w = scaled_dot_product_attention(q, k, v, causal_mask(6))
    assert torch.allclose(w.sum(-1), torch.ones(2, 6))
    assert (w.masked_select(~causal_mask(6)) == 0).all()


def test_fully_masked_row_gives_zeros_and_finite_gradients():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 3, generator=g, requires_grad=True)
    k = torch.randn(1, 4, 3, generator=g, requires_grad=True)
    v = torch.randn(1, 4, 2, generator=g, requires_grad=True)
    mask = causal_mask(4).clone()
    mask[2] = False  # query 2 may attend nothing
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(w[0, 2], torch.zeros(4)) and torch.equal(out[0, 2], torch.zeros(2))
    assert torch.isfinite(out).all()
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q.grad[0, 2], torch.zeros(3))  # nothing flows through the empty row


def test_dropout_zero_in_eval_and_scaled_in_training():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 5, 4, generator=g) for _ in range(3))
    torch.manual_seed(0)
    out_drop, w = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    out_plain, w_plain = scaled_dot_product_attention(q, k, v)
    assert torch.equal(w, w_plain)  # the returned weights are the pattern before dropout
    assert not torch.allclose(out_drop, out_plain)


# ---------------------------------------------------------------- AttentionHead


def test_head_matches_manual_projection_and_torch():
    torch.manual_seed(6)
    head = AttentionHead(8, 4)
    assert head.query.bias is None and head.key.bias is None and head.value.bias is None
    x = torch.randn(3, 5, 8)
    out = head(x)
    q, k, v = x @ head.query.weight.T, x @ head.key.weight.T, x @ head.value.weight.T
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.shape == (3, 5, 4)
    assert torch.allclose(out, ref, atol=1e-6)
    assert head.last_weights.shape == (3, 5, 5) and not head.last_weights.requires_grad


def test_head_not_causal_sees_the_future():
    torch.manual_seed(7)
    head = AttentionHead(6, 3, causal=False)
    x = torch.randn(2, 4, 6)
    out = head(x)
    q, k, v = head.query(x), head.key(x), head.value(x)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v), atol=1e-6)
    future = ~causal_mask(4)
    assert (head.last_weights[:, future] > 0).all()


def test_head_padding_mask_combines_with_causal():
    torch.manual_seed(8)
    head = AttentionHead(6, 3)
    x = torch.randn(2, 5, 6)
    keep = torch.tensor([[True] * 5, [False, False, True, True, True]])  # second row left-padded by 2
    out = head(x, keep[:, None, :])
    w = head.last_weights
    assert torch.equal(w[1, :2], torch.zeros(2, 5))  # padded queries see only padding: zeros
    assert torch.equal(out[1, :2], torch.zeros(2, 3))
    assert (w[1, 2:, :2] == 0).all()  # real queries ignore the padding
    assert torch.allclose(w[1, 2:].sum(-1), torch.ones(3))
    # the real tokens of row 1 get exactly what they get alone, without the padding
    alone = head(x[1:, 2:])
    assert torch.allclose(out[1, 2:], alone[0], atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(T=st.integers(2, 10), t=st.integers(0, 8), seed=st.integers(0, 2**16))
def test_head_causality_property(T, t, seed):
    """Changing the inputs after position t never changes the outputs at positions <= t."""
    t = t % (T - 1)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    head = AttentionHead(6, 4)
    x = torch.randn(2, T, 6, generator=g)
    changed = x.clone()
    changed[:, t + 1 :] = torch.randn(2, T - t - 1, 6, generator=g) * 5
    a, b = head(x), head(changed)
    assert torch.allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-6)
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])


def test_head_dropout_only_in_training():
    torch.manual_seed(9)
    head = AttentionHead(4, 4, dropout=0.5)
    x = torch.randn(1, 6, 4)
    head.eval()
    assert torch.equal(head(x), head(x))
    head.train()
    torch.manual_seed(1)
    a = head(x)
    torch.manual_seed(2)
    assert not torch.equal(a, head(x))


# ---------------------------------------------------------------- bad input


def _qkv(*shapes):
    return [torch.zeros(*s) for s in shapes]


@pytest.mark.parametrize(
    "shapes, error, match",
    [
        (((2, 5, 4), (2, 5, 3), (2, 5, 4)), ValueError, r"same last dim d_k.*q \(2, 5, 4\) and k \(2, 5, 3\)"),
        (((2, 5, 4), (2, 6, 4), (2, 5, 4)), ValueError,
         r"same number of positions T_k.*k \(2, 6, 4\) and v \(2, 5, 4\)"),
        (((2, 5, 4), (3, 5, 4), (3, 5, 4)), ValueError, "batch dims .* do not broadcast"),
        (((4,), (5, 4), (5, 4)), ValueError, r"q needs at least 2 dims.*\(4,\)"),
    ],
)
def test_bad_qkv_shapes(shapes, error, match):
    with pytest.raises(error, match=match):
        scaled_dot_product_attention(*_qkv(*shapes))


def test_integer_and_mixed_dtypes_rejected():
    q = torch.zeros(3, 2, dtype=torch.long)
    with pytest.raises(TypeError, match=r"floating-point.*\.float\(\)"):
        scaled_dot_product_attention(q, q, q)
    with pytest.raises(TypeError, match="share one dtype"):
        scaled_dot_product_attention(torch.zeros(3, 2), torch.zeros(3, 2, dtype=torch.float64), torch.zeros(3, 2))


def test_mask_wrong_dtype():
    q, k, v = _qkv((2, 4, 3), (2, 4, 3), (2, 4, 3))
    additive = torch.zeros(4, 4).masked_fill(~causal_mask(4), float("-inf"))
    with pytest.raises(TypeError, match=r"bool tensor.*got dtype torch.float32.*mask == 0"):
        scaled_dot_product_attention(q, k, v, additive)
    with pytest.raises(TypeError, match="bool tensor"):
        scaled_dot_product_attention(q, k, v, causal_mask(4).int())


@pytest.mark.parametrize("shape", [(5, 5), (2, 4), (3, 4, 4)])
def test_mask_wrong_shape(shape):
    q, k, v = _qkv((2, 4, 3), (2, 4, 3), (2, 4, 3))
    with pytest.raises(ValueError, match=rf"mask of shape {re_shape(shape)} does not broadcast.*\(2, 4, 4\)"):
        scaled_dot_product_attention(q, k, v, torch.ones(shape, dtype=torch.bool))


def test_check_mask_names_the_axes_a_padding_mask_lacks():
    keep = torch.ones(2, 5, dtype=torch.bool)  # [B, T_k]
    with pytest.raises(ValueError, match=r"\(2, 5, 5\); a key-padding mask \[B, T_k\] needs a query axis: "
                                         r"mask\[:, None, :\]$"):
        check_mask(keep, (2, 5, 5))
    with pytest.raises(ValueError, match=r"\(2, 4, 5, 5\); a key-padding mask \[B, T_k\] needs head and query axes: "
                                         r"mask\[:, None, None, :\]$"):
        check_mask(keep, (2, 4, 5, 5))
    with pytest.raises(ValueError, match=r"does not broadcast to the scores' shape \[\.\.\., T_q, T_k\] = \(5, 5\)$"):
        check_mask(torch.ones(3, 5, dtype=torch.bool), (5, 5))  # no batch axis: no padding hint
    with pytest.raises(TypeError, match=r"bool torch.Tensor \(True = may attend\), got list"):
        check_mask([[True]], (1, 1))
    check_mask(keep[:, None, None, :], (2, 4, 5, 5))  # fits: no error


def re_shape(shape):
    return str(tuple(shape)).replace("(", r"\(").replace(")", r"\)")


def test_bad_dropout_p():
    q = torch.zeros(3, 2)
    with pytest.raises(ValueError, match=r"dropout_p must be a finite number >= 0.0 and < 1.0, got 1.0"):
        scaled_dot_product_attention(q, q, q, dropout_p=1.0)


def test_head_bad_input():
    head = AttentionHead(8, 4)
    with pytest.raises(ValueError, match=r"AttentionHead was built for d_model=8: .*\[B, T >= 1, 8\], got \(2, 5, 6\)"):
        head(torch.zeros(2, 5, 6))
    with pytest.raises(ValueError, match=r"got \(5, 8\)"):
        head(torch.zeros(5, 8))
    with pytest.raises(TypeError, match="bool tensor"):
        head(torch.zeros(2, 5, 8), torch.ones(2, 1, 5))
    with pytest.raises(ValueError, match=r"mask of shape \(2, 6\).*needs a query axis: mask\[:, None, :\]"):
        head(torch.zeros(2, 5, 8), torch.ones(2, 6, dtype=torch.bool))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"d_model": 0, "head_size": 4}, "d_model must be a whole number >= 1, got 0"),
        ({"d_model": 8, "head_size": 2.0}, "head_size must be a whole number >= 1, got 2.0"),
        ({"d_model": 8, "head_size": 4, "dropout": 1.5}, r"dropout must be a finite number >= 0.0 and < 1.0, got 1.5"),
    ],
)
def test_head_bad_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AttentionHead(**kwargs)
