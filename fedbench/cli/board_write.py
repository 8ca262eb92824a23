"""What `fedbench export --to leaderboard` and `fedbench leaderboard build` share when they write a board:
the command the board records (its README's "Regenerate" section), and the refusal to replace entries
that another command wrote unless given --force.

The recorded command names every option that decides which runs, and so which entries, a board has
(preset, -d/-m/-D/-a, --set, --seeds, --preset-dir, --plugin; export's --where and --keep), with paths
relative to the current folder; the options that only say where files go or how fast runs go (-o,
--cache-dir, --dir/--dest, --data-root, --n-jobs, --threads, --device, ...) are left out, so the command
is the same on every machine and holds no local path.
"""

from __future__ import annotations

import functools
import json
import shlex
from collections.abc import Collection, Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import typer

from fedbench.cli._common import command_words
from fedbench.errors import FedbenchError

# `fedbench run`'s parameters that decide its grid (`running._overrides`, `build_grid`): the others say
# where results, cache and data are, and how runs are placed, timed and stopped
GRID_PARAMS = ("preset", "dataset", "model", "defense", "attack", "set_", "seeds", "preset_dir", "plugin")


@functools.cache
def _run_command() -> Any:
    """`fedbench run` as a Click command, to parse a recorded command line with run's own options."""
    from fedbench.cli.running import run_cmd

    app = typer.Typer()
    app.command()(run_cmd)
    return typer.main.get_command(app)


def grid_run_words(text: str) -> list[str] | None:
    """The words of a recorded `fedbench run ...` command (a results sidecar's) that decide its grid, in
    normal form with portable paths; None when `text` is no `fedbench run` command this version parses."""
    from fedbench.cli.running import DEFAULT_PRESET

    try:
        words = shlex.split(text or "")
    except ValueError:  # unbalanced quotes
        return None
    if words[:2] != ["fedbench", "run"]:
        return None
    try:
        ctx = _run_command().make_context("run", words[2:])
    except Exception:  # any option this version rejects (a Click error, typer.Exit alike)
        return None
    grid = command_words(ctx, GRID_PARAMS, relative=True)
    if ctx.params.get("preset") is None:  # `fedbench run` alone runs the quickstart: say so
        grid.insert(0, DEFAULT_PRESET)
    return ["fedbench", "run", *grid]


def grid_plugins(grid: Any, plugins: Sequence[Path]) -> tuple[Path, ...]:
    """The --plugin files (of `plugins`) that define a component `grid` uses: the ones its board's
    command must name."""
    import sys

    from fedbench.registry import registry_for

    used = set()
    for spec in grid.specs:
        for component in (spec.dataset, spec.model, spec.defense, spec.attack):
            if component is not None:
                module = sys.modules.get(registry_for(component.kind).get(component.name).__module__)
                if getattr(module, "__file__", None):
                    used.add(Path(module.__file__).resolve())
    return tuple(p for p in plugins if Path(p).resolve() in used)


def export_command(
    sidecars: Sequence[dict[str, Any]], board: str, where: Sequence[str], keep: str
) -> tuple[str | None, int | None]:
    """The command that regenerates a board exported from results files: the `fedbench run` command of
    each file (its sidecar's, grid options only) and the export with the options that select entries.

    One file: `fedbench run ... && fedbench export --to leaderboard --board NAME` (the run writes the
    newest file of ./results, which export reads); several: each run into its own folder under
    ./results, the export reading them in order. Returns (command, None), or (None, the index of the
    first file whose sidecar records no `fedbench run` command: the Python API's, or a lost sidecar).
    """
    runs = []
    for i, side in enumerate(sidecars):
        words = grid_run_words(str(side.get("command") or ""))
        if words is None:
            return None, i
        runs.append(words)
    export = ["fedbench", "export"]
    if len(runs) > 1:
        folders = [f"results/{board}-{i + 1}" for i in range(len(runs))]
        runs = [[*words, "-o", folder] for words, folder in zip(runs, folders, strict=True)]
        export += folders
    export += ["--to", "leaderboard", "--board", board]
    if keep != "last":
        export += ["--keep", keep]
    for text in where:
        export += ["--where", text]
    return " && ".join(shlex.join(words) for words in [*runs, export]), None


def absolute_path(command: str) -> str | None:
    """The first word of `command` (or value of a `--option=value` / `key=value` word) that is an
    absolute path (/..., C:\\...), or None."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes
        words = []
    for word in words + command.split():  # unquoted too: shlex reads C:\x as C:x
        for part in (word, word.partition("=")[2]):
            if len(part) > 1 and (PurePosixPath(part).is_absolute() or PureWindowsPath(part).is_absolute()):
                return part
    return None


# ----------------------------------------------------------------------------------------- overwrite


def overwrite_error(folder: Path, command: str, defenses: Collection[str], hint: str) -> str | None:
    """Why writing the board in `folder` with entries for `defenses`, recorded as made by `command`, must
    wait for --force, or None when it may go ahead.

    It may when the folder holds no entries (a new or empty board), or when the board records the same
    `command`: it is regenerating itself (a board's own Regenerate command, `fedbench leaderboard build`
    of its own preset), and what it removes is what its own grid no longer makes. Anything else (another
    preset, other -a/-D options, other results) would remove or replace entries another command wrote:
    the reason names them, the command that wrote them and `hint` (how to write elsewhere)."""
    existing = _entry_labels(folder)
    if not existing:
        return None
    recorded = _recorded_command(folder)
    if recorded == command:
        return None
    removed = [d for d in existing if d not in defenses]
    replaced = [d for d in existing if d in defenses]
    what = " and ".join(
        f"{verb} {len(labels)} ({_listing(labels)})"
        for verb, labels in (("remove", removed), ("replace", replaced))
        if labels
    )
    writer = f"written by: {recorded}" if recorded else "its board.json names no command"
    return (
        f"board {folder.name} in {folder.parent} holds {len(existing)} entries ({writer}); "
        f"this would {what}; pass --force to overwrite them, or {hint}"
    )


def check_overwrite(folder: Path, command: str, defenses: Collection[str], force: bool, hint: str) -> None:
    """Raise the usage error of `overwrite_error` (exit 2, before anything is written) unless `force`."""
    if not force and (reason := overwrite_error(folder, command, defenses, hint)):
        raise FedbenchError(reason)


def _entry_labels(folder: Path) -> list[str]:
    """The defense configurations of a board folder's entries (a file's name when it is not readable)."""
    from fedbench.reporting.leaderboard import ENTRIES_DIR

    labels = []
    for path in sorted((folder / ENTRIES_DIR).glob("*.json")):
        try:
            label = json.loads(path.read_text(encoding="utf-8")).get("defense")
        except (OSError, ValueError, AttributeError):
            label = None
        labels.append(str(label) if isinstance(label, str) and label else path.stem)
    return labels


def _recorded_command(folder: Path) -> str | None:
    from fedbench.reporting.leaderboard import BOARD_FILE

    try:
        command = json.loads((folder / BOARD_FILE).read_text(encoding="utf-8")).get("command")
    except (OSError, ValueError, AttributeError):
        return None
    return command if isinstance(command, str) else None


def _listing(labels: Sequence[str], most: int = 8) -> str:
    shown = ", ".join(labels[:most])
    return shown + (f", and {len(labels) - most} more" if len(labels) > most else "")
