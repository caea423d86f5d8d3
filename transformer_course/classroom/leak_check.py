"""The leak check: does a student edition give an exercise's answer away? (hand-written)

Used by ``transformer-course student-edition`` (which refuses to write an edition that gives an answer
away) and by ``tests/test_classroom.py``. Three ways an answer leaks:

- a copy of a solution region elsewhere (``find_leaks``): regions and code cells are compared as
  syntax trees, so renamed variables or another layout do not hide a copy;
- half or more of a build exercise's statements elsewhere in the notebook (``statement_leaks``), even
  spread out among other statements, as a helper written "in the same way" would show them;
- a predict exercise's answer in sight before the learner answers (``prediction_leaks``): in a stored
  output anywhere, or in the text above the exercise or just below it (``docs/authoring.md``), as
  digits or, for a known constant, by its name (``log 2`` for 0.693).
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
    return leaks + statement_leaks(instructor_nb, student_nb) + prediction_leaks(instructor_nb, student_nb)


# ---------------------------------------------------------------- statements of a build exercise

STATEMENT_SHARE = 0.5  # this share of a solution's statements in one other cell gives the answer away
_MIN_STATEMENTS = 3  # a solution of fewer statements is left to find_leaks (one line is everywhere)


def _leaf_statements(statements):
    """The simple statements (assignments, calls, returns) under ``statements``, in order; loops and
    branches are looked into, function bodies too."""
    import ast

    for node in statements:
        for sub in ast.walk(node):
            if isinstance(sub, ast.stmt) and not isinstance(
                    sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.While, ast.If, ast.With,
                          ast.Try, ast.Pass)):
                if isinstance(sub, ast.Expr) and isinstance(sub.value, ast.Constant):
                    continue  # a docstring
                yield sub


def _statement_forms(statement, keep: set[str]) -> set[str]:
    """A simple statement's forms: names as written and, when the statement says more than its local
    names (an attribute, a constant, an imported name), local names numbered within it: then
    ``loss = F.cross_entropy(logits, y)`` matches ``l = F.cross_entropy(out, t)``, while ``y = f(x)``
    matches only itself."""
    import ast

    forms = {"as written: " + _fingerprint([statement], keep, rename=False)}
    if any(isinstance(node, (ast.Attribute, ast.Constant)) or (isinstance(node, ast.Name) and node.id in keep)
           for node in ast.walk(statement)):
        forms.add("renamed: " + _fingerprint([statement], keep, rename=True))
    return forms


def statement_leaks(instructor_nb, student_nb) -> list[str]:
    """Build and extend exercises (not debug ones, whose buggy version is shown on purpose, nor predict
    ones) of ``_MIN_STATEMENTS`` statements or more, half or more of whose statements (``STATEMENT_SHARE``)
    appear anywhere in ``student_nb``'s code. Returns one line per leak, naming the cells."""
    student = [(i, t) for i, c in enumerate(student_nb.cells)
               if c.get("cell_type") == "code" and (t := _parse(cell_source(c))) is not None]
    keep = _bound_globals([t for _, t in student])
    cells = {i: set().union(*(_statement_forms(s, keep) for s in _leaf_statements(t.body))) for i, t in student}
    leaks = []
    for index, cell in enumerate(instructor_nb.cells):
        source = cell_source(cell) if cell.get("cell_type") == "code" else ""
        kind = EXERCISE_HEADING.search(source)
        if not kind or kind.group(3) not in ("build", "extend"):
            continue
        for begin, end in solution_regions(source):
            statements = list(_leaf_statements(_region_statements(source, begin, end) or []))
            if len(statements) < _MIN_STATEMENTS:
                continue
            where = [sorted(i for i, forms in cells.items() if _statement_forms(s, keep) & forms) for s in statements]
            shown = sum(1 for found in where if found)
            if shown >= STATEMENT_SHARE * len(statements):
                label = exercise_label(instructor_nb.cells, index) or f"cell {index}"
                places = ", ".join(map(str, sorted({i for found in where for i in found})))
                leaks.append(f"{label}: {shown} of its solution's {len(statements)} statements are in student "
                             f"cells {places}")
    return leaks


# ---------------------------------------------------------------- the answer of a predict exercise

NEAR_BELOW = 2  # cells just under a predict exercise, on screen while the learner answers it
_NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")
_DETAILS = re.compile(r"<details>.*?</details>", re.S)  # folded away until the learner opens it


def predicted_value(source: str):
    """The answer of a predict exercise cell: its solution function (``def my_prediction(): ...``, plain
    Python and ``math`` only) run on its own. None when the cell defines no such function."""
    import ast
    import math

    tree = _parse(source)
    for node in tree.body if tree is not None else []:
        if isinstance(node, ast.FunctionDef) and not node.args.args:
            namespace = {"math": math}
            exec(compile(ast.Module([node], []), "<prediction>", "exec"), namespace)  # the course's own answer key
            return namespace[node.name]()
    return None


def _significant(text: str) -> int:
    digits = text.replace(",", "").replace("-", "").split("e")[0].split("E")[0].replace(".", "").lstrip("0")
    return len(digits)


def _shows_number(text: str, value: float) -> bool:
    """Whether ``text`` is ``value`` as people print it: exact for whole numbers (``7087872``,
    ``7,087,872``), for fractions rounded to the digits shown with at least three significant ones
    (``0.333`` or ``0.3333`` for 1/3, not ``0.3``)."""
    try:
        shown = float(text.replace(",", ""))
    except ValueError:
        return False
    if float(value).is_integer() and "." not in text and "e" not in text.lower():
        return shown == value
    decimals = len(text.split(".")[1]) if "." in text else 0
    return _significant(text) >= 3 and abs(shown - value) <= 0.5 * 10 ** -decimals + 1e-12


def _distinctive(value) -> bool:
    """A number worth looking for: small whole numbers (0, 1, 40) are everywhere."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not (
        float(value).is_integer() and abs(value) < 100)


_LARGEST_KNOWN = 1000  # log n and √n are named for whole n up to this (a vocabulary's ln 65, √32)


def _known_constants(value: float) -> list[re.Pattern]:
    """How people write ``value`` when it is a known constant, the natural logarithm or the square root of
    a whole number (``log 2``, ``ln(2)``, ``√32``, ``sqrt(32)``), to the digits the answer key gives
    (``round(math.log(2), 3)`` is log 2): an answer key rounded to fewer than three significant digits
    names no constant. Empty when ``value`` is none of them."""
    import math

    text = repr(float(value))
    if "e" in text.lower() or _significant(text) < 3 or not 0 < value < 1e6:
        return []
    decimals = len(text.split(".")[1])
    tolerance = 0.5 * 10 ** -decimals + 1e-12

    def close(n: int, of) -> bool:
        return 2 <= n <= _LARGEST_KNOWN and abs(of(n) - value) <= tolerance

    end = r"(?![\w.]\d|\d|\w)"  # not log 20, log 2x, log 2.5
    found = []
    if value < math.log(_LARGEST_KNOWN) + 1 and close(n := round(math.exp(value)), math.log):
        # log 2, ln 2, log(2), ln(2), but not log2 76 (a logarithm in base 2)
        found.append(re.compile(rf"(?<!\w)(?:log|ln)(?:\s+|\s*\(\s*){n}\s*\)?{end}", re.I))
    if close(n := round(value * value), math.sqrt) and math.isqrt(n) ** 2 != n:
        found.append(re.compile(rf"(?:√\s*\(?\s*|(?<!\w)sqrt\s*\(\s*|(?<!\w)sqrt\s+){n}\s*\)?{end}", re.I))
    return found


def shows_answer(text: str, value) -> bool:
    """Whether ``text`` shows the answer ``value``: a distinctive number as printed, the known constant
    it is written in words or symbols (``log 2`` for 0.693, ``_known_constants``), or a sequence of
    numbers (a shape, a list of weights) written out in order, in brackets or parentheses."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not _distinctive(value):
            return False
        return any(_shows_number(m.group(), value) for m in _NUMBER.finditer(text)) or any(
            pattern.search(text) for pattern in _known_constants(value))
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) for v in value):
        for group in re.findall(r"[\[(]([^\[\]()]*)[\])]", text):
            numbers = _NUMBER.findall(group)
            if len(numbers) == len(value) and all(
                    _shows_number(n, v) or (float(v).is_integer() and float(n.replace(",", "")) == v)
                    for n, v in zip(numbers, value, strict=True)):
                return True
    return False


def _visible_text(cell, with_source: bool) -> str:
    """What a learner sees of a cell before running anything: markdown (outside ``<details>``), code, and
    the stored outputs' text."""
    parts = [_DETAILS.sub("", cell_source(cell))] if with_source else []
    for output in cell.get("outputs", []) or []:
        data = output.get("data", {}) if isinstance(output, dict) else {}
        for text in (output.get("text"), data.get("text/plain"), data.get("text/markdown"), data.get("text/html")):
            if text:
                parts.append("".join(text) if isinstance(text, list) else str(text))
    return "\n".join(parts)


def predict_answers(nb) -> list:
    """The answers of a notebook's predict exercises that can be computed on their own, in order."""
    answers = []
    for cell in nb.cells:
        source = cell_source(cell) if cell.get("cell_type") == "code" else ""
        kind = EXERCISE_HEADING.search(source)
        if kind and kind.group(3) == "predict" and solution_regions(source):
            try:
                answers.append(predicted_value(source))
            except Exception:  # noqa: BLE001, S112 (prediction_leaks reports it)
                continue
    return answers


def output_shows_an_answer(cell, answers) -> bool:
    """Whether a cell's stored outputs show one of ``answers`` (the student edition clears them)."""
    text = _visible_text(cell, with_source=False)
    return bool(text) and any(shows_answer(text, value) for value in answers)


def prediction_leaks(instructor_nb, student_nb) -> list[str]:
    """Predict exercises whose answer a learner can see before answering: in the stored output of any
    cell of ``student_nb``, or in the markdown or code above the exercise or within ``NEAR_BELOW`` cells
    under it (markdown inside ``<details>`` is folded and does not count). Returns one line per leak."""
    leaks = []
    for index, cell in enumerate(instructor_nb.cells):
        source = cell_source(cell) if cell.get("cell_type") == "code" else ""
        kind = EXERCISE_HEADING.search(source)
        if not kind or kind.group(3) != "predict" or not solution_regions(source):
            continue
        label = exercise_label(instructor_nb.cells, index) or f"cell {index}"
        try:
            value = predicted_value(source)
        except Exception as error:  # noqa: BLE001 (any error of the answer key's function is reported)
            leaks.append(f"{label} (predict): its answer cannot be computed on its own ({error!r}), so the leak "
                         "check cannot look for it: write my_prediction with plain Python and math only")
            continue
        for where, other in enumerate(student_nb.cells):
            if where == index:
                continue
            in_sight = where < index or where <= index + NEAR_BELOW
            if shows_answer(_visible_text(other, with_source=in_sight), value):
                place = "its output" if not in_sight or shows_answer(_visible_text(other, False), value) else "its text"
                leaks.append(f"{label} (predict): the answer {value!r} is in sight in student cell {where} ({place})")
    return leaks
