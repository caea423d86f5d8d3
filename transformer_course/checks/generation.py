"""Checks for chapter 07's exercises (generation, sampling and the KV cache), against
``transformer_course.generation`` or, for the debug and extend exercises, a reference kept here. Hand-written."""

import torch

from ..generation import decode_with_cache, top_k_filter, top_p_filter
from ._core import check, expect, expect_answer, expect_close, expect_runs, expect_tensor, fresh_rng, name_mistake

_NOT_ZERO = ("removed tokens must become -inf (softmax turns -inf into probability 0), not 0: a logit of 0 can still "
             "be likely")


_logits = lambda rows=3, vocab=11, seed=0: torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 2
_row = lambda: torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])  # one row [V] of logits, as the chapter calls the functions
_kept = torch.isfinite  # bool mask of the tokens a filter kept (finite logits)
# a learner's filter run on a copy: it must return a tensor of the logits' shape
_call_filter = lambda fn, logits, knob: expect_tensor(fn(logits.clone(), knob), logits.shape, "a tensor of logits")


def _expect_kept(got: torch.Tensor, logits: torch.Tensor, want: torch.Tensor, hint: str, mistakes=()) -> None:
    """A filter kept exactly the tokens ``want`` (bool [..., V]), with their logits unchanged, the
    rest at -inf; a known mistake (a wrong mask, see name_mistake) gets its own hint."""
    kept = _kept(got)
    expect(torch.equal(kept, want), name_mistake(kept, mistakes, atol=0, rtol=0) or hint)
    expect(torch.equal(got[kept], logits[kept]), "kept logits must keep their values unchanged")
    expect(bool((got[~kept] == float("-inf")).all()), "removed tokens must be exactly -inf (probability 0), not 0")


def _expect_single_row(fn, knob, reference, hint: str) -> None:
    """The filter on one row [V] keeps what ``reference`` keeps."""
    expect(torch.equal(_kept(_call_filter(fn, _row(), knob)), _kept(reference(_row(), knob))),
           f"on a single row [V] {hint}")


# ------------------------------------------------------------------ 7.1 (debug): temperature
def probs_at_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The fixed version of the chapter's buggy cell: logits [..., V] -> probabilities [..., V]."""
    return torch.softmax(logits / temperature, dim=-1)


@check("7.1", "probs_at_temperature", reference=probs_at_temperature)
def check_probs_at_temperature(fn):
    """``fn(logits [..., V], temperature > 0) -> probs [..., V]``; rejects a temperature applied after softmax."""
    logits = _logits(rows=3, vocab=5)  # B != V catches a softmax over the wrong dimension
    for t in (1.0, 0.5, 2.0, 0.1):
        got = torch.as_tensor(fn(logits.clone(), t))
        expect(tuple(got.shape) == (3, 5), f"expected shape (3, 5) (one distribution per row), got {tuple(got.shape)}")
        expect(bool((got >= 0).all()), "probabilities cannot be negative: apply softmax to the scaled logits")
        expect(torch.allclose(got.sum(-1), torch.ones(3), atol=1e-5), f"at temperature {t} the rows do not sum to 1: "
               "the result must be a distribution, so the softmax over the last dimension (dim=-1) comes last")
        expect_close(got, torch.softmax(logits / t, dim=-1), f"wrong probabilities at temperature {t}: "
                     "softmax(logits / temperature) over the vocabulary", mistakes=[
            (f"at temperature {t} you return the same distribution as at temperature 1: dividing the probabilities by "
             "the temperature and renormalising cancels out; divide the LOGITS, before the softmax",
             torch.softmax(logits, dim=-1)),
            (f"with temperature {t} you multiplied the logits by it: divide by the temperature instead",
             torch.softmax(logits * t, dim=-1)),
        ])
    got = torch.as_tensor(fn(_row(), 0.5))
    expect(tuple(got.shape) == (5,),
           f"a single row of logits [V] should give [V] probabilities, got {tuple(got.shape)}")
    expect_close(got, torch.softmax(_row() / 0.5, dim=-1), "wrong probabilities for a single row [V]")


# ------------------------------------------------------------------ 7.2 (build): top-k
@check("7.2", "top_k_filter", reference=top_k_filter)
def check_top_k_filter(fn):
    """``fn(logits [..., V], k) -> logits [..., V]`` with all but the k largest of each row at
    -inf."""
    logits = _logits()
    vocab = logits.size(-1)
    for k in (1, 3, vocab):
        got = _call_filter(fn, logits, k)
        n_kept = _kept(got).sum(-1)
        zeros = bool((n_kept == vocab).all()) and bool(((got == 0).sum(-1) >= vocab - k).all())
        expect(k == vocab or not zeros, _NOT_ZERO)
        expect(bool((n_kept == k).all()), f"with k={k} every row must keep exactly {k} tokens, kept {n_kept.tolist()}")
        _expect_kept(got, logits, _kept(top_k_filter(logits, k)), f"with k={k} you kept the wrong "
                     "tokens: keep the k LARGEST logits of each row (torch.topk)")
    big = expect_runs(_call_filter, fn, logits, vocab + 5, errors=(RuntimeError, IndexError),
                      hint="k larger than the vocabulary must keep every token, but your code "
                           "failed: use min(k, V) tokens")
    expect(torch.equal(big, logits), "k larger than the vocabulary must keep every token, unchanged")
    ties = torch.tensor([[1.0, 3.0, 2.0, 2.0, 2.0]])
    kept = int(_kept(_call_filter(fn, ties, 2)).sum())
    expect(kept == 2, f"with logits [1, 3, 2, 2, 2] and k=2 you kept {kept} tokens: comparing against the k-th value "
           "keeps every tie; put the values of the k positions torch.topk returns back into a row of -inf, so exactly "
           "k survive")
    _expect_single_row(fn, 2, top_k_filter, "= [2, 1, 0.5, 0, -1] with k=2 keep the first two: work along the last "
                                            "dimension (dim=-1)")


# ------------------------------------------------------------------ 7.3 (build): top-p
@check("7.3", "top_p_filter", reference=top_p_filter)
def check_top_p_filter(fn):
    """``fn(logits [..., V], p) -> logits [..., V]`` with everything outside the nucleus at -inf."""
    logits = _logits(rows=4, vocab=12, seed=3)
    probs = torch.softmax(logits.double(), -1)
    top = logits.argmax(-1, keepdim=True)
    outputs = {p: _call_filter(fn, logits, p) for p in (0.9, 0.5, 0.3, 0.05)}
    wanted = {p: _kept(top_p_filter(logits, p)) for p in outputs}
    # most specific mistakes first: each pass looks at every p before the next kind of mistake
    sorted_probs = probs.sort(dim=-1, descending=True).values
    for p, got in outputs.items():
        in_sorted_order = sorted_probs.cumsum(-1) - sorted_probs < p  # the decision, never put back
        expect(not torch.equal(_kept(got), in_sorted_order) or torch.equal(in_sorted_order, wanted[p]),
               f"with p={p} you applied the decision made in SORTED order to the tokens in vocabulary order: put it "
               "back where each token came from (the permutation torch.sort returns)")
    for p, got in outputs.items():
        carry = "keep the token that carries the running total across p"
        before = " (compare the mass BEFORE each token with p, not the total including it)"
        expect(bool(_kept(got).any(-1).all()),
               f"with p={p} a row kept no token at all, so there is nothing to sample: {carry}{before}")
        mass = (probs * _kept(got)).sum(-1)
        expect(bool((mass >= p - 1e-6).all()),
               f"with p={p} the kept tokens hold only {mass.min():.3f}: {carry} too{before}")
    for p, got in outputs.items():
        expect(bool(_kept(got).gather(-1, top).all()), f"with p={p} a row lost its most likely token: sort the "
               "probabilities largest first before the running total, so the top token (mass 0 before it) always "
               "survives")
    for p, got in outputs.items():
        n_kept, n_want = int(_kept(got).sum()), int(wanted[p].sum())
        expect(n_kept <= n_want, f"with p={p} you kept {n_kept} tokens where the nucleus has {n_want}: stop at the "
                                 "first token where the running total reaches p")
        _expect_kept(got, logits, wanted[p], f"with p={p} you kept the wrong tokens: keep a prefix of the tokens "
                     "sorted largest first, then put the decision back in vocabulary order")
    # p = 1: the whole distribution, even a tail whose running total rounds to 1 before it ends
    tail = torch.tensor([[40.0, 0.0, -1.0, -2.0, -3.0]])  # the tail's probabilities are ~1e-18
    kept = int(_kept(_call_filter(fn, tail, 1.0)).sum())
    expect(kept == 5, f"p = 1 must keep every token with a probability above 0, but you kept {kept} of 5 on a row "
           "whose tail is tiny: the running total reaches 1.0 by rounding before the tail; treat p = 1 as 'nothing to "
           "drop'")
    _expect_single_row(fn, 0.6, top_p_filter, "you kept the wrong tokens: sort, sum and softmax along the last "
                                              "dimension (dim=-1)")


# ------------------------------------------------------------------ 7.4 (predict): the cache's work
PROMPT_TOKENS, NEW_TOKENS = 7, 40


@check("7.4", "my_prediction")
def check_predict_cached_work(fn):
    """``fn() -> (forward passes, positions fed)`` for 40 new tokens after a 7-token prompt, with the cache."""
    got = fn()
    expect(isinstance(got, tuple | list) and len(got) == 2,
           "return a pair of whole numbers: (forward passes, positions fed to the model in all of them)")
    passes, positions = got
    expect(all(isinstance(x, int) and not isinstance(x, bool) for x in got), "both numbers are whole numbers (int)")
    one_per_token = "each forward pass yields the logits for ONE new token, so 40 new tokens need 40 passes"
    expect_answer(passes, NEW_TOKENS, [
        ("one pass too many: the 40th token comes out of the 40th pass, and nothing needs to feed it to the model "
         "afterwards", NEW_TOKENS + 1),
        (one_per_token, 1),
        (one_per_token, PROMPT_TOKENS + NEW_TOKENS),
    ], f"{passes} passes? Each pass gives the next token's logits: one pass per new token")
    prefill_only = PROMPT_TOKENS + NEW_TOKENS - 1
    uncached = sum(PROMPT_TOKENS + i for i in range(NEW_TOKENS))
    expect_answer(positions, prefill_only, [
        (f"{uncached} is the loop WITHOUT the cache (the whole text every pass); with it, the prompt goes through once "
         "and each later pass feeds one position", uncached),
        ("one position too many: the last token chosen is never fed to the model (no later pass needs its key and "
         "value)", prefill_only + 1),
        ("the first pass (the prefill) feeds the whole prompt, 7 positions, not one", NEW_TOKENS),
    ], f"{positions} positions? Count the prefill (the prompt, once), then one position for each later pass")


# ------------------------------------------------------------------ 7.5 (build): the cached loop
def _tiny_gpt(seed: int = 2):
    """A small random GPT (vocabulary 13, block_size 8) whose greedy output depends on its context.

    Weights ~ N(0, 0.5) and an untied head: with GPT-2's small initialisation (and a tied head) a
    random model's greedy text collapses to one repeated token, which would let a wrong loop pass.
    """
    from transformer_course.model import GPT, GPTConfig

    with fresh_rng(seed):
        model = GPT(GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, d_model=16, tie_weights=False))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=g) * 0.5)
    return model.eval()


_prompts = lambda batch=2, length=3, seed=1: torch.randint(0, 13, (batch, length),
                                                           generator=torch.Generator().manual_seed(seed))


def _record_calls(model, fed: list, caches: list):
    """Append the positions fed and the cache passed at every forward call of ``model``; returns the hook's handle."""

    def hook(module, args, kwargs):
        fed.append(int((args[0] if args else kwargs["idx"]).shape[-1]))
        caches.append(args[2] if len(args) > 2 else kwargs.get("cache"))

    return model.register_forward_pre_hook(hook, with_kwargs=True)


_greedy = lambda logits: logits.argmax(-1)
# a rule no loop would pick by itself: proves the loop feeds back what ``choose`` returned
_second_best = lambda logits: logits.topk(2, dim=-1).indices[..., 1]


def _expected(model, window: torch.Tensor, n: int, rule) -> torch.Tensor:
    """Tokens [B, n] of the plain loop (no cache: the whole text every step) with the same rule."""
    seq = window
    with torch.no_grad():
        for _ in range(n):
            seq = torch.cat([seq, rule(model(seq)[0][:, -1, :])[:, None]], dim=1)
    return seq[:, window.size(1):]


def _collect(steps, window: torch.Tensor, n: int, fed: list, tokens: list) -> None:
    """Read the learner's generator ``steps`` into ``tokens`` (one [B] per step, at most n + 1)."""
    B = window.size(0)
    expect(not isinstance(steps, torch.Tensor) and hasattr(steps, "__iter__"), "yield each step's tokens [B] as soon "
           "as they are chosen (a generator: `yield` inside the loop), instead of returning them all at the end")
    for step in iter(steps):
        if not tokens:
            expect(len(fed) == 1, f"your loop ran the model {len(fed)} times before yielding the first token: yield "
                                  "each token as soon as choose has picked it (stream prints it before the next step "
                                  "runs)")
        shape = tuple(step.shape) if isinstance(step, torch.Tensor) else type(step).__name__
        expect(isinstance(step, torch.Tensor) and tuple(step.shape) == (B,),
               f"yield what choose returned, one LongTensor [B] = [{B}] per step, got {shape}")
        tokens.append(step)
        if len(tokens) > n:
            break


def _drive(fn, model, window: torch.Tensor, n: int, rule):
    """Run the learner's loop as ``stream`` does; returns (tokens [B, n'], positions fed per pass,
    caches passed, shapes of the logits given to choose)."""
    shapes, fed, caches, tokens = [], [], [], []

    def choose(logits):
        shapes.append(tuple(logits.shape))
        return rule(logits)

    handle = _record_calls(model, fed, caches)
    try:
        with torch.no_grad():
            _collect(fn(model, window.clone(), n, choose), window, n, fed, tokens)
    except NotImplementedError:
        raise  # the student edition's stub: "not done"
    except (ValueError, IndexError, RuntimeError) as error:
        said = f"{type(error).__name__}: {error}"
        expect(len(tokens) < n, f"after yielding all {n} tokens your loop ran the model once more and failed "
                                f"({said}): stop after the last token; no pass needs it, and when the window is full "
                                "there is no room for it")
        expect(False, f"your loop failed ({said}): after the prefill feed only the newest token, [B, 1], with the "
                      "same cache; the cache already holds the keys and values of the rest")
    finally:
        handle.remove()
    out = torch.stack(tokens, dim=1) if tokens else window.new_zeros(window.size(0), 0)
    return out, fed, caches, shapes


@check("7.5", "decode_with_cache", reference=decode_with_cache)
def check_decode_with_cache(fn):
    """``fn(model, window [B, T], n, choose)`` yields n tokens [B]: a prefill, then one position per step."""
    model = _tiny_gpt(seed=3)
    window = _prompts(seed=1)  # [2, 3]
    T, n = window.size(1), 6  # 3 + 6 - 1 = 8 = block_size: the window just fills the context
    got, fed, caches, shapes = _drive(fn, model, window, n, _greedy)
    expect(len(fed) > 0, "your loop never ran the model: run the window through it first (the prefill)")
    expect(fed[0] >= T, f"the first forward pass fed {fed[0]} position(s): it must be the prefill, the whole window "
                        f"({T} positions) through the model with the empty cache")
    expect(got.size(1) == n, f"with n={n} your loop yielded {got.size(1)} tokens: one per step, {n} in all")
    expect(all(shape == (window.size(0), 13) for shape in shapes), "choose takes the LAST position's logits, [B, V] = "
           f"[{window.size(0)}, 13] (logits[:, -1, :]), got {shapes[:1]}")
    expect(len(shapes) == n, f"call choose exactly once per step ({n} times), not {len(shapes)}: a sampling rule draws "
                             "a random number at each call, so extra calls change the text")
    if not torch.equal(got, _expected(model, window, n, _greedy)):
        expect(all(c is not None and c is caches[0] for c in caches), "pass the SAME cache on every call, model(new, "
               "cache=cache, ...): without it (or with a fresh one each step) the newest token is numbered position 0 "
               "and sees none of the tokens before it")
        expect(sum(fed) <= T + n - 1, "feed only the token chosen last after the prefill: feeding the whole sequence "
                                      "again appends its keys a second time and numbers the positions wrongly")
        expect(False, "your tokens differ from the plain loop's: prefill the window, then feed each chosen token "
                      "[B, 1] with the same cache")
    expect(sum(fed) == T + n - 1 and len(fed) == n, f"the tokens are right, but your loop fed the model {sum(fed)} "
           f"positions in {len(fed)} passes where a cached loop needs {T + n - 1} in {n} (the window once, then one "
           "token per step): pass cache= and feed only the token chosen last")
    expect(torch.equal(_drive(fn, model, window, n, _second_best)[0], _expected(model, window, n, _second_best)),
           "with a choose that does not pick the most likely token your tokens are wrong: yield and feed back exactly "
           "what choose returned (not an argmax of your own)")
    one_full = _prompts(batch=1, length=8, seed=5)  # a full window: one token, from the prefill
    got3, fed3, _, _ = _drive(fn, model, one_full, 1, _greedy)
    expect(fed3 == [8] and torch.equal(got3, _expected(model, one_full, 1, _greedy)), "with a full window (8 "
           f"positions) and n=1 the loop must run exactly one pass, the prefill, and yield its token; yours fed {fed3}")


# ------------------------------------------------------------------ 7.6 (extend): min-p
def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Reference for the extension: keep tokens whose probability is at least ``min_p`` times the row's top one."""
    probs = torch.softmax(logits.float(), dim=-1)
    bar = min_p * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < bar, float("-inf"))


@check("7.6", "min_p_filter", reference=min_p_filter)
def check_min_p_filter(fn):
    """``fn(logits [..., V], min_p in [0, 1]) -> logits [..., V]``: tokens below min_p x top probability at -inf."""
    # a confident row (top probability 0.72) and a flat one (0.30): the bar is relative to EACH row's top
    logits = torch.cat([_logits(rows=1, vocab=10, seed=4), _logits(rows=1, vocab=10, seed=5) * 0.3])
    probs = torch.softmax(logits, -1)
    for min_p in (0.1, 0.05, 0.3):
        got = _call_filter(fn, logits, min_p)
        kept, want = _kept(got), probs >= min_p * probs.amax(-1, keepdim=True)
        expect(not (bool(kept.all()) and bool((got[~want] == 0).all()) and not bool(want.all())), _NOT_ZERO)
        _expect_kept(got, logits, want, f"with min_p={min_p} you kept the wrong tokens: keep those whose probability "
                     "is at least min_p times the row's top probability", [
            (f"with min_p={min_p} you compared each probability with min_p itself: the bar is min_p TIMES the row's "
             "top probability, so it rises when the model is sure and falls when it is not", probs >= min_p),
            (f"with min_p={min_p} you used one top probability for the whole batch: take each row's own maximum "
             "(amax over dim=-1, keepdim=True)", probs >= min_p * probs.amax()),
            (f"with min_p={min_p} you compared logits: the rule is about probabilities (softmax first); in logits it "
             "reads logit >= top logit + log(min_p)", logits >= min_p * logits.amax(-1, keepdim=True)),
        ])
    expect(torch.equal(_call_filter(fn, logits, 0.0), logits), "min_p = 0 must keep every token, unchanged")
    ties = torch.tensor([[2.0, 2.0, 0.0, -1.0]])
    kept = _kept(_call_filter(fn, ties, 1.0))
    expect(kept.tolist() == [[True, True, False, False]],
           "min_p = 1 keeps exactly the tokens tied for the top probability (>= the bar, not >)")
    _expect_single_row(fn, 0.3, min_p_filter, "you kept the wrong tokens: take the softmax and the maximum along "
                                              "the last dimension")
