"""Tests for transformer_course.generation (chapter 07): sampling knobs, the loop, the KV cache,
streaming text and the `generate` command.

References: Hugging Face's logits warpers (temperature, top-k, top-p), a naive uncached loop written
here, hand-worked distributions, sampling frequencies over many draws, and `tokenizer.decode`.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_course.generation import (
    decode_stream,
    next_token_probs,
    sample_next,
    top_k_filter,
    top_p_filter,
)

hf = pytest.importorskip("transformers.generation.logits_process")

def _rows(seed: int, rows: int = 4, vocab: int = 50, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale


# ------------------------------------------------------------------ temperature
@pytest.mark.parametrize("t", [0.1, 0.7, 1.0, 1.5, 10.0])
def test_temperature_matches_hugging_face(t):
    logits = _rows(0)
    want = torch.softmax(hf.TemperatureLogitsWarper(t)(None, logits.clone()), -1)
    torch.testing.assert_close(next_token_probs(logits, t), want, rtol=0, atol=0)


def test_temperature_sharpens_and_flattens():
    z = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    top = [next_token_probs(z, t).max().item() for t in (0.25, 0.5, 1.0, 2.0, 8.0)]
    assert top == sorted(top, reverse=True)
    # very low temperature -> (almost) one-hot; very high -> (almost) uniform
    assert next_token_probs(z, 0.01)[0, 0] > 1 - 1e-6
    torch.testing.assert_close(next_token_probs(z, 1e6)[0], torch.full((5,), 0.2), atol=1e-5, rtol=0)


def test_temperature_zero_is_greedy_in_next_token_probs():
    logits = _rows(1)
    probs = next_token_probs(logits, temperature=0)
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))
    assert torch.equal(probs.sum(-1), torch.ones(4)) and torch.equal(probs.max(-1).values, torch.ones(4))
    assert torch.equal(sample_next(logits, temperature=0), logits.argmax(-1))


# ------------------------------------------------------------------ top-k
@pytest.mark.parametrize("k", [1, 2, 7, 50])
def test_top_k_matches_hugging_face_without_ties(k):
    logits = _rows(2)  # continuous random values: no ties
    want = hf.TopKLogitsWarper(k)(None, logits.clone())
    assert torch.equal(top_k_filter(logits, k), want)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-3, 3), min_size=1, max_size=30).map(lambda v: torch.tensor(v, dtype=torch.float32)),
    st.integers(1, 40),
)
def test_top_k_keeps_exactly_k_even_with_ties(row, k):
    out = top_k_filter(row[None], k)[0]
    kept = torch.isfinite(out)
    assert int(kept.sum()) == min(k, row.numel())
    assert torch.equal(out[kept], row[kept])  # kept values unchanged
    if (~kept).any():
        assert row[kept].min() >= row[~kept].max()  # and they are the largest


def test_top_k_larger_than_vocab_keeps_everything():
    logits = _rows(3, vocab=5)
    assert torch.equal(top_k_filter(logits, 100), logits)


# ------------------------------------------------------------------ top-p
def _hf_top_p_kept(logits: torch.Tensor, p: float) -> torch.Tensor:
    return torch.isfinite(hf.TopPLogitsWarper(p, min_tokens_to_keep=1)(None, logits.clone()))


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.01, 0.99))
def test_top_p_matches_hugging_face(seed, p):
    logits = _rows(seed, rows=3, vocab=40)
    ours = torch.isfinite(top_p_filter(logits, p))
    theirs = _hf_top_p_kept(logits, p)
    # the two rules are the same (drop a token when the mass before it, sorted largest first, is >= p,
    # i.e. when it and everything less likely hold <= 1 - p); only float rounding at the boundary differs
    probs = torch.softmax(logits.double(), -1)
    sorted_probs = probs.sort(-1, descending=True).values
    before = sorted_probs.cumsum(-1) - sorted_probs
    borderline = ((before - p).abs() < 1e-5).any(-1)
    assert torch.equal(ours[~borderline], theirs[~borderline])


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.001, 1.0))
def test_top_p_keeps_the_smallest_set_reaching_p(seed, p):
    logits = _rows(seed, rows=1, vocab=30)[0]
    kept = torch.isfinite(top_p_filter(logits, p))
    probs = torch.softmax(logits.double(), -1)
    assert probs[kept].sum() >= p - 1e-12  # reaches p
    assert probs[kept].sum() - probs[kept].min() < p  # without its least likely member it would not
    assert kept[probs.argmax()]  # the top token always survives
    if (~kept).any():
        assert probs[kept].min() >= probs[~kept].max()


def test_top_p_hand_worked():
    # probabilities 0.5, 0.3, 0.15, 0.05 (as log-probabilities): mass before each = 0, 0.5, 0.8, 0.95
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    kept = lambda p: torch.isfinite(top_p_filter(logits, p)).tolist()
    assert kept(0.4) == [True, False, False, False]
    assert kept(0.5) == [True, False, False, False]  # 0.5 reaches 0.5 exactly
    assert kept(0.6) == [True, True, False, False]
    assert kept(0.9) == [True, True, True, False]
    assert kept(1.0) == [True, True, True, True]


def test_top_p_one_keeps_the_tail_despite_rounding():
    logits = torch.cat([torch.tensor([30.0]), torch.zeros(999)])  # a tail of ~1e-13 probabilities
    assert torch.isfinite(top_p_filter(logits, 1.0)).all()


# ------------------------------------------------------------------ sampling frequencies
@pytest.mark.parametrize(
    "settings_",
    [dict(temperature=1.0), dict(temperature=0.7, top_k=4), dict(temperature=1.3, top_p=0.8),
     dict(temperature=0.9, top_k=5, top_p=0.9)],
)
def test_sampling_frequencies_match_probabilities(settings_):
    row = torch.tensor([[1.2, 0.1, 0.9, -0.4, 0.6, -1.5, 0.0, 0.3]])
    target = next_token_probs(row, **settings_)[0]
    n = 100_000
    draws = sample_next(row.expand(n, -1), **settings_, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=8).double() / n
    # 5 standard errors of a frequency (sqrt(p(1-p)/n) <= 0.0016 at n=1e5): fails by chance < 1e-6
    tolerance = 5 * math.sqrt(0.25 / n)
    assert (freq - target.double()).abs().max() < tolerance
    assert freq[target == 0].sum() == 0  # filtered tokens are never drawn


def test_sampling_with_same_seed_is_reproducible():
    logits = _rows(5)
    a = [sample_next(logits, generator=torch.Generator().manual_seed(9)) for _ in range(2)]
    assert torch.equal(a[0], a[1])


def test_sampling_order_is_temperature_then_top_k_then_top_p():
    logits = _rows(6, rows=2, vocab=20)
    t, k, p = 0.6, 8, 0.7
    warped = hf.TopPLogitsWarper(p)(
        None, hf.TopKLogitsWarper(k)(None, hf.TemperatureLogitsWarper(t)(None, logits.clone())))
    torch.testing.assert_close(next_token_probs(logits, t, k, p), torch.softmax(warped, -1), atol=1e-6, rtol=0)


# ------------------------------------------------------------------ bad settings
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(temperature=-0.1), r"temperature must be a finite number >= 0, got -0.1: 0 means greedy"),
        (dict(temperature=float("nan")), r"temperature must be a finite number"),
        (dict(temperature=float("inf")), r"temperature must be a finite number"),
        (dict(temperature=True), r"temperature must be a finite number"),
        (dict(top_k=0), r"top_k must be a whole number >= 1"),
        (dict(top_k=2.5), r"top_k must be a whole number >= 1"),
        (dict(top_p=0.0), r"top_p must be a finite number > 0 and <= 1"),
        (dict(top_p=1.5), r"top_p must be a finite number > 0 and <= 1"),
        (dict(top_p=-0.2), r"top_p must be a finite number > 0 and <= 1"),
    ],
)
def test_bad_sampling_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        next_token_probs(_rows(0), **kwargs)
    with pytest.raises(ValueError, match=match):
        sample_next(_rows(0), **kwargs, generator=torch.Generator())


def test_filters_refuse_a_bad_knob():
    with pytest.raises(ValueError, match=r"k must be a whole number >= 1, got 0"):
        top_k_filter(_rows(0), 0)
    with pytest.raises(ValueError, match=r"p must be a finite number > 0 and <= 1, got 1.5: the probability mass"):
        top_p_filter(_rows(0), 1.5)


def test_a_temperature_that_overflows_points_to_greedy():
    with pytest.raises(ValueError, match="too small for these logits.*use 0 for greedy"):
        next_token_probs(_rows(0), 1e-40)


@pytest.mark.parametrize("temperature", [0, 1.0])
@pytest.mark.parametrize("bad", ["nan", "+inf", "all -inf"])
def test_logits_without_a_distribution_are_refused_even_greedy(temperature, bad):
    logits = _rows(0)
    if bad == "all -inf":
        logits[1] = float("-inf")
    else:
        logits[1, 3] = float(bad.replace("+", ""))
    with pytest.raises(ValueError, match="NaN or \\+inf, or a row that is all -inf"):
        sample_next(logits, temperature, generator=torch.Generator())
    with pytest.raises(ValueError, match="NaN or \\+inf, or a row that is all -inf"):
        next_token_probs(logits, temperature)


def test_sampling_needs_an_explicit_generator():
    with pytest.raises(ValueError, match=r"sampling needs a generator, got None: pass generator=torch.Generator"):
        sample_next(_rows(0), temperature=1.0)
    assert torch.equal(sample_next(_rows(0), temperature=0), _rows(0).argmax(-1))  # greedy draws nothing


# ------------------------------------------------------------------ the loop and the KV cache
from transformer_course.generation import encode_prompt, generate, stream  # noqa: E402

model_module = pytest.importorskip("transformer_course.model")
GPT, GPTConfig = model_module.GPT, model_module.GPTConfig


def _model(seed: int = 0, **overrides):
    kw = dict(vocab_size=17, block_size=12, n_layer=2, n_head=2, d_model=24)
    kw.update(overrides)
    torch.manual_seed(seed)
    return GPT(GPTConfig(**kw)).eval()


def _prompt(batch: int = 2, length: int = 4, seed: int = 0, vocab: int = 17) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def _naive(model, idx, n, temperature, generator):
    """An independent uncached loop: softmax(logits / T) and torch.multinomial, or argmax at T = 0."""
    block = model.cfg.block_size
    with torch.no_grad():
        for _ in range(n):
            logits = model(idx[:, -block:])[0][:, -1]
            if temperature == 0:
                nxt = logits.argmax(-1)
            else:
                nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]
            idx = torch.cat([idx, nxt[:, None]], 1)
    return idx


SAMPLING = [
    dict(temperature=0),
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=5),
    dict(temperature=1.2, top_p=0.8),
    dict(temperature=0.9, top_k=8, top_p=0.9),
]
MODELS = [
    dict(),
    dict(positional="sinusoidal"),
    dict(fast=False),
    dict(norm="post", bias=False, tie_weights=False),
]


@pytest.mark.parametrize("sampling", SAMPLING, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.parametrize("overrides", MODELS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_cache_changes_nothing_even_past_block_size(sampling, overrides):
    model = _model(**overrides)
    idx = _prompt()
    n = 3 * model.cfg.block_size  # far past block_size: the window slides and the cache is rebuilt
    runs = [generate(model, idx, n, use_cache=c, generator=torch.Generator().manual_seed(4), **sampling)
            for c in (True, False)]
    assert runs[0].shape == (2, 4 + n)
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize("crop_to", [1, 5, 11, 12])
def test_cache_changes_nothing_with_crop_to(crop_to):
    model = _model(1)
    idx = _prompt(seed=1)
    runs = [
        generate(model, idx, 40, temperature=1.0, use_cache=c, crop_to=crop_to,
                 generator=torch.Generator().manual_seed(2))
        for c in (True, False)
    ]
    assert torch.equal(*runs)


@pytest.mark.parametrize("temperature", [0, 1.0, 0.6])
def test_generate_matches_an_independent_loop(temperature):
    model = _model(2)
    idx = _prompt(seed=2)
    ours = generate(model, idx, 30, temperature=temperature, generator=torch.Generator().manual_seed(8))
    theirs = _naive(model, idx, 30, temperature, torch.Generator().manual_seed(8))
    assert torch.equal(ours, theirs)


def test_cached_logits_match_full_recompute():
    model = _model(3)
    seq = _prompt(seed=3, length=10)
    cache = model.new_cache()
    with torch.no_grad():
        full = model(seq)[0]
        steps = [model(seq[:, :4], cache=cache)[0]] + [model(seq[:, t : t + 1], cache=cache)[0] for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    assert sum(layer.nbytes for layer in cache) == 2 * 2 * 2 * 10 * 24 * 4  # kv x layers x B x L x C x 4 bytes


def test_long_prompt_is_cropped_to_block_size():
    model = _model(4)
    idx = _prompt(length=30, seed=4)  # longer than block_size = 12
    out = generate(model, idx, 5, temperature=0)
    assert torch.equal(out[:, :30], idx)
    assert torch.equal(out, _naive(model, idx, 5, 0, None))


def test_batch_rows_equal_single_runs_when_greedy():
    model = _model(5)
    idx = _prompt(batch=3, seed=5)
    together = generate(model, idx, 20, temperature=0)
    for i in range(3):
        assert torch.equal(together[i : i + 1], generate(model, idx[i : i + 1], 20, temperature=0))


def test_eos_stops_and_pads_finished_rows():
    model = _model(6)
    idx = _prompt(batch=4, seed=6)
    free = generate(model, idx, 40, temperature=1.0, generator=torch.Generator().manual_seed(0))
    eos = int(free[0, 4])  # row 0 produces this token at its first step
    out = generate(model, idx, 40, temperature=1.0, generator=torch.Generator().manual_seed(0), eos_id=eos)
    new = out[:, 4:]
    for row, free_row in zip(new, free[:, 4:], strict=True):
        hits = (free_row == eos).nonzero()
        if len(hits):  # the row ends at its first eos and is padded with eos after it
            first = int(hits[0])
            assert torch.equal(row[: first + 1], free_row[: first + 1])
            assert bool((row[first:] == eos).all())
        else:  # same random draws as the free run
            assert torch.equal(row, free_row[: len(row)])
    finished_all = all(bool((r == eos).any()) for r in new)
    assert out.shape[1] < 44 if finished_all else out.shape[1] == 44


def test_eos_stops_early_when_every_row_finishes():
    model = _model(7)
    idx = _prompt(batch=1, seed=7)
    greedy = generate(model, idx, 10, temperature=0)
    eos = int(greedy[0, 6])  # the third generated token
    out = generate(model, idx, 10, temperature=0, eos_id=eos)
    first = int((greedy[0, 4:] == eos).nonzero()[0]) + 4
    assert torch.equal(out, greedy[:, : first + 1])


def test_stream_yields_what_generate_returns():
    model = _model(8)
    idx = _prompt(seed=8)
    steps = list(stream(model, idx, 15, temperature=0.8, generator=torch.Generator().manual_seed(1)))
    assert all(s.shape == (2,) and s.dtype == torch.long for s in steps)
    full = generate(model, idx, 15, temperature=0.8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.stack(steps, 1), full[:, 4:])


def test_zero_new_tokens_returns_the_prompt():
    model = _model(9)
    idx = _prompt(seed=9)
    assert torch.equal(generate(model, idx, 0), idx)


def test_generation_is_deterministic_with_dropout_and_restores_training_mode():
    model = _model(10, dropout=0.5).train()
    idx = _prompt(seed=10)
    a = generate(model, idx, 10, temperature=0)
    b = generate(model, idx, 10, temperature=0)
    assert torch.equal(a, b)  # dropout is off while generating
    assert model.training  # and the mode is put back


def test_generate_does_not_track_gradients():
    model = _model(11)
    out = generate(model, _prompt(seed=11), 3)
    assert not out.requires_grad


def test_stream_turns_autograd_off_only_inside_a_step():
    model = _model(11)
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(torch.is_grad_enabled()))
    for _ in stream(model, _prompt(seed=11), 5, temperature=0, use_cache=False):
        assert torch.is_grad_enabled()  # the caller's code between two tokens
    assert seen == [False] * 5  # every forward pass


@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_never_touches_the_global_random_state(use_cache):
    model, idx = _model(13), _prompt(seed=13)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = generate(model, idx, 20, temperature=1.0, top_p=0.9, use_cache=use_cache)  # no generator given
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(456)  # another global state: the same text
    assert torch.equal(generate(model, idx, 20, temperature=1.0, top_p=0.9, use_cache=use_cache), first)
    # the default is a fresh generator seeded with 0
    seeded = generate(model, idx, 20, temperature=1.0, top_p=0.9, generator=torch.Generator().manual_seed(0))
    assert torch.equal(first, seeded)
    assert not torch.equal(first, generate(model, idx, 20, temperature=1.0, top_p=0.9,
                                           generator=torch.Generator().manual_seed(1)))


# ------------------------------------------------------------------ bad requests
@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m: generate(m, torch.zeros(1, 0, dtype=torch.long), 3), "the prompt is empty"),
        (lambda m: generate(m, torch.zeros(0, 3, dtype=torch.long), 3), "the prompt is empty"),
        (lambda m: generate(m, torch.tensor([1, 2, 3]), 3), r"2-D \[B, T\].*idx\[None\]"),
        (lambda m: generate(m, torch.tensor([[1.0, 2.0]]), 3), "LongTensor"),
        (lambda m: generate(m, [[1, 2]], 3), "LongTensor"),
        (lambda m: generate(m, torch.tensor([[1, 17]]), 3), r"token id 17 is outside the model's vocabulary 0..16"),
        (lambda m: generate(m, torch.tensor([[-1, 2]]), 3), "token id -1 is outside"),
        (lambda m: generate(m, torch.tensor([[1, 2]]), -1), "max_new_tokens must be a whole number >= 0"),
        (lambda m: generate(m, torch.tensor([[1, 2]]), 2.5), "max_new_tokens must be a whole number >= 0"),
        (lambda m: generate(m, torch.tensor([[1, 2]]), 3, temperature=-1), "got -1: 0 means greedy"),
        (lambda m: generate(m, torch.tensor([[1, 2]]), 3, top_k=0), "top_k must be"),
        (lambda m: generate(m, torch.tensor([[1, 2]]), 3, top_p=0), r"top_p must be a finite number > 0 and <= 1"),
        (lambda m: generate(m, torch.tensor([[1, 2]]), 3, eos_id=99),
         r"eos_id must be a whole number >= 0 and <= 16 \(or None\)"),
        (lambda m: generate(m, torch.tensor([[1, 2]]), 3, eos_id=True), "eos_id must be a whole number.*got True"),
        (lambda m: generate(m, torch.tensor([[1, 2]]), 3, crop_to=0),
         "crop_to must be a whole number >= 1 and <= 12.*block_size=12"),
        (lambda m: generate(m, torch.tensor([[1, 2]]), 3, crop_to=13), "crop_to must be"),
        (lambda m: generate(m, torch.tensor([[1, 2]]), 3, use_cache="no"), "use_cache must be True or False"),
        (lambda m: generate(m, torch.tensor([[1, 2]]), 3, generator=7),
         r"generator must be a torch.Generator.*manual_seed"),
        # a model on another device (meta stands in for a GPU here; tests/test_gpu.py tries CUDA)
        (lambda m: generate(m.to("meta"), torch.tensor([[1, 2]]), 3),
         r"the prompt is on cpu but the model on meta: .*idx\.to\('meta'\)"),
        (lambda m: stream(m, torch.tensor([[1, 2]]), -2), "max_new_tokens"),  # raised at the call, not at next()
    ],
)
def test_bad_requests_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call(_model())


# ------------------------------------------------------------------ streaming text
def _bpe(vocab_size: int = 300):
    from transformer_course.tokenization import BPETokenizer

    text = "café crème brûlée, naïve façade; ½ € 👋 日本語 " * 20
    return BPETokenizer.train(text, vocab_size)


@pytest.mark.parametrize("vocab_size", [256, 300])
def test_decode_stream_gives_whole_characters_with_bpe(vocab_size):
    tok = _bpe(vocab_size)
    text = "Une crème brûlée, s'il vous plaît: 👋 日本語 ½ €"
    ids = tok.encode(text)
    pieces = list(decode_stream(tok, ids))
    assert "".join(pieces) == tok.decode(ids) == text
    assert len(pieces) == len(ids) and "\ufffd" not in "".join(pieces)
    one_by_one = "".join(tok.decode([i]) for i in ids)
    assert vocab_size > 256 or "\ufffd" in one_by_one  # what decoding each token alone would print


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 255), max_size=40))
def test_decode_stream_joins_to_decode_for_any_bytes(ids):
    tok = _bpe(256)  # no merges: every id is one byte, so any list of ids is any byte string
    assert "".join(decode_stream(tok, ids)) == tok.decode(ids)


def test_decode_stream_with_a_character_tokenizer():
    from transformer_course.tokenization import CharTokenizer

    tok = CharTokenizer.from_text("héllo wörld")
    ids = tok.encode("wörld héllo")
    assert list(decode_stream(tok, ids)) == list("wörld héllo")
    assert list(decode_stream(tok, torch.tensor(ids))) == list("wörld héllo")  # tensor ids too


def test_encode_prompt():
    from transformer_course.tokenization import CharTokenizer

    tok = CharTokenizer.from_text("abc \n")  # chars sorted: "\n", " ", "a", "b", "c"
    assert torch.equal(encode_prompt(tok, "ab c"), torch.tensor([[2, 3, 1, 4]]))
    for bad in ("", None, ["a"]):
        with pytest.raises(ValueError, match="the prompt is empty or not a str"):
            encode_prompt(tok, bad)
    with pytest.raises(ValueError, match=r"characters the tokenizer does not know: 'Zx'.*remove or replace"):
        encode_prompt(tok, "abxZ")


# ------------------------------------------------------------------ against Hugging Face's generate
def test_greedy_generation_matches_hugging_face(tmp_path):
    """A random GPT-2 in Hugging Face's layout: our greedy tokens (with and without the cache) equal
    transformers' `generate(do_sample=False)` with its own KV cache."""
    pretrained = pytest.importorskip("transformer_course.pretrained")
    hf_model = pretrained.make_hf_stand_in(vocab_size=97, n_positions=48, n_embd=32, n_layer=2, n_head=4, seed=3)
    hf_model.save_pretrained(tmp_path)
    ours = pretrained.from_pretrained(str(tmp_path))
    idx = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = hf_model.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=30, do_sample=False,
                                 pad_token_id=0, use_cache=True)
    for use_cache in (True, False):
        assert torch.equal(generate(ours, idx, 30, temperature=0, use_cache=use_cache), want)


# ------------------------------------------------------------------ the command line
def _saved(tmp_path):
    from transformer_course.checkpoint import save_checkpoint
    from transformer_course.tokenization import CharTokenizer

    tok = CharTokenizer.from_text("abcdefg hij\n")
    model = _model(12, vocab_size=tok.vocab_size)
    return save_checkpoint(tmp_path / "model.pt", model, tokenizer=tok), model, tok


def test_cli_generate_streams_the_same_text_as_generate(tmp_path, capsys):
    from transformer_course.cli import main

    path, model, tok = _saved(tmp_path)
    argv = ["generate", "--checkpoint", str(path), "--prompt", "abc", "--max-new-tokens", "20", "--seed", "3",
            "--temperature", "0.9", "--top-k", "5", "--top-p", "0.95", "--device", "cpu"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == first  # seeded: reproducible
    want = generate(model, encode_prompt(tok, "abc"), 20, temperature=0.9, top_k=5, top_p=0.95,
                    generator=torch.Generator().manual_seed(3))
    assert first == tok.decode(want[0].tolist()) + "\n"


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--temperature", "-1"], "got -1.0: 0 means greedy"),
        (["--top-k", "0"], "top_k must be"),
        (["--top-p", "1.5"], r"top_p must be a finite number > 0 and <= 1"),
        (["--max-new-tokens", "-1"], "max_new_tokens must be"),
        (["--prompt", ""], "the prompt is empty"),
        (["--prompt", "abZ"], "characters the tokenizer does not know: 'Z'"),
    ],
)
def test_cli_generate_bad_input(tmp_path, capsys, extra, match):
    import re

    from transformer_course.cli import main

    path, _, _ = _saved(tmp_path)
    assert main(["generate", "--checkpoint", str(path), "--prompt", "abc", *extra]) == 2
    assert re.search(match, capsys.readouterr().err)


def test_cli_generate_without_a_seed_is_generate_without_a_generator(tmp_path, capsys):
    from transformer_course.cli import main

    path, model, tok = _saved(tmp_path)
    assert main(["generate", "--checkpoint", str(path), "--prompt", "abc", "--max-new-tokens", "20"]) == 0
    want = generate(model, encode_prompt(tok, "abc"), 20)
    assert capsys.readouterr().out == tok.decode(want[0].tolist()) + "\n"


def test_cli_generate_without_a_checkpoint_uses_the_shipped_model(capsys):
    from transformer_course.cli import main
    from transformer_course.course_model import greedy_sample, load_course_model

    assert main(["generate", "--prompt", "ROMEO:\n", "--max-new-tokens", "30", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == greedy_sample(load_course_model(), "ROMEO:\n", 30) + "\n"


def test_cli_generate_streams_whole_characters_from_a_bpe_checkpoint(tmp_path, capsys):
    from transformer_course.checkpoint import save_checkpoint
    from transformer_course.cli import main

    tok = _bpe(300)
    model = _model(14, vocab_size=tok.vocab_size, block_size=32)
    path = save_checkpoint(tmp_path / "bpe.pt", model, tokenizer=tok)
    argv = ["generate", "--checkpoint", str(path), "--prompt", "café crè", "--max-new-tokens", "40", "--seed", "5"]
    assert main(argv) == 0
    want = generate(model, encode_prompt(tok, "café crè"), 40, generator=torch.Generator().manual_seed(5))
    assert capsys.readouterr().out == tok.decode(want[0].tolist()) + "\n"  # not one token decoded at a time


def test_cli_generate_refuses_a_tokenizer_smaller_than_the_model(tmp_path, capsys):
    from transformer_course.checkpoint import save_checkpoint
    from transformer_course.cli import main
    from transformer_course.tokenization import CharTokenizer

    tok = CharTokenizer.from_text("abcdefg hij\n")  # 12 characters
    path = save_checkpoint(tmp_path / "model.pt", _model(12, vocab_size=17), tokenizer=tok)
    assert main(["generate", "--checkpoint", str(path), "--prompt", "abc"]) == 2
    out = capsys.readouterr()
    assert out.out == ""  # refused before anything is generated
    assert "its tokenizer knows 12 tokens but the model samples from 17" in out.err


def test_cli_generate_into_a_closed_pipe_ends_quietly(tmp_path):
    import subprocess
    import sys

    path, _, _ = _saved(tmp_path)
    cmd = [sys.executable, "-m", "transformer_course", "generate", "--checkpoint", str(path), "--prompt", "abc",
           "--max-new-tokens", "100000", "--device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**__import__("os").environ,
                            "OMP_NUM_THREADS": "1"})
    assert proc.stdout.read(10)  # the reader takes a few characters, then stops, as `head` does
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert err == b""  # no traceback, no "Exception ignored"
    assert proc.returncode == 141


def test_cli_generate_missing_checkpoint(tmp_path, capsys):
    from transformer_course.cli import main

    assert main(["generate", "--checkpoint", str(tmp_path / "nope.pt"), "--prompt", "a"]) == 2
    assert "no checkpoint at" in capsys.readouterr().err
