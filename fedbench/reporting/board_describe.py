"""A board's descriptive text, refreshed from its preset without re-running (`leaderboard describe`).

Why: a board's title, description, threat model, knowledge switches, tuning rule and substitution are
words about its runs, not results. When a later study adds to them (issue 30: a tuning rule that names
the sweep showing DP cannot stay within a board's utility budget), rebuilding the board only to rewrite
a sentence would re-run hours of attacks, or, after an engine change, recompute them all. What decides
numbers (the primary metric, the utility budget, the headline) is compared,
not copied: if the preset changed one of them, the board must be rebuilt, and the command says so.
"""

from __future__ import annotations

from typing import Any

from fedbench.errors import FedbenchError
from fedbench.reporting.board_build import board_words
from fedbench.reporting.board_schema import Board

#: keys whose change moves numbers or ranks: compared with board.json, never copied
RESULT_KEYS = ("primary", "utility_budget", "headline")


def described(board: Board, grid: Any) -> tuple[Board, list[str]]:
    """`board` with its descriptive fields as `grid` (its preset, expanded) states them (`board_words`,
    what a build writes), and the names of the fields that changed. Raises FedbenchError when the preset
    changed what decides the numbers."""
    spec = grid.board
    for key in RESULT_KEYS:
        if key not in spec:
            continue
        ours, theirs = getattr(board, key), spec[key]
        if key == "utility_budget" and ours is not None:
            ours, theirs = float(ours), float(theirs)
        if ours != theirs:
            raise FedbenchError(
                f"the preset's [grid.board] {key} = {theirs!r} is not the board's {ours!r}: that changes "
                f"the numbers; rebuild the board with '{board.command}'"
            )
    meta = {"description": grid.description, "substitution": grid.substitution}
    update = board_words(spec, meta, board.name, board.board_version >= 2)
    changed = [k for k, v in update.items() if getattr(board, k) != v]
    return board.model_copy(update=update), changed
