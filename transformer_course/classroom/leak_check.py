"""The leak check: does a student edition reproduce a solution somewhere else in its notebook? (hand-written)

Used by ``transformer-course student-edition`` (which refuses to write an edition that gives an answer
away) and by ``tests/test_classroom.py``. Solution regions and code cells are compared as syntax
trees, so renamed variables or another layout do not hide a copy (``docs/authoring.md``).
"""

from __future__ import annotations

import re

from .exercise_cells import EXERCISE_HEADING, cell_source, exercise_label, solution_regions

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

    student_cells = [(i, cell_source(c)) for i, c in enumerate(student_nb.cells) if c.get("cell_type") == "code"]
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
        source = cell_source(cell)
        for begin, end in solution_regions(source):
            statements = _region_statements(source, begin, end)
            if not statements:
                continue
            rename = sum(1 for s in statements for _ in ast.walk(s)) >= _TINY
            wanted = _TOKEN.findall(_fingerprint(statements, keep, rename))
            if not wanted:
                continue
            n = len(statements)
            label = exercise_label(instructor_nb.cells, index) or f"cell {index}"
            kind = EXERCISE_HEADING.search(source)
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
