"""Which presets are leaderboards: a preset that declares a `[grid.board]` is the source of a board in
`leaderboards/`. `fedbench leaderboard build` resolves the names it is given here (a preset, the board's
own name, or a preset file) and records `rebuild_command` in the board it writes.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from fedbench.errors import FedbenchError, UnknownNameError, did_you_mean


@dataclass(frozen=True)
class BoardSource:
    """A preset that declares a `[grid.board]`: the preset as named (or its path), its file, its board."""

    preset: str
    path: Path
    board: str
    builtin: bool


def _source(preset: str, path: Path, extra_dirs: tuple[Path, ...]) -> BoardSource | None:
    from fedbench.spec.grid import builtin_preset_dir, load_preset

    grid = load_preset(path, extra_dirs).get("grid", {})
    if "board" not in grid:
        return None
    builtin = path.resolve().parent == builtin_preset_dir().resolve()
    return BoardSource(preset, path, str(grid["board"].get("name") or grid.get("name") or path.stem), builtin)


def board_sources(extra_dirs: tuple[Path, ...] = (), strict: bool = True) -> list[BoardSource]:
    """Every preset (the --preset-dir folders', then the built-in ones) that declares a board. A preset
    that does not load is an error when `strict` (--all: every board was asked for), else left out."""
    from fedbench.spec.grid import list_presets

    found = []
    for name, path, _ in list_presets(extra_dirs):
        try:
            found.append(_source(name, path, extra_dirs))
        except FedbenchError:
            if strict:
                raise
    return [s for s in found if s is not None]


def resolve_boards(names: list[str], every: bool, extra_dirs: tuple[Path, ...] = ()) -> list[BoardSource]:
    """The boards to build: `--all`, or each name as a preset that declares a board, the board's own
    name, or a preset file's path. Anything else is a usage error with a did-you-mean, before any run."""
    from fedbench.spec.grid import find_preset, list_presets

    if every == bool(names):
        raise FedbenchError("give board names or --all (not both); see 'fedbench leaderboard build --help'")
    known = board_sources(extra_dirs, strict=every)
    if every:
        chosen = known
        if not chosen:
            raise FedbenchError("no preset declares a [grid.board]: nothing to build")
    else:
        chosen = []
        for name in names:
            if is_preset_path(name):
                source = _source(name, find_preset(name), extra_dirs)
            else:  # a preset by name (loaded again: its own errors are shown), else a board's name
                source = None
                if name in {p for p, _, _ in list_presets(extra_dirs)}:
                    source = _source(name, find_preset(name, extra_dirs), extra_dirs)
                source = source or next((s for s in known if name == s.board), None)
            if source is None:
                _not_a_board(name, known, extra_dirs)
            chosen.append(source)
    boards: dict[str, BoardSource] = {}
    for source in chosen:
        other = boards.setdefault(source.board, source)
        if other.preset != source.preset:
            raise FedbenchError(
                f"presets {other.preset} and {source.preset} both declare board {source.board}; build one"
            )
    return list(boards.values())


def _not_a_board(name: str, known: list[BoardSource], extra_dirs: tuple[Path, ...]) -> NoReturn:
    from fedbench.spec.grid import list_presets

    listing = ", ".join(f"{s.preset} ({s.board})" for s in known) or "none"
    if name.endswith(".toml") or any(name == preset for preset, _, _ in list_presets(extra_dirs)):
        raise FedbenchError(f"preset '{name}' declares no [grid.board]; boards: {listing}")
    more = did_you_mean(name, [n for s in known for n in (s.preset, s.board)])
    raise UnknownNameError(f"unknown board '{name}'; {more}(boards, as preset (board): {listing})")


def portable_path(path: str | Path, base: str | Path | None = None) -> str:
    """A path as a recorded command states it: relative to `base` [default: the current folder, where
    the command runs], never absolute (a board's README is read on other machines). An absolute path
    becomes relative (with '..' when it lies outside `base`), a relative one is normalised; '/'
    separates its parts. Only a path on another Windows drive, which has no relative form, stays absolute."""
    text = str(path)
    if Path(text).is_absolute():
        try:
            text = os.path.relpath(text, Path(base) if base is not None else Path.cwd())
        except ValueError:  # another drive
            return Path(text).as_posix()
    return Path(os.path.normpath(text)).as_posix()


def is_preset_path(name: str) -> bool:
    """A preset given as a file rather than by name (`find_preset`'s rule)."""
    return name.endswith(".toml") or "/" in name or "\\" in name


def rebuild_command(
    source: BoardSource, extra_dirs: tuple[Path, ...] = (), plugins: tuple[Path, ...] = ()
) -> str:
    """The command that rebuilds a board, recorded in its board.json and shown in its README.

    It names what decides the board's runs, whatever else the build was given (other boards' folders
    and plugins in one `--all`): the preset (a built-in one by its name, however it was given), for
    another preset the --preset-dir folders it is found in (`preset_dirs`), and the `plugins` its grid
    uses, as paths relative to the current folder (`portable_path`). Where the board is written
    (--dir), the cache, the data root and the parallelism do not change the board and are left out: the
    command is the same for every build of the board, which is how a build recognises its own board
    (`fedbench.cli.board_write.overwrite_error`)."""
    if source.builtin:  # found by name without any --preset-dir; it cannot name a plugin's component
        return shlex.join(["fedbench", "leaderboard", "build", source.path.stem])
    by_path = is_preset_path(source.preset)
    words = ["fedbench", "leaderboard", "build", portable_path(source.preset) if by_path else source.preset]
    for folder in preset_dirs(source, extra_dirs):
        words += ["--preset-dir", portable_path(folder)]
    for plugin in plugins:
        words += ["--plugin", portable_path(plugin)]
    return shlex.join(words)


def preset_dirs(source: BoardSource, extra_dirs: tuple[Path, ...]) -> list[Path]:
    """The --preset-dir folders a board's preset needs: its own (when named by name) and that of the
    preset it `extends` (when that is neither beside it nor built in)."""
    import tomllib

    from fedbench.spec.grid import builtin_preset_dir, find_preset

    by_path = is_preset_path(source.preset)
    dirs = [] if by_path else [source.path.parent]
    base = tomllib.loads(source.path.read_text(encoding="utf-8")).get("grid", {}).get("extends")
    if base:
        found = find_preset(str(base), (source.path.parent, *extra_dirs)).resolve().parent
        if found not in {source.path.resolve().parent, builtin_preset_dir().resolve()}:
            dirs.append(next((Path(d) for d in extra_dirs if Path(d).resolve() == found), found))
    return dirs
