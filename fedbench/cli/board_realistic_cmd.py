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
)
from fedbench.cli.board_ops_cmd import BoardArgument
from fedbench.cli.board_runs import attach_realistic
from fedbench.cli.leaderboard_cmd import DirOption, _command
from fedbench.cli.running import PresetDirOption


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
    (\\[grid.board] realistic: FedAvg on non-IID clients with dozens of records, local epochs of B >= 8,
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
