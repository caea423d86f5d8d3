"""Shared test set-up: deterministic torch, an isolated data cache per session."""

import os
import tempfile

import pytest
import torch

# keep the real user's cache untouched and make each test run start from the same state
os.environ.setdefault("TRANSFORMER_COURSE_CACHE", tempfile.mkdtemp(prefix="tc-cache-"))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a few seconds (still run by make test)")


@pytest.fixture(autouse=True)
def _seed_torch():
    torch.manual_seed(0)
    yield
