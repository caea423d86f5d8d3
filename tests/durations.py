"""How long things take, as last measured: read by the schedulers, never asserted.

Every pytest run writes what each item took to ``build/durations/<run>.json`` (the root conftest.py;
``<run>`` is ``$TC_DURATIONS_RUN``, default ``pytest``): per item, and per chapter (the sum of its nbval
cells, or a student-edition run). The schedulers read those figures: `make test` starts the longest
chapters first so that its two workers end together (conftest.py), and the browser test splits the
chapters into jobs of equal cost (tests/browser/lab_e2e.py). A clone that has not run the tests yet reads
``tests/durations.json``, the same figures from the last `make test` an author recorded with
``python tools/ci_budget.py record`` (machine named inside). Nothing here is kept by hand.
"""

from __future__ import annotations

import json
import statistics
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "build" / "durations"
SNAPSHOT = ROOT / "tests" / "durations.json"
MEASURED_RUN = "test"  # the run whose figures the schedulers prefer: `make test`'s (one thread a chapter)


def read(path: Path) -> dict:
    """A durations file's content, {} when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@cache
def latest() -> dict:
    """The last measured figures: this clone's `make test` run if it has one with chapters, else the snapshot."""
    here = read(RUNS / f"{MEASURED_RUN}.json")
    return here if here.get("chapters") else read(SNAPSHOT)


def cost(name: str) -> float:
    """Seconds chapter ``name`` (a notebook name or path, with or without .ipynb) took to run, as last
    measured; a chapter never measured counts as the median chapter."""
    chapters = latest().get("chapters", {})
    stem = Path(name).stem
    if stem in chapters:
        return float(chapters[stem])
    return float(statistics.median(chapters.values())) if chapters else 1.0


def item_seconds(nodeid: str) -> float:
    """Seconds the test ``nodeid`` took when last measured (0 when never)."""
    return float(latest().get("items", {}).get(nodeid, 0.0))
