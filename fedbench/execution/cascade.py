"""The attack cascade of a board (`[grid.suite] cascade`): AutoAttack's evaluation order for a suite.

Within one FL training (a defense x seed: one utility group of the grid), the suite's attacks run one
after another, cheapest first as the preset lists them, and each covers only the victims that no attack
before it re-identified (AutoAttack runs each of its attacks only on the points still robust; Croce &
Hein, ICML 2020). A victim counts as re-identified when every one of its inputs scored the maximum of
the board's primary rate (`reid` = 1). A run left with no victim is not run: a `skipped` record says why.

Why it is exact for the board's number: the primary is the worst case per input over the suite (design
§7.1), and an input already at the metric's maximum cannot be raised by a later attack. What it does
change: a later attack's own rate on a defended row covers only the inputs left to it, so per-attack
numbers of such rows are not the attack's success rate alone. `none` is never cascaded: it runs every
attack on every input, the per-attack reference (the realistic protocol's textbook column reads it).

Order: the attacks `order` names, in that order; then the suite's other plain attacks in grid order;
then the adaptive attacks (each defense's own adaptive attack goes last, so the board's rate without
adaptive attacks is exact too). Runs of one training that observe different things (another observation
point or round) never narrow each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedbench.spec.applicability import adapts_to

if TYPE_CHECKING:
    from fedbench.execution.record import RunRecord
    from fedbench.spec.run import RunSpec

EXEMPT = ("none",)  # defenses whose rows run every attack on every input (the per-attack reference)
SUCCESS = 1.0 - 1e-9  # a 0/1 rate's value that counts as re-identified


@dataclass(frozen=True)
class Cascade:
    """A board's cascade: the attack names that run first (`order`) and the 0/1 primary that decides
    which victims are done."""

    order: tuple[str, ...]
    primary: str

    def rank(self, spec: RunSpec) -> tuple[int, int]:
        """Where `spec`'s attack runs among its training's runs: named ones, other plain ones, adaptive."""
        name = spec.attack.name if spec.attack is not None else ""
        if name in self.order:
            return (0, self.order.index(name))
        return (2, 0) if spec.attack is not None and adapts_to(name) else (1, 0)

    def sort_group(self, indices: Sequence[int], specs: Sequence[RunSpec]) -> list[int]:
        """One training's runs in cascade order (stable: grid order within a rank)."""
        return sorted(indices, key=lambda i: self.rank(specs[i]))

    def narrows(self, spec: RunSpec) -> bool:
        return spec.attack is not None and spec.defense.name not in EXEMPT

    def done_victims(self, spec: RunSpec, record: RunRecord | None) -> set[int]:
        """The victims `record` (a finished run of `spec`) re-identified on all of their inputs."""
        if record is None or record.status != "ok" or not record.per_image:
            return set()
        values = record.per_image.get(self.primary)
        victims = spec.victim_clients
        if not values or len(values) % len(victims):
            return set()
        per = len(values) // len(victims)
        return {
            v
            for k, v in enumerate(victims)
            if all(x is not None and x >= SUCCESS for x in values[k * per : (k + 1) * per])
        }

    def left(self, spec: RunSpec, earlier: Sequence[tuple[RunSpec, RunRecord | None]]) -> tuple[int, ...]:
        """The victims of `spec` that no earlier run of its training on the same observation re-identified."""
        seen = _observation(spec)
        done: set[int] = set()
        for other, record in earlier:
            if _observation(other) == seen:
                done |= self.done_victims(other, record)
        return tuple(v for v in spec.victim_clients if v not in done)


def _observation(spec: RunSpec):
    """What a run's attacker looks at, its victims aside (observation point and round)."""
    return spec.scenario.replace(victim=0)


SKIP_PREFIX = "cascade: "


def cascade_skipped(record: RunRecord) -> bool:
    """Whether `record` is a run the cascade left unrun (nothing left to attack), not a failure."""
    return record.status == "skipped" and str(record.get("reason", "")).startswith(SKIP_PREFIX)


def skip_reason(attack: str, victims: Sequence[int]) -> str:
    shown = ", ".join(map(str, victims))
    return (
        f"{SKIP_PREFIX}every input of victims {shown} was re-identified by an earlier attack of the suite, "
        f"so {attack} cannot raise the board's worst case"
    )
