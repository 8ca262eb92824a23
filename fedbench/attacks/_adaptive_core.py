"""The torch core of the defense-aware attacks (spec 001 §2.3, §2.4): GLA, then undo the encoding.

- `run_loda_adaptive`: Inverting Gradients recovers the obscured image x' from the gradient, then the
  stationary-point inversion of LODA (Eq. 6) with the defense's feature extractor g recovers x*.
- `run_mixup_decode`: Carlini et al.'s decoding with GradAttack's oracle mapping. The attacker pools
  the encodings behind `pool` training iterations (batch 1): the observed one, plus the encodings of
  the observed round's draws (every local epoch's, when the defense redraws per epoch) that share
  images with it, whose gradients at the observed global state it inverts the same way (the
  gradients it would observe in those iterations, emulated at one model state). It then solves Eq. 3,
  min_P ||abs(M norm(P)) - abs(E^)||^2 (abs only for InstaHide) + reg * mean(1 - |2P - 1|) over the
  private images P in [0, 1] with Adam, and returns the decoded largest-weight component of every
  observed encoding.

Against a defense that does not declare the attack (`Defense.adaptive_attack`), both return the plain
GLA output: no adaptive step applies (the paper's No-Defense and pruning columns of Tables 2 and 4).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fedbench.attacks._inversion import (
    GradientMatcher,
    box_bounds,
    from_pixels,
    initial_images,
    prepare_model,
    reconstruct_batched,
    run_inversion,
    target_gradient,
)
from fedbench.plugin import AttackOutput


def applies(attack: Any, defense: Any) -> bool:
    return defense is not None and getattr(defense, "adaptive_attack", "") == attack.name


# ------------------------------------------------------------------------------------------- LODA


def run_loda_adaptive(
    attack: Any, observation: Any, model: Any, meta: Any, generator: Any, device: Any
) -> Any:
    from fedbench.defenses._loda_core import invert_stationary

    gla = run_inversion(attack, observation, model, meta, generator, device)
    defense = attack.defense
    if not applies(attack, defense):
        return AttackOutput(gla.images, gla.labels, extra={**gla.extra, "adaptive": False})
    p = attack.params
    tap = defense.feature_tap()
    x_obscured = torch.as_tensor(gla.images, dtype=torch.float32)
    x_hat, history = invert_stationary(tap, x_obscured, p.c, p.steps, p.step_lr, p.optimizer, p.start)
    extra = {
        **gla.extra,
        "adaptive": True,
        "adaptive_c": p.c,
        "adaptive_steps": p.steps,
        "adaptive_residual_first": history[0] if history else None,
        "adaptive_residual_last": history[-1] if history else None,
    }
    return AttackOutput(x_hat.numpy().astype("float32"), gla.labels, extra=extra)


# --------------------------------------------------------------------------------- MixUp / InstaHide


def _gla(
    attack: Any,
    model: Any,
    target: dict[str, torch.Tensor],
    labels: torch.Tensor,
    meta: Any,
    generator: Any,
    device: Any,
    box: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """Inverting Gradients on one target gradient: the best restart [B, C, H, W], normalised, in `box`."""
    cfg = attack.settings(meta)
    matcher = GradientMatcher(
        model, target, cost="cosine", weights=cfg["weights"], tv_weight=cfg["tv_weight"]
    )
    shape = tuple(int(s) for s in meta.input_shape)
    x0 = initial_images(cfg["init"], attack.params.restarts, len(labels), shape, meta, generator, device)
    x0 = x0.clamp(box[0], box[1])
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
    return rec.x[rec.best]


def _pool_rows(components: torch.Tensor, targets: set[int], observed: list[int], pool: int) -> list[int]:
    """The observed encodings, then those holding a target image (the observed encodings' largest-weight
    components), then those sharing the most images with the observed ones, up to `pool` rows."""
    wanted = set(components[observed].flatten().tolist())
    score = [
        (any(int(c) in targets for c in row.tolist()), sum(int(c) in wanted for c in row.tolist()), r)
        for r, row in enumerate(components)
    ]
    ranked = sorted(score, key=lambda t: (not t[0], -t[1], t[2]))
    others = [r for hit, n, r in ranked if (hit or n > 0) and r not in observed]
    return observed + others[: max(0, pool - len(observed))]


def decode(
    encodings: torch.Tensor,
    components: torch.Tensor,
    coefficients: torch.Tensor,
    meta: Any,
    signed: bool,
    steps: int,
    lr: float,
    reg: float,
) -> tuple[dict[int, torch.Tensor], list[float]]:
    """Solve Eq. 3 for the private images behind `encodings` (normalised, [M, C, H, W]).

    Returns {private image index: decoded image in [0, 1]} and the loss history.
    """
    images = sorted(set(components.flatten().tolist()))
    where = {img: j for j, img in enumerate(images)}
    device = encodings.device
    local = torch.as_tensor([[where[int(c)] for c in row] for row in components.tolist()], device=device)
    shape = (len(images),) + tuple(encodings.shape[1:])
    pixels = torch.full(shape, 0.5, device=device, requires_grad=True)
    opt = torch.optim.Adam([pixels], lr=lr)
    coef = coefficients.to(device, torch.float32).view(*coefficients.shape, *([1] * (encodings.dim() - 1)))
    target = encodings.abs() if signed else encodings
    history = []  # loss tensors, read back once at the end: no host sync per step on a GPU
    for _ in range(steps):
        mixed = (from_pixels(pixels, meta)[local] * coef).sum(1)
        if signed:
            mixed = mixed.abs()
        loss = F.mse_loss(mixed, target) + reg * (1 - (2 * pixels - 1).abs()).mean()
        history.append(loss.detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            pixels.clamp_(0, 1)
    losses = torch.stack(history).tolist() if history else []
    return {img: pixels[j].detach() for img, j in where.items()}, losses


def run_mixup_decode(
    attack: Any, observation: Any, model: Any, meta: Any, generator: Any, device: Any
) -> Any:
    defense = attack.defense
    if not applies(attack, defense) or not observation.rows:
        gla = run_inversion(attack, observation, model, meta, generator, device)
        return AttackOutput(gla.images, gla.labels, extra={**gla.extra, "adaptive": False})
    reason = attack.check_meta(meta)
    if reason:
        from fedbench.errors import RunFailure

        raise RunFailure(reason)
    p = attack.params
    device = torch.device(device) if device is not None else torch.device("cpu")
    # the oracle mapping of the observed round's draws (every local epoch's, in the rows' order)
    mixing = defense.mixing(observation.client, observation.round)
    signed = mixing.signs is not None
    model = prepare_model(model, observation.global_state, observation.model_mode, device)
    lo, hi = box_bounds(meta, int(meta.input_shape[0]), device)
    if signed:  # sign-flipped encodings fill the mirrored box too
        bound = torch.maximum(lo.abs(), hi.abs())
        lo, hi = -bound, bound
    observed = list(observation.rows)
    dominant = [int(mixing.components[r, int(mixing.coefficients[r].argmax())]) for r in observed]
    rows = _pool_rows(mixing.components, set(dominant), observed, p.pool)
    target, _ = target_gradient(observation.kind, observation.shared, observation.lr, observation.local_steps)
    labels = observation.y_true.detach().long().to(device)  # the threat model grants the labels
    recovered = {}
    first = _gla(attack, model, target, labels, meta, generator, device, (lo, hi))
    for r, x in zip(observed, first, strict=True):
        recovered[r] = x
    params = dict(model.named_parameters())
    for r in rows[len(observed) :]:
        # the gradient the attacker observes in the iteration that trains on encoding r (batch 1)
        enc = mixing.encoded[r : r + 1].to(device)
        y = mixing.labels[r : r + 1].to(device)
        with torch.enable_grad():
            for prm in params.values():
                prm.requires_grad_(True)
            loss = F.cross_entropy(model(enc), y)
            names = [k for k in target]
            grads = torch.autograd.grad(loss, [params[k] for k in names])
            for prm in params.values():
                prm.requires_grad_(False)
        recovered[r] = _gla(
            attack, model, dict(zip(names, grads, strict=True)), y, meta, generator, device, (lo, hi)
        )[0]
    stacked = torch.stack([recovered[r] for r in rows]).cpu()
    images, history = decode(
        stacked,
        mixing.components[rows],
        mixing.coefficients[rows],
        meta,
        signed,
        p.decode_steps,
        p.decode_lr,
        p.reg,
    )
    out = torch.stack([images[i] for i in dominant])
    extra = {
        "adaptive": True,
        "pooled_encodings": len(rows),
        "decoded_images": len(images),
        "decode_loss_first": history[0] if history else None,
        "decode_loss_last": history[-1] if history else None,
        "gla_iterations": attack.settings(meta)["iterations"],
        "labels_known": True,
        "bn_stats_known": False,
        "label_strategy": "known",
        "oracle_mapping": True,
        "encoding": "instahide" if signed else "mixup",
        "gla_box": "mirrored" if signed else "valid",
    }
    return AttackOutput(out.numpy().astype("float32"), labels.cpu().numpy().astype("int64"), extra=extra)
