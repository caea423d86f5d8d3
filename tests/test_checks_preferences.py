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
    check_pass_at_k,
    check_predict_first_dpo_loss,
    check_reply_logprobs,
)
from transformer_course.preferences import dpo_loss, reply_logprobs
from transformer_course.rewards import clipped_objective, group_advantages


@pytest.mark.parametrize("check_fn, reference", [
    (check_dpo_loss, dpo_loss), (check_predict_first_dpo_loss, lambda: 0.693), (check_reply_logprobs, reply_logprobs),
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
