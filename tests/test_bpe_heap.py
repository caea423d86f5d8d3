"""Issue 40: encoding one long chunk is near-linear (apply_merges_heap), with the same ids as the chapter's
plain apply_merges and as tiktoken. The work is counted (merge-table lookups), never timed."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transformer_course import BPETokenizer, get_encoding
from transformer_course.bpe import SHORT_CHUNK, apply_merges, apply_merges_heap

LETTERS = "abcdefghijklmnopqrstuvwxyz"


class CountingMerges(dict):
    """A merge table that counts every lookup (get, [], in)."""

    lookups = 0

    def get(self, key, default=None):
        self.lookups += 1
        return super().get(key, default)

    def __getitem__(self, key):
        self.lookups += 1
        return super().__getitem__(key)

    def __contains__(self, key):
        self.lookups += 1
        return super().__contains__(key)


def tiktoken_piece(enc, data: bytes) -> list[int]:
    """tiktoken's ids for one chunk of bytes with no pre-split (its Rust encoder panics on b"")."""
    return enc._encode_single_piece(data) if data else []


@pytest.fixture(scope="module")
def cl100k():
    return BPETokenizer.from_tiktoken("cl100k_base"), get_encoding("cl100k_base")


def test_encoding_one_long_word_does_linear_work(cl100k):
    """3,000 random letters are one chunk; the plain loop looks at every pair before each merge (millions of
    lookups), the heap at most 6 per letter."""
    ours, enc = cl100k
    word = "".join(random.Random(0).choices(LETTERS, k=3_000))
    tok = BPETokenizer(ours.merges, ours.pattern, ours.special_tokens, ours.byte_ids, ours.name)
    tok.merges = counting = CountingMerges(ours.merges)
    assert tok.encode(word) == enc.encode(word)
    assert 0 < counting.lookups <= 6 * len(word), counting.lookups
    counting.lookups = 0
    assert tok.encode("hello world") == enc.encode("hello world")  # short chunks: the plain loop, few lookups
    assert counting.lookups <= 2 * SHORT_CHUNK


@pytest.mark.parametrize("n", [0, 1, 2, 3, 64, 2_000])
def test_heap_lookups_are_bounded_on_runs_of_one_letter(cl100k, n):
    """Runs of one byte create many equal-rank candidates that overlap (aaaa): still at most 6n lookups."""
    ours, enc = cl100k
    counting = CountingMerges(ours.merges)
    start = [ours.byte_ids[b] for b in b"a" * n]
    ids = apply_merges_heap(start, counting)
    assert counting.lookups <= 6 * n
    assert ids == apply_merges(start, ours.merges)
    if bytes(b"a" * n) not in ours._id_of_bytes:  # tiktoken returns a whole token at once
        assert ids == tiktoken_piece(enc, b"a" * n)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 2_500), alphabet=st.sampled_from([LETTERS, "ab", "a ", "x"]))
def test_heap_matches_tiktoken_and_the_plain_loop_on_long_words(cl100k, seed, n, alphabet):
    ours, enc = cl100k
    data = "".join(random.Random(seed).choices(alphabet, k=n)).encode()
    ids = [ours.byte_ids[b] for b in data]
    fast = apply_merges_heap(ids, ours.merges)
    assert fast == apply_merges(ids, ours.merges)
    if data not in ours._id_of_bytes:  # tiktoken returns a whole token at once
        assert fast == tiktoken_piece(enc, data)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=1_500))
def test_heap_matches_tiktoken_on_random_bytes(cl100k, data):
    ours, enc = cl100k
    ids = [ours.byte_ids[b] for b in data]
    fast = apply_merges_heap(ids, ours.merges)
    assert fast == apply_merges(ids, ours.merges)
    if data not in ours._id_of_bytes:  # tiktoken's single-piece encoder returns a whole token at once
        assert fast == tiktoken_piece(enc, data)


@pytest.fixture(scope="module")
def unsplit():
    """A tokenizer with no pre-split pattern, trained on a two-letter text: long chunks full of overlaps."""
    text = "".join(random.Random(1).choices("aab", k=20_000))
    return BPETokenizer.train(text, vocab_size=400, pattern=None)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet="ab", max_size=600))
def test_long_chunks_without_a_pattern_match_tiktoken(unsplit, text):
    assert unsplit.encode(text) == unsplit.to_tiktoken().encode(text)
    ids = list(text.encode())
    assert apply_merges_heap(ids, unsplit.merges) == apply_merges(ids, unsplit.merges)
