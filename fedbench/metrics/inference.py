"""Inference-attack metrics: attribute inference scored against the victims' true attributes.

Computed outside the attack cache from the attack's predictions and the ground truth the runner
kept (`truth['cohort']`: every observed client's attribute values). A client's true attribute is the
most common value among its records (exact for the paper's one-record clients).

- `asr`: attack success rate, #correct / #inferences (the paper's metric);
- `asr_balanced`: mean recall over the attribute classes present among the victims (an attack that
  always answers the majority class scores 1/#classes, whatever the imbalance);
- `asr_majority`: the reference an attacker gets for free, always answering the majority class of
  its own pool, scored on the same victims;
- `asr_advantage`: asr - asr_majority (> 0: the update leaked more than the prior).

Beside them, the counts of the rate: `aia_correct` victims inferred correctly (k) of `aia_victims`
(n), so asr = k / n. Per victim, in cohort order, the run's JSON sidecar holds `asr` (1: inferred
correctly, else 0), `asr_majority` (1: the majority guess is right), `aia_true` (the true attribute
class) and `aia_pred` (the inferred one), so a board can draw a held-out split of the victims (choose
the worst attack on one part, report its advantage on the other).

The `attribute` attack family: its scorer reads the attack's `predictions` (one attribute class per
observed client, in cohort order) and `extra` (`attribute`, `majority_class`, `adversary`,
`pool_size`, `features`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedbench.metrics.catalogue import Metric, register_family
from fedbench.metrics.scoring import AttackScores

# the defender wants the majority-class rate: no more than the attacker's prior
ATTRIBUTE_METRICS = (
    Metric("asr", "lower", "leakage", "pct", (0, 1), about="attack success rate, #correct / #inferences"),
    Metric("asr_balanced", "lower", "leakage", "pct", (0, 1), about="mean recall over attribute classes"),
    Metric("asr_advantage", "lower", "leakage", "pp", (-1, 1), about="asr - asr_majority"),
    Metric("asr_majority", "lower", "reference", "pct", (0, 1), about="always answering the majority"),
)


def client_attribute(values: Any) -> int:
    """The most common value of a client's attribute over its records."""
    return int(np.bincount(np.asarray(values, dtype=np.int64).reshape(-1)).argmax())


def attribute_scores(y_true: Any, y_pred: Any, majority_class: int) -> dict[str, float]:
    """asr, balanced accuracy, majority-class rate and advantage of predictions vs true classes."""
    t = np.asarray(y_true, dtype=np.int64).reshape(-1)
    p = np.asarray(y_pred, dtype=np.int64).reshape(-1)
    if len(t) != len(p) or not len(t):
        raise ValueError(
            f"attribute predictions ({len(p)}) and truths ({len(t)}) must be equal and non-empty"
        )
    asr = float((t == p).mean())
    recalls = [float((p[t == c] == c).mean()) for c in np.unique(t)]
    majority = float((t == majority_class).mean())
    return {
        "asr": asr,
        "asr_balanced": float(np.mean(recalls)),
        "asr_majority": majority,
        "asr_advantage": asr - majority,
    }


def _victims(output: dict[str, Any], truth: dict[str, Any]) -> tuple[list[int], list[int], int] | None:
    """(true classes, inferred classes, the attacker's majority class) of the victims, in cohort order;
    None when the run holds no cohort."""
    extra = output.get("extra") or {}
    cohort = truth.get("cohort")
    name = extra.get("attribute")
    if not cohort or name is None or output.get("predictions") is None:
        return None
    y_true = [client_attribute(c["attributes"][name]) for c in cohort]
    y_pred = [int(v) for v in np.asarray(output["predictions"], dtype=np.int64).reshape(-1)]
    return y_true, y_pred, int(extra["majority_class"])


def attribute_metrics(output: dict[str, Any], truth: dict[str, Any]) -> dict[str, Any]:
    """Row columns of an attribute-inference run (empty when the run holds no cohort)."""
    victims = _victims(output, truth)
    if victims is None:
        return {}
    y_true, y_pred, majority = victims
    extra = output.get("extra") or {}
    row: dict[str, Any] = attribute_scores(y_true, y_pred, majority)
    row.update(
        aia_correct=sum(t == p for t, p in zip(y_true, y_pred, strict=True)),
        aia_attribute=extra["attribute"],
        aia_adversary=extra.get("adversary"),
        aia_victims=len(y_true),
        aia_pool=extra.get("pool_size"),
        aia_features=extra.get("features"),
    )
    return row


def attribute_per_input(output: dict[str, Any], truth: dict[str, Any]) -> dict[str, list] | None:
    """JSON-able per-victim values, in cohort order (None when the run holds no cohort): `asr` and
    `asr_majority` (0/1: the attack's and the majority guess's correctness), `aia_true`, `aia_pred`."""
    victims = _victims(output, truth)
    if victims is None:
        return None
    y_true, y_pred, majority = victims
    return {
        "asr": [int(t == p) for t, p in zip(y_true, y_pred, strict=True)],
        "asr_majority": [int(t == majority) for t in y_true],
        "aia_true": y_true,
        "aia_pred": y_pred,
    }


@register_family("attribute", metrics=ATTRIBUTE_METRICS, default_metrics=("asr", "asr_advantage"))
def score_attribute(attack: Any, output: dict[str, Any], truth: dict[str, Any]) -> AttackScores:
    """The attribute-inference columns of one run and its per-victim values for the sidecar."""
    return AttackScores(attribute_metrics(output, truth), attribute_per_input(output, truth))
