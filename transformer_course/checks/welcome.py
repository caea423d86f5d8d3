"""Checks for chapter 00's warm-up exercise."""

from collections import Counter

from ._core import check, expect


def char_frequencies(text: str) -> dict[str, int]:
    """The reference: each character's count, most frequent first, ties in code-point order."""
    return dict(sorted(Counter(text).items(), key=lambda item: (-item[1], item[0])))


@check("0.1", "char_frequencies", reference=char_frequencies)
def check_char_frequencies(fn):
    """``fn(text) -> dict`` of character counts, most frequent first, ties alphabetical."""
    for text in ("hello world", "To be, or not to be", "", "aAbB\n\n"):
        got = fn(text)
        expect(isinstance(got, dict), f"return a dict (got {type(got).__name__})")
        want = char_frequencies(text)
        expect(set(got) == set(want), f"on {text!r} the keys should be every distinct character: {sorted(want)}")
        expect(got == want, f"on {text!r} some counts are wrong: expected {want}")
        expect(list(got) == list(want), "the counts are right but the order is not: sort most frequent first, ties "
                                        f"alphabetical (expected {list(want)}, got {list(got)})")
