"""`make test-other-cpu` really runs the chapters in another CPU configuration (tools/other_cpu.py)."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import other_cpu  # noqa: E402


@pytest.mark.system
def test_the_other_configuration_differs_in_isa_threads_and_bf16_probe(monkeypatch):
    from transformer_course import runtime

    monkeypatch.delenv(runtime.FAST_BF16_ENV, raising=False)
    runtime.cpu_has_fast_bf16.cache_clear()
    try:
        native = runtime.cpu_has_fast_bf16()
        env, line = other_cpu.other_environment()
    finally:
        runtime.cpu_has_fast_bf16.cache_clear()
    here = torch.backends.cpu.get_cpu_capability()
    aten, onednn, mkl = other_cpu.CAPS.get(here, other_cpu.CAPS["AVX2"])
    assert ((env["ATEN_CPU_CAPABILITY"], env["ONEDNN_MAX_CPU_ISA"], env["MKL_ENABLE_INSTRUCTIONS"])
            == (aten, onednn, mkl))
    assert env["OMP_NUM_THREADS"] == "2" and env["TRANSFORMER_COURSE_DEVICE"] == "cpu"
    assert env[runtime.FAST_BF16_ENV] == ("0" if native else "1")  # the probe's answer flipped
    assert f"PyTorch kernels {here}" in line and "2 threads" in line


@pytest.mark.parametrize("capability", ["AVX512", "AVX2"])
def test_each_capability_steps_down_one_level(capability):
    aten, onednn, mkl = other_cpu.CAPS[capability]
    assert aten.upper() != capability and onednn and mkl
