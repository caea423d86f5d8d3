"""The machinery shared by every chapter's checks (hand-written)."""

from __future__ import annotations

import functools
import importlib
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

PASSED, FAILED, NOT_DONE = "passed", "failed", "not done"
_ICON = {PASSED: "✅", FAILED: "❌", NOT_DONE: "⏳"}
# one printed line per check; the grader parses exactly this
RESULT_LINE = re.compile(r"^(?P<icon>✅|❌|⏳) Exercise (?P<exercise>[\w.]+) \((?P<name>[^)]*)\): (?P<message>.*)$")
_NOT_DONE_MESSAGE = "not done yet - the chapter carries on with the package's reference implementation"


class CheckFailed(AssertionError):
    """Raised inside a check by :func:`expect` with a hint for the learner."""


@dataclass(frozen=True)
class CheckOutcome:
    exercise: str  # "3.1"
    name: str  # what the learner wrote, e.g. "causal_mask"
    status: str  # "passed" | "failed" | "not done"
    message: str  # the hint (or "passed")
    # what the rest of the chapter runs: the learner's code when it passed, else the package's reference
    # (None when the check was declared without a reference)
    use: object = field(default=None, compare=False, repr=False)

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def line(self) -> str:
        return f"{_ICON[self.status]} Exercise {self.exercise} ({self.name}): {self.message}"

    def __str__(self) -> str:
        return self.line()

    def _ipython_display_(self) -> None:
        """Already printed by the check: show nothing more when it ends a cell."""


_RESULTS: list[CheckOutcome] = []


def results() -> list[CheckOutcome]:
    """Outcomes of every check run in this Python process, in order."""
    return list(_RESULTS)


def expect(condition: object, hint: str) -> None:
    """Fail the running check with ``hint`` unless ``condition`` is true."""
    if not condition:
        raise CheckFailed(hint)


def expect_close(actual, expected, hint: str, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    """Fail with ``hint`` unless two tensors (or array-likes) have the same shape and values."""
    import torch

    actual_t = torch.as_tensor(actual)
    expected_t = torch.as_tensor(expected)
    if actual_t.shape != expected_t.shape:
        raise CheckFailed(f"expected shape {tuple(expected_t.shape)}, got {tuple(actual_t.shape)}")
    actual_t = actual_t.to(torch.float64)
    expected_t = expected_t.to(torch.float64)
    if not torch.allclose(actual_t, expected_t, atol=atol, rtol=rtol, equal_nan=False):
        worst = (actual_t - expected_t).abs().nan_to_num(float("inf")).max().item()
        raise CheckFailed(f"{hint} (largest difference {worst:.3g})")


def expect_tensor(got, shape=None, what: str = "a tensor"):
    """Fail unless the learner's ``got`` is a tensor (of ``shape``, when given); return it."""
    import torch

    expect(isinstance(got, torch.Tensor), f"return {what}, got {type(got).__name__}")
    if shape is not None:
        expect(tuple(got.shape) == tuple(shape), f"return {what} of shape {tuple(shape)}, got {tuple(got.shape)}")
    return got


def seeded_randn(*shape: int, seed: int, dtype=None):
    """A standard normal tensor of ``shape``, the same on every call with the same ``seed`` (its own generator)."""
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _resolve(reference: str):
    """``"transformer_course.attention:causal_mask"`` -> that object (imported when first needed)."""
    module, _, qualname = reference.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def check(exercise: str, name: str, reference: str | None = None) -> Callable:
    """Turn ``body(candidate, *args, **kwargs)`` into a learner-facing check.

    The body calls the learner's ``candidate`` on ordinary and edge inputs and uses :func:`expect`
    to name the likely mistake. The wrapper prints one line, records and returns the outcome:

    - ``NotImplementedError`` from the candidate (the student edition's stub) -> "not done yet";
    - :class:`CheckFailed` -> the hint;
    - any other exception -> what was raised, and where in the learner's code.

    ``reference`` (``"module:qualname"``) names the package's implementation of the same thing. With
    it, the outcome's ``use`` is what the rest of the chapter should run: the learner's candidate when
    it passed, the reference otherwise, and the printed line says which
    (``causal_mask = check_causal_mask(causal_mask).use``).
    """

    def decorate(body: Callable) -> Callable:
        @functools.wraps(body)
        def run(candidate, *args, quiet: bool = False, **kwargs) -> CheckOutcome:
            try:
                body(candidate, *args, **kwargs)
            except NotImplementedError:
                status, message = NOT_DONE, "not done yet"
            except CheckFailed as failure:
                status, message = FAILED, str(failure)
            except Exception as error:  # the learner's code crashed: say what and where
                frames = traceback.extract_tb(error.__traceback__)
                where = next((f for f in reversed(frames) if "transformer_course" not in f.filename), None)
                at = f" (line {where.lineno}: {where.line.strip()})" if where and where.line else ""
                status, message = FAILED, f"your code raised {type(error).__name__}: {error}{at}"
            else:
                status, message = PASSED, PASSED
            use = None
            if reference is not None:
                use = candidate if status == PASSED else _resolve(reference)
                short = reference.rpartition(":")[2]
                if status == PASSED:
                    message = "passed - the rest of the chapter uses yours"
                else:
                    message = f"{message} - the chapter carries on with the package's {short}"
            elif status == NOT_DONE:
                message = _NOT_DONE_MESSAGE
            outcome = CheckOutcome(exercise, name, status, message, use)
            _RESULTS.append(outcome)
            if not quiet:
                print(outcome.line())
            return outcome

        run.exercise = exercise
        run.reference = reference
        return run

    return decorate
