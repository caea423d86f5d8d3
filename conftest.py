"""Scheduling for `make test` and `make test-student` (two workers): the longest items, whole-chapter
runs (nbval's and the student edition's), start first, so the two workers end at about the same time
instead of one of them finishing a long chapter alone. Tests are handed out two at a time
(`--maxschedchunk 2`); a chapter's cells go to one worker together, in order (`--dist loadfile`: they
share one kernel).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))
from chapter_costs import cost  # noqa: E402

# other long items, in chapter_costs' units (about 15 s of one core): tests/test_wheel.py builds, installs and runs
LONG_TESTS = {"test_the_installed_wheel_runs_every_command": 8}
STUDENT_EDITION_RUN = "test_student_edition_runs_and_every_exercise_is_not_done"


def _chapter_run(item) -> str | None:
    """The chapter an item runs whole (an nbval cell, or a student-edition run), else None."""
    path = Path(str(item.fspath))
    if path.suffix == ".ipynb":
        return path.stem
    if getattr(item, "originalname", None) == STUDENT_EDITION_RUN:
        return Path(item.callspec.params["name"]).stem
    return None


def pytest_collection_modifyitems(config, items):
    # the student-edition runs execute every chapter a second time: `make test-student`, not `make test`
    for item in items:
        if getattr(item, "originalname", None) == STUDENT_EDITION_RUN:
            item.add_marker("student_edition")
    # stable: a notebook's cells keep their order; items that run no chapter keep theirs, after
    items.sort(key=lambda item: -cost(chapter) if (chapter := _chapter_run(item))
               else -LONG_TESTS.get(item.originalname, 0))
