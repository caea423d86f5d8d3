"""Chapter 12's checks accept right answers and name the mistake in planted bugs
(tests/test_checks_all.py runs every check on a stub and on its reference)."""

import math

import pytest
import torch
import torch.nn.functional as F
from check_helpers import assert_rejected, run

from transformer_course.checks.preferences import (
    _pass_at_k,
    check_clipped_objective,
    check_dpo_loss,
    check_group_advantages,
    check_ladder_claims,
    check_pair_logprobs,
    check_pass_at_k,
    check_predict_first_dpo_loss,
    check_predict_group_baseline,
    check_predict_hasty_run,
    check_predict_hasty_toy,
    check_reply_logprobs,
)
from transformer_course.preferences import dpo_loss, pair_logprobs, reply_logprobs
from transformer_course.rewards import clipped_objective, group_advantages


@pytest.mark.parametrize("check_fn, reference", [
    (check_dpo_loss, dpo_loss), (check_predict_first_dpo_loss, lambda: 0.693), (check_reply_logprobs, reply_logprobs),
    (check_pair_logprobs, pair_logprobs),
    (check_group_advantages, group_advantages), (check_clipped_objective, clipped_objective),
    (check_pass_at_k, _pass_at_k),
])
def test_reference_passes(check_fn, reference):
    outcome = run(check_fn, reference)
    assert outcome.passed, outcome.message


def _dpo(margin, loss=lambda m: -F.logsigmoid(m).mean()):
    def fn(pc, pr, rc, rr, beta):
        m = margin(pc, pr, rc, rr, beta)
        return loss(m), m
    return fn


@pytest.mark.parametrize("fn, hint", [
    (_dpo(lambda pc, pr, rc, rr, b: b * (pc - pr)), "leaves out the reference"),
    (_dpo(lambda pc, pr, rc, rr, b: (pc - rc) - (pr - rr)), "β multiplies the margin"),
    (_dpo(lambda pc, pr, rc, rr, b: b * ((pr - rr) - (pc - rc))), "chosen minus rejected"),
    (_dpo(lambda pc, pr, rc, rr, b: b * ((pc - rc) - (pr - rr)), lambda m: torch.sigmoid(m).mean()), "σ(margin) alone"),
    (_dpo(lambda pc, pr, rc, rr, b: b * ((pc - rc) - (pr - rr)), lambda m: -torch.log(torch.sigmoid(m)).mean()),
     "F.logsigmoid"),
    (_dpo(lambda pc, pr, rc, rr, b: b * ((pc - rc) - (pr - rr)), lambda m: -F.logsigmoid(m).sum()), "*mean*"),
    (_dpo(lambda pc, pr, rc, rr, b: b * ((pc - rc) - (pr - rr)).detach(), lambda m: -F.logsigmoid(m).mean()),
     "keep the gradient"),
    (lambda pc, pr, rc, rr, b: -F.logsigmoid(b * ((pc - rc) - (pr - rr))).mean(), "return two things"),
])
def test_dpo_loss_mistakes_are_named(fn, hint):
    assert_rejected(check_dpo_loss, fn, hint)


@pytest.mark.parametrize("guess, hint", [(0.0, "not 0"), (0.5, "−log of it"), (1.0, "natural logarithms"),
                                         (0.7, "is not it"), ("0.693", "return a number")])
def test_predicting_the_first_dpo_loss_names_the_mistake(guess, hint):
    assert_rejected(check_predict_first_dpo_loss, lambda: guess, hint)


def test_the_chapters_buggy_reply_logprobs_is_rejected():
    def buggy(model, x, y):
        return torch.log_softmax(model(x)[0].float(), -1).gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    assert_rejected(check_reply_logprobs, buggy, "must be 0")
    assert_rejected(check_reply_logprobs, lambda m, x, y: -reply_logprobs(m, x, y), "not its negation")
    assert_rejected(check_reply_logprobs, lambda m, x, y: reply_logprobs(m, x, y).detach(), "keep the gradient")
    assert_rejected(check_reply_logprobs, lambda m, x, y: reply_logprobs(m, x, y).double(), "float32")


def _sums(model, x, y, *, grad=True, reduce=lambda lp, y: lp.sum(-1)):
    """Each row's reply log-probability under ``model``, [2B], with or without a graph."""
    with torch.set_grad_enabled(grad):
        return reduce(reply_logprobs(model, x, y), y)


def _pairs(policy_side, reference_side, *, order=(0, 1, 2, 3)):
    """A pair_logprobs built from two functions (model, x, y) -> [2B] and a reordering of its four."""
    def fn(policy, reference, x, y):
        ref_c, ref_r = reference_side(reference, x, y).chunk(2)
        pol_c, pol_r = policy_side(policy, x, y).chunk(2)
        four = (pol_c, pol_r, ref_c, ref_r)
        return tuple(four[i] for i in order)
    return fn


_FROZEN = lambda m, x, y: _sums(m, x, y, grad=False)  # noqa: E731
_TRAINED = _sums


@pytest.mark.parametrize("fn, hint", [
    (_pairs(_TRAINED, _FROZEN, order=(1, 0, 3, 2)), "chosen and rejected are swapped"),
    (_pairs(_TRAINED, _FROZEN, order=(0, 1, 3, 2)), "ref_chosen holds the rejected replies' numbers"),
    (_pairs(lambda m, x, y: _sums(m, x, y, reduce=lambda lp, y: lp.mean(-1)), _FROZEN), "a mean over the tokens"),
    (_pairs(lambda m, x, y: _sums(m, x, y, reduce=lambda lp, y: lp.sum(-1) / (y != -1).sum(-1)), _FROZEN),
     "a mean over the reply's tokens"),
    (_pairs(_TRAINED, _TRAINED), "the reference is frozen: no gradient may reach it"),
    (_pairs(_TRAINED, lambda m, x, y: _sums(m, x, y).detach()), "built a graph that was then thrown away"),
    (_pairs(_FROZEN, _FROZEN), "carry no gradient"),
    (_pairs(lambda m, x, y: _sums(m, x, y).detach(), _FROZEN), "carry no gradient"),
    (_pairs(_TRAINED, _FROZEN, order=(2, 3, 0, 1)), "policy_chosen holds the reference's numbers"),
    (lambda p, r, x, y: _pairs(_TRAINED, _FROZEN)(r, r, x, y), "policy_chosen holds the reference's numbers"),
    (lambda p, r, x, y: _pairs(_TRAINED, _FROZEN)(p, p, x, y), "ref_chosen holds the policy's numbers"),
    (lambda p, r, x, y: (_sums(p, x, y), _sums(p, x, y), _sums(r, x, y, grad=False), _sums(r, x, y, grad=False)),
     "split the 2B replies' numbers in two halves"),
    (lambda p, r, x, y: (*reply_logprobs(p, x, y).chunk(2), *_FROZEN(r, x, y).chunk(2)), "sum its tokens'"),
    (lambda p, r, x, y: (_TRAINED(p, x, y)[0::2], _TRAINED(p, x, y)[1::2], *_FROZEN(r, x, y).chunk(2)),
     "policy_chosen alternates the rows"),
    (lambda p, r, x, y: pair_logprobs(p, r, x, y)[:3], "return four things"),
])
def test_pair_logprobs_mistakes_are_named(fn, hint):
    assert_rejected(check_pair_logprobs, fn, hint)


def test_a_reference_gradient_hidden_in_the_policys_numbers_is_rejected():
    def leaky(policy, reference, x, y):
        pol_c, pol_r, ref_c, ref_r = pair_logprobs(policy, reference, x, y)
        live = _sums(reference, x, y).sum()
        return pol_c + 0 * live, pol_r, ref_c, ref_r
    assert_rejected(check_pair_logprobs, leaky, "a gradient reached the reference's weights")

@pytest.mark.parametrize("fn, hint", [
    (lambda r, eps=1e-4: (r - r.mean()) / (r.std(correction=0) + eps), "each group (row) on its own"),
    (lambda r, eps=1e-4: (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps), "population"),
    (lambda r, eps=1e-4: r - r.mean(1, keepdim=True), "divide by the group's standard deviation"),
    (lambda r, eps=1e-4: (r - r.mean(1, keepdim=True)) / r.std(1, keepdim=True, correction=0), "NaN"),
    (lambda r, eps=1e-4: (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True, correction=0) + 1e-4),
     "eps goes beside"),
])
def test_group_advantage_mistakes_are_named(fn, hint):
    assert_rejected(check_group_advantages, fn, hint)


def _objective(*, clip_on=True, use_min=True, kl_sign=1.0, per_reply=True, masked=True, sign=1.0, detach=False):
    def fn(logp, old, ref, adv, mask, clip=0.2, kl_coef=0.04):
        lp = logp.detach() if detach else logp
        ratio = torch.exp(lp - old)
        a = adv[:, None]
        clipped = ratio.clamp(1 - clip, 1 + clip) if clip_on else ratio
        surrogate = torch.min(ratio * a, clipped * a) if use_min else clipped * a
        d = ref - lp
        terms = surrogate - kl_sign * kl_coef * (torch.exp(d) - d - 1)
        m = mask.float() if masked else torch.ones_like(lp)
        if per_reply:
            value = ((terms * m).sum(1) / m.sum(1)).mean()
        else:
            value = (terms * m).sum() / m.sum()
        return -sign * value
    return fn


@pytest.mark.parametrize("fn, hint", [
    (_objective(clip_on=False), "clip the ratio"),
    (_objective(use_min=False), "take the minimum"),
    (_objective(kl_sign=-1.0), "the KL term is a penalty"),
    (_objective(per_reply=False), "average each reply's own tokens"),
    (_objective(masked=False), "only reply tokens count"),
    (_objective(sign=-1.0), "minus the objective"),
])
def test_clipped_objective_mistakes_are_named(fn, hint):
    assert_rejected(check_clipped_objective, fn, hint)


def test_a_detached_objective_is_rejected():
    outcome = run(check_clipped_objective, _objective(detach=True))
    assert not outcome.passed


@pytest.mark.parametrize("fn, hint", [
    (lambda n, c, k: c / n, "that is pass@1"),
    (lambda n, c, k: 1 - (1 - c / n) ** k, "without replacement"),
    (lambda n, c, k: math.comb(n - c, k) / math.comb(n, k), "none of the k is right"),
])
def test_pass_at_k_mistakes_are_named(fn, hint):
    assert_rejected(check_pass_at_k, fn, hint)


def test_predicting_the_group_baseline_accepts_the_answer_and_names_the_mistakes():
    assert run(check_predict_group_baseline, lambda: (0.875, "smaller")).passed
    for guess, hint in [((1.0, "smaller"), "holds reply i's own reward"), ((0.125, "smaller"), "what is left"),
                        ((9 / 8, "smaller"), "removed (not added)"), ((6 / 7, "smaller"), "G − 1 others"),
                        ((0.5, "smaller"), "is not it"), ((0.875, "larger"), "common push"),
                        ((0.875, "less"), '"larger", "smaller" or "same"'), (0.875, "return a pair"),
                        (("7/8", "smaller"), "a number as the first item")]:
        assert_rejected(check_predict_group_baseline, lambda guess=guess: guess, hint)


def test_predicting_the_hasty_run_names_the_mistakes():
    assert run(check_predict_hasty_run, lambda: ("rise", "widen", "lower")).passed
    for guess, hint in [(("stay", "widen", "lower"), "pays for more replies"),
                        (("rise", "stay", "lower"), "which kind gains"),
                        (("rise", "narrow", "lower"), "which kind gains"),
                        (("rise", "widen", "same"), "likeliest reply"),
                        (("rise", "widen", "higher"), "likeliest reply"),
                        (("up", "widen", "lower"), '"rise", "stay" or "fall"'),
                        (("rise", "wider", "lower"), '"widen", "stay" or "narrow"'),
                        (("rise", "widen", "worse"), '"higher", "same" or "lower"'), ("rise", "three words")]:
        assert_rejected(check_predict_hasty_run, lambda guess=guess: guess, hint)


def test_predicting_the_toy_hole_names_the_mistakes():
    assert run(check_predict_hasty_toy, lambda: ("piece", "smaller")).passed
    for guess, hint in [(("right", "smaller"), "cannot prefer the right one"), (("piece", "same"), "gap between them"),
                        (("piece", "larger"), "gap between them"), (("hole", "smaller"), '"right" or "piece"'),
                        (("piece", "less"), '"larger", "smaller" or "same"'), ("piece", "a pair of words")]:
        assert_rejected(check_predict_hasty_toy, lambda guess=guess: guess, hint)


def test_reading_the_ladder_names_the_claim_and_its_ranges():
    right = {"A": False, "B": True, "C": False, "D": True, "E": False}
    assert run(check_ladder_claims, lambda: dict(right)).passed
    assert_rejected(check_ladder_claims, lambda: {**right, "A": True}, "claim A: look at the ranges")
    assert_rejected(check_ladder_claims, lambda: {**right, "E": True}, "68.2-73.0%")
    assert_rejected(check_ladder_claims, lambda: {**right, "B": "yes"}, "True or False")
    assert_rejected(check_ladder_claims, lambda: {"A": False}, "keys")


def test_the_ladder_claims_are_what_the_stored_benchmark_says():
    """The rows of the 12.11 check agree with benchmarks/results/rl_ladder.json (ranges over the seeds)."""
    import json
    from pathlib import Path

    arms = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/results/rl_ladder.json").read_text())["arms"]

    def span(arm, key):
        values = [r[key] for r in arms[arm]]
        return min(values), max(values)

    def apart(x, y):  # x entirely above y
        return x[0] > y[1]

    pairs = {  # claim -> (the arm claimed above, the other, the measure)
        "A": ("GRPO clipped, KL 0.04", "REINFORCE, group-normalised", "greedy"),
        "B": ("GRPO clipped, hasty checker, longer", "GRPO clipped, KL 0.04, longer", "hacked"),
        "C": ("GRPO clipped, KL 0.04", "expert iteration", "pass_at_1"),
        "D": ("REINFORCE, raw reward", "REINFORCE, group-mean baseline", "pass_at_1"),
        "E": ("REINFORCE, group-normalised", "REINFORCE, group-mean baseline", "greedy"),
    }
    from transformer_course.checks.preferences import _LADDER_CLAIMS

    for claim, (above, below, key) in pairs.items():
        truth, hint = _LADDER_CLAIMS[claim]
        assert apart(span(above, key), span(below, key)) == truth, claim
        for arm in (above, below):  # the hint quotes both ranges as stored
            low, high = span(arm, key)
            assert f"{100 * low:.1f}-{100 * high:.1f}%" in hint, (claim, arm)
