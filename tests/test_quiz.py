import pytest

from transformer_course.quiz import Question, quiz


def test_feedback_and_widget():
    q = quiz([Question("2 + 2?", ["3", "4"], answer=1, explain="Count them."),
              Question("x?", ["a", "b", "c"], answer=2)])
    assert repr(q) == "Quick check: 2 questions"
    assert q.answer(0, 0) == "Not quite: the answer is '4'. Count them."
    assert q.answer(0, 1) == "Right. Count them."
    assert "green" in q._feedback[0].value
    assert q.answer(1, 2) == "Right."
    assert Question("x?", ["a", "b"]).feedback(None) == "Pick an answer first."
    assert q._repr_mimebundle_()["text/plain"] == "Quick check: 2 questions"


def test_bad_questions():
    with pytest.raises(ValueError, match="at least two options"):
        Question("x?", ["only"])
    with pytest.raises(ValueError, match=r"answer must index one of the 2 options \(0..1\), got 2"):
        Question("x?", ["a", "b"], answer=2)
    with pytest.raises(ValueError, match="at least one question"):
        quiz([])
