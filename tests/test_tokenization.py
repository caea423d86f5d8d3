"""Tests for transformer_course.tokenization (chapter 01): hand-worked values, tiktoken parity,
properties (hypothesis) and bad-input messages."""

import json
import warnings

import pytest
import tiktoken
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transformer_course import BPETokenizer, CharTokenizer, get_encoding
from transformer_course.data import load_shakespeare
from transformer_course.tokenization import (
    ENDOFTEXT,
    GPT2_SPLIT_PATTERN,
    GPT4_SPLIT_PATTERN,
    _merge_and_diff,
    get_pair_counts,
    merge_pair,
    tokenizer_from_dict,
)

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


@given(st.lists(st.integers(0, 3), max_size=30), st.tuples(st.integers(0, 3), st.integers(0, 3)))
def test_merge_and_diff_explains_the_recount(ids, pair):
    merged, destroyed, created = _merge_and_diff(ids, pair, 9)
    assert merged == merge_pair(ids, pair, 9)
    before, after = get_pair_counts(ids), get_pair_counts(merged)
    for p in set(before) | set(after):
        assert after.get(p, 0) - before.get(p, 0) == created.count(p) - destroyed.count(p)


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
    with pytest.raises(ValueError, match=r"vocab_size=200 is too small.*256 byte values, so vocab_size >= 256"):
        BPETokenizer.train("hello", 200)
    with pytest.raises(ValueError, match=r"plus 2 special token\(s\), so vocab_size >= 258"):
        BPETokenizer.train("hello", 257, special_tokens=["<a>", "<b>"])
    with pytest.raises(TypeError, match="vocab_size must be an int, got float"):
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
        with pytest.raises(RuntimeError, match="downloads the 'gpt2' vocabulary on first use.*'cl100k_base', which works offline"):
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
    assert back.encode(text, allowed_special="all") == enc.encode(text, allowed_special="all") == ours.encode(text, allowed_special="all")



@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(ASSIGNED, max_size=40) | st.text(alphabet=" \n\t\r'sdmtlvreéß0123456789!?.,👋世界ÀÉ", max_size=40))
def test_from_tiktoken_matches_tiktoken_on_any_text(cl100k_teacher, text):
    enc = get_encoding("cl100k_base")
    assert cl100k_teacher.encode_ordinary(text) == enc.encode_ordinary(text)
    assert cl100k_teacher.decode(enc.encode_ordinary(text)) == text
