"""Checks for chapter 04's exercises (multi-head attention). Hand-written.

Each check runs the learner's function next to the package's reference on ordinary and edge inputs
and names the likely mistake in words. See ``transformer_course.checks`` for how checks report.
"""

import torch
import torch.nn.functional as F

from ..attention import AttentionHead, causal_mask
from ..multihead import LoopedMultiHeadAttention, causal_mask_with_past, merge_heads, split_heads
from ._core import CheckFailed, check, expect, expect_close

__all__ = [
    "check_causal_mask_with_past",
    "check_grouped_query_attention",
    "check_merge_heads",
    "check_pack_qkv_weight",
    "check_split_heads",
    "grouped_query_attention_reference",
]


def _randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _same(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=1e-6)


def _call(fn, *args, what: str):
    """Run the learner's ``fn``; turn the usual "view on a non-contiguous tensor" crash into a hint."""
    try:
        return fn(*args)
    except RuntimeError as error:
        if "view size is not compatible" in str(error):
            raise CheckFailed(
                f"{what}: .view failed because after transpose the tensor is not contiguous (its memory is "
                "not in the new order); use .reshape(...) or .contiguous().view(...)"
            ) from None
        raise


def _other_size(fn, *args, hint: str):
    """Run ``fn`` on a second size of input; a crash there means something was hard-coded."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except Exception as error:
        raise CheckFailed(f"{hint} (it raised {type(error).__name__}: {error})") from None


def _expect_same(got, want: torch.Tensor, hint: str) -> None:
    """Like expect_close, but a wrong shape also gets the hint."""
    expect(isinstance(got, torch.Tensor) and got.shape == want.shape,
           f"{hint} (expected shape {tuple(want.shape)}, got {tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__})")
    expect_close(got, want, hint)


# ---------------------------------------------------------------- 4.1 split heads


@check("4.1", "my_split_heads")
def check_split_heads(fn):
    """``fn(x [B, T, C], n_head) -> [B, nh, T, hs]``, head h holding channels h*hs .. (h+1)*hs - 1."""
    x = torch.arange(12.0).view(1, 3, 4)  # B=1, T=3, C=4: token t holds 4t .. 4t+3
    got = _call(fn, x, 2, what="split_heads")
    expect(isinstance(got, torch.Tensor), f"return a tensor, got {type(got).__name__}")
    expect(
        got.shape != (1, 3, 2, 2) or not torch.equal(got, x.view(1, 3, 2, 2)),
        "you returned [B, T, nh, hs]: move the head axis next to the batch with .transpose(1, 2)",
    )
    expect(got.shape == (1, 2, 3, 2), f"[B, T, C] = [1, 3, 4] with 2 heads should give [1, 2, 3, 2], got {tuple(got.shape)}")
    expect(
        not torch.equal(got, x.view(1, 2, 3, 2)),
        "you reshaped straight to [B, nh, T, hs]: the right shape, but head 0's row 1 is (2, 3), the second "
        "half of token 0, so rows are no longer tokens; view as [B, T, nh, hs] first, then transpose(1, 2)",
    )
    expect(
        not torch.equal(got, x.view(1, 3, 2, 2).transpose(-1, -2).transpose(1, 2)),
        "head 0 got channels 0, 2 (every nh-th channel): head h must own the block h*hs .. (h+1)*hs - 1, "
        "so view as [B, T, nh, hs], not [B, T, hs, nh]",
    )
    expect(torch.equal(got, split_heads(x, 2)), f"head 0 should be [[0, 1], [4, 5], [8, 9]], got {got[0, 0].tolist()}")
    xb = _randn(2, 5, 12, seed=0)
    hint = "right for the small example but not for B=2, T=5, C=12, 3 heads: read B, T, C from x.shape"
    _expect_same(_other_size(fn, xb, 3, hint=hint), split_heads(xb, 3), hint)


# ---------------------------------------------------------------- 4.2 merge heads


@check("4.2", "my_merge_heads")
def check_merge_heads(fn):
    """``fn(y [B, nh, T, hs]) -> [B, T, C]``, the inverse of split_heads."""
    y = torch.arange(12.0).view(1, 2, 3, 2)  # B=1, nh=2, T=3, hs=2
    got = _call(fn, y, what="merge_heads")
    expect(isinstance(got, torch.Tensor), f"return a tensor, got {type(got).__name__}")
    expect(got.shape == (1, 3, 4), f"[B, nh, T, hs] = [1, 2, 3, 2] should merge to [B, T, C] = [1, 3, 4], got {tuple(got.shape)}")
    expect(
        not torch.equal(got, y.reshape(1, 3, 4)),
        "you merged without undoing the head transpose: token 0 came out as (0, 1, 2, 3), all from head 0; "
        "transpose(1, 2) back to [B, T, nh, hs] before merging the last two axes",
    )
    expect(
        not torch.equal(got, y.permute(0, 2, 3, 1).reshape(1, 3, 4)),
        "the channels of the heads are interleaved: merge axes in the order (nh, hs), so that head 0's "
        "hs channels come first, then head 1's",
    )
    expect(torch.equal(got, merge_heads(y)), f"token 0 should be (0, 1, 6, 7), got {tuple(got[0, 0].tolist())}")
    x = _randn(2, 5, 12, seed=1)
    hint = "merging split_heads(x) should give x back (B=2, T=5, C=12, 3 heads): read sizes from y.shape"
    _expect_same(_other_size(fn, split_heads(x, 3), hint=hint), x, hint)


# ---------------------------------------------------------------- 4.3 pack the heads' weights


def _heads(d_model: int, n_head: int, seed: int) -> list[AttentionHead]:
    torch.manual_seed(seed)
    return list(LoopedMultiHeadAttention(d_model, n_head).heads)


@check("4.3", "my_pack_qkv_weight")
def check_pack_qkv_weight(fn):
    """``fn(heads: list[AttentionHead]) -> qkv.weight [3C, C]``: [W_q; W_k; W_v], heads in order in each."""
    heads = _heads(8, 2, seed=0)
    got = fn(heads)
    expect(isinstance(got, torch.Tensor), f"return a tensor, got {type(got).__name__}")
    ref = torch.cat([torch.cat([getattr(h, n).weight for h in heads]) for n in ("query", "key", "value")])
    expect(
        got.shape != (8, 24),
        "got [C, 3C]: nn.Linear stores weight as [out_features, in_features], so stack the heads' [hs, C] "
        "weights along dim 0 into [3C, C]",
    )
    expect(got.shape == (24, 8), f"qkv.weight for C=8 should be [3C, C] = [24, 8], got {tuple(got.shape)}")
    by_head = torch.cat([torch.cat([h.query.weight, h.key.weight, h.value.weight]) for h in heads])
    expect(
        not _same(got, by_head),
        "you grouped by head ([q0; k0; v0; q1; ...]); qkv is grouped by kind: every head's query weights "
        "first (head 0, head 1, ...), then all key weights, then all value weights",
    )
    by_kind_reversed = torch.cat([torch.cat([getattr(h, n).weight for h in heads[::-1]]) for n in ("query", "key", "value")])
    expect(not _same(got, by_kind_reversed), "the heads are in reverse order inside each block: head 0 comes first")
    expect_close(got, ref, "qkv.weight should be [W_q; W_k; W_v] with W_q the heads' query.weight stacked in order")
    heads3 = _heads(12, 3, seed=1)  # another size: nothing hard-coded
    ref3 = torch.cat([torch.cat([getattr(h, n).weight for h in heads3]) for n in ("query", "key", "value")])
    hint = "right for 2 heads but not for 3 heads of C=12: loop over all the heads"
    _expect_same(_other_size(fn, heads3, hint=hint), ref3, hint)


# ---------------------------------------------------------------- 4.4 causal mask with a past


@check("4.4", "my_causal_mask_with_past")
def check_causal_mask_with_past(fn):
    """``fn(T, past) -> Bool [T, past + T]``: new query t (position past + t) sees keys 0 .. past + t."""
    for T, past in ((2, 3), (1, 4), (3, 0), (4, 2)):
        got = fn(T, past)
        expect(isinstance(got, torch.Tensor), f"return a tensor, got {type(got).__name__}")
        expect(got.shape == (T, past + T),
               f"with past={past} cached and T={T} new positions the mask is [T, past + T] = [{T}, {past + T}], "
               f"got {tuple(got.shape)}: one column per key, cached ones included")
        expect(got.dtype == torch.bool, f"return a bool tensor (True = may attend), got {got.dtype}")
        ref = causal_mask_with_past(T, past)
        if torch.equal(got, torch.ones(T, past + T, dtype=torch.bool).tril()) and past > 0:
            expect(False, f"your triangle starts in the top-left corner (what is_causal=True does): new query 0 sits "
                          f"at position past={past} and must see all {past} cached keys and itself")
        future = got & ~ref
        if future.any():
            t, j = future.nonzero()[0].tolist()
            expect(False, f"new query {t} (position {past + t}) can see key {j}, which comes after it")
        missing = ref & ~got
        if missing.any():
            t, j = missing.nonzero()[0].tolist()
            expect(j != past + t, f"new query {t} cannot see itself (key {j} = position past + t): include the diagonal")
            expect(False, f"new query {t} (position {past + t}) cannot see the earlier key {j}")
    expect(torch.equal(fn(5, 0), causal_mask(5)), "with past=0 the mask should be chapter 03's causal_mask(T)")


# ---------------------------------------------------------------- 4.5 grouped-query attention (stretch)


def grouped_query_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention with nh query heads sharing n_kv key/value heads (n_kv divides nh).

    q [B, nh, T, hs], k and v [B, n_kv, T, hs] -> [B, nh, T, hs]. Query head h uses key/value head
    h // (nh // n_kv): consecutive query heads share one group (as in Llama 2 and Mistral).
    """
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, nh, T, hs)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@check("4.5", "my_grouped_query_attention")
def check_grouped_query_attention(fn):
    """``fn(q [B, nh, T, hs], k [B, n_kv, T, hs], v [B, n_kv, T, hs]) -> [B, nh, T, hs]``, causal."""
    q, k, v = _randn(2, 4, 5, 8, seed=2), _randn(2, 2, 5, 8, seed=3), _randn(2, 2, 5, 8, seed=4)
    got = fn(q, k, v)
    expect(isinstance(got, torch.Tensor), f"return a tensor, got {type(got).__name__}")
    expect(got.shape == q.shape, f"the output has one row per query head: [B, nh, T, hs] = {tuple(q.shape)}, got {tuple(got.shape)}")
    ref = grouped_query_attention_reference(q, k, v)
    tiled = F.scaled_dot_product_attention(q, k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1), is_causal=True)
    expect(
        not _same(got, tiled),
        "query head 1 used key/value head 1, but heads 0 and 1 share group 0: repeat each key/value head in "
        "place (repeat_interleave along dim 1), not the whole stack (repeat / tile)",
    )
    see_all = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    expect(not _same(got, see_all), "position 0 attends to later keys: the attention must stay causal")
    unscaled = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True, scale=1.0)
    expect(not _same(got, unscaled), "the scores are not scaled: divide q kᵀ by √hs")
    expect_close(got, ref, "differs from causal attention where query head h uses key/value head h // (nh // n_kv)")
    for n_kv in (1, 4):  # multi-query (one shared head) and plain multi-head
        k2, v2 = _randn(1, n_kv, 6, 4, seed=5 + n_kv), _randn(1, n_kv, 6, 4, seed=7 + n_kv)
        q2 = _randn(1, 4, 6, 4, seed=9)
        hint = f"right for 2 groups but not for n_kv={n_kv}: compute the group size as nh // n_kv"
        _expect_same(_other_size(fn, q2, k2, v2, hint=hint), grouped_query_attention_reference(q2, k2, v2), hint)
