"""The chapter 01 checks pass the reference, reject realistic mistakes with the right hint, and
report a stub as "not done"."""

from itertools import pairwise

import pytest

from transformer_course.checks._core import FAILED, NOT_DONE, PASSED
from transformer_course.checks.tokenization import (
    check_count_pairs,
    check_decode_bytes,
    check_encode_chunk,
    check_merge_pair,
)
from transformer_course.tokenization import get_pair_counts, merge_pair


def run(check, fn):
    return check(fn, quiet=True)


def stub(*args):
    raise NotImplementedError("Exercise: ...")


@pytest.mark.parametrize("check", [check_decode_bytes, check_count_pairs, check_merge_pair, check_encode_chunk])
def test_stub_is_not_done(check):
    assert run(check, stub).status == NOT_DONE


# ---------------------------------------------------------------- 1.1 decode


def decode_reference(ids, vocab):
    return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")


def test_decode_reference_passes():
    assert run(check_decode_bytes, decode_reference).status == PASSED


@pytest.mark.parametrize(
    ("buggy", "hint"),
    [
        (lambda ids, vocab: "".join(vocab[i].decode("utf-8", errors="replace") for i in ids), "join the bytes of all ids first"),
        (lambda ids, vocab: b"".join(vocab[i] for i in ids).decode("utf-8"), "pass errors='replace'"),
        (lambda ids, vocab: b"".join(vocab[i] for i in ids).decode("latin-1"), "decode the joined bytes as UTF-8"),
        (lambda ids, vocab: b"".join(vocab[i] for i in ids), "return a str"),
        (lambda ids, vocab: "".join(chr(i) for i in ids), "look up each id's bytes in vocab"),
    ],
)
def test_decode_mistakes_get_hints(buggy, hint):
    outcome = run(check_decode_bytes, buggy)
    assert outcome.status == FAILED and hint in outcome.message


# ---------------------------------------------------------------- 1.2 pair counts


def pairs_step_two(ids):
    counts = {}
    for i in range(0, len(ids) - 1, 2):
        counts[(ids[i], ids[i + 1])] = counts.get((ids[i], ids[i + 1]), 0) + 1
    return counts


def pairs_wrap_around(ids):
    counts = {}
    for pair in zip(ids, ids[1:] + ids[:1], strict=True):
        counts[pair] = counts.get(pair, 0) + 1
    return counts if len(ids) > 1 else {}


def pairs_presence_only(ids):
    return {pair: 1 for pair in pairwise(ids)}


def test_pair_counts_reference_passes():
    assert run(check_count_pairs, lambda ids: get_pair_counts(ids)).status == PASSED


@pytest.mark.parametrize(
    ("buggy", "hint"),
    [
        (pairs_step_two, "pairs overlap"),
        (pairs_wrap_around, "no wrap-around"),
        (pairs_presence_only, "count every occurrence"),
        (lambda ids: {f"{a},{b}": 1 for a, b in pairwise(ids)}, "tuples of two ids"),
        (lambda ids: list(pairwise(ids)), "return a dict"),
    ],
)
def test_pair_count_mistakes_get_hints(buggy, hint):
    outcome = run(check_count_pairs, buggy)
    assert outcome.status == FAILED and hint in outcome.message


# ---------------------------------------------------------------- 1.3 merge


def merge_first_only(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            return [*ids[:i], new_id, *ids[i + 2:]]
    return list(ids)


def merge_forgets_last(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_in_place(ids, pair, new_id):
    i = 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == pair:
            ids[i : i + 2] = [new_id]
        i += 1
    return ids


def merge_advances_by_one(ids, pair, new_id):
    out = []
    for i in range(len(ids)):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
        elif not (i > 0 and (ids[i - 1], ids[i]) == pair and out and out[-1] == new_id):
            out.append(ids[i])
    return out


def test_merge_reference_passes():
    assert run(check_merge_pair, merge_pair).status == PASSED


@pytest.mark.parametrize(
    ("buggy", "hint"),
    [
        (merge_first_only, "only the first occurrence was replaced"),
        (merge_forgets_last, "remember the last id too"),
        (merge_in_place, "do not change the input list"),
        (merge_advances_by_one, "[1, 1, 1] has room for one (1, 1) only"),
    ],
)
def test_merge_mistakes_get_hints(buggy, hint):
    outcome = run(check_merge_pair, buggy)
    assert outcome.status == FAILED and hint in outcome.message


# ---------------------------------------------------------------- 1.4 encode a chunk


def encode_reference(data, merges):
    ids = list(data)
    while len(ids) > 1:
        pair = min(pairwise(ids), key=lambda p: merges.get(p, float("inf")))
        if pair not in merges:
            break
        ids = merge_pair(ids, pair, merges[pair])
    return ids


def encode_in_dict_order(data, merges):
    ids = list(data)
    for pair, new_id in merges.items():  # the dict's order, not the learned order
        ids = merge_pair(ids, pair, new_id)
    return ids


def encode_left_to_right(data, merges):
    ids = list(data)
    merged = True
    while merged:
        merged = False
        for i in range(len(ids) - 1):
            if (ids[i], ids[i + 1]) in merges:
                ids = [*ids[:i], merges[(ids[i], ids[i + 1])], *ids[i + 2:]]
                merged = True
                break
    return ids


def encode_one_merge_only(data, merges):
    ids = list(data)
    if len(ids) > 1:
        pair = min(pairwise(ids), key=lambda p: merges.get(p, float("inf")))
        if pair in merges:
            ids = merge_pair(ids, pair, merges[pair])
    return ids


def encode_sorted_single_pass(data, merges):  # correct: one pass over the merges in learned order
    ids = list(data)
    for pair, new_id in sorted(merges.items(), key=lambda kv: kv[1]):
        ids = merge_pair(ids, pair, new_id)
    return ids


def test_encode_reference_and_an_equivalent_order_pass():
    assert run(check_encode_chunk, encode_reference).status == PASSED
    assert run(check_encode_chunk, encode_sorted_single_pass).status == PASSED


@pytest.mark.parametrize(
    ("buggy", "hint"),
    [
        (encode_in_dict_order, "apply the pair with the LOWEST new id first"),
        (encode_left_to_right, "apply the pair with the LOWEST new id first"),
        (encode_one_merge_only, "keep merging until no pair is in merges"),
        (lambda data, merges: data, "return a list of ids"),
    ],
)
def test_encode_mistakes_get_hints(buggy, hint):
    outcome = run(check_encode_chunk, buggy)
    assert outcome.status == FAILED and hint in outcome.message
