"""Shared helpers of the benchmarks: timing, peak memory, device choice, JSON output and target checks.

Every benchmark reports ratios against a baseline measured in the same run, so its figures hold on a
noisy shared machine, plus the peak memory of each measured thing:

- in-process on CPU: the peak resident set (RSS) above the RSS just before the call, sampled every
  2 ms by a thread; free heap memory is returned to the OS first (`malloc_trim`) so memory the
  allocator kept from an earlier call does not hide a new peak;
- in-process on a GPU: `torch.cuda.max_memory_allocated` during the call;
- a subprocess (CLI, grids): the child's peak RSS from `os.wait4` (the largest process; loky workers
  are their own processes and report through their rows' `peak_rss_mb`).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def rss_mb() -> float:
    """Current resident set of this process (MB); Linux /proc, else the peak from getrusage."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def _trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_memory_mb(fn: Callable[[], Any], device: str = "cpu") -> float:
    """Peak memory (MB) that one call of `fn` adds: GPU allocations on cuda, sampled RSS on CPU."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    _trim()
    start = rss_mb()
    peak = [start]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb())
            time.sleep(0.002)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    return max(peak[0], rss_mb()) - start


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def timeit_interleaved(fns: list[Callable[[], Any]], repeats: int, warmup: int = 2, device: str = "cpu"):
    """Fastest of `repeats` calls of each function (seconds), the functions called round-robin so
    that load from other processes on a shared CPU falls on all of them alike."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    sync(device)
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            sync(device)
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def pick_device(requested: str = "auto") -> str:
    """'auto' -> cuda when visible: on a machine with a GPU the suite reports GPU figures."""
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class ChildRun:
    """A finished command: wall seconds, CPU seconds (user + system, from `os.wait4`: the child's own,
    so time the scheduler gives other jobs on a busy machine is not in it), peak RSS (MB), stdout."""

    wall: float
    cpu: float
    peak_mb: float
    stdout: str


def run_child_usage(args: list[str], env: dict[str, str] | None = None) -> ChildRun:
    """Run a command; raises on failure. The child is reaped with `os.wait4`, which returns that
    child's own resource usage."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}:\n{err.read()[-2000:]}")
        peak = usage.ru_maxrss / 2**20 if sys.platform == "darwin" else usage.ru_maxrss / 1024
        return ChildRun(seconds, usage.ru_utime + usage.ru_stime, peak, out.read())


def run_child(args: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Run a command; (wall seconds, the child's peak RSS in MB, its stdout). Raises on failure."""
    run = run_child_usage(args, env)
    return run.wall, run.peak_mb, run.stdout


def environment(device: str, quick: bool, threads: int | None = None) -> dict[str, Any]:
    import torch

    env = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "device": device,
        "quick": quick,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if threads is not None:
        env["threads"] = threads
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def check(what: str, value: float, target: str, ok: bool) -> dict[str, Any]:
    """One must-show line of the summary: the measured value against its target."""
    return {"what": what, "value": value, "target": target, "ok": bool(ok)}


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump(payload, fh, indent=1, default=float)


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
