"""No committed rate or accuracy has an interval outside its metric's range (issue 26, item 6).

Reads the committed `leaderboards/*/entries/*.json` only. Expected to FAIL until the committed boards
are rebuilt from their runs with entry schema 2 (`fedbench leaderboard build --all`): the boards of
schema 1 print mean ± a symmetric spread that leaves [0, 1] (label accuracy 100.0 ± 0.0 of few
inputs, ASR intervals below 0 %). A schema-2 entry keeps [low, high] (Clopper-Pearson for a rate).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedbench.metrics.catalogue import METRICS
from fedbench.reporting.intervals import value_range

ROOT = Path(__file__).resolve().parents[1] / "leaderboards"
ENTRIES = sorted(ROOT.glob("*/entries/*.json"))


def _rate_or_accuracy(name: str) -> bool:
    """A share shown in percent: accuracies (test, label, attack) and success rates."""
    m = METRICS.get(name) if name in METRICS else None
    return m is not None and m.unit == "pct" and tuple(m.bounds) == (0, 1)


def _stats(entry: dict):
    """(where, metric name, stat) of every aggregated metric of an entry."""
    m = entry["metrics"]
    for key in ("test_acc", "acc_drop"):
        yield key, key, m.get(key)
    for attack, stats in (m.get("leakage") or {}).items():
        for name, stat in stats.items():
            yield f"{attack}:{name}", name, stat
    for name, stat in (m.get("worst_case") or {}).items():
        yield f"worst-case:{name}", name, stat


def _interval(stat: dict) -> tuple[float, float] | None:
    """The interval an entry shows: [low, high] (schema 2), else mean ± its 95 % CI half-width (a
    std, with two seeds, is a spread, not an interval)."""
    if stat.get("low") is not None:
        return stat["low"], stat["high"]
    if stat.get("spread") is not None and stat.get("spread_kind") == "ci95":
        return stat["mean"] - stat["spread"], stat["mean"] + stat["spread"]
    return None


def test_committed_rates_and_accuracies_stay_in_range():
    if not ENTRIES:
        pytest.skip("no committed boards")
    outside, checked = [], 0
    for path in ENTRIES:
        entry = json.loads(path.read_text(encoding="utf-8"))
        for where, name, stat in _stats(entry):
            interval = _interval(stat) if stat and _rate_or_accuracy(name) else None
            if interval is None:
                continue
            checked += 1
            lo, hi = value_range(METRICS[name])
            if interval[0] < lo - 1e-12 or interval[1] > hi + 1e-12:
                board = path.parents[1].name
                outside.append(f"{board}/{path.stem} {where} [{interval[0]:.4g}, {interval[1]:.4g}]")
    assert not outside, f"{len(outside)} of {checked} intervals outside [0, 1]:\n" + "\n".join(outside)


def test_committed_statistics_recompute_from_the_entries():
    """Boards of entry schema 2 keep their per-seed values: recomputing intervals and rank stability
    from them (`board_stats.restat_board`, no run) gives what is committed. Boards of schema 1 keep no
    per-seed values and are skipped (they are rebuilt from their runs)."""
    from fedbench.reporting import board_stats
    from fedbench.reporting import leaderboard as lb

    current = [
        n
        for n in lb.board_names(ROOT)
        if all(board_stats.has_per_seed(e) for e in lb.load_board(ROOT / n)[1])
    ]
    if not current:
        pytest.skip("no committed board of entry schema 2 yet")
    for name in current:
        board, entries = lb.load_board(ROOT / name)
        for old, new in zip(entries, board_stats.restat_board(board, entries), strict=True):
            assert board_stats.same_statistics(new, old), (
                f"{name}/{old['defense']}: its statistics differ from a recomputation"
            )
