"""Chapter 10's checks accept right answers and name the mistake in planted bugs
(tests/test_checks_all.py runs every check on a stub and on its reference)."""

import pytest
import torch
from check_helpers import assert_rejected

from transformer_course.checks.modern import (
    _sliding_window_mask,
    check_predict_kv_bytes,
    check_rms_norm,
    check_rope_frequencies,
    check_rotate_halves,
    check_share_kv_heads,
    check_sliding_window_mask,
)
from transformer_course.modern import RMSNorm, rope_frequencies, rotate_halves, share_kv_heads


@pytest.mark.parametrize(
    "check_fn, reference",
    [
        (check_rms_norm, RMSNorm),
        (check_rope_frequencies, rope_frequencies),
        (check_rotate_halves, rotate_halves),
        (check_predict_kv_bytes, lambda: 5120),
        (check_share_kv_heads, share_kv_heads),
        (check_sliding_window_mask, _sliding_window_mask),
    ],
)
def test_reference_passes(check_fn, reference):
    outcome = check_fn(reference, quiet=True)
    assert outcome.passed, outcome.message
    if check_fn.reference:
        assert outcome.use is reference


def test_failed_check_hands_back_the_reference():
    outcome = check_share_kv_heads(lambda kv, n: kv, quiet=True)
    assert outcome.status == "failed" and outcome.use is share_kv_heads


# ---------------------------------------------------------------- 10.1 RMSNorm


def _rms_variant(body):
    class Variant(RMSNorm):
        def forward(self, x):
            return body(self, x)
    return Variant


@pytest.mark.parametrize(
    "body, hint",
    [
        (
            lambda self, x: torch.nn.functional.layer_norm(
                x, (self.d_model,), self.weight, None, self.eps
            ),
            "the mean is subtracted",
        ),
        (
            lambda self, x: x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps) * self.weight,
            "eps must go inside",
        ),
        (
            lambda self, x: x / (x.pow(2).sum(-1, keepdim=True) + self.eps).sqrt() * self.weight,
            "not of their sum",
        ),
        (
            lambda self, x: x / (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt(),
            "learned gain self.weight",
        ),
        (
            lambda self, x: x / (x.pow(2).mean(0, keepdim=True) + self.eps).sqrt() * self.weight,
            "differs from x / sqrt",
        ),
        (  # right in float32, but computed in bf16 when x is bf16
            lambda self, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight,
            "ran in bf16",
        ),
        (  # float32 inside, but the result left in float32
            lambda self, x: x.float() / (x.float().pow(2).mean(-1, keepdim=True) + self.eps).sqrt() * self.weight,
            "bf16 in must give bf16 out",
        ),
    ],
)
def test_rms_norm_mistakes(body, hint):
    assert_rejected(check_rms_norm, _rms_variant(body), hint)


def test_rms_norm_in_float32_passes_whatever_the_order_of_its_operations():
    """rsqrt or a division, the gain applied in float32 or in x's dtype: all round to the same bf16."""
    def gain_in_float32(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)
    assert check_rms_norm(_rms_variant(gain_in_float32), quiet=True).status == "passed"


# ---------------------------------------------------------------- 10.2 rope_frequencies


@pytest.mark.parametrize(
    "fn, hint",
    [
        (
            lambda hs, base: 1.0 / base ** (torch.arange(hs // 2).float() / hs),
            "the exponent is i/hs",
        ),  # the chapter's bug
        (lambda hs, base: base ** (torch.arange(0, hs, 2).float() / hs), "the speeds grow with i"),
        (lambda hs, base: 1.0 / base ** (torch.arange(hs).float() / hs), "hs // 2 numbers"),
        (lambda hs, base: 1.0 / base ** (torch.arange(0, hs, 2).double() / hs), "float32"),
    ],
)
def test_rope_frequencies_mistakes(fn, hint):
    assert_rejected(check_rope_frequencies, fn, hint)


# ---------------------------------------------------------------- 10.3 rotate_halves


def _interleaved(x, cos, sin):
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


@pytest.mark.parametrize(
    "fn, hint",
    [
        (_interleaved, "interleaved convention"),
        (
            lambda x, c, s: torch.cat(
                [
                    x.chunk(2, -1)[0] * c + x.chunk(2, -1)[1] * s,
                    -x.chunk(2, -1)[0] * s + x.chunk(2, -1)[1] * c,
                ],
                -1,
            ),
            "turn backwards",
        ),
        (
            lambda x, c, s: torch.cat(
                [
                    x.chunk(2, -1)[0] * s + x.chunk(2, -1)[1] * c,
                    x.chunk(2, -1)[0] * c - x.chunk(2, -1)[1] * s,
                ],
                -1,
            ),
            "halves are swapped",
        ),
        (lambda x, c, s: x * torch.cat([c, c], -1), "keeps every vector's length"),
    ],
)
def test_rotate_halves_mistakes(fn, hint):
    assert_rejected(check_rotate_halves, fn, hint)


# ---------------------------------------------------------------- 10.4 predict


@pytest.mark.parametrize("answer, hint", [
    (20480, "not query heads (8)"), (2560, "a factor of 2"), (2560, "not 2 (bf16's)"),
    (10240, "not 8 (float64's)"), (1280, "each float32 takes 4 bytes"), (640, "int8's"),
    (5120.0, "whole number"), (4000, "is not it"),
])
def test_predict_mistakes(answer, hint):
    assert_rejected(check_predict_kv_bytes, lambda: answer, hint)


# ---------------------------------------------------------------- 10.5 share_kv_heads


@pytest.mark.parametrize("fn, hint", [
    (lambda kv, nh: kv.repeat(1, nh // kv.shape[1], 1, 1), "tiled"),
    (lambda kv, nh: kv.repeat_interleave(nh // kv.shape[1], dim=2), "gives (2,"),
    (lambda kv, nh: kv[:, :1].expand(-1, nh, -1, -1), "must read key/value head"),
])
def test_share_kv_heads_mistakes(fn, hint):
    assert_rejected(check_share_kv_heads, fn, hint)


# ---------------------------------------------------------------- 10.6 sliding window


@pytest.mark.parametrize(
    "fn, hint",
    [
        (lambda T, w, past=0: _sliding_window_mask(T, w + 1, past), "one key too many"),
        (lambda T, w, past=0: _sliding_window_mask(T, w - 1, past), "one key too few"),
        (
            lambda T, w, past=0: (
                (past + torch.arange(T)[:, None] - torch.arange(past + T)).abs() < w
            ),
            "stay causal",
        ),
        (lambda T, w, past=0: _sliding_window_mask(T, w, 0), "one row per new query"),
        # the right shape, but the new queries placed at 0 .. T-1 instead of after the cached keys
        (lambda T, w, past=0: _sliding_window_mask(past + T, w, 0)[:T], "shift the query positions by past"),
        (lambda T, w, past=0: _sliding_window_mask(T, w, past).int(), "bool tensor"),
    ],
)
def test_sliding_window_mistakes(fn, hint):
    assert_rejected(check_sliding_window_mask, fn, hint)
