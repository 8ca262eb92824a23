"""A victim batch: one attack run over several victims' observations (`RunSpec.victims`).

`run_victims` returns one `AttackOutput` per observation, in order, each what a run of that victim alone
returns (up to floating-point rounding where the work is vectorised):

- The gradient-inversion attacks whose `run` is the common `run_inversion` (dlg, idlg, cpl,
  inverting-gradients) reconstruct every victim in one optimisation (`run_inversion_victims`): the
  candidates are victims x restarts (victim-major), `VictimMatcher` gives each candidate its victim's
  target gradient, pruning mask, cosine norm and fixed labels, and the best restart is chosen per
  victim. Each victim draws its labels' dummy inputs, initial images and label logits from a fresh
  attack generator, as its own run does (`new_generator`), so every candidate starts where it would
  alone. The optimisers are per candidate: signed Adam is elementwise and its plateau schedule decides
  per candidate (a stopped candidate's step size is 0), and L-BFGS keeps per-candidate state; its one
  rule that reads every candidate, stop-on-success (CPL), is applied per victim here
  (`_lbfgs_grouped`): a victim whose restarts all succeeded stops where its own run would stop, while
  the others go on, and candidates that are not moving are not evaluated.
- Everything else runs once per victim inside the one run, exactly as that victim's own run would (a
  fresh model from the run's seed, a fresh attack generator): attacks with a `run` of their own (the
  adaptive attacks loda-adaptive and mixup-decode, fc-leakage, trap-weights, sdan, plugins), victims that
  received different models, models that draw random numbers in their forward pass (dropout in train
  mode: one batch would draw them differently), signed Adam with stop-on-success (one rule for all
  candidates). Victims of different batch sizes are vectorised in groups of one size.

The extras of a vectorised victim describe its own candidates (restart objectives, best restart,
labels, pruning, iterations to success, L-BFGS iterations), except `evaluations` and, for signed Adam,
`iterations` and `stopped`, which count the shared optimisation. Each output of a batch says how it was
computed in `extra["victim_batch"]` (`VECTORISED`, `ALONE` or `loop: <reason>`).

Cost: a batch shares per-operation overhead, not arithmetic. Each candidate still builds and compares
its own parameter gradient, so what a batch saves is torch's dispatch around those tensors and
L-BFGS's bookkeeping, which `_lbfgs_grouped` does once per step for every candidate: each keeps its
curvature pairs in a ring of its own (`_lbfgs` keeps one list of pairs for all candidates, longer the
further their updates drift apart), read by age in one gather. `VictimMatcher.match` takes the
per-candidate sums through `_RowSum`, whose backward scales each candidate's entries by its scalar
instead of autograd's expand-then-multiply (half an evaluation on the board's MLP). Figures:
docs/benchmarks.md.

Why this lives beside `_inversion` rather than in it: the gradient-pruning defense's code digest covers
`fedbench.attacks._inversion` (gradient_pruning.py imports its DLG citation from gradient_matching), so an
edit there would recompute every cached FL training with gradient pruning. `VictimMatcher` and
`_lbfgs_grouped` generalise `GradientMatcher` and `_inversion._lbfgs` (the same values, operation for
operation: tests/test_victim_batches.py), and can move into `_inversion` the next time its trainings
are recomputed anyway.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from fedbench.attacks._inversion import (
    GradientMatcher,
    Reconstruction,
    _fail,
    _no_success,
    _record_success,
    _success_list,
    box_bounds,
    initial_images,
    prepare_model,
    reconstruct_batched,
    resolve_pruning,
    restarts_pay_as_one_batch,
    target_gradient,
    to_pixels,
    update_as_gradient,
)
from fedbench.errors import RunFailure

# how a victim's output was computed (its `extra["victim_batch"]`): with others in one optimisation, on
# its own as the only victim of its simulation (or of its batch size), or in a loop (`loop: <reason>`)
VECTORISED = "vectorised"
ALONE = "alone"


def run_victims(
    attack: Any,
    observations: Sequence[Any],
    new_model: Callable[[], nn.Module],
    meta: Any,
    new_generator: Callable[[], Any],
    device: Any,
) -> list[Any]:
    """Each observation's `AttackOutput`, in order (see the module docstring).

    `new_model()` builds the model as a run of one victim does before its attack (from the run's seed),
    `new_generator()` that run's attack generator: a victim attacked on its own gets fresh ones.
    """
    if len(observations) == 1:  # one victim: exactly its own run
        out = attack.run(observations[0], new_model(), meta, new_generator(), device)
        out.extra["victim_batch"] = ALONE
        return [out]
    model = new_model()
    reason = loop_reason(attack, observations, model, meta)
    outputs: list[Any] = [None] * len(observations)
    if reason is None:
        for group in _by_batch_size(observations):
            chosen = [observations[i] for i in group]
            if len(group) == 1:
                done = run_victims(attack, chosen, new_model, meta, new_generator, device)
            else:  # a fresh model, as each victim's run has (the one checked above may be taken)
                done = run_inversion_victims(
                    attack, chosen, model or new_model(), meta, new_generator, device
                )
                model = None
            for i, out in zip(group, done, strict=True):
                outputs[i] = out
    else:
        outputs = [attack.run(obs, new_model(), meta, new_generator(), device) for obs in observations]
    for out in outputs:
        out.extra.setdefault("victim_batch", VECTORISED if reason is None else f"loop: {reason}")
    return outputs


def loop_reason(attack: Any, observations: Sequence[Any], model: nn.Module, meta: Any) -> str | None:
    """Why `attack` runs once per victim on these observations, or None when it is vectorised."""
    from fedbench.attacks.inversion_base import InversionAttack

    if not isinstance(attack, InversionAttack) or type(attack).run is not InversionAttack.run:
        return f"{attack.name} has a run of its own"
    first = observations[0]
    if any(not _same_state(o.global_state, first.global_state) for o in observations[1:]):
        return "the victims received different models"
    if any(o.model_mode != first.model_mode for o in observations[1:]):
        return "the victims' models are in different modes"
    if first.model_mode == "train" and any(
        isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules()
    ):
        return "the model draws random numbers in its forward pass (dropout in train mode)"
    cfg = attack.settings(meta)
    if cfg.get("stop_on_success") and cfg["optimizer"] != "lbfgs":
        return "signed Adam's stop-on-success stops every candidate at once"
    return None


def _same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    if a is b:
        return True
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _by_batch_size(observations: Sequence[Any]) -> list[list[int]]:
    """Indices of the observations grouped by batch size, groups in order of their first member."""
    groups: dict[int, list[int]] = {}
    for i, obs in enumerate(observations):
        groups.setdefault(len(obs.y_true), []).append(i)
    return list(groups.values())


# ------------------------------------------------------------------------------------ the matcher


class VictimMatcher(GradientMatcher):
    """A `GradientMatcher` whose candidates belong to several victims: candidates are victims x
    `restarts`, victim-major, and candidate c is matched against its victim's target gradient (with its
    victim's pruning mask and, for the cosine cost, its victim's target norm). With fixed labels
    (`labels`, one [B] tensor per victim), candidate c's gradient is taken at its victim's labels: the
    `y` an optimiser passes is then a placeholder of the right shape and is not read.
    """

    def __init__(
        self,
        model: nn.Module,
        targets: Sequence[dict[str, torch.Tensor]],
        *,
        restarts: int,
        labels: Sequence[torch.Tensor] | None = None,
        cost: str = "l2",
        pruning: Sequence[bool] = (),
        weights: str = "equal",
        tv_weight: float = 0.0,
    ):
        super().__init__(model, targets[0], cost=cost, weights=weights, tv_weight=tv_weight)  # type: ignore[arg-type]
        if any(set(t) != set(targets[0]) for t in targets):
            raise RunFailure("the victims' observations share different tensors")
        device = self.targets[0].device
        pruning = list(pruning) or [False] * len(targets)
        per_victim = [[t[k].to(device) for k in self.names] for t in targets]
        self.victims, self.restarts = len(targets), int(restarts)
        self.pruning_aware = any(pruning)
        self.targets = [self._spread(torch.stack([v[j] for v in per_victim])) for j in range(len(self.names))]
        self.masks = None
        if self.pruning_aware:
            masks = [
                [(t != 0).to(t.dtype) if on else torch.ones_like(t) for t in v]
                for v, on in zip(per_victim, pruning, strict=True)
            ]
            self.masks = [self._spread(torch.stack([m[j] for m in masks])) for j in range(len(self.names))]
        if cost == "cosine":  # each victim's norm, summed as GradientMatcher sums one victim's
            norms = [
                sum(w * ((t * t).sum()) for w, t in zip(self.weights, v, strict=True)).sqrt()
                for v in per_victim
            ]
            self.target_norm = self._spread(torch.stack(norms))
        self.labels = None if labels is None else self._spread(torch.stack([y.to(device) for y in labels]))

    def _spread(self, per_victim: torch.Tensor) -> torch.Tensor:
        """[V, ...] -> [V * restarts, ...]: every candidate gets its victim's row."""
        return per_victim.repeat_interleave(self.restarts, 0)

    def subset(self, rows: Sequence[int]) -> VictimMatcher:
        """The matcher of candidates `rows` alone (same model; their targets, masks, norms, labels)."""
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.targets[0].device)
        self._single_model()  # made once, shared by the subsets (each runs one candidate through it)
        out = copy.copy(self)
        out.targets = [t[index] for t in self.targets]
        out.masks = None if self.masks is None else [m[index] for m in self.masks]
        if self.cost == "cosine":
            out.target_norm = self.target_norm[index]
        out.labels = None if self.labels is None else self.labels[index]
        return out

    def match(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """`GradientMatcher.match`, the same values, with the per-candidate sums of products whose
        backward broadcasts each candidate's scalar over its gradient done by `_RowSum` (autograd's own
        backward of a sum followed by pow or mul expands the [R] gradient to every entry first, and took
        half of an evaluation's time on the 200k-entry layer of the board's MLP)."""
        masks = self.masks or [None] * len(grads)
        if self.cost == "l2":
            out = 0
            for w, g, t, m in zip(self.weights, grads, self.targets, masks, strict=True):
                d = g - t
                if m is not None:
                    d = d * m
                out = out + w * _RowSum.apply(d, d)
            return out
        dot, gn = 0, 0
        for w, g, t, m in zip(self.weights, grads, self.targets, masks, strict=True):
            if m is not None:
                g = g * m
            dot = dot + w * _RowSum.apply(g, t)
            gn = gn + w * _RowSum.apply(g, g)
        return 1 - dot / (gn.sqrt() * self.target_norm)

    def gradients(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        if self.labels is not None:
            if self.labels.shape[0] != x.shape[0]:
                raise ValueError(f"{x.shape[0]} candidates for a matcher of {self.labels.shape[0]}")
            y = self.labels
        return super().gradients(x, y)


class _RowSum(torch.autograd.Function):
    """Per candidate (row) the sum of a * b over its entries: (a * b).flatten(1).sum(1), as
    `GradientMatcher.match` computes it (for a is b, a.pow(2) is a * a). Its backward multiplies each
    candidate's rows by its scalar directly (b * 2 grad for the square; b * grad, a * grad for a
    product with a target that needs no gradient); the values are the ones autograd gives, a power of
    two scaling being exact."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.square = a is b
        ctx.save_for_backward(a, b)
        return (a.pow(2) if ctx.square else a * b).flatten(1).sum(1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        a, b = ctx.saved_tensors
        if ctx.square:
            return a * (2 * grad).view(-1, *[1] * (a.dim() - 1)), None
        per_row = grad.view(-1, *[1] * (a.dim() - 1))
        grad_a = b * per_row if ctx.needs_input_grad[0] else None
        grad_b = a * per_row if ctx.needs_input_grad[1] else None
        return grad_a, grad_b


# ------------------------------------------------------------------------------------ the attack


class _Setup(NamedTuple):
    """One victim's part of `run_inversion_victims`: what its own run sets up before optimising."""

    obs: Any
    target: dict[str, torch.Tensor]
    note: str
    guess: Any  # label_recovery.LabelGuess
    sparsified: bool
    prune: bool
    zero_frac: float
    x0: torch.Tensor
    logits0: torch.Tensor | None


def run_inversion_victims(
    self: Any,
    observations: Sequence[Any],
    model: nn.Module,
    meta: Any,
    new_generator: Callable[[], Any],
    device: Any,
) -> list[Any]:
    """`run_inversion` over several victims of one batch size at once: one output per observation."""
    from fedbench.attacks.label_recovery import recover_labels
    from fedbench.plugin import AttackOutput

    reason = self.check_meta(meta)
    if reason:
        raise RunFailure(reason)
    device = torch.device(device) if device is not None else torch.device("cpu")
    p = self.params
    cfg = self.settings(meta)
    first = observations[0]
    model = prepare_model(model, first.global_state, first.model_mode, device)
    batch = int(len(first.y_true))  # the batch size is known; the labels are not
    shape = tuple(int(s) for s in meta.input_shape)
    R = int(p.restarts)
    victims = []
    for obs in observations:  # each victim's setup, from a fresh generator, in its own run's order
        target, note = target_gradient(obs.kind, obs.shared, obs.lr, obs.local_steps)
        generator = new_generator()
        guess = recover_labels(
            p.labels,
            model=model,
            grads=target,
            num_classes=meta.num_classes,
            batch=batch,
            y_true=obs.y_true if p.labels == "known" else None,
            input_shape=shape,
            generator=generator,
            device=device,
        )
        sparsified = bool(getattr(obs, "sparsified", False))
        prune, zero_frac = resolve_pruning(p.pruning_aware, sparsified, list(target.values()))
        x0 = initial_images(cfg["init"], R, batch, shape, meta, generator, device)
        logits0 = None
        if guess.labels is None:
            logits0 = torch.randn((R, batch, meta.num_classes), generator=generator).to(device)
        victims.append(_Setup(obs, target, note, guess, sparsified, prune, zero_frac, x0, logits0))
    fixed = [v.guess.labels is not None for v in victims]
    if any(fixed) and not all(fixed):
        raise RunFailure(f"{self.name}: label recovery gave labels for some victims only")
    matcher = VictimMatcher(
        model,
        [v.target for v in victims],
        restarts=R,
        labels=[v.guess.labels for v in victims] if all(fixed) else None,
        cost=cfg["cost"],
        pruning=[v.prune for v in victims],
        weights=cfg.get("weights", "equal"),
        tv_weight=cfg.get("tv_weight", 0.0),
    )
    x0 = torch.cat([v.x0 for v in victims])
    logits0 = None if all(fixed) else torch.cat([v.logits0 for v in victims])
    pays = restarts_pay_as_one_batch(matcher, x0[0])
    kw: dict[str, Any] = dict(
        optimizer=cfg["optimizer"],
        iterations=cfg["iterations"],
        lr=cfg["lr"],
        box=box_bounds(meta, shape[0], device) if cfg.get("boxed", True) else None,
        lr_decay=cfg.get("lr_decay", True),
        lbfgs_max_iter=cfg.get("lbfgs_max_iter", 20),
        lbfgs_history=cfg.get("lbfgs_history", 100),
        success_threshold=cfg.get("success_threshold"),
        stop_on_success=cfg.get("stop_on_success", False),
        plateau=cfg.get("plateau"),
        name=self.name,
    )
    if pays:
        rec, its = _reconstruct(matcher, x0, logits0, R, kw)
    else:  # one candidate at a time, as a victim's restarts run where a batch does not pay
        parts = [
            _reconstruct(matcher.subset([c]), x0[c : c + 1], _row(logits0, c), 1, kw) for c in range(len(x0))
        ]
        rec, its = _joined([r for r, _ in parts]), [i for _, c_its in parts for i in c_its]
    outputs = []
    for v, (obs, _target, note, guess, sparsified, prune, zero_frac, _x0, _logits0) in enumerate(victims):
        rows = slice(v * R, (v + 1) * R)
        objective = rec.objective[rows]
        best = int(torch.argmin(objective).item())
        c = v * R + best
        images = to_pixels(rec.x[c], meta)
        if not bool(torch.isfinite(images).all()):
            raise _fail(self.name, its[c])
        labels = guess.labels if guess.labels is not None else rec.label_logits[c].argmax(-1)
        objectives = [float(o) if math.isfinite(float(o)) else None for o in objective.tolist()]
        extra: dict[str, Any] = {
            "iterations": int(its[c]),
            "evaluations": int(rec.evaluations),
            "final_objective": objectives[best],
            "restart_objectives": objectives,
            "restarts": R,
            "restarts_batched": R == 1 or pays,
            "best_restart": best,
            "diverged_restarts": int(sum(rec.diverged[rows])),
            "cost": cfg["cost"],
            "optimizer": cfg["optimizer"],
            "init": cfg["init"],
            "tv_weight": float(cfg.get("tv_weight", 0.0)),
            "label_strategy": guess.strategy,
            "labels_known": p.labels == "known",
            "bn_stats_known": False,
            "model_mode": obs.model_mode,
            "observation_kind": obs.kind,
            "observation_note": note,
            "pruning_aware": bool(prune),
            "observation_sparsified": sparsified,
            "observed_zero_fraction": round(float(zero_frac), 6),
            "matched_tensors": len(matcher.names),
        }
        if cfg.get("plateau") is not None:
            extra["schedule"] = cfg.get("schedule", "plateau")
            extra["stopped"] = rec.stopped
            extra["lr_decays"] = rec.lr_decays[c]
        as_gradient = update_as_gradient(obs.kind, obs.local_steps)
        if as_gradient is not None:
            extra["update_as_gradient"] = as_gradient
        if cfg.get("success_threshold") is not None:
            success_at = rec.iterations_to_success[c]
            extra["success_threshold"] = float(cfg["success_threshold"])
            extra["success"] = success_at is not None
            extra["iterations_to_success"] = success_at
        outputs.append(
            AttackOutput(
                images=images.detach().cpu().numpy().astype("float32"),
                labels=labels.detach().cpu().numpy().astype("int64"),
                extra=extra,
            )
        )
    return outputs


def _row(t: torch.Tensor | None, c: int) -> torch.Tensor | None:
    return None if t is None else t[c : c + 1]


def _reconstruct(
    matcher: VictimMatcher, x0: torch.Tensor, logits0: torch.Tensor | None, restarts: int, kw: dict[str, Any]
) -> tuple[Reconstruction, list[int]]:
    """One optimisation of the matcher's candidates (groups of `restarts` per victim), and each
    candidate's iteration count."""
    labels = None if matcher.labels is None else matcher.labels[0]  # a placeholder: the matcher's are used
    if kw["optimizer"] == "lbfgs" and x0.shape[0] > restarts:
        return _lbfgs_by_victim(matcher, x0, logits0, restarts, kw)
    rec = reconstruct_batched(matcher, x0, labels=labels, label_logits0=logits0, **kw)
    return rec, [rec.iterations] * x0.shape[0]


def _joined(parts: list[Reconstruction]) -> Reconstruction:
    """Candidates optimised one at a time, as one `Reconstruction` (as `reconstruct_restarts` joins)."""
    logits = None if parts[0].label_logits is None else torch.cat([p.label_logits for p in parts])
    return Reconstruction(
        torch.cat([p.x for p in parts]),
        logits,
        torch.cat([p.objective for p in parts]),
        max(p.iterations for p in parts),
        max(p.evaluations for p in parts),
        [s for p in parts for s in p.iterations_to_success],
        [d for p in parts for d in p.diverged],
        stopped="converged" if all(p.stopped == "converged" for p in parts) else "budget",
        lr_decays=[d for p in parts for d in p.lr_decays],
    )


# ------------------------------------------------------------------------------- L-BFGS by victim


def _lbfgs_by_victim(
    matcher: VictimMatcher, x0: torch.Tensor, logits0: torch.Tensor | None, restarts: int, kw: dict[str, Any]
) -> tuple[Reconstruction, list[int]]:
    """`reconstruct_batched`'s L-BFGS branch with the candidates grouped by victim (`restarts` each)."""
    R = x0.shape[0]
    shape_x = x0.shape
    nx = x0[0].numel()
    parts = [x0.reshape(R, -1)]
    if logits0 is not None:
        shape_l = logits0.shape
        parts.append(logits0.reshape(R, -1))
    z = torch.cat(parts, 1).detach().clone()
    y_fixed = matcher.labels

    latest: list[Any] = [None, None]  # the last subset's rows and matcher (the same rows repeat)

    def closure(zz: torch.Tensor, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Objective and gradient of the candidates `rows` (None: all) at `zz` (those rows only)."""
        m = matcher
        if rows is not None:
            key = tuple(rows.tolist())
            if latest[0] != key:
                latest[:] = [key, matcher.subset(key)]
            m = latest[1]
        zz = zz.detach().requires_grad_(True)
        with torch.enable_grad():
            x = zz[:, :nx].reshape(len(zz), *shape_x[1:])
            if y_fixed is not None:
                y = y_fixed if rows is None else y_fixed[rows]
            else:
                y = zz[:, nx:].reshape(len(zz), *shape_l[1:]).softmax(-1)
            obj = m.objective(x, y)
            (g,) = torch.autograd.grad(obj.sum(), zz)
        return obj.detach(), g.detach()

    groups = torch.arange(R, device=z.device) // restarts
    zf, obj, its, evals, success, dead = _lbfgs_grouped(
        closure,
        z,
        groups,
        kw["iterations"],
        kw["lr"],
        kw["lbfgs_max_iter"],
        kw["lbfgs_history"],
        kw["success_threshold"],
        kw["stop_on_success"],
        kw["name"],
    )
    x = zf[:, :nx].reshape(shape_x)
    logits = zf[:, nx:].reshape(shape_l) if logits0 is not None else None
    box = kw["box"]
    if box is not None:
        x = torch.maximum(torch.minimum(x, box[1]), box[0])
    return Reconstruction(x, logits, obj, max(its), evals, success, dead), its


def _lbfgs_grouped(
    closure: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    z: torch.Tensor,
    groups: torch.Tensor,
    iterations: int,
    lr: float,
    max_iter: int,
    history: int,
    success_threshold: float | None,
    stop_on_success: bool,
    name: str,
):
    """`_inversion._lbfgs` whose candidates come in groups (`groups`: a group id per row, 0..G-1), each
    group stopping as `_lbfgs` run on that group alone stops: when all its candidates diverged, or (with
    `stop_on_success`) when each succeeded or diverged. A stopped group takes no more steps, and neither
    its candidates nor diverged ones are evaluated again (`closure(z, rows)` evaluates the others):
    `_lbfgs` evaluates them and ignores what it gets, a stopped candidate's value at the point it stays
    at being one it has seen. Returns what `_lbfgs` returns, with the iterations per candidate (its
    group's) in place of one count; the run fails when a group never had a finite objective, as its own
    run would. With one group and no diverged candidate this is `_lbfgs` (tested)."""
    tol_grad, tol_change = 1e-7, 1e-9
    max_eval = max_iter * 5 // 4  # torch's default max_eval
    R = z.shape[0]
    G = int(groups.max()) + 1
    dev, dt = z.device, z.dtype
    n_iter = torch.zeros(R, dtype=torch.long, device=dev)
    d = torch.zeros_like(z)
    t = torch.zeros(R, dtype=dt, device=dev)
    prev_g = torch.zeros_like(z)
    prev_loss = torch.zeros(R, dtype=dt, device=dev)
    h_diag = torch.ones(R, dtype=dt, device=dev)
    # the curvature pairs, per candidate a ring of `history` slots (the newest replaces the oldest): the
    # pairs `_lbfgs` keeps in one list shared by every candidate (each slot valid for some), whose length
    # grows with how far the candidates' updates drift apart, and whose recursion costs per slot
    H = int(history)
    S = torch.zeros((R, H, z.shape[1]), dtype=dt, device=dev)
    Y = torch.zeros_like(S)
    RHO = torch.zeros((R, H), dtype=dt, device=dev)  # 0 in a slot never written: it contributes nothing
    pos = torch.zeros(R, dtype=torch.long, device=dev)  # the slot the next pair goes to
    count = torch.zeros(R, dtype=torch.long, device=dev)  # pairs held (at most H)
    ring = torch.arange(R, device=dev)[:, None] * H  # row offsets in the flattened [R * H, n] views
    # (the recursion below reads each candidate's pairs by age from one gather per step and does
    # `_lbfgs`'s arithmetic, operation for operation, once per age rather than once per shared slot)
    dead = torch.zeros(R, dtype=torch.bool, device=dev)
    stopped = torch.zeros(R, dtype=torch.bool, device=dev)  # the candidate's group has stopped
    stopped_at = torch.full((R,), -1, dtype=torch.long, device=dev)
    success = _no_success(R, dev)
    evals = 0
    loss = torch.zeros(R, dtype=dt, device=dev)
    done_iters = 0

    best_loss = torch.full((R,), math.inf, dtype=dt, device=dev)
    best_z = z.clone()

    def whole_groups(flag: torch.Tensor) -> torch.Tensor:
        """Per candidate: whether `flag` holds for every candidate of its group."""
        missing = torch.zeros(G, dtype=torch.long, device=dev).index_add_(0, groups, (~flag).long())
        return (missing == 0)[groups]

    def keep_best(obj: torch.Tensor, zz: torch.Tensor) -> None:
        nonlocal best_loss, best_z
        better = ~dead & torch.isfinite(obj) & (obj < best_loss)
        if bool(better.any()):
            best_loss = torch.where(better, obj.detach(), best_loss)
            best_z = torch.where(better[:, None], zz.detach(), best_z)

    def check(obj: torch.Tensor, gz: torch.Tensor, zz: torch.Tensor, snapshot: torch.Tensor, i: int) -> None:
        nonlocal dead
        bad = ~(torch.isfinite(obj) & torch.isfinite(gz).all(1) & torch.isfinite(zz).all(1)) & ~dead
        if bool(bad.any()):
            zz[bad] = snapshot[bad]
            dead = dead | bad

    last_loss = torch.zeros(R, dtype=dt, device=dev)  # each candidate's latest evaluated objective

    def evaluate(zz: torch.Tensor, live: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The closure on the `live` candidates (default: all but the stopped and diverged ones); any
        other keeps its last value with gradient 0. A candidate left out is where it was last evaluated
        (a stopped group, a diverged candidate, one inactive in this iteration's steps), so `_lbfgs`
        would get that value again, or is diverged, whose values `_lbfgs` ignores."""
        nonlocal last_loss
        live = ~(stopped | dead) if live is None else live
        if bool(live.all()):
            obj, gz = closure(zz)
        else:
            rows = torch.nonzero(live).flatten()
            obj, gz = last_loss.clone(), torch.zeros_like(zz)
            if len(rows):
                obj[rows], gz[rows] = closure(zz[rows], rows)
        last_loss = torch.where(live, obj, last_loss)
        return obj, gz

    def stop(now: torch.Tensor, i: int) -> None:
        nonlocal stopped, stopped_at
        new = now & ~stopped
        if bool(new.any()):
            stopped_at = torch.where(new, i, stopped_at)
            stopped = stopped | new

    for i in range(iterations):
        snapshot = z.clone()
        loss, g = evaluate(z)
        evals += 1
        check(loss, g, z, snapshot, i)
        keep_best(loss, z)
        stop(whole_groups(dead), i)  # a group all of whose candidates diverged stops (its own run breaks)
        if bool(stopped.all()):
            break
        alive = ~dead
        alive_loss = torch.where(alive & ~stopped, loss, torch.full_like(loss, math.inf))
        success = _record_success(success, alive_loss, success_threshold, i)
        if stop_on_success:
            stop(whole_groups((success >= 0) | dead), i)
            if bool(stopped.all()):
                break
        active = alive & ~stopped & (g.abs().amax(1) > tol_grad)
        step_evals = 1
        for inner in range(1, max_iter + 1):
            if not bool(active.any()):
                break
            n_iter = n_iter + active.long()
            first = n_iter == 1
            direction = -g
            later = active & ~first
            if bool(later.any()):
                y = g - prev_g
                s = d * t[:, None]
                ys = (y * s).sum(1)
                upd = later & (ys > 1e-10)
                if bool(upd.any()):
                    w = torch.nonzero(upd).flatten()
                    S[w, pos[w]] = s[w]
                    Y[w, pos[w]] = y[w]
                    RHO[w, pos[w]] = 1.0 / ys[w]
                    pos = torch.where(upd, (pos + 1) % H, pos)
                    count = torch.where(upd, torch.clamp(count + 1, max=H), count)
                    h_diag = torch.where(upd, ys / (y * y).sum(1), h_diag)
                # two-loop recursion over each candidate's pairs, newest first, as `_lbfgs` runs it: a
                # slot a candidate has not filled has s = y = 0 and rho = 0, so it changes nothing
                depth = int(count.max())
                slot = (pos[:, None] - 1 - torch.arange(depth, device=dev)[None]) % H  # [R, depth]: by age
                rho_age = RHO.gather(1, slot).T.unsqueeze(-1).unbind(0)  # depth x [R, 1]
                flat = (ring + slot).T.reshape(-1)  # age-major rows of the flattened [R * H, n] views
                # (n spelled out: before any candidate accepted a pair, depth is 0 and -1 is ambiguous)
                n = z.shape[1]
                s_age = S.view(R * H, n).index_select(0, flat).view(depth, R, n).unbind(0)
                y_age = Y.view(R * H, n).index_select(0, flat).view(depth, R, n).unbind(0)
                q = -g
                alphas = []
                for s_k, y_k, rho_k in zip(s_age, y_age, rho_age, strict=True):
                    a = (s_k * q).sum(1, keepdim=True) * rho_k
                    q = q - a * y_k
                    alphas.append(a)
                r_ = q * h_diag[:, None]
                for s_k, y_k, rho_k, a in zip(
                    s_age[::-1], y_age[::-1], rho_age[::-1], alphas[::-1], strict=True
                ):
                    b = (y_k * r_).sum(1, keepdim=True) * rho_k
                    r_ = r_ + s_k * (a - b)
                direction = torch.where(first[:, None], -g, r_)
            d = torch.where(active[:, None], direction, d)
            prev_g = torch.where(active[:, None], g, prev_g)
            prev_loss = torch.where(active, loss, prev_loss)
            t_first = torch.clamp(1.0 / g.abs().sum(1), max=1.0) * lr
            t = torch.where(active, torch.where(first, t_first, torch.full_like(t, lr)), t)
            gtd = (g * d).sum(1)
            active = active & ~(gtd > -tol_change)
            z = z + (t * active)[:, None] * d
            if inner != max_iter:
                new_loss, new_g = evaluate(z, active)  # an inactive candidate did not move
                evals += 1
                step_evals += 1
                check(new_loss, new_g, z, snapshot, i)
                keep_best(new_loss, z)
                active = active & ~dead
                loss = torch.where(active, new_loss, loss)
                g = torch.where(active[:, None], new_g, g)
                opt_cond = g.abs().amax(1) <= tol_grad
            else:
                break
            if step_evals >= max_eval:
                break
            active = active & ~opt_cond
            active = active & ~((d * t[:, None]).abs().amax(1) <= tol_change)
            active = active & ~((loss - prev_loss).abs() < tol_change)
        done_iters = i + 1
    final, g = evaluate(z)
    evals += 1
    snapshot = z.clone()
    check(final, g, z, snapshot, done_iters)
    keep_best(final, z)
    if bool(whole_groups(~torch.isfinite(best_loss)).any()):  # a group that never had a finite objective
        raise _fail(name, done_iters)
    z, final = best_z, best_loss
    its = torch.where(stopped_at >= 0, stopped_at, torch.full_like(stopped_at, done_iters))
    unfinished = torch.where(dead | stopped, torch.full_like(final, math.inf), final)
    success = _record_success(success, unfinished, success_threshold, done_iters)
    return z, final, its.tolist(), evals, _success_list(success), dead.tolist()
