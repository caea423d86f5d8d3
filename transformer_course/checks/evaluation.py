"""Checks for chapter 13's exercises (evaluation). Hand-written.

Each check compares the learner's answer with a value it computes its own way (one batch of plain
cross-entropy, hand-worked numbers, loops over plain floats) and names a likely mistake from a table
of (what that mistake gives, hint) rows. The reference of the extend exercise 13.6
(``_paired_bootstrap``) lives here: it is not part of the package's API.
"""

import math
import random

import torch
import torch.nn.functional as F

from .. import evaluation as _evaluation
from ._core import check, expect, expect_runs


def _number(got, what: str = "a number") -> float:
    expect(
        isinstance(got, int | float) and not isinstance(got, bool), f"return {what}, got {got!r}"
    )
    return float(got)


def _near(got, want, rows, generic: str, tol: float) -> None:
    """Pass when ``got`` (a number or a tuple of them) is within ``tol`` of ``want``, else fail with
    the hint of the first row (wrong value, hint) it is within ``tol`` of, or ``generic``."""

    def close(x, y) -> bool:
        x, y = (
            (x,) if not isinstance(x, tuple | list) else x,
            (y,) if not isinstance(y, tuple | list) else y,
        )
        return len(x) == len(y) and all(
            math.isclose(float(a), float(b), abs_tol=tol) for a, b in zip(x, y, strict=True)
        )

    if close(got, want):
        return
    expect(False, next((hint for wrong, hint in rows if close(got, wrong)), generic))


# ---------------------------------------------------------------- 13.1 debug: heldout_bits


def _tiny_model():
    from ..config import GPTConfig
    from ..model import GPT

    torch.manual_seed(13)  # the check's own random state (the wrapper forks it)
    return GPT(GPTConfig(vocab_size=13, block_size=8, n_layer=1, n_head=2, d_model=16)).eval()


@check("13.1", "heldout_bits", reference=_evaluation.heldout_bits)
def check_heldout_bits(fn):
    """``fn(model, ids [N], batch, chars) -> float``: bits per character, whatever the batch."""
    model = _tiny_model()
    ids = torch.randint(0, 10, (8 * 10 + 5,), generator=torch.Generator().manual_seed(1))
    n = (len(ids) - 1) // 8
    x, y = ids[: n * 8].view(n, 8), ids[1 : n * 8 + 1].view(n, 8)
    with torch.no_grad():
        logits = model(x)[0]
        nats = F.cross_entropy(
            logits.flatten(0, 1), y.flatten()
        ).item()  # every character, one batch
        per_batch = [
            F.cross_entropy(logits[i : i + 3].flatten(0, 1), y[i : i + 3].flatten()).item()
            for i in range(0, n, 3)
        ]
        kept = F.cross_entropy(logits[..., :10].flatten(0, 1), y.flatten()).item()
    want = nats / math.log(2)
    rows = [
        (
            sum(per_batch) / len(per_batch) / math.log(2),
            "each batch's mean counts the same, and the last batch holds fewer windows: add up the "
            "per-character losses (reduction='sum') and divide by how many characters were scored",
        ),
        (nats, "that is in nats: divide by ln 2 for bits"),
        (nats / math.log(10), "bits are log base 2, not base 10: divide the nats by ln 2"),
        (
            nats * 8 / math.log(2),
            "divide by the number of characters scored, not the number of windows",
        ),
    ]
    got = _number(expect_runs(fn, model, ids, 3, hint="heldout_bits(model, ids, batch=3) failed"))
    _near(
        got, want, rows, f"expected {want:.4f} bits per character for batch 3, got {got:.4f}", 1e-4
    )
    _near(
        _number(fn(model, ids, 10)), want, rows, "batch 10 gives another answer than batch 3", 1e-4
    )
    got = _number(fn(model, ids, 4, chars=10))
    _near(
        got,
        kept / math.log(2),
        [(want, "keep only the first `chars` logits: [..., :chars]")],
        "with chars=10 only the first 10 logits count",
        1e-4,
    )


# ---------------------------------------------------------------- 13.2 build: wilson_interval


def _wald(r, n, z):
    p = r / n
    return p - z * math.sqrt(p * (1 - p) / n), p + z * math.sqrt(p * (1 - p) / n)


def _unscaled(r, n, z):  # the centre and half-width without the 1 / (1 + z²/n) factor
    p = r / n
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return p + z * z / (2 * n) - half, p + z * z / (2 * n) + half


_WILSON_MISTAKES = [
    (
        _wald,
        "that is the textbook (Wald) interval: the standard error at the observed share; "
        "Wilson's takes it at p and solves for the p that fit",
    ),
    (_unscaled, "the centre and the half-width both divide by 1 + z²/n: that factor is missing"),
    (
        lambda r, n, z: tuple(100 * v for v in _evaluation.wilson_interval(r, n, z)),
        "return fractions in [0, 1], not percentages",
    ),
    (
        lambda r, n, z: _evaluation.wilson_interval(r, n, z * z),
        "z multiplies the standard error once: z, not z²",
    ),
]


@check("13.2", "wilson_interval", reference=_evaluation.wilson_interval)
def check_wilson_interval(fn):
    """``fn(right, n, z) -> (low, high)``."""
    for r, n, z, want in [
        (18, 100, 1.96, (0.117001, 0.266675)),
        (0, 10, 1.96, (0.0, 0.27754)),
        (10, 10, 1.96, (0.72246, 1.0)),
        (3, 7, 1.0, (0.262309, 0.612691)),
        (310, 400, 1.96, (0.731572, 0.813196)),
    ]:
        got = expect_runs(fn, r, n, z, hint=f"wilson_interval({r}, {n}, {z}) failed")
        expect(
            isinstance(got, tuple | list) and len(got) == 2,
            f"return two numbers (low, high), got {got!r}",
        )
        rows = [(wrong(r, n, z), hint) for wrong, hint in _WILSON_MISTAKES]
        _near(
            tuple(got),
            want,
            rows,
            f"{r} of {n} with z = {z}: expected ({want[0]:.4f}, {want[1]:.4f}), got "
            f"({float(got[0]):.4f}, {float(got[1]):.4f})",
            1e-4,
        )


# ---------------------------------------------------------------- 13.3 predict: questions needed


@check("13.3", "questions_needed")
def check_questions_needed(fn):
    """``fn() -> int``: about 5,900 questions give ±1 point near 19%."""
    got = fn()
    expect(
        isinstance(got, int) and not isinstance(got, bool), f"return a whole number, got {got!r}"
    )
    rows = [
        (got <= 100, "100 questions is the set we have: its interval is about ±8 points"),
        (got < 1000, "too few: try wilson_interval(190, 1000): still about ±2.4 points"),
        (
            got < 5000,
            "closer, but the half-width shrinks only as 1/√n: 4 times the questions halve it",
        ),
        (got > 20_000, "far too many: ±1 point is a half-width of 0.01, not 0.005 or less"),
        (
            got > 7000,
            "a little too many: search n with your wilson_interval until high − low ≤ 0.02",
        ),
    ]
    expect(5000 <= got <= 7000, next((hint for hit, hint in rows if hit), f"{got} is not it"))


# ---------------------------------------------------------------- 13.4 build: reliability_bins


def _bins_by_loops(conf: list[float], right: list[bool], k: int):
    sums, hits, count = [0.0] * k, [0.0] * k, [0] * k
    for c, r in zip(conf, right, strict=True):
        b = min(int(c * k), k - 1)
        sums[b], hits[b], count[b] = sums[b] + c, hits[b] + r, count[b] + 1
    return (
        [s / max(m, 1) for s, m in zip(sums, count, strict=True)],
        [h / max(m, 1) for h, m in zip(hits, count, strict=True)],
        count,
    )


def _as_lists(got, k: int):
    expect(
        isinstance(got, tuple | list) and len(got) == 3,
        "return three tensors: (mean confidence, share right, count), each [bins]",
    )
    out = [torch.as_tensor(g).double().reshape(-1).tolist() for g in got]
    expect(
        not any(len(o) == k + 1 for o in out),
        f"{k + 1} bins for {k}: a confidence of exactly 1 lands in bin "
        f"{k}; it belongs to the last bin, {k - 1}",
    )
    expect(all(len(o) == k for o in out), f"each of the three has one entry per bin: {k}")
    return out


@check("13.4", "reliability_bins", reference=_evaluation.reliability_bins)
def check_reliability_bins(fn):
    """``fn(confidence [N], correct [N], bins) -> (mean confidence, share right, count)``: [K]."""
    hand = _as_lists(
        fn(torch.tensor([0.2, 0.4, 0.9, 1.0]), torch.tensor([False, True, True, True]), 2), 2
    )
    rows = [
        (
            [[0.3, 0.9], [0.5, 1.0], [2, 1]],
            "a confidence of exactly 1 belongs to the last bin, not to none",
        ),
        (
            [[0.6, 1.9], [1.0, 2.0], [2, 2]],
            "divide each bin's sums by its count: means, not totals",
        ),
        ([[0.5, 1.0], [0.3, 0.95], [2, 2]], "the order is (mean confidence, share right, count)"),
    ]
    expect_flat = [v for part in hand for v in part]
    want = [[0.3, 0.95], [0.5, 1.0], [2, 2]]
    close = lambda a, b: all(math.isclose(x, y, abs_tol=1e-6) for x, y in zip(a, b, strict=True))  # noqa: E731
    flat = lambda parts: [v for p in parts for v in p]  # noqa: E731
    if not close(expect_flat, flat(want)):
        expect(
            False,
            next(
                (h for wrong, h in rows if close(expect_flat, flat(wrong))),
                f"by hand: means (0.3, 0.95), shares (0.5, 1.0), counts (2, 2); got {hand}",
            ),
        )
    g = torch.Generator().manual_seed(4)
    conf = torch.cat([torch.rand(200, generator=g) * 0.6 + 0.3, torch.tensor([0.5, 0.7, 1.0, 0.0])])
    right = torch.rand(len(conf), generator=g) < conf
    got = _as_lists(fn(conf, right, 10), 10)
    want = _bins_by_loops(conf.tolist(), right.tolist(), 10)
    expect(
        not any(math.isnan(v) for v in flat(got)),
        "an empty bin gets 0 and 0 (count 0), not NaN: divide by the count clamped to at least 1",
    )
    expect(
        close(flat(got), flat(want)),
        "204 confidences in 10 bins: bin k holds [k/10, (k+1)/10), 0.5 "
        "and 0.7 open their bins; compare your counts with a loop over the values",
    )


# ---------------------------------------------------------------- 13.5 predict: intervals apart

_CLAIMS = {
    "A": (
        False,
        "A: 17/100 gives 10.9% to 25.5%, which holds 12.5%: the speaker task is not "
        "shown to beat chance",
    ),
    "B": (False, "B: 310/400 (73%-81%) and 297/400 (70%-78%) overlap over most of their width"),
    "C": (True, "C: 362/400 (87%-93%) and 310/400 (73%-81%) are apart"),
    "D": (True, "D: 71/100 (62%-79%) and 91/100 (84%-95%) are apart, whatever the seeds say"),
    "E": (True, "E: 12/100 (7%-20%) and 0/100 (0%-3.7%) are apart"),
}


@check("13.5", "intervals_apart")
def check_intervals_apart(fn):
    """``fn() -> {"A": bool, ..., "E": bool}``."""
    got = fn()
    expect(
        isinstance(got, dict) and set(got) == set(_CLAIMS), 'return a dict with the keys "A" to "E"'
    )
    expect(
        all(isinstance(v, bool) for v in got.values()),
        "each value is True (apart) or False (overlap)",
    )
    wrong = [hint for claim, (apart, hint) in _CLAIMS.items() if got[claim] != apart]
    expect(not wrong, f"{len(wrong)} of 5 not right; the first: {wrong[0] if wrong else ''}")


# ---------------------------------------------------------------- 13.6 extend: paired bootstrap


def _paired_bootstrap(
    a: list[bool], b: list[bool], draws: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """The 95% percentile interval of share(a) − share(b), questions resampled together."""
    rng, n = random.Random(seed), len(a)
    diffs = sorted(
        sum(a[i] - b[i] for i in (rng.randrange(n) for _ in range(n))) / n for _ in range(draws)
    )
    return diffs[int(0.025 * draws)], diffs[int(0.975 * draws) - 1]


@check("13.6", "paired_bootstrap", reference=_paired_bootstrap)
def check_paired_bootstrap(fn):
    """``fn(a [n] bools, b [n] bools, draws, seed) -> (low, high)``, near the reference's."""
    a = [True] * 120 + [False] * 80  # the two models agree on 190 of the 200 questions
    b = [True] * 110 + [False] * 90
    shared = random.getstate(), torch.random.get_rng_state()  # the generators every caller shares
    got = expect_runs(fn, a, b, 2000, 0, hint="paired_bootstrap(a, b, 2000, 0) failed")
    expect(random.getstate() == shared[0] and torch.equal(torch.random.get_rng_state(), shared[1]),
           "the same seed must give the same interval: draw from random.Random(seed), not from the generator "
           "the random module (or torch) shares with every caller")
    expect(isinstance(got, tuple | list) and len(got) == 2, f"return (low, high), got {got!r}")
    lo, hi = _paired_bootstrap(a, b)
    expect(
        float(got[1]) - float(got[0]) < 2 * (hi - lo),
        "the interval is far too wide: a and b were resampled apart; draw the question indices "
        "once and use them for both models, so what they share cancels",
    )
    rows = [((-hi, -lo), "that is share(b) − share(a): the difference is a minus b")]
    _near(
        tuple(got),
        (lo, hi),
        rows,
        f"expected about ({lo:.3f}, {hi:.3f}) for a difference of 0.05 on "
        f"questions the two agree on, got ({float(got[0]):.3f}, {float(got[1]):.3f})",
        0.012,
    )
    again = fn(a, b, 2000, 0)
    expect(
        tuple(again) == tuple(got),
        "the same seed must give the same interval: use random.Random(seed)",
    )
