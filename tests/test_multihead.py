"""Tests for transformer_course.multihead (chapter 04): multi-head attention and the KV cache.

References: the loop of chapter-03 heads (weights copied in), torch.nn.MultiheadAttention,
F.scaled_dot_product_attention, hand-worked shapes and masks, and the whole sequence versus the
same sequence fed through a KV cache in pieces.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from transformer_course.attention import AttentionHead, causal_mask
from transformer_course.multihead import (
    KVCache,
    MultiHeadAttention,
    causal_mask_with_past,
    merge_heads,
    split_heads,
)

ATOL = 1e-6


def _mha(d_model=32, n_head=4, seed=0, **kwargs) -> MultiHeadAttention:
    torch.manual_seed(seed)
    m = MultiHeadAttention(d_model, n_head, **kwargs)
    with torch.no_grad():  # non-zero biases, so a wrongly handled bias shows
        m.qkv.bias.normal_() if m.qkv.bias is not None else None
        m.proj.bias.normal_() if m.proj.bias is not None else None
    return m.eval()


def _x(B=2, T=7, C=32, seed=1, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(B, T, C, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _torch_mha(m: MultiHeadAttention) -> nn.MultiheadAttention:
    """torch.nn.MultiheadAttention with m's weights (it packs in_proj as [q | k | v] too)."""
    ref = nn.MultiheadAttention(m.d_model, m.n_head, bias=m.qkv.bias is not None, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(m.qkv.weight)
        ref.out_proj.weight.copy_(m.proj.weight)
        if m.qkv.bias is not None:
            ref.in_proj_bias.copy_(m.qkv.bias)
            ref.out_proj.bias.copy_(m.proj.bias)
    return ref.eval()


# ---------------------------------------------------------------- split / merge


def test_split_heads_shapes_of_seed_003():
    x = torch.randn(4, 16, 64)
    h = split_heads(x, 4)
    assert h.shape == (4, 4, 16, 16)
    assert merge_heads(h).shape == (4, 16, 64)


def test_split_heads_gives_head_h_its_channel_slice():
    x = torch.arange(2 * 3 * 8.0).view(2, 3, 8)
    h = split_heads(x, 4)
    for head in range(4):
        assert torch.equal(h[:, head], x[..., 2 * head : 2 * head + 2])


def test_split_heads_worked_by_hand():
    # B=1, T=3, C=4, nh=2: token t holds 4t..4t+3; head 0 takes the first half of every token
    h = split_heads(torch.arange(12.0).view(1, 3, 4), 2)
    assert h[0, 0].tolist() == [[0, 1], [4, 5], [8, 9]]
    assert h[0, 1].tolist() == [[2, 3], [6, 7], [10, 11]]


@settings(max_examples=25, deadline=None)
@given(
    B=st.integers(1, 3), T=st.integers(1, 9), nh=st.sampled_from([1, 2, 3, 4]), hs=st.integers(1, 5)
)
def test_merge_inverts_split(B, T, nh, hs):
    x = torch.randn(B, T, nh * hs)
    assert torch.equal(merge_heads(split_heads(x, nh)), x)
    y = torch.randn(B, nh, T, hs)
    assert torch.equal(split_heads(merge_heads(y), nh), y)


def test_split_and_merge_bad_input():
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by n_head=4"):
        split_heads(torch.randn(1, 2, 10), 4)
    with pytest.raises(ValueError, match=r"\[B, T, C\]"):
        split_heads(torch.randn(2, 10), 2)
    with pytest.raises(ValueError, match=r"\[B, nh, T, hs\]"):
        merge_heads(torch.randn(2, 3, 10))


# ---------------------------------------------------------------- causal mask with a past


def test_causal_mask_with_past_worked_by_hand():
    got = causal_mask_with_past(2, past=3)
    assert got.dtype == torch.bool
    assert got.int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


@pytest.mark.parametrize("T", [1, 2, 5])
def test_causal_mask_with_no_past_is_chapter_03_mask(T):
    assert torch.equal(causal_mask_with_past(T), causal_mask(T))


@settings(max_examples=25, deadline=None)
@given(T=st.integers(1, 8), past=st.integers(0, 8))
def test_causal_mask_with_past_rule(T, past):
    got = causal_mask_with_past(T, past)
    assert got.shape == (T, past + T)
    # query t sits at position past + t and sees key j exactly when j <= past + t
    want = torch.arange(past + T)[None, :] <= (past + torch.arange(T))[:, None]
    assert torch.equal(got, want)
    # it is the bottom T rows of the full causal mask
    assert torch.equal(got, causal_mask(past + T)[past:])


def test_causal_mask_with_past_bad_input():
    with pytest.raises(ValueError, match=r"past must be a whole number >= 0, got -1: the number of cached positions"):
        causal_mask_with_past(2, past=-1)
    with pytest.raises(ValueError, match=r"past must be a whole number >= 0, got 1.5"):
        causal_mask_with_past(2, past=1.5)


# ---------------------------------------------------------------- KVCache


def test_kv_cache_appends_along_time_and_counts_bytes():
    cache = KVCache()
    assert cache.length == 0 and cache.nbytes == 0
    k1, v1 = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    k2, v2 = torch.randn(2, 3, 1, 5), torch.randn(2, 3, 1, 5)
    assert torch.equal(cache.update(k1, v1)[0], k1)
    k_all, v_all = cache.update(k2, v2)
    assert torch.equal(k_all, torch.cat([k1, k2], 2)) and torch.equal(v_all, torch.cat([v1, v2], 2))
    assert cache.length == 5
    assert cache.nbytes == 2 * (2 * 3 * 5 * 5) * 4
    cache.reset()
    assert cache.length == 0 and cache.nbytes == 0 and cache.k is None


def test_kv_cache_appends_in_place_and_doubles_its_room():
    cache = KVCache()
    steps = [torch.randn(1, 2, 3, 4)] + [torch.randn(1, 2, 1, 4) for _ in range(9)]
    buffers, rooms = [], []
    for step in steps:
        k_all, v_all = cache.update(step, -step)
        buffers.append(cache._k.data_ptr())
        rooms.append(cache._k.shape[2])
    want = torch.cat(steps, dim=2)
    assert torch.equal(k_all, want) and torch.equal(v_all, -want) and cache.length == 12
    assert rooms == [3, 6, 6, 6, 12, 12, 12, 12, 12, 12]  # exact at first, then doubled when full
    assert len(set(buffers)) == 3  # three allocations for twelve positions: appends write in place
    assert cache.nbytes == 2 * 12 * 2 * 4 * 4


def test_kv_cache_with_capacity_allocates_once_and_can_still_grow():
    cache = KVCache(capacity=8)
    cache.update(torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4))
    first = cache._k.data_ptr()
    cache.update(torch.randn(2, 2, 3, 4), torch.randn(2, 2, 3, 4))
    assert cache._k.data_ptr() == first and cache.length == 8
    assert cache._k.shape[2] == 8 and cache.nbytes == 2 * 2 * 2 * 8 * 4 * 4
    past = cache.k.clone()
    cache.update(torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4))  # past the capacity: the room doubles
    assert cache.length == 9 and cache._k.shape[2] == 16 and torch.equal(cache.k[:, :, :8], past)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError,
                           match=r"capacity must be a whole number >= 1 \(or None\).*positions to make room"):
            KVCache(capacity=bad)


def test_kv_cache_bad_input():
    cache = KVCache()
    with pytest.raises(ValueError, match=r"same shape|one shape"):
        cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 5))
    with pytest.raises(ValueError, match=r"\[B, nh, T_new, hs\]"):
        cache.update(torch.randn(2, 3, 4), torch.randn(2, 3, 4))
    cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"reset\(\)"):
        cache.update(torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4))  # another batch size
    with pytest.raises(ValueError, match=r"dtype"):
        cache.update(torch.randn(1, 2, 1, 4).double(), torch.randn(1, 2, 1, 4).double())


# ---------------------------------------------------------------- MultiHeadAttention: references


@pytest.mark.parametrize("n_head, bias", [(1, True), (4, False), (8, True)])
def test_each_head_is_a_chapter_03_head_on_its_slice_of_qkv(n_head, bias):
    """The loop of chapter 04's scaffold: head h, an `AttentionHead` holding rows h*hs .. (h+1)*hs - 1
    of W_q, W_k and W_v, run one after another, concatenated, then W_o."""
    m, x = _mha(n_head=n_head, bias=bias), _x()
    if bias:
        with torch.no_grad():
            m.qkv.bias.zero_()  # chapter 03's heads have no bias
    hs = m.head_size
    heads = [AttentionHead(32, hs).eval() for _ in range(n_head)]
    w_q, w_k, w_v = m.qkv.weight.split(32)  # 3 x (C, C)
    with torch.no_grad():
        for h, head in enumerate(heads):
            for lin, w in ((head.query, w_q), (head.key, w_k), (head.value, w_v)):
                lin.weight.copy_(w[h * hs:(h + 1) * hs])  # (hs, C)
        looped = m.proj(torch.cat([head(x) for head in heads], dim=-1))
        for fast in (True, False):
            m.fast = fast
            torch.testing.assert_close(m(x), looped, atol=ATOL, rtol=0)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("n_head", [1, 4])
def test_matches_torch_nn_multiheadattention(fast, n_head):
    m = _mha(n_head=n_head, fast=fast)
    ref = _torch_mha(m)
    x = _x(T=9)
    # nn.MultiheadAttention's bool mask means the opposite: True = may NOT attend
    want, _ = ref(x, x, x, attn_mask=~causal_mask(9), need_weights=False)
    torch.testing.assert_close(m(x), want, atol=ATOL, rtol=0)


def test_matches_torch_nn_multiheadattention_non_causal_float64():
    m = _mha(causal=False).double()
    ref = _torch_mha(m).double()
    x = _x(dtype=torch.float64)
    want, _ = ref(x, x, x, need_weights=False)
    torch.testing.assert_close(m(x), want, atol=1e-12, rtol=0)
    m.fast = False
    torch.testing.assert_close(m(x), want, atol=1e-12, rtol=0)


def test_fast_and_teaching_paths_agree_and_teaching_keeps_weights():
    m = _mha()
    x = _x(T=11)
    fast = m(x)
    assert m.last_weights is None
    m.fast = False
    slow = m(x)
    torch.testing.assert_close(fast, slow, atol=ATOL, rtol=0)
    w = m.last_weights
    assert w.shape == (2, 4, 11, 11)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 11))
    assert not w.triu(1).any(), "a query attended a later key"


def test_output_is_causal():
    m = _mha()
    x = _x(T=8)
    y = m(x)
    x2 = x.clone()
    x2[:, 5:] += 10.0  # change the future
    torch.testing.assert_close(m(x2)[:, :5], y[:, :5], atol=ATOL, rtol=0)
    assert not torch.allclose(m(x2)[:, 5:], y[:, 5:])


def test_hand_built_heads_attend_where_their_weights_say():
    # C = 4, two heads of hs = 2, on x = [is token 0, is token 1, a, b]. Both heads ask a constant
    # question (q = 1 on their first channel); head 0's keys light up on token 0, head 1's on token 1,
    # so head 0 fetches token 0's a and head 1 token 1's b, at every position.
    m = MultiHeadAttention(4, 2, bias=False, causal=False, fast=False)
    with torch.no_grad():
        w = torch.zeros(12, 4)  # rows: q (head 0: 0-1, head 1: 2-3), k (4-5, 6-7), v (8-9, 10-11)
        w[0, :2] = w[2, :2] = 1.0  # q = 1 for every token, both heads
        w[4, 0], w[6, 1] = 50.0, 50.0  # keys: head 0 <- "is token 0", head 1 <- "is token 1"
        w[8, 2], w[10, 3] = 1.0, 1.0  # values: head 0 <- a, head 1 <- b
        m.qkv.weight.copy_(w)
        m.proj.weight.copy_(torch.eye(4))
    x = torch.tensor([[[1.0, 0, 7, 0], [0, 1.0, 0, 9]]])
    y = m(x)  # merged channels: [head 0 (2), head 1 (2)]
    torch.testing.assert_close(y[0], torch.tensor([[7.0, 0, 9, 0], [7, 0, 9, 0]]), atol=1e-4, rtol=0)
    assert m.last_weights[0, 0, :, 0].min() > 0.99 and m.last_weights[0, 1, :, 1].min() > 0.99


# ---------------------------------------------------------------- masks


@pytest.mark.parametrize("fast", [True, False])
def test_padding_mask_matches_torch_and_gives_no_nan(fast):
    m = _mha(fast=fast)
    ref = _torch_mha(m)
    x = _x(T=6)
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[1, 4:] = False  # the second sequence has 2 padding positions at the end
    y = m(x, mask=keep[:, None, None, :])
    want, _ = ref(x, x, x, attn_mask=~causal_mask(6), key_padding_mask=~keep, need_weights=False)
    torch.testing.assert_close(y, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("fast", [True, False])
def test_fully_masked_row_gives_zero_attention_not_nan(fast):
    m = _mha(fast=fast)
    x = _x(T=5).requires_grad_()
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    mask[0, 0, 2] = False  # query 2 of sequence 0 may see nothing
    y = m(x, mask=mask)
    assert torch.isfinite(y).all()
    # no key: the attention output is zero, so the row is just the output projection's bias
    torch.testing.assert_close(y[0, 2], m.proj.bias, atol=ATOL, rtol=0)
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_mask_bad_input():
    m = _mha()
    x = _x(T=4)
    with pytest.raises(TypeError, match=r"bool tensor.*mask == 0"):
        m(x, mask=torch.zeros(4, 4))
    with pytest.raises(ValueError, match=r"does not broadcast to .* = \(2, 4, 4, 4\).*mask\[:, None, None, :\]"):
        m(x, mask=torch.ones(2, 4, dtype=torch.bool))


# ---------------------------------------------------------------- KV cache through the layer


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("chunks", [[1] * 10, [3, 3, 4], [4, 1, 5], [1, 9], [10]])
def test_cached_pieces_equal_the_whole_sequence(fast, chunks):
    m = _mha(fast=fast)
    x = _x(T=10)
    want = m(x)
    cache, outs, start = KVCache(), [], 0
    for n in chunks:
        outs.append(m(x[:, start : start + n], cache=cache))
        start += n
        assert cache.length == start
    torch.testing.assert_close(torch.cat(outs, dim=1), want, atol=ATOL, rtol=0)


_SMALL = {fast: _mha(d_model=16, n_head=2, fast=fast) for fast in (True, False)}


@settings(max_examples=15, deadline=None)
@given(cuts=st.lists(st.integers(1, 4), min_size=1, max_size=5), fast=st.booleans())
def test_cached_pieces_equal_the_whole_sequence_property(cuts, fast):
    m = _SMALL[fast]
    T = sum(cuts)
    x = _x(T=T, C=16, seed=T)
    want = m(x)
    cache, outs, start = KVCache(), [], 0
    for n in cuts:
        outs.append(m(x[:, start : start + n], cache=cache))
        start += n
    torch.testing.assert_close(torch.cat(outs, dim=1), want, atol=ATOL, rtol=0)


def test_cache_with_padding_mask_over_the_total_length():
    m = _mha()
    x = _x(T=6)
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[0, 1] = False  # hide position 1 of sequence 0
    mask = keep[:, None, None, :]
    want = m(x, mask=mask)
    cache = KVCache()
    first = m(x[:, :4], mask=mask[..., :4], cache=cache)
    rest = m(x[:, 4:], mask=mask, cache=cache)
    torch.testing.assert_close(torch.cat([first, rest], 1), want, atol=ATOL, rtol=0)


def test_is_causal_alone_would_be_wrong_with_a_past():
    """Why the layer builds its own mask: the kernel's triangle is top-left aligned."""
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 1, 2, 8), torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5, 8)
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    shifted = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask_with_past(2, past=3))
    assert not torch.allclose(top_left, shifted, atol=1e-3)


# ---------------------------------------------------------------- training-time behaviour


def test_gradients_match_between_paths():
    x = _x(T=6)
    grads = []
    for fast in (True, False):
        m = _mha(fast=fast).train()
        m(x).pow(2).sum().backward()
        grads.append(m.qkv.weight.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fast", [True, False])
def test_dropout_only_in_training(fast):
    m = _mha(dropout=0.5, fast=fast)
    x = _x()
    m.eval()
    torch.testing.assert_close(m(x), m(x))
    m.train()
    torch.manual_seed(0)
    a = m(x)
    torch.manual_seed(1)
    assert not torch.allclose(a, m(x))


# ---------------------------------------------------------------- bad input


def test_d_model_not_divisible_names_both_numbers():
    with pytest.raises(ValueError, match=r"d_model=64 is not divisible by n_head=5.*1, 2, 4, 8"):
        MultiHeadAttention(64, 5)
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by n_head=4"):
        split_heads(torch.zeros(1, 2, 10), 4)


@pytest.mark.parametrize("kwargs, pattern", [
    ({"d_model": 0, "n_head": 1}, r"d_model must be a whole number >= 1, got 0"),
    ({"d_model": 8, "n_head": 0}, r"n_head must be a whole number >= 1"),
    ({"d_model": 8, "n_head": 2.0}, r"n_head must be a whole number >= 1, got 2.0"),
    ({"d_model": 8, "n_head": True}, r"n_head must be a whole number"),
    ({"d_model": 8, "n_head": 2, "dropout": 1.0}, r"dropout must be a finite number >= 0.0 and < 1.0, got 1.0"),
])
def test_constructor_bad_input(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        MultiHeadAttention(**kwargs)


def test_forward_bad_input():
    m = _mha()
    with pytest.raises(ValueError, match=r"\[B, T >= 1, 32\].*got \(2, 5, 16\)"):
        m(torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match=r"got \(5, 32\)"):
        m(torch.randn(5, 32))
    with pytest.raises(ValueError, match=r"got \(2, 0, 32\)"):
        m(torch.randn(2, 0, 32))


def test_teaching_weights_match_torch_per_head_weights():
    m = _mha(fast=False)
    ref = _torch_mha(m)
    x = _x(T=6)
    m(x)
    _, want = ref(x, x, x, attn_mask=~causal_mask(6), need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(m.last_weights, want, atol=ATOL, rtol=0)  # (B, nh, T, T)


def test_no_length_limit_of_its_own():
    m = _mha()
    assert m(_x(B=1, T=600)).shape == (1, 600, 32)


def test_kv_cache_does_not_keep_the_whole_qkv_output_alive():
    qkv_out = torch.randn(1, 5, 3 * 8)  # what the layer splits: [q | k | v]
    k, v = (split_heads(t, 2) for t in qkv_out.split(8, dim=-1)[1:])  # views into qkv_out
    cache = KVCache()
    cache.update(k, v)
    assert cache.k.untyped_storage().nbytes() == cache.k.numel() * 4  # its own storage, just the keys
    torch.testing.assert_close(cache.k, k, rtol=0, atol=0)


# ---------------------------------------------------------------- bf16 on the CPU


def test_bf16_layer_on_cpu_is_within_bf16_rounding_of_float32():
    """A bf16 copy of the layer attends in bf16 on both paths (PyTorch's fused CPU kernel takes bf16 as
    it is) and stays within bf16 rounding of the float32 layer."""
    m = _mha(seed=3)
    x = _x(T=9)
    want = m(x)
    mb = _mha(seed=3).bfloat16()
    for fast in (True, False):
        mb.fast = fast
        y = mb(x.bfloat16())
        assert y.dtype == torch.bfloat16
        torch.testing.assert_close(y.float(), want, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("with_cache", [False, True])
def test_autocast_bf16_output_is_close_to_float32(with_cache):
    """Under CPU bf16 autocast (chapter 06's training), fast and teaching paths stay within bf16 rounding of fp32."""
    m = _mha(seed=4)
    x = _x(T=8, seed=7)
    want = m(x)
    for fast in (True, False):
        m.fast = fast
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if with_cache:
                cache = KVCache()
                y = torch.cat([m(x[:, :5], cache=cache), m(x[:, 5:], cache=cache)], dim=1)
            else:
                y = m(x)
        assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()
        torch.testing.assert_close(y.float(), want, atol=2e-2, rtol=2e-2)
