"""The chapter 03 checks accept the reference, reject realistic mistakes with the right hint, and
report a stub that raises NotImplementedError as "not done"."""

import math

import pytest
import torch

from transformer_course.attention import causal_mask, scaled_dot_product_attention
from transformer_course.checks import CheckOutcome
from transformer_course.checks.attention import (
    check_attention,
    check_attention_scores,
    check_causal_mask,
    check_head_forward,
    check_padded_causal_mask,
)


def run(check_fn, candidate) -> CheckOutcome:
    return check_fn(candidate, quiet=True)


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise: write me")


ALL_CHECKS = [check_attention_scores, check_causal_mask, check_attention, check_head_forward, check_padded_causal_mask]


@pytest.mark.parametrize("check_fn", ALL_CHECKS)
def test_stub_is_not_done(check_fn):
    outcome = run(check_fn, stub)
    assert outcome.status == "not done"
    assert outcome.exercise == check_fn.exercise


def test_check_prints_one_line(capsys):
    check_causal_mask(lambda T: torch.ones(T, T, dtype=torch.bool).tril())
    assert capsys.readouterr().out == "✅ Exercise 3.2 (my_causal_mask): passed\n"


# ---------------------------------------------------------------- 3.1


def scores_ref(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


@pytest.mark.filterwarnings("ignore:The use of `x.T`:UserWarning")
@pytest.mark.parametrize(
    "candidate, hint",
    [
        (lambda q, k: q @ k.transpose(-2, -1), "raw dot products"),
        (lambda q, k: q @ k.transpose(-2, -1) / q.shape[-1], "divided by d_k"),
        (lambda q, k: k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1]), "rows must be queries"),
        (lambda q, k: q @ k.T / math.sqrt(q.shape[-1]), "not for a batch"),
        (lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(k.shape[-2]), "differ from q kᵀ / √d_k"),
    ],
)
def test_scores_rejects(candidate, hint):
    outcome = run(check_attention_scores, candidate)
    assert outcome.status == "failed" and hint in outcome.message, outcome.message


def test_scores_accepts_reference():
    assert run(check_attention_scores, scores_ref).passed


# ---------------------------------------------------------------- 3.2


@pytest.mark.parametrize(
    "candidate, hint",
    [
        (lambda T: torch.ones(T, T, dtype=torch.bool).triu(), "position 0 can see position 1"),
        (lambda T: torch.ones(T, T, dtype=torch.bool).tril(-1), "position 0 cannot see itself"),
        (lambda T: torch.ones(T, T).tril(), "return a bool tensor"),
        (lambda T: torch.ones(T, T, dtype=torch.bool).tril().triu(-1), "position 2 cannot see the earlier position 0"),
    ],
)
def test_causal_mask_rejects(candidate, hint):
    outcome = run(check_causal_mask, candidate)
    assert outcome.status == "failed" and hint in outcome.message, outcome.message


def test_causal_mask_accepts_reference():
    assert run(check_causal_mask, causal_mask).passed


# ---------------------------------------------------------------- 3.3


def attention_without_nan_fix(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_inverted_mask(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_wrong_softmax_dim(q, k, v, mask=None):
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-2)
    return weights @ v, weights


def attention_unscaled(q, k, v, mask=None):
    weights = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    return weights @ v, weights


@pytest.mark.parametrize(
    "candidate, hint",
    [
        (attention_without_nan_fix, "gave NaN"),
        (attention_inverted_mask, "a masked key got weight"),
        (attention_wrong_softmax_dim, "do not sum to 1"),
        (attention_unscaled, "unscaled scores"),
        (lambda q, k, v, mask=None: scaled_dot_product_attention(q, k, v, mask)[0], "return a pair"),
    ],
)
def test_attention_rejects(candidate, hint):
    outcome = run(check_attention, candidate)
    assert outcome.status == "failed" and hint in outcome.message, outcome.message


def test_attention_accepts_reference():
    assert run(check_attention, scaled_dot_product_attention).passed


# ---------------------------------------------------------------- 3.4


def head_ref(x, w_q, w_k, w_v, *, causal=True, transpose=True, values=None):
    def project(w):
        return x @ w.T if transpose else x @ w

    q, k, v = project(w_q), project(w_k), project(values if values is not None else w_v)
    mask = causal_mask(x.shape[1]) if causal else None
    return scaled_dot_product_attention(q, k, v, mask)[0]


@pytest.mark.parametrize(
    "candidate, hint",
    [
        (lambda x, w_q, w_k, w_v: head_ref(x, w_q, w_k, w_v, causal=False), "apply the causal mask"),
        (lambda x, w_q, w_k, w_v: head_ref(x, w_q, w_k, w_v, transpose=False), "transposed weights"),
        (lambda x, w_q, w_k, w_v: head_ref(x, w_q, w_k, w_v, values=w_k), "must come from w_v"),
    ],
)
def test_head_forward_rejects(candidate, hint):
    outcome = run(check_head_forward, candidate)
    assert outcome.status == "failed" and hint in outcome.message, outcome.message


def test_head_forward_crash_is_reported():
    outcome = run(check_head_forward, lambda x, w_q, w_k, w_v: x @ torch.cat([w_q, w_k]))
    assert outcome.status == "failed" and "your code raised RuntimeError" in outcome.message, outcome.message


def test_head_forward_accepts_reference():
    assert run(check_head_forward, head_ref).passed


# ---------------------------------------------------------------- 3.5


def padded_ref(lengths, T):
    keys_real = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    return causal_mask(T)[None] & keys_real[:, None, :]


@pytest.mark.parametrize(
    "candidate, hint",
    [
        (lambda lengths, T: causal_mask(T)[None] & (torch.arange(T)[None, :] < lengths[:, None])[:, :, None], "hid the padded queries"),
        (lambda lengths, T: (torch.arange(T)[None, :] < lengths[:, None])[:, None, :].expand(-1, T, -1), "combine the padding mask with the causal"),
        (lambda lengths, T: causal_mask(T)[None] & (torch.arange(T)[None, :] <= lengths[:, None])[:, None, :], "can see key 3, a padding position"),
        (lambda lengths, T: padded_ref(lengths, T).float(), "return a bool tensor"),
    ],
)
def test_padded_rejects(candidate, hint):
    outcome = run(check_padded_causal_mask, candidate)
    assert outcome.status == "failed" and hint in outcome.message, outcome.message


def test_padded_accepts_reference():
    assert run(check_padded_causal_mask, padded_ref).passed
