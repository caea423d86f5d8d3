"""Quick self-test questions at the end of each chapter, as an offline ipywidgets quiz.

Hand-written support code. A chapter ends with::

    from transformer_course.quiz import Question, quiz
    quiz([
        Question("Why divide the scores by sqrt(head_size)?",
                 ["To make them positive", "To keep their spread near 1 so softmax does not saturate",
                  "To save memory"],
                 answer=1, explain="q.k sums head_size products, so its variance grows with head_size."),
    ])

Each question shows its options as radio buttons and a "Check" button; the feedback says whether the
choice is right and explains why. Nothing is loaded from the network. The stored output (text/plain)
is a short summary, so nbval compares something stable.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Question:
    prompt: str
    options: list[str] = field(default_factory=list)
    answer: int = 0  # index into options
    explain: str = ""

    def __post_init__(self) -> None:
        if len(self.options) < 2:
            raise ValueError(f"a question needs at least two options, got {len(self.options)}: {self.prompt!r}")
        if not 0 <= self.answer < len(self.options):
            raise ValueError(
                f"answer must index one of the {len(self.options)} options (0..{len(self.options) - 1}), "
                f"got {self.answer} for {self.prompt!r}"
            )

    def feedback(self, choice: int | None) -> str:
        """The text shown after pressing "Check" with option ``choice`` selected (None: nothing chosen)."""
        if choice is None:
            return "Pick an answer first."
        verdict = "Right." if choice == self.answer else f"Not quite: the answer is {self.options[self.answer]!r}."
        return f"{verdict} {self.explain}".strip()


class Quiz:
    """The widget for a list of questions; ``.answer(i, choice)`` drives it from code (tests, demos)."""

    def __init__(self, questions: list[Question], title: str = "Quick check"):
        import ipywidgets as w

        if not questions:
            raise ValueError("a quiz needs at least one question")
        self.questions = list(questions)
        self._radios, self._feedback, rows = [], [], [w.HTML(f"<b>{title}</b>")]
        for i, q in enumerate(self.questions):
            radio = w.RadioButtons(options=list(q.options), value=None, layout=w.Layout(width="auto"))
            button = w.Button(description="Check", button_style="info")
            note = w.HTML("")
            button.on_click(lambda _, i=i: self._check(i))
            self._radios.append(radio)
            self._feedback.append(note)
            rows.append(w.VBox([w.HTML(f"{i + 1}. {q.prompt}"), radio, w.HBox([button, note])]))
        self.widget = w.VBox(rows)

    def _choice(self, i: int) -> int | None:
        value = self._radios[i].value
        return None if value is None else self.questions[i].options.index(value)

    def _check(self, i: int) -> str:
        text = self.questions[i].feedback(self._choice(i))
        colour = "green" if self._choice(i) == self.questions[i].answer else "#b00"
        self._feedback[i].value = f"<span style='color:{colour}'>{text}</span>"
        return text

    def answer(self, i: int, choice: int) -> str:
        """Select option ``choice`` of question ``i``, press Check, and return the feedback text."""
        self._radios[i].value = self.questions[i].options[choice]
        return self._check(i)

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = repr(self)
        return bundle

    def __repr__(self) -> str:
        n = len(self.questions)
        return f"Quick check: {n} question{'s' if n != 1 else ''}"


def quiz(questions: list[Question], title: str = "Quick check") -> Quiz:
    """Build the quiz widget; end a cell with it (or ``display`` it) to show it."""
    return Quiz(questions, title)
