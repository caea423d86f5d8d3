"""Issue 40: a tokenizer file that asks for a huge token or nests deeply is refused with a ValueError that
names the file and the limit (was: a raw MemoryError after asking for ~32 GB, a raw RecursionError)."""

import json

import pytest

from transformer_course import BPETokenizer
from transformer_course.arguments import json_depth, read_json
from transformer_course.presplit import GPT4_SPLIT_PATTERN
from transformer_course.tokenization import MAX_FILE_DEPTH, MAX_TOKEN_BYTES, MAX_VOCAB_BYTES, tokenizer_from_dict


def doubling_merges(n: int) -> list[list]:
    """Merge k joins token 255 + k with itself (k = 0: byte 'a' with itself): token k has 2 ** (k + 1) bytes."""
    return [[97, 97, 256, "aa"]] + [[255 + k, 255 + k, 256 + k, "?"] for k in range(1, n)]


def saved(path, merges) -> str:
    d = {"type": "bpe", "format": "transformer-course-bpe", "version": 1, "name": "bomb", "pattern": GPT4_SPLIT_PATTERN,
         "special_tokens": {}, "byte_ids": list(range(256)), "merges": merges}
    path.write_text(json.dumps(d))
    return str(path)


def test_a_merge_table_that_doubles_a_token_34_times_is_refused_by_its_lengths(tmp_path):
    path = saved(tmp_path / "bomb.json", doubling_merges(34))
    with pytest.raises(ValueError, match=rf"bomb\.json: merge .* builds a token of 131,072 bytes.*"
                                         rf"MAX_TOKEN_BYTES = {MAX_TOKEN_BYTES:,}"):
        BPETokenizer.load(path)
    ok = BPETokenizer.load(saved(tmp_path / "ok.json", doubling_merges(16)))  # 65,536 bytes: the limit itself
    assert max(map(len, ok.vocab.values())) == MAX_TOKEN_BYTES
    with pytest.raises(ValueError, match="MAX_TOKEN_BYTES"):  # the same check without a file
        tokenizer_from_dict(json.loads((tmp_path / "bomb.json").read_text()))


def test_many_long_tokens_are_refused_by_their_total(tmp_path):
    """Distinct tokens of 32 KB each: none is too long, but about 2,050 of them pass MAX_VOCAB_BYTES."""
    merges = doubling_merges(14)  # token 269 holds 2 ** 14 'a's
    others = [b for b in range(256) if b != 97]
    new = 270
    for b in others:  # U_b = 'a' * 16384 + byte b
        merges.append([269, b, new, "?"])
        new += 1
    u = {b: 270 + k for k, b in enumerate(others)}
    pairs = [(x, y) for x in others for y in others][:2_100]  # U_x + U_y: 32,770 bytes each
    merges += [[u[x], u[y], new + k, "?"] for k, (x, y) in enumerate(pairs)]
    with pytest.raises(ValueError, match=rf"many\.json: .*MAX_VOCAB_BYTES = {MAX_VOCAB_BYTES:,} in all"):
        BPETokenizer.load(saved(tmp_path / "many.json", merges))
    fewer = BPETokenizer.load(saved(tmp_path / "fewer.json", merges[:-200]))
    assert sum(map(len, fewer.vocab.values())) <= MAX_VOCAB_BYTES


@pytest.mark.parametrize("depth", [MAX_FILE_DEPTH + 1, 5_000, 200_000])
def test_deeply_nested_files_are_refused_naming_the_file_and_the_limit(tmp_path, depth):
    path = tmp_path / "deep.json"
    path.write_text('{"merges": ' + "[" * depth + "]" * depth + "}")
    with pytest.raises(ValueError, match=rf"deep\.json is not a saved BPETokenizer: its JSON nests {depth + 1} "
                                         rf"levels deep, and at most {MAX_FILE_DEPTH} are accepted"):
        BPETokenizer.load(path)


def test_read_json_names_the_file_for_every_problem(tmp_path):
    (tmp_path / "bad.json").write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ValueError, match=r"bad\.json is not a config \(not UTF-8"):
        read_json(tmp_path / "bad.json", "a config")
    (tmp_path / "cut.json").write_text('{"a": [1, 2')
    with pytest.raises(ValueError, match=r"cut\.json is not a config \(invalid JSON"):
        read_json(tmp_path / "cut.json", "a config")
    with pytest.raises(FileNotFoundError, match="missing.json"):
        read_json(tmp_path / "missing.json", "a config")
    (tmp_path / "ok.json").write_text('{"a": ["]]]\\"[[[", {"b": []}]}')
    assert read_json(tmp_path / "ok.json", "a config", max_depth=4) == {"a": ["]]]\"[[[", {"b": []}]}
    assert json_depth('{"a": ["]]]\\"[[[", {"b": []}]}') == 4 and json_depth("7") == 0


def test_a_saved_tokenizer_still_loads(tmp_path):
    tok = BPETokenizer.train("the cat sat on the mat " * 50, vocab_size=260)
    tok.save(tmp_path / "tok.json")
    assert BPETokenizer.load(tmp_path / "tok.json").merges == tok.merges
