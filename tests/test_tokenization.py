"""Tests for transformer_course.tokenization (chapter 01): hand-worked values, tiktoken parity,
properties (hypothesis) and bad-input messages."""

import json
import random
import tracemalloc
import warnings
from collections import Counter

import pytest
import tiktoken
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transformer_course import BPETokenizer, CharTokenizer, get_encoding, tokenization
from transformer_course.bpe import get_pair_counts, merge_pair, train_merges
from transformer_course.data import load_shakespeare
from transformer_course.presplit import (
    ENDOFTEXT,
    GPT2_SPLIT_PATTERN,
    GPT4_SPLIT_PATTERN,
    split_special,
    text_blocks,
)
from transformer_course.tokenization import SPECIAL_ID_ROOM, tokenizer_from_dict

SEED_TEXT = """
The sun dipped below the horizon, painting the sky with hues of orange and pink.
A gentle breeze rustled the leaves, creating a soothing melody.
In that peaceful moment, the world seemed to pause and breathe.
"""
STRESS = ("Naïve café, résumé: ÀÉÎÕÜ ß ø. 👋🏽 🇫🇷 👩‍👩‍👧 こんにちは世界 你好 한국어 Ελληνικά\n"
          "\ttabs\tand   spaces  \r\n\r\n  trailing   \n12345678 x²+y² ≠ ∞ 'S 'll \u200b\U0001F600 \n\n\n")
# cl100k_base ids of this sentence, as tiktoken produces them (NOTES.md; seed 003 lists 13 ids, wrongly)
TITLE = "Chapter 1: Building Rapport and Capturing"
TITLE_IDS = [26072, 220, 16, 25, 17283, 23097, 403, 323, 17013, 1711]


@pytest.fixture(scope="module")
def shakespeare():
    return load_shakespeare()


@pytest.fixture(scope="module")
def trained(shakespeare):
    return BPETokenizer.train(shakespeare[:300_000], vocab_size=600, special_tokens=[ENDOFTEXT])


@pytest.fixture(scope="module")
def cl100k_teacher():
    return BPETokenizer.from_tiktoken("cl100k_base")


# ---------------------------------------------------------------- characters


def test_char_tokenizer_seed_text_has_30_symbols():
    tok = CharTokenizer.from_text(SEED_TEXT)
    assert tok.vocab_size == 30
    assert tok.chars == sorted(set(SEED_TEXT))
    assert tok.decode(tok.encode(SEED_TEXT)) == SEED_TEXT
    assert tok.encode("\n ") == [0, 1]  # sorted by code point: newline, then space


def test_char_tokenizer_decodes_tensors_and_round_trips_dict():
    tok = CharTokenizer.from_text("hello")
    assert tok.decode(torch.tensor(tok.encode("hole"))) == "hole"
    again = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert isinstance(again, CharTokenizer) and again.chars == tok.chars


def test_char_tokenizer_bad_input():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(ValueError, match=r"2 character\(s\) not in the vocabulary: \['x', 'z'\]"):
        tok.encode("axbz")
    with pytest.raises(ValueError, match=r"unknown token id\(s\) \[3\].*0\.\.2"):
        tok.decode([0, 3])
    with pytest.raises(ValueError, match=r"unknown token id\(s\) \[-1\]"):
        tok.decode([-1])
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        tok.encode(b"abc")
    with pytest.raises(TypeError, match="must be a str, got int"):
        CharTokenizer.from_text(5)
    with pytest.raises(ValueError, match="empty text"):
        CharTokenizer.from_text("")
    with pytest.raises(TypeError, match="single int 1: wrap it"):
        tok.decode(1)
    with pytest.raises(TypeError, match="one row at a time"):
        tok.decode([[0, 1]])
    with pytest.raises(ValueError, match="not a CharTokenizer dict"):
        CharTokenizer.from_dict({"type": "bpe"})


# ---------------------------------------------------------------- the merge loop


def test_pair_counts_and_merge_by_hand():
    assert get_pair_counts([1, 1, 1]) == {(1, 1): 2}
    assert get_pair_counts([]) == {} and get_pair_counts([4]) == {}
    assert get_pair_counts([1, 2], {(1, 2): 3}, weight=5) == {(1, 2): 8}
    assert merge_pair([1, 1, 1], (1, 1), 9) == [9, 1]
    assert merge_pair([5, 6, 7, 5, 6], (5, 6), 99) == [99, 7, 99]
    assert merge_pair([], (1, 2), 9) == []


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.binary(min_size=0, max_size=12).map(lambda b: bytes(97 + x % 3 for x in b)),
                       st.integers(1, 5), max_size=8), st.integers(0, 40))
def test_incremental_trainer_equals_the_recount_on_any_chunks(chunks, n):
    # bytes of three values: overlapping runs ("aaaa"), ties and chunks of 0 or 1 byte are common
    assert train_merges(Counter(chunks), n) == train_merges(Counter(chunks), n, incremental=False)


def test_incremental_trainer_without_a_pattern_on_a_long_chunk(shakespeare):
    # the whole text one chunk: the trainer updates positions, not whole chunks, and still agrees
    text = shakespeare[:20_000]
    fast = BPETokenizer.train(text, 500, pattern=None)
    assert fast.merges == BPETokenizer.train(text, 500, pattern=None, incremental=False).merges
    assert len(fast.merges) == 244 and fast.decode(fast.encode(text)) == text


def test_train_merges_arguments():
    with pytest.raises(ValueError, match="n_merges must be a whole number >= 0, got -1"):
        train_merges(Counter({b"ab": 1}), -1)
    with pytest.raises(ValueError, match="incremental must be True or False, got 'yes'"):
        train_merges(Counter({b"ab": 1}), 1, incremental="yes")


def test_tiny_training_matches_hand_worked_merges():
    # aa -> 256 (4 times), then (97, 98) and (256, 97) tie at 2: the smaller pair wins, then (256, 257)
    tok = BPETokenizer.train("aaabdaaabac", vocab_size=259, pattern=None)
    assert tok.merges == {(97, 97): 256, (97, 98): 257, (256, 257): 258}
    assert tok.encode("aaabdaaabac") == [258, 100, 258, 97, 99]
    assert tok.decode([258, 100, 258, 97, 99]) == "aaabdaaabac"


@pytest.mark.parametrize("pattern", [GPT4_SPLIT_PATTERN, GPT2_SPLIT_PATTERN, None])
def test_incremental_and_naive_trainers_learn_the_same_merges(shakespeare, pattern):
    text = shakespeare[:30_000] if pattern else shakespeare[:3_000]
    fast = BPETokenizer.train(text, 400, pattern=pattern, incremental=True)
    slow = BPETokenizer.train(text, 400, pattern=pattern, incremental=False)
    assert fast.merges == slow.merges and len(fast.merges) == 144


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="abc", min_size=1, max_size=9), min_size=1, max_size=25))
def test_trainers_agree_and_tokens_stay_distinct_on_repetitive_text(words):
    # a three-letter alphabet makes ties and overlapping pairs ("aaa") common
    text = " ".join(words)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small texts run out of pairs
        fast = BPETokenizer.train(text, 300, pattern=None)
        slow = BPETokenizer.train(text, 300, pattern=None, incremental=False)
    assert fast.merges == slow.merges
    assert len(set(fast.vocab.values())) == len(fast.vocab)  # tiktoken's rank table needs distinct tokens
    assert fast.decode(fast.encode(text)) == text
    assert fast.to_tiktoken().encode_ordinary(text) == fast.encode_ordinary(text)


def test_merges_do_not_depend_on_the_target_size(shakespeare):
    text = shakespeare[:100_000]
    big, small = BPETokenizer.train(text, 700), BPETokenizer.train(text, 400)
    assert small.merges == {p: i for p, i in big.merges.items() if i < 400}


# ---------------------------------------------------------------- the BPETokenizer


def test_round_trip_of_unicode_and_special_tokens(trained):
    assert trained.vocab_size == 600 and trained.special_tokens == {ENDOFTEXT: 599}
    assert trained.decode(trained.encode(STRESS)) == STRESS
    ids = trained.encode("end." + ENDOFTEXT + "Begin", allowed_special="all")
    assert ids.count(599) == 1 and trained.decode(ids) == "end." + ENDOFTEXT + "Begin"
    assert 599 not in trained.encode_ordinary(ENDOFTEXT)
    assert trained.encode(ENDOFTEXT, allowed_special={ENDOFTEXT}) == [599]
    assert trained.encode("") == [] and trained.decode([]) == ""


# Characters assigned in this Python's Unicode tables (14.0 for 3.11). The split pattern's \p{L} and \p{N}
# are looked up in each engine's own tables: the `regex` package ships newer ones than tiktoken's Rust
# regex, so for a code point assigned only in a recent Unicode version (hypothesis found U+3D000, a letter
# to `regex` 2026.11, unassigned to tiktoken) the two split differently. That is a difference between
# Unicode versions, not between the algorithms, so such code points are left out here.
ASSIGNED = st.characters(exclude_categories=("Cn", "Cs"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(ASSIGNED, max_size=60))
def test_any_text_round_trips_and_matches_tiktoken(trained, text):
    ids = trained.encode_ordinary(text)
    assert trained.decode(ids) == text
    assert trained.to_tiktoken().encode_ordinary(text) == ids


def test_lone_surrogates_become_replacement_characters_as_in_tiktoken(trained, cl100k_teacher):
    enc = get_encoding("cl100k_base")
    for text in ("a\ud800b", "a\ud83d\ude00b", "\udfff"):  # lone, a valid surrogate pair, lone
        assert cl100k_teacher.encode(text) == enc.encode(text)
        assert trained.to_tiktoken().encode(text) == trained.encode(text)
    assert trained.decode(trained.encode("a\ud800b")) == "a\ufffdb"


def test_partial_characters_decode_with_replacement(trained):
    wave = trained.encode("👋")
    assert len(wave) == 4  # ASCII training: the emoji stays as its 4 bytes
    assert trained.decode(wave[:1]) == "\ufffd"
    assert trained.decode(wave) == "👋"
    with pytest.raises(ValueError, match="not valid UTF-8.*split a character.*errors='replace'"):
        trained.decode(wave[:2], errors="strict")


def test_bpe_bad_input(trained):
    with pytest.raises(ValueError, match=r"vocab_size must be a whole number >= 256, got 200: .*256 byte values"):
        BPETokenizer.train("hello", 200)
    with pytest.raises(ValueError, match=r">= 258, got 257: .*256 byte values plus 2 special token\(s\)"):
        BPETokenizer.train("hello", 257, special_tokens=["<a>", "<b>"])
    with pytest.raises(ValueError, match="vocab_size must be a whole number >= 256, got 300.0"):
        BPETokenizer.train("hello", 300.0)
    with pytest.raises(ValueError, match="special_tokens must be distinct non-empty strings"):
        BPETokenizer.train("hello", 300, special_tokens=["<a>", "<a>"])
    with pytest.raises(TypeError, match="text must be a str, got list"):
        trained.encode(["to", "be"])
    with pytest.raises(TypeError, match="text must be a str, got NoneType"):
        BPETokenizer.train(None, 300)
    with pytest.raises(ValueError, match=r"unknown token id\(s\) \[600, 5000\]"):
        trained.decode([5, 600, 5000])
    with pytest.raises(TypeError, match="one row at a time"):
        trained.decode(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="contains the special token '<\\|endoftext\\|>': pass allowed_special"):
        trained.encode("a" + ENDOFTEXT)
    with pytest.raises(ValueError, match="not special tokens of this tokenizer: \\['<x>'\\]"):
        trained.encode("a", allowed_special={"<x>"})
    with pytest.raises(TypeError, match="for one token write {'<\\|endoftext\\|>'}"):
        trained.encode("a", allowed_special=ENDOFTEXT)


def test_running_out_of_pairs_warns():
    with pytest.warns(UserWarning, match="ran out of pairs after 2 merges, so vocab_size is 258, not 300"):
        tok = BPETokenizer.train("abc", 300, pattern=None)
    assert tok.vocab_size == 258


def test_save_and_load(trained, tmp_path):
    path = tmp_path / "tok.json"
    trained.save(path)
    text = path.read_text(encoding="utf-8")
    assert text.startswith('{\n  "type": "bpe",') and '    [32, 116, 256, " t"],' in text
    assert len(text.splitlines()) == len(trained.merges) + 11  # 8 header lines, one per merge, 3 closing
    loaded = BPETokenizer.load(path)
    assert loaded.merges == trained.merges and loaded.special_tokens == trained.special_tokens
    assert loaded.encode(STRESS) == trained.encode(STRESS)
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind
    again = tokenizer_from_dict(json.loads(json.dumps(trained.to_dict())))
    assert isinstance(again, BPETokenizer) and again.merges == trained.merges
    torch.save({"tokenizer": trained.to_dict()}, tmp_path / "ckpt.pt")  # checkpoints load with weights_only
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert BPETokenizer.from_dict(state["tokenizer"]).encode(STRESS) == trained.encode(STRESS)


def test_load_bad_files(tmp_path, trained):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="is not a saved BPETokenizer \\(invalid JSON"):
        BPETokenizer.load(broken)
    with pytest.raises(ValueError, match="not a saved BPETokenizer"):
        BPETokenizer.from_dict({"type": "char", "chars": "ab"})
    with pytest.raises(ValueError, match="format version 99 is not supported"):
        BPETokenizer.from_dict({**trained.to_dict(), "version": 99})
    with pytest.raises(ValueError, match="not a tokenizer dict"):
        tokenizer_from_dict({"type": "wordpiece"})
    with pytest.raises(ValueError, match="uses an unknown id"):
        BPETokenizer({(1, 999): 256})
    with pytest.raises(ValueError, match="two ids stand for the same bytes"):  # "abc" as ab+c and as a+bc
        BPETokenizer({(97, 98): 256, (256, 99): 257, (98, 99): 258, (97, 258): 259})
    with pytest.raises(ValueError, match="special token ids must differ"):
        BPETokenizer({}, special_tokens={ENDOFTEXT: 65})


# ---------------------------------------------------------------- tiktoken


def test_cl100k_offline_reproduces_the_seed_sentence():
    enc = get_encoding("cl100k_base")
    assert enc.name == "cl100k_base" and enc.n_vocab == 100277
    assert enc.encode(TITLE) == TITLE_IDS
    assert enc.decode([220]) == " "
    assert get_encoding("cl100k_base") is enc  # cached
    assert enc._pat_str == GPT4_SPLIT_PATTERN


def test_get_encoding_errors(monkeypatch):
    with pytest.raises(ValueError, match="unknown encoding 'gpt5'"):
        get_encoding("gpt5")

    def offline(name):
        raise ConnectionError("no route to host")  # what requests raises without a network (an OSError)

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    get_encoding.cache_clear()
    try:
        with pytest.raises(RuntimeError,
                           match="downloads the 'gpt2' vocabulary on first use.*'cl100k_base', which works offline"):
            get_encoding("gpt2")
    finally:
        get_encoding.cache_clear()


def test_from_tiktoken_matches_tiktoken_on_the_whole_corpus(shakespeare, cl100k_teacher):
    enc, ours = get_encoding("cl100k_base"), cl100k_teacher
    assert ours.vocab_size == enc.n_vocab and len(ours.merges) == 100_000
    assert ours.encode(TITLE) == TITLE_IDS
    assert ours.encode_ordinary(shakespeare) == enc.encode_ordinary(shakespeare)
    text = STRESS + ENDOFTEXT + STRESS
    assert ours.encode(text, allowed_special="all") == enc.encode(text, allowed_special="all")
    assert ours.decode(enc.encode(STRESS)) == STRESS


def test_gpt2_style_stand_in_round_trips_through_tiktoken(shakespeare):
    # GPT-2's own vocabulary needs the network; a small GPT-2-style tokenizer exercises the same path
    ours = BPETokenizer.train(shakespeare[:50_000], 400, pattern=GPT2_SPLIT_PATTERN, special_tokens=[ENDOFTEXT])
    enc = ours.to_tiktoken("gpt2-standin")
    back = BPETokenizer.from_tiktoken(enc)
    assert back.merges == ours.merges and back.special_tokens == ours.special_tokens
    text = shakespeare[50_000:150_000] + ENDOFTEXT + STRESS
    assert (back.encode(text, allowed_special="all") == enc.encode(text, allowed_special="all")
            == ours.encode(text, allowed_special="all"))



@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(ASSIGNED, max_size=40) | st.text(alphabet=" \n\t\r'sdmtlvreéß0123456789!?.,👋世界ÀÉ", max_size=40))
def test_from_tiktoken_matches_tiktoken_on_any_text(cl100k_teacher, text):
    enc = get_encoding("cl100k_base")
    assert cl100k_teacher.encode_ordinary(text) == enc.encode_ordinary(text)
    assert cl100k_teacher.decode(enc.encode_ordinary(text)) == text


# ---------------------------------------------------------------- untrusted tokenizer files (issue 24, item 9)


def test_an_unknown_pattern_in_a_file_is_refused_unless_trusted(trained, tmp_path):
    hostile = {**trained.to_dict(), "pattern": r"((a|aa)+)+$"}  # "a" * 40 + "!" would backtrack ~2^40 times
    for load in (BPETokenizer.from_dict, tokenizer_from_dict):
        with pytest.raises(ValueError, match="not GPT-2's, GPT-4's or None.*trust_pattern=True"):
            load(hostile)
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(hostile))
    with pytest.raises(ValueError, match="trust_pattern=True"):
        BPETokenizer.load(path)
    own = {**trained.to_dict(), "pattern": r"\w+|\s+|[^\w\s]+"}  # a pattern of one's own, loaded knowingly
    path.write_text(json.dumps(own))
    own_tok = BPETokenizer.load(path, trust_pattern=True)
    assert own_tok.pattern == own["pattern"] and own_tok.decode(own_tok.encode("to be!")) == "to be!"
    assert BPETokenizer.from_dict(own, trust_pattern=True).pattern == own["pattern"]
    for pattern in (GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN, None):
        assert BPETokenizer.from_dict({**trained.to_dict(), "pattern": pattern}).pattern == pattern
    with pytest.raises(ValueError, match="trust_pattern must be True or False"):
        BPETokenizer.from_dict(trained.to_dict(), trust_pattern="yes")


def test_ids_are_bounded_by_the_vocabulary(trained):
    d = trained.to_dict()
    with pytest.raises(ValueError, match=r"special token id 1000000000000 is far past the vocabulary \(599 tokens\)"):
        BPETokenizer.from_dict({**d, "special_tokens": {ENDOFTEXT: 10**12}})
    last = 599 + 1 + SPECIAL_ID_ROOM - 1  # the largest id a single special token may take
    assert BPETokenizer.from_dict({**d, "special_tokens": {ENDOFTEXT: last}}).vocab_size == last + 1
    with pytest.raises(ValueError, match="far past the vocabulary"):
        BPETokenizer.from_dict({**d, "special_tokens": {ENDOFTEXT: last + 1}})
    with pytest.raises(ValueError,
                       match=r"ids of bytes and merges must be 0\.\.598 with none missing; the largest is 10"):
        BPETokenizer.from_dict({**d, "merges": d["merges"][:-1] + [[*d["merges"][-1][:2], 10**12, "x"]]})
    with pytest.raises(ValueError, match="a special token id must be a whole number >= 0, got True"):
        BPETokenizer.from_dict({**d, "special_tokens": {ENDOFTEXT: True}})
    with pytest.raises(ValueError, match="a byte id must be a whole number >= 0, got -1"):
        BPETokenizer.from_dict({**d, "byte_ids": [-1, *d["byte_ids"][1:]]})
    with pytest.raises(ValueError, match="non-empty strings of valid text"):
        BPETokenizer({}, special_tokens={"": 256})
    cl100k = BPETokenizer.from_tiktoken(get_encoding("cl100k_base"))  # its specials leave 16 ids unused
    assert cl100k.vocab_size == 100_277 and max(cl100k.merges.values()) == 100_255


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2, 2**40) | st.floats(allow_nan=False)
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
SMALL = BPETokenizer.train("to be or not to be, that is the question " * 3, 270, special_tokens=[ENDOFTEXT])


def _only_clear_errors(load, data):
    """``load(data)`` returns a tokenizer that encodes in bounded time, or raises a ValueError (nothing else)."""
    try:
        tok = load(data)
    except ValueError:
        return
    assert tok.decode(tok.encode_ordinary("a" * 40 + "!")) == "a" * 40 + "!"  # a known pattern: no runaway regex


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_any_json_value_gives_a_tokenizer_or_a_value_error(value):
    _only_clear_errors(tokenizer_from_dict, value)
    _only_clear_errors(BPETokenizer.from_dict, value)
    _only_clear_errors(CharTokenizer.from_dict, value)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(SMALL.to_dict())), JSON, st.integers(0, 20), st.data())
def test_a_mutated_file_gives_a_tokenizer_or_a_value_error(key, value, position, data):
    d = json.loads(json.dumps(SMALL.to_dict()))
    if key == "merges" and data.draw(st.booleans()):  # change one field of one merge instead of the whole list
        merge = d["merges"][position % len(d["merges"])]
        merge[data.draw(st.integers(0, 3))] = value
    elif key == "pattern" and data.draw(st.booleans()):
        d["pattern"] = data.draw(st.sampled_from([r"((a|aa)+)+$", r"(a*)*b", "[", r"\p{L}++", GPT2_SPLIT_PATTERN]))
    else:
        d[key] = value
    _only_clear_errors(tokenizer_from_dict, d)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_file_loads_or_gives_a_value_error(tmp_path_factory, content):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_bytes(content)
    _only_clear_errors(BPETokenizer.load, path)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(alphabet="abt o,!\n'é", max_size=12), min_size=1, max_size=30),
       st.sampled_from([GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN, None]), st.integers(257, 320))
def test_valid_files_round_trip(tmp_path_factory, words, pattern, vocab_size):
    text = " ".join(words)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small texts run out of pairs
        tok = BPETokenizer.train(text, vocab_size, pattern=pattern, special_tokens=[ENDOFTEXT])
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(path)
    back = BPETokenizer.load(path)
    assert (back.merges, back.special_tokens, back.pattern) == (tok.merges, tok.special_tokens, tok.pattern)
    assert back.encode(text + ENDOFTEXT, allowed_special="all") == tok.encode(text + ENDOFTEXT, allowed_special="all")


# ---------------------------------------------------------------- streaming encoding of large texts


def _stream(tok, pieces, **kwargs) -> list[int]:
    return [i for ids in tok.encode_stream(pieces, **kwargs) for i in ids]


@pytest.fixture(scope="module")
def gpt2_style(shakespeare):
    return BPETokenizer.train(shakespeare[:50_000], 400, pattern=GPT2_SPLIT_PATTERN,
                              special_tokens=[ENDOFTEXT, "<|x|>"])


# the places where a cut is delicate: contractions, runs of spaces and newlines before a word, numbers,
# special tokens (whole, and prefixes of them), characters of several bytes, surrogate pairs and lone halves
PARTS = ["to", " be", "  ", "\n", "\n\n  ", "'ll", "'", "l", "12345", "!!", " ", ENDOFTEXT, "<|endo", "<|x|>", "<|",
         "é", "👋🏽", "\t", "\r\n", "\ud83d", "\ude00", "ANTIPHOLUS"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(PARTS), max_size=60), st.lists(st.integers(0, 400), max_size=12),
       st.integers(1, 40), st.booleans())
def test_stream_equals_encoding_the_whole_text(trained, gpt2_style, monkeypatch, parts, cuts, block, gpt2):
    tok = gpt2_style if gpt2 else trained
    text = "".join(parts)
    cuts = sorted({c % (len(text) + 1) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    monkeypatch.setattr(tokenization, "_STREAM_BLOCK", block)  # tiny blocks: every boundary gets cut
    assert _stream(tok, pieces, allowed_special="all") == tok.encode(text, allowed_special="all")
    ordinary = text.replace(ENDOFTEXT, "").replace("<|x|>", "")
    assert _stream(tok, pieces=[ordinary]) == tok.encode(ordinary)


def _stream_peak(tok, path) -> tuple[int, int]:
    """(ids, tracemalloc's peak in bytes) of encode_stream over the file at ``path``, read line by line."""
    with open(path, encoding="utf-8") as f:
        tracemalloc.start()
        try:
            count = sum(len(ids) for ids in tok.encode_stream(f, allowed_special="all"))
            return count, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


def test_stream_of_a_file_in_flat_memory(trained, shakespeare, tmp_path):
    """A file three times larger than the memory the stream may use (a third of it), and a peak that does
    not grow with the file: 1 MB and 3 MB peak alike. The chunk cache is filled first (it is the
    tokenizer's, and bounded, not the stream's). The ids equal encoding the whole text at once."""
    text = (shakespeare[:200_000] + ENDOFTEXT) * 15  # 3 MB
    small, big = tmp_path / "small.txt", tmp_path / "big.txt"
    small.write_text(text[: len(text) // 3], encoding="utf-8")
    big.write_text(text, encoding="utf-8")
    whole = trained.encode(text, allowed_special="all")  # also warms the chunk cache
    (_, small_peak), (count, peak) = _stream_peak(trained, small), _stream_peak(trained, big)
    assert count == len(whole)
    assert peak < len(text) / 3, f"peak {peak:,} bytes for a {len(text):,}-character file"
    assert peak < 1.25 * small_peak, f"the peak grew with the file: {small_peak:,} -> {peak:,} bytes"
    with open(big, encoding="utf-8") as f:
        assert _stream(trained, f, allowed_special="all") == whole


def test_stream_errors(trained):
    with pytest.raises(ValueError, match="needs GPT-2's or GPT-4's pre-split pattern.*encode\\(text\\)"):
        _stream(BPETokenizer.train("abc abc", 258, pattern=None), ["abc"])
    with pytest.raises(TypeError, match="each piece must be a str .*got bytes"):
        _stream(trained, [b"to be"])
    with pytest.raises(TypeError, match="pieces must be an iterable of str"):
        _stream(trained, 5)
    with pytest.raises(ValueError, match="contains the special token '<\\|endoftext\\|>'"):
        _stream(trained, ["a <|endo", "ftext|> b"])  # a disallowed special cut in two is still found
    with pytest.raises(TypeError, match="for one token write"):
        next(trained.encode_stream(["a"], allowed_special=ENDOFTEXT))
    assert _stream(trained, []) == [] and _stream(trained, "") == []
    assert _stream(trained, "to be") == trained.encode("to be")  # one str is one piece


def test_text_blocks_keep_surrogate_pairs_whole():
    blocks = list(text_blocks(["ab\ud83d", "\ude00c"], 3))
    assert "".join(blocks) == "ab\U0001F600c" and all(len(b) <= 6 for b in blocks)
    assert split_special("x<|endoftext|>y", [ENDOFTEXT]) == ["x", ENDOFTEXT, "y"]
    rng = random.Random(0)
    text = "".join(rng.choice("ab \n") for _ in range(1000))
    cuts = sorted(rng.sample(range(1000), 40))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, 1000], strict=True)]
    blocks = list(text_blocks(pieces, 64))
    assert "".join(blocks) == text and all(len(b) < 128 for b in blocks) and all(len(b) >= 64 for b in blocks[:-1])
