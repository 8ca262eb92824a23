"""Progress of a grid as plain lines, for logs: stderr redirected to a file (CI, nohup, a batch job).

On a terminal `fedbench run` draws a progress bar; a file gets no bar (rich draws it only at the end),
so a long grid would write nothing for hours. `LogLines` writes one line per computed, failed or
timed-out run instead, the moment it finishes:

    [37/216] done 12.4 s  recup-fl[eps=0.001] x attribute-inference[adversary=svm] seed 2
    [38/216] failed 0.3 s  test-fail x - seed 0: RuntimeError: broken defense

Runs served from the cache and skipped runs take milliseconds each, and a resumed grid of thousands
would flood the log: they are counted and summed up in one line at most every `CACHED_EVERY_S`
seconds, and once more when the grid ends (`[200/216] 150 cached, 3 skipped`). Each warning is written
once, as on a terminal.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedbench.execution.runner import RunEvent
    from fedbench.spec.run import RunSpec

#: Seconds between two summary lines of cached and skipped runs.
CACHED_EVERY_S = 5.0
QUIET = ("cached", "skipped")  # statuses summed up rather than written one line each


class LogLines:
    """An `on_event` callback writing a grid's progress as plain lines to `console` (see the module).

    `specs` are the grid's runs: a line names a run's dataset and model only when the grid has several.
    `prefix` starts every line (a board's name; a warning line: `warning: PREFIX...`). `clock` is
    injectable for tests.
    """

    def __init__(
        self,
        console: Any,
        specs: Sequence[RunSpec],
        prefix: str = "",
        every: float = CACHED_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._console = console
        self._prefix = prefix
        self._every = every
        self._clock = clock
        self._last = clock()  # when the last summary line was written (or the grid started)
        self._pending: Counter = Counter()  # cached and skipped runs not yet summed up
        self._index = 0
        self._total = len(specs)
        self._stated: set[str] = set()
        self._datasets = len({s.dataset.label for s in specs}) > 1
        self._models = len({s.model.label for s in specs}) > 1

    def __call__(self, event: RunEvent) -> None:
        self._index, self._total = event.index, event.total
        status = event.status
        if status in QUIET:
            self._pending[status] += 1
            if self._clock() - self._last >= self._every:
                self._summary()
        else:
            self._line(f"{status}{_seconds(event.record.get('seconds'))}  {self.label(event.spec)}", event)
        for message in event.record.warnings:
            if message not in self._stated:  # e.g. "LPIPS unavailable", once, not once per run
                self._stated.add(message)
                self._console.print(f"warning: {self._prefix}{message}", highlight=False, soft_wrap=True)

    def close(self) -> None:
        """The grid ended: sum up the cached and skipped runs not written yet."""
        if self._pending:
            self._summary()

    def label(self, spec: RunSpec) -> str:
        """`defense x attack seed N`, after `dataset/model` when the grid has several of either."""
        shown = [spec.dataset.label] if self._datasets else []
        shown += [spec.model.label] if self._models else []
        where = "/".join(shown) + " " if shown else ""
        attack = spec.attack.label if spec.attack else "-"
        return f"{where}{spec.defense.label} x {attack} seed {spec.seed}"

    def _line(self, text: str, event: RunEvent) -> None:
        reason = str(event.record.get("reason") or "")
        if event.record.status != "ok" and reason:
            text += ": " + reason.strip().splitlines()[0][:300]
        self._write(f"[{event.index}/{event.total}] {text}")

    def _summary(self) -> None:
        counts = ", ".join(f"{self._pending[s]} {s}" for s in QUIET if self._pending[s])
        self._write(f"[{self._index}/{self._total}] {counts}")
        self._pending.clear()
        self._last = self._clock()

    def _write(self, text: str) -> None:
        self._console.print(self._prefix + text, highlight=False, markup=False, soft_wrap=True)


def _seconds(value: Any) -> str:
    """` 12.4 s`, or nothing when the run has no time (a worker that died)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return ""
    return f" {seconds:.1f} s" if math.isfinite(seconds) else ""
