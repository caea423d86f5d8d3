"""The test-only fault injection (tests/fault_injection/course_faults.py): its syntax, its refusals, that a
fault strikes at its point, count, rank and restart round only, that each point is reached where its seam
says, and that a child process started with `environment(fault)` arms it while the package itself knows
nothing of it. (The crash and restart tests that use it: test_training_crash.py, test_grading_crash.py,
test_distributed.py, test_run_safety.py, test_training.py.)"""

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fault_injection import course_faults as faults
from fault_injection.course_faults import FAULT_ENV, SEAMS, Fault, InjectedFault, environment, parse

from transformer_course import cli
from transformer_course.checkpoint import load_checkpoint
from transformer_course.classroom import grading
from transformer_course.parallel import World, current_world
from transformer_course.runtime import atomic_save

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "transformer_course"


@pytest.fixture
def fault(monkeypatch):
    """Arm a fault in this process as a child process started with `environment(fault)` would find it, its
    seams wrapped (undone after the test): ``fault("raise:step=2")``."""
    for name in (FAULT_ENV, "RANK", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, seams in SEAMS.items():
        for owner, attribute, wrapper in seams(importlib.import_module(name)):
            monkeypatch.setattr(owner, attribute, wrapper)

    def arm(text: str, **env: str) -> None:
        monkeypatch.setenv(FAULT_ENV, text)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        faults.reset()

    faults.reset()
    yield arm
    monkeypatch.delenv(FAULT_ENV, raising=False)
    faults.reset()


# ---------------------------------------------------------------- the package knows nothing of it
def _imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at module level or inside a function, absolute names (``from . import
    x`` in transformer_course/cli.py: ``transformer_course.x`` and ``transformer_course``)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(filter(None, [base, node.module]))
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return found


def test_no_module_of_the_package_imports_faults_or_reads_the_variable():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 20 and not (PACKAGE / "faults.py").exists()
    for path in modules:
        imported = _imported_modules(path)
        assert not any({"faults", "course_faults", "fault_injection"} & set(name.split(".")) for name in imported), \
            (path, imported)
        assert FAULT_ENV not in path.read_text(encoding="utf-8"), path
    chapters = sorted((ROOT / "chapter_sources").glob("*.py"))
    assert chapters and not any(FAULT_ENV in p.read_text(encoding="utf-8") or "faults." in p.read_text(encoding="utf-8")
                                for p in chapters)


def test_the_import_finder_resolves_relative_imports():
    path = PACKAGE / "classroom" / "grading.py"
    assert {"transformer_course.arguments", "transformer_course.classroom.sandbox"} <= _imported_modules(path)


def test_every_seam_is_a_function_the_package_has():
    """A seam renamed or removed in the package fails here, not as a kill test that no longer kills."""
    for name, seams in SEAMS.items():
        for owner, attribute, wrapper in seams(importlib.import_module(name)):
            assert callable(getattr(owner, attribute)) and wrapper.__wrapped__ is getattr(owner, attribute)


# ---------------------------------------------------------------- the syntax
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


# ---------------------------------------------------------------- when it strikes
def test_unset_or_empty_arms_nothing(fault):
    assert faults.armed() is None
    faults.reached("mid_save")  # nothing happens
    fault("  ")
    assert faults.armed() is None
    faults.reached("mid_save")


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


def test_partial_cuts_the_file_being_written_to_half(fault, tmp_path):
    fault("raise:mid_csv=1")
    with open(tmp_path / "out.tmp", "w") as handle:
        handle.write("x" * 1001)  # still in the buffer: flushed first
        with pytest.raises(InjectedFault):
            faults.reached("mid_csv", partial=handle)
    assert (tmp_path / "out.tmp").read_text() == "x" * 500


# ---------------------------------------------------------------- each point at its seam
def test_start_is_reached_before_the_train_commands_settings_are_made(fault):
    fault("raise:start=1")
    with pytest.raises(InjectedFault):
        cli._train_config(None, None)  # the original would fail on these: the point came first


def test_a_raise_mid_save_cuts_nothing_it_keeps_the_old_file(fault, tmp_path):
    path = atomic_save({"a": 1}, tmp_path / "f.pt")
    before = path.read_bytes()
    fault("raise:mid_save=1")
    with pytest.raises(OSError, match="could not write .*fault injected") as error:
        atomic_save({"a": 2}, path)
    assert isinstance(error.value.__cause__, InjectedFault)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["f.pt"]  # temporary file removed


def test_a_raise_mid_csv_keeps_the_old_csv(fault, tmp_path):
    path = tmp_path / "class.csv"
    path.write_text("old")
    fault("raise:mid_csv=1")
    with pytest.raises(InjectedFault):
        grading.write_csv([], path)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["class.csv"]


@pytest.mark.parametrize("positional", [False, True])
def test_after_grade_is_reached_once_each_grade_is_reported(fault, tmp_path, positional):
    """The N-th `after_grade` comes after the N-th grade was given to `on_grade` (by keyword or by
    position), or would have been, without one. (Called through the module, as the grade command does:
    a name imported before the seams were wrapped is the original.)"""
    notebooks = [tmp_path / f"{name}_03_toy.ipynb" for name in "abc"]  # absent: a row each, saying so
    reported = []
    fault("raise:after_grade=2")
    with pytest.raises(InjectedFault):
        if positional:
            grading.grade_notebooks(notebooks, 10.0, False, tmp_path, True, reported.append)
        else:
            grading.grade_notebooks(notebooks, execute=False, chapters_dir=tmp_path, on_grade=reported.append)
    assert [g.notebook for g in reported] == ["a_03_toy.ipynb", "b_03_toy.ipynb"]
    fault("raise:after_grade=3")
    with pytest.raises(InjectedFault):
        grading.grade_notebooks(notebooks, execute=False, chapters_dir=tmp_path)  # without on_grade


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
    world = current_world()
    assert type(world) is World and world.rank == 0 and world.size == 1 and World.mean.__wrapped__
    with pytest.raises(InjectedFault):
        _tiny_run(tmp_path)
    assert load_checkpoint(tmp_path / "c.pt").step == saved


def test_a_wrapped_world_trains_exactly_as_the_plain_one(tmp_path, fault, monkeypatch):
    with monkeypatch.context() as plain_world:
        for attribute in ("mean", "sum", "barrier"):  # the originals, for this run only
            plain_world.setattr(World, attribute, getattr(World, attribute).__wrapped__)
        plain = _tiny_run(tmp_path).to_dict()
    fault("raise:step=100")  # armed but never reached
    wrapped = _tiny_run(tmp_path).to_dict()
    for key in ("step", "loss", "eval_step", "train_loss", "val_loss"):
        assert plain[key] == wrapped[key], key


# ---------------------------------------------------------------- child processes
def _child(script: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_environment_puts_the_folder_first_only_with_a_fault(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "kill:start=1")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert FAULT_ENV not in environment() and environment()["PYTHONPATH"] == "/elsewhere"
    armed = environment("kill:mid_csv=1")
    assert armed[FAULT_ENV] == "kill:mid_csv=1"
    assert armed["PYTHONPATH"].split(os.pathsep) == [str(faults.FOLDER), "/elsewhere"]
    assert environment("raise:step=1", {"A": "1"}) == {"A": "1", FAULT_ENV: "raise:step=1",
                                                       "PYTHONPATH": str(faults.FOLDER)}


def test_a_child_with_a_fault_is_killed_mid_csv_with_half_its_file_written(tmp_path):
    """The whole path: sitecustomize arms the child, the hook wraps grading as it is imported, and the
    kill is SIGKILL of the child itself, its temporary file cut to half."""
    script = ("import sys\nfrom transformer_course.classroom.grading import NotebookGrade, write_csv\n"
              "write_csv([NotebookGrade('a' * 400 + '.ipynb', {}, '')], sys.argv[1])\nprint('survived')\n")
    child = _child(script, environment("kill:mid_csv=1"), str(tmp_path / "class.csv"))
    assert child.returncode == -9 and child.stdout == "", child.stderr
    (left,) = tmp_path.iterdir()
    assert left.name.startswith(".class.csv.") and left.name.endswith(".tmp")
    whole = f"notebook,exercise,status,notebook_error\r\n{'a' * 400}.ipynb,,,\r\n"
    assert left.read_bytes() == whole.encode()[: len(whole) // 2]


def test_a_child_without_a_fault_wraps_nothing():
    script = ("import sys\nfrom transformer_course import parallel, runtime\n"
              "print(hasattr(parallel.World.mean, '__wrapped__'), hasattr(runtime._write, '__wrapped__'),\n"
              "      'course_faults' in sys.modules)\n")
    child = _child(script, environment(None) | {"PYTHONPATH": str(faults.FOLDER)})  # the folder, no fault
    assert child.returncode == 0 and child.stdout.split() == ["False", "False", "False"], child.stderr
    armed = _child(script, environment("raise:step=1"))
    assert armed.returncode == 0 and armed.stdout.split() == ["True", "True", "True"], armed.stderr


def test_the_sitecustomize_it_hides_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("print('the other sitecustomize')\n")
    env = environment("raise:step=1")
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    child = _child("print('main')", env)
    assert child.stdout.split("\n")[:2] == ["the other sitecustomize", "main"], child.stderr
