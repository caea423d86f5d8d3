import os
import random

import numpy as np
import pytest
import torch

from transformer_course.runtime import DEVICE_ENV, pick_device, seed_everything


def test_seed_everything_makes_every_source_repeat():
    g = seed_everything(123)
    first = (random.random(), np.random.rand(), torch.rand(2), torch.rand(2, generator=g))
    g = seed_everything(123)
    second = (random.random(), np.random.rand(), torch.rand(2), torch.rand(2, generator=g))
    assert first[0] == second[0] and first[1] == second[1]
    assert torch.equal(first[2], second[2]) and torch.equal(first[3], second[3])
    with pytest.raises(TypeError, match="seed must be an int"):
        seed_everything(1.5)


def test_pick_device(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available() and torch.backends.mps.is_available():
        expected = "mps"
    assert pick_device().type == expected
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert pick_device() == torch.device("cpu")
    monkeypatch.setenv(DEVICE_ENV, "tpu")
    with pytest.raises(ValueError, match="unknown device 'tpu'.*TRANSFORMER_COURSE_DEVICE.*cpu, cuda, mps"):
        pick_device()
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            pick_device("cuda")


def test_cpu_has_fast_bf16_asks_torch_and_survives_a_build_without_the_probe(monkeypatch):
    from transformer_course import runtime

    monkeypatch.delenv(runtime.FAST_BF16_ENV, raising=False)
    runtime.cpu_has_fast_bf16.cache_clear()
    try:
        answer = runtime.cpu_has_fast_bf16()
        assert isinstance(answer, bool)
        probes = [getattr(torch.cpu, n, None) for n in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
        assert answer == any(bool(p()) for p in probes if p is not None)
        runtime.cpu_has_fast_bf16.cache_clear()
        monkeypatch.setattr(torch, "cpu", object())  # a PyTorch without the probes (or another CPU family)
        assert runtime.cpu_has_fast_bf16() is False
    finally:
        runtime.cpu_has_fast_bf16.cache_clear()


@pytest.mark.parametrize("value, expected", [("0", False), ("1", True), (" 1 ", True)])
def test_cpu_has_fast_bf16_can_be_forced_from_the_environment(monkeypatch, value, expected):
    from transformer_course import runtime

    monkeypatch.setenv(runtime.FAST_BF16_ENV, value)
    runtime.cpu_has_fast_bf16.cache_clear()
    try:
        assert runtime.cpu_has_fast_bf16() is expected
        monkeypatch.setenv(runtime.FAST_BF16_ENV, "yes")
        runtime.cpu_has_fast_bf16.cache_clear()
        with pytest.raises(ValueError, match="must be 0 or 1"):
            runtime.cpu_has_fast_bf16()
    finally:
        runtime.cpu_has_fast_bf16.cache_clear()


def test_set_threads_takes_a_request_or_one_thread_per_idle_core(monkeypatch):
    from transformer_course import runtime

    before = torch.get_num_threads()
    try:
        assert runtime.set_threads(1) == 1 and torch.get_num_threads() == 1
        for bad in (0, -1, 1.5, True, "2"):
            with pytest.raises(ValueError, match="threads must be a whole number >= 1"):
                runtime.set_threads(bad)
        torch.set_num_threads(2)
        monkeypatch.setattr(runtime, "idle_cores", lambda: 0)  # every core busy: still one thread
        assert runtime.set_threads() == 1
        torch.set_num_threads(2)
        monkeypatch.setattr(runtime, "idle_cores", lambda: 8)  # never more than PyTorch's own default
        assert runtime.set_threads() == 2
        monkeypatch.setattr(runtime, "idle_cores", lambda: None)  # no /proc/stat: PyTorch's default
        assert runtime.set_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_idle_cores_counts_cores_from_proc_stat():
    from transformer_course.runtime import idle_cores

    found = idle_cores(0.05)
    assert found is None or 0 <= found <= os.cpu_count()


def test_the_threads_option_refuses_zero_with_one_line(capsys):
    from transformer_course import cli

    assert cli.main(["generate", "--threads", "0", "--prompt", "x"]) == 2
    assert "threads must be a whole number >= 1" in capsys.readouterr().err
