"""Scoring one attack run: the columns every family shares, then the scorer of the attack's family.

The runner calls `attack_metrics(attack, result)` on a cached attack result; the attack's `family`
class attribute picks the scorer registered with `fedbench.metrics.catalogue.register_family`
(reconstruction, membership, attribute, or a plugin's own). Scores are computed outside the attack
cache, so a fixed metric re-scores cached runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedbench.errors import FedbenchError
from fedbench.metrics.catalogue import METRICS, family

# Attack `extra` entries copied into the result row: the threat-model switches and outcome details.
THREAT_MODEL_FIELDS = {
    "labels_known": "tm_labels_known",
    "bn_stats_known": "tm_bn_stats_known",
    "label_strategy": "tm_label_strategy",
    "pruning_aware": "tm_pruning_aware",
    "update_as_gradient": "tm_update_as_gradient",
    "mia_members": "tm_mia_members",
    "mia_nonmembers": "tm_mia_nonmembers",
}
OUTCOME_FIELDS = {"success": "attack_success", "iterations_to_success": "iterations_to_success"}


@dataclass
class AttackScores:
    """What the metrics say about one attack run: result-row columns, and what is not a CSV cell.

    A family's scorer returns its own columns here; `attack_metrics` puts the shared ones first.
    """

    columns: dict[str, Any]
    per_image: dict[str, list[float]] | None = None  # per-image values for the JSON sidecar
    warnings: list[str] = field(default_factory=list)  # e.g. why LPIPS is empty, stated once per process


def threat_model_columns(output: dict[str, Any], observation: dict[str, Any]) -> dict[str, Any]:
    """The columns of every attack row: the observation point, round and kind, the switches the
    attack reports (labels known, BN statistics known, ...) and its outcome (success, iterations)."""
    extra = output.get("extra") or {}
    row: dict[str, Any] = {
        "tm_observation": observation.get("point"),
        "tm_observation_kind": observation.get("kind"),
        "tm_observed_examples": observation.get("examples"),
    }
    if "defense_hooks" in observation:  # the defense's hooks that acted on what the attacker saw
        row["tm_defense_hooks"] = "+".join(observation["defense_hooks"])
    for key, column in {**THREAT_MODEL_FIELDS, **OUTCOME_FIELDS}.items():
        if key in extra:
            row[column] = extra[key]
    return row


def attack_metrics(attack: Any, result: dict[str, Any]) -> AttackScores:
    """Scores of one attack run: the shared threat-model columns, then its family's scorer's; a victim
    batch's (`victims` in the result) by `victim_batch_metrics`."""
    if "victims" in result:
        return victim_batch_metrics(attack, result["victims"])
    name = getattr(attack, "name", "") or type(attack).__name__
    scorer = family(attack.family, name).scorer
    if scorer is None:  # described by a results file read in this process, its plugin not loaded
        raise FedbenchError(
            f"attack '{name}': family '{attack.family}' has no scorer loaded; pass the plugin file "
            "that registers it with --plugin"
        )
    row = threat_model_columns(result["output"], result.get("observation", {}))
    scores = scorer(attack, result["output"], result["truth"])
    row.update(scores.columns)
    return AttackScores(row, scores.per_image, scores.warnings)


# Columns that count a run's inputs: a victim batch's are its victims' added up.
COUNT_COLUMNS = ("tm_observed_examples",)


def victim_batch_metrics(attack: Any, victims: list[dict[str, Any]]) -> AttackScores:
    """Scores of a victim batch: each victim scored as a run of its own (`attack_metrics` of its output,
    truth and observation), then joined.

    Per-image scores follow one another in victim order: `index` numbers the run's true images, `match`
    the run's reconstructions (-1 stays unmatched) and `victim` gives each image's client, so entry i
    is true image i of the run's truth, scored against its own victim's reconstructions only. A column:
    - counting inputs (`COUNT_COLUMNS`): the victims' sum;
    - a catalogued worst case (`*_worst`): the worst over the victims, in the catalogue's direction;
    - any other number: the victims' mean weighted by their inputs (a mean over images, or a share of
      inputs, over all the victims' inputs); a flag (bool) on which the victims differ: the share of
      victims where it holds;
    - text and anything else: the value when every victim has it, else the distinct values joined by "; ".
    A victim without a value (None) is left out of that column.
    """
    scored = [attack_metrics(attack, v) for v in victims]
    weights = [float(s.columns.get(COUNT_COLUMNS[0]) or 1) for s in scored]
    columns: dict[str, Any] = {}
    for key in dict.fromkeys(k for s in scored for k in s.columns):
        pairs = [(s.columns.get(key), w) for s, w in zip(scored, weights, strict=True)]
        columns[key] = _joined_column(key, [(v, w) for v, w in pairs if v is not None])
    warnings = list(dict.fromkeys(w for s in scored for w in s.warnings))
    return AttackScores(columns, _joined_per_image(victims, scored), warnings)


def _joined_column(key: str, values: list[tuple[Any, float]]) -> Any:
    if not values:
        return None
    plain = [v for v, _ in values]
    if all(isinstance(v, bool) for v in plain):
        return plain[0] if len(set(plain)) == 1 else sum(plain) / len(plain)
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in plain):
        if key in COUNT_COLUMNS:
            return sum(plain)
        entry = METRICS.get(key) if key.endswith("_worst") else None
        if entry is not None:
            sign = entry.leakage_sign
            return sign * max(sign * v for v in plain)
        total = sum(w for _, w in values)
        return float(sum(v * w for v, w in values) / total)
    return plain[0] if all(v == plain[0] for v in plain) else "; ".join(dict.fromkeys(map(str, plain)))


def _joined_per_image(victims: list[dict[str, Any]], scored: list[AttackScores]) -> dict[str, list] | None:
    """The victims' per-image scores one after another (`victim_batch_metrics`); None when none has any."""
    if all(s.per_image is None for s in scored):
        return None
    out: dict[str, list] = {}
    images = reconstructions = 0
    for v, s in zip(victims, scored, strict=True):
        own = s.per_image or {}
        n = max((len(x) for x in own.values()), default=0)
        for key in dict.fromkeys(k for k in [*out, *own] if k != "victim"):
            values = list(own.get(key) or [None] * n)  # a list with no entries (`match` of no images) too
            if key == "index":
                values = [images + i for i in values]
            elif key == "match":
                values = [reconstructions + m if m is not None and m >= 0 else m for m in values]
            out.setdefault(key, [None] * images).extend(values)
        out.setdefault("victim", [None] * images).extend([v.get("client")] * n)
        images += n
        recs = v.get("output", {}).get("images")
        reconstructions += 0 if recs is None else len(recs)
    return out
