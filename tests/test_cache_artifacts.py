"""`fedbench.plugin.artifact`: derived artifacts (SDAN layers, extractors) computed once per cache folder.

A RunCache owns the store; the runner makes it current for the duration of a run (`using_artifacts`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedbench import registry
from fedbench.execution.cache import RunCache
from fedbench.execution.runner import RunContext, execute
from fedbench.plugin import Defense, artifact, using_artifacts
from fedbench.spec.run import RunSpec
from fedbench.testing import tiny_spec


def test_artifact_is_computed_once_per_key_and_cache_dir(tmp_path):
    calls = []

    def compute(value):
        def run():
            calls.append(value)
            return np.full(3, value)

        return run

    with using_artifacts(RunCache(tmp_path / "c1").artifacts):
        assert artifact("test", '{"a": 1}', compute(1)).tolist() == [1, 1, 1]
        assert artifact("test", '{"a": 1}', compute(99)).tolist() == [1, 1, 1]  # from disk, not recomputed
        assert artifact("test", '{"a": 2}', compute(2)).tolist() == [2, 2, 2]
    assert calls == [1, 2]
    with using_artifacts(RunCache(tmp_path / "c2").artifacts):  # another folder knows nothing of c1's
        artifact("test", '{"a": 1}', compute(1))
    assert calls == [1, 2, 1]
    assert RunCache(None).artifacts is None  # --no-cache: no store, computed on every call
    with using_artifacts(RunCache(None).artifacts):
        artifact("test", '{"a": 1}', compute(1))
    artifact("test", '{"a": 1}', compute(1))  # outside a run (a plugin called directly): computed too
    assert calls == [1, 2, 1, 1, 1]


def test_a_damaged_artifact_is_recomputed_with_one_line_warning_and_no_joblib_noise(tmp_path, recwarn):
    calls = []

    def compute():
        calls.append(1)
        return np.arange(4)

    rc = RunCache(tmp_path / "c")
    with using_artifacts(rc.artifacts):
        artifact("test", '{"b": 1}', compute)
        (entry,) = [p for p in (tmp_path / "c").rglob("output.pkl") if "_artifact_entry" in str(p)]
        entry.write_bytes(entry.read_bytes()[:12])  # truncated: fails zlib's checksum
        assert artifact("test", '{"b": 1}', compute).tolist() == [0, 1, 2, 3]
        assert len(calls) == 2
        (line,) = rc.take_warnings()
        assert line.startswith("corrupted test artifact cache entry") and line.endswith("recomputed")
        assert "\n" not in line
        assert not [w for w in recwarn if "joblib" in str(w.filename) or "Traceback" in str(w.message)]
        assert artifact("test", '{"b": 1}', compute).tolist() == [0, 1, 2, 3] and len(calls) == 2
    assert rc.take_warnings() == []


SOLVED: list[int] = []


def _solve() -> np.ndarray:
    SOLVED.append(1)
    return np.ones(2)


class _ArtifactUser(Defense):
    """Derives an artifact in its update hook (test only)."""

    def update(self, delta, ctx):
        artifact("test-user", '{"k": 1}', _solve)
        return delta


def _spec() -> RunSpec:
    return tiny_spec("defense", "test-artifact-user")  # two clients, one round


@pytest.fixture
def artifact_user():
    """Registered only for the test that needs it: the registry matrix of other modules must not see it."""
    registry.register_defense("test-artifact-user")(_ArtifactUser)
    yield
    registry.defenses.unregister("test-artifact-user")


def test_a_run_uses_its_cache_store_and_a_damaged_artifact_is_noted_in_its_record(tmp_path, artifact_user):
    SOLVED.clear()
    cache = RunCache(tmp_path / "c")
    assert execute(_spec(), cache, RunContext(threads=1))["status"] == "ok"
    assert len(SOLVED) == 1  # two clients, one computation: the second read it from the cache folder
    for entry in (tmp_path / "c").rglob("output.pkl"):
        if "_artifact_entry" in str(entry):
            entry.write_bytes(b"")
    other = execute(dataclasses.replace(_spec(), seed=1), cache, RunContext(threads=1))  # a new run reads it
    assert other["status"] == "ok" and len(SOLVED) == 2  # the damaged artifact is redone once
    (line,) = other.warnings
    assert line.startswith("corrupted test-user artifact cache entry")
    forced = execute(_spec(), RunCache(tmp_path / "c", force=True), RunContext(threads=1))
    assert forced["status"] == "ok" and len(SOLVED) == 3  # --force retrains and redoes the artifact, once
    assert not forced.warnings
    execute(_spec(), RunCache(None), RunContext(threads=1))  # --no-cache: each client computes it
    assert len(SOLVED) == 5
    artifact("test-user", '{"k": 1}', _solve)  # after the run its store is no longer current
    assert len(SOLVED) == 6


def test_the_utility_run_and_an_attack_on_the_final_model_share_one_training(tmp_path, monkeypatch):
    """A membership attack reads the final model of the training its utility run computed (the
    `trained-model` artifact), so a defense x seed trains once, not once per attack; without a cache
    each trains, and the numbers are the same either way."""
    from fedbench.fl.simulation import Simulation

    runs = []
    real_run = Simulation.run
    monkeypatch.setattr(Simulation, "run", lambda self: runs.append(self.observe) or real_run(self))
    spec = tiny_spec("attack", "mia-loss")
    cache = RunCache(tmp_path / "c")
    shared = execute(spec, cache, RunContext(threads=1))
    assert shared["status"] == "ok" and runs == [None]  # one training; the attack ran none of its own
    other = dataclasses.replace(spec, attack=tiny_spec("attack", "mia-direct").attack)
    assert execute(other, cache, RunContext(threads=1))["status"] == "ok" and runs == [None]
    runs.clear()
    alone = execute(spec, RunCache(None), RunContext(threads=1))
    assert runs == [None, None]  # no cache: the utility run and the attack each train
    for column in ("test_acc", "mia_auc", "mia_acc"):
        assert alone[column] == shared[column]
