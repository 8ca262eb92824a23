"""Membership-inference metrics: accuracy, ROC AUC, TPR at a low FPR (exact operating point), advantage.

The field now judges a membership attack by its true-positive rate at a low false-positive rate
(Carlini et al., "Membership Inference Attacks From First Principles", 2022), not by accuracy alone:
an attack that is right on average may still identify no member confidently. Scores are "higher
means member".

**TPR at a low FPR** (design §7.1) is an operating point the scores realise, not a point read off an
interpolated ROC curve: for each target FPR f in `LOW_FPRS`, the threshold t is chosen from the
scores so that "member iff score >= t" has the largest TPR whose realised FPR k_fp / n_non is <= f
(every score equal to t is on the same side; among thresholds with that TPR, the one with the fewest
false positives; t = +inf, no member claimed, when no threshold flags a member within the budget).
The row holds the exact rate `mia_tpr_at_1pct_fpr` = k_tp / n_mem (a rate whose inputs are the
members, `mia_n_members`), its counts `mia_tp_at_1pct_fpr` (k_tp) and `mia_fp_at_1pct_fpr` (k_fp),
the realised FPR `mia_realised_fpr_at_1pct_fpr` = k_fp / n_non and the threshold
`mia_threshold_at_1pct_fpr`; the same at 0.1 % (`..._at_0.1pct_fpr`). An FPR f is only resolved by
at least 10 / f non-members (1,000 for 1 %, 10,000 for 0.1 %): with fewer, the point's columns are
empty ("n/a") and `mia_low_fpr_note` says why. `mia_auc` is informational beside them.

`advantage` is TPR - FPR of the attack's own decisions (Yeom et al. 2018): 0 for guessing, 1 for a
perfect attack; on a balanced set it equals 2 * accuracy - 1. The member base rate of the evaluated
set is reported beside the metrics, so 50% accuracy reads as chance only when the rate is 0.5.

The `membership` attack family: its scorer reads the attack's `scores` (higher = member),
`predictions` (its 0/1 decisions) and `extra["is_member"]` (the truth of the evaluated set, which the
attack sampled itself: its experimental design). Per evaluated input, in the attack's order, the run's
JSON sidecar holds `mia_score`, `mia_is_member` (0/1) and `mia_prediction` (0/1), so a board can draw
a held-out split of the scored inputs (choose the worst attack on one part, report it on the other).

Beside them, a privacy audit (`fedbench.metrics.audit`): `eps_lower`, the 95 % lower bound on epsilon
that the attack's scores prove (Jagielski et al. 2020, Nasr et al. 2021; threshold chosen on a held-out
half), at the audit delta `eps_lower_delta`; a defense whose formal epsilon is below it is mis-implemented
or mis-accounted. Not among the default columns: tables show them when asked (`--metric eps_lower`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fedbench.metrics.audit import epsilon_lower_bound
from fedbench.metrics.catalogue import Metric, register_family
from fedbench.metrics.scoring import AttackScores

# (column suffix, target FPR): the columns of a point are mia_tpr_at_<suffix>, mia_tp_at_<suffix>, ...
LOW_FPRS: tuple[tuple[str, float], ...] = (("0.1pct_fpr", 1e-3), ("1pct_fpr", 1e-2))
# an FPR f is resolved by at least RESOLVING_FALSE_POSITIVES / f non-members (10 false positives at f)
RESOLVING_FALSE_POSITIVES = 10


def _label(target: float) -> str:
    return f"{target * 100:g}%"


# the defender wants chance level: AUC 0.5, accuracy at the base rate, advantage 0, TPR = FPR
MEMBERSHIP_METRICS = (
    Metric("mia_acc", "lower", "leakage", "pct", (0, 1), about="accuracy of the attack's decisions"),
    Metric("mia_auc", "lower", "leakage", "fixed", (0, 1), about="ROC AUC of the scores (informational)"),
    *(
        Metric(
            f"mia_tpr_at_{suffix}",
            "lower",
            "leakage",
            "pct",
            (0, 1),
            required=False,
            about=f"TPR at FPR <= {_label(f)}: k_tp / n_mem at the score threshold with the largest TPR "
            f"whose realised FPR is <= {_label(f)} (exact; n/a under {RESOLVING_FALSE_POSITIVES / f:.0f} "
            "non-members)",
        )
        for suffix, f in LOW_FPRS
    ),
    *(
        Metric(
            f"mia_realised_fpr_at_{suffix}",
            "lower",
            "reference",
            "pct",
            (0, 1),
            required=False,
            about=f"k_fp / n_non at the threshold of mia_tpr_at_{suffix} (<= {_label(f)})",
        )
        for suffix, f in LOW_FPRS
    ),
    Metric("mia_advantage", "lower", "leakage", "pct", (-1, 1), about="TPR - FPR of the decisions"),
    Metric("mia_base_rate", "lower", "reference", "pct", (0, 1), about="share of members evaluated"),
    # the audit (fedbench.metrics.audit): an empirical epsilon, comparable with the formal `epsilon`
    Metric("eps_lower", "lower", "leakage", "fixed", (0, None), about="95% lower bound on epsilon (audit)"),
    Metric("eps_lower_delta", "lower", "reference", "sig", (0, 1), about="delta of the eps_lower audit"),
)


@dataclass(frozen=True)
class OperatingPoint:
    """'member iff score >= threshold' at a target FPR: the counts it realises on the evaluated set.

    `tp` of the `members` and `fp` of the `nonmembers` are flagged; `resolved` says whether the
    non-members resolve the target (at least 10 / target of them); the rates are None when not.
    """

    target: float
    threshold: float
    tp: int
    fp: int
    members: int
    nonmembers: int

    @property
    def resolved(self) -> bool:
        # n_non >= 10 / f, compared as n_non * f >= 10 (1000 * 0.01 is 10.0 in floating point)
        return self.nonmembers * self.target >= RESOLVING_FALSE_POSITIVES * (1 - 1e-12)

    @property
    def tpr(self) -> float | None:
        return self.tp / self.members if self.resolved else None

    @property
    def fpr(self) -> float | None:
        return self.fp / self.nonmembers if self.resolved else None

    def row(self, suffix: str) -> dict[str, Any]:
        """The point's columns (empty when unresolved: "n/a", not a number below the data's resolution)."""
        ok = self.resolved
        return {
            f"mia_tpr_at_{suffix}": self.tpr,
            f"mia_tp_at_{suffix}": self.tp if ok else None,
            f"mia_fp_at_{suffix}": self.fp if ok else None,
            f"mia_realised_fpr_at_{suffix}": self.fpr,
            f"mia_threshold_at_{suffix}": self.threshold if ok else None,
        }


def operating_point(is_member: Any, scores: Any, target: float) -> OperatingPoint:
    """The exact operating point at FPR <= `target` (see the module docstring).

    Candidate thresholds are the distinct scores and +inf; flagged counts at t are the members and
    non-members with score >= t. Both counts grow as t falls, so the admissible thresholds (k_fp /
    n_non <= target) are the highest ones, and the largest TPR among them is first reached at the
    highest threshold that reaches it (the fewest false positives for that TPR).
    """
    import numpy as np

    truth = np.asarray(is_member).astype(bool).reshape(-1)
    s = np.asarray(scores, dtype=float).reshape(-1)
    if truth.size != s.size:
        raise ValueError(f"{s.size} scores for {truth.size} membership labels")
    if not np.isfinite(s).all():
        raise ValueError("membership scores must be finite numbers (higher = member)")
    n_mem, n_non = int(truth.sum()), int((~truth).sum())
    if not n_mem or not n_non:
        raise ValueError("membership metrics need both members and non-members in the evaluated set")
    values = np.unique(s)[::-1]  # distinct scores, highest first
    tp = n_mem - np.searchsorted(np.sort(s[truth]), values, side="left")
    fp = n_non - np.searchsorted(np.sort(s[~truth]), values, side="left")
    admissible = np.nonzero(fp / n_non <= target)[0]  # a prefix: fp does not fall as t falls
    if not admissible.size or tp[admissible[-1]] == 0:
        return OperatingPoint(target, math.inf, 0, 0, n_mem, n_non)  # flag nothing
    i = int(np.argmax(tp == tp[admissible[-1]]))  # the highest threshold with that TPR
    return OperatingPoint(target, float(values[i]), int(tp[i]), int(fp[i]), n_mem, n_non)


@dataclass(frozen=True)
class MembershipScores:
    """The metrics of one membership attack on one evaluation set."""

    accuracy: float
    auc: float
    points: tuple[OperatingPoint, ...]
    advantage: float
    base_rate: float
    examples: int

    def _named(self) -> list[tuple[str, OperatingPoint]]:
        return [(suffix, p) for (suffix, _), p in zip(LOW_FPRS, self.points, strict=True)]

    @property
    def tpr_at_low_fpr(self) -> dict[str, float | None]:
        """`mia_tpr_at_<suffix>` -> the exact TPR at that FPR (None where it is not resolved)."""
        return {f"mia_tpr_at_{suffix}": p.tpr for suffix, p in self._named()}

    def note(self) -> str:
        """Why some low-FPR columns are empty ("" when every target is resolved)."""
        missing = [(suffix, p) for suffix, p in self._named() if not p.resolved]
        if not missing:
            return ""
        names = ", ".join(f"mia_tpr_at_{suffix}" for suffix, _ in missing)
        needs = ", ".join(
            f"{RESOLVING_FALSE_POSITIVES / p.target:.0f} for {_label(p.target)}" for _, p in missing
        )
        return (
            f"{names}: n/a, {missing[0][1].nonmembers} non-members were scored and a false-positive "
            f"rate f needs at least {RESOLVING_FALSE_POSITIVES} / f of them ({needs}); evaluate more "
            "examples for a TPR at that FPR"
        )

    def row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"mia_acc": self.accuracy, "mia_auc": self.auc}
        for suffix, p in self._named():
            row.update(p.row(suffix))
        row.update(
            mia_advantage=self.advantage,
            mia_base_rate=self.base_rate,
            mia_examples=self.examples,
            mia_n_members=self.points[0].members,
            mia_n_nonmembers=self.points[0].nonmembers,
            mia_low_fpr_note=self.note(),
        )
        return row


def roc_points(is_member: Any, scores: Any) -> tuple[Any, Any]:
    """(fpr, tpr) of every threshold, from (0, 0) to (1, 1), non-decreasing in both."""
    import numpy as np
    from sklearn.metrics import roc_curve

    fpr, tpr, _ = roc_curve(
        np.asarray(is_member).astype(int), np.asarray(scores, dtype=float), drop_intermediate=False
    )
    return fpr, tpr


def membership_scores(is_member: Any, scores: Any, predictions: Any) -> MembershipScores:
    """Accuracy and advantage of the attack's decisions; AUC and low-FPR operating points of its scores."""
    import numpy as np
    from sklearn.metrics import roc_auc_score

    truth = np.asarray(is_member).astype(bool)
    pred = np.asarray(predictions).astype(bool)
    if truth.all() or not truth.any():
        raise ValueError("membership metrics need both members and non-members in the evaluated set")
    decision_tpr = float(pred[truth].mean())
    decision_fpr = float(pred[~truth].mean())
    return MembershipScores(
        accuracy=float((pred == truth).mean()),
        auc=float(roc_auc_score(truth.astype(int), np.asarray(scores, dtype=float))),
        points=tuple(operating_point(truth, scores, target) for _, target in LOW_FPRS),
        advantage=decision_tpr - decision_fpr,
        base_rate=float(truth.mean()),
        examples=int(truth.size),
    )


def per_input(is_member: Any, scores: Any, predictions: Any) -> dict[str, list]:
    """JSON-able per-input values, in the attack's order: score, is_member (0/1), decision (0/1)."""
    return {
        "mia_score": [float(v) for v in scores],
        "mia_is_member": [int(bool(v)) for v in is_member],
        "mia_prediction": [int(bool(v)) for v in predictions],
    }


@register_family("membership", metrics=MEMBERSHIP_METRICS, default_metrics=("mia_auc", "mia_acc"))
def score_membership(attack: Any, output: dict[str, Any], truth: dict[str, Any]) -> AttackScores:
    """The membership columns of one run, how many members and non-members were scored (the evaluated
    half of the balanced design), the empirical epsilon lower bound of the attack's scores, and the
    per-input scores and truths for the sidecar; a note when a low FPR is n/a."""
    is_member = (output.get("extra") or {})["is_member"]
    scores = membership_scores(is_member, output["scores"], output["predictions"])
    row: dict[str, Any] = scores.row()
    row.update(epsilon_lower_bound(is_member, output["scores"]).row())
    note = row["mia_low_fpr_note"]
    return AttackScores(
        row, per_input(is_member, output["scores"], output["predictions"]), [note] if note else []
    )
