"""Chapter 15's checks accept right answers and name the mistake in planted bugs
(tests/test_checks_all.py runs every check on a stub and on its reference)."""

import pytest
import torch
from check_helpers import assert_rejected, run, stub

from transformer_course.checks.serving import (
    blocks_needed,
    check_append_slots,
    check_blocks_needed,
    check_match_prefix,
    check_predict_batching,
    check_table_slots,
)
from transformer_course.paged_cache import append_slots, match_prefix, table_slots


@pytest.mark.parametrize("check_fn, reference", [
    (check_predict_batching, lambda: (4.0, "about 1x")), (check_append_slots, append_slots),
    (check_table_slots, table_slots), (check_match_prefix, match_prefix), (check_blocks_needed, blocks_needed),
])
def test_reference_passes_and_a_stub_is_not_done(check_fn, reference):
    assert run(check_fn, reference).passed
    assert run(check_fn, stub).status == "not done"


@pytest.mark.parametrize("guess, hint", [((16.0, "about 1x"), "4 bytes"), ((2.0, "about 1x"), "2 operations"),
                                         ((0.5, "about 1x"), "that is batch 1"), ((4.0, "about 8x"), "ridge"),
                                         (4.0, "two things"), ((4, "8"), '"about 1x" or')])
def test_predict_batching_names_the_slip(guess, hint):
    assert_rejected(check_predict_batching, lambda: guess, hint)


def _append_every_time(table, pool, n):  # a new block for each call, full or not
    slots = []
    for i in range(n):
        if i == 0 or table.length % pool.block_size == 0:
            table.blocks.append(pool.allocate())
        slots.append(table.blocks[-1] * pool.block_size + table.length % pool.block_size)
        table.length += 1
    return slots


def _append_unscaled(table, pool, n):  # the block id used as a slot number
    slots = []
    for _ in range(n):
        if table.length % pool.block_size == 0:
            table.blocks.append(pool.allocate())
        slots.append(table.blocks[-1] + table.length % pool.block_size)
        table.length += 1
    return slots


def _append_no_length(table, pool, n):  # slots right, length never updated
    saved = table.length
    slots = append_slots(table, pool, n)
    table.length = saved
    return slots


def _append_off_by_one(table, pool, n):  # a new block only past a full one
    slots = []
    for _ in range(n):
        offset = table.length % pool.block_size
        if not table.blocks or (offset == 0 and table.length > len(table.blocks) * pool.block_size):
            table.blocks.append(pool.allocate())
        slots.append(table.blocks[-1] * pool.block_size + offset)
        table.length += 1
    return slots


@pytest.mark.parametrize("fn, hint", [
    (_append_every_time, "only when the last one is full"), (_append_unscaled, "block * block_size + offset"),
    (_append_no_length, "table.length grows by n"), (_append_off_by_one, "needs a new block"),
])
def test_append_slots_mistakes_are_named(fn, hint):
    assert_rejected(check_append_slots, fn, hint)


@pytest.mark.parametrize("fn, hint", [
    (lambda b, n, bs: torch.tensor(b)[torch.arange(n) // bs] + torch.arange(n) % bs, "not slot numbers"),
    (lambda b, n, bs: torch.tensor(b)[torch.arange(n) % bs % len(b)] * bs + torch.arange(n) // bs,
     "not the other way round"),
    (lambda b, n, bs: torch.tensor(sorted(b))[torch.arange(n) // bs] * bs + torch.arange(n) % bs, "unsorted"),
    (lambda b, n, bs: table_slots(b, n, bs).tolist(), "LongTensor"),
])
def test_table_slots_mistakes_are_named(fn, hint):
    assert_rejected(check_table_slots, fn, hint)


def _match_whole(cached, tokens, bs):  # may cache the prompt's last token too
    return match_prefix(cached, [*tokens, -1], bs)


def _match_skipping(cached, tokens, bs):  # carries on past a miss
    return [cached[tuple(tokens[:e])] for e in range(bs, len(tokens), bs) if tuple(tokens[:e]) in cached]


def _match_own_tokens(cached, tokens, bs):  # keys compared by the block's own tokens
    by_own = {k[-bs:]: v for k, v in cached.items()}
    found = []
    for e in range(bs, len(tokens), bs):
        if tuple(tokens[e - bs:e]) not in by_own:
            break
        found.append(by_own[tuple(tokens[e - bs:e])])
    return found


@pytest.mark.parametrize("fn, hint", [(_match_whole, "leave the last token"), (_match_skipping, "stop at the first"),
                                      (_match_own_tokens, "every token from position 0"),
                                      (lambda c, t, bs: tuple(match_prefix(c, t, bs)), "return a list")])
def test_match_prefix_mistakes_are_named(fn, hint):
    assert_rejected(check_match_prefix, fn, hint)


def _floor(prompts, bs):
    return sum(len(p) // bs for p in prompts), blocks_needed(prompts, bs)[1]


def _share_by_content(prompts, bs):
    own = {tuple(p[e - bs:e]) for p in prompts for e in range(bs, len(p) + 1, bs)}
    return blocks_needed(prompts, bs)[0], len(own) + sum(1 for p in prompts if len(p) % bs)


def _share_partial(prompts, bs):
    keys = {tuple(p[:e]) for p in prompts for e in range(bs, len(p) + bs, bs)}
    return blocks_needed(prompts, bs)[0], len(keys)


@pytest.mark.parametrize("fn, hint", [(_floor, "round the blocks"), (_share_by_content, "everything before them"),
                                      (_share_partial, "never shared"), (lambda ps, bs: 3, "two numbers")])
def testblocks_needed_mistakes_are_named(fn, hint):
    assert_rejected(check_blocks_needed, fn, hint)
