"""Grading handed-in notebooks (hand-written): which exercises passed, failed, are not done, were not
run or are missing.

Used by ``transformer-course grade``. Each notebook is read by a loader that never raises (a file that
is not a notebook becomes a row that says so), matched to its chapter by file name
(``alice_03_single_head_attention.ipynb``) or by the chapter the student edition wrote into its
metadata, and run in a fresh kernel (``sandbox``). A notebook's grade lists exactly the
exercises of the original chapter: an exercise cell that is gone is **missing**, an exercise that a
notebook invents does not count, and a verdict counts only when the check recorded it while running
(printed text proves nothing). One bad notebook never stops a batch: its row carries the error.

Hand-ins are hostile input: each is read once, before the sandbox, only if it is a regular file (not a
link, a FIFO, a device) of at most ``MAX_NOTEBOOK_BYTES``, and the kernel sees only its copy. Learner
text (file names, error messages) is escaped in the table and the CSV (:func:`printable`, :func:`csv_cell`).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import stat
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..arguments import real_number
from .exercise_cells import (
    COURSE_CHAPTERS,
    cell_source,
    exercise_numbers,
    exercise_positions,
    printed_verdicts,
)
from .sandbox import DATA_DIR, copied_in, run_cells, sandbox_problem, unreadable_by_the_sandbox

MAX_NOTEBOOK_BYTES = 64 * 2**20  # a handed-in notebook larger than this is refused, not read
DEFAULT_TIMEOUT = 1800  # seconds for a whole notebook: chapter 06 trains for about two minutes on a laptop
MAX_TIMEOUT = 86400  # a day: more is a typing slip (and past ~2e6 s, timers overflow)
MAX_JOBS = 64
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


def read_hand_in(path) -> tuple[bytes, str]:
    """(the bytes of a handed-in file, "") or (b"", why it was refused). Only a regular file is read (a
    symbolic link, even to a notebook, a FIFO, a device or a folder is refused without being opened for
    reading), at most ``MAX_NOTEBOOK_BYTES``, through a descriptor that cannot follow a link or block."""
    path = Path(path)
    try:
        before = os.lstat(path)
        if stat.S_ISLNK(before.st_mode):
            return b"", "a symbolic link, not a notebook file: not followed (hand in the .ipynb file itself)"
        if not stat.S_ISREG(before.st_mode):
            kind = "a folder" if stat.S_ISDIR(before.st_mode) else "a FIFO" if stat.S_ISFIFO(before.st_mode) else \
                "a device or socket"
            return b"", f"{kind}, not a notebook file: not read"
        if before.st_size > MAX_NOTEBOOK_BYTES:
            return b"", f"larger than {MAX_NOTEBOOK_BYTES // 2**20} MB: not read"
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                         | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
        try:
            opened = os.fstat(handle)
            if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (before.st_dev, before.st_ino):
                return b"", "replaced while it was being read: not read"
            chunks, size = [], 0
            while chunk := os.read(handle, min(2**20, MAX_NOTEBOOK_BYTES + 1 - size)):
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_NOTEBOOK_BYTES:
                    return b"", f"larger than {MAX_NOTEBOOK_BYTES // 2**20} MB: not read"
            return b"".join(chunks), ""
        finally:
            os.close(handle)
    except FileNotFoundError:
        return b"", "no such file"
    except OSError as error:
        return b"", f"could not be read: {error.strerror or error}"


def parse_submission(data: bytes) -> Submission:
    """A handed-in notebook's cells and chapter from its bytes; any problem in ``error`` (never raises)."""
    try:
        data = json.loads(data.decode("utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
            return Submission(error="not a Jupyter notebook (no list of cells): hand in the .ipynb file")
        if data.get("nbformat") != 4:
            return Submission(error=f"notebook format {data.get('nbformat')!r}, not 4: open and save it in JupyterLab")
        cells = [_cell(cell, i) for i, cell in enumerate(data["cells"])]
        meta = data.get("metadata")
        course = meta.get("transformer_course") if isinstance(meta, dict) else None
        chapter = course.get("chapter") if isinstance(course, dict) else None
        return Submission(cells, chapter if isinstance(chapter, str) else "")
    except UnicodeDecodeError as error:
        return Submission(error=f"could not be read: {error}")
    except json.JSONDecodeError as error:
        return Submission(error=f"not valid notebook JSON ({error.msg} at line {error.lineno}, column {error.colno})")
    except (ValueError, RecursionError, MemoryError) as error:
        return Submission(error=f"not a valid notebook: {error}")


def read_submission(path) -> Submission:
    """Read a handed-in notebook safely (:func:`read_hand_in`); any problem is returned in ``error``."""
    data, error = read_hand_in(path)
    return Submission(error=error) if error else parse_submission(data)


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


_CHECKS_IMPORT = re.compile(r"transformer_course\.checks\.(\w+)")  # the check modules a chapter imports


def grade_one(path, timeout: float, chapters_dir, execute: bool = True, sandbox: bool = True,
              limits=None) -> NotebookGrade:
    """Grade one notebook; every problem ends up in the grade's ``error``. The kernel runs the cells of
    the hand-in's bytes, read once (:func:`read_hand_in`), in a copy of its own, with the course's data
    (``benchmarks/results`` beside ``chapters_dir``) one level up; ``limits`` go to ``run_cells``."""
    path = Path(path)
    data, error = read_hand_in(path)
    submission = Submission(error=error) if error else parse_submission(data)
    chapter = chapter_for(path, submission.chapter, chapters_dir)
    expected: list[str] = []
    modules: list[str] = []
    if chapter is not None:  # the teacher's own chapter: trusted, read even through a link
        original = parse_submission(Path(chapter).read_bytes())
        expected = exercise_numbers(original.cells)
        modules = sorted({m for c in original.cells if c["cell_type"] == "code"
                          for m in _CHECKS_IMPORT.findall(c["source"])})
    if submission.error:
        return NotebookGrade(path.name, dict.fromkeys(expected, "not run"), submission.error)
    if chapter is None:
        return NotebookGrade(path.name, {}, f"no chapter of {chapters_dir} matches: name the file after its chapter, "
                                            "e.g. alice_03_single_head_attention.ipynb")
    if not execute:
        return grade_cells(path.name, submission.cells, expected, stored_verdicts(submission.cells))
    code = [(i, c["source"]) for i, c in enumerate(submission.cells)
            if c["cell_type"] == "code" and c["source"].strip()]
    answer = run_cells(code, hand_in=data, name=path.name, course_data=Path(chapters_dir).parent / DATA_DIR,
                       timeout=timeout, sandbox=sandbox, expected=expected,
                       hidden=[str(chapters_dir), str(COURSE_CHAPTERS), str(path.parent)], check_modules=modules,
                       **(limits or {}))
    return grade_cells(path.name, submission.cells, expected, answer.get("records", []), answer.get("error", ""))


def check_timeout(timeout) -> float:
    return real_number(timeout, "timeout", low=0, low_open=True, high=MAX_TIMEOUT,
                       hint=f"the seconds allowed for a whole notebook, e.g. --timeout 1800 (at most {MAX_TIMEOUT}, a "
                            "day; there is no 'no limit')")


def expand_notebooks(paths) -> list[Path]:
    """``paths`` with each folder replaced by the ``.ipynb`` files directly in it, sorted (a link or a
    FIFO among them is kept, to be refused with a row of its own; a folder without any stays, a row). A
    folder the teacher names is followed even through a symbolic link (the teacher chose it); links inside
    it are hand-ins, and stay refused."""
    found: list[Path] = []
    for path in map(Path, paths):
        inside = []
        if path.is_dir():
            try:
                inside = sorted(p for p in path.iterdir() if p.name.endswith(".ipynb") and not p.name.startswith("."))
            except OSError:  # a folder that cannot be listed: its row says why
                inside = []
        found += inside or [path]
    return found


def grade_notebooks(paths, timeout: float = DEFAULT_TIMEOUT, execute: bool = True, chapters_dir=None,
                    sandbox: bool = True, on_grade=None, jobs: int = 1, limits=None) -> list[NotebookGrade]:
    """Grade each notebook (``execute=False``: read the verdicts stored in trusted notebooks instead); a
    folder stands for the notebooks in it. One grade per notebook, in order, whatever happens.

    ``timeout`` bounds each whole notebook, in seconds; ``jobs`` notebooks run at once. With ``sandbox``
    (the default), refuses to run anything where no sandbox can be made. ``on_grade(grade)`` is called
    as each grade is ready, in order. ``limits`` ({"memory": bytes, "processes": n}) narrow the sandbox's."""
    timeout = check_timeout(timeout)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= MAX_JOBS:
        raise ValueError(f"jobs must be a whole number from 1 to {MAX_JOBS}, got {jobs!r}")
    chapters_dir = Path(chapters_dir) if chapters_dir else COURSE_CHAPTERS
    if execute and sandbox:
        problem = sandbox_problem()
        if problem:
            raise RuntimeError(f"no sandbox for the learners' code on this machine: {problem}. Nothing was run. "
                               "To grade anyway, with their code running as you, pass --no-sandbox")

    def one(path) -> NotebookGrade:
        try:
            return grade_one(path, timeout, chapters_dir, execute, sandbox, limits)
        except Exception as error:  # never lose the batch to one notebook
            return NotebookGrade(Path(path).name, {}, f"grading failed: {type(error).__name__}: {error}")

    grades = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for grade in pool.map(one, expand_notebooks(paths)):
            grades.append(grade)
            if on_grade is not None:
                on_grade(grade)
    return grades


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """Learner text made safe for a terminal and one line: control characters (escape sequences, newlines,
    carriage returns, bidirectional overrides) shown as ``\\x1b``-style escapes, not sent."""
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else
                            f"\\u{ord(m.group()):04x}", str(text))


def csv_cell(text: str) -> str:
    """:func:`printable`, and a cell a spreadsheet would run as a formula (= + - @, a tab) starts with ``'``."""
    text = printable(text)
    return f"'{text}" if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


HEADER = f"{'notebook':<36} {'passed':>6} {'failed':>6} {'not done':>8} {'not run':>7} {'missing':>7}  details"


def format_row(g: NotebookGrade) -> str:
    """One line of the table; the notebook's name and error escaped (:func:`printable`)."""
    missing = [f"{e}:{s}" for e, s in g.exercises.items() if s != "passed"]
    details = printable(", ".join(missing) + (f" [error: {g.error}]" if g.error else ""))
    return (f"{printable(g.notebook):<36} {g.count('passed'):>6} {g.count('failed'):>6} {g.count('not done'):>8} "
            f"{g.count('not run'):>7} {g.count('missing'):>7}  {details.strip()}").rstrip()


def format_table(grades: list[NotebookGrade]) -> str:
    """A plain-text table: one row per notebook, counts per status, and the exercises not passed."""
    return "\n".join([HEADER, "-" * len(HEADER), *map(format_row, grades)])


def _write_text(handle, text: str) -> None:
    """`text` into the open file `handle`, flushed to the operating system (not yet to the disk)."""
    handle.write(text)
    handle.flush()


def write_csv(grades: list[NotebookGrade], path) -> None:
    """One row per (notebook, exercise): notebook, exercise, status, notebook_error (one row with an empty
    exercise for a notebook without any), learner text escaped (:func:`csv_cell`). Written atomically:
    the file is whole or absent."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(["notebook", "exercise", "status", "notebook_error"])
    for g in grades:
        for exercise, status in g.exercises.items() or [("", "")]:
            writer.writerow([csv_cell(g.notebook), csv_cell(exercise), status, csv_cell(g.error)])
    path = Path(path)
    handle = tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp",
                                         delete=False, newline="", encoding="utf-8")
    try:
        with handle:
            _write_text(handle, buffer.getvalue())
            os.fsync(handle.fileno())
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise


def check_csv_path(csv_path, notebooks) -> None:
    """Refuse a ``--csv`` that would overwrite a notebook: a ``.ipynb`` name, or one of ``notebooks``."""
    path = Path(csv_path)
    if path.name.lower().endswith(".ipynb"):
        raise ValueError(f"--csv {csv_path}: that is a notebook's name, not a CSV file's (did --csv swallow a hand-in? "
                         "write e.g. --csv class.csv)")
    if path.is_dir():
        raise ValueError(f"--csv {csv_path}: a folder; name the CSV file, e.g. --csv class.csv")
    if not path.resolve().parent.is_dir():
        raise ValueError(f"--csv {csv_path}: its folder does not exist")
    if path.exists() and any(n.exists() and os.path.samefile(path, n) for n in expand_notebooks(notebooks)):
        raise ValueError(f"--csv {csv_path}: that is one of the notebooks to grade; name another file")


def run_grade_command(args) -> int:
    """Exit status: 0 every notebook graded to its end; 1 some could not be (their rows say why); 2 usage."""
    timeout = check_timeout(args.timeout)
    if args.csv:
        check_csv_path(args.csv, args.notebooks)
    if not args.no_sandbox and (hidden := [p for p in unreadable_by_the_sandbox() if not copied_in(p)]):
        print(f"warning: graded as root, the notebooks run as nobody, who cannot read {len(hidden)} files of the "
              f"course (e.g. {hidden[0]}); a notebook that opens them fails. Fix: chmod -R o+rX "
              f"{Path(hidden[0]).parent if len(hidden) == 1 else os.path.commonpath(hidden)}", file=sys.stderr)
    print(HEADER)
    print("-" * len(HEADER))
    grades = grade_notebooks(args.notebooks, timeout=timeout, chapters_dir=args.chapters,
                             sandbox=not args.no_sandbox, on_grade=lambda g: print(format_row(g), flush=True),
                             jobs=getattr(args, "jobs", 1))
    if args.csv:
        write_csv(grades, args.csv)
        print(f"wrote {args.csv}", file=sys.stderr)
    failed = [printable(g.notebook) for g in grades if g.error]
    print(f"graded {len(grades)} notebooks" + (f"; {len(failed)} not to the end (see [error: ...]): "
                                                  f"{', '.join(failed)}" if failed else ""), file=sys.stderr)
    return 1 if failed else 0
