"""The paged KV cache (chapter 15) against the plain cache of chapter 04: the same logits through block
tables, for a prompt, for a batch of sequences of different lengths and with a shared prefix; the pool's
bookkeeping by hand-worked numbers."""

import pytest
import torch

from transformer_course.config import GPTConfig
from transformer_course.course_model import load_chat_model
from transformer_course.modern import build_gpt
from transformer_course.paged_cache import (
    BlockPool,
    BlockTable,
    CacheFull,
    PagedKVCache,
    PrefixCache,
    append_slots,
    free_table,
    match_prefix,
    paged_forward,
    table_slots,
)


@pytest.fixture(scope="module")
def chat_model():
    return load_chat_model().model.eval()


def _modern():
    """A Llama-style model: rotary positions, two key/value heads for four query heads, RMSNorm, SwiGLU."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=50, block_size=48, n_layer=2, n_head=4, d_model=32, positional="rope",
                    normalization="rmsnorm", mlp="swiglu", n_kv_head=2, bias=False)
    return build_gpt(cfg).eval()


def test_the_pool_counts_references_and_frees_at_the_last():
    pool = BlockPool(3, 4)
    assert [pool.allocate(), pool.allocate()] == [0, 1] and pool.used == 2
    pool.share(1)
    pool.release(1)
    assert pool.used == 2  # one holder left
    pool.release(1)
    assert pool.used == 1 and pool.allocate() == 1  # the freed block is handed out next
    pool.allocate()
    with pytest.raises(CacheFull, match="all 3 blocks"):
        pool.allocate()
    pool.release(0)
    with pytest.raises(ValueError, match="released twice"):
        pool.release(0)
    with pytest.raises(ValueError, match="only a block in use"):
        pool.share(0)


def test_append_slots_and_table_slots_by_hand():
    pool = BlockPool(10, 4)
    pool.free = [5, 2]  # next: 2, then 5
    table = BlockTable([7], 3)
    assert append_slots(table, pool, 3) == [31, 8, 9] and table == BlockTable([7, 2], 6)
    assert table_slots([7, 2], 6, 4).tolist() == [28, 29, 30, 31, 8, 9]
    pool.refs[7] = 1
    free_table(table, pool)
    assert table == BlockTable() and pool.refs[7] == pool.refs[2] == 0


def _through_table(model, cache, prompt, *, hold=0):
    """Logits after `prompt` (one sequence), its blocks handed out after `hold` positions of another sequence."""
    append_slots(BlockTable(), cache.pool, hold)
    table = BlockTable()
    slots = append_slots(table, cache.pool, len(prompt))
    return paged_forward(model, cache, torch.tensor([prompt]), [table], [slots]), table


@pytest.mark.parametrize("build", ["chat", "modern"])
def test_prompt_then_a_batch_of_different_lengths_equal_the_plain_cache(build, chat_model):
    model = chat_model if build == "chat" else _modern()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 40, (n,), generator=gen).tolist() for n in (5, 13, 9)]
    cache = PagedKVCache(model, num_blocks=40, block_size=4)
    tables, plain = [], []
    for i, p in enumerate(prompts):
        logits, table = _through_table(model, cache, p, hold=3 * i)
        want, _ = model(torch.tensor([p]), last_only=True)
        torch.testing.assert_close(logits, want[:, -1], atol=1e-5, rtol=0)
        tables.append(table)
        plain.append(p)
    for _ in range(6):  # one token per sequence per step, all in one call
        nxt = [int(t) for t in torch.randint(0, 40, (3,), generator=gen)]
        write = [append_slots(t, cache.pool, 1) for t in tables]
        got = paged_forward(model, cache, torch.tensor(nxt)[:, None], tables, write)
        for b, token in enumerate(nxt):
            plain[b] = plain[b] + [token]
            want, _ = model(torch.tensor([plain[b]]), last_only=True)
            torch.testing.assert_close(got[b], want[0, -1], atol=1e-5, rtol=0)


def test_a_shared_prefix_gives_the_logits_of_computing_it_all(chat_model):
    cache = PagedKVCache(chat_model, num_blocks=20, block_size=4)
    prefix = PrefixCache(cache.pool)
    first, second = list(range(1, 19)), list(range(1, 14)) + [30, 31, 32]
    _, t1 = _through_table(chat_model, cache, first)
    prefix.enter(first, t1)
    t2 = prefix.share(second)
    assert t2.blocks == t1.blocks[:3] and t2.length == 12 and prefix.hits == 3  # positions 0..11 shared
    slots = append_slots(t2, cache.pool, len(second) - 12)
    got = paged_forward(chat_model, cache, torch.tensor([second[12:]]), [t2], [slots])
    want, _ = chat_model(torch.tensor([second]), last_only=True)
    torch.testing.assert_close(got, want[:, -1], atol=1e-5, rtol=0)
    assert [cache.pool.refs[b] for b in t2.blocks] == [2, 2, 2, 1]
    free_table(t1, cache.pool)
    assert len(prefix.blocks) == 3  # still held by the second sequence
    free_table(t2, cache.pool)
    assert cache.pool.used == 0 and prefix.blocks == {} and prefix.keys == {}


def test_match_prefix_leaves_the_last_token_and_stops_at_a_gap():
    cached = {(1, 2): 4, (1, 2, 3, 4): 9}
    assert match_prefix(cached, [1, 2, 3, 4, 5], 2) == [4, 9]
    assert match_prefix(cached, [1, 2, 3, 4], 2) == [4]
    assert match_prefix({(1, 2, 3, 4): 9}, [1, 2, 3, 4, 5], 2) == []


def test_the_cache_is_sized_in_megabytes(chat_model):
    assert PagedKVCache.block_bytes(chat_model.cfg, 16) == 2 * 4 * 4 * 32 * 16 * 4  # 64 KiB
    assert PagedKVCache.from_megabytes(chat_model, 1, 16).pool.num_blocks == 16
    with pytest.raises(ValueError, match="holds no block"):
        PagedKVCache.from_megabytes(chat_model, 0.01, 16)
    with pytest.raises(ValueError, match="one token per sequence"):
        paged_forward(chat_model, PagedKVCache(chat_model, 4, 4), torch.zeros(2, 2, dtype=torch.long),
                      [BlockTable(), BlockTable()], [[0, 1], [2, 3]])
