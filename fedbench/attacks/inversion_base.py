"""The torch-free base of the gradient-inversion attacks (dlg, idlg, cpl, ig).

Plugin modules are imported by `fedbench list`, which must not pay for importing torch, so the
optimisation core lives in `_inversion` and is imported when an attack runs.
"""

from __future__ import annotations

from typing import Any


class InversionAttack:
    """Mixin with the common `run` of the gradient-inversion attacks; subclasses set `settings()`.

    Used as `class X(InversionAttack, Attack)`. `settings()` returns a dict with: cost, optimizer, lr,
    iterations, tv_weight, weights, init, lbfgs_max_iter, lbfgs_history, lr_decay, boxed,
    success_threshold, stop_on_success.
    """

    observation_point = "update"
    accepted_points: tuple[str, ...] = ("example", "step", "update", "server")
    family = "reconstruction"

    def check(self, scenario: Any) -> str | None:
        point = self.point_for(scenario)
        if point not in self.accepted_points:
            return (
                f"{self.name} needs a gradient observation ({', '.join(self.accepted_points)}); "
                f"scenario.observe={point} does not produce one"
            )
        if getattr(scenario, "loss", "ce") != "ce":
            return (
                f"{self.name} matches cross-entropy gradients; scenario.loss={scenario.loss} is not supported"
            )
        return None

    def check_meta(self, meta: Any) -> str | None:
        if not getattr(meta, "is_image", False) or len(meta.input_shape) != 3:
            return (
                f"{self.name} reconstructs images; dataset '{meta.name}' is {meta.modality} "
                f"with input shape {tuple(meta.input_shape)}"
            )
        return None

    def settings(self, meta: Any) -> dict[str, Any]:
        raise NotImplementedError

    def run(self, observation: Any, model: Any, meta: Any, generator: Any, device: Any) -> Any:
        from fedbench.attacks._inversion import run_inversion

        return run_inversion(self, observation, model, meta, generator, device)
