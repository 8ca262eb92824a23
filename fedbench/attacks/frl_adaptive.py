"""`frl-adaptive`: gradient inversion by an attacker who knows FRL's regulariser and gradient modification.

A new construction (FRL's paper, spec 003, evaluates only plain DLG): the issue's "attacker who knows
FRL's gradient modification and regulariser". FRL changes what the client sends in two ways, and
the attacker simulates both on every candidate image x:

1. The loss whose gradient is sent is FRL's full local objective, L_c - lambda * BCE(A'(softmax F(x), y), 1)
   (Eq. 5; `term=mean`: Nasr et al.'s L_c + lambda * (mean sigmoid A' - 1/2)), with A' the SA network
   the server distributed (FRL aggregates A with FedAvg and sends it with F, Fig. 1) after the client's
   `sa_steps` Adam steps on the candidate's own output and an auxiliary record of its label (the server
   owns the auxiliary set; the client's exact aux draw is unknown and is replaced by the attacker's).
   `sa_step=distributed` skips that step (A' = A), an ablation.
2. Gradient modification sends the top-rho entries of a = g + m u per tensor; in a client's first
   round u = 0, so the sent tensor is the masked true gradient, unscaled. The attacker matches only
   the sent coordinates (the observed non-zeros). In a later round u is the client's private residual:
   the attack then matches the sent entries as if u were 0 (`residual_assumed_zero` is false in the row).

Optimiser and defaults: DLG's (L2, L-BFGS lr 1, max_iter 20, 50 iterations as the FedSGD board's dlg,
iDLG label), or `optimizer=adam-signed` (IG's cosine + signed Adam). Against any defense other than
`frl` it falls back to plain matching of what was sent (DLG's objective with these settings, masked to the
observed non-zeros where a sparsifying defense acted), with `adaptive` false in the row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from fedbench.attacks.gradient_matching import iterations_param
from fedbench.attacks.inversion_base import InversionAttack
from fedbench.attacks.membership import FRL_PAPER
from fedbench.plugin import Paper
from fedbench.registry import register_attack
from fedbench.spec.params import param


@register_attack("frl-adaptive", "adaptive-frl")
class FRLAdaptive(InversionAttack):
    """Inversion of FRL's sent gradient: simulate its SA-regularised loss, match only the sent entries."""

    version = "1"
    paper = Paper(FRL_PAPER.key, f"{FRL_PAPER.title} (adaptive attack: a new construction)", FRL_PAPER.url)
    adapts_to: ClassVar[tuple[str, ...]] = ("frl",)

    @dataclass(frozen=True)
    class Params:
        iterations: int = iterations_param(
            50, "optimiser iterations (L-BFGS: each up to max_iter evaluations; the board's dlg: 50)", 100000
        )
        max_iter: int = param(20, "objective evaluations per L-BFGS iteration (DLG 20)", min=1, max=1000)
        history: int = param(100, "L-BFGS history size (DLG 100)", min=1, max=10000)
        lr: float = param(1.0, "L-BFGS step size (DLG 1) or signed-Adam learning rate", min=0, min_open=True)
        optimizer: Literal["lbfgs", "adam-signed"] = param(
            "lbfgs", "lbfgs: L2 matching (DLG); adam-signed: cosine matching (IG)"
        )
        restarts: int = param(1, "restarts, best by final objective", min=1, max=64)
        init: Literal["randn", "uniform", "patterned"] = param("randn", "image init (DLG: randn)")
        labels: Literal["idlg", "batch", "known"] = param(
            "idlg", "label strategy: idlg (batch 1), batch (counts), known (threat model grants y)"
        )
        sa_step: Literal["simulate", "distributed"] = param(
            "simulate", "simulate the client's SA step on each candidate (default) or use the sent SA as is"
        )

    defense: Any = None

    def bind_defense(self, defense: Any) -> None:
        self.defense = defense

    def settings(self, meta: Any) -> dict[str, Any]:
        p = self.params
        return {"optimizer": p.optimizer, "lr": p.lr, "iterations": p.iterations, "init": p.init}

    def run(self, observation: Any, model: Any, meta: Any, generator: Any, device: Any) -> Any:
        from fedbench.attacks._frl_adaptive_core import run_frl_adaptive

        return run_frl_adaptive(self, observation, model, meta, generator, device)
