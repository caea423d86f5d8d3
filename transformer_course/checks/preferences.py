"""Checks for chapter 12's exercises (preferences and rewards: DPO, GRPO, pass@k). Hand-written.

Each check computes what it expects its own way (by hand-worked numbers, or by loops over plain Python floats); the
planted mistakes are tables of (hint, what the mistake gives). 12.8's reference (``_pass_at_k``) lives here."""

import itertools
import math

import torch

from .. import preferences as _preferences
from .. import rewards as _rewards
from ._core import (
    check,
    expect,
    expect_answer,
    expect_close,
    expect_items,
    expect_number,
    expect_tensor,
    fresh_rng,
    name_mistake,
    planted,
)

_logsig = lambda z: -math.log1p(math.exp(-z)) if z >= 0 else z - math.log1p(math.exp(z))  # log σ(z), computed stably


def _named(got, mistakes, atol: float = 1e-5):
    """name_mistake for numbers (or nested lists of them): compared as tensors, within atol."""
    as_tensor = lambda v: torch.as_tensor(v, dtype=torch.float64)  # noqa: E731
    mistakes = [(hint, as_tensor(wrong() if callable(wrong) else wrong)) for hint, wrong in mistakes]
    return name_mistake(as_tensor(got), mistakes, atol=atol)


# ---------------------------------------------------------------- 12.1 build: dpo_loss
@check("12.1", "dpo_loss", reference=_preferences.dpo_loss)
def check_dpo_loss(fn):
    """``fn(policy_chosen [B], policy_rejected [B], ref_chosen [B], ref_rejected [B], beta)``
    ``-> (loss, margins [B])``."""
    _expect_dpo_hand_worked(fn)
    _expect_dpo_batch(fn)
    _expect_dpo_far_margin(fn)
    _expect_dpo_gradient(fn)


def _expect_dpo_hand_worked(fn):
    """One pair worked by hand (β = 0.5): ``fn`` returns (loss, margins), the margin 0.75 and the loss
    log(1 + e^-0.75), or the hint naming the slip."""
    out = fn(*[torch.tensor([v]) for v in (-2.0, -3.0, -2.5, -2.0)], 0.5)
    loss, margins = expect_items(out, 2, "return two things: (the mean loss, the margins [B])")
    margin = float(expect_tensor(margins, what="the margins").reshape(-1)[0])
    expect_answer(margin, 0.75, [
        ("the margin leaves out the reference: subtract ref_chosen and ref_rejected", 0.5),
        ("β multiplies the margin: beta * ((pc - rc) - (pr - rr))", 1.5),
        ("the margin is chosen minus rejected, not the other way round", -0.75),
    ], f"the hand-worked margin is 0.75 (β = 0.5 times (0.5 − (−1.0))), got {margin:.4f}", atol=1e-5)
    expect_answer(float(loss), math.log1p(math.exp(-0.75)), [
        ("the loss is −log σ(margin); σ(margin) alone is the probability", 1 / (1 + math.exp(-0.75))),
        ("the loss is minus log σ: it must be positive", -math.log1p(math.exp(-0.75))),
        ("the loss is −log σ(margin), not −margin", -0.75),
    ], f"the hand-worked loss is log(1 + e^-0.75) = 0.3869, got {float(loss):.4f}", atol=1e-4)


def _expect_dpo_batch(fn):
    """Six random pairs (β = 0.2): margins [6] and a scalar loss, their mean (not their sum), against plain-float
    loops."""
    with fresh_rng(12):
        pc, pr, rc, rr = (torch.randn(6) * 3 - 8 for _ in range(4))
    beta = 0.2
    want_margins = [beta * ((a - c) - (b - d))
                    for a, b, c, d in zip(pc.tolist(), pr.tolist(), rc.tolist(), rr.tolist(), strict=True)]
    loss, margins = fn(pc, pr, rc, rr, beta)
    expect_close(expect_tensor(margins, shape=(6,), what="the margins [B]"), torch.tensor(want_margins),
                 "one margin per pair, beta · ((pc − rc) − (pr − rr))", atol=1e-5)
    expect(torch.as_tensor(loss).dim() == 0, "the loss is one number: the mean over the pairs")
    want = -sum(_logsig(m) for m in want_margins) / 6
    expect(math.isclose(float(loss), want, abs_tol=1e-5),
           "the loss is the *mean* of −log σ(margin) over the pairs, not the sum"
           if math.isclose(float(loss), 6 * want, abs_tol=1e-4)
           else f"expected a mean loss of {want:.5f}, got {float(loss):.5f}")


def _expect_dpo_far_margin(fn):
    """A margin of −200: the loss is 200, finite (logsigmoid, not log of sigmoid)."""
    far = fn(torch.tensor([0.0]), torch.tensor([0.0]), torch.tensor([0.0]), torch.tensor([-400.0]), 0.5)[0]
    expect(math.isfinite(float(far)) and math.isclose(float(far), 200.0, rel_tol=1e-4),
           "a margin of −200 must give a loss of 200, not inf: use F.logsigmoid(margins), which "
           "stays finite where torch.log(torch.sigmoid(...)) rounds to log 0")


def _expect_dpo_gradient(fn):
    """The gradient: the loss falls as the chosen reply gets likelier, the rejected one less."""
    grads = [torch.tensor([-2.0], requires_grad=True), torch.tensor([-3.0], requires_grad=True)]
    loss = fn(grads[0], grads[1], torch.tensor([-2.5]), torch.tensor([-2.5]), 0.5)[0]
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        loss.backward()
    expect(grads[0].grad is not None and float(grads[0].grad) < 0 < float(grads[1].grad),
           "the loss must fall as the chosen reply gets likelier and the rejected one less likely "
           "(keep the gradient: no .item() or .detach() inside)")


# ---------------------------------------------------------------- 12.2 predict: the first DPO loss
@check("12.2", "my_prediction")
def check_predict_first_dpo_loss(fn):
    """``fn() -> float``: the DPO loss when the policy equals the reference."""
    got = expect_number(fn())
    expect_answer(got, math.log(2), [
        ("every margin is 0, but the loss is −log σ(0), not 0", 0.0),
        ("σ(0) = 0.5 is the probability the model gives the preference; the loss is −log of it", 0.5),
        ("−log σ(0) = log 2 in natural logarithms (not bits)", 1.0),
    ], f"{got} is not it: with the policy equal to the reference, what is every margin?", atol=1e-3)


# ---------------------------------------------------------------- 12.3 debug: reply_logprobs
class _Table(torch.nn.Module):
    """A stand-in model whose logits depend on the token only: logits [B, T, V] = table[x].
    ``graphs`` records, for each forward pass, whether autograd built a graph for it."""

    def __init__(self, vocab: int = 7, seed: int = 123):
        super().__init__()
        with fresh_rng(seed):
            self.table = torch.nn.Parameter(torch.randn(vocab, vocab).double())
        self.graphs: list[bool] = []

    def forward(self, x):
        logits = self.table[x]
        self.graphs.append(logits.requires_grad)
        return logits, None


@check("12.3", "reply_logprobs", reference=_preferences.reply_logprobs)
def check_reply_logprobs(fn):
    """``fn(model, x [B, T], y [B, T]) -> [B, T]`` log-probabilities of the targets, 0 where y " "is -1."""
    model = _Table()
    x = torch.tensor([[1, 2, 3, 4, 5], [6, 5, 4, 0, 0]])
    y = torch.tensor([[-1, -1, 4, 5, -1], [-1, 4, 0, -1, -1]])
    got = expect_tensor(fn(model, x, y), shape=(2, 5), what="the log-probabilities [B, T]")
    expect(got.dtype == torch.float32, f"return float32 (call .float() on the logits), got {got.dtype}")
    logp = torch.log_softmax(model.table.detach().float(), dim=-1)  # (V, V)
    want = torch.zeros(2, 5)
    for b, t in itertools.product(range(2), range(5)):
        if y[b, t] != -1:
            want[b, t] = logp[x[b, t], y[b, t]]
    expect(not torch.allclose(got.detach(), logp[x, y.clamp(min=0)], atol=1e-5),
           "positions whose target is -1 (the prompt, the padding) must be 0: multiply by (y != IGNORE), "
           "or a reply's sum picks up log-probabilities of token 0 there")
    expect(not torch.allclose(got.detach(), -want, atol=1e-5),
           "log-probabilities are negative: take log_softmax, not its negation")
    expect_close(got.detach(), want, "expected log_softmax(logits) at each target id, and 0 where y is -1", atol=1e-5)
    expect(got.requires_grad, "keep the gradient: DPO trains through these numbers (no .detach())")


# ---------------------------------------------------------------- 12.4 build: pair_logprobs
def _pair_batch(chosen, rejected):
    """x, y [2B, T] as conversation_batch lays out a DPO batch, from (prompt, reply) token lists: the B chosen
    conversations, then the B rejected ones; padded with token 0, targets -1 outside the replies (position t predicts
    x[t + 1])."""
    rows = [p + r for p, r in chosen + rejected]
    x = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    y = torch.full_like(x, -1)
    for i, ((prompt, _), row) in enumerate(zip(chosen + rejected, rows, strict=True)):
        x[i, : len(row)] = torch.tensor(row)
        for t in range(len(prompt) - 1, len(row) - 1):
            y[i, t] = row[t + 1]
    return x, y


def _summed(model, x, y, mean=None):
    """Each row's summed log-probability of its targets under ``model`` (plain Python floats); ``mean="T"`` or
    ``"reply"`` divides by the row's length or its number of targets instead."""
    logp = torch.log_softmax(model.table.detach(), dim=-1).tolist()
    out = []
    for xs, ys in zip(x.tolist(), y.tolist(), strict=True):
        terms = [logp[a][b] for a, b in zip(xs, ys, strict=True) if b != -1]
        out.append(sum(terms) / {None: 1, "T": len(ys), "reply": len(terms)}[mean])
    return out


_PAIR_NAMES = ("policy_chosen", "policy_rejected", "ref_chosen", "ref_rejected")
_ROWS_FIRST = "x holds the B chosen conversations first, then the same B prompts with the rejected replies"
_SUM = "a reply's log-probability is the *sum* of"


def _pair_mistakes(name, policy, reference, x, y):
    """(hint, wrong [B]) for the output ``name``: what each likely mistake gives there."""
    b = x.shape[0] // 2
    is_policy, is_chosen = name.startswith("policy"), name.endswith("chosen")
    mine, other = (policy, reference) if is_policy else (reference, policy)
    rows = lambda v, chosen: v[:b] if chosen else v[b:]  # noqa: E731
    interleaved = lambda v: v[0::2] if is_chosen else v[1::2]  # noqa: E731
    return [
        (f"{name} holds the {'rejected' if is_chosen else 'chosen'} replies' numbers: chosen and rejected are swapped "
         f"({_ROWS_FIRST})", rows(_summed(mine, x, y), not is_chosen)),
        (f"{name} holds the {'reference' if is_policy else 'policy'}'s numbers: the first two outputs come from "
         "`policy`, the last two from `reference`", rows(_summed(other, x, y), is_chosen)),
        (f"{name} alternates the rows: {_ROWS_FIRST}, so the first half of the rows is chosen and the second half "
         "rejected", interleaved(_summed(mine, x, y))),
        (f"{name} is a mean over the tokens: {_SUM} its tokens' log-probabilities (log of the product of their "
         "probabilities)", rows(_summed(mine, x, y, mean="T"), is_chosen)),
        (f"{name} is a mean over the reply's tokens: {_SUM} its tokens' log-probabilities (log of the product of their "
         "probabilities)", rows(_summed(mine, x, y, mean="reply"), is_chosen)),
    ]


def _pair_case(fn, policy, reference, chosen, rejected):
    """Run ``fn`` on one batch and check the four numbers' shapes and values; return them."""
    x, y = _pair_batch(chosen, rejected)
    b, t = len(chosen), x.shape[1]
    out = expect_items(fn(policy, reference, x.clone(), y.clone()), 4, "return four things: (policy_chosen, "
                       "policy_rejected, ref_chosen, ref_rejected)", tuple | list)
    for name, got in zip(_PAIR_NAMES, out, strict=True):
        shape = tuple(expect_tensor(got, what=name).shape)
        expect(shape != (2 * b,), f"{name} has shape {shape}: one number per pair, [B] = ({b},). {_ROWS_FIRST}: "
                                  "split the 2B replies' numbers in two halves")
        expect(shape not in ((b, t), (2 * b, t)), f"{name} has shape {shape}: one number per reply, so sum its "
               f"tokens' log-probabilities over T (each output is [B] = ({b},))")
        expect(shape == (b,), f"{name} must be [B] = ({b},), got shape {shape}")
    for name, got in zip(_PAIR_NAMES, out, strict=True):
        model = policy if name.startswith("policy") else reference
        whole = _summed(model, x, y)
        want = whole[:b] if name.endswith("chosen") else whole[b:]
        as64 = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
        expect_close(got.detach(), as64(want), f"{name}: expected each reply's summed log-probability of its target "
                     f"tokens (0 where y is -1) under the {'policy' if model is policy else 'reference'}", atol=1e-4,
                     mistakes=[(hint, as64(wrong)) for hint, wrong in _pair_mistakes(name, policy, reference, x, y)])
    return out


@check("12.4", "pair_logprobs", reference=_preferences.pair_logprobs)
def check_pair_logprobs(fn):
    """``fn(policy, reference, x [2B, T], y [2B, T])``
    ``-> (policy_chosen, policy_rejected, ref_chosen, ref_rejected)``, each [B]."""
    policy, reference = _Table(seed=41), _Table(seed=42)
    # two pairs: prompts of different lengths, replies of different lengths (padding after them)
    chosen = [([1, 2, 3], [4, 5, 6]), ([6, 1], [2, 3])]
    rejected = [([1, 2, 3], [5, 4]), ([6, 1], [3, 2, 0, 1])]
    out = _pair_case(fn, policy, reference, chosen, rejected)
    expect(out[0].requires_grad and out[1].requires_grad and policy.graphs and policy.graphs[-1],
           "policy_chosen and policy_rejected carry no gradient: the DPO loss trains the policy through them, so "
           "keep the policy's forward pass in the graph (no torch.no_grad() or .detach() for the policy)")
    frozen = ("the reference is frozen: no gradient may reach it, so compute its log-probabilities "
              "under torch.no_grad()")
    expect(not (out[2].requires_grad or out[3].requires_grad), f"{frozen} (ref_chosen and ref_rejected carry a "
                                                               "gradient)")
    sum(v.sum() for v in out if v.requires_grad).backward()
    expect(reference.table.grad is None, f"{frozen} (a gradient reached the reference's weights)")
    expect(policy.table.grad is not None, "no gradient reached the policy's weights")
    expect(not any(reference.graphs), "the reference's forward pass built a graph that was then thrown away "
           "(.detach()): run it under torch.no_grad(), so autograd records nothing for it and keeps no activations")
    # one pair (B = 1), its rejected reply a single token
    _pair_case(fn, _Table(seed=43), reference, [([2, 3, 4, 1], [5, 5, 6])], [([2, 3, 4, 1], [6])])
    with fresh_rng(7):
        a, b = _Table(seed=5), _Table(seed=6)
        tokens = torch.randint(0, 7, (3, 9)).tolist()
    chosen = [(row[:4], row[4:]) for row in tokens]
    rejected = [(row[:4], row[4 : 6 + i]) for i, row in enumerate(tokens)]
    _pair_case(fn, a, b, chosen, rejected)


# ---------------------------------------------------------------- 12.5 build: group_advantages
def _advantages(rows, eps=1e-4, correction=0, per_row=True, divide=True):
    """group_advantages in plain Python, with one mistake switched on at will."""
    flat = [r for row in rows for r in row]
    out = []
    for row in rows:
        pool = row if per_row else flat
        mean = sum(pool) / len(pool)
        std = math.sqrt(sum((r - mean) ** 2 for r in pool) / (len(pool) - correction))
        out.append([(r - mean) / (std + eps) if divide else r - mean for r in row])
    return out


_ADVANTAGE_MISTAKES = [  # (hint, the switch of _advantages that plants it)
    ("normalise each group (row) on its own: mean and std over dim=1, keepdim=True", dict(per_row=False)),
    ("use the population standard deviation, over G (std(..., correction=0))", dict(correction=1)),
    ("divide by the group's standard deviation (plus eps) after subtracting the mean", dict(divide=False)),
]


@check("12.5", "group_advantages", reference=_rewards.group_advantages)
def check_group_advantages(fn):
    """``fn(rewards [P, G], eps=1e-4) -> advantages [P, G]``."""
    rows = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]]
    got = expect_tensor(fn(torch.tensor(rows)), shape=(3, 4), what="the advantages [P, G]")
    expect(bool(torch.isfinite(got).all()), "a group of equal rewards has standard deviation 0: add eps to it "
                                            "before dividing, so the advantages are 0, not NaN")
    mistakes = planted(_ADVANTAGE_MISTAKES, _advantages, rows)
    expect_close(got, torch.tensor(_advantages(rows)), _named(got.tolist(), mistakes, atol=1e-4)
                 or "by hand, rewards [1, 0, 0, 0] give [1.732, −0.577, −0.577, −0.577]", atol=1e-4)
    with fresh_rng(4):
        rewards = torch.randint(0, 2, (5, 8)).float()
    expect_close(fn(rewards, eps=0.5), torch.tensor(_advantages(rewards.tolist(), eps=0.5)),
                 "eps goes beside the standard deviation: (r − mean) / (std + eps)", atol=1e-5)


# ---------------------------------------------------------------- 12.6 build: clipped_objective
def _objective(logp, old, ref, adv, mask, clip, kl, *, use_clip=True, use_min=True, kl_sign=1, per_reply=True,
               masked=True):
    """clipped_objective with Python loops, with one mistake switched on at will."""
    total, replies, tokens = 0.0, 0, 0.0
    for i in range(len(logp)):
        terms = []
        for t in range(len(logp[i])):
            if masked and not mask[i][t]:
                continue
            ratio = math.exp(logp[i][t] - old[i][t])
            clipped = min(max(ratio, 1 - clip), 1 + clip) if use_clip else ratio
            surrogate = min(ratio * adv[i], clipped * adv[i]) if use_min else clipped * adv[i]
            d = ref[i][t] - logp[i][t]
            terms.append(surrogate - kl_sign * kl * (math.exp(d) - d - 1))
        total += sum(terms) / max(len(terms), 1) if per_reply else sum(terms)
        tokens += len(terms)
        replies += 1
    return -(total / replies if per_reply else total / tokens)


_OBJECTIVE_MISTAKES = [  # (hint, the switch of _objective that plants it)
    ("clip the ratio to [1 − clip, 1 + clip] in the second term: ratio.clamp(1 - clip, 1 + clip)",
     dict(use_clip=False)),
    ("take the minimum of the clipped and the unclipped term (torch.min): the clip must only ever lower the "
     "objective", dict(use_min=False)),
    ("the KL term is a penalty: subtract kl_coef · k3 from the surrogate (the loss is minus that)", dict(kl_sign=-1)),
    ("average each reply's own tokens (sum over T of the masked terms / the reply's mask.sum), then the replies",
     dict(per_reply=False)),
    ("only reply tokens count: multiply by the mask before summing, and divide by mask.sum(dim=1)", dict(masked=False)),
]


@check("12.6", "clipped_objective", reference=_rewards.clipped_objective)
def check_clipped_objective(fn):
    """``fn(logp [N, T], logp_old [N, T], logp_ref [N, T], advantages [N], mask [N, T], clip, " "kl_coef) -> loss``."""
    with fresh_rng(5):
        old = -torch.rand(4, 6) * 3
        logp = old + torch.randn(4, 6) * 0.4  # ratios well outside [0.8, 1.2] in places
        ref = old + torch.randn(4, 6) * 0.3
        adv = torch.tensor([1.5, -0.5, -1.0, 0.0])
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 0, 0], [0, 1, 1, 0, 0, 0]]).bool()
    args = [v.tolist() for v in (logp, old, ref, adv)] + [mask.tolist(), 0.2, 0.1]
    leaf = logp.clone().requires_grad_(True)
    got = expect_tensor(fn(leaf, old, ref, adv, mask, 0.2, 0.1), what="the loss")
    expect(got.dim() == 0, f"the loss is one number, got shape {tuple(got.shape)}")
    value, want = float(got.detach()), _objective(*args)
    mistakes = planted(_OBJECTIVE_MISTAKES, _objective, *args)
    mistakes.append(("the loss is minus the objective: gradient descent must raise it", -want))
    expect(math.isclose(value, want, abs_tol=1e-5),
           _named(value, mistakes) or f"expected a loss of {want:.5f}, got {value:.5f}")
    got.backward()
    expect(leaf.grad is not None and bool(leaf.grad[~mask].abs().max() == 0),
           "the gradient must reach logp on reply tokens only (keep the graph; no .detach() of logp)")
    same = fn(old.clone(), old, old, adv, mask, 0.2, 0.1)
    expect(math.isclose(float(same), -float(adv.mean()), abs_tol=1e-5),
           "with π = π_old = π_ref every ratio is 1 and k3 is 0, so the loss is minus the mean advantage")


# ---------------------------------------------------------------- 12.7 predict: GRPO against a checker with a hole
@check("12.7", "my_prediction")
def check_predict_hasty_run(fn):
    """``fn() -> (accepted, gap, greedy)``: after twenty GRPO steps paid by ``hasty_check`` (no KL term), how
    the rollout's share the hasty checker accepts moved ("rise" | "stay" | "fall"), how the gap between it
    and the share that is right moved ("widen" | "stay" | "narrow"), and the held-out greedy accuracy against
    the SFT model's ("higher" | "same" | "lower")."""
    got = fn()
    accepted, gap, greedy = expect_items(got, 3, f"return three words, got {got!r}")
    expect(accepted in ("rise", "stay", "fall"), f'the first item is "rise", "stay" or "fall", got {accepted!r}')
    expect(gap in ("widen", "stay", "narrow"), f'the second item is "widen", "stay" or "narrow", got {gap!r}')
    expect(greedy in ("higher", "same", "lower"), f'the third item is "higher", "same" or "lower", got {greedy!r}')
    expect(accepted == "rise", "GRPO makes more likely whatever its checker pays for, and the hasty checker pays "
           "for more replies than the right ones")
    expect(gap == "widen", "a wrong piece of the answer is paid as much as the right answer and is easier to "
           "produce: as paid replies become likelier, which kind gains?")
    expect(greedy == "lower", "greedy decoding answers with the likeliest reply; once wrong pieces are likelier, "
           "what does the strict checker say of them?")


# ---------------------------------------------------------------- 12.8 extend: pass@k
def _pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k (Chen et al. 2021): 1 − C(n − c, k) / C(n, k)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@check("12.8", "pass_at_k", reference=_pass_at_k)
def check_pass_at_k(fn):
    """``fn(n, c, k) -> float``: the chance that k of the n samples, drawn without replacement, hold a right one."""
    got = expect_number(fn(5, 2, 2))
    expect_answer(got, 0.7, [
        ("that is pass@1 (c / n); pass@k asks whether any of k samples is right", 0.4),
        ("draw without replacement: 1 − (1 − c/n)^k counts one sample twice", 1 - (1 - 2 / 5) ** 2),
        ("that is the chance that none of the k is right: pass@k is 1 minus it", 0.3),
    ], f"by hand, n = 5, c = 2, k = 2 gives 1 − C(3, 2)/C(5, 2) = 0.7, got {got}", atol=1e-9)
    for n, c, k in [(5, 2, 3), (6, 1, 1), (8, 0, 3), (8, 8, 2), (7, 5, 3), (10, 3, 10)]:
        right = [True] * c + [False] * (n - c)
        draws = list(itertools.combinations(range(n), k))
        want = sum(any(right[i] for i in d) for d in draws) / len(draws)  # every k-subset, counted
        got = fn(n, c, k)
        expect(math.isclose(got, want, abs_tol=1e-9), f"n = {n}, c = {c}, k = {k}: {want:.6f} of the k-subsets hold "
               f"a right sample, got {got}" + (" (when n − c < k every draw holds one)" if n - c < k else ""))


# ---------------------------------------------------------------- 12.9 predict: the group-mean baseline
@check("12.9", "my_prediction")
def check_predict_group_baseline(fn):
    """``fn() -> (fraction, "larger" | "smaller" | "same")``: the average REINFORCE gradient with the
    group-mean baseline as a fraction of the average without it (G = 8), and the spread of its estimates."""
    got = fn()
    share, spread = expect_items(got, 2, f"return a pair (a number, a word), got {got!r}")
    expect_number(share, "a number as the first item")
    expect_answer(share, 7 / 8, [
        ("a baseline that does not depend on the reply changes nothing on average, but the group's mean holds "
         "reply i's own reward: what does that one term of the mean take away?", 1.0),
        ("1/G is what reply i's own reward takes away; what is left of the gradient?", 1 / 8),
        ("the mean includes reply i with weight 1/G, so 1/G is removed (not added)", 9 / 8),
        ("that would be a mean over the G − 1 others; the group's mean has G terms", 6 / 7),
    ], f"{share} is not it: split the group's mean into reply i's own term and the G − 1 independent ones",
        atol=5e-3)
    expect(spread in ("larger", "smaller", "same"), f'the second item is "larger", "smaller" or "same", got {spread!r}')
    expect(spread == "smaller", "with 0/1 rewards every sample pushes the same way before the baseline; subtracting "
           "what the group shares removes most of that common push, so the estimates scatter less")


# ---------------------------------------------------------------- 12.10 predict: a hole in the checker, in a toy
@check("12.10", "my_prediction")
def check_predict_hasty_toy(fn):
    """``fn() -> ("right" | "piece", "larger" | "smaller" | "same")``: the most likely reply after exact policy
    gradient against a checker that also accepts a piece of the answer, and the right reply's share of the
    accepted probability, against its share at the start (the piece starts ahead)."""
    got = fn()
    top, share = expect_items(got, 2, f"return a pair of words, got {got!r}")
    expect(top in ("right", "piece"), f'the first item is "right" or "piece", got {top!r}')
    expect(share in ("larger", "smaller", "same"), f'the second item is "larger", "smaller" or "same", got {share!r}')
    expect(top == "piece", "both replies earn the same reward, so the objective cannot prefer the right one; each "
           "accepted reply's logit rises in proportion to its own probability, and the piece starts ahead")
    expect(share == "smaller", "each accepted reply is pushed up in proportion to its probability pᵢ: the likelier "
           "one gains faster, so the gap between them widens while the push lasts")


# ---------------------------------------------------------------- 12.11 predict: what the ladder's seeds support
# The truth of each claim in the stored benchmark (benchmarks/results/rl_ladder.md, three seeds a rung): two arms
# differ on a measure when their seeds' ranges do not overlap. A re-run that changes a range changes these rows.
_LADDER_CLAIMS = {
    "A": (False, "GRPO's greedy 71.2-74.5% against group-normalised REINFORCE's 71.0-76.8%: the ranges overlap"),
    "B": (True, "hole used 10.0-73.8% of greedy replies against 0.2-0.8% with the strict checker: apart"),
    "C": (False, "expert iteration's pass@1 55.9-57.4% against GRPO's 53.9-56.1%: the ranges overlap"),
    "D": (True, "raw REINFORCE's pass@1 57.4-61.1% against the group-mean baseline's 52.0-53.9%: apart"),
    "E": (False, "group-normalised greedy 71.0-76.8% against the plain baseline's 68.2-73.0%: the ranges overlap"),
}


@check("12.11", "ladder_claims")
def check_ladder_claims(fn):
    """``fn() -> {"A": bool, ..., "E": bool}``: which claims about the ladder's table its three seeds support."""
    got = fn()
    expect(isinstance(got, dict) and set(got) == set(_LADDER_CLAIMS),
           f"return a dict with the keys {sorted(_LADDER_CLAIMS)} and True or False for each, got {got!r}")
    expect(all(isinstance(v, bool) for v in got.values()), f"each value is True or False, got {got!r}")
    wrong = [key for key, (truth, _) in _LADDER_CLAIMS.items() if got[key] != truth]
    expect(not wrong, f"claim {wrong[0] if wrong else ''}: look at the ranges in brackets, not at the means. "
           + (_LADDER_CLAIMS[wrong[0]][1] if wrong else ""))
