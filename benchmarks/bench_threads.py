"""Training on a shared machine: PyTorch's default threads against one thread and the course's default
(``runtime.set_threads``: one per core idle at start), on a quiet machine and with a busy loop on a core.

Each run is a child process that trains chapter 06's `tiny` preset for a fixed number of steps (AdamW,
batch 32 x 64 tokens) and reports tokens/s after a warm-up. The busy loop is another child process
(``while True: pass``) started before the run and stopped after it, as on a classroom server or a busy
laptop. The configurations alternate, ``--repeats`` times each, and the table gives the median and the
range. Goal (issue 51): with the busy loop, the course's default at least 0.8x the best one-thread figure
of the same run.

    python benchmarks/bench_threads.py [--steps 40] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import machine

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

CHILD = r"""
import sys, time, torch
from transformer_course.config import PRESETS
from transformer_course.model import GPT
from transformer_course.runtime import set_threads
chosen = set_threads(None if sys.argv[1] == "default" else int(sys.argv[1]))
steps = int(sys.argv[2])
torch.manual_seed(0)
cfg = PRESETS["tiny"]
model = GPT(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randint(0, cfg.vocab_size, (32, cfg.block_size))
def step():
    _, loss = model(x, x)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
for _ in range(3):
    step()
start = time.perf_counter()
for _ in range(steps):
    step()
print(chosen, steps * x.numel() / (time.perf_counter() - start))
"""

CONFIGS = {"1 thread": "1", "2 threads (PyTorch's default here)": "2", "course default (set_threads)": "default"}


def run(config: str, steps: int, busy: bool) -> tuple[int, float]:
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, config, str(steps)], capture_output=True, text=True,
                             check=True, cwd=ROOT, timeout=900).stdout.split()
    finally:
        if loop is not None:
            loop.kill()
            loop.wait()
    return int(out[0]), float(out[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    found: dict[tuple[str, bool], list[tuple[int, float]]] = {}
    for _ in range(args.repeats):
        for busy in (False, True):
            for name, config in CONFIGS.items():
                found.setdefault((name, busy), []).append(run(config, args.steps, busy))
                print(name, "busy" if busy else "quiet", found[(name, busy)][-1], flush=True)
    rows = []
    for (name, busy), got in found.items():
        rates = [r for _, r in got]
        rows.append({"config": name, "busy_loop": busy, "threads": sorted({t for t, _ in got}),
                     "tokens_per_s_median": round(statistics.median(rates)), "min": round(min(rates)),
                     "max": round(max(rates))})
    best_single_busy = max(r for (n, b), got in found.items() if b and n == "1 thread" for _, r in got)
    best_single_quiet = max(r for (n, b), got in found.items() if not b and n == "1 thread" for _, r in got)
    default_busy = statistics.median(r for _, r in found[("course default (set_threads)", True)])
    ratio = default_busy / max(best_single_busy, best_single_quiet)
    info = machine.describe()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "threads.json").write_text(json.dumps({
        "meta": {"machine_info": info, "date": datetime.now(UTC).strftime("%Y-%m-%d"), "steps": args.steps,
                 "repeats": args.repeats},
        "rows": rows, "default_busy_vs_best_single_thread": round(ratio, 2)}, indent=1) + "\n")
    lines = [
        "# Training on a shared machine: threads", "",
        machine.markdown_line(info), "",
        f"Chapter 06's `tiny` preset, AdamW, batch 32 x 64, {args.steps} timed steps after 3 of warm-up, each run "
        f"a fresh process; {args.repeats} runs of each configuration, alternated. Busy: another process "
        "spinning (`while True: pass`) during the run.", "",
        "| configuration | machine | threads | tokens/s (median) | range |", "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row['config']} | {'busy loop on a core' if row['busy_loop'] else 'quiet'} | "
                     f"{', '.join(map(str, row['threads']))} | {row['tokens_per_s_median']:,} | "
                     f"{row['min']:,}-{row['max']:,} |")
    lines += ["", f"With the busy loop, the course's default ran at {ratio:.2f}x the best one-thread figure of this "
              f"run (goal: at least 0.8x)."]
    (RESULTS / "threads.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
