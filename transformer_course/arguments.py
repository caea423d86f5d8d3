"""Argument checks shared by every module (hand-written, not exported): one wording for one mistake.

Each function returns the value it checked (a float for ``real_number``), so a constructor can write
``self.n_head = whole_number(n_head, "n_head")``. Every failure raises ``ValueError`` naming the
argument, what it must be, the value received and, where given, a hint that names the fix. ``bool`` is
never taken for a number (``True`` is an ``int`` to Python, but ``n_head=True`` is a mistake), and a
string is never taken for a flag (``bias="no"`` would otherwise count as true).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable

__all__ = ["choice", "flag", "whole_number", "real_number", "check_heads", "json_depth", "read_json"]

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*+"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _fail(name: str, must: str, value, hint: str) -> ValueError:
    return ValueError(f"{name} must be {must}, got {value!r}" + (f": {hint}" if hint else ""))


def whole_number(value, name: str, *, low: int | None = 1, high: int | None = None, none_ok: bool = False,
                 hint: str = "") -> int | None:
    """``value`` if it is an ``int`` (not a ``bool``) in ``low..high`` (either bound may be ``None``)."""
    if value is None and none_ok:
        return None
    bounds = " and ".join(b for b in (f">= {low}" if low is not None else "",
                                      f"<= {high}" if high is not None else "") if b)
    must = "a whole number" + (f" {bounds}" if bounds else "") + (" (or None)" if none_ok else "")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, must, value, hint)
    if (low is not None and value < low) or (high is not None and value > high):
        raise _fail(name, must, value, hint)
    return value


def real_number(value, name: str, *, low: float | None = None, high: float | None = None, low_open: bool = False,
                high_open: bool = False, none_ok: bool = False, hint: str = "") -> float | None:
    """``float(value)`` if it is a finite real number in the interval (``low_open``: ``low`` excluded)."""
    if value is None and none_ok:
        return None
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high}")
    must = "a finite number" + (" " + " and ".join(parts) if parts else "") + (" (or None)" if none_ok else "")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(name, must, value, hint)
    if low is not None and (value <= low if low_open else value < low):
        raise _fail(name, must, value, hint)
    if high is not None and (value >= high if high_open else value > high):
        raise _fail(name, must, value, hint)
    return float(value)


def flag(value, name: str, hint: str = "") -> bool:
    """``value`` if it is ``True`` or ``False``; strings such as ``"no"`` or ``"False"`` are refused."""
    if not isinstance(value, bool):
        raise _fail(name, "True or False", value, hint)
    return value


def choice(value, name: str, choices: Iterable, hint: str = ""):
    """``value`` if it is one of ``choices``."""
    options = tuple(choices)
    if isinstance(value, bool) or value not in options:
        raise _fail(name, "one of " + ", ".join(map(repr, options)), value, hint)
    return value


def check_heads(d_model, n_head, n_kv_head=None, prefix: str = "") -> tuple[int, int, int]:
    """(C, nh, nkv) once C = ``d_model`` splits into ``n_head`` heads and the nh query heads into groups
    of nh // nkv sharing one of ``n_kv_head`` key/value heads (None: nkv = nh). The one check of head
    sizes, for the attention layer (chapter 04) and the config (chapter 06); ``prefix`` names the owner
    (e.g. "GPTConfig.")."""
    C = whole_number(d_model, f"{prefix}d_model")
    nh = whole_number(n_head, f"{prefix}n_head")
    nkv = nh if n_kv_head is None else whole_number(n_kv_head, f"{prefix}n_kv_head")
    if C % nh:
        divisors = ", ".join(str(h) for h in range(1, C + 1) if C % h == 0)
        raise ValueError(f"d_model={C} is not divisible by n_head={nh}: every head gets d_model // n_head "
                         f"channels, so choose n_head among {divisors}, or change d_model")
    if nh % nkv:
        fits = [g for g in range(1, nh + 1) if nh % g == 0]
        raise ValueError(f"n_head={nh} is not divisible by n_kv_head={nkv}: each key/value head serves "
                         f"n_head // n_kv_head query heads; choose n_kv_head among {fits}")
    return C, nh, nkv


def json_depth(text: str) -> int:
    """How deeply the arrays and objects of JSON ``text`` nest (0: a number or a string), found without
    parsing: the brackets outside strings, counted. Exact for valid JSON."""
    depth = deepest = 0
    for c in _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)):
        depth += 1 if c in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def read_json(path, what: str, max_depth: int = 16):
    """The JSON value in the file ``path``, read as untrusted data: a ``ValueError`` that names the file
    when it is not UTF-8 or not JSON, or nests deeper than ``max_depth`` (checked before parsing: Python's
    parser would die with a RecursionError). ``what`` says what the file should be ("a saved
    BPETokenizer"). A file that does not exist raises ``FileNotFoundError``, which names it."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not {what} (not UTF-8 text: {e.reason} at byte {e.start})") from None
    depth = json_depth(text)
    if depth > max_depth:
        raise ValueError(f"{path} is not {what}: its JSON nests {depth} levels deep, and at most {max_depth} "
                         "are accepted (is this file corrupted?)")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{path} is not {what} (invalid JSON: {e})") from None
