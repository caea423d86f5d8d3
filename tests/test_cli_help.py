"""The command line as a new user meets it (issue 40): --help says what the presets are, shows defaults, has
help for every option and examples, and says that train resumes; --version; the progress bar shows the
running training loss and plain lines replace it with --no-progress or when the output is not a terminal;
print(history) is one line; the teacher's commands name the extra they need."""

import argparse
import importlib.util
import re

import pytest

import transformer_course
from transformer_course import cli
from transformer_course.config import PRESETS, TRAIN_PRESETS, History


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_option_of_every_command_has_help():
    parser = cli.build_parser()
    commands = _subparsers(parser)
    assert set(commands) >= {"train", "generate", "chat", "student-edition", "grade"}
    for name, command in [("", parser), *commands.items()]:
        for action in command._actions:
            if not isinstance(action, argparse._SubParsersAction):
                assert action.help and action.help.strip(), f"{name} {action.option_strings or action.dest}: no help"


def test_help_lists_the_presets_with_what_they_are_and_examples(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for name, recipe in TRAIN_PRESETS.items():
        shape = PRESETS[name]
        line = next(line for line in text.splitlines() if line.strip().startswith(name + " "))
        assert f"{shape.n_layer} layers x {shape.n_head} heads, width {shape.d_model}" in line, line
        assert f"{recipe.max_iters:,} steps" in line and f"{recipe.batch_size} windows" in line, line
    assert "Examples:" in text and "transformer-course train --preset tiny --out runs/tiny" in text
    assert "resumes" in text  # train's one-line summary


def test_train_help_says_it_resumes_and_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert "Resumes from --out" in text and "checkpoint.pt" in text
    assert "(default: tiny)" in text and "(default: 1337)" in text and "--no-progress" in text
    assert re.search(r"tiny 4 layers x 4 heads", text)


def test_generate_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    text = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert "(default: 200)" in text and "(default: 1.0)" in text and "(default: 0)" in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"transformer-course {transformer_course.__version__}"


def test_print_history_is_one_short_line():
    h = History(tokens_per_step=768, step=list(range(5000)), loss=[2.0] * 5000, lr=[1e-3] * 5000,
                eval_step=[0, 2500, 5000], train_loss=[4.2, 1.9, 1.61234], val_loss=[4.2, 2.0, 1.87654],
                eval_seconds=[0.0, 50.0, 100.0], train_seconds=90.0, wall_seconds=101.25)
    text = repr(h)
    assert text == "History(5000 steps, train loss 1.6123, val loss 1.8765 at step 5000, 101.2 s)", text
    assert str(h) == text and "\n" not in text
    assert repr(History()) == "History(0 steps, not evaluated, 0.0 s)"


def test_running_loss_is_the_mean_of_the_last_steps():
    from transformer_course.training import _running_loss

    assert _running_loss([], [], []) == {}
    assert _running_loss([9.0] + [2.0] * 50, [], []) == {"loss": "2.000"}
    assert _running_loss([1.0, 2.0], [1.5], [1.75]) == {"loss": "1.500", "train": "1.500", "val": "1.750"}


def _train(tmp_path, *extra):
    return cli.main(["train", "--preset", "tiny", "--out", str(tmp_path / "run"), "--max-iters", "2",
                     "--eval-iters", "1", "--device", "cpu", *extra])


def test_train_prints_plain_lines_when_asked_or_not_a_terminal(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert _train(tmp_path, "--no-progress") == 0
    out, err = capsys.readouterr()
    assert re.search(r"^step 0/2: train loss \d+\.\d{4}, val loss \d+\.\d{4}, \d+ s$", out, re.M), out
    assert re.search(r"^step 2/2: running loss \d+\.\d{3}, train loss \d+\.\d{4}, val loss", out, re.M), out
    assert "training:" not in err and "step/s" not in err  # no bar
    monkeypatch.undo()  # pytest's captured output is not a terminal: plain lines without the flag too
    assert _train(tmp_path / "again") == 0
    out, err = capsys.readouterr()
    assert "step 2/2: running loss" in out and "training:" not in err


def test_train_in_a_terminal_shows_a_bar_with_the_running_loss(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert _train(tmp_path) == 0
    out, err = capsys.readouterr()
    assert "step 2/2" not in out
    assert re.search(r"training: 100%.*2/2.*loss=\d+\.\d{3}, train=\d+\.\d{3}, val=\d+\.\d{3}", err), err


def test_teacher_commands_name_the_extra_when_it_is_missing(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("nbformat", "jupyter_client") else real(name, *a))
    assert cli.main(["student-edition", str(tmp_path / "edition")]) == 2
    err = capsys.readouterr().err
    assert "student-edition: error: nbformat is not installed" in err and "`teacher` extra" in err, err
    assert 'pip install ".[teacher]"' in err and "pip install nbformat jupyter-client ipykernel" in err
    assert not (tmp_path / "edition").exists()
    assert cli.main(["grade", str(tmp_path / "x.ipynb")]) == 2
    assert "grade: error: jupyter_client is not installed" in capsys.readouterr().err

    from transformer_course.classroom.sandbox import sandbox_problem

    assert "jupyter_client is not installed (the course's `teacher` extra)" in sandbox_problem()


def test_the_chapters_are_found_in_the_clone_or_named_as_missing(tmp_path):
    from pathlib import Path

    from transformer_course.classroom.edition import write_student_edition
    from transformer_course.classroom.exercise_cells import COURSE_CHAPTERS, course_chapters

    root = Path(__file__).resolve().parents[1]
    assert course_chapters() == COURSE_CHAPTERS == root / "chapters"
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="--chapters"):
        write_student_edition(tmp_path / "out", tmp_path / "empty")


def test_the_library_train_bar_shows_the_running_loss(capsys):
    """Chapter 06's `train` (what a notebook calls) puts the running loss on its bar too."""
    import torch

    from transformer_course import GPT, GPTConfig, TrainConfig, train

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, d_model=16))
    data = torch.randint(11, (400,))
    history = train(model, data, data, TrainConfig(max_iters=3, batch_size=2, eval_iters=1, eval_interval=10,
                                                   warmup_iters=1, device="cpu"))
    err = capsys.readouterr().err
    assert re.search(r"training: 100%.*3/3.*loss=\d+\.\d{3}, train=\d+\.\d{3}, val=\d+\.\d{3}", err), err
    assert repr(history).startswith("History(3 steps, train loss ")
