"""Checks for chapter 06's exercises (the GPT model and its training), against the package's references."""

import contextlib
import math
import numbers
from dataclasses import replace

import torch
import torch.nn.functional as F

from .. import model as _lib
from ..data import get_batch
from ..training import lr_at, param_groups, train_step
from ._core import CheckFailed, check, close, expect, expect_close, expect_items, expect_runs, expect_tensor, fresh_rng


def _small_config(**overrides):
    from transformer_course.config import GPTConfig

    base = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, d_model=8)
    return replace(base, **overrides)


def _small_gpt():
    """A small package GPT, the same on every call."""
    from transformer_course.model import GPT

    with fresh_rng(0):
        return GPT(_small_config())


# ---------------------------------------------------------------- 6.1 build: GPT.forward
@check("6.1", "GPT.forward", reference=_lib.GPT)
def check_gpt_forward(cls):
    """``cls.forward`` is run on a package ``GPT`` (so only the learner's forward is tested)."""
    from transformer_course.model import GPT

    model = _small_gpt().eval()
    V, C = model.cfg.vocab_size, model.cfg.d_model
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, V, (3, 6), generator=gen)
    targets = torch.randint(0, V, (3, 6), generator=gen)

    def forward(*args, **kwargs):
        return cls.forward(model, *args, **kwargs)

    with torch.no_grad():
        want, _ = GPT.forward(model, idx)
        stream = model.embed(idx)
        for block in model.blocks:
            stream = block(stream)
        logits, loss = expect_items(forward(idx), 2, "return a pair (logits, loss): (logits, None) without targets")
        expect_tensor(logits, what="the logits tensor as the pair's first element")
        expect(loss is None, "without targets the loss must be None: return (logits, None)")
        expect(tuple(logits.shape) != (3, 6, C), "you returned the residual stream [B, T, C]: "
               "finish with ln_f and lm_head to get logits [B, T, V]")
        expect(tuple(logits.shape) == (3, 6, V), f"logits must be [B, T, V] = (3, 6, {V}), got {tuple(logits.shape)}")
        expect_close(logits, want, "the logits differ from the reference: the embedding (with "
                     "start_pos), every block in order, then ln_f and lm_head", mistakes=[
            ("ln_f is missing: normalise the last block's output with self.ln_f before the head",
             model.lm_head(stream)),
        ])
        _expect_gpt_loss(forward, want, idx, targets)
        _expect_last_only(forward, model, want, idx)
        _expect_gpt_cache(forward, model, want, idx)


def _expect_gpt_loss(forward, want, idx, targets) -> None:
    """6.1's loss: the mean cross-entropy against targets as given, -1 left out."""
    _, loss = forward(idx, targets)
    expect(isinstance(loss, torch.Tensor) and loss.dim() == 0,
           "with targets, return the mean cross-entropy as a scalar tensor (0-dimensional)")
    want_loss = F.cross_entropy(want.flatten(0, 1), targets.flatten())
    shifted = F.cross_entropy(want[:, :-1].flatten(0, 1), targets[:, 1:].flatten())
    expect_close(loss, want_loss, "the loss differs from the mean cross-entropy of the logits "
                 "[B·T, V] against the targets [B·T]", mistakes=[
        ("the loss is summed over positions: take the mean over the B·T positions", want_loss * targets.numel()),
        ("the targets are already shifted (targets[b, t] is the token after idx[b, t]): compare "
         "logits[:, t] with targets[:, t], do not shift them again", shifted),
    ])
    masked = targets.clone()
    masked[0, :3] = -1
    masked[2, 5] = -1
    _, loss = expect_runs(forward, idx, masked, errors=(IndexError, RuntimeError),
                          hint="targets equal to -1 must be skipped: pass ignore_index=-1 to F.cross_entropy")
    keep = masked.flatten() != -1
    expect_close(loss, F.cross_entropy(want.flatten(0, 1)[keep], masked.flatten()[keep]),
                 "positions whose target is -1 must be left out of the mean (ignore_index=-1)")


def _expect_last_only(forward, model, want, idx) -> None:
    """6.1's last_only=True: the last position's logits, and the head run on it alone."""
    V = model.cfg.vocab_size
    head_inputs = []
    hook = model.lm_head.register_forward_hook(lambda _m, args, _out: head_inputs.append(tuple(args[0].shape)))
    try:
        logits, _ = forward(idx, last_only=True)
    finally:
        hook.remove()
    expect(tuple(logits.shape) == (3, 1, V), "with last_only=True return the last position's "
           f"logits only, [B, 1, V] = (3, 1, {V}); got {tuple(logits.shape)}")
    expect_close(logits, want[:, -1:], "last_only must give the same numbers as the last position of the full logits")
    expect(all(shape[-2] == 1 for shape in head_inputs), "last_only: keep only the last position of the stream "
           "*before* ln_f and lm_head, so the head's [C, V] product runs once per sequence instead of T times")


def _expect_gpt_cache(forward, model, want, idx) -> None:
    """6.1 with a KV cache: four tokens into an empty cache, then two more."""
    V = model.cfg.vocab_size
    cache = model.new_cache()
    first, _ = forward(idx[:, :4], cache=cache)
    expect(all(layer.length == 4 for layer in cache), "the cache did not grow in every layer: "
           "give block i its own cache[i] (the block's cache= argument)")
    expect_close(first, want[:, :4], "with an empty cache the logits must equal those of the plain forward pass")
    second, _ = forward(idx[:, 4:], cache=cache)
    expect(tuple(second.shape) == (3, 2, V),
           f"two new tokens with a cache: logits (3, 2, {V}), got {tuple(second.shape)}")
    expect_close(second, want[:, 4:], "with a cache the new tokens sit at positions start, "
                 "start + 1, ...: pass start_pos=start to the embedding")


# ---------------------------------------------------------------- 6.2 predict: a fresh model's loss
@check("6.2", "initial loss")
def check_predict_initial_loss(fn):
    guess = fn()
    if isinstance(guess, torch.Tensor) and guess.numel() == 1:
        guess = guess.item()
    expect(isinstance(guess, numbers.Real) and not isinstance(guess, bool),
           f"return a number, got {type(guess).__name__}")
    guess = float(guess)
    V = 65
    expect(abs(guess - math.log2(V)) > 0.1, "that is log2(65), in bits: PyTorch's cross-entropy "
                                            "uses the natural log (ln)")
    expect(abs(guess - V) > 1 and abs(guess - 1 / V) > 0.005, "65 is the vocabulary size and 1/65 a probability; the "
           "loss is minus the log of the probability the model gives the right token")
    expect(guess > 0.5, "a fresh model knows nothing, so it cannot be confident and right: its loss is far from 0")
    expect(guess < 6, "too high: a fresh model is not confidently wrong; weights of size 0.02 give logits close to 0")
    expect(abs(guess - math.log(V)) < 0.1, "not quite: logits close to 0 make the softmax almost uniform, so each of "
           "the 65 characters gets about 1/65. What does that cost per position?")


# ---------------------------------------------------------------- 6.3 build: train_step
class _Recorder:
    """A context manager that remembers whether the model's forward pass ran inside it."""

    inside, forward_inside = False, None

    def __enter__(self):
        self.inside = True
        return self

    def __exit__(self, *exc):
        self.inside = False


def _fresh_sgd():
    """A small GPT and plain SGD: every gradient mistake shows in the update (Adam hides the scale)."""
    model = _small_gpt()
    return model, torch.optim.SGD(model.parameters(), lr=0.5)


def _same_weights(a, b) -> bool:
    return all(close(p, q, atol=1e-6) for p, q in zip(a.parameters(), b.parameters(), strict=True))


@check("6.3", "train_step", reference=train_step)
def check_train_step(fn):
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 11, (3, 8), generator=gen) for _ in range(3)]
    (ref, ref_opt), (mine, my_opt) = _fresh_sgd(), _fresh_sgd()
    for i, seq in enumerate(batches):
        x, y = seq[:, :-1], seq[:, 1:]
        want = train_step(ref, ref_opt, x, y, 0.05, None)
        before = [p.detach().clone() for p in mine.parameters()]
        try:
            got = fn(mine, my_opt, x, y, 0.05, None)
        except (AttributeError, TypeError) as error:
            if "context manager" in str(error) or "__enter__" in str(error):
                raise CheckFailed("autocast may be None (no context): enter `autocast or nullcontext()`") from error
            raise
        expect(isinstance(got, float), f"return the loss as a Python float (loss.item()), got {type(got).__name__}")
        expect(any(not torch.equal(a, p) for a, p in zip(before, mine.parameters(), strict=True)),
               "the parameters did not change: call optimizer.step() after loss.backward()")
        expect(math.isclose(got, want, rel_tol=1e-5), f"step {i}: loss {got:.6f}, expected "
               f"{want:.6f} (return the loss of this batch, computed before the update)")
        if i == 0:
            expect(_same_weights(mine, ref), "the first update differs: clip the gradient norm "
                   "after backward() and before optimizer.step()")
        expect(_same_weights(mine, ref), "later updates differ: gradients accumulate across steps "
               "unless you call optimizer.zero_grad() every step")

    (ref, ref_opt), (mine, my_opt) = _fresh_sgd(), _fresh_sgd()
    x, y = batches[0][:, :-1], batches[0][:, 1:]
    train_step(ref, ref_opt, x, y, 0.0, None)
    fn(mine, my_opt, x, y, 0.0, None)
    expect(_same_weights(mine, ref), "grad_clip=0 means no clipping: clip only when grad_clip > 0")

    recorder = _Recorder()
    hook = mine.register_forward_pre_hook(lambda _m, _args: setattr(recorder, "forward_inside", recorder.inside))
    try:
        fn(mine, my_opt, x, y, 1.0, recorder)
    finally:
        hook.remove()
    expect(recorder.forward_inside is True, "run the forward pass inside the autocast context "
           "you are given: `with autocast or nullcontext(): ...`")


# ---------------------------------------------------------------- 6.4 build: param_groups
@check("6.4", "param_groups", reference=param_groups)
def check_param_groups(fn):
    model = _small_gpt()
    groups = fn(model, 0.1)
    expect(isinstance(groups, list) and all(isinstance(g, dict) and "params" in g for g in groups),
           "return a list of dicts, each with 'params' and 'weight_decay'")
    seen = [p for g in groups for p in g["params"]]
    expect(len(seen) == len({id(p) for p in seen}), "a parameter appears twice (the tied "
           "embedding/head matrix?): AdamW would update it twice per step")
    expect({id(p) for p in seen} == {id(p) for p in model.parameters()},
           "every trainable parameter must be in exactly one group")
    decayed = {id(p) for g in groups if g.get("weight_decay", 0) > 0 for p in g["params"]}
    named = list(model.named_parameters())
    expect(all(id(p) not in decayed for n, p in named if n.startswith("ln") or ".ln" in n),
           "LayerNorm gains and shifts are decayed: weight decay is for matrices and embeddings (dim >= 2) only")
    expect(all(id(p) not in decayed for n, p in named if n.endswith("bias")),
           "biases are decayed: only parameters with dim >= 2 should be")
    expect(all(id(p) in decayed for p in model.parameters() if p.dim() >= 2),
           "every matrix and embedding (dim >= 2) must be decayed")
    expect(all(math.isclose(g["weight_decay"], 0.1) for g in groups
               if g.get("weight_decay", 0) > 0), "the decayed group must use the weight_decay you were given")


# ---------------------------------------------------------------- 6.5 build: lr_at
@check("6.5", "lr_at", reference=lr_at)
def check_lr_at(fn):
    from transformer_course.config import TrainConfig

    cfg = TrainConfig(max_iters=1000, learning_rate=1e-3, min_lr=1e-4, warmup_iters=100)
    got0 = fn(0, cfg)
    expect(got0 > 0, "step 0 gets learning rate 0: warm up from lr/warmup_iters at step 0 "
                     "((step + 1) / warmup_iters), so the first update is not wasted")
    expect(math.isclose(fn(99, cfg), 1e-3, rel_tol=1e-6), "the warm-up must reach the peak "
           "learning_rate at its last step (step warmup_iters - 1)")
    expect(fn(100, cfg) <= 1e-3 * (1 + 1e-9), "step warmup_iters goes above the peak: the warm-up covers steps 0 .. "
           "warmup_iters - 1 (step < warmup_iters), and the cosine starts at the peak")
    expect(math.isclose(fn(100, cfg), 1e-3, rel_tol=1e-6),
           "the cosine must start at the peak at step warmup_iters (progress 0 there)")
    expect(math.isclose(got0, lr_at(0, cfg), rel_tol=1e-6), "warm-up is linear: step s < "
           "warmup_iters gets learning_rate * (s + 1) / warmup_iters")
    expect(fn(999, cfg) > 0.5 * cfg.min_lr, "the cosine must end at min_lr, not at 0: lr = "
           "min_lr + (peak - min_lr) * (1 + cos(pi * progress)) / 2")
    expect(math.isclose(fn(1000, cfg), 1e-4, rel_tol=1e-6) and math.isclose(fn(1500, cfg), 1e-4, rel_tol=1e-6),
           "after lr_decay_iters (default: max_iters) the rate stays flat at min_lr; the cosine must not come back up")
    for step in (250, 550, 900):
        expect(math.isclose(fn(step, cfg), lr_at(step, cfg), rel_tol=1e-6),
               f"step {step}: expected {lr_at(step, cfg):.6g}, got {fn(step, cfg):.6g}; "
               "progress = (step - warmup_iters) / (decay_end - warmup_iters)")
    other = replace(cfg, lr_decay_iters=600)
    expect(math.isclose(fn(400, other), lr_at(400, other), rel_tol=1e-6),
           "the decay must end at lr_decay_iters when it is set (max_iters only when it is None)")
    start = expect_runs(fn, 0, replace(cfg, warmup_iters=0), errors=ZeroDivisionError,
                        hint="warmup_iters=0 (no warm-up) divides by zero: step 0 is then already in the cosine")
    expect(math.isclose(start, 1e-3, rel_tol=1e-6),
           "with warmup_iters=0 the schedule starts at the peak (step 0 is progress 0)")


# ---------------------------------------------------------------- 6.6 debug: windows and targets
@check("6.6", "get_batch", reference=get_batch)
def check_get_batch(fn):
    data = torch.arange(200, dtype=torch.uint8)  # each token is its own position: easy windows
    x, y = fn(data, 8, 5, generator=torch.Generator().manual_seed(0))
    expect(isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor), "return two tensors (x, y)")
    expect(tuple(x.shape) == (5, 8) and tuple(y.shape) == (5, 8), "x and y must both be "
           f"[batch_size, block_size] = (5, 8), got {tuple(x.shape)} and {tuple(y.shape)}")
    expect(x.dtype == torch.long and y.dtype == torch.long,
           "return int64 ids (.long()): the embedding and the cross-entropy want long tensors")
    expect(bool(((x[:, 1:] - x[:, :-1]) == 1).all()),
           "each row of x must be a contiguous window data[s : s + block_size]")
    expect(not (y == x).float().mean() > 0.5, "the targets equal the inputs: position t is asked for the character it "
           "is reading, which it can see. y must be the window one character later (data[s + 1 : s + 1 + block_size])")
    expect(not (y == x - 1).float().mean() > 0.5, "the targets are the characters *before* the "
           "inputs (x and y swapped?): y starts one character after x")
    expect(torch.equal(y, x + 1), "y[b, t] must be the character right after x[b, t]: the window one character later")
    short = torch.arange(9, dtype=torch.uint8)  # exactly one window of 8 and its targets fit
    for seed in range(8):
        try:
            xs, ys = fn(short, 8, 4, generator=torch.Generator().manual_seed(seed))
            fits = (torch.equal(xs, torch.arange(8).repeat(4, 1)) and torch.equal(ys, torch.arange(1, 9).repeat(4, 1)))
        except (IndexError, RuntimeError):
            fits = False
        expect(fits, "a window must leave room for its last target: starts go from 0 to "
                     "len(data) - block_size - 1 (torch.randint(len(data) - block_size, ...))")
    again = [fn(data, 8, 5, generator=torch.Generator().manual_seed(3))[0] for _ in range(2)]
    expect(torch.equal(*again), "use the generator you are given (torch.randint(..., "
                                "generator=generator)): the same seed must give the same batch")


# ---------------------------------------------------------------- 6.7 extend: label smoothing
def _smoothed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, smoothing: float) -> torch.Tensor:
    """The reference for exercise 6.7: mean over N of (1 - ε)·(-log p_target) + ε·mean_v(-log p_v)."""
    log_probs = logits - logits.logsumexp(dim=-1, keepdim=True)
    nll = -log_probs.gather(-1, targets[:, None]).squeeze(-1)
    return ((1 - smoothing) * nll - smoothing * log_probs.mean(dim=-1)).mean()


@contextlib.contextmanager
def _without_f_cross_entropy():
    """F.cross_entropy (which has label smoothing built in) refuses to run while the check runs."""
    original = F.cross_entropy

    def refuse(*args, **kwargs):
        raise CheckFailed("build it from the logits (logsumexp, gather, mean) rather than "
                          "F.cross_entropy, which has label smoothing built in")

    F.cross_entropy = refuse
    try:
        yield
    finally:
        F.cross_entropy = original


@check("6.7", "smoothed_cross_entropy", reference=_smoothed_cross_entropy)
def check_smoothed_cross_entropy(fn):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 5, generator=gen)
    targets = torch.tensor([0, 4, 2, 2, 1, 3])
    plain = F.cross_entropy(logits, targets)
    smoothed = F.cross_entropy(logits, targets, label_smoothing=0.1)
    huge = logits * 200  # softmax underflows to exactly 0 for most entries
    huge_want = F.cross_entropy(huge, targets, label_smoothing=0.1)
    log_probs = logits.log_softmax(-1)
    nll = -log_probs[torch.arange(6), targets]
    others = (-log_probs.sum(-1) - nll) / 4  # ε spread over the V - 1 other tokens only
    with _without_f_cross_entropy():
        got = fn(logits, targets, 0.0)
        expect(isinstance(got, torch.Tensor) and got.dim() == 0, "return a scalar tensor (the mean over the N rows)")
        expect_close(got, plain, "with smoothing=0 it must be the plain cross-entropy", mistakes=[
            ("you summed over the rows: take the mean over the N positions", plain * 6),
            ("the sign is flipped: the loss is minus the log-probability", -plain),
            ("that is minus the probability, not minus the log-probability of the target",
             -logits.softmax(-1)[torch.arange(6), targets].mean()),
        ])
        expect_close(fn(logits, targets, 0.1), smoothed, "does not match cross-entropy with "
                     "label smoothing 0.1 on small random logits", mistakes=[
            ("ε is spread over all V tokens, the right one included (as PyTorch's label_smoothing "
             "does), not over the V - 1 others: the second term is the mean of -log p over all V",
             (0.9 * nll + 0.1 * others).mean()),
            ("the right token's own term must be weighted by 1 - ε: (1 - ε)·(-log p_target) + "
             "ε·mean(-log p)", (nll - 0.1 * log_probs.mean(-1)).mean()),
        ])
        got_huge = fn(huge, targets, 0.1)
        expect(bool(torch.isfinite(got_huge)), "logits in the hundreds give inf or NaN: use "
               "log-probabilities logits - logsumexp(logits) instead of softmax then log")
        expect_close(got_huge, huge_want, "wrong for large logits: compute log-probabilities as "
                     "logits - logsumexp(logits)", atol=1e-3, rtol=1e-5)
        leaf = logits.clone().requires_grad_(True)
        fn(leaf, targets, 0.1).backward()
        expect(leaf.grad is not None, "the loss must be differentiable: build it from torch operations on the logits")
