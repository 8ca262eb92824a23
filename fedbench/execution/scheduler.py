"""One loop that runs a grid's runs in worker processes: loky workers on this machine, or Ray tasks.

Order: the first run of each utility group is ready at once; a group's next run becomes ready when the
one before it has finished (the group's FL training is then in the cache, so it is computed once); of
the ready runs the lowest grid index starts first, at most `capacity` in flight.

Faults: a run whose worker process died (the kernel's OOM killer, a crash in native code, a lost Ray node)
may only have been in flight beside the culprit, so it is retried alone once every other run in flight
has ended; the run that kills its worker again becomes a `failed` record, never a hung grid. A task that
raised (the runner's `execute` never does for a run, so the backend failed to run it) is a `failed` record
with the error. `finish(i, record)` returning True (fail-fast) stops the grid, and so does Ctrl-C (the
KeyboardInterrupt propagates; the runner turns it into `GridInterrupted`): either way the runs in flight
are cancelled and their workers stopped.

The backends differ only in what the adapters `LokyWorkers` and `RayTasks` do: submit a run, wait for one
to end, read how it ended (`Outcome`), cancel the runs in flight. Each is opened by a context manager
(`loky_workers`, `ray_tasks`) that sets its workers up (threads, Ray's resources) and builds the task they
run with `make_task(ctx)`: a picklable callable `spec -> RunRecord` from the runner, so this module runs
runs without knowing how one executes. Placement (GPUs, starting Ray) is `fedbench.execution.placement`'s.
"""

from __future__ import annotations

import dataclasses
import heapq
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from fedbench.execution.placement import default_threads, ray_module, ray_start, task_resources
from fedbench.execution.record import RunRecord, failed_record

if TYPE_CHECKING:
    from fedbench.execution.runner import RunContext
    from fedbench.spec.run import RunSpec

DIED = "worker process died while running it (out of memory or a crash in native code)"

Task = Callable[["RunSpec"], RunRecord]  # one run in a worker; picklable
MakeTask = Callable[["RunContext"], Task]  # the task for the workers' context
Finish = Callable[[int, RunRecord], bool]  # a run ended; True stops the grid
Prepare = Callable[[int], RunRecord | None]  # before a run starts: None, or the record it ends with unrun


@dataclass(frozen=True)
class WorkerDied:
    """The worker process running the task died under it."""

    detail: str = ""  # what the backend knows of how, e.g. "; exit code {...}"


@dataclass(frozen=True)
class TaskRaised:
    """The task raised instead of returning a record."""

    error: BaseException


Outcome = RunRecord | WorkerDied | TaskRaised


class Workers(Protocol):
    """A backend adapter: what the scheduling loop needs of loky or Ray."""

    capacity: int  # at most this many runs in flight

    def submit(self, spec: RunSpec, alone: bool) -> Any:
        """Start one run; returns its handle. `alone`: a retry that must not share a worker pool."""
        ...

    def wait(self, handles: list[Any]) -> list[Any]:
        """Block until at least one run in flight has ended; the handles of those that have."""
        ...

    def outcome(self, handle: Any) -> Outcome:
        """How an ended run ended. Re-raises KeyboardInterrupt."""
        ...

    def cancel(self, handles: list[Any]) -> None:
        """Stop the runs in flight and their workers (fail-fast, Ctrl-C)."""
        ...


def run_on_workers(
    specs: list[RunSpec],
    groups: list[list[int]],
    ctx: RunContext,
    n_jobs: int,
    make_task: MakeTask,
    finish: Finish,
    prepare: Prepare | None = None,
) -> None:
    """Run the grid on the backend `ctx.backend` names; `groups` are the grid indices per utility group."""
    open_workers = ray_tasks if ctx.backend == "ray" else loky_workers
    with open_workers(ctx, n_jobs, len(specs), make_task) as workers:
        schedule(specs, groups, workers, finish, prepare)


def schedule(
    specs: list[RunSpec],
    groups: list[list[int]],
    workers: Workers,
    finish: Finish,
    prepare: Prepare | None = None,
) -> None:
    """The scheduling loop (see the module docstring); returns when every run ended or `finish` says stop.

    `prepare(i)`, called as run i is about to start (its group's earlier runs have finished), may
    change `specs[i]` (the attack cascade narrows its victims) or return the record it ends with unrun.
    """
    following = {g[k]: g[k + 1] for g in groups for k in range(len(g) - 1)}
    ready = [g[0] for g in groups]
    heapq.heapify(ready)
    suspects: list[int] = []  # in flight when their worker died: each is retried alone
    retried: set[int] = set()
    in_flight: dict[Any, int] = {}
    alone = False
    try:
        while ready or suspects or in_flight:
            if suspects and not in_flight:
                i = suspects.pop(0)
                retried.add(i)
                alone = True
                in_flight[workers.submit(specs[i], alone=True)] = i
            elif not suspects:
                alone = False
                while ready and len(in_flight) < workers.capacity:
                    i = heapq.heappop(ready)
                    early = prepare(i) if prepare is not None else None
                    if early is not None:  # ends unrun: its group's next run is ready at once
                        if i in following:
                            heapq.heappush(ready, following[i])
                        if finish(i, early):
                            return
                        continue
                    in_flight[workers.submit(specs[i], alone=False)] = i
            if not in_flight:  # every run started ended unrun (`prepare`): its followers are ready
                continue
            for handle in sorted(workers.wait(list(in_flight)), key=in_flight.__getitem__):
                i = in_flight.pop(handle)
                outcome = workers.outcome(handle)
                if isinstance(outcome, WorkerDied):
                    if not (alone or i in retried):
                        suspects.append(i)
                        continue
                    record = failed_record(specs[i], DIED + outcome.detail)
                elif isinstance(outcome, TaskRaised):
                    record = failed_record(specs[i], f"{type(outcome.error).__name__}: {outcome.error}")
                else:
                    record = outcome
                if i in following:
                    heapq.heappush(ready, following[i])
                if finish(i, record):
                    return
    finally:
        if in_flight:
            workers.cancel(list(in_flight))


# ------------------------------------------------------------------------------------------- loky


@contextmanager
def loky_workers(ctx: RunContext, n_jobs: int, n_runs: int, make_task: MakeTask) -> Iterator[LokyWorkers]:
    """Up to `n_jobs` loky workers, each with torch threads `--threads` or its share of the free cores."""
    capacity = min(n_jobs, n_runs)
    threads = ctx.threads or default_threads(capacity)
    yield LokyWorkers(capacity, make_task(dataclasses.replace(ctx, threads=threads)))


class LokyWorkers:
    """Runs in the processes of joblib's reusable loky executor.

    A worker that dies breaks the whole pool: every run in flight ends with BrokenProcessPool (they are
    the suspects the loop retries alone, on a pool of one worker). The pool outlives a finished grid (its
    idle workers exit after 60 s), so the next grid of this process starts warm. Workers die with this
    process (`die_with_parent`): a `kill -9` of fedbench leaves no orphan computing for minutes.
    """

    def __init__(self, capacity: int, task: Task):
        self.capacity = capacity
        self._task = task
        self._executor: Any = None

    def submit(self, spec: RunSpec, alone: bool) -> Any:
        from joblib.externals.loky import get_reusable_executor

        self._executor = get_reusable_executor(
            max_workers=1 if alone else self.capacity,
            timeout=60,
            initializer=die_with_parent,
            initargs=(os.getpid(),),
        )
        return self._executor.submit(self._task, spec)

    def wait(self, handles: list[Any]) -> list[Any]:
        from concurrent.futures import FIRST_COMPLETED, wait

        done, _ = wait(handles, return_when=FIRST_COMPLETED)
        if any(_broken(f.exception()) for f in done):
            done, _ = wait(handles)  # the pool is broken: every run in flight ends now
        return list(done)

    def outcome(self, handle: Any) -> Outcome:
        exc = handle.exception()
        if _broken(exc):
            codes = re.search(r"exit codes of the workers are (\{[^}]*\})", str(exc))
            return WorkerDied(f"; exit code {codes.group(1)}" if codes else "")
        if isinstance(exc, KeyboardInterrupt):
            raise KeyboardInterrupt
        return TaskRaised(exc) if exc is not None else handle.result()

    def cancel(self, handles: list[Any]) -> None:
        for fut in handles:
            fut.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=False, kill_workers=True)


PARENT_POLL_S = 0.5  # how often a worker checks that the fedbench process that started it is alive


def die_with_parent(parent: int) -> None:
    """Worker initialiser: end this worker as soon as `parent` (the fedbench process) is gone.

    A parent killed with SIGKILL runs no cleanup, and loky's workers would go on computing their runs for
    minutes, holding cores and memory. A daemon thread polls the parent pid (the worker is re-parented
    when it dies) and exits the worker at once. A thread, not `prctl(PR_SET_PDEATHSIG)`: that signal
    fires when the *thread* that spawned the worker ends, which loky's manager thread may do while
    fedbench lives, and it exists only on Linux.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)  # no cleanup to run: the results would have nowhere to go

    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=watch, name="fedbench-parent-watch", daemon=True).start()


def _broken(exc: BaseException | None) -> bool:
    from joblib.externals.loky.process_executor import BrokenProcessPool

    return isinstance(exc, BrokenProcessPool)


# -------------------------------------------------------------------------------------------- Ray


@contextmanager
def ray_tasks(ctx: RunContext, n_jobs: int, n_runs: int, make_task: MakeTask) -> Iterator[RayTasks]:
    """Ray tasks on the cluster at `ctx.address` (or a local one, shut down after the grid).

    At most `n_jobs` runs are in flight when n_jobs > 1; otherwise the cluster's free resources decide.
    """
    ray = ray_module()
    started = ray_start(ray, ctx.address)
    try:
        tctx, cpus, gpus = task_resources(ray, ctx)
        yield RayTasks(ray, make_task(tctx), cpus, gpus, n_jobs if n_jobs > 1 else n_runs)
    finally:
        if started:
            ray.shutdown()


class RayTasks:
    """Runs as Ray tasks, each asking for `cpus` CPUs and `gpus` GPUs (Ray sets the visible device).

    Ray itself retries no task (max_retries=0): a task whose worker died is retried by the scheduling
    loop, alone, like a loky run, so both backends treat a dying run the same way.
    """

    def __init__(self, ray: Any, task: Task, cpus: float, gpus: float, capacity: int):
        self.capacity = capacity
        self._ray = ray
        self._task = task
        self._remote = ray.remote(_run_task).options(num_cpus=cpus, num_gpus=gpus, max_retries=0)

    def submit(self, spec: RunSpec, alone: bool) -> Any:  # alone: the loop keeps nothing else in flight
        return self._remote.remote(self._task, spec)

    def wait(self, handles: list[Any]) -> list[Any]:
        done, _ = self._ray.wait(handles, num_returns=1)
        return list(done)

    def outcome(self, handle: Any) -> Outcome:
        errors = self._ray.exceptions
        try:
            return self._ray.get(handle)
        except errors.RayTaskError as exc:  # the task raised
            return TaskRaised(exc.cause if getattr(exc, "cause", None) is not None else exc)
        except errors.RayError:  # its worker process or its node died
            return WorkerDied()

    def cancel(self, handles: list[Any]) -> None:
        for ref in handles:
            self._ray.cancel(ref, force=True)


def _run_task(task: Task, spec: RunSpec) -> RunRecord:
    """The Ray task: one run (Ray makes remote functions, not remote callable objects)."""
    return task(spec)
