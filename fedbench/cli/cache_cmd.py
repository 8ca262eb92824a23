"""`fedbench cache info|clear`."""

from __future__ import annotations

from pathlib import Path

import typer

from fedbench.cli._common import cache_dir_option, err, handle_errors, out

cache_app = typer.Typer(help="Inspect or clear the run cache.", no_args_is_help=True)

CACHE_HELP = "Cache directory (default: FEDBENCH_CACHE_DIR, else the user cache directory)."


@cache_app.command("info")
@handle_errors
def info(cache_dir: Path = typer.Option(None, "--cache-dir", help=CACHE_HELP)) -> None:
    """Where the cache is and what it holds.

    Examples:

      fedbench cache info

      fedbench cache info --cache-dir /tmp/fb-cache
    """
    from fedbench.cache import RunCache

    location = cache_dir_option(cache_dir)
    if not location.exists():
        out.print(f"cache: {location} (empty)")
        return
    info = RunCache(location).info()
    out.print(
        f"cache: {info.location}\nutility runs: {info.utility_entries}\n"
        f"attack runs: {info.attack_entries}\nsize: {info.size_bytes / 1e6:.1f} MB",
        highlight=False,
    )


@cache_app.command("clear")
@handle_errors
def clear(
    cache_dir: Path = typer.Option(None, "--cache-dir", help=CACHE_HELP),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete every cached run.

    Examples:

      fedbench cache clear --yes
    """
    from fedbench.cache import RunCache

    location = cache_dir_option(cache_dir)
    if not location.exists():
        out.print(f"cache: {location} (already empty)")
        return
    if not yes and not typer.confirm(f"delete all cached runs in {location}?"):
        err.print("nothing deleted")
        raise typer.Exit(1)
    RunCache(location).clear()
    out.print(f"cleared {location}")
