"""Per-run locks: two fedbench processes sharing a cache directory compute a shared run (or artifact) once.

`RunCache` takes an exclusive `flock` on `<cache>/locks/<what>-<run id>.lock` before it computes a run
that is not in the cache, and checks the cache again once it holds the lock: a process that waited
finds the entry the other one wrote and loads it. Nothing is locked for a run served from the cache,
nor without a cache (`--no-cache`).

- Released on every exit path: the lock is held by an open file descriptor, closed when the computation
  returns or raises, and the kernel drops it when the process dies (SIGKILL, the OOM killer), so a dead
  holder never blocks anyone.
- The file is removed by its holder before it lets go (while still holding the lock); a waiter that
  then gets the lock on the removed file sees the path missing or naming another file, and locks the
  path again. The folder holds files only of runs being computed, and of holders that died.
- Derived artifacts (`fedbench.plugin.artifact`: a LODA extractor, an obscured dataset, a RecUP zoo)
  are locked the same way (`<cache>/locks/artifact-<hash of kind and key>.lock`), so two grids that need
  one artifact compute it once.
- No deadlock: a process holds at most one run lock (the utility run's lock is released before the
  attack run's is taken; `--gpus` slot locks are claimed before any run and never waited for under a
  run lock). Under it, it may wait for artifact locks, and an artifact's computation for the locks of
  the artifacts it uses; those dependencies have no cycle, and no artifact holder waits for a run
  lock, so no wait can close a cycle. Waiting can be interrupted: Ctrl-C and the run's timeout alarm
  raise through `flock`.
- `fedbench cache prune --stale` deletes an entry only while it holds that entry's lock, taken without
  waiting (`exclusive_if_free`): an entry whose lock another process holds is being computed or
  rewritten, and is left.
- Where `fcntl` does not exist (Windows) nothing is locked: concurrent processes compute a shared run
  twice, as before locks existed, and write equal entries.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCKS_DIR = "locks"  # in the cache directory, beside joblib/ and data/
LOCK_SUFFIX = ".lock"


def lock_path(location: Path, what: str, run_id: str) -> Path:
    """The lock file of the `what` run (utility, attack) with this run id in the cache at `location`."""
    return location / LOCKS_DIR / f"{what}-{run_id}{LOCK_SUFFIX}"


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created when missing) for the duration of the block."""
    try:
        import fcntl
    except ImportError:  # no flock here: unlocked (see the module docstring)
        yield
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = _acquire(path, fcntl)
    try:
        yield
    finally:
        _release(path, fd)


@contextmanager
def exclusive_if_free(path: Path) -> Iterator[bool]:
    """`exclusive` without waiting: holds the lock for the block and gives True, or gives False at once
    (holding nothing) when another process holds it. Without `fcntl`, True, unlocked."""
    try:
        import fcntl
    except ImportError:
        yield True
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = _acquire(path, fcntl, wait=False)
    if fd is None:
        yield False
        return
    try:
        yield True
    finally:
        _release(path, fd)


def _acquire(path: Path, fcntl, wait: bool = True) -> int | None:
    """An open descriptor holding the lock on the file that is at `path` now; without `wait`, None at once
    when another process holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)  # waits while held
            if _same_file(fd, path):
                return fd
        except BlockingIOError:  # held, and not waiting
            os.close(fd)
            return None
        except BaseException:  # Ctrl-C or the run's timeout while waiting: nothing is held
            os.close(fd)
            raise
        os.close(fd)  # the holder removed the file before letting go: lock the path's new file


def _same_file(fd: int, path: Path) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _release(path: Path, fd: int) -> None:
    """Remove the lock file (still holding the lock, so no one else holds it), then let go."""
    try:
        if _same_file(fd, path):  # never another holder's file (a cleared cache made a new one)
            path.unlink()
    except OSError:
        pass
    finally:
        os.close(fd)
