"""Student edition and grading: no solution leaks, stubs run, checks say "not done", grades add up."""

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from transformer_course.classroom import (
    BEGIN,
    END,
    format_table,
    grade_notebooks,
    is_exercise_cell,
    solution_lines,
    solution_regions,
    stub_solutions,
    write_csv,
    write_student_edition,
)

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
EXERCISE_CHAPTERS = [p for p in CHAPTERS if any(is_exercise_cell(c) for c in nbformat.read(p, 4).cells)]

CELL = '''import torch


def my_mask(T: int):
    """Bool [T, T]."""
    ### BEGIN SOLUTION
    ones = torch.ones(T, T)
    return ones.bool().tril()
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
    assert BEGIN not in out and END not in out and "tril" not in out and "42" not in out
    assert '    """Bool [T, T]."""\n    raise NotImplementedError(\'Exercise 3.2: write my_mask' in out
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
    result = subprocess.run(
        [sys.executable, "-m", "transformer_course", "student-edition", str(out)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
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


def test_instructor_notebooks_grade_all_passed():
    """Stored outputs (which nbval proves are what the code produces) show every exercise passed."""
    grades = grade_notebooks(EXERCISE_CHAPTERS, execute=False)
    for grade in grades:
        assert grade.exercises and set(grade.exercises.values()) == {"passed"}, format_table([grade])


@pytest.mark.slow
@pytest.mark.parametrize("name", [p.name for p in CHAPTERS])
def test_student_edition_runs_and_every_exercise_is_not_done(student_dir, name):
    """Each student notebook runs top to bottom; every check there reports "not done"."""
    (grade,) = grade_notebooks([student_dir / name], timeout=900)  # runs in student/chapters/
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
