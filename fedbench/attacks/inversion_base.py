"""The torch-free base of the gradient-inversion attacks (dlg, idlg, cpl, ig).

Plugin modules are imported by `fedbench list`, which must not pay for importing torch, so the
optimisation core lives in `_inversion` and is imported when an attack runs.
"""

from __future__ import annotations

from typing import Any

from fedbench.attacks.base import ImageReconstructionAttack


class InversionAttack(ImageReconstructionAttack):
    """Base of the gradient-inversion attacks with their common `run`; subclasses set `settings()`.

    `settings()` returns a dict with: cost, optimizer, lr, iterations, tv_weight, weights, init,
    lbfgs_max_iter, lbfgs_history, lr_decay, boxed, success_threshold, stop_on_success.
    """

    observation_point = "update"
    accepted_points: tuple[str, ...] = ("example", "step", "update", "server")

    def check(self, scenario: Any) -> str | None:
        reason = super().check(scenario)
        if not reason and getattr(scenario, "loss", "ce") != "ce":
            reason = (
                f"{self.name} matches cross-entropy gradients; scenario.loss={scenario.loss} is not supported"
            )
        return reason

    def settings(self, meta: Any) -> dict[str, Any]:
        raise NotImplementedError

    def run(self, observation: Any, model: Any, meta: Any, generator: Any, device: Any) -> Any:
        from fedbench.attacks._inversion import run_inversion

        return run_inversion(self, observation, model, meta, generator, device)
