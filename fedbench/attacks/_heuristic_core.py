"""Torch core of the adaptive attacks on heuristic defenses (`soteria-adaptive`, `pruning-adaptive`).

Both attacks are one pipeline with two defense-specific inputs, what the attacker knows was *sent*:

1. Analytic pixels (`analytic_pixels`, batch of one, first layer fully connected with a bias). For one
   example the first FC layer's gradient is dL/dW_ij = dL/db_i * x_j, so every sent entry (i, j) of a
   row i whose bias gradient dL/db_i is sent and nonzero gives x_j = dL/dW_ij / dL/db_i exactly (the
   recovery of `fc-leakage`, `_fc_recovery.candidates`, restricted to the sent entries). A pixel seen in
   several such rows takes the row with the largest |dL/db_i| (the least rounding). Propagation: a row
   whose bias gradient was not sent but which holds a sent, nonzero entry at an already recovered pixel j
   has dL/db_i = dL/dW_ij / x_j (anchored at its largest such entry), and then gives its other sent
   entries too; this repeats until no row is added. The rows' agreement on pixels they share
   (`spread`) and the pixel range are checked without the ground truth.
2. Masked Inverting Gradients with the recovered pixels fixed (`invert`): cosine matching + TV with
   signed Adam (`_inversion.GradientMatcher` and `reconstruct_batched`, the `ig` optimiser and budget)
   on the sent coordinates only, whose box is the valid pixel range except at the recovered pixels, where
   its lower and upper bounds both equal the recovered value (so the projection after every step keeps
   them fixed and the optimisation fills the rest).
   Under magnitude pruning a pruned entry of a known row bounds the pixel: |db_i x_j| < the smallest
   kept |dW| (`limit`), which narrows the box of the free pixels. `fill=prior` replaces the optimisation
   by the dataset mean (normalised 0) projected into that box.
3. Choice (in `reconstruct`): a complete, consistent, in-range analytic image is returned as is (its
   matching cost is zero up to rounding; no optimisation is run); otherwise the fill's output, which
   holds every recovered pixel. Where an analytic image is complete but fails a check, both are scored by the
   same matching objective and the lower one wins: the attacker never reads the ground truth.

What is "sent" (the defense-specific knowledge):
- Soteria: every tensor but the defend layer's weight as is; that weight's pruned input columns are
  zero. `drop` (Balunovic et al.) leaves the defend layer's weight out of the matching; `kept` matches
  its columns that are not all zero. The analytic step uses the first FC layer's kept columns (all of
  them when Soteria defends a later layer).
- Gradient pruning / top-k sparsification: exactly the nonzero entries of each tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from fedbench.attacks._inversion import (
    GradientMatcher,
    box_bounds,
    channel_stats,
    initial_images,
    prepare_model,
    reconstruct_batched,
    target_gradient,
    to_pixels,
    update_as_gradient,
)
from fedbench.errors import RunFailure

#: Relative agreement the analytic rows must reach on the pixels they share (float32 gradients agree to
#: ~1e-6; rows of a B > 1 batch or of a noised gradient disagree by orders of magnitude more).
CONSISTENCY_TOL = 1e-3
#: Pixel-range tolerance of an analytic value, in [0, 1] pixel units.
RANGE_TOL = 1e-3


@dataclass
class AnalyticPixels:
    """The outcome of the analytic step on the first FC layer (B = 1)."""

    values: torch.Tensor | None  # [n] normalised input values (float64), 0 where unknown
    known: torch.Tensor | None  # [n] bool
    reason: str | None = None  # why nothing was recovered (None: the step ran)
    rows_direct: int = 0  # rows whose sent bias gradient gave pixels
    rows_propagated: int = 0  # rows whose bias gradient was derived from a recovered pixel
    spread: float = 0.0  # largest relative disagreement of two rows on a shared pixel
    limit: torch.Tensor | None = None  # [n] bound on |x_j| from the pruned entries of known rows (inf: none)

    @property
    def count(self) -> int:
        return 0 if self.known is None else int(self.known.sum())

    @property
    def complete(self) -> bool:
        return self.known is not None and bool(self.known.all())


def analytic_pixels(
    gw: torch.Tensor,
    gb: torch.Tensor,
    w_sent: torch.Tensor,
    b_sent: torch.Tensor,
    *,
    rel_tol: float = 1e-8,
    propagate: bool = True,
    dropped_below: float | None = None,
) -> AnalyticPixels:
    """x_j = dW_ij / db_i over the sent entries of the rows with a sent, nonzero db_i (see module doc)."""
    gw = gw.detach().to("cpu", torch.float64)
    gb = gb.detach().to("cpu", torch.float64).reshape(-1)
    w_sent = w_sent.to("cpu", torch.bool)
    b_sent = b_sent.to("cpu", torch.bool).reshape(-1)
    rows, n = gw.shape
    peak = float(gb[b_sent].abs().max()) if bool(b_sent.any()) else 0.0
    db = torch.where(b_sent & (gb.abs() > rel_tol * peak), gb, torch.zeros_like(gb)) if peak else gb * 0
    direct = db != 0
    values = torch.zeros(n, dtype=torch.float64)
    known = torch.zeros(n, dtype=torch.bool)
    propagated = 0
    while True:
        active = db != 0
        weight = db.abs()[:, None] * (w_sent & active[:, None])  # [rows, n]
        best, row = weight.max(0)
        has = best > 0
        new = has & ~known
        if bool(new.any()):
            cols = torch.nonzero(new).flatten()
            values[cols] = gw[row[cols], cols] / db[row[cols]]
            known |= new
        if not propagate:
            break
        # rows with no bias gradient yet, holding a sent nonzero entry at a recovered nonzero pixel
        anchor = w_sent & (gw != 0) & (known & (values != 0))[None, :] & ~active[:, None]
        candidates = torch.nonzero(anchor.any(1)).flatten()
        if candidates.numel() == 0:
            break
        mag = torch.where(anchor, gw.abs(), torch.zeros_like(gw))
        j = mag[candidates].argmax(1)
        db[candidates] = gw[candidates, j] / values[j]
        propagated += int(candidates.numel())
    spread = consistency(gw, db, w_sent, values, known)
    limit = torch.full((n,), math.inf, dtype=torch.float64)
    if dropped_below is not None:  # a dropped entry of a known row: |db_i x_j| <= dropped_below
        active = db != 0
        ratio = torch.where(~w_sent & active[:, None], dropped_below / db.abs()[:, None], math.inf)
        limit = torch.minimum(limit, ratio.min(0).values if rows else limit)
    return AnalyticPixels(values, known, None, int(direct.sum()), propagated, spread, limit)


def consistency(
    gw: torch.Tensor, db: torch.Tensor, w_sent: torch.Tensor, values: torch.Tensor, known: torch.Tensor
) -> float:
    """Largest |dW_ij / db_i - x_j| over every row's sent entries, relative to max |x| (0 for one row)."""
    active = db != 0
    if not bool(active.any()) or not bool(known.any()):
        return 0.0
    use = w_sent[active] & known[None, :]
    est = gw[active] / db[active, None]
    dev = torch.where(use, (est - values[None, :]).abs(), torch.zeros_like(est))
    scale = float(values[known].abs().max()) or 1.0
    return float(dev.max()) / scale


def first_fc_analytic(
    model: Any,
    target: dict[str, torch.Tensor],
    batch: int,
    sent: dict[str, torch.Tensor],
    magnitude_pruned: bool = False,
) -> tuple[str | None, AnalyticPixels]:
    """The analytic step on the model's first layer: (layer name or None, outcome with its reason)."""
    from fedbench.attacks._fc_recovery import first_layer_reason, first_linear

    reason = first_layer_reason(model)
    if reason:
        return None, AnalyticPixels(None, None, f"analytic step skipped: {reason}")
    layer, _ = first_linear(model)
    if batch != 1:
        return layer, AnalyticPixels(
            None,
            None,
            f"analytic step skipped: batch of {batch} (a row mixes the batch's inputs; needs B = 1)",
        )
    wkey, bkey = f"{layer}.weight", f"{layer}.bias"
    if wkey not in target or bkey not in target:
        return layer, AnalyticPixels(None, None, f"analytic step skipped: '{wkey}'/'{bkey}' not observed")
    below = None
    if magnitude_pruned:  # every dropped entry is below the smallest kept one (per tensor or global)
        kept = target[wkey][sent[wkey]].abs()
        below = float(kept.min()) if kept.numel() else None
    out = analytic_pixels(target[wkey], target[bkey], sent[wkey], sent[bkey], dropped_below=below)
    if out.count == 0:
        out.reason = "analytic step found no row with a sent, nonzero bias gradient"
    return layer, out


def analytic_image(pixels: AnalyticPixels, shape: tuple[int, ...], meta: Any) -> torch.Tensor:
    """The recovered values as a normalised image [1, C, H, W] (float32; unknown pixels 0)."""
    return pixels.values.to(torch.float32).reshape(1, *shape)


def in_range(pixels: AnalyticPixels, shape: tuple[int, ...], meta: Any) -> bool:
    """Whether every recovered value lies in the valid [0, 1] pixel range (up to RANGE_TOL)."""
    x = pixels.values.reshape(1, *shape)
    m, s = channel_stats(meta, shape[0], torch.device("cpu"))
    pix = (x * s.double() + m.double())[pixels.known.reshape(1, *shape)]
    return bool(((pix >= -RANGE_TOL) & (pix <= 1 + RANGE_TOL)).all())


def fixed_box(
    pixels: AnalyticPixels | None, shape: tuple[int, ...], meta: Any, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The valid normalised box, collapsed to the recovered value at every recovered pixel."""
    lo, hi = box_bounds(meta, shape[0], device)
    lo = lo.expand(1, *shape).clone()
    hi = hi.expand(1, *shape).clone()
    if pixels is not None and pixels.count:
        known = pixels.known.reshape(1, *shape).to(device)
        v = pixels.values.to(device, torch.float32).reshape(1, *shape)
        v = torch.maximum(torch.minimum(v, hi), lo)
        lo = torch.where(known, v, lo)
        hi = torch.where(known, v, hi)
    if pixels is not None and pixels.limit is not None:  # the pruning rule's bound, on the other pixels
        free = ~pixels.known.reshape(1, *shape).to(device)
        lim = pixels.limit.to(device, torch.float32).reshape(1, *shape)
        lo = torch.where(free, torch.maximum(lo, torch.minimum(-lim, hi)), lo)
        hi = torch.where(free, torch.minimum(hi, torch.maximum(lim, lo)), hi)
    return lo, hi


@dataclass
class Inversion:
    """The masked, pixel-constrained Inverting Gradients of one victim."""

    x: torch.Tensor  # [B, C, H, W] normalised, the best restart
    objective: float | None
    iterations: int
    stopped: str | None


def invert(
    attack: Any,
    matcher: GradientMatcher,
    labels: torch.Tensor,
    shape: tuple[int, ...],
    meta: Any,
    generator: torch.Generator,
    device: torch.device,
    box: tuple[torch.Tensor, torch.Tensor],
) -> Inversion:
    """Signed-Adam IG (the attack's `settings`) inside `box`; restarts batched, best by objective."""
    cfg = attack.settings(meta)
    R = int(attack.params.restarts)
    x0 = initial_images(cfg["init"], R, len(labels), shape, meta, generator, device)
    x0 = torch.maximum(torch.minimum(x0, box[1]), box[0])
    rec = reconstruct_batched(
        matcher,
        x0,
        labels=labels,
        iterations=cfg["iterations"],
        lr=cfg["lr"],
        box=box,
        lr_decay=cfg["lr_decay"],
        plateau=cfg.get("plateau"),
        name=attack.name,
    )
    best = rec.best
    obj = float(rec.objective[best])
    return Inversion(
        rec.x[best],
        obj if math.isfinite(obj) else None,
        int(rec.iterations),
        rec.stopped if cfg.get("plateau") else None,
    )


def objective_of(matcher: GradientMatcher, x: torch.Tensor, labels: torch.Tensor) -> float:
    """The matching objective of one image batch x [B, C, H, W] (the attacker's choice criterion)."""
    with torch.no_grad():
        return float(matcher.objective(x.unsqueeze(0), labels.unsqueeze(0))[0])


@dataclass
class Setup:
    """A victim's model, target, labels and shape: what `run_inversion` sets up before optimising."""

    model: Any
    target: dict[str, torch.Tensor]
    note: str
    labels: torch.Tensor
    label_strategy: str
    shape: tuple[int, ...]
    device: torch.device
    generator: torch.Generator


def setup(attack: Any, observation: Any, model: Any, meta: Any, generator: Any, device: Any) -> Setup:
    from fedbench.attacks.label_recovery import recover_labels

    reason = attack.check_meta(meta)
    if reason:
        raise RunFailure(reason)
    device = torch.device(device) if device is not None else torch.device("cpu")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    model = prepare_model(model, observation.global_state, observation.model_mode, device)
    target, note = target_gradient(
        observation.kind, observation.shared, observation.lr, observation.local_steps
    )
    batch = int(len(observation.y_true))  # the batch size is known; the labels are not
    shape = tuple(int(s) for s in meta.input_shape)
    guess = recover_labels(
        attack.params.labels,
        model=model,
        grads=target,
        num_classes=meta.num_classes,
        batch=batch,
        y_true=observation.y_true if attack.params.labels == "known" else None,
        input_shape=shape,
        generator=generator,
        device=device,
    )
    if guess.labels is None:
        raise RunFailure(f"{attack.name}: no labels recovered ({guess.strategy}); use labels=known or idlg")
    return Setup(model, target, note, guess.labels, guess.strategy, shape, device, generator)


def reconstruct(
    attack: Any,
    observation: Any,
    meta: Any,
    s: Setup,
    matcher: GradientMatcher,
    sent: dict[str, torch.Tensor],
    use_analytic: bool,
    extra: dict[str, Any],
    magnitude_pruned: bool = False,
    fill: str = "optimise",
) -> Any:
    """Steps 1-3 of the module docstring for one victim; returns the AttackOutput."""
    from fedbench.plugin import AttackOutput

    batch = len(s.labels)
    if use_analytic:
        layer, pixels = first_fc_analytic(s.model, s.target, batch, sent, magnitude_pruned)
    else:
        layer, pixels = None, AnalyticPixels(None, None, "analytic step off (analytic=false)")
    valid = pixels.count > 0 and pixels.spread <= CONSISTENCY_TOL and in_range(pixels, s.shape, meta)
    if pixels.count and not valid and pixels.reason is None:
        pixels.reason = (
            f"analytic pixels rejected: rows disagree by {pixels.spread:.2e} (tolerance {CONSISTENCY_TOL:g})"
            if pixels.spread > CONSISTENCY_TOL
            else "analytic pixels rejected: values outside the pixel range"
        )
    info = {
        "analytic_layer": layer,
        "analytic_pixels": pixels.count if valid else 0,
        "analytic_share": round(pixels.count / math.prod(s.shape), 6) if valid else 0.0,
        "analytic_rows": pixels.rows_direct,
        "analytic_rows_propagated": pixels.rows_propagated,
        "analytic_spread": pixels.spread,
        "analytic_note": pixels.reason,
    }
    if valid and pixels.complete:
        x = analytic_image(pixels, s.shape, meta).to(s.device)
        choice, objective, iterations = "analytic", objective_of(matcher, x, s.labels), 0
    elif valid and fill == "prior":  # the dataset mean (normalised 0), projected into the feasible box
        lo, hi = fixed_box(pixels, s.shape, meta, s.device)
        x = torch.maximum(torch.minimum(torch.zeros_like(lo), hi), lo).expand(batch, *s.shape)
        choice, objective, iterations = "analytic + prior fill", objective_of(matcher, x, s.labels), 0
    else:
        box = fixed_box(pixels if valid else None, s.shape, meta, s.device)
        inv = invert(attack, matcher, s.labels, s.shape, meta, s.generator, s.device, box)
        x, objective, iterations = inv.x, inv.objective, inv.iterations
        choice = "combined" if valid else "optimisation"
        if inv.stopped is not None:
            info["stopped"] = inv.stopped
        if pixels.complete and not valid:  # a complete analytic image failed a check: the objective decides
            alt = analytic_image(pixels, s.shape, meta).to(s.device)
            alt_obj = objective_of(matcher, alt, s.labels)
            if objective is None or alt_obj < objective:
                x, objective, choice = alt, alt_obj, "analytic (lower objective)"
    images = to_pixels(x, meta)
    if not bool(torch.isfinite(images).all()):
        raise RunFailure(f"{attack.name}: non-finite reconstruction")
    cfg = attack.settings(meta)
    extra = {
        **extra,
        **info,
        "choice": choice,
        "final_objective": objective,
        "iterations": iterations,
        "restarts": int(attack.params.restarts),
        "cost": "cosine",
        "optimizer": "adam-signed",
        "init": cfg["init"],
        "tv_weight": float(cfg["tv_weight"]),
        "label_strategy": s.label_strategy,
        "labels_known": attack.params.labels == "known",
        "bn_stats_known": False,
        "model_mode": observation.model_mode,
        "observation_kind": observation.kind,
        "observation_note": s.note,
        "matched_tensors": len(matcher.names),
    }
    as_gradient = update_as_gradient(observation.kind, observation.local_steps)
    if as_gradient is not None:
        extra["update_as_gradient"] = as_gradient
    return AttackOutput(
        images=images.detach().cpu().numpy().astype("float32"),
        labels=s.labels.detach().cpu().numpy().astype("int64"),
        extra=extra,
    )


# ------------------------------------------------------------------------------------------ the attacks


def adapted(attack: Any) -> str | None:
    """The run's defense name when the attack adapts to it, else None."""
    defense = getattr(attack, "defense", None)
    name = getattr(defense, "name", None)
    return name if name in type(attack).adapts_to else None


def fallback_note(attack: Any) -> str:
    defense = getattr(attack, "defense", None)
    what = f"defense '{defense.name}'" if defense is not None else "no defense bound"
    adapts = ", ".join(type(attack).adapts_to)
    return f"{attack.name} adapts to {adapts}; {what}: run without a defense-specific step"


def run_soteria_adaptive(
    attack: Any, observation: Any, model: Any, meta: Any, generator: Any, device: Any
) -> Any:
    """Soteria's adaptive attack: match every tensor but the defend layer's weight, analytic first layer."""
    from fedbench.defenses.soteria import defend_layer

    p = attack.params
    s = setup(attack, observation, model, meta, generator, device)
    sent = {k: torch.ones_like(v, dtype=torch.bool) for k, v in s.target.items()}
    target = dict(s.target)
    masks: dict[str, torch.Tensor] = {}
    defense = adapted(attack)
    extra: dict[str, Any] = {"adaptive": defense is not None}
    if defense is not None:
        layer, _ = defend_layer(s.model, attack.defense.params.layer)
        key = f"{layer}.weight"
        columns = (s.target[key] != 0).any(0, keepdim=True).expand_as(s.target[key])
        sent[key] = columns  # pruned input columns are all zero; a kept column is sent as is
        if p.defended == "drop":
            target.pop(key)
        else:
            masks[key] = columns.to(s.target[key].dtype)
        extra.update({"defended_tensor": key, "defended": p.defended, "kept_columns": int(columns[0].sum())})
    else:
        extra["adaptive_note"] = fallback_note(attack)
    if p.pruning_aware == "on":  # mask the observed zeros of the other tensors too (ablation)
        for k, t in target.items():
            masks.setdefault(k, (t != 0).to(t.dtype))
    matcher = _matcher(attack, s, target, masks, meta)
    return reconstruct(attack, observation, meta, s, matcher, sent, p.analytic, extra)


def run_pruning_adaptive(
    attack: Any, observation: Any, model: Any, meta: Any, generator: Any, device: Any
) -> Any:
    """Mask-aware inversion of a pruned/sparsified gradient, seeded by its kept rows' analytic pixels."""
    p = attack.params
    s = setup(attack, observation, model, meta, generator, device)
    defense = adapted(attack)
    extra: dict[str, Any] = {"adaptive": defense is not None}
    if defense is not None:
        prune = p.pruning_aware != "off"
        sent = {k: v != 0 for k, v in s.target.items()}  # the pruned entries are exactly the zeros
    else:
        extra["adaptive_note"] = fallback_note(attack)
        prune = p.pruning_aware == "on" or (
            p.pruning_aware == "auto" and bool(getattr(observation, "sparsified", False))
        )
        sent = {k: (v != 0) if prune else torch.ones_like(v, dtype=torch.bool) for k, v in s.target.items()}
    masks = {k: (t != 0).to(t.dtype) for k, t in s.target.items()} if prune else {}
    extra["pruning_aware"] = prune
    extra["observed_zero_fraction"] = round(
        sum(int((t == 0).sum()) for t in s.target.values())
        / max(1, sum(t.numel() for t in s.target.values())),
        6,
    )
    matcher = _matcher(attack, s, s.target, masks, meta)
    return reconstruct(
        attack, observation, meta, s, matcher, sent, p.analytic, extra, defense is not None, p.fill
    )


def _matcher(
    attack: Any, s: Setup, target: dict[str, torch.Tensor], masks: dict[str, torch.Tensor], meta: Any
) -> GradientMatcher:
    """IG's cosine matcher on `target`, matching only the entries of `masks` where a tensor has one."""
    cfg = attack.settings(meta)
    matcher = GradientMatcher(
        s.model, target, cost="cosine", weights=cfg["weights"], tv_weight=cfg["tv_weight"]
    )
    if masks:
        device = matcher.targets[0].device
        matcher.masks = [
            masks[k].to(device) if k in masks else torch.ones_like(t)
            for k, t in zip(matcher.names, matcher.targets, strict=True)
        ]
    return matcher
