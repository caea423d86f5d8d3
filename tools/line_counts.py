"""How big the package is, and how much of the model path is argument checking (issue 34's numbers).

    python tools/line_counts.py            # the working tree's committed state (HEAD)
    python tools/line_counts.py 1dc5943    # any revision, read from git (no checkout)

Prints, for the revision: the package's Python lines (all of ``transformer_course/``, and split into the
library, ``checks/``, the classroom tooling and the rest), then for each module of the model path its
lines, its code lines (no blank, comment-only or docstring lines) and its argument-check lines: a
``raise``, an ``if`` whose body only raises, a call statement to one of the validators below, or a whole
validator function. A check written as an assignment (``self.d = whole_number(d, "d")``) does the work
of the model too and is not counted, so the check figure is a lower bound.
"""

from __future__ import annotations

import ast
import subprocess
import sys

MODEL_PATH = ("config", "model", "block", "multihead", "attention", "positional", "modern", "generation")
VALIDATORS = {"whole_number", "real_number", "choice", "flag", "check_heads", "check_input", "check_mask",
              "_check_qkv", "check_sampling", "_check_logits", "_check_ids", "_check_head_size"}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def package_files(rev: str) -> list[str]:
    names = git("ls-tree", "-r", "--name-only", rev, "transformer_course").split()
    return [n for n in names if n.endswith(".py")]


def span(node: ast.AST) -> set[int]:
    return set(range(node.lineno, node.end_lineno + 1))


def counts(source: str) -> tuple[int, int, int]:
    """(lines, code lines, check lines) of one module's source."""
    tree = ast.parse(source)
    docstrings: set[int] = set()
    checks: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            docstrings |= span(body[0])
        if isinstance(node, ast.FunctionDef) and node.name in VALIDATORS or isinstance(node, ast.Raise) \
                or isinstance(node, ast.If) and not node.orelse and all(isinstance(s, ast.Raise) for s in node.body):
            checks |= span(node)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            called = node.value.func
            if getattr(called, "id", getattr(called, "attr", None)) in VALIDATORS:
                checks |= span(node)
    lines = source.splitlines()
    code = {i for i, line in enumerate(lines, 1) if line.strip() and not line.strip().startswith("#")} - docstrings
    return len(lines), len(code), len(checks & code)


def main(rev: str = "HEAD") -> None:
    groups: dict[str, int] = {}
    for name in package_files(rev):
        lines = len(git("show", f"{rev}:{name}").splitlines())
        part = name.split("/")[1]
        group = part if part in ("checks", "classroom") else "library and the rest"
        groups[group] = groups.get(group, 0) + lines
    print(f"{rev}: transformer_course/ {sum(groups.values()):,} lines (" +
          ", ".join(f"{group} {n:,}" for group, n in sorted(groups.items())) + ")")
    total = [0, 0, 0]
    print(f"{'model path':12} {'lines':>6} {'code':>6} {'checks':>7}")
    for module in MODEL_PATH:
        row = counts(git("show", f"{rev}:transformer_course/{module}.py"))
        total = [a + b for a, b in zip(total, row, strict=True)]
        print(f"{module:12} {row[0]:6,} {row[1]:6,} {row[2]:7,}")
    print(f"{'total':12} {total[0]:6,} {total[1]:6,} {total[2]:7,}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
