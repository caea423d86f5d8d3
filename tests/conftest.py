"""Shared test set-up: deterministic torch, an isolated data cache per session, and the test tiers.

Markers (`make test` runs neither tier alone: it leaves `system` to `make test-system`):
- ``system``: starts processes of its own (torchrun, sandboxed kernels, the grader, `make lab`, a killed
  training run, a model builder, the wheel); `make test-system`.
- ``torch_free``: the test process never imports PyTorch (every test of the modules in ``TORCH_FREE``).
  Run with ``--torch-free`` they must pass with ``import torch`` refused, which `make test-system` does:
  that is the proof that their results cannot depend on the PyTorch release, so the runs on the floor and
  newest releases (`make test-torch`) leave them out.
"""

import importlib.abc
import os
import sys
import tempfile
from pathlib import Path

import pytest

# keep the real user's cache untouched and make each test run start from the same state
os.environ.setdefault("TRANSFORMER_COURSE_CACHE", tempfile.mkdtemp(prefix="tc-cache-"))

# test modules whose process never imports torch (proved by `make test-system`: they run with --torch-free)
TORCH_FREE = {
    "test_arguments", "test_bpe_heap", "test_checks_tokenization", "test_checks_welcome", "test_classroom",
    "test_ci_budget", "test_clone_location",
    "test_export", "test_function_length", "test_grading", "test_grading_crash", "test_grading_teacher",
    "test_lab", "test_leak_check", "test_notebook_hygiene", "test_quiz", "test_sandbox",
    "test_tokenizer_file_bounds",
}
# test modules that start processes of their own; single tests elsewhere carry @pytest.mark.system
SYSTEM = {
    "test_distributed", "test_grading", "test_grading_crash", "test_grading_teacher", "test_lab",
    "test_run_safety", "test_sandbox", "test_training_crash", "test_wheel",
}


class _RefuseTorch(importlib.abc.MetaPathFinder):
    """With --torch-free: `import torch` fails, naming the test tier that forbids it."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"{name} imported by a torch_free test (tests/conftest.py, TORCH_FREE): "
                              "move the test out of that list, or keep it from importing torch")
        return None


def pytest_addoption(parser):
    parser.addoption("--torch-free", action="store_true",
                     help="refuse `import torch` in the test process (for the torch_free tier)")


def pytest_configure(config):
    config.addinivalue_line("markers", "system: starts processes of its own (make test-system, not make test)")
    config.addinivalue_line("markers", "torch_free: the test process never imports torch (proved by --torch-free)")
    if config.getoption("--torch-free"):
        if "torch" in sys.modules:
            raise pytest.UsageError("--torch-free: torch was imported before the tests started")
        sys.meta_path.insert(0, _RefuseTorch())


def pytest_ignore_collect(collection_path, config):
    """With --torch-free, only the TORCH_FREE modules are collected (the others import torch to collect)."""
    if config.getoption("--torch-free") and collection_path.suffix == ".py" \
            and collection_path.name.startswith("test_") and collection_path.stem not in TORCH_FREE:
        return True
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = Path(str(item.fspath)).stem
        if module in TORCH_FREE:
            item.add_marker("torch_free")
        if module in SYSTEM:
            item.add_marker("system")


@pytest.fixture(autouse=True, scope="session")
def _one_thread(request):
    """One PyTorch thread per test process: the tests' models are tiny and gain nothing from more,
    while two threads on a busy 2-core machine can run ten times slower (make test runs two workers)."""
    if request.config.getoption("--torch-free"):
        yield
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _seed_torch(request):
    if not request.config.getoption("--torch-free"):
        import torch

        torch.manual_seed(0)
    yield
