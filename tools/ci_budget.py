"""CI's time budget: each step of `.ci/run` timed, printed, and held to its share of 60 minutes.

CI stops a submission that runs past 90 minutes; the project keeps `.ci/run` under 40 so that it can grow.
Each step has a share of a 60-minute budget (``SHARES``, seconds, on a 2-core machine of the slowest
kind CI lands on, cold: venvs built). A step that takes longer than its share fails CI at the end of
the run, naming the step, its time and its share: growth is seen one stop before it blocks a landing.
This is CI's guard, not a test: no test asserts a time.

Standard library only (it runs before any venv exists):

    python3 tools/ci_budget.py step NAME -- CMD ...   run CMD; record and print its time under NAME
    python3 tools/ci_budget.py check                   the table of steps; exit 1 when one exceeded its share
    python3 tools/ci_budget.py record                  copy the last `make test` durations into
                                                       tests/durations.json (what a fresh clone schedules by)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ROOT / "build" / "ci" / "steps.json"
BUDGET_S = 3600
# each step's share of BUDGET_S, in seconds (docs/testing.md gives the times measured against them)
SHARES = {
    "make test": 660,
    "make test-system": 360,
    "torch floor venv": 300,
    "make test-torch-floor": 960,
    "torch newest venv": 300,
    "make test-torch-newest": 540,
    "make test-browser": 480,
}
assert sum(SHARES.values()) == BUDGET_S, sum(SHARES.values())


def _load() -> dict:
    try:
        return json.loads(STEPS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def step(name: str, cmd: list[str]) -> int:
    """Run ``cmd``; record its wall time under ``name``; return its exit status."""
    if name not in SHARES:
        raise SystemExit(f"ci_budget: unknown step {name!r}; give it a share in tools/ci_budget.py SHARES")
    start = time.monotonic()
    status = subprocess.call(cmd)
    took = time.monotonic() - start
    steps = _load()
    steps[name] = {"seconds": round(took, 1), "status": status}
    STEPS.parent.mkdir(parents=True, exist_ok=True)
    STEPS.write_text(json.dumps(steps, indent=1) + "\n", encoding="utf-8")
    total = sum(s["seconds"] for s in steps.values())
    verdict = "passed" if status == 0 else f"FAILED (exit {status})"
    print(f"ci: {name} {verdict} in {took:.0f} s (share {SHARES[name]} s); steps so far {total:.0f} s", flush=True)
    return status


def check() -> int:
    """Print every recorded step against its share; 1 when one ran over."""
    steps, over = _load(), []
    print(f"{'step':<24} {'seconds':>8} {'share':>6}")
    for name, share in SHARES.items():
        if name in steps:
            took = steps[name]["seconds"]
            print(f"{name:<24} {took:>8.0f} {share:>6}{'  OVER' if took > share else ''}")
            if took > share:
                over.append(f"{name} took {took:.0f} s, over its share of {share} s")
    total = sum(s["seconds"] for s in steps.values())
    print(f"{'total':<24} {total:>8.0f} {BUDGET_S:>6}")
    if over:
        print("ci: over budget: " + "; ".join(over) + ". Make the step faster, or move time from another "
              "step's share in tools/ci_budget.py SHARES (the shares add up to 60 minutes: CI stops at 90)",
              file=sys.stderr)
        return 1
    return 0


def record() -> int:
    """tests/durations.json <- build/durations/test.json (chapters and items over a second)."""
    source = ROOT / "build" / "durations" / "test.json"
    data = json.loads(source.read_text(encoding="utf-8"))
    if not data.get("chapters"):
        raise SystemExit(f"{source} has no chapter figures: run make test first")
    data["items"] = {k: v for k, v in data["items"].items() if v >= 1.0 and ".ipynb::" not in k}
    target = ROOT / "tests" / "durations.json"
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, target)
    print(f"wrote {target.relative_to(ROOT)}: {len(data['chapters'])} chapters, {len(data['items'])} items "
          f"({data.get('machine', 'machine not named')})")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["step"] and len(argv) >= 4 and argv[2] == "--":
        if shutil.which(argv[3]) is None and not Path(argv[3]).exists():
            raise SystemExit(f"ci_budget: {argv[3]}: command not found")
        return step(argv[1], argv[3:])
    if argv == ["check"]:
        return check()
    if argv == ["record"]:
        return record()
    raise SystemExit(__doc__.strip().split("Standard library only")[1].split("\n", 1)[1])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
