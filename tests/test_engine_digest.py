"""Issue 26 item 3: editing the FL engine must not serve stale results, and `cache prune --stale`.

A cache entry stores the digests of the engine code its computation ran (`fedbench.execution.sources`:
`fedbench.fl`, the runner's compute functions and what they use), beside its plugins'; an entry from
other engine code is recomputed with one warning line. Metrics and epsilon are computed outside the
cache, so a cached run's row always shows the current metric and accounting code.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from fedbench.cli import app
from fedbench.execution import runner as runner_mod
from fedbench.execution import sources
from fedbench.execution.cache import RunCache, prune_stale
from fedbench.execution.locks import exclusive, lock_path
from fedbench.execution.runner import RunContext, execute
from fedbench.plugin import Scenario
from fedbench.reporting.results import newest_results, read_results
from fedbench.spec.run import ComponentSpec, RunSpec

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = dict(clients=2, rounds=2, local_steps=2, batch_size=4, lr=0.1, train_size=40, test_size=20)


def _spec(defense="none", attack=None, **params):
    return RunSpec(
        ComponentSpec.resolve("dataset", "digits"),
        ComponentSpec.resolve("model", "mlp", {"hidden": [8]}),
        ComponentSpec.resolve("defense", defense, params),
        ComponentSpec.resolve("attack", attack, {"iterations": 2}) if attack else None,
        Scenario.from_dict(SCENARIO),
        0,
    )


def _edited(module: str, real=sources.engine_digests):
    """engine_digests as if `module` had been edited since (for runs of this process)."""
    return lambda kind: {**real(kind), module: "0" * 16}


# ------------------------------------------------------------------------------------ what is covered


def test_the_engine_digest_covers_the_code_that_runs_inside_the_cache():
    utility, attack = sources.engine_digests("utility"), sources.engine_digests("attack")
    fl = {f"fedbench.fl.{p.stem}" for p in (ROOT / "fedbench" / "fl").glob("*.py") if p.stem != "__init__"}
    runner = "fedbench.execution.runner"
    for digests, compute in ((utility, "compute_utility"), (attack, "compute_attack")):
        assert fl | {"fedbench.fl"} <= set(digests)  # every module of fl/, imported or not
        for name in ("fedbench.data.partition", "fedbench.data", "fedbench.plugin"):
            assert name in digests  # client partitioning, dataset loading, the plugins' default hooks
        for name in (compute, "Job", "Components", "resolve_device"):
            assert f"{runner}:{name}" in digests  # the runner's definitions that run inside the cache
        # outside the cache: metrics and epsilon are computed from the cached result, per row
        assert not any(m.startswith("fedbench.metrics") for m in digests), sorted(digests)
        for name in ("_accounting", "execute", "_execute_into", "run_grid"):
            assert f"{runner}:{name}" not in digests
        assert runner not in digests  # every root exists: the runner is not hashed whole
        assert not any(m.startswith("fedbench.execution.sources") for m in digests)  # the digest itself
    assert f"{runner}:compute_attack" not in utility  # an edit of the attack path keeps cached trainings
    assert f"{runner}:compute_utility" not in attack
    assert "fedbench.spec.run:training_scenario" in utility  # what the utility run trains on


def test_the_engine_digest_ignores_comments_and_docstrings_and_sees_code(tmp_path, monkeypatch):
    copy = tmp_path / "fedbench"
    shutil.copytree(ROOT / "fedbench", copy, ignore=shutil.ignore_patterns("__pycache__", "_presets"))
    monkeypatch.setattr(sources, "_ROOT", copy)
    sources.forget()
    try:
        before = sources.engine_digests("utility")
        sim = copy / "fl" / "simulation.py"
        sim.write_text("# a comment\n\n" + sim.read_text().replace('"""', '"""Reworded. ', 1))
        runner = copy / "execution" / "runner.py"
        runner.write_text(runner.read_text() + "\n\ndef unrelated():\n    return 1\n")  # not run in the cache
        sources.forget()
        assert sources.engine_digests("utility") == before
        _zero_the_server_step(sim)
        sources.forget()
        after = sources.engine_digests("utility")
        assert {m for m in after if after[m] != before[m]} == {"fedbench.fl.simulation"}
    finally:
        sources.forget()


# --------------------------------------------------------------------------------------- in process


def test_a_changed_engine_recomputes_with_one_warning_line(tmp_path, monkeypatch):
    cache, ctx = RunCache(tmp_path / "c"), RunContext(threads=1)
    first = execute(_spec(attack="idlg"), cache, ctx)
    assert first["status"] == "ok" and first["from_cache"] is False, first.get("reason")
    monkeypatch.setattr(sources, "engine_digests", _edited("fedbench.fl.simulation"))
    edited = execute(_spec(attack="idlg"), cache, ctx)
    assert edited["status"] == "ok" and edited["from_cache"] is False
    assert edited["run_id"] == first["run_id"]  # the digest is not part of the run id
    assert len(edited.warnings) == 2, edited.warnings  # the utility entry and the attack entry
    for line, what in zip(edited.warnings, ("utility", "attack"), strict=True):
        assert line.startswith(f"stale {what} cache entry ") and line.endswith("; recomputed")
        assert "(the code of the engine (fedbench.fl.simulation) changed since it was computed)" in line
    again = execute(_spec(attack="idlg"), cache, ctx)
    assert again["from_cache"] is True and again.warnings == []


def test_entries_from_before_the_engine_digest_are_served(tmp_path, monkeypatch):
    """A cache filled by the previous fedbench (plugin digests only) stays usable."""
    cache, ctx = RunCache(tmp_path / "c"), RunContext(threads=1)
    real = sources.code_digests
    monkeypatch.setattr(runner_mod, "code_digests", lambda spec, attack: _without_engine(real(spec, attack)))
    first = execute(_spec(), cache, ctx)
    monkeypatch.undo()
    again = execute(_spec(), cache, ctx)
    assert first["from_cache"] is False and again["from_cache"] is True and again.warnings == []
    assert prune_stale(tmp_path / "c").fresh == 1  # and prune keeps them


def test_metrics_and_epsilon_of_a_cached_run_come_from_the_code_loaded_now(tmp_path, monkeypatch):
    """Design §2: metrics and epsilon are computed outside the cache, from the cached result: a run
    served from the cache shows what the metric and accounting code loaded now give. They are stored
    under the digest of that code (issue 29, `fedbench.execution.derived`): an edit of the files changes
    it; an in-memory patch, as here, does not, so the test changes the digest as the edit would."""
    from fedbench.defenses.dp import DPGaussian
    from fedbench.metrics import reconstruction

    cache, ctx = RunCache(tmp_path / "c"), RunContext(threads=1)
    spec = _spec("dp-gaussian", "idlg", sigma=0.01, clip=1.0)
    first = execute(spec, cache, ctx)
    assert first["status"] == "ok", first.get("reason")
    assert first["epsilon"] != 123.0 and first["psnr"] != 7.0

    accounting = DPGaussian.accounting
    monkeypatch.setattr(
        DPGaussian,
        "accounting",
        lambda self, sc, n: dataclasses.replace(accounting(self, sc, n), epsilon=123.0),
    )
    monkeypatch.setattr(reconstruction, "psnr", lambda true, rec, *a, **k: np.full(len(true), 7.0))
    unchanged = execute(spec, cache, ctx)  # the same code digest: the stored derived columns
    assert unchanged["epsilon"] == first["epsilon"] and unchanged["psnr"] == first["psnr"]
    edited = sources.derived_digest
    monkeypatch.setattr(sources, "derived_digest", lambda s, attack: "edited " + edited(s, attack))
    again = execute(spec, cache, ctx)
    assert again["from_cache"] is True and not any("cache entry" in w for w in again.warnings)
    assert again["epsilon"] == 123.0 and again["psnr"] == 7.0
    assert again["test_acc"] == first["test_acc"]


# ------------------------------------------------------------------------------------------ a real edit


def _zero_the_server_step(path: Path) -> None:
    """Edit `Simulation._apply` (the server step) in `path`: the server applies 0 x the update."""
    source = path.read_text()
    tree = ast.parse(source)
    sim = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Simulation")
    apply = [n for n in sim.body if isinstance(n, ast.FunctionDef) and n.name == "_apply"]
    assert apply, "Simulation._apply (the server step) is gone: point this test at the new server step"
    agg = apply[0].args.args[1].arg  # the aggregated update
    first = apply[0].body[0]
    lines = source.splitlines(keepends=True)
    zero = f"{' ' * first.col_offset}{agg} = {{k: 0 * v for k, v in {agg}.items()}}\n"
    lines.insert(first.lineno - 1, zero)
    path.write_text("".join(lines))


TINY = """
[grid]
name = "tiny"
description = "one tiny training"

[scenario]
clients = 2
rounds = 2
local_steps = 2
batch_size = 4
lr = 0.1
train_size = 40
test_size = 20

[[dataset]]
name = "digits"

[[model]]
name = "mlp"
params = { hidden = [8] }

[[defense]]
name = "none"
"""


def test_editing_the_server_step_in_a_copy_of_fedbench_recomputes_the_next_run(tmp_path):
    """Issue 26's report: a server applying 0 x the update served the cached accuracy. Here a copy of
    fedbench is edited as a user would edit their checkout, and each run is a new process."""
    copy = tmp_path / "src"
    # the compiled modules come along (valid while a source keeps its size and mtime): less to compile
    shutil.copytree(ROOT / "fedbench", copy / "fedbench", ignore=shutil.ignore_patterns("_presets"))
    preset, cache = tmp_path / "tiny.toml", tmp_path / "cache"
    preset.write_text(TINY)
    env = {**os.environ, "PYTHONPATH": str(copy), "FEDBENCH_CACHE_DIR": str(cache)}

    def run(out: str) -> tuple[dict, str]:
        args = [sys.executable, "-m", "fedbench", "run", str(preset), "-o", str(tmp_path / out)]
        proc = subprocess.run(
            [*args, "--threads", "1", "--device", "cpu"],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,  # `python -m` puts the working directory first on the path: not this checkout
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        (row,) = read_results(newest_results(tmp_path / out)).to_dict("records")
        return row, proc.stdout + proc.stderr

    original, output = run("o1")
    assert original["from_cache"] is False and "warning:" not in output
    _zero_the_server_step(copy / "fedbench" / "fl" / "simulation.py")
    edited, output = run("o2")
    assert edited["run_id"] == original["run_id"]
    assert edited["from_cache"] is False  # recomputed, not served
    (warning,) = [line for line in output.splitlines() if line.startswith("warning:")]  # exactly one
    assert re.fullmatch(
        r"warning: stale utility cache entry [0-9a-f]{16} "
        r"\(the code of the engine \(fedbench\.fl\.simulation\) changed since it was computed\); recomputed",
        warning,
    ), output
    assert edited["test_loss"] != original["test_loss"]  # the model never moved from its initialisation


# ----------------------------------------------------------------------------------- cache prune --stale


def invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(app, list(args), input=input, catch_exceptions=False)


def test_prune_stale_deletes_the_entries_whose_code_changed_and_nothing_else(tmp_path, monkeypatch):
    location, ctx = tmp_path / "c", RunContext(threads=1)
    stale, fresh, legacy = _spec(), _spec("sparsification", fraction=0.1), _spec("dp-gaussian", sigma=0.01)
    real = sources.code_digests
    with monkeypatch.context() as m:  # `stale` computed by other engine code, `legacy` before engine digests
        m.setattr(
            runner_mod, "code_digests", lambda spec, attack: {**real(spec, attack), "engine": {"x": "0"}}
        )
        execute(stale, RunCache(location), ctx)
        m.setattr(runner_mod, "code_digests", lambda spec, attack: _without_engine(real(spec, attack)))
        execute(legacy, RunCache(location), ctx)
    execute(fresh, RunCache(location), ctx)
    cache = RunCache(location)
    assert all(cache.has_utility(_key(s)) for s in (stale, fresh, legacy))

    declined = invoke("cache", "prune", "--stale", "--cache-dir", str(location), input="n\n")
    assert declined.exit_code == 1 and "delete 1 stale run (" in declined.output
    assert "nothing deleted" in declined.output and cache.has_utility(_key(stale))

    with exclusive(lock_path(location, "utility", stale.utility_id)):  # another process rewrites it
        report = prune_stale(location)
    assert (report.stale, report.busy, report.fresh) == (0, 1, 2) and cache.has_utility(_key(stale))

    res = invoke("cache", "prune", "--stale", "--yes", "--cache-dir", str(location))
    assert res.exit_code == 0, res.output
    assert f"cache: {location}: deleted 1 stale run computed by code that changed, freed " in res.output
    assert "kept 2 served by this code" in res.output
    assert not cache.has_utility(_key(stale))
    assert cache.has_utility(_key(fresh)) and cache.has_utility(_key(legacy))
    again = invoke("cache", "prune", "--stale", "--yes", "--cache-dir", str(location))
    assert again.exit_code == 0 and "no stale runs (nothing deleted)" in again.output


def _without_engine(code: dict) -> dict:
    return {k: v for k, v in code.items() if k != "engine"}


def _key(spec: RunSpec) -> str:
    from fedbench.spec.run import canonical_json

    return canonical_json(spec.utility_key())


def test_prune_stale_on_an_empty_missing_or_foreign_folder(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    res = invoke("cache", "prune", "--stale", "--cache-dir", str(empty))
    assert res.exit_code == 0 and "no stale runs (nothing deleted)" in res.output
    missing = invoke("cache", "prune", "--stale", "--cache-dir", str(tmp_path / "missing"))
    assert missing.exit_code == 2 and "no cache at" in missing.output
    assert not (tmp_path / "missing").exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    res = invoke("cache", "prune", "--stale", "--yes", "--cache-dir", str(foreign))
    assert res.exit_code == 2 and "not a fedbench cache" in res.output
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    res = invoke("cache", "prune", "--cache-dir", str(empty))
    assert res.exit_code == 2 and "--stale" in res.output


def test_prune_help_has_examples():
    res = invoke("cache", "prune", "--help")
    assert res.exit_code == 0 and "fedbench cache prune --stale" in res.output
