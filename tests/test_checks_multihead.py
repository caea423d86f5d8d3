"""The chapter 04 checks accept the reference, reject realistic mistakes with the right hint, and
report a stub that raises NotImplementedError as "not done"."""

import pytest
import torch
import torch.nn.functional as F

from transformer_course.checks import CheckOutcome
from transformer_course.checks.multihead import (
    check_causal_mask_with_past,
    check_grouped_query_attention,
    check_merge_heads,
    check_pack_qkv_weight,
    check_split_heads,
    grouped_query_attention_reference,
)
from transformer_course.multihead import causal_mask_with_past, merge_heads, split_heads


def run(check_fn, candidate) -> CheckOutcome:
    return check_fn(candidate, quiet=True)


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise: write me")


ALL_CHECKS = [check_split_heads, check_merge_heads, check_pack_qkv_weight, check_causal_mask_with_past,
              check_grouped_query_attention]


@pytest.mark.parametrize("check_fn", ALL_CHECKS)
def test_stub_is_not_done(check_fn):
    outcome = run(check_fn, stub)
    assert outcome.status == "not done"
    assert outcome.exercise == check_fn.exercise


def test_check_prints_one_line(capsys):
    check_split_heads(split_heads)
    assert capsys.readouterr().out == "✅ Exercise 4.1 (my_split_heads): passed\n"


def assert_rejects(check_fn, candidate, hint):
    outcome = run(check_fn, candidate)
    assert outcome.status == "failed", outcome
    assert hint in outcome.message, outcome.message


# ---------------------------------------------------------------- 4.1


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


@pytest.mark.parametrize("candidate, hint", [
    (split_no_transpose, "you returned [B, T, nh, hs]"),
    (split_straight, "you reshaped straight to [B, nh, T, hs]"),
    (split_strided, "every nh-th channel"),
    (split_hard_coded, "read B, T, C from x.shape"),
])
def test_split_heads_rejects(candidate, hint):
    assert_rejects(check_split_heads, candidate, hint)


def test_split_heads_accepts_reference_and_reshape_version():
    assert run(check_split_heads, split_heads).passed
    assert run(check_split_heads, lambda x, nh: x.reshape(*x.shape[:2], nh, -1).permute(0, 2, 1, 3)).passed


# ---------------------------------------------------------------- 4.2


def merge_view(y):
    B, nh, T, hs = y.shape
    return y.transpose(1, 2).view(B, T, nh * hs)


def merge_no_transpose(y):
    B, nh, T, hs = y.shape
    return y.reshape(B, T, nh * hs)


def merge_interleaved(y):
    B, nh, T, hs = y.shape
    return y.permute(0, 2, 3, 1).reshape(B, T, nh * hs)


@pytest.mark.parametrize("candidate, hint", [
    (merge_view, "not contiguous"),
    (merge_no_transpose, "without undoing the head transpose"),
    (merge_interleaved, "interleaved"),
])
def test_merge_heads_rejects(candidate, hint):
    assert_rejects(check_merge_heads, candidate, hint)


def test_merge_heads_accepts_reference_and_contiguous_view():
    assert run(check_merge_heads, merge_heads).passed
    assert run(check_merge_heads, lambda y: y.transpose(1, 2).contiguous().view(y.shape[0], y.shape[2], -1)).passed


# ---------------------------------------------------------------- 4.3


def pack_ref(heads):
    return torch.cat([torch.cat([getattr(h, n).weight for h in heads]) for n in ("query", "key", "value")])


def pack_by_head(heads):
    return torch.cat([torch.cat([h.query.weight, h.key.weight, h.value.weight]) for h in heads])


def pack_transposed(heads):  # stacked the transposed [C, hs] weights side by side
    return torch.cat([torch.cat([getattr(h, n).weight.T for h in heads], dim=1) for n in ("query", "key", "value")], dim=1)


def pack_two_heads_only(heads):
    return torch.cat([torch.cat([getattr(h, n).weight for h in heads[:2]]) for n in ("query", "key", "value")])


def pack_reversed(heads):
    return pack_ref(heads[::-1])


@pytest.mark.parametrize("candidate, hint", [
    (pack_by_head, "you grouped by head"),
    (pack_transposed, "got [C, 3C]"),
    (pack_reversed, "reverse order"),
    (pack_two_heads_only, "loop over all the heads"),
])
def test_pack_rejects(candidate, hint):
    assert_rejects(check_pack_qkv_weight, candidate, hint)


def test_pack_accepts_reference():
    assert run(check_pack_qkv_weight, pack_ref).passed
    assert run(check_pack_qkv_weight, lambda heads: pack_transposed(heads).T).passed


# ---------------------------------------------------------------- 4.4


@pytest.mark.parametrize("candidate, hint", [
    (lambda T, past: torch.ones(T, past + T, dtype=torch.bool).tril(), "top-left corner"),
    (lambda T, past: torch.ones(T, past + T, dtype=torch.bool).tril(past - 1), "cannot see itself"),
    (lambda T, past: torch.ones(T, past + T, dtype=torch.bool).tril(past + 1), "which comes after it"),
    (lambda T, past: torch.ones(T, T, dtype=torch.bool).tril(), "one column per key"),
    (lambda T, past: torch.ones(T, past + T).tril(past), "return a bool tensor"),
    (lambda T, past: torch.ones(T, past + T, dtype=torch.bool).tril(past).triu(past - 1), "cannot see the earlier key"),
])
def test_mask_with_past_rejects(candidate, hint):
    assert_rejects(check_causal_mask_with_past, candidate, hint)


def test_mask_with_past_accepts_reference():
    assert run(check_causal_mask_with_past, causal_mask_with_past).passed
    assert run(check_causal_mask_with_past, lambda T, past: torch.ones(T, past + T, dtype=torch.bool).tril(past)).passed


# ---------------------------------------------------------------- 4.5


def gqa_tiled(q, k, v):
    g = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1), is_causal=True)


def gqa_not_causal(q, k, v):
    g = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1))


def gqa_unscaled(q, k, v):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    w = (q @ k.transpose(-2, -1)).masked_fill(~torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).tril(), float("-inf"))
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
    assert_rejects(check_grouped_query_attention, candidate, hint)


def test_gqa_accepts_reference():
    assert run(check_grouped_query_attention, grouped_query_attention_reference).passed


def test_gqa_reference_matches_pytorch_enable_gqa():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 6, 7, 4, generator=g), torch.randn(2, 2, 7, 4, generator=g), torch.randn(2, 2, 7, 4, generator=g)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(grouped_query_attention_reference(q, k, v), want, atol=1e-6, rtol=0)
