"""Metrics computed from cached attack results and ground truth, outside the attack cache."""

from __future__ import annotations

from typing import Any


def attack_metrics(attack: Any, result: dict[str, Any]) -> dict[str, Any]:
    """Result-row columns for one attack run, by the attack's family."""
    output, truth = result["output"], result["truth"]
    if attack.family == "reconstruction":
        from fedbench.metrics.reconstruction import score_reconstruction

        images = output.get("images")
        if images is None or "images" not in truth:
            return {}
        scores = score_reconstruction(
            truth["images"], images, y_true=truth.get("y"), y_pred=output.get("labels")
        )
        return dict(scores.summary())
    return {}
