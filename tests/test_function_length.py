"""No function of the package is longer than a screen (issue 34: "no library function over ~60 lines").

Counted from the ``def`` line to the function's last line, decorators left out and nested functions
counted in their parent. The limit is 65, not 60, so that two loops a chapter teaches whole can stay
whole: chapter 01's BPE trainer and chapter 06's training loop (63 and 64 lines), which a learner
reads top to bottom beside the text that explains them."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "transformer_course"
LIMIT = 65


def function_lengths(source: str) -> dict[str, int]:
    """``{qualified name: lines}`` of every function and method in ``source`` (nested ones too)."""
    lengths = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lengths[name] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return lengths


def test_the_count_reads_defs_methods_and_nested_functions():
    source = "def f():\n    def g():\n        pass\n    return g\n\n\nclass C:\n    def m(self):\n        return 1\n"
    assert function_lengths(source) == {"f": 4, "f.g": 2, "C.m": 2}


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_is_longer_than_the_limit(path):
    long = {name: n for name, n in function_lengths(path.read_text(encoding="utf-8")).items() if n > LIMIT}
    assert not long, f"{path.relative_to(PACKAGE.parent)}: split {long} into steps of at most {LIMIT} lines"
