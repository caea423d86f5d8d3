"""Authoring tool for the course's chapters.

Each chapter is written as a jupytext percent script in ``chapters/src/NN_name.py`` and built into
``chapters/NN_name.ipynb`` (the notebook learners open and nbval checks). Both are committed; the
notebook is the source of truth for nbdev's export, the script is the readable, reviewable form.

Usage (from the repository root, inside the project's virtual environment)::

    python tools/nb.py build chapters/src/03_single_head_attention.py   # script -> executed notebook -> export
    python tools/nb.py build --all                                     # every chapter (``make course``)
    python tools/nb.py pull chapters/03_single_head_attention.ipynb    # notebook edited in Lab -> script
    python tools/nb.py check                                           # sync + export drift (``make test``)

``build`` executes the notebook top to bottom in a fresh ``python3`` kernel with ``chapters/`` as
the working directory (as nbval does), keeps outputs and execution counts, strips volatile metadata,
and then runs ``nbdev-export`` so the package matches the notebooks.
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
SRC = CHAPTERS / "src"
PACKAGE = ROOT / "transformer_course"
RAISES = "# NBVAL_RAISES_EXCEPTION"
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def _notebook_for(src: Path) -> Path:
    return CHAPTERS / (src.stem + ".ipynb")


def _script_for(nb_path: Path) -> Path:
    return SRC / (nb_path.stem + ".py")


def _read_script(src: Path):
    import jupytext

    nb = jupytext.read(src, fmt="py:percent")
    for cell in nb.cells:
        cell.metadata.pop("lines_to_next_cell", None)
    return nb


def _stable_ids(nb) -> None:
    """Cell ids from the cells' content, so a rebuild does not rename every cell (nor churn the
    ``# %% ... #<id>`` markers nbdev writes into exported modules)."""
    seen: dict[str, int] = {}
    for cell in nb.cells:
        digest = hashlib.sha1(f"{cell.cell_type}\n{cell.source}".encode()).hexdigest()[:8]
        seen[digest] = seen.get(digest, 0) + 1
        cell.id = digest if seen[digest] == 1 else f"{digest}-{seen[digest]}"


def _clean(nb) -> None:
    """Strip volatile metadata; keep outputs and execution counts (nbval needs both)."""
    nb.metadata = {
        "kernelspec": dict(KERNELSPEC),
        "language_info": {"name": "python"},
    }
    for cell in nb.cells:
        tags = [t for t in cell.metadata.get("tags", []) if t != "raises-exception"]
        if cell.cell_type == "code" and RAISES in cell.source:
            tags.append("raises-exception")
        cell.metadata = {"tags": tags} if tags else {}


def _coalesce_streams(nb) -> None:
    """One output per run of consecutive stdout (or stderr) chunks: how a kernel splits a cell's printing
    depends on the machine's load, and the stored notebook should not."""
    for cell in nb.cells:
        merged = []
        for output in cell.get("outputs", []):
            previous = merged[-1] if merged else None
            if (output.get("output_type") == "stream" and previous is not None
                    and previous.get("output_type") == "stream" and previous.get("name") == output.get("name")):
                previous["text"] += output["text"]
            else:
                merged.append(output)
        if cell.cell_type == "code":
            cell.outputs = merged


def build(src: Path, timeout: int = 900) -> Path:
    """Convert ``src`` to a notebook, execute it in ``chapters/`` and save it next to the others."""
    import nbformat
    from nbclient import NotebookClient

    nb = _read_script(src)
    _clean(nb)
    _stable_ids(nb)
    nb_path = _notebook_for(src)
    # export before running, so a chapter can import what it has just defined (e.g. a second module)
    nbformat.write(nb, nb_path)
    export()
    start = time.perf_counter()
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(CHAPTERS)}},
    )
    client.execute()
    _clean(nb)
    _coalesce_streams(nb)
    nbformat.validator.normalize(nb)
    nbformat.write(nb, nb_path)
    print(f"built {nb_path.relative_to(ROOT)} in {time.perf_counter() - start:.1f} s")
    export()
    return nb_path


def pull(nb_path: Path) -> Path:
    """Write the percent script for a notebook that was edited in JupyterLab."""
    import jupytext

    nb = jupytext.read(nb_path)
    nb.metadata = {}
    out = _script_for(nb_path)
    out.parent.mkdir(exist_ok=True)
    jupytext.write(nb, out, fmt="py:percent")
    print(f"wrote {out.relative_to(ROOT)}")
    return out


def export(cwd: Path = ROOT) -> None:
    exe = Path(sys.executable).with_name("nbdev-export")
    subprocess.run([str(exe)], cwd=cwd, check=True)
    # nbdev also writes _modidx.py, an index of symbols for its documentation site; this course
    # publishes no such site and nothing imports it, so the package does not carry it (55 kB)
    (cwd / "transformer_course" / "_modidx.py").unlink(missing_ok=True)


def _cells(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def check_sync() -> list[str]:
    """Every chapter notebook has a script and both hold the same cells."""
    import nbformat

    problems = []
    notebooks = sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
    scripts = sorted(SRC.glob("[0-9][0-9]_*.py"))
    for nb_path in notebooks:
        src = _script_for(nb_path)
        if not src.exists():
            problems.append(f"{nb_path.name}: no script {src.relative_to(ROOT)} (run: python tools/nb.py pull {nb_path.relative_to(ROOT)})")
            continue
        if _cells(_read_script(src)) != _cells(nbformat.read(nb_path, as_version=4)):
            problems.append(
                f"{nb_path.name} and {src.relative_to(ROOT)} differ: rebuild the notebook "
                f"(python tools/nb.py build {src.relative_to(ROOT)}) or pull your Lab edits into the script"
            )
    for src in scripts:
        if not _notebook_for(src).exists():
            problems.append(f"{src.relative_to(ROOT)} has no notebook: python tools/nb.py build {src.relative_to(ROOT)}")
    return problems


def check_export() -> list[str]:
    """Export the notebooks into a scratch copy of the package and compare with the real one."""
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
        shutil.copytree(CHAPTERS, tmp / "chapters", ignore=shutil.ignore_patterns("src", ".ipynb_checkpoints"))
        shutil.copytree(PACKAGE, tmp / "transformer_course", ignore=shutil.ignore_patterns("__pycache__"))
        export(cwd=tmp)
        for fresh in sorted((tmp / "transformer_course").rglob("*.py")):
            rel = fresh.relative_to(tmp)
            real = ROOT / rel
            if not real.exists():
                problems.append(f"{rel}: exported by a notebook but missing from the package (run: make export)")
            elif not filecmp.cmp(fresh, real, shallow=False):
                problems.append(f"{rel}: differs from what its notebook exports (edit the notebook, then: make export)")
    for module in sorted(PACKAGE.glob("*.py")):
        header = next((line for line in module.read_text().splitlines() if line.startswith("# AUTOGENERATED")), "")
        if "File to edit:" in header:  # after the module docstring, when there is one
            nb_rel = header.split("File to edit:", 1)[1].strip().rstrip(".")
            if not (PACKAGE / nb_rel).exists():
                problems.append(f"{module.relative_to(ROOT)} names {nb_rel}, which does not exist")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="script(s) -> executed notebook(s) -> export")
    b.add_argument("scripts", nargs="*", type=Path)
    b.add_argument("--all", action="store_true", help="build every chapter in order")
    b.add_argument("--timeout", type=int, default=900, help="seconds allowed per cell")
    p = sub.add_parser("pull", help="notebook(s) edited in Lab -> script(s)")
    p.add_argument("notebooks", nargs="+", type=Path)
    sub.add_parser("export", help="run nbdev-export")
    sub.add_parser("check", help="fail if scripts, notebooks and package disagree")
    args = parser.parse_args(argv)

    if args.cmd == "build":
        scripts = sorted(SRC.glob("[0-9][0-9]_*.py")) if args.all else args.scripts
        if not scripts:
            parser.error("name at least one script, or pass --all")
        for src in scripts:
            build(Path(src).resolve(), timeout=args.timeout)
    elif args.cmd == "pull":
        for nb_path in args.notebooks:
            pull(Path(nb_path).resolve())
    elif args.cmd == "export":
        export()
    elif args.cmd == "check":
        problems = check_sync() + check_export()
        for problem in problems:
            print("drift:", problem)
        if problems:
            return 1
        print("chapters, scripts and package agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
