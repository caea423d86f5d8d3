"""Turn the GPU tier's JUnit XML into the stored summary (``make test-gpu`` runs it after pytest).

    python tools/gpu_test_report.py build/gpu_tests.xml benchmarks/results/gpu_tests.json

Writes, as JSON: the GPU (name, memory, compute capability), PyTorch and CUDA versions, the date, the
counts, and every test with its outcome, time, failure message and the figures it recorded with
``record_property`` (measured errors, losses). Exits 1 when a test failed or errored, or when none ran
(a tier that skipped everything proved nothing), saying so; the file is written either way.
"""

from __future__ import annotations

import json
import platform
import sys
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path


def _number(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def read_junit(path: Path) -> list[dict]:
    """Every test case of a pytest JUnit XML file: name, outcome, seconds, message, properties."""
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                message = (found.get("message") or found.text or "").strip()[:2000]
                break
        properties = {p.get("name"): _number(p.get("value", "")) for p in case.iter("property")}
        tests.append({"name": case.get("name"), "outcome": outcome, "seconds": float(case.get("time", 0.0)),
                      "message": message, "properties": properties})
    return tests


def device_facts() -> dict:
    import torch

    facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
             "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "gpu": None}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts["gpu"] = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                        "capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count}
    return facts


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    junit, out = Path(args[0]), Path(args[1])
    if not junit.is_file():
        print(f"{junit} is missing: pytest did not get as far as writing it (see its output above)", file=sys.stderr)
        return 1
    tests = read_junit(junit)
    counts = {outcome: sum(t["outcome"] == outcome for t in tests)
              for outcome in ("passed", "failed", "error", "skipped")}
    report = {**device_facts(), "counts": counts, "tests": tests}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    gpu = report["gpu"]["name"] if report["gpu"] else "no GPU"
    print(f"{out}: {gpu}, torch {report['torch']}: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    if counts["failed"] or counts["error"]:
        return 1
    if not counts["passed"]:
        print("no GPU test ran (all skipped or none collected): nothing was proven on a GPU", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
