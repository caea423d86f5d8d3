"""Student edition and grading: no solution leaks, stubs run, checks say "not done", grades add up."""

import json
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from transformer_course import cli
from transformer_course.classroom.edition import (
    solution_lines,
    stub_solutions,
    student_notebook,
    write_student_edition,
)
from transformer_course.classroom.exercise_cells import (
    BEGIN,
    END,
    KINDS,
    exercise_kinds,
    is_exercise_cell,
    solution_regions,
)
from transformer_course.classroom.grading import format_table, grade_notebooks, write_csv
from transformer_course.classroom.leak_check import find_leaks
from transformer_course.classroom.sandbox import sandbox_problem

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
EXERCISE_CHAPTERS = [p for p in CHAPTERS if any(is_exercise_cell(c) for c in nbformat.read(p, 4).cells)]

CELL = '''import itertools


def my_mask(T: int):
    """Bool [T, T], as nested lists."""
    ### BEGIN SOLUTION
    pairs = itertools.product(range(T), repeat=2)
    return [[j <= i for j in range(T)] for i in range(T)] if pairs else None
    ### END SOLUTION


class Thing:
    def go(self):
        """Do it."""
        ### BEGIN SOLUTION
        return 42
        ### END SOLUTION

check(my_mask)'''


def test_stub_keeps_signature_docstring_and_indentation():
    out = stub_solutions(CELL, "Exercise 3.2")
    assert BEGIN not in out and END not in out and "product" not in out and "42" not in out
    assert '    """Bool [T, T], as nested lists."""\n    raise NotImplementedError(\'Exercise 3.2: write my_mask' in out
    assert '        """Do it."""\n        raise NotImplementedError(\'Exercise 3.2: write go' in out
    namespace = {}
    exec(out.replace("check(my_mask)", ""), namespace)
    with pytest.raises(NotImplementedError, match="Exercise 3.2: write my_mask"):
        namespace["my_mask"](3)


def test_unbalanced_markers_are_reported():
    with pytest.raises(ValueError, match="never closed"):
        solution_regions(f"x\n{BEGIN}\ny")
    with pytest.raises(ValueError, match="without a matching"):
        solution_regions(f"{END}\n")
    with pytest.raises(ValueError, match="inside another"):
        solution_regions(f"{BEGIN}\n{BEGIN}\n{END}\n{END}")


def test_every_chapter_with_exercises_has_balanced_markers():
    assert EXERCISE_CHAPTERS, "no chapter has exercises"
    for path in CHAPTERS:
        for cell in nbformat.read(path, 4).cells:
            if cell.cell_type == "code":
                solution_regions(cell.source)  # raises when unbalanced


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("student")
    write_student_edition(out)
    return out / "chapters"


def test_student_edition_leaks_no_solution_line(student_dir):
    assert sorted(p.name for p in student_dir.glob("*.ipynb")) == [p.name for p in CHAPTERS]
    for path in CHAPTERS:
        secret = solution_lines(nbformat.read(path, 4))
        student_text = (student_dir / path.name).read_text()
        student_lines = set()
        for cell in json.loads(student_text)["cells"]:
            student_lines |= {line.strip() for line in "".join(cell["source"]).split("\n")}
            for out in cell.get("outputs", []):
                student_lines |= {line.strip() for line in json.dumps(out).split("\\n")}
        leaked = secret & student_lines
        assert not leaked, f"{path.name} leaks solution lines: {sorted(leaked)[:5]}"
        assert BEGIN not in student_text and END not in student_text


def test_student_exercise_cells_are_stubbed_and_cleared(student_dir):
    for path in EXERCISE_CHAPTERS:
        nb = nbformat.read(student_dir / path.name, 4)
        exercises = [c for c in nb.cells if is_exercise_cell(c)]
        assert exercises
        for cell in exercises:
            assert "raise NotImplementedError(" in cell.source and cell.outputs == []
        verdicts = [c for c in nb.cells if c.cell_type == "code" and "✅ Exercise" in json.dumps(c.get("outputs", []),
                                                                                              ensure_ascii=False)]
        assert not verdicts, f"{path.name}: a stored 'passed' verdict is left in the student edition"


def test_instructor_notebooks_grade_all_passed():
    """Stored outputs (which nbval proves are what the code produces) show every exercise passed."""
    grades = grade_notebooks(EXERCISE_CHAPTERS, execute=False)
    for grade in grades:
        assert grade.exercises and set(grade.exercises.values()) == {"passed"}, format_table([grade])


@pytest.mark.system
@pytest.mark.parametrize("name", ["03_single_head_attention.ipynb"])
def test_student_edition_runs_and_every_exercise_is_not_done(student_dir, name):
    """A student notebook runs top to bottom through the grader and its sandbox; every check there
    reports "not done". Every chapter's student edition runs under strict nbval (`make test-student`,
    tools/student_nbval.py); this one goes through the grader, end to end."""
    (grade,) = grade_notebooks([student_dir / name],  # in student/chapters/
                               timeout=1800, sandbox=not sandbox_problem())
    assert not grade.error, format_table([grade])
    instructor = nbformat.read(ROOT / "chapters" / name, 4)
    assert len(grade.exercises) == sum(is_exercise_cell(c) for c in instructor.cells), format_table([grade])
    assert set(grade.exercises.values()) <= {"not done"}, format_table([grade])


def test_grade_csv(tmp_path):
    grades = grade_notebooks(EXERCISE_CHAPTERS, execute=False)
    write_csv(grades, tmp_path / "class.csv")
    rows = (tmp_path / "class.csv").read_text().splitlines()
    assert rows[0] == "notebook,exercise,status,notebook_error"
    assert len(rows) == 1 + sum(len(g.exercises) for g in grades)
    assert all(row.split(",")[2] == "passed" for row in rows[1:])


def test_student_edition_refuses_to_overwrite_the_chapters(tmp_path):
    with pytest.raises(ValueError, match="another directory"):
        write_student_edition(ROOT)  # would write into chapters/ itself
    with pytest.raises(FileNotFoundError, match="no chapter notebooks"):
        write_student_edition(tmp_path / "out", chapters_dir=tmp_path)


def _nb(*sources):
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])


EXERCISE = '''#| export
# Your turn - Exercise 3.3 (★★☆, build): attention.
def attention(q, k, v):
    """out [T, d_v]."""
    ### BEGIN SOLUTION
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores, dim=-1)
    return weights @ v
    ### END SOLUTION'''


def test_find_leaks_sees_a_renamed_reformatted_copy():
    """A planted leak: the same computation with other names and layout in a later demo cell."""
    leak = ("import math\nimport torch\ns = (a @ b.transpose(-2, -1)\n     / math.sqrt(a.shape[-1]))\n"
            "w = torch.softmax(s, dim=-1)\nout = w @ c")
    instructor = _nb("import math\nimport torch", EXERCISE, leak)
    leaks = find_leaks(instructor, student_notebook(instructor))
    assert leaks == ["Exercise 3.3 (solution region at cell 1) is reproduced in student cell 2",
                     "Exercise 3.3: 2 of its solution's 3 statements are in student cells 2"]  # (statement_leaks)
    near = leak.replace("dim=-1)", "dim=-1).float()")  # a near copy
    assert find_leaks(_nb("import math\nimport torch", EXERCISE, near), student_notebook(_nb(EXERCISE, near)))
    unrelated = "import torch\nx = torch.randn(3, 4)\nprint(x.mean())"
    assert find_leaks(_nb(EXERCISE, unrelated), student_notebook(_nb(EXERCISE, unrelated))) == []


def test_a_debug_exercise_may_show_the_bug_but_not_the_fix():
    debug = EXERCISE.replace("build", "debug").replace("#| export\n", "")
    buggy = ("def attention_with_a_bug(q, k, v):\n    scores = q @ k.transpose(-2, -1)\n"
             "    weights = torch.softmax(scores, dim=-1)\n    return weights @ v")
    nb = _nb("import math\nimport torch", debug, buggy)
    assert find_leaks(nb, student_notebook(nb)) == []
    fixed = buggy.replace("k.transpose(-2, -1)", "k.transpose(-2, -1) / math.sqrt(q.shape[-1])")
    nb = _nb("import math\nimport torch", debug, fixed)
    assert find_leaks(nb, student_notebook(nb))


@pytest.mark.system
@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_chapter_gives_an_answer_away(student_dir, path):
    leaks = find_leaks(nbformat.read(path, 4), nbformat.read(student_dir / path.name, 4))
    assert not leaks, f"{path.name}: {leaks}"


@pytest.mark.parametrize("path", [p for p in EXERCISE_CHAPTERS if p.stem != "00_welcome"], ids=lambda p: p.stem)
def test_every_chapter_has_each_kind_of_exercise(path):
    """Build, predict, debug and extend in every chapter after the welcome (which only shows how checks work)."""
    nb = nbformat.read(path, 4)
    kinds = exercise_kinds(nb)
    assert len(kinds) == sum(is_exercise_cell(c) for c in nb.cells), "every exercise names its stars and kind"
    assert {k for _, k in kinds.values()} >= set(KINDS), f"{path.name}: {sorted(kinds.items())}"


# The student-edition command runs in this process (cli.main, what `python -m transformer_course` calls, its
# return value the exit status): test_packaging proves the module and console script reach cli.main.
@pytest.mark.system
def test_student_edition_command_fails_on_a_leak(tmp_path, capsys):
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    copy = "import math\nimport torch\nscores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n" \
        "w = torch.softmax(scores, dim=-1)\nprint(w @ v)"
    nbformat.write(_nb("import math\nimport torch", EXERCISE), chapters / "03_a.ipynb")
    run = ["student-edition", str(tmp_path / "out"), "--chapters", str(chapters)]
    assert cli.main(run) == 0, capsys.readouterr().err
    closing = capsys.readouterr().out.splitlines()[-1]  # how to open it, and where JupyterLab comes from
    assert f"jupyter lab --notebook-dir={tmp_path / 'out' / 'chapters'}" in closing, closing
    assert "`lab` extra" in closing and 'pip install -e ".[lab]"' in closing, closing
    nbformat.write(_nb("import math\nimport torch", EXERCISE, copy), chapters / "03_a.ipynb")
    assert cli.main(run) == 1 and "03_a.ipynb: Exercise 3.3" in capsys.readouterr().err


def _edition(tmp_path):
    chapters = tmp_path / "course" / "chapters"
    chapters.mkdir(parents=True)
    nbformat.write(_nb("import math\nimport torch", EXERCISE), chapters / "03_a.ipynb")
    nbformat.write(_nb("print(1)"), chapters / "04_b.ipynb")
    return chapters, tmp_path / "student"


@pytest.mark.system
def test_student_edition_never_overwrites_a_learners_edits(tmp_path, capsys):
    chapters, out = _edition(tmp_path)
    written = write_student_edition(out, chapters)
    assert json.loads((written[0]).read_text())["metadata"]["transformer_course"] == {"chapter": "03_a"}
    assert write_student_edition(out, chapters) == written  # unchanged files: written again, silently
    edited = out / "chapters" / "03_a.ipynb"
    edited.write_text(edited.read_text().replace("raise NotImplementedError", "return 42  #"))
    mine = edited.read_text()
    with pytest.raises(FileExistsError,
                       match=r"(?s)changed since the student edition wrote them.*03_a\.ipynb.*--force"):
        write_student_edition(out, chapters)
    assert edited.read_text() == mine
    run = ["student-edition", str(out), "--chapters", str(chapters)]
    capsys.readouterr()
    assert cli.main(run) == 2 and "03_a.ipynb" in capsys.readouterr().err and edited.read_text() == mine
    assert cli.main([*run, "--force"]) == 0 and edited.read_text() != mine


@pytest.mark.system
def test_removing_the_edition_keeps_submissions_and_edited_notebooks(tmp_path, capsys):
    chapters, out = _edition(tmp_path)
    write_student_edition(out, chapters)
    (out / "submissions").mkdir()
    (out / "submissions" / "alice_03_a.ipynb").write_text("{}")
    edited = out / "chapters" / "04_b.ipynb"
    edited.write_text(edited.read_text().replace("print(1)", "print(2)"))
    capsys.readouterr()
    assert cli.main(["student-edition", str(out), "--remove"]) == 0
    printed = capsys.readouterr().out
    assert "removed 1 files" in printed and "kept 2 files" in printed and "submissions" in printed
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.ipynb")) == ["chapters/04_b.ipynb",
                                                                                   "submissions/alice_03_a.ipynb"]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_clean_keeps_student_work():
    recipe = subprocess.run(["make", "-n", "clean"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "student-edition student --remove" in recipe
    assert not [line for line in recipe.splitlines() if line.startswith("rm") and "student" in line], recipe


def test_a_folder_named_through_a_link_is_followed_and_links_inside_it_stay_refused(tmp_path):
    from transformer_course.classroom.grading import expand_notebooks, read_hand_in

    folder = tmp_path / "hand-ins"
    folder.mkdir()
    (folder / "a.ipynb").write_text("{}")
    (folder / "b.ipynb").symlink_to(folder / "a.ipynb")
    (tmp_path / "linked").symlink_to(folder, target_is_directory=True)
    found = expand_notebooks([str(tmp_path / "linked") + "/"])
    assert [p.name for p in found] == ["a.ipynb", "b.ipynb"]
    assert read_hand_in(found[0])[1] == "" and "symbolic link" in read_hand_in(found[1])[1]
