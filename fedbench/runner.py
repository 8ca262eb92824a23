"""Execute one RunSpec (utility run, attack run, metrics) and a whole grid.

`execute` turns a spec into one results row: the utility run and the attack run come from the
cache when present; metrics are computed here, outside the cache, so a metric can be fixed or added
without re-running attacks. A run that raises becomes a `failed` row with the error; a plugin that
does not apply becomes a `skipped` row with its reason. `run_grid` groups runs by utility key so the
FL training shared by several attacks happens once, sequentially or in joblib worker processes.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from fedbench import __version__
from fedbench.api import Attack
from fedbench.cache import RunCache
from fedbench.errors import FedbenchError, RunFailure
from fedbench.params import params_to_dict
from fedbench.results import SCENARIO_PREFIX
from fedbench.spec import RunSpec, canonical_json


@dataclass(frozen=True)
class RunContext:
    """Where and how runs execute; none of it is part of a cache key."""

    device: str = "cpu"
    data_root: str | None = None
    download: bool = False
    threads: int | None = None


@dataclass(frozen=True)
class Job:
    """What a cached computation needs besides its key (ignored by the cache hash)."""

    spec: RunSpec
    ctx: RunContext


@dataclass(frozen=True)
class RunEvent:
    """Progress of a grid: one finished run."""

    index: int
    total: int
    spec: RunSpec
    status: str  # done | cached | skipped | failed
    row: dict[str, Any]


def check_device(device: str) -> str:
    """Validate a --device value early; 'cuda' without a GPU is a usage error. Returns it unchanged.

    'auto' and 'cpu' need no torch import, which keeps a fully cached re-run fast.
    """
    if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
        raise FedbenchError(f"--device {device}: use auto, cpu, cuda or cuda:N")
    if device.startswith("cuda"):
        resolve_device(device)
    return device


def resolve_device(device: str) -> str:
    """'auto' -> cuda when visible, else cpu; 'cuda' without a GPU is a usage error."""
    if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
        raise FedbenchError(f"--device {device}: use auto, cpu, cuda or cuda:N")
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise FedbenchError(f"--device {device}: no CUDA device is visible; use --device cpu or auto")
    return device


# ------------------------------------------------------------------------------------ computations


def _load(spec: RunSpec, ctx: RunContext):
    from fedbench.data import load_dataset

    return load_dataset(spec.dataset.name, spec.dataset.params_dict, ctx.data_root, ctx.download)


def _model_factory(spec: RunSpec, meta: Any) -> Callable[[], Any]:
    from fedbench.models import build_model

    return lambda: build_model(spec.model.name, spec.model.params_dict, meta.input_shape, meta.num_classes)


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def compute_utility(job: Job) -> dict[str, Any]:
    """Train with the defense for the scenario's rounds; accuracy/loss per round and at the end."""
    from fedbench.fl.simulation import Simulation

    spec, ctx = job.spec, job.ctx
    start = time.perf_counter()
    bundle = _load(spec, ctx)
    defense = spec.defense.instantiate()
    device = resolve_device(ctx.device)
    sim = Simulation(spec.scenario, bundle, _model_factory(spec, bundle.meta), defense, spec.seed, device)
    result = sim.run()
    accounting = defense.accounting(spec.scenario, len(sim.y_train))
    return {
        "test_acc": result.test_acc,
        "test_loss": result.test_loss,
        "history": result.history,
        "client_sizes": result.client_sizes,
        "accounting": dataclasses.asdict(accounting) if accounting else None,
        "seconds": time.perf_counter() - start,
        "device": device,
    }


def compute_attack(job: Job) -> dict[str, Any]:
    """Simulate up to the observation, run the attack, return its output and the ground truth."""
    import numpy as np
    import torch

    from fedbench.fl.seeding import torch_generator
    from fedbench.fl.simulation import ObservationRequest, Simulation, fast_float_mode

    spec, ctx = job.spec, job.ctx
    start = time.perf_counter()
    device = resolve_device(ctx.device)
    bundle = _load(spec, ctx)
    attack = spec.attack.instantiate()
    sc = spec.scenario
    request = ObservationRequest(attack.point_for(sc), sc.observe_round, sc.victim, attack.observes_cohort)
    factory = _model_factory(spec, bundle.meta)
    sim = Simulation(
        sc,
        bundle,
        factory,
        spec.defense.instantiate(),
        spec.seed,
        device,
        observe=request,
        server_hook=attack.server_hook(bundle.meta),
        stop_after_observation=True,
    )
    obs = sim.run().observation
    if obs is None:
        raise RunFailure(f"{attack.name}: no '{request.point}' observation was produced")
    if sim.defense.implements("prepare_data"):
        obs = sim.locate(obs)  # rows and the private inputs behind data the defense replaced
    if type(attack).bind_data is not Attack.bind_data:
        attack.bind_data(sim.run_data())
    if type(attack).bind_defense is not Attack.bind_defense:
        attack.bind_defense(sim.defense)
    fast_float_mode()
    torch.manual_seed(spec.seed)
    model = factory().to(device)
    output = attack.run(obs, model, bundle.meta, torch_generator(spec.seed, "attack"), torch.device(device))
    truth = {
        "y": obs.y_true.cpu().numpy(),
        "attributes": {k: v.cpu().numpy() for k, v in obs.attr_true.items()},
    }
    if obs.cohort:  # every observed participant's attribute values, in cohort order
        truth["cohort"] = [
            {"client": o.client, "attributes": {k: v.cpu().numpy() for k, v in o.attr_true.items()}}
            for o in obs.cohort
        ]
    if bundle.meta.is_image and obs.x_true.numel():
        truth["images"] = bundle.denormalize(obs.x_true).clamp(0, 1).cpu().numpy().astype(np.float32)
        if obs.x_private is not None:  # metrics compare with the private data; keep what was shared too
            truth["shared_images"] = truth["images"]
            truth["images"] = bundle.denormalize(obs.x_private).clamp(0, 1).cpu().numpy().astype(np.float32)
    return {
        "output": {f.name: getattr(output, f.name) for f in dataclasses.fields(output)},
        "truth": truth,
        "observation": {
            "point": obs.point,
            "round": obs.round,
            "kind": obs.kind,
            "examples": len(obs.y_true),
        },
        "seconds": time.perf_counter() - start,
        "device": device,
    }


# ----------------------------------------------------------------------------------------- one run


def _base_row(spec: RunSpec) -> dict[str, Any]:
    row: dict[str, Any] = {
        "run_id": spec.run_id,
        "utility_id": spec.utility_id,
        "preset": spec.preset,
        "dataset": spec.dataset.label,
        "model": spec.model.label,
        "defense": spec.defense.label,
        "attack": spec.attack.label if spec.attack else "",
        "defense_name": spec.defense.name,
        "attack_name": spec.attack.name if spec.attack else "",
        "seed": spec.seed,
    }
    for key, value in params_to_dict(spec.scenario).items():
        row[SCENARIO_PREFIX + key] = value
    for comp in (spec.dataset, spec.model, spec.defense, spec.attack):
        if comp is None:
            continue
        for key, value in comp.params_dict.items():
            row[f"p_{comp.kind}_{key}"] = canonical_json(value) if isinstance(value, list) else value
    row.update(
        {
            "fedbench_version": __version__,
            "torch_version": torch_version(),
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
    )
    return row


def torch_version() -> str:
    """The installed torch version, read without importing torch."""
    from importlib.metadata import version

    return version("torch")


def skip_reason(spec: RunSpec, ctx: RunContext) -> str | None:
    """Why this run does not apply (plugin `check`s), or None."""
    scenario = spec.scenario
    for comp in (spec.dataset, spec.model, spec.defense, spec.attack):
        if comp is None:
            continue
        reason = comp.instantiate().check(scenario)
        if reason:
            return f"{comp.name}: {reason}"
    return None


def attack_skip_reason(spec: RunSpec, ctx: RunContext) -> str | None:
    """Why the attack does not apply to this dataset or model (loads the metadata, builds the model)."""
    attack = spec.attack.instantiate()
    meta = _load(spec, ctx).meta
    check_meta = getattr(attack, "check_meta", None)
    reason = check_meta(meta) if callable(check_meta) else None
    if not reason and type(attack).check_model is not Attack.check_model:
        reason = attack.check_model(_model_factory(spec, meta)())
    return f"{attack.name}: {reason}" if reason else None


def execute(spec: RunSpec, cache: RunCache, ctx: RunContext) -> dict[str, Any]:
    """One results row for `spec`; never raises for a run failure (it becomes a `failed` row)."""
    row = _base_row(spec)
    job = Job(spec, ctx)
    start = time.perf_counter()
    try:
        reason = skip_reason(spec, ctx)
        attack_key = canonical_json(spec.key())
        if not reason and spec.attack is not None and not cache.has_attack(attack_key):
            reason = attack_skip_reason(spec, ctx)
        if reason:
            row.update(status="skipped", reason=reason, from_cache=False)
            return row
        utility, u_cached = cache.utility(canonical_json(spec.utility_key()), job)
        row.update(
            test_acc=utility["test_acc"],
            test_loss=utility["test_loss"],
            utility_seconds=utility["seconds"],
            device=utility["device"],
        )
        acc = utility.get("accounting")
        if acc:
            row.update(
                epsilon=acc["epsilon"],
                delta=acc["delta"],
                dp_level=acc["level"],
                accountant=acc["accountant"],
            )
        cached = u_cached
        if spec.attack is not None:
            from fedbench.metrics import attack_metrics

            result, a_cached = cache.attack(attack_key, job)
            row.update(attack_metrics(spec.attack.instantiate(), result))
            row["attack_seconds"] = result["seconds"]
            cached = cached and a_cached
        row.update(status="ok", from_cache=cached, reason="")
        row["_history"] = utility["history"]
    except Exception as exc:  # a failed run is a row, never a crash of the grid (finished runs are kept)
        row.update(status="failed", from_cache=False, reason=f"{type(exc).__name__}: {exc}"[:500])
    row["seconds"] = time.perf_counter() - start
    row["peak_rss_mb"] = _peak_rss_mb()
    return row


# -------------------------------------------------------------------------------------------- grid


def _status(row: dict[str, Any]) -> str:
    if row["status"] == "ok":
        return "cached" if row.get("from_cache") else "done"
    return row["status"]


def _run_group(
    specs: list[RunSpec], cache_location: str | None, force: bool, ctx: RunContext
) -> list[dict[str, Any]]:
    """Worker entry point: the runs sharing one utility key, in order."""
    if ctx.threads:
        import torch

        torch.set_num_threads(ctx.threads)
    cache = RunCache(cache_location, force=force)
    return [execute(spec, cache, ctx) for spec in specs]


def preflight(specs: list[RunSpec], ctx: RunContext) -> None:
    """Fail before any run when a dataset needs a --data-root that is missing, or the device is bad.

    Datasets that read from a root are loaded here (once; the load is memoised for the runs).
    Shipped datasets are loaded only when a run actually computes, so a cached re-run stays fast.
    """
    from fedbench.registry import datasets

    check_device(ctx.device)
    seen = set()
    for spec in specs:
        key = (spec.dataset.name, canonical_json(spec.dataset.params_dict))
        if key not in seen and getattr(datasets.get(spec.dataset.name), "needs_root", False):
            seen.add(key)
            _load(spec, ctx)


def run_grid(
    specs: list[RunSpec],
    cache: RunCache,
    ctx: RunContext,
    n_jobs: int = 1,
    on_event: Callable[[RunEvent], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every spec; rows come back in grid order. Runs sharing a utility key run together."""
    preflight(specs, ctx)
    groups: dict[str, list[int]] = {}
    for i, spec in enumerate(specs):
        groups.setdefault(spec.utility_id, []).append(i)
    rows: list[dict[str, Any] | None] = [None] * len(specs)
    done = 0

    def collect(indices: list[int], group_rows: list[dict[str, Any]]) -> None:
        nonlocal done
        for i, row in zip(indices, group_rows, strict=True):
            rows[i] = row
            done += 1
            if on_event:
                on_event(RunEvent(done, len(specs), specs[i], _status(row), row))

    location = str(cache.location) if cache.location else None
    if n_jobs == 1 or len(groups) == 1:
        if ctx.threads:
            import torch

            torch.set_num_threads(ctx.threads)
        for indices in groups.values():
            group_rows = []
            for i in indices:
                group_rows.append(execute(specs[i], cache, ctx))
            collect(indices, group_rows)
    else:
        from joblib import Parallel, delayed

        workers = min(n_jobs, len(groups))
        threads = ctx.threads or max(1, (os.cpu_count() or 1) // workers)
        wctx = dataclasses.replace(ctx, threads=threads)
        order = list(groups.values())
        parallel = Parallel(n_jobs=workers, backend="loky", return_as="generator_unordered")
        tasks = (
            delayed(_with_indices)(ix, [specs[i] for i in ix], location, cache.force, wctx) for ix in order
        )
        for indices, group_rows in parallel(tasks):
            collect(indices, group_rows)
    return [r for r in rows if r is not None]


def _with_indices(
    indices: list[int], specs: list[RunSpec], location: str | None, force: bool, ctx: RunContext
) -> tuple[list[int], list[dict[str, Any]]]:
    return indices, _run_group(specs, location, force, ctx)
