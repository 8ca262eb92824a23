"""The run cache: the only module that touches joblib.Memory.

Two cached functions, both small stable trampolines (editing a cached function's source wipes its
joblib cache, so the real work lives in `fedbench.runner`): the utility run, keyed by the run's
utility key (no attack), and the attack run, keyed by the full key. Each takes the canonical JSON
key as its only hashed argument; the `job` argument (the RunSpec and the run context: device, data
root) is ignored by joblib, so device and paths never enter a key. Failed runs raise, and joblib
does not store exceptions, so failures are never cached. Values are plain dicts of numbers and
numpy arrays, never torch objects.

Integrity: entries are written zlib-compressed, so a flipped or missing byte fails the checksum
when read; joblib writes each file to a temporary name and renames it, so a concurrent process or
an interruption never leaves a half-written entry under its final name. An entry that fails to load
is recomputed and overwritten (run entries and `artifact` entries alike), and the run's row carries
one warning naming it. The cache holds pickles: loading one from someone else's cache runs their
code, hence the private directory.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedbench.paths import private_dir


def _utility_entry(key: str, job: Any) -> dict:
    from fedbench.runner import compute_utility

    return compute_utility(job)


def _attack_entry(key: str, job: Any) -> dict:
    from fedbench.runner import compute_attack

    return compute_attack(job)


def _artifact_entry(kind: str, key: str, compute: Callable[[], Any]) -> Any:
    return compute()


# Where derived artifacts are cached: the location of the RunCache most recently opened in this process
# (the runner opens one per grid and per worker), so artifacts live and are cleared with the runs.
_artifacts: dict[str, Any] = {"location": None, "func": None, "warnings": []}
_artifact_lock = threading.Lock()


def artifact(kind: str, key: str, compute: Callable[[], Any]) -> Any:
    """A derived artifact shared by many runs, computed once and cached on disk beside the runs.

    Examples: SDAN-trained malicious parameters, a LODA feature extractor, an obscured dataset. `kind`
    names the artifact family, `key` is a canonical JSON string of everything the value depends on;
    `compute()` is called only on a miss and must return a picklable value (tensors, arrays). Without
    an open on-disk RunCache (`--no-cache`, or library use) the value is computed each call. A damaged
    entry is recomputed like a damaged run entry, with one warning in the current run's row.
    """
    with _artifact_lock:
        func, warnings = _artifacts["func"], _artifacts["warnings"]
    if func is None:
        return compute()
    return _load_or_compute(func, (kind, key, compute), f"{kind} artifact", key, warnings)[0]


def _open_artifacts(memory: Any, location: Path, warnings: list[str]) -> None:
    with _artifact_lock:
        if _artifacts["location"] != location:
            _artifacts["location"] = location
            _artifacts["func"] = memory.cache(_artifact_entry, ignore=["compute"])
        _artifacts["warnings"] = warnings


def _close_artifacts(location: Path | None) -> None:
    with _artifact_lock:
        if location is None or _artifacts["location"] == location:
            _artifacts["location"] = _artifacts["func"] = None
            _artifacts["warnings"] = []


def _load_or_compute(
    func: Any,
    args: tuple,
    what: str,
    key: str,
    warnings: list[str],
    validate: Callable[[Any], None] | None = None,
) -> tuple[Any, bool]:
    """(value, came_from_cache) of a joblib-memoised call; a damaged entry is dropped and recomputed.

    joblib alone would also recompute, but with its own multi-line warning and traceback; here the
    caller gets one line in `warnings` naming the entry.
    """
    if not func.check_call_in_cache(*args):
        return func(*args), False
    shelved = func.call_and_shelve(*args)
    try:
        value = shelved.get()
        if validate is not None:
            validate(value)
        return value, True
    except Exception as exc:  # truncated or corrupted: drop it, recompute, store the new value
        detail = str(exc).splitlines()[0][:120] if str(exc) else "unreadable"
        name = type(exc).__name__
        warnings.append(f"corrupted {what} cache entry {_run_id(key)} ({name}: {detail}); recomputed")
        shelved.clear()  # a recomputation that fails must not leave the damaged entry behind
        return func.call(*args)[0], False


def _check_run_result(value: Any) -> None:
    if not isinstance(value, dict) or "seconds" not in value:
        raise ValueError(f"holds a {type(value).__name__}, not a run result")


class CacheWarning(UserWarning):
    """A cache entry that could not be read and was recomputed."""


# zlib level 3: its checksum makes corruption detectable; run results are small, so it costs little.
_COMPRESS = 3


def _run_id(key: str) -> str:
    from fedbench.spec import short_hash

    return short_hash(key)


@dataclass(frozen=True)
class CacheInfo:
    location: str
    utility_entries: int
    attack_entries: int
    size_bytes: int


class RunCache:
    """Cached utility and attack computations under `location` (None: no caching at all)."""

    def __init__(self, location: str | Path | None, force: bool = False):
        self.location = Path(location) if location is not None else None
        self.force = force
        self._memory = None
        self._warnings: list[str] = []
        if self.location is not None:
            from joblib import Memory

            private_dir(self.location)
            self._memory = Memory(str(self.location), verbose=0, compress=_COMPRESS)
            self._utility = self._memory.cache(_utility_entry, ignore=["job"])
            self._attack = self._memory.cache(_attack_entry, ignore=["job"])
            _open_artifacts(self._memory, self.location, self._warnings)
        else:
            _close_artifacts(None)

    @property
    def enabled(self) -> bool:
        return self._memory is not None

    def _get(self, func: Any, plain: Any, key: str, job: Any) -> tuple[dict, bool]:
        if self._memory is None:
            return plain(key, job), False
        if self.force:
            return func.call(key, job)[0], False
        what = func.func.__name__.strip("_").replace("_entry", "")
        return _load_or_compute(func, (key, job), what, key, self._warnings, _check_run_result)

    def take_warnings(self) -> list[str]:
        """Warnings (corrupted entries recomputed) since the last call; each is reported once."""
        out = list(self._warnings)
        self._warnings.clear()  # in place: the artifact cache appends to this same list
        return out

    def utility(self, key: str, job: Any) -> tuple[dict, bool]:
        """(value, came_from_cache) of the utility run with this key."""
        return self._get(getattr(self, "_utility", None), _utility_entry, key, job)

    def attack(self, key: str, job: Any) -> tuple[dict, bool]:
        """(value, came_from_cache) of the attack run with this key."""
        return self._get(getattr(self, "_attack", None), _attack_entry, key, job)

    def has_utility(self, key: str) -> bool:
        return self._memory is not None and not self.force and self._utility.check_call_in_cache(key, None)

    def has_attack(self, key: str) -> bool:
        return self._memory is not None and not self.force and self._attack.check_call_in_cache(key, None)

    def info(self) -> CacheInfo:
        if self.location is None or not self.location.exists():
            return CacheInfo(str(self.location), 0, 0, 0)
        size = sum(p.stat().st_size for p in self.location.rglob("*") if p.is_file())

        def entries(name: str) -> int:
            found = list(self.location.rglob(name))
            return sum(1 for d in found[0].iterdir() if d.is_dir()) if found else 0

        return CacheInfo(str(self.location), entries("_utility_entry"), entries("_attack_entry"), size)

    def clear(self) -> None:
        """Delete every cached run (the directory itself is kept, private)."""
        if self.location is None or not self.location.exists():
            return
        for child in self.location.iterdir():
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()
