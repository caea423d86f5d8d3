"""Checks for chapter 15's exercises (serving: batching, a paged KV cache, a prefix cache).
Hand-written.

Each check runs the learner's function on a few hand-worked cases and, when the answer differs,
names the mistake from a table of (hint, planted mistake) rows: a planted mistake is a one-line
wrong version whose output, equal to the learner's, identifies the slip. The build exercises
(15.2 ``append_slots``, 15.4 ``match_prefix``) and the debug exercise (15.3 ``table_slots``) have
the package as their reference; the extend exercise 15.5 has its reference, ``blocks_needed``, here.
"""

import torch

from .. import paged_cache as _paged
from ._core import check, expect, name_mistake


def _named(got, want, mistakes, *args):
    """The hint of the row ``(hint, wrong_fn)`` whose output on ``args`` is ``got``."""
    return name_mistake(got, [(hint, wrong(*args)) for hint, wrong in mistakes], want=want)

# ---------------------------------------------------------------- 15.1 predict


@check("15.1", "predict_batching")
def check_predict_batching(fn):
    """``fn() -> (FLOPs per byte at batch 8, "about 1x" or "about 8x")``."""
    got = fn()
    expect(isinstance(got, tuple) and len(got) == 2,
           f"return two things, (a number, a str), got {got!r}")
    intensity, ratio = got
    expect(isinstance(intensity, int | float) and not isinstance(intensity, bool),
           f"the first answer is a number, got {intensity!r}")
    expect(abs(intensity - 4.0) < 1e-9, name_mistake(intensity, [
        ("each float32 weight is 4 bytes: divide the operations by 4", 16.0),
        ("a multiply-add counts as 2 operations", 2.0),
        ("that is batch 1: at batch 8 each weight read serves 8 sequences", 0.5),
    ]) or f"{intensity} is not it: count the operations (2 per weight and sequence) and the bytes "
          "per weight")
    expect(ratio in ("about 1x", "about 8x"),
           f'the second answer is "about 1x" or "about 8x", got {ratio!r}')
    expect(ratio == "about 1x",
           "at 4 FLOP per byte the step is far below the ridge: it waits for memory (and Python), "
           "not arithmetic, so 8 rows cost about what 1 row costs")


# ---------------------------------------------------------------- 15.2 build: append_slots


def _pool(free_next: list[int], num_blocks: int = 12, block_size: int = 4) -> _paged.BlockPool:
    """A pool whose next allocations are ``free_next`` (in order); every other block is in use."""
    pool = _paged.BlockPool(num_blocks, block_size)
    pool.refs = [1] * num_blocks
    for b in free_next:
        pool.refs[b] = 0
    pool.free = list(reversed(free_next))
    return pool


APPEND_CASES = [  # (blocks, length, next free blocks, n): an empty table, the worked example,
    # nothing to add, a full last block, two new blocks
    ([], 0, [0, 1, 2], 5), ([7], 3, [2, 5], 3), ([4], 2, [0], 0), ([1], 4, [9, 3], 1),
    ([6, 2], 8, [5, 0, 1], 6),
]
APPEND_HINTS = [  # (what the learner's result shows, hint)
    (lambda got, want: not isinstance(got[0], list) or len(got[0]) != len(want[0]),
     "return a list with one slot per new position"),
    (lambda got, want: got[2] != want[2], "table.length grows by n: add one per position written"),
    (lambda got, want: len(got[1]) > len(want[1]),
     "take a new block only when the last one is full (table.length % block_size == 0)"),
    (lambda got, want: len(got[1]) < len(want[1]),
     "an empty table, or a full last block, needs a new block from pool.allocate() first"),
    (lambda got, want: got[0] == [s // 4 + s % 4 for s in want[0]],
     "a slot is block * block_size + offset: the block id alone is not a slot"),
]


@check("15.2", "append_slots", reference=_paged.append_slots)
def check_append_slots(fn):
    """``fn(table, pool, n) -> slots``, growing ``table`` and taking blocks from ``pool``."""
    for blocks, length, free_next, n in APPEND_CASES:
        results = []
        for f in (fn, _paged.append_slots):
            table, pool = _paged.BlockTable(list(blocks), length), _pool(free_next)
            slots = f(table, pool, n)
            results.append((slots, table.blocks, table.length))
        got, want = results
        if got != want:
            hint = next((h for test, h in APPEND_HINTS if test(got, want)), None)
            expect(False, hint or f"blocks {blocks}, length {length}, block_size 4, {n} new "
                                  f"positions: expected slots {want[0]} and blocks {want[1]}, got "
                                  f"{got[0]} and {got[1]}")


# ---------------------------------------------------------------- 15.3 debug: table_slots

SLOTS_MISTAKES = [  # (hint, planted mistake)
    ("block ids are not slot numbers: block b starts at slot b * block_size",
     lambda b, n, bs: torch.tensor(b)[torch.arange(n) // bs] + torch.arange(n) % bs),
    ("position p lives in block p // block_size at offset p % block_size (not the other way round)",
     lambda b, n, bs: torch.tensor(b)[torch.arange(n) % bs % len(b)] * bs + torch.arange(n) // bs),
    ("the table lists blocks in the sequence's order: index it with p // block_size, unsorted",
     lambda b, n, bs: torch.tensor(sorted(b))[torch.arange(n) // bs] * bs + torch.arange(n) % bs),
]


@check("15.3", "table_slots", reference=_paged.table_slots)
def check_table_slots(fn):
    """``fn(blocks, length, block_size) -> LongTensor [length]`` of slots."""
    for blocks, length, bs in [([0], 3, 4), ([5, 2, 9], 10, 4), ([3, 1], 8, 4), ([4], 1, 16)]:
        got, want = fn(blocks, length, bs), _paged.table_slots(blocks, length, bs)
        expect(isinstance(got, torch.Tensor) and got.dtype == torch.long
               and got.shape == want.shape, f"return a LongTensor of {length} slots, got {got!r}")
        expect(torch.equal(got, want), _named(got, want, SLOTS_MISTAKES, blocks, length, bs)
               or f"blocks {blocks}, length {length}, block_size {bs}: expected {want.tolist()}, "
                  f"got {got.tolist()}")


# ---------------------------------------------------------------- 15.4 build: match_prefix


def _cached(prompts: list[list[int]], bs: int) -> dict:
    """The prefix dictionary after ``prompts`` were computed: their full blocks, numbered."""
    found: dict = {}
    for p in prompts:
        for end in range(bs, len(p) + 1, bs):
            found.setdefault(tuple(p[:end]), len(found) + 10)
    return found


MATCH_CASES = [  # (cached prompts, the prompt looked up), block size 2
    ([[1, 2, 3, 4, 5]], [1, 2, 3, 4, 6]), ([[1, 2, 3, 4]], [1, 2, 3, 4]),
    ([[1, 2, 3, 4, 5, 6]], [1, 9, 3, 4, 5, 6, 7]), ([[7, 7, 3, 4]], [1, 2, 3, 4, 8]),
    ([], [1, 2, 3]), ([[1, 2, 3, 4, 5, 6]], [1, 2, 3]),
    ([[1, 2, 3, 4], [9, 9, 5, 6]], [1, 2, 5, 6, 7]),
    ({(1, 2, 3, 4): 11}, [1, 2, 3, 4, 5]),  # block 10 was freed: the cache has a gap
]
MATCH_MISTAKES = [  # (hint, planted mistake)
    ("leave the last token to compute: a prompt of exactly k full blocks reuses at most k - 1",
     lambda c, t, bs: _paged.match_prefix(c, [*t, -1], bs)),
    ("stop at the first block that is not cached: the blocks after it followed other tokens",
     lambda c, t, bs: [c[tuple(t[:e])] for e in range(bs, len(t), bs) if tuple(t[:e]) in c]),
    ("the key is every token from position 0 to the block's end, not the block's own tokens",
     lambda c, t, bs: [v for e in range(bs, len(t), bs) for k, v in c.items()
                       if k[-bs:] == tuple(t[e - bs:e])]),
]


@check("15.4", "match_prefix", reference=_paged.match_prefix)
def check_match_prefix(fn):
    """``fn(cached, tokens, block_size) -> [block ids]`` of the longest cached prefix."""
    for prompts, tokens in MATCH_CASES:
        cached = prompts if isinstance(prompts, dict) else _cached(prompts, 2)
        got, want = fn(dict(cached), list(tokens), 2), _paged.match_prefix(cached, tokens, 2)
        expect(isinstance(got, list), f"return a list of block ids, got {type(got).__name__}")
        expect(got == want, _named(got, want, MATCH_MISTAKES, cached, tokens, 2)
               or f"cached prompts {prompts}, block size 2, prompt {tokens}: expected blocks "
                  f"{want}, got {got}")


# ---------------------------------------------------------------- 15.5 extend: blocks_needed


def blocks_needed(prompts: list[list[int]], block_size: int) -> tuple[int, int]:
    """The reference: (blocks each alone, blocks with full blocks of equal beginnings shared)."""
    alone = sum(-(-len(p) // block_size) for p in prompts)
    return alone, len(_keys(prompts, block_size, 0)) + _partial(prompts, block_size)


def _keys(prompts, bs, last, own=False):
    """The distinct blocks of ``prompts``, each keyed by its whole prefix (``own``: by its own
    tokens); ``last`` = bs - 1 counts a partial last block as a block too."""
    ends = [(p, e) for p in prompts for e in range(bs, len(p) + 1 + last, bs)]
    return {tuple(p[e - bs if own else 0:e]) for p, e in ends}


def _partial(prompts, bs):
    return sum(1 for p in prompts if len(p) % bs)


NEEDED_MISTAKES = [  # (hint, planted mistake)
    ("a partial last block needs a block too: round the blocks of a prompt up",
     lambda ps, bs: (sum(len(p) // bs for p in ps), blocks_needed(ps, bs)[1])),
    ("a partial last block is never shared, even when two prompts end alike",
     lambda ps, bs: (blocks_needed(ps, bs)[0], len(_keys(ps, bs, bs - 1)))),
    ("blocks are shared only when everything before them is equal too, not only their own tokens",
     lambda ps, bs: (blocks_needed(ps, bs)[0],
                     len(_keys(ps, bs, 0, own=True)) + _partial(ps, bs))),
]
NEEDED_CASES = [([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6, 7]], 4), ([[5, 6, 1, 2], [7, 8, 1, 2]], 2),
                ([[1, 2, 3], [1, 2, 3]], 2), ([[1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8, 9]], 4),
                ([[3]], 4)]


@check("15.5", "blocks_needed", reference=blocks_needed)
def check_blocks_needed(fn):
    """``fn(prompts, block_size) -> (blocks alone, blocks shared)``."""
    for prompts, bs in NEEDED_CASES:
        got, want = fn([list(p) for p in prompts], bs), blocks_needed(prompts, bs)
        expect(isinstance(got, tuple) and len(got) == 2,
               f"return two numbers, (alone, shared), got {got!r}")
        expect(tuple(got) == want, _named(tuple(got), want, NEEDED_MISTAKES, prompts, bs)
               or f"prompts {prompts}, block size {bs}: expected {want}, got {got}")
