"""Chapter 10's checks accept right answers and name the mistake in planted bugs
(tests/test_checks_all.py runs every check on a stub and on its reference)."""

import pytest
import torch
from check_helpers import assert_rejected, run
from torch import nn

from transformer_course.block import TransformerBlock
from transformer_course.checks.modern import (
    _RollingKVCache,
    _sliding_window_mask,
    check_modern_parts,
    check_predict_kv_bytes,
    check_rms_norm,
    check_rolling_kv_cache,
    check_rope_frequencies,
    check_rotate_halves,
    check_sliding_window_mask,
)
from transformer_course.modern import (
    RMSNorm,
    RotaryEmbedding,
    SwiGLU,
    make_norm,
    modern_parts,
    rope_frequencies,
    rotate_halves,
)
from transformer_course.positional import InputEmbedding


@pytest.mark.parametrize(
    "check_fn, reference",
    [
        (check_rms_norm, RMSNorm),
        (check_rope_frequencies, rope_frequencies),
        (check_rotate_halves, rotate_halves),
        (check_predict_kv_bytes, lambda: 5120),
        (check_modern_parts, modern_parts),
        (check_sliding_window_mask, _sliding_window_mask),
        (check_rolling_kv_cache, _RollingKVCache),
    ],
)
def test_reference_passes(check_fn, reference):
    outcome = check_fn(reference, quiet=True)
    assert outcome.passed, outcome.message
    if check_fn.reference:
        assert outcome.use is reference


def test_failed_check_hands_back_the_reference():
    outcome = check_rotate_halves(lambda x, cos, sin: x, quiet=True)
    assert outcome.status == "failed" and outcome.use is rotate_halves


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


# ---------------------------------------------------------------- 10.5 modern_parts


def _parts(cfg, *, rope_pos=True, per_block_rope=False, swiglu=True, norm_kind=None, kv=True, eps=None,
           rope_base=None, pass_rope=True):
    """The package's assembly with one mistake switched on at will."""
    def new_rope():
        return RotaryEmbedding(cfg.head_size, cfg.block_size, rope_base or cfg.rope_base)

    rope = new_rope() if cfg.positional == "rope" else None
    positional = None if rope is not None and rope_pos else ("learned" if rope is not None else cfg.positional)
    embed = InputEmbedding(cfg.vocab_size, cfg.d_model, cfg.block_size, positional, cfg.dropout)

    def norm(C):
        return make_norm(norm_kind or cfg.normalization, C, cfg.eps if eps is None else eps, cfg.bias, cfg.fast)

    blocks = nn.ModuleList(
        TransformerBlock(cfg.d_model, cfg.n_head, cfg.dropout, cfg.bias, cfg.norm, cfg.activation, cfg.fast,
                         cfg.eps, d_ff=cfg.d_ff, n_kv_head=cfg.n_kv_head if kv else None,
                         rope=(new_rope() if per_block_rope and rope is not None else rope) if pass_rope else None,
                         make_norm=norm,
                         mlp=SwiGLU(cfg.d_model, cfg.d_ff, cfg.bias, cfg.dropout) if cfg.mlp == "swiglu" and swiglu
                         else None)
        for _ in range(cfg.n_layer))
    return embed, blocks, norm(cfg.d_model)


def test_modern_parts_reference_and_a_rewrite_pass():
    assert run(check_modern_parts, modern_parts).passed
    assert run(check_modern_parts, _parts).passed


@pytest.mark.parametrize("switch, hint", [
    (dict(rope_pos=False), "has no position table"),
    (dict(swiglu=False), "each block's MLP is a SwiGLU"),
    (dict(norm_kind="layernorm"), "ln1 is LayerNorm, the config asks for RMSNorm"),
    (dict(kv=False), "pass cfg.n_kv_head to every block"),
    (dict(per_block_rope=True), "build one and give it to every block"),
    (dict(pass_rope=False), "pass rope= to every block"),
    (dict(eps=1e-3), "pass cfg.eps"),
    (dict(rope_base=500.0), "the logits differ from the package's"),
])
def test_modern_parts_mistakes(switch, hint):
    assert_rejected(check_modern_parts, lambda cfg: _parts(cfg, **switch), hint)


def test_modern_parts_must_return_three_things():
    assert_rejected(check_modern_parts, lambda cfg: _parts(cfg)[:2], "return three things")


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


# ---------------------------------------------------------------- 10.7 a rolling KV cache


class _Growing(_RollingKVCache):
    """Keeps every position and hands back the last window: right answers, memory that grows."""

    def update(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        self.length += 1
        return self.k[:, :, -self.window:], self.v[:, :, -self.window:]


class _Sliced(_Growing):
    """Concatenates, then keeps the last window: memory bounded (window + 1 positions at most)."""

    def update(self, k, v):
        keys, values = super().update(k, v)
        self.k, self.v = keys, values
        return keys, values


def _variant(**changes):
    """The reference with one mistake: ``keep`` positions handed back instead of window, ``length``
    of the positions kept, values not beside their keys, the oldest kept, one batch row everywhere."""

    class Variant(_RollingKVCache):
        def update(self, k, v):
            if changes.get("row_zero"):
                k, v = k[:1].expand_as(k), v[:1].expand_as(v)
            if changes.get("oldest") and self.length >= self.window:
                self.length += 1
                return self.k, self.v
            keys, values = super().update(k, v)
            if changes.get("drop_newest"):
                keys, values = keys[:, :, : max(keys.shape[2] - 1, 0)], values[:, :, : max(values.shape[2] - 1, 0)]
            if changes.get("values_reversed"):
                values = values.flip(2)
            if changes.get("kept_length"):
                self.length = min(self.length, self.window)
            if changes.get("one_more") and self.length > self.window:
                p = self.length - 1
                extra = (p - self.window) + torch.arange(1, dtype=k.dtype)  # the position one too far back
                keys = torch.cat([keys, (extra + k[:, :, :1] - p)], dim=2)
                values = torch.cat([values, -(extra + k[:, :, :1] - p)], dim=2)
            return keys, values

    return Variant


def test_rolling_cache_may_concatenate_and_slice():
    assert run(check_rolling_kv_cache, _Sliced).passed


@pytest.mark.parametrize(
    "cls, hint",
    [
        (_Growing, "must not grow with the sequence"),
        (_variant(kept_length=True), "length counts every position seen"),
        (_variant(drop_newest=True), "the new position itself is missing"),
        (_variant(values_reversed=True), "the values must come back in the same order as their keys"),
        (_variant(oldest=True), "the new position itself is missing"),
        (_variant(one_more=True), "one too many"),
        (_variant(row_zero=True), "each batch row and each key/value head keeps its own keys"),
    ],
)
def test_rolling_cache_mistakes(cls, hint):
    assert_rejected(check_rolling_kv_cache, cls, hint)


def test_rolling_cache_keeping_everything_is_named():
    class Everything(_Growing):
        def update(self, k, v):
            super().update(k, v)
            return self.k, self.v

    assert_rejected(check_rolling_kv_cache, Everything, "a sliding window keeps only the last")
