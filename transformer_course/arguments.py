"""Argument checks shared by every module (hand-written, not exported): one wording for one mistake.

Each function returns the value it checked (a float for ``real_number``), so a constructor can write
``self.n_head = whole_number(n_head, "n_head")``. Every failure raises ``ValueError`` naming the
argument, what it must be, the value received and, where given, a hint that names the fix. ``bool`` is
never taken for a number (``True`` is an ``int`` to Python, but ``n_head=True`` is a mistake), and a
string is never taken for a flag (``bias="no"`` would otherwise count as true).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["choice", "flag", "whole_number", "real_number"]


def _fail(name: str, must: str, value, hint: str) -> ValueError:
    return ValueError(f"{name} must be {must}, got {value!r}" + (f": {hint}" if hint else ""))


def whole_number(value, name: str, *, low: int | None = 1, high: int | None = None, none_ok: bool = False,
                 hint: str = "") -> int | None:
    """``value`` if it is an ``int`` (not a ``bool``) in ``low..high`` (either bound may be ``None``)."""
    if value is None and none_ok:
        return None
    bounds = " and ".join(b for b in (f">= {low}" if low is not None else "", f"<= {high}" if high is not None else "") if b)
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
