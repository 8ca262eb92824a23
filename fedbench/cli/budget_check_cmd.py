"""`fedbench leaderboard budget-check`: re-run a board's optimisation attacks with more budget on a few
rows and record whether the primary rate moves (`fedbench.reporting.budget_check`)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Annotated

import typer

from fedbench.cli._common import (
    CacheDirOption,
    DataRootOption,
    NJobsOption,
    PluginOption,
    ThreadsOption,
    literal,
    out,
)
from fedbench.cli.board_ops_cmd import BoardArgument, StampOption, _board_grid, _load_v2, _run_specs
from fedbench.cli.leaderboard_cmd import DirOption, _command
from fedbench.cli.running import PresetDirOption
from fedbench.errors import FedbenchError


@_command("budget-check")
def budget_check_cmd(
    board: BoardArgument,
    factor: Annotated[
        int, typer.Option("--factor", min=2, help="Multiply every iteration budget by this.")
    ] = 2,
    entry: Annotated[
        list[str] | None,
        typer.Option(
            "--entry", help=literal("A row to check (repeatable) [default: none and the rank-1 rows].")
        ),
    ] = None,
    seeds: Annotated[
        int | None,
        typer.Option("--seeds", min=1, help=literal("Check on the board's first K seeds [default: all].")),
    ] = None,
    stamp: StampOption = True,
    root: DirOption = Path("leaderboards"),
    cache_dir: CacheDirOption = None,
    data_root: DataRootOption = None,
    threads: ThreadsOption = None,
    n_jobs: NJobsOption = 1,
    preset_dir: PresetDirOption = None,
    plugin: PluginOption = None,
) -> None:
    """Would more attack budget find more? Re-run the suite's optimisation attacks with --factor times
    their iterations on `none` and the best-ranked rows, on the cached trainings, and compare each row's
    primary rate (worst case per input, the doubled attacks in place of the originals, same seeds).

    A row passes when its rate moves by less than half its published 95 % interval. A row whose every
    input on those seeds is already at the metric's maximum (all re-identified) is at the ceiling: more
    budget cannot find more, so it is recorded as such and not re-run. The result goes
    into board.json and the board's README; exit 1 when a row moved more (raise the board's budgets).
    An attack on its stall or plateau schedule (iterations = none) gets both the schedule's cap and its
    patience multiplied (`budget_scale`); one on an auto schedule that declares no budget is listed,
    not doubled.

    Examples:

      fedbench leaderboard budget-check inversion-fedsgd-mnist5k-mlp --seeds 2 --n-jobs 2

      fedbench leaderboard budget-check my-board --dir boards --entry none --entry "mine\\[a=1]"
    """
    from fedbench.cli._common import cache_dir_option, data_root_option
    from fedbench.reporting import budget_check as bc
    from fedbench.reporting import leaderboard as lb
    from fedbench.reporting.board_build import build
    from fedbench.reporting.board_rank import rank_board
    from fedbench.spec.grid import Overrides, build_grid

    b, entries = _load_v2(root, board)
    ranking = rank_board(entries, b.primary, b.utility_budget)
    by_defense = {r.defense: r for r in ranking.rows}
    chosen = list(entry or [])
    for name in chosen:
        if name not in by_defense:
            raise FedbenchError(f"--entry {name!r}: not on board {board} (entries: {', '.join(by_defense)})")
    if not chosen:
        chosen = ["none", *(r.defense for r in ranking.ranked if r.rank == 1 and r.defense != "none")]
    path, extra = _board_grid(b, preset_dir, plugin)
    grid = build_grid(path, Overrides(), extra_dirs=extra)
    board_seeds = sorted({s.seed for s in grid.specs})[: seeds or None]
    specs = [s for s in grid.specs if s.seed in board_seeds]
    ceilings = {c.defense: c for d in chosen if (c := bc.at_ceiling(by_defense[d], b.primary, board_seeds))}
    doubled, labels = bc.doubled_specs(specs, set(chosen), factor)
    auto = sorted(  # on an auto schedule that declares no budget to scale: listed, not doubled
        {
            s.attack.label
            for s in specs
            if s.attack is not None
            and s.attack.params_dict.get("iterations", 0) is None
            and bc.doubled_attack(s.attack, factor) is None
        }
    )
    if not doubled:
        raise FedbenchError(f"board {board}'s suite has no attack with an iteration budget to multiply")
    rerun = [s for s in doubled if s.defense.label not in ceilings]
    new_by: dict[str, dict] = {}
    if rerun:
        results, records = _run_specs(
            grid, rerun, (data_root_option(data_root), threads, n_jobs), cache_dir_option(cache_dir)
        )
        failed = [r for r in records if r.status != "ok"]
        if failed:
            raise FedbenchError(
                f"{len(failed)} run(s) failed (first: {failed[0].get('reason')}); nothing recorded"
            )
        baseline = next((e for e in entries if e["defense"] == "none"), None)
        new_by = {e["defense"]: e for e in build(results, b.name, baseline=baseline)[1]}
    checks = [
        ceilings[d] if d in ceilings else bc.check_row(by_defense[d], new_by[d], labels, b.primary)
        for d in chosen
        if d in ceilings or d in new_by
    ]
    for c in checks:
        out.print(
            f"{c.defense}: {100 * c.rate:.1f} % at the ceiling (every input at the maximum): not re-run"
            if c.ceiling
            else f"{c.defense}: {100 * c.rate:.1f} % -> {100 * c.doubled:.1f} % "
            f"(half interval {50 * (c.high - c.low):.1f} points): {'converged' if c.passed else 'MOVED'}",
            highlight=False,
        )
    passed = all(c.passed for c in checks)
    if stamp:
        record = {
            "date": datetime.date.today().isoformat(),
            "factor": factor,
            "seeds": board_seeds,
            "attacks": sorted(set(labels.values())),
            "auto": auto,
            "rows": [
                {
                    "defense": c.defense,
                    "rate": c.rate,
                    "doubled": c.doubled,
                    "low": c.low,
                    "high": c.high,
                    "passed": c.passed,
                    **({"ceiling": True} if c.ceiling else {}),
                }
                for c in checks
            ],
            "result": "pass" if passed else "fail",
        }
        lb.write_board_file(root, b.model_copy(update={"budget_check": record}))
        lb.render(root, [board])
    if not passed:
        raise typer.Exit(1)
