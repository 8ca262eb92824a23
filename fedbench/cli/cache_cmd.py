"""`fedbench cache info|clear|prune`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fedbench.cli._common import PluginOption, cache_dir_option, err, handle_errors, load_plugins, out
from fedbench.errors import FedbenchError

if TYPE_CHECKING:
    from fedbench.execution.cache import PruneReport

cache_app = typer.Typer(help="Inspect, prune or clear the run cache.", no_args_is_help=True)

CACHE_HELP = "Cache directory (default: FEDBENCH_CACHE_DIR, else the user cache directory)."
CacheDirOption = Annotated[Path | None, typer.Option("--cache-dir", help=CACHE_HELP)]


@cache_app.command("info")
@handle_errors
def info(cache_dir: CacheDirOption = None) -> None:
    """Where the cache is and what it holds.

    Examples:

      fedbench cache info

      fedbench cache info --cache-dir /tmp/fb-cache
    """
    from fedbench.execution.cache import cache_info

    location = cache_dir_option(cache_dir)
    info = cache_info(location)  # reads only: no marker written, no permission changed
    if not location.exists():
        out.print(f"cache: {location} (empty)", highlight=False)
        return
    out.print(
        f"cache: {info.location}\nutility runs: {info.utility_entries}\n"
        f"attack runs: {info.attack_entries}\nsize: {info.size_bytes / 1e6:.1f} MB",
        highlight=False,
    )


@cache_app.command("clear")
@handle_errors
def clear(
    cache_dir: CacheDirOption = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete every cached run (only what fedbench wrote; a folder that is not a fedbench cache is refused).

    The folder must hold fedbench's CACHEDIR.TAG marker (written when fedbench creates or adopts a cache
    folder) or exactly an older fedbench cache's layout; any other folder is refused with nothing deleted.
    Inside a cache, files fedbench did not write are kept and listed.

    Examples:

      fedbench cache clear --yes

      fedbench cache clear --yes --cache-dir /tmp/fb-cache
    """
    from fedbench.execution.cache import clear_cache
    from fedbench.execution.paths import is_cache_dir, not_a_cache

    location = cache_dir_option(cache_dir)
    if not location.exists() or (location.is_dir() and not any(location.iterdir())):
        out.print(f"cache: {location} (already empty)", highlight=False)
        return
    if not is_cache_dir(location):
        raise not_a_cache(location)  # refused before asking: nothing would be deleted
    if not yes and not typer.confirm(f"delete all cached runs in {location}?"):
        err.print("nothing deleted")
        raise typer.Exit(1)
    kept = clear_cache(location)
    out.print(f"cleared {location}", highlight=False)
    if kept:
        shown = ", ".join(kept[:5]) + (f" and {len(kept) - 5} more" if len(kept) > 5 else "")
        err.print(f"kept {len(kept)} file(s) fedbench did not write: {shown}", highlight=False)


@cache_app.command("prune")
@handle_errors
def prune(
    stale: Annotated[
        bool,
        typer.Option("--stale", help="Delete the runs computed by code that has changed since (required)."),
    ] = False,
    cache_dir: CacheDirOption = None,
    plugin: PluginOption = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete the cached runs whose code changed, and say how many and how much space that freed.

    A cached run stores digests of the code that computed it (its plugins, the FL engine); a run whose
    digests differ from the code installed now is never served again (a run recomputes it, with a
    warning), but stays on disk until then. --stale deletes those and nothing else: runs from before
    digests were stored are kept (they are served), as are runs of plugins this command has not loaded
    (pass their --plugin files) and runs another process is computing or rewriting (its lock is held).
    The counts are shown before anything is deleted. Another checkout of fedbench sharing this cache
    may still use what this one calls stale.

    Examples:

      fedbench cache prune --stale

      fedbench cache prune --stale --yes --cache-dir /tmp/fb-cache
    """
    from fedbench.execution.cache import prune_stale
    from fedbench.execution.paths import is_cache_dir, not_a_cache

    if not stale:
        raise FedbenchError("say what to prune: --stale (the runs computed by code that has changed since)")
    location = cache_dir_option(cache_dir)
    if not location.exists():
        raise FedbenchError(f"no cache at {location}; pass an existing cache with --cache-dir")
    if any(location.iterdir()) and not is_cache_dir(location):
        raise not_a_cache(location)  # refused before anything is read: nothing would be deleted
    load_plugins(plugin)
    found = prune_stale(location, remove=False)
    left = _left(found)
    if not found.stale:
        out.print(f"cache: {location}: no stale runs (nothing deleted){left}", highlight=False)
        return
    what = f"{_runs(found.stale)} ({_mb(found.stale_bytes)}) computed by code that changed"
    if not yes and not typer.confirm(f"delete {what}, in {location}?"):
        err.print("nothing deleted")
        raise typer.Exit(1)
    done = prune_stale(location)
    out.print(
        f"cache: {location}: deleted {_runs(done.stale)} computed by code that changed, "
        f"freed {_mb(done.stale_bytes)}{_left(done)}",
        highlight=False,
    )


def _runs(n: int) -> str:
    return f"{n} stale run{'s' if n != 1 else ''}"


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"


def _left(report: PruneReport) -> str:
    """'; kept 3 (...)': what a prune left, by reason; empty when it checked nothing else."""
    kept = [
        (report.fresh, "served by this code"),
        (report.busy, "in use by another process"),
        (report.unchecked, "not checked: plugin not loaded (--plugin) or unreadable"),
    ]
    parts = [f"{n} {why}" for n, why in kept if n]
    return f"; kept {', '.join(parts)}" if parts else ""
