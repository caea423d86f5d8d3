"""Chapter 12's ladder up to GRPO (`rewards`): masked means and sums, REINFORCE with and without a baseline,
the SFT loss from log-probabilities, per-token entropy, the rungs `grpo` takes, and expert iteration. Each
is checked against a reference written here independently: loops, PyTorch's own losses and distributions,
and exact expectations by enumerating every outcome of a small policy."""

import copy

import pytest
import torch
import torch.nn.functional as F

from transformer_course.course_model import load_chat_model
from transformer_course.rewards import (
    baseline_advantages,
    expert_iteration,
    grpo,
    masked_mean,
    masked_sum,
    policy_gradient_loss,
    sft_loss,
    token_entropy,
)


@pytest.fixture(scope="module")
def shipped():
    return load_chat_model()


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(5, 7, generator=g)
    mask = torch.rand(5, 7, generator=g) > 0.4
    mask[3] = False  # an empty row
    return values, mask


def test_masked_mean_and_sum_against_loops():
    values, mask = _batch()
    for i in range(5):
        kept = [values[i, t].item() for t in range(7) if mask[i, t]]
        want = sum(kept) / len(kept) if kept else 0.0
        assert masked_mean(values, mask)[i].item() == pytest.approx(want, abs=1e-6)
    total = sum(values[i, t].item() for i in range(5) for t in range(7) if mask[i, t])
    assert masked_sum(values, mask, 35).item() == pytest.approx(total / 35, abs=1e-6)
    with pytest.raises(ValueError, match="constant"):
        masked_sum(values, mask, 0)


def test_baseline_advantages_by_hand():
    adv = baseline_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]))
    assert torch.allclose(adv, torch.tensor([[0.75, -0.25, -0.25, -0.25], [0.0, 0.0, 0.0, 0.0]]))


def _exact_expected_gradient(logits, rewards, baseline):
    """E over y ~ π of the gradient of the REINFORCE loss for one token, by enumerating all y."""
    grads = torch.zeros_like(logits)
    probs = torch.softmax(logits, -1).detach()
    for y in range(logits.numel()):
        leaf = logits.detach().clone().requires_grad_(True)
        logp = torch.log_softmax(leaf, -1)[y].view(1, 1)
        adv = torch.tensor([rewards[y] - baseline])
        policy_gradient_loss(logp, adv, torch.ones(1, 1, dtype=torch.bool)).backward()
        grads += probs[y] * leaf.grad
    return grads


@pytest.mark.parametrize("baseline", [0.0, 0.37, 5.0])
def test_reinforce_is_unbiased_for_any_baseline(baseline):
    """The expected gradient of −(r − b)·log π(y) is minus the gradient of the expected reward, whatever b."""
    logits = torch.tensor([0.3, -1.2, 2.0, 0.1])
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    leaf = logits.clone().requires_grad_(True)
    (torch.softmax(leaf, -1) * rewards).sum().backward()  # ∇ E[r]
    assert torch.allclose(_exact_expected_gradient(logits, rewards, baseline), -leaf.grad, atol=1e-6)


def test_length_normalisation_reply_mean_against_sum_over_a_constant():
    logp = torch.tensor([[-1.0, 0.0, 0.0], [-2.0, -4.0, -6.0]])
    mask = torch.tensor([[True, False, False], [True, True, True]])
    adv = torch.tensor([1.0, -1.0])
    # per-token −A·logp: reply 0: [1]; reply 1: [-2, -4, -6]
    assert policy_gradient_loss(logp, adv, mask).item() == pytest.approx((1.0 + (-12.0 / 3)) / 2)
    assert policy_gradient_loss(logp, adv, mask, "constant", 8).item() == pytest.approx((1.0 - 12.0) / 8)
    assert policy_gradient_loss(logp, adv, mask, "constant").item() == pytest.approx((1.0 - 12.0) / 6)
    with pytest.raises(ValueError, match="length"):
        policy_gradient_loss(logp, adv, mask, "token")


def test_sft_loss_is_pytorchs_cross_entropy_when_divided_by_the_count():
    g = torch.Generator().manual_seed(1)
    logits, targets = torch.randn(3, 6, 11, generator=g), torch.randint(0, 11, (3, 6), generator=g)
    targets[0, :2] = -1
    logp = torch.log_softmax(logits, -1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    mask = targets != -1
    want = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-1)
    assert torch.allclose(sft_loss(logp, mask, mask.sum().item()), want, atol=1e-6)


def test_token_entropy_against_torch_distributions_and_its_sampled_estimate():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 9, generator=g) * 2
    want = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.allclose(token_entropy(logits), want, atol=1e-6)
    assert token_entropy(torch.zeros(5)).item() == pytest.approx(torch.log(torch.tensor(5.0)).item())
    # grpo records the sampled tokens' mean −log π: an unbiased estimate of the entropy
    draws = torch.multinomial(torch.softmax(logits[0], -1), 200_000, replacement=True, generator=g)
    estimate = -torch.log_softmax(logits[0], -1)[draws].mean()
    assert estimate.item() == pytest.approx(want[0].item(), abs=0.02)


def test_grpo_takes_each_rung_and_refuses_bad_combinations(shipped):
    reference = shipped.model
    for kw in ({"loss": "pg", "advantage": "raw"}, {"loss": "pg", "advantage": "baseline", "length": "constant"},
               {"advantage": "baseline"}):
        policy = copy.deepcopy(reference)
        history = grpo(policy, reference, shipped.tokenizer, steps=1, tasks_per_step=2, group=4, **kw)
        assert 0 < history["entropy"][0] and history["kl"][0] >= 0
    for kw, word in (({"length": "constant"}, "needs loss='pg'"), ({"loss": "ppo"}, "loss"),
                     ({"advantage": "std"}, "advantage")):
        with pytest.raises(ValueError, match=word):
            grpo(copy.deepcopy(reference), reference, shipped.tokenizer, steps=1, tasks_per_step=2, group=2, **kw)


def test_grpo_reads_a_frozen_reference_without_a_graph_and_leaves_it_trainable(shipped):
    from transformer_course.preferences import reply_logprobs

    reference, seen = shipped.model, []

    def logprobs(model, x, y):
        out = reply_logprobs(model, x, y)
        seen.append((model is reference, out.requires_grad))
        return out

    policy = copy.deepcopy(reference)
    history = grpo(policy, reference, shipped.tokenizer, steps=1, tasks_per_step=2, group=4, inner_steps=1,
                   logprobs=logprobs)
    assert seen == [(True, False), (False, True)]  # the reference once, no graph; the policy once, with one
    assert history["clipped"] == [0.0]  # one inner step: the policy is the sampler, every ratio exactly 1
    assert all(p.requires_grad for p in reference.parameters())

    def failing(task, reply):
        raise RuntimeError("checker broke")

    with pytest.raises(RuntimeError, match="checker broke"):
        grpo(copy.deepcopy(reference), reference, shipped.tokenizer, steps=1, tasks_per_step=2, group=2,
             check=failing)
    assert all(p.requires_grad for p in reference.parameters())  # restored on the way out of an error too
    with pytest.raises(ValueError, match="copy.deepcopy"):
        grpo(reference, reference, shipped.tokenizer, steps=1)


def test_expert_iteration_trains_only_on_accepted_replies(shipped):
    start = shipped.model
    untouched = copy.deepcopy(start)
    history = expert_iteration(untouched, shipped.tokenizer, steps=1, tasks_per_step=2, group=2,
                               check=lambda task, reply: False)
    assert history["kept"] == [0.0] and history["reward"] == [0.0]
    assert all(torch.equal(a, b) for a, b in zip(untouched.parameters(), start.parameters(), strict=True))
    trained = copy.deepcopy(start)
    history = expert_iteration(trained, shipped.tokenizer, steps=1, tasks_per_step=2, group=2,
                               check=lambda task, reply: True)
    assert history["kept"] == [4.0] and history["reward"] == [1.0]
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), start.parameters(), strict=True))
