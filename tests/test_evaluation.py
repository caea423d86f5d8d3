"""Chapter 13's evaluation tools against independent references: Wilson's interval found by bisection
on its defining inequality, bits per character from one batch of plain cross-entropy, reliability bins
from loops, pass@k from every k-subset, baselines and contamination by hand."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from transformer_course.assistant import Example, word_task
from transformer_course.config import GPTConfig
from transformer_course.evaluation import (
    baselines,
    calibration_error,
    heldout_bits,
    next_char_confidence,
    pass_at_k,
    reliability_bins,
    seen_in,
    wilson_interval,
)
from transformer_course.model import GPT


def _plausible_edge(right: int, n: int, z: float, upper: bool) -> float:
    """The end of the set of p with |right/n − p| <= z·sqrt(p(1 − p)/n), by bisection (Wilson's definition)."""
    share = right / n
    inside = lambda p: abs(share - p) <= z * math.sqrt(p * (1 - p) / n)  # noqa: E731
    lo, hi = (share, 1.0) if upper else (0.0, share)
    if inside(hi if upper else lo):
        return hi if upper else lo
    for _ in range(200):
        mid = (lo + hi) / 2
        if inside(mid) == upper:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@pytest.mark.parametrize("right, n, z", [(18, 100, 1.96), (0, 10, 1.96), (10, 10, 1.96), (3, 7, 1.0), (310, 400, 2.58),
                                         (1, 1, 1.96), (50, 100, 1.645)])
def test_wilson_matches_its_definition(right, n, z):
    lo, hi = wilson_interval(right, n, z)
    assert lo == pytest.approx(_plausible_edge(right, n, z, False), abs=1e-9)
    assert hi == pytest.approx(_plausible_edge(right, n, z, True), abs=1e-9)


def test_wilson_covers_about_95_percent():
    g = torch.Generator().manual_seed(3)
    hits = (torch.rand(4000, 200, generator=g) < 0.3).sum(1).tolist()
    covered = sum(lo <= 0.3 <= hi for lo, hi in (wilson_interval(h, 200) for h in hits)) / 4000
    assert 0.935 <= covered <= 0.965


@pytest.mark.parametrize("args, match", [((5, 0), "n must be"), ((11, 10), "right must be"),
                                         ((-1, 10), "right must be"), ((1, 10, 0.0), "z must be"),
                                         ((True, 10), "right must be")])
def test_wilson_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        wilson_interval(*args)


def _tiny():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, d_model=16)).eval()


@pytest.mark.parametrize("batch", [1, 3, 7, 64])
def test_heldout_bits_is_plain_cross_entropy_whatever_the_batch(batch):
    model, ids = _tiny(), torch.randint(0, 20, (8 * 9 + 4,), generator=torch.Generator().manual_seed(1))
    x, y = ids[:72].view(9, 8), ids[1:73].view(9, 8)
    with torch.no_grad():
        want = F.cross_entropy(model(x)[0].flatten(0, 1), y.flatten()).item() / math.log(2)
        low = model(x.clamp(max=11))[0][..., :12].flatten(0, 1)
        kept = F.cross_entropy(low, y.flatten().clamp(max=11)).item() / math.log(2)
    assert heldout_bits(model, ids, batch) == pytest.approx(want, abs=1e-5)
    assert heldout_bits(model, ids.clamp(max=11), batch, chars=12) == pytest.approx(kept, abs=1e-5)


def test_heldout_bits_bad_input():
    with pytest.raises(ValueError, match="at least block_size"):
        heldout_bits(_tiny(), torch.arange(5))
    with pytest.raises(ValueError, match="batch must be"):
        heldout_bits(_tiny(), torch.arange(20) % 20, batch=0)


def test_next_char_confidence_is_the_top_probability():
    model, ids = _tiny(), torch.randint(0, 20, (17,), generator=torch.Generator().manual_seed(2))
    conf, right = next_char_confidence(model, ids)
    probs = model(ids[:16].view(2, 8))[0].softmax(-1).flatten(0, 1)
    assert torch.allclose(conf, probs.max(-1).values, atol=1e-6)
    assert torch.equal(right, probs.argmax(-1) == ids[1:17])


def _bins_by_loops(conf, right, k):
    rows = [[] for _ in range(k)]
    for c, r in zip(conf, right, strict=True):
        rows[min(int(c * k), k - 1)].append((c, r))
    return ([sum(c for c, _ in b) / len(b) if b else 0.0 for b in rows],
            [sum(r for _, r in b) / len(b) if b else 0.0 for b in rows], [len(b) for b in rows])


def test_reliability_bins_against_loops_and_the_error():
    g = torch.Generator().manual_seed(5)
    conf = torch.cat([torch.rand(300, generator=g), torch.tensor([0.0, 0.5, 1.0])])
    right = torch.rand(303, generator=g) < conf
    mean_conf, share, count = reliability_bins(conf, right, 7)
    want = _bins_by_loops(conf.tolist(), right.tolist(), 7)
    assert torch.allclose(mean_conf, torch.tensor(want[0], dtype=torch.float64), atol=1e-6)
    assert torch.allclose(share, torch.tensor(want[1], dtype=torch.float64))
    assert count.tolist() == want[2]
    ece = sum(n * abs(s - c) for c, s, n in zip(*want, strict=True)) / 303
    assert calibration_error(mean_conf, share, count) == pytest.approx(ece, abs=1e-9)
    with pytest.raises(ValueError, match="must both be"):
        reliability_bins(conf, right[:3])


@pytest.mark.parametrize("n, c, k", [(5, 2, 2), (8, 0, 3), (8, 8, 1), (7, 5, 3), (10, 3, 10), (6, 1, 1)])
def test_pass_at_k_counts_every_subset(n, c, k):
    right = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(right[i] for i in s) for s in subsets) / len(subsets))


def test_pass_at_k_bad_input():
    with pytest.raises(ValueError, match="k must be"):
        pass_at_k(4, 1, 5)


def test_baselines_by_hand():
    train = [Example("count", "count: x", a) for a in ["5", "5", "6", "7"]]
    held = [Example("count", "count: y", a) for a in ["5", "6", "6", "6"]]
    assert baselines(train, held) == {"chance": pytest.approx(1 / 3), "majority": 0.25}
    with pytest.raises(ValueError, match="need training"):
        baselines([], held)


def test_seen_in_words_whole_and_lines_anywhere():
    text = "The gentle rain\nwho says this line, my lord\n"
    tasks = [word_task("upper", "gentle"), word_task("upper", "gent"),
             Example("speaker", "who says: this line, my", "X"), Example("speaker", "who says: not here", "Y")]
    assert seen_in(tasks, text) == [True, False, True, False]
