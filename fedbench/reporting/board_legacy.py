"""Entries of schema 1 (means and spreads only, no per-seed values) brought inside their metrics' ranges
without their runs, until a rebuild replaces them.

A schema-1 entry printed mean ± the 95 % t half-width over seeds, which leaves [0, 1] for a rate near
0 % or 100 % (label accuracy "100.0 ± 0.0" of 6 inputs, an ASR interval below 0 %). What can be
recomputed from the entry alone:

- a **rate** whose inputs per seed the board's scenario fixes (`inputs_per_seed`: the attacked images
  of an inversion board, |victims| x B; the round's participants of an attribute board) gets the exact
  binomial interval of the pooled counts, k = mean x seeds x inputs per seed. That is what a rebuild
  computes (`intervals.summarise`) when every seed has the same inputs, and the count is checked to be
  a whole number (a mean that is not k / n for the stated n is left alone rather than guessed);
- every other bounded metric (accuracies, AUC, a rate of unknown count) keeps its t interval, clipped
  to the metric's range (`intervals.value_range`), the rule a rebuild applies to a bounded mean.

Rank stability and the worst-case selection need the per-seed values: they stay as computed, stated
as such in the entry (`rank_stability.joint` absent), until the board is rebuilt.
"""

from __future__ import annotations

from typing import Any

from fedbench.metrics.catalogue import metric
from fedbench.reporting.intervals import RATE, clopper_pearson, is_rate, value_range
from fedbench.reporting.ranking import rounded


def inputs_per_seed(scenario: dict[str, Any], family: str) -> int | None:
    """The inputs one seed of a board scores for a rate of attack `family`, from the board's scenario:
    inversion boards attack each victim's batch of B (B = 0: unknown here), attribute boards every
    participant of the observed round; None where the scenario does not fix it."""
    if family == "reconstruction":
        victims = scenario.get("sc_victim", 0)
        count = len(victims) if isinstance(victims, list) else 1
        batch = int(scenario.get("sc_batch_size") or 0)
        return count * batch if batch else None
    if family == "attribute":
        clients, share = int(scenario["sc_clients"]), float(scenario["sc_participation"])
        return max(1, round(share * clients))
    return None


def bound_stat(stat: dict[str, Any] | None, name: str, per_seed: int | None) -> dict[str, Any] | None:
    """A schema-1 stat with an interval inside its metric's range (module docstring); unchanged when it
    already has one, has no interval (two seeds: a std), or is not a known metric."""
    if not stat or stat.get("low") is not None:
        return stat
    try:
        m = metric(name)
    except Exception:  # a plugin's metric fedbench does not catalogue: left as it is
        return stat
    if is_rate(m) and per_seed:
        total = stat["n"] * per_seed
        k = stat["mean"] * total
        if abs(k - round(k)) <= 1e-3:
            k = round(k)
            low, high = clopper_pearson(k, total)
            return {
                **stat,
                "mean": rounded(k / total),
                "spread": None,
                "spread_kind": RATE,
                "low": rounded(low),
                "high": rounded(high),
                "k": k,
                "inputs": total,
            }
    if stat.get("spread_kind") == "ci95" and stat.get("spread") is not None:
        lo, hi = value_range(m)
        mean, half = stat["mean"], stat["spread"]
        return {**stat, "low": rounded(max(lo, mean - half)), "high": rounded(min(hi, mean + half))}
    return stat


def bound_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A schema-1 entry with every stat bounded (`bound_stat`); a copy."""
    scenario = entry["scenario"]
    m = dict(entry["metrics"])
    for key in ("test_acc", "acc_drop"):
        m[key] = bound_stat(m.get(key), key, None)

    def per_seed(name: str) -> int | None:
        try:
            return inputs_per_seed(scenario, metric(name).family)
        except Exception:
            return None

    m["leakage"] = {
        attack: {name: bound_stat(stat, name, per_seed(name)) for name, stat in stats.items()}
        for attack, stats in (m.get("leakage") or {}).items()
    }
    m["worst_case"] = {
        name: bound_stat(stat, name, per_seed(name)) for name, stat in (m.get("worst_case") or {}).items()
    }
    return {**entry, "metrics": m}
