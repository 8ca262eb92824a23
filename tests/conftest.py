"""Shared fixtures: every test gets a private cache directory and never touches the user's home."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.getbasetemp() / "fedbench-cache"
    monkeypatch.setenv("FEDBENCH_CACHE_DIR", str(cache))
    monkeypatch.delenv("FEDBENCH_DATA_ROOT", raising=False)
    yield
