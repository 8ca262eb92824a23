"""`fedbench.cache.artifact`: derived artifacts (SDAN layers, feature extractors) computed once per cache."""

from __future__ import annotations

import numpy as np

from fedbench import cache
from fedbench.cache import RunCache, artifact


def test_artifact_is_computed_once_per_key_and_cache_dir(tmp_path):
    calls = []

    def compute(value):
        def run():
            calls.append(value)
            return np.full(3, value)

        return run

    RunCache(tmp_path / "c1")
    assert artifact("test", '{"a": 1}', compute(1)).tolist() == [1, 1, 1]
    assert artifact("test", '{"a": 1}', compute(99)).tolist() == [1, 1, 1]  # from disk, not recomputed
    assert artifact("test", '{"a": 2}', compute(2)).tolist() == [2, 2, 2]
    assert calls == [1, 2]
    RunCache(tmp_path / "c2")  # another cache directory knows nothing of the first one's artifacts
    artifact("test", '{"a": 1}', compute(1))
    assert calls == [1, 2, 1]
    RunCache(None)  # --no-cache: computed on every call
    artifact("test", '{"a": 1}', compute(1))
    artifact("test", '{"a": 1}', compute(1))
    assert calls == [1, 2, 1, 1, 1]
    assert cache._artifacts["func"] is None
