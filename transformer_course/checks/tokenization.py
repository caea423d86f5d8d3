"""Checks for chapter 01's exercises (tokenization), against ``transformer_course.bpe`` or, for the extend exercise,
``_stream_decode`` here. Hand-written; how checks report: ``transformer_course.checks``."""

import codecs
import random
from collections import Counter

from ..bpe import apply_merges, get_pair_counts, merge_pair, train_merges, train_merges_simple
from ._core import check, expect, expect_unchanged, name_mistake

__all__ = ["check_apply_merges", "check_get_pair_counts", "check_merge_pair",
           "check_predict_tiny_merges", "check_stream_decode", "check_train_merges_simple"]

# ---------------------------------------------------------------- 1.1 get_pair_counts
@check("1.1", "get_pair_counts", reference=get_pair_counts)
def check_get_pair_counts(fn):
    """``fn(ids, counts=None, weight=1) -> {(a, b): count}`` over adjacent, overlapping pairs."""
    for ids in ([], [7]):
        got = fn(list(ids))
        expect(isinstance(got, dict), f"return a dict from pair to count, got {type(got).__name__}")
        expect(dict(got) == {}, f"{ids} has no neighbouring pairs, so the result should be empty, got {dict(got)}")
    got = dict(fn([1, 2, 3]))
    expect(all(isinstance(k, tuple) and len(k) == 2 for k in got),
           "the keys should be pairs (tuples of two ids), e.g. (1, 2)")
    expect((3, 1) not in got, "the last id has no right neighbour: do not pair it with the first one (no wrap-around)")
    expect((2, 3) in got, "[1, 2, 3] holds (1, 2) and (2, 3): pairs overlap, so pair every "
                          "position with the next (step by 1, not 2)")
    expect(got == {(1, 2): 1, (2, 3): 1}, f"[1, 2, 3] should give {{(1, 2): 1, (2, 3): 1}}, got {got}")
    got = dict(fn([1, 1, 1]))
    expect(got.get((1, 1)) == 2, "[1, 1, 1] holds (1, 1) twice, at positions 0 and 1: count every "
                                 f"occurrence, got {got}")
    ids = list(b"aaabdaaabac")
    got, want = dict(fn(list(ids))), get_pair_counts(ids)
    expect(got.keys() == want.keys(), "wrong set of pairs for 'aaabdaaabac': missing "
           f"{sorted(want.keys() - got.keys())}, extra {sorted(got.keys() - want.keys())}")
    expect(got[(97, 97)] != 1, "count every occurrence: (97, 97) occurs 4 times in 'aaabdaaabac', not just once")
    expect(got == want, f"wrong counts for 'aaabdaaabac': expected {want}, got {got}")
    # the two extras training needs: add into a given table, with a weight per occurrence
    table = {(1, 2): 3, (8, 9): 1}
    got = fn([1, 2], table, weight=5)
    expect(got is table, "when a counts dict is passed in, add into that very dict and return it "
                         "(do not start a new one)")
    expect(table.get((1, 2)) != 5, "[1, 2] added into {(1, 2): 3} should keep the 3 already there and add to it")
    expect(table.get((1, 2)) != 4, "each occurrence adds weight, not 1: [1, 2] with weight=5 adds 5")
    expect(table == {(1, 2): 8, (8, 9): 1}, "[1, 2] added into {(1, 2): 3, (8, 9): 1} with "
           f"weight=5 should give {{(1, 2): 8, (8, 9): 1}}, got {table}")
    got = dict(fn([4, 4, 4, 5], None, 3))
    expect(got == {(4, 4): 6, (4, 5): 3}, f"[4, 4, 4, 5] with weight=3 should give {{(4, 4): 6, (4, 5): 3}}, got {got}")
    fresh = fn([1, 2])
    expect(fresh == {(1, 2): 1}, "without a counts dict, start from an empty one each call: "
           f"[1, 2] gave {fresh} (a default argument `counts={{}}` is shared between calls)")


# ---------------------------------------------------------------- 1.2 merge_pair
@check("1.2", "merge_pair", reference=merge_pair)
def check_merge_pair(fn):
    """``fn(ids, pair, new_id) -> list`` replacing each left-to-right occurrence, input unchanged."""
    ids = [5, 6, 7, 5, 6]
    got = fn(ids, (5, 6), 99)
    expect_unchanged(ids, [5, 6, 7, 5, 6], "do not change the input list: build and return a new one")
    expect(isinstance(got, list), f"return a list of ids, got {type(got).__name__}")
    expect(got == [99, 7, 99], name_mistake(got, [
        ("only the first occurrence was replaced: keep scanning to the end of the list",
         [99, 7, 5, 6]),
        ("[5, 6, 7, 5, 6] ends with the pair, and it must be merged too: check the loop's last positions", [99, 7]),
    ]) or f"[5, 6, 7, 5, 6] with (5, 6) -> 99 should give [99, 7, 99], got {got}")
    got = fn([1, 2, 3], (2, 3), 50)
    expect(got == [1, 50], f"[1, 2, 3] with (2, 3) -> 50 should give [1, 50], got {got}")
    got = fn([3, 4, 9], (4, 5), 50)
    expect(got == [3, 4, 9], f"a list without the pair must come back unchanged, got {got}: remember the last id too")
    one_step = "after a merge, skip both ids of the pair (advance by 2), not just one"
    got = fn([1, 2, 1, 2], (1, 2), 9)
    expect(got == [9, 9], name_mistake(got, [(one_step, [9, 2, 9, 2]), (one_step, [9, 9, 2])])
           or f"[1, 2, 1, 2] with (1, 2) -> 9 should give [9, 9], got {got}")
    got = fn([1, 1, 1], (1, 1), 9)
    expect(got == [9, 1], name_mistake(got, [
        ("[1, 1, 1] has room for one (1, 1) only: after merging positions 0 and 1, the last 1 stays alone", [9, 9]),
    ]) or f"[1, 1, 1] with (1, 1) -> 9 should give [9, 1], got {got}")
    for ids, pair in (([], (1, 2)), ([4], (4, 4)), (list(b"mississippi"), (115, 115)), ([1, 1, 1, 1, 1], (1, 1))):
        expect(fn(list(ids), pair, 300) == merge_pair(ids, pair, 300), f"wrong result for {ids} with {pair}")


# ---------------------------------------------------------------- 1.3 predict three merges
@check("1.3", "prediction")
def check_predict_tiny_merges(fn):
    """``fn() -> list[int]``: "aaabdaaabac" after three merges."""
    tiny = list(b"aaabdaaabac")
    steps = [tiny]
    for k, pair in enumerate(train_merges(Counter([bytes(tiny)]), 3)):
        steps.append(merge_pair(steps[-1], pair, 256 + k))
    got = fn()
    expect(isinstance(got, list | tuple) and all(isinstance(i, int) for i in got),
           f"return the ids as a list of ints, e.g. [256, 97, ...], got {got!r}")
    got = list(got)
    expect(got == steps[3], name_mistake(got, [
        ("that is the sequence after the first merge; carry on for two more (recount after each)", steps[1]),
        ("that is the sequence after two merges; one more to go", steps[2]),
    ]) or (f"three merges leave {len(steps[3])} ids, you have {len(got)}: recount the pairs after "
           "each merge" if len(got) != len(steps[3]) else
           "the right length, but not the right ids: the merges make 256, 257, 258 in turn, and "
           "the third merge joins the two tokens the first two made"))


# ---------------------------------------------------------------- 1.4 the training loop
@check("1.4", "train_merges_simple", reference=train_merges_simple)
def check_train_merges_simple(fn):
    """``fn(chunks: Counter[bytes], n_merges) -> list of pairs``, merge k making id 256 + k."""

    def run(chunks, n):
        given = Counter(chunks)
        got = fn(given, n)
        expect(isinstance(got, list), f"return the list of merged pairs, got {type(got).__name__}")
        expect_unchanged(given, Counter(chunks), "do not change the chunks Counter you were given")
        return [tuple(p) for p in got]

    expect(run({b"ab": 1}, 0) == [], "n_merges=0 asks for no merges: return []")
    tiny = {b"aaabdaaabac": 1}
    got = run(tiny, 1)
    expect(len(got) == 1, f"n_merges=1 should give one merge, got {len(got)}")
    expect(got == [(97, 97)], "the first merge of 'aaabdaaabac' is its most frequent pair, "
                              f"(97, 97) (4 times), got {got}")
    got = run({b"a": 3, b"b": 2}, 4)
    expect(got == [], "pairs never cross from one chunk into the next: {b'a': 3, b'b': 2} has no "
                      f"pair at all, got {got}")
    expect(run({}, 2) == [], "no chunks: no pairs, so no merges")
    got = run({b"ab": 1, b"cd": 5}, 1)
    expect(got == [(99, 100)], "each chunk counts as often as it occurs: b'cd' occurs 5 times, "
                               f"so (99, 100) wins (pass its count as the weight), got {got}")
    got = run({b"ba": 1, b"ab": 1}, 1)
    expect(got == [(97, 98)], "(98, 97) and (97, 98) are equally frequent: ties go to the smaller "
                              f"pair, (97, 98); got {got}")
    got = run(tiny, 3)
    expect(len(got) == 3, f"n_merges=3 should give three merges, got {len(got)}")
    expect(got[1] != (97, 97), "the same pair was chosen twice: after choosing a pair, merge it "
                               "in every chunk (merge_pair) and count the merged chunks again")
    expect((257, 258) not in got and (255, 256) not in got,
           f"merge k makes id 256 + k (the first merge is 256, the second 257): got {got}")
    expect(got == [(97, 97), (97, 98), (256, 257)],
           f"'aaabdaaabac' should give [(97, 97), (97, 98), (256, 257)], got {got}")
    got = run({b"abab": 2}, 10)
    expect(got == [(97, 98), (256, 256)], "stop as soon as no chunk has a pair left (b'abab' "
                                          f"allows two merges), got {got}")
    text = "the cat sat on the mat, the rat ate the hat; that cat, that rat " * 3
    chunks = Counter(w.encode() for w in text.replace(",", " ,").replace(";", " ;").split(" ") if w)
    chunks.update([b" the", b" the", b"aaaa", b"abab"])
    want = train_merges(Counter(chunks), 25)
    got = run(chunks, 25)
    first = next((k for k, (g, w) in enumerate(zip(got, want, strict=False)) if g != w), min(len(got), len(want)))
    expect(got == want, f"25 merges on a small text differ from the package's: first difference at merge {first}")


# ---------------------------------------------------------------- 1.5 apply_merges (debug)
def _noted(name: str):
    """dict's method ``name``, noting that it walked the table."""

    def walk(self):
        self.walked = True
        return getattr(dict, name)(self)

    return walk


class _LookupOnlyMerges(dict):
    """A merge table that notes any attempt to walk through all of it (100,000 merges for cl100k)."""

    walked = False
    __iter__, keys, values, items = (_noted(name) for name in ("__iter__", "keys", "values", "items"))


@check("1.5", "apply_merges", reference=apply_merges)
def check_apply_merges(fn):
    """``fn(ids, merges: (a, b) -> new id) -> list`` applying the lowest new id first, as training did."""
    a, b, c = b"abc"
    # (b, c) was learned before (a, b); the dict lists them in the other order on purpose
    merges = {(a, b): 257, (b, c): 256, (256, 256): 258, (a, 256): 259}
    got = fn([120], dict(merges))
    expect(isinstance(got, list), f"return a list of ids, got {type(got).__name__}")
    expect(got == [120], f"a single id [120] should stay [120], got {got}")
    expect(fn([], dict(merges)) == [], "no ids should give an empty list")
    expect(fn([120, 121, 122], dict(merges)) == [120, 121, 122],
           "with no applicable merge, the ids come back unchanged")
    ids = [a, b, c]
    got = fn(ids, dict(merges))
    expect_unchanged(ids, [a, b, c], "do not change the input list: work on a copy")
    expect(got == [259], name_mistake(got, [
        ("for [97, 98, 99] you merged (97, 98) because it comes first (from the left, or first in the dict): apply the "
         "pair with the LOWEST new id first; (98, 99) -> 256 was learned before (97, 98) -> 257", [257, c]),
        ("[97, 98, 99] becomes [97, 256] after one merge, but (97, 256) -> 259 applies too: keep "
         "merging until no neighbouring pair is in merges", [a, 256]),
    ]) or f"[97, 98, 99] should give [259], got {got}")
    for data in (b"bcbc", b"abcbc", b"bcbcabab", b"cab", b"ababab"):
        want = apply_merges(list(data), merges)
        got = fn(list(data), dict(merges))
        expect(got == want, f"{list(data)} should give {want}, got {got}: repeat 'merge the "
                            "lowest-id pair present' until none applies")
    # the symptom the chapter shows: " or", with "or" (269) learned before " o" (281)
    shaped = {(111, 114): 269, (32, 111): 281, (32, 269): 389}
    got = fn([32, 111, 114], dict(shaped))
    expect(got == [389], "' or' = [32, 111, 114] with (111, 114) -> 269, (32, 111) -> 281, (32, 269) -> 389 should "
                         f"give [389], got {got}: the lowest new id goes first, wherever it sits in the chunk")
    guarded = _LookupOnlyMerges(merges)
    got = fn([a, b, c, b, c], guarded)
    expect(not guarded.walked, "your code walks through the whole merge table (sorting it, "
           "iterating over it, or copying it) for every chunk; cl100k has 100,000 merges: look up "
           "only the pairs the ids contain (merges.get(pair), pair in merges)")
    expect(got == apply_merges([a, b, c, b, c], merges), f"[97, 98, 99, 98, 99] gave {got}")


# ---------------------------------------------------------------- 1.6 stream_decode (extend)
def _stream_decode(ids, vocab) -> list[str]:
    """Reference: one str per id, the text that id completes; unfinished bytes wait, invalid ones are '�'."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pieces = [decoder.decode(vocab[i]) for i in ids]
    if pieces:
        pieces[-1] += decoder.decode(b"", final=True)
    return pieces


def _cut(data: bytes, rng: random.Random) -> list[bytes]:
    """``data`` cut into tokens of 1 to 4 bytes at random places (across characters too)."""
    tokens, i = [], 0
    while i < len(data):
        n = rng.randint(1, 4)
        tokens.append(data[i:i + n])
        i += n
    return tokens


@check("1.6", "stream_decode", reference=_stream_decode)
def check_stream_decode(fn):
    """``fn(ids, vocab: id -> bytes) -> list[str]``: one piece per id; the pieces join to the full decode."""
    wave = "👋".encode()

    def run(tokens: list[bytes]) -> list[str]:
        vocab = {300 + k: t for k, t in enumerate(tokens)}
        got = fn(list(vocab), dict(vocab))
        expect(isinstance(got, list) and all(isinstance(p, str) for p in got),
               f"return a list of str, one per id, got {type(got).__name__}")
        expect(len(got) == len(tokens), f"return one string per id ({len(tokens)} ids), got "
                                        f"{len(got)}: an id that completes nothing gives ''")
        return got

    expect(run([]) == [], "no ids should give an empty list")
    got = run([b"to", b" be"])
    expect(got == ["to", " be"], "complete text comes out at once: [b'to', b' be'] should give "
                                 f"['to', ' be'], got {got}")
    got = run([wave[:2], wave[2:]])
    expect("\ufffd" not in "".join(got), "you decoded each token on its own: keep the bytes of an "
                                         "unfinished character until the rest arrives")
    expect(got == ["", "👋"], f"'👋' in two tokens of two bytes should give ['', '👋'], got {got}")
    got = run([b"h", b"i\xc3", b"\xa9!"])
    expect(got == ["h", "i", "\u00e9!"], name_mistake(got, [
        ("b'i\\xc3' completes the 'i': send the finished characters on at once and keep back only "
         "the unfinished tail", ["h", "", "i\u00e9!"]),
    ]) or f"[b'h', b'i\\xc3', b'\\xa9!'] should give ['h', 'i', 'é!'], got {got}")
    got = run([b"a", b"\xff", b"b"])
    expect("".join(got) == "a\ufffdb", "0xff is never part of a character: it should become "
                                       f"'\ufffd' (the whole text is 'a\ufffdb'), got {got}")
    expect(got == ["a", "\ufffd", "b"], "0xff can never start a character, so it becomes '\ufffd' straight away, not "
                                        f"later: expected ['a', '\ufffd', 'b'], got {got}")
    got = run([b"ok", "é".encode()[:1]])
    expect(got == ["ok", "\ufffd"], "when the ids run out in the middle of a character, its bytes "
                                    "end the last piece as '\ufffd' (the pieces must join to what "
                                    f"decode gives): expected ['ok', '\ufffd'], got {got}")
    rng = random.Random(0)
    text = "Naïve café 👋🏽 こんにちは 🇫🇷 x²+y² ≠ ∞ — fin"
    for _ in range(6):
        tokens = _cut(text.encode(), rng)
        got = run(tokens)
        expect("".join(got) == text, f"the pieces should join to the whole text, got {''.join(got)!r}")
        want = _stream_decode(range(len(tokens)), tokens)
        expect(got == want, f"each piece should hold the characters completed by its id: expected {want}, got {got}")
    for tokens in ([b"\xe2\x82", b"A"], [b"\xff\xf0\x9f", wave[2:]], [b"\xed\xa0", b"\x80z"], [b"\x80\x80", b"\xc3"]):
        got = run(tokens)
        want = "".join(_stream_decode(range(len(tokens)), tokens))
        expect("".join(got) == want, f"{tokens} should decode to {want!r} in all (as bytes.decode('utf-8', "
                                     f"errors='replace') gives), got {''.join(got)!r}")
