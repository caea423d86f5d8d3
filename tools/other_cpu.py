"""Run the chapters under strict nbval as if on another kind of CPU (``make test-other-cpu``).

The stored outputs of the chapters must not depend on the CPU they run on. ``make test`` checks them on
this machine as it is; this script checks them a second time in a configuration that differs in
everything a CPU can change about the numbers, in one child process per worker:

- the instruction set PyTorch's own kernels, oneDNN and MKL may use, capped one level below this
  machine's (AVX-512 -> AVX2; AVX2 -> no vector extensions), so every matrix product and reduction
  sums in another order;
- PyTorch's thread count (2 instead of 1), another source of summation order;
- the answer of ``runtime.cpu_has_fast_bf16()`` flipped (``TRANSFORMER_COURSE_FAST_BF16``), so a
  chapter that chose bf16 by itself would compute something else and fail.

Both runs compare against the same stored outputs, so both passing means the outputs hold on either
kind of CPU. Usage: ``python tools/other_cpu.py [nbval/pytest arguments...]``.
"""

from __future__ import annotations

import os
import subprocess
import sys

CAPS = {  # this machine's capability -> (ATen, oneDNN, MKL) one level down
    "AVX512": ("avx2", "AVX2", "AVX2"),
    "AVX2": ("default", "SSE41", "SSE4_2"),
}


def other_environment() -> tuple[dict[str, str], str]:
    """The environment of the second configuration, and a line that describes both."""
    import torch

    from transformer_course.runtime import cpu_has_fast_bf16

    here = torch.backends.cpu.get_cpu_capability()
    aten, onednn, mkl = CAPS.get(here, CAPS["AVX2"])
    flipped = "0" if cpu_has_fast_bf16() else "1"
    env = dict(os.environ, ATEN_CPU_CAPABILITY=aten, ONEDNN_MAX_CPU_ISA=onednn, MKL_ENABLE_INSTRUCTIONS=mkl,
               OMP_NUM_THREADS="2", TRANSFORMER_COURSE_FAST_BF16=flipped, TRANSFORMER_COURSE_DEVICE="cpu",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # older torch (2.6) names the lowest level "NO AVX", two words: one field per line
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability()); print(torch.get_num_threads())"
    there = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    got_cap, got_threads = there.stdout.strip().splitlines()[-2:]
    if got_cap == here and here not in ("DEFAULT", "NO AVX"):
        raise SystemExit(f"ATEN_CPU_CAPABILITY={aten} did not take effect (still {here}); cannot test another CPU")
    line = (f"this CPU: PyTorch kernels {here}, native bf16 {cpu_has_fast_bf16()}; the other configuration: "
            f"PyTorch kernels {got_cap}, oneDNN <= {onednn}, MKL <= {mkl}, {got_threads} threads, native bf16 "
            f"answered {flipped == '1'}")
    return env, line


def main(argv: list[str]) -> int:
    env, line = other_environment()
    print(line, flush=True)
    return subprocess.call([sys.executable, "-m", "pytest", *argv], env=env)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
