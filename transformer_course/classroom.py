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
KINDS = ("build", "predict", "debug", "extend")
# "# Your turn - Exercise 3.2 (★☆☆, build): the causal mask." (docs/authoring.md)
_KIND = re.compile(r"Exercise\s+(\d+\.\d+)\s*\(([★☆]{3}),\s*(build|predict|debug|extend)\)")
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


def exercise_kinds(nb) -> dict[str, tuple[str, str]]:
    """{"3.2": ("★☆☆", "build"), ...}: each exercise cell's number, stars and kind, from its first lines."""
    found = {}
    for cell in nb.cells:
        if is_exercise_cell(cell):
            match = _KIND.search(_source(cell))
            if match:
                found[match.group(1)] = (match.group(2), match.group(3))
    return found


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


# ------------------------------------------------------------------ leak check (on the syntax tree)

_TOKEN = re.compile(r"\w+|[^\w\s]")
_TINY = 6  # a region of fewer AST nodes is compared with its names as written (renamed, `return x` is everywhere)


def _parse(source: str):
    """The syntax tree of a code cell, IPython magics and shell lines blanked; None when it does not parse."""
    import ast

    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n")]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _bound_globals(trees) -> set[str]:
    """Names a notebook imports (``torch``, ``F``, ``math``) plus Python's builtins: never renamed."""
    import ast
    import builtins

    names = set(dir(builtins))
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _statement_lists(tree):
    """Every list of statements in a tree: a module's body, a function's, a loop's, a branch's."""
    import ast

    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                yield body
        for handler in getattr(node, "handlers", []) or []:
            yield handler.body


def _fingerprint(statements, keep: set[str], rename: bool) -> str:
    """The statements' layout-free form: docstrings dropped and, with ``rename``, local names numbered
    in order of first use (``q @ k`` and ``a @ b`` look the same; ``torch.tril`` stays itself)."""
    import ast
    import copy as _copy

    names: dict[str, str] = {}

    class Renamer(ast.NodeTransformer):
        def _new(self, name: str) -> str:
            if not rename or name in keep:
                return name
            return names.setdefault(name, f"v{len(names)}")

        def visit_Name(self, node):
            node.id = self._new(node.id)
            return node

        def visit_arg(self, node):
            node.arg = self._new(node.arg)
            node.annotation = None
            return node

        def visit_FunctionDef(self, node):
            node.name = self._new(node.name)
            node.returns = None
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                node.body = body[1:] or [ast.Pass()]
            self.generic_visit(node)
            return node

    parts = []
    for statement in statements:
        node = Renamer().visit(_copy.deepcopy(statement))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # a docstring or a bare string
        parts.append(ast.dump(node, annotate_fields=False, include_attributes=False))
    return "\n".join(parts)


def _region_statements(source: str, begin: int, end: int):
    """The statements between a region's markers, parsed on their own (dedented)."""
    import textwrap

    body = textwrap.dedent("\n".join(source.split("\n")[begin + 1 : end]))
    tree = _parse(body)
    return None if tree is None else tree.body


SIMILAR = 0.85  # a block this similar to a region (difflib ratio of the normalised trees) gives it away


def _similar(a: list[str], b: list[str]) -> bool:
    from difflib import SequenceMatcher

    matcher = SequenceMatcher(None, a, b, autojunk=False)
    return matcher.real_quick_ratio() >= SIMILAR and matcher.quick_ratio() >= SIMILAR and matcher.ratio() >= SIMILAR


def find_leaks(instructor_nb, student_nb) -> list[str]:
    """Where a solution region of ``instructor_nb`` is reproduced in a code cell of ``student_nb``.

    Both sides are compared as syntax trees, after dropping docstrings, comments, annotations and
    layout and numbering local names in order of use, so a copy with other variable names or line
    breaks is still found; so is a near copy (one extra argument, one changed constant): a run of
    consecutive statements in one block of another cell (as many as the region has, or one fewer or
    more) whose normalised tree matches the region's at least ``SIMILAR`` (difflib ratio over tree
    tokens). Returns one line per leak (empty: no leak)."""
    import ast

    student_cells = [(i, _source(c)) for i, c in enumerate(student_nb.cells) if c.get("cell_type") == "code"]
    student_trees = [(i, t) for i, src in student_cells if (t := _parse(src)) is not None]
    keep = _bound_globals([t for _, t in student_trees])
    blocks = [(where, block) for where, tree in student_trees for block in _statement_lists(tree)]
    cache: dict[tuple, list[str]] = {}

    def tokens(key, statements, rename) -> list[str]:
        if key not in cache:
            cache[key] = _TOKEN.findall(_fingerprint(statements, keep, rename))
        return cache[key]

    leaks = []
    for index, cell in enumerate(instructor_nb.cells):
        if cell.get("cell_type") != "code":
            continue
        source = _source(cell)
        for begin, end in solution_regions(source):
            statements = _region_statements(source, begin, end)
            if not statements:
                continue
            rename = sum(1 for s in statements for _ in ast.walk(s)) >= _TINY
            wanted = _TOKEN.findall(_fingerprint(statements, keep, rename))
            if not wanted:
                continue
            n = len(statements)
            label = _exercise_label(instructor_nb.cells, index) or f"cell {index}"
            kind = _KIND.search(source)
            if kind and kind.group(3) == "debug":  # the buggy version shown above may resemble the fix
                sizes, same = {n}, lambda a, b: a == b
            else:
                sizes, same = {max(1, n - 1), n, n + 1}, _similar
            for where, block in blocks:
                found = any(
                    same(wanted, tokens((id(block), i, m, rename), block[i : i + m], rename))
                    for m in sizes
                    for i in range(len(block) - m + 1)
                )
                if found:
                    leaks.append(f"{label} (solution region at cell {index}) is reproduced in student cell {where}")
                    break
    return leaks


def student_notebook(nb):
    """A copy of notebook ``nb`` with every solution stubbed, and the outputs of exercise cells and of
    cells that print a check's verdict cleared."""
    out = copy.deepcopy(nb)
    for index, cell in enumerate(out.cells):
        if cell.cell_type == "code" and BEGIN not in _source(cell) and _outcomes(cell):
            cell.outputs = []  # a check cell after an exported exercise: its stored "passed" is the key's
            cell.execution_count = None
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
    """Read the verdicts of an executed notebook (exercises whose check never ran: "not run").

    A verdict counts only in the output of a cell that calls a check (``check_...(``): the exercise
    cell itself, or the cell after it when the exercise is an exported cell."""
    grade = NotebookGrade(name)
    for cell in nb.cells:
        if cell.get("cell_type") == "code" and "check_" in _source(cell):
            for exercise, status in _outcomes(cell):
                grade.exercises[exercise] = status
    for index, cell in enumerate(nb.cells):
        if not is_exercise_cell(cell):
            continue
        label = (_exercise_label(nb.cells, index) or f"cell {index}").replace("Exercise ", "")
        grade.exercises.setdefault(label, "not run")
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
    import nbformat

    written = write_student_edition(args.out_dir, args.chapters)
    src = Path(args.chapters) if args.chapters else COURSE_CHAPTERS
    leaks = []
    for path in written:
        print(f"wrote {path}")
        leaks += [f"{path.name}: {leak}" for leak in
                  find_leaks(nbformat.read(src / path.name, as_version=4), nbformat.read(path, as_version=4))]
    if leaks:
        print("The student edition gives answers away (move or rewrite these cells):", file=sys.stderr)
        for leak in leaks:
            print(f"  {leak}", file=sys.stderr)
        return 1
    print(f"{len(written)} chapters; solutions removed, checks kept. Open them with: jupyter lab {Path(args.out_dir) / 'chapters'}")
    return 0


def run_grade_command(args) -> int:
    grades = grade_notebooks(args.notebooks, timeout=args.timeout)
    print(format_table(grades))
    if args.csv:
        write_csv(grades, args.csv)
        print(f"wrote {args.csv}", file=sys.stderr)
    return 0
