"""Reliability: interruption and resume, faults inside runs, cache integrity, concurrency, determinism.

The misbehaving plugins live in a plugin file (FAULTS) so `fedbench run --plugin` subprocesses and
loky workers can load them; the in-process tests load the same file once per module.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC
from pathlib import Path
from subprocess import PIPE

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from fedbench import registry
from fedbench.api import execute_grid
from fedbench.cli import app
from fedbench.execution.cache import RunCache
from fedbench.execution.runner import GridInterrupted, RunContext, execute, run_grid
from fedbench.reporting.results import newest_results, read_results, results_path, write_results
from fedbench.spec.grid import Overrides, build_grid
from fedbench.spec.run import ComponentSpec, RunSpec, canonical_json

FAULTS = '''"""Test-only defenses that misbehave on purpose (reliability tests)."""

import os
import signal
import time
from dataclasses import dataclass

from fedbench.plugin import Defense
from fedbench.spec.params import param
from fedbench.registry import register_defense


@register_defense("test-slow")
class Slow(Defense):
    """Sleeps in every update: a long run."""

    @dataclass(frozen=True)
    class Params:
        seconds: float = param(0.1, "sleep per update", min=0)
        tag: int = param(0, "tells otherwise equal runs apart", min=0)

    def update(self, delta, ctx):
        time.sleep(self.params.seconds)
        return delta


@register_defense("test-oom")
class OutOfMemory(Defense):
    """Runs out of memory."""

    def update(self, delta, ctx):
        raise MemoryError("cannot allocate 64 GiB")


@register_defense("test-die")
class Die(Defense):
    """Kills its own process, as the kernel's OOM killer would."""

    def update(self, delta, ctx):
        os.kill(os.getpid(), signal.SIGKILL)
'''
PLUGINS = ("test-slow", "test-oom", "test-die")
# columns that legitimately differ between two runs of the same grid (cost, time, cache provenance)
VOLATILE = {"seconds", "utility_seconds", "attack_seconds", "peak_rss_mb", "created_at", "from_cache"}
TINY = dict(clients=2, rounds=1, local_steps=2, batch_size=4, lr=0.1, train_size=40, test_size=20)
runner = CliRunner()


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """The plugin file, loaded in this process (and, through --plugin tracking, in loky workers)."""
    from fedbench.registry import load_plugin_file

    path = tmp_path_factory.mktemp("plugins") / "faults.py"
    path.write_text(FAULTS)
    load_plugin_file(path)
    yield path
    for name in PLUGINS:
        if name in registry.defenses:
            registry.defenses.unregister(name)
    for mod in [m for m in sys.modules if m.startswith("fedbench_plugin_faults_")]:
        del sys.modules[mod]


def _spec(defense="none", params=None, seed=0, attack=None, attack_params=None, model="mlp"):
    return RunSpec(
        ComponentSpec.resolve("dataset", "digits"),
        ComponentSpec.resolve("model", model, {"hidden": [8]} if model == "mlp" else {}),
        ComponentSpec.resolve("defense", defense, params or {}),
        ComponentSpec.resolve("attack", attack, attack_params or {}) if attack else None,
        _scenario(),
        seed,
        preset="test",
    )


def _scenario(**kw):
    from fedbench.plugin import Scenario

    return Scenario.from_dict({**TINY, **kw})


def _stable(frame: pd.DataFrame) -> pd.DataFrame:
    """A results frame without the columns that differ between equal runs, in run_id order."""
    keep = [c for c in frame.columns if c not in VOLATILE]
    return frame[keep].sort_values("run_id").reset_index(drop=True)


def _entries(cache: Path) -> list[Path]:
    """The run entries (not the derived columns and the run summaries stored beside them:
    `fedbench.execution.derived`, `fedbench.reporting.run_summary`)."""
    return sorted(
        p for p in cache.rglob("output.pkl") if not {"_derived_entry", "_summary_entry"} & set(p.parts)
    )


def _fedbench(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedbench", *args]


# ------------------------------------------------------------------------------------ interruption


SLOW_GRID = (
    "run",
    "smoke",
    "-D",
    "test-slow[seconds=0.12,tag=[0,1,2,3,4,5]]",
    "--set",
    "scenario.rounds=1",
    "--set",
    "scenario.clients=2",
    "--threads",
    "1",
)


def _start_and_signal(args: list[str], cache: Path, sig: int, after: int) -> tuple:
    """Start `fedbench run`, signal it once `after` runs are in the cache; (process, stderr, child pids)."""
    # default SIGINT in the child, as in a terminal: a test session started in the background of a
    # non-interactive shell inherits SIGINT ignored, and Python keeps an ignored SIGINT ignored
    proc = subprocess.Popen(
        _fedbench(*args),
        stdout=PIPE,
        stderr=PIPE,
        text=True,
        env=_env(),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 90
    # `after` runs in the cache: the earlier ones have certainly been reported back to the grid by then
    while len(_entries(cache)) < after and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the grid finished before it could be interrupted"
    children = _children(proc.pid)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    return proc, stderr, children


def _children(pid: int) -> set[int]:
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def test_interrupted_grid_resumes_and_matches_an_uninterrupted_run(tmp_path, faults):
    """SIGINT to a running `fedbench run`; the rerun recomputes only the unfinished runs, same results."""
    cache, out = tmp_path / "cache", tmp_path / "out"
    args = [*SLOW_GRID, "--plugin", str(faults), "-o", str(out), "--cache-dir", str(cache)]
    proc, stderr, _ = _start_and_signal(args, cache, signal.SIGINT, after=3)
    assert proc.returncode == 130, stderr
    assert "interrupted:" in stderr and "Traceback" not in stderr
    partial_path = newest_results(out)
    partial = read_results(partial_path)
    assert 1 <= len(partial) < 6 and set(partial["status"]) == {"ok"}
    assert '"interrupted": true' in partial_path.with_suffix(".json").read_text()
    assert not list(out.glob(".*.tmp"))

    again = subprocess.run(_fedbench(*args), capture_output=True, text=True, env=_env(), timeout=120)
    assert again.returncode == 0, again.stderr
    resumed = read_results(newest_results(out))
    assert len(resumed) == 6
    recomputed = set(resumed.loc[~resumed["from_cache"], "run_id"])
    assert set(partial["run_id"]) <= set(resumed.loc[resumed["from_cache"], "run_id"])
    assert recomputed and recomputed.isdisjoint(set(partial["run_id"]))

    # an uninterrupted run of the same grid, in a fresh cache, gives the same results file (in this
    # process and with one job: results do not depend on --n-jobs, see test_runner)
    ref_args = ["--plugin", str(faults), "-o", str(tmp_path / "ref"), "--cache-dir", str(tmp_path / "c2")]
    fresh = runner.invoke(app, [*SLOW_GRID, *ref_args])
    assert fresh.exit_code == 0, fresh.output
    reference = read_results(newest_results(tmp_path / "ref"))
    pd.testing.assert_frame_equal(_stable(resumed), _stable(reference))


def test_sigterm_stops_a_parallel_grid_and_its_workers(tmp_path, faults):
    """SIGTERM with --n-jobs 2: exit 130, finished runs written, no worker process left behind."""
    cache, out = tmp_path / "cache", tmp_path / "out"
    args = [*SLOW_GRID, "--plugin", str(faults), "-j", "2", "-o", str(out), "--cache-dir", str(cache)]
    proc, stderr, children = _start_and_signal(args, cache, signal.SIGTERM, after=3)
    assert proc.returncode == 130, stderr
    assert "interrupted:" in stderr and "Traceback" not in stderr
    partial = read_results(newest_results(out))
    assert 1 <= len(partial) < 6 and set(partial["status"]) == {"ok"}
    assert children, "the grid ran no worker processes"
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [pid for pid in children if Path(f"/proc/{pid}").exists() and _state(pid) != "Z"]
    assert not alive, f"worker processes still running: {alive}"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    return env


def test_keyboard_interrupt_in_process_keeps_finished_rows(tmp_path, faults, monkeypatch):
    """The library side: GridInterrupted carries the finished records, execute_grid writes them."""
    from fedbench.execution import runner as runner_mod

    grid = build_grid("smoke", Overrides(defenses=("none", "dp-gaussian", "sparsification"), sets=_sets()))
    calls = []
    real = runner_mod.execute

    def interrupt_third(spec, cache, ctx, *rest):
        calls.append(spec.run_id)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(spec, cache, ctx, *rest)

    monkeypatch.setattr(runner_mod, "execute", interrupt_third)
    with pytest.raises(GridInterrupted) as info:
        execute_grid(grid, RunContext(threads=1), RunCache(tmp_path / "c"), tmp_path / "o")
    assert len(info.value.records) == 2 and info.value.total == 3
    assert info.value.path is not None and len(read_results(info.value.path)) == 2


def _sets(**extra) -> tuple[str, ...]:
    values = {"rounds": 1, "clients": 2, "local_steps": 2, "train_size": 60, "test_size": 30, **extra}
    return tuple(f"scenario.{k}={v}" for k, v in values.items())


# ------------------------------------------------------------------------------------------ faults


def test_exception_nan_and_oom_become_failed_rows_and_nothing_is_cached(tmp_path, faults):
    cache = RunCache(tmp_path / "c")
    specs = [_spec("test-oom"), _spec("none")]
    rows = run_grid(specs, cache, RunContext(threads=1))
    assert [r["status"] for r in rows] == ["failed", "ok"]
    assert rows[0]["reason"].startswith("MemoryError: cannot allocate")
    assert not cache.has_utility(canonical_json(specs[0].utility_key()))
    assert cache.has_utility(canonical_json(specs[1].utility_key()))


def test_nan_attack_output_fails_and_is_not_cached(tmp_path, monkeypatch):
    from fedbench.plugin import AttackOutput

    attack_cls = registry.attacks.get("idlg")

    def nan_run(self, obs, model, meta, generator, device):
        return AttackOutput(images=np.full((1, 1, 8, 8), np.nan, np.float32), labels=np.zeros(1, int))

    monkeypatch.setattr(attack_cls, "run", nan_run)
    cache = RunCache(tmp_path / "c")
    spec = _spec(attack="idlg", attack_params={"iterations": 1}, model="lenet")
    row = execute(spec, cache, RunContext(threads=1))
    assert row["status"] == "failed" and "NaN images" in row["reason"]
    assert not cache.has_attack(canonical_json(spec.key()))


def test_dead_worker_and_timeout_in_a_pool_grid_goes_on(tmp_path, faults):
    """A worker killed mid-run (OOM killer) and a run past --timeout are rows; the rest finishes."""
    cache = RunCache(tmp_path / "c")
    specs = [_spec("none"), _spec("none", seed=1), _spec("test-slow", {"seconds": 5.0}), _spec("test-die")]
    rows = run_grid(specs, cache, RunContext(threads=1, timeout=1.5), n_jobs=2)
    by_defense = {(r["defense_name"], r["seed"]): r for r in rows}
    died = by_defense[("test-die", 0)]
    assert died["status"] == "failed" and "worker process died" in died["reason"]
    assert by_defense[("test-slow", 0)]["status"] == "timeout"
    assert by_defense[("test-slow", 0)]["reason"] == "exceeded the timeout of 1.5 s"
    assert by_defense[("none", 0)]["status"] == by_defense[("none", 1)]["status"] == "ok"
    for spec in specs[2:]:
        assert not cache.has_utility(canonical_json(spec.utility_key()))


def test_timeout_in_process_and_fail_fast_from_the_cli(tmp_path, faults):
    out = tmp_path / "o"
    base = ["run", "smoke", "--plugin", str(faults), "--threads", "1", "-o", str(out), "--no-cache"]
    sets = [a for s in _sets() for a in ("--set", s)]
    res = runner.invoke(app, [*base, *sets, "-D", "test-slow[seconds=5]", "-D", "none", "--timeout", "1"])
    assert res.exit_code == 1, res.output
    assert "timeout" in res.output and "exceeded the timeout of 1 s" in res.output
    frame = read_results(newest_results(out))
    assert list(frame["status"]) == ["timeout", "ok"]

    res = runner.invoke(app, [*base, *sets, "-D", "test-oom", "-D", "none", "--fail-fast"])
    assert res.exit_code == 1, res.output
    assert "stopped at the first failure (--fail-fast): 1 runs not started" in res.output
    assert list(read_results(newest_results(out))["status"]) == ["failed"]


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_bad_timeout_is_a_usage_error(tmp_path, value):
    res = runner.invoke(app, ["run", "smoke", "--timeout", value, "-o", str(tmp_path / "o")])
    assert res.exit_code == 2 and "--timeout" in res.output
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------ cache integrity


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_corrupted_cache_entry_is_recomputed_with_one_warning(tmp_path, damage):
    cache, out = tmp_path / "c", tmp_path / "o"
    args = ["run", "smoke", "-D", "none", *[a for s in _sets() for a in ("--set", s)], "--threads", "1"]
    args += ["--cache-dir", str(cache), "-o", str(out)]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    (entry,) = _entries(cache)
    data = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        entry.write_bytes(data[:40] + bytes([data[40] ^ 0x55]) + data[41:])
    else:
        entry.write_bytes(b"")
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    warnings = [line for line in second.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "corrupted utility cache entry" in warnings[0]
    assert "1 done" in second.output
    third = runner.invoke(app, args)
    assert "1 cached" in third.output and "warning:" not in third.output
    frames = [read_results(p) for p in sorted(out.glob("*.csv"))]
    assert len(frames) == 3
    assert frames[0]["test_acc"].iloc[0] == frames[1]["test_acc"].iloc[0] == frames[2]["test_acc"].iloc[0]


def test_a_corrupted_entry_whose_recomputation_fails_is_dropped(tmp_path, monkeypatch):
    from fedbench.execution import runner as runner_mod

    cache, spec, ctx = RunCache(tmp_path / "c"), _spec("none"), RunContext(threads=1)
    assert execute(spec, cache, ctx)["status"] == "ok"
    (entry,) = _entries(tmp_path / "c")
    entry.write_bytes(entry.read_bytes()[:10])

    def broken(job):
        raise RuntimeError("disk full")

    monkeypatch.setattr(runner_mod, "compute_utility", broken)
    row = execute(spec, cache, ctx)
    assert row["status"] == "failed" and len(row.warnings) == 1
    assert not cache.has_utility(canonical_json(spec.utility_key())) and not _entries(tmp_path / "c")


def test_library_users_get_a_python_warning_for_a_corrupted_entry(tmp_path):
    from fedbench.execution.cache import CacheWarning

    grid = build_grid("smoke", Overrides(defenses=("none",), sets=_sets()))
    execute_grid(grid, RunContext(threads=1), RunCache(tmp_path / "c"), None)
    (entry,) = _entries(tmp_path / "c")
    entry.write_bytes(b"not a pickle")
    with pytest.warns(CacheWarning, match="corrupted utility cache entry"):
        rows, _ = execute_grid(grid, RunContext(threads=1), RunCache(tmp_path / "c"), None)
    assert rows[0]["status"] == "ok" and not any(column.startswith("_") for column in rows[0].columns)


def test_two_concurrent_runs_share_a_cache_and_an_output_folder(tmp_path, faults):
    cache, out = tmp_path / "cache", tmp_path / "out"
    args = [*SLOW_GRID, "--plugin", str(faults), "-o", str(out), "--cache-dir", str(cache)]
    procs = [
        subprocess.Popen(
            _fedbench(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
        )
        for _ in range(2)
    ]
    for proc in procs:
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
    files = sorted(out.glob("*.csv"))
    assert len(files) == 2  # never the same name, even when both finish in the same second
    a, b = (read_results(f) for f in files)
    assert len(a) == len(b) == 6 and set(a["status"]) == set(b["status"]) == {"ok"}
    pd.testing.assert_frame_equal(_stable(a), _stable(b))
    leftovers = [p for p in cache.rglob("*") if re.search(r"\.pkl\.[0-9a-f]{32}-\d+-\d+$", p.name)]
    assert not leftovers and not list(out.glob(".*.tmp"))
    # every entry reads back: a third run takes all six from the cache
    third = runner.invoke(app, [*args[:-4], "-o", str(tmp_path / "o3"), "--cache-dir", str(cache)])
    assert third.exit_code == 0 and "6 cached" in third.output, third.output
    pd.testing.assert_frame_equal(_stable(read_results(newest_results(tmp_path / "o3"))), _stable(a))


def test_results_file_names_never_collide(tmp_path):
    from datetime import datetime

    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    rows = [{"run_id": "a" * 16, "defense": "none", "status": "ok"}]
    first = write_results(rows, {"n": 1}, results_path(tmp_path, "grid", when))
    second = write_results(rows, {"n": 2}, results_path(tmp_path, "grid", when))
    assert first.name == "grid-20260102-030405.csv" and second.name == "grid-20260102-030405-2.csv"
    assert second.with_suffix(".json").read_text().strip().endswith("}")
    assert first.stat().st_mode & 0o777 == 0o644


# -------------------------------------------------------------------------------------- determinism


def test_same_command_same_seeds_gives_identical_results(tmp_path):
    grid = build_grid(
        "smoke",
        Overrides(
            models=("lenet",),
            defenses=("none", "dp-gaussian[sigma=0.01]"),
            attacks=("idlg[iterations=3]",),
            sets=_sets(batch_size=1),
            seeds=2,
        ),
    )
    frames = []
    for k in range(2):
        rows, path = execute_grid(grid, RunContext(threads=1), RunCache(None), tmp_path / f"o{k}")
        frames.append(read_results(path))
    assert len(frames[0]) == 4 and set(frames[0]["status"]) == {"ok"}
    pd.testing.assert_frame_equal(_stable(frames[0]), _stable(frames[1]))
    assert frames[0]["psnr"].notna().all()


# ------------------------------------------------------------------------------------ untrusted files


def test_checkpoints_load_with_weights_only_and_nothing_unpickles_outside_the_cache():
    """torch.load always with weights_only=True; no pickle.load / allow_pickle=True in the package."""
    root = Path(__file__).resolve().parents[1] / "fedbench"
    for path in root.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"torch\.load\(([^()]*(\([^()]*\))?)*\)", text):
            assert "weights_only=True" in m.group(0), f"{path}: {m.group(0)}"
        assert "allow_pickle=True" not in text, path
        assert not re.search(r"\bpickle\.loads?\(", text), path


def test_default_cache_dir_is_created_private(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDBENCH_CACHE_DIR", str(tmp_path / "deep" / "cache"))
    res = runner.invoke(
        app,
        [
            "run",
            "smoke",
            "-D",
            "none",
            *[a for s in _sets() for a in ("--set", s)],
            "-o",
            str(tmp_path / "o"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / "deep" / "cache").stat().st_mode & 0o777 == 0o700
