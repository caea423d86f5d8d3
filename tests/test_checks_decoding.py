"""Chapter 14's checks accept right answers and name the mistake in planted bugs
(tests/test_checks_all.py runs every check on a stub and on its reference too)."""

import pytest
import torch
from check_helpers import assert_rejected, run, stub

from transformer_course.checks.decoding import (
    _pack_int4,
    accept_if_p_above_q,
    check_pack_int4,
    check_predict_bits_per_weight,
    check_predict_break_even,
    check_prompt_lookup,
    check_quantize_int4,
    check_quantize_int8,
    check_verify,
    resample_from_p,
)
from transformer_course.quantization import quantize_int4, quantize_int8
from transformer_course.speculative import prompt_lookup, verify

CHECKS = [(check_quantize_int8, quantize_int8), (check_quantize_int4, quantize_int4),
          (check_predict_bits_per_weight, lambda: (8 + 32 / 768, 5.0)), (check_verify, verify),
          (check_prompt_lookup, prompt_lookup), (check_predict_break_even, lambda: 0.7747),
          (check_pack_int4, _pack_int4)]


@pytest.mark.parametrize("check_fn, reference", CHECKS)
def test_reference_passes_and_a_stub_is_not_done(check_fn, reference):
    assert run(check_fn, reference).passed
    assert run(check_fn, stub).status == "not done"


def _int8(top=127, rounder=torch.round, dim=1):
    def fn(w):
        peak = w.abs().amax(dim=dim, keepdim=True)
        scale = torch.where(peak > 0, peak / top, torch.ones_like(peak))
        return rounder(w / scale).clamp(-127, 127).to(torch.int8), scale.reshape(-1)
    return fn


@pytest.mark.parametrize("fn, hint", [
    (_int8(top=128), "overflows int8"),
    (_int8(rounder=torch.trunc), "truncates"),
    (_int8(rounder=torch.floor), "not down"),
    (lambda w: (quantize_int8(w)[0].float(), quantize_int8(w)[1]), "torch.int8"),
    (lambda w: (torch.round(w / (w.abs().amax(1, keepdim=True) / 127)).to(torch.int8), w.abs().amax(1) / 127),
     "a row of zeros"),
    (lambda w: quantize_int8(w)[0], "return two things"),
])
def test_quantize_int8_mistakes_are_named(fn, hint):
    assert_rejected(check_quantize_int8, fn, hint)


def _int4(top=7, per_row=False, strided=False):
    def fn(w, group=32):
        N, K = w.shape
        if strided:
            blocks = w.reshape(N, group, K // group).transpose(1, 2)
        else:
            blocks = w.reshape(N, 1, K) if per_row else w.reshape(N, K // group, group)
        peak = blocks.abs().amax(2, keepdim=True)
        scale = torch.where(peak > 0, peak / top, torch.ones_like(peak))
        q = torch.round(blocks / scale).clamp(-7, 7).to(torch.int8)
        q = q.transpose(1, 2).reshape(N, K) if strided else q.reshape(N, K)
        return q, scale[..., 0].expand(N, K // group)
    return fn


@pytest.mark.parametrize("fn, hint", [
    (_int4(top=8), "maps to 7"),
    (_int4(top=15), "not 15"),
    (_int4(per_row=True), "not per row"),
    (_int4(strided=True), "consecutive inputs"),
    (lambda w, group=32: quantize_int4(w, group)[0], "return two things"),
])
def test_quantize_int4_mistakes_are_named(fn, hint):
    assert_rejected(check_quantize_int4, fn, hint)


@pytest.mark.parametrize("guess, hint", [((8, 4), "the scales cost bits too"), ((8 + 32 / 768, 4.5), "1 bit each"),
                                         ((8 + 1, 5), "not per 32"), (5.0, "return two numbers")])
def test_bits_per_weight_predictions_are_named(guess, hint):
    assert_rejected(check_predict_bits_per_weight, lambda: guess, hint)


def _always_keep(p, q, drafted, generator):
    return torch.cat([drafted, torch.multinomial(p[len(drafted)], 1, generator=generator)])


def _no_bonus(p, q, drafted, generator):
    out = verify(p, q, drafted, generator)
    return out[:len(drafted)] if len(out) == len(drafted) + 1 else out


@pytest.mark.parametrize("fn, hint", [
    (accept_if_p_above_q, "not only when p > q"),
    (resample_from_p, "residual max(0, p - q)"),
    (_always_keep, "not always"),
    (_no_bonus, "one more token follows from p[k]"),
])
def test_verify_mistakes_are_named(fn, hint):
    assert_rejected(check_verify, fn, hint)


def _lookup(own_tail=False, earliest=False, gram=False):
    def fn(ctx, k, max_ngram=3):
        for n in range(min(max_ngram, len(ctx) - 1), 0, -1):
            last = len(ctx) - n - (0 if own_tail else 1)
            for start in range(0, last + 1) if earliest else range(last, -1, -1):
                if ctx[start:start + n] == ctx[-n:]:
                    return ctx[start:start + k] if gram else ctx[start + n:start + n + k]
        return []
    return fn


@pytest.mark.parametrize("fn, hint", [
    (_lookup(own_tail=True), "the tail matches itself"),  # the chapter's buggy copy
    (_lookup(earliest=True), "search from the end backwards"),
    (_lookup(gram=True), "not the n-gram itself"),
    (lambda ctx, k, max_ngram=3: prompt_lookup(ctx, k, 1), "longest n-gram first"),
    (lambda ctx, k, max_ngram=3: prompt_lookup(ctx, k, max_ngram)[:1], "up to k ids"),
    (lambda ctx, k, max_ngram=3: tuple(prompt_lookup(ctx, k, max_ngram)), "return a list"),
])
def test_prompt_lookup_mistakes_are_named(fn, hint):
    assert_rejected(check_prompt_lookup, fn, hint)


@pytest.mark.parametrize("guess, hint", [(0.519, "the draft's 4 steps too"), (0.574, "costs c = 2.0 steps"),
                                         (0.85, "up to k + 1 = 5 tokens"), (0.5, "is not it"), ("0.77", "a number")])
def test_break_even_predictions_are_named(guess, hint):
    assert_rejected(check_predict_break_even, lambda: guess, hint)


def _swapped(q):
    nib = (q.to(torch.int16) & 0xF).to(torch.uint8)
    return nib[:, 1::2] | (nib[:, 0::2] << 4)


@pytest.mark.parametrize("fn, hint", [
    (_swapped, "swap them"),
    (lambda q: q.to(torch.uint8)[:, 0::2] | (q.to(torch.uint8)[:, 1::2] << 4), "mask each value"),
    (lambda q: (q.to(torch.int16) & 0xF).to(torch.uint8), "the bytes [N, K // 2]"),
])
def test_pack_int4_mistakes_are_named(fn, hint):
    assert_rejected(check_pack_int4, fn, hint)
