"""Checks for chapter 03's exercises (single-head attention). Hand-written.

The private references ``_alibi_bias`` (3.5) and ``_online_attention`` (3.6, with mistakes to switch on) are not part of
the package's API; ``largest_tensor`` measures the biggest tensor a function computes (3.6 must work tile by tile)."""

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..attention import causal_mask, scaled_dot_product_attention
from ._core import (
    check,
    close,
    expect,
    expect_close,
    expect_items,
    expect_mask,
    expect_numbers,
    expect_runs,
    expect_tensor,
    name_mistake,
    planted,
)

__all__ = ["check_alibi_bias", "check_attention", "check_attention_scores", "check_causal_mask",
           "check_predict_equal_scores", "check_tiled_attention", "largest_tensor", "tiled_attention"]
_randn64 = lambda *shape, seed: torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ---------------------------------------------------------------- 3.1 scores (debug)
@check("3.1", "fixed_scores")
def check_attention_scores(fn):
    """``fn(q [..., T_q, d_k], k [..., T_k, d_k]) -> scores [..., T_q, T_k] = q kᵀ / √d_k``."""
    # square first: 4 positions and d_k = 4, where multiplying by the untransposed k runs silently
    q, k = _randn64(4, 4, seed=0), _randn64(4, 4, seed=1)
    got = expect_tensor(fn(q, k), what="a tensor of scores")
    expect(got.shape == (4, 4), f"scores for 4 queries and 4 keys should be [4, 4], got {tuple(got.shape)}")
    raw = q @ k.T
    expect_close(got, raw / 2.0, "the scores differ from q kᵀ / √d_k", mistakes=[
        ("q @ k multiplies the features of q by the *positions* of k (row m of k is key m): it "
         "only runs when T_k = d_k, and then gives nonsense. Each score is the dot product of a "
         "query row with a key row: transpose the last two dims of k, q @ k.transpose(-2, -1)", q @ k / 2.0),
        ("q.T @ k compares features with features, [d_k, d_k], and only looks like [T_q, T_k] "
         "when T = d_k; compare positions: q @ k.transpose(-2, -1)", q.T @ k / 2.0),
        ("rows must be queries and columns keys: compute q @ kᵀ, not k @ qᵀ", k @ q.T / 2.0),
        ("these are the raw dot products: divide them by √d_k (d_k = q.shape[-1])", raw),
        ("you divided by d_k; divide by its square root, √d_k", raw / 4),
    ])
    q, k = _randn64(3, 4, seed=2), _randn64(5, 4, seed=3)  # T_q = 3, T_k = 5, d_k = 4
    got = expect_runs(fn, q, k, errors=RuntimeError,
                      hint="with 3 queries, 5 keys and d_k = 4 your code failed: pair every query "
                           "row with every key row, q @ k.transpose(-2, -1)")
    got = expect_tensor(got, what="a tensor of scores")
    expect(got.shape != (5, 3), "the scores came out [T_k, T_q]: rows must be queries, so compute q @ kᵀ, not k @ qᵀ")
    expect(got.shape == (3, 5), f"scores for 3 queries and 5 keys should be [3, 5], got {tuple(got.shape)}")
    expect_close(got, q @ k.T / 2.0, "the scores differ from q kᵀ / √d_k")
    expect_close(fn(q[:, :2], k[:, :2]), q[:, :2] @ k[:, :2].T / math.sqrt(2),
                 "with d_k = 2 the scores are wrong: divide by √d_k of *these* inputs, math.sqrt(q.shape[-1])")
    qb, kb = _randn64(2, 3, 4, seed=4), _randn64(2, 5, 4, seed=5)  # a batch of two sequences
    hint = ("works for one sequence but not for a batch [B, T, d_k]: transpose only the last two "
            "dims, k.transpose(-2, -1); k.T reverses every dim")
    got_b = expect_runs(fn, qb, kb, hint=hint, errors=RuntimeError)
    expect_close(got_b, qb @ kb.transpose(-2, -1) / 2.0, hint)


# ---------------------------------------------------------------- 3.2 causal mask (build)
@check("3.2", "causal_mask", reference=causal_mask)
def check_causal_mask(fn):
    """``fn(T, device=None) -> Bool [T, T]``, True where query i may attend key j (j <= i)."""
    for T in (1, 4, 7):
        got = expect_tensor(fn(T))
        expect(got.shape == (T, T), f"the mask for T={T} should be [{T}, {T}], got {tuple(got.shape)}")
        expect(got.dtype == torch.bool, f"return a bool tensor (True = may attend), got "
                                        f"{got.dtype}: pass dtype=torch.bool to torch.ones")
        expect_mask(got, causal_mask(T), lambda i, j: f"position {i} can see position {j}, which comes after it: "
                    "keep the lower triangle (tril), not the upper",
                    lambda i, j: f"position {i} cannot see itself: the diagonal must be True (tril, not tril(-1))"
                    if i == j else f"position {i} cannot see the earlier position {j}: every j <= i must be True")
    # a device without data: only where the tensor lives is checked
    on_meta = fn(3, device=torch.device("meta"))
    expect(isinstance(on_meta, torch.Tensor) and on_meta.device.type == "meta", "the mask ignores `device`: create "
           "it there (torch.ones(..., device=device)), so that it lives where the scores are (on the GPU, in later "
           "chapters)")


# ---------------------------------------------------------------- 3.3 equal scores (predict)
@check("3.3", "equal scores")
def check_predict_equal_scores(fn):
    """``fn() -> 5 weights``: query 2 of a causal head, T = 5, every score 7.0."""
    w = expect_numbers(fn(), 5, "return 5 numbers", as_list="return the 5 weights as a list",
                       count="one weight per key: T = 5 keys, so 5 numbers")
    expect(abs(w[3]) < 1e-9 and abs(w[4]) < 1e-9, "keys 3 and 4 come after query 2: the causal "
                                                   "mask hides them, so their weight is exactly 0")
    expect(max(w[:3]) - min(w[:3]) < 1e-3, "equal scores give equal weights: exp(7) is the same "
                                           "for each of keys 0, 1 and 2")
    expect(abs(w[0] - 1) > 1e-3, "softmax weights sum to 1 over the keys a query may see: three "
                                 "equal weights are 1/3 each")
    expect(abs(sum(w) - 1) < 1e-2, "softmax weights sum to 1; the size of the equal scores (7.0) "
                                   "does not matter, only their differences")


# ---------------------------------------------------------------- 3.4 attention (build)
@check("3.4", "scaled_dot_product_attention", reference=scaled_dot_product_attention)
def check_attention(fn):
    """``fn(q, k, v, mask=None, *, scale=None, dropout_p=0.0)``
    ``-> (out [..., T_q, d_v], weights [..., T_q, T_k])``."""
    q, k, v = _randn64(2, 4, 3, seed=10), _randn64(2, 6, 3, seed=11), _randn64(2, 6, 5, seed=12)
    out, weights = expect_items(fn(q, k, v), 2, "return a pair (out, weights), not just the output")
    ref_out, ref_w = scaled_dot_product_attention(q, k, v)
    expect(isinstance(weights, torch.Tensor) and weights.shape == (2, 4, 6), "weights should be "
           f"[..., T_q, T_k] = (2, 4, 6), got {getattr(weights, 'shape', weights)}")
    expect(torch.allclose(weights.sum(-1), torch.ones(2, 4, dtype=weights.dtype), atol=1e-6),
           "the rows of the weights do not sum to 1: take the softmax over the keys, dim=-1")
    raw = q @ k.transpose(-2, -1)
    expect_close(weights, ref_w, "the weights differ from softmax(q kᵀ / √d_k)", mistakes=[
        ("the weights come from unscaled scores: with scale=None, multiply q kᵀ by 1/√d_k "
         "before the softmax", torch.softmax(raw, dim=-1)),
        ("you divided the scores by d_k; divide by √d_k", torch.softmax(raw / 3, dim=-1)),
    ])
    expect_close(out, ref_out, "the weights are right but the output is not: it is weights @ v")

    _, w_one = fn(q, k, v, scale=1.0)
    expect_close(w_one, scaled_dot_product_attention(q, k, v, scale=1.0)[1],
                 "with scale=1.0 the scores are q kᵀ times 1.0 (the scale multiplies, it does not divide)",
                 mistakes=[("`scale` is ignored: when it is given, multiply the scores by it "
                            "instead of 1/√d_k", ref_w)])

    heads = [_randn64(2, 3, T, d, seed=seed) for T, d, seed in ((4, 5, 13), (6, 5, 14), (6, 2, 15))]
    hint = ("with two batch dims [B, nh, T, d_k] the weights are wrong: transpose only the last "
            "two dims of k, k.transpose(-2, -1) (k.T or k.transpose(0, 1) mixes up the batch dims)")
    w_heads = expect_runs(fn, *heads, hint=hint, errors=RuntimeError)[1]
    expect_close(w_heads, scaled_dot_product_attention(*heads)[1], hint)

    mask = causal_mask(6)[:4]  # query i may see keys 0..i
    out, weights = fn(q, k, v, mask)
    _, ref_w = scaled_dot_product_attention(q, k, v, mask)
    expect(not close(weights, scaled_dot_product_attention(q, k, v, ~mask)[1], atol=1e-6),
           "True in the mask means 'may attend': hide the keys where the mask is False (~mask), not where it is True")
    expect(not (weights.masked_select(~mask) > 0).any(),
           "a masked key got weight: give masked scores -inf before the softmax, so exp(-inf) = 0")
    expect_close(weights, ref_w, "with a mask the weights differ: give masked scores -inf before the softmax")

    keep = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])[:, None, :]  # padding: [B, 1, T_k]
    expect_close(fn(q, k, v, keep)[1], scaled_dot_product_attention(q, k, v, keep)[1],
                 "a padding mask [B, 1, T_k] (one row per sequence, broadcast over the queries) gives wrong weights")
    _check_fully_masked_row(fn, q, k, v, mask)


def _check_fully_masked_row(fn, q, k, v, mask):
    """3.4 with a query that may attend nothing: zeros, no NaN, and no NaN in the gradients."""
    empty = mask.clone()
    empty[1] = False  # query 1 may attend nothing
    out, weights = fn(q, k, v, empty)
    expect(not torch.isnan(out).any() and not torch.isnan(weights).any(), "a query whose every key is masked gave NaN "
           "(softmax of all -inf is 0/0): set its weights to 0 after the softmax")
    expect(not torch.allclose(weights[:, 1], torch.full_like(weights[:, 1], 1 / 6)),
           "a query whose every key is masked got equal weights on all 6 keys: that is what a large negative number "
           "such as -1e9 gives instead of -inf. Use -inf, and set the weights of a fully masked row to 0")
    expect((out[:, 1] == 0).all() and (weights[:, 1] == 0).all(),
           "a query whose every key is masked must get zero weights (and so a zero output)")
    expect_close(weights, scaled_dot_product_attention(q, k, v, empty)[1],
                 "the rows with at least one visible key changed when another row was fully masked")

    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out, _ = fn(qg, kg, vg, empty)
    out.sum().backward()
    finite = all(t.grad is not None and torch.isfinite(t.grad).all() for t in (qg, kg, vg))
    expect(finite, "the output is right, but gradients through the fully masked row are NaN, and they reach every key: "
           "adding an additive -inf mask passes the softmax's NaN gradient back to q and k. Set masked scores with "
           "scores.masked_fill(~mask, float('-inf')) (it blocks their gradient) instead")


# ---------------------------------------------------------------- 3.5 ALiBi (extend)
def _alibi_bias(T: int, slope: float) -> torch.Tensor:
    """Reference for 3.5: float [T, T], -slope * (i - j) for keys j <= i, -inf for the future."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    bias = -slope * (i - j).to(torch.get_default_dtype())  # (T, T): 0 on the diagonal
    return bias.masked_fill(j > i, float("-inf"))


@check("3.5", "alibi_bias", reference=_alibi_bias)
def check_alibi_bias(fn):
    """``fn(T, slope) -> float [T, T]``: an additive ALiBi bias, causal."""
    for T, slope in ((5, 0.5), (6, 0.25), (1, 1.0)):
        got = expect_tensor(fn(T, slope))
        expect(got.dtype.is_floating_point, "return float biases to add to the scores (0 where "
               f"nothing changes, -inf to hide a key), got {got.dtype}")
        expect(got.shape == (T, T), f"for T={T} the bias should be [{T}, {T}], got {tuple(got.shape)}")
        got = got.detach().double()
        expect(not torch.isnan(got).any(), "your bias holds NaN: 0 * -inf is NaN; build the -inf "
                                           "part with masked_fill or torch.where")
        if T == 1:
            expect(got.item() == 0, "with T = 1 the single query sees only itself, distance 0: "
                                    f"bias [[0.]], got {got.tolist()}")
        else:
            _expect_alibi_values(got, T, slope)


def _expect_alibi_values(got: torch.Tensor, T: int, slope: float) -> None:
    want = _alibi_bias(T, slope).double()
    future = torch.ones(T, T, dtype=torch.bool).triu(1)  # j > i
    past = ~future
    expect(not torch.isinf(got[past]).any(), "rows are queries and columns keys: key j may be seen by query i when j "
           "<= i, so -inf belongs above the diagonal (j > i) and the distance penalty on and below it")
    expect(not (got[future] == 0).all(), "0 above the diagonal lets query i attend the future "
                                         "keys j > i: an additive mask hides a key with -inf")
    expect((got[future] == float("-inf")).all(), "the future must stay hidden: the entries above "
                                                 "the diagonal (key j after query i) must be -inf")
    if close(got[past], want[past], atol=1e-6):
        return
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).double()
    named = name_mistake(got[past], [
        ("the bias must fall with distance, -slope * (i - j): yours grows, so a head would "
         "prefer the oldest keys", (slope * dist)[past]),
        ("a query and itself are 0 positions apart: the diagonal gets bias 0, the key before it "
         "-slope", (-slope * (dist + 1))[past]),
        (f"multiply the distance by `slope` (here {slope}): -slope * (i - j)", (-dist)[past]),
    ], want=want[past], atol=1e-6)
    i, j = ((got - want).abs() > 1e-6).logical_and(past).nonzero()[0].tolist()
    expect(False, named or f"entry [{i}, {j}] (T={T}, slope={slope}) should be -slope * (i - j) = "
                           f"{want[i, j].item():g}, yours is {got[i, j].item():g}")


# ---------------------------------------------------------------- 3.6 attention tile by tile
class _LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any operation produces while active."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.numel = max(self.numel, leaf.numel())
        return out


def largest_tensor(fn, *args, **kwargs) -> tuple[object, int]:
    """(fn(*args, **kwargs), the element count of the largest tensor computed on the way): every
    operation's output is seen, views and temporaries included, so a [T, T] matrix cannot hide."""
    with _LargestTensor() as seen:
        out = fn(*args, **kwargs)
    return out, seen.numel


def _online_attention(q, k, v, tile: int, causal: bool = False, *, rescale_sum=True,
                      rescale_values=True, divide=True, scaled=True, global_keys=True):
    """Reference for 3.6, with one mistake switched on at will: softmax(q kᵀ / √d) v over tiles of
    keys, keeping per query a running maximum m and running sums of exp(s - m) and exp(s - m) v."""
    scale = 1 / math.sqrt(q.shape[-1]) if scaled else 1.0
    m = q.new_full((*q.shape[:-1], 1), float("-inf"))  # (..., T_q, 1) the largest score so far
    total = q.new_zeros((*q.shape[:-1], 1))  # (..., T_q, 1) sum of exp(score - m)
    acc = q.new_zeros((*q.shape[:-1], v.shape[-1]))  # (..., T_q, d_v) sum of exp(score - m) v
    for start in range(0, k.shape[-2], tile):
        s = q @ k[..., start:start + tile, :].transpose(-2, -1) * scale  # (..., T_q, tile)
        if causal:
            keys = torch.arange(s.shape[-1]) + (start if global_keys else 0)
            s = s.masked_fill(keys > torch.arange(q.shape[-2])[:, None], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m_new)  # (..., T_q, tile)
        shrink = torch.exp(m - m_new)  # (..., T_q, 1): the old sums were against the old maximum
        total = (total * shrink if rescale_sum else total) + p.sum(-1, keepdim=True)
        acc = (acc * shrink if rescale_values else acc) + p @ v[..., start:start + tile, :]
        m = m_new
    return acc / total if divide else acc


_TILED_MISTAKES = (  # (hint, the switch that makes _online_attention commit it)
    ("when the running maximum grows, the sum of exponentials must shrink by exp(m_old - m_new) "
     "too", {"rescale_sum": False}),
    ("when the running maximum grows, the running sum of weighted values must shrink by "
     "exp(m_old - m_new): it was computed against the old maximum", {"rescale_values": False}),
    ("the weighted sum of values is not divided by the sum of exponentials at the end",
     {"divide": False}),
    ("the scores are not divided by √d (d, the size of q's last dimension)", {"scaled": False}),
    ("the causal mask compares a query with the key's place inside its tile: use the key's "
     "position in the whole sequence (the tile's start plus its place in the tile)",
     {"global_keys": False}),
)


def tiled_attention(q, k, v, tile: int, causal: bool = False) -> torch.Tensor:
    """The chapter's fallback when 3.6 is not done: attention tile by tile (online softmax)."""
    return _online_attention(q, k, v, tile, causal)


@check("3.6", "tiled_attention", reference=tiled_attention)
def check_tiled_attention(fn):
    """``fn(q [..., T_q, d], k [..., T_k, d], v [..., T_k, d_v], tile, causal=False)`` equal to
    softmax(q kᵀ / √d) v, [..., T_q, d_v], never holding more than [T_q, tile] scores."""
    cases = [((6, 4), (6, 4), (6, 3), 2, False), ((10, 4), (10, 4), (10, 5), 3, True),
             ((2, 3, 7, 8), (2, 3, 7, 8), (2, 3, 7, 8), 1, True),
             ((5, 4), (9, 4), (9, 2), 16, False)]
    for n, (sq, sk, sv, tile, causal) in enumerate(cases):
        q, k, v = _randn64(*sq, seed=60 + n), _randn64(*sk, seed=70 + n), _randn64(*sv, seed=80 + n)
        want = scaled_dot_product_attention(q, k, v, causal_mask(sq[-2]) if causal else None)[0]
        got = expect_tensor(fn(q, k, v, tile, causal=causal), what="a tensor from tiled_attention")
        where = f"q {tuple(q.shape)}, k {tuple(k.shape)}, tile={tile}, causal={causal}"
        expect(tuple(got.shape) == tuple(want.shape), f"the output is [..., T_q, d_v] = "
               f"{tuple(want.shape)} for {where}, got {tuple(got.shape)}")
        expect_close(got, want, f"the output differs from softmax(q kᵀ / √d) v ({where})", atol=1e-9, rtol=1e-9,
                     mistakes=planted(_TILED_MISTAKES, _online_attention, q, k, v, tile, causal))
    big_q, big_k = (40 * _randn64(8, 4, seed=s).float() for s in (90, 91))
    v = _randn64(8, 4, seed=92).float()
    got = expect_tensor(fn(big_q, big_k, v, 3), what="a tensor from tiled_attention")
    expect(bool(torch.isfinite(got).all()), "scores in the hundreds give inf or NaN: exp(800) overflows. Subtract each "
           "query's running maximum before exp, and rescale the sums when it grows")
    expect_close(got, scaled_dot_product_attention(big_q, big_k, v)[0],
                 "with large scores (float32) the output differs from the softmax's", atol=1e-4, rtol=1e-4)
    q, k, v = (_randn64(64, 4, seed=s) for s in (93, 94, 95))
    _, numel = largest_tensor(fn, q, k, v, 8, causal=True)
    expect(numel <= 64 * 8, f"with T = 64 and tile = 8 your function computed a tensor of {numel:,} numbers; the "
           "scores of all queries against one tile are 64 x 8 = 512. Build the scores (and any causal mask) one tile "
           "of keys at a time, never for all 64 x 64 pairs")
