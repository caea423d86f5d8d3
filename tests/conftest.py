"""Shared test set-up: deterministic torch, an isolated data cache per session."""

import os
import tempfile

import pytest
import torch

# keep the real user's cache untouched and make each test run start from the same state
os.environ.setdefault("TRANSFORMER_COURSE_CACHE", tempfile.mkdtemp(prefix="tc-cache-"))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a few seconds (still run by make test)")


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """One PyTorch thread per test process: the tests' models are tiny and gain nothing from more,
    while two threads on a busy 2-core machine can run ten times slower (make test runs two workers)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _seed_torch():
    torch.manual_seed(0)
    yield
