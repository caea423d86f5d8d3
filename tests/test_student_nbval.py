"""tools/student_nbval.py: the student edition with the key's outputs, each verdict turned into "not done"."""

import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import student_nbval  # noqa: E402

REFERENCES = {"3.2": "causal_mask", "3.3": None}


def test_a_passed_verdict_becomes_the_stubs_line_and_a_planted_failure_stays():
    text = ("✅ Exercise 3.2 (causal_mask): passed - the rest of the chapter uses yours\ntensor([1])\n"
            "✅ Exercise 3.3 (equal scores): passed\n"
            "❌ Exercise 3.2 (causal_mask): wrong on purpose - the chapter carries on with the package's causal_mask\n")
    assert student_nbval.not_done_text(text, REFERENCES).split("\n") == [
        "⏳ Exercise 3.2 (causal_mask): not done yet - the chapter carries on with the package's causal_mask",
        "tensor([1])",
        "⏳ Exercise 3.3 (equal scores): not done yet - the chapter carries on with the package's reference "
        "implementation",
        "❌ Exercise 3.2 (causal_mask): wrong on purpose - the chapter carries on with the package's causal_mask",
        "",
    ]


def test_every_check_names_its_exercise_and_reference():
    references = student_nbval._references()
    assert len(references) >= 70 and references["3.2"] == "causal_mask"


def test_the_key_outputs_go_to_the_student_cells_and_a_learner_branch_is_not_compared():
    out = nbformat.v4.new_output("stream", name="stdout", text="✅ Exercise 3.2 (causal_mask): passed\n")
    key = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 3"),
        nbformat.v4.new_code_cell("check(causal_mask)", outputs=[out], execution_count=1),
        nbformat.v4.new_code_cell('print("yours" if ok else "pass Exercise 3.2 to use yours")', execution_count=2),
    ])
    student = nbformat.v4.new_notebook(cells=[nbformat.from_dict(c) for c in key.cells])
    student.cells[1].outputs, student.cells[1].execution_count = [], None
    got = student_nbval.with_key_outputs(student, key)
    assert got.cells[1].execution_count == 1
    assert got.cells[1].outputs[0]["text"].startswith("⏳ Exercise 3.2 (causal_mask): not done yet")
    assert got.cells[2].source.startswith("# NBVAL_IGNORE_OUTPUT\n")
    assert key.cells[1].outputs[0]["text"].startswith("✅")  # the key itself is untouched
