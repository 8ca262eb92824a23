"""Re-running a board's runs and checking the numbers they feed (`fedbench leaderboard verify`), and
putting one new configuration on a board (`fedbench leaderboard add`).

A v2 entry (`board_inputs`) keeps, per attack and seed, the run ids of its inputs and each input's
values, and per seed the accuracy of the FL training. So one re-run run (one seed x attack x victim
batch) identifies exactly which numbers it feeds: its inputs' values, its seed's run-level values
(when the seed has that one run) and the seed's test accuracy.

- Same environment (the CPU capability and torch version the board was built or last verified with):
  every number must be identical to the 6 significant digits entries keep.
- Another environment: an optimisation attack's trajectory depends on the CPU's kernels, so a number
  must keep its row within the published interval: the row's primary rate and its test accuracy,
  recomputed with the re-run values in place, stay inside the entry's 95 % intervals.
"""

from __future__ import annotations

import copy
import hashlib
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedbench.reporting.board_rank import rank_board
from fedbench.reporting.board_schema import Board
from fedbench.reporting.ranking import rounded


@dataclass(frozen=True)
class RunRef:
    """Where a run's numbers live in a board: the entry, the attack ('' for the training) and seed."""

    run_id: str
    defense: str
    attack: str
    seed: str


def board_runs(entries: list[dict[str, Any]]) -> list[RunRef]:
    """Every attack run of the board's entries, in a stable order."""
    refs: dict[str, RunRef] = {}
    for e in entries:
        for attack, seeds in sorted((e.get("per_seed") or {}).items()):
            for seed, rec in sorted(seeds.items()):
                for run in rec.get("runs", []):
                    refs.setdefault(run, RunRef(run, e["defense"], attack, seed))
    return [refs[k] for k in sorted(refs)]


def sample_runs(refs: list[RunRef], k: int, rng_seed: int) -> list[RunRef]:
    """`k` runs drawn without replacement (all when fewer)."""
    if k >= len(refs):
        return list(refs)
    return sorted(random.Random(rng_seed).sample(refs, k), key=lambda r: r.run_id)


@dataclass
class Check:
    """One compared number."""

    where: str
    committed: Any
    rerun: Any
    ok: bool


@dataclass
class Verification:
    checks: list[Check] = field(default_factory=list)
    exact: bool = True

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def passed(self) -> bool:
        return not self.failures


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return rounded(float(a)) == rounded(float(b)) or (math.isnan(float(a)) and math.isnan(float(b)))


def _within(value: float | None, low: float | None, high: float | None) -> bool:
    if value is None or low is None or high is None:
        return True  # nothing published to hold it to
    tol = 1e-9 * max(1.0, abs(value))
    return low - tol <= value <= high + tol


def compare(
    board: Board,
    entries: list[dict[str, Any]],
    refs: list[RunRef],
    frame,
    per_image: dict[str, dict[str, list]],
    exact: bool,
) -> Verification:
    """Compare the re-run `frame` (results rows of the `refs`' runs) with the committed entries."""
    result = Verification(exact=exact)
    by_defense = {e["defense"]: e for e in entries}
    rows = {str(r["run_id"]): r for _, r in frame.iterrows()}
    substituted = copy.deepcopy(by_defense)
    touched: set[str] = set()
    for ref in refs:
        e = by_defense[ref.defense]
        row = rows.get(ref.run_id)
        where = f"entries of {ref.defense}: {ref.attack} seed {ref.seed} (run {ref.run_id})"
        if row is None or row.get("status") != "ok":
            reason = "missing" if row is None else f"{row.get('status')}: {row.get('reason')}"
            result.checks.append(Check(f"{where}: the re-run", "ok", reason, False))
            continue
        rec = (e.get("per_input") or {}).get(ref.attack, {}).get(ref.seed)
        if rec is not None:
            pos = 0
            for run, count in zip(rec["runs"], rec["counts"], strict=True):
                if run == ref.run_id:
                    break
                pos += int(count)
            fresh = per_image.get(ref.run_id) or {}
            for name, values in rec["values"].items():
                new = fresh.get(name)
                for j in range(int(rec["counts"][rec["runs"].index(ref.run_id)])):
                    old = values[pos + j]
                    got = None if new is None or j >= len(new) else new[j]
                    label = f"{where}: {name}[{pos + j}]"
                    if exact:
                        result.checks.append(
                            Check(label, old, rounded(got) if got is not None else None, _same(old, got))
                        )
                    elif got is not None:
                        substituted[ref.defense]["per_input"][ref.attack][ref.seed]["values"][name][
                            pos + j
                        ] = float(got)
                        touched.add(ref.defense)
        seed_rec = (e.get("per_seed") or {}).get(ref.attack, {}).get(ref.seed) or {}
        if seed_rec.get("runs") == [ref.run_id]:  # the seed's one run: its run-level values too
            for name, old in seed_rec.items():
                if name == "runs" or ":" in name or name.endswith("_seconds") or name not in row:
                    continue
                got = row.get(name)
                got = None if got is None or (isinstance(got, float) and math.isnan(got)) else got
                label = f"{where}: {name}"
                if exact:
                    result.checks.append(
                        Check(label, old, rounded(float(got)) if got is not None else None, _same(old, got))
                    )
        seeds = [str(s) for s in e["seeds"]]
        acc = e["metrics"]["test_acc"]
        if ref.seed in seeds and acc.get("per_seed"):
            old = acc["per_seed"][seeds.index(ref.seed)]
            got = row.get("test_acc")
            label = f"entries of {ref.defense}: test_acc seed {ref.seed}"
            if exact:
                result.checks.append(
                    Check(label, old, rounded(float(got)) if got is not None else None, _same(old, got))
                )
            else:
                ok = _within(float(got), acc.get("low"), acc.get("high"))
                result.checks.append(
                    Check(label + " within its interval", [acc.get("low"), acc.get("high")], got, ok)
                )
    if not exact and touched:
        fresh_rank = rank_board(list(substituted.values()), board.primary, board.utility_budget)
        published = rank_board(entries, board.primary, board.utility_budget)
        old_rows = {r.defense: r for r in published.rows}
        for r in fresh_rank.rows:
            if r.defense not in touched:
                continue
            old = old_rows[r.defense]
            ok = _within(r.rate, old.low, old.high)
            result.checks.append(
                Check(
                    f"{r.defense}: {board.primary} with the re-run values, within its interval",
                    [old.low, old.high],
                    r.rate,
                    ok,
                )
            )
    return result


def source_digest(path: str | Path) -> str:
    """16 hex digits of a plugin file's bytes (what `leaderboard add --plugin` records in the entry)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
