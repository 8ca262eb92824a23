"""A board's preset and runs, shared by the `fedbench leaderboard` commands that re-run part of a built
board (verify, add, describe, budget-check, audit, realistic): the preset as the board was built from it,
its expanded runs, and running a set of them into a results set. No command is registered here, so the
build command can use it too without an import circle."""

from __future__ import annotations

import tempfile
from pathlib import Path

from fedbench.cli._common import out
from fedbench.errors import FedbenchError


def _board_grid(board, preset_dir, plugin):
    """The board's preset expanded as it was built: the preset, --preset-dir folders and --plugin files
    of its recorded `fedbench leaderboard build` command (relative to the folder it ran in), plus any
    given here. Returns (preset path, extra folders)."""
    import shlex

    from fedbench.cli._common import load_plugins
    from fedbench.spec.boards import resolve_boards

    words = shlex.split(board.command)
    if words[:3] != ["fedbench", "leaderboard", "build"] or len(words) < 4:
        raise FedbenchError(
            f"board {board.name} was written by '{board.command}', not 'fedbench leaderboard build': "
            "rebuild it with 'fedbench leaderboard build' to verify or add to it"
        )
    dirs = [Path(w) for k, w in zip(words, words[1:], strict=False) if k == "--preset-dir"]
    plugins = [Path(w) for k, w in zip(words, words[1:], strict=False) if k == "--plugin"]
    load_plugins([*plugins, *(plugin or [])] or None)
    extra = tuple(dirs) + tuple(preset_dir or ())
    source = resolve_boards([words[3]], False, extra)[0]
    return source.path, extra


def _board_specs(board, grid, path, extra, entries=()) -> list:
    """The runs of a board's preset `grid`, with those of its `add -a` evaluations (the board's too)
    and the runs its attack cascade narrowed to fewer victims (as the `entries` record them)."""
    from fedbench.spec.grid import Overrides, build_grid

    every = list(grid.specs)
    if board.external_attacks:
        more = build_grid(path, Overrides(attacks=tuple(x.attack for x in board.external_attacks)), extra)
        every += more.specs
    return every + narrowed_specs(every, entries)


def narrowed_specs(specs, entries) -> list:
    """The specs of the entries' runs that a cascade narrowed: each is a run of `specs` (same defense,
    attack and seed) on the victims its entry lists for that run."""
    from fedbench.reporting.input_keys import victim_list

    known = {s.run_id for s in specs}
    base = {(s.defense.label, s.attack.label, str(s.seed)): s for s in specs if s.attack is not None}
    out = []
    for e in entries:
        for attack, seeds in (e.get("per_input") or {}).items():
            for seed, rec in seeds.items():
                spec = base.get((e["defense"], attack, seed))
                if spec is None:
                    continue
                for run, victims in zip(rec.get("runs", []), rec.get("victims", []), strict=False):
                    narrowed = spec.with_victims(victim_list(victims)) if run not in known else None
                    if narrowed is not None and narrowed.run_id == run:
                        out.append(narrowed)
                        known.add(run)
    return out


def _load_v2(root: Path, name: str):
    from fedbench.reporting import leaderboard as lb

    lb.check_board_name(root, name)
    board, entries = lb.load_board(root / name)
    if board.board_version < 2 or any(
        e.get("per_input") is None and e.get("per_seed") is None for e in entries
    ):
        raise FedbenchError(
            f"board {name} is a v1 board (its entries keep no per-input values); rebuild it with "
            f"'{board.command}' after adding primary and utility_budget to its preset's [grid.board]"
        )
    return board, entries


def _run_specs(grid, specs, ctx_args, cache_dir: Path | None, cascade: bool = False):
    """Run `specs` of the board's `grid` (into `cache_dir`, or a fresh empty cache) and load their
    results (whose sidecar keeps the grid's [grid.board], so they export as the board's entries).
    Progress goes to stderr as `fedbench run` shows it: a bar on a terminal, a line per run in a log.
    `cascade`: run them in the board's attack cascade (a new row, as the build runs rows); otherwise
    each run as given (a re-run of the runs a board recorded, a check at another budget)."""
    import dataclasses
    from collections import Counter

    from fedbench.cli.running import run_with_progress
    from fedbench.execution.cache import RunCache
    from fedbench.execution.runner import RunContext
    from fedbench.reporting.tables import load_results

    data_root, threads, n_jobs = ctx_args
    grid = dataclasses.replace(grid, specs=tuple(specs), cascade=grid.cascade if cascade else None)
    with tempfile.TemporaryDirectory(prefix="fedbench-verify-") as tmp:
        cache = RunCache(cache_dir or Path(tmp) / "cache")
        setup = RunContext(data_root=data_root, threads=threads)
        records, path = run_with_progress(grid, setup, cache, Path(tmp) / "out", Counter(), n_jobs=n_jobs)
        return load_results([path]), records


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
