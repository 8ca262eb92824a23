"""`fedbench leaderboard audit`: the one-run privacy audit (`fedbench.auditing`) of every DP row of a
board, its empirical epsilon lower bound stored in the row's entry and stated on the board."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from fedbench.cli._common import CacheDirOption, DataRootOption, PluginOption, ThreadsOption, out
from fedbench.cli.board_ops_cmd import BoardArgument, _board_grid, _load_v2
from fedbench.cli.leaderboard_cmd import DirOption, _command
from fedbench.cli.running import PresetDirOption
from fedbench.errors import FedbenchError


@_command("audit")
def board_audit_cmd(
    board: BoardArgument,
    canaries: Annotated[int, typer.Option("--canaries", min=10, help="Canaries per audit (m).")] = 1000,
    seed: Annotated[int, typer.Option("--seed", help="The board seed whose training is audited.")] = 0,
    entry: Annotated[
        list[str] | None, typer.Option("--entry", help="Audit this DP row only (repeatable).")
    ] = None,
    root: DirOption = Path("leaderboards"),
    cache_dir: CacheDirOption = None,
    data_root: DataRootOption = None,
    threads: ThreadsOption = None,
    preset_dir: PresetDirOption = None,
    plugin: PluginOption = None,
) -> None:
    """Audit every DP row of a board once (Steinke, Nasr & Jagielski 2023: one training run with
    `--canaries` canaries, each included by a fair coin) and store each row's empirical lower bound on
    epsilon at 95 % confidence, with the method, in its entry; the board's README states them.

    A DP row is one with a finite formal epsilon. A lower bound above the formal epsilon is a
    violation (a mis-implemented or mis-accounted mechanism): exit 1, the bound is still stored. A
    black-box one-run bound far below the formal epsilon is expected (docs/auditing.md).

    Examples:

      fedbench leaderboard audit inversion-fedsgd-mnist5k-mlp --canaries 1000

      fedbench leaderboard audit my-board --dir boards --entry "dp-sgd\\[epsilon=4]"
    """
    from fedbench.auditing.audit import AuditConfig, audit_spec
    from fedbench.cli._common import cache_dir_option, data_root_option
    from fedbench.execution.cache import RunCache
    from fedbench.execution.runner import RunContext
    from fedbench.reporting import leaderboard as lb
    from fedbench.spec.grid import Overrides, build_grid

    b, entries = _load_v2(root, board)
    dp = [e for e in entries if _formal(e) is not None]
    if entry:
        labels = {e["defense"] for e in dp}
        for name in entry:
            if name not in labels:
                rows = ", ".join(sorted(labels)) or "none"
                raise FedbenchError(f"--entry {name!r}: not a DP row of board {board} (DP rows: {rows})")
        dp = [e for e in dp if e["defense"] in set(entry)]
    if not dp:
        raise FedbenchError(f"board {board} has no DP row (a row with a finite formal epsilon) to audit")
    path, extra = _board_grid(b, preset_dir, plugin)
    specs = {}
    for e in dp:  # the row's own grid: rows that `add -D` put on the board are not in the preset's
        grid = build_grid(path, Overrides(defenses=(e["defense"],)), extra_dirs=extra)
        at_seed = [s for s in grid.specs if s.seed == seed]
        if not at_seed:
            raise FedbenchError(f"--seed {seed}: not a seed of board {board} (seeds: {sorted(e['seeds'])})")
        specs[e["defense"]] = at_seed[0]
    config = AuditConfig(canaries=canaries)
    cache = RunCache(cache_dir_option(cache_dir))
    ctx = RunContext(data_root=data_root_option(data_root), threads=threads)
    violations = []
    for e in dp:
        result = audit_spec(specs[e["defense"]], config, cache, ctx)
        e["metrics"]["one_run_audit"] = {
            "eps_lower": result.eps_lower,
            "confidence": result.confidence,
            "delta": result.delta,
            "formal_eps": result.formal_eps,
            "seed": seed,
            "method": result.method_line,
        }
        out.print(f"{e['defense']}: {result.method_line}", highlight=False)
        if result.violation:
            violations.append(e["defense"])
    for e in dp:  # every entry checked before any file is written
        lb.validate_entry(e, b, f"entry {e['defense']}")
    for e in dp:
        target = root / board / lb.ENTRIES_DIR / f"{lb.slug(e['defense'])}.json"
        target.write_text(lb.dump_json(e), encoding="utf-8")
    lb.render(root, [board])
    if violations:
        out.print(
            f"VIOLATION: lower bound above the formal epsilon: {', '.join(violations)}", highlight=False
        )
        raise typer.Exit(1)


def _formal(entry: dict) -> float | None:
    eps = entry["metrics"].get("epsilon")
    return eps if isinstance(eps, int | float) and math.isfinite(eps) else None
