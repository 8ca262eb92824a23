"""`fedbench export`: write a results file's trade-off table (csv, markdown, latex) or leaderboard entries."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from fedbench.cli._common import FORCE_BOARD_HELP, choice_option, err, force_param, handle_errors, literal
from fedbench.cli.compare import KeepOption, OutputOption, ResultsArgument, WhereOption, split_list

ExportTarget = Literal["csv", "markdown", "latex", "leaderboard"]  # renderers.render's formats + a board
SUFFIX = {"csv": ".table.csv", "markdown": ".md", "latex": ".tex"}


@handle_errors
def export_cmd(
    to: Annotated[
        ExportTarget,
        choice_option(ExportTarget, "--to", "export target", "csv, markdown, latex or leaderboard."),
    ],
    results: ResultsArgument = None,
    dest: Annotated[
        Path | None,
        typer.Option(
            "--dest",
            help=literal(
                "Output file for tables [default: next to the results file]; "
                "leaderboards folder for --to leaderboard [default: ./leaderboards]."
            ),
        ),
    ] = None,
    board: Annotated[
        str | None,
        typer.Option("--board", help=literal("Board name [default: the preset's board or name].")),
    ] = None,
    command: Annotated[
        str | None,
        typer.Option(
            "--command",
            help=literal(
                "Regenerating command recorded in the board, paths relative to this folder "
                "[default: the results' 'fedbench run' command, grid options only, then this export]."
            ),
        ),
    ] = None,
    force: Annotated[bool, force_param(FORCE_BOARD_HELP)] = False,
    metric: Annotated[
        list[str] | None, typer.Option("--metric", "-M", help="Leakage metric(s) for tables.")
    ] = None,
    where: WhereOption = None,
    keep: KeepOption = "last",
    output: OutputOption = Path("results"),
) -> None:
    """Export tables (csv, markdown, latex) or leaderboard entries from results files.

    --to leaderboard writes one JSON entry per defense configuration into leaderboards/<board>/ and
    renders its leaderboard.csv and README.md. The board records the command that regenerates it: the
    results' 'fedbench run' command (its grid options: preset, -d/-m/-D/-a, --set, --seeds, --preset-dir,
    --plugin) and this export. A board that holds entries another command wrote is replaced only with
    --force (without it: exit 2, naming the entries that would be lost, nothing written).

    Examples:

      fedbench export results/quickstart-20250101-120000.csv --to latex --dest table.tex

      fedbench export --to leaderboard --board my-board

      fedbench export --to leaderboard --board my-board --force   # replace what another run exported
    """
    from fedbench.reporting.renderers import render
    from fedbench.reporting.tables import load_results, pivot

    rs = load_results(results or [], keep=keep, default_dir=output)
    if to == "leaderboard":
        from fedbench.cli.board_write import check_overwrite
        from fedbench.reporting import leaderboard as lb

        root = dest or Path("leaderboards")
        b, entries = lb.build(rs, board, where or (), command)
        b = _recorded(b, rs, where or (), keep, given=command is not None)
        check_overwrite(
            root / b.name,
            b.command,
            {e["defense"] for e in entries},
            force,
            "export to another --board or --dest",
        )
        lb.write_board(root, b, entries)  # what leaderboard.export does, with the checks in between
        changed = lb.render(root, [b.name])
        folder = root / b.name
        err.print(
            f"board {b.name}: {len(entries)} entries in {folder / lb.ENTRIES_DIR}; "
            f"rendered {', '.join(str(p) for p in changed) or 'nothing new'}",
            highlight=False,
        )
        return
    text = render(pivot(rs, metrics=split_list(metric), where=where or ()), to)
    path = dest or rs.paths[-1].with_name(rs.paths[-1].stem + SUFFIX[to])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    err.print(f"wrote {path}", highlight=False)


def _recorded(board, rs, where, keep, given: bool):
    """The board with the command it records: --command as given, else the command that regenerates it
    from its results (`board_write.export_command`); else, for results no `fedbench run` wrote (the Python
    API's), the preset's [grid.board] command or a plain run of the preset, with a warning. A command
    naming an absolute path is refused: it would be wrong on every other machine."""
    from fedbench.cli.board_write import absolute_path, export_command
    from fedbench.errors import FedbenchError

    if not given:
        command, missing = export_command(rs.sidecars, board.name, where, keep)
        if command is not None:
            board = board.model_copy(update={"command": command})
        else:
            err.print(
                f"warning: {rs.paths[missing]} records no 'fedbench run' command; the board records "
                f"'{board.command}', which may not rebuild it (pass --command)",
                highlight=False,
            )
    if path := absolute_path(board.command):
        source = "--command" if given else "the command the board would record"
        raise FedbenchError(
            f"{source} '{board.command}' names the absolute path {path}, wrong on any other machine; "
            "pass --command with paths relative to this folder"
        )
    return board
