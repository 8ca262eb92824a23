"""`fedbench leaderboard realistic`: run an inversion board's realistic-protocol companion preset and put
each attack's realistic success rates beside its textbook ones on the board
(`fedbench.reporting.board_realistic`)."""

from __future__ import annotations

from pathlib import Path

from fedbench.cli._common import (
    CacheDirOption,
    DataRootOption,
    NJobsOption,
    PluginOption,
    ThreadsOption,
    out,
)
from fedbench.cli.board_ops_cmd import BoardArgument, _board_grid, _load_v2, _run_specs
from fedbench.cli.leaderboard_cmd import DirOption, _command
from fedbench.cli.running import PresetDirOption
from fedbench.errors import FedbenchError


def realistic_grid(board, preset_dir, plugin):
    """(preset name, expanded grid) of the companion preset a board's preset names in `[grid.board]
    realistic`; exit 2 (FedbenchError) when it names none."""
    from fedbench.spec.grid import Overrides, build_grid, find_preset

    path, extra = _board_grid(board, preset_dir, plugin)
    name = build_grid(path, Overrides(), extra_dirs=extra).board.get("realistic")
    if not name:
        raise FedbenchError(
            f"board {board.name}: its preset {path.name} names no realistic protocol; add "
            '[grid.board] realistic = "PRESET" (a FedAvg preset of -D none runs at several observe_round)'
        )
    return str(name), build_grid(find_preset(str(name), extra), Overrides(), extra_dirs=extra)


def realistic_for(board, entries, grid, name: str, results) -> dict:
    """The board's realistic record from the companion preset's results."""
    from fedbench.reporting.board_realistic import realistic_record

    none = next((e for e in entries if e["defense"] == "none"), None)
    command = f"fedbench leaderboard realistic {board.name}"
    return realistic_record(results, board.primary, none, name, command, grid.description)


@_command("realistic")
def realistic_cmd(
    board: BoardArgument,
    root: DirOption = Path("leaderboards"),
    cache_dir: CacheDirOption = None,
    data_root: DataRootOption = None,
    threads: ThreadsOption = None,
    n_jobs: NJobsOption = 1,
    preset_dir: PresetDirOption = None,
    plugin: PluginOption = None,
) -> None:
    """Does each attack still work in realistic FL? Run the board's realistic-protocol preset
    ([grid.board] realistic: FedAvg on non-IID clients with dozens of records, local epochs of B >= 8,
    no defense, the victim's update attacked untrained, early and converged) and write each attack's
    success rates there beside its textbook rate (the board's none row), with exact intervals, into
    board.json and the board's README ("Works in realistic FL?"). The runs are cached like a build's;
    `fedbench leaderboard build` runs it too for a board that declares one.

    Examples:

      fedbench leaderboard realistic inversion-fedsgd-mnist5k-mlp --n-jobs 2 --threads 1

      fedbench leaderboard realistic inversion-fedavg-mnist5k-mlp --cache-dir ~/.cache/fedbench
    """
    from fedbench.cli._common import cache_dir_option, data_root_option

    ctx_args = (data_root_option(data_root), threads, n_jobs)
    attach_realistic(root, board, ctx_args, cache_dir_option(cache_dir), preset_dir, plugin)


def attach_realistic(root: Path, board: str, ctx_args, cache_dir: Path | None, preset_dir=None, plugin=None):
    """Run the board's realistic preset (cached runs are read back) and write its record on the board:
    what `leaderboard realistic` does, and `leaderboard build` after a board that declares one."""
    from fedbench.execution.record import STOP_STATUSES
    from fedbench.reporting import leaderboard as lb

    b, entries = _load_v2(root, board)
    name, grid = realistic_grid(b, preset_dir, plugin)
    results, records = _run_specs(grid, grid.specs, ctx_args, cache_dir)
    if bad := [r for r in records if r.status in STOP_STATUSES]:
        raise FedbenchError(
            f"{len(bad)} of {len(records)} runs of {name} failed (first: {bad[0]['attack']}: "
            f"{bad[0].get('reason')}); board {board} left as it was"
        )
    record = realistic_for(b, entries, grid, name, results)
    lb.write_board_file(root, b.model_copy(update={"realistic": record}))
    lb.render(root, [board])
    verdicts = ", ".join(f"{a['label']} {a['works']}" for a in record["attacks"])
    out.print(f"{board}: works in realistic FL? {verdicts}", highlight=False)
