"""Analytic attacks on the first fully connected layer (spec 004): `fc-leakage` and `trap-weights`.

- `fc-leakage` (the paper's passive baseline [24]): every neuron t of the first FC layer with a
  nonzero bias gradient gives the candidate x_t = (dL/dW_t) / (dL/db_t) (spec 004 §2.6). When t is
  activated by exactly one image of the batch (an SDAN) the candidate equals that image exactly; a
  neuron activated by several images gives a weighted mixture.
- `trap-weights` (Boenisch et al., "When the Curious Abandon Honesty", the paper's [5]/[6]): a
  malicious server replaces the first FC layer of the broadcast model by Algorithm 3's trap weights
  (mu=0, sigma=2, s=0.97, zero bias; sign convention as a param, default the Boenisch reading of
  spec §2.5), so few images activate each neuron, then the same recovery.

Selection and scoring (spec §2.6/§5): the attacker cannot tell which candidate belongs to which
private image, so the attack returns all candidates in [0, 1] pixel space (optionally only those in
the valid pixel range; near-duplicates merged, strongest bias gradient first) and the metrics give
each private image one candidate: its best one (`matching=best`, the spec's oracle default; a
candidate may serve several images) or a one-to-one Hungarian assignment (`matching=one-to-one`, the
strict option, <= best per image). PSNR is capped at 100 dB and averaged over the batch; `recovered`
is the share of images above `success_psnr` (40 dB, the paper's Fig. 2 count) and `exact` the share
at the cap. The recovered neurons are listed in `extra['candidate_neurons']`.

Delivery of the malicious layer (spec §1, Eq. 8-9): the paper's server broadcasts gradients, so it
sends the crafted fc1 gradient g* = (theta - theta*) / tau and the client applies theta - tau g*
(`delivery=gradient`, the default; equal to theta* up to float rounding); `delivery=replace` sets
fc1 = theta* directly (a weight-broadcast FedAvg server). Trap weights and SDAN parameters are built
for [0, 1] pixel inputs (the paper feeds raw pixels) and folded into the dataset's normalisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from fedbench.attacks.base import ImageReconstructionAttack
from fedbench.plugin import Paper
from fedbench.registry import register_attack
from fedbench.spec.params import param

_SELECTION_HELP = (
    "candidates returned: all (every neuron with a nonzero bias gradient) or in-range (only those "
    "inside [0,1] pixel space up to range_tol, all if none is; attacker-side filtering of spec §2.6)"
)


class _FCRecovery(ImageReconstructionAttack):
    """Common checks and `run` of the first-FC-layer attacks (not registered)."""

    observation_point = "update"
    accepted_points: tuple[str, ...] = ("example", "step", "update", "server")

    def check_model(self, model: Any) -> str | None:
        from fedbench.attacks._fc_recovery import first_layer_reason

        return first_layer_reason(model)

    def run(self, observation: Any, model: Any, meta: Any, generator: Any, device: Any) -> Any:
        from fedbench.attacks._fc_recovery import recover

        return recover(self, observation, model, meta)

    def scoring(self) -> dict[str, Any]:
        return {"matching": self.params.matching, "success_psnr": self.params.success_psnr}


@dataclass(frozen=True)
class _RecoveryParams:
    selection: Literal["all", "in-range"] = param("all", _SELECTION_HELP)
    bias_tol: float = param(
        1e-8, "neurons with |dL/db_t| <= bias_tol * max|dL/db| are dropped (spec §2.6 default 1e-8)", min=0
    )
    range_tol: float = param(1e-3, "pixel-range tolerance of selection=in-range", min=0)
    dedupe_mse: float = param(
        1e-10, "merge candidates closer than this MSE in pixel space (0 = keep duplicates)", min=0
    )
    max_candidates: int = param(0, "keep at most this many candidates, strongest first; 0 = all", min=0)
    matching: Literal["best", "one-to-one"] = param(
        "best",
        "scoring: best = each private image gets its best candidate (spec default, reuse allowed); "
        "one-to-one = Hungarian assignment (strict)",
    )
    success_psnr: float = param(
        40.0, "an image counts as recovered above this PSNR (paper Fig. 2: 40 dB)", min=0
    )


@register_attack("fc-leakage", "fc-analytic")
class FCLeakage(_FCRecovery):
    """Passive analytic recovery x = dL/dW_i / dL/db_i from the first fully connected layer."""

    version = "2"
    paper = Paper(
        "poisoning-inversion-24",
        "Direct data leakage of a trained FC layer (baseline [24] of the SDAN model-poisoning paper)",
    )

    Params = _RecoveryParams


class TrapHook:
    """Malicious server: every broadcast gets trap weights in the first FC layer and a zero bias."""

    def __init__(self, params: Any, meta: Any = None):
        self.params = params
        self.meta = meta

    def broadcast(self, state: dict, round: int) -> dict:
        from fedbench.attacks._fc_recovery import poison_state

        return poison_state(state, self.params, self.meta, round)


@register_attack("trap-weights", "curious-abandon-honesty")
class TrapWeights(_FCRecovery):
    """Malicious server: trap-weight init of the first FC layer (Boenisch et al.), then analytic recovery."""

    version = "2"
    paper = Paper(
        "boenisch2023curious",
        "When the Curious Abandon Honesty: Federated Learning Is Not Private",
        "https://arxiv.org/abs/2112.02918",
    )

    @dataclass(frozen=True)
    class Params(_RecoveryParams):
        mu: float = param(0.0, "mean of the Gaussian of Algorithm 3 (paper 0)")
        sigma: float = param(2.0, "std of the Gaussian of Algorithm 3 (paper 2)", min=0, min_open=True)
        scale: float = param(0.97, "scale factor s of the positive half (paper 0.97)", min=0)
        sign: Literal["boenisch", "literal"] = param(
            "boenisch",
            "boenisch: z- = -|N(mu,sigma)|, z+ = s|z-| (spec §2.5 default); literal: z- signed, z+ = s z-",
        )
        layer: str = param("fc1", "name of the first FC layer in the broadcast state")
        seed: int = param(0, "seed of the trap weights (mixed with the round)", min=0)
        pixel_space: bool = param(
            True, "build the layer for [0,1] pixels and fold the dataset normalisation in (False: as is)"
        )
        delivery: Literal["gradient", "replace"] = param(
            "gradient",
            "gradient: broadcast g* = (theta - theta*)/tau, clients apply it (paper Eq. 8-9); "
            "replace: set the weights directly",
        )
        tau: float = param(
            0.1,
            "FL learning rate tau of the gradient delivery (cancels; spec default 0.1)",
            min=0,
            min_open=True,
        )

    def server_hook(self, meta: Any = None) -> Any:
        return TrapHook(self.params, meta)
