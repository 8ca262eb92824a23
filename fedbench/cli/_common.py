"""Shared CLI plumbing: consoles, one-line usage errors, fixed-choice parameters, common options."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Annotated, Any, NoReturn, get_args

import typer
from rich.console import Console
from rich.markup import escape

from fedbench.errors import FedbenchError, UnknownNameError, did_you_mean

# Markup is off: labels like dp-gaussian[sigma=0.1] must print as they are, never as style tags.
out = Console(soft_wrap=True, markup=False)
err = Console(stderr=True, soft_wrap=True, markup=False)

# The environment variable behind --data-root: Typer reads it (`envvar=`), so a flag beats it and it
# beats the default. Not shown as Typer's "[env var: ...]": the help texts name it themselves.
DATA_ROOT_ENV = "FEDBENCH_DATA_ROOT"


def fail(exc: FedbenchError) -> NoReturn:
    """Print a usage error as one line on stderr and exit with its code (2)."""
    err.print(f"[red]error:[/red] {escape(str(exc))}", markup=True, highlight=False)
    raise typer.Exit(exc.exit_code) from None


def handle_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a FedbenchError into one line on stderr and exit code 2; Ctrl-C into exit 130.

    An OSError about a place the user chose (a read-only or full file system, a file where a folder
    goes: `fedbench.execution.paths.FOLDER_ERRNOS`, with the path it names) is bad input too, not a bug:
    one line naming that path, exit 2, rather than a traceback. Other OSErrors stay tracebacks.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except FedbenchError as exc:
            fail(exc)
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None
        except OSError as exc:
            usage = place_error(exc)
            if usage is None:
                raise
            fail(usage)

    return wrapper


def place_error(exc: OSError) -> FedbenchError | None:
    """The one-line usage error for an OSError about a path that cannot be written, or None for others."""
    from fedbench.execution.paths import FOLDER_ERRNOS, folder_error

    if exc.errno not in FOLDER_ERRNOS or not exc.filename:
        return None
    return folder_error(exc.filename, exc, "path", "pass a writable location (-o, --cache-dir)")


def choice(
    values: Any, noun: str, listing: str, normalize: Callable[[str], str] | None = None
) -> Callable[[str], str]:
    """A Typer `parser=` for a parameter annotated with the `Literal` `values`.

    Typer shows the choices in `--help` and completes them either way; this parser makes a bad value
    fedbench's one-line usage error (`unknown format 'html'; did you mean ...? (--format: rich, ...)`,
    exit 2) instead of Typer's boxed usage panel, whichever Typer app mounts the command (it runs while
    Typer parses, before `handle_errors` is in reach). `listing` names the list of choices (the option's
    flag, or 'kinds' for an argument); `normalize` maps another accepted spelling onto a choice.
    """
    choices: tuple[str, ...] = get_args(values)

    def parse(value: str) -> str:
        key = normalize(value) if normalize else value
        if key in choices:
            return key
        more = did_you_mean(value, choices)
        fail(UnknownNameError(f"unknown {noun} '{value}'; {more}({listing}: {', '.join(choices)})"))

    return parse


def choice_option(values: Any, flag: str, noun: str, help: str, *aliases: str) -> Any:
    """A Typer option over the `Literal` `values` whose bad value is a one-line error (see `choice`):
    `Annotated[Agg, choice_option(Agg, "--agg", "aggregation", "Over seeds: ...")]`."""
    return typer.Option(flag, *aliases, parser=choice(values, noun, flag), help=help)


def data_root_param(help: str) -> Any:
    """The --data-root option of a command (its help differs by command): the flag, else
    FEDBENCH_DATA_ROOT, else none (only shipped datasets). `Annotated[Path | None, data_root_param(...)]`."""
    return typer.Option("--data-root", envvar=DATA_ROOT_ENV, show_envvar=False, help=help)


def data_root_option(value: Path | None) -> str | None:
    """The data root a run is given, from a `data_root_param` value (Typer has read the environment)."""
    return str(value) if value is not None else None


def cache_dir_option(value: Path | None) -> Path:
    """--cache-dir, else the library's default (FEDBENCH_CACHE_DIR, else the user cache directory), which
    the Python API shares: `fedbench.execution.paths.default_cache_dir`."""
    from fedbench.execution.paths import default_cache_dir

    return value if value is not None else default_cache_dir()


def load_plugins(paths: list[Path] | None) -> None:
    """Load the --plugin files; one that fails to import is named once, with why, as a warning line.

    The command goes on (the grid may not need it); one that uses a name the file should have registered
    then fails with an unknown-name error naming the file (`fedbench.registry.load_plugin_file`).
    """
    from fedbench.registry import load_plugin_file

    for path in paths or []:
        failed = load_plugin_file(path)
        if failed is not None:
            err.print(
                f"warning: --plugin {path} failed to load, its plugins are unavailable: {failed.error}",
                highlight=False,
            )


def literal(text: str) -> str:
    """A help text shown as written. Typer reads help as rich markup, where '[k=v]', '[env X]' or
    '[default: ...]' is a style tag and vanishes from `--help`; escaped, the brackets print."""
    return escape(text)


def command_words(ctx: Any, names: Collection[str] | None = None, relative: bool = False) -> list[str]:
    """A parsed command's parameters (`typer.Context`) as words, in the order the command declares them,
    each option by its first flag and only where it differs from its default: the command in one normal
    form, whatever spelling (`-j2`, `--threads=1`, any order) it was typed in. `names` keeps those
    parameters only; `relative` writes paths (and a preset given as a file) relative to the current folder
    (`fedbench.spec.boards.portable_path`), as a command recorded for other machines must."""
    from fedbench.spec.boards import is_preset_path, portable_path

    words: list[str] = []
    for param in ctx.command.params:
        if names is not None and param.name not in names:
            continue
        value = ctx.params.get(param.name)
        if value is None or value is False or (isinstance(value, list | tuple) and not value):
            continue
        texts = []
        for v in value if isinstance(value, list | tuple) else [value]:
            path = isinstance(v, Path) or (param.name == "preset" and is_preset_path(str(v)))
            texts.append(portable_path(v) if relative and path else str(v))
        if param.name == "n_jobs" and value == 0:  # parse_jobs' value of `auto`, which reads back
            texts = ["auto"]
        if param.param_type_name == "argument":
            words += texts
        elif getattr(param, "is_flag", False):
            if value != param.default:
                words.append(param.opts[0])
        elif value != param.default:
            for text in texts:
                words += [param.opts[0], text]
    return words


def force_param(help: str) -> Any:
    """--force, the one word for overwriting what a command otherwise keeps: `run` recomputes cached
    runs, `export --to leaderboard` and `leaderboard build` replace a board's entries that another command
    wrote. `Annotated[bool, force_param("Recompute ... and overwrite ...")]`; help says what it overwrites."""
    return typer.Option("--force", help=help)


FORCE_BOARD_HELP = (
    "Overwrite the board's entries when another command wrote them (without it that is refused, naming "
    "the entries that would be lost; a board's own Regenerate command needs no --force)."
)

PLUGIN_HELP = "Python file that registers plugins (the only way code is loaded from a path); repeatable."
PluginOption = Annotated[list[Path] | None, typer.Option("--plugin", help=PLUGIN_HELP)]


# Options several commands share, declared once so their flags and help cannot drift apart.
CacheDirOption = Annotated[
    Path | None, typer.Option("--cache-dir", help=literal("Cache directory [env FEDBENCH_CACHE_DIR]."))
]
DataRootOption = Annotated[
    Path | None, data_root_param(literal("Folder of full datasets [env FEDBENCH_DATA_ROOT]."))
]


def parse_jobs(value: str) -> int:
    """--n-jobs: a count >= 1, or `auto` (0, `fedbench.execution.placement.AUTO_JOBS`)."""
    from fedbench.execution.placement import AUTO_JOBS

    if str(value).strip().lower() == "auto":
        return AUTO_JOBS
    try:
        jobs = int(value)
    except ValueError:
        jobs = 0
    if jobs < 1:
        fail(FedbenchError(f"--n-jobs {value}: give a number of worker processes >= 1, or auto"))
    return jobs


NJobsOption = Annotated[
    int,
    typer.Option(
        "--n-jobs",
        "-j",
        parser=parse_jobs,
        metavar="N|auto",
        help=literal(
            "Parallel worker processes; auto: in this process until a computed run takes 5 s, "
            "then one worker per free core."
        ),
    ),
]
ThreadsOption = Annotated[
    int | None,
    typer.Option(
        "--threads",
        min=1,
        help=literal(
            "torch threads per worker [default: free cores / n-jobs, free = cores - 1-min load average]."
        ),
    ),
]
