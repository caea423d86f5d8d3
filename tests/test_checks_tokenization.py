"""The chapter 01 checks pass the reference and reject realistic mistakes with the right hint
(tests/test_checks_all.py runs every check on a stub and on its reference)."""

import codecs
from itertools import pairwise

import pytest
from check_helpers import assert_rejected, run
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_course.bpe import (
    apply_merges,
    get_pair_counts,
    merge_pair,
    train_merges_simple,
)
from transformer_course.checks._core import FAILED, PASSED
from transformer_course.checks.tokenization import (
    _stream_decode,
    check_apply_merges,
    check_get_pair_counts,
    check_merge_pair,
    check_predict_tiny_merges,
    check_stream_decode,
    check_train_merges_simple,
)

# ---------------------------------------------------------------- 1.1 get_pair_counts


def pairs_step_two(ids, counts=None, weight=1):
    counts = {} if counts is None else counts
    for i in range(0, len(ids) - 1, 2):
        counts[(ids[i], ids[i + 1])] = counts.get((ids[i], ids[i + 1]), 0) + weight
    return counts


def pairs_wrap_around(ids, counts=None, weight=1):
    counts = {} if counts is None else counts
    if len(ids) > 1:
        for pair in zip(ids, ids[1:] + ids[:1], strict=True):
            counts[pair] = counts.get(pair, 0) + weight
    return counts


def pairs_presence_only(ids, counts=None, weight=1):
    counts = {} if counts is None else counts
    counts.update({pair: weight for pair in pairwise(ids)})
    return counts


def pairs_new_dict(ids, counts=None, weight=1):  # ignores the table it was given
    out = {}
    for pair in pairwise(ids):
        out[pair] = out.get(pair, 0) + weight
    return out


def pairs_ignores_weight(ids, counts=None, weight=1):
    counts = {} if counts is None else counts
    for pair in pairwise(ids):
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def pairs_overwrite(ids, counts=None, weight=1):  # sets instead of adding to what was there
    counts = {} if counts is None else counts
    local = {}
    for pair in pairwise(ids):
        local[pair] = local.get(pair, 0) + weight
    counts.update(local)
    return counts


def pairs_shared_default(ids, counts={}, weight=1):  # noqa: B006 - the planted mistake
    for pair in pairwise(ids):
        counts[pair] = counts.get(pair, 0) + weight
    return counts


def test_get_pair_counts_reference_passes():
    outcome = run(check_get_pair_counts, get_pair_counts)
    assert outcome.status == PASSED and outcome.use is get_pair_counts


@pytest.mark.parametrize(
    ("buggy", "hint"),
    [
        (pairs_step_two, "pairs overlap"),
        (pairs_wrap_around, "no wrap-around"),
        (pairs_presence_only, "count every occurrence"),
        (pairs_new_dict, "add into that very dict"),
        (pairs_ignores_weight, "each occurrence adds weight, not 1"),
        (pairs_overwrite, "keep the 3 already there"),
        (
            lambda ids, counts=None, weight=1: {f"{a},{b}": 1 for a, b in pairwise(ids)},
            "tuples of two ids",
        ),
        (lambda ids, counts=None, weight=1: list(pairwise(ids)), "return a dict"),
    ],
)
def test_get_pair_counts_mistakes_get_hints(buggy, hint):
    assert_rejected(check_get_pair_counts, buggy, hint)


def test_a_shared_default_dict_is_caught():
    pairs_shared_default.__defaults__[0].clear()
    outcome = run(check_get_pair_counts, pairs_shared_default)
    assert outcome.status == FAILED  # the very first call already sees pairs from nowhere
    assert outcome.use is get_pair_counts


# ---------------------------------------------------------------- 1.2 merge_pair


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


def merge_advances_by_one(ids, pair, new_id):  # "aaa" -> both overlapping pairs merged
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
    assert_rejected(check_merge_pair, buggy, hint)


# ---------------------------------------------------------------- 1.3 predict


def test_prediction_right_answer_passes():
    assert run(check_predict_tiny_merges, lambda: [258, 100, 258, 97, 99]).status == PASSED
    assert run(check_predict_tiny_merges, lambda: (258, 100, 258, 97, 99)).status == PASSED


@pytest.mark.parametrize(
    ("guess", "hint"),
    [
        ([256, 97, 98, 100, 256, 97, 98, 97, 99], "after the first merge"),
        ([256, 257, 100, 256, 257, 97, 99], "after two merges"),
        ([258, 100, 258, 99], "three merges leave 5 ids"),
        ([256, 100, 256, 97, 99], "not the right ids"),
        ("aaab d aaab a c", "list of ints"),
        (5, "list of ints"),
    ],
)
def test_wrong_predictions_get_hints(guess, hint):
    assert_rejected(check_predict_tiny_merges, lambda: guess, hint)


# ---------------------------------------------------------------- 1.4 train_merges_simple


def _words(chunks):
    return [list(c) for c in chunks], list(chunks.values())


def train_max_by_insertion(chunks, n_merges):  # ties broken by dict order, not by the smaller pair
    words, freqs = _words(chunks)
    merges = []
    for k in range(n_merges):
        counts = {}
        for ids, f in zip(words, freqs, strict=True):
            get_pair_counts(ids, counts, f)
        if not counts:
            break
        pair = max(counts, key=counts.get)
        merges.append(pair)
        words = [merge_pair(ids, pair, 256 + k) for ids in words]
    return merges


def train_unweighted(chunks, n_merges):
    words, _ = _words(chunks)
    merges = []
    for k in range(n_merges):
        counts = {}
        for ids in words:
            get_pair_counts(ids, counts)
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))
        merges.append(pair)
        words = [merge_pair(ids, pair, 256 + k) for ids in words]
    return merges


def train_joined(chunks, n_merges):  # one long sequence: pairs cross from chunk to chunk
    ids = [b for chunk, f in chunks.items() for _ in range(f) for b in chunk]
    merges = []
    for k in range(n_merges):
        counts = get_pair_counts(ids)
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))
        merges.append(pair)
        ids = merge_pair(ids, pair, 256 + k)
    return merges


def train_never_merges(chunks, n_merges):  # forgets to apply the merge before recounting
    words, freqs = _words(chunks)
    merges = []
    for _ in range(n_merges):
        counts = {}
        for ids, f in zip(words, freqs, strict=True):
            get_pair_counts(ids, counts, f)
        if not counts:
            break
        merges.append(min(counts, key=lambda p: (-counts[p], p)))
    return merges


def train_id_after_append(chunks, n_merges):  # new id computed after the append: 257, 258, ...
    words, freqs = _words(chunks)
    merges = []
    while len(merges) < n_merges:
        counts = {}
        for ids, f in zip(words, freqs, strict=True):
            get_pair_counts(ids, counts, f)
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))
        merges.append(pair)
        words = [merge_pair(ids, pair, 256 + len(merges)) for ids in words]
    return merges


def train_crashes_when_out_of_pairs(chunks, n_merges):
    words, freqs = _words(chunks)
    merges = []
    for k in range(n_merges):
        counts = {}
        for ids, f in zip(words, freqs, strict=True):
            get_pair_counts(ids, counts, f)
        pair = min(counts, key=lambda p: (-counts[p], p))  # ValueError on an empty table
        merges.append(pair)
        words = [merge_pair(ids, pair, 256 + k) for ids in words]
    return merges


def test_train_reference_passes():
    outcome = run(check_train_merges_simple, train_merges_simple)
    assert outcome.status == PASSED and outcome.use is train_merges_simple


@pytest.mark.parametrize(
    ("buggy", "hint"),
    [
        (train_max_by_insertion, "ties go to the smaller pair"),
        (train_unweighted, "pass its count as the weight"),
        (train_joined, "pairs never cross"),
        (train_never_merges, "the same pair was chosen twice"),
        (train_id_after_append, "merge k makes id 256 + k"),
        (train_crashes_when_out_of_pairs, "your code raised ValueError"),
    ],
)
def test_train_mistakes_get_hints(buggy, hint):
    outcome = run(check_train_merges_simple, buggy)
    assert outcome.status == FAILED and hint in outcome.message, outcome.message
    assert outcome.use is train_merges_simple  # the chapter carries on with the package's trainer


# ---------------------------------------------------------------- 1.5 apply_merges (debug)


def apply_leftmost(ids, merges):  # the chapter's planted bug, as shown in the notebook
    ids = list(ids)
    while True:
        for i in range(len(ids) - 1):
            pair = (ids[i], ids[i + 1])
            if pair in merges:
                ids = merge_pair(ids, pair, merges[pair])
                break
        else:
            return ids


def apply_in_dict_order(ids, merges):
    ids = list(ids)
    for pair, new_id in merges.items():  # the dict's order, not the learned order
        ids = merge_pair(ids, pair, new_id)
    return ids


def apply_one_merge_only(ids, merges):
    ids = list(ids)
    if len(ids) > 1:
        pair = min(pairwise(ids), key=lambda p: merges.get(p, float("inf")))
        if pair in merges:
            ids = merge_pair(ids, pair, merges[pair])
    return ids


def apply_replay_every_merge(ids, merges):  # right ids, but one pass per merge of the whole table
    ids = list(ids)
    for pair, new_id in sorted(merges.items(), key=lambda kv: kv[1]):
        ids = merge_pair(ids, pair, new_id)
    return ids


def apply_highest_first(ids, merges):
    ids = list(ids)
    while len(ids) > 1:
        present = [p for p in pairwise(ids) if p in merges]
        if not present:
            break
        pair = max(present, key=merges.get)
        ids = merge_pair(ids, pair, merges[pair])
    return ids


def test_apply_merges_reference_passes():
    outcome = run(check_apply_merges, apply_merges)
    assert outcome.status == PASSED and outcome.use is apply_merges


@pytest.mark.parametrize(
    ("buggy", "hint"),
    [
        (apply_leftmost, "apply the pair with the LOWEST new id first"),
        (apply_in_dict_order, "apply the pair with the LOWEST new id first"),
        (apply_highest_first, "apply the pair with the LOWEST new id first"),
        (apply_one_merge_only, "keep merging until no neighbouring pair is in merges"),
        (apply_replay_every_merge, "walks through the whole merge table"),
        (lambda ids, merges: tuple(ids), "return a list of ids"),
    ],
)
def test_apply_merges_mistakes_get_hints(buggy, hint):
    assert_rejected(check_apply_merges, buggy, hint)


# ---------------------------------------------------------------- 1.6 stream_decode (extend)


def stream_each_alone(ids, vocab):
    return [vocab[i].decode("utf-8", errors="replace") for i in ids]


def stream_hold_until_decodable(
    ids, vocab
):  # waits for the whole buffer to decode, even "i" + half of "é"
    out, buffer = [], b""
    for i in ids:
        buffer += vocab[i]
        try:
            out.append(buffer.decode("utf-8"))
            buffer = b""
        except UnicodeDecodeError:
            out.append("")
    if buffer and out:
        out[-1] += buffer.decode("utf-8", errors="replace")
    return out


def stream_drops_the_tail(ids, vocab):  # never flushes an unfinished character at the end
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return [decoder.decode(vocab[i]) for i in ids]


def stream_holds_invalid_bytes(ids, vocab):  # treats any decode error as "wait for more"
    out, buffer = [], b""
    for i in ids:
        buffer += vocab[i]
        try:
            text, buffer = buffer.decode("utf-8"), b""
        except UnicodeDecodeError as e:
            text, buffer = buffer[:e.start].decode("utf-8"), buffer[e.start:]
        out.append(text)
    if buffer and out:
        out[-1] += buffer.decode("utf-8", errors="replace")
    return out


def stream_manual(ids, vocab):  # a correct hand-written version: the reference is not the only way
    out, buffer = [], b""
    for i in ids:
        buffer += vocab[i]
        text = ""
        while buffer:
            try:
                text += buffer.decode("utf-8")
                buffer = b""
            except UnicodeDecodeError as e:
                if e.reason == "unexpected end of data":
                    text += buffer[:e.start].decode("utf-8")
                    buffer = buffer[e.start:]
                    break
                text += buffer[:e.start].decode("utf-8") + "\ufffd"
                buffer = buffer[e.end:]
        out.append(text)
    if buffer and out:
        out[-1] += buffer.decode("utf-8", errors="replace")
    return out


def test_stream_decode_reference_and_a_hand_written_version_pass():
    outcome = run(check_stream_decode, _stream_decode)
    assert outcome.status == PASSED and outcome.use is _stream_decode
    assert run(check_stream_decode, stream_manual).status == PASSED


@pytest.mark.parametrize(
    ("buggy", "hint"),
    [
        (stream_each_alone, "you decoded each token on its own"),
        (stream_hold_until_decodable, "send the finished characters on at once"),
        (stream_drops_the_tail, "when the ids run out in the middle of a character"),
        (stream_holds_invalid_bytes, "becomes '\ufffd' straight away"),
        (lambda ids, vocab: "".join(stream_each_alone(ids, vocab)), "return a list of str"),
        (
            lambda ids, vocab: [b"".join(vocab[i] for i in ids).decode("utf-8", "replace")],
            "one string per id",
        ),
    ],
)
def test_stream_decode_mistakes_get_hints(buggy, hint):
    outcome = run(check_stream_decode, buggy)
    assert outcome.status == FAILED and hint in outcome.message, outcome.message
    assert outcome.use is _stream_decode


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=4), max_size=12))
def test_stream_reference_joins_to_the_one_shot_decode(tokens):
    pieces = _stream_decode(range(len(tokens)), tokens)
    assert len(pieces) == len(tokens)
    assert "".join(pieces) == b"".join(tokens).decode("utf-8", errors="replace")
