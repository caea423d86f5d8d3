"""Issue 40: the `train` command, its checkpoints and its loaders behave as users expect when a run is
stopped (Ctrl-C), diverges (a NaN loss), shares its --out with another run, is pointed at a device that
does not exist, or resumes from a checkpoint that was edited by hand (its SHA-256 recomputed).

Faults are injected by a count of events (TRANSFORMER_COURSE_FAULT, see transformer_course.faults) or by
holding a lock from the test itself: nothing races a timer or a signal against the code.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_course import cli, faults, parallel
from transformer_course.checkpoint import load_checkpoint, save_checkpoint
from transformer_course.config import GPTConfig, TrainConfig
from transformer_course.faults import FAULT_ENV
from transformer_course.model import GPT
from transformer_course.runtime import LOCK_NAME, folder_lock, pick_device
from transformer_course.tokenization import CharTokenizer

ROOT = Path(__file__).resolve().parents[1]
CFG = GPTConfig(vocab_size=12, block_size=16, n_layer=2, n_head=2, d_model=16)


def _train(out: Path, steps: int, *flags: str, fault: str | None = None) -> subprocess.CompletedProcess:
    """The real command, in a child process: the tiny preset, an evaluation (and checkpoint) every 3 steps."""
    command = [sys.executable, "-m", "transformer_course", "train", "--preset", "tiny", "--out", str(out),
               "--max-iters", str(steps), "--eval-interval", "3", "--eval-iters", "2", "--device", "cpu", *flags]
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV} | {"OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=env if fault is None else {**env, FAULT_ENV: fault})


def _last_line(run: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    return run.stderr.strip().splitlines()[-1]


# ---------------------------------------------------------------- Ctrl-C
@pytest.mark.slow
def test_ctrl_c_during_train_says_where_it_stopped_exits_130_and_keeps_the_checkpoint(tmp_path):
    out = tmp_path / "run"
    # the 5th step's update done (step 4), its loss not yet recorded: the checkpoint of step 3 is the last
    stopped = _train(out, 6, fault="interrupt:step=5")
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    checkpoint = out / "checkpoint.pt"
    assert _last_line(stopped) == (f"transformer-course train: stopped at step 4; checkpoint at {checkpoint}; "
                                   "run the same command to resume")
    assert load_checkpoint(checkpoint).step == 3
    assert not (out / "history.json").exists() and not list(out.glob("*.tmp"))
    resumed = _train(out, 6)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from step 3" in resumed.stdout and load_checkpoint(checkpoint).step == 6


def test_ctrl_c_before_the_first_checkpoint_says_there_is_none(tmp_path):
    stopped = _train(tmp_path / "run", 3, fault="interrupt:start=1")
    assert stopped.returncode == 130
    assert _last_line(stopped) == ("transformer-course train: stopped; no checkpoint written yet; run the same "
                                   "command to resume")


# ---------------------------------------------------------------- divergence
@pytest.mark.slow
def test_a_nan_loss_stops_training_and_leaves_the_last_finite_checkpoint_untouched(tmp_path):
    out = tmp_path / "run"
    checkpoint = out / "checkpoint.pt"
    assert _train(out, 3).returncode == 0
    before = checkpoint.read_bytes()  # step 3's
    diverged = _train(out, 9, fault="nan:step=2")  # resumed at step 3: its 2nd step is step 4
    assert diverged.returncode == 2, diverged.stderr[-3000:]
    assert _last_line(diverged) == (
        f"transformer-course train: error: training diverged at step 4: the training loss is nan; the last "
        f"checkpoint, {checkpoint}, is kept as it was. Try a lower learning rate (TrainConfig.learning_rate, "
        "--learning-rate), resuming from that checkpoint")
    assert checkpoint.read_bytes() == before and not list(out.glob("*.tmp"))
    # what the message suggests works: the same command with a lower learning rate resumes from step 3
    lower = _train(out, 6, "--learning-rate", "1e-4")
    assert lower.returncode == 0 and "resuming from step 3" in lower.stdout, lower.stderr[-3000:]
    resumed = load_checkpoint(checkpoint)
    assert resumed.step == 6 and resumed.train_config.learning_rate == 1e-4
    assert resumed.train_config.min_lr < 1e-4


def test_weights_that_are_already_nan_stop_at_the_first_evaluation_and_write_nothing(tmp_path):
    torch.manual_seed(0)
    model = GPT(CFG)
    with torch.no_grad():
        model.ln_f.weight.fill_(float("nan"))  # as a run that diverged before it was checkpointed
    data = torch.randint(0, 12, (500,), generator=torch.Generator().manual_seed(0))
    cfg = TrainConfig(batch_size=4, max_iters=3, eval_interval=3, eval_iters=1, warmup_iters=1, progress=False,
                      device="cpu")
    with pytest.raises(parallel.TrainingDiverged, match=r"diverged at step 0: the evaluated loss is nan; no "
                                                        r"checkpoint\. Try a lower learning rate"):
        parallel.train(model, data[:400], data[400:], cfg, checkpoint_path=tmp_path / "checkpoint.pt")
    assert list(tmp_path.iterdir()) == []


def test_the_nan_fault_belongs_to_steps_only():
    with pytest.raises(ValueError, match="nan makes a step's loss NaN: its point is step, not eval"):
        faults.parse("nan:eval=1")
    assert faults.parse("interrupt:step=3") == faults.Fault("interrupt", "step", 3)


# ---------------------------------------------------------------- one run per --out
def test_a_second_run_on_the_same_out_is_refused_at_once_naming_the_first(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with folder_lock(out, f"--out {out}"):  # this process plays the first run
        second = _train(out, 1)
        assert second.returncode == 2
        assert _last_line(second) == (
            f"transformer-course train: error: --out {out} is in use by another run (PID {os.getpid()}), and two "
            "runs writing one folder destroy each other's checkpoints: wait for that run to end (or stop it), or "
            "choose another folder")
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing written by the refused run
    with folder_lock(out):  # released at the end of the block: the next holder gets it
        pass


# ---------------------------------------------------------------- devices that do not exist
def test_a_device_index_that_does_not_exist_is_named_with_the_ones_that_do(monkeypatch):
    monkeypatch.delenv("TRANSFORMER_COURSE_DEVICE", raising=False)
    assert pick_device("cpu:0") == torch.device("cpu")
    with pytest.raises(RuntimeError, match=r"device 'cpu:5' does not exist; this machine has cpu"):
        pick_device("cpu:5")
    with pytest.raises(ValueError, match="'cuda:x' is not a device name"):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        pick_device("cuda:x")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(RuntimeError, match=r"device 'cuda:1' does not exist; this machine has cpu, cuda:0"):
        pick_device("cuda:1")
    assert pick_device("cuda:0") == torch.device("cuda:0")


def test_generate_and_train_on_a_missing_device_say_so_not_that_the_checkpoint_is_damaged(tmp_path, capsys,
                                                                                         monkeypatch):
    torch.manual_seed(0)
    path = save_checkpoint(tmp_path / "c.pt", GPT(CFG), tokenizer=CharTokenizer.from_text("abcdefghijkl"))
    assert cli.main(["generate", "--checkpoint", str(path), "--prompt", "ab", "--device", "cpu:5"]) == 2
    err = capsys.readouterr().err
    assert "device 'cpu:5' does not exist; this machine has cpu" in err and "corrupted" not in err
    from transformer_course import data

    monkeypatch.setattr(data, "load_shakespeare", lambda *a, **k: pytest.fail("the corpus was loaded"))
    assert cli.main(["train", "--out", str(tmp_path / "run"), "--device", "cpu:5"]) == 2
    assert "device 'cpu:5' does not exist" in capsys.readouterr().err
