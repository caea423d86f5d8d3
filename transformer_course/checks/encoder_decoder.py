"""Checks for chapter 09's exercises (encoder-decoder and cross-attention). Hand-written."""

import torch

from . import check, expect, expect_close

PAD = 0


def _reference_self_mask(tgt, pad_id):
    T = tgt.shape[1]
    return torch.ones(T, T, dtype=torch.bool).tril()[None] & (tgt != pad_id)[:, None, :]


@check("9.1", "decoder_self_mask")
def check_decoder_self_mask(fn):
    """``fn(tgt [B, T], pad_id) -> bool [B, T, T]``: causal AND key not padding."""
    tgt = torch.tensor([[1, 5, 6, 7], [1, 8, PAD, PAD]])
    got = fn(tgt, PAD)
    expect(isinstance(got, torch.Tensor), f"return a tensor, got {type(got).__name__}")
    expect(got.dtype == torch.bool, f"return a bool mask (True = may attend), got dtype {got.dtype}")
    expect(tuple(got.shape) == (2, 4, 4), f"the mask must be [B, T, T] = (2, 4, 4), got {tuple(got.shape)}")
    want = _reference_self_mask(tgt, PAD)
    if got.equal(~want):
        expect(False, "the mask is inverted: True must mean 'may attend'")
    expect(not (got & ~torch.ones(4, 4, dtype=torch.bool).tril()).any(),
           "a position can see a later one: query t may only attend keys j <= t (the causal part)")
    expect(not got[1, :, 2:].any(), "padding keys are visible: key j must be hidden when tgt[b, j] is the pad id")
    expect(got.equal(want), "some allowed positions are masked: query t should see every real key j <= t")
    other = fn(torch.tensor([[3, 3, 9]]), 9)  # another pad id: it must be used, not assumed to be 0
    expect(other.equal(_reference_self_mask(torch.tensor([[3, 3, 9]]), 9)),
           "use the pad_id argument rather than assuming padding is 0")


def _reference_cross(x, memory, keep, W_q, W_k, W_v):
    q, k, v = x @ W_q, memory @ W_k, memory @ W_v
    scores = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(~keep[:, None, :], float("-inf"))
    return torch.softmax(scores, -1).nan_to_num(0.0) @ v


@check("9.2", "cross_attention")
def check_cross_attention(fn):
    """``fn(x, memory, memory_keep, W_q, W_k, W_v) -> [B, T, d]``."""
    g = torch.Generator().manual_seed(9)
    d = 4
    x, memory = torch.randn(2, 3, d, generator=g), torch.randn(2, 5, d, generator=g)
    W_q, W_k, W_v = (torch.randn(d, d, generator=g) for _ in range(3))
    keep = torch.tensor([[True] * 5, [True, True, False, False, False]])
    got = fn(x, memory, keep, W_q, W_k, W_v)
    expect(isinstance(got, torch.Tensor) and tuple(got.shape) == (2, 3, d),
           f"the output must be [B, T, d] = (2, 3, {d}): one vector per decoder position")
    want = _reference_cross(x, memory, keep, W_q, W_k, W_v)
    swapped = _reference_cross(memory[:, :3], x.repeat(1, 2, 1)[:, :5], keep, W_q, W_k, W_v)
    if torch.allclose(got, swapped, atol=1e-5):
        expect(False, "queries must come from the decoder (x) and keys/values from the encoder (memory)")
    unscaled = _reference_cross(x * d**0.5, memory, keep, W_q, W_k, W_v)
    if torch.allclose(got, unscaled, atol=1e-4) and not torch.allclose(got, want, atol=1e-4):
        expect(False, "scores were not scaled by 1/sqrt(d)")
    no_mask = _reference_cross(x, memory, torch.ones_like(keep), W_q, W_k, W_v)
    if torch.allclose(got, no_mask, atol=1e-5):
        expect(False, "padded source positions are attended: mask keys where memory_keep is False")
    expect(not got.isnan().any(), "the output holds NaN: mask with -inf before the softmax, not after")
    expect_close(got, want, "the output differs from softmax(q kᵀ / sqrt(d)) v with pad keys masked", atol=1e-5)
    empty = fn(x[:1], memory[:1], torch.zeros(1, 5, dtype=torch.bool), W_q, W_k, W_v)
    expect(not empty.isnan().any(), "a source that is all padding gives NaN: return zeros there (e.g. nan_to_num)")
    expect_close(empty, torch.zeros(1, 3, d), "a source that is all padding must give a zero output")


@check("9.3", "shift_right")
def check_shift_right(fn):
    """``fn(tgt [B, T], bos_id) -> [B, T]``: bos first, then tgt without its last token."""
    tgt = torch.tensor([[7, 8, 9, 2], [5, 6, 2, 0]])
    got = fn(tgt, 1)
    expect(isinstance(got, torch.Tensor), f"return a tensor, got {type(got).__name__}")
    expect(tuple(got.shape) == (2, 4), f"keep the shape [B, T] = (2, 4), got {tuple(got.shape)}: drop the last token")
    if got.equal(torch.tensor([[8, 9, 2, 1], [6, 2, 0, 1]])):
        expect(False, "shifted the wrong way: the decoder input is the target moved right, bos in front")
    expect((got[:, 0] == 1).all(), "every row must start with bos_id")
    expect(got.equal(torch.tensor([[1, 7, 8, 9], [1, 5, 6, 2]])), "after bos must come tgt[:, :-1], in order")
    expect(not got.equal(tgt) and tgt.equal(torch.tensor([[7, 8, 9, 2], [5, 6, 2, 0]])),
           "do not change tgt in place: build a new tensor")
