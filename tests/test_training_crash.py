"""Killing `transformer-course train` at any moment loses nothing (issue 24's crash test for training).

A run is SIGKILLed four times, each time at a chosen point: while it starts (its data loaded), in the
middle of a training step, during an evaluation, and in the middle of writing its checkpoint. The run
kills itself there (TRANSFORMER_COURSE_FAULT, see tests/fault_injection), so the point is a count of
events, the same on a fast machine and a slow one, not a timer racing the training. After every kill,
whatever is on disk must be whole: the checkpoint loads (its SHA-256 verified), holds exactly the step of
the last checkpoint written, and its step never goes back; `history.json` is written only by a run that
ends. Then the same command runs to the end: it resumes from that checkpoint, reaches the requested step,
and leaves no temporary file behind.
"""

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fault_injection.course_faults import environment

from transformer_course.checkpoint import load_checkpoint

pytestmark = pytest.mark.system  # trainings started, killed and resumed: about half a minute
ROOT = Path(__file__).resolve().parents[1]


def _kills(interval: int) -> list[tuple[str, int | None]]:
    """(fault, the checkpoint's step after the kill; None: none yet), for a run of 3 * `interval` steps
    that evaluates and checkpoints every `interval`. Counts start from 1 in each process."""
    return [
        ("kill:start=1", None),  # data loaded, nothing trained
        (f"kill:step={interval + 1}", interval),  # from step 0: checkpoints at 0 and interval, killed in the next step
        ("kill:eval=2", 2 * interval),  # resumed: its 1st evaluation checkpoints, killed in its 2nd (the last)
        ("kill:mid_save=1", 2 * interval),  # resumed: killed while writing the last checkpoint
    ]


def _train(out: Path, steps: int, interval: int, fault: str | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "transformer_course", "train", "--preset", "tiny", "--out", str(out),
               "--max-iters", str(steps), "--eval-interval", str(interval), "--eval-iters", "2", "--device", "cpu"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=environment(fault) | {"OMP_NUM_THREADS": "1"})


def _temporary_files(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.endswith(".tmp"))


def crash_run(out: Path, interval: int = 3) -> None:
    """Kill a run of 3 * `interval` steps at each kind of moment, then let it finish (the module docstring)."""
    steps, last_step = 3 * interval, -1
    for fault, expected in _kills(interval):
        run = _train(out, steps, interval, fault)
        assert run.returncode == -signal.SIGKILL, f"{fault}: {run.returncode}\n{run.stderr[-2000:]}"
        resumed = re.findall(r"resuming from step (\d+)", run.stdout)
        assert resumed == ([] if last_step < 0 else [str(last_step)]), (fault, run.stdout)
        checkpoint = out / "checkpoint.pt"
        if expected is None:
            assert not checkpoint.exists(), fault
        else:
            step = load_checkpoint(checkpoint).step  # raises if the file is not whole
            assert step == expected and step >= last_step, (fault, step, last_step)
            last_step = step
        assert not (out / "history.json").exists(), fault  # written only when a run ends
        # only a kill in the middle of a save leaves its temporary file (cut short) behind
        assert len(_temporary_files(out)) == (fault.startswith("kill:mid_save")), (fault, _temporary_files(out))
    final = _train(out, steps, interval)
    assert final.returncode == 0, final.stderr
    assert re.findall(r"resuming from step (\d+)", final.stdout) == [str(last_step)]
    assert "removed 1 unfinished temporary file(s)" in final.stderr  # the killed save's, by the next save
    assert load_checkpoint(out / "checkpoint.pt").step == steps
    history = json.loads((out / "history.json").read_text())
    assert history["eval_step"] == list(range(0, steps + 1, interval)) and history["step"] == list(range(steps))
    assert _temporary_files(out) == [], "temporary files left behind"


def test_killing_training_at_each_kind_of_moment_loses_nothing(tmp_path):
    crash_run(tmp_path / "run")
