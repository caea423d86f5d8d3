"""Checks for chapter 09's exercises (encoder-decoder and cross-attention). Hand-written; the references of 9.3
(``_memory_mask``) and 9.4 (``_beam_search``) live here: they are not part of the package's API."""

import math

import torch
import torch.nn.functional as F

from ..encoder_decoder import CrossAttention, EncoderDecoder, Seq2SeqConfig, key_mask
from ..multihead import MultiHeadAttention
from ._core import CheckFailed, check, expect, expect_close, expect_tensor, fresh_rng, name_mistake, planted


# ---------------------------------------------------------------- 9.1 predict: the weights' shape
@check("9.1", "my_prediction")
def check_predict_cross_weights_shape(fn):
    """``fn() -> (B, nh, T, S)`` for B 2, 4 heads, 3 decoder and 5 encoder positions."""
    got = fn()
    expect(isinstance(got, tuple | list | torch.Size) and all(isinstance(d, int) for d in got),
           "return the shape as a tuple of ints, e.g. (1, 2, 3, 4)")
    got = tuple(got)
    expect(len(got) != 3, "each head has its own weights: the shape has four numbers, [batch, heads, ..., ...]")
    expect(len(got) == 4, f"four numbers: [batch, heads, queries, keys], got {len(got)}")
    expect(got[:2] == (2, 4), f"the first two numbers are the batch (2) and the heads (4), got {got[:2]}")
    square = ("not square: the queries come from the decoder (3 positions) and the keys from the encoder (5)")
    expect(got == (2, 4, 3, 5), name_mistake(got, [
        ("rows are the queries and columns the keys: the queries come from the decoder "
         "(3 positions), the keys from the encoder (5 positions)", (2, 4, 5, 3)),
        (square, (2, 4, 3, 3)),
        (square, (2, 4, 5, 5)),
    ]) or f"{got} is not the shape: one weight per batch item, head, query and key")


# ---------------------------------------------------------------- 9.2 build: CrossAttention
def _cross(attn, x, memory, mask=None, *, kv_from_x=False, order="qkv", causal=False,
           use_mask=True, proj=True, scale=True):
    """CrossAttention's output computed from `attn`'s parameters, with one mistake switched on at
    will (keys and values from x: the source's padding mask cannot apply, so it is left out)."""
    C, nh = attn.d_model, attn.n_head
    w, b = attn.qkv.weight, attn.qkv.bias
    rows = dict(zip(order, (slice(0, C), slice(C, 2 * C), slice(2 * C, 3 * C)), strict=True))
    q_in, kv_in = x, (x if kv_from_x else memory)
    use_mask = use_mask and not kv_from_x

    def heads(t, part):
        y = F.linear(t, w[rows[part]], None if b is None else b[rows[part]])  # (B, L, C)
        return y.view(t.shape[0], t.shape[1], nh, C // nh).transpose(1, 2)  # (B, nh, L, hs)

    q, k, v = heads(q_in, "q"), heads(kv_in, "k"), heads(kv_in, "v")
    scores = q @ k.transpose(-2, -1) / (math.sqrt(C // nh) if scale else 1.0)  # (B, nh, T, S)
    T, S = scores.shape[-2:]
    allowed = torch.ones(T, S, dtype=torch.bool)
    # "top": the decoder's triangle copied; "bottom": chapter 04's, aligned on the last key
    if causal:
        allowed = allowed.tril() if causal == "top" else allowed.tril(S - T)
    if mask is not None and use_mask:
        allowed = allowed & mask
    allowed = allowed.expand_as(scores)
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
    y = (weights @ v).transpose(1, 2).reshape(q_in.shape[0], q_in.shape[1], C)  # (B, T, C)
    return attn.proj(y) if proj else y


_CAUSAL = ("a causal mask was applied: cross-attention has none, every decoder position may read "
           "the whole source (the class is built with causal=False; add no triangle)")
_MISTAKES = [  # (hint, the switch that makes _cross commit it)
    ("the keys and values come from the decoder states x: they must come from memory (the "
     "encoder output), only the queries from x", dict(kv_from_x=True)),
    ("queries and keys are swapped: qkv's rows are [q | k | v], the first C rows are W_q", dict(order="kqv")),
    ("keys and values are swapped: rows C..2C of qkv are W_k, rows 2C..3C are W_v", dict(order="qvk")),
    (_CAUSAL, dict(causal="top")),
    (_CAUSAL, dict(causal="bottom")),
    ("padded source positions are attended: pass `mask` on to the attention", dict(use_mask=False)),
    ("the heads are merged but not projected: finish with self.proj (and self.resid_dropout)", dict(proj=False)),
    ("the scores are not scaled by 1/sqrt(hs): use self.attend(q, k, v, mask)", dict(scale=False)),
]


def _random_cross(cls, C: int, nh: int, fast: bool, seed: int):
    with fresh_rng(seed):
        attn = cls(C, nh, fast=fast).eval()
        with torch.no_grad():
            for p in attn.parameters():  # random biases too, so no row of qkv is mixed up unseen
                p.copy_(torch.randn_like(p) * 0.5)
    return attn


@check("9.2", "CrossAttention", reference=CrossAttention)
def check_cross_attention(cls):
    """``cls(d_model, n_head, fast=...)`` with ``forward(x [B, T, C], memory [B, S, C], mask) -> [B, T, C]``."""
    g = torch.Generator().manual_seed(9)
    C, nh = 16, 4
    for fast in (False, True):
        attn = _random_cross(cls, C, nh, fast, seed=1)
        expect(isinstance(attn, MultiHeadAttention), "keep the class a subclass of MultiHeadAttention, built as given")
        with fresh_rng():
            ref = CrossAttention(C, nh, fast=fast).eval()
        ref.load_state_dict(attn.state_dict())
        x, memory = torch.randn(2, 3, C, generator=g), torch.randn(2, 5, C, generator=g)
        with torch.no_grad():
            _expect_cross(attn, ref, x, memory, fast)


def _expect_cross(attn, ref, x, memory, fast: bool) -> None:
    """9.2 for one layer: without and with the source's padding, one step, and a source that is all padding."""
    C, nh = attn.d_model, attn.n_head
    keep = torch.tensor([[True] * 5, [True, True, False, False, False]])
    for mask in (None, key_mask(keep)):  # without a mask first, then with the source's padding
        got = expect_tensor(attn(x, memory, mask), what="a tensor from forward")
        expect(tuple(got.shape) != (2, 5, C), "the output has one vector per encoder position: "
               "the queries come from x (the decoder), one output per decoder position")
        expect(tuple(got.shape) == (2, 3, C), f"the output must be [B, T, C] = (2, 3, {C}), got {tuple(got.shape)}")
        expect(not got.isnan().any(), "the output holds NaN")
        expect_close(got, ref(x, memory, mask), f"the output differs from the reference CrossAttention (fast={fast})",
                     mistakes=planted(_MISTAKES, _cross, attn, x, memory, mask))
    if not fast:
        weights = attn.last_weights
        expect(isinstance(weights, torch.Tensor), "with fast=False the weights must be kept "
               "in self.last_weights: use self.attend(q, k, v, mask)")
        expect(tuple(weights.shape) == (2, nh, 3, 5),
               f"last_weights should be [B, nh, T, S] = (2, {nh}, 3, 5), got {tuple(weights.shape)}")
        expect_close(weights, ref.last_weights, "last_weights differ from the reference's")
    one = attn(x[:, :1], memory)  # one decoder step, no mask
    expect_close(one, ref(x[:, :1], memory), "one decoder position without a mask gives another output")
    nothing = key_mask(torch.zeros(1, 5, dtype=torch.bool))
    empty = attn(x[:1], memory[:1], nothing)
    expect(not empty.isnan().any(), "a source that is all padding gives NaN: self.attend returns "
                                    "zeros there, so pass the mask to it")
    expect_close(empty, ref(x[:1], memory[:1], nothing),
                 "a source that is all padding should give the projection of zeros (proj's bias)")


# ---------------------------------------------------------------- 9.3 debug: the memory mask
def _memory_mask(T: int, src_keep: torch.Tensor) -> torch.Tensor:
    """The cross-attention mask, bool [B, 1, T, S]: every decoder position sees every real source token."""
    return src_keep[:, None, None, :].expand(-1, 1, T, -1)


@check("9.3", "my_memory_mask", reference=_memory_mask)
def check_memory_mask(fn):
    """``fn(T, src_keep [B, S]) -> bool`` broadcastable to [B, 1, T, S]."""
    cases = [(3, torch.tensor([[True] * 5, [True, True, True, False, False]])),
             # more decoder positions than source ones
             (6, torch.tensor([[True, True, False, False]])),
             # one step; a source all padding
             (1, torch.tensor([[True, True, True], [False, False, False]]))]
    for T, keep in cases:
        B, S = keep.shape
        got = expect_tensor(fn(T, keep.clone()))
        expect(got.dtype == torch.bool, f"return a bool mask (True = may attend), got dtype {got.dtype}")
        try:
            full = torch.broadcast_to(got, (B, 1, T, S))
        except RuntimeError:
            raise CheckFailed(f"the mask must broadcast to [B, 1, T, S] = {(B, 1, T, S)}, got "
                              f"{tuple(got.shape)}") from None
        want = _memory_mask(T, keep)
        expect(not (full.equal(~want) and want.any()), "the mask is inverted: True must mean 'may attend'")
        hidden = want & ~full  # real source tokens the decoder cannot see
        if hidden.any():
            b, _, t, s = (int(i) for i in hidden.nonzero()[0])
            expect(not (s > t), f"decoder position {t} cannot see source position {s}: cross-attention needs no causal "
                                "mask, the whole source is known before decoding starts")
            raise CheckFailed(f"decoder position {t} cannot see source position {s}, a real token")
        expect(not (full & ~want).any(), "padded source positions are visible: hide key s where "
                                         "src_keep[b, s] is False")


# ---------------------------------------------------------------- 9.4 extend: beam search
@torch.no_grad()
def _beam_search(model, src, bos_id: int, eos_id: int, beam_size: int = 4, max_new_tokens: int = 11):
    """The `beam_size` most probable hypotheses kept at each step (ranked by their summed
    log-probabilities); one that produces `eos_id` is finished. Returns (ids, score) of the best
    finished one (the best unfinished one when none finished within `max_new_tokens` steps)."""
    memory, keep = model.encode(src)  # (1, S, C), (1, S): once
    live, finished = [([bos_id], 0.0)], []
    for _ in range(max_new_tokens):
        if not live:
            break
        n = len(live)
        ids = torch.tensor([seq for seq, _ in live], device=src.device)  # (n, t)
        logits = model.decode(ids, memory.expand(n, -1, -1), keep.expand(n, -1))[:, -1]
        logp = logits.double().log_softmax(-1)
        scores = torch.tensor([s for _, s in live], dtype=torch.float64, device=src.device)
        scores = scores[:, None] + logp  # (n, V)
        top = scores.flatten().topk(min(beam_size, scores.numel()))
        V = logp.shape[1]
        chosen = [(live[i // V][0] + [i % V], s)
                  for s, i in zip(top.values.tolist(), top.indices.tolist(), strict=True)]
        live = [(seq, s) for seq, s in chosen if seq[-1] != eos_id]
        finished += [(seq, s) for seq, s in chosen if seq[-1] == eos_id]
    return max(finished or live, key=lambda h: h[1])


def _small_model(seed: int):
    """A random encoder-decoder with a target vocabulary of 5 (pad 0, bos 1, eos 2, two symbols)."""
    cfg = Seq2SeqConfig(8, 5, 8, 8, n_layer_enc=1, n_layer_dec=1, n_head=2, d_model=16)
    with fresh_rng(seed):
        model = EncoderDecoder(cfg).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(3.0)  # sharper distributions, so the best sequence and greedy's often differ
    return model


@torch.no_grad()
def _log_prob(model, src, ids: list[int]) -> float:
    """The total log-probability the model gives to ids[1:] after ids[0] (teacher forcing)."""
    tgt = torch.tensor([ids])
    logits, _ = model(src, tgt[:, :-1])
    return logits.double().log_softmax(-1)[0].gather(-1, tgt[0, 1:, None]).sum().item()


# (model seed, source): the most probable finished sequence is one greedy decoding does not produce;
# in the first case greedy finishes too, with a less probable sequence
# (tests/test_checks_encoder_decoder.py)
BEAM_CASES = ((15, [[5, 5, 6, 7, 4, 2]]), (0, [[7, 3, 2]]), (5, [[3, 4, 5, 6, 2]]),
              (6, [[3, 4, 5, 6, 2]]))
# (model seed, source) where a beam of 2 over 4 steps gives one answer whichever common variant of
# beam search is written (finished hypotheses taking a place in the beam or not), and ranking the
# extensions by their last token's log-probability gives another
# (tests/test_checks_encoder_decoder.py)
BEAM_NARROW = ((6, [[3, 4, 5, 6, 2]]), (15, [[3, 4, 5, 6, 2]]))
_ids = lambda ids: ids.flatten().tolist() if isinstance(ids, torch.Tensor) else list(ids)


@check("9.4", "my_beam_search", reference=_beam_search)
def check_beam_search(fn):
    """``fn(model, src [1, S], bos_id, eos_id, beam_size, max_new_tokens)`` ``-> (ids: list[int], score: float)``."""
    bos, eos = 1, 2
    for seed, source in BEAM_CASES:
        model = _small_model(seed)
        src = torch.tensor(source)
        for beam_size, steps in ((1, 6), (100, 3)):  # greedy; wide enough to keep every hypothesis
            got = fn(model, src, bos, eos, beam_size=beam_size, max_new_tokens=steps)
            expect(isinstance(got, tuple | list) and len(got) == 2, "return a pair (ids, score)")
            ids, score = _ids(got[0]), float(got[1])
            expect(ids and ids[0] == bos, "the ids must start with bos_id, as greedy_decode's do")
            expect(eos not in ids[1:-1], "a hypothesis is finished at its first eos_id: do not extend it further")
            expect(len(ids) - 1 <= steps, f"{len(ids) - 1} new tokens, more than max_new_tokens={steps}")
            _expect_score(score, _log_prob(model, src, ids), len(ids) - 1)
            if beam_size == 1:
                greedy = model.greedy_decode(src, bos, eos, max_new_tokens=steps)[0].tolist()
                expect(ids == greedy, "with beam_size=1 the search must give greedy_decode's "
                       f"answer {greedy}, got {ids}: keep the single best extension at each step")
            else:
                want_ids, want = _beam_search(model, src, bos, eos, beam_size=beam_size, max_new_tokens=steps)
                expect(not (ids[-1] != eos and want_ids[-1] == eos),
                       "return the best *finished* hypothesis (one that ends with eos_id)")
                expect(score >= want - 1e-4, "with a beam wide enough to keep every hypothesis, the best finished "
                       f"sequence scores {want:.4f}, yours {score:.4f}: rank the extensions of all live hypotheses "
                       "together by their total log-probability and keep the beam_size best")
    for seed, source in BEAM_NARROW:
        model, src = _small_model(seed), torch.tensor(source)
        ids = _ids(fn(model, src, bos, eos, beam_size=2, max_new_tokens=4)[0])
        want_ids, _ = _beam_search(model, src, bos, eos, beam_size=2, max_new_tokens=4)
        expect(ids == want_ids, f"with beam_size=2 the search should return {want_ids}, got {ids}: rank the extensions "
               "of all live hypotheses together by their total log-probability (the sum over all their tokens, not the "
               "last token's alone) and keep the beam_size best")


def _expect_score(score: float, true: float, new_tokens: int) -> None:
    """9.4's score must be the summed log-probability ``true`` of the returned tokens."""
    if math.isclose(score, true, abs_tol=1e-4):
        return
    expect(not math.isclose(score, math.exp(true), abs_tol=1e-4), "score is a probability: "
           "return the total log-probability (a sum of log_softmax values)")
    expect(not math.isclose(score, true / new_tokens, abs_tol=1e-4),
           "score is divided by the length: return the plain sum of the log-probabilities")
    raise CheckFailed(f"score {score:.4f} is not the summed log-probability of the returned tokens ({true:.4f}): add "
                      "log_softmax of each chosen token to its hypothesis's score")
