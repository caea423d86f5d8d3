"""Checks for chapter 04's exercises (multi-head attention). Hand-written; 4.5's reference (``pack_heads``, which
serves the chapter's proof only) lives here, the others are the package's."""

import torch
import torch.nn.functional as F

from ..attention import AttentionHead, causal_mask
from ..multihead import MultiHeadAttention, causal_mask_with_past, merge_heads, split_heads
from ._core import (
    CheckFailed,
    check,
    close,
    expect,
    expect_answer,
    expect_close,
    expect_known_crash,
    expect_mask,
    expect_runs,
    expect_tensor,
    fresh_rng,
    name_mistake,
    seeded_randn,
)

__all__ = ["check_causal_mask_with_past", "check_grouped_query_attention", "check_heads_attention",
           "check_merge_heads", "check_pack_heads", "check_predict_scores_shape",
           "check_split_heads", "grouped_query_attention_reference", "pack_heads"]


def _view_crash(what: str) -> list:
    """The usual "view on a non-contiguous tensor" crash, as ``expect_known_crash`` names it."""
    return [("view size is not compatible", f"{what}: .view failed because after transpose the tensor is not "
             "contiguous (its memory is not in the new order); use .reshape(...) or .contiguous().view(...)")]


def _expect_same(got, want: torch.Tensor, hint: str, mistakes=()) -> None:
    """Like expect_close, but a wrong shape also gets the hint."""
    shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
    expect(isinstance(got, torch.Tensor) and got.shape == want.shape,
           f"{hint} (expected shape {tuple(want.shape)}, got {shape})")
    expect_close(got, want, hint, mistakes=mistakes)


def _expect_other_sizes(fn, args, want, hint: str, seed: int) -> None:
    """4.1 and 4.3 on more sizes (ordinary; one head and T = 1; a head size of 1): the learner's
    ``fn(*args(x, n_head))`` must give ``want(x, n_head)``; ``hint`` names {shape} and {n_head}."""
    for shape, n_head in (((2, 5, 12), 3), ((3, 1, 8), 1), ((1, 4, 6), 6)):
        x = seeded_randn(*shape, seed=sum(shape) + seed)
        said = hint.format(shape=list(shape), n_head=n_head)
        _expect_same(expect_runs(fn, *args(x, n_head), hint=said), want(x, n_head), said)


# ---------------------------------------------------------------- 4.1 split heads (build)
@check("4.1", "split_heads", reference=split_heads)
def check_split_heads(fn):
    """``fn(x [B, T, C], n_head) -> [B, nh, T, hs]``, head h holding channels h*hs .. (h+1)*hs - 1."""
    x = torch.arange(12.0).view(1, 3, 4)  # B=1, T=3, C=4: token t holds 4t .. 4t+3
    got = expect_tensor(expect_known_crash(fn, x, 2, known=_view_crash("split_heads")))
    expect(got.shape != (1, 3, 2, 2) or not torch.equal(got, x.view(1, 3, 2, 2)),
           "you returned [B, T, nh, hs]: the head axis must come before the time axis, [B, nh, T, hs]")
    expect(got.shape == (1, 2, 3, 2), f"[B, T, C] = [1, 3, 4] with 2 heads should give [1, 2, 3, 2], got "
                                      f"{tuple(got.shape)}")
    expect(torch.equal(got, split_heads(x, 2)), name_mistake(got, [
        ("you reshaped straight to [B, nh, T, hs]: the right shape, but head 0's row 1 is (2, 3), the second half of "
         "token 0, so rows are no longer tokens; cut C into [nh, hs] first, then move the head axis",
         x.view(1, 2, 3, 2)),
        ("head 0 got channels 0, 2 (every nh-th channel): head h must own the block h*hs .. (h+1)*hs - 1, so cut C "
         "as [nh, hs], not [hs, nh]", x.view(1, 3, 2, 2).transpose(-1, -2).transpose(1, 2)),
    ], atol=0, rtol=0) or f"head 0 should be [[0, 1], [4, 5], [8, 9]], got {got[0, 0].tolist()}")
    _expect_other_sizes(fn, lambda x, n_head: (x, n_head), split_heads, seed=0, hint="right for the small example "
                        "but not for [B, T, C] = {shape} with {n_head} heads: read B, T, C from x.shape and hs from "
                        "C // n_head")


# ---------------------------------------------------------------- 4.2 the scores' shape (predict)
@check("4.2", "my_prediction")
def check_predict_scores_shape(fn):
    """``fn() -> (B, nh, T, T)`` for B = 4, T = 10, C = 64, 4 heads: the attention scores' shape."""
    got = fn()
    try:
        got = tuple(int(n) for n in got)
    except (TypeError, ValueError):
        raise CheckFailed(f"return the shape as a tuple of ints, such as (2, 3), got {got!r}") from None
    expect_answer(got, (4, 4, 10, 10), [
        ("that is source 003's label, and the shape of q, k and v per head; the scores compare every query with every "
         "key, so the last axis runs over the T keys, not over hs", (4, 4, 10, 16)),
        ("T is 10 here (16 is the head size hs, and the longer sequence of the example above)", (4, 4, 16, 16)),
        ("split_heads puts the head axis before the time axis: [B, nh, T_q, T_k]", (4, 10, 4, 10)),
        ("each head has its own table of scores: [B, nh, T_q, T_k]", (4, 10, 10)),
        ("that is the shape of the layer's output; the scores are one [T, T] table per head and sequence", (4, 10, 64)),
        ("the scores compare every query with every key: one [T_q, T_k] table per head", (4, 4, 10, 64)),
    ], f"{got} is not it: one score per (sequence, head, query, key)")


# ---------------------------------------------------------------- 4.3 merge heads (build)
@check("4.3", "merge_heads", reference=merge_heads)
def check_merge_heads(fn):
    """``fn(y [B, nh, T, hs]) -> [B, T, C]``, the inverse of split_heads."""
    y = torch.arange(12.0).view(1, 2, 3, 2)  # B=1, nh=2, T=3, hs=2
    got = expect_tensor(expect_known_crash(fn, y, known=_view_crash("merge_heads")))
    expect(got.shape == (1, 3, 4), f"[B, nh, T, hs] = [1, 2, 3, 2] should merge to [B, T, C] = [1, 3, 4], got "
                                   f"{tuple(got.shape)}")
    expect(torch.equal(got, merge_heads(y)), name_mistake(got, [
        ("you merged without undoing the head transpose: token 0 came out as (0, 1, 2, 3), all from head 0 (positions "
         "mixed into one token); bring the time axis back before the head axis ([B, T, nh, hs]), then merge the last "
         "two axes", y.reshape(1, 3, 4)),
        ("the channels of the heads are interleaved: merge axes in the order (nh, hs), so that head 0's hs channels "
         "come first, then head 1's", y.permute(0, 2, 3, 1).reshape(1, 3, 4)),
    ], atol=0, rtol=0) or f"token 0 should be (0, 1, 6, 7), got {tuple(got[0, 0].tolist())}")
    _expect_other_sizes(fn, lambda x, n_head: (split_heads(x, n_head),), lambda x, n_head: x, seed=1,
                        hint="merging split_heads(x) should give x back ([B, T, C] = {shape}, {n_head} heads): read "
                             "the sizes from y.shape")


# ---------------------------------------------------------------- 4.4 mask with a past (build)
@check("4.4", "causal_mask_with_past", reference=causal_mask_with_past)
def check_causal_mask_with_past(fn):
    """``fn(T, past, device=None) -> Bool [T, past + T]``: new query t (position past + t) sees keys 0 .. past + t."""
    for T, past in ((2, 3), (1, 4), (3, 0), (4, 2), (1, 0)):
        got = expect_tensor(fn(T, past))
        expect(got.shape == (T, past + T), f"with past={past} cached and T={T} new positions the mask is [T, past + T] "
               f"= [{T}, {past + T}], got {tuple(got.shape)}: one column per key, cached ones included")
        expect(got.dtype == torch.bool, f"return a bool tensor (True = may attend), got {got.dtype}")
        ref = causal_mask_with_past(T, past)
        expect(past == 0 or not torch.equal(got, torch.ones(T, past + T, dtype=torch.bool).tril()), "your triangle "
               "starts in the top-left corner (what is_causal=True does): new query 0 sits at position "
               f"past={past} and must see all {past} cached keys and itself")
        expect_mask(got, ref, lambda t, j, past=past: f"new query {t} (position {past + t}) can see key {j}, which "
                    "comes after it", lambda t, j, past=past: f"new query {t} cannot see itself (key {j} = position "
                    "past + t): include the diagonal" if j == past + t else
                    f"new query {t} (position {past + t}) cannot see the earlier key {j}")
    expect(torch.equal(fn(5, 0), causal_mask(5)), "with past=0 the mask should be chapter 03's causal_mask(T)")
    on = expect_runs(fn, 2, 3, device=torch.device("cpu"), hint="the layer calls causal_mask_with_past(T, past, "
                     "device=...): accept device and build the mask there")
    expect(isinstance(on, torch.Tensor) and on.device.type == "cpu"
           and torch.equal(on, causal_mask_with_past(2, 3)), "with device= given, return the same mask on that device")


# ---------------------------------------------------------------- 4.5 pack the heads (extend)
@torch.no_grad()
def pack_heads(heads, proj: torch.nn.Linear, fast: bool = True) -> MultiHeadAttention:
    """The reference: a `MultiHeadAttention` computing ``proj(cat([head(x) for head in heads], -1))``.

    ``heads`` are chapter 03's bias-free `AttentionHead`s of one width, ``proj`` the W_o Linear [C, C]. Rows h*hs ..
    (h+1)*hs - 1 of W_q (the first C rows of ``qkv.weight`` [3C, C]) are head h's ``query.weight``; likewise W_k and
    W_v; ``qkv.bias`` is zero.
    """
    heads = list(heads)
    mha = MultiHeadAttention(heads[0].d_model, len(heads), bias=proj.bias is not None,
                             causal=heads[0].causal, fast=fast)
    mha.to(proj.weight)  # same dtype and device
    mha.qkv.weight.copy_(_packed_weight(heads))  # (3C, C)
    if mha.qkv.bias is not None:
        mha.qkv.bias.zero_()
    mha.proj.load_state_dict(proj.state_dict())
    return mha


def _loop(d_model: int, n_head: int, seed: int, bias: bool = True):
    """Chapter 04's scaffold, built from chapter 03's heads: (heads, proj, x [B, T, C] -> [B, T, C])."""
    with fresh_rng(seed):
        heads = [AttentionHead(d_model, d_model // n_head) for _ in range(n_head)]
        proj = torch.nn.Linear(d_model, d_model, bias=bias)
        if bias:
            with torch.no_grad():
                proj.bias.normal_()  # a bias that matters
    return heads, proj, lambda x: proj(torch.cat([head(x) for head in heads], dim=-1))


def _packed_weight(heads) -> torch.Tensor:
    return torch.cat([torch.cat([getattr(h, n).weight for h in heads]) for n in ("query", "key", "value")])


@check("4.5", "pack_heads", reference=pack_heads)
def check_pack_heads(fn):
    """``fn(heads, proj, fast=True) -> MultiHeadAttention`` computing what the loop of ``heads`` and W_o compute."""
    heads, proj, looped = _loop(8, 2, seed=0)
    mha = fn(heads, proj)
    # the notebook defines its own MultiHeadAttention class: check what it has, not its class
    expect(isinstance(mha, torch.nn.Module) and hasattr(mha, "qkv") and hasattr(mha, "proj"),
           f"return the new MultiHeadAttention (made for you above the region), got {type(mha).__name__}")
    got = mha.qkv.weight.detach()
    expect(got.shape == (24, 8), f"qkv.weight for C=8 should be [3C, C] = [24, 8], got {tuple(got.shape)}")
    by_head = torch.cat([torch.cat([h.query.weight, h.key.weight, h.value.weight]) for h in heads])
    expect_close(got, _packed_weight(heads), "qkv.weight should be [W_q; W_k; W_v] with W_q the heads' query.weight "
                 "stacked in order", mistakes=[
        ("you grouped by head ([q0; k0; v0; q1; ...]); qkv is grouped by kind: every head's query weights first (head "
         "0, head 1, ...), then all key weights, then all value weights", by_head),
        ("the heads are in reverse order inside each block: head 0 comes first", _packed_weight(heads[::-1])),
    ])
    expect(torch.count_nonzero(mha.qkv.bias.detach()) == 0, "qkv.bias still holds its random start: the heads have no "
                                                            "bias, so set qkv.bias to zero")
    expect(close(mha.proj.weight.detach(), proj.weight.detach(), atol=1e-6)
           and close(mha.proj.bias.detach(), proj.bias.detach(), atol=1e-6),
           "proj (W_o) should be a copy of the loop's proj: its weight and its bias")
    x = seeded_randn(2, 5, 8, seed=11)
    with torch.no_grad():
        expect_close(mha(x), looped(x), "the packed layer should compute what the loop computes")
    expect(fn(heads, proj, fast=False).fast is False,
           "pass fast on to the new layer (it is made for you above the region)")
    # another size; a layer without biases (qkv.bias is None)
    for C, n_head, bias in ((12, 3, True), (8, 4, False)):
        other_heads, other_proj, other = _loop(C, n_head, seed=C + n_head, bias=bias)
        hint = (f"right for 2 heads of C=8 but not for {n_head} heads of C={C}"
                f"{'' if bias else ' without biases (qkv.bias is None)'}: loop over all the heads"
                + ("" if bias else ", and only touch qkv.bias when it exists"))
        packed = expect_runs(fn, other_heads, other_proj, hint=hint)
        xo = seeded_randn(2, 5, C, seed=C)
        with torch.no_grad():
            _expect_same(packed(xo), other(xo), hint)


# ---------------------------------------------------------------- 4.6 the scores' scale (debug)
def _layer(d_model: int, n_head: int, seed: int, bias: bool = True) -> MultiHeadAttention:
    with fresh_rng(seed):
        return MultiHeadAttention(d_model, n_head, bias=bias).eval()


@check("4.6", "my_heads_attention")
@torch.no_grad()
def check_heads_attention(fn):
    """``fn(layer, x [B, T, C]) -> [B, T, C]`` equal to ``layer(x)``: causal, scores scaled by 1/√hs."""
    layer, x = _layer(32, 4, seed=6), seeded_randn(2, 6, 32, seed=6)  # hs = 8: √hs, √C, hs differ
    got = expect_tensor(fn(layer, x))
    expect(got.shape != (2, 4, 6, 8), "you returned [B, nh, T, hs]: merge the heads and apply layer.proj (W_o)")
    q, k, v = (split_heads(t, 4) for t in layer.qkv(x).split(32, dim=-1))
    mask = causal_mask(6)

    def attend(**kw):
        return layer.proj(merge_heads(F.scaled_dot_product_attention(q, k, v, **kw)))

    _expect_same(got, layer(x), "differs from layer(x)", mistakes=[
        ("the scores are divided by √C = √d_model (sources 001 and 004); each head's q·k sums only hs products, so "
         "divide by √hs = √(C / nh), layer.head_size (chapter 03's default)", attend(attn_mask=mask, scale=32**-0.5)),
        ("the scores are not scaled at all: divide q kᵀ by √hs (layer.head_size)", attend(attn_mask=mask, scale=1.0)),
        ("the scores are divided by hs instead of √hs", attend(attn_mask=mask, scale=1 / 8)),
        ("position 0 attends to later positions: keep the causal mask", attend(scale=8**-0.5)),
        ("the heads are not mixed: apply layer.proj (W_o) to the merged heads",
         merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))),
    ])
    layer3, x3 = _layer(12, 3, seed=7, bias=False), seeded_randn(1, 7, 12, seed=7)
    hint = "right for 4 heads of C=32 but not for 3 heads of C=12: read sizes from x and the layer"
    _expect_same(expect_runs(fn, layer3, x3, hint=hint), layer3(x3), hint)


# ---------------------------------------------------------------- 4.7 grouped-query (extend)
def grouped_query_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention with nh query heads sharing n_kv key/value heads (n_kv divides nh).

    q [B, nh, T, hs], k and v [B, n_kv, T, hs] -> [B, nh, T, hs]. Query head h uses key/value head
    h // (nh // n_kv): consecutive query heads share one group (as in Llama 2 and Mistral).
    """
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, nh, T, hs)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@check("4.7", "my_grouped_query_attention")
def check_grouped_query_attention(fn):
    """``fn(q [B, nh, T, hs], k [B, n_kv, T, hs], v [B, n_kv, T, hs]) -> [B, nh, T, hs]``, causal."""
    q, k, v = (seeded_randn(2, n, 5, 8, seed=seed) for n, seed in ((4, 2), (2, 3), (2, 4)))
    got = expect_tensor(fn(q, k, v))
    expect(got.shape == q.shape, f"the output has one row per query head: [B, nh, T, hs] = {tuple(q.shape)}, got "
                                 f"{tuple(got.shape)}")
    grouped_k, grouped_v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    attend = F.scaled_dot_product_attention
    expect_close(got, grouped_query_attention_reference(q, k, v), "differs from causal attention where query head h "
                 "uses key/value head h // (nh // n_kv)", mistakes=[
        ("query head 1 used key/value head 1, but heads 0 and 1 share group 0: repeat each key/value head in place "
         "(repeat_interleave along dim 1), not the whole stack (repeat / tile)",
         attend(q, k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1), is_causal=True)),
        ("position 0 attends to later keys: the attention must stay causal", attend(q, grouped_k, grouped_v)),
        ("the scores are not scaled: divide q kᵀ by √hs", attend(q, grouped_k, grouped_v, is_causal=True, scale=1.0)),
    ])
    for n_kv in (1, 4):  # multi-query (one shared head) and plain multi-head
        k2, v2 = (seeded_randn(1, n_kv, 6, 4, seed=seed + n_kv) for seed in (5, 7))
        q2 = seeded_randn(1, 4, 6, 4, seed=9)
        hint = f"right for 2 groups but not for n_kv={n_kv}: compute the group size as nh // n_kv"
        _expect_same(expect_runs(fn, q2, k2, v2, hint=hint), grouped_query_attention_reference(q2, k2, v2), hint)
