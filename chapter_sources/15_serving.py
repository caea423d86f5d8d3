# %% [markdown]
# # 15 · Serving many users: continuous batching, a paged KV cache and a prefix cache
#
# > Decode many requests at once on one model: a scheduler that lets finished sequences leave and new
# > ones join between two decode steps, a KV cache kept in fixed-size blocks that a table per sequence
# > points into, and a prefix cache that shares the blocks of a common prompt by reference count.
#
# Chapter 07 decodes one prompt at a time, and `transformer-course serve` did the same: each request
# waited its turn and then ran at batch 1, with a cache sized for the whole context. A serving engine
# (vLLM, SGLang, TGI) does three things differently, and this chapter builds each, small enough to read
# in one sitting, and checks each against the plain cache of chapter 04: the tokens must be the ones
# decoding each request alone gives.
#
# **In this chapter you will** see why batch 1 leaves the machine idle (Exercise 15.1), count what a
# static batch wastes on padding, keep the KV cache in blocks with a block table per sequence (15.2),
# fix a reader of the table (15.3), find the cached blocks of a shared prefix (15.4) and work out what
# sharing saves (15.5), then run a continuous-batching engine over all of it. `transformer-course
# serve` runs this engine.
#
# **You need** chapter 07 (sampling, the KV cache in `decode_with_cache`), chapter 04 (attention with a
# cache, `MultiHeadAttention.attend`), chapter 11 (the chat model) and the roofline of chapter 90.

# %%
#| default_exp batching

# %%
import time

import torch

from transformer_course.course_model import load_chat_model
from transformer_course.generation import generate

torch.set_printoptions(precision=4, sci_mode=False)
torch.set_num_threads(1)  # the timings below share a small CPU with other work: one thread keeps them steady
torch.manual_seed(0)
chat = load_chat_model()  # chapter 11's shipped assistant
model, tok = chat.model.eval(), chat.tokenizer
cfg = model.cfg
print(f"{model.num_parameters():,} parameters, {cfg.n_layer} layers, d_model {cfg.d_model}, "
      f"context {cfg.block_size} tokens")

# %% [markdown]
# ## 1. Why batch 1 wastes the machine
#
# Chapter 90's roofline: a decode step at batch 1 reads every weight once and does one multiply-add
# (2 floating-point operations) with it, for one token. With B sequences in the batch the same weights,
# read once, serve B tokens: the work per byte read grows with B while the bytes read stay the same.
# Which of the two limits a step, reading or arithmetic, decides what a bigger batch costs (for a model
# this small, Python's fixed cost per layer and per operation adds to the reading side).

# %%
#| export
"""Continuous batching (chapter 15): many requests decoded together on one model, over the paged KV cache
of `paged_cache`. Sequences join and leave between two decode steps; each has its own sampling settings
and generator, so its tokens are those `generation.generate` gives it alone.
Shapes: B sequences in a step, T new positions, V vocabulary size."""

import math
from collections import deque
from dataclasses import dataclass, field

import torch

from transformer_course.arguments import whole_number
from transformer_course.generation import check_sampling, next_token_probs, sample_next
from transformer_course.paged_cache import (
    BlockTable,
    PagedKVCache,
    PrefixCache,
    append_slots,
    free_table,
    paged_forward,
)

# %% [markdown]
# Chapter 90 measured this CPU's ridge point (the intensity, in operations per byte read, where
# arithmetic rather than memory becomes the limit) at tens of operations per byte. The weights here are
# float32.

# %%
# Your turn - Exercise 15.1 (★☆☆, predict): what batching buys at small batch.
def my_prediction() -> tuple[float, str]:
    """(the FLOPs per byte of weights read in a float32 decode step at batch 8, and whether the time of one
    step of 8 sequences is "about 1x" or "about 8x" that of one sequence on this model)."""
    ### BEGIN SOLUTION
    return 4.0, "about 1x"
    ### END SOLUTION


# %%
from transformer_course.checks.serving import check_predict_batching

check_predict_batching(my_prediction)

# %% [markdown]
# `flops_per_byte` writes the count down; the measurement uses chapter 07's plain cache: B prompts of 8
# tokens, then 24 decode steps of the whole batch. The times vary from machine to machine (the cell is not
# compared); the shape is what to look at.
#
# <details><summary>What the shape says (open after you have answered)</summary>
#
# Tokens per second grow almost as fast as the batch at first, because a step of a few rows costs about
# what a step of one row costs; the growth flattens as the arithmetic (and the attention over more rows)
# starts to count. Serving one request at a time leaves that factor unused.
#
# </details>

# %%
#| export
def flops_per_byte(batch: int, bytes_per_weight: int = 4) -> float:
    """Arithmetic intensity of a decode step: 2 operations per weight and sequence, each weight read once."""
    return 2 * whole_number(batch, "batch") / bytes_per_weight


# %%
# NBVAL_IGNORE_OUTPUT
def decode_rate(batch: int, steps: int = 24) -> float:
    idx = torch.randint(0, tok.base.vocab_size, (batch, 8), generator=torch.Generator().manual_seed(0))
    cache, start = model.new_cache(), time.perf_counter()
    with torch.no_grad():
        logits, _ = model(idx, cache=cache, last_only=True)
        for _ in range(steps):
            logits, _ = model(logits[:, -1].argmax(-1)[:, None], cache=cache, last_only=True)
    return batch * steps / (time.perf_counter() - start)


decode_rate(1)  # a first run warms up the kernels
rates = {b: decode_rate(b) for b in (1, 4, 16, 48)}
for b, rate in rates.items():
    print(f"batch {b:3}: {rate:8.0f} tokens/s ({rate / rates[1]:5.1f}x batch 1, {flops_per_byte(b):4.1f} FLOP/byte)")

# %% [markdown]
# ## 2. Static batching and its padding
#
# The simplest batch: take B requests, pad their prompts to the longest, and decode until the longest
# answer is done. Every row pays for the longest prompt and the longest answer: a row that finished
# early keeps its slot, computing tokens no one reads, and no new request can start until the whole
# batch ends. `static_batch_slots` counts the positions such a batch computes and the ones it needed.

# %%
#| export
def static_batch_slots(prompt_lengths: list[int], answer_lengths: list[int]) -> tuple[int, int]:
    """(positions a static batch computes, positions the requests need): every row padded to the longest
    prompt plus the longest answer, against each prompt plus its own answer."""
    if len(prompt_lengths) != len(answer_lengths) or not prompt_lengths:
        raise ValueError("give one prompt length and one answer length per request, at least one request")
    needed = sum(p + a for p, a in zip(prompt_lengths, answer_lengths, strict=True))
    return len(prompt_lengths) * (max(prompt_lengths) + max(answer_lengths)), needed


# %% [markdown]
# Eight requests like a chat's: prompts of 6 to 30 tokens, answers of 2 to 30.

# %%
prompts_len = [6, 12, 30, 9, 14, 22, 8, 11]
answers_len = [30, 4, 6, 2, 12, 25, 3, 8]
computed, needed = static_batch_slots(prompts_len, answers_len)
print(f"computed {computed} positions for {needed} needed: {1 - needed / computed:.0%} wasted on padding")

# %% [markdown]
# More than half the work is padding. Continuous (iteration-level) batching (Yu et al. 2022, Orca)
# removes both costs: the batch is rebuilt between two decode steps, so a finished sequence leaves at
# once and a waiting one takes its place. Sequences in one step then have different lengths, and a
# contiguous cache of [B, nh, L, hs] no longer fits them: that is what the paged cache is for.
#
# ## 3. A paged KV cache
#
# Reserving a whole context per sequence wastes memory the same way padding wastes compute. Kwon et
# al. (2023, vLLM's PagedAttention) borrowed the operating system's answer: cut the cache into **blocks**
# of a fixed number of positions, hand them out as a sequence grows, and keep per sequence a **block
# table**, the list of its blocks in order. Position p of a sequence lives in block `table[p // bs]` at
# offset `p % bs`; all blocks sit in one big tensor of **slots** (block b's positions are slots
# b·bs ... b·bs + bs − 1), so a slot number is an index into it.
#
# The bookkeeping is a pool: a free list and a reference count per block (a block shared by several
# sequences, section 4, goes back to the free list when its last holder lets go).

# %%
#| export paged_cache
"""A paged KV cache (chapter 15): keys and values of every layer in fixed-size blocks, a block table per
sequence, and attention that reads through the table; a prefix cache shares full blocks of a common prompt
by reference count. Shapes: B sequences, T new positions, L positions of a sequence, S = num_blocks *
block_size slots, nkv key/value heads, hs head size, C channels, V vocabulary size."""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from transformer_course.arguments import whole_number
from transformer_course.modern import ROPE_CONVENTIONS
from transformer_course.multihead import merge_heads, split_heads


class CacheFull(RuntimeError):
    """No free block is left in the pool."""


class BlockPool:
    """The bookkeeping of ``num_blocks`` blocks of ``block_size`` positions: a free list and a reference count
    per block. ``on_free(block)`` (if set) is called when a block's last reference goes."""

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = whole_number(num_blocks, "num_blocks")
        self.block_size = whole_number(block_size, "block_size")
        self.refs = [0] * self.num_blocks
        self.free = list(range(self.num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self.on_free: Callable[[int], None] | None = None

    @property
    def used(self) -> int:
        """Blocks held by at least one sequence."""
        return self.num_blocks - len(self.free)

    def allocate(self) -> int:
        """A free block, now held once (CacheFull when none is left)."""
        if not self.free:
            raise CacheFull(f"all {self.num_blocks} blocks of {self.block_size} positions are in use")
        block = self.free.pop()
        self.refs[block] = 1
        return block

    def share(self, block: int) -> None:
        """One more holder of a block in use."""
        if self.refs[block] < 1:
            raise ValueError(f"block {block} is free: only a block in use can be shared")
        self.refs[block] += 1

    def release(self, block: int) -> None:
        """One holder fewer; the last one returns the block to the free list."""
        if self.refs[block] < 1:
            raise ValueError(f"block {block} is already free: released twice?")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free.append(block)
            if self.on_free is not None:
                self.on_free(block)


@dataclass
class BlockTable:
    """One sequence's blocks, in order, and the number of positions written into them."""

    blocks: list[int] = field(default_factory=list)
    length: int = 0


# %% [markdown]
# Your turn: growing a table. A sequence about to write `n` new positions needs a slot for each; its last
# block may have room left, and when it is full (or the table is empty) the next position needs a fresh
# block from the pool. Worked numbers, block size 4: a table holding blocks [7] and length 3 that
# appends 3 positions writes slot 7·4 + 3 = 31, then takes a new block (say 2) for slots 8 and 9, and
# ends with blocks [7, 2] and length 6.

# %%
#| export paged_cache
# Your turn - Exercise 15.2 (★★☆, build): append positions to a block table.
def append_slots(table: BlockTable, pool: BlockPool, n: int) -> list[int]:
    """Make room for ``n`` more positions of ``table``: their slots (block * block_size + offset), taking a
    block from ``pool`` whenever the last one is full; ``table.blocks`` and ``table.length`` are updated."""
    n = whole_number(n, "n", low=0, hint="the number of new positions")
    ### BEGIN SOLUTION
    slots = []
    for _ in range(n):
        offset = table.length % pool.block_size
        if offset == 0:  # no block yet, or the last one is full
            table.blocks.append(pool.allocate())
        slots.append(table.blocks[-1] * pool.block_size + offset)
        table.length += 1
    return slots
    ### END SOLUTION


# %%
from transformer_course.checks.serving import check_append_slots

append_slots = check_append_slots(append_slots).use

# %% [markdown]
# Freeing a table hands each of its blocks back (a shared one only loses a holder). Two sequences that
# grow in turns get interleaved blocks, and nothing needs to be contiguous:

# %%
#| export paged_cache
def free_table(table: BlockTable, pool: BlockPool) -> None:
    """Release every block of ``table`` (a shared block only loses this holder) and empty it."""
    for block in table.blocks:
        pool.release(block)
    table.blocks, table.length = [], 0


# %%
pool = BlockPool(num_blocks=8, block_size=4)
a, b = BlockTable(), BlockTable()
print("a writes", append_slots(a, pool, 5), "| b writes", append_slots(b, pool, 3))
print("a writes", append_slots(a, pool, 4))
print("tables:", a.blocks, b.blocks, "| blocks used", pool.used)
free_table(a, pool)
print("after a leaves: blocks used", pool.used, "| b's next slots", append_slots(b, pool, 2))

# %% [markdown]
# The storage: keys and values of every layer, [n_layer, S, nkv, hs] each, where S is blocks × block
# size. Reading a sequence means turning its positions 0 ... L−1 into slots through the table and
# gathering those rows. Memory is bounded by the number of blocks, which a server sets from megabytes.

# %%
#| export paged_cache
class PagedKVCache:
    """Keys and values of every layer of ``model`` in ``num_blocks`` blocks of ``block_size`` positions:
    ``k``, ``v`` [n_layer, S, nkv, hs], S = num_blocks * block_size; ``pool`` does the bookkeeping."""

    def __init__(self, model, num_blocks: int, block_size: int = 16):
        cfg, weights = model.cfg, next(model.parameters())
        self.pool = BlockPool(num_blocks, block_size)
        shape = (cfg.n_layer, self.pool.num_blocks * self.pool.block_size, cfg.n_kv_head or cfg.n_head,
                 cfg.head_size)
        self.k = weights.new_zeros(shape)  # (n_layer, S, nkv, hs)
        self.v = weights.new_zeros(shape)  # (n_layer, S, nkv, hs)

    @staticmethod
    def block_bytes(cfg, block_size: int = 16, bytes_per_number: int = 4) -> int:
        """Bytes of one block: keys and values of every layer, key/value head and channel, block_size positions."""
        return 2 * cfg.n_layer * (cfg.n_kv_head or cfg.n_head) * cfg.head_size * block_size * bytes_per_number

    @classmethod
    def from_megabytes(cls, model, megabytes: float, block_size: int = 16) -> PagedKVCache:
        """As many blocks as fit in ``megabytes`` (at least one)."""
        blocks = int(megabytes * 2**20 // cls.block_bytes(model.cfg, block_size))
        if blocks < 1:
            raise ValueError(f"{megabytes} MB holds no block of {cls.block_bytes(model.cfg, block_size):,} bytes: "
                             "give more memory to the KV cache")
        return cls(model, blocks, block_size)


# %% [markdown]
# Attention through the table. `paged_forward` runs the model's own layers (chapter 05's blocks,
# chapter 04's `attend`) on new tokens at per-sequence positions: it writes each layer's new keys and
# values into their slots, then gathers each sequence's keys and values through its slots, padding
# the shorter ones and masking the padding. Two shapes of call suffice: one sequence's prompt
# (B = 1, T new positions, the causal mask aligned after what is cached), or one new token for each
# of B sequences of different lengths (T = 1).

# %%
#| export paged_cache
def _embed_at(embed, idx: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Chapter 02's embedding of idx [B, T] at positions [B, T] (each row its own) -> [B, T, C]."""
    x = embed.token(idx)  # (B, T, C)
    if embed.positional is None:  # rotary positions act in attention
        return x
    return x + (embed.pe[positions] if embed.position is None else embed.position(positions))  # (B, T, C)


def _rope_at(rope, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Chapter 10's rotary embedding of x [B, h, T, hs] at positions [B, T]."""
    cos, sin = rope.cos[positions][:, None], rope.sin[positions][:, None]  # (B, 1, T, hs/2)
    return ROPE_CONVENTIONS[rope.convention](x.float(), cos, sin).to(x.dtype)


def _paged_attention(attn, x: torch.Tensor, layer: int, cache: PagedKVCache, ctx: dict) -> torch.Tensor:
    """Chapter 04's attention on x [B, T, C], its keys and values written to and read from the cache."""
    B, T, _ = x.shape
    nh, nkv, hs = attn.n_head, attn.n_kv_head, attn.head_size
    q, k, v = attn.qkv(x).split([nh * hs, nkv * hs, nkv * hs], dim=2)
    q, k, v = split_heads(q, nh), split_heads(k, nkv), split_heads(v, nkv)  # (B, heads, T, hs)
    if attn.rope is not None:
        q, k = _rope_at(attn.rope, q, ctx["positions"]), _rope_at(attn.rope, k, ctx["positions"])
    cache.k[layer, ctx["write"]] = k.transpose(1, 2).reshape(B * T, nkv, hs)  # new keys into their slots
    cache.v[layer, ctx["write"]] = v.transpose(1, 2).reshape(B * T, nkv, hs)
    keys = cache.k[layer, ctx["read"]].transpose(1, 2)  # (B, nkv, L_max, hs), gathered through the tables
    values = cache.v[layer, ctx["read"]].transpose(1, 2)
    y = attn.attend(q, keys, values, ctx["mask"])  # (B, nh, T, hs)
    return attn.proj(merge_heads(y))  # (B, T, C)


def _paged_block(block, x: torch.Tensor, layer: int, cache: PagedKVCache, ctx: dict) -> torch.Tensor:
    """Chapter 05's block, its attention reading through the block tables."""
    if block.norm == "pre":
        x = x + _paged_attention(block.attn, block.ln1(x), layer, cache, ctx)
        return x + block.mlp(block.ln2(x))
    x = block.ln1(x + _paged_attention(block.attn, x, layer, cache, ctx))
    return block.ln2(x + block.mlp(x))


@torch.no_grad()
def paged_forward(model, cache: PagedKVCache, idx: torch.Tensor, tables: list[BlockTable],
                  write: list[list[int]]) -> torch.Tensor:
    """Logits [B, V] after the new tokens idx [B, T] of B sequences: row b's tokens sit at the last T positions
    of ``tables[b]`` (already grown by `append_slots`, whose slots are ``write[b]``). B = 1, or T = 1."""
    B, T = idx.shape
    if B > 1 and T > 1:
        raise ValueError("paged_forward takes one sequence's prompt (B = 1) or one token per sequence (T = 1)")
    lengths, bs, device = [t.length for t in tables], cache.pool.block_size, cache.k.device
    read = [table_slots(t.blocks, t.length, bs) for t in tables]  # each (L_b,)
    L = max(lengths)
    read_slots = torch.stack([torch.nn.functional.pad(r, (0, L - len(r))) for r in read]).to(device)  # (B, L)
    held = torch.tensor(lengths, device=device)[:, None]  # (B, 1)
    mask = None
    if min(lengths) < L:  # padded keys are never attended
        mask = (torch.arange(L, device=device)[None, :] < held)[:, None, None, :]  # (B, 1, 1, L)
    positions = held - T + torch.arange(T, device=device)  # (B, T)
    ctx = {"positions": positions, "write": torch.tensor(write, device=device).reshape(-1), "read": read_slots,
           "mask": mask}
    x = _embed_at(model.embed, idx, positions)
    for layer, block in enumerate(model.blocks):
        x = _paged_block(block, x, layer, cache, ctx)
    return model.lm_head(model.ln_f(x[:, -1]))  # (B, V)


# %% [markdown]
# Equivalence with the plain cache: `paged_greedy` runs a prompt through blocks handed out out of order
# (another sequence took the first ones) and decodes greedily, one token per step, through the table.

# %%
from transformer_course.paged_cache import table_slots  # the package's reader, until Exercise 15.3


def paged_greedy(prompt: list[int], n: int, cache: PagedKVCache, reader=None) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens after `prompt` through the paged cache (its table freed at the end), and the first logits;
    `reader` replaces `table_slots` for the run."""
    global table_slots
    saved, table_slots = table_slots, reader or table_slots
    try:
        table, ids, first, new = BlockTable(), list(prompt), None, list(prompt)
        for _ in range(n):
            slots = append_slots(table, cache.pool, len(new))
            logits = paged_forward(model, cache, torch.tensor([new]), [table], [slots])
            first = logits if first is None else first
            ids.append(int(logits.argmax(-1)))
            new = ids[-1:]
        free_table(table, cache.pool)
        return ids[len(prompt):], first
    finally:
        table_slots = saved


def busy_cache() -> PagedKVCache:
    cache = PagedKVCache(model, num_blocks=24, block_size=4)
    append_slots(BlockTable(), cache.pool, 9)  # another sequence holds blocks 0, 1 and 2 first
    return cache


prompt = tok.encode("<|user|>reverse: gentle<|end|><|assistant|>")

# %% [markdown]
# Here is a reader of the table that turns positions 0 ... L−1 into slots. It has a bug: the model
# decodes right through it while a short sequence stays in the pool's first block, and wrong elsewhere.

# %%
def buggy_table_slots(blocks: list[int], length: int, block_size: int) -> torch.Tensor:
    pos = torch.arange(length)  # (L,)
    return torch.tensor(blocks, dtype=torch.long)[pos // block_size] + pos % block_size  # (L,)


for n_prompt, cache in [(1, PagedKVCache(model, num_blocks=24, block_size=4)), (21, busy_cache())]:
    got, _ = paged_greedy(prompt[:n_prompt], 3, cache, reader=buggy_table_slots)
    alone = generate(model, torch.tensor([prompt[:n_prompt]]), 3, temperature=0)[0, n_prompt:].tolist()
    print(f"prompt of {n_prompt:2} tokens: the buggy reader's tokens equal the plain cache's: {got == alone}")

# %%
#| export paged_cache
# Your turn - Exercise 15.3 (★☆☆, debug): fix the table reader.
def table_slots(blocks: list[int], length: int, block_size: int) -> torch.Tensor:
    """Slots of positions 0 .. length-1 of a sequence whose blocks are ``blocks``: LongTensor [length]."""
    ### BEGIN SOLUTION
    pos = torch.arange(length)  # (L,)
    return torch.tensor(blocks, dtype=torch.long)[pos // block_size] * block_size + pos % block_size  # (L,)
    ### END SOLUTION


# %%
from transformer_course.checks.serving import check_table_slots

table_slots = check_table_slots(table_slots).use

# %% [markdown]
# With a right reader, a prompt of 21 tokens gives the logits chapter 07's cache gives, and the next 10
# greedy steps the same tokens:

# %%
plain = generate(model, torch.tensor([prompt]), 10, temperature=0)[0, len(prompt):].tolist()
ours, first = paged_greedy(prompt, 10, busy_cache())
plain_logits, _ = model(torch.tensor([prompt]), last_only=True)
print("greedy tokens identical to the plain cache:", ours == plain, "| answer:", repr(tok.decode(ours[:6])))
print("first logits within 1e-5:", bool((first - plain_logits[:, -1]).abs().max() < 1e-5))

# %% [markdown]
# ## 4. A prefix cache
#
# A chat server sees the same beginnings again and again: a system prompt, the history of a
# conversation that grows by one turn per request. Their keys and values are the same every time (the
# cache of position p depends on tokens 0 ... p only), so a full block computed once can serve every
# sequence that starts with the same tokens. The prefix cache (SGLang's RadixAttention, vLLM's automatic
# prefix caching) keeps a dictionary from **every token from position 0 to the end of a full block**
# (a tuple, so two blocks with the same contents after different beginnings are different keys) to that
# block's id. A new sequence looks its prompt up, shares the blocks found (reference count + 1) and
# computes only the rest. A block leaves the dictionary when its last holder frees it.
#
# Your turn, with no recipe this time: find the blocks of the longest cached prefix of a prompt. Only
# full blocks are ever cached, and the last token of the prompt must always be computed (its logits
# choose the first new token), so a prompt of exactly two blocks can reuse only the first.

# %%
#| export paged_cache
# Your turn - Exercise 15.4 (★★★, build): the longest cached prefix.
def match_prefix(cached: dict[tuple[int, ...], int], tokens: list[int], block_size: int) -> list[int]:
    """The blocks, in order, of the longest run of full blocks of ``tokens`` found in ``cached`` (key: the
    tokens from position 0 to the end of a block), leaving at least the last token to compute."""
    ### BEGIN SOLUTION
    found = []
    for end in range(block_size, len(tokens), block_size):  # end < len(tokens): the last token stays
        block = cached.get(tuple(tokens[:end]))
        if block is None:
            break
        found.append(block)
    return found
    ### END SOLUTION


# %%
from transformer_course.checks.serving import check_match_prefix

match_prefix = check_match_prefix(match_prefix).use

# %%
#| export paged_cache
class PrefixCache:
    """Full blocks already computed, found by their tokens (`match_prefix`'s dictionary). A block is entered
    once full and forgotten when the pool frees it; ``hits`` counts blocks reused, ``lookups`` blocks asked."""

    def __init__(self, pool: BlockPool):
        self.pool, self.blocks, self.keys = pool, {}, {}  # key -> block, block -> key
        self.hits = self.lookups = 0
        pool.on_free = self.forget

    def share(self, tokens: list[int]) -> BlockTable:
        """A table holding the cached blocks of the longest prefix of ``tokens`` (each now held once more)."""
        found = match_prefix(self.blocks, tokens, self.pool.block_size)
        self.lookups += (len(tokens) - 1) // self.pool.block_size
        self.hits += len(found)
        for block in found:
            self.pool.share(block)
        return BlockTable(list(found), len(found) * self.pool.block_size)

    def enter(self, tokens: list[int], table: BlockTable) -> None:
        """Remember every full block of ``table`` (whose positions hold ``tokens``) not known yet."""
        bs = self.pool.block_size
        for i, block in enumerate(table.blocks[: table.length // bs]):
            key = tuple(tokens[: (i + 1) * bs])
            if key not in self.blocks and block not in self.keys:
                self.blocks[key], self.keys[block] = block, key

    def forget(self, block: int) -> None:
        """The pool freed ``block``: it is no longer a prefix of anything."""
        key = self.keys.pop(block, None)
        if key is not None:
            del self.blocks[key]


# %% [markdown]
# Two prompts with the same 16-token beginning: the second computes only its last tokens, reads the
# shared blocks through its table, and decodes the same tokens as without the cache.

# %%
paged = PagedKVCache(model, num_blocks=24, block_size=4)
prefix = PrefixCache(paged.pool)
first_prompt = tok.encode("<|user|>reverse: gentle<|end|><|assistant|>")
second_prompt = tok.encode("<|user|>reverse: gentlemen<|end|><|assistant|>")
t1 = prefix.share(first_prompt)
slots = append_slots(t1, paged.pool, len(first_prompt))
paged_forward(model, paged, torch.tensor([first_prompt]), [t1], [slots])
prefix.enter(first_prompt, t1)
t2 = prefix.share(second_prompt)
print(f"second prompt: {len(second_prompt)} tokens, {t2.length} of them found in blocks {t2.blocks}")
new = second_prompt[t2.length:]
slots = append_slots(t2, paged.pool, len(new))
logits = paged_forward(model, paged, torch.tensor([new]), [t2], [slots])
plain_logits, _ = model(torch.tensor([second_prompt]), last_only=True)
print("logits within 1e-5 of computing it all:", bool((logits - plain_logits[:, -1]).abs().max() < 1e-5))
print("reference counts of the shared blocks:", [paged.pool.refs[b] for b in t2.blocks[:3]])
free_table(t1, paged.pool)
free_table(t2, paged.pool)
print("after both leave: blocks used", paged.pool.used, "| prefixes remembered", len(prefix.blocks))

# %% [markdown]
# What does sharing save? Your turn to extend the idea: count the blocks a set of prompts needs with
# every prompt cached on its own, and with full blocks shared whenever the whole beginning up to their
# end is the same (a partial last block is never shared). Worked numbers, block size 4: prompts
# [1, 2, 3, 4, 5] and [1, 2, 3, 4, 6, 7] need 2 + 2 = 4 blocks alone, and 3 shared (the block [1, 2, 3, 4]
# once).

# %%
# Your turn - Exercise 15.5 (★★☆, extend): what a prefix cache saves.
def blocks_needed(prompts: list[list[int]], block_size: int) -> tuple[int, int]:
    """(blocks for ``prompts`` each alone, blocks with full blocks of equal beginnings shared)."""
    ### BEGIN SOLUTION
    alone = sum(-(-len(p) // block_size) for p in prompts)
    full = {tuple(p[:end]) for p in prompts for end in range(block_size, len(p) + 1, block_size)}
    partial = sum(1 for p in prompts if len(p) % block_size)
    return alone, len(full) + partial
    ### END SOLUTION


# %%
from transformer_course.checks.serving import check_blocks_needed

blocks_needed = check_blocks_needed(blocks_needed).use

# %% [markdown]
# Sixteen chat requests that share a 38-token beginning (a system prompt), in blocks of 8:

# %%
system = "<|user|>one word only, no more. task: "
traffic = [tok.encode(f"{system}upper: {w}<|end|><|assistant|>") for w in
           ["king", "queen", "lord", "night", "day", "sword", "crown", "rose",
            "love", "death", "heart", "moon", "sun", "ghost", "blood", "time"]]
alone, shared = blocks_needed(traffic, 8)
print(f"prompts of {min(map(len, traffic))}-{max(map(len, traffic))} tokens: {alone} blocks alone, {shared} shared")

# %% [markdown]
# ## 5. Continuous batching over the paged cache
#
# The engine puts it together. Requests wait in a queue; before each step it admits waiting ones while
# the batch has room (`max_batch`) and the pool can hold every admitted sequence at its longest (a
# reservation: a sequence never runs out of blocks half-way). Each step computes, for every running
# sequence, what its cache lacks: a newly admitted one its prompt (after the prefix cache's blocks), one
# at a time; all the others one token each, **in one batched call**. Each row then draws its next token
# with its own settings and generator (chapter 07's `next_token_probs`, worked out at once for the rows that
share their settings, then one draw per row from the row's generator), and a sequence that produced its end
# token, reached `max_tokens` or was cancelled leaves, its blocks freed, before the next step.
#
# A sequence longer than the context does what chapter 07's `generate` does: it keeps its last
# `block_size` tokens and computes them again from position 0.

# %%
#| export
@dataclass
class Request:
    """What one request asks for: its prompt's ids, how many tokens at most, and chapter 07's sampling."""

    prompt: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    eos_id: int | None = None


@dataclass(eq=False)  # two sequences are never "equal": each is its own request
class Sequence:
    """A request being decoded: the tokens its context holds (``window``), its table, its generator, the
    tokens produced and, once over, why (``finish``: "stop", "length" or "cancelled")."""

    request: Request
    window: list[int]
    table: BlockTable = field(default_factory=BlockTable)
    generator: torch.Generator | None = None
    out: list[int] = field(default_factory=list)
    finish: str | None = None
    cancelled: bool = False

    def cancel(self) -> None:
        """End this sequence before the next step (its blocks are freed there). Safe from any thread."""
        self.cancelled = True


# %%
#| export
class Engine:
    """Continuous batching of ``model`` over ``cache``: `submit` queues a request, `step` runs one decode step of
    every running sequence (admitting waiting ones first) and returns what each produced. ``never`` [V]: ids
    never sampled (`generation.stream`'s ``allowed``)."""

    def __init__(self, model, cache: PagedKVCache, max_batch: int = 64, prefix_cache: bool = True,
                 never: torch.Tensor | None = None):
        self.model, self.cache, self.never = model.eval(), cache, never
        self.max_batch = whole_number(max_batch, "max_batch")
        self.prefix = PrefixCache(cache.pool) if prefix_cache else None
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.tokens = 0  # tokens produced so far

    def blocks_for(self, request: Request) -> int:
        """The most blocks a request holds at once: its longest window, at most the context."""
        longest = min(len(request.prompt) + request.max_tokens, self.model.cfg.block_size)
        return math.ceil(longest / self.cache.pool.block_size)

    def submit(self, request: Request) -> Sequence:
        """Queue ``request``; a ValueError when it is malformed or could never fit in the cache."""
        check_sampling(request.temperature, request.top_k, request.top_p)
        whole_number(request.max_tokens, "max_tokens")
        if not request.prompt or not all(0 <= i < self.model.cfg.vocab_size for i in request.prompt):
            raise ValueError("the prompt must be at least one token id of the model's vocabulary")
        if self.blocks_for(request) > self.cache.pool.num_blocks:
            raise ValueError(f"this request needs {self.blocks_for(request)} blocks and the cache holds "
                             f"{self.cache.pool.num_blocks}: give the KV cache more memory")
        seq = Sequence(request, list(request.prompt[-self.model.cfg.block_size:]),
                       generator=torch.Generator().manual_seed(request.seed))
        self.waiting.append(seq)
        return seq

    def _admit(self) -> None:
        reserved = sum(self.blocks_for(s.request) for s in self.running)
        while self.waiting and len(self.running) < self.max_batch:
            seq = self.waiting[0]
            if seq.cancelled:
                self.waiting.popleft().finish = "cancelled"
                continue
            if reserved + self.blocks_for(seq.request) > self.cache.pool.num_blocks:
                break  # first come, first served: the head of the queue waits for blocks
            self.waiting.popleft()
            reserved += self.blocks_for(seq.request)
            self.running.append(seq)

    def _compute(self, seqs: list[Sequence]) -> torch.Tensor:
        """Logits [B, V] after what the caches of ``seqs`` lack (one prompt, or one token each); an empty
        table first takes the prefix cache's blocks."""
        if self.prefix is not None and len(seqs) == 1 and seqs[0].table.length == 0:
            seqs[0].table = self.prefix.share(seqs[0].window)  # looked up now: an earlier prompt may have filled it
        pool, new = self.cache.pool, [s.window[s.table.length:] for s in seqs]
        write = [append_slots(s.table, pool, len(n)) for s, n in zip(seqs, new, strict=True)]
        idx = torch.tensor(new, device=self.cache.k.device)
        logits = paged_forward(self.model, self.cache, idx, [s.table for s in seqs], write)
        if self.prefix is not None:
            for s in seqs:
                self.prefix.enter(s.window, s.table)
        return logits

    def _choose(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        """The next token of each of ``seqs`` sharing one setting, from their logits [B, V]: the distribution is
        worked out for all rows at once, and each row draws with its own generator."""
        r = seqs[0].request
        if self.never is not None:
            logits = logits.masked_fill(self.never, float("-inf"))
        if r.temperature == 0:
            return sample_next(logits, 0.0, r.top_k, r.top_p).tolist()
        probs = next_token_probs(logits, r.temperature, r.top_k, r.top_p)  # (B, V)
        return [int(torch.multinomial(probs[i:i + 1], 1, generator=s.generator)) for i, s in enumerate(seqs)]

    def _draw(self, rows: list[tuple[Sequence, torch.Tensor]]) -> list[int]:
        """The next token of every row (a sequence and its logits [V]), rows grouped by their settings."""
        groups: dict[tuple, list[int]] = {}
        for i, (seq, _) in enumerate(rows):
            r = seq.request
            groups.setdefault((r.temperature, r.top_k, r.top_p), []).append(i)
        tokens = [0] * len(rows)
        for members in groups.values():
            drawn = self._choose([rows[i][0] for i in members], torch.stack([rows[i][1] for i in members]))
            for i, token in zip(members, drawn, strict=True):
                tokens[i] = token
        return tokens

    def _retire(self, seq: Sequence, reason: str) -> None:
        seq.finish = reason
        free_table(seq.table, self.cache.pool)
        self.running.remove(seq)

    def step(self) -> list[tuple[Sequence, int]]:
        """One step: admit, compute, draw one token per running sequence; finished ones leave."""
        for seq in [s for s in self.running if s.cancelled]:
            self._retire(seq, "cancelled")
        self._admit()
        block = self.model.cfg.block_size
        for seq in self.running:
            if len(seq.window) > block:  # past the context: keep the last block_size tokens, from position 0
                free_table(seq.table, self.cache.pool)
                seq.window = seq.window[-block:]
        one = [s for s in self.running if len(s.window) - s.table.length == 1]
        rows = list(zip(one, self._compute(one), strict=True)) if one else []  # every decode in one call
        for seq in [s for s in self.running if s not in one]:  # then each new prompt, unless cancelled meanwhile
            if not seq.cancelled:
                rows.append((seq, self._compute([seq])[0]))
        events = []
        for (seq, _), token in zip(rows, self._draw(rows), strict=True):
            seq.out.append(token)
            seq.window.append(token)
            events.append((seq, token))
            r = seq.request
            if token == r.eos_id or len(seq.out) >= r.max_tokens:
                self._retire(seq, "stop" if token == r.eos_id else "length")
        self.tokens += len(events)
        return events

    def run(self, requests: list[Request]) -> list[Sequence]:
        """Submit ``requests`` and step until every one is done: their sequences, in order."""
        seqs = [self.submit(r) for r in requests]
        while self.running or self.waiting:
            self.step()
        return seqs


# %% [markdown]
# Eight chat requests of different lengths, at most four at a time, greedy: each row of the timeline is a
# step, each column a request (`P` its prompt computed, `.` a decoded token, blank: not running).

# %%
words = ["gentle", "king", "night", "sword", "rose", "queen", "death", "moon"]
reqs = [Request(tok.encode(f"<|user|>{kind}: {w}<|end|><|assistant|>"), max_tokens=n, eos_id=tok.end_id)
        for w, kind, n in zip(words, ["reverse", "upper"] * 4, [12, 3, 9, 5, 12, 2, 7, 4], strict=True)]
engine = Engine(model, PagedKVCache(model, num_blocks=32, block_size=8), max_batch=4)
seqs = [engine.submit(r) for r in reqs]
steps = 0
while engine.running or engine.waiting:
    fresh = {id(s) for s in engine.waiting}
    events = engine.step()
    ran = {id(s): ("P" if id(s) in fresh else ".") for s, _ in events}
    print(f"step {steps:2} |" + "".join(ran.get(id(s), " ") for s in seqs) + "|")
    steps += 1

# %%
alone = [generate(model, torch.tensor([r.prompt]), r.max_tokens, temperature=0, eos_id=tok.end_id)[0, len(r.prompt):]
         .tolist() for r in reqs]
print("every request's tokens identical to decoding it alone:", [s.out for s in seqs] == alone)
print(f"{steps} steps for {sum(map(len, alone))} tokens; blocks used after the run: {engine.cache.pool.used}")
print("answers:", [tok.decode([i for i in s.out if i != tok.end_id]) for s in seqs])

# %% [markdown]
# Sampled requests too: each has its own temperature, top-p and seed, and its tokens are those chapter 07's
# `generate` draws for it alone with that seed, however the batch around it changes. The sixteen requests
# with a shared system prompt reuse its blocks:

# %%
sampled = [Request(p, max_tokens=10, temperature=[0.0, 0.8, 1.0, 1.2][i % 4], top_p=[None, 0.9][i % 2],
                   seed=100 + i, eos_id=tok.end_id) for i, p in enumerate(traffic)]
engine = Engine(model, PagedKVCache(model, num_blocks=64, block_size=8), max_batch=8)
done = engine.run(sampled)


def alone_tokens(r: Request) -> list[int]:
    g = torch.Generator().manual_seed(r.seed)
    out = generate(model, torch.tensor([r.prompt]), r.max_tokens, r.temperature, r.top_k, r.top_p,
                   generator=g, eos_id=r.eos_id)
    return out[0, len(r.prompt):].tolist()


print("identical to each alone with its seed:", [s.out for s in done] == [alone_tokens(r) for r in sampled])
print(f"prefix cache: {engine.prefix.hits} of {engine.prefix.lookups} full prompt blocks reused; "
      f"blocks used at the end: {engine.cache.pool.used}")

# %% [markdown]
# ## 6. Behind the server
#
# `transformer-course serve` runs one `Engine` in a thread of its own: each HTTP request (streamed or not)
# is submitted with its own sampling settings, `max_tokens`, stop strings and seed; the engine's loop steps
# while anything runs and sends each token to its request. A client that disconnects cancels its sequence,
# whose blocks are freed before the next step. `--kv-cache-mb` sets the number of blocks; a request waits
# for blocks in the queue, and past `--max-waiting` waiting requests a new one gets 429 with a
# `Retry-After` header. `/metrics` reports running and waiting requests, blocks used, prefix hits and
# tokens per second in Prometheus' text format.
#
# What this engine does not do, and what vLLM does instead:
#
# - **Prompts one at a time.** A newly admitted prompt is computed alone, and the decode batch waits for
#   it; vLLM splits long prompts into chunks and runs them in the same step as the decode tokens
#   (chunked prefill).
# - **Reservation instead of preemption.** A sequence is admitted only if its longest window fits; vLLM
#   admits optimistically and, when blocks run out, preempts a sequence (frees its blocks and recomputes
#   it later, or swaps them to host memory).
# - **Gather, then attend.** Keys and values are copied out of the pool through the table into a padded
#   tensor each step; PagedAttention's kernel reads the blocks in place, and CUDA graphs remove the
#   Python cost of each step.
# - **Exact-prefix matching, freed at once.** A block is forgotten when its last holder leaves; vLLM and
#   SGLang keep unused cached blocks and evict the least recently used when memory is needed.
#
# The load test (`benchmarks/bench_serving.py`: the `openai` client with 1 to 64 concurrent streams
# against the server on 127.0.0.1, and against the same server limited to one sequence at a time, as it
# ran before this chapter) is stored with its machine named. Read it for three things: total tokens per
# second as the streams grow (one at a time stays flat, batching grows); the time to the first token (one
# at a time, a request waits for every request ahead of it); and the tokens per second of the server's
# own CPU time, steadier than wall-clock figures on a machine that other work shares. On a 2-core CPU the
# HTTP work and the client take the same cores as the model, so the gain is smaller than the engine's
# alone (section 1's measurement).

# %%
# NBVAL_IGNORE_OUTPUT
from pathlib import Path

stored = Path("../benchmarks/results/serving.md")
print(stored.read_text() if stored.exists() else "no stored run yet: python benchmarks/bench_serving.py")

# %% [markdown]
# ## Quick check

# %%
from transformer_course.quiz import Question, quiz

quiz([
    Question("A static batch of 8 requests: one answer is 30 tokens long, the others 3. What do the other seven "
             "rows do after their third token?",
             ["They leave and new requests take their places", "They keep computing padding until the 30th step",
              "They stop, and the step gets cheaper"],
             answer=1, explain="A static batch ends together: finished rows keep their slots until the longest is done."),
    Question("A block table holds blocks [5, 2] with block size 4. Where is position 6?",
             ["Slot 6", "Slot 26", "Slot 10"],
             answer=2, explain="Position 6 is in the table's second block (6 // 4 = 1), block 2, at offset 2: 2·4 + 2."),
    Question("Why is the last token of a prompt never taken from the prefix cache?",
             ["Its logits choose the first new token, so it must be computed", "It is never in a full block",
              "Its key would be too long"],
             answer=0, explain="Reusing every position would leave nothing to compute, and no logits to sample from."),
    Question("Two sequences share a prefix block. The first finishes. What happens to the block?",
             ["It is freed", "It loses one holder and stays, the second still reads it", "It is copied"],
             answer=1, explain="Its reference count goes from 2 to 1; it is freed (and forgotten) when the second leaves."),
])

# %% [markdown]
# ## Summary
#
# - At batch 1 a decode step reads every weight for one token; a batch reuses each read for B tokens, so
#   tokens per second grow almost with B until the arithmetic catches up (you predicted it).
# - **Static batching** pads every row to the longest prompt and the longest answer: over half the work
#   was padding on eight chat-like requests. **Continuous batching** rebuilds the batch between two
#   steps: finished sequences leave, waiting ones join.
# - A **paged KV cache** hands out fixed-size blocks as sequences grow; a **block table** per sequence
#   maps each position to a slot of the block that holds it (you wrote the bookkeeping and fixed the reader);
#   attention gathers through it and gives the plain cache's tokens.
# - A **prefix cache** finds full blocks by every token up to their end (you wrote the lookup), shares them
#   by reference count and forgets them when the last holder leaves; sharing a system prompt cuts the
#   blocks needed (you counted by how much).
# - Every output was checked against decoding each request alone: greedy and sampled (per-request seeds),
#   paged and plain, prefix-cached and not.
#
# Exported to `transformer_course/paged_cache.py`: `CacheFull`, `BlockPool`, `BlockTable`, `append_slots`,
# `free_table`, `PagedKVCache`, `table_slots`, `paged_forward`, `match_prefix`, `PrefixCache`; and to
# `transformer_course/batching.py`: `flops_per_byte`, `static_batch_slots`, `Request`, `Sequence`, `Engine`.
