"""The statistics a board entry carries, and their recomputation from the per-seed values it keeps.

An entry's metric (`board_schema.Stat`) is a table cell (`tables.Cell`) written out: the mean over
seeds, its 95 % interval inside the metric's range (`low`, `high`; `intervals`), a rate's pooled
counts (`k` successes in `inputs` inputs) and, since entry schema 2, the values the mean averages,
one per seed of the entry (`per_seed`, with `per_seed_k` and `per_seed_inputs` for a rate). With
those, intervals and rank stability are recomputed from the entries alone (`restat_board`): a change
of method re-renders the committed boards without re-running anything. Entries of schema 1 keep only
means and spreads; they render as they always did, and only a rebuild from the runs refreshes them.

Rank stability (`with_rank_stability`) is computed here from the entries too, so a board built from
runs and one recomputed from its entries get the same numbers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from fedbench.errors import FedbenchError
from fedbench.metrics.catalogue import metric
from fedbench.reporting.board_schema import Board
from fedbench.reporting.ranking import rank_stability, ranked, rounded
from fedbench.reporting.tables import Cell, aggregate


def _count(v: float | None) -> float | int | None:
    """A count as the entries keep it: an integer when it is one (6 decimals otherwise: a TPR's k)."""
    if v is None or math.isnan(v):
        return None
    r = round(float(v), 6)
    return int(r) if r.is_integer() else r


def stat_record(c: Cell | None, seeds: Sequence[int]) -> dict[str, Any] | None:
    """A cell as an entry keeps it; `seeds` are the entry's seeds, which `per_seed` follows (None where
    a seed has no value; several values of one seed enter as their mean, their counts summed)."""
    if c is None or c.value is None:
        return None
    out: dict[str, Any] = {
        "mean": rounded(c.value),
        "spread": rounded(c.spread),
        "spread_kind": c.spread_kind,
        "n": c.n,
    }
    if c.low is not None and c.high is not None:
        out.update(low=rounded(c.low), high=rounded(c.high))
    if c.k is not None:
        out.update(k=_count(c.k), inputs=_count(c.inputs))
    if c.per_seed:
        by_seed: dict[int, list[tuple[float, float | None]]] = {}
        for seed, value, inputs in c.per_seed:
            by_seed.setdefault(int(seed), []).append((value, inputs))
        values = [by_seed.get(s) for s in seeds]
        out["per_seed"] = [None if v is None else rounded(sum(x for x, _ in v) / len(v)) for v in values]
        if c.k is not None:  # a rate: each seed's successes and inputs
            counts = [None if v is None else sum(n for _, n in v) for v in values]
            out["per_seed_k"] = [None if v is None else _count(sum(x * n for x, n in v)) for v in values]
            out["per_seed_inputs"] = [_count(n) for n in counts]
    if c.attack:
        out["attack"] = c.attack
        out["per_input"] = c.per_input
        if c.selection:
            out["selection"] = c.selection
    return out


def stat_cell(stat: dict[str, Any] | None) -> Cell:
    """An entry's stat as a table cell (`board_pivot`), old entries (mean ± spread) included."""
    if not stat:
        return Cell(None)
    return Cell(
        stat["mean"],
        stat.get("spread"),
        stat.get("spread_kind", ""),
        stat["n"],
        stat.get("attack", ""),
        per_input=bool(stat.get("per_input")),
        low=stat.get("low"),
        high=stat.get("high"),
        k=stat.get("k"),
        inputs=stat.get("inputs"),
        selection=stat.get("selection", ""),
    )


def has_per_seed(entry: dict[str, Any]) -> bool:
    """Whether the entry keeps its per-seed values (schema 2): its accuracy does."""
    return entry["metrics"]["test_acc"].get("per_seed") is not None


def _seed_values(stat: dict[str, Any]) -> tuple[list[float | None], list[float | None] | None]:
    """A stat's per-seed values and, for a rate, per-seed inputs; a rate's value is its k over inputs."""
    if stat.get("per_seed_k") is None:
        return list(stat["per_seed"]), None
    inputs = list(stat["per_seed_inputs"])
    values = [None if k is None or not n else k / n for k, n in zip(stat["per_seed_k"], inputs, strict=True)]
    return values, inputs


def restat(stat: dict[str, Any] | None, name: str, seeds: Sequence[int]) -> dict[str, Any] | None:
    """A stat recomputed from its per-seed values (`tables.aggregate`), its attack and selection kept."""
    if not stat:
        return stat
    if stat.get("per_seed") is None:
        raise FedbenchError(f"metric {name}: the entry keeps no per-seed values; rebuild the board from runs")
    values, inputs = _seed_values(stat)
    present = [i for i, v in enumerate(values) if v is not None]
    cell = aggregate(
        [values[i] for i in present],
        metric(name),
        inputs=None if inputs is None else [inputs[i] for i in present],
        seeds=[seeds[i] for i in present],
    )
    cell = dataclasses.replace(
        cell,
        attack=stat.get("attack", ""),
        per_input=bool(stat.get("per_input")),
        selection=stat.get("selection", ""),
    )
    return stat_record(cell, seeds)


def restat_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry with every metric's interval recomputed from its per-seed values (a copy)."""
    seeds = entry["seeds"]
    m = dict(entry["metrics"])
    for key in ("test_acc", "acc_drop"):
        m[key] = restat(m.get(key), key, seeds)
    m["leakage"] = {
        attack: {name: restat(stat, name, seeds) for name, stat in stats.items()}
        for attack, stats in (m.get("leakage") or {}).items()
    }
    m["worst_case"] = {name: restat(stat, name, seeds) for name, stat in (m.get("worst_case") or {}).items()}
    return {**entry, "metrics": m}


def headline_per_seed(entry: dict[str, Any], headline: str) -> tuple[list[float], list[float], list[float]]:
    """The entry's per-seed test accuracy, headline leakage (worst case over the suite) and the
    leakage's inputs (1 per seed unless the headline is a rate: then its inputs, so a resampled mean
    is the pooled k / n the entry shows); NaN where a seed has no value."""
    util = [math.nan if v is None else v for v in entry["metrics"]["test_acc"]["per_seed"]]
    stat = (entry["metrics"].get("worst_case") or {}).get(headline)
    if not stat:
        return util, [math.nan] * len(util), [1.0] * len(util)
    values, inputs = _seed_values(stat)
    leak = [math.nan if v is None else v for v in values]
    weights = [1.0] * len(leak) if inputs is None else [math.nan if n is None else float(n) for n in inputs]
    return util, leak, weights


def with_rank_stability(board: Board, entries: list[dict[str, Any]]) -> None:
    """Set every entry's `rank_stability` (`ranking.rank_stability`: the board's seeds resampled
    jointly) from the per-seed values the entries keep."""
    sign = metric(board.headline).leakage_sign
    shown = {e["defense"]: rank for rank, e in ranked(board, entries)}
    per_seed = []
    for e in entries:
        util, leak, weights = headline_per_seed(e, board.headline)
        per_seed.append((util, [v * sign for v in leak], weights))
    stability = rank_stability(
        per_seed, [shown[e["defense"]] for e in entries], seeds=[e["seeds"] for e in entries]
    )
    for entry, stable in zip(entries, stability, strict=True):
        entry["rank_stability"] = stable


def restat_board(board: Board, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries with intervals and rank stability recomputed from the per-seed values they keep,
    without re-running anything (entries of schema 2; older ones raise: rebuild them from the runs)."""
    old = [e["defense"] for e in entries if not has_per_seed(e)]
    if old:
        raise FedbenchError(
            f"{board.name}: entries {', '.join(old)} keep no per-seed values (schema 1); "
            "rebuild the board from its runs ('fedbench leaderboard build')"
        )
    out = [restat_entry(e) for e in entries]
    if board.board_version < 2:  # a v2 board's ranks and their stability live only in rendered files
        with_rank_stability(board, out)
    return out


def same_statistics(a: Any, b: Any) -> bool:
    """Whether two entries (or parts) state the same statistics: equal, numbers up to the 6 significant
    digits entries keep and what that rounding does to a spread recomputed from rounded per-seed values
    (a PSNR near 100 dB kept to 1e-4 moves a spread by ~1e-4; abs 1e-3 is far below the 2 decimals
    printed). `restat` rewrites an entry only where they differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_statistics(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_statistics(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-3)
    return a == b
