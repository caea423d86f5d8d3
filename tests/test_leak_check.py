"""The leak check's statement and predict rules (classroom/leak_check.py), on planted cases: each rule
fires on a leak and stays quiet on the same notebook without it. (The copy rule's cases are in
tests/test_classroom.py; every real chapter is checked there too.)"""

import math

import nbformat
import pytest

from transformer_course.classroom.edition import student_notebook
from transformer_course.classroom.leak_check import (
    find_leaks,
    predicted_value,
    prediction_leaks,
    shows_answer,
    statement_leaks,
)

TRAIN_STEP = '''#| export
# Your turn - Exercise 6.3 (★★☆, build): one training step.
def train_step(model, optimizer, x, y):
    """One step: loss.item()."""
    ### BEGIN SOLUTION
    logits = model(x)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()
    ### END SOLUTION'''

# the same statements, other names, spread among others in a helper "written the same way"
ACCUMULATED = '''import torch
import torch.nn.functional as F

def accumulated(net, opt, batches):
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for inputs, targets in batches:
        out = net(inputs)
        l = F.cross_entropy(out.flatten(0, 1), targets.flatten()) / len(batches)
        l.backward()
        total += l.item()
    opt.step()
    return total'''

# the same job done by calling pieces, sharing fewer than half of the statements
SHARED_LITTLE = '''import torch
import torch.nn.functional as F

def accumulated(net, opt, batches):
    for inputs, targets in batches:
        scaled_loss(net, inputs, targets, len(batches)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)'''


def _nb(*cells):
    made = []
    for cell in cells:
        kind, source = cell if isinstance(cell, tuple) else ("code", cell)
        made.append(nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_code_cell(source))
    return nbformat.v4.new_notebook(cells=made)


def test_half_of_a_solutions_statements_elsewhere_is_a_leak():
    nb = _nb("import torch\nimport torch.nn.functional as F", TRAIN_STEP, ACCUMULATED)
    assert statement_leaks(nb, student_notebook(nb)) == [
        "Exercise 6.3: 3 of its solution's 6 statements are in student cells 2"]
    assert statement_leaks(nb, student_notebook(nb)) == [leak for leak in find_leaks(nb, student_notebook(nb))
                                                          if "statements" in leak]
    quiet = _nb("import torch\nimport torch.nn.functional as F", TRAIN_STEP, SHARED_LITTLE)
    assert statement_leaks(quiet, student_notebook(quiet)) == []
    # the same statements spread over two cells leak as well
    spread = _nb("import torch\nimport torch.nn.functional as F", TRAIN_STEP, SHARED_LITTLE,
                 "def scaled_loss(net, x, y, n):\n    return F.cross_entropy(net(x).flatten(0, 1), y.flatten()) / n",
                 "total = 0.0\nfor l in losses:\n    total += l.item()\nprint(total)\nl.backward()")
    assert statement_leaks(spread, student_notebook(spread)) == [
        "Exercise 6.3: 3 of its solution's 6 statements are in student cells 2, 4"]


def test_a_debug_exercise_and_a_short_solution_are_exempt():
    debug = TRAIN_STEP.replace("build", "debug")
    nb = _nb("import torch\nimport torch.nn.functional as F", debug, ACCUMULATED)
    assert statement_leaks(nb, student_notebook(nb)) == []
    short = '''# Your turn - Exercise 3.1 (★☆☆, build): scores.
def scores(q, k):
    ### BEGIN SOLUTION
    s = q @ k.T
    return s
    ### END SOLUTION'''
    nb = _nb(short, "def other(a, b):\n    s = a @ b.T\n    return s")
    assert statement_leaks(nb, student_notebook(nb)) == []  # two statements: find_leaks' business


PREDICT = '''# Your turn - Exercise 5.4 (★☆☆, predict): the size of one GPT-2 small block.
def my_prediction() -> int:
    """Parameters in a GPT-2 small block?"""
    ### BEGIN SOLUTION
    return 12 * 768**2 + 13 * 768
    ### END SOLUTION


check_predict_block_parameters(my_prediction)'''


def test_a_predict_answer_is_computed_from_the_answer_key():
    assert predicted_value(PREDICT) == 7_087_872
    assert predicted_value("def my_prediction():\n    return round(math.log(2), 3)") == 0.693
    assert predicted_value("x = 1") is None


@pytest.mark.parametrize(("text", "value", "shown"), [
    ("7,087,872 per block", 7_087_872, True),
    ("7087872", 7_087_872, True),
    ("7087873", 7_087_872, False),
    ("weights tensor([0.3333, 0.3333, 0.3333, 0.0000, 0.0000])", [1 / 3, 1 / 3, 1 / 3, 0.0, 0.0], True),
    ("weights tensor([0.3333, 0.3333, 0.3333, 0.0000])", [1 / 3, 1 / 3, 1 / 3, 0.0, 0.0], False),
    ("ln 65 = 4.174", 4.174387, True),
    ("about 4.2", 4.174387, False),  # two significant digits are everywhere
    ("the loss starts near 0.693", 0.693, True),
    ("torch.Size([4, 4, 10, 10])", (4, 4, 10, 10), True),
    ("(4, 10, 10)", (4, 4, 10, 10), False),
    ("40 new tokens", 40, False),  # a small whole number is not distinctive
    # a known constant, named: the answer key's round(math.log(2), 3) is log 2
    ("first loss is log 2: True", 0.693, True),
    ("-log σ(0) = ln 2.", 0.693, True),
    ("the loss starts at ln(2)", 0.693, True),
    ("log( 2 ) whatever beta is", round(math.log(2), 4), True),
    ("LOG 2", math.log(2), True),
    ("log2 76 = 6.25 bits", 0.693, False),  # a logarithm in base 2, not log 2
    ("log 20 and ln 2.5", 0.693, False),
    ("log 2", 0.69, False),  # two significant digits name no constant
    ("log 2", 0.7, False),
    ("ln 65 is the first loss", round(math.log(65), 3), True),
    ("a row of length √32", 32**0.5, True),
    ("sqrt(32) whatever the position", 32**0.5, True),
    ("√320 and sqrt(3)", 32**0.5, False),
])
def test_what_counts_as_showing_an_answer(text, value, shown):
    assert shows_answer(text, value) is shown


def test_a_predict_answer_above_the_exercise_or_just_below_it_is_a_leak():
    above = _nb(("markdown", "A GPT-2 block holds 7,087,872 parameters. Now predict it."), PREDICT)
    assert prediction_leaks(above, student_notebook(above)) == [
        "Exercise 5.4 (predict): the answer 7087872 is in sight in student cell 0 (its text)"]
    below = _nb(PREDICT, ("markdown", "That is 7,087,872."))
    assert prediction_leaks(below, student_notebook(below))
    folded = _nb(PREDICT, ("markdown", "<details><summary>The count</summary>\n\nThat is 7,087,872.\n\n</details>"))
    assert prediction_leaks(folded, student_notebook(folded)) == []
    far = _nb(PREDICT, "x = 1", "y = 2", ("markdown", "## Later\n\nThe block held 7,087,872."))
    assert prediction_leaks(far, student_notebook(far)) == []  # read after answering, as a book's next page


def _printing(source, text):
    cell = nbformat.v4.new_code_cell(source)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
    return cell


def test_the_student_edition_clears_outputs_that_show_a_predict_answer():
    nb = _nb(PREDICT, ("markdown", "## A later section"), "print('unrelated')", "print(count)")
    nb.cells[2] = _printing("print('unrelated')", "unrelated\n")
    nb.cells[3] = _printing("print(count)", "7087872\n")
    assert prediction_leaks(nb, nb) == [
        "Exercise 5.4 (predict): the answer 7087872 is in sight in student cell 3 (its output)"]
    student = student_notebook(nb)
    assert student.cells[3].outputs == [] and student.cells[2].outputs[0].text == "unrelated\n"
    assert prediction_leaks(nb, student) == []


LOG2 = '''# Your turn - Exercise 12.2 (★☆☆, predict): the first DPO loss.
def my_prediction() -> float:
    ### BEGIN SOLUTION
    return round(math.log(2), 3)
    ### END SOLUTION


check_predict_first_dpo_loss(my_prediction)'''


def test_a_named_constant_is_an_answer_in_sight():
    """Chapter 12's answer 0.693 was in sight as "log 2" (a stored output, the text above): the digits
    alone were looked for."""
    above = _nb(("markdown", "The first loss is log 2, whatever β. Now predict it."), LOG2)
    assert prediction_leaks(above, student_notebook(above)) == [
        "Exercise 12.2 (predict): the answer 0.693 is in sight in student cell 0 (its text)"]
    nb = _nb(LOG2, ("markdown", "## 4. Training"), "train()", ("markdown", "## Quick check"), "quiz()")
    nb.cells[2] = _printing("train()", "first loss is log 2: True\n")
    nb.cells[4] = _printing("quiz()", "Why is the first DPO loss ln(2) whatever β is?\n")
    assert prediction_leaks(nb, nb) == [
        "Exercise 12.2 (predict): the answer 0.693 is in sight in student cell 2 (its output)",
        "Exercise 12.2 (predict): the answer 0.693 is in sight in student cell 4 (its output)"]
    student = student_notebook(nb)  # the edition clears those outputs
    assert student.cells[2].outputs == [] and student.cells[4].outputs == []
    assert prediction_leaks(nb, student) == []
    quiet = _nb(LOG2, ("markdown", "## 4. Training"), "train()")
    quiet.cells[2] = _printing("train()", "the first loss is that of zero margins: True\n")
    assert prediction_leaks(quiet, student_notebook(quiet)) == []
    assert student_notebook(quiet).cells[2].outputs  # kept


def test_the_cells_right_after_a_predict_exercise_are_cleared_up_to_the_next_heading():
    nb = _nb(PREDICT, "plot()", ("markdown", "More text"), "plot()", ("markdown", "### Next"), "plot()")
    for index in (1, 3, 5):
        nb.cells[index] = _printing("plot()", "a figure\n")
    student = student_notebook(nb)
    assert [bool(student.cells[i].outputs) for i in (1, 3, 5)] == [False, False, True]


def test_a_prediction_that_cannot_run_on_its_own_is_reported():
    broken = PREDICT.replace("12 * 768**2 + 13 * 768", "model.count()")
    nb = _nb(broken)
    (leak,) = prediction_leaks(nb, student_notebook(nb))
    assert "cannot be computed on its own" in leak and "Exercise 5.4" in leak
