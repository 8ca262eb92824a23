"""A board entry's privacy budget recomputed from what the entry records, without its runs.

Epsilon depends only on the defense's parameters, the scenario, the training-set size and the model's
number of trained tensors, never on trained weights (`fedbench.execution.runner._accounting` computes
it per row for the same reason). So when an accountant is fixed, a committed board can take the new
epsilon without re-running a single attack: `refresh_epsilon` re-resolves the entry's defense label
with today's defaults, rebuilds the scenario, the dataset's training prefix and the model from the
entry, and asks the defense's accountant.

A defense that calibrates its noise to a target epsilon (dp-sgd, dp-fedavg; fed-cdp and fed-sdp given
`epsilon`) is not refreshed here:
its noise multiplier is part of the runs, so a change to its accountant changes the runs (its plugin
`version` moves) and only a rebuild from the runs can say what they protect.
"""

from __future__ import annotations

import math
from typing import Any

from fedbench.reporting.ranking import rounded


class NotRefreshable(Exception):
    """This entry's epsilon cannot be recomputed from the entry alone (the message says why)."""


def _scenario(entry: dict[str, Any]) -> Any:
    """The training scenario of the entry (observation-only fields dropped: they never change epsilon)."""
    from fedbench.plugin import Scenario

    raw = {k[3:]: v for k, v in entry["scenario"].items() if k.startswith("sc_")}
    raw.pop("victim", None)
    raw["observe"] = "default"
    raw["observe_round"] = 0
    return Scenario.from_dict(raw)


def entry_accounting(entry: dict[str, Any]) -> tuple[Any, dict[str, Any]] | None:
    """(Accounting, resolved defense params) of a board entry under today's accountants, or None for a
    defense without a formal guarantee. Raises NotRefreshable for a calibrated defense."""
    import torch

    from fedbench.data import load_dataset
    from fedbench.execution.runner import _accepts
    from fedbench.plugin import Defense
    from fedbench.registry import defenses
    from fedbench.spec.patterns import parse_pattern
    from fedbench.spec.run import ComponentSpec

    if defenses.get(entry["defense_name"]).accounting is Defense.accounting:
        return None  # before parsing the label: a heuristic defense's label may hold free text
    name, params = parse_pattern(entry["defense"])
    defense_spec = ComponentSpec.resolve("defense", name, params)
    defense = defense_spec.instantiate()
    if getattr(defense.params, "epsilon", 0.0):  # a target (fed-cdp/fed-sdp take one only when > 0)
        raise NotRefreshable(
            f"{entry['defense']} calibrates its noise to a target epsilon: rebuild from runs"
        )
    dname, dparams = parse_pattern(entry["scenario"]["dataset"])
    dataset = ComponentSpec.resolve("dataset", dname, dparams).instantiate()
    bundle = load_dataset(dname, dataset.params, None, False)
    scenario = _scenario(entry)
    size = len(bundle.y_train)
    n_train = min(scenario.train_size or size, size)
    extra: dict[str, Any] = {}
    if _accepts(defense.accounting, "tensors"):
        mname, mparams = parse_pattern(entry["scenario"]["model"])
        model = ComponentSpec.resolve("model", mname, mparams).instantiate()
        shape = tuple(int(s) for s in bundle.meta.input_shape)
        with torch.random.fork_rng(devices=[]):
            net = model.build(shape, int(bundle.meta.num_classes))
        extra["tensors"] = sum(1 for p in net.parameters() if p.requires_grad)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an infinite or loose epsilon is stated in the entry
        accounting = defense.accounting(scenario, n_train, **extra)
    return accounting, dict(defense_spec.params)


def refresh_epsilon(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry with epsilon, delta, level and accountant of today's accountant, and its defense's
    parameters resolved with today's defaults (an accounting-only parameter such as fed-cdp's
    `sampling` is outside the run key, so the entry's runs are the same runs). Unchanged for a
    defense without a guarantee."""
    found = entry_accounting(entry)
    if found is None:
        return entry
    acc, params = found
    metrics = dict(entry["metrics"])
    infinite = math.isinf(acc.epsilon)
    metrics.update(
        epsilon=None if infinite else rounded(acc.epsilon),
        delta=rounded(acc.delta),
        dp_level=acc.level,
        accountant=acc.accountant,
    )
    metrics.pop("epsilon_infinite", None)
    if infinite:
        metrics["epsilon_infinite"] = True
    return {**entry, "metrics": metrics, "params": params}
