"""`fedbench leaderboard remove`: take configurations off a built board, the reason on record
(`fedbench.reporting.board_remove`)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Annotated

import typer

from fedbench.cli._common import literal, out
from fedbench.cli.board_ops_cmd import BoardArgument, _load_v2
from fedbench.cli.leaderboard_cmd import DirOption, _command


@_command("remove")
def remove_cmd(
    board: BoardArgument,
    defense: Annotated[
        list[str],
        typer.Option("-D", "--defense", help=literal("A row to remove, by its label (repeatable).")),
    ],
    reason: Annotated[
        str, typer.Option("--reason", help="Why the rows leave the board (the README says it).")
    ],
    root: DirOption = Path("leaderboards"),
) -> None:
    """Take rows off a built board without rebuilding it: their entries are deleted, and board.json and
    the README record each one with the reason, the date and what it measured (primary rate, accuracy
    drop, epsilon). The other rows' numbers do not depend on them. Drop the rows from the board's preset
    too, or the next build brings them back.

    Examples:

      fedbench leaderboard remove my-board -D "fed-cdp\\[clip=4,sigma=1]" --reason "epsilon 26.9 > 8"
    """
    from fedbench.reporting import leaderboard as lb
    from fedbench.reporting.board_remove import removed_board

    b, entries = _load_v2(root, board)
    today = datetime.date.today().isoformat()
    new, kept = removed_board(b, entries, list(defense), reason, today)
    lb.write_board(root, new, kept)
    lb.render(root, [board])
    out.print(f"{board}: removed {', '.join(defense)}; {len(kept)} rows left", highlight=False)
