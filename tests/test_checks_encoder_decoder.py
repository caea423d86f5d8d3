"""Chapter 09's checks accept the reference and name the mistake in planted bugs
(tests/test_checks_all.py runs every check on a stub and on its reference)."""

import math

import pytest
import torch
import torch.nn.functional as F
from check_helpers import assert_rejected

from transformer_course.checks.encoder_decoder import (
    BEAM_CASES,
    BEAM_NARROW,
    _beam_search,
    _memory_mask,
    _small_model,
    check_beam_search,
    check_cross_attention,
    check_memory_mask,
    check_predict_cross_weights_shape,
)
from transformer_course.encoder_decoder import CrossAttention, key_mask
from transformer_course.multihead import merge_heads, split_heads

# ---------------------------------------------------------------- 9.1 predict


def test_predict_right_answer_passes():
    assert check_predict_cross_weights_shape(lambda: (2, 4, 3, 5), quiet=True).passed
    assert check_predict_cross_weights_shape(lambda: torch.Size([2, 4, 3, 5]), quiet=True).passed


@pytest.mark.parametrize("answer, hint", [
    ((2, 4, 5, 3), "rows are the queries"),
    ((2, 4, 3, 3), "not square"),
    ((2, 4, 5, 5), "not square"),
    ((2, 3, 5), "each head has its own weights"),
    ((4, 2, 3, 5), "the batch (2) and the heads (4)"),
    ("2, 4, 3, 5", "tuple of ints"),
])
def test_predict_wrong_answers_are_named(answer, hint):
    assert_rejected(check_predict_cross_weights_shape, lambda: answer, hint)


# ---------------------------------------------------------------- 9.2 build: CrossAttention


class Planted(CrossAttention):
    """CrossAttention.forward written out, with switches for realistic mistakes."""

    kv_from_x = swap_qk = no_mask = no_proj = fast_only = False

    def forward(self, x, memory, mask=None):
        C = self.d_model
        q_rows, k_rows = (
            (slice(C, 2 * C), slice(0, C)) if self.swap_qk else (slice(0, C), slice(C, 2 * C))
        )
        w, b = self.qkv.weight, self.qkv.bias
        kv_in = x if self.kv_from_x else memory
        q = split_heads(F.linear(x, w[q_rows], b[q_rows]), self.n_head)
        k = split_heads(F.linear(kv_in, w[k_rows], b[k_rows]), self.n_head)
        v = split_heads(F.linear(kv_in, w[2 * C :], b[2 * C :]), self.n_head)
        mask = None if self.no_mask else mask
        if (
            self.fast_only
        ):  # PyTorch's kernel called directly: the teaching path's weights are never kept
            y = merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        else:
            y = merge_heads(self.attend(q, k, v, mask))
        return y if self.no_proj else self.proj(y)


def planted(**switches):
    return type("Mistake", (Planted,), switches)


class Causal(CrossAttention):
    """Forgot causal=False: chapter 04's default causal mask (aligned on the last key) is
    applied."""

    def __init__(self, d_model, n_head, dropout=0.0, bias=True, fast=True):
        super().__init__(d_model, n_head, dropout=dropout, bias=bias, fast=fast)
        self.causal = True


class OwnSoftmax(CrossAttention):
    """Its own attention: right on ordinary inputs, NaN for a source that is all padding."""

    def forward(self, x, memory, mask=None):
        C = self.d_model
        w, b = self.qkv.weight, self.qkv.bias
        q = split_heads(F.linear(x, w[:C], b[:C]), self.n_head)
        k, v = (split_heads(t, self.n_head) for t in F.linear(memory, w[C:], b[C:]).split(C, -1))
        scores = q @ k.transpose(-2, -1) / math.sqrt(C // self.n_head)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(-1)
        self.last_weights = weights
        return self.proj(merge_heads(weights @ v))


class Unscaled(OwnSoftmax):
    def forward(self, x, memory, mask=None):
        C = self.d_model
        w, b = self.qkv.weight, self.qkv.bias
        q = split_heads(F.linear(x, w[:C], b[:C]), self.n_head)
        k, v = (split_heads(t, self.n_head) for t in F.linear(memory, w[C:], b[C:]).split(C, -1))
        scores = q @ k.transpose(-2, -1)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return self.proj(merge_heads(scores.softmax(-1).nan_to_num(0.0) @ v))


@pytest.mark.parametrize("candidate, hint", [
    (planted(kv_from_x=True), "keys and values come from the decoder states x"),
    (planted(swap_qk=True), "queries and keys are swapped"),
    (Causal, "a causal mask was applied"),
    (planted(no_mask=True), "padded source positions are attended"),
    (planted(no_proj=True), "finish with self.proj"),
    (planted(fast_only=True), "self.last_weights"),
    (OwnSoftmax, "all padding gives NaN"),
    (Unscaled, "not scaled by 1/sqrt(hs)"),
])
def test_cross_attention_mistakes_are_named(candidate, hint):
    assert_rejected(check_cross_attention, candidate, hint)


def test_cross_attention_falls_back_to_the_package():
    outcome = check_cross_attention(planted(no_proj=True), quiet=True)
    assert outcome.use is CrossAttention and "package's CrossAttention" in outcome.message


# ---------------------------------------------------------------- 9.3 debug: the memory mask


def memory_mask_copied(T, src_keep):  # the chapter's buggy builder, as shown in the notebook
    S = src_keep.shape[1]
    no_peeking = torch.ones(T, S, dtype=torch.bool).tril()
    return no_peeking & key_mask(src_keep)


def test_memory_mask_reference_passes():
    assert check_memory_mask(_memory_mask, quiet=True).passed
    assert check_memory_mask(
        lambda T, keep: key_mask(keep), quiet=True
    ).passed  # [B, 1, 1, S] broadcasts


@pytest.mark.parametrize(
    "candidate, hint",
    [
        (memory_mask_copied, "cross-attention needs no causal mask"),
        (lambda T, keep: ~_memory_mask(T, keep), "inverted"),
        (
            lambda T, keep: torch.ones(keep.shape[0], 1, T, keep.shape[1], dtype=torch.bool),
            "padded source positions are visible",
        ),
        (lambda T, keep: _memory_mask(T, keep).float(), "bool mask"),
        (lambda T, keep: keep[:, None, :].expand(-1, T, -1), "must broadcast to [B, 1, T, S]"),
    ],
)
def test_memory_mask_mistakes_are_named(candidate, hint):
    assert_rejected(check_memory_mask, candidate, hint)


# ---------------------------------------------------------------- 9.4 extend: beam search


def test_beam_search_reference_passes():
    assert check_beam_search(_beam_search, quiet=True).passed


def test_beam_cases_are_ones_where_greedy_is_not_the_best():
    for seed, source in BEAM_CASES:
        model, src = _small_model(seed), torch.tensor(source)
        greedy = model.greedy_decode(src, 1, 2, max_new_tokens=3)[0].tolist()
        assert _beam_search(model, src, 1, 2, beam_size=100, max_new_tokens=3)[0] != greedy


@torch.no_grad()
def _variant(model, src, bos, eos, beam_size, max_new_tokens, *, keep_width, all_eos):
    """Other common ways to write beam search: `keep_width` keeps beam_size unfinished hypotheses
    (finished ones take no place in the beam); `all_eos` finishes every extension by eos, not only
    the best ones."""
    memory, keep = model.encode(src)
    live, finished = [([bos], 0.0)], []
    for _ in range(max_new_tokens):
        if not live:
            break
        n = len(live)
        logp = model.decode(
            torch.tensor([s for s, _ in live]), memory.expand(n, -1, -1), keep.expand(n, -1)
        )
        logp = logp[:, -1].double().log_softmax(-1)
        ext = sorted(((s + logp[i, t].item(), seq + [t]) for i, (seq, s) in enumerate(live)
                      for t in range(logp.shape[1])), reverse=True)
        finished += [(seq, s) for s, seq in (ext if all_eos else ext[:beam_size]) if seq[-1] == eos]
        unfinished = [
            (seq, s) for s, seq in (ext if keep_width else ext[:beam_size]) if seq[-1] != eos
        ]
        live = unfinished[:beam_size]
    return max(finished or live, key=lambda h: h[1])


def test_another_correct_variant_passes():
    def variant(*args, **kwargs):
        return _variant(*args, **kwargs, keep_width=True, all_eos=False)

    assert check_beam_search(variant, quiet=True).passed


def test_narrow_cases_do_not_depend_on_the_variant():
    for seed, source in BEAM_NARROW:
        model, src = _small_model(seed), torch.tensor(source)
        want = _beam_search(model, src, 1, 2, beam_size=2, max_new_tokens=4)[0]
        for keep_width, all_eos in ((True, False), (True, True), (False, True)):
            got = _variant(model, src, 1, 2, 2, 4, keep_width=keep_width, all_eos=all_eos)[0]
            assert got == want, (seed, keep_width, all_eos)


@torch.no_grad()
def _planted(model, src, bos, eos, beam_size=4, max_new_tokens=11, *, mistake):
    memory, keep = model.encode(src)
    live, finished = [([bos], 0.0)], []
    for _ in range(max_new_tokens):
        if not live:
            break
        n = len(live)
        logp = model.decode(
            torch.tensor([s for s, _ in live]), memory.expand(n, -1, -1), keep.expand(n, -1)
        )
        logp = logp[:, -1].double().log_softmax(-1)
        ext = [
            (s + logp[i, t].item(), logp[i, t].item(), seq + [t])
            for i, (seq, s) in enumerate(live)
            for t in range(logp.shape[1])
        ]
        rank = (lambda e: e[1]) if mistake == "rank by last token" else (lambda e: e[0])
        chosen = sorted(ext, key=rank, reverse=True)[:1 if mistake == "greedy" else beam_size]
        if mistake == "extend finished":  # hypotheses are never stopped at eos
            live = [(seq, s) for s, _, seq in chosen]
        else:
            live = [(seq, s) for s, _, seq in chosen if seq[-1] != eos]
            finished += [(seq, s) for s, _, seq in chosen if seq[-1] == eos]
    ids, score = max(finished or live, key=lambda h: h[1])
    if mistake == "probability":
        score = math.exp(score)
    if mistake == "length normalised":
        score = score / (len(ids) - 1)
    if mistake == "best live":
        ids, score = max(live or finished, key=lambda h: h[1])
    return ids, score


@pytest.mark.parametrize("mistake, hint", [
    ("greedy", "with a beam wide enough to keep every hypothesis"),
    ("best live", "return the best *finished* hypothesis"),
    ("rank by last token", "not the last token's alone"),
    ("probability", "score is a probability"),
    ("length normalised", "divided by the length"),
    ("extend finished", "finished at its first eos_id"),
])
def test_beam_search_mistakes_are_named(mistake, hint):
    assert_rejected(check_beam_search, lambda *a, **k: _planted(*a, **k, mistake=mistake), hint)


def test_narrow_cases_separate_the_right_ranking_from_the_wrong_one():
    for seed, source in BEAM_NARROW:
        model, src = _small_model(seed), torch.tensor(source)
        want = _beam_search(model, src, 1, 2, beam_size=2, max_new_tokens=4)[0]
        wrong = _planted(
            model, src, 1, 2, beam_size=2, max_new_tokens=4, mistake="rank by last token"
        )[0]
        assert want != wrong
