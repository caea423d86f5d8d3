"""The machine a benchmark ran on, described the same way in every results table.

Figures from a CPU with native bf16 matrix instructions (AVX512-BF16 or AMX) and from one without
them differ by more than noise (bf16 products run about twice as fast on the first, and are emulated
and slower on the second), so every table names its CPU, the instruction sets PyTorch can use there
and the thread count it timed with. The bench scripts run as ``python benchmarks/bench_x.py``, which
puts this folder on ``sys.path``: they ``import machine`` and write :func:`markdown_line` into their
header and :func:`describe` into their JSON's ``meta["machine_info"]``.

    python benchmarks/machine.py    # prints this machine's line
"""

from __future__ import annotations

import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")  # Linux only; elsewhere the flags below read as unknown (False)

# /proc/cpuinfo flag -> how the table names it; these decide which of PyTorch's x86 kernels run
ISA_FLAGS = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_bf16": "AVX512-BF16", "amx_tile": "AMX"}


def _read_cpuinfo(path: Path) -> tuple[str, set[str]] | None:
    """The first "model name" and "flags" of ``path`` (a /proc/cpuinfo); None if unreadable."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    name, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not name:
            name = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return name, flags


def describe(cpuinfo: Path | None = None) -> dict:
    """This machine as a JSON-ready dict: CPU, instruction sets, PyTorch's view of it, the run.

    Call it after the benchmark has set ``torch.set_num_threads``: ``threads`` is the count in force
    now. ``cpuinfo`` defaults to :data:`CPUINFO`; tests point it at a file of their own.
    """
    import torch

    from transformer_course.runtime import cpu_has_fast_bf16

    read = _read_cpuinfo(CPUINFO if cpuinfo is None else Path(cpuinfo))
    name, flags = read if read is not None else ("", set())
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        load = None
    return {
        "cpu": name or platform.processor() or platform.machine(),
        "arch": platform.machine(),
        "system": platform.system(),
        "isa_known": bool(flags),
        **{flag: flag in flags for flag in ISA_FLAGS},
        "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
        "native_bf16": bool(cpu_has_fast_bf16()),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "load_1min": load,
    }


def isa_class(info: dict) -> str:
    """Name the kind of CPU: "bf16-class" with AVX512-BF16 or AMX, else "AVX2-class".

    The two kinds of figures differ by more than noise, so docs/maintainers.md shows them side by side.
    """
    return "bf16-class" if info.get("avx512_bf16") or info.get("amx_tile") else "AVX2-class"


def markdown_line(info: dict | None = None) -> str:
    """One line for a results table's header, starting with "Machine:".

    ``info`` comes from :func:`describe`; by default this machine, now.
    """
    info = describe() if info is None else info
    if info.get("isa_known"):
        isa = ", ".join(f"{label} {'yes' if info.get(flag) else 'no'}"
                        for flag, label in ISA_FLAGS.items())
    else:
        isa = "AVX2, AVX-512, AVX512-BF16, AMX: unknown (no /proc/cpuinfo)"
    cpus = f"{info['cpu_count']} CPUs" if info.get("cpu_count") else "CPU count unknown"
    threads = info["threads"]
    load = "n/a" if info.get("load_1min") is None else f"{info['load_1min']:.1f}"
    return (
        f"Machine: {info['cpu']} ({cpus}; {isa}; PyTorch kernels {info['cpu_capability']}; "
        f"native bf16 {'yes' if info['native_bf16'] else 'no'}, {isa_class(info)}), "
        f"{threads} torch thread{'' if threads == 1 else 's'}, torch {info['torch']}, "
        f"Python {info['python']}, {info['date']}, load average {load}."
    )


if __name__ == "__main__":
    print(markdown_line())


def best_cpu_seconds(run, repeats: int) -> float:
    """The least CPU time (this process, every thread) of `repeats` calls of `run()`, after one warm-up call."""
    run()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best
