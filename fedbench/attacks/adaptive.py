"""Defense-aware (adaptive) gradient-inversion attacks of spec 001: GLA, then undo the defense's encoding.

Both run Inverting Gradients first (same params as `ig`, so an adaptive run and its `ig` run share the
first stage bit for bit), then apply their adaptive stage when the run's defense declares them
(`Defense.adaptive_attack`); against any other defense they return the GLA output unchanged (the
paper's No-Defense and pruning columns of Tables 2 and 4 equal Tables 1 and 3). Grids add a defense's
adaptive attack beside the standard one with `adaptive = true` on an [[attack]] block; boards and
tables take the worst case over both (design §7).

- `loda-adaptive` (§2.4): min_x ||J_g(x')^T (g(x') - g(x)) - c (x' - x)||^2 over [0, 1] from the GLA
  output x', with the defense's feature extractor g (the attacker knows it). Paper: c = 1 (searched
  over {0, 1, 5, 10, 20}), 100 gradient-descent steps; the reference code: c = 5, init 0.5, plain GD
  step 0.01, clamp. The default optimiser is Adam (lr 0.01, 100 steps, init 0.5): plain GD with a
  fixed step depends on the scale of the residual, which depends on g and the image size; on the
  digits stand-in it diverged (residual 2.2e7 -> 4.5e7, 3.4 dB) where Adam reached 10.9 dB from the
  true obscured images (8 digits, c = 300). `optimizer=gd` keeps the paper's solver.
- `mixup-decode` (§2.3): Carlini et al.'s decoding with GradAttack's oracle mapping and coefficients
  (a "very strong attacker" upper bound): GLA on the gradients of `pool` training iterations (paper:
  50), then Eq. 3 by Adam (lr 0.01, 1000 steps) with abs() against InstaHide's sign flips.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

from fedbench.attacks.inverting_gradients import InvertingGradients
from fedbench.defenses.loda import LODA_PAPER
from fedbench.plugin import Paper
from fedbench.registry import register_attack
from fedbench.spec.params import param

INSTAHIDE_ATTACK_PAPER = Paper(
    "carlini2020instahide",
    "An Attack on InstaHide: Is Private Learning Possible with Instance Encoding?",
    "https://arxiv.org/abs/2011.05315",
)


class _DefenseAware(InvertingGradients):
    """IG plus the defense instance of the run (bound by the runner)."""

    defense: Any = None
    stage: ClassVar[str]  # the function of `fedbench.attacks._adaptive_core` that runs the attack

    def bind_defense(self, defense: Any) -> None:
        self.defense = defense

    def run(self, observation: Any, model: Any, meta: Any, generator: Any, device: Any) -> Any:
        from fedbench.attacks import _adaptive_core

        return getattr(_adaptive_core, self.stage)(self, observation, model, meta, generator, device)


@register_attack("loda-adaptive", "adaptive-loda")
class LodaAdaptive(_DefenseAware):
    """GLA then LODA's stationary-point inversion (Eq. 6) with the defense's feature extractor."""

    version = "2"  # 2: its GLA's pruning_aware=auto follows the defense, not the observed zeros
    stage = "run_loda_adaptive"
    paper = replace(LODA_PAPER, title=f"{LODA_PAPER.title} (adaptive attack, §4.2)")

    @dataclass(frozen=True)
    class Params(InvertingGradients.Params):
        c: float = param(1.0, "attacker's pixel weight c in Eq. 6 (paper 1; code 5)", min=0)
        steps: int = param(100, "descent steps on Eq. 6 (paper 100)", min=0)
        step_lr: float = param(
            0.01, "step size or Adam learning rate (code: plain GD step 0.01)", min=0, min_open=True
        )
        optimizer: Literal["gd", "adam"] = param(
            "adam", "Adam (scale-free; default) or plain projected gradient descent (paper, reference code)"
        )
        start: float = param(0.5, "constant initial image of Eq. 6 (code 0.5)", min=0, max=1)


@register_attack("mixup-decode", "carlini-decode", "instahide-decode")
class MixupDecode(_DefenseAware):
    """GLA on pooled iterations, then Carlini et al.'s decoding of MixUp/InstaHide (oracle mapping)."""

    version = "3"  # 3: its GLA's pruning_aware=auto follows the defense, not the observed zeros
    stage = "run_mixup_decode"
    paper = INSTAHIDE_ATTACK_PAPER

    @dataclass(frozen=True)
    class Params(InvertingGradients.Params):
        pool: int = param(
            50, "training iterations (encodings) whose reconstructions are combined (paper 50)", min=1
        )
        decode_steps: int = param(1000, "Adam steps on Eq. 3 (GradAttack 1000)", min=1)
        decode_lr: float = param(0.01, "Adam learning rate on Eq. 3 (paper 0.01)", min=0, min_open=True)
        reg: float = param(0.05, "weight of GradAttack's mean(1 - |2P - 1|) term", min=0)
