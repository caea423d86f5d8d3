"""The chapter 07 checks accept the reference, reject planted bugs with the matching hint, and report
a NotImplementedError stub as "not done"."""

from __future__ import annotations

import pytest
import torch

from transformer_course.checks.generation import (
    check_cached_generate,
    check_greedy_generate,
    check_temperature_probs,
    check_top_k,
    check_top_p,
)
from transformer_course.generation import generate, top_k_filter, top_p_filter

NEG_INF = float("-inf")




def _stub(*args, **kwargs):
    raise NotImplementedError("Exercise: not written yet")


def _run(check, fn):
    return check(fn, quiet=True)


def _assert_fails(check, fn, hint: str):
    outcome = _run(check, fn)
    assert outcome.status == "failed", outcome.line()
    assert hint in outcome.message, outcome.message


@pytest.mark.parametrize(
    "check",
    [check_temperature_probs, check_top_k, check_top_p, check_greedy_generate, check_cached_generate],
)
def test_stub_is_not_done(check):
    assert _run(check, _stub).status == "not done"


# ------------------------------------------------------------------ 7.1 temperature
def test_temperature_reference_passes():
    assert _run(check_temperature_probs, lambda z, t: torch.softmax(z / t, dim=-1)).passed


def test_temperature_multiplied_is_caught():
    _assert_fails(check_temperature_probs, lambda z, t: torch.softmax(z * t, dim=-1), "multiplied the logits")


def test_temperature_softmax_over_batch_is_caught():
    _assert_fails(check_temperature_probs, lambda z, t: torch.softmax(z / t, dim=0), "softmax over the last dimension")


def test_temperature_without_softmax_is_caught():
    _assert_fails(check_temperature_probs, lambda z, t: z / t, "cannot be negative")


# ------------------------------------------------------------------ 7.2 top-k
def test_top_k_reference_passes():
    assert _run(check_top_k, top_k_filter).passed


def test_top_k_threshold_keeps_ties():
    def by_threshold(z, k):
        kth = torch.topk(z, k, dim=-1).values[..., -1:]
        return z.masked_fill(z < kth, NEG_INF)

    _assert_fails(check_top_k, by_threshold, "comparing against the k-th value keeps every tie")


def test_top_k_zero_instead_of_minus_inf():
    def zeros(z, k):
        values, indices = torch.topk(z, k, dim=-1)
        return torch.zeros_like(z).scatter(-1, indices, values)

    _assert_fails(check_top_k, zeros, "must become -inf")


def test_top_k_smallest_instead_of_largest():
    def smallest(z, k):
        values, indices = torch.topk(z, k, dim=-1, largest=False)
        return torch.full_like(z, NEG_INF).scatter(-1, indices, values)

    _assert_fails(check_top_k, smallest, "keep the k LARGEST")


# ------------------------------------------------------------------ 7.3 top-p
def _sorted_mass(z):
    probs = torch.softmax(z, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    return sorted_probs, order


def test_top_p_reference_passes():
    assert _run(check_top_p, top_p_filter).passed


def test_top_p_inclusive_total_drops_the_crossing_token():
    def inclusive(z, p):
        sorted_probs, order = _sorted_mass(z)
        drop = torch.zeros_like(sorted_probs, dtype=torch.bool).scatter(-1, order, sorted_probs.cumsum(-1) > p)
        return z.masked_fill(drop, NEG_INF)

    _assert_fails(check_top_p, inclusive, "keep the token that carries the running total across p")


def test_top_p_without_sorting():
    def unsorted(z, p):
        probs = torch.softmax(z, dim=-1)
        return z.masked_fill(probs.cumsum(-1) - probs >= p, NEG_INF)

    _assert_fails(check_top_p, unsorted, "sort the probabilities largest first")


def test_top_p_keeping_too_many():
    def loose(z, p):
        sorted_probs, order = _sorted_mass(z)
        before = sorted_probs.cumsum(-1) - sorted_probs
        drop = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before > p + 0.05)
        return z.masked_fill(drop, NEG_INF)

    _assert_fails(check_top_p, loose, "stop at the first token where the running total reaches p")


# ------------------------------------------------------------------ 7.4 greedy loop
def _greedy_reference(model, idx, n):
    return generate(model, idx, n, temperature=0, use_cache=False)


def test_greedy_reference_passes():
    assert _run(check_greedy_generate, _greedy_reference).passed


def test_greedy_without_cropping_is_caught():
    def no_crop(model, idx, n):
        for _ in range(n):
            logits, _ = model(idx)
            idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return idx

    _assert_fails(check_greedy_generate, no_crop, "past block_size your loop failed")


def test_greedy_first_position_is_caught():
    def first_position(model, idx, n):
        for _ in range(n):
            logits, _ = model(idx[:, -model.cfg.block_size :])
            idx = torch.cat([idx, logits[:, 0].argmax(-1, keepdim=True)], dim=1)
        return idx

    _assert_fails(check_greedy_generate, first_position, "FIRST position")


def test_greedy_cropping_the_wrong_end_is_caught():
    def keeps_the_start(model, idx, n):
        for _ in range(n):
            logits, _ = model(idx[:, : model.cfg.block_size])
            idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return idx

    _assert_fails(check_greedy_generate, keeps_the_start, "LAST block_size tokens")


# ------------------------------------------------------------------ 7.5 cached loop
def _cached_reference(model, idx, n):
    cache, new = model.new_cache(), idx
    for _ in range(n):
        logits, _ = model(new, cache=cache)
        new = logits[:, -1].argmax(-1, keepdim=True)
        idx = torch.cat([idx, new], dim=1)
    return idx


def test_cached_reference_passes():
    assert _run(check_cached_generate, _cached_reference).passed


def test_cached_without_using_the_cache_is_caught():
    _assert_fails(check_cached_generate, _greedy_reference, "the tokens are right, but")


def test_cached_feeding_everything_again_is_caught():
    def feeds_all(model, idx, n):
        cache = model.new_cache()
        for _ in range(n):
            logits, _ = model(idx, cache=cache)
            idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return idx

    _assert_fails(check_cached_generate, feeds_all, "feed only the")


def test_cached_without_prefill_is_caught():
    def no_prefill(model, idx, n):
        cache, new = model.new_cache(), idx[:, -1:]
        for _ in range(n):
            logits, _ = model(new, cache=cache)
            new = logits[:, -1].argmax(-1, keepdim=True)
            idx = torch.cat([idx, new], dim=1)
        return idx

    _assert_fails(check_cached_generate, no_prefill, "prefill")
