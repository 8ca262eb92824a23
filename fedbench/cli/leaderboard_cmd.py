"""`fedbench leaderboard build|render|check|show|site|thumbnails`: the boards under ./leaderboards.

`build` runs the presets that declare a `[grid.board]` (as `fedbench run PRESET` does, through
`fedbench.api.execute_grid`, so the same runs, run ids and cache entries) and exports each board from
its results (`leaderboard.export`, as `fedbench export --to leaderboard` does); `thumbnails`
(`thumbnails_cmd`) draws a board's reconstructions from its runs in the cache; the other commands read
the committed JSON entries only.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from fedbench.cli._common import (
    FORCE_BOARD_HELP,
    CacheDirOption,
    DataRootOption,
    NJobsOption,
    PluginOption,
    ThreadsOption,
    err,
    force_param,
    handle_errors,
    literal,
    out,
)
from fedbench.cli.compare import FormatOption
from fedbench.cli.running import PresetDirOption, _sigterm_as_interrupt
from fedbench.cli.thumbnails_cmd import thumbnails_cmd
from fedbench.errors import FedbenchError
from fedbench.spec.boards import BoardSource, rebuild_command, resolve_boards

leaderboard_app = typer.Typer(
    help="Build, render, check and show the leaderboards (JSON entries -> leaderboard.csv, README.md);\n"
    "write them as a static website.\n\n"
    "Examples:\n\n  fedbench leaderboard build --all\n\n  fedbench leaderboard render\n\n"
    "  fedbench leaderboard check\n\n  fedbench leaderboard show inversion-fedsgd-mnist5k-mlp\n\n"
    "  fedbench leaderboard site -o site\n\n"
    "  fedbench leaderboard thumbnails malicious-server-mnist5k-fcnn",
    no_args_is_help=True,
)
BoardsArgument = Annotated[
    list[str] | None, typer.Argument(help=literal("Board name(s) [default: all]."), show_default=False)
]
DirOption = Annotated[Path, typer.Option("--dir", help="Folder holding the boards.")]


def _command(name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register a function as `fedbench leaderboard NAME`, its usage errors one line (`handle_errors`)."""

    def register(func: Callable[..., None]) -> Callable[..., None]:
        return leaderboard_app.command(name)(handle_errors(func))

    return register


@_command("render")
def render_cmd(board: BoardsArgument = None, root: DirOption = Path("leaderboards")) -> None:
    """Regenerate leaderboard.csv and README.md of the boards (and the index) from their entries.

    Examples:

      fedbench leaderboard render

      fedbench leaderboard render inversion-fedsgd-mnist5k-mlp --dir leaderboards
    """
    from fedbench.reporting.leaderboard import render

    changed = render(root, board or None)
    for path in changed:
        err.print(f"wrote {path}", highlight=False)
    if not changed:
        err.print("all rendered files are up to date", highlight=False)


@_command("check")
def check_cmd(board: BoardsArgument = None, root: DirOption = Path("leaderboards")) -> None:
    """Validate the entries and fail (exit 1) when a rendered file is stale, or when a board's slice
    (`build --slice`) ranks a row otherwise than its full board, beyond their intervals.

    Examples:

      fedbench leaderboard check

      fedbench leaderboard check inversion-fedsgd-mnist5k-mlp --dir leaderboards
    """
    from fedbench.reporting.board_slice import check_slices
    from fedbench.reporting.leaderboard import stale

    if bad := stale(root, board or None):
        err.print(
            f"stale: {', '.join(str(p) for p in bad)}; run 'fedbench leaderboard render'",
            highlight=False,
        )
        raise typer.Exit(1)
    if disagree := check_slices(root, board or None):
        for line in disagree:
            err.print(f"slice disagrees: {line}", highlight=False)
        raise typer.Exit(1)
    err.print(f"{root}: entries valid, rendered files up to date", highlight=False)


@_command("show")
def show_cmd(
    board: Annotated[str, typer.Argument(help="Board name.")],
    root: DirOption = Path("leaderboards"),
    fmt: FormatOption = "rich",
) -> None:
    """Print a board, ranked by Pareto rank.

    Examples:

      fedbench leaderboard show inversion-fedsgd-mnist5k-mlp

      fedbench leaderboard show inversion-fedsgd-mnist5k-mlp --format markdown
    """
    from fedbench.cli.compare import emit
    from fedbench.reporting.leaderboard import board_pivot, check_board_name, load_board
    from fedbench.reporting.renderers import render

    check_board_name(root, board)
    b, entries = load_board(root / board)
    emit(render(board_pivot(b, entries), fmt), fmt)
    if fmt == "rich":
        out.print(f"command: {b.command}", highlight=False)


@_command("site")
def site_cmd(
    out_dir: Annotated[
        Path,
        typer.Option("--out", "-o", help=literal("Folder to write the site into (new, empty, or a site).")),
    ],
    board: BoardsArgument = None,
    root: DirOption = Path("leaderboards"),
) -> None:
    """Write the boards as a static website: an index and a page per board (sortable table, scenario,
    threat model, trade-off plot, rebuild command). Plain HTML/CSS/JS from the committed entries;
    nothing is loaded from the network when viewed.

    Examples:

      fedbench leaderboard site -o site

      fedbench leaderboard site inversion-fedsgd-mnist5k-mlp -o /tmp/site --dir leaderboards
    """
    from fedbench.reporting.site import PAGE, build_site

    names = build_site(root, out_dir, board or None)
    err.print(f"wrote {out_dir / PAGE} ({len(names)} board{'' if len(names) == 1 else 's'})", highlight=False)


_command("thumbnails")(thumbnails_cmd)


# ------------------------------------------------------------------------------------------- build


@dataclass
class BoardBuild:
    """One board's build: its runs by status, seconds, and what went wrong (empty when it was written)."""

    board: str
    runs: int
    counts: Counter
    seconds: float
    failure: str = ""
    folder: Path | None = None

    def line(self) -> str:
        from fedbench.execution.record import STOP_STATUSES

        states = ("done", "cached", "skipped", *STOP_STATUSES)
        status = ", ".join(f"{self.counts[s]} {s}" for s in states if self.counts[s])
        runs = f"{self.runs} run{'' if self.runs == 1 else 's'}"
        head = f"{self.board}: {runs} ({status or 'none finished'}) in {self.seconds:.1f} s"
        return f"{head}; FAILED: {self.failure}" if self.failure else f"{head} -> {self.folder}"


def build_board(source: BoardSource, grid, setup, cache, root: Path, command: str) -> BoardBuild:
    """Run a board's grid (`fedbench.api.execute_grid`) into a temporary results file and export the
    board from it (`leaderboard.export`). A failed or timed-out run leaves the committed board as it
    was: a board with a configuration short of seeds would rank it on fewer numbers than the others."""
    from fedbench.api import execute_grid
    from fedbench.cli.progress import LogLines
    from fedbench.execution.placement import AUTO_JOBS
    from fedbench.execution.record import STOP_STATUSES
    from fedbench.reporting import leaderboard as lb
    from fedbench.reporting.build_wall import Invocation, fingerprint, ledger_path, record
    from fedbench.reporting.tables import load_results

    counts: Counter = Counter()
    stated: set[str] = set()
    # a log file (stderr not a terminal): a line per computed or failed run, cached runs summed up
    lines = None if err.is_terminal else LogLines(err, grid.specs, prefix=f"{source.board}: ")

    def on_event(event) -> None:
        counts[event.status] += 1
        if lines is not None:
            lines(event)  # states the warnings too
            return
        for message in event.record.warnings:
            if message not in stated:  # stated once, not once per run
                stated.add(message)
                err.print(f"warning: {source.board}: {message}", highlight=False)

    started = time.perf_counter()
    ledger = ledger_path(cache.location, source.board)
    grid_id = fingerprint([spec.run_id for spec in grid.specs])

    def wall(finished: bool) -> dict | None:  # this invocation into the build's wall-time ledger
        call = Invocation(
            seconds=time.perf_counter() - started,
            computed=counts["done"],
            # a skipped run (the cascade left it nothing) is decided afresh: neither computed nor cached
            runs=len(grid.specs) - counts["skipped"],
            n_jobs="auto" if setup.n_jobs == AUTO_JOBS else str(setup.n_jobs),
            threads=str(setup.ctx.threads or "all"),
            finished=finished,
        )
        return record(ledger, grid_id, call)

    with tempfile.TemporaryDirectory(prefix="fedbench-board-") as tmp:
        try:
            records, path = execute_grid(grid, setup, cache, tmp, on_event=on_event, command=command)
        except BaseException:
            wall(finished=False)  # an interrupted build: its seconds count when it resumes
            raise
        finally:
            if lines is not None:
                lines.close()
        result = BoardBuild(source.board, len(records), counts, 0.0)
        bad = [r for r in records if r.status in STOP_STATUSES]
        if bad:
            wall(finished=False)
            result.failure = (
                f"{len(bad)} of {len(records)} runs failed or timed out (first: {bad[0].run_id} "
                f"{bad[0]['defense']} {bad[0]['attack']}: {bad[0].get('reason')}); board not written"
            )
        else:
            try:
                board, _entries, _changed = lb.export(
                    load_results([path]), root, command=command, wall=wall(finished=True)
                )
                result.folder = root / board.name
            except FedbenchError as exc:
                result.failure = f"{exc}; board not written"
    result.seconds = time.perf_counter() - started
    return result


def sliced_grid(source: BoardSource, grid, extra: tuple) -> tuple[BoardSource, Any]:
    """The board's slice (`fedbench.reporting.board_slice`): its grid on the slice's seeds and victims,
    and the board it is exported as (NAME-slice, naming NAME as what it stands for)."""
    import dataclasses

    from fedbench.reporting.board_slice import slice_name, slice_overrides
    from fedbench.spec.grid import Overrides, build_grid

    spec = grid.board.get("slice")
    if not spec:
        raise FedbenchError(
            f"--slice: preset {source.preset} declares no [grid.board.slice] (seeds, victims); add one "
            "or build the full board"
        )
    part = build_grid(source.path, Overrides(sets=slice_overrides(spec)), extra_dirs=extra)
    name = slice_name(source.board)
    title = str(grid.board.get("title") or source.board)
    board = {**part.board, "name": name, "slice_of": source.board, "title": f"{title} (slice)"}
    return dataclasses.replace(source, board=name), dataclasses.replace(part, board=board)


@_command("build")
def build_cmd(
    board: Annotated[
        list[str] | None,
        typer.Argument(
            help=literal("Preset(s) with a [grid.board], by preset or board name, or a preset file."),
            show_default=False,
        ),
    ] = None,
    every: Annotated[
        bool, typer.Option("--all", help=literal("Every preset that declares a [grid.board]."))
    ] = False,
    n_jobs: NJobsOption = 1,
    threads: ThreadsOption = None,
    cache_dir: CacheDirOption = None,
    data_root: DataRootOption = None,
    root: DirOption = Path("leaderboards"),
    preset_dir: PresetDirOption = None,
    plugin: PluginOption = None,
    force: Annotated[bool, force_param(FORCE_BOARD_HELP)] = False,
    sliced: Annotated[
        bool,
        typer.Option(
            "--slice",
            help=literal(
                "Build the board's declared slice ([grid.board.slice]: every row and the whole suite on "
                "fewer seeds and inputs) as the board NAME-slice."
            ),
        ),
    ] = False,
) -> None:
    """Run each board's preset and export the board from its results (JSON entries, CSV, README).

    The same runs as 'fedbench run PRESET' (served from the cache when they ran before), then what
    'fedbench export --to leaderboard' does. One line per board: its runs and seconds (with stderr
    redirected to a file, also a line per computed or failed run, cached runs summed up every few
    seconds). A board whose preset names a realistic protocol (\\[grid.board] realistic) gets it too, as
    'fedbench leaderboard realistic' runs it. A failed run leaves that board as it was; the others are
    built, and the command exits 1
    naming it. A board records the command that rebuilt it (the preset, and --preset-dir and --plugin for
    a preset of yours); a board that another command wrote (another preset, or 'fedbench export') is
    replaced only with --force: without it, exit 2 before any run, naming the entries it would lose.

    Examples:

      fedbench leaderboard build --all --n-jobs 2 --threads 1

      fedbench leaderboard build my-board --preset-dir my_presets --dir /tmp/boards

      fedbench leaderboard build my-board --preset-dir my_presets --force   # replace another's board

      fedbench leaderboard build board-fedsgd --slice --n-jobs auto   # its 30-minute slice
    """
    from fedbench.cli._common import cache_dir_option, data_root_option, load_plugins
    from fedbench.cli.board_write import check_overwrite, grid_plugins
    from fedbench.cli.running import print_left_out
    from fedbench.execution.cache import RunCache
    from fedbench.execution.runner import GridInterrupted, RunContext, check_grid
    from fedbench.spec.grid import build_grid

    load_plugins(plugin)
    extra = tuple(preset_dir or ())
    sources = resolve_boards(list(board or []), every, extra)
    ctx = RunContext(data_root=data_root_option(data_root), threads=threads)
    planned = []
    for source in sources:  # every usage error (a preset, a dataset without --data-root) before any run
        grid = build_grid(source.path, extra_dirs=extra)
        if sliced:
            source, grid = sliced_grid(source, grid, extra)
        command = rebuild_command(source, extra, grid_plugins(grid, plugin or ()))
        command += " --slice" if sliced else ""
        defenses = {spec.defense.label for spec in grid.specs}
        check_overwrite(root / source.board, command, defenses, force, "build into another --dir")
        planned.append((source, grid, check_grid(list(grid.specs), ctx, n_jobs), command))
    cache = RunCache(cache_dir_option(cache_dir))
    failed = []
    for source, grid, setup, command in planned:
        print_left_out(grid)
        try:
            with _sigterm_as_interrupt():
                result = build_board(source, grid, setup, cache, root, command)
        except GridInterrupted:
            err.print(
                f"interrupted while building {source.board}: finished runs are cached; "
                "the same command resumes",
                highlight=False,
            )
            raise typer.Exit(130) from None
        err.print(result.line(), highlight=False)
        if result.failure:
            failed.append(source.board)
        elif grid.board.get("realistic") and not sliced:  # the realistic protocol beside it (issue 30)
            from fedbench.cli.board_runs import attach_realistic

            ctx_args = (ctx.data_root, threads, n_jobs)
            attach_realistic(root, source.board, ctx_args, cache.location, preset_dir, plugin)
    if failed:
        err.print(f"not built: {', '.join(failed)}", highlight=False)
        raise typer.Exit(1)


@_command("epsilon")
def epsilon_cmd(
    board: BoardsArgument = None,
    root: DirOption = Path("leaderboards"),
    check: Annotated[
        bool,
        typer.Option(
            "--check", help="Write nothing; exit 1 when an entry's epsilon is not today's accountant's."
        ),
    ] = False,
) -> None:
    """Recompute the entries' epsilon with today's accountants, without re-running anything.

    Epsilon depends on the defense's parameters, the scenario and the model's shape only, so a fixed
    accountant reaches a committed board from its entries (`fedbench.reporting.board_epsilon`). Changed
    entries are rewritten and their board re-rendered; one line per change. A defense that calibrates
    its noise to a target epsilon (dp-sgd, dp-fedavg) is left as it is: its runs hold that noise, so
    only a rebuild can change it.

    Examples:

      fedbench leaderboard epsilon

      fedbench leaderboard epsilon membership-mnist5k-mlp --check
    """
    from fedbench.reporting.board_epsilon import NotRefreshable, refresh_epsilon

    def refresh(name: str, b, entries: list) -> tuple[list, int]:
        fresh, moved = [], 0
        for entry in entries:
            try:
                new = refresh_epsilon(entry)
            except NotRefreshable as exc:
                err.print(f"{name}: {entry['defense']}: kept ({exc})", highlight=False)
                new = entry
            if new != entry:
                moved += 1
                old_eps, new_eps = entry["metrics"].get("epsilon"), new["metrics"].get("epsilon")
                err.print(f"{name}: {entry['defense']}: epsilon {old_eps} -> {new_eps}", highlight=False)
            fresh.append(new)
        return fresh, moved

    _rewrite_entries(
        board,
        root,
        check,
        refresh,
        stale=lambda moved: (
            f"{sum(moved.values())} entries hold another epsilon; run 'fedbench leaderboard epsilon'"
        ),
        current="every entry's epsilon is today's accountant's",
    )


@_command("restat")
def restat_cmd(
    board: BoardsArgument = None,
    root: DirOption = Path("leaderboards"),
    check: Annotated[
        bool,
        typer.Option("--check", help="Write nothing; exit 1 when an entry's statistics would change."),
    ] = False,
) -> None:
    """Recompute the entries' intervals and rank stability from what they keep, without re-running.

    Entries of schema 2 keep their per-seed values: intervals (Clopper-Pearson for a rate, the t
    interval clipped to the metric's range otherwise) and the joint rank-stability bootstrap are
    recomputed from them (`board_stats.restat_board`). Entries of schema 1 keep means and spreads
    only: their rates get the exact binomial interval of the counts the board's scenario fixes, the
    rest their t interval clipped to the range (`board_legacy`); their rank stability needs a rebuild.

    Examples:

      fedbench leaderboard restat

      fedbench leaderboard restat inversion-fedsgd-mnist5k-mlp --check
    """
    from fedbench.reporting import board_legacy, board_stats

    def refresh(name: str, b, entries: list) -> tuple[list, int]:
        if all(board_stats.has_per_seed(e) for e in entries):
            fresh = board_stats.restat_board(b, entries)
        else:
            fresh = [e if board_stats.has_per_seed(e) else board_legacy.bound_entry(e) for e in entries]
        moved = sum(not board_stats.same_statistics(e, f) for e, f in zip(entries, fresh, strict=True))
        if moved:
            err.print(f"{name}: {moved} of {len(entries)} entries restated", highlight=False)
        return fresh, moved

    _rewrite_entries(
        board,
        root,
        check,
        refresh,
        stale=lambda moved: f"stale statistics in {', '.join(moved)}; run 'fedbench leaderboard restat'",
        current="every entry's statistics are current",
    )


def _rewrite_entries(
    boards: list[str] | None,
    root: Path,
    check: bool,
    refresh: Callable[[str, Any, list], tuple[list, int]],
    stale: Callable[[dict[str, int]], str],
    current: str,
) -> None:
    """What `epsilon` and `restat` share: every named board (default all; unknown names fail first) is
    loaded, `refresh(name, board, entries)` returns its new entries and how many moved, and a board
    with any moved is rewritten and re-rendered, or, with `check`, nothing is written and the command
    exits 1 with `stale({board: moved})`; `current` is said when nothing moved."""
    from fedbench.reporting.leaderboard import board_names, check_board_name, load_board, render, write_board

    names = boards or board_names(root)
    for name in names:
        check_board_name(root, name)
    moved: dict[str, int] = {}
    for name in names:
        b, entries = load_board(root / name)
        fresh, count = refresh(name, b, entries)
        if count:
            moved[name] = count
            if not check:
                write_board(root, b, fresh)
                render(root, [name])
    if check and moved:
        err.print(stale(moved), highlight=False)
        raise typer.Exit(1)
    if not moved:
        err.print(current, highlight=False)
