"""Execute one RunSpec (utility run, attack run, metrics) and a whole grid.

`execute` turns a spec into one `RunRecord`: the utility run and the attack run come from the cache
when present; metrics are computed here, outside the cache, so a metric can be fixed or added without
re-running attacks. A run that raises becomes a `failed` record with the error; a plugin that does not
apply becomes a `skipped` record with its reason; a run past `RunContext.timeout` a `timeout` record.
The run's plugins are instantiated once (`Components`) and handed to everything that needs them.
`run_grid` runs the runs sharing a utility key after their first, so the FL training shared by several
attacks happens once, sequentially in this process or on workers (`fedbench.execution.scheduler`).

Faults: an exception (NaN, MemoryError, CUDA out of memory, a plugin bug) inside a run is caught by
`execute`. A worker process that dies (the kernel's OOM killer, a crash in native code) takes down
the runs in flight; they are retried one at a time, and the one that kills its worker again becomes
a `failed` record. The timeout is an interval timer (SIGALRM) in the process that executes the run:
it stops Python code between two bytecodes, so a single native call that never returns is not cut.
Ctrl-C (or SIGTERM, which the CLI turns into Ctrl-C) raises `GridInterrupted` with the records of the
runs that finished; every finished run is also in the cache, so the same command resumes.
"""

from __future__ import annotations

import dataclasses
import math
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any

from fedbench.errors import FedbenchError, RunFailure
from fedbench.execution import placement, scheduler
from fedbench.execution.cache import RunCache
from fedbench.execution.cascade import Cascade
from fedbench.execution.cascade import skip_reason as cascade_skip
from fedbench.execution.derived import derived_key
from fedbench.execution.placement import Backend
from fedbench.execution.record import STOP_STATUSES, RunRecord, base_columns, skipped_record
from fedbench.execution.sources import code_digests
from fedbench.plugin import Attack, Dataset, Defense, Model, using_artifacts
from fedbench.spec.run import RunSpec, canonical_json, training_scenario


@dataclass(frozen=True)
class RunContext:
    """Where and how runs execute; none of it is part of a cache key."""

    device: str = "cpu"
    data_root: str | None = None
    download: bool = False
    threads: int | None = None
    timeout: float | None = None  # seconds per run (utility + attack); None: no limit
    backend: Backend = "local"  # local (this process or loky workers) | ray; see fedbench.execution.placement
    address: str | None = None  # Ray cluster HOST:PORT; None starts a local one
    gpus: tuple[int, ...] = ()  # --gpus: one worker per listed GPU


@dataclass(frozen=True)
class Components:
    """A run's plugins, instantiated once from the spec's validated parameters.

    The instances serve the skip checks, the accountant, the simulations and the metrics. The defense is
    the exception for the simulations: each simulation gets its own instance (`simulation_defense`),
    built from the same validated parameters, because a defense keeps state from the simulation it ran in
    that binding it to the next one's data does not reset: RecUP-FL with `zoo_at=first` keeps the first
    round's global weights (under a malicious server the attack simulation's differ from the utility
    simulation's: one shared instance changes the rows of RecUP-FL x SDAN), MixUp and InstaHide keep each
    client's latest draws, LODA its per-client traces. The utility run may come from the cache, in which
    case the attack simulation is the only one; a fresh defense per simulation gives the same result
    either way, as separate instances always did.
    """

    dataset: Dataset
    model: Model
    defense: Defense
    attack: Attack | None

    @classmethod
    def of(cls, spec: RunSpec) -> Components:
        return cls(
            spec.dataset.instantiate(),
            spec.model.instantiate(),
            spec.defense.instantiate(),
            spec.attack.instantiate() if spec.attack is not None else None,
        )

    def simulation_defense(self) -> Defense:
        """A pristine defense for one simulation (see the class docstring); the parameters are frozen."""
        return type(self.defense)(self.defense.params)

    def model_factory(self, meta: Any) -> Callable[[], Any]:
        """Builds a fresh torch module for the dataset (initialised from torch's global RNG)."""
        shape, classes = tuple(int(s) for s in meta.input_shape), int(meta.num_classes)
        return lambda: self.model.build(shape, classes)

    def skip_reason(self, scenario: Any) -> str | None:
        """Why this run does not apply in `scenario` (the plugins' `check`s), or None."""
        for plugin in (self.dataset, self.model, self.defense, self.attack):
            reason = plugin.check(scenario) if plugin is not None else None
            if reason:
                return f"{plugin.name}: {reason}"
        return None


@dataclass
class Job:
    """What a cached computation needs besides its key (ignored by the cache hash): the spec, where it
    runs, and the run's plugins."""

    spec: RunSpec
    ctx: RunContext
    built: Components | None = None  # the plugins `execute` built; None: built from the spec when needed

    @cached_property
    def parts(self) -> Components:
        """The run's plugin instances."""
        return self.built if self.built is not None else Components.of(self.spec)

    def bundle(self) -> Any:
        """The run's dataset (memoised per process by `fedbench.data.load_dataset`)."""
        from fedbench.data import load_dataset

        ctx = self.ctx
        return load_dataset(self.spec.dataset.name, self.parts.dataset.params, ctx.data_root, ctx.download)


@dataclass(frozen=True)
class RunEvent:
    """Progress of a grid: one finished run."""

    index: int
    total: int
    spec: RunSpec
    record: RunRecord

    @property
    def status(self) -> str:
        """done | cached | skipped | failed | timeout."""
        return self.record.progress


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
    """The dataset of `spec`, before its plugins exist (preflight, warm-up)."""
    from fedbench.data import load_dataset

    return load_dataset(spec.dataset.name, spec.dataset.params_dict, ctx.data_root, ctx.download)


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def compute_utility(job: Job) -> dict[str, Any]:
    """Train with the defense for the scenario's rounds; accuracy/loss per round and at the end.

    A run whose attack reads the final model takes the training from `trained_model`, shared with
    the other attacks of that defense x seed; `seconds` is the training's own, whichever run computed it.
    """
    bundle = job.bundle()
    device = resolve_device(job.ctx.device)
    factory = job.parts.model_factory(bundle.meta)
    if reads_final_model(job, bundle.meta):
        trained = trained_model(job, bundle, factory, device)
    else:
        trained = _train(job, bundle, factory, device)
    return {
        **{k: trained[k] for k in ("test_acc", "test_loss", "history", "client_sizes", "n_train", "seconds")},
        "device": device,
        "code": code_digests(job.spec, attack=False),  # an entry from other plugin or engine code: recomputed
    }


def _train(job: Job, bundle: Any, factory: Callable[[], Any], device: str) -> dict[str, Any]:
    """The run's FL training on the training scenario (without the observation point, as the utility
    key is) with a fresh defense: its utility, its wall time and its final global state (CPU tensors)."""
    from fedbench.fl.simulation import Simulation

    spec = job.spec
    start = time.perf_counter()
    sc = training_scenario(spec.scenario)  # keyed without the observation point: it must not see it
    sim = Simulation(sc, bundle, factory, job.parts.simulation_defense(), spec.seed, device)
    result = sim.run()
    if not (math.isfinite(result.test_acc) and not math.isnan(result.test_loss)):
        raise RunFailure(f"non-finite test acc/loss after training ({result.test_acc}, {result.test_loss})")
    return {
        "test_acc": result.test_acc,
        "test_loss": result.test_loss,
        "history": result.history,
        "client_sizes": result.client_sizes,
        "n_train": len(sim.y_train),  # what the accountant needs (computed per row, outside the cache)
        "seconds": time.perf_counter() - start,
        "global_state": {k: v.detach().cpu().clone() for k, v in sim.global_state.items()},
    }


def reads_final_model(job: Job, meta: Any) -> bool:
    """Whether the run's attack observes the final global model of an honest training (the `model` point,
    no server hook: membership inference), which `trained_model` shares across the attacks."""
    attack = job.parts.attack
    return (
        attack is not None
        and attack.point_for(job.spec.scenario) == "model"
        and attack.server_hook(meta) is None
    )


TRAINED_MODEL = "trained-model"  # the artifact kind of `trained_model`


def trained_model(job: Job, bundle: Any, factory: Callable[[], Any], device: str) -> dict[str, Any]:
    """`_train`'s result, computed once per training and kept as an artifact beside the runs.

    The utility run and every attack that reads the final model (`reads_final_model`) share it, so a
    membership board trains each defense x seed once instead of once per attack; an attack that stops
    at an earlier round simulates up to it as before, and a utility-only run trains without storing a
    model. The key is the training's (`RunSpec.utility_key`) with the digests of the code that trains
    (`code_digests`, as the utility entry stores them), so an edited plugin or engine trains anew. Without
    an on-disk cache it trains on each call.
    """
    from fedbench.plugin import artifact

    spec = job.spec
    key = canonical_json({"training": spec.utility_key(), "code": code_digests(spec, attack=False)})
    return artifact(TRAINED_MODEL, key, partial(_train, job, bundle, factory, device))


def _accounting(job: Job, utility: dict[str, Any]) -> tuple[dict[str, Any], list[str]] | None:
    """The defense's formal guarantee for this run and its notes, computed now rather than read from the
    cache.

    Epsilon depends only on the defense's parameters, the training scenario and the training-set size,
    never on the trained weights, so it is not cached with the training: a fix to an accountant reaches
    every row at once, without retraining and without a version bump. Entries cached before `n_train`
    was stored get the size from the dataset (the same cap the simulation applies).
    """
    spec, defense = job.spec, job.parts.defense
    if type(defense).accounting is Defense.accounting:
        return None
    n_train = utility.get("n_train")
    if n_train is None:
        size = len(job.bundle().y_train)
        n_train = min(spec.scenario.train_size or size, size)
    import warnings as pywarnings

    from fedbench.metrics.accounting import AccountingWarning

    extra = {"tensors": _trained_tensors(job)} if _accepts(defense.accounting, "tensors") else {}
    with pywarnings.catch_warnings(record=True) as caught:
        pywarnings.simplefilter("always", AccountingWarning)  # a loose epsilon is said in the row, once
        accounting = defense.accounting(training_scenario(spec.scenario), int(n_train), **extra)
    notes = []
    for w in caught:
        if issubclass(w.category, AccountingWarning):
            notes.append(str(w.message))
        else:  # other warnings go where they would have gone
            pywarnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if not accounting:
        return None
    return dataclasses.asdict(accounting), list(dict.fromkeys(notes))


def _trained_tensors(job: Job) -> int:
    """M, the number of parameter tensors the run's model trains (what per-layer clipping clips one by
    one). The model is built under a forked RNG, so counting never moves torch's global generator."""
    import torch

    with torch.random.fork_rng(devices=[]):
        model = job.parts.model_factory(job.bundle().meta)()
    return sum(1 for p in model.parameters() if p.requires_grad)


def _accepts(method: Callable[..., Any], name: str) -> bool:
    """Whether `method` takes a keyword `name` (a plugin's `accounting` written before `tensors` does not)."""
    import inspect

    params = inspect.signature(method).parameters
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def compute_attack(job: Job) -> dict[str, Any]:
    """Simulate up to the observation, run the attack, return its output and the ground truth.

    A victim batch (`RunSpec.victims`) is observed in one simulation that records every participant of
    the observed round (a victim the round did not sample gets a simulation of its own) and attacked in
    one call (`fedbench.attacks._victims.run_victims`). Its result holds, under `victims`, each victim's
    output, truth and observation, in victim order, as that victim's own run has them; `output` and
    `truth` are their concatenation (the images of every victim, in that order).
    """
    import torch

    from fedbench.fl.seeding import torch_generator
    from fedbench.fl.simulation import fast_float_mode

    spec, ctx, parts = job.spec, job.ctx, job.parts
    attack = parts.attack
    start = time.perf_counter()
    device = resolve_device(ctx.device)
    bundle = job.bundle()
    factory = parts.model_factory(bundle.meta)

    def new_model() -> Any:  # the model a run's attack gets: built from the run's seed
        torch.manual_seed(spec.seed)
        return factory().to(device)

    def new_generator() -> Any:
        return torch_generator(spec.seed, "attack")

    results: dict[int, dict[str, Any]] = {}  # by client (one entry unless a victim batch)
    for sim, observations in _observations(job, bundle, factory, device):
        if type(attack).bind_data is not Attack.bind_data:
            attack.bind_data(sim.run_data())
        if type(attack).bind_defense is not Attack.bind_defense:
            attack.bind_defense(sim.defense)
        fast_float_mode()
        if spec.victims:
            from fedbench.attacks._victims import run_victims

            outputs = run_victims(
                attack, observations, new_model, bundle.meta, new_generator, torch.device(device)
            )
        else:
            outputs = [
                attack.run(observations[0], new_model(), bundle.meta, new_generator(), torch.device(device))
            ]
        for obs, output in zip(observations, outputs, strict=True):
            results[obs.client] = _attack_result(attack, obs, output, bundle)
    if spec.victims:
        per_victim = [results[v] for v in spec.victims]
        out = {
            "output": _concatenated([r["output"] for r in per_victim]),
            "truth": _concatenated([r["truth"] for r in per_victim]),
            "observation": {
                **per_victim[0]["observation"],
                "examples": sum(r["observation"]["examples"] for r in per_victim),
            },
            "victims": [{"client": v, **r} for v, r in zip(spec.victims, per_victim, strict=True)],
        }
    else:
        (out,) = results.values()
    return {
        **out,
        "seconds": time.perf_counter() - start,
        "device": device,
        "code": code_digests(spec, attack=True),  # an entry from other plugin or engine code: recomputed
    }


def _observations(
    job: Job, bundle: Any, factory: Callable[[], Any], device: str
) -> list[tuple[Any, list[Any]]]:
    """(simulation, observations) pairs covering the run's victims: the run's victim, or every victim of a
    batch. A batch is observed with the round's other participants (`ObservationRequest.cohort`); each
    client's update of a round is computed from the state it received with its own randomness, so its
    observation is the one a run of that victim alone records. A victim the simulated round did not
    sample (participation < 1) is observed in a simulation of its own."""
    from fedbench.fl.simulation import ObservationRequest, Simulation

    spec, parts = job.spec, job.parts
    attack, sc = parts.attack, spec.scenario
    wanted = list(spec.victim_clients)
    out = []
    while wanted:
        cohort = attack.observes_cohort or bool(spec.victims)
        request = ObservationRequest(attack.point_for(sc), sc.observe_round, wanted[0], cohort)
        sim = Simulation(
            sc,
            bundle,
            factory,
            parts.simulation_defense(),
            spec.seed,
            device,
            observe=request,
            server_hook=attack.server_hook(bundle.meta),
            stop_after_observation=True,
        )
        if reads_final_model(job, bundle.meta):  # the training the utility run shares
            obs = sim.trained_observation(trained_model(job, bundle, factory, device)["global_state"])
        else:
            obs = sim.run().observation
        if obs is None:
            raise RunFailure(f"{attack.name}: no '{request.point}' observation was produced")
        if spec.victims:
            recorded = {o.client: o for o in obs.cohort}
            found = [recorded[v] for v in wanted if v in recorded]
            if not found:
                raise RunFailure(
                    f"{attack.name}: victim {wanted[0]} was not observed in round {sc.observe_round}"
                )
        else:
            found = [obs]
        if sim.defense.implements("prepare_data"):  # rows and the private inputs behind replaced data
            found = [sim.locate(o) for o in found]
        out.append((sim, found))
        wanted = [v for v in wanted if v not in {o.client for o in found}]
    return out


def _attack_result(attack: Attack, obs: Any, output: Any, bundle: Any) -> dict[str, Any]:
    """One victim's part of an attack result: the attack's output, the ground truth, the observation."""
    import numpy as np

    for name in ("images", "scores", "predictions"):  # a NaN result is a failure, never a cached number
        value = getattr(output, name)
        if isinstance(value, np.ndarray) and value.dtype.kind == "f" and np.isnan(value).any():
            raise RunFailure(f"{attack.name}: its output has NaN {name}")
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
            "defense_hooks": list(obs.defense_hooks),
        },
    }


def _concatenated(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Victims' outputs or truths as one: arrays joined along their first axis (victim order), tables
    joined key by key; any other value is the first victim's if all agree, else the list of them. An
    output's `extra` is per victim (`victims` in the result), so the joined one lists the clients."""
    import numpy as np

    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for p in parts for k in p):
        values = [p.get(key) for p in parts]
        if key == "extra":
            out[key] = {}
        elif all(isinstance(v, np.ndarray) and v.ndim for v in values):
            out[key] = np.concatenate(values)
        elif all(isinstance(v, dict) for v in values):
            out[key] = _concatenated(values)
        elif all(isinstance(v, list) for v in values):
            out[key] = [x for v in values for x in v]
        else:
            out[key] = values[0] if all(v is values[0] or v == values[0] for v in values) else values
    return out


# ----------------------------------------------------------------------------------------- one run


def attack_skip_reason(job: Job) -> str | None:
    """Why the attack does not apply to this dataset or model (loads the metadata, builds the model)."""
    attack = job.parts.attack
    meta = job.bundle().meta
    check_meta = getattr(attack, "check_meta", None)
    reason = check_meta(meta) if callable(check_meta) else None
    if not reason and type(attack).check_model is not Attack.check_model:
        reason = attack.check_model(job.parts.model_factory(meta)())
    return f"{attack.name}: {reason}" if reason else None


#: The observation points that are one client's: the points a victim batch can observe per victim.
CLIENT_POINTS = ("example", "step", "update", "server")


def victim_batch_reason(spec: RunSpec, attack: Attack | None) -> str | None:
    """Why the run's victim batch (`RunSpec.victims`) does not apply to its attack, or None: a batch
    reconstructs each victim's own observation, so it needs a reconstruction attack of one client's
    observation (membership and attribute inference choose their victims themselves)."""
    if not spec.victims or attack is None:
        return None
    if attack.family != "reconstruction" or attack.observes_cohort:
        return (
            f"{attack.name}: victim batches are for reconstruction attacks; {attack.name} is a "
            f"{attack.family} attack (set scenario.victim, not scenario.victims, for its runs)"
        )
    point = attack.point_for(spec.scenario)
    if point not in CLIENT_POINTS:
        return (
            f"{attack.name}: a victim batch needs each victim's own observation; '{point}' is not a client's"
        )
    return None


class RunTimeout(BaseException):
    """Raised by the per-run alarm. A BaseException, so plugin code catching Exception cannot eat it."""


def timeout_supported() -> bool:
    """The per-run timeout needs interval timers (POSIX) and, in-process, the main thread."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Raise RunTimeout in this (main) thread after `seconds`; no-op for None."""
    if not seconds:
        yield
        return
    if not timeout_supported():
        raise RuntimeError("the run timeout needs POSIX interval timers in the main thread")

    def on_alarm(signum: int, frame: Any) -> None:
        raise RunTimeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, previous)


def _warm_up(spec: RunSpec, ctx: RunContext) -> None:
    """Import torch and load the run's dataset (memoised per process) before a run's clock starts.

    A fresh worker spends seconds on imports and the first dataset load; a per-run timeout bounds
    the run's own work, not that. A load error is left for the run itself to raise and report.
    """
    import torch  # noqa: F401

    import fedbench.fl.simulation  # noqa: F401

    try:
        _load(spec, ctx)
    except Exception:  # the run loads again inside its deadline and reports this as its failure
        pass


def execute(
    spec: RunSpec, cache: RunCache, ctx: RunContext, before_compute: Callable[[], None] | None = None
) -> RunRecord:
    """The record of `spec`; never raises for a run failure (it becomes a `failed` record).

    Ctrl-C (KeyboardInterrupt) is not a run failure: it propagates. The record's warnings are the run's
    own notes (accountant, metrics) followed by the cache's (a corrupted or stale entry recomputed).
    While the run executes, the cache's artifact store is the one `fedbench.plugin.artifact` uses.
    `before_compute()` is called before anything is computed rather than read from the cache (the
    grid's thread setting: a run read whole from the cache never imports torch).
    """
    record = RunRecord(base_columns(spec))
    if ctx.timeout:
        _warm_up(spec, ctx)
    start = time.perf_counter()
    try:
        with _deadline(ctx.timeout), using_artifacts(cache.artifacts):
            _execute_into(record, spec, cache, ctx, before_compute)
    except RunTimeout:
        record.columns.update(
            status="timeout", from_cache=False, reason=f"exceeded the timeout of {ctx.timeout:g} s"
        )
    except Exception as exc:  # a failed run is a record, never a crash of the grid (finished runs are kept)
        record.columns.update(status="failed", from_cache=False, reason=f"{type(exc).__name__}: {exc}"[:500])
    record.warnings.extend(cache.take_warnings())
    record.columns["seconds"] = time.perf_counter() - start
    record.columns["peak_rss_mb"] = _peak_rss_mb()
    return record


def _execute_into(
    record: RunRecord,
    spec: RunSpec,
    cache: RunCache,
    ctx: RunContext,
    before_compute: Callable[[], None] | None = None,
) -> None:
    """Fill `record` with the run's results; raises on a run failure.

    `compute_utility` and `compute_attack` are looked up here, at call time, and handed to the cache,
    each behind `before_compute` (see `execute`), as is the computation of the derived columns.
    """

    def computing(compute: Callable[..., Any]) -> Callable[..., Any]:
        if before_compute is None:
            return compute

        def prepared(*args: Any) -> Any:
            before_compute()
            return compute(*args)

        return prepared

    columns = record.columns
    job = Job(spec, ctx, Components.of(spec))
    reason = job.parts.skip_reason(spec.scenario) or victim_batch_reason(spec, job.parts.attack)
    attack_key = canonical_json(spec.key())
    if not reason and spec.attack is not None and not cache.has_attack(attack_key):
        reason = attack_skip_reason(job)
    if reason:
        columns.update(status="skipped", reason=reason, from_cache=False)
        return
    utility_key = canonical_json(spec.utility_key())
    utility, cached = cache.utility(utility_key, job, computing(compute_utility))
    columns.update(
        test_acc=utility["test_acc"],
        test_loss=utility["test_loss"],
        utility_seconds=utility["seconds"],
        device=utility["device"],
    )
    result = None
    if spec.attack is not None:
        result, a_cached = cache.attack(attack_key, job, computing(compute_attack))
        columns["attack_seconds"] = result["seconds"]
        cached = cached and a_cached
    key = derived_key(attack_key if result is not None else utility_key, spec, utility, result)
    derived, _ = cache.derived(key, computing(lambda: _derived(job, utility, result)))
    if derived["accounting"] is not None:
        acc = derived["accounting"]["values"]
        columns.update(
            epsilon=acc["epsilon"],
            delta=acc["delta"],
            dp_level=acc["level"],
            accountant=acc["accountant"],
        )
        record.warnings.extend(derived["accounting"]["notes"])
    if derived["scores"] is not None:
        scores = derived["scores"]
        columns.update(scores["columns"])
        record.per_image = scores["per_image"]
        record.warnings.extend(scores["warnings"])
    columns.update(status="ok", from_cache=cached, reason="")
    record.history = utility["history"]


def _derived(job: Job, utility: dict[str, Any], result: dict[str, Any] | None) -> dict[str, Any]:
    """A run's derived columns from its cached values: the defense's guarantee (`_accounting`) and, with
    an attack result, its scores (`attack_metrics` on the result with its re-identification pools).
    Stored by `fedbench.execution.derived` under the digest of this code (`sources.DERIVED_ROOTS`)."""
    guarantee = _accounting(job, utility)
    accounting = {"values": guarantee[0], "notes": guarantee[1]} if guarantee else None
    scores = None
    if result is not None:
        from fedbench.metrics import attack_metrics

        scored = attack_metrics(job.parts.attack, with_reid_pools(job, result))
        scores = {"columns": scored.columns, "per_image": scored.per_image, "warnings": scored.warnings}
    return {"accounting": accounting, "scores": scores}


def with_reid_pools(job: Job, result: dict[str, Any]) -> dict[str, Any]:
    """A reconstruction attack's result with what re-identification scores need added to its truth:
    each victim's candidate pool, class-mean image and the dataset's mean image
    (`fedbench.metrics.reidentification.candidate_pools`, keyed on the run seed and the victims).

    Built here, outside the cache, from the run's dataset (loaded once per process): a pool depends on
    the data, the seed and the victim, not on the attack, so cached attack results are scored as they
    are and one victim has one pool under every defense and attack. Other results come back unchanged.
    A victim batch's victims (`victims` in the result, which is how it is scored) get theirs each.
    """
    if "victims" in result:
        return {**result, "victims": [with_reid_pools(job, part) for part in result["victims"]]}
    truth = result.get("truth") or {}
    if getattr(job.parts.attack, "family", None) != "reconstruction" or truth.get("images") is None:
        return result
    if truth.get("y") is None or len(truth["y"]) != len(truth["images"]):
        return result
    from fedbench.metrics.reidentification import candidate_pools

    pools = candidate_pools(job.bundle(), truth["images"], truth["y"], job.spec.seed)
    return {**result, "truth": {**truth, **pools}}


def attack_result(spec: RunSpec, cache: RunCache, ctx: RunContext) -> dict[str, Any]:
    """The attack result of `spec` (its output, ground truth and observation) from the cache, computed
    and cached when missing, with the cache's artifacts current as in a run. No checks, no metrics: what
    `fedbench show run --save-images` draws."""
    with using_artifacts(cache.artifacts):
        return cache.attack(canonical_json(spec.key()), Job(spec, ctx), compute_attack)[0]


# -------------------------------------------------------------------------------------------- grid


class GridInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a grid; `records` are the finished runs (grid order), `path` their file."""

    def __init__(self, records: list[RunRecord], total: int):
        super().__init__(f"interrupted after {len(records)} of {total} runs")
        self.records = records
        self.total = total
        self.path: Any = None


def check_timeout(timeout: float | None, n_jobs: int = 1) -> float | None:
    """Validate --timeout before any run; returns it unchanged."""
    if timeout is None:
        return None
    if not timeout > 0 or not math.isfinite(timeout):
        raise FedbenchError(f"--timeout {timeout}: give a number of seconds > 0")
    if not hasattr(signal, "setitimer"):
        raise FedbenchError("--timeout needs POSIX interval timers (Linux, macOS); drop --timeout here")
    if n_jobs <= 1 and threading.current_thread() is not threading.main_thread():  # 0 = auto: may run here
        raise FedbenchError("--timeout with one job needs the main thread; run from it or use n_jobs >= 2")
    return timeout


def preflight(specs: list[RunSpec], ctx: RunContext) -> None:
    """Fail before any run when a dataset needs a --data-root that is missing, or when its `validation`
    split would leave a side without an example per class (a size only the loaded data tells).

    Datasets that read from a root, and datasets asked for a validation split, are loaded here (once;
    the load is memoised for the runs). Other shipped datasets are loaded only when a run actually
    computes, so a cached re-run stays fast.
    """
    from fedbench.registry import datasets

    seen = set()
    for spec in specs:
        key = (spec.dataset.name, canonical_json(spec.dataset.params_dict))
        if key in seen:
            continue
        root = getattr(datasets.get(spec.dataset.name), "needs_root", False)
        if root or spec.dataset.params_dict.get("validation"):
            seen.add(key)
            _load(spec, ctx)


@dataclass(frozen=True)
class GridSetup:
    """A grid's checked execution setting: the context its runs get and how many run at once."""

    ctx: RunContext
    n_jobs: int


def check_grid(specs: list[RunSpec], ctx: RunContext, n_jobs: int = 1) -> GridSetup:
    """Every check of a grid's setting, before any run or output: the device, the timeout, the placement
    (`--backend`, `--address`, `--gpus` against `--device` and `--n-jobs`, which may change the context
    and the job count) and the datasets that need a --data-root. Usage errors raise FedbenchError."""
    check_device(ctx.device)
    check_timeout(ctx.timeout, n_jobs)
    ctx, n_jobs = placement.plan(ctx, n_jobs)
    preflight(specs, ctx)
    return GridSetup(ctx, n_jobs)


#: Seconds a computed run must take before `--n-jobs auto` starts workers for the rest of the grid: a
#: loky worker spends a few seconds importing torch and loading data before its first run, so shorter
#: runs are faster in this process (a reviewer measured 2.1x slower with 2 workers on 4 short cells).
PARALLEL_PAYS_AFTER_S = 5.0


def pays_to_go_parallel(record: RunRecord) -> bool:
    """`--n-jobs auto`: whether runs like this one (computed, not from the cache) are long enough that
    worker processes pay for their start-up."""
    columns = record.columns
    return (
        record.status == "ok"
        and not columns.get("from_cache")
        and columns["seconds"] >= PARALLEL_PAYS_AFTER_S
    )


def run_grid(
    specs: list[RunSpec],
    cache: RunCache,
    ctx: RunContext | GridSetup,
    n_jobs: int = 1,
    on_event: Callable[[RunEvent], None] | None = None,
    fail_fast: bool = False,
    cascade: Cascade | None = None,
) -> list[RunRecord]:
    """Run every spec; the records of the finished runs come back in grid order.

    `ctx` and `n_jobs` are checked here (`check_grid`), unless `ctx` is the `GridSetup` that
    `check_grid` returned (the CLI checks before it prints anything); `n_jobs` is then the setup's.
    The first run of each utility group computes the shared FL training; the group's other runs start
    after it, in this process (one job) or on workers (`fedbench.execution.scheduler`), one run per task
    so a finished run is reported at once. `n_jobs=0` (`--n-jobs auto`) runs in this process until a
    computed run takes `PARALLEL_PAYS_AFTER_S`, then the rest on one worker per free core (if there are
    two or more). `fail_fast` stops at the first failed or timed-out run (the
    records so far come back). Ctrl-C raises `GridInterrupted` carrying the finished records.
    `cascade` (a board's `[grid.suite] cascade`, `fedbench.execution.cascade`): a training's runs go in
    cascade order and each is narrowed, when it starts, to the victims its predecessors left; `specs`
    (the caller's list) then holds the narrowed specs, the ones the records are of.
    """
    setup = ctx if isinstance(ctx, GridSetup) else check_grid(specs, ctx, n_jobs)
    ctx, n_jobs = setup.ctx, setup.n_jobs
    groups: dict[str, list[int]] = {}
    for i, spec in enumerate(specs):
        groups.setdefault(spec.utility_id, []).append(i)
    if cascade is not None:
        groups = {k: cascade.sort_group(g, specs) for k, g in groups.items()}
    records: list[RunRecord | None] = [None] * len(specs)
    done = 0

    def prepare(i: int) -> RunRecord | None:
        """Before run i starts: narrow it to the victims the cascade left, or its `skipped` record."""
        spec = specs[i]
        if cascade is None or not cascade.narrows(spec):
            return None
        group = groups[spec.utility_id]
        earlier = [(specs[k], records[k]) for k in group[: group.index(i)]]
        left = cascade.left(spec, earlier)
        if not left:
            return skipped_record(spec, cascade_skip(spec.attack.label, spec.victim_clients))
        if left != spec.victim_clients:
            specs[i] = spec.with_victims(left)
        return None

    def finish(i: int, record: RunRecord) -> bool:
        """Record a finished run; True when the grid must stop (fail-fast)."""
        nonlocal done
        records[i] = record
        done += 1
        if on_event:
            on_event(RunEvent(done, len(specs), specs[i], record))
        return fail_fast and record.status in STOP_STATUSES

    location = str(cache.location) if cache.location else None

    def on_workers(indices: list[list[int]], jobs: int) -> None:
        plugins = _plugin_files()

        def make_task(wctx: RunContext) -> WorkerTask:
            return WorkerTask(location, cache.force, wctx, plugins)

        scheduler.run_on_workers(specs, indices, ctx, jobs, make_task, finish, prepare)

    threads_set = False

    def set_threads() -> None:
        """--threads, else no more threads than free cores (never more than torch or the caller chose);
        once, before the first computation in this process (a grid read from the cache imports no torch)."""
        nonlocal threads_set
        if not threads_set:
            import torch

            torch.set_num_threads(ctx.threads or min(torch.get_num_threads(), placement.default_threads(1)))
            threads_set = True

    def here(order: list[int], until: Callable[[RunRecord], bool] = lambda r: False) -> list[int]:
        """Run `order` in this process until fail-fast stops the grid or `until(record)`; the rest."""
        for k, i in enumerate(order):
            early = prepare(i)
            record = early if early is not None else execute(specs[i], cache, ctx, set_threads)
            if finish(i, record):
                return []
            if until(record):
                return order[k + 1 :]
        return []

    try:
        order = [i for indices in groups.values() for i in indices]
        if ctx.backend != "ray" and n_jobs == placement.AUTO_JOBS:
            left = here(order, until=pays_to_go_parallel)
            workers = min(placement.free_cores(), len(left))
            if workers >= 2:  # the groups' remaining runs (a group whose first run is done starts at once)
                rest = set(left)
                on_workers([[i for i in g if i in rest] for g in groups.values() if rest & set(g)], workers)
            elif left:
                here(left)
        elif ctx.backend != "ray" and (n_jobs == 1 or len(specs) == 1):
            here(order)
        else:
            on_workers(list(groups.values()), n_jobs)
    except GridInterrupted:
        raise
    except KeyboardInterrupt:
        raise GridInterrupted([r for r in records if r is not None], len(specs)) from None
    return [r for r in records if r is not None]


# ---------------------------------------------------------------------------------------- workers

_worker_caches: dict[tuple[str | None, bool], RunCache] = {}


def _plugin_files() -> tuple[str, ...]:
    """Files loaded with --plugin in this process (workers load them too, or their names are unknown)."""
    return tuple(
        sorted(
            str(getattr(m, "__file__", ""))
            for name, m in list(sys.modules.items())
            if name.startswith("fedbench_plugin_") and getattr(m, "__file__", None)
        )
    )


@dataclass(frozen=True)
class WorkerTask:
    """One run in a worker process (loky or Ray), set up like the grid's process: the same cache folder
    and `--force`, the workers' context, the same `--plugin` files. Picklable: it travels to the worker."""

    location: str | None
    force: bool
    ctx: RunContext
    plugins: tuple[str, ...]

    def __call__(self, spec: RunSpec) -> RunRecord:
        """Ctrl-C is the parent's to handle (it stops the workers)."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        ctx = placement.worker_context(self.ctx)  # its own GPU under --gpus
        if self.plugins:
            from fedbench.registry import load_plugin_file

            for path in self.plugins:
                load_plugin_file(path)
        if ctx.threads:
            import torch

            torch.set_num_threads(ctx.threads)
        cache = _worker_caches.get((self.location, self.force))
        if cache is None:
            cache = _worker_caches[(self.location, self.force)] = RunCache(self.location, force=self.force)
        return execute(spec, cache, ctx)
