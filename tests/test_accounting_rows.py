"""Epsilon is computed per row from the defense's accountant, never read back from the training cache:
a fix to an accountant reaches cached runs without retraining (and needs no version bump)."""

from __future__ import annotations

import math

import pytest

from fedbench.execution.cache import RunCache
from fedbench.execution.runner import RunContext, execute
from fedbench.plugin import Scenario
from fedbench.spec.run import ComponentSpec, RunSpec


def _spec() -> RunSpec:
    sc = Scenario.from_dict(
        dict(clients=2, rounds=1, local_steps=2, batch_size=2, train_size=40, test_size=20)
    )
    return RunSpec(
        ComponentSpec.resolve("dataset", "digits"),
        ComponentSpec.resolve("model", "mlp", {"hidden": [8]}),
        ComponentSpec.resolve("defense", "fed-cdp", {"sigma": 1.0}),
        None,
        sc,
        0,
        preset="test",
    )


def test_a_changed_accountant_reaches_a_cached_run(tmp_path, monkeypatch):
    cache = RunCache(tmp_path / "c")
    first = execute(_spec(), cache, RunContext())
    assert first["status"] == "ok" and not first["from_cache"]
    assert math.isfinite(first["epsilon"]) and first["epsilon"] > 0

    defense_cls = type(_spec().defense.instantiate())
    original = defense_cls.accounting
    seen = {}

    def doubled(self, scenario, train_size, tensors=None):
        seen["train_size"], seen["tensors"] = train_size, tensors
        acc = original(self, scenario, train_size, tensors)
        return type(acc)(**{**acc.__dict__, "epsilon": 2 * acc.epsilon})

    monkeypatch.setattr(defense_cls, "accounting", doubled)
    # epsilon is stored under the digest of the code computing it (issue 29): editing the defense's
    # file changes that digest; this in-memory patch does not, so the digest is changed as an edit would
    from fedbench.execution import sources

    digest = sources.derived_digest
    monkeypatch.setattr(sources, "derived_digest", lambda spec, attack: "edited " + digest(spec, attack))
    again = execute(_spec(), cache, RunContext())
    assert again["status"] == "ok", again["reason"]
    assert again["from_cache"], "the training must come from the cache"
    assert again["epsilon"] == pytest.approx(2 * first["epsilon"])
    assert seen["train_size"] == 40  # the training prefix the simulation used
    assert seen["tensors"] == 4  # the MLP's trained tensors: 2 weights, 2 biases


def test_a_defense_without_a_guarantee_has_no_epsilon(tmp_path):
    spec = _spec()
    spec = RunSpec(spec.dataset, spec.model, ComponentSpec.resolve("defense", "none"), None, spec.scenario, 0)
    row = execute(spec, RunCache(tmp_path / "c"), RunContext())
    assert row["status"] == "ok" and "epsilon" not in row
