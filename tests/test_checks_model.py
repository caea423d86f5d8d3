"""The checks behind chapter 06's exercises: the reference passes, planted bugs get the right hint,
and the student edition's stub reports "not done"."""

import math

import torch

from transformer_course.checks.model import (
    check_count_parameters,
    check_cross_entropy,
    check_lr_schedule,
    check_param_groups,
    check_train_step,
)
from transformer_course.model import count_parameters
from transformer_course.training import lr_at, param_groups, train_step


def _run(check, fn):
    return check(fn, quiet=True)


def _assert_fails(check, fn, hint_fragment):
    outcome = _run(check, fn)
    assert outcome.status == "failed", outcome
    assert hint_fragment in outcome.message, outcome.message


def _stub(*args, **kwargs):
    raise NotImplementedError("Exercise 6.x")


def test_all_checks_pass_the_reference_and_report_not_done_for_the_stub():
    def cross_entropy(logits, targets):
        return -(logits - logits.logsumexp(-1, keepdim=True)).gather(-1, targets[:, None]).mean()

    for check, reference in [(check_count_parameters, count_parameters), (check_cross_entropy, cross_entropy),
                             (check_lr_schedule, lr_at), (check_param_groups, param_groups),
                             (check_train_step, lambda m, o, x, y, c: train_step(m, o, x, y, c))]:
        assert _run(check, reference).status == "passed", check.__name__
        assert _run(check, _stub).status == "not done", check.__name__


# ---------------------------------------------------------------- 6.1
def test_count_parameters_bugs():
    def tied_twice(cfg):
        return count_parameters(cfg) + (cfg.d_model * cfg.vocab_size if cfg.tie_weights else 0)

    def no_positions(cfg):
        return count_parameters(cfg) - (cfg.block_size * cfg.d_model if cfg.positional == "learned" else 0)

    def always_positions(cfg):  # sinusoidal positions counted as if learned
        return count_parameters(cfg) + (cfg.block_size * cfg.d_model if cfg.positional == "sinusoidal" else 0)

    def ignores_bias_flag(cfg):
        from dataclasses import replace

        return count_parameters(replace(cfg, bias=True))

    def no_final_norm(cfg):
        return count_parameters(cfg) - 2 * cfg.d_model

    _assert_fails(check_count_parameters, tied_twice, "counted twice")
    _assert_fails(check_count_parameters, no_positions, "learned position embedding is missing")
    _assert_fails(check_count_parameters, always_positions, "sinusoidal position code is a fixed buffer")
    _assert_fails(check_count_parameters, ignores_bias_flag, "with bias=False no Linear")
    _assert_fails(check_count_parameters, no_final_norm, "final LayerNorm ln_f is missing")
    _assert_fails(check_count_parameters, lambda cfg: float(count_parameters(cfg)), "return an int")


# ---------------------------------------------------------------- 6.2
def test_cross_entropy_bugs():
    def naive(logits, targets):  # softmax, then log: underflows for large logits
        return -logits.softmax(-1)[torch.arange(len(targets)), targets].log().mean()

    def summed(logits, targets):
        return -(logits - logits.logsumexp(-1, keepdim=True)).gather(-1, targets[:, None]).sum()

    def probability(logits, targets):
        return -logits.softmax(-1)[torch.arange(len(targets)), targets].mean()

    _assert_fails(check_cross_entropy, naive, "use logsumexp")
    _assert_fails(check_cross_entropy, summed, "you summed over the rows")
    _assert_fails(check_cross_entropy, probability, "minus the probability, not minus the log-probability")
    _assert_fails(check_cross_entropy, lambda lg, t: torch.tensor([1.0, 2.0]), "return a scalar tensor")


# ---------------------------------------------------------------- 6.3
def test_lr_schedule_bugs():
    def warmup_from_zero(step, cfg):
        return cfg.learning_rate * step / cfg.warmup_iters if step < cfg.warmup_iters else lr_at(step, cfg)

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
        return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)

    def ignores_decay_iters(step, cfg):
        from dataclasses import replace

        return lr_at(step, replace(cfg, lr_decay_iters=None))

    _assert_fails(check_lr_schedule, warmup_from_zero, "step 0 gets learning rate 0")
    _assert_fails(check_lr_schedule, cosine_to_zero, "must end at min_lr, not at 0")
    _assert_fails(check_lr_schedule, comes_back_up, "must not come back up")
    _assert_fails(check_lr_schedule, ignores_decay_iters, "must end at lr_decay_iters")


# ---------------------------------------------------------------- 6.4
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

    _assert_fails(check_param_groups, decay_everything, "LayerNorm gains and shifts are decayed")
    _assert_fails(check_param_groups, decay_by_name, "LayerNorm gains and shifts are decayed")
    _assert_fails(check_param_groups, tied_twice, "a parameter appears twice")
    _assert_fails(check_param_groups, lambda m, wd: (list(m.parameters()),), "return a list of dicts")


# ---------------------------------------------------------------- 6.5
def test_train_step_bugs():
    def no_zero_grad(model, optimizer, x, y, clip):
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        return loss.item()

    def clip_after_step(model, optimizer, x, y, clip):
        _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        return loss.item()

    def no_step(model, optimizer, x, y, clip):
        _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        return loss.item()

    def returns_tensor(model, optimizer, x, y, clip):
        train_step(model, optimizer, x, y, clip)
        return torch.tensor(0.0)

    _assert_fails(check_train_step, no_zero_grad, "gradients accumulate across steps")
    _assert_fails(check_train_step, clip_after_step, "clip the gradient norm after backward() and before optimizer.step()")
    _assert_fails(check_train_step, no_step, "call optimizer.step()")
    _assert_fails(check_train_step, returns_tensor, "return the loss as a Python float")
