from collections import Counter

from transformer_course.checks.welcome import check_char_frequencies


def reference(text):
    return dict(sorted(Counter(text).items(), key=lambda kv: (-kv[1], kv[0])))


def unsorted(text):  # forgets to sort
    return dict(Counter(text))


def skips_spaces(text):  # counts only visible characters
    return reference(text.replace(" ", ""))


def ties_reversed(text):  # sorts by count but breaks ties the wrong way
    return dict(
        sorted(Counter(text).items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    )


def test_reference_passes():
    assert check_char_frequencies(reference, quiet=True).passed


def test_reference_is_what_the_chapter_falls_back_to():
    from transformer_course.checks.welcome import char_frequencies

    def stub(text):
        raise NotImplementedError

    assert check_char_frequencies(stub, quiet=True).use is char_frequencies
    assert check_char_frequencies(reference, quiet=True).use is reference


def test_planted_bugs_get_their_hint():
    assert "order is not" in check_char_frequencies(unsorted, quiet=True).message
    assert (
        "keys should be every distinct character"
        in check_char_frequencies(skips_spaces, quiet=True).message
    )
    assert "ties alphabetical" in check_char_frequencies(ties_reversed, quiet=True).message
    assert "return a dict" in check_char_frequencies(lambda t: list(t), quiet=True).message
    # the slip chapter 00 shows: every character counted once
    assert (
        "some counts are wrong"
        in check_char_frequencies(lambda t: dict.fromkeys(t, 1), quiet=True).message
    )
