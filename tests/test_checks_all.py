"""Every ``@check`` of ``transformer_course.checks``, found by walking its modules: the student
edition's stub is "not done" under the check's exercise id, the reference passes and is what the
chapter runs next, and no check moves the notebook's random numbers."""

import importlib
import inspect
import pkgutil
import re
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from check_helpers import run, stub, stub_class

import transformer_course.checks as checks_package


def _all_checks() -> list:
    found = []
    for info in pkgutil.iter_modules(checks_package.__path__):
        if not info.name.startswith("_"):
            module = importlib.import_module(f"{checks_package.__name__}.{info.name}")
            found += [obj for _, obj in inspect.getmembers(module, callable)
                      if hasattr(obj, "exercise") and obj.__module__ == module.__name__]
    return sorted(found, key=lambda c: tuple(int(n) for n in c.exercise.split(".")))


CHECKS = _all_checks()
WITH_REFERENCE = [c for c in CHECKS if c.reference is not None]


def _name(check_fn) -> str:
    return f"{check_fn.exercise}-{check_fn.__name__}"


def _exercises_in_the_chapters() -> set[str]:
    """Every "# Your turn - Exercise N.M" the chapter scripts hold (the source of truth, not a count)."""
    sources = (Path(__file__).resolve().parents[1] / "chapter_sources").glob("[0-9][0-9]_*.py")
    return {m for p in sources for m in re.findall(r"^# Your turn - Exercise (\d+\.\d+)\b", p.read_text(), re.M)}


def test_every_exercise_has_one_check_and_each_module_one_chapter_in_order():
    exercises = _exercises_in_the_chapters()
    assert len(CHECKS) == len({c.exercise for c in CHECKS}) and {c.exercise for c in CHECKS} == exercises, (
        sorted(exercises ^ {c.exercise for c in CHECKS}))
    by_module = defaultdict(list)
    for c in CHECKS:
        by_module[c.__module__].append(c.exercise)
    for module, exercises in by_module.items():
        chapter = exercises[0].split(".")[0]
        assert exercises == [f"{chapter}.{n}" for n in range(1, len(exercises) + 1)], module


@pytest.mark.parametrize("check_fn", CHECKS, ids=_name)
def test_stub_is_not_done(check_fn):
    reference = check_fn.reference
    outcome = run(check_fn, stub_class(reference) if isinstance(reference, type) else stub)
    assert (outcome.status, outcome.exercise) == ("not done", check_fn.exercise), outcome.line()
    assert outcome.use is reference  # None for a check without a reference
    if reference is not None:
        assert outcome.message.endswith(
            f"the chapter carries on with the package's {reference.__name__}")


@pytest.mark.parametrize("check_fn", WITH_REFERENCE, ids=_name)
def test_reference_passes_and_is_used(check_fn):
    reference = check_fn.reference
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    outcome = run(check_fn, reference)
    assert outcome.passed, outcome.line()
    assert outcome.use is reference
    assert torch.equal(torch.rand(3), expected), "the check moved the notebook's random numbers"
