"""Tests for transformer_course.block (chapter 05): LayerNorm, FeedForward, TransformerBlock.

References: torch.nn.LayerNorm, hand-worked normalisations, the GELU formulas and Hugging Face's
NewGELUActivation, torch.nn.TransformerEncoderLayer (pre- and post-norm, weights copied in),
Hugging Face's GPT-2 block (weights copied in), the whole sequence against a KV cache, and the
parameter count worked out by hand.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from transformer_course.block import (
    ACTIVATIONS,
    NORMS,
    FeedForward,
    LayerNorm,
    TransformerBlock,
    block_parameter_count,
    input_gradient_norms,
)
from transformer_course.multihead import KVCache


def _x(*shape, seed=1, dtype=torch.float32, scale=1.0, shift=0.0) -> torch.Tensor:
    return shift + scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _randomise(module: nn.Module, seed: int = 0) -> nn.Module:
    """Give every LayerNorm random γ, β and every bias random values, so nothing is trivially 1 or 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim == 1:
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def _block(norm="pre", C=32, n_head=4, seed=0, **kwargs) -> TransformerBlock:
    torch.manual_seed(seed)
    return _randomise(TransformerBlock(C, n_head, norm=norm, **kwargs), seed).eval()


# ---------------------------------------------------------------- LayerNorm


def test_layer_norm_by_hand():
    # x = [1, 2, 3, 4]: mean 2.5, variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
    ln = LayerNorm(4).double()
    want = torch.tensor([[-1.5, -0.5, 0.5, 1.5]], dtype=torch.float64) / math.sqrt(1.25 + 1e-5)
    assert torch.allclose(ln(x), want, atol=1e-14)
    with torch.no_grad():
        ln.weight.copy_(torch.tensor([2.0, 2.0, 2.0, 2.0]))
        ln.bias.copy_(torch.tensor([1.0, 0.0, 0.0, -1.0]))
    assert torch.allclose(ln(x), 2 * want + torch.tensor([1.0, 0.0, 0.0, -1.0], dtype=torch.float64), atol=1e-14)


@pytest.mark.parametrize("shape", [(4,), (3, 8), (2, 5, 64), (2, 3, 4, 16), (2, 16, 768)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("fast", [False, True])
def test_layer_norm_matches_torch_float32(shape, bias, fast):
    C = shape[-1]
    ours, ref = _randomise(LayerNorm(C, bias=bias, fast=fast), 1), nn.LayerNorm(C, bias=bias)
    ref.load_state_dict(ours.state_dict())  # same parameter names and shapes
    x = _x(*shape, scale=10.0, shift=3.0)
    assert torch.allclose(ours(x), ref(x), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("fast", [False, True])
def test_layer_norm_matches_torch_float64_and_gradients(fast):
    ours, ref = _randomise(LayerNorm(48, fast=fast), 2).double(), nn.LayerNorm(48).double()
    ref.load_state_dict(ours.state_dict())
    x1 = _x(4, 7, 48, dtype=torch.float64, scale=3.0).requires_grad_()
    x2 = x1.detach().clone().requires_grad_()
    up = _x(4, 7, 48, seed=9, dtype=torch.float64)
    ours(x1).backward(up)
    ref(x2).backward(up)
    assert torch.allclose(ours(x1), ref(x2), atol=1e-12)
    assert torch.allclose(x1.grad, x2.grad, atol=1e-10)
    assert torch.allclose(ours.weight.grad, ref.weight.grad, atol=1e-10)
    assert torch.allclose(ours.bias.grad, ref.bias.grad, atol=1e-10)


@settings(max_examples=30, deadline=None)
@given(C=st.integers(2, 40), rows=st.integers(1, 6), scale=st.floats(1e-2, 1e3), seed=st.integers(0, 10_000))
def test_layer_norm_output_has_mean_0_and_variance_1(C, rows, scale, seed):
    x = _x(rows, C, seed=seed, dtype=torch.float64, scale=scale, shift=5.0)
    y = LayerNorm(C, fast=False).double()(x)  # the step-by-step formula (the fused path is tested against it below)
    var = x.var(-1, correction=0, keepdim=True)
    assert torch.allclose(y.mean(-1), torch.zeros(rows, dtype=torch.float64), atol=1e-9)
    assert torch.allclose(y.pow(2).mean(-1, keepdim=True), var / (var + 1e-5), atol=1e-9)


def test_layer_norm_fused_and_teaching_paths_agree_in_value_and_gradients():
    """fast=True (F.layer_norm) is the same function as the step-by-step formula, with the same parameters."""
    teach = _randomise(LayerNorm(64, fast=False), 4)
    fused = LayerNorm(64, fast=True)
    fused.load_state_dict(teach.state_dict())
    x1 = _x(3, 9, 64, seed=5, scale=10.0, shift=-2.0).requires_grad_()
    x2 = x1.detach().clone().requires_grad_()
    up = _x(3, 9, 64, seed=6)
    y1, y2 = teach(x1), fused(x2)
    y1.backward(up)
    y2.backward(up)
    torch.testing.assert_close(y2, y1, atol=1e-5, rtol=1e-5)
    for a, b in ((x2.grad, x1.grad), (fused.weight.grad, teach.weight.grad), (fused.bias.grad, teach.bias.grad)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert "fast=True" in repr(fused) and "fast=False" in repr(teach)


def test_block_fast_flag_reaches_its_layer_norms():
    for fast in (False, True):
        blk = TransformerBlock(32, 4, fast=fast)
        assert blk.ln1.fast is fast and blk.ln2.fast is fast and blk.attn.fast is fast


def test_layer_norm_constant_token_gives_bias_not_nan():
    ln = _randomise(LayerNorm(8), 3)
    y = ln(torch.full((2, 3, 8), 7.0))
    assert torch.isfinite(y).all()
    assert torch.allclose(y, ln.bias.expand_as(y))


def test_layer_norm_without_bias_has_no_bias_parameter():
    ln = LayerNorm(6, bias=False)
    assert ln.bias is None
    assert [name for name, _ in ln.named_parameters()] == ["weight"]
    assert "bias=False" in repr(ln)


# ---------------------------------------------------------------- FeedForward


def _gelu_exact(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def test_activations_against_formulas_and_hugging_face():
    from transformers.activations import NewGELUActivation

    x = torch.linspace(-8, 8, 1001, dtype=torch.float64)
    assert torch.allclose(FeedForward(1, activation="gelu").act(x), _gelu_exact(x), atol=1e-12)
    assert torch.allclose(FeedForward(1, activation="gelu_tanh").act(x), NewGELUActivation()(x), atol=1e-12)
    assert torch.equal(FeedForward(1, activation="relu").act(x), x.clamp_min(0))
    gap = (_gelu_exact(x) - NewGELUActivation()(x)).abs().max().item()
    assert 1e-4 < gap < 5e-4  # the two GELUs are close but not the same function


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_feed_forward_matches_sequential(activation):
    torch.manual_seed(0)
    ffn = FeedForward(16, activation=activation)
    act = {"relu": nn.ReLU(), "gelu": nn.GELU(), "gelu_tanh": nn.GELU(approximate="tanh")}[activation]
    ref = nn.Sequential(nn.Linear(16, 64), act, nn.Linear(64, 16))
    ref[0].load_state_dict(ffn.fc.state_dict())
    ref[2].load_state_dict(ffn.proj.state_dict())
    x = _x(2, 5, 16)
    assert torch.allclose(ffn(x), ref(x), atol=1e-6)


def test_feed_forward_sizes():
    ffn = FeedForward(64, activation="relu")  # seed 003: 64 -> 256 -> 64
    assert ffn.d_ff == 256 and ffn.fc.weight.shape == (256, 64) and ffn.proj.weight.shape == (64, 256)
    assert sum(p.numel() for p in ffn.parameters()) == 64 * 256 + 256 + 256 * 64 + 64 == 33_088
    narrow = FeedForward(8, d_ff=12, bias=False)
    assert narrow.fc.weight.shape == (12, 8) and narrow.fc.bias is None and narrow.proj.bias is None


def test_feed_forward_is_position_wise():
    ffn = FeedForward(8)
    x = _x(2, 6, 8)
    x2 = x.clone()
    x2[1, 4] += 1.0
    moved = (ffn(x2) - ffn(x)).abs().amax(-1)
    assert moved[1, 4] > 0
    moved[1, 4] = 0
    assert moved.eq(0).all()


def test_feed_forward_dropout_only_in_training():
    ffn = FeedForward(8, dropout=0.5)
    x = _x(4, 6, 8)
    ffn.train()
    assert not torch.equal(ffn(x), ffn(x))
    ffn.eval()
    assert torch.equal(ffn(x), ffn(x))


# ---------------------------------------------------------------- TransformerBlock


def _torch_layer(block: TransformerBlock, n_head: int, activation: str) -> nn.TransformerEncoderLayer:
    layer = nn.TransformerEncoderLayer(block.d_model, n_head, dim_feedforward=block.mlp.d_ff, dropout=0.0,
                                       activation=activation, layer_norm_eps=block.ln1.eps, batch_first=True,
                                       norm_first=block.norm == "pre")
    pairs = {"self_attn.in_proj_weight": "attn.qkv.weight", "self_attn.in_proj_bias": "attn.qkv.bias",
             "self_attn.out_proj.weight": "attn.proj.weight", "self_attn.out_proj.bias": "attn.proj.bias",
             "linear1.weight": "mlp.fc.weight", "linear1.bias": "mlp.fc.bias",
             "linear2.weight": "mlp.proj.weight", "linear2.bias": "mlp.proj.bias",
             "norm1.weight": "ln1.weight", "norm1.bias": "ln1.bias",
             "norm2.weight": "ln2.weight", "norm2.bias": "ln2.bias"}
    ours = block.state_dict()
    layer.load_state_dict({theirs: ours[mine] for theirs, mine in pairs.items()})
    return layer.eval()


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("fast", [True, False])
def test_block_matches_torch_encoder_layer(norm, activation, fast):
    block = _block(norm, activation=activation, fast=fast)
    x = _x(3, 9, 32)
    future = ~torch.ones(9, 9, dtype=torch.bool).tril()  # PyTorch: True = may not attend
    want = _torch_layer(block, 4, activation)(x, src_mask=future)
    assert (block(x) - want).abs().max().item() < 1e-5


def test_pre_norm_block_matches_hugging_face_gpt2():
    from transformers import GPT2Config, GPT2Model

    C, nh = 32, 4
    cfg = GPT2Config(n_embd=C, n_head=nh, n_layer=2, n_positions=16, vocab_size=8, activation_function="gelu_new",
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                     bos_token_id=0, eos_token_id=0)
    hf = GPT2Model(cfg).eval()
    block = _block("pre", C, nh, activation="gelu_tanh")
    h = hf.h[0]
    with torch.no_grad():
        hf.wpe.weight.zero_()  # positions are chapter 02's business: feed the block's input directly
        for conv, linear in ((h.attn.c_attn, block.attn.qkv), (h.attn.c_proj, block.attn.proj),
                             (h.mlp.c_fc, block.mlp.fc), (h.mlp.c_proj, block.mlp.proj)):
            conv.weight.copy_(linear.weight.T)  # HF's Conv1D stores [in, out]
            conv.bias.copy_(linear.bias)
        for theirs, mine in ((h.ln_1, block.ln1), (h.ln_2, block.ln2)):
            theirs.weight.copy_(mine.weight)
            theirs.bias.copy_(mine.bias)
    x = _x(2, 10, C)
    with torch.no_grad():
        want = hf(inputs_embeds=x, output_hidden_states=True).hidden_states[1]  # after block 0
        assert (block(x) - want).abs().max().item() < 1e-5


@pytest.mark.parametrize("norm", NORMS)
def test_block_is_causal(norm):
    block = _block(norm)
    x = _x(2, 8, 32)
    x2 = x.clone()
    x2[:, 5] += 1.0
    moved = (block(x2) - block(x)).abs().amax(dim=(0, 2))
    assert moved[:5].eq(0).all() and moved[5:].gt(0).all()


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("pieces", [[1] * 9, [4, 1, 3, 1]])
def test_block_with_cache_matches_full_sequence(norm, pieces):
    block = _block(norm)
    x = _x(2, 9, 32)
    cache, outs, start = KVCache(), [], 0
    for n in pieces:
        outs.append(block(x[:, start:start + n], cache=cache))
        start += n
    assert cache.length == 9
    assert torch.allclose(torch.cat(outs, dim=1), block(x), atol=1e-5)


@pytest.mark.parametrize("norm", NORMS)
def test_block_passes_the_mask_to_attention(norm):
    block = _block(norm)
    x = _x(2, 6, 32)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[0, ..., :2] = False  # sequence 0: the first two keys are padding
    if norm == "pre":
        h = x + block.attn(block.ln1(x), mask=mask)
        want = h + block.mlp(block.ln2(h))
    else:
        h = block.ln1(x + block.attn(x, mask=mask))
        want = block.ln2(h + block.mlp(h))
    got = block(x, mask=mask)
    assert torch.isfinite(got).all()  # rows 0 and 1 of sequence 0 see no key at all
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.allclose(got[1], block(x)[1], atol=1e-6)  # sequence 1 is unmasked


@pytest.mark.parametrize("norm", NORMS)
def test_every_parameter_gets_a_gradient(norm):
    """Catches the seeds' bug of using ln1 twice (ln2 would get no gradient)."""
    block = _block(norm)
    block(_x(2, 5, 32)).pow(2).sum().backward()
    for name, p in block.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_ln1_twice_is_invisible_at_init_but_not_after():
    torch.manual_seed(0)
    block = TransformerBlock(16, 2)
    x = _x(2, 5, 16)

    def ln1_twice(b, v):
        v = v + b.attn(b.ln1(v))
        return v + b.mlp(b.ln1(v))

    assert torch.equal(ln1_twice(block, x), block(x))  # identical γ = 1, β = 0
    _randomise(block.ln2, 5)
    assert not torch.allclose(ln1_twice(block, x), block(x), atol=1e-3)


def test_block_float64_and_dropout():
    block = _block("pre").double()
    x = _x(2, 5, 32, dtype=torch.float64)
    assert block(x).dtype == torch.float64
    drop = TransformerBlock(32, 4, dropout=0.3).train()
    assert not torch.equal(drop(x.float()), drop(x.float()))
    drop.eval()
    assert torch.equal(drop(x.float()), drop(x.float()))


def test_block_attribute_names_follow_the_contract():
    block = TransformerBlock(32, 4, bias=False, norm="post", activation="relu", eps=1e-6)
    assert [name for name, _ in block.named_children()] == ["ln1", "attn", "ln2", "mlp"]
    assert block.norm == "post" and block.mlp.activation == "relu" and block.ln1.eps == 1e-6
    assert block.ln1.bias is None and block.attn.qkv.bias is None and block.mlp.fc.bias is None
    assert repr(block).startswith("TransformerBlock(\n  norm='post'")


# ---------------------------------------------------------------- parameter count


def test_parameter_count_by_hand():
    assert block_parameter_count(768) == 7_087_872  # GPT-2 small, per block
    assert block_parameter_count(4) == 12 * 16 + 13 * 4 == 244  # seed 000's block
    assert block_parameter_count(64, bias=False) == 12 * 64 * 64 + 2 * 64


@pytest.mark.parametrize(("C", "n_head"), [(4, 2), (32, 4), (48, 3), (64, 1)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("norm", NORMS)
def test_parameter_count_matches_module(C, n_head, bias, norm):
    block = TransformerBlock(C, n_head, bias=bias, norm=norm)
    assert sum(p.numel() for p in block.parameters()) == block_parameter_count(C, bias=bias)


# ---------------------------------------------------------------- input_gradient_norms


class _Scale(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return self.factor * x


def test_input_gradient_norms_by_hand():
    g = _x(2, 3, 4, seed=7)
    norms = input_gradient_norms([_Scale(2.0), _Scale(0.5), _Scale(3.0)], _x(2, 3, 4), g)
    # dL/dx_2 = 3 g, dL/dx_1 = 0.5 * 3 g, dL/dx_0 = 2 * 0.5 * 3 g
    assert torch.allclose(norms, torch.tensor([3.0, 1.5, 3.0]) * g.norm())


def test_input_gradient_norms_leaves_parameter_gradients_alone():
    layers = [TransformerBlock(16, 2) for _ in range(3)]
    norms = input_gradient_norms(layers, _x(2, 4, 16), _x(2, 4, 16, seed=3))
    assert norms.shape == (3,) and not norms.requires_grad and torch.isfinite(norms).all()
    assert all(p.grad is None for layer in layers for p in layer.parameters())


def test_input_gradient_norms_bad_input():
    with pytest.raises(ValueError, match="at least one layer"):
        input_gradient_norms([], _x(2, 4), _x(2, 4))
    with pytest.raises(ValueError, match=r"grad_output has shape \(2, 5\).*\(2, 4\)"):
        input_gradient_norms([nn.Identity()], _x(2, 4), _x(2, 5))


# ---------------------------------------------------------------- bad input


def test_wrong_width_is_named():
    """The block checks its input once, at its entry; a LayerNorm or FeedForward on its own is checked
    by PyTorch, whose message names the widths."""
    with pytest.raises(ValueError, match=r"TransformerBlock was built for d_model=32: .*got \(2, 5, 16\)"):
        TransformerBlock(32, 4)(_x(2, 5, 16))
    with pytest.raises(RuntimeError, match=r"expected input with shape \[\*, 8\], but got input of size"):
        LayerNorm(8)(_x(3, 6))
    with pytest.raises(RuntimeError, match=r"cannot be multiplied \(3x6 and 8x32\)"):
        FeedForward(8)(_x(3, 6))
    with pytest.raises(TypeError, match=r"needs floating-point input, got torch.int64.*embedding"):
        TransformerBlock(4, 2)(torch.zeros(1, 3, 4, dtype=torch.long))


def test_block_needs_a_batch_dimension():
    with pytest.raises(ValueError,
                       match=r"\[B, T >= 1, 32\], got \(5, 32\); add a batch dimension with x\.unsqueeze\(0\)"):
        TransformerBlock(32, 4)(_x(5, 32))


def test_unknown_choices_list_the_options():
    with pytest.raises(ValueError, match=r"norm must be one of 'pre', 'post', got 'sandwich'"):
        TransformerBlock(32, 4, norm="sandwich")
    with pytest.raises(ValueError, match=r"activation must be one of 'relu', 'gelu', 'gelu_tanh', got 'swish'"):
        FeedForward(32, activation="swish")
    with pytest.raises(ValueError, match=r"activation must be one of .* got 'GELU'"):
        TransformerBlock(32, 4, activation="GELU")
    with pytest.raises(ValueError, match=r"norm must be one of .* got None"):
        TransformerBlock(32, 4, norm=None)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: LayerNorm(0), "d_model must be a whole number >= 1, got 0"),
        (lambda: LayerNorm(4.0), "d_model must be a whole number >= 1, got 4.0"),
        (lambda: LayerNorm(4, eps=0), "eps must be a finite number > 0.0, got 0: GPT-2 uses 1e-5"),
        (lambda: FeedForward(8, d_ff=0), "d_ff must be a whole number >= 1"),
        (lambda: FeedForward(8, dropout=1.0), r"dropout must be a finite number >= 0.0 and < 1.0, got 1.0"),
        (lambda: TransformerBlock(8, 2, dropout=-0.1), r"dropout must be a finite number >= 0.0 and < 1.0"),
        (lambda: TransformerBlock(30, 4), "not divisible by n_head=4"),
    ],
)
def test_bad_sizes(make, message):
    with pytest.raises(ValueError, match=message):
        make()
