"""The chapter 04 checks accept the reference and reject realistic mistakes with the right hint
(tests/test_checks_all.py runs every check on a stub and on its reference)."""

import pytest
import torch
import torch.nn.functional as F
from check_helpers import assert_rejected, run, stub

from transformer_course.attention import causal_mask, scaled_dot_product_attention
from transformer_course.checks.multihead import (
    check_causal_mask_with_past,
    check_grouped_query_attention,
    check_heads_attention,
    check_merge_heads,
    check_pack_heads,
    check_predict_scores_shape,
    check_split_heads,
    grouped_query_attention_reference,
    pack_heads,
)
from transformer_course.multihead import (
    MultiHeadAttention,
    causal_mask_with_past,
    merge_heads,
    split_heads,
)

BUILD_CHECKS = {check_split_heads: split_heads, check_merge_heads: merge_heads,
                check_causal_mask_with_past: causal_mask_with_past, check_pack_heads: pack_heads}


@pytest.mark.parametrize("check_fn", list(BUILD_CHECKS), ids=lambda c: c.__name__)
def test_build_checks_hand_back_what_the_chapter_uses(check_fn):
    """A passing candidate is used; a stub falls back to the package's reference."""
    reference = BUILD_CHECKS[check_fn]
    assert run(check_fn, reference).use is reference
    assert run(check_fn, stub).use is reference

    def mine(*args, **kwargs):
        return reference(*args, **kwargs)

    outcome = run(check_fn, mine)
    assert outcome.passed and outcome.use is mine


def test_check_prints_one_line(capsys):
    check_split_heads(split_heads)
    assert capsys.readouterr().out == (
        "✅ Exercise 4.1 (split_heads): passed - the rest of the chapter uses yours\n")
    check_merge_heads(stub)
    assert capsys.readouterr().out.startswith("⏳ Exercise 4.3 (merge_heads): not done yet - the "
                                              "chapter carries on with the package's merge_heads")


# ---------------------------------------------------------------- 4.1 split heads (build)


def split_no_transpose(x, n_head):
    B, T, C = x.shape
    return x.view(B, T, n_head, C // n_head)


def split_straight(x, n_head):
    B, T, C = x.shape
    return x.view(B, n_head, T, C // n_head)


def split_strided(x, n_head):
    B, T, C = x.shape
    return x.view(B, T, C // n_head, n_head).transpose(-1, -2).transpose(1, 2)


def split_hard_coded(x, n_head):
    return x.view(1, 3, 2, 2).transpose(1, 2)


def split_hs_as_heads(x, n_head):  # treats n_head as the head size: fine while nh = hs = 2
    B, T, C = x.shape
    return x.view(B, T, C // n_head, n_head).transpose(1, 2)


@pytest.mark.parametrize("candidate, hint", [
    (split_no_transpose, "you returned [B, T, nh, hs]"),
    (split_straight, "you reshaped straight to [B, nh, T, hs]"),
    (split_strided, "every nh-th channel"),
    (split_hard_coded, "read B, T, C from x.shape"),
    (split_hs_as_heads, "hs from C // n_head"),
])
def test_split_heads_rejects(candidate, hint):
    assert_rejected(check_split_heads, candidate, hint)


def test_split_heads_accepts_reference_and_reshape_version():
    assert run(check_split_heads, split_heads).passed
    assert run(
        check_split_heads, lambda x, nh: x.reshape(*x.shape[:2], nh, -1).permute(0, 2, 1, 3)
    ).passed
    assert run(
        check_split_heads, lambda x, nh: x.unflatten(-1, (nh, -1)).transpose(1, 2).contiguous()
    ).passed


# ---------------------------------------------------------------- 4.2 predict the scores' shape


@pytest.mark.parametrize("answer, hint", [
    ((4, 4, 10, 16), "source 003's label"),
    ((4, 10, 4, 10), "before the time axis"),
    ((4, 4, 16, 16), "T is 10 here"),
    ((4, 10, 10), "each head has its own table"),
    ((2, 2), "is not it"),
    ("[4, 4, 10, 10]", "tuple of ints"),
    (None, "tuple of ints"),
])
def test_predict_scores_shape_rejects(answer, hint):
    assert_rejected(check_predict_scores_shape, lambda: answer, hint)


@pytest.mark.parametrize("answer", [(4, 4, 10, 10), [4, 4, 10, 10], torch.Size([4, 4, 10, 10])])
def test_predict_scores_shape_accepts(answer):
    assert run(check_predict_scores_shape, lambda: answer).passed


def test_predict_scores_shape_is_what_the_chapter_computes():
    q = split_heads(torch.randn(4, 10, 64), 4)
    _, weights = scaled_dot_product_attention(q, q, q, causal_mask(10))
    assert run(check_predict_scores_shape, lambda: tuple(weights.shape)).passed


# ---------------------------------------------------------------- 4.3 merge heads (build)


def merge_view(y):
    B, nh, T, hs = y.shape
    return y.transpose(1, 2).view(B, T, nh * hs)


def merge_no_transpose(y):
    B, nh, T, hs = y.shape
    return y.reshape(B, T, nh * hs)


def merge_interleaved(y):
    B, nh, T, hs = y.shape
    return y.permute(0, 2, 3, 1).reshape(B, T, nh * hs)


def merge_hard_coded(y):
    return y.transpose(1, 2).reshape(1, 3, 4)


@pytest.mark.parametrize("candidate, hint", [
    (merge_view, "not contiguous"),
    (merge_no_transpose, "without undoing the head transpose"),
    (merge_interleaved, "interleaved"),
    (merge_hard_coded, "read the sizes from y.shape"),
])
def test_merge_heads_rejects(candidate, hint):
    assert_rejected(check_merge_heads, candidate, hint)


def test_merge_heads_accepts_reference_and_contiguous_view():
    assert run(check_merge_heads, merge_heads).passed
    assert run(
        check_merge_heads, lambda y: y.transpose(1, 2).contiguous().view(y.shape[0], y.shape[2], -1)
    ).passed


# ---------------------------------------------------------------- 4.4 mask with a past (build)


def ones(T, past, device=None):
    return torch.ones(T, past + T, dtype=torch.bool, device=device)


@pytest.mark.parametrize(
    "candidate, hint",
    [
        (lambda T, past, device=None: ones(T, past, device).tril(), "top-left corner"),
        (lambda T, past, device=None: ones(T, past, device).tril(past - 1), "cannot see itself"),
        (lambda T, past, device=None: ones(T, past, device).tril(past + 1), "which comes after it"),
        (
            lambda T, past, device=None: torch.ones(T, T, dtype=torch.bool).tril(),
            "one column per key",
        ),
        (lambda T, past, device=None: torch.ones(T, past + T).tril(past), "return a bool tensor"),
        (
            lambda T, past, device=None: ones(T, past, device).tril(past).triu(past - 1),
            "cannot see the earlier key",
        ),
        (lambda T, past: ones(T, past).tril(past), "accept device"),
    ],
)
def test_mask_with_past_rejects(candidate, hint):
    assert_rejected(check_causal_mask_with_past, candidate, hint)


def test_mask_with_past_accepts_reference():
    assert run(check_causal_mask_with_past, causal_mask_with_past).passed
    assert run(
        check_causal_mask_with_past, lambda T, past=0, device=None: ones(T, past, device).tril(past)
    ).passed


# ---------------------------------------------------------------- 4.5 pack the heads (extend)


def _new_layer(heads, proj, fast=True):
    heads = list(heads)
    mha = MultiHeadAttention(heads[0].d_model, len(heads), bias=proj.bias is not None, fast=fast)
    return heads, mha


def _finish(mha, proj, weight, zero_bias=True, copy_proj=True):
    with torch.no_grad():
        mha.qkv.weight.copy_(weight)
        if zero_bias and mha.qkv.bias is not None:
            mha.qkv.bias.zero_()
        if copy_proj:
            mha.proj.load_state_dict(proj.state_dict())
    return mha


def by_kind(heads):
    return torch.cat(
        [torch.cat([getattr(h, n).weight for h in heads]) for n in ("query", "key", "value")]
    )


def pack_by_head(heads, proj, fast=True):
    heads, mha = _new_layer(heads, proj, fast)
    return _finish(
        mha,
        proj,
        torch.cat([torch.cat([h.query.weight, h.key.weight, h.value.weight]) for h in heads]),
    )


def pack_reversed(heads, proj, fast=True):
    heads, mha = _new_layer(heads, proj, fast)
    return _finish(mha, proj, by_kind(heads[::-1]))


def pack_keeps_random_bias(heads, proj, fast=True):
    heads, mha = _new_layer(heads, proj, fast)
    return _finish(mha, proj, by_kind(heads), zero_bias=False)


def pack_forgets_proj(heads, proj, fast=True):
    heads, mha = _new_layer(heads, proj, fast)
    return _finish(mha, proj, by_kind(heads), copy_proj=False)


def pack_two_heads_only(heads, proj, fast=True):
    heads, mha = _new_layer(heads, proj, fast)
    two = by_kind(heads[:2])
    return _finish(
        mha, proj, two if two.shape == mha.qkv.weight.shape else torch.zeros_like(mha.qkv.weight)
    )


def pack_assumes_bias(heads, proj, fast=True):
    heads, mha = _new_layer(heads, proj, fast)
    with torch.no_grad():
        mha.qkv.weight.copy_(by_kind(heads))
        mha.qkv.bias.zero_()  # AttributeError when the layer has no biases
        mha.proj.load_state_dict(proj.state_dict())
    return mha


@pytest.mark.parametrize("candidate, hint", [
    (pack_by_head, "you grouped by head"),
    (pack_reversed, "reverse order"),
    (pack_keeps_random_bias, "qkv.bias still holds its random start"),
    (pack_forgets_proj, "proj (W_o) should be a copy"),
    (pack_two_heads_only, "loop over all the heads"),
    (pack_assumes_bias, "only touch qkv.bias when it exists"),
])
def test_pack_heads_rejects(candidate, hint):
    assert_rejected(check_pack_heads, candidate, hint)


def test_pack_heads_accepts_reference_and_a_loop_version():
    assert run(check_pack_heads, pack_heads).passed

    def by_rows(heads, proj, fast=True):
        heads, mha = _new_layer(heads, proj, fast)
        C, hs = heads[0].d_model, heads[0].query.weight.shape[0]  # query.weight is [hs, C]
        with torch.no_grad():
            for i, kind in enumerate(("query", "key", "value")):
                for h, head in enumerate(heads):
                    mha.qkv.weight[i * C + h * hs:i * C + (h + 1) * hs] = getattr(head, kind).weight
            if mha.qkv.bias is not None:
                mha.qkv.bias.fill_(0.0)
            mha.proj.weight.copy_(proj.weight)
            if mha.proj.bias is not None:
                mha.proj.bias.copy_(proj.bias)
        return mha

    assert run(check_pack_heads, by_rows).passed


# ---------------------------------------------------------------- 4.6 the scores' scale (debug)


def heads_attention(layer, x, scale="hs", causal=True, project=True):
    B, T, C = x.shape
    q, k, v = (split_heads(t, layer.n_head) for t in layer.qkv(x).split(C, dim=-1))
    scale = {"hs": layer.head_size**-0.5, "C": C**-0.5, "none": 1.0}[scale]
    y, _ = scaled_dot_product_attention(q, k, v, causal_mask(T) if causal else None, scale=scale)
    return layer.proj(merge_heads(y)) if project else merge_heads(y)


@pytest.mark.parametrize(
    "candidate, hint",
    [
        (
            lambda layer, x: heads_attention(layer, x, scale="C"),
            "divided by √C = √d_model",
        ),  # the chapter's bug
        (lambda layer, x: heads_attention(layer, x, scale="none"), "not scaled at all"),
        (lambda layer, x: heads_attention(layer, x, causal=False), "keep the causal mask"),
        (lambda layer, x: heads_attention(layer, x, project=False), "apply layer.proj"),
        (
            lambda layer, x: heads_attention(layer, x) if x.shape[-1] == 32 else x,
            "not for 3 heads of C=12",
        ),
    ],
)
def test_heads_attention_rejects(candidate, hint):
    assert_rejected(check_heads_attention, candidate, hint)


def test_heads_attention_accepts_the_fix_and_the_default_scale():
    assert run(check_heads_attention, heads_attention).passed

    def default_scale(layer, x):  # chapter 03's function scales by 1/√hs when given no scale
        q, k, v = (split_heads(t, layer.n_head) for t in layer.qkv(x).split(x.shape[-1], dim=-1))
        return layer.proj(
            merge_heads(scaled_dot_product_attention(q, k, v, causal_mask(x.shape[1]))[0])
        )

    assert run(check_heads_attention, default_scale).passed
    assert run(check_heads_attention, lambda layer, x: layer(x)).passed


# ---------------------------------------------------------------- 4.7 grouped-query (extend)


def gqa_tiled(q, k, v):
    g = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(
        q, k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1), is_causal=True
    )


def gqa_not_causal(q, k, v):
    g = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1))


def gqa_unscaled(q, k, v):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    w = (q @ k.transpose(-2, -1)).masked_fill(
        ~torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).tril(), float("-inf")
    )
    return w.softmax(-1) @ v


def gqa_group_of_two(q, k, v):
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("candidate, hint", [
    (gqa_tiled, "repeat_interleave"),
    (gqa_not_causal, "attends to later keys"),
    (gqa_unscaled, "not scaled"),
    (gqa_group_of_two, "group size as nh // n_kv"),
])
def test_gqa_rejects(candidate, hint):
    assert_rejected(check_grouped_query_attention, candidate, hint)


def test_gqa_accepts_reference():
    assert run(check_grouped_query_attention, grouped_query_attention_reference).passed


def test_gqa_reference_matches_pytorch_enable_gqa():
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 6, 7, 4, generator=g),
        torch.randn(2, 2, 7, 4, generator=g),
        torch.randn(2, 2, 7, 4, generator=g),
    )
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(grouped_query_attention_reference(q, k, v), want, atol=1e-6, rtol=0)
