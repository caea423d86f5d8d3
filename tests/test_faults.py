"""The test-only fault switch (transformer_course.faults): its syntax, its refusals, and that a fault
strikes at its point, count, rank and restart round only. (The crash and restart tests that use it:
test_training_crash.py, test_grading_crash.py, test_distributed.py, test_training.py.)"""

import os
import subprocess
import sys

import pytest

from transformer_course import faults
from transformer_course.checkpoint import load_checkpoint
from transformer_course.faults import FAULT_ENV, Fault, InjectedFault, parse
from transformer_course.parallel import World, current_world
from transformer_course.runtime import atomic_save


@pytest.fixture
def fault(monkeypatch):
    """Arm a fault in this process as a test process would find it: ``fault("raise:step=2")``."""
    for name in (FAULT_ENV, "RANK", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)

    def arm(text: str, **env: str) -> None:
        monkeypatch.setenv(FAULT_ENV, text)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        faults.reset()

    faults.reset()
    yield arm
    monkeypatch.delenv(FAULT_ENV, raising=False)
    faults.reset()


@pytest.mark.parametrize("text, expected", [
    ("kill:after_checkpoint=2:rank=1:round=0", Fault("kill", "after_checkpoint", 2, rank=1, round=0)),
    ("raise:rank=1:step=3", Fault("raise", "step", 3, rank=1)),  # fields in any order
    (" kill:mid_save=1 ", Fault("kill", "mid_save", 1)),
    ("raise:step=3:rank=1:others=wait", Fault("raise", "step", 3, rank=1, others_wait=True)),
    ("kill:round=2:eval=10", Fault("kill", "eval", 10, round=2)),
])
def test_the_syntax(text, expected):
    assert parse(text) == expected
    assert parse(str(expected)) == expected  # str() writes it back in the same syntax


@pytest.mark.parametrize("text, why", [
    ("kil:step=1", "unknown action 'kil'"),
    ("step=1", "unknown action 'step=1'"),
    ("kill", "give exactly one point"),
    ("kill:rank=1", "give exactly one point"),
    ("kill:step=1:eval=2", "give exactly one point, not 2 (step, eval)"),
    ("kill:steps=1", "unknown field 'steps'"),
    ("kill:step", "step needs a whole number, as step=1"),
    ("kill:step=", "step needs a whole number"),
    ("kill:step=x", "step needs a whole number"),
    ("kill:step=-1", "step needs a whole number"),
    ("kill:step=1.5", "step needs a whole number"),
    ("kill:step=²", "step needs a whole number"),
    ("kill:step= 1", "step needs a whole number"),
    ("kill:step=0", "step counts from 1"),
    ("kill:step=1:rank=-1", "rank needs a whole number"),
    ("kill:step=1:step=2", "step is given twice"),
    ("kill:step=1:others=wait", "others=wait needs rank=R"),
    ("kill:step=1:rank=1:others=go", "others=go is no choice"),
    ("kill:step=1::rank=1", "unknown field ''"),
])
def test_a_malformed_value_is_refused_with_the_syntax(text, why):
    with pytest.raises(ValueError, match="the syntax is ACTION:POINT=N") as error:
        parse(text)
    assert why in str(error.value) and f"{FAULT_ENV}={text!r}" in str(error.value)


def test_unset_or_empty_arms_nothing_and_leaves_the_world_alone(fault, monkeypatch):
    assert faults.armed() is None
    world = World()
    assert faults.watch(world) is world and type(current_world()) is World
    faults.reached("mid_save")  # nothing happens
    fault("  ")
    assert faults.armed() is None


def test_the_variable_is_read_once(fault, monkeypatch):
    fault("raise:mid_save=1")
    assert faults.armed() == Fault("raise", "mid_save", 1)
    monkeypatch.setenv(FAULT_ENV, "kill:start=1")
    assert faults.armed() == Fault("raise", "mid_save", 1)  # until reset()


def test_a_malformed_variable_fails_at_the_first_point_reached(fault):
    fault("kill:stpe=3")
    with pytest.raises(ValueError, match=rf"{FAULT_ENV}='kill:stpe=3': unknown field 'stpe'"):
        faults.reached("step")


def test_it_strikes_at_its_count_of_its_point_only(fault):
    fault("raise:mid_csv=2")
    faults.reached("mid_save")  # another point: not counted
    faults.reached("mid_csv")  # the first
    with pytest.raises(InjectedFault,
                       match=rf"fault injected by {FAULT_ENV}=raise:mid_csv=2 \(occurrence 2 of mid_csv"):
        faults.reached("mid_csv")
    faults.reached("mid_csv")  # the third: past it


@pytest.mark.parametrize("text, env, strikes", [
    ("raise:start=1:rank=1", {}, False),  # outside torchrun this is rank 0
    ("raise:start=1:rank=1", {"RANK": "0"}, False),
    ("raise:start=1:rank=1", {"RANK": "1"}, True),
    ("raise:start=1", {"RANK": "3"}, True),
    ("raise:start=1:round=0", {}, True),
    ("raise:start=1:round=0", {"TORCHELASTIC_RESTART_COUNT": "0"}, True),
    ("raise:start=1:round=0", {"TORCHELASTIC_RESTART_COUNT": "1"}, False),  # torchrun's first restart
    ("raise:start=1:rank=1:round=1", {"RANK": "1", "TORCHELASTIC_RESTART_COUNT": "1"}, True),
])
def test_it_strikes_on_its_rank_in_its_round_only(fault, text, env, strikes):
    fault(text, **env)
    if strikes:
        with pytest.raises(InjectedFault):
            faults.reached("start")
    else:
        faults.reached("start")


@pytest.mark.parametrize("env, waits", [({"RANK": "0"}, True), ({"RANK": "2"}, True),
                                        ({"RANK": "0", "TORCHELASTIC_RESTART_COUNT": "1"}, False)])
def test_the_other_ranks_wait_where_asked(fault, monkeypatch, env, waits):
    """`others=wait`: a rank that is not the one to fail stops at the point for good (torchrun ends it),
    in the fault's round only; without it, that rank goes on."""
    class Waiting(Exception):
        pass

    monkeypatch.setattr(faults, "_wait_to_be_ended", lambda: (_ for _ in ()).throw(Waiting()))
    fault("raise:start=1:rank=1:round=0:others=wait", **env)
    if waits:
        with pytest.raises(Waiting):
            faults.reached("start")
    else:
        faults.reached("start")
    fault("raise:start=1:rank=1:round=0", **env)
    faults.reached("start")  # goes on


def test_kill_is_sigkill_of_the_process_itself(tmp_path):
    script = "from transformer_course import faults\nfaults.reached('after_grade')\nprint('survived')\n"
    env = {**os.environ, FAULT_ENV: "kill:after_grade=1"}
    child = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert child.returncode == -9 and child.stdout == ""


def test_a_raise_mid_save_cuts_nothing_it_keeps_the_old_file(fault, tmp_path):
    path = atomic_save({"a": 1}, tmp_path / "f.pt")
    before = path.read_bytes()
    fault("raise:mid_save=1")
    with pytest.raises(OSError, match="could not write .*fault injected") as error:
        atomic_save({"a": 2}, path)
    assert isinstance(error.value.__cause__, InjectedFault)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["f.pt"]  # temporary file removed


def test_partial_cuts_the_file_being_written_to_half(fault, tmp_path):
    fault("raise:mid_csv=1")
    with open(tmp_path / "out.tmp", "w") as handle:
        handle.write("x" * 1001)  # still in the buffer: flushed first
        with pytest.raises(InjectedFault):
            faults.reached("mid_csv", partial=handle)
    assert (tmp_path / "out.tmp").read_text() == "x" * 500


def _tiny_run(tmp_path, **changes):
    """A 1-layer model trained in this process for 4 steps, evaluated and checkpointed after every step."""
    sys.path.insert(0, os.path.dirname(__file__))
    import ddp_worker

    from transformer_course.parallel import train  # what the train command runs

    return train(ddp_worker.model(0.0), ddp_worker.TRAIN, ddp_worker.VAL,
                 ddp_worker.config(max_iters=4, eval_interval=1, eval_iters=2, **changes),
                 checkpoint_path=tmp_path / "c.pt")


@pytest.mark.parametrize("text, saved", [
    ("raise:step=3", 2),  # the 3rd step is step 2: checkpoints at 0, 1 and 2 are written, not 3
    ("raise:eval=3", 1),  # the 3rd evaluation (step 2) fails before its checkpoint
    ("raise:after_checkpoint=3", 2),  # after the 3rd evaluation's checkpoint (step 2)
])
def test_steps_and_evaluations_are_counted_as_train_makes_them(fault, tmp_path, text, saved):
    """The World that `parallel.train` asks counts its steps and evaluations: the fault strikes at the one
    named."""
    fault(text)
    assert type(current_world()) is not World and current_world().rank == 0 and current_world().size == 1
    with pytest.raises(InjectedFault):
        _tiny_run(tmp_path)
    assert load_checkpoint(tmp_path / "c.pt").step == saved


def test_a_watched_world_trains_exactly_as_the_plain_one(fault, tmp_path):
    plain = _tiny_run(tmp_path).to_dict()
    fault("raise:step=100")  # armed but never reached
    watched = _tiny_run(tmp_path).to_dict()
    for key in ("step", "loss", "eval_step", "train_loss", "val_loss"):
        assert plain[key] == watched[key], key
