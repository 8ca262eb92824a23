"""`recup-fl` (Cui et al., ASIA CCS '23; spec 000 §4.5-4.6): user-configurable adversarial perturbation
of the client update against attribute inference.

Each client names the sensitive attributes it protects. In the `update` hook, for each of them, the
client perturbs its update with FGSM steps that raise the loss of a zoo of substitute defender
classifiers (spec §4.5): P meta-iterations, each sampling Q zoo models, iterative FGSM (step eps/Q)
on Q-1 of them (meta-train, a simulated white-box attack), then one FGSM step of size eps on the
held-out model (meta-test, a simulated black-box attack); only the meta-test step is kept, so the
perturbation has L-infinity norm <= P * eps. Several attributes combine as Algorithm 1 line 23: each
attribute's perturbation is computed from the ORIGINAL update and the update sent is
g + sum_m gamma_m (g_m - g). `variant` selects the FGSM ablations of App. E instead.

Zoo: per attribute, `zoo` 3-hidden-layer MLPs (widths drawn from `widths`, spec §5.3: 20 models,
128..2048) over the max-pooled, standardised update (the attack's feature map, shared code), trained
with CE + SGD on the updates of the defender's labelled pool at the round's global weights
(`zoo_at=round`, spec default; `zoo_at=first` trains once at the first round's weights, the paper's
"zoo built before FL training"). The pool is the adversary's: records no client holds by default
(`pool=disjoint`), the clients' own with `pool=overlap`. Zoos are cached (in process and on disk).

Per-client configuration (`assign`): empty = every client protects all `attributes`; otherwise
`|`-separated groups cycled over client ids, each a `+`-joined subset of `attributes` or `none`,
e.g. `assign="race|sex"` (even clients race, odd clients sex; the paper's §6.4 half/half setting) or
`assign="race+sex|none"`. A client's gamma for an attribute is the one given for it in `gamma`
(default 1/M for M attributes; the paper uses 1 for one attribute, 0.5/0.5 for two).

Timing (Table 1): the per-round client cost is the perturbation; zoo training is a one-off per round
shared by all clients (and by cached runs), see benchmarks/bench_recup_cost.py. The perturbations of
many updates (a round's clients through `update_batch`, the adaptive adversary's pool) are computed
together by default (`fgsm=batched`: one batched backward per zoo member and FGSM step, 4x less CPU
per update at 40 updates, 12x at 400, benchmarks/bench_recup_batch.py); `fgsm=per-record` is the path
of one update at a time that built the committed attribute board. The two differ only where rounding
meets a quantity within rounding of zero (`_recup_core`), but a run amplifies such a difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from fedbench.attacks.attribute_inference import RECUP_PAPER
from fedbench.errors import FedbenchError
from fedbench.plugin import Defense, HookContext, RunData
from fedbench.registry import register_defense
from fedbench.spec.params import param

VARIANTS = ("meta", "one-step", "average", "iterative", "momentum")
_META_START_HELP = "meta-train start: the current output (Eq. 8, Alg. 1) or the original update (Eq. 5)"
_FGSM_HELP = (
    "FGSM of many updates: batched (one backward per zoo member and step over all of them) or per-record "
    "(one update at a time, the committed attribute board's path); equal but where rounding meets zero"
)


def parse_assign(assign: str, attributes: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The attribute groups of `assign` ('' = one group with all attributes), validated."""
    if not assign.strip():
        return [tuple(attributes)]
    groups = []
    for part in assign.split("|"):
        part = part.strip()
        names = () if part in ("none", "") else tuple(n.strip() for n in part.split("+") if n.strip())
        unknown = [n for n in names if n not in attributes]
        if unknown:
            raise FedbenchError(
                f"recup-fl: assign={assign!r} names {', '.join(unknown)}, not among attributes="
                f"{','.join(attributes)}; list every protected attribute in attributes"
            )
        groups.append(names)
    return groups


@register_defense("recup-fl", "recup")
class RecUPFL(Defense):
    """RecUP-FL: FGSM perturbation of the update against a zoo of attribute classifiers, per client choice."""

    paper = RECUP_PAPER
    version = "1"
    key_optional = ("fgsm",)  # added later: at its default the run ids stay those of before

    @dataclass(frozen=True)
    class Params:
        attributes: tuple[str, ...] = param(
            (), "attributes to protect; empty = the dataset's first (adult: race)"
        )
        gamma: tuple[float, ...] = param((), "weight per attribute (Alg. 1 line 23); empty = 1/M each", min=0)
        eps: float = param(0.01, "FGSM budget epsilon per step (paper's convergence setting 0.01)", min=0)
        p: int = param(10, "meta-iterations P (paper 10)", min=1)
        q: int = param(5, "zoo models sampled per meta-iteration Q (paper 5)", min=1)
        zoo: int = param(20, "defender models per attribute (paper 20)", min=1)
        widths: tuple[int, ...] = param(
            (128, 256, 512, 1024, 2048), "hidden widths the zoo draws from (3 hidden layers)", min=1
        )
        epochs: int = param(80, "zoo training epochs, CE + SGD (paper 80)", min=1)
        lr: float = param(0.01, "zoo SGD learning rate (paper 0.01)", min=0, min_open=True)
        batch: int = param(64, "zoo training batch size (unspecified; 64)", min=1)
        variant: Literal["meta", "one-step", "average", "iterative", "momentum"] = param(
            "meta", "FGSM scheme: RecUP-FL's meta alternation or an App. E ablation"
        )
        mu: float = param(0.9, "momentum of the momentum variant (paper 0.9)", min=0, max=1)
        meta_start: Literal["current", "original"] = param("current", _META_START_HELP)
        zoo_at: Literal["round", "first"] = param(
            "round", "train the zoo at each round's global weights, or once at the first round's"
        )
        pool: Literal["disjoint", "overlap"] = param(
            "disjoint", "defender pool: records no client holds, or the clients' own"
        )
        pool_size: int = param(0, "records in the defender pool; 0 = all available", min=0)
        layers: str = param("all", "parameters the zoo reads and the perturbation touches (as the attack's)")
        max_features: int = param(4096, "max-pool window chosen so the feature dimension is <= this", min=1)
        assign: str = param("", "per-client attribute groups, '|'-separated, cycled by client id (see docs)")
        fgsm: Literal["batched", "per-record"] = param("batched", _FGSM_HELP)

    def __init__(self, params: Any = None):
        super().__init__(params)
        p = self.params
        if p.gamma and p.attributes and len(p.gamma) != len(p.attributes):
            raise FedbenchError(
                f"recup-fl: gamma has {len(p.gamma)} values for {len(p.attributes)} attributes; "
                "give one weight per attribute (or none for 1/M)"
            )
        if p.attributes:
            parse_assign(p.assign, p.attributes)
        self._data: RunData | None = None
        self._state: dict[str, Any] = {}

    # ---------------------------------------------------------------------------------- configuration
    def bind_data(self, data: RunData) -> None:
        from fedbench.attacks._attribute_core import resolve_attribute

        meta = data.bundle.meta
        attributes = self.params.attributes
        if not attributes:
            name, reason = resolve_attribute(meta, "", self.name)
            if reason:
                raise FedbenchError(reason)
            attributes = (name,)
        for a in attributes:
            reason = resolve_attribute(meta, a, self.name)[1]
            if reason:
                raise FedbenchError(reason)
        gammas = self.params.gamma or tuple(1.0 / len(attributes) for _ in attributes)
        if len(gammas) != len(attributes):
            raise FedbenchError(
                f"recup-fl: gamma has {len(gammas)} values for {len(attributes)} attributes; "
                "give one weight per attribute"
            )
        self._data = data
        self._attributes = attributes
        self._gamma = dict(zip(attributes, gammas, strict=True))
        self._groups = parse_assign(self.params.assign, attributes)

    def protected(self, client: int) -> tuple[str, ...]:
        """The attributes `client` protects (its group of `assign`)."""
        return self._groups[client % len(self._groups)]

    def _client_label(self, client: int, attr: str) -> int:
        from fedbench.attacks._attribute_core import client_label

        idx = list(self._data.client_indices[client])
        return client_label(self._data.bundle.attr_train[attr][idx].numpy())

    # ----------------------------------------------------------------------------------------- zoo
    def _zoos(self, ctx: HookContext, attrs: tuple[str, ...]) -> tuple[Any, dict[str, list]]:
        """(layout, {attribute: zoo}) at this round's global weights (or the first round's)."""
        import copy

        import torch

        from fedbench.attacks._attribute_core import (
            layout_for,
            pool_indices,
            pool_updates,
            pool_window,
            state_digest,
        )
        from fedbench.defenses._recup_core import ZooSpec, build_zoo, cached_zoo

        p = self.params
        state = ctx.global_state
        if p.zoo_at == "first":
            state = self._state.setdefault("first", {k: v.detach().clone() for k, v in state.items()})
        names = [n for n, t in ctx.model.named_parameters() if t.requires_grad]
        layout = layout_for(state, names, p.layers)
        window = pool_window(layout, p.max_features)
        digest = state_digest(state)
        data, meta, sc = self._data, self._data.bundle.meta, ctx.scenario
        idx = pool_indices(data, p.pool, p.pool_size, self.name)
        kind = "gradient" if sc.protocol == "fedsgd" else "delta"
        zoos = {}
        for attr in attrs:
            spec = ZooSpec(p.zoo, tuple(p.widths), p.epochs, p.lr, p.batch, len(meta.attribute_names[attr]))
            key = {
                "state": digest,
                "attribute": attr,
                "dataset": meta.name,
                "pool": [p.pool, int(idx[0]), int(idx[-1]), len(idx)],
                "layers": list(layout.names),
                "window": window,
                "kind": kind,
                "lr": sc.lr,
                "loss": sc.loss,
                "mode": sc.model_mode,
                "zoo": [spec.size, list(spec.widths), spec.epochs, spec.lr, spec.batch, spec.n_classes],
            }

            def compute(attr=attr, spec=spec):
                device = next(iter(state.values())).device
                bundle = data.bundle
                t_idx = torch.as_tensor(idx)
                model = copy.deepcopy(ctx.model)
                model.train(sc.model_mode == "train")
                cached = self._state.get("flat")  # the pool updates of this round, shared by attributes
                if cached is not None and cached[0] == digest:
                    flat = cached[1]
                else:
                    x, y = bundle.x_train[t_idx].to(device), bundle.y_train[t_idx].to(device)
                    flat = pool_updates(model, state, layout, x, y, sc.loss, kind, sc.lr)
                    self._state["flat"] = (digest, flat)
                labels = bundle.attr_train[attr][t_idx].to(device)
                return build_zoo(flat, labels, layout, window, spec, attr)

            zoos[attr] = cached_zoo(key, compute)
        return layout, zoos

    # ------------------------------------------------------------------------------------- the hooks
    def update(self, delta, ctx: HookContext):
        return self.update_batch([delta], [ctx])[0]

    def update_batch(self, deltas, ctxs):
        """The perturbed updates of several clients (`fgsm`: together, or one at a time)."""
        if self._data is None:
            raise FedbenchError("recup-fl: the simulation did not bind the run's data (bind_data)")
        if self.params.eps == 0:
            return list(deltas)
        if self.params.fgsm == "per-record":
            return [self._update_one(d, c) for d, c in zip(deltas, ctxs, strict=True)]
        return self._update_batched(deltas, ctxs)

    def _update_one(self, delta, ctx: HookContext):
        """One client's update, one FGSM backward at a time (`fgsm=per-record`)."""
        from fedbench.defenses._recup_core import perturb

        attrs = self.protected(ctx.client)
        if not attrs:
            return delta
        p = self.params
        layout, zoos = self._zoos(ctx, attrs)
        g = layout.flatten(delta)
        peb = 0.0
        for attr in attrs:
            label = self._client_label(ctx.client, attr)
            g_m = perturb(g, label, zoos[attr], p.eps, p.p, p.q, p.variant, ctx.generator, p.mu, p.meta_start)
            peb = peb + self._gamma[attr] * (g_m - g)
        out = dict(delta)
        out.update(layout.unflatten(g + peb))
        return out

    def _update_batched(self, deltas, ctxs):
        """All clients' updates at once (`fgsm=batched`): each client's zoo members are drawn from its
        own generator first, in `_update_one`'s order (attribute by attribute), then the updates that
        protect the same attribute against the same zoo are perturbed together (`perturb_batch`) and
        combined per client as `_update_one` combines them."""
        import torch

        from fedbench.defenses._recup_core import draw_members, perturb_batch

        p = self.params
        zoos_of: dict[tuple, tuple] = {}  # (received state, attributes) -> (layout, zoos), once per batch
        jobs: list[_Job] = []
        for i, (delta, ctx) in enumerate(zip(deltas, ctxs, strict=True)):
            attrs = self.protected(ctx.client)
            if not attrs:
                continue
            key = (id(ctx.global_state), attrs)
            if key not in zoos_of:
                zoos_of[key] = self._zoos(ctx, attrs)
            layout, zoos = zoos_of[key]
            draws = {a: draw_members(len(zoos[a]), p.q, p.p, p.variant, ctx.generator) for a in attrs}
            labels = {a: self._client_label(ctx.client, a) for a in attrs}
            jobs.append(_Job(i, attrs, layout, zoos, layout.flatten(delta), draws, labels))
        together: dict[tuple, list[_Job]] = {}  # (attribute, zoo) -> the updates perturbed in one batch
        for job in jobs:
            for a in job.attrs:
                together.setdefault((a, id(job.zoos[a])), []).append(job)
        for (a, _), batch in together.items():
            g = torch.stack([job.flat for job in batch])
            labels = torch.tensor([job.labels[a] for job in batch], device=g.device)
            draws = [job.draws[a] for job in batch]
            g_m = perturb_batch(g, labels, batch[0].zoos[a], p.eps, draws, p.variant, p.mu, p.meta_start)
            for row, job in enumerate(batch):
                job.perturbed[a] = g_m[row]
        out = list(deltas)
        for job in jobs:
            peb = 0.0
            for a in job.attrs:
                peb = peb + self._gamma[a] * (job.perturbed[a] - job.flat)
            out[job.position] = dict(deltas[job.position])
            out[job.position].update(job.layout.unflatten(job.flat + peb))
        return out


@dataclass
class _Job:
    """One client's update in a batch: where it goes, what it protects, its draws and its results."""

    position: int
    attrs: tuple[str, ...]
    layout: Any
    zoos: dict[str, list]
    flat: Any
    draws: dict[str, list[list[int]]]
    labels: dict[str, int]
    perturbed: dict[str, Any] = field(default_factory=dict)
