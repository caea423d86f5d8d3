# %% [markdown]
# # 09 · The original transformer: encoder, decoder and cross-attention
#
# GPT is half of a larger machine. The 2017 transformer ("Attention Is All You Need") had two stacks:
# an **encoder** that reads the whole input once, with every position looking at every other, and a
# **decoder** that writes the output one token at a time and, at every layer, looks back at the
# encoder's result through **cross-attention**. GPT kept only the decoder, without the cross-attention.
#
# **In this chapter you will** build multi-head cross-attention yourself (Exercise 9.2), and see padding
# masks for batches of different lengths, the encoder and decoder layers (post-norm as in the paper,
# pre-norm selectable), and a full `EncoderDecoder` model; prove each layer equals PyTorch's own
# `nn.TransformerEncoderLayer` / `nn.TransformerDecoderLayer`; and train it on this CPU to turn dates
# written in words ("the twenty-second of November 2026") into ISO form ("2026-11-22"). Your
# cross-attention then runs inside the trained model: it reads the dates and draws the attention maps.
# You will also predict the shape of the cross-attention weights (9.1), fix a decoder that cannot read
# the whole date (9.3), and add beam search to the greedy decoder (9.4).
#
# **You need** chapters 03 (attention and masks), 04 (multi-head attention) and 05 (the block).

# %%
#| default_exp encoder_decoder

# %%
import torch
import torch.nn.functional as F
from torch import nn

torch.set_printoptions(precision=4, sci_mode=False)
torch.manual_seed(0)
# One thread: this chapter's matrices are small, so more threads gain little, and a single thread
# gives bit-for-bit the numbers stored here on any machine (training amplifies tiny rounding changes).
torch.set_num_threads(1)

# %% [markdown]
# ## 1. Cross-attention is the same attention with different inputs
#
# In self-attention the queries, keys and values all come from one sequence. In cross-attention the
# **queries come from the decoder** (what the output written so far is looking for) and the **keys and
# values come from the encoder's output** (what the input offers). Nothing else changes: the scores are
# scaled dot products, a softmax turns each query's scores into weights that sum to 1, and the output of
# a query is the weighted mix of the values. Chapter 03's `scaled_dot_product_attention` does that work,
# split into heads as in chapter 04.
#
# The two sequences need not have the same length. When the model below has read
# "the twenty-second of November 2026" (34 characters and an end mark: 35 encoder positions) and
# written "2026-" after its begin mark (6 decoder positions), each of the 6 queries compares itself with
# each of the 35 keys. And no causal mask: the whole input is known before decoding starts, so every
# output position may look at all of it, the last input character included.

# %%
from transformer_course.checks.encoder_decoder import (
    check_beam_search,
    check_cross_attention,
    check_memory_mask,
    check_predict_cross_weights_shape,
)


# Your turn - Exercise 9.1 (★☆☆, predict): the shape of the cross-attention weights.
def my_prediction() -> tuple[int, ...]:
    """A batch of 2 sources of 5 tokens each, whose decoders have 3 tokens so far, and cross-attention with
    4 heads: the shape of its attention weights (one number per batch item, head, query and key)?"""
    ### BEGIN SOLUTION
    return (2, 4, 3, 5)
    ### END SOLUTION


check_predict_cross_weights_shape(my_prediction)

# %% [markdown]
# ## 2. Padding: batches of different lengths
#
# Sentences differ in length, but a batch is a rectangle. We pad the short ones with a **pad token**
# and build a **padding mask** (True = a real token) so that no query ever attends to a pad. A key
# that is padding must get exactly zero weight, whatever its vector is.

# %%
#| export
"""The encoder-decoder transformer of Vaswani et al. (2017), built on chapters 03-05 (chapter 09).

An encoder reads the source once; a decoder writes the target with causal self-attention and
cross-attention to the encoder's output. Shapes: B batch, S source positions, T target positions,
C = d_model, nh heads, V vocabulary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.arguments import choice, whole_number
from transformer_course.attention import check_input
from transformer_course.block import NORMS, LayerNorm, TransformerBlock
from transformer_course.multihead import MultiHeadAttention, merge_heads, split_heads
from transformer_course.positional import InputEmbedding


def padding_mask(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """ids [B, T] -> bool [B, T], True where the token is real (not ``pad_id``)."""
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2:
        raise ValueError(f"ids must be a [B, T] tensor of token ids, got {getattr(ids, 'shape', type(ids).__name__)}")
    return ids != pad_id


def key_mask(keep: torch.Tensor) -> torch.Tensor:
    """A padding mask [B, T_k] shaped to broadcast over heads and queries: [B, 1, 1, T_k]."""
    return keep[:, None, None, :]

# %%
PAD = 0
batch = torch.tensor([[5, 6, 7, 8], [9, 10, PAD, PAD]])  # two sentences, the second padded
keep = padding_mask(batch, PAD)
print(keep)

# %% [markdown]
# The proof that padding is invisible: attention over the padded batch gives, for the short
# sentence, exactly what attention over the short sentence alone gives, whatever the pad positions hold.

# %%
from transformer_course.attention import scaled_dot_product_attention

d = 8
x = torch.randn(2, 4, d)
out_padded, w_padded = scaled_dot_product_attention(x, x, x, mask=key_mask(keep)[:, 0])
out_alone, _ = scaled_dot_product_attention(x[1:, :2], x[1:, :2], x[1:, :2])
x_garbage = x.clone()
x_garbage[1, 2:] = 1e3  # change what sits in the padded positions
out_garbage, _ = scaled_dot_product_attention(x_garbage, x_garbage, x_garbage, mask=key_mask(keep)[:, 0])
print("weights on pad keys:", w_padded[1, :, 2:].abs().max().item())
print("short sentence, padded vs alone:", torch.allclose(out_padded[1, :2], out_alone[0], atol=1e-6))
print("real positions unchanged by pad contents:", torch.allclose(out_padded[1, :2], out_garbage[1, :2], atol=1e-6))

# %% [markdown]
# And a sequence that is *all* padding: every key is masked, so a naive softmax would divide 0 by 0
# and produce NaN that then spreads through every later layer. The course's attention gives zero
# weights and a zero output instead (chapter 03).

# %%
all_pad = torch.zeros(1, 1, 4, dtype=torch.bool)
o, w = scaled_dot_product_attention(x[:1], x[:1], x[:1], mask=all_pad)
print("any NaN:", bool(o.isnan().any() or w.isnan().any()), "| output max", o.abs().max().item())

# %% [markdown]
# In the decoder both masks apply at once: position t may see target position j only if j ≤ t
# (causal) **and** j is not padding. The combined mask is the logical AND of the two.

# %%
from transformer_course.attention import causal_mask

tgt = torch.tensor([[1, 4, 5, PAD, PAD]])
combined = causal_mask(5) & padding_mask(tgt, PAD)[:, None, :]  # (1, T, T)
print(combined.int())

# %% [markdown]
# ## 3. Multi-head cross-attention
#
# The package's `CrossAttention` is chapter 04's `MultiHeadAttention` with one change: the packed
# projection's query rows read the decoder states and its key and value rows read the encoder output.
# Keeping the packed layout [W_q | W_k | W_v] means the same weights drop straight into PyTorch's
# `nn.MultiheadAttention` (its `in_proj_weight` is packed the same way), which we use to prove it.
#
# **Your turn - Exercise 9.2 (★★☆, build).** Write `CrossAttention.forward(x, memory, mask=None)`:
# decoder states `x` [B, T, C] and the encoder output `memory` [B, S, C] in, [B, T, C] out. The class
# inherits from `MultiHeadAttention` everything it needs:
#
# - `self.qkv`, an `nn.Linear(C, 3C)`: its weight, [3C, C], stacks the rows of W_q, W_k and W_v in that
#   order, and its bias [3C] likewise. Queries use the first C rows, applied to `x`; keys and values the
#   other 2C rows, applied to `memory`. `F.linear(input, weight, bias)` applies a slice of a layer.
# - `split_heads` and `merge_heads` (chapter 04, imported in the cell) go between [B, T, C] and
#   [B, nh, T, hs].
# - `self.attend(q, k, v, mask)`, chapter 04's attention over split heads: q [B, nh, T, hs], k and v
#   [B, nh, S, hs], the mask (checked there) -> [B, nh, T, hs]. It runs PyTorch's fused kernel or, with
#   `fast=False`, chapter 03's function, which keeps the weights in `self.last_weights`. The class is
#   built with `causal=False`, so it adds no causal mask, and a query whose every key is masked gets a
#   zero output.
# - `self.proj` and `self.resid_dropout` finish the output, as in chapter 04.
#
# The checks of the arguments at the top of `forward` are done for you. The model of section 5 and the
# trained dates model of section 6 will run on your class.

# %%
#| export
# Your turn - Exercise 9.2 (★★☆, build): multi-head cross-attention.
class CrossAttention(MultiHeadAttention):
    """Multi-head attention from the decoder (queries) to the encoder output (keys, values), never causal.

    ``forward(x [B, T, C], memory [B, S, C], mask=None) -> [B, T, C]``; the parameters of
    `MultiHeadAttention` (``qkv`` packed [q | k | v], ``proj``). ``mask``: bool, broadcastable to
    [B, nh, T, S] (True = may attend), e.g. ``key_mask(keep)``.
    """

    def __init__(self, d_model: int, n_head: int, dropout: float = 0.0, bias: bool = True, fast: bool = True):
        super().__init__(d_model, n_head, dropout=dropout, bias=bias, causal=False, fast=fast)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        check_input(x, self.d_model, "CrossAttention")
        check_input(memory, self.d_model, "CrossAttention", name="memory")
        if x.shape[0] != memory.shape[0]:
            raise ValueError(f"decoder batch {x.shape[0]} != encoder batch {memory.shape[0]}: "
                             "pair each target with its source")
        ### BEGIN SOLUTION
        C = self.d_model
        w_q, w_kv = self.qkv.weight.split([C, 2 * C])  # (C, C), (2C, C)
        b_q, b_kv = self.qkv.bias.split([C, 2 * C]) if self.qkv.bias is not None else (None, None)
        q = split_heads(F.linear(x, w_q, b_q), self.n_head)  # (B, nh, T, hs)
        k, v = (split_heads(t, self.n_head) for t in F.linear(memory, w_kv, b_kv).split(C, dim=2))  # (B, nh, S, hs)
        y = self.attend(q, k, v, mask)  # (B, nh, T, hs)
        return self.resid_dropout(self.proj(merge_heads(y)))  # (B, T, C)
        ### END SOLUTION

# %%
CrossAttention = check_cross_attention(CrossAttention).use

# %% [markdown]
# Exercise 9.1's answer, from your class on its teaching path (which keeps the weights): one row per
# decoder position, one column per encoder position, for every head of every batch item.

# %%
C, nh = 16, 4
cross = CrossAttention(C, nh, fast=False).eval()
y = cross(torch.randn(2, 3, C), torch.randn(2, 5, C))
print("output", tuple(y.shape), "| weights", tuple(cross.last_weights.shape))
print("each query's weights sum to 1:", torch.allclose(cross.last_weights.sum(-1), torch.ones(2, nh, 3)))

# %%
ours = CrossAttention(C, nh).eval()
theirs = nn.MultiheadAttention(C, nh, batch_first=True).eval()
with torch.no_grad():
    theirs.in_proj_weight.copy_(ours.qkv.weight)
    theirs.in_proj_bias.copy_(ours.qkv.bias)
    theirs.out_proj.weight.copy_(ours.proj.weight)
    theirs.out_proj.bias.copy_(ours.proj.bias)
x_dec, mem = torch.randn(2, 3, C), torch.randn(2, 5, C)
mem_keep = torch.tensor([[True] * 5, [True, True, True, False, False]])
ref, _ = theirs(x_dec, mem, mem, key_padding_mask=~mem_keep)  # PyTorch: True = ignore
print("equal to nn.MultiheadAttention within 1e-6:", torch.allclose(ours(x_dec, mem, key_mask(mem_keep)), ref, atol=1e-6))

# %% [markdown]
# ## 4. The encoder layer and the decoder layer
#
# An **encoder layer** is chapter 05's block with the causal mask switched off: every source position
# sees every other (bidirectional). A **decoder layer** has three sublayers, each with its residual
# connection and LayerNorm: masked (causal) self-attention, cross-attention to the encoder output,
# and the feed-forward network. The paper puts each LayerNorm *after* its residual sum (post-norm);
# GPT-2 and most modern models put it *before* the sublayer (pre-norm, chapter 05).
#
# What seeing both ways buys shows in a sentence that many explanations of attention use, source 2
# among them (chapter 00 lists the sources): "The animal didn't cross the street because it was too
# tired." What does *it* refer to? The word that decides, *tired*, comes after *it* (end the sentence
# with *wide* and *it* is the street). An encoder position for *it* can attend to *tired* and settle
# the question right there. A causal decoder cannot: at *it* it has read only "The animal didn't cross
# the street because", so it can guess (the animal is the likelier subject) but the evidence arrives
# later, and only the positions from *tired* on can use it. Source 2 tells the example for a causal
# model as if *it* were resolved where it stands; that is an encoder's kind of attention.

# %%
#| export
class EncoderLayer(TransformerBlock):
    """Chapter 05's `TransformerBlock` with bidirectional attention: x [B, S, C] -> [B, S, C].

    ``mask``: bool key mask broadcastable to [B, nh, S, S]. Defaults: the paper's post-norm, ReLU.
    """

    def __init__(self, d_model: int, n_head: int, dropout: float = 0.0, bias: bool = True,
                 norm: str = "post", activation: str = "relu", fast: bool = True, eps: float = 1e-5):
        super().__init__(d_model, n_head, dropout=dropout, bias=bias, norm=norm, activation=activation,
                         fast=fast, eps=eps)
        self.attn = MultiHeadAttention(d_model, n_head, dropout=dropout, bias=bias, causal=False, fast=fast)


class DecoderLayer(TransformerBlock):
    """Causal self-attention, cross-attention to the encoder, feed-forward: x [B, T, C] -> [B, T, C].

    Chapter 05's block with ``ln_cross`` and ``cross_attn`` between its two sublayers. ``self_mask``
    [B, nh, T, T] (target padding) joins the causal mask; ``memory_mask`` [B, nh, T, S] (source padding).
    """

    def __init__(self, d_model: int, n_head: int, dropout: float = 0.0, bias: bool = True,
                 norm: str = "post", activation: str = "relu", fast: bool = True, eps: float = 1e-5):
        super().__init__(d_model, n_head, dropout=dropout, bias=bias, norm=norm, activation=activation,
                         fast=fast, eps=eps)
        self.ln_cross = LayerNorm(d_model, eps=eps, bias=bias, fast=fast)
        self.cross_attn = CrossAttention(d_model, n_head, dropout=dropout, bias=bias, fast=fast)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, self_mask: torch.Tensor | None = None,
                memory_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.norm == "pre":
            x = x + self.attn(self.ln1(x), mask=self_mask)  # (B, T, C)
            x = x + self.cross_attn(self.ln_cross(x), memory, mask=memory_mask)
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x, mask=self_mask))
        x = self.ln_cross(x + self.cross_attn(x, memory, mask=memory_mask))
        return self.ln2(x + self.mlp(x))

# %% [markdown]
# ### Proof: the same numbers as PyTorch's own layers
#
# PyTorch ships `nn.TransformerEncoderLayer` and `nn.TransformerDecoderLayer`. `copy_from_torch`
# moves their weights into ours (names differ, layouts do not); then both must agree to within
# 1e-5 for post-norm and pre-norm, with padding in the source and the target.

# %%
#| export
@torch.no_grad()
def copy_from_torch(ours: nn.Module, theirs: nn.Module) -> nn.Module:
    """Copy a ``nn.TransformerEncoderLayer``/``nn.TransformerDecoderLayer`` into our layer; returns ours."""
    pairs = [(ours.attn, theirs.self_attn), (ours.mlp.fc, theirs.linear1), (ours.mlp.proj, theirs.linear2),
             (ours.ln1, theirs.norm1), (ours.ln2, theirs.norm2)]
    if isinstance(ours, DecoderLayer):
        pairs[-1] = (ours.ln2, theirs.norm3)
        pairs += [(ours.ln_cross, theirs.norm2), (ours.cross_attn, theirs.multihead_attn)]
    for mine, ref in pairs:
        if isinstance(ref, nn.MultiheadAttention):
            mine.qkv.weight.copy_(ref.in_proj_weight)  # both packed [W_q; W_k; W_v]
            mine.qkv.bias.copy_(ref.in_proj_bias)
            mine.proj.weight.copy_(ref.out_proj.weight)
            mine.proj.bias.copy_(ref.out_proj.bias)
        else:
            mine.weight.copy_(ref.weight)
            mine.bias.copy_(ref.bias)
    return ours

# %%
torch.backends.mha.set_fastpath_enabled(False)  # PyTorch's inference fast path drops padded rows
src_keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
tgt_keep = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
src_x, tgt_x = torch.randn(2, 6, C), torch.randn(2, 5, C)
for norm_first in (False, True):
    norm = "pre" if norm_first else "post"
    ref_enc = nn.TransformerEncoderLayer(C, nh, 4 * C, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    ref_dec = nn.TransformerDecoderLayer(C, nh, 4 * C, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    enc = copy_from_torch(EncoderLayer(C, nh, norm=norm).eval(), ref_enc)
    dec = copy_from_torch(DecoderLayer(C, nh, norm=norm).eval(), ref_dec)
    mem_ours = enc(src_x, mask=key_mask(src_keep))
    mem_ref = ref_enc(src_x, src_key_padding_mask=~src_keep)
    out_ours = dec(tgt_x, mem_ours, self_mask=key_mask(tgt_keep), memory_mask=key_mask(src_keep))
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)  # PyTorch's convention: True = may NOT attend
    out_ref = ref_dec(tgt_x, mem_ref, tgt_mask=future, tgt_is_causal=True,
                      tgt_key_padding_mask=~tgt_keep, memory_key_padding_mask=~src_keep)
    real = tgt_keep[..., None]  # PyTorch's padded query rows are not meaningful; compare real ones
    enc_diff = (mem_ours - mem_ref)[src_keep].abs().max().item()
    dec_diff = ((out_ours - out_ref) * real).abs().max().item()
    print(f"{norm}-norm: encoder equal to PyTorch's within 1e-5: {enc_diff < 1e-5}, decoder: {dec_diff < 1e-5}")
    assert enc_diff < 1e-5 and dec_diff < 1e-5

# %% [markdown]
# ## 5. The full model
#
# The source and the target get **separate embeddings** here, each plus the sinusoidal positions of
# chapter 02 (the paper's choice of position code, its section 3.5). The paper's embeddings differ in
# three ways (section 3.4): source and target share one vocabulary (about 37,000 byte-pair tokens for
# English-German) and one embedding matrix, that matrix is also the output layer's (tied, as GPT-2 ties
# its own, chapter 06), and the embeddings are multiplied by √d_model before the positions are added.
# We keep two tables and an untied output layer because our two sides write different alphabets (the
# target only digits and "-"), and we leave out the √d_model factor because it is meant for embeddings
# that start small (implementations following the paper initialise them with standard deviation
# d_model^-1/2, and the factor brings them to the scale of the position code), while PyTorch's
# `nn.Embedding` starts at N(0, 1), already at that scale; the cell after the model checks this.
#
# The encoder stack turns the source into `memory`; the decoder stack reads the target so far plus `memory`; a
# linear head gives logits over the target vocabulary. Training uses *teacher forcing*: the decoder
# input is the true target shifted right by one (it starts with a begin token), and the loss asks it to
# predict the next target token at every position at once, exactly like GPT's training.

# %%
#| export
@dataclass
class Seq2SeqConfig:
    """Sizes and choices of an `EncoderDecoder` (defaults: the paper's post-norm, ReLU, sinusoids)."""

    src_vocab_size: int
    tgt_vocab_size: int
    max_src_len: int
    max_tgt_len: int
    n_layer_enc: int = 2
    n_layer_dec: int = 2
    n_head: int = 4
    d_model: int = 64
    dropout: float = 0.0
    norm: str = "post"
    activation: str = "relu"
    positional: str = "sinusoidal"
    pad_id: int = 0
    bias: bool = True

    def __post_init__(self):
        for name in ("src_vocab_size", "tgt_vocab_size", "max_src_len", "max_tgt_len", "n_layer_enc", "n_layer_dec"):
            whole_number(getattr(self, name), name)  # n_head, d_model, dropout: checked by the layers
        choice(self.norm, "norm", NORMS)
        whole_number(self.pad_id, "pad_id", low=0)
        for side in ("src", "tgt"):
            vocab = getattr(self, f"{side}_vocab_size")
            if not 0 <= self.pad_id < vocab:
                raise ValueError(f"pad_id {self.pad_id} is outside the {side} vocabulary 0..{vocab - 1}: "
                                 "reserve one id of each vocabulary for padding")

    def to_dict(self) -> dict:
        return asdict(self)


class EncoderDecoder(nn.Module):
    """Source ids [B, S] and target ids [B, T] -> logits [B, T, V_tgt] (and the loss, given targets)."""

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.cfg = cfg
        layer = dict(n_head=cfg.n_head, dropout=cfg.dropout, bias=cfg.bias, norm=cfg.norm, activation=cfg.activation)
        self.src_embed = InputEmbedding(cfg.src_vocab_size, cfg.d_model, cfg.max_src_len, cfg.positional, cfg.dropout)
        self.tgt_embed = InputEmbedding(cfg.tgt_vocab_size, cfg.d_model, cfg.max_tgt_len, cfg.positional, cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg.d_model, **layer) for _ in range(cfg.n_layer_enc))
        self.decoder = nn.ModuleList(DecoderLayer(cfg.d_model, **layer) for _ in range(cfg.n_layer_dec))
        # pre-norm leaves the residual stream un-normalised, so each stack ends with a LayerNorm
        final = (lambda: LayerNorm(cfg.d_model, bias=cfg.bias)) if cfg.norm == "pre" else nn.Identity
        self.enc_norm, self.dec_norm = final(), final()
        self.lm_head = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """src [B, S] -> (memory [B, S, C], keep [B, S] bool). Run once per source, reused every step."""
        if isinstance(src, torch.Tensor) and src.ndim == 2 and src.shape[1] == 0:
            raise ValueError("empty source sequence (length 0): give at least one token, e.g. just the end token")
        keep = padding_mask(src, self.cfg.pad_id)
        x = self.src_embed(src)  # (B, S, C)
        for layer in self.encoder:
            x = layer(x, mask=key_mask(keep))
        return self.enc_norm(x), keep

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_keep: torch.Tensor) -> torch.Tensor:
        """tgt [B, T] (target so far), memory [B, S, C] -> logits [B, T, V_tgt]."""
        if tgt.ndim == 2 and tgt.shape[1] > self.cfg.max_tgt_len:
            raise ValueError(f"target has {tgt.shape[1]} tokens but this model handles at most "
                             f"max_tgt_len={self.cfg.max_tgt_len}: "
                             "shorten it or build a model with a larger max_tgt_len")
        if tgt.shape[0] != memory.shape[0]:
            raise ValueError(f"source batch has {memory.shape[0]} sequences but target batch has {tgt.shape[0]}: "
                             "they must pair up one to one")
        y = self.tgt_embed(tgt)  # (B, T, C)
        self_mask, memory_mask = key_mask(padding_mask(tgt, self.cfg.pad_id)), key_mask(src_keep)
        for layer in self.decoder:
            y = layer(y, memory, self_mask=self_mask, memory_mask=memory_mask)
        return self.lm_head(self.dec_norm(y))  # (B, T, V_tgt)

    def forward(self, src, tgt, targets=None):
        """(logits [B, T, V_tgt], loss or None); padded targets (pad_id) are left out of the loss."""
        logits = self.decode(tgt, *self.encode(src))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=self.cfg.pad_id)
        return logits, loss

    @torch.no_grad()
    def greedy_decode(self, src: torch.Tensor, bos_id: int, eos_id: int, max_new_tokens: int | None = None):
        """Encode once, then pick the most likely token step by step -> [B, 1 + n] ids (starting with bos).

        Sequences that produced ``eos_id`` are padded with ``pad_id`` while the others finish.
        """
        steps = self.cfg.max_tgt_len - 1 if max_new_tokens is None else max_new_tokens
        memory, keep = self.encode(src)  # once, reused at every step below
        out = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        for _ in range(steps):
            nxt = self.decode(out, memory, keep)[:, -1].argmax(-1)  # (B,)
            nxt = nxt.masked_fill(done, self.cfg.pad_id)
            out = torch.cat([out, nxt[:, None]], dim=1)
            done |= nxt == eos_id
            if done.all():
                break
        return out

    @torch.no_grad()
    def cross_attention_weights(self, src: torch.Tensor, tgt: torch.Tensor) -> list[torch.Tensor]:
        """Cross-attention weights of every decoder layer, each [B, nh, T, S] (teaching path)."""
        layers = [layer.cross_attn for layer in self.decoder]
        saved = [a.fast for a in layers]
        try:
            for a in layers:
                a.fast = False  # chapter 03's function keeps the weights; same numbers as the fused one
            self.decode(tgt, *self.encode(src))
            return [a.last_weights for a in layers]
        finally:
            for a, fast in zip(layers, saved, strict=True):
                a.fast = fast

# %% [markdown]
# The scale argument in numbers: a fresh model's token rows and its position rows, and what the
# paper's √d_model would do to them. Then the size of the paper's base model (its Table 3: 6 encoder
# and 6 decoder layers, d_model 512, 8 heads, d_ff 2048 = 4 · d_model), built from the same classes on
# PyTorch's `meta` device, which records shapes without allocating memory; our dates model below is
# much smaller (2 + 2 layers, d_model 64, 4 heads).

# %%
with torch.random.fork_rng():  # leaves the notebook's random state as it was
    fresh = EncoderDecoder(Seq2SeqConfig(src_vocab_size=40, tgt_vocab_size=14, max_src_len=48, max_tgt_len=12))
token_rms = fresh.src_embed.token.weight.pow(2).mean().sqrt().item()  # N(0, 1): about 1
position_rms = fresh.src_embed.pe.pow(2).mean().sqrt().item()  # sin² + cos² = 1 per pair: √½
print(f"token rows and position rows within a factor 1.5 of each other in scale: {max(token_rms, position_rms) / min(token_rms, position_rms) < 1.5}")
print(f"times √d_model = 8, the token rows would be about {round(8 * token_rms / position_rms)} times the position rows")
with torch.device("meta"):
    paper = EncoderDecoder(Seq2SeqConfig(src_vocab_size=37_000, tgt_vocab_size=37_000, max_src_len=512,
                                         max_tgt_len=512, n_layer_enc=6, n_layer_dec=6, n_head=8, d_model=512))
in_layers = sum(p.numel() for layer in (*paper.encoder, *paper.decoder) for p in layer.parameters())
print(f"the paper's base model: {in_layers / 1e6:.1f} M parameters in its 12 layers, {(in_layers + 37_000 * 512) / 1e6:.0f} M "
      "with one 37,000 x 512 embedding shared by source, target and output (the paper reports 65 M)")

# %% [markdown]
# ## 6. A real task: dates in words → ISO dates
#
# The code writes its own data: random dates rendered in several styles that people use, paired with
# the ISO form. The model must read day, month and year wherever they sit in the input, in words or
# digits, and write them in a fixed order. That reordering is exactly what cross-attention is for.

# %%
#| export dates
# Dates written the ways people write them, and their ISO form: a seq2seq task (chapter 09).
# Each example pairs a source like "the twenty-second of November 2026" or "Nov 22nd, 2026" with the
# target "2026-11-22". Vocabularies are characters, with 0 = padding, 1 = begin, 2 = end.
# Shapes: B batch, S source ids (characters, end mark, padding), T target ids.
import datetime
import random

import torch
from tqdm.auto import tqdm

from transformer_course.encoder_decoder import EncoderDecoder, Seq2SeqConfig

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
_UNITS = ["", "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth"]
_TEENS = {10: "tenth", 11: "eleventh", 12: "twelfth", 13: "thirteenth", 14: "fourteenth", 15: "fifteenth",
          16: "sixteenth", 17: "seventeenth", 18: "eighteenth", 19: "nineteenth", 20: "twentieth", 30: "thirtieth"}
_TENS = {2: "twenty", 3: "thirty"}
PAD, BOS, EOS = 0, 1, 2
FIRST, LAST = datetime.date(1900, 1, 1), datetime.date(2099, 12, 31)


def ordinal_word(day: int) -> str:
    """1 -> "first", 22 -> "twenty-second", 30 -> "thirtieth"."""
    if day in _TEENS:
        return _TEENS[day]
    if day < 10:
        return _UNITS[day]
    return f"{_TENS[day // 10]}-{_UNITS[day % 10]}"


def ordinal_suffix(day: int) -> str:
    """1 -> "1st", 22 -> "22nd", 13 -> "13th"."""
    suffix = "th" if 10 <= day % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


TARGET_CHARS = "-0123456789"
# every character any format can produce: digits, separators, month names, ordinal words and suffixes
SOURCE_CHARS = "".join(sorted(set(" ,-/0123456789the of stndrdth" + "".join(MONTHS)
                                  + "".join(map(ordinal_word, range(1, 32))))))

FORMATS = {
    "words": lambda d: f"the {ordinal_word(d.day)} of {MONTHS[d.month - 1]} {d.year}",
    "day month": lambda d: f"{d.day} {MONTHS[d.month - 1]} {d.year}",
    "short": lambda d: f"{d.day} {MONTHS[d.month - 1][:3]} {d.year}",
    "us": lambda d: f"{MONTHS[d.month - 1]} {d.day}, {d.year}",
    "us ordinal": lambda d: f"{MONTHS[d.month - 1][:3]} {ordinal_suffix(d.day)}, {d.year}",
    "numeric": lambda d: f"{d.day:02d}/{d.month:02d}/{d.year}",
}


def random_example(rng: random.Random) -> tuple[str, str]:
    """One (source, target) pair: a uniformly random date in 1900-2099 in a random format."""
    date = FIRST + datetime.timedelta(days=rng.randrange((LAST - FIRST).days + 1))
    fmt = rng.choice(sorted(FORMATS))
    return FORMATS[fmt](date), date.isoformat()


def make_examples(n: int, seed: int, exclude: set[str] | None = None) -> list[tuple[str, str]]:
    """n distinct pairs from ``random.Random(seed)``, none of whose sources is in ``exclude``."""
    rng, seen, pairs = random.Random(seed), set(exclude or ()), []
    while len(pairs) < n:
        src, tgt = random_example(rng)
        if src not in seen:
            seen.add(src)
            pairs.append((src, tgt))
    return pairs


def encode_batch(texts: list[str], chars: str, add_bos: bool = False) -> torch.Tensor:
    """Texts -> LongTensor [B, longest + extras], char ids offset by 3, EOS at the end, PAD after."""
    index = {c: i + 3 for i, c in enumerate(chars)}
    unknown = sorted({c for t in texts for c in t} - set(index))
    if unknown:
        raise ValueError(f"characters {unknown} are not in the vocabulary {chars!r}")
    rows = [([BOS] if add_bos else []) + [index[c] for c in t] + [EOS] for t in texts]
    out = torch.full((len(rows), max(map(len, rows))), PAD, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


def decode_ids(ids, chars: str) -> str:
    """Ids -> text, stopping at EOS and skipping BOS/PAD."""
    text = []
    for i in ids:
        if i == EOS:
            break
        if i >= 3:
            text.append(chars[i - 3])
    return "".join(text)

# %%
from transformer_course.dates import (
    BOS,
    EOS,
    FORMATS,
    PAD,
    SOURCE_CHARS,
    TARGET_CHARS,
    decode_ids,
    encode_batch,
    make_examples,
)

test_pairs = make_examples(2000, seed=1)  # held out: the training data never contains these sources
train_pairs = make_examples(60_000, seed=2, exclude={s for s, _ in test_pairs})
for src, tgt in train_pairs[:6]:
    print(f"{src:<40} -> {tgt}")
print(len(FORMATS), "formats;", len(SOURCE_CHARS) + 3, "source ids;", len(TARGET_CHARS) + 3, "target ids")

# %% [markdown]
# Batches: sources padded to the longest in the batch; the decoder input starts with BOS, and the
# target it must predict is the same sequence shifted left, ending with EOS.

# %%
#| export dates
def make_batch(pairs: list[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(source, ISO target) pairs -> source ids [B, S], decoder input [B, T] (BOS first) and the ids it
    must predict [B, T] (the same sequence shifted left, EOS last)."""
    src = encode_batch([s for s, _ in pairs], SOURCE_CHARS)
    full = encode_batch([t for _, t in pairs], TARGET_CHARS, add_bos=True)  # BOS 2026-11-22 EOS
    return src, full[:, :-1], full[:, 1:]  # source, decoder input, what it must predict

# %%
src, tgt_in, tgt_out = make_batch(train_pairs[:2])
print("source", tuple(src.shape), "| decoder input", tgt_in[0].tolist(), "| predict", tgt_out[0].tolist())

# %% [markdown]
# ### Training
#
# A small model (2 encoder and 2 decoder layers, d_model 64, 4 heads) trained with AdamW on batches of
# 64 examples, with a short warm-up and a linear decay. The loop is the one chapter 06 built, written
# out for two inputs: encode the batch, predict, compare, update.

# %%
#| export dates
def new_dates_model(seed: int = 0) -> EncoderDecoder:
    """The chapter's model for this task, freshly initialised from `seed`: 2 + 2 layers, d_model 64, 4 heads."""
    torch.manual_seed(seed)
    cfg = Seq2SeqConfig(src_vocab_size=len(SOURCE_CHARS) + 3, tgt_vocab_size=len(TARGET_CHARS) + 3,
                        max_src_len=48, max_tgt_len=12, n_layer_enc=2, n_layer_dec=2, n_head=4, d_model=64)
    return EncoderDecoder(cfg)


def train_dates(model: EncoderDecoder, pairs: list[tuple[str, str]], steps: int = 1200, batch_size: int = 64,
                lr: float = 3e-3, seed: int = 3, progress: bool = True) -> list[float]:
    """Train `model` in place on (source, ISO) pairs and return every step's loss. AdamW (weight decay
    0.01), learning rate warmed up linearly over 100 steps then decayed linearly to 2% of `lr`, global
    gradient norm clipped at 1; batches taken in order from one shuffle of `pairs` (seeded)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100) * (1 - s / steps) + 0.02)
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed)).tolist()
    losses = []
    model.train()
    for step in tqdm(range(steps), desc="training", mininterval=2, disable=not progress):
        i = (step * batch_size) % (len(order) - batch_size)
        src, tgt_in, tgt_out = make_batch([pairs[j] for j in order[i : i + batch_size]])
        _, loss = model(src, tgt_in, tgt_out)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    model.eval()
    return losses

# %% [markdown]
# The full recipe is 1,200 steps, about two minutes on a laptop CPU. Here we run the first 200 to
# watch it learn (about 15 s). The package's `new_dates_model` builds the model from the package's
# classes; the small function below puts your `CrossAttention` (Exercise 9.2; the package's if the
# check did not pass) into every decoder layer, with the same weights, so that the run trains your code.

# %%
from transformer_course.dates import make_batch, new_dates_model, train_dates


def with_your_cross_attention(model):
    """`model`, each decoder layer's cross-attention replaced by this notebook's `CrossAttention` holding
    the same weights."""
    for layer in model.decoder:
        old = layer.cross_attn
        new = CrossAttention(old.d_model, old.n_head, dropout=old.dropout, bias=old.qkv.bias is not None, fast=old.fast)
        new.load_state_dict(old.state_dict())
        layer.cross_attn = new.to(old.qkv.weight.device).train(old.training)
    return model


model = with_your_cross_attention(new_dates_model())
print(f"{sum(p.numel() for p in model.parameters()):,} parameters;",
      "cross-attention is this notebook's:", all(type(layer.cross_attn) is CrossAttention for layer in model.decoder))

# %%
# NBVAL_IGNORE_OUTPUT
short_losses = train_dates(model, train_pairs, steps=200)

# %% [markdown]
# The course ships the model trained with the full recipe by this very function
# (`tools/build_course_model.py` trains it again), and the rest of the chapter uses that one: training
# sums millions of float32 products, and a CPU with other vector instructions groups those sums
# differently, so a model trained here would differ from one trained elsewhere in its last digits, and
# so would everything we print about it. Loading a file gives the same model on every machine. It
# too gets your cross-attention: from here on, your code reads every date.

# %%
import matplotlib.pyplot as plt

from transformer_course.course_model import load_dates_model

shipped = load_dates_model()
model = with_your_cross_attention(shipped.model)
first, after_200 = sum(short_losses[:20]) / 20, sum(short_losses[-20:]) / 20
print(f"your 200 steps: mean loss of the first 20 steps above 1: {first > 1}, of the last 20 below 0.5: {after_200 < 0.5}")
print(f"the shipped run: {len(shipped.losses):,} steps, mean loss of the last 100 {sum(shipped.losses[-100:]) / 100:.4f}")
assert first > 1 and after_200 < 0.5
fig, ax = plt.subplots(figsize=(7, 3))
ax.plot(shipped.losses, lw=0.7, label="the shipped run (1,200 steps)")
ax.plot(short_losses, lw=0.7, label="your first 200 steps")
ax.set(yscale="log", xlabel="step", ylabel="cross-entropy", title="Dates → ISO: training loss")
ax.legend()
plt.show()

# %% [markdown]
# ### Held-out accuracy
#
# Exact match on the 2,000 held-out examples: the whole ISO string must be right. Decoding is greedy:
# encode once, then pick the most likely next character until EOS.

# %%
def predict(texts):
    src = encode_batch(texts, SOURCE_CHARS)
    out = model.greedy_decode(src, BOS, EOS)
    return [decode_ids(row.tolist(), TARGET_CHARS) for row in out]


predictions = [p for i in range(0, len(test_pairs), 500) for p in predict([s for s, _ in test_pairs[i : i + 500]])]
correct = [p == t for p, (_, t) in zip(predictions, test_pairs)]
accuracy = sum(correct) / len(correct)
print(f"exact match on {len(test_pairs)} held-out dates: {accuracy:.2%}")
assert accuracy >= 0.99
for (s, t), p in list(zip(test_pairs, predictions))[:5]:
    print(f"{s:<40} -> {p} {'✓' if p == t else '✗ (want ' + t + ')'}")

# %% [markdown]
# Per format, and the mistakes if any:

# %%
import datetime
from collections import Counter

by_format = Counter()
for (s, t), ok in zip(test_pairs, correct):
    fmt = next(name for name, f in FORMATS.items() if f(datetime.date.fromisoformat(t)) == s)
    by_format[fmt, ok] += 1
for name in FORMATS:
    total = by_format[name, True] + by_format[name, False]
    print(f"{name:<11} {by_format[name, True]:>4}/{total}")
mistakes = [(s, p) for (s, _), p, ok in zip(test_pairs, predictions, correct) if not ok]
print(f"{len(mistakes)} mistakes in all; the first few (if any): {mistakes[:3]}")

# %% [markdown]
# ### A decoder that cannot read the whole date
#
# A slip that is easy to make. The decoder's self-attention needs the causal mask combined with the
# padding mask (section 2), and someone writing the *cross*-attention's mask follows the same recipe:
# "the decoder must not peek ahead". Below is such a mask builder, and what it does to the trained
# model. `exact_match_with` decodes the first 200 held-out dates with every cross-attention given the
# builder's mask instead of the model's own one (a forward pre-hook swaps the `memory_mask` argument
# of each decoder layer), and counts the exact matches.

# %%
def memory_mask_copied(T: int, src_keep: torch.Tensor) -> torch.Tensor:
    """The cross-attention mask, bool [B, 1, T, S], for T decoder positions reading sources with keep [B, S]."""
    S = src_keep.shape[1]
    no_peeking = torch.ones(T, S, dtype=torch.bool).tril()  # as in the decoder's self-attention
    return no_peeking & key_mask(src_keep)  # (B, 1, T, S)


def exact_match_with(memory_mask_fn, n=200):
    """Share of the first n held-out dates decoded exactly when the cross-attention of every decoder
    layer gets memory_mask_fn(T, src_keep) instead of the model's own mask."""
    def swap(layer, args, kwargs):
        src_keep = kwargs["memory_mask"][:, 0, 0]  # the model passes key_mask(src_keep): [B, 1, 1, S]
        return args, {**kwargs, "memory_mask": memory_mask_fn(args[0].shape[1], src_keep)}

    hooks = [layer.register_forward_pre_hook(swap, with_kwargs=True) for layer in model.decoder]
    try:
        got = predict([s for s, _ in test_pairs[:n]])
    finally:
        for hook in hooks:
            hook.remove()
    return sum(p == t for p, (_, t) in zip(got, test_pairs)) / n


print("exact match with the copied mask below 5%:", exact_match_with(memory_mask_copied) < 0.05)

# %% [markdown]
# From near-perfect to almost nothing right. **Your turn - Exercise 9.3 (★☆☆, debug).** Find the bug
# (what can the first decoder position, the one that writes the year's first digit, see of
# "the twenty-second of November 2026"?) and write the fixed builder: bool, broadcastable to
# [B, 1, T, S], True where decoder position t may attend source position s. The cell after the check
# measures the model with your mask.

# %%
# Your turn - Exercise 9.3 (★☆☆, debug): the cross-attention mask.
def my_memory_mask(T: int, src_keep: torch.Tensor) -> torch.Tensor:
    """The cross-attention mask, bool [B, 1, T, S], for T decoder positions reading sources with keep [B, S]."""
    ### BEGIN SOLUTION
    return key_mask(src_keep).expand(-1, -1, T, -1)  # (B, 1, T, S): every real source token, for every t
    ### END SOLUTION


memory_mask = check_memory_mask(my_memory_mask).use

# %%
print("exact match with your mask at least 99%:", exact_match_with(memory_mask) >= 0.99)

# %% [markdown]
# ### Where does each output character look?
#
# The cross-attention weights of the last decoder layer, averaged over heads: rows are the output
# characters as they are produced, columns the input characters. The year digits look at the year, the
# month digits at the month name, the day digits at the day, wherever they sit in the input.

# %%
from transformer_course.viz import plot_attention

text = "the twenty-second of November 2026"
src = encode_batch([text], SOURCE_CHARS)
out = model.greedy_decode(src, BOS, EOS)
weights = model.cross_attention_weights(src, out[:, :-1])[-1][0].mean(0)  # (T, S), heads averaged
rows = [decode_ids([i], TARGET_CHARS) or "<bos>" for i in out[0, :-1].tolist()]
rows = [f"{r} → {decode_ids([n], TARGET_CHARS) or '<eos>'}" for r, n in zip(rows, out[0, 1:].tolist())]
cols = list(text) + ["<eos>"]
fig, ax = plt.subplots(figsize=(12, 4))
plot_attention(weights, rows, cols, ax=ax, title=f"cross-attention: {text!r} → {decode_ids(out[0].tolist(), TARGET_CHARS)}")
plt.show()

# %% [markdown]
# A check of that claim in numbers: for each output digit, which input word holds most of its
# attention?

# %%
words, starts = text.split(" "), []
pos = 0
for w in words:
    starts.append((pos, pos + len(w)))
    pos += len(w) + 1
mass = torch.stack([weights[:, a:b].sum(-1) for a, b in starts], dim=1)  # (T, words)
for r, row in zip(rows, mass):
    print(f"{r:<8} looks mostly at {words[int(row.argmax())]!r} ({row.max().item():.0%})")

# %% [markdown]
# Try your own date (the model never saw a year outside 1900-2099):

# %%
import ipywidgets as widgets


def convert(text: str) -> str:
    try:
        return f"{text!r} -> {predict([text])[0]}"
    except ValueError as e:  # a character the model has no id for
        return str(e)


def date_explorer(initial="4 Jul 1976"):
    """A text box; each edit shows the model's ISO date below it (redrawn only by the observer)."""
    box = widgets.Text(value=initial, description="date", continuous_update=True)
    out = widgets.Output()

    def update(change):
        with out:
            out.clear_output(wait=True)
            print(convert(change["new"]))

    box.observe(update, "value")
    return widgets.VBox([box, out])


print(convert("4 Jul 1976"))
date_explorer()

# %% [markdown]
# ### Beyond greedy: beam search
#
# Greedy decoding commits to the most likely character at every step. The most likely *string* can
# start with a less likely character: a first digit of probability 0.5 followed by a sure continuation
# beats a first digit of 0.6 followed by a coin toss. Beam search keeps several candidates. It holds
# the `beam_size` most probable partial outputs (a *beam*), each with its score: the sum of the
# log-probabilities of its tokens. At each step it extends every candidate by every token of the
# target vocabulary, scores all the extensions, and keeps the `beam_size` best of them all. A candidate
# that has just produced the end mark is finished and leaves the beam. The search stops when no candidate
# is left unfinished, or after `max_new_tokens` steps, and returns the finished candidate with the
# highest score. With `beam_size=1` it is greedy decoding. The 2017 paper decoded its translations with
# a beam of 4.
#
# **Your turn - Exercise 9.4 (★★★, extend).** Write `my_beam_search(model, src, bos_id, eos_id,
# beam_size=4, max_new_tokens=11)` for one source `src` [1, S]. Return `(ids, score)`: the best finished
# hypothesis as a list of ints (starting with `bos_id`, ending with `eos_id`) and its total
# log-probability (if none finished, the best unfinished one). Encode once with
# `memory, keep = model.encode(src)`; `model.decode(tgt, memory, keep)` gives the logits [n, t, V] of n
# candidates `tgt` [n, t] at once, given `memory` and `keep` repeated n times
# (`memory.expand(n, -1, -1)`). Every token is a possible extension, as in `greedy_decode`.

# %%
# Your turn - Exercise 9.4 (★★★, extend): beam search.
@torch.no_grad()
def my_beam_search(model, src, bos_id, eos_id, beam_size=4, max_new_tokens=11):
    """src [1, S] -> (ids: list[int], bos_id first, score: float): the most probable finished hypothesis."""
    ### BEGIN SOLUTION
    memory, keep = model.encode(src)  # (1, S, C), (1, S): once
    live, finished = [([bos_id], 0.0)], []
    for _ in range(max_new_tokens):
        if not live:
            break
        n = len(live)
        tgt = torch.tensor([seq for seq, _ in live])  # (n, t)
        logp = model.decode(tgt, memory.expand(n, -1, -1), keep.expand(n, -1))[:, -1].log_softmax(-1)  # (n, V)
        scores = torch.tensor([score for _, score in live])[:, None] + logp  # (n, V): every extension
        best = scores.flatten().topk(min(beam_size, scores.numel()))
        V = logp.shape[1]
        chosen = [(live[i // V][0] + [i % V], s) for s, i in zip(best.values.tolist(), best.indices.tolist())]
        live = [(seq, s) for seq, s in chosen if seq[-1] != eos_id]
        finished += [(seq, s) for seq, s in chosen if seq[-1] == eos_id]
    return max(finished or live, key=lambda hypothesis: hypothesis[1])
    ### END SOLUTION


beam_search = check_beam_search(my_beam_search).use

# %% [markdown]
# On dates like the ones it was trained on, the model is sure of itself and beam search has nothing to
# add. On years it never saw (it was trained on 1900-2099), it hesitates, and beam search finds strings
# more probable than greedy's. More probable is not the same as right: the model is out of its depth,
# and the search only makes better use of what it believes.

# %%
import math


@torch.no_grad()
def probability(src, ids):
    """The model's probability of the whole output ids[1:] (teacher forcing)."""
    tgt = torch.tensor([ids])
    logits, _ = model(src, tgt[:, :-1])
    return logits.log_softmax(-1)[0].gather(-1, tgt[0, 1:, None]).sum().exp().item()


same = [decode_ids(beam_search(model, encode_batch([s], SOURCE_CHARS), BOS, EOS)[0], TARGET_CHARS) == p
        for (s, _), p in zip(test_pairs[:25], predictions)]
print("first 25 held-out dates, beam of 4 and greedy agree on all:", all(same))
for text in ["Jul 17th, 2317", "the third of September 1610", "13 May 1672"]:
    src = encode_batch([text], SOURCE_CHARS)
    greedy = model.greedy_decode(src, BOS, EOS)[0].tolist()
    ids, score = beam_search(model, src, BOS, EOS, beam_size=4)
    print(f"{text:<28} greedy {decode_ids(greedy, TARGET_CHARS)} ({probability(src, greedy):.0%})"
          f"   beam {decode_ids(ids, TARGET_CHARS)} ({math.exp(score):.0%})")

# %% [markdown]
# ## 7. Source 4's two points, made concrete
#
# **The input is encoded once.** `greedy_decode` runs the encoder a single time and reuses its output
# at every step. The naive alternative calls the whole model at each step and re-encodes the same
# source every time. Both give the same answer; we count encoder layer calls and time them.

# %%
calls = Counter()
hooks = [layer.register_forward_hook(lambda *_: calls.update(["encoder layer"])) for layer in model.encoder]


@torch.no_grad()
def greedy_reencoding(src, steps=11):
    out = torch.full((src.shape[0], 1), BOS)
    for _ in range(steps):
        logits, _ = model(src, out)  # encoder runs again on the same source
        out = torch.cat([out, logits[:, -1:].argmax(-1)], dim=1)
    return out


batch_src = encode_batch([s for s, _ in test_pairs[:200]], SOURCE_CHARS)
calls.clear()
once = model.greedy_decode(batch_src, BOS, EOS, max_new_tokens=11)
n_once = calls["encoder layer"]
calls.clear()
again = greedy_reencoding(batch_src)
print("same predictions:", [decode_ids(r.tolist(), TARGET_CHARS) for r in once[:3]] == [decode_ids(r.tolist(), TARGET_CHARS) for r in again[:3]])
print(f"encoder layer calls: encode once {n_once}, re-encode every step {calls['encoder layer']}")

# %%
# NBVAL_IGNORE_OUTPUT
import time

for h in hooks:
    h.remove()
t0 = time.perf_counter()
model.greedy_decode(batch_src, BOS, EOS, max_new_tokens=11)
t1 = time.perf_counter()
greedy_reencoding(batch_src)
t2 = time.perf_counter()
print(f"encode once: {1e3 * (t1 - t0):.0f} ms | re-encode every step: {1e3 * (t2 - t1):.0f} ms "
      f"({(t2 - t1) / (t1 - t0):.1f}x slower) for 200 dates on this machine")

# %% [markdown]
# **Where a token sits changes its meaning.** Source 4 observes that an encoder-decoder gives the same
# words different probabilities depending on whether they arrived as *input* or were *generated*.
# Below, one fresh (untrained) model with a shared vocabulary scores what comes after "the cat sat
# on" twice: once with all four words as input, once with "the cat sat" as input and "on" as the
# decoder's own output. A decoder-only GPT sees one stream either way: below it reads "on" once as part
# of the prompt and once as a token it generated itself, fed back after the cached prompt the way
# chapter 07's loop does, and the two answers agree.

# %%
from transformer_course import GPT, GPTConfig

vocab = ["<pad>", "<bos>", "<eos>", "the", "cat", "sat", "on", "mat"]
ids = {w: i for i, w in enumerate(vocab)}
torch.manual_seed(4)
toy = EncoderDecoder(Seq2SeqConfig(len(vocab), len(vocab), 8, 8, d_model=32, n_head=2)).eval()
as_input, _ = toy(torch.tensor([[ids[w] for w in "the cat sat on".split()]]), torch.tensor([[BOS]]))
as_output, _ = toy(torch.tensor([[ids[w] for w in "the cat sat".split()]]), torch.tensor([[BOS, ids["on"]]]))
p_in, p_out = as_input[0, -1].softmax(-1), as_output[0, -1].softmax(-1)
print(f"encoder-decoder  P(the | ...): all input {p_in[ids['the']]:.3f} vs 'on' generated {p_out[ids['the']]:.3f}")
gpt = GPT(GPTConfig(vocab_size=len(vocab), block_size=8, n_layer=2, n_head=2, d_model=32)).eval()
stream = torch.tensor([[ids[w] for w in "the cat sat on".split()]])
p_gpt = gpt(stream)[0][0, -1].softmax(-1)  # all four words as the prompt
cache = gpt.new_cache()
gpt(stream[:, :3], cache=cache)  # the prompt "the cat sat"...
p_gen = gpt(stream[:, 3:], cache=cache)[0][0, -1].softmax(-1)  # ...then "on" fed back as if generated
print(f"decoder-only     P(the | ...): all input {p_gpt[ids['the']]:.3f} vs 'on' generated {p_gen[ids['the']]:.3f}, "
      f"the same within 1e-6: {(p_gpt - p_gen).abs().max().item() < 1e-6}")

# %% [markdown]
# The GPT paper (Radford et al. 2018) does not give its reasons for dropping the encoder: it simply
# uses a transformer decoder as its language model, a design Liu et al. (2018) had used to generate
# Wikipedia articles. What the experiment shows is what a single stream buys: for open-ended text
# there is no natural line between "input" and "output", and a stream that treats every token alike
# is simpler, uses one set of weights for both, and trains on every position of every document.
#
# ## 8. When to use which
#
# | | Encoder-only (BERT) | Decoder-only (GPT) | Encoder-decoder (the 2017 transformer, T5) |
# |---|---|---|---|
# | Attention | bidirectional self-attention | causal self-attention | bidirectional encoder; causal decoder + cross-attention |
# | Output | a vector per input token | the next token, again and again | an output sequence conditioned on an input sequence |
# | Good at | classification, tagging, retrieval embeddings | open-ended generation, chat, code, in-context learning | translation, summarisation, structured rewrites like our dates |
# | Cost at inference | one pass | one pass per new token (KV cache helps) | encoder once + one decoder pass per token |
#
# Decoder-only models won for general-purpose language models because one architecture, one
# training objective (next token) and one stream of text cover every task, and the prompt plays the
# role the encoder input used to play.

# %% [markdown]
# ## Bad input gets a clear message

# %%
bad_calls = {
    "batch sizes differ": lambda: model(encode_batch(["1 May 2000"], SOURCE_CHARS), torch.tensor([[BOS], [BOS]])),
    "target too long": lambda: model(encode_batch(["1 May 2000"], SOURCE_CHARS), torch.full((1, 13), 3)),
    "empty source": lambda: model(torch.zeros(1, 0, dtype=torch.long), torch.tensor([[BOS]])),
    "pad id outside vocabulary": lambda: Seq2SeqConfig(10, 5, 8, 8, pad_id=7),
}
for name, call in bad_calls.items():
    try:
        call()
    except ValueError as e:
        print(f"{name}: {e}")

# %% [markdown]
# ## Quick check

# %%
from transformer_course.quiz import Question, quiz

quiz([
    Question("In cross-attention, where do the keys and values come from?",
             ["From the decoder's own earlier positions", "From the encoder's output", "From the vocabulary"],
             answer=1, explain="Queries come from the decoder; keys and values from the encoded source."),
    Question("Why does cross-attention need no causal mask?",
             ["The source is fully known before decoding starts", "Because it has only one head", "It does need one"],
             answer=0, explain="Only the target is produced step by step; every output may read the whole input."),
    Question("A source that is entirely padding reaches attention. What should come out?",
             ["NaN, to flag the problem", "Zeros: no key may be attended, so nothing is mixed in", "The pad embedding"],
             answer=1, explain="A softmax over no keys is 0/0; the course's attention returns zero weights instead."),
    Question("What does a decoder-only model gain by having no encoder?",
             ["It can be trained on CPUs", "One causal stream handles every task and treats all tokens alike",
              "Its attention is faster than cross-attention"],
             answer=1, explain="With no fixed input/output boundary, the prompt does the encoder's job and one set of "
                               "weights reads both."),
])

# %% [markdown]
# ## Summary
#
# - Cross-attention is chapter 03's attention with queries from the decoder and keys/values from the
#   encoder output; its weights are [B, nh, T, S], a rectangle. You wrote `CrossAttention.forward`, and
#   the trained model ran on it. Padding masks keep pad tokens out, and an all-pad source gives zeros,
#   not NaN.
# - Cross-attention has no causal mask: a decoder given one can see only the start of the source, and
#   gets almost every date wrong.
# - `EncoderLayer` is chapter 05's block without the causal mask; `DecoderLayer` adds cross-attention
#   between its two sublayers. Both equal PyTorch's own layers (post- and pre-norm) to within 1e-5.
# - Trained for about two minutes on a CPU (`train_dates`; the course ships the trained model), it converts dates in six styles to ISO form with at
#   least 99% exact match on held-out examples, and its cross-attention lines each output digit up with
#   the input word it comes from.
# - Beam search keeps several candidates and returns the most probable finished one; on familiar dates
#   it agrees with greedy decoding, on unfamiliar years it finds more probable (not always right) answers.
#
# Exported to `transformer_course/encoder_decoder.py`: `padding_mask`, `key_mask`, `CrossAttention`,
# `EncoderLayer`, `DecoderLayer`, `copy_from_torch`, `Seq2SeqConfig`, `EncoderDecoder`; and to
# `transformer_course/dates.py`: the date task (`make_examples`, `encode_batch`, `decode_ids`, `make_batch`,
# `new_dates_model`, `train_dates`, ...).
