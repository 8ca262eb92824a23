"""Which input a per-input value belongs to, so that the worst case over attacks is taken per input even
when the attacks covered different victims (the attack cascade, `fedbench.execution.cascade`: a later
attack runs only on the victims no earlier one re-identified).

A run's per-input values are its victims' inputs one after another, in victim order, each victim with
the same number of inputs (its batch). An input is then keyed by (victim, position among that victim's
inputs), whichever run or batch it came from.
"""

from __future__ import annotations

import json
from typing import Any


def victim_list(cell: Any) -> list[Any]:
    """The victims of a run from its `sc_victim` cell: a batch ("[0,1,2]" or a list) or one client."""
    if isinstance(cell, list | tuple):
        return list(cell)
    if isinstance(cell, str):  # a results file's cell: "[0,2]", or "0" in a column that also holds batches
        try:
            value = json.loads(cell)
        except ValueError:
            return [cell]
        return list(value) if isinstance(value, list) else [value]
    return [cell.item() if hasattr(cell, "item") else cell]


def _plain(v: Any) -> Any:
    """A victim as a comparable, printable key: an int where it is one (5, 5.0, "5" alike)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return int(f) if f.is_integer() else str(v)


def input_keys(victims: Any, count: int) -> list[tuple[Any, int]] | None:
    """The keys of a run's `count` values, victims one after another; None when `count` does not split
    evenly over the victims (the inputs cannot be told apart by victim)."""
    vs = victim_list(victims)
    if not vs or count % len(vs):
        return None
    per = count // len(vs)
    return [(_plain(v), j) for v in vs for j in range(per)]


def sort_key(key: tuple[Any, int]) -> tuple[int, Any, int]:
    """Keys in victim order (clients by number), then by position."""
    victim, j = key
    return (0, victim, j) if isinstance(victim, int) else (1, str(victim), j)
