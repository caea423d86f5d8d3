"""Exercise cells: how the student edition, the leak check and the grader find and name an exercise (hand-written).

An *exercise cell* is a code cell whose source holds a solution region::

    # Your turn - Exercise 3.2 (★☆☆, build): the causal mask.
    def my_causal_mask(T):
        \"\"\"...\"\"\"
        ### BEGIN SOLUTION
        return torch.ones(T, T, dtype=torch.bool).tril()
        ### END SOLUTION

or, in the student edition, a code cell tagged ``exercise`` (the region became a stub). Its label
("Exercise 3.2") is written in the cell itself or in the markdown cell just above it. Cells are
nbformat cells or plain dicts with the same keys (``cell_type``, ``source``, ``metadata``).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..checks import RESULT_LINE

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
EXERCISE_TAG = "exercise"
KINDS = ("build", "predict", "debug", "extend")
# "# Your turn - Exercise 3.2 (★☆☆, build): the causal mask." (docs/authoring.md)
EXERCISE_HEADING = re.compile(r"Exercise\s+(\d+\.\d+)\s*\(([★☆]{3}),\s*(build|predict|debug|extend)\)")
_EXERCISE_ID = re.compile(r"Exercise\s+(\d+\.\d+)")
_STATUS = {"✅": "passed", "❌": "failed", "⏳": "not done"}


def course_chapters() -> Path:
    """The course's chapter notebooks: a clone's ``chapters/`` beside the package (a clone, an editable
    install), else the copy a wheel ships inside the package (``transformer_course/_course/chapters``, with
    the benchmark results they read in ``_course/benchmarks/results``: pyproject.toml's package data)."""
    package = Path(__file__).resolve().parents[1]
    clone = package.parent / "chapters"
    if (package.parent / "pyproject.toml").is_file() and clone.is_dir():
        return clone
    return package / "_course" / "chapters"


COURSE_CHAPTERS = course_chapters()


def cell_source(cell) -> str:
    """A cell's source as one string (nbformat stores it as a string or as a list of lines)."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def cell_tags(cell) -> list[str]:
    tags = (cell.get("metadata") or {}).get("tags") or []
    return [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else []


def is_exercise_cell(cell) -> bool:
    return cell.get("cell_type") == "code" and (BEGIN in cell_source(cell) or EXERCISE_TAG in cell_tags(cell))


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


def exercise_label(cells, index: int) -> str:
    """"Exercise 3.2" from the cell itself or the markdown just above it ("" when unnamed)."""
    for cell in (cells[index], cells[index - 1] if index > 0 else None):
        if cell is not None:
            found = _EXERCISE_ID.search(cell_source(cell))
            if found:
                return f"Exercise {found.group(1)}"
    return ""


def exercise_positions(cells) -> dict[str, int]:
    """{"3.1": 12, ...}: the number of every exercise cell ("cell 7" for an unnamed one) and its index."""
    found: dict[str, int] = {}
    for index, cell in enumerate(cells):
        if is_exercise_cell(cell):
            found.setdefault(exercise_label(cells, index).replace("Exercise ", "") or f"cell {index}", index)
    return found


def exercise_numbers(cells) -> list[str]:
    """["3.1", "3.2", ...]: the number of every exercise cell, in order."""
    return list(exercise_positions(cells))


def exercise_kinds(nb) -> dict[str, tuple[str, str]]:
    """{"3.2": ("★☆☆", "build"), ...}: each exercise cell's number, stars and kind, from its first lines."""
    found = {}
    for cell in nb.cells:
        if is_exercise_cell(cell):
            match = EXERCISE_HEADING.search(cell_source(cell))
            if match:
                found[match.group(1)] = (match.group(2), match.group(3))
    return found


def printed_verdicts(cell) -> list[tuple[str, str]]:
    """[("3.2", "passed"), ...]: the verdict lines a check printed into a cell's stored outputs.

    Printed text proves nothing about a notebook handed in (any cell can print it); the grader reads
    the checks' own records instead. This reads trusted notebooks (the answer key's stored outputs)
    and finds the verdicts the student edition must clear."""
    found = []
    outputs = cell.get("outputs")
    for output in outputs if isinstance(outputs, list) else []:
        text = output.get("text", "") if isinstance(output, dict) and output.get("output_type") == "stream" else ""
        for line in ("".join(map(str, text)) if isinstance(text, list) else str(text)).splitlines():
            match = RESULT_LINE.match(line.strip())
            if match:
                found.append((match["exercise"], _STATUS[match["icon"]]))
    return found
