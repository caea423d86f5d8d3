"""Checks for chapter 07's exercises (generation, sampling and the KV cache). Hand-written.

Each check runs the learner's function against ``transformer_course.generation`` on ordinary and
edge inputs and names the likely mistake.
"""

from __future__ import annotations

import torch

from ._core import check, expect, expect_close


def _logits(rows: int = 3, vocab: int = 11, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * 2


def _kept(filtered: torch.Tensor) -> torch.Tensor:
    """Bool mask of the tokens a filter kept (finite logits)."""
    return torch.isfinite(filtered)


@check("7.1", "probs_with_temperature")
def check_temperature_probs(fn):
    """``fn(logits [B, V], temperature > 0) -> probs [B, V]``."""
    logits = _logits(rows=3, vocab=5)  # B != V catches a softmax over the wrong dimension
    for t in (1.0, 0.5, 2.0):
        got = torch.as_tensor(fn(logits.clone(), t))
        expect(tuple(got.shape) == (3, 5), f"expected shape (3, 5) (one distribution per row), got {tuple(got.shape)}")
        expect(bool((got >= 0).all()), "probabilities cannot be negative: apply softmax to the scaled logits")
        expect(
            torch.allclose(got.sum(-1), torch.ones(3), atol=1e-5),
            "each row must sum to 1: take the softmax over the last dimension (the vocabulary), dim=-1",
        )
        want = torch.softmax(logits / t, dim=-1)
        if t != 1.0 and torch.allclose(got, torch.softmax(logits * t, dim=-1), atol=1e-5):
            expect(False, f"with temperature {t} you multiplied the logits by it: divide by the temperature instead")
        expect_close(got, want, f"wrong probabilities at temperature {t}: softmax(logits / temperature, dim=-1)")


@check("7.2", "top_k")
def check_top_k(fn):
    """``fn(logits [B, V], k) -> logits [B, V]`` with all but the k largest of each row at -inf."""
    from transformer_course.generation import top_k_filter

    logits = _logits()
    vocab = logits.size(-1)
    for k in (1, 3, vocab):
        got = torch.as_tensor(fn(logits.clone(), k))
        expect(tuple(got.shape) == tuple(logits.shape), f"keep the shape [B, V] = {tuple(logits.shape)}, got {tuple(got.shape)}")
        n_kept = _kept(got).sum(-1)
        if k < vocab and bool((n_kept == vocab).all()) and bool(((got == 0).sum(-1) >= vocab - k).all()):
            expect(False, "removed tokens must become -inf (softmax turns -inf into probability 0), not 0: a logit of 0 can still be likely")
        expect(bool((n_kept == k).all()), f"with k={k} every row must keep exactly {k} tokens, kept {n_kept.tolist()}")
        expect(
            torch.equal(_kept(got), _kept(top_k_filter(logits, k))),
            f"with k={k} you kept the wrong tokens: keep the k LARGEST logits of each row (torch.topk)",
        )
        expect(torch.equal(got[_kept(got)], logits[_kept(got)]), "kept logits must keep their values unchanged")
    ties = torch.tensor([[1.0, 3.0, 2.0, 2.0, 2.0]])
    kept = int(_kept(torch.as_tensor(fn(ties.clone(), 2))).sum())
    expect(
        kept == 2,
        f"with logits [1, 3, 2, 2, 2] and k=2 you kept {kept} tokens: comparing against the k-th value keeps every tie; "
        "scatter the topk indices instead so exactly k survive",
    )


@check("7.3", "top_p")
def check_top_p(fn):
    """``fn(logits [B, V], p) -> logits [B, V]`` with everything outside the nucleus at -inf."""
    from transformer_course.generation import top_p_filter

    logits = _logits(rows=4, vocab=12, seed=3)
    probs = torch.softmax(logits.double(), -1)
    top = logits.argmax(-1, keepdim=True)
    ps = (0.9, 0.5, 0.3, 1.0, 0.05)
    outputs = {}
    for p in ps:
        got = torch.as_tensor(fn(logits.clone(), p))
        expect(tuple(got.shape) == tuple(logits.shape), f"keep the shape [B, V] = {tuple(logits.shape)}, got {tuple(got.shape)}")
        outputs[p] = got
    # most specific mistakes first: each pass looks at every p before the next kind of mistake
    for p, got in outputs.items():
        mass = (probs * _kept(got)).sum(-1)
        expect(
            bool((mass >= p - 1e-6).all()),
            f"with p={p} the kept tokens hold only {mass.min():.3f}: keep the token that carries the running total "
            "across p too (compare the mass BEFORE each token with p, not the total including it)",
        )
    for p, got in outputs.items():
        expect(
            bool(_kept(got).gather(-1, top).all()),
            f"with p={p} a row lost its most likely token: sort the probabilities largest first before the running "
            "total, so the top token (mass 0 before it) always survives",
        )
    for p, got in outputs.items():
        kept, want = _kept(got), _kept(top_p_filter(logits, p))
        expect(
            int(kept.sum()) <= int(want.sum()),
            f"with p={p} you kept {int(kept.sum())} tokens where the nucleus has {int(want.sum())}: stop at the first "
            "token where the running total reaches p",
        )
        expect(torch.equal(kept, want), f"with p={p} you kept the wrong tokens: keep a prefix of the tokens sorted largest first")
        expect(torch.equal(got[kept], logits[kept]), "kept logits must keep their values unchanged")


def _tiny_gpt(seed: int = 2):
    """A small random GPT (vocabulary 13, block_size 8) whose greedy output depends on its context.

    Weights ~ N(0, 0.5) and an untied head: with GPT-2's small initialisation (and a tied head) a random
    model's greedy text collapses to one repeated token, which would let a wrong loop pass.
    """
    from transformer_course.model import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, d_model=16, tie_weights=False))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=g) * 0.5)
    return model.eval()


def _prompts(batch: int = 2, length: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 13, (batch, length), generator=torch.Generator().manual_seed(seed))


class _Counter:
    """Counts the token positions fed to a model, per forward call (a forward pre-hook)."""

    def __init__(self, model):
        self.fed: list[int] = []
        self._handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        idx = args[0] if args else kwargs.get("idx")
        self.fed.append(int(idx.shape[1]))

    def remove(self) -> None:
        self._handle.remove()


def _run_counted(fn, model, idx, n):
    counter = _Counter(model)
    try:
        with torch.no_grad():
            out = fn(model, idx.clone(), n)
    finally:
        counter.remove()
    return torch.as_tensor(out), counter.fed


@check("7.4", "greedy_generate")
def check_greedy_generate(fn):
    """``fn(model, idx [B, T], max_new_tokens) -> [B, T + max_new_tokens]``, greedy, no cache."""
    from transformer_course.generation import generate

    model = _tiny_gpt()
    idx = _prompts()
    n = 5  # 3 + 5 = 8 = block_size: no cropping needed yet
    got, _ = _run_counted(fn, model, idx, n)
    want = generate(model, idx, n, temperature=0, use_cache=False)
    expect(
        tuple(got.shape) == tuple(want.shape),
        f"expected shape {tuple(want.shape)} (the prompt followed by {n} new tokens), got {tuple(got.shape)}",
    )
    expect(torch.equal(got[:, : idx.size(1)], idx), "the output must start with the prompt, unchanged")
    with torch.no_grad():
        first = model(idx)[0][:, 0].argmax(-1)
    if not torch.equal(got[:, idx.size(1)], want[:, idx.size(1)]) and torch.equal(got[:, idx.size(1)], first):
        expect(False, "you used the FIRST position's logits: the next token comes from the last one, logits[:, -1, :]")
    expect(torch.equal(got, want), "within block_size your tokens differ from greedy decoding: append logits[:, -1, :].argmax(-1) each step")
    long_n = 12  # 3 + 12 > block_size = 8
    try:
        got_long, fed = _run_counted(fn, model, idx, long_n)
    except NotImplementedError:
        raise
    except (ValueError, IndexError, RuntimeError) as error:
        expect(False, f"past block_size your loop failed ({type(error).__name__}): feed only the last block_size tokens, "
                      "idx[:, -model.cfg.block_size:]")
    expect(max(fed) <= 8, "you fed the model more than block_size positions: crop to idx[:, -model.cfg.block_size:]")
    want_long = generate(model, idx, long_n, temperature=0, use_cache=False)
    expect(
        torch.equal(got_long, want_long),
        "past block_size your tokens differ: crop the context to its LAST block_size tokens before every step "
        "(and keep the whole text in the output)",
    )


@check("7.5", "cached_greedy")
def check_cached_generate(fn):
    """``fn(model, idx [B, T], max_new_tokens) -> [B, T + max_new_tokens]`` with a KV cache."""
    from transformer_course.generation import generate

    model = _tiny_gpt(seed=3)
    idx = _prompts(seed=1)
    n = 5
    try:
        got, fed = _run_counted(fn, model, idx, n)
    except NotImplementedError:
        raise
    except (ValueError, IndexError, RuntimeError) as error:
        expect(False, f"your loop failed ({type(error).__name__}: {error}): after the prefill feed only the newest token, "
                      "model(new_token [B, 1], cache=cache); the cache already holds the keys and values of the rest")
    want = generate(model, idx, n, temperature=0, use_cache=False)
    expect(tuple(got.shape) == tuple(want.shape), f"expected shape {tuple(want.shape)}, got {tuple(got.shape)}")
    if not torch.equal(got, want) and fed and fed[0] < idx.size(1):
        expect(False, "the first forward pass must be the prefill: run the whole prompt through the model with the empty cache")
    if not torch.equal(got, want) and sum(fed) > idx.size(1) + n - 1:
        expect(False, "with a cache, feed only the tokens it has not seen (the newest one): feeding the whole sequence "
                      "again appends its keys twice and numbers the positions wrongly")
    expect(torch.equal(got, want), "your tokens differ from greedy decoding: prefill the prompt, then feed each new token with the cache")
    expected_work = idx.size(1) + n - 1
    expect(
        sum(fed) == expected_work,
        f"the tokens are right, but your loop fed the model {sum(fed)} positions where a cached loop needs "
        f"{expected_work} (the prompt once, then one token per step): pass cache= and feed only the newest token",
    )
