"""Fault injection for the tests of crashes, kills and restarts (test-only: the package knows nothing of
it, and imports nothing of it). A process fails or kills itself at a chosen point of the course's code, so
those tests trigger their fault by a count of events, never by a timer or a signal raced against the code.

A test starts its child process with :func:`environment` (``environment("kill:mid_save=1")``): the
variable ``TRANSFORMER_COURSE_FAULT`` holds the fault and this folder comes first on ``PYTHONPATH``, so
Python imports this folder's ``sitecustomize`` at startup (and so do torchrun's workers, which inherit
both), which calls :func:`install`. That puts an import hook first on ``sys.meta_path``: when one of the
modules of ``SEAMS`` is imported, right after its code ran and before any other module can see it, the
functions named there are replaced by wrappers that call the original and mark a point with
:func:`reached`. Nothing is installed, and nothing wrapped, in a process without the variable. The
variable is read once per process, at the first point reached, and holds one fault::

    ACTION:POINT=N[:rank=R][:round=K][:others=wait]     e.g.  kill:after_checkpoint=2:rank=1:round=0

- ``ACTION``: ``kill`` (the process sends itself SIGKILL: no cleanup, no flushing, as a power cut or the
  OOM killer), ``raise`` (an ``InjectedFault``, a ``RuntimeError``, which the code's own error handling
  sees), ``interrupt`` (a ``KeyboardInterrupt``, what Ctrl-C raises) or ``nan`` (``step`` only: the step's
  loss becomes NaN on that rank, and so its mean over the ranks, as in a run that diverged).
- ``POINT=N``: the N-th time (from 1) this process reaches the point. A resumed or restarted run is a new
  process and counts from 1 again. Each point is a call the code makes anyway (its seam, in ``SEAMS``):

  * ``start``: the ``train`` command, its data loaded, before the model is built or a checkpoint read
    (``cli._train_config`` is about to run);
  * ``step``: a training step, after its optimizer update, before its loss is recorded
    (``parallel.World.mean``, before the mean over the ranks);
  * ``eval``: an evaluation, after the train split was scored, before the validation split (the first of
    each two calls of ``parallel.World.sum``, before the sum);
  * ``after_checkpoint``: an evaluation's end, its checkpoint (if any) written and every rank past the
    barrier that follows it (``parallel.World.barrier`` returned);
  * ``mid_save``: ``runtime.atomic_save``, its temporary file cut to half its length, not renamed
    (``runtime._write`` returned: the whole object written and flushed, not yet synced to the disk);
  * ``after_grade``: the grader, the grade of a notebook reported, the next notebook not started (the
    ``on_grade`` callback of ``classroom.grading.grade_notebooks`` returned, or would have, without one);
  * ``mid_csv``: the grader's CSV, its temporary file cut to half its length, not renamed
    (``classroom.grading._write_text`` returned).

  ``step``, ``eval`` and ``after_checkpoint`` are counted on every ``parallel.World``: ``parallel.train``
  (what the ``train`` command runs) calls ``mean`` once per step, ``sum`` twice per evaluation and
  ``barrier`` once per evaluation, and nothing else of the package calls them. Chapter 06's one-process
  ``training.train`` has no ``World`` and counts nothing.
- ``rank=R``: only the process with torchrun's ``RANK`` R (0 outside torchrun); default every rank.
- ``round=K``: only in torchrun's restart round K (``TORCHELASTIC_RESTART_COUNT``, 0 for the first
  start): ``round=0`` fails the first round and lets the restarted one run through.
- ``others=wait`` (with ``rank=R``): the other ranks stop at the same point and wait there until torchrun
  ends them, so rank R's failure is the first torchrun sees, however fast each rank is. Without it they
  go on, and fail at their next collective operation (or are ended by torchrun first).

A value that does not follow this syntax raises a ``ValueError`` that says what is wrong, at the first
point reached. This module imports neither torch nor the package (the grader's tests run without torch).
"""

from __future__ import annotations

import functools
import importlib.abc
import inspect
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

FAULT_ENV = "TRANSFORMER_COURSE_FAULT"
FOLDER = Path(__file__).resolve().parent  # holds the sitecustomize that calls install()
ACTIONS = ("kill", "raise", "interrupt", "nan")
POINTS = ("start", "step", "eval", "after_checkpoint", "mid_save", "after_grade", "mid_csv")
SYNTAX = (f"ACTION:POINT=N[:rank=R][:round=K][:others=wait] with ACTION one of {', '.join(ACTIONS)}, POINT one "
          f"of {', '.join(POINTS)}, N >= 1, R >= 0 and K >= 0 whole numbers, others=wait only with rank=R "
          "(e.g. kill:after_checkpoint=2:rank=1:round=0); nan only at step")


def environment(fault: str | None = None, base=None) -> dict[str, str]:
    """The environment of a child process: `base` (default ``os.environ``) without
    ``TRANSFORMER_COURSE_FAULT``; with a `fault`, that fault and this folder first on ``PYTHONPATH``."""
    env = {key: value for key, value in (os.environ if base is None else base).items() if key != FAULT_ENV}
    if fault is None:
        return env
    path = os.pathsep.join(filter(None, [str(FOLDER), env.get("PYTHONPATH")]))
    return {**env, FAULT_ENV: fault, "PYTHONPATH": path}


class InjectedFault(RuntimeError):
    """The failure a ``raise:...`` fault asks for."""


@dataclass(frozen=True)
class Fault:
    """One parsed ``TRANSFORMER_COURSE_FAULT``: `action` at the `count`-th `point`, on `rank` in `round`
    (None: any); `others_wait`: the other ranks wait at that point."""

    action: str
    point: str
    count: int
    rank: int | None = None
    round: int | None = None
    others_wait: bool = False

    def __str__(self) -> str:
        where = "".join(f":{key}={value}" for key, value in (("rank", self.rank), ("round", self.round))
                        if value is not None)
        return f"{self.action}:{self.point}={self.count}{where}" + (":others=wait" if self.others_wait else "")


def parse(text: str) -> Fault:
    """The `Fault` that `text` describes; ``ValueError`` saying what is wrong when it follows no syntax."""
    def refuse(why: str) -> ValueError:
        return ValueError(f"{FAULT_ENV}={text!r}: {why}; the syntax is {SYNTAX}")

    action, *fields = text.strip().split(":")
    if action not in ACTIONS:
        raise refuse(f"unknown action {action!r}")
    values: dict[str, int] = {}
    for item in fields:
        key, equals, number = item.partition("=")
        if key not in (*POINTS, "rank", "round", "others"):
            raise refuse(f"unknown field {key!r}")
        if key in values:
            raise refuse(f"{key} is given twice")
        if key == "others":
            if number != "wait":
                raise refuse(f"others={number} is no choice: others=wait is the only one")
            values[key] = 1
        elif not equals or not (number.isascii() and number.isdigit()):  # no sign, space or other digits
            raise refuse(f"{key} needs a whole number, as {key}=1")
        else:
            values[key] = int(number)
    points = [key for key in values if key in POINTS]
    if len(points) != 1:
        raise refuse("give exactly one point" + (f", not {len(points)} ({', '.join(points)})" if points else ""))
    if values[points[0]] < 1:
        raise refuse(f"{points[0]} counts from 1 (its first occurrence), got 0")
    if "others" in values and "rank" not in values:
        raise refuse("others=wait needs rank=R, the rank that fails while the others wait")
    if action == "nan" and points[0] != "step":
        raise refuse(f"nan makes a step's loss NaN: its point is step, not {points[0]}")
    return Fault(action, points[0], values[points[0]], values.get("rank"), values.get("round"), "others" in values)


@functools.cache
def armed() -> Fault | None:
    """The fault this process was asked for (``TRANSFORMER_COURSE_FAULT``, read once), or None."""
    text = os.environ.get(FAULT_ENV, "")
    return parse(text) if text.strip() else None


_counts: dict[str, int] = {}


def reset() -> None:
    """Read ``TRANSFORMER_COURSE_FAULT`` again and count every point from zero (for tests in one process)."""
    armed.cache_clear()
    _counts.clear()


def _here(name: str) -> int:
    return int(os.environ.get(name) or 0)


def _wait_to_be_ended() -> None:
    """Block for good: torchrun ends this process (SIGTERM) once another rank has failed."""
    threading.Event().wait()


def reached(point: str, partial=None) -> bool:
    """Mark one occurrence of `point`; fail or die here if it is the one the armed fault names (True:
    the ``nan`` fault's, whose caller makes its value NaN). `partial`: the open temporary file being
    written, cut to half its length before the fault strikes."""
    fault = armed()
    if fault is None or fault.point != point:
        return False
    _counts[point] = seen = _counts.get(point, 0) + 1
    if seen != fault.count or fault.round not in (None, _here("TORCHELASTIC_RESTART_COUNT")):
        return False
    if fault.rank not in (None, _here("RANK")):
        if fault.others_wait:
            _wait_to_be_ended()
        return False
    if fault.action == "nan":
        return True
    if partial is not None:
        partial.flush()
        os.ftruncate(partial.fileno(), os.fstat(partial.fileno()).st_size // 2)
    if fault.action == "kill":
        os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))  # Windows: TerminateProcess
    if fault.action == "interrupt":
        raise KeyboardInterrupt(f"fault injected by {FAULT_ENV}={fault} (as Ctrl-C)")
    raise InjectedFault(f"fault injected by {FAULT_ENV}={fault} (occurrence {seen} of {point} in this process)")


# ---------------------------------------------------------------- the seams: wrappers of what the code calls

def _cli_seams(cli) -> list:
    train_config = cli._train_config

    @functools.wraps(train_config)
    def _train_config(*args, **kwargs):  # the train command: its data loaded, nothing built yet
        reached("start")
        return train_config(*args, **kwargs)

    return [(cli, "_train_config", _train_config)]


def _parallel_seams(parallel) -> list:
    world = parallel.World
    mean, sum_, barrier = world.mean, world.sum, world.barrier

    @functools.wraps(mean)
    def mean_of_ranks(self, value: float) -> float:  # train: once per step, with the step's loss
        return mean(self, float("nan") if reached("step") else value)

    @functools.wraps(sum_)
    def sum_of_ranks(self, value: float) -> float:  # train: twice per evaluation, the train split first
        _counts["sum"] = _counts.get("sum", 0) + 1
        if _counts["sum"] % 2:
            reached("eval")
        return sum_(self, value)

    @functools.wraps(barrier)
    def barrier_of_ranks(self) -> None:  # train: once per evaluation, after rank 0 wrote the checkpoint
        barrier(self)
        reached("after_checkpoint")

    return [(world, "mean", mean_of_ranks), (world, "sum", sum_of_ranks), (world, "barrier", barrier_of_ranks)]


def _runtime_seams(runtime) -> list:
    write = runtime._write

    @functools.wraps(write)
    def _write(obj, f) -> None:  # atomic_save: the temporary file written and flushed, not synced or renamed
        write(obj, f)
        reached("mid_save", partial=f)

    return [(runtime, "_write", _write)]


def _grading_seams(grading) -> list:
    write_text, grade_notebooks = grading._write_text, grading.grade_notebooks
    signature = inspect.signature(grade_notebooks)

    @functools.wraps(write_text)
    def _write_text(handle, text: str) -> None:  # write_csv: its temporary file written, not synced or renamed
        write_text(handle, text)
        reached("mid_csv", partial=handle)

    @functools.wraps(grade_notebooks)
    def grading_notebooks(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        on_grade = bound.arguments.get("on_grade")

        def reported(grade) -> None:  # each grade, once on_grade had it
            if on_grade is not None:
                on_grade(grade)
            reached("after_grade")

        bound.arguments["on_grade"] = reported
        return grade_notebooks(*bound.args, **bound.kwargs)

    return [(grading, "_write_text", _write_text), (grading, "grade_notebooks", grading_notebooks)]


# module -> its seams: (owner, attribute, wrapper) for each function wrapped, made from the module
SEAMS = {
    "transformer_course.cli": _cli_seams,
    "transformer_course.parallel": _parallel_seams,
    "transformer_course.runtime": _runtime_seams,
    "transformer_course.classroom.grading": _grading_seams,
}


def _wrap(module) -> None:
    for owner, attribute, wrapper in SEAMS[module.__name__](module):
        setattr(owner, attribute, wrapper)


class _Wrapping(importlib.abc.Loader):
    """A module's own loader, which then wraps the module's seams (before any other module sees it)."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _wrap(module)

    def __getattr__(self, name):  # get_source, get_filename, ...: the module's own loader's
        return getattr(self._loader, name)


class _Hook(importlib.abc.MetaPathFinder):
    """Finds the modules of SEAMS as the other finders do, and gives each a loader that wraps its seams."""

    def find_spec(self, name, path=None, target=None):
        if name not in SEAMS:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(name, path, target) if find else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Wrapping(spec.loader)
                return spec
        return None


def install() -> None:
    """Wrap the seams of each module of SEAMS as it is imported (at once, for one imported already)."""
    if any(isinstance(finder, _Hook) for finder in sys.meta_path):
        return
    for name in SEAMS:
        if name in sys.modules:
            _wrap(sys.modules[name])
    sys.meta_path.insert(0, _Hook())
