"""Torch core of `fedavg-leakage` (Dimitrov et al., TMLR 2022): reconstruct by simulating local training.

`simulate_update` replays the client's FedAvg round on candidate data: `steps` SGD steps of size `lr`
on minibatches of `batch_size`, each a plain functional step theta <- theta - lr * grad(loss), kept in
the autograd graph (create_graph), so the simulated update theta_E - theta_0 is differentiable w.r.t.
the candidate images. `reconstruct` optimises the candidates so that the simulated update matches the
observed one: 1 - cosine similarity over all shared tensors (the paper's cosine-type matching) plus a
total-variation prior, signed Adam with IG's step-size milestones, boxed, restarts one after another,
the best restart by final objective.

Order of the data within the round. The client shuffles its data afresh every epoch and the attacker
does not see the shuffle. The paper reconstructs one image set per epoch and ties the sets together
with its epoch-order-invariant prior (matched per-epoch reconstructions pulled to their mean). Here
the prior is simplified into a hard constraint: ONE set of candidates, reused in every epoch (the
attacker knows the client re-uses its data), batched in a fixed order (candidate i in slot i every
epoch). The simulation is therefore exact, up to relabelling the candidates, whenever every local step
sees all the data (batch_size 0 or >= the client's examples), and for mini-batches within one epoch
when the labels per batch are right; otherwise the fixed order is an approximation, stated in the row.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedbench.attacks._inversion import (
    box_bounds,
    initial_images,
    prepare_model,
    to_pixels,
    total_variation,
)
from fedbench.errors import RunFailure

ORDER_NOTE = (
    "one candidate set reused every epoch, batched in a fixed order (the client's shuffle is unknown)"
)


def functional_model(model: nn.Module) -> nn.Module:
    """The model to simulate with: train-mode BatchNorm uses batch statistics without tracking them."""
    if model.training and any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        model = copy.deepcopy(model)
        torch.func.replace_all_batch_norm_modules_(model)
    return model


def simulate_update(
    model: nn.Module,
    start: dict[str, torch.Tensor],
    fixed: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lr: float,
    steps: int,
    batch_size: int,
    create_graph: bool = True,
) -> dict[str, torch.Tensor]:
    """The FedAvg update theta_E - theta_0 of `steps` local SGD steps on (x, y), batched in order.

    `start` holds the trained parameters theta_0 (the observation's keys), `fixed` the model's other
    parameters and buffers. Step s uses batch s mod ceil(N / batch_size) (batch_size 0 = all N): the
    engine's local loop with the identity shuffle. Cross-entropy with mean reduction, as the clients.
    """
    n = len(y)
    bs = batch_size if 0 < batch_size < n else n
    per_epoch = math.ceil(n / bs)
    params = {k: v.detach().requires_grad_(True) for k, v in start.items()}
    names = list(params)
    for s in range(steps):
        b = s % per_epoch
        xb, yb = x[b * bs : (b + 1) * bs], y[b * bs : (b + 1) * bs]
        out = torch.func.functional_call(model, {**fixed, **params}, (xb,))
        loss = F.cross_entropy(out, yb)
        grads = torch.autograd.grad(loss, [params[k] for k in names], create_graph=create_graph)
        params = {k: params[k] - lr * g for k, g in zip(names, grads, strict=True)}
    return {k: params[k] - start[k] for k in names}


def cosine_cost(sim: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> torch.Tensor:
    """1 - cosine similarity between the simulated and the observed update, over all tensors at once."""
    dot = sum((sim[k] * target[k]).sum() for k in target)
    a = sum(sim[k].pow(2).sum() for k in target)
    b = sum(target[k].pow(2).sum() for k in target)
    return 1 - dot / (a.sqrt() * b.sqrt() + 1e-12)


class UpdateSimulator:
    """The victim model at the received weights, the observed update, and the client's local schedule."""

    def __init__(self, model: nn.Module, observation: Any, device: torch.device):
        model = prepare_model(model, observation.global_state, observation.model_mode, device)
        self.model = functional_model(model)
        named = dict(self.model.named_parameters())
        missing = [k for k in observation.shared if k not in named]
        if missing:
            raise RunFailure(f"observed tensors {missing[:3]} are not parameters of the model")
        self.target = {k: v.detach().float().to(device) for k, v in observation.shared.items()}
        self.start = {k: named[k].detach() for k in self.target}
        self.fixed = {k: v.detach() for k, v in named.items() if k not in self.target}
        self.fixed.update({k: v for k, v in self.model.named_buffers()})
        self.lr = float(observation.lr)
        self.steps = int(observation.local_steps)
        self.batch_size = int(observation.batch_size)

    def update(self, x: torch.Tensor, y: torch.Tensor, create_graph: bool = True) -> dict[str, torch.Tensor]:
        return simulate_update(
            self.model,
            self.start,
            self.fixed,
            x,
            y,
            lr=self.lr,
            steps=self.steps,
            batch_size=self.batch_size,
            create_graph=create_graph,
        )

    def exact_order(self, n: int) -> bool:
        """Whether the fixed order loses nothing: every step sees all n examples, or one epoch at most
        (then the candidates' slots are free; only the labels per batch may differ)."""
        return self.batch_size == 0 or self.batch_size >= n


def reconstruct(
    sim: UpdateSimulator,
    labels: torch.Tensor,
    x0: torch.Tensor,
    *,
    iterations: int,
    lr: float,
    tv_weight: float,
    box: tuple[torch.Tensor, torch.Tensor] | None,
    lr_decay: bool,
) -> tuple[torch.Tensor, list[float]]:
    """Optimise each restart's candidates x0[r] ([R, B, C, H, W]); returns (best candidates, objectives).

    Signed Adam (Inverting Gradients' optimiser), MultiStepLR x0.1 at 3/8, 5/8, 7/8 of the iterations,
    clamped into the valid box after every step.
    """
    best_x, objectives = None, []
    for r in range(x0.shape[0]):
        x = x0[r].clone().requires_grad_(True)
        opt = torch.optim.Adam([x], lr=lr)
        marks = [int(iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)] if lr_decay else []
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=marks, gamma=0.1)
        for _ in range(iterations):
            opt.zero_grad(set_to_none=True)
            cost = _objective(sim, x, labels, tv_weight)
            (g,) = torch.autograd.grad(cost, [x])
            x.grad = g.sign()
            opt.step()
            sched.step()
            if box is not None:
                with torch.no_grad():
                    x.copy_(torch.maximum(torch.minimum(x, box[1]), box[0]))
        final = float(_objective(sim, x, labels, tv_weight).detach())
        if not math.isfinite(final):
            raise RunFailure("fedavg-leakage: the simulated update became non-finite")
        objectives.append(final)
        if final <= min(objectives):
            best_x = x.detach().clone()
    assert best_x is not None
    return best_x, objectives


def _objective(sim: UpdateSimulator, x: torch.Tensor, labels: torch.Tensor, tv_weight: float) -> torch.Tensor:
    cost = cosine_cost(sim.update(x, labels), sim.target)
    if tv_weight > 0:
        cost = cost + tv_weight * total_variation(x.unsqueeze(0))[0]
    return cost


def run_fedavg_leakage(
    self: Any, observation: Any, model: nn.Module, meta: Any, generator: Any, device: Any
) -> Any:
    """The `run` of `fedavg-leakage`: labels, candidates, simulated-update matching, pixels out."""
    from fedbench.attacks._inversion import target_gradient
    from fedbench.attacks.inverting_gradients import auto_tv_weight
    from fedbench.attacks.label_recovery import recover_labels
    from fedbench.plugin import AttackOutput

    reason = self.check_meta(meta)
    if reason:
        raise RunFailure(reason)
    if observation.kind != "delta":
        raise RunFailure(f"{self.name} simulates a FedAvg round; the observation is a '{observation.kind}'")
    device = torch.device(device) if device is not None else torch.device("cpu")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    p = self.params
    sim = UpdateSimulator(model, observation, device)
    n = int(len(observation.y_true))  # the number of examples is known; their labels are not
    shape = tuple(int(s) for s in meta.input_shape)
    # label counts from the equivalent gradient of the round (the FedSGD estimate, as the paper's start)
    grads, _ = target_gradient("delta", observation.shared, observation.lr, observation.local_steps)
    guess = recover_labels(
        p.labels,
        model=sim.model,
        grads={k: v.to(device) for k, v in grads.items()},
        num_classes=meta.num_classes,
        batch=n,
        y_true=observation.y_true if p.labels == "known" else None,
        input_shape=shape,
        generator=generator,
        device=device,
    )
    if guess.labels is None:
        raise RunFailure(f"{self.name}: no labels ({guess.strategy}); use labels=known")
    tv = p.tv_weight if p.tv_weight is not None else auto_tv_weight(shape[0])
    x0 = initial_images("randn", int(p.restarts), n, shape, meta, generator, device)
    box = box_bounds(meta, shape[0], device)
    x, objectives = reconstruct(
        sim, guess.labels, x0, iterations=p.iterations, lr=p.lr, tv_weight=tv, box=box, lr_decay=p.lr_decay
    )
    images = to_pixels(x, meta)
    best = min(range(len(objectives)), key=objectives.__getitem__)
    return AttackOutput(
        images=images.detach().cpu().numpy().astype("float32"),
        labels=guess.labels.detach().cpu().numpy().astype("int64"),
        extra={
            "iterations": int(p.iterations),
            "final_objective": objectives[best],
            "restart_objectives": objectives,
            "best_restart": best,
            "restarts": int(p.restarts),
            "cost": "cosine",
            "optimizer": "adam-signed",
            "tv_weight": float(tv),
            "label_strategy": guess.strategy,
            "labels_known": p.labels == "known",
            "simulated_steps": sim.steps,
            "simulated_batch_size": sim.batch_size,
            "order": "exact" if sim.exact_order(n) else ORDER_NOTE,
            "observation_kind": observation.kind,
        },
    )
