"""The run cache: the only module that touches joblib.Memory.

Two cached functions, both small stable trampolines (editing a cached function's source wipes its
joblib cache, so the real work lives in `fedbench.runner`): the utility run, keyed by the run's
utility key (no attack), and the attack run, keyed by the full key. Each takes the canonical JSON
key as its only hashed argument; the `job` argument (the RunSpec and the run context: device, data
root) is ignored by joblib, so device and paths never enter a key. Failed runs raise, and joblib
does not store exceptions, so failures are never cached. Values are plain dicts of numbers and
numpy arrays, never torch objects.
"""

from __future__ import annotations

import shutil
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
        if self.location is not None:
            from joblib import Memory

            private_dir(self.location)
            self._memory = Memory(str(self.location), verbose=0)
            self._utility = self._memory.cache(_utility_entry, ignore=["job"])
            self._attack = self._memory.cache(_attack_entry, ignore=["job"])

    @property
    def enabled(self) -> bool:
        return self._memory is not None

    def _get(self, func: Any, plain: Any, key: str, job: Any) -> tuple[dict, bool]:
        if self._memory is None:
            return plain(key, job), False
        if self.force:
            return func.call(key, job)[0], False
        if func.check_call_in_cache(key, job):
            return func(key, job), True
        return func(key, job), False

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
