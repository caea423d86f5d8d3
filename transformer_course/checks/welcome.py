"""Checks for chapter 00's warm-up exercise."""

from collections import Counter

from . import check, expect


def _reference(text: str) -> dict[str, int]:
    return dict(sorted(Counter(text).items(), key=lambda item: (-item[1], item[0])))


@check("0.1", "char_frequencies")
def check_char_frequencies(fn):
    """``fn(text) -> dict`` of character counts, most frequent first, ties alphabetical."""
    for text in ("hello world", "To be, or not to be", "", "aAbB\n\n"):
        got = fn(text)
        expect(isinstance(got, dict), f"return a dict (got {type(got).__name__})")
        want = _reference(text)
        expect(set(got) == set(want), f"on {text!r} the keys should be every distinct character: {sorted(want)}")
        expect(got == want, f"on {text!r} some counts are wrong: expected {want}")
        expect(
            list(got) == list(want),
            f"the counts are right but the order is not: sort most frequent first, ties alphabetical "
            f"(expected {list(want)}, got {list(got)})",
        )
