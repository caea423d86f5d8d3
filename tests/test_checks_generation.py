"""The chapter 07 checks accept the reference and reject planted bugs with the matching hint
(tests/test_checks_all.py runs every check on a stub and on its reference)."""

from __future__ import annotations

import pytest
import torch
from check_helpers import assert_rejected, run

from transformer_course.checks import generation as checks
from transformer_course.checks.generation import (
    check_decode_with_cache,
    check_min_p_filter,
    check_predict_cached_work,
    check_probs_at_temperature,
    check_top_k_filter,
    check_top_p_filter,
)
from transformer_course.generation import decode_with_cache, top_k_filter, top_p_filter

NEG_INF = float("-inf")


# ------------------------------------------------------------------ 7.1 debug: temperature
def test_temperature_reference_passes():
    assert run(check_probs_at_temperature, checks.probs_at_temperature).passed
    outcome = run(check_probs_at_temperature, lambda z, t: torch.softmax(z / t, dim=-1))
    assert outcome.passed and outcome.use is not checks.probs_at_temperature


def test_temperature_power_of_probabilities_is_also_right():
    def power(z, t):
        p = torch.softmax(z, dim=-1) ** (1 / t)
        return p / p.sum(-1, keepdim=True)

    assert run(check_probs_at_temperature, power).passed


def test_temperature_after_softmax_is_the_chapters_bug():
    def after_softmax(z, t):  # the cell the chapter shows
        scaled = torch.softmax(z, dim=-1) / t
        return scaled / scaled.sum(dim=-1, keepdim=True)

    assert_rejected(
        check_probs_at_temperature, after_softmax, "same distribution as at temperature 1"
    )


def test_temperature_after_softmax_without_renormalising():
    assert_rejected(
        check_probs_at_temperature, lambda z, t: torch.softmax(z, dim=-1) / t, "do not sum to 1"
    )


def test_temperature_multiplied_is_caught():
    assert_rejected(
        check_probs_at_temperature,
        lambda z, t: torch.softmax(z * t, dim=-1),
        "multiplied the logits",
    )


def test_temperature_softmax_over_batch_is_caught():
    assert_rejected(check_probs_at_temperature, lambda z, t: torch.softmax(z / t, dim=0), "dim=-1")


def test_temperature_without_softmax_is_caught():
    assert_rejected(check_probs_at_temperature, lambda z, t: z / t, "cannot be negative")


# ------------------------------------------------------------------ 7.2 build: top-k
def test_top_k_reference_passes():
    assert run(check_top_k_filter, top_k_filter).passed


def test_top_k_threshold_keeps_ties():
    def by_threshold(z, k):
        kth = torch.topk(z, min(k, z.size(-1)), dim=-1).values[..., -1:]
        return z.masked_fill(z < kth, NEG_INF)

    assert_rejected(
        check_top_k_filter, by_threshold, "comparing against the k-th value keeps every tie"
    )


def test_top_k_zero_instead_of_minus_inf():
    def zeros(z, k):
        values, indices = torch.topk(z, k, dim=-1)
        return torch.zeros_like(z).scatter(-1, indices, values)

    assert_rejected(check_top_k_filter, zeros, "must become -inf")


def test_top_k_smallest_instead_of_largest():
    def smallest(z, k):
        values, indices = torch.topk(z, min(k, z.size(-1)), dim=-1, largest=False)
        return torch.full_like(z, NEG_INF).scatter(-1, indices, values)

    assert_rejected(check_top_k_filter, smallest, "keep the k LARGEST")


def test_top_k_larger_than_the_vocabulary_crashes():
    def no_min(z, k):
        values, indices = torch.topk(z, k, dim=-1)
        return torch.full_like(z, NEG_INF).scatter(-1, indices, values)

    assert_rejected(
        check_top_k_filter, no_min, "k larger than the vocabulary must keep every token"
    )


def test_top_k_along_the_batch_dimension():
    def along_batch(z, k):
        values, indices = torch.topk(z, min(k, z.size(0)), dim=0)
        return torch.full_like(z, NEG_INF).scatter(0, indices, values)

    assert run(check_top_k_filter, along_batch).status == "failed"


# ------------------------------------------------------------------ 7.3 build: top-p
def _sorted_mass(z):
    probs = torch.softmax(z, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    return sorted_probs, order


def test_top_p_reference_passes():
    assert run(check_top_p_filter, top_p_filter).passed


def test_top_p_inclusive_total_drops_the_crossing_token():
    def inclusive(z, p):
        sorted_probs, order = _sorted_mass(z)
        drop = torch.zeros_like(sorted_probs, dtype=torch.bool).scatter(
            -1, order, sorted_probs.cumsum(-1) > p
        )
        return z.masked_fill(drop, NEG_INF)

    assert_rejected(
        check_top_p_filter, inclusive, "keep the token that carries the running total across p"
    )


def test_top_p_without_sorting():
    def unsorted(z, p):
        probs = torch.softmax(z, dim=-1)
        return z.masked_fill(probs.cumsum(-1) - probs >= p, NEG_INF)

    assert_rejected(check_top_p_filter, unsorted, "sort the probabilities largest first")


def test_top_p_keeping_too_many():
    def loose(z, p):
        sorted_probs, order = _sorted_mass(z)
        before = sorted_probs.cumsum(-1) - sorted_probs
        drop = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before > p + 0.05)
        return z.masked_fill(drop, NEG_INF)

    assert_rejected(
        check_top_p_filter, loose, "stop at the first token where the running total reaches p"
    )


def test_top_p_decision_left_in_sorted_order():
    def not_scattered_back(z, p):
        sorted_probs, _ = _sorted_mass(z)
        return z.masked_fill(sorted_probs.cumsum(-1) - sorted_probs >= p, NEG_INF)

    assert_rejected(check_top_p_filter, not_scattered_back, "put it back")


def test_top_p_one_without_the_shortcut_drops_the_tail():
    def no_shortcut(z, p):  # float64 and exclusive, right everywhere except p = 1 on a tiny tail
        probs = torch.softmax(z.double(), dim=-1)
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs
        drop = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before >= p)
        return z.masked_fill(drop, NEG_INF)

    assert_rejected(check_top_p_filter, no_shortcut, "p = 1 must keep every token")


# ------------------------------------------------------------------ 7.4 predict: the cache's work
@pytest.mark.parametrize(
    ("guess", "hint"),
    [
        ((40, 46), None),
        ((41, 47), "one pass too many"),
        ((40, 47), "one position too many"),
        ((40, 1060), "WITHOUT the cache"),
        ((40, 40), "feeds the whole prompt"),
        ((1, 46), "ONE new token"),
        ((40, 50), "Count the prefill"),
        (46, "return a pair"),
    ],
)
def test_predict_cached_work(guess, hint):
    outcome = run(check_predict_cached_work, lambda: guess)
    if hint is None:
        assert outcome.passed, outcome.line()
    else:
        assert outcome.status == "failed" and hint in outcome.message, outcome.line()


# ------------------------------------------------------------------ 7.5 build: the cached loop
def test_cached_reference_passes():
    assert run(check_decode_with_cache, decode_with_cache).passed


def test_cached_loop_without_last_only_passes():
    def plain_call(model, window, n, choose):
        cache, new = model.new_cache(), window
        for _ in range(n):
            logits, _ = model(new, cache=cache)
            nxt = choose(logits[:, -1, :])
            yield nxt
            new = nxt[:, None]

    assert run(check_decode_with_cache, plain_call).passed


def test_cached_loop_without_the_cache_is_caught():
    def no_cache(model, window, n, choose):  # right tokens, the whole text every step
        seq = window
        for _ in range(n):
            nxt = choose(model(seq)[0][:, -1, :])
            yield nxt
            seq = torch.cat([seq, nxt[:, None]], dim=1)

    assert_rejected(check_decode_with_cache, no_cache, "the tokens are right, but")


def test_cached_loop_feeding_everything_again_is_caught():
    def feeds_all(model, window, n, choose):
        cache, seq = model.new_cache(), window
        for _ in range(n):
            nxt = choose(model(seq, cache=cache)[0][:, -1, :])
            yield nxt
            seq = torch.cat([seq, nxt[:, None]], dim=1)

    assert_rejected(check_decode_with_cache, feeds_all, "feed only the")


def test_cached_loop_without_prefill_is_caught():
    def no_prefill(model, window, n, choose):
        cache, new = model.new_cache(), window[:, -1:]
        for _ in range(n):
            nxt = choose(model(new, cache=cache)[0][:, -1, :])
            yield nxt
            new = nxt[:, None]

    assert_rejected(check_decode_with_cache, no_prefill, "prefill")


def test_cached_loop_with_a_fresh_cache_each_step_is_caught():
    def fresh_cache(model, window, n, choose):  # every new token sits at position 0
        new = window
        for _ in range(n):
            nxt = choose(model(new, cache=model.new_cache())[0][:, -1, :])
            yield nxt
            new = nxt[:, None]

    assert_rejected(check_decode_with_cache, fresh_cache, "SAME cache")


def test_cached_loop_with_its_own_argmax_is_caught():
    def own_argmax(model, window, n, choose):
        cache, new = model.new_cache(), window
        for _ in range(n):
            logits = model(new, cache=cache)[0][:, -1, :]
            yield choose(logits)
            new = logits.argmax(-1)[:, None]  # feeds back its own pick, not choose's

    assert_rejected(check_decode_with_cache, own_argmax, "what choose returned")


def test_cached_loop_returning_a_tensor_is_caught():
    def returns_all(model, window, n, choose):
        return torch.stack(list(decode_with_cache(model, window, n, choose)), dim=1)

    assert_rejected(check_decode_with_cache, returns_all, "yield each step's tokens")


def test_cached_loop_yielding_only_at_the_end_is_caught():
    def collects_first(model, window, n, choose):
        yield from list(decode_with_cache(model, window, n, choose))

    assert_rejected(check_decode_with_cache, collects_first, "as soon as choose has picked it")


def test_cached_loop_with_an_extra_pass_after_the_last_token_is_caught():
    def one_pass_too_many(model, window, n, choose):
        cache, new = model.new_cache(), window
        logits = model(new, cache=cache, last_only=True)[0]
        for _ in range(n):
            nxt = choose(logits[:, -1, :])
            yield nxt
            logits = model(nxt[:, None], cache=cache, last_only=True)[
                0
            ]  # one pass after the last token too

    assert_rejected(check_decode_with_cache, one_pass_too_many, "ran the model once more")


def test_cached_loop_calling_choose_on_every_position_is_caught():
    def all_positions(model, window, n, choose):
        cache, new = model.new_cache(), window
        for _ in range(n):
            nxt = choose(model(new, cache=cache)[0])[:, -1]  # [B, T, V] handed to choose
            yield nxt
            new = nxt[:, None]

    assert_rejected(check_decode_with_cache, all_positions, "LAST position's logits")


# ------------------------------------------------------------------ 7.6 extend: min-p
def test_min_p_reference_passes():
    assert run(check_min_p_filter, checks.min_p_filter).passed


def test_min_p_in_logit_space_passes():
    def in_logits(z, min_p):
        top = z.amax(dim=-1, keepdim=True)
        return z.masked_fill(z < top + torch.log(torch.tensor(min_p)), NEG_INF)

    assert run(check_min_p_filter, in_logits).passed


def test_min_p_absolute_bar_is_caught():
    def absolute(z, min_p):
        return z.masked_fill(torch.softmax(z, -1) < min_p, NEG_INF)

    assert_rejected(check_min_p_filter, absolute, "min_p TIMES the row's top probability")


def test_min_p_one_top_for_the_whole_batch_is_caught():
    def batch_max(z, min_p):
        probs = torch.softmax(z, -1)
        return z.masked_fill(probs < min_p * probs.max(), NEG_INF)

    assert_rejected(check_min_p_filter, batch_max, "each row's own maximum")


def test_min_p_on_logits_is_caught():
    def on_logits(z, min_p):
        return z.masked_fill(z < min_p * z.amax(-1, keepdim=True), NEG_INF)

    assert_rejected(check_min_p_filter, on_logits, "you compared logits")


def test_min_p_strict_bar_is_caught():
    def strict(z, min_p):
        probs = torch.softmax(z, -1)
        return z.masked_fill(probs <= min_p * probs.amax(-1, keepdim=True), NEG_INF)

    assert_rejected(check_min_p_filter, strict, ">= the bar, not >")


def test_min_p_zero_instead_of_minus_inf_is_caught():
    def zeros(z, min_p):
        probs = torch.softmax(z, -1)
        return z.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), 0.0)

    assert_rejected(check_min_p_filter, zeros, "not 0")
