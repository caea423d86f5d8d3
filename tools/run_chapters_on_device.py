"""Run every chapter top to bottom on a device, outputs not compared: does the course run there?

    python tools/run_chapters_on_device.py                   # every chapters/NN_*.ipynb on CUDA
    python tools/run_chapters_on_device.py --device cpu chapters/00_welcome.ipynb   # a dry run, any machine
    python tools/run_chapters_on_device.py --jobs 4 chapters/06_*.ipynb chapters/07_*.ipynb ...  # 4 at a time

Each notebook runs in a fresh ``python3`` kernel with ``chapters/`` as its working directory (as
``tools/nb.py build`` and nbval run it), with ``TRANSFORMER_COURSE_DEVICE`` set to the device, so
``pick_device()`` and the trainer's default choose it, and the Hugging Face hub switched off (the
stored outputs are the offline ones). Cells tagged ``raises-exception`` may raise, as in the build;
any other error fails the chapter, and the next chapter still runs. The notebooks are not modified:
their outputs differ from the CPU's stored ones and are not compared.

Writes, per chapter, passed or failed, the seconds it took and the first error (cell, exception,
message) to ``benchmarks/results/gpu_chapters.json`` (``--out`` elsewhere), with the device and the
GPU named. The report is rewritten after every chapter, so a run stopped by a time limit keeps what it
finished (the chapters not reached are listed as such). Chapters run in the order given; ``--jobs N``
runs N at a time, each kernel in its own process. Exits 1 when a chapter failed or was not reached, 2
when the device asked for is not available.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
OUT = ROOT / "benchmarks" / "results" / "gpu_chapters.json"
sys.path.insert(0, str(ROOT))


def first_error(nb) -> dict | None:
    """The first error output of an executed notebook: cell index, exception name and message."""
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                return {"cell": index, "ename": output.get("ename"), "evalue": str(output.get("evalue"))[:500]}
    return None


def run_chapter(path: Path, timeout: int) -> dict:
    """Execute one notebook in a fresh kernel (in memory only); passed, seconds and the first error."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(CHAPTERS)}})
    start = time.perf_counter()
    error = None
    try:
        client.execute()
    except CellExecutionError:
        error = first_error(nb) or {"cell": None, "ename": "CellExecutionError", "evalue": ""}
    except (CellTimeoutError, DeadKernelError) as exc:
        error = {"cell": None, "ename": type(exc).__name__, "evalue": str(exc).splitlines()[0][:500]}
    return {"chapter": path.stem, "passed": error is None, "seconds": round(time.perf_counter() - start, 1),
            "error": error}


def device_facts(device: str) -> dict:
    import torch

    facts = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
             "python": platform.python_version(), "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "gpu": None}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        facts["gpu"] = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                        "capability": f"{props.major}.{props.minor}"}
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every chapters/NN_*.ipynb")
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, mps or cpu")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--timeout", type=int, default=900, help="seconds one cell may run")
    parser.add_argument("--jobs", type=int, default=1, help="chapters run at a time, each in its own kernel")
    args = parser.parse_args(argv)
    from transformer_course.runtime import DEVICE_ENV, pick_device

    try:
        pick_device(args.device)
    except (RuntimeError, ValueError) as error:
        print(f"cannot run the chapters on {args.device!r}: {error}", file=sys.stderr)
        return 2
    notebooks = args.notebooks or sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
    if missing := [str(p) for p in notebooks if not p.is_file()]:
        parser.error(f"no such notebook: {', '.join(missing)}")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give 1 or more")
    # the kernels inherit this environment
    os.environ.update({DEVICE_ENV: args.device, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    facts, results = device_facts(args.device), {}

    def write() -> dict:
        rows = [results.get(p.stem, {"chapter": p.stem, "passed": False, "seconds": None, "error": None,
                                     "not_reached": True}) for p in notebooks]
        report = {**facts, "chapters": rows, "passed": sum(r["passed"] for r in rows),
                  "failed": sum(not r["passed"] and not r.get("not_reached") for r in rows),
                  "not_reached": sum(bool(r.get("not_reached")) for r in rows)}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        return report

    write()
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        running = {pool.submit(run_chapter, path, args.timeout): path for path in notebooks}
        for done in concurrent.futures.as_completed(running):
            r = results[running[done].stem] = done.result()
            where = ("" if r["passed"]
                     else f": cell {r['error']['cell']}, {r['error']['ename']}: {r['error']['evalue'][:200]}")
            print(f"{'passed' if r['passed'] else 'FAILED'} {r['chapter']} in {r['seconds']:.0f} s{where}", flush=True)
            write()
    report = write()
    print(f"{report['passed']} of {len(notebooks)} chapters ran on {args.device} without an error; "
          f"written to {args.out}")
    return 1 if report["failed"] or report["not_reached"] else 0


if __name__ == "__main__":
    sys.exit(main())
