"""L2 gradient-matching attacks optimised with L-BFGS: DLG, iDLG and CPL.

- `dlg` (Zhu, Liu, Han 2019): dummy images N(0, 1) and dummy label logits optimised jointly with
  L-BFGS (lr 1, max_iter 20, history 100: the torch defaults the DLG code uses) on the squared L2
  distance summed over all layers, soft labels softmax(logits). Paper: 300 iterations.
- `idlg` (Zhao, Mopuri, Bilen 2020): the label read from the last layer's gradient, then DLG on the
  image only.
- `cpl` (Wei et al. 2020, as used by Fed-CDP, spec 002 §2): CPL's patterned random seed (a U[0, 1)
  tile of half the resolution repeated 2x2), iDLG labels, L2 matching with L-BFGS, at most 300
  iterations, success when the matching loss falls below a threshold (1e-4; the paper leaves it
  unspecified), `iterations_to_success` recorded.

One iteration = one `torch.optim.LBFGS.step` (up to `max_iter` objective evaluations), as in the
DLG and CPL code. Restarts run as one batched optimisation with per-candidate L-BFGS state (see
`fedbench.attacks._inversion`), which equals independent runs; the best restart by final objective
is returned. The box is applied to the returned images only (L-BFGS runs unconstrained, as DLG).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from fedbench.attacks.inversion_base import InversionAttack
from fedbench.plugin import Paper
from fedbench.registry import register_attack
from fedbench.spec.params import param

DLG_PAPER = Paper("zhu2019dlg", "Deep Leakage from Gradients", "https://arxiv.org/abs/1906.08935")
_LABELS_HELP = (
    "label strategy: known (threat model grants y), idlg (batch 1 analytic, else batch), "
    "batch (last-layer gradient counts), optimise (DLG joint soft labels)"
)
_PRUNE_HELP = (
    "match only the observed non-zero entries (pruning-adaptive, spec 001 §2.2); auto = on "
    "when a pruning or sparsifying defense acted on the observation"
)


def iterations_param(default: int, help: str, maximum: int) -> Any:
    """The `iterations` parameter of an optimisation attack: at least 1, at most `maximum`."""
    return param(default, help, min=1, max=maximum)


@register_attack("dlg", "deep-leakage")
class DLG(InversionAttack):
    """Deep Leakage from Gradients: L2 gradient matching, joint image+label L-BFGS."""

    version = "3"  # 3: pruning_aware=auto follows the defense, not the observed zeros
    paper = DLG_PAPER

    @dataclass(frozen=True)
    class Params:
        iterations: int = iterations_param(
            50, "L-BFGS iterations (each up to max_iter evaluations); paper 300 (CPU default 50)", 100000
        )
        max_iter: int = param(
            20, "objective evaluations per L-BFGS iteration (torch/DLG default 20)", min=1, max=1000
        )
        history: int = param(100, "L-BFGS history size (torch/DLG default 100)", min=1, max=10000)
        lr: float = param(1.0, "L-BFGS step size (paper 1)", min=0, min_open=True)
        restarts: int = param(
            1,
            "independent restarts, one vmap batch where it pays (else one at a time); best by objective",
            min=1,
            max=256,
        )
        init: Literal["randn", "uniform", "patterned"] = param("randn", "image init (paper: randn)")
        labels: Literal["optimise", "idlg", "batch", "known"] = param("optimise", _LABELS_HELP)
        pruning_aware: Literal["auto", "on", "off"] = param("auto", _PRUNE_HELP)

    def settings(self, meta: Any) -> dict[str, Any]:
        p = self.params
        return {
            "cost": "l2",
            "optimizer": "lbfgs",
            "lr": p.lr,
            "iterations": p.iterations,
            "lbfgs_max_iter": p.max_iter,
            "lbfgs_history": p.history,
            "init": p.init,
            "boxed": True,
        }


@register_attack("idlg")
class IDLG(DLG):
    """Improved DLG: analytic label from the last layer's gradient, then L2 matching with L-BFGS."""

    version = "3"
    paper = Paper(
        "zhao2020idlg", "iDLG: Improved Deep Leakage from Gradients", "https://arxiv.org/abs/2001.02610"
    )

    @dataclass(frozen=True)
    class Params(DLG.Params):
        """DLG's parameters; only the label strategy's default differs (the analytic iDLG label)."""

        labels: Literal["idlg", "batch", "known", "optimise"] = param("idlg", _LABELS_HELP)


@register_attack("cpl", "cpl-attack")
class CPL(DLG):
    """CPL gradient leakage (Fed-CDP's attack): patterned init, iDLG label, L-BFGS, success threshold."""

    version = "3"
    paper = Paper(
        "wei2020cpl",
        "A Framework for Evaluating Client Privacy Leakages in Federated Learning",
        "https://arxiv.org/abs/2004.10397",
    )

    @dataclass(frozen=True)
    class Params(DLG.Params):
        """DLG's parameters with CPL's defaults (300 iterations, patterned init, iDLG label), plus its
        success test."""

        iterations: int = param(300, "maximum L-BFGS iterations (paper 300)", min=1, max=100000)
        init: Literal["patterned", "randn", "uniform"] = param("patterned", "image init (paper: patterned)")
        labels: Literal["idlg", "batch", "known", "optimise"] = param("idlg", _LABELS_HELP)
        success_threshold: float = param(
            1e-4,
            "success when the L2 matching loss is below this (paper: unspecified; spec default 1e-4)",
            min=0,
            min_open=True,
        )
        stop_on_success: bool = param(
            True, "stop once every restart succeeded (saves CPU; false runs all iterations)"
        )

    def settings(self, meta: Any) -> dict[str, Any]:
        return {
            **super().settings(meta),
            "success_threshold": self.params.success_threshold,
            "stop_on_success": self.params.stop_on_success,
        }
