"""The budget check of a v2 board (issue 28): would more attack budget find more?

A board is only as strong as its attacks' budgets. On a sample of cells (`none` and the best-ranked
rows by default), every optimisation attack of the suite is re-run with its iteration budget
multiplied by `factor` (2: "doubling"), on the board's own trainings, and the row's primary rate is
recomputed with the doubled attacks in place of the originals (worst case per input over the suite,
as the board takes it). The check passes for a row when the rate moves by less than the half-width of
the row's published 95 % interval: more budget would not change what the board says. If it moves
more, the board's budgets must be raised.

An attack's budget is what its `scaled_budget` says (`fedbench.plugin.Attack`): an integer `iterations`
by default; for an attack on an adaptive schedule (Inverting Gradients without `iterations`: decay on
stall, stop when converged) both the schedule's cap and its patience ("doubling both the cap and the
schedule's patience", issue 28). An attack with no budget to scale (an auto schedule that does not
declare one) is listed as not doubled.

The question is one-sided: could more budget find *more*? A row whose every input on the checked
seeds already leaks the metric's maximum (re-identified: reid 1.0) is at the ceiling: no budget can
raise it, so its attacks are not re-run and the record says so (`at_ceiling`). Re-running them would
only measure the attacks' run-to-run noise, at the price of the whole check (an hour of CPU for a
six-row FedAvg board whose rows all stand at 100 %).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedbench.reporting.board_rank import Row, worst_per_input

BUDGET_PARAM = "iterations"


@dataclass
class RowCheck:
    """One row's check: its rate with the board's budgets and with `factor` times them, on the same
    seeds; the published interval whose half-width the move must stay under."""

    defense: str
    rate: float
    doubled: float
    low: float
    high: float
    attacks: list[str] = field(default_factory=list)
    ceiling: bool = False  # every input already at the metric's maximum: not re-run

    @property
    def moved(self) -> float:
        return abs(self.doubled - self.rate)

    @property
    def passed(self) -> bool:
        return self.moved < (self.high - self.low) / 2 or self.moved == 0.0


def _on_seeds(per_input: dict[str, Any], seeds: set[str]) -> dict[str, Any]:
    return {a: {s: r for s, r in v.items() if s in seeds} for a, v in per_input.items()}


def leakage_ceiling(primary: str) -> float | None:
    """The most leakage the primary metric can state (its declared bound on the leaking side), or None."""
    from fedbench.metrics.catalogue import metric

    m = metric(primary)
    low, high = m.bounds
    return high if m.leakage_sign > 0 else low


def at_ceiling(row: Row, primary: str, seeds: list[int]) -> RowCheck | None:
    """The row's check without re-running anything when every input on `seeds` is at the metric's
    maximum (module docstring); None otherwise, or when the row has no per-input values there."""
    ceiling = leakage_ceiling(primary)
    if ceiling is None:
        return None
    kept = _on_seeds(row.entry.get("per_input") or {}, {str(s) for s in seeds})
    values = [v for v in worst_per_input({**row.entry, "per_input": kept}, primary).inputs.values()]
    if not values or not all(len(v) for v in values):
        return None
    flat = np.concatenate(values)
    if not np.all(flat == ceiling):
        return None
    return RowCheck(
        row.defense,
        float(ceiling),
        float(ceiling),
        float(row.low if row.low is not None else 0.0),
        float(row.high if row.high is not None else 0.0),
        ceiling=True,
    )


def doubled_attack(attack: Any, factor: int) -> Any | None:
    """The attack spec with its optimisation budget multiplied by `factor` (the plugin's
    `scaled_budget`), or None when it has none to scale."""
    from fedbench.registry import registry_for
    from fedbench.spec.run import ComponentSpec

    plugin = registry_for("attack").get(attack.name)
    given = {k: v for k, v in attack.params_dict.items() if k in attack.given}
    raw = plugin.scaled_budget(attack.params_dict, given, factor)
    if raw is None:
        return None
    return ComponentSpec.resolve("attack", attack.name, raw)


def doubled_specs(specs: list[Any], rows: set[str], factor: int) -> tuple[list[Any], dict[str, str]]:
    """The runs of the chosen rows with each optimisation attack's budget multiplied, and {doubled
    attack label: the board's attack label} to put them in place of the originals."""
    out, labels = [], {}
    for spec in specs:
        if spec.defense.label not in rows or spec.attack is None:
            continue
        more = doubled_attack(spec.attack, factor)
        if more is None:
            continue
        labels[more.label] = spec.attack.label
        out.append(dataclasses.replace(spec, attack=more))
    return list(dict.fromkeys(out)), labels


def check_row(row: Row, doubled_entry: dict[str, Any], labels: dict[str, str], primary: str) -> RowCheck:
    """The row's rate with the doubled attacks in place of the originals, on the seeds they ran."""
    entry = row.entry
    swapped = dict(entry.get("per_input") or {})
    replaced = []
    for new, old in labels.items():
        values = (doubled_entry.get("per_input") or {}).get(new)
        if values is not None and old in swapped:
            swapped[old] = values
            replaced.append(new)
    seeds = {s for new in replaced for s in doubled_entry["per_input"][new]}
    before = worst_per_input({**entry, "per_input": _on_seeds(entry.get("per_input") or {}, seeds)}, primary)
    after = worst_per_input({**entry, "per_input": _on_seeds(swapped, seeds)}, primary)
    before, after = before.point(), after.point()
    return RowCheck(
        row.defense,
        float(before if before is not None else float("nan")),
        float(after if after is not None else float("nan")),
        float(row.low if row.low is not None else 0.0),
        float(row.high if row.high is not None else 0.0),
        sorted(replaced),
    )


def note(check: dict[str, Any]) -> str:
    """The board README's sentence for a recorded budget check ('' when none is recorded)."""
    if not check:
        return ""
    parts = [
        f"`{r['defense']}` {100 * r['rate']:.1f} % (at the ceiling: every input already at the metric's "
        "maximum, so more budget cannot find more; not re-run)"
        if r.get("ceiling")
        else f"`{r['defense']}` {100 * r['rate']:.1f} % → {100 * r['doubled']:.1f} % "
        f"({'converged' if r['passed'] else 'MOVED beyond half its interval'})"
        for r in check["rows"]
    ]
    seeds = ", ".join(map(str, check["seeds"]))
    if all(r.get("ceiling") for r in check["rows"]):
        names = ", ".join(f"`{r['defense']}`" for r in check["rows"])
        return (
            f"Budget check ({check['date']}, `fedbench leaderboard budget-check`): every input of the "
            f"checked rows ({names}) on seeds {seeds} is already at the primary metric's maximum "
            f"({100 * check['rows'][0]['rate']:.1f} %), so more attack budget cannot find more; no attack "
            f"was re-run. Result: {check['result']}."
        )
    attacks = ", ".join(check["attacks"]) or "none"
    auto = f"; on their auto schedule, not doubled: {', '.join(check['auto'])}" if check.get("auto") else ""
    return (
        f"Budget check ({check['date']}, `fedbench leaderboard budget-check`): the budget (iterations; "
        f"on an adaptive schedule, its cap and patience) of "
        f"{attacks} multiplied by {check['factor']} on seeds {seeds}{auto}. "
        f"The primary rate, same seeds: {'; '.join(parts)}. Result: {check['result']} (a row passes when "
        "its rate moves by less than half its published 95 % interval)."
    )
