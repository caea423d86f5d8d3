"""Chapter 13's checks accept right answers and name the mistake in planted bugs
(tests/test_checks_all.py runs every check on a stub and on its reference)."""

import math
import random

import pytest
import torch
import torch.nn.functional as F
from check_helpers import assert_rejected, run, stub

from transformer_course.checks.evaluation import (
    _paired_bootstrap,
    check_heldout_bits,
    check_intervals_apart,
    check_paired_bootstrap,
    check_questions_needed,
    check_reliability_bins,
    check_wilson_interval,
)
from transformer_course.evaluation import heldout_bits, reliability_bins, wilson_interval

RIGHT = {"A": False, "B": False, "C": True, "D": True, "E": True}
CHECKS = [(check_heldout_bits, heldout_bits), (check_wilson_interval, wilson_interval),
          (check_questions_needed, lambda: 5900), (check_reliability_bins, reliability_bins),
          (check_intervals_apart, lambda: dict(RIGHT)), (check_paired_bootstrap, _paired_bootstrap)]


@pytest.mark.parametrize("check_fn, reference", CHECKS)
def test_reference_passes_and_stub_is_not_done(check_fn, reference):
    assert run(check_fn, reference).passed, run(check_fn, reference).message
    assert run(check_fn, stub).status == "not done"


def _bits(reduce):
    """heldout_bits with the loss of each batch combined by `reduce(losses, counts, n_chars)` (in nats)."""
    @torch.no_grad()
    def fn(model, ids, batch=64, chars=None):
        B = model.cfg.block_size
        n = (len(ids) - 1) // B
        x, y = ids[: n * B].view(n, B), ids[1: n * B + 1].view(n, B)
        losses, counts = [], []
        for i in range(0, n, batch):
            logits = model(x[i: i + batch])[0][..., :chars]
            losses.append(F.cross_entropy(logits.flatten(0, 1), y[i: i + batch].flatten(), reduction="sum").item())
            counts.append(y[i: i + batch].numel())
        return reduce(losses, counts, n * B)
    return fn


@pytest.mark.parametrize("fn, hint", [
    (_bits(lambda s, c, n: sum(x / m for x, m in zip(s, c, strict=True)) / len(s) / math.log(2)), "each batch's mean"),
    (_bits(lambda s, c, n: sum(s) / n), "in nats"),
    (_bits(lambda s, c, n: sum(s) / n / math.log(10)), "base 10"),
    (_bits(lambda s, c, n: sum(s) / (n // 8) / math.log(2)), "not the number of windows"),
])
def test_heldout_bits_mistakes_are_named(fn, hint):
    assert_rejected(check_heldout_bits, fn, hint)


def test_heldout_bits_ignoring_chars_is_named():
    def fn(model, ids, batch=64, chars=None):
        return heldout_bits(model, ids, batch)
    assert_rejected(check_heldout_bits, fn, "first `chars` logits")


def _wald(right, n, z=1.96):
    p = right / n
    return p - z * math.sqrt(p * (1 - p) / n), p + z * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("fn, hint", [
    (_wald, "Wald"),
    (lambda r, n, z=1.96: tuple(100 * v for v in wilson_interval(r, n, z)), "percentages"),
    (lambda r, n, z=1.96: wilson_interval(r, n, z * z), "not z²"),
    (lambda r, n, z=1.96: (r / n + z * z / (2 * n) - z * math.sqrt(r / n * (1 - r / n) / n + z * z / (4 * n * n)),
                           r / n + z * z / (2 * n) + z * math.sqrt(r / n * (1 - r / n) / n + z * z / (4 * n * n))),
     "1 + z²/n"),
    (lambda r, n, z=1.96: wilson_interval(r, n, z)[1], "two numbers"),
])
def test_wilson_mistakes_are_named(fn, hint):
    assert_rejected(check_wilson_interval, fn, hint)


@pytest.mark.parametrize("guess, hint", [(100, "the set we have"), (600, "too few"), (2400, "1/√n"),
                                         (23_600, "far too many"), (8000, "a little too many"),
                                         (5900.0, "whole number")])
def test_questions_needed_mistakes_are_named(guess, hint):
    assert_rejected(check_questions_needed, lambda: guess, hint)


def test_reliability_bins_mistakes_are_named():
    def dropped_one(conf, right, bins=10):
        keep = conf < 1
        return reliability_bins(conf[keep], right[keep], bins)

    def totals(conf, right, bins=10):
        m, s, c = reliability_bins(conf, right, bins)
        return m * c, s * c, c

    def swapped(conf, right, bins=10):
        m, s, c = reliability_bins(conf, right, bins)
        return s, m, c

    def unclamped(conf, right, bins=10):
        which = (conf * bins).long()
        count = torch.bincount(which)
        per = count.clamp(min=1)
        return torch.bincount(which, conf) / per, torch.bincount(which, right.double()) / per, count

    def nan_when_empty(conf, right, bins=10):
        m, s, c = reliability_bins(conf, right, bins)
        return m / (c > 0), s / (c > 0), c

    for fn, hint in [(dropped_one, "exactly 1 belongs"), (totals, "means, not totals"), (swapped, "the order is"),
                     (unclamped, "lands in bin"), (nan_when_empty, "not NaN")]:
        assert_rejected(check_reliability_bins, fn, hint)


@pytest.mark.parametrize("claim, hint", [("A", "holds 12.5%"), ("B", "overlap"), ("D", "whatever the seeds say")])
def test_intervals_apart_names_the_claim(claim, hint):
    wrong = dict(RIGHT, **{claim: not RIGHT[claim]})
    assert_rejected(check_intervals_apart, lambda: wrong, hint)
    assert_rejected(check_intervals_apart, lambda: {"A": True}, "keys")


def test_paired_bootstrap_mistakes_are_named():
    def unpaired(a, b, draws=2000, seed=0):
        rng, n = random.Random(seed), len(a)
        d = sorted(sum(rng.choice(a) for _ in range(n)) / n - sum(rng.choice(b) for _ in range(n)) / n
                   for _ in range(draws))
        return d[int(0.025 * draws)], d[int(0.975 * draws) - 1]

    def flipped(a, b, draws=2000, seed=0):
        return _paired_bootstrap(b, a, draws, seed)

    def unseeded(a, b, draws=2000, seed=0):
        return _paired_bootstrap(a, b, draws, random.randrange(10**9))

    for fn, hint in [(unpaired, "resampled apart"), (flipped, "a minus b"), (unseeded, "same seed")]:
        assert_rejected(check_paired_bootstrap, fn, hint)
