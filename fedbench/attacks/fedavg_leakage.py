"""Data Leakage in Federated Averaging (Dimitrov, Balunovic, Konstantinov, Vechev, TMLR 2022).

A FedAvg client sends theta_E - theta_0 after several local SGD steps. Gradient-matching attacks
(dlg, ig) match that update as one gradient -delta/(lr*steps) at theta_0, which is exact only for one
step. This attack instead simulates the client's round on its candidates: the same number of local
steps, the same lr and batch size (read from the observation), each step differentiable, so the
candidates are optimised until the simulated update matches the observed one (1 - cosine + TV,
signed Adam as Inverting Gradients, boxed, restarts). The paper's epoch-order-invariant prior is taken
in a simplified, hard form: one candidate set is reused in every epoch, batched in a fixed order (the
client's shuffle is unknown to the attacker); the row says whether that order was exact
(`_fedavg_core` explains when). Labels: known (threat model) or batch counts from the round's
equivalent gradient.

Budget: the paper runs a few thousand Adam steps per client; `iterations` (default 1000) is the CPU
friendly default, each iteration costs one simulated round (steps forward/backward passes, twice).
It applies only to FedAvg with more than one local step: with one step (or FedSGD) the simulated
update is one gradient and this is Inverting Gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from fedbench.attacks.base import ImageReconstructionAttack
from fedbench.attacks.gradient_matching import iterations_param
from fedbench.plugin import Paper
from fedbench.registry import register_attack
from fedbench.spec.params import param


def one_step_reason(scenario: Any) -> str | None:
    """Why a scenario's client update is a single gradient step (so plain matching is this attack)."""
    if scenario.protocol != "fedavg":
        return f"protocol={scenario.protocol} shares one gradient; the attack simulates FedAvg's local steps"
    if scenario.local_steps == 1:
        return "local_steps=1: the update is one gradient step; use inverting-gradients"
    if scenario.local_steps == 0 and scenario.local_epochs == 1 and scenario.batch_size == 0:
        return "one local epoch on the full local batch is one gradient step; use inverting-gradients"
    return None


@register_attack("fedavg-leakage", "dimitrov")
class FedAvgLeakage(ImageReconstructionAttack):
    """FedAvg leakage: match the observed update with a differentiable simulation of the local steps."""

    version = "1"
    observation_point = "update"
    accepted_points: tuple[str, ...] = ("update", "server")  # server: the update after a server-side hook
    paper = Paper(
        "dimitrov2022fedavg", "Data Leakage in Federated Averaging", "https://arxiv.org/abs/2206.12395"
    )

    @dataclass(frozen=True)
    class Params:
        iterations: int = iterations_param(
            1000, "signed-Adam iterations, each one simulated client round (CPU default 1000)", 100000
        )
        lr: float = param(0.1, "Adam learning rate (as Inverting Gradients)", min=0, min_open=True)
        tv_weight: float | None = param(
            None, "total-variation weight; none = by domain (0 for 1-channel, 1e-4 for RGB)", min=0
        )
        restarts: int = param(1, "restarts, run one after another; best by final objective", min=1, max=64)
        lr_decay: bool = param(True, "MultiStepLR x0.1 at 3/8, 5/8, 7/8 of the iterations")
        labels: Literal["known", "batch"] = param(
            "known",
            "label strategy: known (threat model grants y), batch (counts from the equivalent gradient)",
        )

    def check(self, scenario: Any) -> str | None:
        reason = super().check(scenario)
        if not reason:
            reason = one_step_reason(scenario)
        if not reason and getattr(scenario, "loss", "ce") != "ce":
            loss = scenario.loss
            reason = f"{self.name} simulates cross-entropy training; scenario.loss={loss} is not supported"
        return reason

    def run(self, observation: Any, model: Any, meta: Any, generator: Any, device: Any) -> Any:
        from fedbench.attacks._fedavg_core import run_fedavg_leakage

        return run_fedavg_leakage(self, observation, model, meta, generator, device)
