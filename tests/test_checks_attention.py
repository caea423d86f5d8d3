"""The chapter 03 checks accept the reference and reject realistic mistakes with the right hint
(tests/test_checks_all.py runs every check on a stub and on its reference)."""

import math

import pytest
import torch
from check_helpers import assert_rejected, run

from transformer_course.attention import _MASKED, causal_mask, scaled_dot_product_attention
from transformer_course.checks.attention import (
    _alibi_bias,
    _online_attention,
    check_alibi_bias,
    check_attention,
    check_attention_scores,
    check_causal_mask,
    check_predict_equal_scores,
    check_tiled_attention,
    largest_tensor,
    tiled_attention,
)


def test_check_prints_one_line(capsys):
    check_causal_mask(causal_mask)
    assert capsys.readouterr().out == (
        "✅ Exercise 3.2 (causal_mask): passed - the rest of the chapter uses yours\n")


# ---------------------------------------------------------------- 3.1 (debug)


def scores_ref(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def the_chapters_buggy_scores(q, k):
    """The cell the chapter shows: k used as it is."""
    return q @ k / math.sqrt(q.shape[-1])


@pytest.mark.filterwarnings("ignore:The use of `x.T`:UserWarning")
@pytest.mark.parametrize(
    "candidate, hint",
    [
        (the_chapters_buggy_scores, "multiplies the features of q by the *positions* of k"),
        (lambda q, k: q.T @ k / math.sqrt(q.shape[-1]), "compares features with features"),
        (lambda q, k: q @ k.transpose(-2, -1), "raw dot products"),
        (lambda q, k: q @ k.transpose(-2, -1) / q.shape[-1], "divided by d_k"),
        (lambda q, k: k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1]), "rows must be queries"),
        (lambda q, k: q @ k.T / math.sqrt(q.shape[-1]), "not for a batch"),
        (lambda q, k: q @ k.transpose(0, 1) / math.sqrt(q.shape[-1]), "not for a batch"),
        (lambda q, k: q @ k.transpose(-2, -1) / 2.0, "divide by √d_k of *these* inputs"),
        (lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(k.shape[-2]), "differ from q kᵀ / √d_k"),
    ],
)
def test_scores_rejects(candidate, hint):
    assert_rejected(check_attention_scores, candidate, hint)


def test_scores_accepts_reference():
    assert run(check_attention_scores, scores_ref).passed
    assert run(
        check_attention_scores,
        lambda q, k: torch.einsum("...id,...jd->...ij", q, k) / q.shape[-1] ** 0.5,
    ).passed


# ---------------------------------------------------------------- 3.2 (build)


@pytest.mark.parametrize(
    "candidate, hint",
    [
        (
            lambda T, device=None: torch.ones(T, T, dtype=torch.bool, device=device).triu(),
            "position 0 can see position 1",
        ),
        (
            lambda T, device=None: torch.ones(T, T, dtype=torch.bool, device=device).tril(-1),
            "position 0 cannot see itself",
        ),
        (lambda T, device=None: torch.ones(T, T, device=device).tril(), "return a bool tensor"),
        (
            lambda T, device=None: (
                torch.ones(T, T, dtype=torch.bool, device=device).tril().triu(-1)
            ),
            "position 2 cannot see the earlier position 0",
        ),
        (
            lambda T, device=None: torch.ones(T, T, dtype=torch.bool).tril(),
            "the mask ignores `device`",
        ),
    ],
)
def test_causal_mask_rejects(candidate, hint):
    assert_rejected(check_causal_mask, candidate, hint)


def test_causal_mask_without_a_device_argument_is_reported():
    assert_rejected(
        check_causal_mask, lambda T: torch.ones(T, T, dtype=torch.bool).tril(), "TypeError"
    )


def test_causal_mask_accepts_reference():
    assert run(check_causal_mask, causal_mask).passed


# ---------------------------------------------------------------- 3.3 (predict)


def test_equal_scores_right():
    assert run(check_predict_equal_scores, lambda: [1 / 3, 1 / 3, 1 / 3, 0.0, 0.0]).passed
    assert run(check_predict_equal_scores, lambda: torch.tensor([0.333, 0.333, 0.333, 0, 0])).passed


@pytest.mark.parametrize(
    "answer, hint",
    [
        ([0.2] * 5, "keys 3 and 4 come after query 2"),
        ([1, 1, 1, 0, 0], "three equal weights are 1/3 each"),
        ([0.5, 0.3, 0.2, 0, 0], "equal scores give equal weights"),
        ([7 / 3, 7 / 3, 7 / 3, 0, 0], "the size of the equal scores (7.0) does not matter"),
        ([1 / 3, 1 / 3, 1 / 3], "5 numbers"),
        ([1 / 3, 1 / 3, 1 / 3, float("-inf"), float("-inf")], "their weight is exactly 0"),
    ],
)
def test_equal_scores_wrong(answer, hint):
    assert_rejected(check_predict_equal_scores, lambda: answer, hint)


# ---------------------------------------------------------------- 3.4 (build)


def attention_ref(q, k, v, mask=None, *, scale=None, dropout_p=0.0):
    return scaled_dot_product_attention(q, k, v, mask, scale=scale, dropout_p=dropout_p)


def make_attention(
    *,
    scale_default=None,
    fill=_MASKED,
    fix_nan=True,
    additive=False,
    invert=False,
    dim=-1,
    ignore_scale=False,
    batch_transpose=False,
):
    """A learner's attention with one planted slip (the defaults give the right answer)."""

    def attention(q, k, v, mask=None, *, scale=None, dropout_p=0.0):
        d_k = q.shape[-1]
        s = scale_default(d_k) if scale_default else 1 / math.sqrt(d_k)
        if scale is not None and not ignore_scale:
            s = scale
        kt = k.transpose(0, 1) if batch_transpose and k.ndim > 3 else k.transpose(-2, -1)
        scores = (q @ kt) * s
        if mask is not None:
            hide = mask if invert else ~mask
            if additive:
                scores = scores + torch.zeros_like(scores).masked_fill(hide, fill)
            else:
                scores = scores.masked_fill(hide, fill)
        weights = torch.softmax(scores, dim=dim)
        if mask is not None and fix_nan:
            weights = weights.masked_fill(mask if invert else ~mask, 0.0)
        return weights @ v, weights

    return attention


@pytest.mark.parametrize(
    "candidate, hint",
    [
        (make_attention(fix_nan=False), "gave NaN"),
        (make_attention(invert=True), "True in the mask means 'may attend'"),
        (make_attention(dim=-2), "do not sum to 1"),
        (make_attention(scale_default=lambda d: 1.0), "unscaled scores"),
        (make_attention(scale_default=lambda d: 1 / d), "divided the scores by d_k"),
        (make_attention(ignore_scale=True), "`scale` is ignored"),
        (make_attention(fill=-1e9, fix_nan=False), "a large negative number such as -1e9"),
        (make_attention(additive=True), "gradients through the fully masked row are NaN"),
        (make_attention(batch_transpose=True), "with two batch dims"),
        (
            lambda q, k, v, mask=None, **kw: scaled_dot_product_attention(q, k, v, mask, **kw)[0],
            "return a pair",
        ),
    ],
)
def test_attention_rejects(candidate, hint):
    assert_rejected(check_attention, candidate, hint)


def test_attention_mask_only_zeroed_after_softmax():
    """Masking the weights after an unmasked softmax: rows no longer sum to 1 over the visible
    keys."""

    def zero_after(q, k, v, mask=None, *, scale=None, dropout_p=0.0):
        s = (1 / math.sqrt(q.shape[-1])) if scale is None else scale
        weights = torch.softmax(q @ k.transpose(-2, -1) * s, dim=-1)
        if mask is not None:
            weights = weights * mask
        return weights @ v, weights

    assert_rejected(check_attention, zero_after, "with a mask the weights differ")


def test_attention_accepts_reference_and_other_correct_versions():
    assert run(check_attention, scaled_dot_product_attention).passed
    assert run(check_attention, make_attention()).passed

    def with_nan_to_num(q, k, v, mask=None, *, scale=None, dropout_p=0.0):
        s = (1 / math.sqrt(q.shape[-1])) if scale is None else scale
        scores = q @ k.transpose(-2, -1) * s
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        return weights @ v, weights

    assert run(check_attention, with_nan_to_num).passed


# ---------------------------------------------------------------- 3.5 (extend)


def test_alibi_worked_numbers():
    inf = float("-inf")
    assert torch.equal(
        _alibi_bias(3, 0.5), torch.tensor([[0.0, inf, inf], [-0.5, 0.0, inf], [-1.0, -0.5, 0.0]])
    )


def test_alibi_plugs_into_torch_attention():
    q, k, v = (torch.randn(1, 5, 4, generator=torch.Generator().manual_seed(s)) for s in range(3))
    bias = _alibi_bias(5, 0.5)
    weights = torch.softmax(q @ k.transpose(-2, -1) / 2 + bias, dim=-1)
    torch.testing.assert_close(
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias), weights @ v
    )


def distance(T):
    return (torch.arange(T)[:, None] - torch.arange(T)[None, :]).float()


def causal(T, values):
    return values.masked_fill(~causal_mask(T), float("-inf"))


@pytest.mark.parametrize(
    "candidate, hint",
    [
        (lambda T, m: causal(T, m * distance(T)), "yours grows"),
        (lambda T, m: -m * distance(T).abs(), "the future must stay hidden"),
        (lambda T, m: (-m * distance(T)) * causal_mask(T), "0 above the diagonal"),
        (lambda T, m: causal(T, -m * distance(T)).T, "rows are queries and columns keys"),
        (lambda T, m: causal(T, -m * (distance(T) + 1)), "the diagonal gets bias 0"),
        (lambda T, m: causal(T, -distance(T)), "multiply the distance by `slope`"),
        (lambda T, m: causal_mask(T), "return float biases"),
        (
            lambda T, m: (
                (-m * distance(T))
                + torch.zeros(T, T).masked_fill(~causal_mask(T), float("-inf")) * 0
            ),
            "NaN",
        ),
        (lambda T, m: causal(T, -m * distance(T))[:, :-1], "should be ["),
        (lambda T, m: causal(T, -m * distance(T) / math.sqrt(T)), "should be -slope * (i - j)"),
    ],
)
def test_alibi_rejects(candidate, hint):
    assert_rejected(check_alibi_bias, candidate, hint)


def test_alibi_accepts_reference_and_a_loop():
    assert run(check_alibi_bias, _alibi_bias).passed

    def loop(T, slope):
        bias = torch.full((T, T), float("-inf"))
        for i in range(T):
            for j in range(i + 1):
                bias[i, j] = -slope * (i - j)
        return bias

    assert run(check_alibi_bias, loop).passed


# ---------------------------------------------------------------- 3.6 attention tile by tile


def test_tiled_attention_reference_equals_full_attention_and_holds_one_tile_of_scores():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 33, 8, generator=g, dtype=torch.float64) for _ in range(3))
    for tile in (1, 5, 32, 100):
        for causal in (False, True):
            want = scaled_dot_product_attention(q, k, v, causal_mask(33) if causal else None)[0]
            torch.testing.assert_close(tiled_attention(q, k, v, tile, causal), want, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(tiled_attention(q, k, v, 5, True),
                               torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    _, full = largest_tensor(scaled_dot_product_attention, q, k, v)
    _, tiled = largest_tensor(tiled_attention, q, k, v, 4, True)
    assert full == 2 * 33 * 33 and tiled == 2 * 33 * 8  # the scores, or the values' running sum [2, 33, 8]


def test_tiled_attention_reference_and_a_rewrite_pass():
    assert run(check_tiled_attention, tiled_attention).passed

    def loop(q, k, v, tile, causal=False):  # one query row at a time, stopping at the last key it sees
        out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
        for i in range(q.shape[-2]):
            row = q[..., i:i + 1, :]  # (..., 1, d)
            m = torch.full((*row.shape[:-1], 1), float("-inf"), dtype=q.dtype)
            total, acc = 0.0, 0.0
            end = i + 1 if causal else k.shape[-2]
            for start in range(0, end, tile):
                stop = min(start + tile, end)
                s = row @ k[..., start:stop, :].transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., 1, n)
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                p, shrink = torch.exp(s - m_new), torch.exp(m - m_new)
                total = total * shrink + p.sum(-1, keepdim=True)
                acc = acc * shrink + p @ v[..., start:stop, :]
                m = m_new
            out[..., i:i + 1, :] = acc / total
        return out

    assert run(check_tiled_attention, loop).passed


def _plain_exp(q, k, v, tile, causal=False):
    """Right in exact arithmetic, but exp of raw scores: overflows on large ones."""
    total, acc = 0, 0
    for start in range(0, k.shape[-2], tile):
        s = q @ k[..., start:start + tile, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            s = s.masked_fill(torch.arange(start, start + s.shape[-1]) > torch.arange(q.shape[-2])[:, None],
                              float("-inf"))
        total, acc = total + s.exp().sum(-1, keepdim=True), acc + s.exp() @ v[..., start:start + tile, :]
    return acc / total


def _full_then_split(q, k, v, tile, causal=False):
    """Right values, but the whole score matrix first."""
    return scaled_dot_product_attention(q, k, v, causal_mask(q.shape[-2]) if causal else None)[0]


@pytest.mark.parametrize(("candidate", "hint"), [
    (lambda q, k, v, tile, causal=False: _online_attention(q, k, v, tile, causal, rescale_sum=False),
     "the sum of exponentials must shrink"),
    (lambda q, k, v, tile, causal=False: _online_attention(q, k, v, tile, causal, rescale_values=False),
     "the running sum of weighted values must shrink"),
    (lambda q, k, v, tile, causal=False: _online_attention(q, k, v, tile, causal, divide=False),
     "not divided by the sum of exponentials"),
    (lambda q, k, v, tile, causal=False: _online_attention(q, k, v, tile, causal, scaled=False), "divided by √d"),
    (lambda q, k, v, tile, causal=False: _online_attention(q, k, v, tile, causal, global_keys=False),
     "position in the whole sequence"),
    (_plain_exp, "exp(800) overflows"),
    (_full_then_split, "a tensor of 4,096 numbers"),
    (lambda q, k, v, tile, causal=False: _online_attention(q, k, v, tile, causal)[..., :1],
     "the output is [..., T_q, d_v]"),
])
def test_tiled_attention_mistakes_are_named(candidate, hint):
    assert_rejected(check_tiled_attention, candidate, hint)
