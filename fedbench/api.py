"""The Python API behind the CLI: run a preset and get a DataFrame; create plugins by name.

>>> import fedbench
>>> df = fedbench.run("smoke", seeds=2)
>>> df[["defense", "test_acc"]]
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedbench.execution.cache import CacheWarning, RunCache
from fedbench.execution.paths import default_cache_dir, writable_dir
from fedbench.execution.placement import AUTO_JOBS
from fedbench.execution.provenance import environment
from fedbench.execution.record import RunRecord
from fedbench.execution.runner import GridInterrupted, GridSetup, RunContext, RunEvent, check_grid, run_grid
from fedbench.reporting.results import results_path, write_results
from fedbench.spec.grid import Grid, Overrides, build_grid
from fedbench.spec.run import ComponentSpec, RunSpec


def create_defense(name: str, **params: Any):
    return ComponentSpec.resolve("defense", name, params).instantiate()


def create_attack(name: str, **params: Any):
    return ComponentSpec.resolve("attack", name, params).instantiate()


def create_model(name: str, **params: Any):
    return ComponentSpec.resolve("model", name, params).instantiate()


def create_dataset(name: str, **params: Any):
    return ComponentSpec.resolve("dataset", name, params).instantiate()


def execute_grid(
    grid: Grid,
    ctx: RunContext | GridSetup,
    cache: RunCache,
    out_dir: str | Path | None,
    n_jobs: int = 1,
    on_event: Callable[[RunEvent], None] | None = None,
    command: str = "",
    fail_fast: bool = False,
) -> tuple[list[RunRecord], Path | None]:
    """Run a grid and write its results (CSV + JSON sidecar) when `out_dir` is given.

    `ctx` and `n_jobs` are checked first, unless `ctx` is a `GridSetup` from `check_grid`. On Ctrl-C the
    finished runs are written (the sidecar says `interrupted`) and the `GridInterrupted` is re-raised
    with `path` set. The records' warnings are warned here (CacheWarning) when no `on_event` callback
    took them.
    """
    setup = ctx if isinstance(ctx, GridSetup) else check_grid(list(grid.specs), ctx, n_jobs)
    if out_dir is not None:  # a file in its place, a read-only or full disk: stop before any run
        writable_dir(out_dir)
    specs = list(grid.specs)  # a cascade narrows them as they run: the sidecar keys the runs that ran
    try:
        records = run_grid(specs, cache, setup, on_event=on_event, fail_fast=fail_fast, cascade=grid.cascade)
    except GridInterrupted as exc:
        exc.path = _write_grid_results(
            grid, specs, setup.ctx, exc.records, out_dir, command, True, on_event is None
        )
        raise
    return records, _write_grid_results(
        grid, specs, setup.ctx, records, out_dir, command, False, on_event is None
    )


def _write_grid_results(
    grid: Grid,
    specs: list[RunSpec],
    ctx: RunContext,
    records: list[RunRecord],
    out_dir: str | Path | None,
    command: str,
    interrupted: bool,
    warn: bool,
) -> Path | None:
    if warn:
        for record in records:
            for message in record.warnings:
                warnings.warn(message, CacheWarning, stacklevel=3)
    path = None
    if out_dir is not None and records:
        path = results_path(out_dir, grid.name)
        sidecar = {
            "preset": grid.name,
            "source": grid.source,
            "description": grid.description,
            "paper": grid.paper,
            "substitution": grid.substitution,
            "command": command,
            "seeds": list(grid.seeds),
            "environment": environment(ctx.device),
            "runs": {spec.run_id: spec.key() for spec in specs},
            "history": {r.utility_id: r.history for r in records if r.history is not None},
            "per_image": {r.run_id: r.per_image for r in records if r.per_image is not None},
            "reported": list(grid.reported),
            "board": grid.board,
            "cascade": list(grid.cascade.order) if grid.cascade else [],
            "interrupted": interrupted,
            "finished_runs": len(records),
        }
        path = write_results([r.columns for r in records], sidecar, path)
    return path


def run(
    preset: str | Path = "quickstart",
    *,
    datasets=None,
    models=None,
    defenses=None,
    attacks=None,
    sets=(),
    seeds: int | None = None,
    device: str = "auto",
    data_root: str | None = None,
    cache_dir: str | Path | None = None,
    out_dir: str | Path | None = None,
    n_jobs: int | str = 1,
    use_cache: bool = True,
    timeout: float | None = None,
    fail_fast: bool = False,
    backend: str = "local",
    address: str | None = None,
    gpus: tuple[int, ...] = (),
    threads: int | None = None,
):
    """Run a preset (name or path) and return one row per run as a pandas DataFrame.

    `threads` sets torch's intra-op threads per worker (the CLI's `--threads`; default: the free cores,
    cores minus the 1-minute load average, shared by the n_jobs workers).
    `backend="ray"` runs the grid as Ray tasks (on the cluster at `address`, else a local one);
    `gpus=(0, 1)` runs one worker per GPU (see `fedbench.execution.placement`). `n_jobs="auto"` runs in
    this process until a computed run takes 5 s, then the rest on one worker per free core.
    """
    import pandas as pd

    def tup(v):
        return tuple([v] if isinstance(v, str) else v) if v is not None else None

    overrides = Overrides(tup(datasets), tup(models), tup(defenses), tup(attacks), tuple(sets), seeds)
    grid = build_grid(preset, overrides)
    ctx = RunContext(
        device,
        data_root,
        threads=threads,
        timeout=timeout,
        backend=backend,
        address=address,
        gpus=tuple(gpus),
    )
    jobs = AUTO_JOBS if n_jobs == "auto" else int(n_jobs)
    setup = check_grid(list(grid.specs), ctx, jobs)  # before the cache folder is created
    cache = RunCache((cache_dir or default_cache_dir()) if use_cache else None)
    records, _ = execute_grid(grid, setup, cache, out_dir, fail_fast=fail_fast)
    return pd.DataFrame([r.columns for r in records])


def compare(df, metrics=None, rows=None, agg: str = "mean", where=()):
    """The trade-off table of a results DataFrame (e.g. from `run`) as a DataFrame of numbers.

    One row per configuration; per column the aggregate over seeds, its spread and count, and for
    worst-case columns the attack that achieved it (the same table `fedbench compare` renders).
    """
    import pandas as pd

    from fedbench.reporting.tables import pivot, records

    return pd.DataFrame(records(pivot(df, metrics=metrics, rows=rows, agg=agg, where=where)))
