"""What the tests of the exercise checks share (``tests/test_checks_*.py``): run a check quietly,
the student edition's stubs, and "rejected with this hint"."""

from __future__ import annotations

import re

from transformer_course.checks import CheckOutcome


def run(check_fn, candidate) -> CheckOutcome:
    """``check_fn(candidate)``, without the printed line."""
    return check_fn(candidate, quiet=True)


def stub(*args, **kwargs):
    """The student edition's stub of a function exercise."""
    raise NotImplementedError("Exercise: write me")


def stub_class(base: type) -> type:
    """The student edition's stub of a class exercise: ``base`` whose ``forward`` raises."""

    def forward(self, *args, **kwargs):
        raise NotImplementedError("Exercise: write forward")

    return type(f"Stub{base.__name__}", (base,), {"forward": forward})


def assert_rejected(check_fn, candidate, hint: str | re.Pattern) -> CheckOutcome:
    """``check_fn`` fails on ``candidate`` with a message that holds ``hint`` (a part of it, or a
    compiled pattern that it matches)."""
    outcome = run(check_fn, candidate)
    assert outcome.status == "failed", outcome.line()
    if isinstance(hint, re.Pattern):
        assert hint.search(outcome.message), outcome.message
    else:
        assert hint in outcome.message, outcome.message
    return outcome
