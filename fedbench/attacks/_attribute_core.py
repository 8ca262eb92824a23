"""Torch/sklearn core of attribute inference from updates (spec 000 §3.1), shared with RecUP-FL.

What lives here, and why it is shared: the adversary and the RecUP-FL defender zoo see the same
thing, a client update mapped to a feature vector, and must agree on that map exactly.

- `UpdateLayout`: which parameters of the FL model feed the features (`layers`), and their order in
  the flat update vector (model parameter order).
- `FeatureMap`: differentiable 1-D max-pooling of each selected tensor (window chosen so the total
  stays <= `max_features`, Melis et al.), then standardisation with the training pool's statistics.
  It is the first module of every defender, so RecUP-FL's FGSM acts on the raw update through it
  (its gradient is non-zero only at each window's arg-max: the perturbation is sparse, spec §3.1).
- `pool_updates`: the update each pool record would produce as a one-record client at the current
  global weights (per-example gradients via torch.func; `-lr * g` when clients share weight deltas,
  exact for one local step); `defended_pool_features`, the same updates passed through the run's
  defense as one-record clients (the defense-aware adversary, `train_on=defended`).
- the adversary models: `stru-nn` / zoo members (`mlp` of given widths), `unkwn-nn`
  (1024-1024-512-128), trained with CE and plain SGD (lr 0.01, 80 epochs, batch 64, spec §3.1), and
  sklearn's RBF `SVC` and 120-tree `RandomForestClassifier`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedbench.errors import FedbenchError

UNKWN_WIDTHS = (1024, 1024, 512, 128)


# ------------------------------------------------------------------------------------------- features


@dataclass(frozen=True)
class UpdateLayout:
    """The selected parameter names and shapes, in model order; the flat update is their concatenation."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(math.prod(s) for s in self.shapes)

    @property
    def dim(self) -> int:
        return sum(self.sizes)

    def flatten(self, update: dict[str, torch.Tensor]) -> torch.Tensor:
        """[D] flat vector of one update dict (selected tensors only)."""
        return torch.cat([update[n].reshape(-1) for n in self.names])

    def flatten_batch(self, updates: dict[str, torch.Tensor]) -> torch.Tensor:
        """[B, D] flat vectors of a dict of batched tensors [B, *shape]."""
        b = next(iter(updates.values())).shape[0]
        return torch.cat([updates[n].reshape(b, -1) for n in self.names], dim=1)

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        out, offset = {}, 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes, strict=True):
            out[name] = flat[offset : offset + size].reshape(shape)
            offset += size
        return out


def layout_for(state: dict[str, torch.Tensor], param_names: Sequence[str], layers: str) -> UpdateLayout:
    """The layout of `layers` ('all' or comma-separated parameter names or module prefixes).

    `param_names` are the model's trainable parameter names in order (the keys of an update).
    """
    if layers.strip() in ("", "all"):
        chosen = list(param_names)
    else:
        wanted = [w.strip() for w in layers.split(",") if w.strip()]
        chosen = [n for n in param_names if any(n == w or n.startswith(w + ".") for w in wanted)]
        missing = [w for w in wanted if not any(n == w or n.startswith(w + ".") for n in param_names)]
        if missing:
            raise FedbenchError(
                f"layers={layers}: {', '.join(missing)} match no model parameter "
                f"(parameters: {', '.join(param_names)}); use 'all' or parameter/module names"
            )
    return UpdateLayout(tuple(chosen), tuple(tuple(state[n].shape) for n in chosen))


def pool_window(layout: UpdateLayout, max_features: int) -> int:
    """The smallest max-pool window that brings the pooled dimension to at most `max_features`."""
    window = 1
    while sum(math.ceil(s / window) for s in layout.sizes) > max_features:
        window += 1
    return window


class FeatureMap(nn.Module):
    """Flat update [B, D] -> standardised max-pooled features [B, F], differentiable in the update."""

    def __init__(self, layout: UpdateLayout, window: int):
        super().__init__()
        self.sizes = list(layout.sizes)
        self.window = window
        self.dim = sum(math.ceil(s / window) for s in self.sizes)
        self.register_buffer("mean", torch.zeros(self.dim))
        self.register_buffer("std", torch.ones(self.dim))

    def pooled(self, flat: torch.Tensor) -> torch.Tensor:
        if self.window == 1:
            return flat
        parts = torch.split(flat, self.sizes, dim=1)
        pooled = [
            nn.functional.max_pool1d(p.unsqueeze(1), self.window, self.window, ceil_mode=True).squeeze(1)
            for p in parts
        ]
        return torch.cat(pooled, dim=1)

    def fit(self, flat: torch.Tensor) -> FeatureMap:
        """Set the standardisation from a training pool of flat updates; returns self."""
        with torch.no_grad():
            return self.fit_pooled(self.pooled(flat))

    def fit_pooled(self, f: torch.Tensor) -> FeatureMap:
        """Set the standardisation from already max-pooled pool features [N, F]; returns self."""
        with torch.no_grad():
            self.mean.copy_(f.mean(0))
            std = f.std(0, unbiased=False)
            self.std.copy_(torch.where(std > 1e-12, std, torch.ones_like(std)))
        return self

    def standardise(self, pooled: torch.Tensor) -> torch.Tensor:
        return (pooled - self.mean) / self.std

    def forward(self, flat: torch.Tensor) -> torch.Tensor:
        return self.standardise(self.pooled(flat))


# ------------------------------------------------------------------------------------- pool updates


def pool_updates(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    layout: UpdateLayout,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_name: str,
    kind: str,
    lr: float,
    chunk: int = 256,
) -> torch.Tensor:
    """[N, D] flat updates of one-record clients holding each (x_i, y_i), at weights `state`.

    `kind` is the observation's message kind: 'gradient' (FedSGD) shares g, 'delta' (FedAvg) shares
    the weight change, -lr * g after one local step.
    """
    from fedbench.fl.losses import loss_function
    from fedbench.fl.per_example import per_example_grads

    model.load_state_dict(state)
    loss_fn = loss_function(loss_name)
    out = []
    for i in range(0, len(y), chunk):
        grads = per_example_grads(model, x[i : i + chunk], y[i : i + chunk], loss_fn)
        out.append(layout.flatten_batch(grads).detach())
    flat = torch.cat(out) if out else torch.zeros(0, layout.dim)
    return -lr * flat if kind == "delta" else flat


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """A content hash of a dict of tensors (a model state: the zoo of a round depends on its weights)."""
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:32]


# hooks a one-record client's defense acts through in the adversary's replay, and those it cannot replay
_REPLAYED_HOOKS = ("per_example", "step", "update", "receive")
_UNREPLAYABLE_HOOKS = ("prepare_data", "loss")


def defended_pool_features(
    defense,
    data,
    idx: np.ndarray,
    model: nn.Module,
    state: dict[str, torch.Tensor],
    layout: UpdateLayout,
    fmap: FeatureMap,
    observation,
    seed: int,
    chunk: int = 256,
) -> torch.Tensor:
    """[N, F] max-pooled features of the pool records' updates AFTER the run's defense (spec ambiguity #4).

    Each pool record is replayed as a one-record client of the observed round: its gradient at the
    observed global weights goes through the defense's `per_example` and `step` hooks, becomes the
    shared message (the gradient, or -lr * g for a weight delta: one local step, as `pool_updates`),
    then through `update` (and `receive` when the attack observes at the server), each call with a
    HookContext of its own seeded from the attack seed: DP noise is fresh, never the victims'. A
    defense that binds data (RecUP-FL) is bound, on a copy, to the pool records as one-record
    clients, so each record protects its own attribute value (and, with per-client `assign`, the
    pseudo-clients cycle over the groups as the real clients do); one with a batched `update` hook
    (`Defense.update_batch`: RecUP-FL) gets a chunk's records at once. Defenses that change the client's
    data or loss (`prepare_data`, `loss`) cannot be replayed from a gradient: FedbenchError.

    Cached as an artifact (the four adversaries of a grid cell share it): the key holds the defense's
    name, version and params, the observed weights, the dataset and the pool, the scenario and the seed.
    """
    import copy
    import dataclasses

    from fedbench.fl.losses import loss_function
    from fedbench.fl.per_example import per_example_grads
    from fedbench.fl.seeding import torch_generator
    from fedbench.plugin import Defense, HookContext, artifact
    from fedbench.spec.params import params_to_dict

    if defense is None:
        raise FedbenchError(
            "attribute-inference: train_on=defended needs the run's defense (the runner binds it; "
            "call bind_defense in library use) or use train_on=clean"
        )
    unreplayable = [h for h in _UNREPLAYABLE_HOOKS if defense.implements(h)]
    if unreplayable:
        raise FedbenchError(
            f"attribute-inference: train_on=defended cannot replay defense '{defense.name}' (its "
            f"{', '.join(unreplayable)} hook changes the client's data or loss, not its update); "
            "use train_on=clean"
        )
    sc, bundle = data.scenario, data.bundle
    point = observation.point
    hooks = [h for h in _REPLAYED_HOOKS if defense.implements(h) and (h != "receive" or point == "server")]
    t_idx = torch.as_tensor(idx)
    device = next(iter(state.values())).device
    x, y = bundle.x_train[t_idx].to(device), bundle.y_train[t_idx].to(device)
    if not hooks:  # the defense acts on none of what the adversary sees: the clean pool
        flat = pool_updates(model, state, layout, x, y, sc.loss, observation.kind, observation.lr)
        with torch.no_grad():
            return fmap.pooled(flat)
    key = {
        "defense": [defense.name, type(defense).version, params_to_dict(defense.params)],
        "state": state_digest(state),
        "dataset": [bundle.meta.name, state_digest({"x": bundle.x_train, "y": bundle.y_train})],
        "attributes": state_digest(dict(bundle.attr_train)),
        "pool": state_digest({"idx": t_idx}),
        "layers": list(layout.names),
        "window": fmap.window,
        "observation": [point, observation.kind, observation.lr, observation.round, observation.model_mode],
        "scenario": params_to_dict(sc),
        "seed": seed,
    }

    def compute() -> torch.Tensor:
        bound = defense
        if defense.implements("bind_data"):  # the pool records as one-record clients
            bound = copy.copy(defense)
            bound.bind_data(dataclasses.replace(data, client_indices=tuple((int(i),) for i in idx)))
        model.load_state_dict(state)
        loss_fn = loss_function(sc.loss)
        rnd = observation.round
        # a defense with a batched `update` hook (RecUP-FL) takes a chunk's records at once
        batched = "update" in hooks and bound.implements("update_batch")

        def ctx(purpose: str, client: int, **extra) -> HookContext:
            gen = torch_generator(seed, f"aia-defended-{purpose}", rnd, client, 0)
            xj, yj = x[client : client + 1], y[client : client + 1]
            return HookContext(rnd, client, 0, sc, gen, model, bundle.meta, xj, yj, **extra)

        def before_update(client: int, one: dict) -> dict:
            if bound.implements("per_example"):
                g = bound.per_example(one, ctx("step", client))
            else:
                g = Defense.per_example(bound, one, None)
            if bound.implements("step"):
                g = bound.step(g, ctx("step", client))
            return g if observation.kind == "gradient" else {k: -observation.lr * v for k, v in g.items()}

        def after_update(client: int, shared: dict) -> torch.Tensor:
            if "receive" in hooks:
                shared = bound.receive(shared, ctx("receive", client))
            return layout.flatten({k: v.detach() for k, v in shared.items()})

        out = []
        for start in range(0, len(idx), chunk):
            grads = per_example_grads(model, x[start : start + chunk], y[start : start + chunk], loss_fn)
            pending = []  # (client, message) waiting for the batched update hook
            for j in range(len(next(iter(grads.values())))):
                client = start + j
                shared = before_update(client, {k: v[j : j + 1] for k, v in grads.items()})
                if batched:
                    pending.append((client, shared))
                    continue
                if "update" in hooks:
                    shared = bound.update(shared, ctx("update", client, global_state=state))
                out.append(after_update(client, shared))
            if pending:
                contexts = [ctx("update", client, global_state=state) for client, _ in pending]
                updated = bound.update_batch([m for _, m in pending], contexts)
                out += [after_update(c, m) for (c, _), m in zip(pending, updated, strict=True)]
        with torch.no_grad():
            return fmap.pooled(torch.stack(out)).cpu()

    return artifact("aia-defended-pool", json.dumps(key, sort_keys=True), compute).to(device)


def client_label(values: np.ndarray) -> int:
    """A client's attribute: the most common value among its records (exact for one record)."""
    return int(np.bincount(np.asarray(values, dtype=np.int64)).argmax())


# ---------------------------------------------------------------------------------------- adversaries


def mlp(in_dim: int, widths: Sequence[int], n_classes: int) -> nn.Sequential:
    """Fully connected ReLU net: in_dim -> widths... -> n_classes logits."""
    layers: list[nn.Module] = []
    prev = in_dim
    for w in widths:
        layers += [nn.Linear(prev, int(w)), nn.ReLU()]
        prev = int(w)
    layers.append(nn.Linear(prev, n_classes))
    return nn.Sequential(*layers)


def zoo_widths(size: int, choices: Sequence[int], seed: int, depth: int = 3) -> list[tuple[int, ...]]:
    """Hidden widths of `size` zoo members, each drawn from `choices` with a fixed seed.

    Distinct triples while there are enough of them (|choices|^depth >= size), spec §4.5 default.
    """
    rng = np.random.default_rng(seed)
    combos = len(choices) ** depth
    out: list[tuple[int, ...]] = []
    while len(out) < size:
        w = tuple(int(c) for c in rng.choice(np.asarray(choices), depth))
        if w not in out or len(out) >= combos:
            out.append(w)
    return out


def train_classifier(
    net: nn.Module,
    features: torch.Tensor,
    labels: torch.Tensor,
    epochs: int,
    lr: float,
    batch: int,
    seed: int,
) -> nn.Module:
    """CE + plain SGD (spec §3.1: lr 0.01, 80 epochs), seeded shuffles; returns `net` in eval mode.

    The SGD step is `torch.optim.SGD`'s without momentum or weight decay, written out: the gradients
    from `torch.autograd.grad` (what `backward` would store in `.grad`) and `p -= lr * g` as
    `_foreach_add_(params, grads, alpha=-lr)` (what SGD runs: per tensor on CPU, one foreach kernel on
    GPU), so the weights are bit for bit SGD's; it skips the optimizer's per-step bookkeeping and
    `zero_grad`. The batch is gathered with `index_select` (the same rows as `features[idx]`, whose
    advanced indexing costs ~5x more). Together ~15-20 % of a RecUP-FL zoo's training on these small
    MLPs, whose matrix products are most of the rest (docs/benchmarks.md).
    """
    gen = torch.Generator().manual_seed(seed)
    params = [p for p in net.parameters() if p.requires_grad]
    net.train()
    n = len(labels)
    for _ in range(epochs):
        # drawn on the CPU generator (the same order on every device), gathered where the data lives:
        # index_select, unlike features[idx], wants its index on the data's device
        order = torch.randperm(n, generator=gen).to(features.device)
        for i in range(0, n, batch):
            idx = order[i : i + batch]
            xb, yb = features.index_select(0, idx), labels.index_select(0, idx)  # = features[idx], faster
            grads = torch.autograd.grad(nn.functional.cross_entropy(net(xb), yb), params)
            with torch.no_grad():
                torch._foreach_add_(params, grads, alpha=-lr)
    return net.eval()


@dataclass
class Adversary:
    """A fitted adversary model with `predict(features [N, F]) -> classes [N]`."""

    kind: str
    model: object

    def predict(self, features: torch.Tensor) -> np.ndarray:
        if isinstance(self.model, nn.Module):
            with torch.no_grad():
                return self.model(features).argmax(1).cpu().numpy()
        return np.asarray(self.model.predict(features.cpu().numpy().astype(np.float64)))


def fit_adversary(
    kind: str,
    features: torch.Tensor,
    labels: torch.Tensor,
    n_classes: int,
    seed: int,
    stru_widths: Sequence[int],
    epochs: int,
    lr: float,
    batch: int,
) -> Adversary:
    """Train the adversary `kind` on standardised features (spec §3.1 models and hyper-parameters)."""
    if kind in ("stru-nn", "unkwn-nn"):
        torch.manual_seed(seed)
        widths = stru_widths if kind == "stru-nn" else UNKWN_WIDTHS
        net = mlp(features.shape[1], widths, n_classes).to(features.device)
        return Adversary(kind, train_classifier(net, features, labels, epochs, lr, batch, seed))
    x, y = features.cpu().numpy().astype(np.float64), labels.cpu().numpy()
    if len(np.unique(y)) < 2:  # sklearn refuses one-class training sets; the constant is the answer
        from sklearn.dummy import DummyClassifier

        return Adversary(kind, DummyClassifier(strategy="most_frequent").fit(x, y))
    if kind == "svm":
        from sklearn.svm import SVC

        return Adversary(kind, SVC(kernel="rbf", C=1.0, gamma="scale").fit(x, y))
    if kind == "rf":
        from sklearn.ensemble import RandomForestClassifier

        return Adversary(
            kind, RandomForestClassifier(n_estimators=120, random_state=seed, n_jobs=1).fit(x, y)
        )
    raise FedbenchError(f"adversary={kind}: use stru-nn, unkwn-nn, svm or rf")


# ------------------------------------------------------------------------------------ pools and runs

ZOO_CHOICES = (128, 256, 512, 1024, 2048)  # spec §4.5: each hidden width in 128..2048
ZOO_SEED = 0


def pool_indices(data, source: str, size: int, who: str) -> np.ndarray:
    """Training indices of the adversary's / defender's labelled pool.

    `disjoint` (default, spec §3.1): records no client holds (at or after scenario.train_size);
    `overlap`: the clients' own records (the paper's literal "same D_train", victims inside the pool).
    `size` > 0 keeps the first `size` of them.
    """
    if source == "disjoint":
        idx = np.asarray(data.unused_train(), dtype=np.int64)
        if len(idx) == 0:
            raise FedbenchError(
                f"{who}: pool=disjoint needs training records beyond scenario.train_size (all "
                f"{data.train_size} are held by clients); lower scenario.train_size or use pool=overlap"
            )
    else:
        idx = np.arange(data.train_size, dtype=np.int64)
    return idx[:size] if size else idx


def resolve_attribute(meta, name: str, who: str) -> tuple[str | None, str | None]:
    """(attribute, None) or (None, skip reason): '' means the dataset's first sensitive attribute."""
    names = list(meta.attribute_names)
    if not names:
        return None, f"{who} needs sensitive attributes; dataset '{meta.name}' has none"
    if not name:
        return names[0], None
    if name not in names:
        return (
            None,
            f"{who}: dataset '{meta.name}' has no attribute '{name}' (attributes: {', '.join(names)})",
        )
    return name, None


def infer(params, observation, model: nn.Module, meta, data, seed: int, device, defense=None) -> dict:
    """Train the adversary on its pool at the observed global weights and predict every victim.

    Returns a plain dict for AttackOutput: predictions (one per cohort client, in cohort order) and
    the details the metrics and the row need (attribute, the pool's majority class, dimensions).
    """
    who = "attribute-inference"
    attr, reason = resolve_attribute(meta, params.attribute, who)
    if reason:
        raise FedbenchError(reason)
    if data is None or data.scenario is None:
        raise FedbenchError(f"{who}: the runner did not bind the run's data (bind_data)")
    victims = observation.cohort or (observation,)
    state = {k: v.to(device) for k, v in observation.global_state.items()}
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    layout = layout_for(state, names, params.layers)
    window = pool_window(layout, params.max_features)
    idx = torch.as_tensor(pool_indices(data, params.pool, params.pool_size, who))
    bundle = data.bundle
    x, y = bundle.x_train[idx].to(device), bundle.y_train[idx].to(device)
    a = bundle.attr_train[attr][idx].to(device)
    model = model.to(device)
    model.train(observation.model_mode == "train")
    fmap = FeatureMap(layout, window).to(device)
    if params.train_on == "defended":  # the adaptive adversary (spec ambiguity #4)
        pooled = defended_pool_features(
            defense, data, idx.numpy(), model, state, layout, fmap, observation, seed
        )
        fmap.fit_pooled(pooled)
        with torch.no_grad():
            feats = fmap.standardise(pooled)
    else:
        flat = pool_updates(model, state, layout, x, y, data.scenario.loss, observation.kind, observation.lr)
        fmap.fit(flat)
        with torch.no_grad():
            feats = fmap(flat)
    with torch.no_grad():
        victim_flat = torch.stack(
            [layout.flatten({k: v.to(device) for k, v in o.shared.items()}) for o in victims]
        )
        victim_feats = fmap(victim_flat)
    n_classes = len(meta.attribute_names[attr])
    stru = tuple(params.stru_widths) or tuple(zoo_widths(1, ZOO_CHOICES, ZOO_SEED)[0])
    adversary = fit_adversary(
        params.adversary, feats, a, n_classes, seed, stru, params.epochs, params.lr, params.batch
    )
    pred = adversary.predict(victim_feats)
    return {
        "predictions": pred.astype(np.int64),
        "extra": {
            "attribute": attr,
            "adversary": params.adversary,
            "majority_class": int(np.bincount(a.cpu().numpy(), minlength=n_classes).argmax()),
            "n_classes": n_classes,
            "pool_size": len(idx),
            "pool_source": params.pool,
            "train_on": params.train_on,
            "features": fmap.dim,
            "pool_window": window,
            "victims": len(victims),
            "victim_clients": [int(o.client) for o in victims],
            "train_acc": float((adversary.predict(feats) == a.cpu().numpy()).mean()),
        },
    }
