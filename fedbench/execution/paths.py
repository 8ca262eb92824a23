"""Default locations: the cache directory (private to the user) and the data root.

Read at call time, never at import time, so tests and the CLI can set the environment first.
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
import time
from pathlib import Path

from fedbench.errors import FedbenchError


def default_cache_dir() -> Path:
    """`FEDBENCH_CACHE_DIR`, else `$XDG_CACHE_HOME/fedbench`, else `~/.cache/fedbench`."""
    env = os.environ.get("FEDBENCH_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "fedbench"


def default_data_root() -> Path | None:
    """`FEDBENCH_DATA_ROOT` when set, else None (only shipped datasets are available)."""
    env = os.environ.get("FEDBENCH_DATA_ROOT")
    return Path(env).expanduser() if env else None


class FolderError(FedbenchError):
    """An output or cache folder fedbench cannot write in: a file in its place, a read-only or full file
    system, no permission. Raised before anything is written there (or with the partial file removed)."""


# Why a folder cannot be written, by errno: the part of the one-line error a person acts on.
_WHY = {
    errno.EROFS: "is on a read-only file system",
    errno.ENOSPC: "is on a full disk (no space left)",
    errno.EDQUOT: "is over its disk quota",
    errno.EACCES: "is not writable (permission denied)",
    errno.EPERM: "is not writable (operation not permitted)",
    errno.ENOTDIR: "is inside a file, not a folder",
    errno.EEXIST: "is a file, not a folder",
    errno.ENAMETOOLONG: "has too long a name",
}
# The errnos that mean "this place cannot be written", not a bug: `handle_errors` prints them as one line.
FOLDER_ERRNOS = frozenset(_WHY) | {errno.EISDIR, errno.ELOOP}


def folder_error(path: Path | str, exc: OSError, what: str, fix: str) -> FolderError:
    """The one-line error for `exc` raised while writing in the folder `path`: `{what} {path} {why}
    (errno N); {fix}`, e.g. `output folder results is on a read-only file system (errno 30); nothing
    was written: pass a writable folder with -o`."""
    why = _WHY.get(exc.errno or 0, f"cannot be written ({exc.strerror or exc})")
    return FolderError(f"{what} {path} {why} (errno {exc.errno}); {fix}")


def _file_in_the_way(path: Path) -> Path | None:
    """`path` or the nearest of its parents that exists, when that is not a folder (a file in the way)."""
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return None if candidate.is_dir() else candidate
    return None


def writable_dir(path: Path | str, what: str = "output folder", flag: str = "-o") -> Path:
    """`path`, created when missing, after proving a file can be written there (a temporary file, removed
    at once); else a one-line `FolderError` naming the folder, why and the flag that chooses another.

    Commands call it before any run so a file given as the output folder, a read-only file system or a
    full disk stops them at the start, not after the grid ran.
    """
    path = Path(path)
    blocker = _file_in_the_way(path)
    if blocker is not None:
        where = "is a file" if blocker == path else f"is inside {blocker}, a file"
        raise FolderError(f"{what} {path} {where}, not a folder; pass a folder with {flag}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".fedbench-probe-", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        fix = f"nothing was written: pass a writable folder with {flag}"
        raise folder_error(path, exc, what, fix) from None
    return path


_CACHE_FIX = "choose another folder with --cache-dir or FEDBENCH_CACHE_DIR (or pass --no-cache)"


def private_dir(path: Path, what: str = "cache folder", fix: str = _CACHE_FIX) -> Path:
    """`path`, created (with its parents) when missing; a folder fedbench creates is readable only by the
    user (0700: the cache holds pickles). An existing folder is used as it is: its permissions are the
    owner's choice and are never changed. A folder that cannot be created is a one-line `FolderError`
    (`{what} {path} {why}; {fix}`)."""
    blocker = _file_in_the_way(path)
    if blocker is not None:
        where = "is a file" if blocker == path else f"is inside {blocker}, a file"
        raise FolderError(f"{what} {path} {where}, not a folder; {fix}")
    try:
        path.mkdir(parents=True, exist_ok=False, mode=0o700)
    except FileExistsError:
        return path
    except OSError as exc:
        raise folder_error(path, exc, what, f"nothing was written: {fix}") from None
    try:
        os.chmod(path, 0o700)  # mkdir's mode is reduced by the umask
    except OSError:
        pass
    return path


# ------------------------------------------------------------------------------------ cache marker
#
# A fedbench cache directory is identified by a marker file, a CACHEDIR.TAG (https://bford.info/cachedir/,
# which backup tools skip) whose text names fedbench. fedbench writes it when it creates a cache directory
# or adopts an empty one, and only ever deletes inside a directory that holds it (or that has exactly the
# layout older fedbench versions left, see `_legacy_layout`). A non-empty directory without it is refused:
# pointing --cache-dir at a checkout or a home folder must never let `cache clear` delete it.

CACHE_MARKER = "CACHEDIR.TAG"
_MARKER_SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"
_MARKER_TEXT = (
    f"{_MARKER_SIGNATURE}\n"
    "# This directory is a fedbench run cache (https://bford.info/cachedir/).\n"
    "# `fedbench cache clear` deletes only the entries fedbench wrote here (joblib/fedbench, data/*.npz,\n"
    "# locks/*.lock).\n"
)
# What fedbench writes inside a cache directory: joblib's store, joblib's .gitignore, prepared datasets,
# and the run locks (`locks/`, see `fedbench.execution.locks`).
JOBLIB_DIR = "joblib"
DATA_DIR = "data"
_JOBLIB_GITIGNORE = "# Created by joblib automatically.\n*\n"
# Files fedbench writes in data/: `mnist5k-v1.npz`, `<key>-<size>-<16 hex>.npz`, and the temporary
# name of an interrupted atomic write (`<name>.npz.<random>.tmp`).
_DATA_FILE = re.compile(r"^(mnist5k-v\d+|[a-z0-9_-]+-\d+-[0-9a-f]{16})\.npz(\.[A-Za-z0-9_]+\.tmp)?$")


class NotACacheError(FedbenchError):
    """A --cache-dir that holds files fedbench did not write."""


def has_marker(path: Path) -> bool:
    """Whether `path` holds fedbench's CACHEDIR.TAG."""
    try:
        text = (path / CACHE_MARKER).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return text.startswith(_MARKER_SIGNATURE) and "fedbench" in text


def is_data_file(name: str) -> bool:
    """Whether a file name in `<cache>/data` is one fedbench writes there."""
    return bool(_DATA_FILE.match(name))


def _legacy_layout(path: Path) -> bool:
    """A cache written by fedbench before the marker existed: nothing but joblib's `.gitignore` (its exact
    text), `joblib/` holding only `fedbench/cache/<fedbench's cached functions>`, and `data/` holding only
    fedbench's dataset files; at least one of joblib/fedbench or a data file must be there."""
    try:
        entries = {p.name: p for p in path.iterdir()}
        if not entries or not set(entries) <= {".gitignore", JOBLIB_DIR, DATA_DIR}:
            return False
        if ".gitignore" in entries and not (
            entries[".gitignore"].is_file() and entries[".gitignore"].read_text() == _JOBLIB_GITIGNORE
        ):
            return False
        found = False
        if JOBLIB_DIR in entries:
            store = entries[JOBLIB_DIR]
            if not store.is_dir() or {p.name for p in store.iterdir()} - {"fedbench"}:
                return False
            if (store / "fedbench").exists():
                if {p.name for p in (store / "fedbench").iterdir()} - {"cache"}:
                    return False
                found = True
        if DATA_DIR in entries:
            data = entries[DATA_DIR]
            if not data.is_dir() or not all(p.is_file() and is_data_file(p.name) for p in data.iterdir()):
                return False
            found = found or any(data.iterdir())
        return found
    except OSError:
        return False


def is_cache_dir(path: Path) -> bool:
    """Whether `path` is a fedbench cache: it holds the marker, or exactly an older fedbench's layout."""
    return path.is_dir() and (has_marker(path) or _legacy_layout(path))


def not_a_cache(path: Path) -> NotACacheError:
    """The refusal of `path` as a cache directory: a file in its place, or a folder fedbench did not write."""
    blocker = _file_in_the_way(path)
    if blocker is not None:
        where = "is a file" if blocker == path else f"is inside {blocker}, a file"
        return NotACacheError(f"cache directory {path} {where}; pass a folder with --cache-dir")
    return NotACacheError(
        f"cache directory {path} is not a fedbench cache (it holds files fedbench did not write and no "
        f"fedbench {CACHE_MARKER}); nothing was changed: pass a new or empty folder, e.g. --cache-dir "
        f"{path / 'fedbench-cache'}"
    )


def open_cache_dir(path: Path) -> Path:
    """`path` ready to hold fedbench's cache: created (0700) with its marker when missing, adopted (the
    marker written, its permissions untouched) when it is empty or an older fedbench cache, used as it is
    when it holds the marker. Any other folder raises `NotACacheError` before anything is written."""
    if _file_in_the_way(path) is not None:
        raise not_a_cache(path)
    if not path.exists():
        private_dir(path, "cache directory")
    elif has_marker(path):
        return path
    elif any(path.iterdir()) and not _legacy_layout(path) and not (path / CACHE_MARKER).is_file():
        raise not_a_cache(path)  # (a marker being written by another process is waited for below)
    try:
        _write_marker(path)
    except OSError as exc:
        raise folder_error(path, exc, "cache directory", f"nothing was written: {_CACHE_FIX}") from None
    return path


def _write_marker(path: Path) -> None:
    try:
        fd = os.open(path / CACHE_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:  # another fedbench process adopted it first (and may still be writing it)
        for _ in range(50):
            if has_marker(path):
                return
            time.sleep(0.01)
        raise not_a_cache(path) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(_MARKER_TEXT)
    except BaseException:  # a full disk: no half-written marker is left to be mistaken for a cache
        (path / CACHE_MARKER).unlink(missing_ok=True)
        raise
