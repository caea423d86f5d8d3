"""Checks for chapter 06's exercises (the GPT model and its training).

Each check runs the learner's function next to the package's reference on ordinary and edge cases
and, when they disagree, names the likely mistake.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F

from ._core import check, expect, expect_close


def _small_config(**overrides):
    from transformer_course.model import GPTConfig

    base = GPTConfig(vocab_size=11, block_size=7, n_layer=2, n_head=2, d_model=8)
    return replace(base, **overrides)


@check("6.1", "count_parameters")
def check_count_parameters(fn):
    from transformer_course.model import GPT

    base = _small_config()
    C, V = base.d_model, base.vocab_size
    want = GPT(base).num_parameters()
    got = fn(base)
    expect(isinstance(got, int) and not isinstance(got, bool), f"return an int, got {type(got).__name__}")
    off = got - want
    expect(off != C * V, "the tied LM head is counted twice: with tie_weights=True it is the token-embedding matrix, count it once")
    expect(off != -base.block_size * C, "the learned position embedding is missing: it holds block_size x d_model numbers")
    expect(off != -2 * C, "the final LayerNorm ln_f is missing (a gain and a bias of d_model each)")
    expect(off != -base.n_layer * 4 * C, "a block's LayerNorms are missing (two per block, gain and bias of d_model each)")
    expect(off == 0, f"for {base} the model has {want} parameters, you counted {got}")
    cases = [
        (replace(base, tie_weights=False), "with tie_weights=False the head is its own d_model x vocab_size matrix (no bias)"),
        (replace(base, positional="sinusoidal"), "the sinusoidal position code is a fixed buffer, not a parameter: it adds nothing"),
        (replace(base, bias=False), "with bias=False no Linear and no LayerNorm has a bias: only the LayerNorm gains remain"),
        (replace(base, n_layer=5, d_model=12, n_head=3, block_size=9), "the count must scale with n_layer and d_model: check the per-block terms"),
    ]
    for cfg, hint in cases:
        expect(fn(cfg) == GPT(cfg).num_parameters(), hint)


@check("6.2", "cross_entropy")
def check_cross_entropy(fn):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 5, generator=gen)
    targets = torch.tensor([0, 4, 2, 2, 1, 3])
    got = fn(logits, targets)
    expect(isinstance(got, torch.Tensor) and got.dim() == 0, "return a scalar tensor (the mean over the N rows)")
    want = F.cross_entropy(logits, targets)
    expect(not torch.isclose(got, want * 6, atol=1e-5), "you summed over the rows: take the mean over the N positions")
    expect(not torch.isclose(got, -want, atol=1e-5), "the sign is flipped: the loss is minus the log-probability of the target")
    plain_p = -logits.softmax(-1)[torch.arange(6), targets].mean()
    expect(not torch.isclose(got, plain_p, atol=1e-5), "that is minus the probability, not minus the log-probability of the target")
    expect_close(got, want, "does not match F.cross_entropy on small random logits")
    huge = logits * 200  # softmax underflows to exactly 0 for most entries
    got_huge = fn(huge, targets)
    expect(torch.isfinite(got_huge), "logits in the hundreds give inf or NaN: use logsumexp (subtract the row maximum) instead of softmax then log")
    expect_close(got_huge, F.cross_entropy(huge, targets), "wrong for large logits: compute log-probabilities as logits - logsumexp(logits)", atol=1e-3, rtol=1e-5)
    logits.requires_grad_(True)
    fn(logits, targets).backward()
    expect(logits.grad is not None, "the loss must be differentiable: build it from torch operations on the logits")


@check("6.3", "lr_at")
def check_lr_schedule(fn):
    from transformer_course.training import TrainConfig, lr_at

    cfg = TrainConfig(max_iters=1000, learning_rate=1e-3, min_lr=1e-4, warmup_iters=100)
    got0 = fn(0, cfg)
    expect(got0 > 0, "step 0 gets learning rate 0: warm up from lr/warmup_iters at step 0 ((step + 1) / warmup_iters), so the first update is not wasted")
    expect(math.isclose(fn(99, cfg), 1e-3, rel_tol=1e-6), "the warm-up must reach the peak learning_rate at its last step (step warmup_iters - 1)")
    expect(math.isclose(got0, lr_at(0, cfg), rel_tol=1e-6), "warm-up is linear: step s < warmup_iters gets learning_rate * (s + 1) / warmup_iters")
    expect(fn(999, cfg) > 0.5 * cfg.min_lr, "the cosine must end at min_lr, not at 0: lr = min_lr + (peak - min_lr) * (1 + cos(pi * progress)) / 2")
    expect(math.isclose(fn(1000, cfg), 1e-4, rel_tol=1e-6) and math.isclose(fn(1500, cfg), 1e-4, rel_tol=1e-6),
           "after lr_decay_iters (default: max_iters) the rate stays flat at min_lr; the cosine must not come back up")
    for step in (100, 250, 550, 900):
        expect(math.isclose(fn(step, cfg), lr_at(step, cfg), rel_tol=1e-6),
               f"step {step}: expected {lr_at(step, cfg):.6g}, got {fn(step, cfg):.6g}; progress = (step - warmup_iters) / (decay_end - warmup_iters)")
    other = replace(cfg, lr_decay_iters=600)
    expect(math.isclose(fn(400, other), lr_at(400, other), rel_tol=1e-6), "the decay must end at lr_decay_iters when it is set (max_iters only when it is None)")


@check("6.4", "param_groups")
def check_param_groups(fn):
    from transformer_course.model import GPT

    torch.manual_seed(0)
    model = GPT(_small_config())
    groups = fn(model, 0.1)
    expect(isinstance(groups, list) and all(isinstance(g, dict) and "params" in g for g in groups),
           "return a list of dicts, each with 'params' and 'weight_decay'")
    seen = [p for g in groups for p in g["params"]]
    expect(len(seen) == len({id(p) for p in seen}), "a parameter appears twice (the tied embedding/head matrix?): AdamW would update it twice per step")
    expect({id(p) for p in seen} == {id(p) for p in model.parameters()}, "every trainable parameter must be in exactly one group")
    decayed = {id(p) for g in groups if g.get("weight_decay", 0) > 0 for p in g["params"]}
    expect(all(id(p) not in decayed for n, p in model.named_parameters() if n.startswith("ln") or ".ln" in n),
           "LayerNorm gains and shifts are decayed: weight decay is for matrices and embeddings (dim >= 2) only")
    expect(all(id(p) not in decayed for n, p in model.named_parameters() if n.endswith("bias")),
           "biases are decayed: only parameters with dim >= 2 should be")
    expect(all(id(p) in decayed for p in model.parameters() if p.dim() >= 2), "every matrix and embedding (dim >= 2) must be decayed")
    expect(all(math.isclose(g["weight_decay"], 0.1) for g in groups if g.get("weight_decay", 0) > 0),
           "the decayed group must use the weight_decay you were given")


@check("6.5", "train_step")
def check_train_step(fn):
    from transformer_course.model import GPT
    from transformer_course.training import train_step

    def fresh():  # plain SGD: every gradient mistake shows in the update (Adam hides the scale)
        torch.manual_seed(0)
        model = GPT(_small_config())
        return model, torch.optim.SGD(model.parameters(), lr=0.5)

    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 11, (3, 8), generator=gen) for _ in range(3)]
    ref, ref_opt = fresh()
    mine, my_opt = fresh()
    for i, seq in enumerate(batches):
        x, y = seq[:, :-1], seq[:, 1:]
        want = train_step(ref, ref_opt, x, y, grad_clip=0.05)
        before = [p.detach().clone() for p in mine.parameters()]
        got = fn(mine, my_opt, x, y, 0.05)
        expect(isinstance(got, float), f"return the loss as a Python float (loss.item()), got {type(got).__name__}")
        expect(any(not torch.equal(a, p) for a, p in zip(before, mine.parameters(), strict=True)),
               "the parameters did not change: call optimizer.step() after loss.backward()")
        expect(math.isclose(got, want, rel_tol=1e-5), f"step {i}: loss {got:.6f}, expected {want:.6f} (return the loss of this batch, before the update)")
        close = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(mine.parameters(), ref.parameters(), strict=True))
        if i == 0:
            expect(close, "the first update differs: clip the gradient norm after backward() and before optimizer.step()")
        expect(close, "later updates differ: gradients accumulate across steps unless you call optimizer.zero_grad() every step")
