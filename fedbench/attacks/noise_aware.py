"""`noise-aware`: the Bayes-optimal gradient inversion against a known noise defense (Balunovic et al.).

Balunovic, Dimitrov, Jovanovic, Vechev, "Bayesian framework for gradient leakage" (ICLR 2022): an
attacker who knows the defense's mechanism maximises log p(g_obs | x) + log p(x). For clipping plus
i.i.d. noise the likelihood term is the distance between the attacker-simulated CLIPPED candidate
gradient and the observation, in the norm of the noise law, scaled by the noise: L2^2 / (2 (sigma C)^2)
for Gaussian noise, L1 / b for Laplace noise; the prior is total variation with a weight. Where the
noise is large the likelihood is nearly flat and the prior dominates, which is the Bayes-optimal
behaviour; formal-DP rows are attacked by it too (the guarantee bounds it; the number shows how much
it gets).

The defense's mechanism is read from the run's defense (`bind_defense`) and scenario (`bind_data`):
which hook adds the noise (client update, server, every example's gradient), flat or per-layer
clipping, the clip bound (Fed-CDP(decay)'s C_t of the observed round) and the noise scale (a noise
multiplier times C, or an absolute sigma / b; dp-sgd's and dp-fedavg's calibrated sigma). The torch
core and the exact forms: `fedbench.attacks._noise_core`.

Optimiser: Inverting Gradients' signed Adam (lr 0.1, box-constrained, the auto plateau schedule or
a fixed budget), whose steps depend only on the ratio of likelihood and prior, not on their scale.
Against `none` (no noise) the objective is L2 matching without the prior (the MAP of an exact
observation); against a defense outside `adapts_to` the run fails with a message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from fedbench.attacks._schedules import Plateau, auto_schedule
from fedbench.attacks.gradient_matching import iterations_param
from fedbench.attacks.inversion_base import InversionAttack
from fedbench.plugin import Paper
from fedbench.registry import register_attack
from fedbench.spec.params import param

BAYES_PAPER = Paper(
    "balunovic2022bayesian",
    "Bayesian Framework for Gradient Leakage (Balunovic, Dimitrov, Jovanovic, Vechev; ICLR 2022)",
    "https://arxiv.org/abs/2111.04706",
)


@register_attack("noise-aware", "bayes-noise")
class NoiseAware(InversionAttack):
    """Bayes-optimal inversion for the defense's known clipping and noise: scaled L2 / L1 + TV prior."""

    version = "1"
    paper = BAYES_PAPER
    adapts_to: ClassVar[tuple[str, ...]] = (
        "dp-gaussian",
        "dp-laplace",
        "fed-sdp",
        "fed-cdp",
        "fed-cdp-decay",
        "dp-sgd",
        "dp-fedavg",
    )

    @dataclass(frozen=True)
    class Params:
        iterations: int | None = iterations_param(
            None,
            "signed-Adam iterations (milestone schedule); none = auto: decay on plateaus, stop when"
            " converged, capped by image size (4800 up to 32x32)",
            1000000,
        )
        lr: float = param(0.1, "signed-Adam learning rate (IG 0.1)", min=0, min_open=True)
        prior_weight: float = param(
            100.0,
            "weight w of the TV prior, -log p(x) = w * mean TV of the [0, 1] pixels, in the likelihood's"
            " nats (FedSGD board, seed 1, dp-gaussian[sigma=0.01]: 0 >= 300 > 1000 > 3000 in PSNR)",
            min=0,
        )
        likelihood: Literal["auto", "l2", "l1"] = param(
            "auto",
            "auto: the defense's law (Gaussian: L2, Laplace: L1); l2 / l1 force one law at the same"
            " noise variance (an ablation)",
        )
        restarts: int = param(1, "restarts, best by final objective", min=1, max=256)
        init: Literal["randn", "uniform", "patterned"] = param("randn", "image init (IG: randn)")
        labels: Literal["rows", "known", "idlg", "batch"] = param(
            "rows",
            "label strategy: rows (iDLG's sign rule on the last layer's bias + weight-row sum, robust to"
            " noise; batch 1, else batch), known (threat model grants y), idlg (bias only), batch (counts)",
        )

    defense: Any = None
    scenario: Any = None

    def bind_defense(self, defense: Any) -> None:
        self.defense = defense

    def bind_data(self, data: Any) -> None:
        self.scenario = getattr(data, "scenario", None)

    def settings(self, meta: Any) -> dict[str, Any]:
        p = self.params
        cap, patience = auto_schedule(tuple(meta.input_shape))
        return {
            "optimizer": "adam-signed",
            "lr": p.lr,
            "iterations": p.iterations if p.iterations is not None else cap,
            "plateau": Plateau(patience=patience) if p.iterations is None else None,
            "init": p.init,
        }

    def run(self, observation: Any, model: Any, meta: Any, generator: Any, device: Any) -> Any:
        from fedbench.attacks._noise_core import run_noise_aware

        return run_noise_aware(self, observation, model, meta, generator, device)
