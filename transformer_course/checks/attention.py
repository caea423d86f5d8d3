"""Checks for chapter 03's exercises (single-head attention). Hand-written.

Each check runs the learner's function next to the package's reference on ordinary and edge inputs
and names the likely mistake in words. See ``transformer_course.checks`` for how checks report.
"""

import math

import torch

from ..attention import causal_mask, scaled_dot_product_attention
from ._core import check, expect, expect_close

__all__ = [
    "check_attention",
    "check_attention_scores",
    "check_causal_mask",
    "check_head_forward",
    "check_padded_causal_mask",
]


def _randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _same(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=1e-6)


# ---------------------------------------------------------------- 3.1 scores


@check("3.1", "my_scores")
def check_attention_scores(fn):
    """``fn(q [..., T_q, d_k], k [..., T_k, d_k]) -> scores [..., T_q, T_k] = q kᵀ / √d_k``."""
    q, k = _randn(3, 4, seed=0), _randn(5, 4, seed=1)  # one sequence: T_q=3, T_k=5, d_k=4
    got = fn(q, k)
    expect(isinstance(got, torch.Tensor), f"return a tensor of scores, got {type(got).__name__}")
    expect(
        got.shape != (5, 3),
        "the scores came out [T_k, T_q]: rows must be queries, so compute q @ kᵀ, not k @ qᵀ",
    )
    expect(got.shape == (3, 5), f"scores for 3 queries and 5 keys should be [3, 5], got {tuple(got.shape)}")
    raw = q @ k.T
    expect(not _same(got, raw), "these are the raw dot products: divide them by √d_k (d_k = q.shape[-1])")
    expect(not _same(got, raw / 4), "you divided by d_k; divide by its square root, √d_k")
    expect_close(got, raw / math.sqrt(4), "the scores differ from q kᵀ / √d_k")
    qb, kb = _randn(2, 3, 4, seed=2), _randn(2, 5, 4, seed=3)  # a batch of two sequences
    try:
        got_b = fn(qb, kb)
    except RuntimeError as error:
        expect(False, f"works for one sequence but not for a batch ({error}): transpose only the last two dims, "
                      "k.transpose(-2, -1); k.T reverses every dim")
    expect_close(got_b, qb @ kb.transpose(-2, -1) / 2.0,
                 "works for one sequence but not for a batch: transpose only the last two dims, "
                 "k.transpose(-2, -1); k.T reverses every dim")


# ---------------------------------------------------------------- 3.2 causal mask


@check("3.2", "my_causal_mask")
def check_causal_mask(fn):
    """``fn(T) -> Bool [T, T]``, True where query i may attend key j (j <= i)."""
    for T in (1, 4, 7):
        got = fn(T)
        expect(isinstance(got, torch.Tensor), f"return a tensor, got {type(got).__name__}")
        expect(got.shape == (T, T), f"the mask for T={T} should be [{T}, {T}], got {tuple(got.shape)}")
        expect(got.dtype == torch.bool,
               f"return a bool tensor (True = may attend), got {got.dtype}: pass dtype=torch.bool to torch.ones")
        ref = causal_mask(T)
        future = got & ~ref
        if future.any():
            i, j = future.nonzero()[0].tolist()
            expect(False, f"position {i} can see position {j}, which comes after it: keep the lower triangle (tril), not the upper")
        missing = ref & ~got
        if missing.any():
            i, j = missing.nonzero()[0].tolist()
            hint = (f"position {i} cannot see itself: the diagonal must be True (tril, not tril(-1))" if i == j
                    else f"position {i} cannot see the earlier position {j}: every j <= i must be True")
            expect(False, hint)


# ---------------------------------------------------------------- 3.3 attention


@check("3.3", "my_attention")
def check_attention(fn):
    """``fn(q, k, v, mask=None) -> (out [..., T_q, d_v], weights [..., T_q, T_k])``."""
    q, k, v = _randn(2, 4, 3, seed=10), _randn(2, 6, 3, seed=11), _randn(2, 6, 5, seed=12)
    result = fn(q, k, v)
    expect(isinstance(result, tuple) and len(result) == 2, "return a pair (out, weights), not just the output")
    out, weights = result
    ref_out, ref_w = scaled_dot_product_attention(q, k, v)
    expect(isinstance(weights, torch.Tensor) and weights.shape == (2, 4, 6),
           f"weights should be [..., T_q, T_k] = (2, 4, 6), got {getattr(weights, 'shape', weights)}")
    expect(torch.allclose(weights.sum(-1), torch.ones(2, 4, dtype=weights.dtype), atol=1e-6),
           "the rows of the weights do not sum to 1: take the softmax over the keys, dim=-1")
    unscaled = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    expect(not _same(weights, unscaled), "the weights come from unscaled scores: divide q kᵀ by √d_k before the softmax")
    expect_close(weights, ref_w, "the weights differ from softmax(q kᵀ / √d_k)")
    expect_close(out, ref_out, "the weights are right but the output is not: multiply weights @ v")

    mask = causal_mask(6)[:4]  # query i may see keys 0..i
    out, weights = fn(q, k, v, mask)
    _, ref_w = scaled_dot_product_attention(q, k, v, mask)
    expect(not (weights.masked_select(~mask) > 0).any(),
           "a masked key got weight: True in the mask means 'may attend', so fill the scores with -inf where the mask is False (~mask)")
    expect_close(weights, ref_w, "with a mask the weights differ: fill masked scores with -inf before the softmax")

    empty = mask.clone()
    empty[1] = False  # query 1 may attend nothing
    out, weights = fn(q, k, v, empty)
    expect(not torch.isnan(out).any() and not torch.isnan(weights).any(),
           "a query whose every key is masked gave NaN (softmax of all -inf is 0/0): set its weights to 0, "
           "e.g. weights.masked_fill(~mask, 0.0) after the softmax")
    expect((out[:, 1] == 0).all() and (weights[:, 1] == 0).all(),
           "a query whose every key is masked must get zero weights and a zero output")


# ---------------------------------------------------------------- 3.4 one head by hand


@check("3.4", "my_head_forward")
def check_head_forward(fn):
    """``fn(x [B, T, C], w_q, w_k, w_v [hs, C]) -> [B, T, hs]``: one causal head from raw weights."""
    x = _randn(2, 5, 4, seed=20)
    square = [_randn(4, 4, seed=s) * 0.5 for s in (21, 22, 23)]  # hs = C = 4
    got = fn(x, *square)

    def head(x, w_q, w_k, w_v, causal=True, transpose=True):
        q, k, v = ((x @ w.T) if transpose else (x @ w) for w in (w_q, w_k, w_v))
        return scaled_dot_product_attention(q, k, v, causal_mask(x.shape[1]) if causal else None)[0]

    expect(isinstance(got, torch.Tensor) and got.shape == (2, 5, 4),
           f"the output should be [B, T, hs] = (2, 5, 4), got {getattr(got, 'shape', got)}")
    expect(not _same(got, head(x, *square, transpose=False)),
           "multiply by the transposed weights: like nn.Linear, w has shape [hs, C], so q = x @ w_q.T")
    expect(not _same(got, head(x, *square, causal=False)),
           "position 0's output depends on later positions: apply the causal mask")
    w_q, w_k, w_v = square
    expect(not _same(got, head(x, w_q, w_k, w_q)) and not _same(got, head(x, w_q, w_k, w_k)),
           "the values must come from w_v: v = x @ w_v.T")
    expect_close(got, head(x, *square), "the output differs from causal attention over q, k, v = x @ w.T")
    narrow = [_randn(3, 4, seed=s) for s in (24, 25, 26)]  # hs = 3 != C = 4
    expect_close(fn(x, *narrow), head(x, *narrow), "works when hs = C but not for a narrower head (hs = 3)")


# ---------------------------------------------------------------- 3.5 padding + causal


@check("3.5", "my_padded_causal_mask")
def check_padded_causal_mask(fn):
    """``fn(lengths [B], T) -> Bool [B, T, T]``: causal, and keys at positions >= length are padding."""
    lengths = torch.tensor([5, 3, 1])
    got = fn(lengths, 5)
    expect(isinstance(got, torch.Tensor) and got.shape == (3, 5, 5),
           f"the mask should be [B, T, T] = (3, 5, 5), got {getattr(got, 'shape', got)}")
    expect(got.dtype == torch.bool, f"return a bool tensor (True = may attend), got {got.dtype}")
    ref = causal_mask(5) & (torch.arange(5) < lengths[:, None])[:, None, :]
    rows_instead = causal_mask(5) & (torch.arange(5) < lengths[:, None])[:, :, None]
    expect(not torch.equal(got, rows_instead),
           "you hid the padded queries (rows); padding must hide the keys (columns): mask[b, i, j] needs j < length[b]")
    future = got & ~causal_mask(5)
    expect(not future.any(), "a query can see a later position: combine the padding mask with the causal mask (&)")
    leaked = got & ~ref
    if leaked.any():
        b, i, j = leaked.nonzero()[0].tolist()
        expect(False, f"sequence {b} has length {lengths[b].item()} but query {i} can see key {j}, a padding position: "
                      "keep keys with j < length (strictly less)")
    expect(torch.equal(got, ref), "a real earlier key is hidden: every j <= i with j < length must be True")
