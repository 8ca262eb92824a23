"""Torch core of `noise-aware`: the Bayes-optimal gradient-inversion objective for a known noise.

Balunovic, Dimitrov, Jovanovic, Vechev, "Bayesian framework for gradient leakage" (ICLR 2022,
arXiv 2111.04706): the attacker that knows the defense's mechanism maximises the posterior
log p(g_obs | x) + log p(x). For a mechanism that clips the gradient (or update) and adds i.i.d.
noise, g_obs = clip(g(x)) + n, so

- Gaussian noise of std s per coordinate: -log p(g_obs | x) = ||clip(g(x)) - g_obs||_2^2 / (2 s^2) + const,
- Laplace noise of scale b:            -log p(g_obs | x) = ||clip(g(x)) - g_obs||_1 / b + const,

where clip is the attacker's simulation of the defense's clipping on the candidate's gradient (flat or
per layer, on the whole update or on every example's gradient). The image prior is total variation,
-log p(x) = prior_weight * TV(x) + const (the paper's prior for images, its weight tuned).

What it owns:

- `NoiseModel` and `noise_model(defense, observation, scenario)`: the law, scale and clipping that
  acted on the observed tensor, read from the defense's parameters, in the units of the target
  gradient (a FedAvg delta is matched as -delta/(lr*L), so update-level scales are divided by lr*L,
  and per-step example-level noise averaged over L steps by sqrt(L)). A mechanism whose hook did not
  act on the observation (`Observation.defense_hooks`: noise added at the server, a `step`
  observation read before the update hook) contributes nothing: law `none`.
- `clip_gradients` and `neg_log_likelihood`: the closed forms above, per candidate.
- `NoiseAwareMatcher`: a `GradientMatcher` whose objective is the negative log posterior; candidates
  are optimised by fedbench's inversion machinery (`reconstruct_restarts`).
- `run_noise_aware`: the attack's `run`.

With law `none` (no noise at the observation) the likelihood is a point mass at an exact match, so
the MAP estimate is the exact matcher and the prior cannot move it: the objective is plain L2 matching
(of the clipped candidate gradient where the defense clipped), without the prior.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Literal

import torch

from fedbench.attacks._inversion import (
    GradientMatcher,
    box_bounds,
    channel_stats,
    initial_images,
    prepare_model,
    reconstruct_restarts,
    restarts_pay_as_one_batch,
    target_gradient,
    to_pixels,
    total_variation,
    update_as_gradient,
)
from fedbench.errors import RunFailure

Law = Literal["gaussian", "laplace", "none"]

#: the defenses whose noise `noise_model` reads (the attack's `adapts_to`)
NOISE_DEFENSES = ("dp-gaussian", "dp-laplace", "fed-sdp", "fed-cdp", "fed-cdp-decay", "dp-sgd", "dp-fedavg")


@dataclass(frozen=True)
class NoiseModel:
    """What the defense did to the observed tensor, in the target gradient's units.

    `law`/`scale`: i.i.d. noise per coordinate, Gaussian of std `scale` or Laplace of scale `scale`
    (`none`: no noise reached the observation). `clip`: the L2 bound (None: no clipping acted),
    applied to the whole gradient (`level=update`) or to each example's gradient before the batch mean
    (`level=example`), over all tensors at once (`per_layer=False`) or to each tensor separately.
    """

    law: Law
    scale: float
    clip: float | None
    level: Literal["update", "example"] = "update"
    per_layer: bool = False
    source: str = ""

    def as_extra(self) -> dict[str, Any]:
        return {
            "noise_law": self.law,
            "noise_scale": self.scale,
            "clip_bound": self.clip,
            "clip_level": self.level,
            "clip_per_layer": self.per_layer,
            "noise_source": self.source,
        }


def noise_model(defense: Any, observation: Any, scenario: Any) -> NoiseModel:
    """The `NoiseModel` of `defense` at `observation` (see the module docstring).

    Raises `RunFailure` for a defense the attack does not model; `none` (or no defense) is the
    noise-free model (plain L2 matching).
    """
    name = getattr(defense, "name", "none") if defense is not None else "none"
    hooks = tuple(getattr(observation, "defense_hooks", ()))
    steps = max(int(observation.local_steps), 1)
    # a delta is matched as -delta/(lr*L): update-level scales shrink by lr*L; per-step noise of the
    # mean of L step gradients by sqrt(L) (the L clipped steps are simulated at the received weights)
    per_update = 1.0 / (observation.lr * steps) if observation.kind == "delta" else 1.0
    per_step = 1.0 / math.sqrt(steps) if observation.kind == "delta" else 1.0
    if name == "none":
        return NoiseModel("none", 0.0, None, source="no defense")
    if name not in NOISE_DEFENSES:
        raise RunFailure(
            f"noise-aware models the noise of {', '.join(NOISE_DEFENSES)}; defense '{name}' adds none it "
            "knows (use inverting-gradients or dlg, or the defense's own adaptive attack)"
        )
    p = defense.params
    if name in ("dp-gaussian", "dp-laplace"):
        if "update" not in hooks:
            return NoiseModel(
                "none", 0.0, None, source=f"{name}'s update hook did not act on this observation"
            )
        scale = p.sigma if name == "dp-gaussian" else p.b
        law: Law = ("gaussian" if name == "dp-gaussian" else "laplace") if scale > 0 else "none"
        return NoiseModel(
            law,
            scale * per_update,
            p.clip * per_update,
            source=f"{name}: flat clip of the update, then noise",
        )
    if name in ("fed-sdp", "dp-fedavg"):
        hook = "update" if p.placement == "client" else "receive"
        if hook not in hooks:
            return NoiseModel("none", 0.0, None, source=f"{name}[placement={p.placement}]: raw at this point")
        per_layer = bool(defense.per_layer)
        clip = p.clip * per_update
        if p.noise == "central":  # one noise on the server's sum: the client's clipped update is exact
            return NoiseModel("none", 0.0, clip, per_layer=per_layer, source=f"{name}: central noise after")
        sigma = defense.sigma_for(_need(scenario, name), len(observation.shared))
        return NoiseModel(
            "gaussian",
            sigma * p.clip * per_update,
            clip,
            per_layer=per_layer,
            source=f"{name}: clip, N(0, (sigma C)^2)",
        )
    # fed-cdp, fed-cdp-decay, dp-sgd: per-example clipping and noise inside local training
    if "per_example" not in hooks:
        return NoiseModel("none", 0.0, None, source=f"{name}'s per-example hook did not act here")
    ctx = SimpleNamespace(round=observation.round, scenario=scenario, client=observation.client, step=0)
    if name == "fed-cdp-decay":
        _need(scenario, name)
    bound = float(defense.clip_at(ctx))
    sigma = defense.sigma_for(_need(scenario, name), len(observation.shared))
    batch = max(int(observation.batch_size or len(observation.y_true)), 1)
    if observation.point == "example":
        batch = 1
    std = sigma * bound / (math.sqrt(batch) if p.noise == "example" else batch)
    return NoiseModel(
        "gaussian",
        std * per_step,
        bound,
        level="example",
        per_layer=bool(defense.per_layer),
        source=f"{name}: per-example clip to C_t={bound:g}, noise sigma*C_t on the batch ({p.noise})",
    )


def _need(scenario: Any, name: str) -> Any:
    if scenario is None:
        raise RunFailure(
            f"noise-aware needs the run's scenario to read {name}'s noise (the runner passes it with "
            "bind_data; in library use call attack.bind_data(simulation.run_data()))"
        )
    return scenario


# ------------------------------------------------------------------------------- closed forms


def clip_gradients(grads: list[torch.Tensor], bound: float | None, per_layer: bool) -> list[torch.Tensor]:
    """The defense's clipping simulated on candidates' gradients (each [N, ...], one row per candidate
    or example): g * min(1, C / ||g||), the norm over all tensors of a row (flat) or per tensor."""
    if bound is None:
        return grads
    if per_layer:
        out = []
        for g in grads:
            norm = g.flatten(1).norm(dim=1).clamp_min(1e-12)
            out.append(g * (bound / norm).clamp(max=1.0).view(-1, *([1] * (g.dim() - 1))))
        return out
    sq = sum(g.flatten(1).pow(2).sum(1) for g in grads)
    factor = (bound / sq.sqrt().clamp_min(1e-12)).clamp(max=1.0)
    return [g * factor.view(-1, *([1] * (g.dim() - 1))) for g in grads]


def neg_log_likelihood(
    clipped: list[torch.Tensor], targets: list[torch.Tensor], law: Law, scale: float
) -> torch.Tensor:
    """-log p(g_obs | x) up to a constant, per candidate [R]: ||d||^2 / (2 s^2) (gaussian),
    ||d||_1 / b (laplace), ||d||^2 / 2 (none: the unit-scale L2 of the exact matcher)."""
    total = 0
    for g, t in zip(clipped, targets, strict=True):
        d = (g - t.unsqueeze(0)).flatten(1)
        total = total + (d.abs().sum(1) if law == "laplace" else d.pow(2).sum(1))
    if law == "gaussian":
        return total / (2 * scale * scale)
    if law == "laplace":
        return total / scale
    return total / 2


# ------------------------------------------------------------------------------------ the matcher


class NoiseAwareMatcher(GradientMatcher):
    """Negative log posterior per candidate: likelihood of the clipped candidate gradient + TV prior."""

    def __init__(
        self, model: Any, target: dict[str, torch.Tensor], noise: NoiseModel, prior_weight: float, meta: Any
    ):
        super().__init__(model, target, cost="l2")
        self.noise = noise
        self.prior_weight = float(prior_weight) if noise.law != "none" else 0.0
        self.meta = meta

    def gradients(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        """Each candidate's simulated defended gradient (clipped; noise is the likelihood's part)."""
        nz = self.noise
        R, B = x.shape[0], x.shape[1]
        if nz.level == "example" and B > 1:  # each example's gradient clipped, then the batch mean
            xe = x.reshape(R * B, 1, *x.shape[2:])
            ye = y.reshape(R * B, 1, *y.shape[2:])
            per = clip_gradients(super().gradients(xe, ye), nz.clip, nz.per_layer)
            return [g.reshape(R, B, *g.shape[1:]).mean(1) for g in per]
        return clip_gradients(super().gradients(x, y), nz.clip, nz.per_layer)

    def match(self, grads: list[torch.Tensor]) -> torch.Tensor:
        return neg_log_likelihood(grads, self.targets, self.noise.law, self.noise.scale)

    def prior(self, x: torch.Tensor) -> torch.Tensor:
        """-log p(x) up to a constant: prior_weight * mean anisotropic TV of the [0, 1] pixels."""
        m, s = channel_stats(self.meta, x.shape[-3], x.device)
        return self.prior_weight * total_variation(x * s + m)

    def objective(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = self.match(self.gradients(x, y))
        if self.prior_weight:
            out = out + self.prior(x)
        return out


# ------------------------------------------------------------------------------------ the attack


def row_sum_label(model: Any, grads: dict[str, torch.Tensor], num_classes: int, device: Any) -> Any:
    """iDLG's sign rule on the last layer's bias entry plus its weight-row sum, for one example.

    The label's entries are (p_y - 1) * (1, h) with h >= 0 after a ReLU and every other class's are
    p_c * (1, h): the label is the most negative sum. Under noise of std s per coordinate the bias
    entry alone has signal |p_y - 1| * clip factor against noise s, which a sigma = 0.1 defense
    swamps; the sum over the F + 1 entries of the row has noise s * sqrt(F + 1) against a signal
    that grows with sum(h), so it keeps the label where the bias entry loses it. None when the model
    has no last linear layer in the gradient.
    """
    from fedbench.attacks.label_recovery import LabelGuess, last_layer

    w, b = last_layer(model, grads, num_classes)
    if w is None:
        return None
    score = w.sum(1) + (b if b is not None else 0)
    return LabelGuess(torch.tensor([int(torch.argmin(score))], dtype=torch.long, device=device), "rows")


def run_noise_aware(attack: Any, observation: Any, model: Any, meta: Any, generator: Any, device: Any) -> Any:
    from fedbench.attacks.label_recovery import recover_labels
    from fedbench.plugin import AttackOutput

    reason = attack.check_meta(meta)
    if reason:
        raise RunFailure(reason)
    device = torch.device(device) if device is not None else torch.device("cpu")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    p = attack.params
    cfg = attack.settings(meta)
    noise = noise_model(attack.defense, observation, attack.scenario)
    if p.likelihood != "auto" and noise.law != "none":  # the other law at the same noise variance
        std = noise.scale * (math.sqrt(2) if noise.law == "laplace" else 1.0)
        noise = (
            NoiseModel("gaussian", std, noise.clip, noise.level, noise.per_layer, noise.source + "; as L2")
            if p.likelihood == "l2"
            else NoiseModel(
                "laplace",
                std / math.sqrt(2),
                noise.clip,
                noise.level,
                noise.per_layer,
                noise.source + "; as L1",
            )
        )
    model = prepare_model(model, observation.global_state, observation.model_mode, device)
    target, note = target_gradient(
        observation.kind, observation.shared, observation.lr, observation.local_steps
    )
    batch = int(len(observation.y_true))
    shape = tuple(int(s) for s in meta.input_shape)
    guess = (
        row_sum_label(model, target, meta.num_classes, device) if p.labels == "rows" and batch == 1 else None
    ) or recover_labels(
        "batch" if p.labels == "rows" else p.labels,
        model=model,
        grads=target,
        num_classes=meta.num_classes,
        batch=batch,
        y_true=observation.y_true if p.labels == "known" else None,
        input_shape=shape,
        generator=generator,
        device=device,
    )
    if guess.labels is None:
        raise RunFailure(f"noise-aware: no label found ({guess.strategy}); use labels=known")
    matcher = NoiseAwareMatcher(model, target, noise, p.prior_weight, meta)
    R = int(p.restarts)
    x0 = initial_images(cfg["init"], R, batch, shape, meta, generator, device)
    box = box_bounds(meta, shape[0], device)
    batched = R == 1 or restarts_pay_as_one_batch(matcher, x0[0])
    rec = reconstruct_restarts(
        matcher,
        x0,
        batched=batched,
        labels=guess.labels,
        optimizer=cfg["optimizer"],
        iterations=cfg["iterations"],
        lr=cfg["lr"],
        box=box,
        lr_decay=True,
        plateau=cfg.get("plateau"),
        name=attack.name,
    )
    best = rec.best
    images = to_pixels(rec.x[best], meta)
    objectives = [float(v) if math.isfinite(float(v)) else None for v in rec.objective.tolist()]
    with torch.no_grad():
        prior = matcher.prior(rec.x[best : best + 1]) if matcher.prior_weight else torch.zeros(1)
    extra: dict[str, Any] = {
        **noise.as_extra(),
        "adaptive": noise.law != "none",
        "prior_weight": matcher.prior_weight,
        "final_objective": objectives[best],
        "final_prior": float(prior[0]),
        "restart_objectives": objectives,
        "restarts": R,
        "best_restart": best,
        "iterations": int(rec.iterations),
        "evaluations": int(rec.evaluations),
        "optimizer": cfg["optimizer"],
        "init": cfg["init"],
        "label_strategy": guess.strategy,
        "labels_known": p.labels == "known",
        "bn_stats_known": False,
        "model_mode": observation.model_mode,
        "observation_kind": observation.kind,
        "observation_note": note,
        "matched_tensors": len(matcher.names),
    }
    if cfg.get("plateau") is not None:
        extra["schedule"] = "plateau"
        extra["stopped"] = rec.stopped
    as_gradient = update_as_gradient(observation.kind, observation.local_steps)
    if as_gradient is not None:
        extra["update_as_gradient"] = as_gradient
    return AttackOutput(
        images=images.detach().cpu().numpy().astype("float32"),
        labels=guess.labels.detach().cpu().numpy().astype("int64"),
        extra=extra,
    )
