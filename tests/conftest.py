"""Shared fixtures: every test gets a private cache directory and never touches the user's home.

Tests run torch single-threaded: the models are tiny, and two threads per process on a shared
2-core machine oversubscribe the cores (10-100x slowdowns were measured). Tests assert behaviour,
not speed; benchmarks measure speed.
"""

from __future__ import annotations

import pytest


def pytest_configure(config):
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.getbasetemp() / "fedbench-cache"
    monkeypatch.setenv("FEDBENCH_CACHE_DIR", str(cache))
    monkeypatch.delenv("FEDBENCH_DATA_ROOT", raising=False)
    yield
