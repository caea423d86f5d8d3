"""The shared argument checks: each accepts what it should and names the argument and the fix otherwise."""

import math

import pytest

from transformer_course.arguments import choice, flag, real_number, whole_number


def test_whole_number_accepts_ints_in_range_and_refuses_the_rest():
    assert whole_number(3, "n") == 3
    assert whole_number(0, "n", low=0) == 0
    assert whole_number(None, "n", none_ok=True) is None
    for bad in (True, 1.0, "3", 0, -1, None):
        with pytest.raises(ValueError, match=r"^n must be a whole number >= 1, got"):
            whole_number(bad, "n")
    with pytest.raises(ValueError, match=r"n must be a whole number >= 1 and <= 4, got 5: use fewer"):
        whole_number(5, "n", high=4, hint="use fewer")


def test_real_number_refuses_bools_nan_inf_and_values_outside_the_interval():
    assert real_number(1, "eps", low=0, low_open=True) == 1.0
    assert isinstance(real_number(1, "eps"), float)
    assert real_number(None, "p", none_ok=True) is None
    for bad in (True, math.nan, math.inf, -math.inf, "1e-5", 0.0, -1e-5):
        with pytest.raises(ValueError, match=r"^eps must be a finite number > 0, got"):
            real_number(bad, "eps", low=0, low_open=True)
    assert real_number(1.0, "p", low=0, high=1, low_open=True) == 1.0
    with pytest.raises(ValueError, match=r"p must be a finite number >= 0 and < 1, got 1"):
        real_number(1, "p", low=0, high=1, high_open=True)


def test_flag_takes_only_bools():
    assert flag(True, "bias") is True and flag(False, "bias") is False
    for bad in ("no", "False", 0, 1, None):
        with pytest.raises(ValueError, match=r"^bias must be True or False, got"):
            flag(bad, "bias")


def test_choice_names_the_options():
    assert choice("pre", "norm", ("pre", "post")) == "pre"
    with pytest.raises(ValueError, match=r"norm must be one of 'pre', 'post', got 'mid'"):
        choice("mid", "norm", ("pre", "post"))
    with pytest.raises(ValueError):
        choice(True, "x", (1, 0))
