"""Scheduling and timing for every pytest run of the course.

Scheduling (`make test`'s two workers): the longest items start first, so both workers end at about the
same time instead of one of them finishing a long chapter alone. A chapter's nbval cells go to one worker
together, in order (`--dist loadfile`: they share one kernel); their order among
the other items is set by the chapter's last measured time (tests/durations.py), and so is that of unit
tests that took over ``LONG_ITEM_S`` seconds.

Timing: every run writes what each item took to ``build/durations/$TC_DURATIONS_RUN.json`` (default
``pytest``): the figures the schedulers and the CI budget read.
"""

import json
import os
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tests"))
import durations  # noqa: E402

LONG_ITEM_S = 20.0  # a unit test that took longer than this is started among the chapters, longest first
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
    def seconds(item) -> float:
        if chapter := _chapter_run(item):
            return durations.cost(chapter)
        measured = durations.item_seconds(item.nodeid)
        return measured if measured > LONG_ITEM_S else 0.0

    items.sort(key=lambda item: -seconds(item))  # stable: a notebook's cells keep their order


_took: dict[str, float] = defaultdict(float)
_started = time.monotonic()


def pytest_runtest_logreport(report):
    _took[report.nodeid] += report.duration  # setup, call and teardown


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput") or not _took:  # an xdist worker: its controller writes
        return
    chapters: dict[str, float] = defaultdict(float)
    for nodeid, seconds in _took.items():
        path = nodeid.split("::")[0]
        if path.endswith(".ipynb"):
            chapters[Path(path).stem] += seconds
        elif "::" + STUDENT_EDITION_RUN + "[" in nodeid:
            chapters[Path(nodeid.split("[", 1)[1].rstrip("]")).stem] += seconds
    run = os.environ.get("TC_DURATIONS_RUN", "pytest")
    out = durations.RUNS / f"{run}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "run": run, "wall_s": round(time.monotonic() - _started, 1), "machine": _machine(),
        "chapters": {k: round(v, 1) for k, v in sorted(chapters.items())},
        "items": {k: round(v, 2) for k, v in sorted(_took.items(), key=lambda kv: -kv[1])},
    }
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, out)


def _machine() -> str:
    """The CPU's model name and core count (Linux), else the platform."""
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"
