"""Killing `transformer-course train` at random moments loses nothing (issue 24's crash test for training).

A run is SIGKILLed a few times at random delays (while it loads data, trains, evaluates or writes its
checkpoint). After every kill, whatever is on disk must be whole: the checkpoint loads (its SHA-256
verified) and its step never goes back; `history.json`, if written, parses. Then the same command runs
to the end: it resumes from the last checkpoint, reaches the requested step, and leaves no temporary
file behind.
"""

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from transformer_course.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
STEPS = 300  # the tiny preset evaluates and checkpoints every 100 steps


def _train(out: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "transformer_course", "train", "--preset", "tiny", "--out", str(out),
               "--max-iters", str(STEPS), "--device", "cpu"]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})


def test_killing_training_at_random_moments_loses_nothing(tmp_path):
    out = tmp_path / "run"
    rng = random.Random(24)  # the delays are random but the same on every run of the test
    last_step = -1
    for _ in range(3):
        child = _train(out)
        time.sleep(rng.uniform(3.0, 9.0))
        child.send_signal(signal.SIGKILL)
        child.communicate()
        checkpoint = out / "checkpoint.pt"
        if checkpoint.exists():
            step = load_checkpoint(checkpoint).step  # raises if the file is not whole
            assert step >= last_step, "a kill must never leave an older checkpoint than the one before"
            last_step = step
        if (out / "history.json").exists():
            json.loads((out / "history.json").read_text())
    child = _train(out)
    stdout, stderr = child.communicate(timeout=600)
    assert child.returncode == 0, stderr
    if last_step >= 0:
        assert f"resuming from step {last_step}" in stdout
    assert load_checkpoint(out / "checkpoint.pt").step == STEPS
    assert json.loads((out / "history.json").read_text())["eval_step"][-1] == STEPS
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")], "temporary files left behind"
