"""Test-only fault injection (hand-written, not exported): a process fails or kills itself at a chosen
point, so the tests of crashes and restarts trigger their fault by a count of events, never by a timer.

Nothing happens unless the environment variable ``TRANSFORMER_COURSE_FAULT`` is set. It is read once per
process, on first use, and holds one fault::

    ACTION:POINT=N[:rank=R][:round=K][:others=wait]     e.g.  kill:after_checkpoint=2:rank=1:round=0

- ``ACTION``: ``kill`` (the process sends itself SIGKILL: no cleanup, no flushing, as a power cut or the
  OOM killer), ``raise`` (an ``InjectedFault``, a ``RuntimeError``, which the code's own error handling
  sees), ``interrupt`` (a ``KeyboardInterrupt``, what Ctrl-C raises) or ``nan`` (``step`` only: the step's
  loss becomes NaN on that rank, and so its mean over the ranks, as in a run that diverged).
- ``POINT=N``: the N-th time (from 1) this process reaches the point. A resumed or restarted run is a new
  process and counts from 1 again.

  * ``start``: the ``train`` command, its data loaded, before the model is built or a checkpoint read;
  * ``step``: a training step, after its optimizer update, before its loss is recorded;
  * ``eval``: an evaluation, after the train split was scored, before the validation split;
  * ``after_checkpoint``: an evaluation's end, its checkpoint (if any) written and every rank past the
    barrier that follows it;
  * ``mid_save``: ``runtime.atomic_save``, its temporary file cut to half its length, not renamed;
  * ``after_grade``: the grader, the grade of a notebook reported, the next notebook not started;
  * ``mid_csv``: the grader's CSV, its temporary file cut to half its length, not renamed.

  ``step``, ``eval`` and ``after_checkpoint`` are counted on the ``World`` that ``parallel.train`` (what
  the ``train`` command runs) gets from ``parallel.current_world()``: train calls ``mean`` once per step,
  ``sum`` twice per evaluation and ``barrier`` once per evaluation. Chapter 06's one-process
  ``training.train`` has no ``World`` and counts nothing.
- ``rank=R``: only the process with torchrun's ``RANK`` R (0 outside torchrun); default every rank.
- ``round=K``: only in torchrun's restart round K (``TORCHELASTIC_RESTART_COUNT``, 0 for the first
  start): ``round=0`` fails the first round and lets the restarted one run through.
- ``others=wait`` (with ``rank=R``): the other ranks stop at the same point and wait there until torchrun
  ends them, so rank R's failure is the first torchrun sees, however fast each rank is. Without it they
  go on, and fail at their next collective operation (or are ended by torchrun first).

A value that does not follow this syntax raises a ``ValueError`` that says what is wrong, at the first
point reached. Unset, each point costs one cached lookup, and the ``World`` is not wrapped at all.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from dataclasses import dataclass

FAULT_ENV = "TRANSFORMER_COURSE_FAULT"
ACTIONS = ("kill", "raise", "interrupt", "nan")
POINTS = ("start", "step", "eval", "after_checkpoint", "mid_save", "after_grade", "mid_csv")
WORLD_POINTS = ("step", "eval", "after_checkpoint")  # counted on the World parallel.train asks
SYNTAX = (f"ACTION:POINT=N[:rank=R][:round=K][:others=wait] with ACTION one of {', '.join(ACTIONS)}, POINT one "
          f"of {', '.join(POINTS)}, N >= 1, R >= 0 and K >= 0 whole numbers, others=wait only with rank=R "
          "(e.g. kill:after_checkpoint=2:rank=1:round=0); nan only at step")


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
    """Read ``TRANSFORMER_COURSE_FAULT`` again and count every point from zero (for tests)."""
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


def watch(world):
    """`world` itself, unless the armed fault counts training steps or evaluations: then an equal `World`
    whose ``mean``, ``sum`` and ``barrier`` also mark them (see the module docstring)."""
    fault = armed()
    if fault is None or fault.point not in WORLD_POINTS:
        return world
    return _watching(type(world))(world.rank, world.size, world.device)


@functools.cache
def _watching(world_class: type) -> type:
    """A subclass of `world_class` (``parallel.World``, whose module imports this one) that marks what
    `parallel.train` does with it: a step, an evaluation, the end of an evaluation."""

    class WatchedWorld(world_class):
        def mean(self, value: float) -> float:  # train: once per step, with the step's loss
            return super().mean(float("nan") if reached("step") else value)

        def sum(self, value: float) -> float:  # train: twice per evaluation, the train split first
            _counts["sum"] = _counts.get("sum", 0) + 1
            if _counts["sum"] % 2:
                reached("eval")
            return super().sum(value)

        def barrier(self) -> None:  # train: once per evaluation, after rank 0 wrote the checkpoint
            super().barrier()
            reached("after_checkpoint")

    return WatchedWorld
