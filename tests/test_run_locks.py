"""Issue 20: concurrent grids on one cache compute each shared run once (`fedbench.execution.locks`)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from fedbench.execution.cache import RunCache, clear_cache
from fedbench.execution.locks import LOCKS_DIR, exclusive, lock_path
from fedbench.reporting.results import newest_results, read_results

ROOT = Path(__file__).resolve().parents[1]
COUNTED = ROOT / "tests" / "plugins" / "counted.py"
VOLATILE = {"seconds", "utility_seconds", "attack_seconds", "peak_rss_mb", "created_at", "from_cache"}
# 2 trainings (tag 0, 1), each shared by 2 attack runs (matching best, one-to-one)
GRID = [
    "run",
    "smoke",
    "--plugin",
    str(COUNTED),
    "-D",
    "test-counted[tag=[0,1]]",
    "-a",
    'test-counted-fc[matching=["best","one-to-one"]]',
    "--threads",
    "1",
    "--device",
    "cpu",
    *(
        a
        for s in ("rounds=2", "clients=2", "local_steps=2", "batch_size=4", "train_size=40", "test_size=20")
        for a in ("--set", f"scenario.{s}")
    ),
]


def _env(counter: Path, processes: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(ROOT),
        FEDBENCH_TEST_COUNTER=str(counter),
        FEDBENCH_TEST_PROCESSES=str(processes),
    )
    return env


def _stable(path: Path) -> pd.DataFrame:
    frame = read_results(path)
    keep = [c for c in frame.columns if c not in VOLATILE]
    return frame[keep].sort_values("run_id").reset_index(drop=True)


def test_two_concurrent_grids_compute_each_shared_run_once(tmp_path):
    cache, counter = tmp_path / "cache", tmp_path / "count"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "fedbench", *GRID, "-o", tmp_path / f"o{k}", "--cache-dir", cache],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(counter, 2),
        )
        for k in range(2)
    ]
    for proc in procs:
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
    lines = counter.read_text().splitlines()
    computed = Counter(line.rsplit(" ", 1)[0] for line in lines)
    assert computed == {  # once each, whichever process computed it
        "utility tag=0": 1,
        "utility tag=1": 1,
        "attack matching=best": 2,  # one per training
        "attack matching=one-to-one": 2,
    }, lines
    a, b = (_stable(newest_results(tmp_path / f"o{k}")) for k in range(2))
    assert len(a) == 4 and set(a["status"]) == {"ok"}
    pd.testing.assert_frame_equal(a, b)
    assert not list((cache / LOCKS_DIR).iterdir())  # each holder removed its lock file


def test_a_waiting_cache_loads_the_entry_the_lock_holder_wrote(tmp_path):
    """In one process, two RunCache objects on one folder: the second waits, then loads, never computes."""
    first, second = RunCache(tmp_path / "c"), RunCache(tmp_path / "c")
    started, results = threading.Event(), {}

    def slow(job):
        started.set()
        time.sleep(0.3)
        return {"seconds": 0.3, "value": 1}

    def never(job):
        raise AssertionError("computed twice")

    holder = threading.Thread(target=lambda: results.update(first=first.utility("k", None, slow)))
    holder.start()
    assert started.wait(10)
    results["second"] = second.utility("k", None, never)  # blocks on the lock until `slow` has stored
    holder.join(10)
    assert results["first"] == ({"seconds": 0.3, "value": 1}, False)
    assert results["second"] == ({"seconds": 0.3, "value": 1}, True)


def test_a_lock_held_by_a_dead_process_does_not_block(tmp_path):
    path = lock_path(tmp_path, "utility", "0123456789abcdef")
    code = (
        "import sys, time\nfrom pathlib import Path\nfrom fedbench.execution.locks import exclusive\n"
        "with exclusive(Path(sys.argv[1])):\n    print('held', flush=True)\n    time.sleep(60)\n"
    )
    env = _env(tmp_path / "unused", 0)
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        fd = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):  # the lock is real while its holder lives
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        holder.kill()  # SIGKILL: no cleanup runs, the lock file stays behind
        holder.wait(10)
    assert path.exists()
    acquired = threading.Event()

    def take() -> None:
        with exclusive(path):
            acquired.set()

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    assert acquired.wait(5), "a dead process's lock blocked"
    taker.join(5)
    assert not path.exists()


def test_the_lock_is_released_when_the_computation_raises(tmp_path):
    cache = RunCache(tmp_path / "c")

    def broken(job):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        cache.utility("k", None, broken)
    path = lock_path(tmp_path / "c", "utility", cache_run_id("k"))
    assert not path.exists()
    with exclusive(path):  # free at once
        pass
    assert cache.utility("k", None, lambda job: {"seconds": 0.0}) == ({"seconds": 0.0}, False)


def test_no_cache_takes_no_lock_and_cache_clear_removes_dead_locks(tmp_path):
    assert RunCache(None).utility("k", None, lambda job: {"seconds": 0.0}) == ({"seconds": 0.0}, False)
    RunCache(tmp_path / "c")
    stale = lock_path(tmp_path / "c", "attack", cache_run_id("k"))
    stale.parent.mkdir()
    stale.touch()  # left by a process that died holding it
    assert clear_cache(tmp_path / "c") == []  # removed, not listed as a file fedbench did not write
    assert not (tmp_path / "c" / LOCKS_DIR).exists()


def cache_run_id(key: str) -> str:
    from fedbench.spec.run import short_hash

    return short_hash(key)


def test_a_cache_folder_another_process_is_creating_is_waited_for(tmp_path):
    """Two processes creating one cache: the marker exists, its text not yet; a foreign marker is refused."""
    from fedbench.errors import FedbenchError
    from fedbench.execution.paths import _MARKER_TEXT, CACHE_MARKER, open_cache_dir

    cache = tmp_path / "c"
    cache.mkdir()
    (cache / CACHE_MARKER).touch()  # the other process created it and is about to write its text
    writer = threading.Timer(0.1, lambda: (cache / CACHE_MARKER).write_text(_MARKER_TEXT))
    writer.start()
    assert open_cache_dir(cache) == cache
    writer.join()
    foreign = tmp_path / "other"
    foreign.mkdir()
    (foreign / CACHE_MARKER).write_text("Signature: 8a477f597d28d172789f06886806bc55\n# another tool\n")
    with pytest.raises(FedbenchError, match="not a fedbench cache"):
        open_cache_dir(foreign)


def test_a_waiting_cache_loads_the_artifact_the_lock_holder_wrote(tmp_path):
    """Artifacts (a LODA extractor, a RecUP zoo) are computed once too: the second store waits, then loads."""
    first, second = RunCache(tmp_path / "c"), RunCache(tmp_path / "c")
    started, results = threading.Event(), {}

    def slow():
        started.set()
        time.sleep(0.3)
        return [1, 2, 3]

    def never():
        raise AssertionError("computed twice")

    holder = threading.Thread(target=lambda: results.update(first=first.artifacts.get("zoo", "{}", slow)))
    holder.start()
    assert started.wait(10)
    assert (tmp_path / "c" / LOCKS_DIR).is_dir() and list((tmp_path / "c" / LOCKS_DIR).iterdir())
    results["second"] = second.artifacts.get("zoo", "{}", never)  # blocks until `slow` has stored it
    holder.join(10)
    assert results == {"first": [1, 2, 3], "second": [1, 2, 3]}
    assert not list((tmp_path / "c" / LOCKS_DIR).iterdir())  # the holder removed its lock file
    assert second.artifacts.get("zoo", "{}", never) == [1, 2, 3]  # a hit takes no lock
