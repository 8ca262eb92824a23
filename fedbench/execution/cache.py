"""The run cache: the only module that touches joblib.Memory.

Two cached functions, both small stable trampolines (editing a cached function's source wipes its
joblib cache): the utility run, keyed by the run's utility key (no attack), and the attack run, keyed by
the full key. Each takes the canonical JSON key as its only hashed argument; the `job` (the RunSpec, the
run context: device, data root, and the run's plugin instances) and the `compute` function that does the
work (`fedbench.execution.runner.compute_utility` / `compute_attack`, handed in by the runner: this module
never imports it) are ignored by joblib, so device and paths never enter a key. Failed runs raise, and
joblib does not store exceptions, so failures are never cached. Values are plain dicts of numbers and
numpy arrays, never torch objects. A third trampoline stores a run's derived columns (epsilon and the
privacy metrics computed from the cached run: `fedbench.execution.derived`, whose key names the code
and the inputs they come from), so a fully cached re-run does not compute them again.

Artifacts: each RunCache owns an `ArtifactStore` for values plugins derive once for many runs (SDAN
layers, a LODA extractor, RecUP-FL's zoo), stored beside the runs and cleared with them. The runner makes
it current for the duration of a run (`fedbench.plugin.using_artifacts`); plugins reach it through
`fedbench.plugin.artifact`.

Integrity: entries are written zlib-compressed, so a flipped or missing byte fails the checksum
when read; joblib writes each file to a temporary name and renames it, so a concurrent process or
an interruption never leaves a half-written entry under its final name. An entry that fails to load
is recomputed and overwritten (run entries and `artifact` entries alike), and the run's record carries
one warning naming it. The cache holds pickles: loading one from someone else's cache runs their
code, hence the private directory.

Concurrency: processes sharing the cache directory (two `fedbench run`, a grid's workers) compute a
shared run once. A run that is not in the cache is computed under an exclusive per-run lock
(`fedbench.execution.locks`: a `flock` on `locks/<utility|attack>-<run id>.lock`), and the cache is read
again once the lock is held, so a process that waited loads the entry the other one wrote; an artifact
that is not in the cache likewise (`locks/artifact-<hash>.lock`). `--force` takes the run lock too (two
writers never race on one entry); without a cache nothing is locked.

Code: a run entry stores the digests of the code that computed it (`fedbench.execution.sources`: its
plugins' code and the engine's: the FL simulation, the runner's compute functions, ...) and an artifact
entry the digest of the module that computed it; an entry computed by code that has changed since (a
plugin or `fedbench/fl/simulation.py` edited without a `version` bump) is recomputed under its lock with
one warning line naming what changed. The digests are not part of the key, so run ids stay stable.
Entries from before a digest was stored have none and are served: before digests at all, and before
the engine's (a cache filled by an earlier fedbench stays usable). `prune_stale` (`fedbench cache prune
--stale`) deletes the run entries whose stored digests differ from the code loaded now.

Ownership: the cache directory is marked by a CACHEDIR.TAG (`fedbench.execution.paths.open_cache_dir`); a
folder fedbench did not create is refused, `clear_cache` deletes only fedbench's entries, and an
existing folder's permissions are never changed.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedbench.errors import FedbenchError
from fedbench.execution.locks import LOCK_SUFFIX, LOCKS_DIR, exclusive, exclusive_if_free, lock_path
from fedbench.execution.paths import (
    CACHE_MARKER,
    DATA_DIR,
    JOBLIB_DIR,
    is_cache_dir,
    is_data_file,
    not_a_cache,
    open_cache_dir,
    private_dir,
)

# What computes a run on a miss: called with the job, returns the value to store.
Compute = Callable[[Any], dict]


def _utility_entry(key: str, job: Any, compute: Compute) -> dict:
    return compute(job)


def _attack_entry(key: str, job: Any, compute: Compute) -> dict:
    return compute(job)


def _artifact_entry(kind: str, key: str, compute: Callable[[], Any]) -> Any:
    return compute()


def _derived_entry(key: str, compute: Callable[[], Any]) -> Any:
    return compute()


def _summary_entry(key: str, compute: Callable[[], Any]) -> Any:
    return compute()


class ArtifactStore:
    """The derived artifacts of one RunCache: computed once, stored in its folder beside the runs.

    `get` is what `fedbench.plugin.artifact` calls while a run of this cache executes. An entry that fails
    to load, or that was computed by code that has changed since (the digest of the module defining
    `compute` is stored with the value), is recomputed with one line in the cache's warnings. With
    `force` (`--force`: recompute every run) each entry is recomputed the first time this store is
    asked for it, then served: an artifact is part of the runs that read it (the shared training of
    `fedbench.execution.runner.trained_model` is one), and a forced grid recomputes it once per process,
    not once per run.
    """

    def __init__(
        self,
        memory: Any,
        warnings: list[str],
        locked: Callable[[str, str], AbstractContextManager[None]],
        force: bool = False,
    ):
        self._func = memory.cache(_artifact_entry, ignore=["compute"])
        self._warnings = warnings  # the RunCache's own list: a run's record takes them with the rest
        self._locked = locked  # the RunCache's lock of one entry (what, key)
        self._force = force
        self._redone: set[tuple[str, str]] = set()  # (kind, key) recomputed by this store under force

    def get(self, kind: str, key: str, compute: Callable[[], Any]) -> Any:
        """The artifact `kind` with canonical JSON `key`; `compute()` runs only on a miss."""
        code = _compute_digest(compute)

        def stamped() -> dict[str, Any]:  # the value and the digest of the code that computed it
            return {_STAMP: code, "value": compute()}

        def check(value: Any) -> None:
            if _is_stamped(value) and value[_STAMP] != code:
                where = getattr(getattr(compute, "func", compute), "__module__", "?")
                raise StaleEntry(f"the code of {where} changed since it was computed")

        args = (kind, key, stamped)
        lock, what = self._locked("artifact", f"{kind}\n{key}"), f"{kind} artifact"
        if self._force and (kind, key) not in self._redone:
            with lock:
                value = self._func.call(*args)[0]
            self._redone.add((kind, key))
        else:
            value = _load_or_compute_once(self._func, args, lock, what, key, self._warnings, check)[0]
        return value["value"] if _is_stamped(value) else value  # an entry from before stamps: as stored


_STAMP = "__fedbench_code__"


def _is_stamped(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {_STAMP, "value"}


def _compute_digest(compute: Callable[[], Any]) -> str | None:
    """Digest of the code of the module that defines `compute` (a plugin's helper), or None."""
    from fedbench.execution.sources import combine, module_closure

    func = getattr(compute, "func", compute)  # functools.partial
    module = getattr(func, "__module__", None)
    files = module_closure([module]) if module else {}
    return combine(files) if files else None


class StaleEntry(Exception):
    """A cache entry computed by plugin code that has since changed (its stored digest differs)."""


def _load_or_compute_once(
    func: Any,
    args: tuple,
    lock: AbstractContextManager[None],
    what: str,
    key: str,
    warnings: list[str],
    validate: Callable[[Any], None] | None = None,
) -> tuple[Any, bool]:
    """`_load_or_compute` across processes: on a miss another process sharing this cache may be computing
    the same entry, so `lock` (its per-entry lock) is taken first and the cache checked again once held,
    loading the entry that process wrote. A valid hit takes no lock. An entry that is stale or damaged
    is replaced under the lock too, like a miss: two processes that find it replace it once, and
    `prune_stale` never deletes an entry while it is being rewritten."""
    if func.check_call_in_cache(*args):
        try:
            return _load_valid(func, args, validate), True
        except Exception:  # stale, damaged or deleted meanwhile: checked again (and said) under the lock
            pass
    with lock:
        return _load_or_compute(func, args, what, key, warnings, validate)


def _load_valid(func: Any, args: tuple, validate: Callable[[Any], None] | None) -> Any:
    """The stored value of a joblib-memoised call, checked by `validate`; raises when it fails."""
    value = func.call_and_shelve(*args).get()
    if validate is not None:
        validate(value)
    return value


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
    except StaleEntry as exc:  # computed by code that has changed since: recompute, store the new value
        warnings.append(f"stale {what} cache entry {_run_id(key)} ({exc}); recomputed")
        shelved.clear()
        return func.call(*args)[0], False
    except Exception as exc:  # truncated or corrupted: drop it, recompute, store the new value
        detail = str(exc).splitlines()[0][:120] if str(exc) else "unreadable"
        name = type(exc).__name__
        warnings.append(f"corrupted {what} cache entry {_run_id(key)} ({name}: {detail}); recomputed")
        shelved.clear()  # a recomputation that fails must not leave the damaged entry behind
        return func.call(*args)[0], False


def _check_derived(value: Any) -> None:
    if not isinstance(value, dict) or "scores" not in value:
        raise ValueError(f"holds a {type(value).__name__}, not derived columns")


def _check_summary(value: Any) -> None:
    if not isinstance(value, dict) or not isinstance(value.get("markdown"), str) or "table" not in value:
        raise ValueError(f"holds a {type(value).__name__}, not a run summary")


def _check_run_result(value: Any) -> None:
    if not isinstance(value, dict) or "seconds" not in value:
        raise ValueError(f"holds a {type(value).__name__}, not a run result")


def _run_validator(job: Any, attack: bool) -> Callable[[Any], None]:
    """Checks a cached run result: readable, and computed by the code loaded now.

    The result stores `code`, the digests of its plugins' and the engine's code
    (`fedbench.execution.sources.code_digests`); one that differs from the code loaded now raises
    StaleEntry naming what changed. An entry written before a digest was stored has none for it and is
    served as before (`fedbench.execution.sources.changed_code`).
    """
    spec = getattr(job, "spec", None)

    def validate(value: Any) -> None:
        _check_run_result(value)
        if spec is None:
            return
        from fedbench.execution.sources import changed_code

        changed = changed_code(spec, value.get("code"), attack)
        if changed:
            raise StaleEntry(f"the code of {changed} changed since it was computed")

    return validate


def _read_code_now(job: Any, attack: bool) -> None:
    """Read the digests of the code a run uses when the run starts (each once per process), not when its
    computation ends: a file edited while a long run computes does not stamp the old numbers as new."""
    spec = getattr(job, "spec", None)
    if spec is not None:
        from fedbench.execution.sources import code_digests

        code_digests(spec, attack)


class CacheWarning(UserWarning):
    """A run's warning line: a cache entry that was corrupted or stale and was recomputed, or a metric
    that could not be computed (LPIPS without its weights), stated once (`RunRecord.warnings`)."""


# zlib level 3: its checksum makes corruption detectable; run results are small, so it costs little.
_COMPRESS = 3


def _run_id(key: str) -> str:
    from fedbench.spec.run import short_hash

    return short_hash(key)


@dataclass(frozen=True)
class CacheInfo:
    location: str
    utility_entries: int
    attack_entries: int
    size_bytes: int


class RunCache:
    """Cached utility and attack computations under `location` (None: no caching at all), and the
    artifacts derived for them (`artifacts`, None without a location)."""

    def __init__(self, location: str | Path | None, force: bool = False):
        self.location = Path(location) if location is not None else None
        self.force = force
        self._memory = None
        self._warnings: list[str] = []
        self.artifacts: ArtifactStore | None = None
        if self.location is not None:
            from joblib import Memory

            open_cache_dir(self.location)  # refuses a folder fedbench did not create (nothing written)
            private_dir(self.location / JOBLIB_DIR)  # the pickles stay private even in an adopted folder
            self._memory = Memory(str(self.location), verbose=0, compress=_COMPRESS)
            self._funcs = {
                "utility": self._memory.cache(_utility_entry, ignore=["job", "compute"]),
                "attack": self._memory.cache(_attack_entry, ignore=["job", "compute"]),
            }
            self._derived = self._memory.cache(_derived_entry, ignore=["compute"])
            self._summary = self._memory.cache(_summary_entry, ignore=["compute"])
            self.artifacts = ArtifactStore(self._memory, self._warnings, self._locked, force)

    @property
    def enabled(self) -> bool:
        return self._memory is not None

    def _get(self, what: str, key: str, job: Any, compute: Compute | None) -> tuple[dict, bool]:
        if compute is None and not self._has(what, key):
            raise FedbenchError(f"{what} run {_run_id(key)} is not in the cache {self.location}")
        if self._memory is None:
            return compute(job), False
        func = self._funcs[what]
        args = (key, job, compute)
        _read_code_now(job, attack=what == "attack")
        if self.force:
            with self._locked(what, key):
                return func.call(*args)[0], False
        validate = _run_validator(job, attack=what == "attack")
        return _load_or_compute_once(func, args, self._locked(what, key), what, key, self._warnings, validate)

    def _locked(self, what: str, key: str) -> AbstractContextManager[None]:
        """The exclusive lock of one entry (run or artifact) of this cache (`fedbench.execution.locks`)."""
        assert self.location is not None
        return exclusive(lock_path(self.location, what, _run_id(key)))

    def _has(self, what: str, key: str) -> bool:
        """Whether the entry is cached. Asked twice when the first answer is no: joblib writes a cache
        folder's record of the function's code (`func_code.py`) only when this process has not yet
        checked that function in any folder, so a folder filled by a process that used another one
        first lacks it, and the next process's first check there answers no while writing it (a fully
        cached re-run then loaded the dataset, and imported torch, for its first attack)."""
        if self._memory is None or self.force:
            return False
        func = self._funcs[what]
        return func.check_call_in_cache(key, None, None) or func.check_call_in_cache(key, None, None)

    def take_warnings(self) -> list[str]:
        """Warnings (entries recomputed: corrupted or stale) since the last call; each is reported once."""
        out = list(self._warnings)
        self._warnings.clear()  # in place: the artifact store appends to this same list
        return out

    def utility(self, key: str, job: Any, compute: Compute | None = None) -> tuple[dict, bool]:
        """(value, came_from_cache) of the utility run with this key; `compute(job)` makes it on a miss
        (None: read the cache only, a miss is an error)."""
        return self._get("utility", key, job, compute)

    def attack(self, key: str, job: Any, compute: Compute | None = None) -> tuple[dict, bool]:
        """(value, came_from_cache) of the attack run with this key; see `utility`."""
        return self._get("attack", key, job, compute)

    def derived(self, key: str, compute: Callable[[], dict]) -> tuple[dict, bool]:
        """(value, came_from_cache) of a run's derived columns with this key (`fedbench.execution.derived`,
        whose key holds everything they are computed from); `compute()` makes them on a miss and with
        `force`. Not locked: a derived value costs little, and two processes store the same value."""
        return self._keyed("derived", key, compute, _check_derived)

    def summary(self, key: str, compute: Callable[[], dict]) -> tuple[dict, bool]:
        """(value, came_from_cache) of what `fedbench run` prints after its runs, with this key
        (`fedbench.reporting.run_summary`, whose key holds everything it is computed from); as `derived`."""
        return self._keyed("summary", key, compute, _check_summary)

    def _keyed(
        self, what: str, key: str, compute: Callable[[], dict], check: Callable[[Any], None]
    ) -> tuple[dict, bool]:
        """A value stored under a key that names everything it is computed from (`derived`, `summary`:
        the memoised function `self._<what>`)."""
        if self._memory is None:
            return compute(), False
        func = getattr(self, f"_{what}")
        if self.force:
            return func.call(key, compute)[0], False
        return _load_or_compute(func, (key, compute), what, key, self._warnings, check)

    def has_utility(self, key: str) -> bool:
        return self._has("utility", key)

    def has_attack(self, key: str) -> bool:
        return self._has("attack", key)

    def info(self) -> CacheInfo:
        return cache_info(self.location) if self.location is not None else CacheInfo("None", 0, 0, 0)

    def clear(self) -> list[str]:
        """Delete every cached run; see `clear_cache`."""
        return clear_cache(self.location) if self.location is not None else []


def _store(location: Path) -> Path:
    """Where fedbench's joblib.Memory keeps its entries: `<location>/joblib/fedbench`."""
    return location / JOBLIB_DIR / "fedbench"


_LEGACY_MODULE = "fedbench.cache"  # where the cached functions lived before fedbench.execution


def cache_info(location: str | Path) -> CacheInfo:
    """What the cache at `location` holds; reads only (writes no marker, changes no permission).

    A missing or empty folder holds nothing; a folder that is not a fedbench cache raises NotACacheError.
    """
    location = Path(location)
    if not location.exists() or (location.is_dir() and not any(location.iterdir())):
        return CacheInfo(str(location), 0, 0, 0)
    if not is_cache_dir(location):
        raise not_a_cache(location)
    owned = [_store(location), location / DATA_DIR]
    size = sum(p.stat().st_size for root in owned if root.exists() for p in root.rglob("*") if p.is_file())

    def entries(func: Callable) -> int:
        """joblib keeps a function's entries under its dotted path; fedbench < 0.2 kept this module at
        `fedbench.cache`, and its entries still count (and are served by that version)."""
        total = 0
        for module in dict.fromkeys((func.__module__, _LEGACY_MODULE)):
            folder = location / JOBLIB_DIR / Path(*module.split(".")) / func.__name__
            total += sum(1 for d in folder.iterdir() if d.is_dir()) if folder.is_dir() else 0
        return total

    return CacheInfo(str(location), entries(_utility_entry), entries(_attack_entry), size)


def clear_cache(location: str | Path) -> list[str]:
    """Delete fedbench's entries in the cache at `location`: the run and artifact store
    (`joblib/fedbench`), the prepared datasets (fedbench's `data/*.npz`) and the run locks
    (`locks/*.lock`: a lock's holder removes its file, so those are left by processes that died).
    Everything else stays: the marker, joblib's `.gitignore`, and any file fedbench did not write (their
    names are returned).

    A folder that is neither a fedbench cache nor empty raises NotACacheError and nothing is deleted.
    """
    location = Path(location)
    if not location.exists() or (location.is_dir() and not any(location.iterdir())):
        return []
    if not is_cache_dir(location):
        raise not_a_cache(location)
    open_cache_dir(location)  # an older fedbench's cache gets its marker: it stays a cache once emptied
    store, data, locks = _store(location), location / DATA_DIR, location / LOCKS_DIR
    if store.exists():
        shutil.rmtree(store)
    for folder, ours in ((data, is_data_file), (locks, _is_lock_file)):
        if folder.is_dir():
            for p in folder.iterdir():
                if p.is_file() and ours(p.name):
                    p.unlink()
    for folder in (location / JOBLIB_DIR, data, locks):  # removed when nothing else is left in them
        try:
            folder.rmdir()
        except OSError:
            pass
    ours = {location / CACHE_MARKER, location / ".gitignore"}
    files = sorted(p for p in location.rglob("*") if p.is_file() and p not in ours)
    return [str(p.relative_to(location)) for p in files]


def _is_lock_file(name: str) -> bool:
    """Whether a file name in `<cache>/locks` is a run lock fedbench writes there."""
    return name.endswith(LOCK_SUFFIX) and name.split("-", 1)[0] in ("utility", "attack")


@dataclass(frozen=True)
class PruneReport:
    """What `prune_stale` did (or, without `remove`, would do) in the cache at `location`.

    `stale` entries were computed by code that has changed since (their stored digests differ from the
    code loaded now): removed, freeing `stale_bytes`. Left: `busy` stale entries whose lock another
    process held (it is computing or rewriting them), `fresh` entries (computed by the code loaded now,
    or from before digests were stored: they are served), and `unchecked` ones (a plugin not loaded in
    this process, such as a `--plugin` file's; an unreadable entry, which is recomputed when used).
    """

    location: str
    stale: int
    stale_bytes: int
    busy: int
    fresh: int
    unchecked: int


def prune_stale(location: str | Path, remove: bool = True) -> PruneReport:
    """Delete the run entries of the cache at `location` whose code changed; nothing else.

    Such an entry is never served again by this code (it would be recomputed, with a warning), but it
    stays on disk until then. An entry is deleted while this process holds its run lock, taken without
    waiting, and after checking it again under the lock; one whose lock another process holds is left
    (`busy`). Artifacts are not checked: an artifact entry records the digest of its code, not which
    code that is (each is recomputed when next used if stale). `remove=False` only counts.

    A folder that is neither a fedbench cache nor empty raises NotACacheError; a missing one holds nothing.
    """
    location = Path(location)
    counts = dict.fromkeys(("stale", "stale_bytes", "busy", "fresh", "unchecked"), 0)
    if location.exists() and any(location.iterdir()):
        if not is_cache_dir(location):
            raise not_a_cache(location)
        for what, func in (("utility", _utility_entry), ("attack", _attack_entry)):
            folder = location / JOBLIB_DIR / Path(*func.__module__.split(".")) / func.__name__
            entries = sorted(d for d in folder.iterdir() if d.is_dir()) if folder.is_dir() else []
            for entry in entries:
                verdict, key = _entry_verdict(entry, what)
                if verdict != "stale" or not remove:
                    counts[verdict] += 1
                    counts["stale_bytes"] += _size(entry) if verdict == "stale" else 0
                    continue
                with exclusive_if_free(lock_path(location, what, _run_id(key))) as held:
                    verdict = _entry_verdict(entry, what)[0] if held else "busy"  # again, under the lock
                    size = _size(entry) if verdict == "stale" else 0
                    if verdict == "stale":
                        shutil.rmtree(entry)
                counts[verdict] += 1
                counts["stale_bytes"] += size
    return PruneReport(str(location), **counts)


def _entry_verdict(entry: Path, what: str) -> tuple[str, str]:
    """("stale" | "fresh" | "unchecked", the entry's key) of a run entry folder of the joblib store."""
    import ast
    import json

    import joblib

    from fedbench.execution.sources import changed_code

    try:
        meta = json.loads((entry / "metadata.json").read_text(encoding="utf-8"))
        key = ast.literal_eval(meta["input_args"]["key"])  # joblib stores the repr of each argument
        spec = _plugins_of(json.loads(key))
        value = joblib.load(entry / "output.pkl")
    except Exception:  # half-written, damaged, or a plugin that is not loaded here: not this command's
        return "unchecked", ""
    if not isinstance(value, dict):
        return "unchecked", key
    return ("stale" if changed_code(spec, value.get("code"), attack=what == "attack") else "fresh"), key


def _plugins_of(key: dict[str, Any]) -> Any:
    """The plugin names of a run key, as `changed_code` reads them from a spec (`spec.defense.name`), the
    parameters left unchecked (a parameter a plugin no longer has changes no digest)."""
    from types import SimpleNamespace

    from fedbench.registry import registry_for

    def part(kind: str) -> Any:
        name = key[kind]["name"] if key.get(kind) else None
        return SimpleNamespace(kind=kind, name=registry_for(kind).get(name).name) if name else None

    return SimpleNamespace(**{kind: part(kind) for kind in ("dataset", "model", "defense", "attack")})


def _size(folder: Path) -> int:
    try:
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    except OSError:  # rewritten or removed meanwhile by a run of another process
        return 0
