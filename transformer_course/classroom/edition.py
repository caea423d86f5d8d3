"""The student edition of the chapters: solutions removed, checks kept (hand-written).

Used by ``transformer-course student-edition`` (and ``make student``, ``make clean``). The student
edition replaces each solution region of an exercise cell (``exercise_cells``) by
``raise NotImplementedError("Exercise 3.2: ...")`` at the marker's indentation (signature and
docstring stay), clears that cell's stored outputs and tags it ``exercise`` so the grader can find
it again; ``leak_check`` then refuses an edition that gives an answer away. Nothing a learner wrote
is ever overwritten or removed: the edition keeps a manifest of the files it wrote (``MANIFEST``,
their SHA-256) and touches only files that still match it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import stat
import sys
from pathlib import Path

from .exercise_cells import (
    BEGIN,
    COURSE_CHAPTERS,
    END,
    EXERCISE_HEADING,
    EXERCISE_TAG,
    cell_source,
    exercise_label,
    printed_verdicts,
    solution_regions,
)
from .leak_check import find_leaks, output_shows_an_answer, predict_answers

_DEF = re.compile(r"^\s*(?:async\s+)?def\s+(\w+)|^\s*class\s+(\w+)")


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
        lines = cell_source(cell).split("\n")
        regions = solution_regions(cell_source(cell)) if cell.cell_type == "code" else []
        covered = {i for b, e in regions for i in range(b + 1, e)}
        for i, line in enumerate(lines):
            if line.strip() in (BEGIN, END) or not line.strip():
                continue
            (inside if i in covered else outside).add(line.strip())
    return inside - outside


def _reveal_cells(cells) -> set[int]:
    """The code cells that answer a predict exercise: those after it, up to the next markdown heading."""
    found, after_predict = set(), False
    for index, cell in enumerate(cells):
        if cell.cell_type == "markdown" and re.search(r"^#{1,6} ", cell_source(cell), re.M):
            after_predict = False
        elif cell.cell_type == "code" and BEGIN in cell_source(cell):
            after_predict = (m := EXERCISE_HEADING.search(cell_source(cell))) is not None and m.group(3) == "predict"
        elif cell.cell_type == "code" and after_predict:
            found.add(index)
    return found


def student_notebook(nb, chapter: str = ""):
    """A copy of notebook ``nb`` with every solution stubbed, and the outputs of exercise cells, of
    cells that print a check's verdict and of the cells that reveal a predict exercise's answer (those
    after it up to the next heading, and any whose output shows the answer: the learner runs them once
    they have answered) cleared. ``chapter``
    ("03_single_head_attention") is written into the metadata, so the grader knows the chapter of a
    handed-in notebook whatever its file name."""
    out = copy.deepcopy(nb)
    if chapter:
        out.metadata["transformer_course"] = {"chapter": chapter}
    answers, reveal = predict_answers(nb), _reveal_cells(out.cells)
    for index, cell in enumerate(out.cells):
        if index in reveal or (cell.cell_type == "code" and output_shows_an_answer(cell, answers)):
            cell.outputs = []
            cell.execution_count = None
    for index, cell in enumerate(out.cells):
        if cell.cell_type == "code" and BEGIN not in cell_source(cell) and printed_verdicts(cell):
            cell.outputs = []  # a check cell after an exported exercise: its stored "passed" is the key's
            cell.execution_count = None
        if cell.cell_type != "code" or BEGIN not in cell_source(cell):
            continue
        cell.source = stub_solutions(cell_source(cell), exercise_label(out.cells, index))
        cell.outputs = []
        cell.execution_count = None
        tags = [t for t in cell.metadata.get("tags", []) if t != EXERCISE_TAG]
        cell.metadata["tags"] = tags + [EXERCISE_TAG]
    return out


# files next to the chapters that notebooks read by relative path (e.g. ../benchmarks/results/*.json)
SIDE_FILES = ("benchmarks/results",)
MANIFEST = ".student-edition.json"  # {relative path: SHA-256 of what the edition wrote}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_manifest(out_dir) -> dict[str, str]:
    """The manifest's {relative path: SHA-256}, {} when there is none or it is not one (a link, bad JSON).
    It lies in the learners' folder: :func:`remove_student_edition` trusts none of its entries blindly."""
    path = Path(out_dir) / MANIFEST
    try:
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(handle, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                return {}
            data = json.loads(file.read(2**22).decode("utf-8"))
    except (OSError, ValueError):
        return {}
    return ({k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}
            if isinstance(data, dict) else {})


# what the edition writes, relative to its folder: the chapters, and the files they read (SIDE_FILES)
_OWN_PATH = re.compile(r"chapters/\d\d_[\w-]+\.ipynb|benchmarks/results/[\w.-]+(?:/[\w.-]+)*")


def removable(out_dir, rel: str, digest: str) -> str:
    """"" when the manifest's entry ``rel`` names a file :func:`remove_student_edition` may delete, else
    why not: one of the edition's own paths (``_OWN_PATH``: no absolute path, no ``..``, no learner's
    folder such as submissions/), inside ``out_dir`` once links are resolved, a regular file and not a
    link, whose content still hashes to ``digest``."""
    out = Path(out_dir).resolve()
    if not _OWN_PATH.fullmatch(rel) or ".." in rel.split("/"):
        return "not a file the student edition writes"
    path = out / rel
    if any((out / folder).is_symlink() for folder in Path(rel).parents) or not path.resolve().is_relative_to(out):
        return "outside the edition's folder (through a link)"
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "gone"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    return "" if _sha256(path) == digest else "changed since the edition wrote it"


def _write_manifest(out_dir: Path, manifest: dict[str, str]) -> None:
    tmp = out_dir / f"{MANIFEST}.tmp"
    tmp.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out_dir / MANIFEST)


def changed_files(out_dir, relative_paths) -> list[str]:
    """Those of ``relative_paths`` that exist in ``out_dir`` but differ from what the edition last wrote
    there (or that it never wrote): a learner's work, never to be overwritten without ``force``."""
    out, manifest = Path(out_dir), read_manifest(out_dir)
    return [rel for rel in relative_paths
            if (out / rel).is_file() and manifest.get(rel) != _sha256(out / rel)]


def write_student_edition(out_dir, chapters_dir=None, force: bool = False) -> list[Path]:
    """Write the student edition into ``out_dir``: ``chapters/*.ipynb`` plus the files the chapters
    read by relative path (``SIDE_FILES``), laid out as in the course. Returns the notebook paths.

    Refuses (``FileExistsError``, nothing written) when a file it would write was changed since it last
    wrote it, unless ``force``."""
    import nbformat

    src = Path(chapters_dir) if chapters_dir else COURSE_CHAPTERS
    notebooks = sorted(src.glob("[0-9][0-9]_*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"no chapter notebooks (NN_name.ipynb) found in {src}: give the course's chapters "
                                "folder with --chapters (chapters/ in a clone of the course)")
    out = Path(out_dir)
    if src.resolve() in (out.resolve(), (out / "chapters").resolve()):
        raise ValueError("the student edition must go to another directory than the chapters themselves")
    files: dict[str, bytes] = {}
    for side in SIDE_FILES:
        for path in sorted((src.parent / side).rglob("*")) if (src.parent / side).is_dir() else []:
            if path.is_file():
                files[path.relative_to(src.parent).as_posix()] = path.read_bytes()
    for path in notebooks:
        nb = student_notebook(nbformat.read(path, as_version=4), chapter=path.stem)
        files[f"chapters/{path.name}"] = nbformat.writes(nb).encode("utf-8") + b"\n"
    changed = changed_files(out, files)
    if changed and not force:
        shown = "\n  ".join(str(out / rel) for rel in changed)
        raise FileExistsError(f"not written: these files changed since the student edition wrote them (a learner's "
                              f"work?):\n  {shown}\nMove them away, write the edition to another folder, or pass "
                              "--force to overwrite them")
    manifest = read_manifest(out)
    for rel, data in files.items():
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
        manifest[rel] = hashlib.sha256(data).hexdigest()
        _write_manifest(out, manifest)
    return [out / f"chapters/{path.name}" for path in notebooks]


def remove_student_edition(out_dir) -> tuple[list[Path], list[Path]]:
    """Remove the files the edition wrote and nobody changed since (:func:`removable`: an entry of the
    manifest naming anything else, an absolute or ``../`` path, a learner's hand-in, a link, is refused);
    keep everything else (submissions, edited notebooks). Returns (removed, kept); the folders the
    edition made, left empty, are removed too."""
    out = Path(out_dir)
    manifest = read_manifest(out)
    removed, folders = [], set()
    for rel, digest in manifest.items():
        if not removable(out, rel, digest):
            (out / rel).unlink()
            removed.append(out / rel)
            folders |= {out / parent for parent in Path(rel).parents if str(parent) != "."}
    for folder in sorted(folders, key=lambda f: len(f.parts), reverse=True):  # deepest first
        if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
            folder.rmdir()
    kept = sorted(p for p in out.rglob("*") if p.name != MANIFEST and (p.is_symlink() or p.is_file())) \
        if out.is_dir() and not out.is_symlink() else []
    if not kept:
        (out / MANIFEST).unlink(missing_ok=True)
        if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
            out.rmdir()
    else:
        _write_manifest(out, {rel: d for rel, d in manifest.items()  # what a learner changed stays known as such
                              if removable(out, rel, d) == "changed since the edition wrote it"})
    return removed, kept


def run_student_edition_command(args) -> int:
    import nbformat

    if getattr(args, "remove", False):
        removed, kept = remove_student_edition(args.out_dir)
        print(f"removed {len(removed)} files of the student edition from {args.out_dir}")
        if kept:
            folders = sorted({str(p.parent) for p in kept})
            print(f"kept {len(kept)} files that learners wrote or changed (submissions, edited notebooks), in: "
                  + ", ".join(folders))
        return 0
    written = write_student_edition(args.out_dir, args.chapters, force=getattr(args, "force", False))
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
    print(f"{len(written)} chapters; solutions removed, checks kept. "
          f"Open them with: jupyter lab --notebook-dir={Path(args.out_dir) / 'chapters'} (JupyterLab is not in "
          'the `teacher` extra: install the course with the `lab` extra, in a clone pip install -e ".[lab]")')
    return 0
