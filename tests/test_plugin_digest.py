"""Issue 16 defect 10: editing a plugin's code without bumping `version` must not serve its old result.

Each cache entry stores the digest of its plugins' code (`fedbench.execution.sources`); an entry whose digest
differs from the code loaded now is recomputed with one warning line. The run_id does not change.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from fedbench import registry
from fedbench.execution import cache as cache_mod
from fedbench.execution import sources
from fedbench.execution.cache import RunCache
from fedbench.execution.runner import RunContext, execute
from fedbench.plugin import Scenario, artifact, using_artifacts
from fedbench.registry import load_plugin_file
from fedbench.spec.run import ComponentSpec, RunSpec

PLUGIN = '''"""A test defense whose update is scaled by FACTOR."""

from fedbench.plugin import Defense
from fedbench.defenses._tensors import clip_global  # noqa: F401  (an in-scope import: in the digest)
from fedbench.registry import register_defense

FACTOR = {factor}


@register_defense("test-scaled")
class Scaled(Defense):
    """Scales every shared update."""

    version = "1"

    def update(self, delta, ctx):
        return {{k: v * FACTOR for k, v in delta.items()}}
'''


def _load(path, factor, comment=""):
    """(Re)load the plugin file as a fresh process would: the edited code, digests recomputed."""
    path.write_text(comment + PLUGIN.format(factor=factor))
    if "test-scaled" in registry.defenses:
        registry.defenses.unregister("test-scaled")
    for name in [m for m in sys.modules if m.startswith("fedbench_plugin_scaled_")]:
        del sys.modules[name]
    sources.forget()
    load_plugin_file(path)


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "scaled.py"
    yield path
    registry.defenses.unregister("test-scaled")
    for name in [m for m in sys.modules if m.startswith("fedbench_plugin_scaled_")]:
        del sys.modules[name]
    sources.forget()


def _spec(attack=None):
    scenario = Scenario.from_dict(
        dict(clients=2, rounds=2, local_steps=2, batch_size=4, lr=0.1, train_size=40, test_size=20)
    )
    return RunSpec(
        ComponentSpec.resolve("dataset", "digits"),
        ComponentSpec.resolve("model", "mlp", {"hidden": [8]}),
        ComponentSpec.resolve("defense", "test-scaled"),
        ComponentSpec.resolve("attack", attack, {"iterations": 2}) if attack else None,
        scenario,
        0,
    )


def test_editing_a_plugin_without_a_version_bump_recomputes_its_runs(plugin, tmp_path):
    cache, ctx = RunCache(tmp_path / "c"), RunContext(threads=1)
    _load(plugin, 1.0)
    first = execute(_spec("idlg"), cache, ctx)
    assert first["status"] == "ok" and first["from_cache"] is False, first.get("reason")
    again = execute(_spec("idlg"), cache, ctx)
    assert again["from_cache"] is True and again.warnings == []
    assert again["test_acc"] == first["test_acc"]

    _load(plugin, 1.0, comment="# comments and blank lines above the code shift it, but change no code\n\n")
    assert execute(_spec("idlg"), cache, ctx)["from_cache"] is True

    _load(plugin, 0.0)  # every update zeroed, same version "1"
    assert _spec("idlg").run_id == first["run_id"]  # run ids stay stable: only the entry is refused
    edited = execute(_spec("idlg"), cache, ctx)
    assert edited["status"] == "ok" and edited["from_cache"] is False
    utility, attack = edited.warnings
    for line, what in ((utility, "utility"), (attack, "attack")):
        assert line.startswith(f"stale {what} cache entry ") and line.endswith("; recomputed")
        assert "the code of defense 'test-scaled' changed" in line and "\n" not in line
    assert edited["test_acc"] != first["test_acc"]  # the zeroed updates never move the model
    cached = execute(_spec("idlg"), cache, ctx)
    assert cached["from_cache"] is True and cached.warnings == []
    assert cached["test_acc"] == edited["test_acc"]


def test_the_digest_follows_fedbench_imports_of_a_plugin_file(plugin):
    _load(plugin, 1.0)
    cls = registry.defenses.get("test-scaled")
    files = sources.module_closure([cls.__module__])
    assert cls.__module__ in files and "fedbench.defenses._tensors" in files
    assert "fedbench.plugin" not in files  # framework modules are not plugin code
    digest = sources.plugin_digest(cls)
    _load(plugin, 2.0)
    assert sources.plugin_digest(registry.defenses.get("test-scaled")) != digest
    # a --plugin module's name carries a per-process hash of its path: only its code counts
    files = sources.module_closure([cls.__module__])
    renamed = {("fedbench_plugin_scaled_1" if m == cls.__module__ else m): d for m, d in files.items()}
    assert sources.combine(renamed) == sources.combine(files)


def _helper_value():
    return np.arange(3)


def test_an_artifact_from_other_code_is_recomputed(tmp_path, monkeypatch):
    rc = RunCache(tmp_path / "c")
    calls = []

    def compute():
        calls.append(1)
        return _helper_value()

    with using_artifacts(rc.artifacts):
        assert artifact("test", '{"k": 1}', compute).tolist() == [0, 1, 2]
        assert artifact("test", '{"k": 1}', compute).tolist() == [0, 1, 2] and len(calls) == 1
        monkeypatch.setattr(cache_mod, "_compute_digest", lambda c: "edited")  # as if this module changed
        assert artifact("test", '{"k": 1}', compute).tolist() == [0, 1, 2] and len(calls) == 2
    (line,) = rc.take_warnings()
    assert line.startswith("stale test artifact cache entry") and "changed since it was computed" in line


def test_every_declared_equivalent_edit_is_keyed_by_the_code_now():
    """A declaration whose module was edited again is dead (the new code digests anew): remove it, or
    declare the new edit, with its reason."""
    for name, edits in sources.EQUIVALENT_EDITS.items():
        now = sources.code_now(name)
        assert now in edits, f"{name}: no declaration matches its code now ({now}); remove the stale one"
        assert edits[now] != now


def test_a_declared_edit_digests_as_the_code_it_replaces(monkeypatch):
    name = "fedbench.defenses._tensors"  # in the digest of the test plugins above
    now = sources.code_now(name)
    sources.forget()
    plain = sources.module_closure([name])[name]
    assert plain == now
    monkeypatch.setitem(sources.EQUIVALENT_EDITS, name, {now: "f" * 64})
    sources.forget()
    assert sources.module_closure([name])[name] == "f" * 64
    # a declaration keyed by other code (the module edited again since) has no effect
    monkeypatch.setitem(sources.EQUIVALENT_EDITS, name, {"0" * 64: "f" * 64})
    sources.forget()
    assert sources.module_closure([name])[name] == plain
    sources.forget()


def test_a_cached_entry_of_the_replaced_code_is_served(tmp_path, plugin, monkeypatch):
    """An entry stamped with the replaced code's digest is served while the edit is declared, and
    recomputed (with the warning) once it is not. The entry is written under a declaration mapping the
    code now to a stand-in digest of the "old" code (the plugin file's own module is keyed by a
    per-process name, so the declaration is on a fedbench module the plugin imports)."""
    name = "fedbench.defenses._tensors"
    monkeypatch.setitem(sources.EQUIVALENT_EDITS, name, {sources.code_now(name): "a" * 64})
    _load(plugin, 0.5)
    cache = RunCache(tmp_path / "cache")
    first = execute(_spec(), cache, RunContext())
    assert first.status == "ok" and not first.columns["from_cache"]
    sources.forget()
    served = execute(_spec(), cache, RunContext())
    assert served.status == "ok" and served.columns["from_cache"]
    monkeypatch.delitem(sources.EQUIVALENT_EDITS, name)
    sources.forget()
    again = execute(_spec(), cache, RunContext())
    assert again.status == "ok" and not again.columns["from_cache"]
    assert any("changed" in w for w in again.warnings)
    assert again["test_acc"] == first["test_acc"]
    sources.forget()
