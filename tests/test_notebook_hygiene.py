"""Every chapter is stored as a learner should see it: run in order, no errors, stable outputs."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
MAX_IGNORED = 0.10


def _code_cells(path):
    nb = json.loads(path.read_text())
    return nb, [c for c in nb["cells"] if c["cell_type"] == "code"]


def test_there_are_chapters():
    assert (ROOT / "chapters" / "00_welcome.ipynb") in CHAPTERS


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_hygiene(path):
    nb, cells = _code_cells(path)
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    counts = [c["execution_count"] for c in cells if "".join(c["source"]).strip()]
    assert None not in counts, "some code cells were never run: rebuild with tools/nb.py build"
    assert counts == list(range(1, len(counts) + 1)), "cells were not run once each, top to bottom"
    for cell in cells:
        source = "".join(cell["source"])
        for out in cell.get("outputs", []):
            if out["output_type"] == "error":
                assert "NBVAL_RAISES_EXCEPTION" in source, f"stored error in cell: {source[:80]!r}"
            if out["output_type"] == "stream" and out["name"] == "stderr":
                text = "".join(out["text"])
                assert "Traceback" not in text, f"traceback on stderr: {text[:200]!r}"
            text = json.dumps(out.get("data", {}).get("text/plain", out.get("text", "")))
            assert not re.search(r"object at 0x[0-9a-f]+", text), f"object address in output: {source[:80]!r}"
    ignored = sum(re.search(r"^\s*# NBVAL_IGNORE_OUTPUT\s*$", "".join(c["source"]), re.M) is not None for c in cells)
    assert ignored <= MAX_IGNORED * len(cells), f"{ignored}/{len(cells)} cells ignore their output (max 10%)"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_is_self_contained(path):
    """No chapter reads the authors' seed folder or fetches anything at run time."""
    _, cells = _code_cells(path)
    source = "\n".join("".join(c["source"]) for c in cells)
    assert "../shared" not in source and "seeds/" not in source
    assert not re.search(r"\burllib\.request\b|\brequests\.get\(|\bwget\b", source)


def _compared(cell) -> bool:
    return re.search(r"^\s*# NBVAL_IGNORE_OUTPUT\s*$", "".join(cell["source"]), re.M) is None


# Things whose value differs from machine to machine, or that `make bench` rewrites: a cell whose
# output nbval compares may not print them. (The second configuration of `make test-other-cpu` checks
# the same property by running the chapters; this test names the cell that breaks it.)
MACHINE_DEPENDENT = {
    "benchmarks/results": "reads a file that `make bench` rewrites",
    "cpu_has_fast_bf16": "asks whether this CPU has native bf16",
    "get_cpu_capability": "asks which instruction set this CPU has",
    "process_time": "measures time",
    "perf_counter": "measures time",
}


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_compared_outputs_do_not_depend_on_the_machine(path):
    _, cells = _code_cells(path)
    for cell in cells:
        source = "".join(cell["source"])
        if not _compared(cell) or not cell.get("outputs"):
            continue
        for needle, why in MACHINE_DEPENDENT.items():
            assert needle not in source, f"a compared cell {why} ({needle}): {source[:100]!r}"


def test_the_machine_dependence_check_can_fail():
    cell = {"source": ["print(cpu_has_fast_bf16())\n"], "outputs": [{"output_type": "stream", "text": "True"}]}
    assert _compared(cell) and "cpu_has_fast_bf16" in "".join(cell["source"])
    ignored = {"source": ["# NBVAL_IGNORE_OUTPUT\n", "print(cpu_has_fast_bf16())\n"], "outputs": []}
    assert not _compared(ignored)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapters_do_not_switch_to_bf16_unasked(path):
    """Training and decoding in bf16 only as a labelled experiment: never on the CPU's say-so."""
    _, cells = _code_cells(path)
    for cell in cells:
        source = "".join(cell["source"])
        if re.search(r"bf16\s*=\s*cpu_has_fast_bf16|if\s+cpu_has_fast_bf16\(\)", source):
            pytest.fail(f"a cell picks bf16 from the hardware probe: {source[:100]!r}")


def _names(source: str) -> tuple[set[str], set[str], bool]:
    """(module-level names a cell assigns, names it reads, whether a string in its code names
    benchmarks/results), from its syntax tree; names local to functions, classes, lambdas and
    comprehensions are left out."""
    import ast

    lines = ["" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.split("\n")]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return set(), set(), False
    stored, loaded = set(), set()
    reads = any(isinstance(n, ast.Constant) and isinstance(n.value, str) and "benchmarks/results" in n.value
                for n in ast.walk(tree))
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
              ast.DictComp, ast.GeneratorExp)

    def visit(node) -> None:
        if isinstance(node, ast.Name):
            (stored if isinstance(node.ctx, ast.Store) else loaded).add(node.id)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, scopes):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    stored.add(child.name)
                continue
            visit(child)

    visit(tree)
    return stored, loaded, reads


def _tainted_compared_cells(cells) -> list[str]:
    """Compared cells that print something computed from a file `make bench` rewrites: the names a
    reading cell assigns are tainted, so is every name assigned in a cell that reads a tainted one,
    in cell order (a name assigned in a clean cell is clean again)."""
    tainted: set[str] = set()
    found = []
    for cell in cells:
        source = "".join(cell["source"])
        stored, loaded, reads = _names(source)
        uses = reads or bool(loaded & tainted)
        if not uses:
            tainted -= stored  # assigned afresh from clean values
        else:
            tainted |= stored
            if _compared(cell) and any(o.get("output_type") == "stream" for o in cell.get("outputs", [])):
                found.append(source[:100])
    return found


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_no_compared_cell_prints_what_make_bench_rewrites(path):
    """`make bench` rewrites benchmarks/results/: a compared cell may not print values derived from it."""
    _, cells = _code_cells(path)
    assert _tainted_compared_cells(cells) == []


def test_the_benchmark_taint_check_can_fail():
    read = {"source": ["# NBVAL_IGNORE_OUTPUT\n", "rows = json.loads(open('../benchmarks/results/a.json').read())\n"],
            "outputs": []}
    derived = {"source": ["best = max(rows)\n"], "outputs": []}
    printed = {"source": ["print(best)\n"], "outputs": [{"output_type": "stream", "name": "stdout", "text": "3"}]}
    assert _tainted_compared_cells([read, derived, printed]) == ["print(best)\n"]
    assert _tainted_compared_cells([printed]) == []
