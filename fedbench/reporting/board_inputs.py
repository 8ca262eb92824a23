"""What a v2 entry keeps of its runs so that every statistic is computed at render time (`board_rank`):
per attack and seed, each input's values (`per_input`) and each run-level value (`per_seed`).

- `per_input[attack][seed]`: `victims` (the victims in order), `counts` (each victim's inputs),
  `runs` (their run ids) and `values` (metric -> one value per input, victims one after another):
  the results' per-image scores (`per_image` of the JSON sidecar). The worst case over attacks is
  then taken per (seed, victim, position), as design §7.1 asks, and a rerun of one run
  (`leaderboard verify`) knows which values it feeds.
- `per_seed[attack][seed]`: the run-level metric columns of that attack on that seed (victims pooled:
  a rate is k / n over them), a rate's inputs as `<metric>:n`, and the run ids.

Values are rounded to the 6 significant digits entries keep.
"""

from __future__ import annotations

import math
from typing import Any

from fedbench.metrics.catalogue import METRICS
from fedbench.reporting.input_keys import victim_list
from fedbench.reporting.intervals import ONE_PER_RUN, inputs_column, is_rate
from fedbench.reporting.ranking import is_missing, rounded


def _number(v: Any) -> float | None:
    if v is None or isinstance(v, str) or is_missing(v):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return rounded(f) if math.isfinite(f) else None


def entry_inputs(runs, per_image: dict[str, dict[str, list]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(`per_input`, `per_seed`) of one defense's attack runs (rows of a results frame whose `attack`
    column already carries the observation point when that varies: `board_build.observation_view`)."""
    per_input: dict[str, dict[str, Any]] = {}
    per_seed: dict[str, dict[str, Any]] = {}
    attacked = runs[runs["attack"] != ""]
    for (attack, seed), grp in attacked.groupby(["attack", "seed"], sort=True):
        grp = grp.sort_values("sc_victim", key=lambda col: col.map(str)) if "sc_victim" in grp else grp
        victims: list[Any] = []
        counts: list[int] = []
        values: dict[str, list[float | None]] = {}
        complete = True
        for _, row in grp.iterrows():
            scores = per_image.get(row["run_id"]) or {}
            lengths = {len(v) for v in scores.values() if isinstance(v, list)}
            if len(lengths) != 1:
                complete = False
                break
            n = lengths.pop()
            shown = victim_list(row["sc_victim"]) if "sc_victim" in row else [0]
            victims.append(shown[0] if len(shown) == 1 else shown)
            counts.append(n)
            for m, arr in scores.items():
                if m in METRICS and isinstance(arr, list):
                    values.setdefault(m, [None] * (sum(counts) - n)).extend(_number(v) for v in arr)
            for m in values:  # a metric this run lacks: None for its inputs
                values[m].extend([None] * (sum(counts) - len(values[m])))
        key = str(int(seed))
        values = {m: v for m, v in values.items() if any(x is not None for x in v)}
        if complete and values:
            per_input.setdefault(attack, {})[key] = {
                "victims": victims,
                "counts": counts,
                "runs": list(grp["run_id"]),
                "values": values,
            }
        per_seed.setdefault(attack, {})[key] = _seed_record(grp)
    return per_input, per_seed


def _seed_record(grp) -> dict[str, Any]:
    """One attack's run-level values on one seed, victims pooled (a rate: k / n over them)."""
    out: dict[str, Any] = {"runs": list(grp["run_id"])}
    for col in grp.columns:
        m = METRICS.get(col) if col in METRICS else None
        if m is None or not m.per_attack:
            continue
        vals = [_number(v) for v in grp[col]]
        if all(v is None for v in vals):
            continue
        counted = inputs_column(m) if is_rate(m) else None
        if counted and counted != ONE_PER_RUN and counted in grp:
            n = [_number(v) for v in grp[counted]]
            if all(v is not None for v in vals) and all(x is not None for x in n) and sum(n) > 0:
                out[col] = rounded(sum(v * x for v, x in zip(vals, n, strict=True)) / sum(n))
                out[f"{col}:n"] = rounded(sum(n))
                continue
        if counted == ONE_PER_RUN:
            present = [v for v in vals if v is not None]
            out[col] = rounded(sum(present) / len(present))
            out[f"{col}:n"] = len(present)
            continue
        present = [v for v in vals if v is not None]
        out[col] = rounded(sum(present) / len(present))
    # a TPR's operating point: the counts and threshold each seed's exact low-FPR point rests on
    counts = [c for c in grp.columns if c.startswith(("mia_tp_at_", "mia_fp_at_", "mia_threshold_at_"))]
    for col in ("mia_n_members", "mia_n_nonmembers", *counts):
        if col in grp and col not in out:
            n = [_number(v) for v in grp[col]]
            if all(x is not None for x in n):
                out[col] = rounded(sum(n) / len(n))
    return out
