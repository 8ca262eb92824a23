"""`fedbench run` and `fedbench validate`: expand a preset with overrides, run it, write results."""

from __future__ import annotations

import shlex
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from fedbench.cli._common import (
    CacheDirOption,
    DataRootOption,
    NJobsOption,
    PluginOption,
    ThreadsOption,
    cache_dir_option,
    choice_option,
    command_words,
    data_root_option,
    err,
    force_param,
    handle_errors,
    literal,
    load_plugins,
    out,
)
from fedbench.execution.placement import Backend

DEFAULT_PRESET = "quickstart"  # what `fedbench run` alone runs
PRESET_HELP = literal(
    f"Preset name (see 'fedbench list presets') or path to a .toml file [default: {DEFAULT_PRESET}]."
)
TIMEOUT_HELP = "Seconds per run; a run past it becomes a 'timeout' row (not cached)."
PresetDirOption = Annotated[
    list[Path] | None, typer.Option("--preset-dir", help="Extra folder of presets; repeatable.")
]


def _overrides(dataset, model, defense, attack, set_, seeds):
    from fedbench.spec.grid import Overrides

    return Overrides(
        datasets=tuple(dataset) if dataset else None,
        models=tuple(model) if model else None,
        defenses=tuple(defense) if defense else None,
        attacks=tuple(attack) if attack else None,
        sets=tuple(set_ or ()),
        seeds=seeds,
    )


@handle_errors
def run_cmd(
    ctx: typer.Context,
    preset: Annotated[str | None, typer.Argument(help=PRESET_HELP)] = None,
    dataset: Annotated[
        list[str] | None,
        typer.Option("-d", "--dataset", help=literal("Dataset pattern name[k=v]; repeatable.")),
    ] = None,
    model: Annotated[
        list[str] | None, typer.Option("-m", "--model", help="Model pattern; repeatable.")
    ] = None,
    defense: Annotated[
        list[str] | None,
        typer.Option(
            "-D", "--defense", help="Defense pattern, e.g. 'dp-gaussian[sigma=[0.01,0.1]]'; repeatable."
        ),
    ] = None,
    attack: Annotated[
        list[str] | None, typer.Option("-a", "--attack", help="Attack pattern ('none': utility only).")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override, e.g. scenario.batch_size=4; repeatable.")
    ] = None,
    seeds: Annotated[int | None, typer.Option("--seeds", help="Number of seeds (0..N-1).")] = None,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    data_root: DataRootOption = None,
    download: Annotated[
        bool, typer.Option("--download", help="Download full datasets into --data-root.")
    ] = False,
    output: Annotated[Path, typer.Option("-o", "--output", help="Results directory.")] = Path("results"),
    cache_dir: CacheDirOption = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the cache.")] = False,
    force: Annotated[bool, force_param("Recompute every run and overwrite its cache entry.")] = False,
    n_jobs: NJobsOption = 1,
    timeout: Annotated[float | None, typer.Option("--timeout", help=TIMEOUT_HELP)] = None,
    fail_fast: Annotated[
        bool, typer.Option("--fail-fast", help="Stop at the first failed or timed-out run.")
    ] = False,
    threads: ThreadsOption = None,
    backend: Annotated[
        Backend,
        choice_option(
            Backend,
            "--backend",
            "backend",
            literal("local (this machine) or ray (Ray tasks; needs fedbench[ray])."),
        ),
    ] = "local",
    address: Annotated[
        str | None,
        typer.Option(
            "--address", help=literal("Ray cluster HOST:PORT for --backend ray [default: a local cluster].")
        ),
    ] = None,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="GPU indices, one worker each, e.g. 0,1.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Expand and check the grid, run nothing.")
    ] = False,
    preset_dir: PresetDirOption = None,
    plugin: PluginOption = None,
) -> None:
    """Run a grid of (dataset, model, defense, attack, seed); print the ranked leaderboard.

    With no arguments it runs the quickstart preset on shipped data. Writes the results CSV (+ JSON
    sidecar), a markdown table and a trade-off plot to --output.

    Progress goes to stderr: a bar on a terminal; redirected to a file, one line per computed or
    failed run, and cached runs summed up every few seconds.

    Examples:

      fedbench run smoke

      fedbench run quickstart -D none -D "dp-gaussian[sigma=[0.001,0.01]]" --seeds 3

      fedbench run my_grid.toml --set scenario.rounds=20 --data-root ~/data

      fedbench run dlg-ig --gpus 0,1

      fedbench run smoke --backend ray --address head:6379 --cache-dir /shared/fedbench-cache

    Exit codes: 0 all runs ok or skipped, 1 some run failed or timed out (the results hold every
    finished run), 2 bad input (nothing run, nothing written), 130 interrupted by Ctrl-C or SIGTERM
    (finished runs are cached and written; the same command resumes).
    """
    from fedbench.execution.cache import RunCache
    from fedbench.execution.placement import parse_gpus
    from fedbench.execution.record import STOP_STATUSES
    from fedbench.execution.runner import GridInterrupted, RunContext, check_grid
    from fedbench.spec.grid import build_grid

    load_plugins(plugin)
    grid = build_grid(
        preset or DEFAULT_PRESET,
        _overrides(dataset, model, defense, attack, set_, seeds),
        tuple(preset_dir or ()),
    )
    if dry_run:
        _print_plan(grid)
        return
    # the sidecar's record of this command, from the options as parsed (sys.argv is another program's
    # when fedbench runs embedded, e.g. under CliRunner); export reads its grid options back
    command = shlex.join(["fedbench", "run", *command_words(ctx)])
    run_ctx = RunContext(
        device=device,
        data_root=data_root_option(data_root),
        download=download,
        threads=threads,
        timeout=timeout,
        backend=backend,
        address=address,
        gpus=parse_gpus(gpus),
    )
    setup = check_grid(list(grid.specs), run_ctx, n_jobs)  # every usage error here, before any output
    cache = RunCache(None if no_cache else cache_dir_option(cache_dir), force=force)
    err.print(
        f"{grid.name}: {len(grid.specs)} runs (device {setup.ctx.device})"
        + (f" — {grid.substitution}" if grid.substitution else ""),
        highlight=False,
    )
    print_left_out(grid)
    started = time.perf_counter()
    counts: Counter = Counter()
    try:
        with _sigterm_as_interrupt():
            records, path = run_with_progress(grid, setup, cache, output, counts, fail_fast, command)
    except GridInterrupted as exc:
        where = f"; results of the finished runs: {exc.path}" if exc.path else ""
        err.print(
            f"interrupted: {len(exc.records)} of {exc.total} runs finished (all cached){where}; "
            "run the same command again to compute the rest",
            highlight=False,
        )
        raise typer.Exit(130) from None
    elapsed = time.perf_counter() - started
    written = _print_summary(records, path, cache)
    status = ", ".join(f"{counts[s]} {s}" for s in ("done", "cached", "skipped", *STOP_STATUSES) if counts[s])
    err.print(f"{len(records)} runs in {elapsed:.1f} s ({status})", highlight=False)
    if len(records) < len(grid.specs):
        err.print(
            f"stopped at the first failure (--fail-fast): {len(grid.specs) - len(records)} runs not started"
        )
    err.print(f"results (CSV): {path}", highlight=False)
    for what, where in written.items():
        err.print(f"{what}: {where}", highlight=False)
    for record in records:
        if record.status in STOP_STATUSES:
            err.print(
                f"{record.status} {record.run_id} {record['defense']} {record['attack']}: {record['reason']}",
                highlight=False,
            )
    if any(counts[s] for s in STOP_STATUSES):
        raise typer.Exit(1)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops a grid like Ctrl-C: finished runs are written, exit 130."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_with_progress(grid, setup, cache, output, counts, fail_fast=False, command="", n_jobs=1):
    """Run the grid with its progress on stderr: a bar on a terminal, else plain lines (`LogLines`)."""
    from fedbench.api import execute_grid

    if not err.is_terminal:  # a log file: no bar (rich would draw it only at the end), a line per run
        from fedbench.cli.progress import LogLines

        lines = LogLines(err, grid.specs)

        def log_event(event):
            counts[event.status] += 1
            lines(event)

        try:
            return execute_grid(
                grid,
                setup,
                cache,
                output,
                n_jobs=n_jobs,
                on_event=log_event,
                command=command,
                fail_fast=fail_fast,
            )
        finally:
            lines.close()
    return _run_with_bar(grid, setup, cache, output, counts, command, fail_fast, n_jobs)


def _run_with_bar(grid, setup, cache, output, counts, command, fail_fast, n_jobs=1):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from fedbench.api import execute_grid

    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
    ]
    with Progress(*columns, console=err, transient=False) as progress:
        task = progress.add_task(grid.name, total=len(grid.specs), status="")
        stated: set[str] = set()

        def on_event(event):
            counts[event.status] += 1
            progress.update(
                task, completed=event.index, status=" ".join(f"{k}={v}" for k, v in sorted(counts.items()))
            )
            if event.status in ("failed", "timeout"):
                progress.console.print(
                    f"{event.status}: {event.spec.describe()}: {event.record.get('reason')}", highlight=False
                )
            for message in event.record.warnings:
                if message not in stated:  # e.g. "LPIPS unavailable", stated once by each worker process
                    stated.add(message)
                    progress.console.print(f"warning: {message}", highlight=False)

        return execute_grid(
            grid, setup, cache, output, n_jobs=n_jobs, on_event=on_event, command=command, fail_fast=fail_fast
        )


def _print_summary(records, path, cache=None) -> dict[str, str]:
    """Print the leaderboard of the run (or the trade-off table when it spans several scenarios);
    write its markdown and trade-off plot next to the results. Returns {what: where written}. The
    summary comes from the run cache when it holds one of the same results and code
    (`fedbench.reporting.run_summary`)."""
    if path is None or not any(r.status == "ok" for r in records):
        return {}
    from fedbench.reporting.renderers import to_rich
    from fedbench.reporting.results import atomic_write
    from fedbench.reporting.run_summary import run_summary

    summary = run_summary(path, cache)
    for message in cache.take_warnings() if cache is not None else ():  # a damaged stored summary
        err.print(f"warning: {message}", highlight=False)
    out.print(to_rich(summary["table"]))
    md = path.with_suffix(".md")
    atomic_write(md, summary["markdown"])
    written: dict[str, str] = {"markdown": str(md)}
    plot = summary["plot"]
    if "error" in plot:
        written["plot"] = f"not drawn ({plot['error']})"
        return written
    from fedbench.errors import FedbenchError
    from fedbench.reporting.plots import save_tradeoff

    png = path.with_name(path.stem + "-tradeoff.png")
    try:
        save_tradeoff(
            plot["points"], png, plot["utility_label"], plot["leakage_label"], plot["title"], plot["floor"]
        )
        written["plot"] = str(png)
    except FedbenchError as exc:
        written["plot"] = f"not drawn ({exc})"
    return written


def _print_plan(grid) -> None:
    from rich.table import Table

    table = Table(title=f"{grid.name}: {len(grid.specs)} runs (dry run)", title_justify="left")
    for col in ("run_id", "dataset", "model", "defense", "attack", "seed"):
        table.add_column(col)
    for spec in grid.specs:
        table.add_row(
            spec.run_id,
            spec.dataset.label,
            spec.model.label,
            spec.defense.label,
            spec.attack.label if spec.attack else "—",
            str(spec.seed),
        )
    out.print(table)
    print_left_out(grid)


def print_left_out(grid) -> None:
    """The attack x defense pairs the grid left out because the attack does not apply, and the attacks
    its `[grid.suite]` excludes, one line each on stderr (issue 28: a suite says what it skipped)."""
    for attack, defense, reason in grid.skipped:
        err.print(f"skipped {attack} x {defense}: {reason}", highlight=False)
    for attack, reason in grid.excluded:
        err.print(f"excluded {attack}: {reason}", highlight=False)


@handle_errors
def validate_cmd(
    preset: Annotated[str, typer.Argument(help=PRESET_HELP)],
    preset_dir: PresetDirOption = None,
    plugin: PluginOption = None,
) -> None:
    """Check a preset: names, parameters, ranges and structure, without running anything.

    Examples:

      fedbench validate quickstart

      fedbench validate path/to/grid.toml
    """
    from fedbench.spec.grid import build_grid

    load_plugins(plugin)
    grid = build_grid(preset, extra_dirs=tuple(preset_dir or ()))
    kinds = {
        "datasets": {s.dataset.label for s in grid.specs},
        "models": {s.model.label for s in grid.specs},
        "defenses": {s.defense.label for s in grid.specs},
        "attacks": {s.attack.label for s in grid.specs if s.attack},
    }
    detail = ", ".join(f"{len(v)} {k}" for k, v in kinds.items())
    out.print(
        f"{grid.source}: valid; {len(grid.specs)} runs ({detail}; seeds {list(grid.seeds)})", highlight=False
    )
