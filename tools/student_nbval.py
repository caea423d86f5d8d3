"""The student edition as an nbval pass: every chapter with its solutions stubbed, checked against the
answer key's stored outputs (hand-written test tooling, not shipped in the package).

``make test-student`` (and CI's newest-PyTorch run) used to execute each student notebook through the
grader and look only at the verdicts. This writes, into OUT_DIR, the student edition laid out as
``transformer-course student-edition`` lays it out (``chapters/`` and the files they read), with one
change: every code cell gets back the answer key's stored outputs, each verdict line the key printed
("✅ Exercise 3.2 (causal_mask): passed ...") turned into the line a stub must print ("⏳ Exercise 3.2
(causal_mask): not done yet - ..."). Strict nbval over these notebooks then proves three things in one
execution: the student edition runs top to bottom, every check says "not done" (no stub passes, no
check is lost), and everything else a learner sees is what the answer key shows (the chapter carries on
with the package's reference code exactly as with the learner's). The few cells that print which code
they run, the learner's or the package's (``LEARNER_BRANCH``), are run but not compared; a "❌" line in
the key (a planted wrong answer, shown on purpose) stays as it is.

Usage: ``python tools/student_nbval.py OUT_DIR`` prints the notebooks it wrote, one a line.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
# a cell that says which code it runs, the learner's or the package's ("yours if 10.1 passed", "pass Exercise
# 10.7 to generate with your cache"): its output is the stub's branch here, so it is run but not compared
LEARNER_BRANCH = re.compile(r"\bif \d+\.\d+ passed\b|\bpass Exercise \d+\.\d+\b")
IGNORE = "# NBVAL_IGNORE_OUTPUT"


def _references() -> dict[str, str | None]:
    """Exercise ("3.2") -> the name of the package's reference its check falls back to (None: no reference)."""
    import importlib
    import pkgutil

    import transformer_course.checks as checks

    found = {}
    for info in pkgutil.iter_modules(checks.__path__):
        module = importlib.import_module(f"{checks.__name__}.{info.name}")
        for value in vars(module).values():
            if callable(value) and hasattr(value, "exercise") and hasattr(value, "reference"):
                found[value.exercise] = getattr(value.reference, "__name__", None)
    return found


def not_done_text(text: str, references: dict[str, str | None]) -> str:
    """``text`` (a stream's output) with each verdict line turned into the one a stub gets: "not done yet",
    and where the check has a reference, the reference the chapter then carries on with."""
    from transformer_course.checks._core import _NOT_DONE_MESSAGE, RESULT_LINE

    lines = text.split("\n")
    for i, line in enumerate(lines):
        match = RESULT_LINE.match(line.strip())
        if match and match["icon"] == "✅":  # a ❌ in the key is a planted wrong answer, the same for a stub
            short = references.get(match["exercise"])
            message = (f"not done yet - the chapter carries on with the package's {short}" if short
                       else _NOT_DONE_MESSAGE)
            lines[i] = f"⏳ Exercise {match['exercise']} ({match['name']}): {message}"
    return "\n".join(lines)


def with_key_outputs(student, key):
    """A copy of the student notebook whose code cells carry the key's outputs, verdicts "not done"."""
    out = copy.deepcopy(student)
    if len(out.cells) != len(key.cells):
        raise ValueError("the student edition must keep the answer key's cells one for one")
    references = _references()
    for cell, key_cell in zip(out.cells, key.cells, strict=True):
        if cell.cell_type != "code":
            continue
        if LEARNER_BRANCH.search(cell.source) and not cell.source.startswith(IGNORE):
            cell.source = f"{IGNORE}\n# (student pass: this cell shows the learner's branch)\n{cell.source}"
        cell.outputs = copy.deepcopy(key_cell.outputs)
        cell.execution_count = key_cell.execution_count
        for output in cell.outputs:
            if output.get("output_type") == "stream":
                text = output["text"]
                output["text"] = not_done_text("".join(text) if isinstance(text, list) else text, references)
    return out


def write(out_dir: Path, chapters_dir: Path = ROOT / "chapters") -> list[Path]:
    """Write the student edition into ``out_dir`` (replacing an earlier one), then give its notebooks
    the key's outputs. Returns the notebooks' paths."""
    from transformer_course.classroom.edition import write_student_edition

    written = write_student_edition(out_dir, chapters_dir, force=True)
    for path in written:
        key = nbformat.read(chapters_dir / path.name, as_version=4)
        nbformat.write(with_key_outputs(nbformat.read(path, as_version=4), key), path)
    return written


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Write the student edition with the key's outputs, for strict nbval.",
                                     epilog=__doc__.strip().splitlines()[-1])
    parser.add_argument("out_dir", type=Path, help="the folder to write the edition into (replaced)")
    args = parser.parse_args(argv)
    for notebook in write(args.out_dir):
        print(notebook)


if __name__ == "__main__":
    main()
