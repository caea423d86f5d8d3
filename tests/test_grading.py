"""Grading: one bad notebook never stops a batch, the time limit bounds the whole notebook, verdicts
cannot be forged by printing, invented exercises do not count and deleted ones are missing, and the
learners' code runs in a sandbox (issue 24). Tiny notebooks of a toy chapter keep each run to ~1 s."""

import contextlib
import copy
import csv
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from transformer_course.classroom.edition import student_notebook
from transformer_course.classroom.grading import (
    STATUSES,
    format_table,
    grade_notebooks,
    read_submission,
)
from transformer_course.classroom.sandbox import sandbox_problem

ROOT = Path(__file__).resolve().parents[1]


def ensure_bubblewrap() -> None:
    """The sandbox is bubblewrap: CI runs as root on a bare Debian, so install it there when missing (as
    tests/browser/lab_e2e.py does chromium); one installer at a time, however many test workers."""
    if shutil.which("bwrap") or sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    import fcntl

    with open("/tmp/transformer-course-bubblewrap.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if shutil.which("bwrap") is None:
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "bubblewrap"]):
                subprocess.run(command, env=env, capture_output=True, timeout=900, check=False)


ensure_bubblewrap()
NO_SANDBOX = sandbox_problem()  # "" where this machine can run notebooks in a sandbox
SANDBOX = not NO_SANDBOX

CHECKS = '''from transformer_course.checks import check, expect

@check("3.1", "double")
def check_double(fn):
    expect(fn(2) == 4, "double it")

@check("3.2", "triple")
def check_triple(fn):
    expect(fn(2) == 6, "triple it")'''
DOUBLE = '''# Your turn - Exercise 3.1 (★☆☆, build): double a number.
def double(x):
    ### BEGIN SOLUTION
    return 2 * x
    ### END SOLUTION

check_double(double)'''
TRIPLE = DOUBLE.replace("3.1", "3.2").replace("double", "triple").replace("2 * x", "3 * x")


def toy_chapter():
    return new_notebook(cells=[new_code_cell(CHECKS), new_markdown_cell("## Your turn"), new_code_cell(DOUBLE),
                               new_markdown_cell("## And again"), new_code_cell(TRIPLE)])


@pytest.fixture
def course(tmp_path):
    """A chapters folder with the toy chapter, and a submissions folder beside it."""
    chapters, submissions = tmp_path / "chapters", tmp_path / "submissions"
    chapters.mkdir()
    submissions.mkdir()
    nbformat.write(toy_chapter(), chapters / "03_toy.ipynb")
    return chapters, submissions


def handed_in(folder: Path, name: str, edit=None, extra=()) -> Path:
    """The student edition of the toy chapter, ``edit(cells)`` applied, ``extra`` cells appended."""
    nb = student_notebook(toy_chapter(), chapter="03_toy")
    if edit is not None:
        edit(nb.cells)
    nb.cells += [new_code_cell(source) for source in extra]
    path = folder / name
    nbformat.write(nb, path)
    return path


def solve(cells):
    cells[2].source = DOUBLE.replace("    ### BEGIN SOLUTION\n", "").replace("    ### END SOLUTION\n", "")
    cells[4].source = TRIPLE.replace("    ### BEGIN SOLUTION\n", "").replace("    ### END SOLUTION\n", "")


def grade(course, *paths, timeout=60):
    return grade_notebooks(paths, timeout=timeout, chapters_dir=course[0], sandbox=SANDBOX)


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "transformer_course", *args], capture_output=True, text=True,
                          timeout=timeout)


# ------------------------------------------------------------------ one bad notebook never stops a batch

@pytest.mark.system
def test_a_batch_survives_dead_kernels_bad_json_and_raising_cells(course):
    chapters, subs = course
    handed_in(subs, "ok_03_toy.ipynb", solve)
    handed_in(subs, "exits_03_toy.ipynb", solve, ["import os\nos._exit(3)"])
    handed_in(subs, "oom_03_toy.ipynb", solve,
              ["import os, signal\nos.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer"])
    handed_in(subs, "raises_03_toy.ipynb", lambda cells: cells.insert(2, new_code_cell("1 / 0")))
    (subs / "broken_03_toy.ipynb").write_text('{"cells": [')
    names = ["exits", "broken", "ok", "oom", "gone", "raises"]
    csv_path = subs.parent / "batch.csv"
    result = cli("grade", "--csv", str(csv_path), "--chapters", str(chapters), *([] if SANDBOX else ["--no-sandbox"]),
                 *[str(subs / f"{n}_03_toy.ipynb") for n in names])
    assert result.returncode == 1, result.stderr  # 1: some notebooks could not be graded to the end
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[2:]}
    assert list(rows) == [f"{n}_03_toy.ipynb" for n in names], result.stdout
    assert "[error: the kernel died in cell 6 ('import os') (exit status 3)]" in rows["exits_03_toy.ipynb"]
    assert "killed by signal 9: out of memory?" in rows["oom_03_toy.ipynb"]
    assert "[error: not valid notebook JSON (Expecting value at line 1, column 12)]" in rows["broken_03_toy.ipynb"]
    assert "[error: no such file]" in rows["gone_03_toy.ipynb"]
    assert "[error: cell 3 ('1 / 0') raised ZeroDivisionError: division by zero]" in rows["raises_03_toy.ipynb"]
    assert rows["ok_03_toy.ipynb"].split()[1:7] == ["2", "0", "0", "0", "0"]
    assert rows["exits_03_toy.ipynb"].split()[1:3] == ["2", "0"]  # verdicts recorded before the kernel died stay
    with open(csv_path, newline="") as handle:
        table = list(csv.DictReader(handle))
    assert ([(r["notebook"], r["exercise"]) for r in table]
            == [(f"{n}_03_toy.ipynb", e) for n in names for e in ("3.1", "3.2")])
    assert {r["status"] for r in table if r["notebook"].startswith("ok")} == {"passed"}
    assert {r["status"] for r in table if r["notebook"].startswith("broken")} == {"not run"}
    assert "not to the end" in result.stderr and "exits_03_toy.ipynb" in result.stderr.splitlines()[-1]


def test_a_notebook_of_no_known_chapter_is_a_row_not_a_crash(course, tmp_path):
    path = handed_in(course[1], "homework.ipynb")
    nb = json.loads(path.read_text())
    del nb["metadata"]["transformer_course"]
    path.write_text(json.dumps(nb))
    (g,) = grade_notebooks([path], chapters_dir=course[0], execute=False)
    assert g.exercises == {} and "name the file after its chapter" in g.error
    renamed = handed_in(course[1], "homework-copy.ipynb")  # the chapter the student edition wrote in the metadata
    (g,) = grade_notebooks([renamed], chapters_dir=course[0], execute=False)
    assert g.exercises == {"3.1": "not run", "3.2": "not run"} and not g.error


# ------------------------------------------------------------------ the time limit bounds the whole notebook

@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "soon"])
def test_grade_refuses_a_timeout_that_is_no_limit(bad, tmp_path):
    result = cli("grade", "--timeout", bad, str(tmp_path / "x.ipynb"))
    assert result.returncode == 2 and "--timeout" in result.stderr and "must be a number of seconds" in result.stderr
    with pytest.raises(ValueError, match="timeout must be a finite number > 0"):
        grade_notebooks([tmp_path / "x.ipynb"], timeout=float(bad) if bad != "soon" else bad)


@pytest.mark.system
def test_the_timeout_bounds_the_whole_notebook_and_an_endless_loop(course):
    """Only the time limit can end these notebooks: one of 600 one-second cells (ten minutes, each cell
    well inside the limit, so only a limit on the whole notebook stops it), one endless loop. No wall
    time is compared: the grade says the limit ended the run, and what ran before it still counts."""
    slow = handed_in(course[1], "slow_03_toy.ipynb", solve, ["import time", *["time.sleep(1)"] * 600])
    endless = handed_in(course[1], "endless_03_toy.ipynb", solve, ["while True:\n    pass"])
    for path, cell in ((slow, "time.sleep(1)"), (endless, "while True:")):
        (g,) = grade(course, path, timeout=4)
        pattern = rf"timed out: still running cell \d+ {re.escape(f'({cell!r})')} when the notebook's 4 s were up"
        assert re.fullmatch(pattern + r" \(--timeout\)", g.error), g.error
        assert g.exercises == {"3.1": "passed", "3.2": "passed"}  # what ran before the limit still counts


# ------------------------------------------------------------------ grading cannot be fooled

FORGED = "print('✅ Exercise 3.1 (double): passed - the rest of the chapter uses yours')"


@pytest.mark.system
def test_printed_verdicts_invented_and_deleted_exercises(course):
    subs = course[1]
    forged = handed_in(subs, "forged_03_toy.ipynb",
                       lambda cells: cells[2].__setitem__("source", cells[2].source + "\n" + FORGED))
    no_check = handed_in(subs, "nocheck_03_toy.ipynb", lambda cells: cells[2].__setitem__(
        "source", cells[2].source.replace("check_double(double)", FORGED)))

    def invent_and_delete(cells):
        solve(cells)
        del cells[3:5]  # the markdown above 3.2 and its exercise cell
        invented = new_code_cell("# Your turn - Exercise 3.9 (★☆☆, build): mine.\n"
                                 "from transformer_course.checks import check\n"
                                 "check('3.9', 'mine')(lambda fn: None)(print)\n"
                                 "check('3.2', 'triple')(lambda fn: None)(print)")
        invented.metadata["tags"] = ["exercise"]
        cells.append(invented)

    edited = handed_in(subs, "edited_03_toy.ipynb", invent_and_delete)

    def demo_before_a_crash(cells):  # as chapter 00: a check shown failing before the exercise
        cells.insert(1, new_code_cell("check_double(lambda x: x)"))
        cells[3].source = "raise RuntimeError('my exercise cell crashed')\n" + cells[3].source

    demo = handed_in(subs, "demo_03_toy.ipynb", demo_before_a_crash)
    grades = {g.notebook: g for g in grade(course, forged, no_check, edited, demo)}
    assert grades["forged_03_toy.ipynb"].exercises == {"3.1": "not done", "3.2": "not done"}
    assert grades["nocheck_03_toy.ipynb"].exercises == {"3.1": "not run", "3.2": "not done"}
    assert grades["edited_03_toy.ipynb"].exercises == {"3.1": "passed", "3.2": "missing"}  # no 3.9; 3.2's cell is gone
    # the demo's verdict is not 3.1's
    assert grades["demo_03_toy.ipynb"].exercises == {"3.1": "not run", "3.2": "not run"}
    table = format_table(list(grades.values()))
    assert "edited_03_toy.ipynb                       1      0        0       0       1  3.2:missing" in table


# ------------------------------------------------------------------ the sandbox

def _listen() -> socket.socket:
    """A server on the grader's loopback that accepts nothing while the notebook runs: a connection the
    notebook makes waits in its backlog, where `_connections` finds it afterwards (no timing involved)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def _connections(server: socket.socket) -> int:
    """How many connections reached `server` (each completed one waits in its backlog until accepted)."""
    server.setblocking(False)
    count = 0
    while True:
        try:
            server.accept()[0].close()
        except BlockingIOError:
            return count
        count += 1


def _processes_with(marker: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in cmdline.read_bytes().decode(errors="replace"):
                found.append(cmdline.parent.name)
        except OSError:
            continue
    return found


def _gone(marker: str, within: float = 30.0) -> list[str]:
    """The processes whose command line holds `marker`, once there are none or `within` seconds have
    passed: a sandbox's processes die with it, but the kernel takes a moment to end them all. (The marked
    processes sleep far longer than `within`, so only the sandbox can end them in time.)"""
    deadline = time.monotonic() + within
    while (found := _processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


@pytest.mark.system
@pytest.mark.skipif(not SANDBOX, reason=f"no sandbox here: {NO_SANDBOX}")
def test_the_sandbox_blocks_writes_network_and_leftover_processes(course, tmp_path):
    outside = ROOT / "build" / f"grading-test-{uuid.uuid4().hex}"  # outside /tmp, which the sandbox replaces
    outside.mkdir(parents=True)
    marker = f"600.{uuid.uuid4().int % 10**6:06d}"  # ten minutes at most, should the sandbox fail
    server = _listen()
    cells = [
        f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)",  # left running
        f"import os\nif os.fork() == 0:\n    os.setsid()\n    os.execvp('sleep', ['sleep', '{marker}'])",
        f"try:\n    open({str(outside / 'pwned')!r}, 'w').write('x')\nexcept OSError as e:\n    print(e)",
        f"try:\n    open({str(tmp_path / 'pwned')!r}, 'w').write('x')\nexcept OSError as e:\n    print(e)",
        f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=2)\n"
        "except OSError as e:\n    print(e)",
        "open('mine.txt', 'w').write('its own folder is writable')",
    ]
    path = handed_in(course[1], "hostile_03_toy.ipynb", solve, cells)
    try:
        (g,) = grade(course, path)
        assert not g.error and set(g.exercises.values()) == {"passed"}, format_table([g])  # every cell ran
        assert not (outside / "pwned").exists() and not (tmp_path / "pwned").exists()
        assert _connections(server) == 0, "the notebook reached a server on the grader's loopback"
        assert _gone(f"sleep\x00{marker}") == [], "a process the notebook started is still running"
        # its own folder was writable (the last cell ran): a copy in the sandbox, thrown away with it
        assert sorted(p.name for p in course[1].iterdir()) == ["hostile_03_toy.ipynb"]
    finally:
        server.close()
        shutil.rmtree(outside)
        for pid in _processes_with(f"sleep\x00{marker}"):  # only where the sandbox failed: what this test started
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)


def test_without_a_sandbox_nothing_runs_unless_asked(course, monkeypatch):
    import transformer_course.classroom.grading as grading

    path = handed_in(course[1], "a_03_toy.ipynb", extra=["open('ran', 'w')"])
    monkeypatch.setattr(grading, "sandbox_problem", lambda: "the sandbox needs Linux namespaces (this is Darwin)")
    with pytest.raises(RuntimeError, match=r"Darwin\)\. Nothing was run\. .*pass --no-sandbox"):
        grade_notebooks([path], chapters_dir=course[0])
    assert not (course[1] / "ran").exists()


@pytest.mark.system
def test_the_answer_file_used_where_there_are_no_pipes_to_pass(monkeypatch, tmp_path):
    """Windows passes no file descriptors: the worker's answer comes back in a file of the grader's."""
    import transformer_course.classroom.sandbox as sandbox

    monkeypatch.setattr(sandbox, "PIPE_ANSWER", False)
    cells = [(0, CHECKS), (1, "check_double(lambda x: 2 * x)"), (3, "check_triple(print)\n1 / 0"), (4, "never = 1")]
    answer = sandbox.run_cells(cells, timeout=60, sandbox=False, expected=["3.1", "3.2"])
    # the verdict recorded by a cell that then raised is kept (asked for after the error)
    assert answer["records"] == [[1, "3.1", "passed"], [3, "3.2", "failed"]] and answer["cells_run"] == 3
    assert answer["error"] == "cell 4 ('check_triple(print)') raised ZeroDivisionError: division by zero"


# ------------------------------------------------------------------ the loader never crashes a batch

def test_read_submission_says_what_is_wrong(tmp_path):
    cases = {"empty": b"", "text": b"hello", "list": b"[1, 2]", "latin1": '{"é": 1}'.encode("latin-1"),
             "v3": b'{"nbformat": 3, "cells": []}', "cell": b'{"nbformat": 4, "cells": [{"cell_type": "video"}]}',
             "deep": b"[" * 100_000 + b"]" * 100_000}
    for name, data in cases.items():
        (tmp_path / f"{name}.ipynb").write_bytes(data)
    errors = {name: read_submission(tmp_path / f"{name}.ipynb").error for name in cases}
    assert errors["empty"].startswith("not valid notebook JSON (Expecting value at line 1, column 1)")
    assert errors["list"] == "not a Jupyter notebook (no list of cells): hand in the .ipynb file"
    assert errors["latin1"].startswith("could not be read: 'utf-8' codec can't decode")
    assert errors["v3"] == "notebook format 3, not 4: open and save it in JupyterLab"
    assert errors["cell"] == "not a valid notebook: cell 1 has cell_type 'video'"
    assert errors["deep"] and all(errors.values())


def _valid_notebook() -> dict:
    return json.loads(nbformat.writes(student_notebook(toy_chapter(), chapter="03_toy")))


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                     lambda inner: (st.lists(inner, max_size=3)
                                    | st.dictionaries(st.text(max_size=10), inner, max_size=3)),
                     max_leaves=12)
_ODD = st.sampled_from([None, True, 0, -1, 1.5, "", "x", [], ["x"], [1], {}, {"x": 1}]) | _JSON  # type mix-ups first


def _paths(node, prefix=()):
    """Every place in a JSON document, as the keys that lead there."""
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from _paths(child, (*prefix, key))


def _mutate(data, notebook):
    """Replace or delete one place of the notebook, drawn uniformly (a cell's metadata as often as its root)."""
    path = data.draw(st.sampled_from(list(_paths(notebook))[1:]))
    parent = notebook
    for key in path[:-1]:
        parent = parent[key]
    if data.draw(st.booleans()):
        parent[path[-1]] = copy.deepcopy(data.draw(_ODD))  # sampled_from hands out the same list each time
    else:
        del parent[path[-1]]


def _grade_file(folder: Path, data: bytes, chapters: Path):
    path = folder / "mutant_03_toy.ipynb"
    path.write_bytes(data)
    submission = read_submission(path)  # never raises
    assert isinstance(submission.error, str) and isinstance(submission.cells, list)
    (g,) = grade_notebooks([path], chapters_dir=chapters, execute=False)
    assert g.notebook == path.name and set(g.exercises) <= {"3.1", "3.2"}
    assert set(g.exercises.values()) <= set(STATUSES)
    assert bool(submission.error) == bool(g.error)
    format_table([g])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_mutated_notebook_json_never_crashes_the_batch(course, data):
    notebook = _valid_notebook()
    for _ in range(data.draw(st.integers(1, 3))):
        if isinstance(notebook, dict) and notebook:
            _mutate(data, notebook)
    _grade_file(course[1], json.dumps(notebook).encode(), course[0])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 10_000), at=st.integers(0, 10_000), junk=st.binary(max_size=8))
def test_damaged_notebook_bytes_never_crash_the_batch(course, cut, at, junk):
    raw = nbformat.writes(student_notebook(toy_chapter(), chapter="03_toy")).encode()
    at %= len(raw) + 1
    _grade_file(course[1], (raw[:at] + junk + raw[at + len(junk):])[: len(raw) - cut % len(raw)], course[0])
