"""Issue 40: the `train` command, its checkpoints and its loaders behave as users expect when a run is
stopped (Ctrl-C), diverges (a NaN loss), shares its --out with another run, is pointed at a device that
does not exist, or resumes from a checkpoint that was edited by hand (its SHA-256 recomputed).

Faults are injected by a count of events (TRANSFORMER_COURSE_FAULT, see tests/fault_injection) or by
holding a lock from the test itself: nothing races a timer or a signal against the code.
"""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from fault_injection import course_faults as faults
from fault_injection.course_faults import environment

from transformer_course import cli, parallel
from transformer_course.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, state_sha256
from transformer_course.config import GPTConfig, TrainConfig
from transformer_course.model import GPT, count_parameters
from transformer_course.runtime import LOCK_NAME, folder_lock, pick_device
from transformer_course.tokenization import CharTokenizer

ROOT = Path(__file__).resolve().parents[1]
CFG = GPTConfig(vocab_size=12, block_size=16, n_layer=2, n_head=2, d_model=16)


def _train(out: Path, steps: int, *flags: str, fault: str | None = None) -> subprocess.CompletedProcess:
    """The real command, in a child process: the tiny preset, an evaluation (and checkpoint) every 3 steps."""
    command = [sys.executable, "-m", "transformer_course", "train", "--preset", "tiny", "--out", str(out),
               "--max-iters", str(steps), "--eval-interval", "3", "--eval-iters", "2", "--device", "cpu", *flags]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=environment(fault) | {"OMP_NUM_THREADS": "1"})


def _last_line(run: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    return run.stderr.strip().splitlines()[-1]


# ---------------------------------------------------------------- Ctrl-C
@pytest.mark.system
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
@pytest.mark.system
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


# ---------------------------------------------------------------- checkpoints edited by hand
def _trained(tmp_path: Path) -> tuple[Path, torch.Tensor]:
    """A checkpoint of 2 steps of `parallel.train` (what the command runs): optimizer, history, random states."""
    torch.manual_seed(0)
    data = torch.randint(0, 12, (600,), generator=torch.Generator().manual_seed(0))
    path = tmp_path / "checkpoint.pt"
    parallel.train(GPT(CFG), data[:500], data[500:], _quick(2), checkpoint_path=path)
    return path, data


def _quick(steps: int) -> TrainConfig:
    return TrainConfig(batch_size=4, max_iters=steps, eval_interval=2, eval_iters=1, warmup_iters=1, progress=False,
                       device="cpu")


def _edited(path: Path, edit) -> Path:
    """`path` with `edit(state)` applied and its SHA-256 recomputed, as a hostile file would carry it."""
    state = torch.load(path, weights_only=True)
    state.pop("sha256")
    edit(state)
    state["sha256"] = state_sha256(state)
    out = path.with_name("edited.pt")
    torch.save(state, out)
    return out


def _resume(path: Path, data: torch.Tensor) -> None:
    """What `transformer-course train` does with a checkpoint it finds: load it into a fresh model, go on."""
    model = GPT(CFG)
    resume = load_checkpoint(path, model)
    parallel.train(model, data[:500], data[500:], _quick(resume.step + 1), resume=resume)


def _set(state, keys, value) -> None:
    for key in keys[:-1]:
        state = state[key]
    state[keys[-1]] = value


EDITS = [  # (entry, new value, what the error says)
    (("optimizer", "state", 0, "exp_avg"), torch.zeros(3), r"\['exp_avg'\] must be a torch.float32 tensor of its "
                                                             r"parameter's shape \(12, 16\)"),
    (("optimizer", "state", 0, "exp_avg_sq"), torch.zeros(12, 16, dtype=torch.float64), r"\['exp_avg_sq'\] must be"),
    (("optimizer", "state", 0, "exp_avg_sq"), -torch.ones(12, 16), r"\['exp_avg_sq'\] must be finite and >= 0"),
    (("optimizer", "state", 0, "exp_avg"), torch.zeros(1).expand(12, 16), r"\['exp_avg'\] is a strided view"),
    (("optimizer", "state", 0, "step"), torch.tensor(-1.0), r"\['step'\] must be a number >= 0"),
    (("optimizer", "state", 0, "max_exp_avg_sq"), torch.zeros(12, 16), r"optimizer\['state'\]\[0\] must be AdamW's"),
    (("optimizer", "param_groups", 0, "betas"), (1.5, 0.9), r"\['betas'\] must be two numbers in \[0, 1\)"),
    (("optimizer", "param_groups", 1, "amsgrad"), True, r"\[1\]\['amsgrad'\] must be False"),
    (("optimizer", "param_groups", 0, "params"), [0], r"entry optimizer must be AdamW's state, 2 param_groups of"),
    (("history", "loss"), [1.0], r"history\['loss'\] must be a list of numbers as long as history\['step'\]"),
    (("history", "eval_step"), [0, -2.5], r"history\['eval_step'\] must be a list of whole numbers"),
    (("rng", "torch"), torch.zeros(10, dtype=torch.uint8), r"rng\['torch'\] must be a state of this PyTorch's"),
    (("rng", "batch"), torch.zeros(5056), r"rng\['batch'\] must be a generator state"),
    (("step",), 2.5, "its step must be a whole number"),
]


@pytest.mark.parametrize(("keys", "value", "match"), EDITS, ids=[".".join(map(str, e[0])) for e in EDITS])
def test_every_entry_a_resume_uses_is_checked_at_load(tmp_path, keys, value, match):
    path, data = _trained(tmp_path)
    _resume(path, data)  # untouched, it resumes
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(_edited(path, lambda state: _set(state, keys, value)), GPT(CFG))


def _leaves(value, keys=()):
    """Every entry inside `value` (dicts, lists, tensors, numbers), as key paths."""
    yield keys
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*keys, key))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _leaves(item, (*keys, i))


def _random_value(rng, old):
    if isinstance(old, torch.Tensor) and rng.random() < 0.7:
        shape = old.shape if rng.random() < 0.5 else tuple(rng.randint(0, 5) for _ in range(rng.randint(0, 3)))
        dtype = rng.choice([old.dtype, torch.float64, torch.int64, torch.uint8, torch.bfloat16])
        fill = rng.choice([0.0, -1.0, float("nan"), float("inf"), 3.0])
        made = torch.full(shape, fill).to(dtype) if dtype.is_floating_point else torch.full(shape, 3, dtype=dtype)
        return made if rng.random() < 0.8 or not shape else torch.zeros(()).to(dtype).expand(shape)
    return rng.choice([-1, 0, 1, 2**40, -(2**70), 1.5, float("nan"), float("inf"), "x", None, True, [], {}, (0.9,),
                       [0, 1], torch.tensor(7.0)])


def _random_edit(state, rng) -> str:
    keys = rng.choice([k for entry in ("optimizer", "history", "rng", "step") for k in _leaves(state[entry], (entry,))
                       if len(k) > 1 or entry == "step"])
    parent = state
    for key in keys[:-1]:
        parent = parent[key]
    old = parent[keys[-1]]
    if isinstance(parent, tuple):  # betas: rebuild the tuple
        grand = state
        for key in keys[:-2]:
            grand = grand[key]
        items = list(parent)
        items[keys[-1]] = _random_value(rng, old)
        grand[keys[-2]] = tuple(items)
    elif isinstance(parent, dict) and rng.random() < 0.15:
        del parent[keys[-1]]
        return f"del {keys}"
    elif isinstance(parent, list) and rng.random() < 0.15:
        parent.pop(keys[-1])
        return f"pop {keys}"
    else:
        parent[keys[-1]] = _random_value(rng, old)
    return f"{keys} = {parent[keys[-1]]!r}"[:200] if not isinstance(parent, tuple) else f"{keys} edited"


@pytest.mark.system
def test_random_edits_of_the_resumed_entries_resume_cleanly_or_raise_a_checkpoint_error(tmp_path):
    """100 seeded random edits of the optimizer, history, random states and step, each re-hashed: every one
    either loads and resumes, or is refused with a CheckpointError; never another error (or a crash)."""
    import random

    path, data = _trained(tmp_path)
    rng, outcomes = random.Random(40), {"resumed": 0, "refused": 0}
    for _ in range(100):
        described = []
        edited = _edited(path, lambda state, said=described: said.append(_random_edit(state, rng)))
        try:
            model = GPT(CFG)
            resume = load_checkpoint(edited, model)
        except CheckpointError:
            outcomes["refused"] += 1
            continue
        try:
            parallel.train(model, data[:500], data[500:], _quick(min(resume.step, 10**6) + 1), resume=resume)
        except Exception as error:  # noqa: BLE001  (the assertion names it)
            pytest.fail(f"the edit {described[0]} loaded, then resuming raised {type(error).__name__}: {error}")
        outcomes["resumed"] += 1
    assert outcomes["refused"] > 50 and outcomes["resumed"] > 5, outcomes


# ---------------------------------------------------------------- memory bombs
def test_a_small_file_of_repeated_numbers_cannot_ask_for_gigabytes(tmp_path, monkeypatch):
    """GPT-2 XL's config (1.6 B parameters, 6 GB to build) with weights that are views of one number each."""
    from transformer_course import checkpoint

    big = GPTConfig(vocab_size=50257, block_size=1024, n_layer=48, n_head=25, d_model=1600)
    with torch.device("meta"):
        shapes = {name: t.shape for name, t in GPT(big).state_dict().items()}
    state = {"format": 1, "model_config": big.to_dict(), "step": 0,
             "model": {name: torch.zeros(()).expand(shape) for name, shape in shapes.items()}}
    torch.save(state, tmp_path / "bomb.pt")  # no checksum: the loader skips that check
    assert (tmp_path / "bomb.pt").stat().st_size < 1_000_000  # 4 bytes per tensor, and the zip's headers
    monkeypatch.setattr(checkpoint, "GPT", lambda cfg: pytest.fail("a model was built"))
    with pytest.raises(CheckpointError, match="is a strided view"):
        load_checkpoint(tmp_path / "bomb.pt", max_parameters=None)
    # whole tensors that all share one storage: 20 tensors of a tenth of the parameters claim twice their
    # number, and the file holds a tenth of them
    small = replace(big, n_layer=1, vocab_size=500, d_model=160, n_head=5)
    base = torch.zeros(count_parameters(small) // 10)
    state |= {"model_config": small.to_dict(), "model": {f"w{i}": base for i in range(20)}}
    torch.save(state, tmp_path / "shared.pt")
    assert (tmp_path / "shared.pt").stat().st_size < count_parameters(small)  # 4 bytes a number: a tenth
    with pytest.raises(CheckpointError, match=r"asks for [\d,]+ parameters but the file holds [\d,]+ numbers"):
        load_checkpoint(tmp_path / "shared.pt", max_parameters=None)
