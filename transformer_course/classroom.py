"""Classroom tools: the student edition of the chapters, and grading of student notebooks.

Hand-written support code, used by ``transformer-course student-edition`` and
``transformer-course grade`` (and ``make student``).

An *exercise cell* is a code cell whose source holds a solution region::

    def my_causal_mask(T):
        \"\"\"...\"\"\"
        ### BEGIN SOLUTION
        return torch.ones(T, T, dtype=torch.bool).tril()
        ### END SOLUTION

    check_causal_mask(my_causal_mask)

The student edition replaces each region by ``raise NotImplementedError("Exercise 3.2: ...")`` at the
marker's indentation (signature and docstring stay), clears that cell's stored outputs and tags it
``exercise`` so the grader can find it again. Grading executes notebooks with nbclient and reads the
one-line verdict each check prints (``transformer_course.checks.RESULT_LINE``) from the exercise cells.
"""

from __future__ import annotations

import copy
import csv
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .checks import RESULT_LINE

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
EXERCISE_TAG = "exercise"
_EXERCISE_ID = re.compile(r"Exercise\s+(\d+\.\d+)")
_DEF = re.compile(r"^\s*(?:async\s+)?def\s+(\w+)|^\s*class\s+(\w+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STATUS = {"✅": "passed", "❌": "failed", "⏳": "not done"}
COURSE_CHAPTERS = Path(__file__).resolve().parents[1] / "chapters"


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def is_exercise_cell(cell) -> bool:
    return cell.get("cell_type") == "code" and (
        BEGIN in _source(cell) or EXERCISE_TAG in cell.get("metadata", {}).get("tags", [])
    )


def solution_regions(source: str) -> list[tuple[int, int]]:
    """(begin, end) line indices of every solution region in ``source``; raises on unbalanced markers."""
    regions, start = [], None
    for i, line in enumerate(source.split("\n")):
        if line.strip() == BEGIN:
            if start is not None:
                raise ValueError(f"line {i + 1}: '{BEGIN}' inside another solution region")
            start = i
        elif line.strip() == END:
            if start is None:
                raise ValueError(f"line {i + 1}: '{END}' without a matching '{BEGIN}'")
            regions.append((start, i))
            start = None
    if start is not None:
        raise ValueError(f"line {start + 1}: '{BEGIN}' is never closed by '{END}'")
    return regions


def _exercise_label(cells, index: int) -> str:
    """"Exercise 3.2" from the cell itself or the markdown just above it ("" when unnamed)."""
    for cell in (cells[index], cells[index - 1] if index > 0 else None):
        if cell is not None:
            found = _EXERCISE_ID.search(_source(cell))
            if found:
                return f"Exercise {found.group(1)}"
    return ""


def stub_solutions(source: str, label: str) -> str:
    """Replace every solution region in a cell's source by a ``NotImplementedError`` stub."""
    lines = source.split("\n")
    for begin, end in reversed(solution_regions(source)):
        indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
        name = next(
            (m.group(1) or m.group(2) for line in reversed(lines[:begin]) if (m := _DEF.match(line))), "this exercise"
        )
        what = f"{label}: write {name}" if label else f"write {name}"
        message = f"{what} (remove this line and replace it with your code)"
        lines[begin : end + 1] = [f"{indent}raise NotImplementedError({message!r})"]
    return "\n".join(lines)


def solution_lines(nb) -> set[str]:
    """Non-blank lines that appear only inside solution regions of a notebook (what must not leak)."""
    inside, outside = set(), set()
    for cell in nb.cells:
        lines = _source(cell).split("\n")
        regions = solution_regions(_source(cell)) if cell.cell_type == "code" else []
        covered = {i for b, e in regions for i in range(b + 1, e)}
        for i, line in enumerate(lines):
            if line.strip() in (BEGIN, END) or not line.strip():
                continue
            (inside if i in covered else outside).add(line.strip())
    return inside - outside


def student_notebook(nb):
    """A copy of notebook ``nb`` with every solution stubbed and exercise outputs cleared."""
    out = copy.deepcopy(nb)
    for index, cell in enumerate(out.cells):
        if cell.cell_type != "code" or BEGIN not in _source(cell):
            continue
        cell.source = stub_solutions(_source(cell), _exercise_label(out.cells, index))
        cell.outputs = []
        cell.execution_count = None
        tags = [t for t in cell.metadata.get("tags", []) if t != EXERCISE_TAG]
        cell.metadata["tags"] = tags + [EXERCISE_TAG]
    return out


# files next to the chapters that notebooks read by relative path (e.g. ../benchmarks/results/*.json)
SIDE_FILES = ("benchmarks/results",)


def write_student_edition(out_dir, chapters_dir=None) -> list[Path]:
    """Write the student edition into ``out_dir``: ``chapters/*.ipynb`` plus the files the chapters
    read by relative path (``SIDE_FILES``), laid out as in the course. Returns the notebook paths."""
    import nbformat

    src = Path(chapters_dir) if chapters_dir else COURSE_CHAPTERS
    notebooks = sorted(src.glob("[0-9][0-9]_*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"no chapter notebooks (NN_name.ipynb) found in {src}")
    out = Path(out_dir)
    if src.resolve() in (out.resolve(), (out / "chapters").resolve()):
        raise ValueError("the student edition must go to another directory than the chapters themselves")
    (out / "chapters").mkdir(parents=True, exist_ok=True)
    for side in SIDE_FILES:
        if (src.parent / side).is_dir():
            shutil.copytree(src.parent / side, out / side, dirs_exist_ok=True)
    written = []
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        target = out / "chapters" / path.name
        nbformat.write(student_notebook(nb), target)
        written.append(target)
    return written


@dataclass
class NotebookGrade:
    notebook: str
    exercises: dict[str, str] = field(default_factory=dict)  # "3.2" -> passed | failed | not done | not run
    error: str = ""

    def count(self, status: str) -> int:
        return sum(s == status for s in self.exercises.values())


def _outcomes(cell) -> list[tuple[str, str]]:
    found = []
    for output in cell.get("outputs", []):
        text = output.get("text", "") if output.get("output_type") == "stream" else ""
        for line in ("".join(text) if isinstance(text, list) else text).splitlines():
            match = RESULT_LINE.match(line.strip())
            if match:
                found.append((match["exercise"], _STATUS[match["icon"]]))
    return found


def grade_notebook(nb, name: str = "") -> NotebookGrade:
    """Read the verdicts of an executed notebook's exercise cells (cells never reached: "not run")."""
    grade = NotebookGrade(name)
    for index, cell in enumerate(nb.cells):
        if not is_exercise_cell(cell):
            continue
        outcomes = _outcomes(cell)
        if outcomes:
            for exercise, status in outcomes:
                grade.exercises[exercise] = status
        else:
            label = _exercise_label(nb.cells, index) or f"cell {index}"
            grade.exercises[label.replace("Exercise ", "")] = "not run"
    return grade


def execute_notebook(path, timeout: int = 600):
    """Run a notebook top to bottom in a fresh python3 kernel, in its own folder, without network."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    offline = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "127.0.0.1,localhost"}
    offline.update({k: "http://127.0.0.1:9" for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")})
    saved = {k: os.environ.get(k) for k in offline}
    os.environ.update(offline)  # the kernel inherits this environment
    error = ""
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    except CellExecutionError as exc:
        lines = _ANSI.sub("", str(exc)).strip().splitlines()
        error = lines[-1][:200] if lines else type(exc).__name__
    except TimeoutError as exc:
        error = f"timed out: {exc}"
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return nb, error


def grade_notebooks(paths, timeout: int = 600, execute: bool = True) -> list[NotebookGrade]:
    """Grade each notebook; ``execute=False`` reads the outputs already stored in it."""
    import nbformat

    grades = []
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no such notebook: {path}")
        if execute:
            nb, error = execute_notebook(path, timeout)
        else:
            nb, error = nbformat.read(path, as_version=4), ""
        grade = grade_notebook(nb, path.name)
        grade.error = error
        grades.append(grade)
    return grades


def format_table(grades: list[NotebookGrade]) -> str:
    """A plain-text table: one row per notebook, counts per status, and the exercises not passed."""
    header = f"{'notebook':<36} {'passed':>6} {'failed':>6} {'not done':>8} {'not run':>7}  details"
    rows = [header, "-" * len(header)]
    for g in grades:
        missing = [f"{e}:{s}" for e, s in g.exercises.items() if s != "passed"]
        details = ", ".join(missing) + (f" [error: {g.error}]" if g.error else "")
        rows.append(
            f"{g.notebook:<36} {g.count('passed'):>6} {g.count('failed'):>6} {g.count('not done'):>8} "
            f"{g.count('not run'):>7}  {details}".rstrip()
        )
    return "\n".join(rows)


def write_csv(grades: list[NotebookGrade], path) -> None:
    """One row per (notebook, exercise): notebook, exercise, status, error."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["notebook", "exercise", "status", "notebook_error"])
        for g in grades:
            for exercise, status in g.exercises.items():
                writer.writerow([g.notebook, exercise, status, g.error])


def run_student_edition_command(args) -> int:
    written = write_student_edition(args.out_dir, args.chapters)
    for path in written:
        print(f"wrote {path}")
    print(f"{len(written)} chapters; solutions removed, checks kept. Open them with: jupyter lab {Path(args.out_dir) / 'chapters'}")
    return 0


def run_grade_command(args) -> int:
    grades = grade_notebooks(args.notebooks, timeout=args.timeout)
    print(format_table(grades))
    if args.csv:
        write_csv(grades, args.csv)
        print(f"wrote {args.csv}", file=sys.stderr)
    return 0
