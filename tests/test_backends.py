"""Scale: placement rules (--gpus, --backend, --address), GPU slots of workers, parallel == sequential,
batched == one-at-a-time reconstructions, and the Ray backend (slow: a local Ray cluster)."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fedbench.cli import app
from fedbench.errors import FedbenchError
from fedbench.execution import placement as backends
from fedbench.execution.cache import RunCache
from fedbench.execution.runner import RunContext, run_grid
from fedbench.spec.grid import Overrides, build_grid

runner = CliRunner()
# columns that legitimately differ between two executions of the same grid
VOLATILE = {"seconds", "utility_seconds", "attack_seconds", "peak_rss_mb", "created_at", "from_cache"}


def _stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in VOLATILE and not k.startswith("_")} for r in rows]


def _same(a: list[dict], b: list[dict]) -> None:
    assert [r["run_id"] for r in a] == [r["run_id"] for r in b]
    for ra, rb in zip(_stable(a), _stable(b), strict=True):
        assert ra.keys() == rb.keys()
        for k in ra:
            va, vb = ra[k], rb[k]
            same = va == vb or (
                isinstance(va, float) and isinstance(vb, float) and math.isnan(va) and math.isnan(vb)
            )
            assert same, (ra["run_id"], k, va, vb)


# ------------------------------------------------------------------------------------- placement


def test_parse_gpus():
    assert backends.parse_gpus(None) == () and backends.parse_gpus("") == ()
    assert backends.parse_gpus("0,2,1") == (0, 2, 1)
    for bad in ("x", "0,,1", "-1", "0,0"):
        with pytest.raises(FedbenchError, match="--gpus"):
            backends.parse_gpus(bad)


def test_plan_gpus_one_worker_per_gpu():
    two = lambda: 2  # noqa: E731  (a machine with two GPUs)
    ctx, n = backends.plan(RunContext(device="auto", gpus=(0, 1)), 1, two)
    assert (ctx.device, ctx.gpus, n) == ("cuda", (0, 1), 2)
    ctx, n = backends.plan(RunContext(device="cuda", gpus=(1, 0)), 2, two)
    assert n == 2 and ctx.gpus == (1, 0)
    ctx, n = backends.plan(RunContext(device="auto", gpus=(1,)), 1, two)  # one GPU: in this process
    assert (ctx.device, ctx.gpus, n) == ("cuda:1", (), 1)
    assert backends.plan(*backends.plan(RunContext(gpus=(0, 1), device="cuda"), 1, two), two)[1] == 2
    plain = RunContext(device="cpu")
    assert backends.plan(plain, 3, two) == (plain, 3)  # no --gpus: untouched


@pytest.mark.parametrize(
    "ctx, n_jobs, count, message",
    [
        (RunContext(device="auto", gpus=(0,)), 1, 0, "no CUDA device is visible"),
        (RunContext(device="auto", gpus=(0, 2)), 1, 2, "--gpus 2: only 2 CUDA device"),
        (RunContext(device="cpu", gpus=(0,)), 1, 1, "--gpus with --device cpu"),
        (RunContext(device="cuda", gpus=(0, 1)), 3, 2, "--n-jobs 3 with --gpus"),
        (RunContext(backend="spark"), 1, 0, "--backend spark: use one of local, ray"),
        (RunContext(address="head:6379"), 1, 0, "--address head:6379: only with --backend ray"),
    ],
)
def test_plan_rejects(ctx, n_jobs, count, message):
    with pytest.raises(FedbenchError, match=message.replace("(", r"\(")):
        backends.plan(ctx, n_jobs, lambda: count)


def test_gpu_slots_are_exclusive_and_freed(tmp_path):
    folder = str(tmp_path / "slots")
    a, b, c = {}, {}, {}  # three 'processes' (flock locks belong to open files, so this is exact)
    assert backends.claim_slot(folder, 2, claimed=a) == 0
    assert backends.claim_slot(folder, 2, claimed=a) == 0  # a worker keeps its slot
    assert backends.claim_slot(folder, 2, claimed=b) == 1
    with pytest.raises(RuntimeError, match="more workers than GPUs"):
        backends.claim_slot(folder, 2, wait=0, claimed=c)
    import os

    os.close(a.pop(folder)[1])  # worker a dies: the kernel drops its lock
    assert backends.claim_slot(folder, 2, wait=0, claimed=c) == 0


def test_worker_context_maps_slot_to_listed_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(backends, "slot_dir", lambda: str(tmp_path / "w"))
    monkeypatch.setattr(backends, "_claimed", {})
    ctx = backends.worker_context(RunContext(device="cuda", gpus=(3, 5)))
    assert ctx.device == "cuda:3" and ctx.gpus == ()
    assert backends.worker_context(RunContext(device="cpu")).device == "cpu"


# ------------------------------------------------------------------------------------------ CLI


def test_cli_gpus_without_cuda_is_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    res = runner.invoke(app, ["run", "smoke", "--gpus", "0,1", "-o", str(tmp_path), "--no-cache"])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "--gpus: no CUDA device is visible" in lines[0]
    assert not list(tmp_path.iterdir())


def test_cli_ray_backend_without_ray_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    res = runner.invoke(app, ["run", "smoke", "--backend", "ray", "-o", str(tmp_path), "--no-cache"])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert (
        len(lines) == 1 and "ray is not installed" in lines[0] and "pip install 'fedbench[ray]'" in lines[0]
    )


# -------------------------------------------------------------------------------- n_jobs == 1


def _small_grid():
    """2 defenses x 2 attacks: two utility groups of two runs each."""
    sets = ("scenario.rounds=1", "scenario.clients=2", "scenario.train_size=60", "scenario.test_size=30")
    attacks = ("dlg[iterations=1]", "ig[iterations=5]")
    overrides = Overrides(
        defenses=("none", "dp-gaussian"), attacks=attacks, sets=(*sets, "scenario.batch_size=2")
    )
    return build_grid("smoke", overrides)


def test_n_jobs_2_gives_identical_rows_and_run_ids(tmp_path):
    specs = list(_small_grid().specs)
    assert len({s.utility_id for s in specs}) < len(specs)  # shared utility runs are exercised
    seq = run_grid(specs, RunCache(tmp_path / "a"), RunContext(threads=1))
    par = run_grid(specs, RunCache(tmp_path / "b"), RunContext(threads=1), n_jobs=2)
    assert {r["status"] for r in seq} == {"ok"}
    _same(seq, par)


def _worker_gpu(folder: str) -> tuple[int, int]:
    import os
    import time

    time.sleep(0.05)
    return os.getpid(), backends.claim_slot(folder, 2)


def test_loky_workers_each_keep_their_own_gpu(tmp_path):
    from joblib.externals.loky import get_reusable_executor

    executor = get_reusable_executor(max_workers=2, timeout=60)
    seen = list(executor.map(_worker_gpu, [str(tmp_path / "s")] * 8))
    slot_of: dict[int, set[int]] = {}
    for pid, slot in seen:
        slot_of.setdefault(pid, set()).add(slot)
    assert all(len(s) == 1 for s in slot_of.values())  # a worker never changes GPU
    assert len({next(iter(s)) for s in slot_of.values()}) == len(slot_of)  # two workers never share one


# ------------------------------------------------------------------------------ scheduling loop


def _record(spec, status="ok"):
    from fedbench.execution.record import RunRecord, base_columns

    return RunRecord({**base_columns(spec), "status": status, "from_cache": False, "reason": ""})


class _FakeWorkers:
    """An in-memory backend: runs end in the order they started; `script[i]` gives run i's outcome per
    attempt (a callable of the spec, or an Outcome), the last entry repeating."""

    def __init__(self, capacity, script=None):
        self.capacity = capacity
        self.script = script or {}
        self.log = []  # ("submit", i, alone, in flight before) and ("end", i)
        self.cancelled = []
        self._flight = []  # (handle, i)
        self._attempts = {}
        self._next = 0

    def submit(self, spec, alone):
        i = self._index[spec.run_id]
        self.log.append(("submit", i, alone, len(self._flight)))
        self._next += 1
        self._flight.append((self._next, i))
        return self._next

    def wait(self, handles):
        return [self._flight[0][0]]

    def outcome(self, handle):
        i = dict(self._flight)[handle]
        self._flight = [(h, j) for h, j in self._flight if h != handle]
        self.log.append(("end", i))
        n = self._attempts[i] = self._attempts.get(i, -1) + 1
        steps = self.script.get(i, [_record])
        step = steps[min(n, len(steps) - 1)]
        if step is KeyboardInterrupt:
            raise KeyboardInterrupt
        return step(self._specs[i]) if callable(step) else step

    def cancel(self, handles):
        self.cancelled.extend(handles)

    def run(self, specs, groups, finish=None):
        from fedbench.execution import scheduler

        self._specs = specs
        self._index = {s.run_id: i for i, s in enumerate(specs)}
        ended = []

        def record_end(i, record):
            ended.append((i, record))
            return finish(i, record) if finish else False

        scheduler.schedule(specs, groups, self, record_end)
        return ended


def _four_specs():
    specs = list(_small_grid().specs)
    assert len(specs) == 4
    return specs


def test_scheduler_starts_group_heads_then_each_next_run_after_its_predecessor():
    specs = _four_specs()
    workers = _FakeWorkers(capacity=2)
    ended = workers.run(specs, [[0, 2], [1, 3]])
    assert [i for i, _ in ended] == [0, 1, 2, 3]
    submits = [e for e in workers.log if e[0] == "submit"]
    assert [e[1] for e in submits] == [0, 1, 2, 3] and max(e[3] for e in submits) < 2  # capacity 2
    log = workers.log
    for first, then in ((0, 2), (1, 3)):  # a group's next run starts only once the one before it ended
        assert log.index(("end", first)) < next(k for k, e in enumerate(log) if e[:2] == ("submit", then))
    assert not workers.cancelled


def test_scheduler_retries_the_runs_of_a_dead_worker_alone_and_fails_a_repeat_killer():
    from fedbench.execution.scheduler import DIED, TaskRaised, WorkerDied

    specs = _four_specs()
    died = WorkerDied("; exit code {1: -9}")
    script = {
        0: [WorkerDied(), _record],  # in flight when run 1 killed the pool: fine on its own
        1: [WorkerDied(), died],  # kills its worker again, alone
        2: [TaskRaised(ValueError("boom"))],  # the backend could not run it
    }
    workers = _FakeWorkers(capacity=2, script=script)
    ended = dict(workers.run(specs, [[0, 2], [1, 3]]))
    assert ended[0].status == "ok" and ended[3].status == "ok"
    assert ended[1].status == "failed" and ended[1]["reason"] == DIED + "; exit code {1: -9}"
    assert ended[2].status == "failed" and ended[2]["reason"] == "ValueError: boom"
    retries = [e for e in workers.log if e[0] == "submit" and e[2]]
    assert [e[1] for e in retries] == [0, 1] and all(e[3] == 0 for e in retries)  # alone: nothing in flight


def test_scheduler_fail_fast_and_ctrl_c_cancel_the_runs_in_flight():
    specs = _four_specs()
    workers = _FakeWorkers(capacity=2)
    ended = workers.run(specs, [[0, 2], [1, 3]], finish=lambda i, record: True)
    assert [i for i, _ in ended] == [0] and workers.cancelled == [2]  # run 1 (handle 2) was in flight
    workers = _FakeWorkers(capacity=2, script={1: [KeyboardInterrupt]})
    with pytest.raises(KeyboardInterrupt):
        workers.run(specs, [[0, 2], [1, 3]])
    assert workers.cancelled == [3]  # run 2 had started after run 0 ended


class _FakeRay:
    """Enough of the `ray` module for the Ray adapter: tasks run at once, in this process."""

    class exceptions:
        class RayError(Exception):
            pass

        class RayTaskError(RayError):
            def __init__(self, cause):
                super().__init__(str(cause))
                self.cause = cause

    class _Died(BaseException):
        """Raised by a test task to play a worker process killed under it."""

    class Ref:
        """An object ref: how the task ended."""

        def __init__(self, kind, value):
            self.kind, self.value = kind, value

    def __init__(self):
        self.options, self.cancelled, self.calls = {}, [], []
        self.started = self.stopped = False

    def is_initialized(self):
        return self.started

    def init(self, **kwargs):
        self.started = True

    def shutdown(self):
        self.stopped = True

    def cluster_resources(self):
        return {"CPU": 2.0}

    def remote(self, fn):
        ray = self

        class Remote:
            def options(self, **kwargs):
                ray.options = kwargs
                return self

            def remote(self, *args):
                ray.calls.append(args)
                try:
                    return _FakeRay.Ref("ok", fn(*args))
                except _FakeRay._Died:
                    return _FakeRay.Ref("died", None)
                except Exception as exc:
                    return _FakeRay.Ref("raised", exc)

        return Remote()

    def wait(self, refs, num_returns):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        if ref.kind == "died":
            raise self.exceptions.RayError("the worker died")
        if ref.kind == "raised":
            raise self.exceptions.RayTaskError(ref.value)
        return ref.value

    def cancel(self, ref, force):
        self.cancelled.append(ref)


def test_ray_adapter_runs_the_grid_through_the_scheduling_loop(monkeypatch):
    """Without Ray installed: the adapter's resources, its reading of a dead worker and of a task that
    raised, and the shutdown of the Ray it started (the real cluster is tested below, when installed)."""
    from fedbench.execution import scheduler

    ray = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", ray)
    specs = _four_specs()
    contexts, attempts = [], {}

    def make_task(ctx):
        contexts.append(ctx)

        def task(spec):
            i = specs.index(spec)
            attempts[i] = attempts.get(i, 0) + 1
            if i == 1:
                raise _FakeRay._Died
            if i == 2:
                raise ValueError("boom")
            return _record(spec)

        return task

    ended = {}

    def finish(i, record):
        ended[i] = record
        return False

    scheduler.run_on_workers(
        specs, [[0, 2], [1, 3]], RunContext(device="auto", backend="ray"), 1, make_task, finish
    )
    assert ray.options == {"num_cpus": 1.0, "num_gpus": 0.0, "max_retries": 0}
    assert [(c.device, c.threads) for c in contexts] == [("cpu", 1)]  # no GPU in the cluster
    assert ended[0].status == ended[3].status == "ok"
    assert ended[1].status == "failed" and "worker process died" in ended[1]["reason"] and attempts[1] == 2
    assert ended[2].status == "failed" and ended[2]["reason"] == "ValueError: boom"
    assert ray.started and ray.stopped and not ray.cancelled


# --------------------------------------------------------------------- batched reconstructions


def _psnrs(rec_x: torch.Tensor, truth01: np.ndarray, meta) -> np.ndarray:
    from fedbench.attacks._inversion import to_pixels
    from fedbench.metrics.reconstruction import psnr

    return np.array([float(psnr(truth01, to_pixels(x, meta).numpy()).mean()) for x in rec_x])


@pytest.mark.parametrize("attack", ["ig", "dlg"])
def test_batched_reconstructions_have_the_one_at_a_time_psnr_distribution(attack):
    """R restarts as one vmapped optimisation vs the same R starts run one at a time (same seeds)."""
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from torch import nn

    from fedbench.attacks import _inversion as inv
    from fedbench.plugin import DatasetMeta

    torch.set_num_threads(1)
    meta = DatasetMeta("digits8", (1, 8, 8), 10, "image", (0.3,), (0.4,))
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(1, 6, 3, 1, 1), nn.Sigmoid(), nn.Flatten(), nn.Linear(6 * 64, 10))
    for p in model.parameters():
        nn.init.uniform_(p, -0.5, 0.5)
    d = load_digits()
    truth = torch.tensor(d.images[[7]] / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(d.target[[7]])
    g = torch.autograd.grad(F.cross_entropy(model((truth - 0.3) / 0.4), y), list(model.parameters()))
    target = {n: gi for (n, _), gi in zip(model.named_parameters(), g, strict=True)}
    model = inv.prepare_model(model, model.state_dict(), "eval", torch.device("cpu"))
    R = 6
    x0 = torch.randn((R, 1, 1, 8, 8), generator=torch.Generator().manual_seed(0))
    if attack == "ig":
        matcher = inv.GradientMatcher(model, target, cost="cosine")
        box = inv.box_bounds(meta, 1, torch.device("cpu"))
        kw = dict(labels=y, optimizer="adam-signed", iterations=60, lr=0.1, box=box)
    else:
        matcher = inv.GradientMatcher(model, target, cost="l2")
        kw = dict(labels=y, optimizer="lbfgs", iterations=4, lr=1.0, lbfgs_max_iter=10)
    batched = inv.reconstruct_batched(matcher, x0, **kw)
    single = torch.cat([inv.reconstruct_batched(matcher, x0[r : r + 1], **kw).x for r in range(R)])
    pb, ps = _psnrs(batched.x, truth.numpy(), meta), _psnrs(single, truth.numpy(), meta)
    assert pb.max() > 15  # the attack works on this problem (the random-image floor is ~6-9 dB)
    # same distribution, mean and best; near-exact reconstructions (DLG reaches the 100 dB cap) amplify
    # float rounding, hence the relative tolerance
    assert np.allclose(np.sort(pb), np.sort(ps), rtol=0.01, atol=0.05)
    assert math.isclose(pb.mean(), ps.mean(), rel_tol=0.005) and math.isclose(
        pb.max(), ps.max(), rel_tol=0.005
    )


# ----------------------------------------------------------------------------------------- Ray


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_backend_gives_the_local_results_table_on_smoke(tmp_path, ray_cluster):
    from fedbench.api import execute_grid
    from fedbench.reporting.tables import load_results, pivot, records

    grid = build_grid("smoke")
    _, local = execute_grid(grid, RunContext(threads=1), RunCache(tmp_path / "a"), tmp_path / "local")
    rows, remote = execute_grid(
        grid, RunContext(threads=1, backend="ray"), RunCache(tmp_path / "b"), tmp_path / "ray"
    )
    assert {r["status"] for r in rows} == {"ok"} and not any(r["from_cache"] for r in rows)
    assert records(pivot(load_results([local]))) == records(pivot(load_results([remote])))


@pytest.mark.slow
def test_ray_worker_that_dies_is_a_failed_row(tmp_path, ray_cluster):
    from fedbench.registry import defenses, load_plugin_file

    plugin = tmp_path / "die.py"
    plugin.write_text(
        "import os, signal\nfrom fedbench.plugin import Defense\n"
        "from fedbench.registry import register_defense\n"
        "@register_defense('test-ray-die')\nclass Die(Defense):\n"
        "    def update(self, delta, ctx):\n        os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    load_plugin_file(plugin)
    try:
        grid = build_grid("smoke", Overrides(defenses=("none", "test-ray-die"), sets=("scenario.rounds=1",)))
        rows = run_grid(list(grid.specs), RunCache(None), RunContext(threads=1, backend="ray"))
    finally:
        defenses.unregister("test-ray-die")
    by = {r["defense"]: r for r in rows}
    assert by["none"]["status"] == "ok"
    assert by["test-ray-die"]["status"] == "failed" and "worker process died" in by["test-ray-die"]["reason"]


# ------------------------------------------------------------------------------ default thread policy


def test_default_threads_are_the_free_cores_shared_by_the_workers():
    from fedbench.execution.placement import default_threads, free_cores

    assert free_cores(cores=2, load=0.05) == 2  # idle laptop: every core
    assert free_cores(cores=2, load=2.3) == 1  # a shared 2-core box, both cores busy: one thread
    assert free_cores(cores=2, load=1.0) == 1
    assert free_cores(cores=64, load=60.4) == 4  # a busy server: what is left
    assert free_cores(cores=8, load=0.0) == 8 and free_cores(cores=8, load=99.0) == 1
    assert default_threads(2, cores=8, load=0.0) == 4  # two workers share the free cores
    assert default_threads(4, cores=2, load=0.0) == 1  # never below one


def test_a_sequential_grid_on_busy_cores_runs_one_thread(monkeypatch, tmp_path):
    """Simulated load: with the load average at the core count, a grid without --threads uses 1 thread."""
    import torch

    from fedbench.execution import placement
    from fedbench.execution.cache import RunCache
    from fedbench.execution.runner import RunContext, run_grid
    from fedbench.testing import tiny_spec

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(placement, "usable_cores", lambda: 2)
        monkeypatch.setattr(placement.os, "getloadavg", lambda: (2.0, 2.0, 2.0))
        monkeypatch.setattr(placement, "runnable_others", lambda: 2)  # two other jobs running now
        run_grid([tiny_spec("defense", "none")], RunCache(None), RunContext())
        assert torch.get_num_threads() == 1
        monkeypatch.setattr(placement, "runnable_others", lambda: 0)  # they ended: the average lags
        torch.set_num_threads(2)
        run_grid([tiny_spec("defense", "none")], RunCache(None), RunContext())
        assert torch.get_num_threads() == 2
        monkeypatch.setattr(placement.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
        torch.set_num_threads(2)
        run_grid([tiny_spec("defense", "none")], RunCache(None), RunContext())
        assert torch.get_num_threads() == 2  # idle: torch's own choice stays
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------------- --n-jobs auto


def _smoke_specs():
    from fedbench.spec.grid import Overrides, build_grid

    return list(build_grid("smoke", Overrides(sets=("scenario.rounds=1",))).specs)


def test_auto_jobs_keeps_short_runs_in_this_process(monkeypatch):
    from fedbench.execution import runner, scheduler
    from fedbench.execution.cache import RunCache
    from fedbench.execution.placement import AUTO_JOBS

    def no_workers(*args, **kwargs):
        raise AssertionError("short runs must not start workers")

    monkeypatch.setattr(scheduler, "run_on_workers", no_workers)
    monkeypatch.setattr(runner, "PARALLEL_PAYS_AFTER_S", 1e9)
    records = runner.run_grid(_smoke_specs(), RunCache(None), runner.RunContext(), n_jobs=AUTO_JOBS)
    assert [r.status for r in records] == ["ok"] * 4


def test_auto_jobs_moves_the_rest_to_one_worker_per_free_core_once_runs_are_long(monkeypatch):
    from fedbench.execution import placement, runner, scheduler
    from fedbench.execution.cache import RunCache
    from fedbench.execution.placement import AUTO_JOBS

    calls = []
    real = scheduler.run_on_workers

    def spy(specs, groups, ctx, n_jobs, make_task, finish, prepare=None):
        calls.append((groups, n_jobs))
        return real(specs, groups, ctx, n_jobs, make_task, finish, prepare)

    monkeypatch.setattr(scheduler, "run_on_workers", spy)
    monkeypatch.setattr(runner, "PARALLEL_PAYS_AFTER_S", 0.0)  # every computed run "pays"
    monkeypatch.setattr(placement, "free_cores", lambda *a, **k: 2)
    specs = _smoke_specs()
    seq = runner.run_grid(specs, RunCache(None), runner.RunContext(threads=1))
    auto = runner.run_grid(specs, RunCache(None), runner.RunContext(threads=1), n_jobs=AUTO_JOBS)
    ((groups, jobs),) = calls
    assert jobs == 2 and sorted(i for g in groups for i in g) == [1, 2, 3]  # the first ran here
    assert [r.run_id for r in auto] == [r.run_id for r in seq]
    assert [r["test_acc"] for r in auto] == [r["test_acc"] for r in seq]


def test_n_jobs_auto_on_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from fedbench.cli import app

    res = CliRunner().invoke(
        app, ["run", "smoke", "-j", "auto", "--set", "scenario.rounds=1", "-o", str(tmp_path), "--no-cache"]
    )
    assert res.exit_code == 0, res.output
    bad = CliRunner().invoke(app, ["run", "smoke", "-j", "two"])
    assert bad.exit_code == 2 and "--n-jobs two" in bad.output
