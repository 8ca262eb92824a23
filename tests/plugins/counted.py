"""A defense and an attack that count their computations, for the concurrency test (tests/test_run_locks.py).

Each appends one line to the file named by `FEDBENCH_TEST_COUNTER`: the defense `test-counted` when a
training (a utility run) reaches its last round (an attack run's simulation stops at the observation,
round 0, so it never gets there), the attack `test-counted-fc` (fc-leakage) each time it runs. When
`FEDBENCH_TEST_PROCESSES` is set, a training waits (up to 20 s) until that many processes have loaded
this file, so concurrent `fedbench run` processes really overlap.

Load it with `--plugin tests/plugins/counted.py`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from fedbench.attacks.fc_leakage import FCLeakage
from fedbench.plugin import Defense
from fedbench.registry import register_attack, register_defense
from fedbench.spec.params import param


def _count(line: str) -> None:
    path = os.environ.get("FEDBENCH_TEST_COUNTER")
    if path:
        with open(path, "a") as fh:  # one short append: lines of concurrent processes never mix
            fh.write(f"{line} {os.getpid()}\n")


def _started() -> Path | None:
    path = os.environ.get("FEDBENCH_TEST_COUNTER")
    return Path(path + ".started") if path else None


if (_marker := _started()) is not None:
    with open(_marker, "a") as _fh:
        _fh.write(f"{os.getpid()}\n")


def _wait_for_the_others() -> None:
    want, marker = int(os.environ.get("FEDBENCH_TEST_PROCESSES") or 0), _started()
    deadline = time.monotonic() + 20
    while want and marker is not None and time.monotonic() < deadline:
        if len(set(marker.read_text().split())) >= want:
            return
        time.sleep(0.05)


@register_defense("test-counted")
class Counted(Defense):
    """No defense; counts each training it is part of."""

    @dataclass(frozen=True)
    class Params:
        tag: int = param(0, "tells otherwise equal trainings apart", min=0)

    def update(self, delta, ctx):
        if ctx.round == ctx.scenario.rounds - 1 and ctx.client == 0:
            _wait_for_the_others()
            _count(f"utility tag={self.params.tag}")
            time.sleep(0.3)  # the other process reaches this run's lock meanwhile
        return delta


@register_attack("test-counted-fc")
class CountedFC(FCLeakage):
    """fc-leakage; counts each time it runs."""

    def run(self, observation, model, meta, generator, device):
        _count(f"attack matching={self.params.matching}")
        return super().run(observation, model, meta, generator, device)
