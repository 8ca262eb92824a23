"""Taking a configuration off a built board (`fedbench leaderboard remove`), with the reason on record.

Why: a board's rows follow rules that change (issue 30: every DP row at a target epsilon <= 8 or
labelled noise), and rebuilding a board of hours to drop a row measures nothing new: the other rows'
runs, numbers and ranks do not depend on it (each row is ranked against `none` and the budget). Removing
deletes the row's entry and records it in board.json (`RemovedRow`: what it measured, why, when), and
the README keeps one line per removed row, so a reader of the board sees that it was there. The preset
must drop the row too (a rebuild would bring it back); `leaderboard describe` and `verify` then agree.
A rebuild keeps the record of rows its preset still leaves out (`carried_removals`).
"""

from __future__ import annotations

import math
from typing import Any

from fedbench.errors import FedbenchError
from fedbench.reporting.board_notes import epsilon_value
from fedbench.reporting.board_rank import rank_board


def measured_text(board: Any, entries: list[dict[str, Any]], defense: str) -> str:
    """A row's primary rate, accuracy drop and epsilon as the board shows them, in one phrase."""
    rows = {r.defense: r for r in rank_board(entries, board.primary, board.utility_budget).rows}
    row = rows.get(defense)
    entry = next(e for e in entries if e["defense"] == defense)
    parts = []
    if row is not None and row.rate is not None:
        span = f" [{100 * row.low:.1f}, {100 * row.high:.1f}]" if row.low is not None else ""
        parts.append(f"{board.primary} {100 * row.rate:.1f} %{span}")
    if row is not None and row.drop is not None:
        parts.append(f"accuracy drop {100 * row.drop:.1f} points")
    eps = epsilon_value(entry.get("metrics", {}))
    if eps is not None:
        parts.append("epsilon ∞" if math.isinf(eps) else f"epsilon {eps:.3g}")
    return ", ".join(parts)


def removed_board(board: Any, entries: list[dict[str, Any]], defenses: list[str], reason: str, date: str):
    """(board, entries) without `defenses`, each recorded with `reason`; FedbenchError naming the
    problem when a defense is not on the board, is the `none` baseline, or no reason is given."""
    if not reason.strip():
        raise FedbenchError("--reason is empty: say why the rows leave the board (the README states it)")
    on_board = [e["defense"] for e in entries]
    for d in defenses:
        if d not in on_board:
            raise FedbenchError(f"{d!r} is not on board {board.name}; its rows: {', '.join(on_board)}")
        if d == "none":
            raise FedbenchError("'none' is every row's baseline and cannot leave the board")
    records = [
        {"defense": d, "reason": reason.strip(), "date": date, "measured": measured_text(board, entries, d)}
        for d in defenses
    ]
    kept = [e for e in entries if e["defense"] not in defenses]
    check = dict(board.budget_check or {})
    if check:
        check["rows"] = [r for r in check.get("rows", []) if r.get("defense") not in defenses]
    from fedbench.reporting.board_schema import Board, parse

    earlier = [r.model_dump() for r in board.removed if r.defense not in defenses]
    data = {**board.to_json(), "removed": [*earlier, *records], "budget_check": check}
    return parse(Board, data, f"board {board.name}"), kept


def carried_removals(previous: Any, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The removal records of a board's earlier version (raw board.json) for rows a rebuild still lacks."""
    present = {e["defense"] for e in entries}
    return [r for r in previous or [] if isinstance(r, dict) and r.get("defense") not in present]


def removed_note(board: Any) -> str | None:
    """The README's line on the rows taken off the board, grouped by reason (None when none was)."""
    if not board.removed:
        return None
    groups: dict[tuple[str, str], list[str]] = {}
    for r in board.removed:
        groups.setdefault((r.date, r.reason), []).append(
            f"`{r.defense}`" + (f" ({r.measured})" if r.measured else "")
        )
    parts = [f"{', '.join(rows)}, on {date}: {reason}" for (date, reason), rows in groups.items()]
    return "Removed from this board after it was built: " + "; ".join(parts) + "."
