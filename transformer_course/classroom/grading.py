"""Grading handed-in notebooks (hand-written): which exercises passed, failed, are not done, were not
run or are missing.

Used by ``transformer-course grade``. Each notebook is read by a loader that never raises (a file that
is not a notebook becomes a row that says so), matched to its chapter by file name
(``alice_03_single_head_attention.ipynb``) or by the chapter the student edition wrote into its
metadata, and run in a fresh kernel (``sandbox``). A notebook's grade lists exactly the
exercises of the original chapter: an exercise cell that is gone is **missing**, an exercise that a
notebook invents does not count, and a verdict counts only when the check recorded it while running
(printed text proves nothing). One bad notebook never stops a batch: its row carries the error.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import faults
from ..arguments import real_number
from .exercise_cells import (
    COURSE_CHAPTERS,
    cell_source,
    exercise_numbers,
    exercise_positions,
    printed_verdicts,
)
from .sandbox import run_cells, sandbox_problem

MAX_NOTEBOOK_BYTES = 64 * 2**20  # a handed-in notebook larger than this is refused, not read
DEFAULT_TIMEOUT = 1800  # seconds for a whole notebook: chapter 06 trains for about two minutes on a laptop
CELL_TYPES = ("code", "markdown", "raw")
STATUSES = ("passed", "failed", "not done", "not run", "missing")


@dataclass
class Submission:
    """A notebook as the grader reads it: cells as plain dicts (``cell_type``, ``source``, ``metadata``)."""

    cells: list[dict] = field(default_factory=list)
    chapter: str = ""  # the chapter named in the notebook's metadata by the student edition ("" if none)
    error: str = ""  # why the file could not be read ("" when it could)


def _cell(value, index: int) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"cell {index + 1} is not an object")
    kind, source, metadata = value.get("cell_type"), value.get("source", ""), value.get("metadata", {})
    if kind not in CELL_TYPES:
        raise ValueError(f"cell {index + 1} has cell_type {kind!r}")
    if isinstance(source, list) and all(isinstance(line, str) for line in source):
        source = "".join(source)
    if not isinstance(source, str):
        raise ValueError(f"cell {index + 1} has a source that is not text")
    if not isinstance(metadata, dict):
        raise ValueError(f"cell {index + 1} has metadata that is not an object")
    outputs = value.get("outputs")
    return {"cell_type": kind, "source": source, "metadata": metadata,
            "outputs": outputs if isinstance(outputs, list) else []}


def read_submission(path) -> Submission:
    """Read a handed-in notebook; any problem is returned in ``error`` (this never raises)."""
    try:
        path = Path(path)
        if path.stat().st_size > MAX_NOTEBOOK_BYTES:
            return Submission(error=f"larger than {MAX_NOTEBOOK_BYTES // 2**20} MB: not read")
        data = json.loads(path.read_bytes().decode("utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
            return Submission(error="not a Jupyter notebook (no list of cells): hand in the .ipynb file")
        if data.get("nbformat") != 4:
            return Submission(error=f"notebook format {data.get('nbformat')!r}, not 4: open and save it in JupyterLab")
        cells = [_cell(cell, i) for i, cell in enumerate(data["cells"])]
        meta = data.get("metadata")
        course = meta.get("transformer_course") if isinstance(meta, dict) else None
        chapter = course.get("chapter") if isinstance(course, dict) else None
        return Submission(cells, chapter if isinstance(chapter, str) else "")
    except FileNotFoundError:
        return Submission(error="no such file")
    except (OSError, UnicodeDecodeError) as error:
        return Submission(error=f"could not be read: {error}")
    except json.JSONDecodeError as error:
        return Submission(error=f"not valid notebook JSON ({error.msg} at line {error.lineno}, column {error.colno})")
    except (ValueError, RecursionError) as error:
        return Submission(error=f"not a valid notebook: {error}")


def chapter_for(path, chapter: str, chapters_dir) -> Path | None:
    """The course chapter a handed-in notebook belongs to: the one its file name ends with (the longest),
    else the one its metadata names; None when neither matches."""
    chapters = {p.name: p for p in Path(chapters_dir).glob("[0-9][0-9]_*.ipynb")}
    name = Path(path).name
    ends = [p for n, p in chapters.items() if name == n or name.endswith(f"_{n}") or name.endswith(f"-{n}")]
    if ends:
        return max(ends, key=lambda p: len(p.name))
    return chapters.get(f"{chapter}.ipynb") if chapter and "/" not in chapter else None


@dataclass
class NotebookGrade:
    notebook: str
    exercises: dict[str, str] = field(default_factory=dict)  # "3.2" -> one of STATUSES
    error: str = ""  # why the notebook was not graded to its end ("" when it was)

    def count(self, status: str) -> int:
        return sum(s == status for s in self.exercises.values())


def grade_cells(name: str, cells, expected, records, error: str = "") -> NotebookGrade:
    """The grade of one notebook: every ``expected`` exercise (the original chapter's, in order) gets
    "missing" when the notebook has no such exercise cell, else the last verdict its check recorded
    at or after that cell (``records``: [(cell index, exercise, status), ...] in order; a demo before
    the exercise, as in chapter 00, does not count), else "not run"."""
    where = exercise_positions(cells)
    exercises = {}
    for e in expected:
        verdicts = [status for index, exercise, status in records if exercise == e and index >= where.get(e, 0)]
        exercises[e] = "missing" if e not in where else verdicts[-1] if verdicts else "not run"
    return NotebookGrade(name, exercises, error)


def stored_verdicts(cells) -> list[tuple[int, str, str]]:
    """Verdicts printed in stored outputs, by cells that call a check. Only for trusted notebooks (the
    answer key): printed text can be forged, so handed-in notebooks are always run."""
    return [(index, exercise, status) for index, cell in enumerate(cells)
            if cell.get("cell_type") == "code" and "check_" in cell_source(cell)
            for exercise, status in printed_verdicts(cell)]


def grade_one(path, timeout: float, chapters_dir, execute: bool = True, sandbox: bool = True) -> NotebookGrade:
    """Grade one notebook; every problem ends up in the grade's ``error``."""
    path = Path(path)
    submission = read_submission(path)
    chapter = chapter_for(path, submission.chapter, chapters_dir)
    expected: list[str] = []
    if chapter is not None:
        original = read_submission(chapter)
        expected = exercise_numbers(original.cells)
    if submission.error:
        return NotebookGrade(path.name, dict.fromkeys(expected, "not run"), submission.error)
    if chapter is None:
        return NotebookGrade(path.name, {}, f"no chapter of {chapters_dir} matches: name the file after its chapter, "
                                            "e.g. alice_03_single_head_attention.ipynb")
    if not execute:
        return grade_cells(path.name, submission.cells, expected, stored_verdicts(submission.cells))
    code = [(i, c["source"]) for i, c in enumerate(submission.cells)
            if c["cell_type"] == "code" and c["source"].strip()]
    answer = run_cells(code, path.resolve().parent, timeout, sandbox, expected)
    return grade_cells(path.name, submission.cells, expected, answer.get("records", []), answer.get("error", ""))


def check_timeout(timeout) -> float:
    return real_number(timeout, "timeout", low=0, low_open=True,
                       hint="the seconds allowed for a whole notebook, e.g. --timeout 1800 (there is no 'no limit')")


def grade_notebooks(paths, timeout: float = DEFAULT_TIMEOUT, execute: bool = True, chapters_dir=None,
                    sandbox: bool = True, on_grade=None) -> list[NotebookGrade]:
    """Grade each notebook (``execute=False``: read the verdicts stored in trusted notebooks instead).

    ``timeout`` bounds each whole notebook, in seconds. With ``sandbox`` (the default), refuses to run
    anything where no sandbox can be made. ``on_grade(grade)`` is called as each grade is ready."""
    timeout = check_timeout(timeout)
    chapters_dir = Path(chapters_dir) if chapters_dir else COURSE_CHAPTERS
    if execute and sandbox:
        problem = sandbox_problem()
        if problem:
            raise RuntimeError(f"no sandbox for the learners' code on this machine: {problem}. Nothing was run. "
                               "To grade anyway, with their code running as you, pass --no-sandbox")
    grades = []
    for path in paths:
        try:
            grade = grade_one(path, timeout, chapters_dir, execute, sandbox)
        except Exception as error:  # never lose the batch to one notebook
            grade = NotebookGrade(Path(path).name, {}, f"grading failed: {type(error).__name__}: {error}")
        grades.append(grade)
        if on_grade is not None:
            on_grade(grade)
        faults.reached("after_grade")  # tests only: TRANSFORMER_COURSE_FAULT=kill:after_grade=1
    return grades


HEADER = f"{'notebook':<36} {'passed':>6} {'failed':>6} {'not done':>8} {'not run':>7} {'missing':>7}  details"


def format_row(g: NotebookGrade) -> str:
    missing = [f"{e}:{s}" for e, s in g.exercises.items() if s != "passed"]
    details = ", ".join(missing) + (f" [error: {g.error}]" if g.error else "")
    return (f"{g.notebook:<36} {g.count('passed'):>6} {g.count('failed'):>6} {g.count('not done'):>8} "
            f"{g.count('not run'):>7} {g.count('missing'):>7}  {details.strip()}").rstrip()


def format_table(grades: list[NotebookGrade]) -> str:
    """A plain-text table: one row per notebook, counts per status, and the exercises not passed."""
    return "\n".join([HEADER, "-" * len(HEADER), *map(format_row, grades)])


def write_csv(grades: list[NotebookGrade], path) -> None:
    """One row per (notebook, exercise): notebook, exercise, status, notebook_error (one row with an empty
    exercise for a notebook without any). Written atomically: the file is whole or absent."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(["notebook", "exercise", "status", "notebook_error"])
    for g in grades:
        for exercise, status in g.exercises.items() or [("", "")]:
            writer.writerow([g.notebook, exercise, status, g.error])
    path = Path(path)
    handle = tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp",
                                         delete=False, newline="", encoding="utf-8")
    try:
        with handle:
            handle.write(buffer.getvalue())
            handle.flush()
            faults.reached("mid_csv", partial=handle)  # tests only: TRANSFORMER_COURSE_FAULT=kill:mid_csv=1
            os.fsync(handle.fileno())
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise


def run_grade_command(args) -> int:
    """Exit status: 0 every notebook graded to its end; 1 some could not be (their rows say why); 2 usage."""
    timeout = check_timeout(args.timeout)
    if args.csv and not Path(args.csv).resolve().parent.is_dir():
        raise ValueError(f"--csv {args.csv}: its folder does not exist")
    print(HEADER)
    print("-" * len(HEADER))
    grades = grade_notebooks(args.notebooks, timeout=timeout, chapters_dir=args.chapters,
                             sandbox=not args.no_sandbox, on_grade=lambda g: print(format_row(g), flush=True))
    if args.csv:
        write_csv(grades, args.csv)
        print(f"wrote {args.csv}", file=sys.stderr)
    failed = [g.notebook for g in grades if g.error]
    print(f"graded {len(grades)} notebooks" + (f"; {len(failed)} not to the end (see [error: ...]): "
                                                  f"{', '.join(failed)}" if failed else ""), file=sys.stderr)
    return 1 if failed else 0
