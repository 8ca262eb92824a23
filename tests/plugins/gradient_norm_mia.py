"""Gradient-norm membership inference: an attack with a family of its own, in one plugin file.

The worked example of docs/writing-an-attack.md; load it with
`fedbench run ... --plugin tests/plugins/gradient_norm_mia.py`.

Method: a model fits the examples it trained on, so their loss gradients at the trained model are
small (Nasr et al., S&P 2019, found the gradient norm to separate members from non-members). The
attack reads the final global model (white-box, as every FL participant can), computes each
example's gradient of the training loss with respect to the parameters, and scores it by minus the
L2 norm (higher = member). Its decision threshold is the accuracy-maximising one on a calibration half
of members and non-members the attacker labels itself, as `mia-loss` sets its loss threshold; the
other half is scored. The examples (the victim client's, class-matched held-out non-members, halves)
come from the built-in membership design, so the rows compare with mia-*'s.

The family `gradient-norm` is its own: next to AUC, accuracy and TPR at 1% FPR it reports how far apart
the two norm distributions are (`gn_norm_ratio`), a quantity the black-box membership family does not have.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fedbench.metrics import AttackScores, Metric, register_family
from fedbench.plugin import Attack, AttackOutput, Observation, Paper, RunData
from fedbench.registry import register_attack
from fedbench.spec.params import param

FAMILY = "gradient-norm"

GRADIENT_NORM_METRICS = (
    Metric("gn_auc", "lower", "leakage", "fixed", (0, 1), about="ROC AUC of minus the gradient norm"),
    Metric("gn_acc", "lower", "leakage", "pct", (0, 1), about="accuracy of the thresholded decisions"),
    Metric(
        "gn_tpr_at_1pct_fpr",
        "lower",
        "leakage",
        "pct",
        (0, 1),
        required=False,  # n/a (empty) when fewer than 1000 non-members are scored
        about="TPR at the threshold with realised FPR <= 1% (exact; n/a under 1000 non-members)",
    ),
    Metric(
        "gn_norm_ratio",
        "lower",
        "leakage",
        "sig",
        (0, None),
        about="median gradient norm of non-members / of members (1: the norms tell nothing)",
    ),
)


@register_family(FAMILY, metrics=GRADIENT_NORM_METRICS, default_metrics=("gn_auc", "gn_acc"))
def score_gradient_norm(attack: Any, output: dict[str, Any], truth: dict[str, Any]) -> AttackScores:
    """The family's columns, from the attack's scores (minus the norms), decisions and `is_member`."""
    from fedbench.metrics.membership import membership_scores

    is_member = np.asarray(output["extra"]["is_member"], dtype=bool)
    scores = np.asarray(output["scores"], dtype=float)
    roc = membership_scores(is_member, scores, output["predictions"])
    norms = -scores
    member_norm = float(np.median(norms[is_member]))
    ratio = float(np.median(norms[~is_member])) / member_norm if member_norm > 0 else float("inf")
    return AttackScores(
        {
            "gn_auc": roc.auc,
            "gn_acc": roc.accuracy,
            "gn_tpr_at_1pct_fpr": roc.tpr_at_low_fpr["mia_tpr_at_1pct_fpr"],
            "gn_norm_ratio": ratio,
        }
    )


@register_attack("gradient-norm-mia", "gn-mia")
class GradientNormMIA(Attack):
    """Membership inference by the norm of each example's loss gradient at the final global model."""

    family = FAMILY
    observation_point = "model"
    accepted_points = ("model",)
    version = "1"
    paper = Paper(
        "nasr2019",
        "Comprehensive Privacy Analysis of Deep Learning: Passive and Active White-box Inference Attacks "
        "against Centralized and Federated Learning (Nasr et al., S&P 2019)",
        "https://arxiv.org/abs/1812.00910",
    )

    @dataclass(frozen=True)
    class Params:
        members: Literal["victim", "all"] = param(
            "victim", "members: the victim client's examples, or every client's training examples"
        )
        max_pairs: int = param(0, "at most this many member/non-member pairs; 0 = all available", min=0)

    def __init__(self, params: Any = None):
        super().__init__(params)
        self.data: RunData | None = None

    def bind_data(self, data: RunData) -> None:
        self.data = data  # the members (clients' examples) and the held-out non-members

    def run(self, observation: Observation, model, meta, generator, device) -> AttackOutput:
        from fedbench.attacks import _membership_core as design
        from fedbench.errors import RunFailure

        if self.data is None:
            raise RunFailure(f"{self.name}: the runner bound no run data (members and non-members)")
        p = self.params
        rng = design.numpy_rng(generator)
        split, _ = design.membership_split(
            self.data, observation.client, p.members, "test", "class-matched", p.max_pairs, rng
        )
        target = design.target_model(observation, model, device)
        loss = self.data.scenario.loss if self.data.scenario else "ce"
        calibration_in = _minus_gradient_norms(target, split.x_in, split.y_in, loss, device)
        calibration_out = _minus_gradient_norms(target, split.x_out, split.y_out, loss, device)
        threshold = design.best_threshold(calibration_in, calibration_out)
        scores = _minus_gradient_norms(target, split.x_eval, split.y_eval, loss, device)
        return AttackOutput(
            scores=scores,
            predictions=(scores > threshold).astype(np.int8),
            extra={
                "is_member": split.is_member.tolist(),
                "threshold": threshold,
                "mia_members": p.members,  # the threat-model columns every membership row states
                "mia_nonmembers": "class-matched test",
            },
        )


def _minus_gradient_norms(model, x, y, loss: str, device) -> np.ndarray:
    """-||grad_theta loss(model(x_i), y_i)||_2 per example (higher = member), float64."""
    import torch

    from fedbench.fl.losses import loss_function
    from fedbench.fl.per_example import per_example_grads

    grads = per_example_grads(model, x.to(device), y.to(device), loss_function(loss), chunk_size=64)
    squared = sum(g.flatten(1).double().pow(2).sum(1) for g in grads.values())
    return -torch.sqrt(squared).cpu().numpy()
