"""Torch core of the `frl` defense (Federated Regularization Learning, spec 003 §3).

`FRLState` is the defense-internal state of one simulation (the defense object lives for the whole
run): the server's auxiliary set, the global SA network, the SA states the round's clients send
back, and every client's gradient-modification residual u (kept on the client across rounds).

- Simulated attacker (Eqs. 2, 3, 5): before every classifier step the client's SA network A is
  trained `sa_steps` times on L_SA = lambda * [BCE(A(F(x_loc), y_loc), 1) + BCE(A(F(x_aux), y_aux), 0)]
  with F frozen (its outputs computed without gradient and without touching BatchNorm statistics),
  then the classifier's loss is L = L_c - lambda * BCE(A(F(x_loc), y_loc), 1) with A frozen
  (`term=bce`, Eq. 5 as written). That term is unbounded: its gradient on A's logit stays near
  lambda even once A is fooled, so the classifier keeps pushing its outputs away from the data.
  `term=mean` is the privacy term of Nasr et al.'s adversarial-regularisation code
  (SPIN-UMass/ML-Privacy-Regulization, `alpha * (mean(A) - 0.5)`): L = L_c + lambda * (mean A - 1/2),
  whose gradient vanishes as A's output on members reaches 0.
  A starts every round from the global SA state and is aggregated with FedAvg (weights n_k) beside
  the classifier. Adam's moments are not federated: each client's round starts a fresh optimiser.
- Gradient modification (Eq. 6): a = g + m * u; the entries selected by the threshold (top-rho of
  |a| per tensor, or |a| > tau) are applied/transmitted, the rest become the new residual u. With
  m > 1 an unselected residual grows geometrically, so every entry is eventually transmitted.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from fedbench.models._membership_net import MembershipNet


def gm_select(a: torch.Tensor, mode: str, rho: float, tau: float) -> torch.Tensor:
    """The boolean mask S_select of the entries of `a` transmitted now."""
    if mode == "absolute":
        return a.abs() > tau
    flat = a.abs().flatten()
    k = max(1, math.ceil(rho * flat.numel()))
    mask = torch.zeros(flat.numel(), dtype=torch.bool, device=a.device)
    if k >= flat.numel():
        mask[:] = True
    else:
        mask[torch.topk(flat, k, sorted=False).indices] = True
    return mask.view_as(a)


def gradient_modification(
    grads: dict[str, torch.Tensor],
    residual: dict[str, torch.Tensor] | None,
    m: float,
    mode: str,
    rho: float,
    tau: float,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Eq. 6: (transmitted part, new residual) of a = g + m * u."""
    sent, kept = {}, {}
    for name, g in grads.items():
        a = g + m * residual[name] if residual is not None else g.clone()
        mask = gm_select(a, mode, rho, tau)
        sent[name] = torch.where(mask, a, torch.zeros_like(a))
        kept[name] = torch.where(mask, torch.zeros_like(a), a)
    return sent, kept


class _FrozenForward:
    """Run the classifier without changing its BatchNorm running statistics (extra forwards of FRL)."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __enter__(self) -> None:
        self.saved = {k: b.detach().clone() for k, b in self.model.named_buffers()}

    def __exit__(self, *exc: Any) -> None:
        with torch.no_grad():
            for k, b in self.model.named_buffers():
                b.copy_(self.saved[k])


class FRLState:
    """SA networks, auxiliary set and GM residuals of one simulation (see the module docstring)."""

    def __init__(
        self,
        params: Any,
        aux_x: torch.Tensor,
        aux_y: torch.Tensor,
        num_classes: int,
        client_sizes: list[int],
        seed: int,
    ):
        self.p = params
        self.aux_x, self.aux_y = aux_x, aux_y
        self.client_sizes = client_sizes
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.sa = MembershipNet(num_classes, params.sa_arch)
        self.sa_global = {k: v.detach().clone() for k, v in self.sa.state_dict().items()}
        self.current: tuple[int, int] | None = None
        self.opt: torch.optim.Optimizer | None = None
        self.round_states: list[tuple[dict[str, torch.Tensor], float]] = []
        self.residual: dict[int, dict[str, torch.Tensor]] = {}
        self.bce = nn.BCEWithLogitsLoss()
        labels = aux_y.cpu()
        self._by_class = {int(c): torch.nonzero(labels == c).flatten() for c in torch.unique(labels)}

    # ------------------------------------------------------------------------------- SA network
    def _begin(self, rnd: int, client: int, device: torch.device) -> None:
        """A client's first local step of a round: A <- global SA state, fresh Adam."""
        if self.current == (rnd, client):
            return
        self.current = (rnd, client)
        self.sa.load_state_dict(self.sa_global)
        self.sa.to(device)
        self.opt = torch.optim.Adam(self.sa.parameters(), lr=self.p.sa_lr)
        if self.aux_x.device != device:
            self.aux_x, self.aux_y = self.aux_x.to(device), self.aux_y.to(device)

    def loss(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, base_loss: torch.Tensor, ctx: Any
    ) -> torch.Tensor:
        """Train A (Eq. 2), then return the classifier objective L_c - lambda * L_SA' (Eq. 5)."""
        p = self.p
        self._begin(ctx.round, ctx.client, x.device)
        pick = self._aux_batch(y, ctx.generator).to(x.device)
        x_out, y_out = self.aux_x[pick], self.aux_y[pick]
        with _FrozenForward(model):
            probs = torch.softmax(model(x), dim=1)  # F is unchanged until the engine's step: one forward
            with torch.no_grad():
                probs_out = torch.softmax(model(x_out), dim=1)
        probs_loc = probs.detach()
        ones, zeros = torch.ones(len(y), device=x.device), torch.zeros(len(y), device=x.device)
        self.sa.train()
        for _ in range(p.sa_steps):
            self.opt.zero_grad()
            l_sa = p.lam * (
                self.bce(self.sa(probs_loc, y), ones) + self.bce(self.sa(probs_out, y_out), zeros)
            )
            l_sa.backward()
            self.opt.step()
        for q in self.sa.parameters():
            q.requires_grad_(False)
        try:
            logits = self.sa(probs, y)
        finally:
            for q in self.sa.parameters():
                q.requires_grad_(True)
        if p.term == "bce":  # Eq. 5 literally: L_c - lambda * L_SA'
            return base_loss - p.lam * self.bce(logits, ones)
        return base_loss + p.lam * (torch.sigmoid(logits).mean() - 0.5)  # Nasr et al.'s code

    def _aux_batch(self, y: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Indices of an aux batch as large as the local one: uniform, or with the local batch's labels.

        Class-matched sampling keeps the SA network from telling a 2-class client's data from the
        10-class aux set by the label alone (the label shift the spec warns about for the MIA, §2.2);
        a label-only SA gives the classifier no useful signal and pushes its outputs off the data.
        A class the aux set lacks is drawn uniformly.
        """
        n = len(self.aux_y)
        pick = torch.randint(n, (len(y),), generator=generator)
        if self.p.aux_sampling == "uniform":
            return pick
        y_cpu = y.cpu()
        for c in torch.unique(y_cpu).tolist():
            pool = self._by_class.get(c)
            if pool is None:
                continue
            where = torch.nonzero(y_cpu == c).flatten()
            pick[where] = pool[torch.randint(len(pool), (len(where),), generator=generator)]
        return pick

    def client_done(self, client: int) -> None:
        """After a client's local training: keep its SA state for the server's FedAvg."""
        if self.current is not None and self.current[1] == client:
            state = {k: v.detach().clone() for k, v in self.sa.state_dict().items()}
            self.round_states.append((state, float(self.client_sizes[client])))
        self.current = None

    def aggregate_sa(self) -> None:
        """FedAvg of the round's SA states (weighted by n_k) becomes the global SA network."""
        if not self.round_states:
            return
        total = sum(w for _, w in self.round_states)
        self.sa_global = {
            k: sum(s[k] * (w / total) for s, w in self.round_states) for k in self.round_states[0][0]
        }
        self.round_states = []

    # ---------------------------------------------------------------------- gradient modification
    def modify(self, grads: dict[str, torch.Tensor], client: int) -> dict[str, torch.Tensor]:
        p = self.p
        sent, kept = gradient_modification(grads, self.residual.get(client), p.m, p.threshold, p.rho, p.tau)
        self.residual[client] = kept
        return sent
