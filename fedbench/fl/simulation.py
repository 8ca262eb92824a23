"""The in-process FL simulation: FedSGD / FedAvg with defense hooks and observation points.

One run = one process-local loop over rounds and sampled clients (design §11: an in-process loop is
5x faster than a framework simulation for grids of short runs). The engine calls the defense hooks
at the fixed places of design §2 and, when asked, records one `Observation` (what the attacker sees)
for the victim client at the observation round. A malicious server can replace the model it sends.

Protocols (the message a client shares):
- fedsgd: the gradient of the mean loss on one minibatch (batch_size; 0 = all local data) at the
  received weights; the server applies w <- w - server_lr * lr * weighted_mean(gradients).
- fedavg: local SGD for local_steps (or local_epochs over the local data), the shared message is the
  weight delta w_end - w_start; the server applies w <- w + server_lr * weighted_mean(deltas).
With one local step on the same batch and server_lr 1 the two give the same model (tested).
A local step's batch is a piece of the epoch's seeded shuffle (`_batches`), unless the defense asks
for Poisson lots (`Defense.batch_sampling`, dp-sgd's `sampling=poisson-records`, issue 30): then each
step holds every record of the client independently with probability batch_size / n (`_lots`), a lot
may be empty (it runs no forward pass; the defense's `per_example` hook adds its noise to a zero sum),
and a step's loss is the lot loss (1 / batch_size) x the sum of its records' losses (`_lot_loss`).
Clients are weighted by their number of examples; buffers (BatchNorm statistics) are averaged.

Observation points and the leakage types of Fed-CDP (spec 002 §1). Every defense hook that acts on a
gradient before the point the threat model names acts on what is observed there (`HOOKS_BEFORE`, the
table in docs/threat-model.md):
- `example` (type-2): one example's gradient at the first local step of the observed round, through
  the client's per-step pipeline as if that example were the batch: the defended `loss` (if any), the
  `per_example` hook (sanitised under Fed-CDP) and the `step` hook (pruned under gradient pruning,
  Soteria). At batch size 1 it is the step gradient; it is what LODA's batch-1 attacker inverts;
- `step`: the first local step's batch gradient, after `loss`, `per_example` and `step`.
  Neither point sees the `update` hook: it acts on the round's message once local training is done
  (a weight delta under FedAvg), which does not exist yet at these points, and client-level
  defenses (Fed-SDP, DP-FedAvg, top-k sparsification of the update) protect what leaves the client,
  not the local computation (Fed-CDP's point: they leave type-1/type-2 leakage open);
- `update` (type-1, and type-0 when the defense adds nothing at the server): the client's round
  update as it leaves the client, after the `update` hook;
- `server` (type-0): the same update as the server holds it, after the server-side `receive` hook
  (Fed-SDP with server-side noise), before aggregation;
- `aggregate`: the server's aggregate; `model`: the final global model (black-box access; `client`
  names the victim whose membership is attacked, x_true/y_true are the whole training prefix).
With `cohort=True` (attacks that score many victims, e.g. attribute inference) a client-level point
is recorded for every participant of the observed round: the victim's observation carries them all
in `Observation.cohort`, sharing one copy of the received global state.

Per-client cost (issue 19: a round costs what a plain in-process FedAvg loop's does,
benchmarks/bench_fl.py): the model's one parameter set is loaded in place and trained in place
(`_Params`), batches are picked from the training set through the client's row indices (no copy of
its data), a hook's generator is made only when the hook reads it (`_SeededContext`), an update's
finiteness is one reduction (`_check_finite`), and without `aggregate`/`prepare_data` hooks the
server sums the weighted mean as updates arrive (`_WeightedSum`). Every result is bit for bit what the
straightforward loop (load_state_dict, dict clones, eager generators, a list of updates) gave.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from fedbench.errors import FedbenchError, RunFailure
from fedbench.fl.losses import loss_function
from fedbench.fl.per_example import per_example_grads
from fedbench.fl.seeding import SeededStreams, torch_generator
from fedbench.plugin import DatasetBundle, Defense, HookContext, Observation, RunData, Scenario

#: The defense hooks that act on what the attacker sees at each observation point, in pipeline order.
#: `prepare_data` replaces the data every gradient is computed on; `loss`, `per_example` and `step` act at
#: every local step (at `example` on the one example's gradient); `update` on the round's message as it
#: leaves the client; `receive` at the server on each client's update; `aggregate` on the server's
#: aggregate. `model` is the global model trained under all of them. docs/threat-model.md is this table.
HOOKS_BEFORE: dict[str, tuple[str, ...]] = {
    "example": ("prepare_data", "loss", "per_example", "step"),
    "step": ("prepare_data", "loss", "per_example", "step"),
    "update": ("prepare_data", "loss", "per_example", "step", "update"),
    "server": ("prepare_data", "loss", "per_example", "step", "update", "receive"),
    "aggregate": ("prepare_data", "loss", "per_example", "step", "update", "receive", "aggregate"),
    "model": ("prepare_data", "loss", "per_example", "step", "update", "receive", "aggregate"),
}


#: How many clients' random streams `Simulation._announce` seeds in one vectorised pass.
_ANNOUNCED = 256


@dataclass(frozen=True)
class ObservationRequest:
    """Record what an attacker sees at `point` for client `client` in round `round` (and, with
    `cohort`, for every other participant of that round too)."""

    point: str
    round: int
    client: int
    cohort: bool = False


@dataclass
class SimulationResult:
    """Utility per evaluated round and at the end, plus the observation when one was requested."""

    history: list[dict[str, float]] = field(default_factory=list)
    test_acc: float = float("nan")
    test_loss: float = float("nan")
    rounds_run: int = 0
    observation: Observation | None = None
    client_sizes: list[int] = field(default_factory=list)


class _Params:
    """The model's trainable parameters and buffers, listed once, and in-place loads of a state into them.

    A client's round starts from the received state; copying it into the one parameter set the model
    owns (`load`) replaces `load_state_dict`, whose module-tree walk and per-key checks cost more than the
    copies themselves on a small model. The full `load_state_dict` still runs the first time a state
    object is loaded (each round's broadcast, a malicious server's replacement included), so a state with
    missing or extra keys or a wrong shape fails as before; every further client of the round reuses
    that check, and the tensor lists are refreshed with it. Within a round the lists assume that
    modules update their buffers in place (BatchNorm does), as an optimizer assumes of parameters.
    Defense hooks are handed `self.model`, which holds the client's current weights.

    The copy is skipped when the model still holds the state it was last loaded with: the engine calls
    `modified()` whenever the model may have changed since (an in-place SGD step, a hook that was handed
    the model, a new round), so a client whose round left the parameters alone (FedSGD, and FedAvg's
    last step computed out of place: `Simulation._last_step_delta`) hands the next one a loaded model.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self._checked: Any = None  # the last state loaded through load_state_dict
        self._modified = True  # whether the model may differ from `_checked`
        self._refresh()

    def _refresh(self) -> None:
        named = dict(self.model.named_parameters())
        self.tensors = [named[n] for n in self.names]
        # parameters and persistent buffers, as load_state_dict copies them
        self.state = list(self.model.state_dict(keep_vars=True).items())
        self.buffers = list(self.model.named_buffers())
        self.modules = list(self.model.modules())

    def set_mode(self, training: bool) -> None:
        """`model.train(training)`, skipped when every module is in that mode already (a no-op then:
        `nn.Module.train` sets the flags of the module tree and does nothing else; a model whose own
        `train` keeps some module in the other mode, as some freeze BatchNorm, is called every time).
        Walking the module tree costs more than a client's other bookkeeping (36 us of ~1,100 in the
        review's 1,000-client profile); reading the flags of the listed modules costs about 1 us."""
        if any(m.training is not training for m in self.modules):
            self.model.train(training)

    def load(self, state: dict[str, torch.Tensor]) -> None:
        """Copy `state` into the model in place: bit for bit what `model.load_state_dict(state)` does."""
        if state is not self._checked:
            self.model.load_state_dict(state)
            self._checked = state
            self._refresh()
        elif self._modified:
            with torch.no_grad():
                for name, t in self.state:
                    t.copy_(state[name])
        self._modified = False

    def modified(self) -> None:
        """Say that the model's parameters or buffers may have changed since the last `load`."""
        self._modified = True


def _clone_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _check_finite(tensors: dict[str, torch.Tensor], where: str) -> None:
    """Raise a RunFailure naming the first tensor of `tensors` with a NaN or an infinite entry.

    One host synchronisation and one reduction per tensor instead of `isfinite(t).all()` per tensor
    (`torch.isfinite` is several element-wise kernels and a temporary: 460 us on a 256x784 float32
    tensor against 15 us for its sum, one thread; it was 17 % of a simulation of 1000 clients). The
    tensors' sums are stacked, added up and the total tested (torch has no public reduction over a
    list of tensors, and `torch.cat` of them would copy the update). IEEE arithmetic carries a NaN
    or an infinity through any sum (+Inf + -Inf is NaN, still non-finite), so a finite total proves
    every entry finite. A non-finite total can also come from finite entries whose sum overflows
    (values near the dtype's maximum, e.g. 65504 in float16); then the per-tensor test decides and
    names the tensor, so the check raises exactly when, and with the message, the per-tensor test
    would, and it costs the per-tensor test only in those (diverging) cases.
    """
    if not tensors:
        return
    sums = [t.sum() for t in tensors.values()]
    total = sums[0] if len(sums) == 1 else torch.stack(sums).sum()
    if bool(torch.isfinite(total)):
        return
    for name, t in tensors.items():
        if not torch.isfinite(t).all():
            raise RunFailure(f"non-finite values in {name} {where}")


#: At most this many clients' messages wait for a batched `update` hook together (their memory).
UPDATE_BATCH = 256


@dataclass
class _Trained:
    """One client's trained round, waiting for the `update` hook: its message and what recording needs."""

    client: int
    rnd: int
    received: dict[str, torch.Tensor]
    shared: dict[str, torch.Tensor]
    n: int
    loss: float
    watching: bool
    seen: list
    steps: int
    rows: Any
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)


class _WeightedSum:
    """The server's weighted mean of the updates, summed up as they arrive instead of from a list.

    `add(u, w)` for each client in order gives, per parameter, exactly what `_aggregate`'s
    `sum(u[n] * (w / total) for u, w in ...)` gives over the list: the same products, added in the
    same order (in place, which rounds as the out-of-place add does), starting as Python's `sum` does
    from 0 (0 + t turns -0.0 into +0.0, kept). The weights must be known before the first update (the
    clients' sizes, when no `prepare_data` hook changes them); holding no list of updates, a round of
    100 clients needs one update's memory instead of 100. Each product is written into one scratch
    tensor per parameter (`_into`; `scratch` may outlive the round), or into the update itself when
    the caller owns it: a fresh tensor per product cost its allocation, about as much as the product.
    """

    def __init__(self, names: list[str], weights: list[float], scratch: dict | None = None):
        self.names, self.weights = names, weights
        self.total = float(sum(weights))  # as `_aggregate` sums them
        self.sum: dict[str, torch.Tensor] | None = None
        self.count = 0
        self.scratch: dict[str, torch.Tensor] = {} if scratch is None else scratch

    def add(self, update: dict[str, torch.Tensor], weight: float, owned: bool = False) -> None:
        """Add `update` at `weight`; `owned`: its tensors are the caller's scratch, scaled in place."""
        if self.count >= len(self.weights) or weight != self.weights[self.count]:
            raise RuntimeError(
                f"update {self.count} has weight {weight}, the round's weights are {self.weights}"
            )
        self.count += 1
        scale = weight / self.total
        first = self.sum is None
        if first:
            self.sum = {}
        for n in self.names:
            scaled = update[n].mul_(scale) if owned else _into(self.scratch, n, torch.mul, update[n], scale)
            if first:
                self.sum[n] = 0 + scaled  # a new tensor, never the scratch
            else:
                self.sum[n].add_(scaled)


def _into(
    scratch: dict[str, torch.Tensor], name: str, op: Callable, a: torch.Tensor, b: Any, **kwargs: Any
) -> torch.Tensor:
    """`op(a, b, **kwargs)` (a binary torch op), written into `scratch[name]` when that tensor fits the
    result, else a new tensor kept there for the next call; the result lives until then.

    `op(a, b, out=t)` runs the kernel of `op(a, b)`: the values are bit for bit the same. It fits
    when `a` is a floating tensor of the scratch tensor's dtype, shape and device, and `b` a Python
    number or a tensor of the same dtype and shape (then the result's dtype is `a`'s), and nothing
    asks for a gradient.
    """
    out = scratch.get(name)
    fits = (
        out is not None
        and out.dtype == a.dtype
        and out.shape == a.shape
        and out.device == a.device
        and a.is_floating_point()
        and not a.requires_grad
        and (
            not isinstance(b, torch.Tensor)
            or (b.dtype == a.dtype and b.shape == a.shape and not b.requires_grad)
        )
    )
    if fits:
        return op(a, b, out=out, **kwargs)
    result = op(a, b, **kwargs)
    if not result.requires_grad:
        scratch[name] = result
    return result


class _SeededContext(HookContext):
    """A HookContext whose `generator` is made when a hook first reads it, not when the context is.

    The generator of (run seed, purpose, round, client, step) is seeded from those coordinates alone
    (`torch_generator`), so making it later gives the same stream as making it eagerly did; it is made
    once and then kept, so every hook sharing this context (`per_example` and `step` of one local step)
    draws from one stream as before. Hooks that draw nothing (gradient pruning, Soteria) and the steps
    of defenses without hooks no longer pay for seeding one (`derive_seed` hashes with numpy's
    SeedSequence, about 50 us a call). `dataclasses.replace` of such a context reads the generator
    (making it) and gives a context holding that same generator, as it did.
    """

    def __init__(self, *args: Any, seed_coords: tuple | None = None, **fields: Any):
        if seed_coords is None:  # dataclasses.replace / copy: the generator is among the fields
            super().__init__(*args, **fields)
            return
        super().__init__(*args, generator=None, **fields)
        object.__delattr__(self, "generator")  # looked up through __getattr__ until first made
        object.__setattr__(self, "_seed_coords", seed_coords)

    def __getattr__(self, name: str) -> Any:
        if name != "generator" or "_seed_coords" not in self.__dict__:
            raise AttributeError(name)
        generator = torch_generator(*self._seed_coords)
        object.__setattr__(self, "generator", generator)
        return generator


def fast_float_mode() -> None:
    """Flush denormal floats to zero (process-wide).

    Tiny gradient values of small networks fall into the denormal range, where x86 CPUs are up to
    100x slower (measured: an MLP FedAvg run on mnist5k took 97 s instead of 1.4 s, with identical
    accuracies). Flushing them changes no result we report.
    """
    torch.set_flush_denormal(True)


def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_name: str, batch_size: int = 1024
) -> tuple[float, float]:
    """Accuracy and mean loss of `model` on (x, y) in eval mode."""
    loss_fn = loss_function(loss_name)
    model.eval()
    correct, total_loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(x), batch_size):
            xb, yb = x[i : i + batch_size], y[i : i + batch_size]
            out = model(xb)
            total_loss += float(loss_fn(out, yb)) * len(xb)
            correct += int((out.argmax(1) == yb).sum())
    n = max(1, len(x))
    return correct / n, total_loss / n


class Simulation:
    """One FL run. Construct, then call `run()`; everything is deterministic from `seed`."""

    def __init__(
        self,
        scenario: Scenario,
        bundle: DatasetBundle,
        model_factory: Callable[[], nn.Module],
        defense: Defense,
        seed: int,
        device: torch.device | str = "cpu",
        observe: ObservationRequest | None = None,
        server_hook: Any = None,
        stop_after_observation: bool = False,
    ):
        from fedbench.data.partition import partition

        fast_float_mode()
        self.sc = scenario
        self.defense = defense
        self.seed = seed
        self.device = torch.device(device)
        self.observe = observe
        self.server_hook = server_hook
        self.stop_after_observation = stop_after_observation
        # the streams of the clients' batch orders and of each round's participants (`_announce`)
        self._orders = SeededStreams(seed, "batches")
        self._draws = SeededStreams(seed, "participants")
        self.loss_fn = loss_function(scenario.loss)
        self.meta = bundle.meta

        # train_size/test_size are caps: a preset's 4000 on a 455-record dataset takes all 455
        n_train = min(scenario.train_size or len(bundle.y_train), len(bundle.y_train))
        n_test = min(scenario.test_size or len(bundle.y_test), len(bundle.y_test))
        self.x_train = bundle.x_train[:n_train].to(self.device)
        self.y_train = bundle.y_train[:n_train].to(self.device)
        self.x_test = bundle.x_test[:n_test].to(self.device)
        self.y_test = bundle.y_test[:n_test].to(self.device)
        self.attr_train = {k: v[:n_train] for k, v in bundle.attr_train.items()}
        groups = bundle.groups_train[:n_train].numpy() if bundle.groups_train is not None else None
        # examples the server keeps for itself (FRL's auxiliary set) are split over no client
        reserve = defense.reserve(n_train, seed) if defense.implements("reserve") else ()
        self.reserved = tuple(int(i) for i in reserve)
        kept = np.setdiff1d(np.arange(n_train), np.asarray(self.reserved, dtype=np.int64))
        if scenario.clients > len(kept):
            raise FedbenchError(
                f"scenario.clients={scenario.clients} exceeds the {len(kept)} training examples; "
                "lower clients or raise train_size"
            )
        parts = partition(
            self.y_train.cpu().numpy()[kept],
            scenario.clients,
            scenario.partition,
            seed=seed,
            alpha=scenario.alpha,
            shards_per_client=scenario.shards_per_client,
            groups=groups[kept] if groups is not None else None,
        )
        self.client_indices = [kept[ix] for ix in parts]

        self.bundle = bundle
        if defense.implements("bind_data"):
            defense.bind_data(self.run_data())
        torch.manual_seed(seed)
        self.model = model_factory().to(self.device)
        self._params = _Params(self.model)
        self.param_names = self._params.names
        self.global_state = _clone_state(self.model)
        self._client_data: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # Without `prepare_data` a client trains on rows of x_train picked through its row indices
        # (`_rows`): no copy of its data is made, unless asked for (`client_data`, `locate`).
        self._prepares = defense.implements("prepare_data")
        self._client_rows: dict[int, torch.Tensor] = {}
        self._trained: set[int] = set()  # the clients that ran a round
        self._client_source: dict[int, torch.Tensor] = {}
        # a defense that redraws its encoding every local epoch (InstaHide): the client's draws so far
        self._per_epoch = defense.implements("prepare_data") and defense.prepares_per_epoch()
        self._client_draw: dict[int, tuple[int, int, int]] = {}  # client -> (round, epoch, rows per draw)
        self._observed_draws: dict[int, tuple[Any, Any]] = {}  # client -> (data, source) of its watched round
        self._needs_per_example = defense.implements("per_example")
        # Poisson lots instead of shuffled batches (`Defense.batch_sampling`, asked once): the defense's
        # `per_example` hook normalises a lot's sum by its expected size, which a plain step cannot
        self._poisson = defense.batch_sampling() == "poisson"
        if self._poisson and not self._needs_per_example:
            raise FedbenchError(
                f"defense '{defense.name}' asks for Poisson lots (batch_sampling) without a per_example "
                "hook: only a per_example hook can normalise a lot's sum by its expected size"
            )
        # the hooks of a local step that are handed its context
        self._step_hooks = any(defense.implements(h) for h in ("loss", "per_example", "step"))
        # Without `aggregate` and `prepare_data` hooks every client's weight (its number of examples) is
        # known before the round, so the weighted mean is summed up client by client as the updates
        # arrive (`_WeightedSum`) instead of holding every participant's update until the round ends.
        self._streaming = not (defense.implements("aggregate") or defense.implements("prepare_data"))
        # A streamed round tests its weighted mean for non-finite values once, instead of each update
        # (`_check_finite` of a client's update was about 100 us of the review's ~1,100 per client):
        # a NaN or infinity in any update reaches the mean (weights are positive), and finite updates
        # cannot overflow their convex combination short of entries within 1e-5 of the dtype's
        # maximum. A `receive` hook may change an update after that test, so then each is tested.
        self._receives = defense.implements("receive")
        # A streamed FedAvg round without `update` and `receive` hooks hands each client's delta straight
        # to the weighted sum: it is computed into one scratch tensor per parameter and scaled there
        # (observations copy what they keep), instead of two fresh tensors per parameter and client.
        self._plain_delta = scenario.protocol == "fedavg" and not (
            defense.implements("update") or self._receives
        )
        self._delta_scratch: dict[str, torch.Tensor] = {}
        # No defense code is handed the model during a round and the model has no buffers (which a
        # forward may update): only the engine's SGD steps change it. Then FedAvg's last local step is
        # computed out of place into the delta (`_last_step_delta`), and the model keeps the received
        # weights for the next client (`_Params.load` copies nothing).
        self._engine_only = not (
            self._step_hooks
            or self._params.buffers
            or any(defense.implements(h) for h in ("prepare_data", "update", "receive", "aggregate"))
        )
        self._sum_scratch: dict[str, torch.Tensor] = {}
        # a defense whose `update` hook is faster over many clients at once (RecUP-FL) gets blocks of a
        # round's clients (`_local_updates`); the others are called right after each client's training.
        # Such a defense has an `update` hook, so its deltas never live in the scratch tensors
        # (`_owned_delta`), which the next client's training would overwrite.
        self._batch_updates = defense.implements("update_batch")

    @property
    def _check_each(self) -> bool:
        """Whether each client's update is tested for finiteness, not only the round's weighted mean."""
        return not self._streaming or self._receives

    @property
    def _owned_delta(self) -> bool:
        """Whether a client's FedAvg delta goes into the scratch tensors, summed at once by `run`."""
        return self._streaming and self._plain_delta

    def run_data(self) -> RunData:
        """The dataset and this run's split, for plugins that need data of their own (`bind_data`)."""
        return RunData(
            bundle=self.bundle,
            train_size=len(self.y_train),
            test_size=len(self.y_test),
            client_indices=tuple(tuple(int(i) for i in ix) for ix in self.client_indices),
            reserved=self.reserved,
            scenario=self.sc,
        )

    # ------------------------------------------------------------------------------------ helpers
    def _ctx(
        self, rnd: int, client: int, draw: int, purpose: str, x: Any = None, y: Any = None, **fields: Any
    ) -> HookContext:
        """The context of a hook call; its generator is seeded from (seed, purpose, rnd, client, draw),
        made when the hook first reads it (`_SeededContext`). `fields` set further context fields
        (`step` defaults to `draw`)."""
        fields.setdefault("step", draw)
        return _SeededContext(
            seed_coords=(self.seed, purpose, rnd, client, draw),
            round=rnd,
            client=client,
            scenario=self.sc,
            model=self.model,
            meta=self.meta,
            x=x,
            y=y,
            **fields,
        )

    def _prepare(self, client: int, ctx: HookContext | None) -> tuple[Any, Any, Any]:
        """The client's private data, through `prepare_data` unless `ctx` is None: (x, y, source or None)."""
        idx = self._rows(client)
        x, y = self.x_train[idx], self.y_train[idx]
        if ctx is None:
            return x, y, None
        prepared = self.defense.prepare_data(x, y, ctx)
        source = prepared[2] if len(prepared) > 2 else None  # the private input behind each row
        return prepared[0], prepared[1], source

    def _rows(self, client: int) -> torch.Tensor:
        """The client's rows of x_train, as an index tensor on the device."""
        rows = self._client_rows.get(client)
        if rows is None:
            rows = self._client_rows[client] = torch.as_tensor(
                self.client_indices[client], device=self.device
            )
        return rows

    def client_data(self, client: int, rnd: int = -1, epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The client's (possibly defense-prepared) local data for local epoch `epoch` of round `rnd`.

        Prepared once; or, when the defense redraws its encoding every epoch (`prepares_per_epoch`),
        once per (round, epoch), in epoch order. Then `_client_data` holds the draws of the client's
        latest round one after the other (epoch e at rows e*M..(e+1)*M-1): what `locate` and
        `Observation.rows` index, like the defense's oracle mapping of that round (the observed round's
        are kept for `locate` when training goes on past it).
        """
        if not self._per_epoch:
            if client not in self._client_data:
                ctx = self._ctx(-1, client, 0, "prepare") if self._prepares else None
                x, y, source = self._prepare(client, ctx)
                if source is not None:
                    self._client_source[client] = source
                self._client_data[client] = (x, y)
            return self._client_data[client]
        last = self._client_draw.get(client)
        first = last[1] + 1 if last is not None and last[0] == rnd else 0  # a new round drops the last's
        for e in range(first, epoch + 1):
            ctx = self._ctx(rnd, client, e, "prepare", step=0, epoch=e)
            x, y, source = self._prepare(client, ctx)
            if e:  # a further epoch of the round: appended
                m = self._client_draw[client][2]
                if len(y) != m:
                    raise FedbenchError(
                        f"defense '{self.defense.name}' prepared {len(y)} rows in epoch {e} and {m} "
                        "before: a per-epoch draw must keep the number of rows"
                    )
                xs, ys = self._client_data[client]
                x, y = torch.cat([xs, x]), torch.cat([ys, y])
                if source is not None:
                    source = torch.cat([self._client_source[client], source])
            self._client_data[client] = (x, y)
            if source is not None:
                self._client_source[client] = source
            self._client_draw[client] = (rnd, e, len(y) if not e else self._client_draw[client][2])
            if self._watching(rnd, client):
                self._observed_draws[client] = (self._client_data[client], self._client_source.get(client))
        m = self._client_draw[client][2]
        x, y = self._client_data[client]
        return x[epoch * m : (epoch + 1) * m], y[epoch * m : (epoch + 1) * m]

    def locate(self, obs: Observation) -> Observation:
        """`obs` with `rows` (x_true's indices in the client's local data, by exact match) and, when the
        defense replaced the data with a source (LODA, MixUp), `x_private` (the private inputs behind them).
        """
        known = obs.client in self._client_data or obs.client in self._trained
        if obs.client < 0 or not known or not len(obs.x_true):
            return obs
        if obs.client in self._observed_draws:  # the observed round's draws (`client_data`)
            (x, _), source = self._observed_draws[obs.client]
        else:
            x, _ = self.client_data(obs.client)  # prepared by now; without prepare_data, a copy made here
            source = self._client_source.get(obs.client)
        flat = x.reshape(len(x), -1)
        rows = []
        for row in obs.x_true.to(x.device).reshape(len(obs.x_true), -1):
            hit = torch.nonzero((flat == row).all(1)).flatten()
            if not len(hit):
                return obs  # not rows of the local data (e.g. an aggregate): nothing to locate
            rows.append(int(hit[0]))
        private = (
            source[torch.as_tensor(rows, device=source.device)].detach().clone()
            if source is not None
            else None
        )
        return dataclasses.replace(obs, rows=tuple(rows), x_private=private)

    def _batches(self, client: int, rnd: int, n: int, epoch: int = 0) -> list[torch.Tensor]:
        """Index batches of one client's epoch: a seeded shuffle cut into batch_size pieces, or the
        epoch's Poisson lots (`_lots`) when the defense asks for them.

        The shuffle is `numpy_rng(seed, "batches", rnd, client, epoch).permutation(n)`, from the
        streams the round's announcement seeded together (`_announce`), bit for bit the same."""
        rng = self._orders.rng(rnd, client, epoch)
        if self._poisson:
            return self._lots(rng, n)
        order = torch.from_numpy(rng.permutation(n)).to(self.device)
        bs = self.sc.batch_size or n
        return [order[i : i + bs] for i in range(0, n, bs)]

    def _lots(self, rng: np.random.Generator, n: int) -> list[torch.Tensor]:
        """The Poisson lots of one client's epoch: ceil(n / B) steps, each holding every one of the n
        records independently with probability q = B / n (B = batch_size, the expected lot size), in
        row order; a lot may be empty.

        Drawn from the epoch's stream of `_batches` (which the shuffle would have used), one uniform
        draw per record and lot, so the lots are a pure function of (seed, round, client, epoch) and
        the step's place in the epoch. n draws per step cost little beside the step's per-example
        gradients."""
        bs = self.sc.batch_size
        if not 0 < bs <= n:
            raise FedbenchError(
                f"Poisson lots of expected size batch_size={bs} need 0 < batch_size <= a client's records "
                f"(a client holds {n}): lower batch_size or the number of clients"
            )
        q = bs / n
        lots = [np.flatnonzero(rng.random(n) < q) for _ in range(math.ceil(n / bs))]
        return [torch.from_numpy(lot).to(self.device) for lot in lots]

    def _lot_loss(self, examples: Any) -> float:
        """A Poisson lot's loss, (1 / B) x the sum of its records' losses with B the expected lot size:
        the loss whose gradient the defense's normalised lot sum clips (Abadi et al.'s lot), an unbiased
        estimate of the client's mean loss, and 0 for an empty lot, which runs no forward pass (models
        cannot take zero examples)."""
        if not examples.batch:
            return 0.0
        return examples.batch_loss() * examples.batch / self.sc.batch_size

    def _require_records(self, rows: torch.Tensor, point: str, client: int, rnd: int) -> None:
        """Fail the run when an observation would hold no record: only Poisson lots can be empty, and
        an attacker reading one sees noise alone, which no metric can score."""
        if self._poisson and not len(rows):
            raise RunFailure(
                f"the '{point}' observation of client {client} in round {rnd} holds no record (the Poisson "
                "lots it reads are empty): use another seed or a larger batch_size"
            )

    def _participants(self, rnd: int) -> list[int]:
        k = self.sc.clients
        m = max(1, round(self.sc.participation * k))
        if m >= k:
            chosen = list(range(k))
        else:
            chosen = sorted(self._draws.rng(rnd).choice(k, m, replace=False).tolist())
        obs = self.observe
        if obs is not None and obs.round == rnd and obs.client not in chosen:
            chosen[-1] = obs.client  # the observed victim always takes part in the observed round
            chosen.sort()
        return chosen

    def _announce(self, rnd: int, upcoming: dict[int, list[int]]) -> None:
        """Draw the participants of the rounds from `rnd` on into `upcoming`, and seed the streams of
        those draws and of the participants' first-epoch batch orders together (`SeededStreams.expect`):
        enough rounds for `_ANNOUNCED` clients, up to the last round run. The draws are pure functions
        of (seed, round, client, epoch), so drawing them ahead changes nothing."""
        k = self.sc.clients
        m = min(k, max(1, round(self.sc.participation * k)))
        last = self.sc.rounds
        if self.stop_after_observation and self.observe is not None:
            last = min(last, self.observe.round + 1)
        block = range(rnd, max(rnd + 1, min(last, rnd + math.ceil(_ANNOUNCED / m))))
        if m < k:
            self._draws.expect((r,) for r in block)
        for r in block:
            upcoming[r] = self._participants(r)
        self._orders.expect((r, c, 0) for r in block for c in upcoming[r])

    def _set_mode(self) -> None:
        self._params.set_mode(self.sc.model_mode == "train")

    def _gradient(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        ctx: HookContext | None,
        want_examples: bool,
        rnd: int,
        client: int,
    ) -> tuple[dict[str, torch.Tensor], float, dict | None]:
        """Batch gradient of the (possibly defense-modified) loss, through the per-example hook if any.

        `ctx` is the step's hook context, None when the defense has no hook of a local step."""
        examples = None
        if self._needs_per_example or want_examples:
            examples = per_example_grads(self.model, x, y, self.loss_fn)
        if self._needs_per_example:
            grad = self.defense.per_example(examples, ctx)
            # a Poisson lot's loss, else the batch mean (the ghost path's forward or the same no-grad one)
            loss = self._lot_loss(examples) if self._poisson else examples.batch_loss()
        else:
            out = self.model(x)
            loss_t = self.loss_fn(out, y)
            if self.defense.implements("loss"):
                loss_t = self.defense.loss(self.model, x, y, loss_t, ctx)
            tensors = self._params.tensors
            grads = torch.autograd.grad(loss_t, tensors, allow_unused=True)
            grad = {
                n: (g if g is not None else torch.zeros_like(p))
                for n, p, g in zip(self.param_names, tensors, grads, strict=True)
            }
            loss = float(loss_t.detach())
        if not math.isfinite(loss):
            raise RunFailure(f"training diverged: non-finite loss in round {rnd}, client {client}")
        return grad, loss, examples

    def _example_gradient(
        self, examples: dict, x1: torch.Tensor, y1: torch.Tensor, rnd: int, client: int, step: int
    ) -> dict[str, torch.Tensor]:
        """The `example` observation: the first example's gradient through the per-step pipeline.

        The hooks act as they would on a batch of that one example (`HOOKS_BEFORE['example']`): the
        defended `loss` when there is one (its gradient on the one-example batch), else the example's
        per-example gradient through `per_example`; then `step`. Noise is drawn from the observation's
        own generator. A stateful hook (FRL's residual and simulated attacker) is called once more than
        in training; the attack's simulation stops after the observed round, so no training result
        depends on that extra call.
        """
        ctx = self._ctx(rnd, client, step, "example", x1, y1)
        if self.defense.implements("loss") and not self._needs_per_example:
            grad, _, _ = self._gradient(x1, y1, ctx, False, rnd, client)
        else:
            grad = self.defense.per_example({k: v[:1] for k, v in examples.items()}, ctx)
        if self.defense.implements("step"):
            grad = self.defense.step(grad, ctx)
        return grad

    # ------------------------------------------------------------------------------- local training
    def local_update(
        self, client: int, rnd: int, received: dict[str, torch.Tensor]
    ) -> tuple[dict, int, float]:
        """Run one client's round; returns (shared message, number of examples, mean local loss).

        The model's one parameter set is loaded with `received` in place and trained in place; the
        message is computed from it directly (a FedAvg delta is a fresh tensor, not a further copy).
        """
        trained = self._train_client(client, rnd, received)
        shared = trained.shared
        if self.defense.implements("update"):
            shared = self.defense.update(shared, self._update_ctx(trained))
        trained.buffers = {k: v.detach().clone() for k, v in self._params.buffers}
        return self._finish_update(trained, shared)

    def _update_ctx(self, trained: _Trained) -> HookContext:
        return self._ctx(trained.rnd, trained.client, 0, "update", global_state=trained.received)

    def _local_updates(
        self, clients: list[int], rnd: int, received: dict[str, torch.Tensor]
    ) -> Iterator[tuple[dict, int, float]]:
        """`local_update` of several clients, their `update` hook called once for all (`update_batch`).

        Each client trains in turn (its buffers kept as it leaves them), then the defense's batched
        hook acts on the messages together, then each is checked and recorded as `local_update` does,
        one at a time as the server takes it (a generator: the server's `receive` and a `server`
        observation of one client come before the next client's record, as in the one-client path).
        Used only for a defense that overrides `Defense.update_batch` (RecUP-FL): other defenses keep
        one `update` call right after each client's training. The hook's contexts hand it the model
        holding the last client's weights; the round's received weights are `ctx.global_state`.
        """
        trained = []
        for client in clients:
            t = self._train_client(client, rnd, received)
            t.buffers = {k: v.detach().clone() for k, v in self._params.buffers}
            trained.append(t)
        shared = self.defense.update_batch(
            [t.shared for t in trained], [self._update_ctx(t) for t in trained]
        )
        for t, s in zip(trained, shared, strict=True):
            yield self._finish_update(t, s)

    def _train_client(self, client: int, rnd: int, received: dict[str, torch.Tensor]) -> _Trained:
        """A client's local training of round `rnd`: its message before the `update` hook."""
        if self._prepares:
            x, y = self.client_data(client, rnd)
            rows, n = None, len(y)
        else:  # the batches are picked from x_train through the client's rows
            x, y = self.x_train, self.y_train
            rows = self._rows(client)
            n = len(rows)
        self._trained.add(client)
        self._params.load(received)
        self._set_mode()
        obs = self.observe
        watching = self._watching(rnd, client)
        batches = self._batches(client, rnd, n)
        if self.sc.protocol == "fedsgd":
            steps = 1
        elif self.sc.local_steps:
            steps = self.sc.local_steps
        else:
            steps = self.sc.local_epochs * len(batches)
        losses, seen = [], []
        tensors = self._params.tensors
        shared = None
        for step in range(steps):
            epoch = step // len(batches)
            if step and step % len(batches) == 0:  # next epoch: a fresh shuffle (and encoding, if redrawn)
                batches = self._batches(client, rnd, n, epoch=epoch)
                if self._per_epoch:
                    x, y = self.client_data(client, rnd, epoch)  # n rows again (checked there)
            idx = batches[step % len(batches)]  # rows of the client's local data
            take = idx if rows is None else rows[idx]  # rows of x
            xb, yb = x[take], y[take]
            if watching:
                seen.append(idx + epoch * n if self._per_epoch else idx)  # rows of the round's draws
            ctx = self._ctx(rnd, client, step, "step", xb, yb) if self._step_hooks else None
            want_example = watching and obs.point == "example" and step == 0
            if watching and step == 0 and obs.point in ("example", "step"):
                self._require_records(idx, obs.point, client, rnd)
            grad, loss, examples = self._gradient(xb, yb, ctx, want_example, rnd, client)
            if want_example:
                x1, y1 = x[take[:1]], y[take[:1]]
                leaked = self._example_gradient(examples, x1, y1, rnd, client, step)
                self._record("example", rnd, client, leaked, "gradient", received, x1, y1)
            if self.defense.implements("step"):
                grad = self.defense.step(grad, ctx)
            if watching and obs.point == "step" and step == 0:
                self._record("step", rnd, client, grad, "gradient", received, xb, yb)
            losses.append(loss)
            if self.sc.protocol == "fedsgd":
                shared = grad
                break
            if self._engine_only and step == steps - 1:
                shared = self._last_step_delta(grad, received)
                break
            with torch.no_grad():
                for name, p in zip(self.param_names, tensors, strict=True):
                    p.sub_(grad[name], alpha=self.sc.lr)
            self._params.modified()
        if not self._engine_only:
            self._params.modified()  # a hook was handed the model, or a forward updated its buffers
        if shared is not None:
            pass
        elif self._owned_delta:  # the delta lives until the next client's (`run` sums it at once)
            scratch = self._delta_scratch
            with torch.no_grad():
                shared = {
                    n: _into(scratch, n, torch.sub, p.detach(), received[n])
                    for n, p in zip(self.param_names, tensors, strict=True)
                }
        else:
            shared = {n: p.detach() - received[n] for n, p in zip(self.param_names, tensors, strict=True)}
        loss = sum(losses) / len(losses)
        return _Trained(client, rnd, received, shared, n, loss, watching, seen, steps, rows)

    def _finish_update(self, t: _Trained, shared: dict) -> tuple[dict, int, float]:
        """Check the client's message after its `update` hook and record what an observer sees of it."""
        client, rnd, obs = t.client, t.rnd, self.observe
        if self._check_each:
            _check_finite(shared, f"of client {client}'s update in round {rnd}")
        if t.watching and obs.point in ("update", "server"):
            used = torch.unique(torch.cat(t.seen))
            self._require_records(used, obs.point, client, rnd)
            # every epoch's draw when the defense redraws per epoch
            xr, yr = self._client_data[client] if t.rows is None else self.client_data(client)
            kind = "gradient" if self.sc.protocol == "fedsgd" else "delta"
            if obs.point == "update":
                self._record("update", rnd, client, shared, kind, t.received, xr[used], yr[used], t.steps)
            else:  # recorded by the server after `receive`
                self._pending_server = (kind, t.received, xr[used], yr[used], t.steps)
        self._last_buffers = t.buffers
        return shared, t.n, t.loss

    def _round_updates(self, chosen: list[int], rnd: int, sent: dict) -> Iterator[tuple[dict, int, float]]:
        """The round's client messages in order, as the server consumes them: one client at a time, or
        blocks of `UPDATE_BATCH` clients for a defense with a batched `update` hook."""
        if not self._batch_updates:
            for client in chosen:
                yield self.local_update(client, rnd, sent)
            return
        for start in range(0, len(chosen), UPDATE_BATCH):
            yield from self._local_updates(list(chosen[start : start + UPDATE_BATCH]), rnd, sent)

    def _last_step_delta(self, grad: dict, received: dict) -> dict[str, torch.Tensor]:
        """FedAvg's delta after the last local step, that step computed out of place: `(p - lr * g) -
        received` per parameter, by the kernels of the in-place step `p.sub_(g, alpha=lr)` and of
        `p - received` (out= and in-place variants of the same kernels: bit for bit the same delta).
        The parameters keep the weights the step started from; the delta goes into the scratch
        tensors when `run` sums it at once (`_owned_delta`), else into new tensors."""
        scratch = self._delta_scratch if self._owned_delta else None
        lr = self.sc.lr
        shared = {}
        with torch.no_grad():
            for n, p in zip(self.param_names, self._params.tensors, strict=True):
                if scratch is None:
                    end = torch.sub(p.detach(), grad[n], alpha=lr)
                else:
                    end = _into(scratch, n, torch.sub, p.detach(), grad[n], alpha=lr)
                shared[n] = end.sub_(received[n])
        return shared

    def _watching(self, rnd: int, client: int) -> bool:
        """Whether this client's round is observed (the victim, or any participant for a cohort)."""
        obs = self.observe
        return obs is not None and obs.round == rnd and (obs.client == client or obs.cohort)

    def _hooks_before(self, point: str) -> tuple[str, ...]:
        """The defense's hooks that acted on what is observed at `point` (`HOOKS_BEFORE`)."""
        return tuple(h for h in HOOKS_BEFORE[point] if self.defense.implements(h))

    def _received_copy(self, received: dict) -> dict:
        """One detached copy of the state sent this round, shared by all observations of the round."""
        if self._state_copy[0] is not received:
            self._state_copy = (received, {k: v.detach().clone() for k, v in received.items()})
        return self._state_copy[1]

    def _record(
        self,
        point: str,
        rnd: int,
        client: int,
        shared: dict,
        kind: str,
        received: dict,
        x: torch.Tensor,
        y: torch.Tensor,
        steps: int = 1,
    ) -> None:
        idx = torch.as_tensor(self.client_indices[client])
        hooks = self._hooks_before(point)
        observation = Observation(
            point=point,
            round=rnd,
            client=client,
            kind=kind,
            shared={k: v.detach().clone() for k, v in shared.items()},
            global_state=self._received_copy(received),
            x_true=x.detach().clone(),
            y_true=y.detach().clone(),
            lr=self.sc.lr,
            local_steps=steps,
            batch_size=self.sc.batch_size or len(y),
            model_mode=self.sc.model_mode,
            attr_true={k: v[idx] for k, v in self.attr_train.items()} if point != "example" else {},
            defense_hooks=hooks,
            sparsified=bool(set(hooks) & set(self.defense.sparsifying_hooks())),
        )
        obs = self.observe
        if obs is not None and obs.cohort and client >= 0:
            self._cohort.append(observation)
        if obs is None or client < 0 or client == obs.client:
            self.observation = observation

    # --------------------------------------------------------------------------------------- server
    def _aggregate(self, updates: list[dict], weights: list[float], rnd: int) -> dict[str, torch.Tensor]:
        if self.defense.implements("aggregate"):
            agg = self.defense.aggregate(updates, weights, self._ctx(rnd, -1, 0, "aggregate"))
            if agg is not None:
                return agg
        total = float(sum(weights))
        return {
            n: sum(u[n] * (w / total) for u, w in zip(updates, weights, strict=True))
            for n in self.param_names
        }

    def run(self) -> SimulationResult:
        result = SimulationResult(client_sizes=[len(ix) for ix in self.client_indices])
        self.observation = None
        self._cohort: list[Observation] = []
        self._state_copy: tuple[Any, dict] = (None, {})
        upcoming: dict[int, list[int]] = {}  # round -> its participants, drawn ahead (`_announce`)
        for rnd in range(self.sc.rounds):
            sent = self.global_state
            if self.server_hook is not None:
                sent = self.server_hook.broadcast({k: v.clone() for k, v in sent.items()}, rnd)
            updates, weights, buffers, losses = [], [], [], []
            self._params.modified()  # evaluation and the server's update changed the model since
            if rnd not in upcoming:
                self._announce(rnd, upcoming)
            chosen = upcoming.pop(rnd)
            summed = None
            if self._streaming:  # the weights are the clients' sizes: the weighted mean is summed on the fly
                sizes = [float(len(self.client_indices[c])) for c in chosen]
                summed = _WeightedSum(self.param_names, sizes, self._sum_scratch)
            for client, (shared, n, loss) in zip(chosen, self._round_updates(chosen, rnd, sent), strict=True):
                if self.defense.implements("receive"):
                    shared = self.defense.receive(shared, self._ctx(rnd, client, 0, "receive"))
                    _check_finite(shared, f"of client {client}'s update at the server in round {rnd}")
                obs = self.observe
                if obs is not None and obs.point == "server" and self._watching(rnd, client):
                    kind, received, xs, ys, steps = self._pending_server
                    self._record("server", rnd, client, shared, kind, received, xs, ys, steps)
                if summed is None:
                    updates.append(shared)
                else:
                    summed.add(shared, float(n), owned=self._owned_delta)
                weights.append(float(n))
                buffers.append(self._last_buffers)
                losses.append(loss)
            if not self._check_each:
                _check_finite(
                    summed.sum, f"of the weighted mean of the {len(chosen)} client updates in round {rnd}"
                )
            agg = self._aggregate(updates, weights, rnd) if summed is None else summed.sum
            if self.observe is not None and self.observe.point == "aggregate" and self.observe.round == rnd:
                self._record(
                    "aggregate",
                    rnd,
                    -1,
                    agg,
                    "gradient" if self.sc.protocol == "fedsgd" else "delta",
                    sent,
                    self.x_train[:0],
                    self.y_train[:0],
                )
            if self._cohort and self.observation is not None:
                self.observation = dataclasses.replace(self.observation, cohort=tuple(self._cohort))
                self._cohort = []
            self._apply(agg, buffers, weights)
            result.rounds_run = rnd + 1
            if self.stop_after_observation and self.observation is not None:
                result.observation = self.observation
                return result
            last = rnd == self.sc.rounds - 1
            if last or (rnd + 1) % self.sc.eval_every == 0:
                self.model.load_state_dict(self.global_state)
                acc, loss = evaluate(self.model, self.x_test, self.y_test, self.sc.loss)
                result.history.append(
                    {
                        "round": rnd + 1,
                        "test_acc": acc,
                        "test_loss": loss,
                        "train_loss": sum(losses) / len(losses),
                    }
                )
        result.test_acc = result.history[-1]["test_acc"]
        result.test_loss = result.history[-1]["test_loss"]
        if self.observe is not None and self.observe.point == "model":
            self.observation = self._model_observation()
        result.observation = self.observation
        return result

    def trained_observation(self, global_state: dict[str, torch.Tensor]) -> Observation:
        """The `model` observation that `run` records at the end of a training whose final global state
        is `global_state`, without training again: every run that reads the final model shares one
        training (`fedbench.execution.runner.trained_model`). The state replaces this simulation's."""
        if self.observe is None or self.observe.point != "model":
            raise ValueError("trained_observation serves a simulation that observes the final model")
        self.global_state = {k: v.to(self.device) for k, v in global_state.items()}
        self.observation = self._model_observation()
        return self.observation

    def _model_observation(self) -> Observation:
        assert self.observe is not None
        self.model.load_state_dict(self.global_state)
        return Observation(
            point="model",
            round=self.sc.rounds,
            client=self.observe.client,  # the victim whose membership is attacked (RunData has its data)
            kind="model",
            shared={},
            global_state=_clone_state(self.model),
            x_true=self.x_train,
            y_true=self.y_train,
            lr=self.sc.lr,
            local_steps=0,
            batch_size=self.sc.batch_size,
            model_mode="eval",
            defense_hooks=self._hooks_before("model"),
        )

    def _apply(self, agg: dict[str, torch.Tensor], buffers: list[dict], weights: list[float]) -> None:
        new = dict(self.global_state)
        scale = -self.sc.server_lr * self.sc.lr if self.sc.protocol == "fedsgd" else self.sc.server_lr
        for n in self.param_names:
            new[n] = self.global_state[n] + scale * agg[n]
        total = float(sum(weights))
        for name in buffers[0] if buffers else ():
            if buffers[0][name].is_floating_point():
                new[name] = sum(b[name] * (w / total) for b, w in zip(buffers, weights, strict=True))
            else:
                new[name] = buffers[0][name]
        self.global_state = new
