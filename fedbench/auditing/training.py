"""One FL training with the audit's canaries in it, built from fedbench's public pieces.

The run is the row's own training (`fedbench.fl.simulation.Simulation` with the row's scenario,
dataset, model, defense and seed), on a dataset bundle that holds the row's training records followed
by the included canaries. Its client split is set so that a canary's coin changes only that canary:

- the row's records are split over the clients exactly as the row's own run splits them (the same
  `fedbench.data.partition.partition` call on the same labels and seed), whatever the coins say;
- an included canary joins the client drawn for it in advance (`Canaries.owner`).

Left to the simulation, the split would be drawn over records and canaries together, so one canary's
coin would move every other record between clients: a change to the data set larger than the one
record that (eps, delta)-DP at the example level (or one client's data, at the client level) bounds.
The simulation is therefore built as usual and its split (`client_indices`) replaced before it runs; a
defense that binds to the run's data (`bind_data`) is bound again to the final split. A defense that
sets records aside for the server (`reserve`: FRL) is refused: its reserve would be drawn over the
canaries too.

After training the canaries are scored black-box: minus the final global model's loss on each canary
(the scenario's loss, eval mode), higher meaning "in".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedbench.auditing.canaries import Canaries, make_canaries


@dataclass(frozen=True)
class CanaryRun:
    """What the audit's training yields: the canaries' scores (higher = "in") and inclusion flags, the
    number of records trained on (row records + included canaries), and the audit run's test accuracy."""

    scores: Any
    included: Any
    n_train: int
    test_acc: float


def audit_bundle(bundle: Any, n_base: int, canaries: Canaries) -> Any:
    """The row's first `n_base` training records followed by the included canaries; the test set without
    the test records taken as canaries."""
    import dataclasses

    import torch

    keep = torch.as_tensor(canaries.included)
    x_in, y_in = canaries.x[keep], canaries.y[keep]
    n_in = len(y_in)
    attr_train = {
        k: torch.cat([v[:n_base], torch.zeros(n_in, dtype=v.dtype)]) for k, v in bundle.attr_train.items()
    }
    groups = bundle.groups_train
    if groups is not None:  # the split is replaced (module docstring); any existing group id will do
        groups = torch.cat([groups[:n_base], groups[:1].repeat(n_in)])
    n_test = len(bundle.y_test) - len(canaries.test_rows)  # canaries come from the end of the test set
    return dataclasses.replace(
        bundle,
        x_train=torch.cat([bundle.x_train[:n_base], x_in]),
        y_train=torch.cat([bundle.y_train[:n_base], y_in]),
        x_test=bundle.x_test[:n_test],
        y_test=bundle.y_test[:n_test],
        attr_train=attr_train,
        attr_test={k: v[:n_test] for k, v in bundle.attr_test.items()},
        groups_train=groups,
    )


def client_split(bundle: Any, scenario: Any, n_base: int, canaries: Canaries, seed: int) -> list[Any]:
    """Each client's rows: the row's own split of its `n_base` records, plus the included canaries
    (rows n_base, n_base + 1, ... in canary order) each at its drawn owner."""
    import numpy as np

    from fedbench.data.partition import partition

    groups = bundle.groups_train[:n_base].numpy() if bundle.groups_train is not None else None
    parts = partition(
        bundle.y_train[:n_base].numpy(),
        scenario.clients,
        scenario.partition,
        seed=seed,
        alpha=scenario.alpha,
        shards_per_client=scenario.shards_per_client,
        groups=groups,
    )
    owners = canaries.owner[canaries.included]
    rows = n_base + np.arange(len(owners))
    return [
        np.sort(np.concatenate([np.asarray(p, dtype=np.int64), rows[owners == c]]))
        for c, p in enumerate(parts)
    ]


def train_with_canaries(spec: Any, parts: Any, bundle: Any, m: int, kind: str, device: str) -> CanaryRun:
    """Train the row of `spec` (its plugins `parts`, its dataset `bundle`) with m canaries of `kind`
    (module docstring) and score them."""
    import torch

    from fedbench.errors import FedbenchError
    from fedbench.fl.simulation import Simulation
    from fedbench.spec.run import training_scenario

    scenario = training_scenario(spec.scenario)
    defense = parts.simulation_defense()
    if defense.implements("reserve"):
        raise FedbenchError(
            f"audit: defense '{defense.name}' sets training records aside for the server; the one-run "
            "audit does not support it"
        )
    n_base = min(scenario.train_size or len(bundle.y_train), len(bundle.y_train))
    canaries = make_canaries(bundle, n_base, m, kind, scenario.clients, spec.seed)
    data = audit_bundle(bundle, n_base, canaries)
    n_train = len(data.y_train)
    run_scenario = scenario.replace(train_size=n_train)
    sim = Simulation(run_scenario, data, parts.model_factory(bundle.meta), defense, spec.seed, device)
    sim.client_indices = client_split(bundle, scenario, n_base, canaries, spec.seed)
    if defense.implements("bind_data"):
        defense.bind_data(sim.run_data())
    result = sim.run()
    model = sim.model
    model.load_state_dict(sim.global_state)
    model.eval()
    loss = sim.loss_fn
    with torch.no_grad():
        x, y = canaries.x.to(sim.device), canaries.y.to(sim.device)
        out = torch.cat([model(x[i : i + 1024]) for i in range(0, len(x), 1024)])
        losses = torch.stack([loss(out[i : i + 1], y[i : i + 1]) for i in range(len(y))])
    return CanaryRun(
        scores=(-losses).double().cpu().numpy(),
        included=canaries.included,
        n_train=n_train,
        test_acc=float(result.test_acc),
    )
