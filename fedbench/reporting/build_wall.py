"""A board's build wall time: seconds on the clock, summed over the invocations of one build.

`build_seconds` (board.json) is the compute of every run, CPU-seconds summed over runs: what a board
costs on one core, not how long a maintainer waits. Issue 30 asks for the wait: a full board builds from
an empty cache within a stated wall time on a 2-core CPU. A build can be interrupted and resumed (its
finished runs are cached), so one measurement may span several invocations of `fedbench leaderboard
build`. The cache therefore keeps a small ledger per board (`builds/<board>.json` under the cache
folder): the open build's fingerprint (its run ids), its seconds and computed runs so far. Each
invocation adds to it, interrupted or not; the one that writes the board closes it, and the board
records the sum (`BuildWall`). `from_empty` says whether every run was computed within that build
(from an empty cache); otherwise the record says how many came from the cache. An invocation that
computes nothing (a re-export from the cache) keeps the board's earlier record instead of replacing a
measurement by seconds of reading.

A build killed without a signal it can catch (SIGKILL, a power cut) loses that invocation's seconds:
the sum is then short and its runs show up as cached in the next invocation, so `from_empty` is false.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import date
from pathlib import Path

LEDGER_DIR = "builds"


@dataclass(frozen=True)
class Invocation:
    """One `leaderboard build` invocation of one board: wall seconds, runs computed, how it ran."""

    seconds: float
    computed: int  # runs computed (not served from the cache)
    runs: int  # runs of the board's grid that were computed or read from the cache (not those skipped)
    n_jobs: str
    threads: str
    finished: bool  # it wrote the board (False: interrupted or failed; the build goes on next time)


def fingerprint(run_ids: list[str]) -> str:
    """16 hex digits naming a grid by its run ids (a changed preset starts a new measurement)."""
    return hashlib.sha256("\n".join(sorted(run_ids)).encode()).hexdigest()[:16]


def ledger_path(cache_location: Path | None, board: str) -> Path | None:
    return None if cache_location is None else Path(cache_location) / LEDGER_DIR / f"{board}.json"


def record(path: Path | None, grid: str, call: Invocation) -> dict | None:
    """Add `call` to the board's open build in the ledger at `path` (None: no cache, this call alone);
    returns the build's `BuildWall` record when `call` finished it, else None (also for a finished call
    that computed nothing and resumed no open build)."""
    state = _read(path)
    if not state or state.get("grid") != grid or state.get("closed"):
        if call.finished and not call.computed:
            return None  # a re-export from the cache measures nothing: the board keeps its record
        state = {"grid": grid, "seconds": 0.0, "computed": 0, "invocations": 0}
    state["seconds"] = float(state["seconds"]) + call.seconds
    state["computed"] = int(state["computed"]) + call.computed
    state["invocations"] = int(state["invocations"]) + 1
    state["closed"] = call.finished
    _write(path, state)
    if not call.finished:
        return None
    return {
        "seconds": round(state["seconds"], 1),
        "runs": call.runs,
        "computed": min(state["computed"], call.runs),
        "from_empty": state["computed"] >= call.runs,
        "invocations": state["invocations"],
        "n_jobs": call.n_jobs,
        "threads": call.threads,
        "cores": os.cpu_count() or 0,
        "date": date.today().isoformat(),
    }


def _read(path: Path | None) -> dict:
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # a damaged ledger starts a new measurement; it never stops a build
    return data if isinstance(data, dict) else {}


def _write(path: Path | None, state: dict) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, sort_keys=True) + "\n")
    tmp.replace(path)


def _clock(seconds: float) -> str:
    """'47 min' under an hour, else '1.6 h'."""
    return f"{seconds / 60:,.0f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def describe(wall: dict) -> str:
    """The README's wall-time sentence of a `BuildWall` record."""
    clock = _clock(wall["seconds"])
    how = f"{wall['cores']} cores, --n-jobs {wall['n_jobs']} --threads {wall['threads']}"
    if wall["from_empty"]:
        source = "from an empty cache"
    else:
        source = f"{wall['computed']} of {wall['runs']} runs computed, the others read from the cache"
    calls = wall["invocations"]
    resumed = f", in {calls} invocations (resumed)" if calls > 1 else ""
    return f"Wall time: {clock} on {how} ({source}{resumed}; {wall['date']})."


def index_cell(wall: dict | None, compute_seconds: float | None) -> str:
    """The index's build cell, short: the wall time of the last build from an empty cache ('47 min'),
    else, in parentheses, the CPU time the runs sum to ('(9.5 h CPU)'; '—' when unknown). Issue 30 asks
    for the first on every board; the board's README says how it ran (cores, --n-jobs)."""
    if wall is not None and wall["from_empty"]:
        return _clock(wall["seconds"])
    return f"({_clock(compute_seconds)} CPU)" if compute_seconds else "—"
