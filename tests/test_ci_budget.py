"""tools/ci_budget.py: CI's steps timed against their shares of 60 minutes, and the durations snapshot."""

import json
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import ci_budget  # noqa: E402


@pytest.fixture
def steps_file(tmp_path, monkeypatch):
    path = tmp_path / "ci" / "steps.json"
    monkeypatch.setattr(ci_budget, "STEPS", path)
    return path


def test_the_shares_add_up_to_the_budget_and_name_every_step_of_ci():
    assert sum(ci_budget.SHARES.values()) == ci_budget.BUDGET_S == 3600
    ci = (ROOT / ".ci" / "run").read_text()
    for name in ci_budget.SHARES:
        assert f'step "{name}"' in ci, name


def test_a_step_is_timed_and_its_status_kept(steps_file, capsys):
    assert ci_budget.step("make test", [sys.executable, "-c", "pass"]) == 0
    assert ci_budget.step("make test-system", [sys.executable, "-c", "raise SystemExit(3)"]) == 3
    recorded = json.loads(steps_file.read_text())
    assert recorded["make test"]["status"] == 0 and recorded["make test-system"]["status"] == 3
    out = capsys.readouterr().out
    assert "ci: make test passed in" in out and "ci: make test-system FAILED (exit 3)" in out
    with pytest.raises(SystemExit, match="unknown step"):
        ci_budget.step("make nothing", [sys.executable, "-c", "pass"])


def test_check_names_each_step_over_its_share(steps_file, capsys):
    steps_file.parent.mkdir(parents=True)
    share = ci_budget.SHARES["make test-browser"]
    steps_file.write_text(json.dumps({"make test": {"seconds": 10.0, "status": 0},
                                      "make test-browser": {"seconds": share + 1.0, "status": 0}}))
    assert ci_budget.check() == 1
    err = capsys.readouterr().err
    assert f"make test-browser took {share + 1} s, over its share of {share} s" in err and "make test " not in err
    steps_file.write_text(json.dumps({"make test": {"seconds": 10.0, "status": 0}}))
    assert ci_budget.check() == 0


def test_the_snapshot_the_schedulers_fall_back_on_names_every_chapter():
    import durations

    snapshot = durations.read(durations.SNAPSHOT)
    chapters = {p.stem for p in (ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")}
    assert set(snapshot["chapters"]) == chapters, "run make test, then: python tools/ci_budget.py record"
    assert snapshot["machine"] and all(v > 0 for v in snapshot["chapters"].values())
    measured = durations.latest()["chapters"]
    assert durations.cost("06_gpt_and_training.ipynb") == measured["06_gpt_and_training"]
    assert durations.cost("99_not_a_chapter") == statistics.median(measured.values())  # never measured: the median
