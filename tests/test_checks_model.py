"""The checks behind chapter 06's exercises: right answers pass and planted bugs get the right hint
(tests/test_checks_all.py runs every check on a stub and on its reference)."""

import math
from contextlib import nullcontext
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from check_helpers import assert_rejected, run

from transformer_course.checks.model import (
    _smoothed_cross_entropy,
    check_get_batch,
    check_gpt_forward,
    check_lr_at,
    check_param_groups,
    check_predict_initial_loss,
    check_smoothed_cross_entropy,
    check_train_step,
)
from transformer_course.model import GPT
from transformer_course.training import lr_at, train_step


# ---------------------------------------------------------------- 6.1 GPT.forward
def _gpt_with(bug: str):
    """A GPT whose forward has one planted mistake."""

    def forward(self, idx, targets=None, cache=None, *, last_only=False):
        start = 0 if cache is None else cache[0].length
        x = self.embed(idx, start_pos=0 if bug == "positions" else start)
        for i, block in enumerate(self.blocks):
            x = block(x, cache=None if cache is None or bug == "no cache" else cache[i])
        if last_only and bug != "late cut":
            x = x[:, -1:, :]
        logits = self.lm_head(x if bug == "no ln_f" else self.ln_f(x))
        if last_only and bug == "late cut":
            logits = logits[:, -1:, :]
        if bug == "stream":
            return x, None
        if targets is None:
            return logits, None
        if bug == "shift again":
            return logits, F.cross_entropy(
                logits[:, :-1].flatten(0, 1), targets[:, 1:].flatten(), ignore_index=-1
            )
        options = {"reduction": "sum"} if bug == "summed" else {}
        if bug != "no ignore":
            options["ignore_index"] = -1
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten(), **options)

    return type(f"GPTWith{bug.title().replace(' ', '')}", (GPT,), {"forward": forward})


@pytest.mark.parametrize(
    ("bug", "hint"),
    [
        ("no ln_f", "ln_f is missing"),
        ("stream", "you returned the residual stream"),
        ("summed", "the loss is summed over positions"),
        ("shift again", "do not shift them again"),
        ("no ignore", "ignore_index=-1"),
        ("late cut", "*before* ln_f and lm_head"),
        ("no cache", "give block i its own cache[i]"),
        ("positions", "pass start_pos=start"),
    ],
)
def test_gpt_forward_bugs(bug, hint):
    assert_rejected(check_gpt_forward, _gpt_with(bug), hint)


def test_gpt_forward_correct_variant_passes():
    assert run(check_gpt_forward, _gpt_with("none")).status == "passed"


# ---------------------------------------------------------------- 6.2 initial loss
@pytest.mark.parametrize(
    ("guess", "hint"),
    [
        (math.log2(65), "natural log"),
        (65, "vocabulary size"),
        (1 / 65, "vocabulary size"),
        (0.0, "cannot be confident and right"),
        (20.0, "not confidently wrong"),
        (3.5, "not quite"),
        ("4.17", "return a number"),
    ],
)
def test_initial_loss_wrong_guesses(guess, hint):
    assert_rejected(check_predict_initial_loss, lambda: guess, hint)


def test_initial_loss_accepts_close_guesses():
    for guess in (4.17, 4.2, torch.tensor(4.1744)):
        assert run(check_predict_initial_loss, lambda g=guess: g).status == "passed"


# ---------------------------------------------------------------- 6.3 train_step
def test_train_step_bugs():
    def no_zero_grad(model, optimizer, x, y, clip=1.0, autocast=None):
        with autocast or nullcontext():
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        return loss.item()

    def clip_after_step(model, optimizer, x, y, clip=1.0, autocast=None):
        with autocast or nullcontext():
            _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        return loss.item()

    def no_step(model, optimizer, x, y, clip=1.0, autocast=None):
        _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        return loss.item()

    def always_clip(
        model, optimizer, x, y, clip=1.0, autocast=None
    ):  # clip_grad_norm_(..., 0) zeroes every gradient
        with autocast or nullcontext():
            _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        return loss.item()

    def no_autocast(model, optimizer, x, y, clip=1.0, autocast=None):
        return train_step(model, optimizer, x, y, clip, None)

    def enters_none(model, optimizer, x, y, clip=1.0, autocast=None):
        with autocast:
            _, loss = model(x, y)
        return train_step(model, optimizer, x, y, clip, None) if loss is not None else 0.0

    def returns_tensor(model, optimizer, x, y, clip=1.0, autocast=None):
        train_step(model, optimizer, x, y, clip)
        return torch.tensor(0.0)

    assert_rejected(check_train_step, no_zero_grad, "gradients accumulate across steps")
    assert_rejected(
        check_train_step,
        clip_after_step,
        "clip the gradient norm after backward() and before optimizer.step()",
    )
    assert_rejected(check_train_step, no_step, "call optimizer.step()")
    assert_rejected(check_train_step, always_clip, "grad_clip=0 means no clipping")
    assert_rejected(check_train_step, no_autocast, "inside the autocast context")
    assert_rejected(check_train_step, enters_none, "autocast may be None")
    assert_rejected(check_train_step, returns_tensor, "return the loss as a Python float")


# ---------------------------------------------------------------- 6.4 param_groups
def test_param_groups_bugs():
    def decay_everything(model, wd):
        return [{"params": list(model.parameters()), "weight_decay": wd}]

    def decay_by_name(model, wd):  # LayerNorm gains are called "weight" too
        named = list(model.named_parameters())
        return [{"params": [p for n, p in named if n.endswith("weight")], "weight_decay": wd},
                {"params": [p for n, p in named if not n.endswith("weight")], "weight_decay": 0.0}]

    def tied_twice(model, wd):
        params = list(model.named_parameters(remove_duplicate=False))
        return [{"params": [p for _, p in params if p.dim() >= 2], "weight_decay": wd},
                {"params": [p for _, p in params if p.dim() < 2], "weight_decay": 0.0}]

    assert_rejected(check_param_groups, decay_everything, "LayerNorm gains and shifts are decayed")
    assert_rejected(check_param_groups, decay_by_name, "LayerNorm gains and shifts are decayed")
    assert_rejected(check_param_groups, tied_twice, "a parameter appears twice")
    assert_rejected(
        check_param_groups, lambda m, wd: (list(m.parameters()),), "return a list of dicts"
    )


# ---------------------------------------------------------------- 6.5 lr_at
def test_lr_at_bugs():
    def warmup_from_zero(step, cfg):
        return (
            cfg.learning_rate * step / cfg.warmup_iters
            if step < cfg.warmup_iters
            else lr_at(step, cfg)
        )

    def warmup_one_too_long(step, cfg):  # off by one at the warm-up boundary
        if step <= cfg.warmup_iters:
            return cfg.learning_rate * (step + 1) / cfg.warmup_iters
        return lr_at(step, cfg)

    def cosine_to_zero(step, cfg):
        end = cfg.lr_decay_iters or cfg.max_iters
        if step < cfg.warmup_iters:
            return lr_at(step, cfg)
        progress = min(1.0, (step - cfg.warmup_iters) / (end - cfg.warmup_iters))
        return 0.5 * (1 + math.cos(math.pi * progress)) * cfg.learning_rate

    def comes_back_up(step, cfg):
        end = cfg.lr_decay_iters or cfg.max_iters
        if step < cfg.warmup_iters:
            return lr_at(step, cfg)
        progress = (step - cfg.warmup_iters) / (end - cfg.warmup_iters)
        return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (
            cfg.learning_rate - cfg.min_lr
        )

    def ignores_decay_iters(step, cfg):
        return lr_at(step, replace(cfg, lr_decay_iters=None))

    def divides_by_warmup(step, cfg):  # fine with a warm-up, breaks without one
        ramp = (step + 1) / cfg.warmup_iters
        return cfg.learning_rate * ramp if step < cfg.warmup_iters else lr_at(step, cfg)

    assert_rejected(check_lr_at, warmup_from_zero, "step 0 gets learning rate 0")
    assert_rejected(check_lr_at, warmup_one_too_long, "goes above the peak")
    assert_rejected(check_lr_at, cosine_to_zero, "must end at min_lr, not at 0")
    assert_rejected(check_lr_at, comes_back_up, "must not come back up")
    assert_rejected(check_lr_at, ignores_decay_iters, "must end at lr_decay_iters")
    assert_rejected(check_lr_at, divides_by_warmup, "warmup_iters=0")


# ---------------------------------------------------------------- 6.6 get_batch (debug)
def _batch(
    data, block_size, batch_size, generator=None, *, shift=1, upper=0, long=True, seeded=True
):
    starts = torch.randint(
        len(data) - block_size + upper, (batch_size,), generator=generator if seeded else None
    )
    offsets = torch.arange(block_size)
    x, y = data[starts[:, None] + offsets], data[starts[:, None] + offsets + shift]
    return (x.long(), y.long()) if long else (x, y)


def test_get_batch_bugs():
    assert_rejected(
        check_get_batch, lambda *a, **k: _batch(*a, **k, shift=0), "the targets equal the inputs"
    )
    assert_rejected(check_get_batch, lambda *a, **k: _batch(*a, **k, shift=-1), "x and y swapped?")
    assert_rejected(
        check_get_batch, lambda *a, **k: _batch(*a, **k, shift=2), "the character right after"
    )
    assert_rejected(
        check_get_batch, lambda *a, **k: _batch(*a, **k, upper=1), "leave room for its last target"
    )
    assert_rejected(
        check_get_batch, lambda *a, **k: _batch(*a, **k, long=False), "return int64 ids"
    )
    assert_rejected(
        check_get_batch,
        lambda *a, **k: _batch(*a, **k, seeded=False),
        "use the generator you are given",
    )
    assert run(check_get_batch, _batch).status == "passed"


# ---------------------------------------------------------------- 6.7 label smoothing (extend)
def test_smoothed_cross_entropy_bugs():
    def naive(logits, targets, eps):  # softmax, then log: underflows for large logits
        log_probs = logits.softmax(-1).log()
        nll = -log_probs[torch.arange(len(targets)), targets]
        return ((1 - eps) * nll - eps * log_probs.mean(-1)).mean()

    def summed(logits, targets, eps):
        return _smoothed_cross_entropy(logits, targets, eps) * len(targets)

    def over_the_others(logits, targets, eps):
        log_probs = logits - logits.logsumexp(-1, keepdim=True)
        nll = -log_probs[torch.arange(len(targets)), targets]
        others = (-log_probs.sum(-1) - nll) / (logits.shape[-1] - 1)
        return ((1 - eps) * nll + eps * others).mean()

    def no_one_minus_eps(logits, targets, eps):
        log_probs = logits - logits.logsumexp(-1, keepdim=True)
        nll = -log_probs[torch.arange(len(targets)), targets]
        return (nll - eps * log_probs.mean(-1)).mean()

    def library(logits, targets, eps):
        return F.cross_entropy(logits, targets, label_smoothing=eps)

    def probability(logits, targets, eps):
        return -logits.softmax(-1)[torch.arange(len(targets)), targets].mean()

    assert_rejected(check_smoothed_cross_entropy, naive, "instead of softmax then log")
    assert_rejected(check_smoothed_cross_entropy, summed, "you summed over the rows")
    assert_rejected(check_smoothed_cross_entropy, over_the_others, "not over the V - 1 others")
    assert_rejected(check_smoothed_cross_entropy, no_one_minus_eps, "weighted by 1 - ε")
    assert_rejected(check_smoothed_cross_entropy, library, "rather than F.cross_entropy")
    assert_rejected(check_smoothed_cross_entropy, probability, "minus the probability")
    assert_rejected(
        check_smoothed_cross_entropy,
        lambda lg, t, e: torch.tensor([1.0, 2.0]),
        "return a scalar tensor",
    )
    assert (
        F.cross_entropy is not None and F.cross_entropy.__name__ == "cross_entropy"
    )  # restored after the check


def test_smoothed_reference_matches_pytorch():
    logits = torch.randn(7, 9, generator=torch.Generator().manual_seed(2)) * 3
    targets = torch.randint(0, 9, (7,), generator=torch.Generator().manual_seed(3))
    for eps in (0.0, 0.1, 0.5):
        want = F.cross_entropy(logits, targets, label_smoothing=eps)
        assert torch.allclose(_smoothed_cross_entropy(logits, targets, eps), want, atol=1e-6)
