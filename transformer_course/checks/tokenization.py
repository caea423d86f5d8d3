"""Checks for chapter 01's exercises (tokenization). Hand-written.

Each check runs the learner's function against ``transformer_course.tokenization`` on ordinary and
edge inputs and names the likely mistake.
"""

from __future__ import annotations

from itertools import pairwise

from ._core import check, expect


@check("1.1", "decode")
def check_decode_bytes(fn):
    """``fn(ids, vocab: id -> bytes) -> str``, joining all bytes before one UTF-8 decode."""
    vocab = {i: bytes([i]) for i in range(256)}
    vocab.update({256: b"th", 257: b"e ", 258: "é".encode()[:1], 259: "👋".encode()[:2], 260: "👋".encode()[2:]})
    got = fn([256, 257, 99, 97, 116], dict(vocab))
    expect(isinstance(got, str), f"return a str (decode the joined bytes with .decode('utf-8')), got {type(got).__name__}")
    expect(got == "the cat", f"[256, 257, 99, 97, 116] should give 'the cat', got {got!r}: look up each id's bytes in vocab")
    expect(fn([], dict(vocab)) == "", "no ids should decode to the empty string")
    try:
        wave = fn([259, 260], dict(vocab))
    except UnicodeDecodeError:
        wave = None
    expect(wave is not None and "\ufffd" not in wave,
           "the emoji's 4 bytes are split over two tokens: join the bytes of all ids first, then decode once")
    expect(wave == "👋", f"ids [259, 260] hold the 4 UTF-8 bytes of '👋', got {wave!r}: decode the joined bytes as UTF-8")
    expect(fn([195, 169], dict(vocab)) == "é", "bytes [195, 169] are 'é' in UTF-8: decode with 'utf-8', not latin-1")
    try:
        half = fn([104, 258], dict(vocab))
    except UnicodeDecodeError:
        half = None
    expect(half is not None, "a token that is half a character raised UnicodeDecodeError: pass errors='replace' to .decode")
    expect(half == "h\ufffd", f"[104, 258] ends in half of 'é' and should give 'h\ufffd' (errors='replace'), got {half!r}")


@check("1.2", "pair_counts")
def check_count_pairs(fn):
    """``fn(ids) -> {(a, b): count}`` over adjacent, overlapping pairs."""
    from transformer_course.tokenization import get_pair_counts

    for ids in ([], [7]):
        got = fn(list(ids))
        expect(isinstance(got, dict), f"return a dict from pair to count, got {type(got).__name__}")
        expect(dict(got) == {}, f"{ids} has no neighbouring pairs, so the result should be empty, got {dict(got)}")
    got = dict(fn([1, 2, 3]))
    expect(all(isinstance(k, tuple) and len(k) == 2 for k in got), "the keys should be pairs (tuples of two ids), e.g. (1, 2)")
    expect((3, 1) not in got, "the last id has no right neighbour: do not pair it with the first one (no wrap-around)")
    expect((2, 3) in got, "[1, 2, 3] holds (1, 2) and (2, 3): pairs overlap, so pair every position with the next (step by 1, not 2)")
    expect(got == {(1, 2): 1, (2, 3): 1}, f"[1, 2, 3] should give {{(1, 2): 1, (2, 3): 1}}, got {got}")
    got = dict(fn([1, 1, 1]))
    expect(got.get((1, 1)) == 2, f"[1, 1, 1] holds (1, 1) twice, at positions 0 and 1: count every occurrence, got {got}")
    ids = list(b"aaabdaaabac")
    got, want = dict(fn(list(ids))), get_pair_counts(ids)
    expect(got.keys() == want.keys(), f"wrong set of pairs for 'aaabdaaabac': missing {sorted(want.keys() - got.keys())}, extra {sorted(got.keys() - want.keys())}")
    expect(got[(97, 97)] != 1, "count every occurrence: (97, 97) occurs 4 times in 'aaabdaaabac', not just once")
    expect(got == want, f"wrong counts for 'aaabdaaabac': expected {want}, got {got}")


@check("1.3", "merge")
def check_merge_pair(fn):
    """``fn(ids, pair, new_id) -> list`` replacing each left-to-right occurrence, input unchanged."""
    from transformer_course.tokenization import merge_pair

    ids = [5, 6, 7, 5, 6]
    got = fn(ids, (5, 6), 99)
    expect(ids == [5, 6, 7, 5, 6], "do not change the input list: build and return a new one")
    expect(isinstance(got, list), f"return a list of ids, got {type(got).__name__}")
    expect(got != [99, 7, 5, 6], "only the first occurrence was replaced: keep scanning to the end of the list")
    expect(got != [99, 7], "[5, 6, 7, 5, 6] ends with the pair, and it must be merged too: check the loop's last positions")
    expect(got == [99, 7, 99], f"[5, 6, 7, 5, 6] with (5, 6) -> 99 should give [99, 7, 99], got {got}")
    got = fn([1, 2, 3], (2, 3), 50)
    expect(got == [1, 50], f"[1, 2, 3] with (2, 3) -> 50 should give [1, 50], got {got}")
    got = fn([3, 4, 9], (4, 5), 50)
    expect(got == [3, 4, 9], f"a list without the pair must come back unchanged, got {got}: remember the last id too")
    got = fn([1, 2, 1, 2], (1, 2), 9)
    expect(got != [9, 2, 9, 2] and got != [9, 9, 2], "after a merge, skip both ids of the pair (advance by 2), not just one")
    expect(got == [9, 9], f"[1, 2, 1, 2] with (1, 2) -> 9 should give [9, 9], got {got}")
    got = fn([1, 1, 1], (1, 1), 9)
    expect(got != [9, 9], "[1, 1, 1] has room for one (1, 1) only: after merging positions 0 and 1, the last 1 stays alone")
    expect(got == [9, 1], f"[1, 1, 1] with (1, 1) -> 9 should give [9, 1], got {got}")
    for ids, pair in (([], (1, 2)), ([4], (4, 4)), (list(b"mississippi"), (115, 115))):
        expect(fn(list(ids), pair, 300) == merge_pair(ids, pair, 300), f"wrong result for {ids} with {pair}")


@check("1.4", "encode_chunk")
def check_encode_chunk(fn):
    """``fn(data: bytes, merges: (a, b) -> new id) -> list`` applying the lowest new id first."""
    from transformer_course.tokenization import merge_pair

    def reference(data: bytes, merges: dict) -> list[int]:
        ids = list(data)
        while len(ids) > 1:
            pair = min(pairwise(ids), key=lambda p: merges.get(p, float("inf")))
            if pair not in merges:
                return ids
            ids = merge_pair(ids, pair, merges[pair])
        return ids

    a, b, c = b"abc"
    # (b, c) was learned before (a, b); the dict lists them in the other order on purpose
    merges = {(a, b): 257, (b, c): 256, (256, 256): 258, (a, 256): 259}
    got = fn(b"x", dict(merges))
    expect(isinstance(got, list), f"return a list of ids, got {type(got).__name__}")
    expect(got == [120], f"a single byte b'x' should give [120], got {got}")
    expect(fn(b"", dict(merges)) == [], "empty bytes should give an empty list")
    expect(fn(b"xyz", dict(merges)) == [120, 121, 122], "with no applicable merge, the ids are the byte values")
    got = fn(b"abc", dict(merges))
    expect(got != [257, c], "for b'abc' you merged (a, b) because it comes first (left to right, or first in the dict): "
           "apply the pair with the LOWEST new id first; (b, c) -> 256 was learned before (a, b) -> 257")
    expect(got != [a, 256], "b'abc' becomes [97, 256] after one merge, but (97, 256) -> 259 applies too: keep merging until no pair is in merges")
    expect(got == [259], f"b'abc' should give [259], got {got}")
    for data in (b"bcbc", b"abcbc", b"bcbcabab", b"cab"):
        want = reference(data, merges)
        got = fn(data, dict(merges))
        expect(got == want, f"{data!r} should give {want}, got {got}: repeat 'merge the lowest-id pair present' until none applies")
