"""From a results set to a board: `build` makes its definition (`Board`) and one entry per defense.

Everything the board keeps about its runs is computed here, while the results are at hand: the
metrics' means over seeds with their intervals and per-seed values (`board_stats.stat_record`; a
rate's inputs counted over pooled victims too), the attacker's vantage points (victims pooled,
observation points as attack columns: `observation_view`), the privacy budget and audit of each
entry (`_epsilon`), the headline's baseline (`headline_baseline`), the cost of the runs
(`build_cost`) and the papers' numbers that concern the board (`match_reported`,
`reported_records`); rank stability is then computed from the entries (`board_stats`). Writing and
rendering the board are `leaderboard`'s.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from fedbench.errors import FedbenchError
from fedbench.execution.cascade import SKIP_PREFIX
from fedbench.metrics.catalogue import METRICS, metric
from fedbench.reporting.board_inputs import entry_inputs
from fedbench.reporting.board_schema import METHOD2_SCHEMA, SCHEMA_VERSION, Board, parse
from fedbench.reporting.board_stats import headline_per_seed, stat_record, with_rank_stability
from fedbench.reporting.input_keys import victim_list
from fedbench.reporting.intervals import INPUT_COLUMNS, inputs_column
from fedbench.reporting.ranking import is_missing, rounded
from fedbench.reporting.tables import (
    ONLY_ATTACK,
    RUNS_COLUMN,
    WORST,
    ResultSet,
    apply_where,
    family_defaults,
    pivot,
    row_inputs,
    slice_columns,
)


def _first(values) -> Any:
    for v in values:
        if not is_missing(v) and v != "":
            return v.item() if hasattr(v, "item") else v
    return None


def default_command(preset: str, board: str) -> str:
    """A board's command when its results record none (the Python API's): no local path in it."""
    return f"fedbench run {preset} && fedbench export --to leaderboard --board {board}"


def build(
    results: ResultSet,
    board_name: str | None = None,
    where: Sequence[str] = (),
    command: str | None = None,
    baseline: dict[str, Any] | None = None,
) -> tuple[Board, list[dict[str, Any]]]:
    """The board definition and one entry per defense configuration from a results set.

    The results must be one scenario, except the attacker's vantage point (`VARYING_OBSERVATION`):
    several victims are pooled (each victim's run is more inputs), several observation points or rounds
    become attack columns ("cpl @update"); see `observation_view`. `baseline`: a committed `none`
    entry that stands in for `none`'s runs (`leaderboard add` puts one configuration on a board).
    """
    frame = apply_where(results.frame, where)
    ok = frame[frame["status"] == "ok"]
    if ok.empty:
        raise FedbenchError("no successful runs: nothing to put on a leaderboard")
    sl = slice_columns(ok)
    varying = [c for c in sl if ok[c].astype(str).nunique() > 1]
    fixed = [c for c in varying if c not in VARYING_OBSERVATION]
    if fixed:
        raise FedbenchError(
            f"a board is one scenario, but these results vary in {', '.join(fixed)}; "
            f"pick one with --where, e.g. --where {fixed[0]}={ok[fixed[0]].iloc[0]}"
        )
    if "none" not in set(ok["defense"]) and baseline is None:
        raise FedbenchError("a board needs the 'none' baseline; add -D none to the run")
    spec = results.board
    preset = str(_first(ok["preset"]) or "") if "preset" in ok else ""
    name = board_name or spec.get("name") or preset or "board"
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", name):
        raise FedbenchError(f"board name {name!r}: use letters, digits, '-', '_' or '.'")
    view, per_image = observation_view(ok, results.per_image, varying)
    method2 = bool(spec.get("primary"))
    # the v2 method keeps each run's inputs: observation points as attack labels, victims not pooled
    unpooled = observation_view(ok, results.per_image, [c for c in varying if c not in POOLED_OBSERVATION])[0]
    if "epsilon" in view:  # an infinite epsilon is the entry's business (`_epsilon`), not a mean's
        view = view.assign(epsilon=view["epsilon"].astype(float).replace([math.inf, -math.inf], math.nan))
    attacked = view[view["attack"] != ""]
    # the suite: every attack that ran, and those the cascade left with nothing to attack on every row
    skipped = frame[frame["status"] == "skipped"] if "reason" in frame else frame.iloc[0:0]
    skipped = skipped[skipped["reason"].astype(str).str.startswith(SKIP_PREFIX)]
    suite = tuple(dict.fromkeys([*attacked["attack"], *skipped["attack"]]))
    present = [m for m in ("psnr", "ssim", "lpips", "label_acc") if m in view and view[m].notna().any()]
    present = present or [m.name for ms in family_defaults(view) for m in ms]  # membership/attribute runs
    headline = spec.get("headline", present[0] if present else "psnr")
    metric(headline)
    wanted = [metric(m).name for m in spec.get("metrics", present)]
    if suite and headline not in wanted:
        wanted.insert(0, headline)
    wanted = [m for m in wanted if m in view and view[m].notna().any()] if suite else []
    p = pivot(
        view,
        metrics=(wanted if suite else []) + ["utility_seconds"],
        rows=["defense"],
        agg="mean",
        per_image=per_image,
    )
    scenario = {c: _values(ok[c]) if c in varying else _first(ok[c]) for c in sl}
    sidecar = results.sidecars[-1] if results.sidecars else {}
    cost = build_cost(ok)
    families = {plugin_name(d) for d in ok["defense"]}
    entries = []
    for i, (key, _cells) in enumerate(p.rows):
        defense = key[0]
        runs = ok[ok["defense"] == defense]
        seeds = sorted({int(s) for s in runs["seed"]})
        params = {
            c[len("p_defense_") :]: _first(runs[c])
            for c in runs.columns
            if c.startswith("p_defense_") and _first(runs[c]) is not None
        }
        leakage: dict[str, dict[str, Any]] = {}
        worst: dict[str, Any] = {}
        for col in p.columns:
            if col.metric.kind != "leakage":
                continue
            stat = stat_record(p.cell(i, col.key), seeds)
            if col.group == WORST:
                worst[col.metric.name] = stat
            else:
                leakage.setdefault(col.group, {})[col.metric.name] = stat
        # a metric one attack of the suite reports (a one-attack suite; a membership metric beside an
        # attribute attack) has that attack's value as its worst case
        reporters: dict[str, list[tuple[str, Any]]] = {}
        for attack, stats in leakage.items():
            for m, stat in stats.items():
                reporters.setdefault(m, []).append((attack, stat))
        for m, found in reporters.items():
            if m not in worst and len(found) == 1:
                attack, stat = found[0]
                worst[m] = dict(stat, attack=attack, per_input=False, selection=ONLY_ATTACK) if stat else None
        created = [str(x) for x in runs.get("created_at", []) if not is_missing(x)]
        extra: dict[str, Any] = {}
        if method2:
            per_input, per_seed = entry_inputs(unpooled[unpooled["defense"] == defense], results.per_image)
            extra = {"per_input": per_input, "per_seed": per_seed}
        entries.append(
            {
                **extra,
                "schema": METHOD2_SCHEMA if method2 else SCHEMA_VERSION,
                "board": name,
                "defense": defense,
                "defense_name": str(_first(runs["defense_name"]) or defense.split("[")[0]),
                "params": params,
                "scenario": scenario,
                "attack_suite": list(suite),
                "seeds": seeds,
                "run_ids": sorted(set(runs["run_id"])),
                "metrics": {
                    "test_acc": stat_record(p.cell(i, "test_acc"), seeds),
                    "acc_drop": stat_record(p.cell(i, "acc_drop"), seeds),
                    **_epsilon(runs),
                    "leakage": leakage,
                    "worst_case": worst,
                    "cost": {
                        "utility_seconds": rounded(p.cell(i, "utility_seconds").value),
                        "attack_seconds": rounded(runs["attack_seconds"].mean())
                        if "attack_seconds" in runs and runs["attack_seconds"].notna().any()
                        else None,
                    },
                },
                "fedbench_version": str(_first(runs.get("fedbench_version", [])) or ""),
                "date": max(created)[:10] if created else "",
            }
        )
    v2 = (
        {
            "board_version": 2,
            "primary": metric(spec["primary"]).name,
            "utility_budget": float(spec["utility_budget"]),
            "slice_of": str(spec.get("slice_of") or ""),
            "environment": compute_environment(),
            "cascade": tuple(sidecar.get("cascade") or ()),
        }
        if method2
        else {}
    )
    board = parse(
        Board,
        {
            **v2,
            "schema": METHOD2_SCHEMA if method2 else SCHEMA_VERSION,
            "name": name,
            **board_words(spec, sidecar, name, method2),
            "scenario": scenario,
            "attack_suite": suite,
            "headline": headline,
            "metrics": tuple(wanted),
            "command": command or str(spec.get("command") or default_command(preset or name, name)),
            "preset": preset,
            "views": tuple(f"{k}:{spec[k]}" for k in ("budget", "target") if spec.get(k)),
            "baseline": headline_baseline(view, headline, _none_per_seed(entries, headline))
            if suite
            else None,
            "build_seconds": None
            if cost is None
            else rounded(cost["utility_seconds"] + cost["attack_seconds"]),
            "cost": cost,
            "reported": tuple(reported_records(match_reported(results.reported, families, suite))),
            "failures": failed_runs(frame),
        },
        f"board {name}",
    )
    if not method2:  # v2: ranks and their stability live only in the rendered files
        with_rank_stability(board, entries)
    return board, entries


def board_words(spec: dict[str, Any], grid: dict[str, Any], name: str, method2: bool) -> dict[str, Any]:
    """The board's descriptive fields from its preset's [grid.board] table (`spec`) and [grid] table
    (`grid`: description, substitution): words about the runs, not results, so `leaderboard describe`
    can refresh them without a build (`board_describe`)."""
    words: dict[str, Any] = {
        "title": str(spec.get("title") or grid.get("description") or name),
        "description": str(spec.get("description") or grid.get("description") or ""),
        "substitution": str(grid.get("substitution") or ""),
        "threat_model": str(spec.get("threat_model") or ""),
    }
    if method2:
        words |= {
            "threat_id": str(spec.get("threat_id") or ""),
            "knowledge": dict(spec.get("knowledge") or {}),
            "tuning": str(spec.get("tuning") or ""),
        }
    return words


def compute_environment() -> dict[str, str]:
    """The torch version and the CPU capability torch's kernels use here: numbers from an optimisation
    attack are reproducible bit for bit only where both match (`leaderboard verify`)."""
    import torch

    return {"torch_version": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def _none_per_seed(entries: list[dict[str, Any]], headline: str) -> tuple[list[float], list[float]] | None:
    """The `none` entry's per-seed accuracy and headline leakage (`board_stats.headline_per_seed`)."""
    none = next((e for e in entries if e["defense"] == "none"), None)
    return None if none is None else headline_per_seed(none, headline)[:2]


# --------------------------------------------------------------------- observation points on a board


# scenario columns of the attacker's vantage point a board may vary (the rest is one scenario):
# victims are pooled, observation points and rounds become attack columns
POOLED_OBSERVATION = ("sc_victim",)
GROUPED_OBSERVATION = ("sc_observe", "sc_observe_round")
VARYING_OBSERVATION = POOLED_OBSERVATION + GROUPED_OBSERVATION


def _values(column) -> list[Any]:
    """The distinct values of a scenario column, in order of appearance (a board's varying field)."""
    return [v.item() if hasattr(v, "item") else v for v in dict.fromkeys(column) if not is_missing(v)]


def plugin_name(label: str) -> str:
    """A plugin label's name: 'cpl[iterations=100] @update' -> 'cpl'."""
    return label.split("[", 1)[0].split(" @", 1)[0]


def observation_view(ok, per_image: dict[str, dict[str, list]], varying: Sequence[str]):
    """(rows, per-image scores) as the board aggregates them when the attacker's vantage point varies.

    - An observation point or round that varies (`GROUPED_OBSERVATION`) joins the attack label:
      'cpl @update', 'cpl @example' (with the round: 'cpl @update,r2'), so each is a column of the
      attack suite and the worst case is taken over all of them.
    - Victims (`POOLED_OBSERVATION`) are pooled: the runs of one (defense, attack, seed) on several
      victims become one row whose metrics are the victims' mean and whose per-image scores are the
      victims' images one after another (each victim's run is more inputs), so the worst case is
      taken per (seed, victim, image) and a seed's value averages its victims. A victim run without
      per-image scores enters as one input (its row value).

    Results whose vantage point does not vary are returned as they are.
    """
    import pandas as pd

    grouped = [c for c in GROUPED_OBSERVATION if c in varying]
    pooled = [c for c in POOLED_OBSERVATION if c in varying]
    if not grouped and not pooled:
        return ok, per_image
    view = ok.copy()
    attacked = view["attack"] != ""
    if grouped:
        suffix = [
            ",".join(str(r[c]) if c == "sc_observe" else f"r{_as_int(r[c])}" for c in grouped)
            for _, r in view[attacked].iterrows()
        ]
        view.loc[attacked, "attack"] = [
            f"{a} @{x}" for a, x in zip(view.loc[attacked, "attack"], suffix, strict=True)
        ]
    if not pooled:
        return view, per_image
    out_images = dict(per_image)
    rows = []
    numeric = [c for c in view.columns if c in METRICS]
    counts = [c for c in view.columns if c in INPUT_COLUMNS]
    columns = [*view.columns, *([] if RUNS_COLUMN in view else [RUNS_COLUMN])]
    for _key, grp in view[attacked].groupby(["defense", "attack", "seed"], sort=False, dropna=False):
        grp = grp.sort_values(pooled[0], key=lambda col: col.map(str))
        row = grp.iloc[0].copy()
        if len(grp) > 1:
            for c in numeric:
                row[c] = _pooled_value(grp, c)
            for c in counts:  # a rate's inputs: the victims' together
                row[c] = float(pd.to_numeric(grp[c], errors="coerce").sum(min_count=len(grp)))
            row["run_id"] = "+".join(grp["run_id"])
            out_images[row["run_id"]] = _pooled_images(grp, per_image)
            # the pooled victims, in the order of their images: the worst case matches inputs by victim
            victims = [v for cell in grp[pooled[0]] for v in victim_list(cell)]
            row[pooled[0]] = json.dumps(victims, separators=(",", ":"))
        row[RUNS_COLUMN] = float(len(grp))
        rows.append(row)
    merged = pd.DataFrame(rows, columns=columns) if rows else view.iloc[0:0]
    return pd.concat([merged, view[~attacked]], ignore_index=True), out_images


def _pooled_value(grp, column: str) -> float:
    """A metric of a victim-pooled row: the victims' mean; for a rate whose inputs every victim run
    counts, the pooled share (k / n over the victims together)."""
    import pandas as pd

    vals = pd.to_numeric(grp[column], errors="coerce")
    if not vals.notna().any():
        return math.nan
    inputs = row_inputs(grp, inputs_column(METRICS[column]))
    if vals.notna().all() and all(n is not None for n in inputs) and sum(inputs) > 0:
        return float(sum(v * n for v, n in zip(vals, inputs, strict=True)) / sum(inputs))
    return float(vals.mean())


def _as_int(v: Any) -> Any:
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _pooled_images(grp, per_image: dict[str, dict[str, list]]) -> dict[str, list]:
    """The per-image scores of a victim-pooled row: per metric, the victims' images in victim order; a
    victim run with none (or with a missing score) enters as one input, its row value."""
    names = dict.fromkeys(m for r in grp["run_id"] for m in (per_image.get(r) or {}))
    names.update(dict.fromkeys(m for m in grp.columns if m in METRICS and METRICS[m].per_attack))
    out: dict[str, list] = {}
    for m in names:
        scores: list[float] = []
        for _, r in grp.iterrows():
            arr = (per_image.get(r["run_id"]) or {}).get(m)
            if arr is not None and len(arr) and all(v is not None for v in arr):
                scores += [float(v) for v in arr]
            elif m in r and _finite(r[m]) is not None:
                scores.append(float(r[m]))
            else:
                break
        else:
            out[m] = scores
    return out


# --------------------------------------------------------------------------------- epsilon and audit


def _finite(v: Any) -> float | None:
    if v is None or isinstance(v, str):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return rounded(f) if math.isfinite(f) else None


def _epsilon(runs) -> dict[str, Any]:
    """An entry's privacy budget: epsilon at delta with its level and accountant (epsilon None and
    `epsilon_infinite` when the accountant found no finite bound), and the audit's `eps_lower`."""
    eps = _first(runs["epsilon"]) if "epsilon" in runs else None
    infinite = isinstance(eps, int | float) and math.isinf(eps)
    out: dict[str, Any] = {
        "epsilon": None if infinite else _finite(eps),
        "delta": _finite(_first(runs["delta"])) if "delta" in runs else None,
        "dp_level": _first(runs["dp_level"]) if "dp_level" in runs else None,
        "accountant": _first(runs["accountant"]) if "accountant" in runs else None,
    }
    if infinite:
        out["epsilon_infinite"] = True
    if "eps_lower" in runs:
        import pandas as pd

        bounds = pd.to_numeric(runs["eps_lower"], errors="coerce")
        bounds = bounds[bounds.notna() & bounds.map(math.isfinite)]
        if len(bounds):
            i = bounds.idxmax()
            delta = runs.loc[i, "eps_lower_delta"] if "eps_lower_delta" in runs else None
            out["eps_lower"] = {
                "max": rounded(float(bounds[i])),
                "attack": str(runs.loc[i, "attack"]),
                "seed": int(runs.loc[i, "seed"]),
                "n": int(len(bounds)),
                "delta": _finite(delta),
            }
    return out


# ------------------------------------------------------------------------------------ baseline, cost


# what an attack gets by guessing, per headline: (kind, results column or None, constant)
_CHANCE = {"mia_auc": 0.5, "mia_acc": 0.5, "mia_advantage": 0.0, "asr_advantage": 0.0}


def headline_baseline(view, headline: str, none_values: tuple[list[float], list[float]] | None):
    """The board's baseline in its headline metric (None when the metric has none or no row carries
    it): the random-image floor (`plots.random_floor`), the membership chance level (AUC 0.5; accuracy
    at the base rate, the larger of `mia_base_rate` and its complement) or the attribute majority-class
    rate (`asr_majority`). `gap`: the `none` row's per-seed worst case minus the seed's baseline, mean
    and 95 % t interval over seeds."""
    import numpy as np

    from fedbench.reporting.plots import FLOOR_COLUMNS, random_floor
    from fedbench.reporting.tables import _t95

    m = metric(headline)
    base = view[(view["defense"] == "none") & (view["attack"] != "")]
    column, kind = "", ""
    if headline in FLOOR_COLUMNS:
        column, kind = FLOOR_COLUMNS[headline], "random image"
        value = random_floor(view, headline)
    elif headline == "mia_acc" and "mia_base_rate" in view and view["mia_base_rate"].notna().any():
        column, kind = "mia_base_rate", "chance"
        rate = float(view["mia_base_rate"].astype(float).mean())
        value = max(rate, 1 - rate)
    elif headline in _CHANCE:
        kind, value = "chance", _CHANCE[headline]
    elif headline == "asr" and "asr_majority" in view and view["asr_majority"].notna().any():
        column, kind = "asr_majority", "majority class"
        value = float(view["asr_majority"].astype(float).mean())
    else:
        return None
    if value is None:
        return None

    def seed_base(seed: int) -> float:
        rows = base[base["seed"] == seed]
        if not column or column not in rows or rows[column].isna().all():
            return value
        v = float(rows[column].astype(float).mean())
        return max(v, 1 - v) if column == "mia_base_rate" else v

    out: dict[str, Any] = {"metric": m.name, "value": rounded(value), "kind": kind, "column": column}
    if none_values is not None:  # per seed of `none`, as its entry lists them (`_none_per_seed`)
        seeds = sorted({int(s) for s in view.loc[view["defense"] == "none", "seed"]})
        leak = none_values[1]
        gaps = [lk - seed_base(s) for s, lk in zip(seeds, leak, strict=False) if not math.isnan(lk)]
        if gaps:
            arr = np.asarray(gaps, dtype=float)
            gap: dict[str, Any] = {"mean": rounded(float(arr.mean())), "n": len(gaps)}
            if len(gaps) > 1:
                half = _t95(len(gaps)) * float(arr.std(ddof=1)) / math.sqrt(len(gaps))
                gap.update(low=rounded(float(arr.mean()) - half), high=rounded(float(arr.mean()) + half))
            out["gap"] = gap
    return out


def failed_runs(frame) -> tuple[dict[str, Any], ...]:
    """Per defense configuration with failed or timed-out runs: how many of its runs, and the first
    reason. A configuration whose every run failed has no entry, so only this says it was tried."""
    bad = frame[frame["status"].isin(["failed", "timeout"])]
    out = []
    for defense in dict.fromkeys(bad["defense"]):
        runs = frame[frame["defense"] == defense]
        failed = bad[bad["defense"] == defense]
        reason = str(failed["reason"].iloc[0]) if "reason" in failed else ""
        out.append({"defense": str(defense), "failed": len(failed), "runs": len(runs), "reason": reason})
    return tuple(out)


def build_cost(ok) -> dict[str, Any] | None:
    """What the board's runs cost: utility seconds summed over its distinct FL trainings (the runs of
    one training, whatever attack or observation point, share it: `training_columns`), attack seconds
    over its attack runs. None when the results carry no timings."""
    import pandas as pd

    from fedbench.reporting.tables import training_columns

    if "utility_seconds" not in ok:
        return None
    trainings = ok.drop_duplicates(subset=training_columns(ok))
    utility = pd.to_numeric(trainings["utility_seconds"], errors="coerce").dropna()
    attacked = ok[ok["attack"] != ""]
    attack = (
        pd.to_numeric(attacked["attack_seconds"], errors="coerce").dropna()
        if "attack_seconds" in attacked
        else pd.Series(dtype=float)
    )
    return {
        "utility_seconds": rounded(float(utility.sum())) or 0.0,
        "attack_seconds": rounded(float(attack.sum())) or 0.0,
        "trainings": int(len(trainings)),
        "attack_runs": int(len(attacked)),
    }


# ------------------------------------------------------------------------------- the papers' numbers


_REPORTED_TEXT = ("dataset", "defense", "attack", "source", "note")


def match_reported(
    rows: Sequence[dict[str, Any]], defenses: set[str], suite: Sequence[str]
) -> list[dict[str, Any]]:
    """The `[[reported]]` rows that concern a board: a defense among its defense families, an attack
    (when the row names one) among its suite's attacks, and at least one catalogued number."""
    attacks = {plugin_name(a) for a in suite}
    out = []
    for r in rows:
        if "defense" not in r or plugin_name(str(r["defense"])) not in defenses:
            continue
        if r.get("attack") and plugin_name(str(r["attack"])) not in attacks:
            continue
        if any(k in METRICS and isinstance(v, int | float) and not isinstance(v, bool) for k, v in r.items()):
            out.append(dict(r))
    return out


def reported_records(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`[[reported]]` rows as board.json keeps them (`board_schema.ReportedRow`)."""
    out = []
    for r in rows:
        values = {
            k: float(v)
            for k, v in r.items()
            if k in METRICS and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }
        out.append(
            {
                **{k: str(r.get(k) or "") for k in _REPORTED_TEXT},
                "values": values,
                "conditions": {
                    k: str(v) for k, v in r.items() if k not in values and k not in _REPORTED_TEXT
                },
            }
        )
    return out
