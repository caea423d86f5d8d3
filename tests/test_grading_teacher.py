"""The teacher's side of grading is safe against what learners hand in (issue 39): hand-ins that are not
plain files, file names and errors made of escape bytes, a --csv typed before the glob, a --timeout too
big for the timers, the student edition's manifest rewritten by a learner, and notebooks that forge
their verdicts. Only the last tests start kernels (one batch of two notebooks, graded two at a time)."""

import csv
import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nbformat.v4 import new_code_cell
from test_grading import SANDBOX, course, handed_in, solve  # noqa: F401  (course: a fixture)

from transformer_course import cli
from transformer_course.checks import _core
from transformer_course.checks.welcome import char_frequencies, check_char_frequencies
from transformer_course.classroom.edition import MANIFEST, remove_student_edition, write_student_edition
from transformer_course.classroom.grading import (
    MAX_NOTEBOOK_BYTES,
    STATUSES,
    NotebookGrade,
    format_row,
    format_table,
    grade_notebooks,
    read_hand_in,
    write_csv,
)


def cli_run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "transformer_course", *args], capture_output=True, text=True,
                          timeout=timeout)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------ hand-ins are hostile input

@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and links as hand-ins: POSIX")
def test_only_regular_files_are_read_and_never_through_a_link(course):  # noqa: F811
    """A FIFO (which would hang the batch), a link to /dev/zero (endless), a link to the answer key (graded
    "all passed" when followed), a device, a folder, a file too big: one row each, nothing read. Run in a
    subprocess: were a FIFO opened, the timeout would end the test instead of hanging it."""
    chapters, subs = course
    os.mkfifo(subs / "fifo_03_toy.ipynb")
    (subs / "zero_03_toy.ipynb").symlink_to("/dev/zero")
    (subs / "key_03_toy.ipynb").symlink_to(chapters / "03_toy.ipynb")
    (subs / "folder_03_toy.ipynb").mkdir()
    with open(subs / "huge_03_toy.ipynb", "wb") as huge:
        huge.truncate(MAX_NOTEBOOK_BYTES + 1)  # sparse: no disk used
    names = ["fifo", "zero", "key", "folder", "huge"]
    result = cli_run("grade", "--no-sandbox", "--chapters", str(chapters),  # nothing here is run
                     *[str(subs / f"{n}_03_toy.ipynb") for n in names], "/dev/null", timeout=120)
    assert result.returncode == 1, result.stderr
    rows = result.stdout.splitlines()[2:]
    assert [row.split()[0] for row in rows] == [*(f"{n}_03_toy.ipynb" for n in names), "null"], result.stdout
    why = dict(zip([*names, "null"], rows, strict=True))
    assert "[error: a FIFO, not a notebook file: not read]" in why["fifo"]
    assert "a symbolic link, not a notebook file: not followed" in why["zero"]
    assert "a symbolic link" in why["key"] and why["key"].split()[1:6] == ["0", "0", "0", "2", "0"]  # not run
    assert "[error: a folder, not a notebook file: not read]" in why["folder"]
    assert f"larger than {MAX_NOTEBOOK_BYTES // 2**20} MB: not read" in why["huge"]
    assert "a device or socket, not a notebook file" in why["null"]


@pytest.mark.skipif(not hasattr(os, "O_NOFOLLOW"), reason="O_NOFOLLOW and O_NONBLOCK: POSIX")
def test_a_hand_in_is_read_once_with_a_descriptor_that_neither_follows_nor_blocks(tmp_path, monkeypatch):
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, flags, *a: opened.append(flags) or real_open(path, flags, *a))
    (tmp_path / "a.ipynb").write_bytes(b"{}")
    assert read_hand_in(tmp_path / "a.ipynb") == (b"{}", "")
    assert len(opened) == 1 and opened[0] & os.O_NOFOLLOW and opened[0] & os.O_NONBLOCK


# ------------------------------------------------------------------ learner text reaches the teacher escaped

EVIL = "=HYPERLINK(\"x\")\x1b]0;pwned\x07\x1b[2J\r\nbob_03_toy.ipynb                          2      0  "


def test_learner_text_is_escaped_in_the_table_and_the_csv(tmp_path):
    grade = NotebookGrade(EVIL + "_03_toy.ipynb", {"3.1": "passed", "3.2": "failed"},
                          "cell 2 raised ValueError: \x1b]52;c;Y2xpcGJvYXJk\x07\u202eevil\n-1+2")
    row = format_row(grade)
    assert "\n" not in row and "\r" not in row and "\x1b" not in row and "\x07" not in row and "\u202e" not in row
    assert "\\x1b]0;pwned\\x07" in row and "\\u202e" in row  # shown, not sent
    table = format_table([grade])
    assert len(table.splitlines()) == 3  # header, rule, one row: no forged "2 passed" line
    write_csv([grade, NotebookGrade("@SUM(A1)_03_toy.ipynb", {}, "-2+3")], tmp_path / "class.csv")
    raw = (tmp_path / "class.csv").read_text()
    assert "\x1b" not in raw and "\x07" not in raw and len(raw.splitlines()) == 4  # header + 2 + 1
    rows = list(csv.DictReader(open(tmp_path / "class.csv", newline="")))
    assert [r["notebook"][:2] for r in rows] == ["'=", "'=", "'@"]  # a spreadsheet shows, never runs, them
    assert rows[0]["notebook_error"].startswith("cell 2") and rows[2]["notebook_error"] == "'-2+3"


@pytest.mark.skipif(sys.platform != "linux", reason="file names with newlines and escape bytes: Linux")
def test_a_file_name_with_a_newline_cannot_forge_a_row(course):  # noqa: F811
    chapters, subs = course
    handed_in(subs, EVIL + "_03_toy.ipynb")
    (g,) = grade_notebooks([subs], chapters_dir=chapters, execute=False)  # a folder: its notebooks
    assert g.notebook == EVIL + "_03_toy.ipynb" and set(g.exercises.values()) == {"not run"}
    assert len(format_table([g]).splitlines()) == 3


# ------------------------------------------------------------------ the command's own options

def test_csv_never_overwrites_a_notebook(course):  # noqa: F811
    chapters, subs = course
    a, b = handed_in(subs, "a_03_toy.ipynb"), handed_in(subs, "b_03_toy.ipynb")
    renamed = subs / "carol.csv"  # a hand-in the student edition's metadata names, whatever its name
    renamed.write_bytes(b.read_bytes())
    before = {p: _digest(p) for p in (a, b, renamed)}
    for args, why in [(["--csv", str(a), str(b)], "that is a notebook's name"),  # --csv typed before the glob
                      (["--csv", str(renamed), str(renamed)], "one of the notebooks to grade"),
                      (["--csv", str(subs), str(a)], "a folder")]:
        result = cli_run("grade", "--no-sandbox", "--chapters", str(chapters), *args)
        assert result.returncode == 2 and why in result.stderr, (args, result.stderr)
        assert "notebook " not in result.stdout  # refused before anything ran
    assert {p: _digest(p) for p in before} == before


@pytest.mark.parametrize(("option", "value", "why"), [
    ("--timeout", "2.2e6", "from 1 to 86400"), ("--timeout", "1e308", "from 1 to 86400"),
    ("--timeout", "0.5", "from 1 to 86400"), ("--jobs", "0", "from 1 to 64"), ("--jobs", "two", "whole number")])
def test_timeout_and_jobs_are_bounded_when_parsed(option, value, why, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.build_parser().parse_args(["grade", option, value, str(tmp_path / "a.ipynb")])
    assert stop.value.code == 2 and why in capsys.readouterr().err


def test_a_folder_stands_for_its_notebooks(course):  # noqa: F811
    chapters, subs = course
    for name in ("b_03_toy.ipynb", "a_03_toy.ipynb"):
        handed_in(subs, name)
    (subs / "notes.txt").write_text("not a notebook")
    grades = grade_notebooks([subs], chapters_dir=chapters, execute=False)
    assert [g.notebook for g in grades] == ["a_03_toy.ipynb", "b_03_toy.ipynb"]


# ------------------------------------------------------------------ --remove trusts no manifest entry blindly

def _edition(tmp_path) -> tuple[Path, Path]:
    chapters = tmp_path / "course" / "chapters"
    chapters.mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(cells=[new_code_cell("print(1)")]), chapters / "03_a.ipynb")
    out = tmp_path / "student"
    write_student_edition(out, chapters)
    return chapters, out


def test_remove_deletes_only_its_own_unchanged_files(tmp_path):
    _, out = _edition(tmp_path)
    outside = tmp_path / "teacher.txt"
    outside.write_text("the teacher's")
    (out / "submissions").mkdir()
    bob = out / "submissions" / "bob_03_a.ipynb"
    bob.write_text("bob's work")
    (out / "chapters" / "04_b.ipynb").symlink_to(bob)  # a link named like the edition's file
    manifest = json.loads((out / MANIFEST).read_text())
    manifest.update({str(outside): _digest(outside), "../teacher.txt": _digest(outside),
                     "submissions/bob_03_a.ipynb": _digest(bob), "chapters/04_b.ipynb": _digest(bob),
                     "chapters/../submissions/bob_03_a.ipynb": _digest(bob)})
    (out / MANIFEST).write_text(json.dumps(manifest))  # as a learner could
    removed, kept = remove_student_edition(out)
    assert [p.relative_to(out).as_posix() for p in removed] == ["chapters/03_a.ipynb"]
    assert outside.read_text() == "the teacher's" and bob.read_text() == "bob's work"
    assert (out / "chapters" / "04_b.ipynb").is_symlink()
    assert sorted(p.relative_to(out).as_posix() for p in kept) == ["chapters/04_b.ipynb", "submissions/bob_03_a.ipynb"]


def test_remove_does_not_go_through_a_linked_folder(tmp_path):
    _, out = _edition(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "results").mkdir(parents=True)
    victim = elsewhere / "results" / "x.json"
    victim.write_text("{}")
    (out / "benchmarks").symlink_to(elsewhere)
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["benchmarks/results/x.json"] = _digest(victim)
    (out / MANIFEST).write_text(json.dumps(manifest))
    remove_student_edition(out)
    assert victim.read_text() == "{}"


# ------------------------------------------------------------------ verdicts a notebook cannot forge

FORGERIES = [
    "import transformer_course.checks._core as core\n"
    "core._RESULTS.append(core.CheckOutcome('3.1', 'double', 'passed', 'passed'))",  # the one cell
    "from transformer_course.checks import check\ncheck('3.2', 'triple')(lambda fn: None)(print)",  # a check of its own
    "print('✅ Exercise 3.2 (triple): passed - the rest of the chapter uses yours')",
]


@pytest.mark.system
@pytest.mark.skipif(not SANDBOX, reason="no sandbox here")
def test_a_forging_notebook_gets_no_passed_and_jobs_keep_the_order(course):  # noqa: F811
    chapters, subs = course
    forged = handed_in(subs, "forged_03_toy.ipynb", extra=FORGERIES)  # its exercises left as stubs
    honest = handed_in(subs, "honest_03_toy.ipynb", solve)
    grades = grade_notebooks([forged, honest], timeout=120, chapters_dir=chapters, jobs=2)
    assert [g.notebook for g in grades] == ["forged_03_toy.ipynb", "honest_03_toy.ipynb"]
    assert grades[0].exercises == {"3.1": "not done", "3.2": "failed"}, format_table(grades)  # print fails triple
    assert grades[1].exercises == {"3.1": "passed", "3.2": "passed"} and not grades[1].error


WELCOME_EXERCISE = """# Your turn - Exercise 0.1 (★☆☆, build): count characters.
def char_frequencies(text):
    ### BEGIN SOLUTION
    counts = {}
    for c in text:
        counts[c] = counts.get(c, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
    ### END SOLUTION

check_char_frequencies(char_frequencies)"""


@pytest.mark.system
@pytest.mark.skipif(not SANDBOX, reason="no sandbox here")
def test_the_packages_check_stays_the_genuine_one(tmp_path):
    """A chapter whose checks come from the package: a notebook that drops the import and defines its own
    check for the exercise, or hands in the package's own function, gets no "passed"."""
    from transformer_course.classroom.edition import student_notebook

    chapters, subs = tmp_path / "chapters", tmp_path / "subs"
    chapters.mkdir()
    subs.mkdir()
    key = nbformat.v4.new_notebook(cells=[new_code_cell("from transformer_course.checks.welcome import "
                                                        "check_char_frequencies"), new_code_cell(WELCOME_EXERCISE)])
    nbformat.write(key, chapters / "00_mini.ipynb")

    def hand_in(name, first_cell, answer=None):
        nb = student_notebook(key, chapter="00_mini")
        nb.cells[0].source = first_cell
        if answer is not None:
            heading = WELCOME_EXERCISE.splitlines()[0]
            nb.cells[1].source = f"{heading}\n{answer}\ncheck_char_frequencies(char_frequencies)"
        nbformat.write(nb, subs / name)
        return subs / name

    own_check = hand_in("own_00_mini.ipynb", "from transformer_course.checks import check\n"
                        "check_char_frequencies = check('0.1', 'char_frequencies')(lambda fn: None)")
    reference = hand_in("reference_00_mini.ipynb", key.cells[0].source,
                        "from transformer_course.checks.welcome import char_frequencies")
    solved = hand_in("solved_00_mini.ipynb", key.cells[0].source,
                     WELCOME_EXERCISE.split("\n\ncheck_")[0].split("\n", 1)[1])
    grades = grade_notebooks([own_check, reference, solved], timeout=120, chapters_dir=chapters, jobs=2)
    assert [g.exercises["0.1"] for g in grades] == ["not done", "not done", "passed"], format_table(grades)


def test_regrade_reruns_the_genuine_check_on_the_learners_function(monkeypatch):
    """In-process: the package's check stays the genuine one, its reference is not the learner's answer."""
    monkeypatch.setenv(_core.GRADING_ENV, "1")
    _core.regrade()  # nothing pending from before

    def mine(text):
        return char_frequencies(text)

    fake = _core.check("0.1", "char_frequencies")(lambda fn: None)  # defined by "the notebook"
    check_char_frequencies(char_frequencies, quiet=True)
    check_char_frequencies(mine, quiet=True)
    fake(len, quiet=True)
    _core._RESULTS.append(_core.CheckOutcome("0.1", "char_frequencies", "passed", "passed"))
    assert json.loads(_core.regrade()) == [["0.1", "not done"], ["0.1", "passed"], ["0.1", "failed"]]
    assert _core.regrade() == "[]"


# ------------------------------------------------------------------ hostile notebooks, one row each

_TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
_OUTPUT = st.fixed_dictionaries({"output_type": st.sampled_from(["stream", "error", "display_data", "weird"])},
                                optional={"text": _TEXT, "data": st.dictionaries(_TEXT, _TEXT, max_size=2)})
_CELL = st.fixed_dictionaries({
    "cell_type": st.sampled_from(["code", "markdown", "raw"]),
    "source": st.one_of(_TEXT, st.integers(1, 4).map(lambda n: "# padding\n" * (50_000 * n)),  # huge cells
                        st.sampled_from(["1/0", "import os\nos._exit(7)", "print('\\x1b[2J')", "x = 1"])),
    "metadata": st.sampled_from([{}, {"tags": ["exercise"]}]),
    "outputs": st.lists(_OUTPUT, max_size=2)})
_NOTEBOOK = st.fixed_dictionaries({"cells": st.lists(_CELL, max_size=4), "nbformat": st.sampled_from([4, 4, 3, "4"]),
                                   "nbformat_minor": st.integers(0, 5),
                                   "metadata": st.just({"transformer_course": {"chapter": "03_toy"}})})


@pytest.mark.system
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(notebook=_NOTEBOOK, name=st.text(st.characters(blacklist_characters="/\x00"), min_size=1, max_size=20))
def test_a_hostile_notebook_is_one_row_and_no_crash(course, notebook, name):  # noqa: F811
    chapters, subs = course
    path = subs / f"{name}_03_toy.ipynb"
    try:
        path.write_text(json.dumps(notebook))
    except OSError:  # a name the file system refuses (too long in bytes)
        return
    try:
        (g,) = grade_notebooks([path], timeout=20, chapters_dir=chapters, sandbox=SANDBOX)
    finally:
        path.unlink()
    assert g.notebook == path.name and set(g.exercises) <= {"3.1", "3.2"} and set(g.exercises.values()) <= set(STATUSES)
    assert "passed" not in g.exercises.values()  # nothing here solves an exercise
    row = format_row(g)
    assert "\n" not in row and "\x1b" not in row and not stat.S_ISLNK(os.lstat(subs).st_mode)
