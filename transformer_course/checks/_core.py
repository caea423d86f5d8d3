"""The machinery shared by every chapter's checks, and the words they are written in (hand-written).

A check is a body wrapped by :func:`check`. The body calls the learner's code and states what must
hold, naming the likely mistake when it does not:

- :func:`expect` (a condition, and the hint when it is false), :func:`expect_tensor` (a tensor, of a shape),
  :func:`expect_number` (a number), :func:`expect_numbers` (a list of them), :func:`expect_items` (a pair, a triple),
  :func:`expect_answer` (a predicted answer, or the known wrong answer it equals), :func:`expect_close` (the same
  values, within a tolerance), :func:`expect_match` (the same, or the known mistake or the first wrong entry named),
  :func:`expect_unchanged` (an input left as it was), :func:`expect_runs` (no crash, where a crash has a likely
  cause), :func:`expect_known_crash` (a crash whose message names its cause), :func:`expect_mask` (an attention mask,
  the first key seen or hidden wrongly named);
- :func:`planted`: a table of mistakes, each planted by a switch of a reference written to commit it;
- :func:`close`, the test behind ``expect_close``, for checks that branch on it, and
  :func:`name_mistake`: which known wrong answer the learner's output equals, and so which hint to
  give (``expect_close(..., mistakes=...)`` asks it when the values differ);
- :func:`fresh_rng` and :func:`seeded_randn`: random numbers of the check's own. The wrapper also
  forks the random state around every check, so no check moves the notebook's random numbers.
"""

import contextlib
import functools
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

PASSED, FAILED, NOT_DONE = "passed", "failed", "not done"
_ICON = {PASSED: "✅", FAILED: "❌", NOT_DONE: "⏳"}
# the one line every check prints; the student edition finds the answer key's stored verdicts with
# it (the grader does not read printed text: it reads results() through the kernel)
RESULT_LINE = re.compile(
    r"^(?P<icon>✅|❌|⏳) Exercise (?P<exercise>[\w.]+) \((?P<name>[^)]*)\): (?P<message>.*)$")
_NOT_DONE_MESSAGE = ("not done yet - the chapter carries on with the package's reference implementation")


class CheckFailed(AssertionError):
    """Raised inside a check by :func:`expect` with a hint for the learner."""


@dataclass(frozen=True)
class CheckOutcome:
    exercise: str  # "3.2"
    name: str  # what the learner wrote, e.g. "causal_mask"
    status: str  # "passed" | "failed" | "not done"
    message: str  # the hint (or "passed")
    # what the rest of the chapter runs: the learner's code when it passed, else the package's
    # reference (None when the check was declared without a reference)
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
# the grader's own record, kept only while `transformer-course grade` runs the notebook (GRADING_ENV
# set): the genuine check of each exercise (the package's where there is one, else the first
# defined) and the calls not re-run yet, as (exercise, candidate, args, kwargs)
GRADING_ENV = "TRANSFORMER_COURSE_GRADING"
_GENUINE: dict[str, Callable] = {}
_PENDING: list[tuple[str, object, tuple, dict]] = []


def results() -> list[CheckOutcome]:
    """Outcomes of every check run in this Python process, in order (the learner's view: the
    grader does not count them, see :func:`regrade`)."""
    return list(_RESULTS)


def _written_by_learner(code) -> bool:
    """False for the package's own code (its reference implementations, its checks)."""
    module = getattr(code, "__module__", None) or ""
    return not (module == "transformer_course" or module.startswith("transformer_course."))


def regrade() -> str:
    """The grader's verdicts, as JSON ``[[exercise, status], ...]``: the genuine check of every exercise checked since
    the last call, re-run quietly on the candidate it was given.

    An outcome appended to the record behind :func:`results`, a printed line, or a check that the notebook defines for
    an exercise the package already checks count for nothing; the package's own implementation handed in as the answer
    is "not done". Code that rewrites the checks or torch in memory is not stopped (docs/teaching.md says so)."""
    import json

    verdicts = []
    while _PENDING:
        exercise, candidate, args, kwargs = _PENDING.pop(0)
        genuine = _GENUINE.get(exercise)
        if genuine is None:
            continue
        mine = _written_by_learner(candidate)
        verdicts.append((exercise, genuine.verdict(candidate, args, kwargs) if mine else NOT_DONE))
    return json.dumps(verdicts)


# ---------------------------------------------------------------- the vocabulary
def expect(condition: object, hint: str) -> None:
    """Fail the running check with ``hint`` unless ``condition`` is true."""
    if not condition:
        raise CheckFailed(hint)


def _is_tensor(x) -> bool:
    torch = sys.modules.get("torch")  # no torch import for the checks that need none
    return torch is not None and isinstance(x, torch.Tensor)


def close(got, want, atol: float = 1e-5, rtol: float = 1e-5) -> bool:
    """Whether ``got`` is a tensor of ``want``'s shape, within ``atol + rtol * |want|`` of it (compared in float64)."""
    import torch

    want = torch.as_tensor(want)
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and torch.allclose(got.double(), want.double(), atol=atol, rtol=rtol))


def name_mistake(got, mistakes: Iterable, *, want=None, atol: float = 1e-5, rtol: float = 1e-5):
    """The hint of the first known mistake whose output ``got`` equals, or None.

    ``mistakes`` holds ``(hint, wrong)`` pairs: ``wrong`` is what that mistake gives (a tensor,
    compared with :func:`close`; anything else, with ``==``), or a function of no arguments that
    computes it when it is needed. With ``want`` (the right answer), a mistake that gives the
    right answer too on this input cannot be told apart from it and is skipped.
    """

    def same(a, b) -> bool:
        return close(a, b, atol, rtol) if _is_tensor(b) else not _is_tensor(a) and a == b

    for hint, wrong in mistakes:
        wrong = wrong() if callable(wrong) else wrong
        if same(got, wrong) and (want is None or not same(wrong, want)):
            return hint
    return None


def planted(mistakes: Iterable, reference: Callable, *args, **kwargs) -> list:
    """A table of planted mistakes, rows of ``(hint, switches)``, as the ``(hint, wrong)`` pairs of
    :func:`name_mistake`: ``wrong`` computes ``reference(*args, **kwargs, **switches)`` (a reference written with one
    keyword switch per mistake, that one switched on) when it is needed."""
    return [(hint, functools.partial(reference, *args, **kwargs, **switches)) for hint, switches in mistakes]


def expect_close(actual, expected, hint: str, atol: float = 1e-5, rtol: float = 1e-5, mistakes: Iterable = ()) -> None:
    """Fail unless two tensors (or array-likes) have the same shape and values.

    When the values differ, the hint is that of the known mistake ``actual`` equals (``mistakes``,
    as for :func:`name_mistake` with ``want=expected``), else ``hint`` and the largest difference.
    """
    import torch

    actual_t = torch.as_tensor(actual)
    expected_t = torch.as_tensor(expected)
    if actual_t.shape != expected_t.shape:
        raise CheckFailed(f"expected shape {tuple(expected_t.shape)}, got {tuple(actual_t.shape)}")
    actual_t = actual_t.to(torch.float64)
    expected_t = expected_t.to(torch.float64)
    if not torch.allclose(actual_t, expected_t, atol=atol, rtol=rtol, equal_nan=False):
        named = name_mistake(actual_t, mistakes, want=expected_t, atol=atol, rtol=rtol)
        worst = (actual_t - expected_t).abs().nan_to_num(float("inf")).max().item()
        raise CheckFailed(named or f"{hint} (largest difference {worst:.3g})")


def expect_number(got, what: str = "a number", kind=(int, float)):
    """Fail unless the learner's ``got`` is a number of ``kind`` (never a bool); return it."""
    expect(isinstance(got, kind) and not isinstance(got, bool), f"return {what}, got {got!r}")
    return got


def expect_numbers(answer, n: int, what: str, as_list: str | None = None, count: str | None = None) -> list[float]:
    """The learner's prediction of ``n`` numbers (a tuple, list or tensor) as floats; fails with ``as_list`` (not a
    sequence), ``count`` (not ``n`` of them) or ``what`` (not numbers), each followed by what it got."""
    if _is_tensor(answer):
        answer = answer.flatten().tolist()
    expect(isinstance(answer, (list, tuple)), f"{as_list or what}, got {type(answer).__name__}")
    expect(len(answer) == n, f"{count or what}, got {len(answer)}")
    try:
        return [float(x) for x in answer]
    except (TypeError, ValueError):
        raise CheckFailed(f"{what}, got {answer!r}") from None


def expect_answer(got, want, mistakes: Iterable = (), otherwise: str = "", atol: float | None = None) -> None:
    """Fail unless the learner's answer ``got`` is ``want`` (a number within ``atol``, when given), with the hint of the
    known mistake it equals (``mistakes``, as for :func:`name_mistake`; numbers within ``atol``), else ``otherwise``."""
    if atol is None:
        right = got == want
    else:
        import torch

        right = abs(float(got) - float(want)) <= atol
        got = torch.as_tensor(got, dtype=torch.float64)
        mistakes = [(hint, torch.as_tensor(wrong, dtype=torch.float64)) for hint, wrong in mistakes]
    if not right:
        raise CheckFailed(name_mistake(got, mistakes, atol=atol or 1e-5) or otherwise)


def expect_mask(got, want, sees_future: Callable, misses_past: Callable) -> None:
    """Fail unless the bool mask ``got`` (True = may attend) is ``want``: the first query i that may attend a key j it
    must not gets the hint ``sees_future(i, j)``, the first that may not attend a key it may, ``misses_past(i, j)``."""
    for wrong, hint in ((got & ~want, sees_future), (want & ~got, misses_past)):
        if wrong.any():
            raise CheckFailed(hint(*wrong.nonzero()[0].tolist()))


def expect_tensor(got, shape=None, what: str = "a tensor"):
    """Fail unless the learner's ``got`` is a tensor (of ``shape``, when given); return it."""
    expect(_is_tensor(got), f"return {what}, got {type(got).__name__}")
    if shape is not None:
        expect(tuple(got.shape) == tuple(shape), f"return {what} of shape {tuple(shape)}, got {tuple(got.shape)}")
    return got


def expect_items(got, n: int, hint: str, kinds=tuple):
    """Fail with ``hint`` unless the learner's ``got`` is a ``kinds`` of ``n`` items (a pair, a triple); return it."""
    expect(isinstance(got, kinds) and len(got) == n, hint)
    return got


def expect_match(got, want, mistakes=(), otherwise: Callable = None, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    """Pass when ``close(got, want)``; else fail with the hint of the known mistake ``got`` equals (``mistakes``, as for
    :func:`name_mistake`, or a function that makes them), or ``otherwise(*index)`` of the first entry off by more than
    ``atol``."""
    if close(got, want, atol, rtol):
        return
    named = name_mistake(got, mistakes() if callable(mistakes) else mistakes, atol=atol, rtol=rtol)
    raise CheckFailed(named or otherwise(*((got - want).abs() > atol).nonzero()[0].tolist()))


def expect_known_crash(fn, *args, known: Iterable, errors=RuntimeError):
    """``fn(*args)``; an error of type ``errors`` whose text holds the text of a ``(text, hint)`` pair of ``known`` (the
    first that does; "" matches any) fails the check with that hint, any other error goes on up."""
    try:
        return fn(*args)
    except errors as error:
        hint = next((hint for text, hint in known if text in str(error)), None)
        if hint is None:
            raise
        raise CheckFailed(hint) from None


def expect_runs(fn, *args, hint: str, errors=Exception, **kwargs):
    """``fn(*args, **kwargs)``; an error of type ``errors`` fails the check with ``hint`` and what
    was raised (a stub's NotImplementedError still means "not done")."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise
    except errors as error:
        raise CheckFailed(f"{hint} (it raised {type(error).__name__}: {error})") from None


def expect_unchanged(x, before, hint: str | None = None):
    """Fail with ``hint`` (by default: do not change x in place) unless the learner's code left its input ``x`` equal
    to ``before``, the copy taken before the call."""
    hint = hint or "do not change x in place: compute a new tensor"
    expect(sys.modules["torch"].equal(x, before) if _is_tensor(x) else x == before, hint)


@contextlib.contextmanager
def fresh_rng(seed: int = 0):
    """Inside the block, the random numbers start from ``seed``; after it, the notebook's random
    state is what it was before (``with fresh_rng(51): layer = cls(8)``)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def seeded_randn(*shape: int, seed: int, dtype=None):
    """A standard normal tensor of ``shape``, the same on every call with the same ``seed``."""
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ---------------------------------------------------------------- the wrapper
def _notebook_rng_kept():
    """The learner's random state, restored when the check ends (no torch yet: nothing to keep)."""
    torch = sys.modules.get("torch")  # no torch import for the checks that need none
    return torch.random.fork_rng(devices=[]) if torch is not None else contextlib.nullcontext()


def _run_body(body: Callable, candidate, args, kwargs) -> tuple[str, str]:
    """(status, message) of one run of a check's body."""
    try:
        with _notebook_rng_kept():
            body(candidate, *args, **kwargs)
    except NotImplementedError:
        return NOT_DONE, "not done yet"
    except CheckFailed as failure:
        return FAILED, str(failure)
    except Exception as error:  # the learner's code crashed: say what and where
        frames = traceback.extract_tb(error.__traceback__)
        where = next((f for f in reversed(frames) if "transformer_course" not in f.filename), None)
        at = f" (line {where.lineno}: {where.line.strip()})" if where and where.line else ""
        return FAILED, f"your code raised {type(error).__name__}: {error}{at}"
    return PASSED, PASSED


def check(exercise: str, name: str, reference=None) -> Callable:
    """Turn ``body(candidate, *args, **kwargs)`` into a learner-facing check.

    The body calls the learner's ``candidate`` on ordinary and edge inputs and uses :func:`expect` and its kin to name
    the likely mistake. The wrapper prints one line, records and returns the outcome:

    - ``NotImplementedError`` from the candidate (the student edition's stub) -> "not done yet";
    - :class:`CheckFailed` -> the hint;
    - any other exception -> what was raised, and where in the learner's code.

    ``reference`` is the package's implementation of the same thing (the object itself). With it, the outcome's ``use``
    is what the rest of the chapter should run: the learner's candidate when it passed, the reference otherwise, and the
    printed line says which (``causal_mask = check_causal_mask(causal_mask).use``).
    """
    short = getattr(reference, "__name__", None)

    def decorate(body: Callable) -> Callable:
        @functools.wraps(body)
        def run(candidate, *args, quiet: bool = False, **kwargs) -> CheckOutcome:
            if os.environ.get(GRADING_ENV):
                _PENDING.append((exercise, candidate, args, kwargs))
            status, message = _run_body(body, candidate, args, kwargs)
            use = None
            if reference is not None:
                use = candidate if status == PASSED else reference
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
        run.verdict = lambda candidate, args, kwargs: _run_body(body, candidate, args, kwargs)[0]
        packaged = _written_by_learner(body) is False
        if exercise not in _GENUINE or (packaged and _written_by_learner(_GENUINE[exercise])):
            _GENUINE[exercise] = run
        return run

    return decorate
