"""Base classes and the typed payloads that cross module boundaries.

Plugins (datasets, models, defenses, attacks) subclass one of the bases here and are registered in
`fedbench.registry`. Payloads are frozen dataclasses: `Scenario` (the FL setting of a run),
`DatasetBundle` (tensors + metadata), `HookContext` (what a defense hook is told), `Observation`
(what an attacker sees) and `AttackOutput` (what an attack returns, before metrics). `artifact` caches
a value a plugin derives once for many runs (a trained helper model) beside the runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar

from fedbench.spec.params import NoParams, build_params, param

if TYPE_CHECKING:  # heavy imports only for type checkers
    import numpy as np
    import torch
    from torch import nn

ObservationPoint = Literal["example", "step", "update", "server", "aggregate", "model"]
OBSERVATION_POINTS: tuple[str, ...] = ("example", "step", "update", "server", "aggregate", "model")


@dataclass(frozen=True)
class Paper:
    """Citation of the paper a plugin implements."""

    key: str
    title: str
    url: str = ""

    def __str__(self) -> str:
        return f"{self.key}: {self.title}" + (f" <{self.url}>" if self.url else "")


class Plugin:
    """Common base of every registered plugin.

    Subclasses set `name` (canonical kebab-case, filled in by the register decorator), `version`
    (bump it whenever results change: it is part of the cache key), `paper`, and a frozen `Params`
    dataclass whose fields come from `fedbench.spec.params.param`.
    """

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    kind: ClassVar[str] = "plugin"
    version: ClassVar[str] = "1"
    paper: ClassVar[Paper | None] = None
    Params: ClassVar[type] = NoParams
    # params added after results were cached: left out of the cache key while at their default, so a
    # new option with the old behaviour as default keeps every earlier run_id (spec.ComponentSpec.key)
    key_optional: ClassVar[tuple[str, ...]] = ()

    def __init__(self, params: Any = None):
        if params is None or isinstance(params, dict):
            params = build_params(f"{self.kind} '{self.name}'", self.Params, params)
        self.params = params

    @classmethod
    def make_params(cls, raw: dict[str, Any] | None) -> Any:
        return build_params(f"{cls.kind} '{cls.name}'", cls.Params, raw)

    @classmethod
    def summary(cls) -> str:
        doc = (cls.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""

    def check(self, scenario: Scenario) -> str | None:
        """Return a reason to skip this plugin in `scenario`, or None when it applies."""
        return None


# ----------------------------------------------------------------------------------------- scenario


@dataclass(frozen=True)
class Scenario:
    """The FL setting of one run. Every field is part of the run's cache key."""

    protocol: Literal["fedsgd", "fedavg"] = param("fedavg", "FedSGD (one gradient per round) or FedAvg")
    clients: int = param(10, "number of clients K", min=1)
    partition: Literal["iid", "dirichlet", "shards", "natural"] = param("iid", "how the train set is split")
    alpha: float = param(0.5, "Dirichlet concentration (partition=dirichlet)", min=0, min_open=True)
    shards_per_client: int = param(2, "label-sorted shards per client (partition=shards)", min=1)
    rounds: int = param(5, "communication rounds T", min=1)
    participation: float = param(1.0, "fraction of clients per round", min=0, max=1, min_open=True)
    local_epochs: int = param(1, "local epochs (fedavg, when local_steps=0)", min=1)
    local_steps: int = param(0, "local steps per round (fedavg); 0 = use local_epochs", min=0)
    batch_size: int = param(32, "client batch size; 0 = all local data", min=0)
    lr: float = param(0.1, "client learning rate", min=0, min_open=True)
    server_lr: float = param(1.0, "server learning rate on the averaged update", min=0, min_open=True)
    loss: Literal["ce", "mse"] = param("ce", "training loss (mse uses one-hot targets)")
    model_mode: Literal["train", "eval"] = param("train", "model mode while clients compute gradients")
    observe: Literal["default", "example", "step", "update", "server", "aggregate", "model"] = param(
        "default", "observation point of the attack (default: the attack's own, usually update)"
    )
    observe_round: int = param(0, "round at which the attacker observes", min=0)
    victim: int = param(0, "index of the observed client", min=0)
    eval_every: int = param(1, "evaluate the global model every N rounds", min=1)
    train_size: int = param(0, "use only the first N training examples (at most all); 0 = all", min=0)
    test_size: int = param(0, "use only the first N test examples (at most all); 0 = all", min=0)

    def validate(self) -> str | None:
        if self.victim >= self.clients:
            return f"victim={self.victim} must be < clients={self.clients}"
        if self.observe_round >= self.rounds:
            return f"observe_round={self.observe_round} must be < rounds={self.rounds}"
        return None

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> Scenario:
        return build_params("scenario", cls, raw)

    def replace(self, **changes: Any) -> Scenario:
        return dataclasses.replace(self, **changes)


# ------------------------------------------------------------------------------------------ datasets


@dataclass(frozen=True)
class DatasetMeta:
    """What a model, a defense or a metric needs to know about a dataset."""

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    modality: Literal["image", "tabular", "audio"]
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    class_names: tuple[str, ...] = ()
    attribute_names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    source: str = ""
    license: str = ""

    @property
    def is_image(self) -> bool:
        return self.modality == "image"


@dataclass(frozen=True)
class DatasetBundle:
    """A loaded dataset: float features (normalised), int64 labels, optional attributes and group ids.

    `x_*` are normalised with `meta.mean/std` for images (de-normalise with `denormalize`);
    `attr_*` map a sensitive attribute name to an int64 tensor aligned with `x_*`;
    `groups_train` holds natural client ids (writer, identity) when the dataset has them.
    """

    meta: DatasetMeta
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    attr_train: dict[str, torch.Tensor] = field(default_factory=dict)
    attr_test: dict[str, torch.Tensor] = field(default_factory=dict)
    groups_train: torch.Tensor | None = None

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        """Map normalised images back to [0, 1] pixel space (identity for non-images)."""
        if not self.meta.mean:
            return x
        import torch

        shape = (1, -1) + (1,) * (x.dim() - 2)
        mean = torch.tensor(self.meta.mean, dtype=x.dtype, device=x.device).view(shape)
        std = torch.tensor(self.meta.std, dtype=x.dtype, device=x.device).view(shape)
        return x * std + mean


@dataclass(frozen=True)
class RunData:
    """The run's data and its split, for plugins whose threat model grants them data of their own.

    Attribute inference trains its adversary on a pool disjoint from the victims, membership inference
    needs held-out non-members and shadow data, RecUP-FL trains its defender zoo on gradients of
    labelled data. `bundle` is the full loaded dataset; the run uses `x_train[:train_size]` split into
    `client_indices` (indices into that prefix) and tests on `x_test[:test_size]`. Training examples
    at or after `train_size`, and test examples at or after `test_size`, are touched by no client and
    no evaluation. A plugin reads only what its threat model grants; the engine cannot enforce it.
    `scenario` is the run's FL setting (loss and lr: a shadow update must be computed like the real one).
    """

    bundle: DatasetBundle
    train_size: int
    test_size: int
    client_indices: tuple[tuple[int, ...], ...]
    reserved: tuple[int, ...] = ()  # indices the defense set aside (`Defense.reserve`): prefix or beyond it
    scenario: Scenario | None = None

    def unused_train(self) -> Sequence[int]:
        """Indices of training examples no client holds (beyond train_size), less the records the
        server set aside there for itself (FRL's `aux_from=unused`): those are no one's spare data."""
        spare = range(self.train_size, len(self.bundle.y_train))
        beyond = {i for i in self.reserved if i >= self.train_size}
        return [i for i in spare if i not in beyond] if beyond else spare


class Dataset(Plugin):
    """A dataset plugin: `load` returns a `DatasetBundle`."""

    kind = "dataset"
    needs_root: ClassVar[bool] = False

    def load(self, data_root: str | None = None, download: bool = False) -> DatasetBundle:
        raise NotImplementedError


class Model(Plugin):
    """A model plugin: `build` returns a torch module for any input shape and class count."""

    kind = "model"

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        raise NotImplementedError


# ------------------------------------------------------------------------------------------ defenses


@dataclass(frozen=True)
class HookContext:
    """What a defense hook is told about where it is called.

    `generator` is a torch.Generator seeded from (run seed, round, client, hook), so noise is
    reproducible and independent between clients and rounds. `x`/`y` are the current local batch in
    the `per_example` and `step` hooks (Soteria needs the inputs behind the gradient), else None.
    `global_state` is the model state the client received this round, given to the `update` hook
    (RecUP-FL trains its defender zoo on gradients at the round's global weights); else None.
    `epoch` is the local epoch of the round, told to `prepare_data` when the defense redraws its
    encoding every epoch (`Defense.prepares_per_epoch`); 0 elsewhere.
    """

    round: int
    client: int
    step: int
    scenario: Scenario
    generator: Any
    model: Any = None
    meta: DatasetMeta | None = None
    x: Any = None
    y: Any = None
    global_state: Any = None
    epoch: int = 0


@dataclass(frozen=True)
class Accounting:
    """A formal privacy guarantee as reported in a result row."""

    epsilon: float
    delta: float
    level: Literal["example", "client"]
    accountant: str
    noise_multiplier: float
    sample_rate: float
    steps: int


class Defense(Plugin):
    """A defense implements any subset of the hooks below; the engine calls them at fixed places.

    Hooks that are not overridden are skipped by the engine (see `implements`), so a defense pays
    only for what it uses (per-example gradients are computed only when `per_example` is overridden).
    Gradients and updates are dicts {parameter name: tensor} in the model's parameter order.
    """

    kind = "defense"
    # The defense-aware attack that breaks this defense (spec 001: "loda-adaptive" for LODA, the Carlini
    # decoder "mixup-decode" for MixUp/InstaHide), or "" for none. Grids add it beside the standard attack
    # (`adaptive = true` on an [[attack]] block) and boards take the worst case over both.
    adaptive_attack: ClassVar[str] = ""
    # The hooks of this defense that zero entries of the gradient or update they pass on (gradient pruning,
    # top-k sparsification, Soteria's pruned columns). An observation that one of them acted on is marked
    # `Observation.sparsified`, and gradient inversion with `pruning_aware=auto` then matches only the
    # observed non-zero entries (docs/threat-model.md). Override `sparsifying_hooks` when it depends on
    # the parameters.
    sparsifies: ClassVar[tuple[str, ...]] = ()

    def implements(self, hook: str) -> bool:
        return getattr(type(self), hook) is not getattr(Defense, hook)

    def sparsifying_hooks(self) -> tuple[str, ...]:
        """The hooks that zero entries in this configuration (default: `sparsifies`)."""
        return tuple(h for h in self.sparsifies if self.implements(h))

    def prepare_data(self, x: torch.Tensor, y: torch.Tensor, ctx: HookContext) -> tuple:
        """Once per client before training: replace its data (LODA, MixUp). When `prepares_per_epoch()`
        is true, instead once per (client, round, local epoch), with `ctx.round`/`ctx.epoch` set and
        always the client's private data as input: a fresh encoding every epoch (InstaHide).
        Otherwise `ctx.round` is -1.

        Returns (x, y) or (x, y, source): `source[i]` is the private input that prepared row i stands
        for (LODA: the image it obscures; MixUp: its largest-weight component). The engine records it as
        `Observation.x_private`, and reconstruction metrics compare against it. A per-epoch draw must
        return the same number of rows every epoch.
        """
        return x, y

    def prepares_per_epoch(self) -> bool:
        """Whether `prepare_data` is called again for every local epoch of every round (default: once)."""
        return False

    def batch_sampling(self) -> Literal["shuffle", "poisson"]:
        """How the engine draws each local step's batch from a client's n records (asked once per run).

        "shuffle" (the default, every run before issue 30): each local epoch is a seeded shuffle cut
        into batch_size pieces, so an example is in exactly one batch per epoch. "poisson": every
        record is in each step's batch (a "lot") independently with probability q = batch_size / n
        (Abadi et al. 2016), the draw that amplification by subsampling accounts for; a lot varies in
        size and may be empty. The steps per round keep the scenario's count (local_steps, or
        local_epochs x ceil(n / batch_size)). Only for a defense with a `per_example` hook: it is
        handed lots of any size, none included (an empty lot runs no forward pass), and divides its
        sum by the expected size batch_size itself (dp-sgd's `sampling=poisson-records`)."""
        return "shuffle"

    def loss(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, base_loss: torch.Tensor, ctx: HookContext
    ) -> torch.Tensor:
        """Every local step: the training loss (FRL adds a regulariser)."""
        return base_loss

    def per_example(self, grads: dict[str, torch.Tensor], ctx: HookContext) -> dict[str, torch.Tensor]:
        """Every local step, per-example gradients [B, ...] -> the batch gradient (mean over B)."""
        return {k: g.mean(0) for k, g in grads.items()}

    def step(self, grad: dict[str, torch.Tensor], ctx: HookContext) -> dict[str, torch.Tensor]:
        """Every local step, the batch gradient."""
        return grad

    def update(self, delta: dict[str, torch.Tensor], ctx: HookContext) -> dict[str, torch.Tensor]:
        """Once per round, the update the client shares (gradient in FedSGD, weight delta in FedAvg)."""
        return delta

    def update_batch(
        self, deltas: Sequence[dict[str, torch.Tensor]], ctxs: Sequence[HookContext]
    ) -> list[dict[str, torch.Tensor]]:
        """The `update` hook of several clients at once (a round's participants, in order), for a defense
        that computes them faster together (RecUP-FL's batched FGSM). Entry i is what `update(deltas[i],
        ctxs[i])` returns (it draws from ctxs[i].generator only). Optional: the default calls `update` for
        each, and the engine calls this hook only where a defense overrides it (the others keep one
        `update` call right after each client's training)."""
        return [self.update(d, c) for d, c in zip(deltas, ctxs, strict=True)]

    def receive(self, delta: dict[str, torch.Tensor], ctx: HookContext) -> dict[str, torch.Tensor]:
        """At the server, each client's update as received, before aggregation (Fed-SDP server noise)."""
        return delta

    def aggregate(
        self, updates: list[dict[str, torch.Tensor]], weights: list[float], ctx: HookContext
    ) -> dict[str, torch.Tensor] | None:
        """At the server: return the aggregate, or None for the plain weighted mean."""
        return None

    def accounting(
        self, scenario: Scenario, train_size: int, tensors: int | None = None
    ) -> Accounting | None:
        """The formal guarantee of this configuration, or None for heuristic defenses.

        `tensors` is M, the number of parameter tensors the model trains (the keys of every gradient
        and update), which the runner passes: a mechanism that clips each tensor to C has whole-update
        sensitivity C*sqrt(M). A defense may leave the argument out of its signature if it needs none.
        """
        return None

    def bind_data(self, data: RunData) -> None:
        """Called once by the simulation before training when the defense needs data beyond its hooks'
        (RecUP-FL's zoo, FRL's auxiliary set). Default: nothing."""

    def reserve(self, train_size: int, seed: int) -> Sequence[int]:
        """Indices of the training prefix the server keeps before the data is split over the clients.

        FRL's auxiliary set is carved out of the training data and held by the server (spec 003 §4):
        no client trains on these examples, and `RunData.client_indices` (what membership attacks
        take as members) excludes them. Must be deterministic in (train_size, seed): the utility and
        the attack simulations of a run must carve the same set. Default: nothing.
        """
        return ()


# ------------------------------------------------------------------------------------------- attacks


@dataclass(frozen=True)
class Observation:
    """What the attacker sees at an observation point, plus the ground truth kept for metrics.

    `shared` is the observed tensor dict (a gradient, an update or an aggregate) after the defense
    acted; `kind` says whether it is a 'gradient' or a weight 'delta'. `global_state` is the model the
    victim received. `x_true`/`y_true` are the victim's data behind the observation: attacks must not
    read them (except label knowledge granted by the threat model); metrics do.

    `rows` are the indices of x_true's examples in the client's local data (found by the engine; an
    attack may use them only as its threat model grants, e.g. the oracle mapping of the MixUp decoder).
    `x_private` is set when the defense replaced the data (`prepare_data` returned a source): the private
    inputs behind x_true, row by row; metrics then compare reconstructions with them.

    `cohort` is filled only for attacks that set `observes_cohort` (attribute inference scores many
    victims per run): the observations, at the same point and round, of every client taking part in
    that round, in client order (the victim's own among them); empty otherwise.

    `defense_hooks` names the defense's hooks that acted on what is observed (the engine's table of
    hooks before each observation point, docs/threat-model.md); `sparsified` is true when one of them
    zeroes entries (`Defense.sparsifying_hooks`): zeros the attacker may treat as pruned, not as values.
    """

    point: str
    round: int
    client: int
    kind: Literal["gradient", "delta", "model"]
    shared: dict[str, torch.Tensor]
    global_state: dict[str, torch.Tensor]
    x_true: torch.Tensor
    y_true: torch.Tensor
    lr: float
    local_steps: int
    batch_size: int
    model_mode: str
    attr_true: dict[str, torch.Tensor] = field(default_factory=dict)
    cohort: tuple[Observation, ...] = ()
    rows: tuple[int, ...] = ()
    x_private: torch.Tensor | None = None
    defense_hooks: tuple[str, ...] = ()
    sparsified: bool = False


@dataclass(frozen=True)
class AttackOutput:
    """What an attack returns; metrics are computed from it outside the attack cache.

    Arrays are numpy so the output can be cached. `images` are reconstructions in [0,1] pixel space,
    `labels` the attack's label guesses, `scores` membership/attribute scores, `extra` anything else
    (iterations to success, losses) as plain JSON-able values.
    """

    images: np.ndarray | None = None
    labels: np.ndarray | None = None
    scores: np.ndarray | None = None
    predictions: np.ndarray | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Attack(Plugin):
    """An attack consumes an `Observation` and the knowledge its threat model grants."""

    kind = "attack"
    observation_point: ClassVar[str] = "update"
    accepted_points: ClassVar[tuple[str, ...]] = ("update",)
    # the attack family whose scorer turns this attack's `AttackOutput` into result columns
    # (reconstruction, membership, attribute, or one a plugin registers with
    # `fedbench.metrics.register_family`); its contract: docs/writing-an-attack.md
    family: ClassVar[str] = "reconstruction"
    # True: the attack reads every participant's update of the observed round (Observation.cohort)
    observes_cohort: ClassVar[bool] = False

    def point_for(self, scenario: Scenario) -> str:
        """The observation point this attack reads in `scenario` (scenario.observe overrides)."""
        return self.observation_point if scenario.observe == "default" else scenario.observe

    def check(self, scenario: Scenario) -> str | None:
        """Skip when the scenario asks for an observation point this attack cannot read."""
        point = self.point_for(scenario)
        if point not in self.accepted_points:
            return (
                f"{self.name} needs one of the observations {', '.join(self.accepted_points)}; "
                f"scenario.observe={point} is not among them"
            )
        return None

    def check_model(self, model: nn.Module) -> str | None:
        """A reason to skip this attack on `model` (e.g. its first layer is not fully connected), or None."""
        return None

    @classmethod
    def scaled_budget(
        cls, params: dict[str, Any], given: dict[str, Any], factor: int
    ) -> dict[str, Any] | None:
        """The parameters to give for `factor` times this attack's optimisation budget (the budget check
        of a board, issue 28), from its resolved `params` and the ones the grid `given`; None when it
        has no budget to scale. By default an integer `iterations` is multiplied; an attack whose
        budget is a schedule (a cap and a patience) overrides this."""
        value = params.get("iterations")
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        return {**given, "iterations": value * factor}

    def bind_data(self, data: RunData) -> None:
        """Called by the runner before `run` with the run's data and split (attribute and membership
        inference read their own pool or non-members from it). Default: nothing."""

    def bind_defense(self, defense: Defense) -> None:
        """Called by the runner before `run` with the run's defense instance, after the simulation
        prepared the victim's data: a defense-aware (adaptive) attack reads the knowledge its threat model
        grants from it (LODA's feature extractor, MixUp's mixing coefficients). Default: nothing."""

    def server_hook(self, meta: DatasetMeta | None = None) -> Any:
        """A malicious server returns an object with `broadcast(state, round) -> state`; else None.

        `meta` describes the run's dataset (a server that trains on auxiliary data of it needs it).
        """
        return None

    def run(
        self, observation: Observation, model: nn.Module, meta: DatasetMeta, generator: Any, device: Any
    ) -> AttackOutput:
        raise NotImplementedError


# ----------------------------------------------------------------------------------------- artifacts

_T = TypeVar("_T")


class ArtifactStore(Protocol):
    """Where `artifact` keeps values: the store of the run cache of the run executing
    (`fedbench.execution.cache.ArtifactStore`)."""

    def get(self, kind: str, key: str, compute: Callable[[], Any]) -> Any: ...


# The store of the run executing in this context; the runner sets it around each run (`using_artifacts`).
_artifact_store: ContextVar[ArtifactStore | None] = ContextVar("fedbench_artifact_store", default=None)


def artifact(kind: str, key: str, compute: Callable[[], _T]) -> _T:
    """A derived artifact shared by many runs, computed once and cached on disk beside the runs.

    Examples: SDAN-trained malicious parameters, a LODA feature extractor, an obscured dataset. `kind`
    names the artifact family, `key` is a canonical JSON string of everything the value depends on;
    `compute()` is called only on a miss and must return a picklable value (tensors, arrays). Outside a
    run with an on-disk cache (`--no-cache`, or a plugin called directly) the value is computed each
    call. A damaged entry, or one computed by code that has changed since, is recomputed with one warning
    line in the run's record.
    """
    store = _artifact_store.get()
    return compute() if store is None else store.get(kind, key, compute)


@contextmanager
def using_artifacts(store: ArtifactStore | None) -> Iterator[None]:
    """Make `store` the one `artifact` reads and writes in this context (None: compute every time)."""
    token = _artifact_store.set(store)
    try:
        yield
    finally:
        _artifact_store.reset(token)
