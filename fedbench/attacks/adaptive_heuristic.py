"""Adaptive (defense-aware) gradient inversion against the heuristic gradient defenses (issue 28).

A heuristic defense is ranked by its adaptive worst case (design §7): the attacker knows the defense and
its parameters and attacks what the defense left intact. Both attacks are Inverting Gradients (the `ig`
parameters, optimiser and budget) plus an analytic step on the first fully connected layer
(x_j = dL/dW_ij / dL/db_i at batch 1, the recovery of `fc-leakage`), computed by
`fedbench.attacks._heuristic_core`:

- `soteria-adaptive` (adapts to `soteria`). Soteria zeroes the pruned input columns of ONE layer's weight
  gradient and shares every other tensor unchanged. The attack of Balunovic et al. (ICLR 2022, "Bayesian
  Framework for Gradient Leakage", its evaluation of heuristic defenses: Soteria is broken by leaving the
  defended layer's gradient out of the reconstruction objective; the gradient-inversion SoK, USENIX
  Security 2025, lists Soteria as bypassed) matches every tensor except the defend layer's weight
  (`defended=drop`; `kept` matches that weight's columns that were sent, an extension). Where the first FC
  layer's weight and bias gradients are untouched (Soteria defends a later layer: the default `layer=last`
  on an MLP), the analytic step recovers the input exactly and no optimisation is run; where Soteria
  defends the first layer itself, its kept columns give those pixels exactly and the optimisation fills
  the pruned ones.
- `pruning-adaptive` (adapts to `gradient-pruning`, `sparsification`). A new construction (not from a
  paper; fedbench's own): mask-aware matching (only the entries that were sent, the `pruning_aware`
  objective of LODA's pruning-adaptive attack, spec 001 §2.2) plus the analytic step on the sent
  entries of the first FC layer: at batch 1 a row i whose bias gradient db_i was sent gives
  x_j = dW_ij / db_i for every sent entry j of it; a row whose db_i was pruned but that has a sent entry
  at an already recovered pixel j gets db_i = dW_ij / x_j and gives its other entries too (repeated to
  a fixed point). The union of these pixels is exact; they are fixed (a per-pixel box collapsed to
  their value). Every pruned entry of a known row was below the smallest kept one, which bounds |x_j|
  on the other pixels (the pruning rule's box). Those are filled with the dataset mean projected into
  that box (`fill=prior`, default) or by the masked optimisation from the fixed pixels
  (`fill=optimise`): on mnist5k at p = 0.99 the sent entries beyond the analytic rows carry almost
  nothing and the optimisation filled worse than the prior (11-12 dB vs 17-18 dB). The projection makes
  each image at least as close, pixel by pixel, as the best candidate of `fc-leakage`, whose pruned
  entries read as the mean. Top-k pruning keeps the largest |db_i x_j|, i.e. the rows of the most
  active neurons, so the kept rows hold most of the foreground.

Choice without the ground truth: a complete analytic image whose rows agree (to 1e-3 relative) and
whose pixels are in range is returned as is; otherwise the constrained optimisation's output (which
holds every recovered pixel); a complete analytic image that fails a check competes with it by the
matching objective. The row says which (`choice`) and how many pixels were analytic.

Against a defense it does not adapt to (or with no defense bound), either attack says so in
`extra["adaptive_note"]` and runs without the defense-specific step: every tensor matched as sent
(`pruning_aware` as `ig`'s), the analytic step on the whole first layer. A model whose first layer is not
an nn.Linear with a bias, or a batch larger than one, skips the analytic step with the reason in
`extra["analytic_note"]` and runs the optimisation alone. Victim batches loop over the victims (an
attack with a `run` of its own, `_victims.run_victims`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from fedbench.attacks.inverting_gradients import InvertingGradients
from fedbench.plugin import Paper
from fedbench.registry import register_attack
from fedbench.spec.params import param

BAYES_LEAKAGE_PAPER = Paper(
    "balunovic2022bayesian",
    "Bayesian Framework for Gradient Leakage (adaptive attack on Soteria)",
    "https://arxiv.org/abs/2111.04706",
)
PRUNING_ADAPTIVE_PAPER = Paper(
    "fedbench-pruning-adaptive",
    "fedbench's mask-aware inversion with analytic first-layer rows (new construction; builds on "
    "LODA's pruning-adaptive matching, spec 001 §2.2, and the FC-layer recovery of fc-leakage)",
)

_ANALYTIC_HELP = (
    "recover the first FC layer's sent pixels analytically at batch 1 and fix them (x = dW_i / db_i)"
)


class _HeuristicAdaptive(InvertingGradients):
    """IG plus the run's defense (bound by the runner) and the analytic first-layer step."""

    adapts_to: ClassVar[tuple[str, ...]] = ()
    stage: ClassVar[str]  # the function of `fedbench.attacks._heuristic_core` that runs the attack
    defense: Any = None

    def bind_defense(self, defense: Any) -> None:
        self.defense = defense

    def run(self, observation: Any, model: Any, meta: Any, generator: Any, device: Any) -> Any:
        from fedbench.attacks import _heuristic_core

        return getattr(_heuristic_core, self.stage)(self, observation, model, meta, generator, device)


@register_attack("soteria-adaptive", "adaptive-soteria")
class SoteriaAdaptive(_HeuristicAdaptive):
    """Balunovic et al.'s attack on Soteria: match all but the defended layer; analytic first FC layer."""

    version = "1"
    adapts_to = ("soteria",)
    stage = "run_soteria_adaptive"
    paper = BAYES_LEAKAGE_PAPER

    @dataclass(frozen=True)
    class Params(InvertingGradients.Params):
        defended: Literal["drop", "kept"] = param(
            "drop",
            "the defend layer's weight gradient: drop it from the matching (Balunovic et al.) or match its"
            " kept columns",
        )
        analytic: bool = param(True, _ANALYTIC_HELP)
        pruning_aware: Literal["auto", "on", "off"] = param(
            "auto",
            "the other tensors, which Soteria sends unchanged: auto/off = match every entry; on = only their"
            " nonzero entries (ablation)",
        )


@register_attack("pruning-adaptive", "adaptive-pruning")
class PruningAdaptive(_HeuristicAdaptive):
    """Mask-aware IG on the sent entries, seeded with the pixels the kept first-layer rows give exactly."""

    version = "1"
    adapts_to = ("gradient-pruning", "sparsification")
    stage = "run_pruning_adaptive"
    paper = PRUNING_ADAPTIVE_PAPER

    @dataclass(frozen=True)
    class Params(InvertingGradients.Params):
        analytic: bool = param(True, _ANALYTIC_HELP)
        fill: Literal["prior", "optimise"] = param(
            "prior",
            "pixels the analytic step leaves: prior = the dataset mean projected into the box the pruning"
            " rule allows (measured better at p = 0.99); optimise = masked IG from the fixed pixels",
        )
        pruning_aware: Literal["auto", "on", "off"] = param(
            "auto",
            "auto/on = match only the sent (nonzero) entries under a defense it adapts to (elsewhere as ig);"
            " off = match every entry (ablation)",
        )
