"""Chapter 09's checks accept the reference and name the mistake in planted bugs."""

import torch

from transformer_course.checks.encoder_decoder import (
    check_cross_attention,
    check_decoder_self_mask,
    check_shift_right,
)


def _msg(check, fn):
    return check(fn, quiet=True).message


def _stub(*args):
    raise NotImplementedError("Exercise")


# ---- 9.1 decoder_self_mask
def mask_ref(tgt, pad_id):
    T = tgt.shape[1]
    return torch.ones(T, T, dtype=torch.bool).tril()[None] & (tgt != pad_id)[:, None, :]


def test_decoder_self_mask():
    assert check_decoder_self_mask(mask_ref, quiet=True).passed
    assert "causal" in _msg(check_decoder_self_mask, lambda t, p: (t != p)[:, None, :].expand(-1, t.shape[1], -1))
    assert "padding keys are visible" in _msg(
        check_decoder_self_mask, lambda t, p: torch.ones(t.shape[1], t.shape[1], dtype=torch.bool).tril().expand(t.shape[0], -1, -1)
    )
    assert "inverted" in _msg(check_decoder_self_mask, lambda t, p: ~mask_ref(t, p))
    assert "pad_id argument" in _msg(check_decoder_self_mask, lambda t, p: mask_ref(t, 0))
    assert check_decoder_self_mask(_stub, quiet=True).status == "not done"


# ---- 9.2 cross_attention
def cross_ref(x, memory, keep, W_q, W_k, W_v):
    q, k, v = x @ W_q, memory @ W_k, memory @ W_v
    s = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(~keep[:, None, :], float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ v


def test_cross_attention():
    assert check_cross_attention(cross_ref, quiet=True).passed

    def unscaled(x, memory, keep, W_q, W_k, W_v):
        q, k, v = x @ W_q, memory @ W_k, memory @ W_v
        s = (q @ k.transpose(-2, -1)).masked_fill(~keep[:, None, :], float("-inf"))
        return torch.softmax(s, -1).nan_to_num(0.0) @ v

    def unmasked(x, memory, keep, W_q, W_k, W_v):
        return cross_ref(x, memory, torch.ones_like(keep), W_q, W_k, W_v)

    def nan_for_empty(x, memory, keep, W_q, W_k, W_v):
        q, k, v = x @ W_q, memory @ W_k, memory @ W_v
        s = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(~keep[:, None, :], float("-inf"))
        return torch.softmax(s, -1) @ v

    assert "not scaled by 1/sqrt(d)" in _msg(check_cross_attention, unscaled)
    assert "padded source positions are attended" in _msg(check_cross_attention, unmasked)
    assert "all padding gives NaN" in _msg(check_cross_attention, nan_for_empty)
    assert check_cross_attention(_stub, quiet=True).status == "not done"


# ---- 9.3 shift_right
def test_shift_right():
    def ref(tgt, bos):
        return torch.cat([torch.full_like(tgt[:, :1], bos), tgt[:, :-1]], 1)

    assert check_shift_right(ref, quiet=True).passed
    assert "wrong way" in _msg(check_shift_right, lambda t, b: torch.cat([t[:, 1:], torch.full_like(t[:, :1], b)], 1))
    assert "keep the shape" in _msg(check_shift_right, lambda t, b: torch.cat([torch.full_like(t[:, :1], b), t], 1))
    assert "start with bos_id" in _msg(check_shift_right, lambda t, b: torch.cat([torch.zeros_like(t[:, :1]), t[:, :-1]], 1))
    assert check_shift_right(_stub, quiet=True).status == "not done"
