"""Data-parallel training throughput: one process vs two under torchrun (gloo), and two "nodes" on loopback.

    python benchmarks/bench_ddp.py            # writes benchmarks/results/ddp.md and ddp.json
    python benchmarks/bench_ddp.py --quick    # fewer steps (a smoke run; the table says so)

Every run is `transformer-course train --preset tiny` (chapter 06's shapes: 4 layers x 128, block 64,
batch 12 per process) on the CPU, with evaluation only at the start and the end; tokens/s is the
trainer's own figure (tokens through forward, backward and update per second of step time, all processes
together). The physical limit for N processes is N times one process on one core; scaling efficiency is
the measured tokens/s over that limit. On a machine whose cores are shared with other work, or with
fewer cores than processes + 1, expect it below 1: each process also waits for the all-reduce.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import machine

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TRAIN = ["-m", "transformer_course", "train", "--preset", "tiny", "--device", "cpu", "--eval-interval", "100000"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _history(out: Path):
    from transformer_course.config import History

    return History.from_dict(json.loads((out / "history.json").read_text()))


def _launch(commands: list[list[str]], threads: int) -> None:
    """Start every command at once (the nodes of one job), wait for all; fail with their stderr."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TRANSFORMER_COURSE_DEVICE": "cpu"}
    jobs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for c in commands]
    for job in jobs:
        _, err = job.communicate(timeout=1800)
        if job.returncode != 0:
            raise RuntimeError(f"{' '.join(job.args)} failed:\n{err[-3000:]}")


def run(name: str, steps: int, scratch: Path) -> dict:
    out = scratch / name.replace(" ", "_")
    train = [*TRAIN, "--out", str(out), "--max-iters", str(steps)]
    if name == "1 process, 1 thread":
        _launch([[sys.executable, *train]], threads=1)
    elif name == "1 process, 2 threads":
        _launch([[sys.executable, *train]], threads=2)
    elif name == "2 processes (gloo), 1 thread each":
        _launch([[*TORCHRUN, "--standalone", "--nproc-per-node", "2", *train]], threads=1)
    elif name == "2 nodes x 1 process over loopback (c10d rendezvous)":
        endpoint = f"127.0.0.1:{_free_port()}"
        node = [*TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", endpoint, "--rdzv-id", "bench-ddp", *train]
        _launch([node, node], threads=1)
    else:
        raise ValueError(name)
    h = _history(out)
    processes = 1 if name.startswith("1 process") else 2
    cores = 2 if "2 threads" in name or processes == 2 else 1
    return {"run": name, "processes": processes, "cores": cores, "windows_per_step": h.tokens_per_step // 64,
            "steps": len(h.step), "tokens_per_s": h.tokens_per_second, "val_loss": h.val_loss[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 steps per run, once, instead of 300, twice")
    args = parser.parse_args()
    steps, repeats = (40, 1) if args.quick else (300, 2)
    names = ["1 process, 1 thread", "1 process, 2 threads", "2 processes (gloo), 1 thread each",
             "2 nodes x 1 process over loopback (c10d rendezvous)"]
    load_before = os.getloadavg()[0]
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        rows = []
        for name in names:  # the faster of `repeats` runs: other work on the machine only ever slows one down
            rows.append(max((run(name, steps, Path(scratch) / str(i)) for i in range(repeats)),
                            key=lambda r: r["tokens_per_s"]))
    seconds = time.perf_counter() - began
    single = rows[0]["tokens_per_s"]
    for r in rows:
        r["vs_1_process_1_thread"] = r["tokens_per_s"] / single
        r["scaling_efficiency"] = r["tokens_per_s"] / (r["cores"] * single)  # limit: one core's speed per core
    import torch

    torch.set_num_threads(1)  # the line names one thread per process (the 2-thread row says otherwise)
    info = machine.describe()
    line = machine.markdown_line(info)
    meta = {"machine": line, "machine_info": info, "steps": steps, "quick": args.quick,
            "seconds": seconds, "load_average_start_end": [load_before, os.getloadavg()[0]]}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ddp.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [
        "# Data-parallel training: tokens/s with 1 and 2 processes (issue 25)", "",
        f"{line} Load average at start / end: {load_before:.1f} / {os.getloadavg()[0]:.1f} (above ~1, other "
        "work shared the cores).", "",
        f"Command: `python benchmarks/bench_ddp.py{' --quick' if args.quick else ''}`"
        f"{' (quick run: few steps, noisy)' if args.quick else ''}", "",
        f"Each run: `transformer-course train --preset tiny` on the CPU for {steps} steps (chapter 06's shapes: "
        "4 layers x 128, block 64, batch 12 windows per process), evaluation only at the start and the end; "
        f"the faster of {repeats} run(s). tokens/s counts the tokens of all processes per second of step time. "
        "Scaling efficiency = tokens/s / (cores used x tokens/s of one process on one core): 1.0 is the "
        "physical limit, every core as fast as one alone; two processes also wait for each other in every "
        "all-reduce, and two threads split every matrix product.", "",
        "| run | processes | cores | windows per step | tokens / s | vs 1 process, 1 thread | scaling efficiency | "
        "val loss at the end |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['run']} | {r['processes']} | {r['cores']} | {r['windows_per_step']} | "
                     f"{r['tokens_per_s']:,.0f} | {r['vs_1_process_1_thread']:.2f}x | {r['scaling_efficiency']:.2f} | "
                     f"{r['val_loss']:.3f} |")
    lines += ["", "The two-process runs take twice the windows per step (the presets' default: the global batch grows "
              "with the number of processes), so at equal steps they have seen twice the data; `--global-batch` "
              "keeps it fixed instead (tests/test_distributed.py proves the two ways compute the same steps)."]
    (RESULTS / "ddp.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
