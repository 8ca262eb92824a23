"""Torch core of `frl-adaptive`: gradient inversion by an attacker who knows FRL's objective and its
gradient modification (a new construction; design in `fedbench.attacks.frl_adaptive`).

FRL's client sends the gradient of L = L_c - lambda * BCE(A'(softmax F(x), y), 1) (Eq. 5; `term=mean`:
L_c + lambda * (mean sigmoid A' - 1/2)), where A' is the server's SA network A after the client's
`sa_steps` Adam steps on lambda * [BCE(A(F(x_loc), y_loc), 1) + BCE(A(F(x_aux), y_aux), 0)], then
sparsified by gradient modification: a = g + m u, top-rho of |a| per tensor sent, the rest kept in the
residual u (zero in a client's first round, so the sent tensor is the masked true gradient, unscaled).

`FRLMatcher` computes, for each candidate, the gradient of that same objective: A' simulated from the
distributed A with the candidate's own softmax output and an auxiliary record of the candidate's label
drawn by the attacker from the server's auxiliary set (the server holds it; the client's own draw is
unknown), A' frozen in the classifier's loss exactly as FRL freezes it; then it matches only the sent
coordinates (the observed non-zeros). A' depends on the candidate through the signs of Adam's first
step, a piecewise-constant map, so it is recomputed at every evaluation and not differentiated.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
import torch.nn.functional as F

from fedbench.attacks._inversion import (
    GradientMatcher,
    box_bounds,
    initial_images,
    prepare_model,
    reconstruct_restarts,
    target_gradient,
    to_pixels,
    update_as_gradient,
)
from fedbench.errors import RunFailure


def distributed_sa(defense: Any, rnd: int, num_classes: int) -> tuple[torch.nn.Module, str]:
    """The SA network the server sent in round `rnd`, and how it was obtained.

    Round 0: the defense's initial SA network, rebuilt as `FRLState` builds it (seeded by the run seed).
    Later rounds: the simulation stops after aggregating the observed round, so the state it holds is
    the next round's (the FedAvg of the observed round's SA networks): an approximation, said in the row.
    """
    from fedbench.models._membership_net import MembershipNet

    p = defense.params
    if rnd == 0:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(defense._seed)
            sa = MembershipNet(num_classes, p.sa_arch)
        return sa, "initial (rebuilt from the run seed: exact)"
    sa = MembershipNet(num_classes, p.sa_arch)
    sa.load_state_dict(defense._state.sa_global)
    return sa, "after the observed round (the next round's; approximation)"


class FRLMatcher(GradientMatcher):
    """L2 (or cosine) matching of the sent coordinates of FRL's full local objective's gradient."""

    def __init__(
        self,
        model: Any,
        target: dict[str, torch.Tensor],
        *,
        sa: torch.nn.Module,
        frl: Any,
        aux: tuple[torch.Tensor, torch.Tensor] | None,
        simulate_step: bool,
        masked: bool,
        cost: str = "l2",
    ):
        super().__init__(model, target, cost=cost, pruning_aware=masked)  # type: ignore[arg-type]
        self.sa0 = sa.to(next(iter(self.params.values())).device)
        self.frl = frl
        self.aux = aux
        self.simulate_step = simulate_step

    def _client_sa(self, probs: torch.Tensor, y: torch.Tensor) -> torch.nn.Module:
        """A' = A after the client's SA steps (Eq. 2) on the candidate's outputs, frozen afterwards."""
        p = self.frl
        sa = copy.deepcopy(self.sa0)
        if self.simulate_step and self.aux is not None:
            ax, ay = self.aux
            opt = torch.optim.Adam(sa.parameters(), lr=p.sa_lr)
            with torch.no_grad():
                model, _ = self._single_model()
                probs_out = torch.softmax(model(ax), dim=1)
            ones, zeros = torch.ones(len(y), device=y.device), torch.zeros(len(ay), device=y.device)
            with torch.enable_grad():
                for _ in range(p.sa_steps):
                    opt.zero_grad()
                    loss = p.lam * (
                        F.binary_cross_entropy_with_logits(sa(probs, y), ones)
                        + F.binary_cross_entropy_with_logits(sa(probs_out, ay), zeros)
                    )
                    loss.backward()
                    opt.step()
        for q in sa.parameters():
            q.requires_grad_(False)
        return sa

    def gradients(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        """Per candidate: the gradient of L_c - lambda * BCE(A'(softmax F(x), y), 1) (or Nasr's term)."""
        p = self.frl
        model, leaves = self._single_model()
        out = []
        for r in range(x.shape[0]):
            xr, yr = x[r], y[r]
            with torch.enable_grad():
                logits = model(xr)
                probs = torch.softmax(logits, dim=1)
                sa = self._client_sa(probs.detach(), yr)
                base = F.cross_entropy(logits, yr)
                a_logit = sa(probs, yr)
                if p.term == "bce":
                    loss = base - p.lam * F.binary_cross_entropy_with_logits(
                        a_logit, torch.ones_like(a_logit)
                    )
                else:
                    loss = base + p.lam * (torch.sigmoid(a_logit).mean() - 0.5)
                g = torch.autograd.grad(loss, leaves, create_graph=x.requires_grad, materialize_grads=True)
            out.append(g)
        return [torch.stack([g[i] for g in out]) for i in range(len(self.names))]


def _aux_records(defense: Any, labels: torch.Tensor, generator: torch.Generator, device: Any):
    """One auxiliary record per label, of that label (uniform when the set lacks it or FRL samples so)."""
    state = defense._state
    ax, ay = state.aux_x, state.aux_y
    picks = []
    for c in labels.tolist():
        pool = torch.nonzero(ay.cpu() == c).flatten()
        if defense.params.aux_sampling == "uniform" or len(pool) == 0:
            pool = torch.arange(len(ay))
        picks.append(int(pool[torch.randint(len(pool), (1,), generator=generator)]))
    idx = torch.tensor(picks)
    return ax[idx.to(ax.device)].to(device), ay[idx.to(ay.device)].to(device)


def run_frl_adaptive(
    attack: Any, observation: Any, model: Any, meta: Any, generator: Any, device: Any
) -> Any:
    from fedbench.attacks.label_recovery import recover_labels
    from fedbench.plugin import AttackOutput

    defense = attack.defense
    adaptive = getattr(defense, "name", None) == "frl"
    reason = attack.check_meta(meta)
    if reason:
        raise RunFailure(reason)
    device = torch.device(device) if device is not None else torch.device("cpu")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    p = attack.params
    model = prepare_model(model, observation.global_state, observation.model_mode, device)
    target, note = target_gradient(
        observation.kind, observation.shared, observation.lr, observation.local_steps
    )
    batch = int(len(observation.y_true))
    shape = tuple(int(s) for s in meta.input_shape)
    guess = recover_labels(
        p.labels,
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
        raise RunFailure(f"frl-adaptive: no label found ({guess.strategy}); use labels=known or idlg")
    cost = "l2" if p.optimizer == "lbfgs" else "cosine"
    if adaptive:
        frl = defense.params
        sa, sa_source = distributed_sa(defense, observation.round, meta.num_classes)
        masked = frl.gm != "off" and bool(observation.sparsified)
        aux = _aux_records(defense, guess.labels, generator, device) if p.sa_step == "simulate" else None
        matcher: GradientMatcher = FRLMatcher(
            model,
            target,
            sa=sa,
            frl=frl,
            aux=aux,
            simulate_step=p.sa_step == "simulate" and "loss" in tuple(observation.defense_hooks),
            masked=masked,
            cost=cost,
        )
        about = {
            "frl_term": frl.term,
            "frl_lambda": frl.lam,
            "sa_network": sa_source,
            "sa_step_simulated": matcher.simulate_step,
        }
    else:  # documented fallback: plain matching of what was sent (DLG's objective with these settings)
        masked = bool(observation.sparsified)
        matcher = GradientMatcher(model, target, cost=cost, pruning_aware=masked)  # type: ignore[arg-type]
        about = {"fallback": f"defense '{getattr(defense, 'name', 'none')}' is not frl: plain matching"}
    R = int(p.restarts)
    x0 = initial_images(p.init, R, batch, shape, meta, generator, device)
    box = box_bounds(meta, shape[0], device)
    rec = reconstruct_restarts(
        matcher,
        x0,
        batched=True,
        labels=guess.labels,
        optimizer="lbfgs" if p.optimizer == "lbfgs" else "adam-signed",
        iterations=p.iterations,
        lr=p.lr,
        box=box,
        lbfgs_max_iter=p.max_iter,
        lbfgs_history=p.history,
        name=attack.name,
    )
    best = rec.best
    images = to_pixels(rec.x[best], meta)
    if not bool(torch.isfinite(images).all()):
        raise RunFailure(f"{attack.name}: non-finite reconstruction")
    objectives = [float(v) if math.isfinite(float(v)) else None for v in rec.objective.tolist()]
    extra: dict[str, Any] = {
        "adaptive": adaptive,
        **about,
        "sent_coordinates_only": masked,
        "residual_assumed_zero": observation.round == 0,
        "final_objective": objectives[best],
        "restart_objectives": objectives,
        "restarts": R,
        "best_restart": best,
        "iterations": int(rec.iterations),
        "evaluations": int(rec.evaluations),
        "diverged_restarts": int(sum(rec.diverged)),
        "optimizer": p.optimizer,
        "init": p.init,
        "label_strategy": guess.strategy,
        "labels_known": p.labels == "known",
        "bn_stats_known": False,
        "model_mode": observation.model_mode,
        "observation_kind": observation.kind,
        "observation_note": note,
        "observed_zero_fraction": round(
            sum(int((t == 0).sum()) for t in target.values())
            / max(sum(t.numel() for t in target.values()), 1),
            6,
        ),
    }
    as_gradient = update_as_gradient(observation.kind, observation.local_steps)
    if as_gradient is not None:
        extra["update_as_gradient"] = as_gradient
    return AttackOutput(
        images=images.detach().cpu().numpy().astype("float32"),
        labels=guess.labels.detach().cpu().numpy().astype("int64"),
        extra=extra,
    )
