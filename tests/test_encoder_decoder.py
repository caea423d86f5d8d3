"""Encoder-decoder (chapter 09): parity with PyTorch's layers, masks that hold, clear errors."""

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from transformer_course.encoder_decoder import (
    CrossAttention,
    DecoderLayer,
    EncoderDecoder,
    EncoderLayer,
    Seq2SeqConfig,
    copy_from_torch,
    key_mask,
    padding_mask,
)

C, NH = 32, 4


@pytest.fixture(autouse=True)
def _no_torch_fastpath():
    torch.backends.mha.set_fastpath_enabled(False)  # PyTorch's inference fast path zeroes padded rows
    yield
    torch.backends.mha.set_fastpath_enabled(True)


def _masks():
    src_keep = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    tgt_keep = torch.tensor([[True] * 5, [True] * 2 + [False] * 3])
    return src_keep, tgt_keep


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("fast", [True, False])
def test_layers_match_pytorch(norm_first, fast):
    torch.manual_seed(1)
    norm = "pre" if norm_first else "post"
    ref_enc = nn.TransformerEncoderLayer(C, NH, 4 * C, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    ref_dec = nn.TransformerDecoderLayer(C, NH, 4 * C, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    enc = copy_from_torch(EncoderLayer(C, NH, norm=norm, fast=fast).eval(), ref_enc)
    dec = copy_from_torch(DecoderLayer(C, NH, norm=norm, fast=fast).eval(), ref_dec)
    src_keep, tgt_keep = _masks()
    src, tgt = torch.randn(2, 7, C), torch.randn(2, 5, C)
    mem = enc(src, mask=key_mask(src_keep))
    mem_ref = ref_enc(src, src_key_padding_mask=~src_keep)
    assert torch.allclose(mem[src_keep], mem_ref[src_keep], atol=1e-5)
    out = dec(tgt, mem, self_mask=key_mask(tgt_keep), memory_mask=key_mask(src_keep))
    out_ref = ref_dec(tgt, mem_ref, tgt_mask=torch.ones(5, 5, dtype=torch.bool).triu(1), tgt_is_causal=True,
                      tgt_key_padding_mask=~tgt_keep, memory_key_padding_mask=~src_keep)
    assert torch.allclose(out[tgt_keep], out_ref[tgt_keep], atol=1e-5)
    # no padding at all: every row must match
    assert torch.allclose(enc(src), ref_enc(src), atol=1e-5)


def test_cross_attention_matches_nn_multihead_attention():
    ours = CrossAttention(C, NH).eval()
    theirs = nn.MultiheadAttention(C, NH, batch_first=True).eval()
    with torch.no_grad():
        theirs.in_proj_weight.copy_(ours.qkv.weight)
        theirs.in_proj_bias.copy_(ours.qkv.bias)
        theirs.out_proj.weight.copy_(ours.proj.weight)
        theirs.out_proj.bias.copy_(ours.proj.bias)
    x, mem = torch.randn(3, 4, C), torch.randn(3, 9, C)
    keep = torch.rand(3, 9) > 0.3
    keep[:, 0] = True
    ref, _ = theirs(x, mem, mem, key_padding_mask=~keep)
    assert torch.allclose(ours(x, mem, key_mask(keep)), ref, atol=1e-6)
    ours.fast = False  # the teaching path agrees too
    assert torch.allclose(ours(x, mem, key_mask(keep)), ref, atol=1e-6)


def test_all_padding_source_gives_no_nan():
    attn = CrossAttention(C, NH)
    for fast in (True, False):
        attn.fast = fast
        out = attn(torch.randn(2, 3, C), torch.randn(2, 4, C), key_mask(torch.zeros(2, 4, dtype=torch.bool)))
        assert not out.isnan().any()
    model = _model()
    src = torch.zeros(2, 5, dtype=torch.long)  # every source token is padding
    logits, _ = model(src, torch.ones(2, 3, dtype=torch.long))
    assert torch.isfinite(logits).all()


@functools.cache
def _model(norm="post", **kw):
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(src_vocab_size=20, tgt_vocab_size=15, max_src_len=16, max_tgt_len=10, d_model=C,
                        n_head=NH, norm=norm, **kw)
    return EncoderDecoder(cfg).eval()


@settings(max_examples=12, deadline=None)
@given(n_real=st.integers(1, 8), n_pad=st.integers(1, 4), seed=st.integers(0, 2**16),
       norm=st.sampled_from(["pre", "post"]))
def test_changing_padded_source_positions_changes_nothing(n_real, n_pad, seed, norm):
    model = _model(norm)
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, 20, (1, n_real + n_pad), generator=g)
    src[:, n_real:] = 0
    tgt = torch.randint(1, 15, (1, 6), generator=g)
    base, _ = model(src, tgt)
    shorter, _ = model(src[:, :n_real], tgt)  # the same sentence without padding
    assert torch.allclose(base, shorter, atol=1e-5)
    # whatever the pad *embedding* holds, real outputs do not move
    saved = model.src_embed.token.weight[0].clone()
    with torch.no_grad():
        model.src_embed.token.weight[0].normal_(generator=g)
        moved, _ = model(src, tgt)
        model.src_embed.token.weight[0] = saved
    assert torch.allclose(moved, base, atol=1e-5)


@settings(max_examples=12, deadline=None)
@given(T=st.integers(2, 9), t=st.integers(0, 8), seed=st.integers(0, 2**16))
def test_future_target_tokens_never_change_earlier_outputs(T, t, seed):
    t = t % (T - 1)  # a position with a future
    model = _model("pre")
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, 20, (2, 6), generator=g)
    tgt = torch.randint(1, 15, (2, T), generator=g)
    changed = tgt.clone()
    changed[:, t + 1 :] = torch.randint(1, 15, (2, T - t - 1), generator=g)
    a, _ = model(src, tgt)
    b, _ = model(src, changed)
    assert torch.allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-5)


def test_greedy_decode_encodes_once_and_matches_reencoding():
    model = _model()
    calls = []
    hooks = [layer.register_forward_hook(lambda *_: calls.append(1)) for layer in model.encoder]
    src = torch.randint(1, 20, (3, 7))
    out = model.greedy_decode(src, bos_id=1, eos_id=2, max_new_tokens=5)
    for hook in hooks:
        hook.remove()
    assert len(calls) == len(model.encoder)
    seq = torch.full((3, 1), 1)
    for _ in range(5):
        logits, _ = model(src, seq)
        seq = torch.cat([seq, logits[:, -1:].argmax(-1)], dim=1)
    finished = (seq == 2).cumsum(1).roll(1, 1).clamp(max=1).bool()  # positions after an EOS
    finished[:, 0] = False
    assert torch.equal(out, seq.masked_fill(finished, 0)[:, : out.shape[1]])


def test_loss_ignores_padding_and_is_near_log_vocab_at_init():
    model = _model()
    src = torch.randint(1, 20, (4, 6))
    tgt = torch.randint(3, 15, (4, 5))
    targets = tgt.clone()
    targets[:, 3:] = 0
    _, loss = model(src, tgt, targets)
    logits, _ = model(src, tgt)
    want = nn.functional.cross_entropy(logits[:, :3].flatten(0, 1), targets[:, :3].flatten())
    assert torch.allclose(loss, want)
    assert abs(loss.item() - torch.log(torch.tensor(15.0)).item()) < 1.0


def test_padding_mask_and_key_mask():
    keep = padding_mask(torch.tensor([[4, 5, 0], [0, 0, 0]]), 0)
    assert keep.tolist() == [[True, True, False], [False, False, False]]
    assert key_mask(keep).shape == (2, 1, 1, 3)
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        padding_mask(torch.tensor([1, 2]), 0)


def test_bad_input_messages():
    model = _model()
    src = torch.randint(1, 20, (2, 5))
    with pytest.raises(ValueError, match="source batch has 2 sequences but target batch has 3"):
        model(src, torch.ones(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="target has 11 tokens but this model handles at most max_tgt_len=10"):
        model(src, torch.ones(2, 11, dtype=torch.long))
    with pytest.raises(ValueError, match="empty source sequence"):
        model(torch.zeros(2, 0, dtype=torch.long), torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="pad_id 20 is outside the src vocabulary 0..19"):
        Seq2SeqConfig(src_vocab_size=20, tgt_vocab_size=30, max_src_len=8, max_tgt_len=8, pad_id=20)
    with pytest.raises(ValueError, match="norm must be one of"):
        Seq2SeqConfig(20, 20, 8, 8, norm="middle")
    with pytest.raises(ValueError, match="decoder batch 2 != encoder batch 3"):
        CrossAttention(C, NH)(torch.randn(2, 3, C), torch.randn(3, 4, C))
    with pytest.raises(ValueError, match=r"its memory must have shape \[B, T >= 1, 32\], got"):
        CrossAttention(C, NH)(torch.randn(2, 3, C), torch.randn(2, 4, C + 1))
