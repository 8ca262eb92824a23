"""Boards from Python: `fedbench.leaderboard.load(name)` returns a board as a pandas DataFrame, one row
per defense configuration in rank order, the columns of its leaderboard.csv (as RobustBench's
`get_leaderboard` does).

    >>> from fedbench import leaderboard
    >>> board = leaderboard.load("inversion-fedsgd-mnist5k-mlp")
    >>> board[["rank", "defense"]].head()

The table is computed from the board's JSON entries as `fedbench leaderboard render` computes it, so it
is what the committed README shows.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from fedbench.errors import FedbenchError

ROOT_ENV = "FEDBENCH_LEADERBOARDS"


def default_root() -> Path:
    """Where boards are read from: $FEDBENCH_LEADERBOARDS, ./leaderboards, else the source tree's."""
    if os.environ.get(ROOT_ENV):
        return Path(os.environ[ROOT_ENV])
    here = Path("leaderboards")
    if here.is_dir():
        return here
    return Path(__file__).resolve().parents[1] / "leaderboards"


def names(root: str | Path | None = None) -> list[str]:
    """The boards under `root` (default: `default_root()`)."""
    from fedbench.reporting.leaderboard import board_names

    return board_names(root or default_root())


def load(name: str, root: str | Path | None = None) -> Any:
    """Board `name` as a DataFrame in rank order (unknown names fail naming the boards there)."""
    import pandas as pd

    from fedbench.reporting import leaderboard as lb

    folder = Path(root or default_root())
    if not (folder / name / lb.BOARD_FILE).is_file():
        known = lb.board_names(folder) if folder.is_dir() else []
        raise FedbenchError(f"no board {name!r} under {folder} (boards: {', '.join(known) or 'none'})")
    board, entries = lb.load_board(folder / name)
    return pd.read_csv(io.StringIO(lb.render_csv(board, entries)))
