"""docs/results/fed-cdp.md states, for its tables' configurations, the epsilon of the mechanism as
simulated beside the paper-model value the tables were computed with: recompute both here."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from fedbench.execution.runner import Job, RunContext, _accounting
from fedbench.spec.grid import Overrides, build_grid

DOC = Path(__file__).resolve().parent.parent / "docs" / "results" / "fed-cdp.md"


def _epsilons(**overrides) -> dict[tuple[str, str], float]:
    """{(defense label, dataset): epsilon} as the runner computes it per row (no training)."""
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for spec in build_grid("fed-cdp", Overrides(seeds=1, **overrides)).specs:
            found = _accounting(Job(spec, RunContext()), {})
            if found:
                out[(spec.defense.label, spec.dataset.name)] = found[0]["epsilon"]
    return out


def test_the_stated_epsilons_are_the_accountants():
    text = DOC.read_text()
    leakage = _epsilons(
        datasets=("mnist5k",),
        models=("lenet",),
        attacks=("cpl",),
        sets=("scenario.protocol=fedsgd", "scenario.rounds=1"),
    )
    assert {round(v, 3) for k, v in leakage.items() if k[0].startswith("fed-cdp")} == {1.479}
    assert {round(v, 3) for k, v in leakage.items() if k[0].startswith("fed-sdp")} == {2.025}
    accuracy = _epsilons()
    assert {round(v, 3) for v in accuracy.values()} == {4.317}
    sweep = _epsilons(
        datasets=("mnist5k", "adult"), defenses=("fed-cdp[sigma=[0.5,1]]", "fed-cdp-decay[sigma=[0.5,1]]")
    )
    assert {round(v, 2) for k, v in sweep.items() if "sigma=1" in k[0]} == {45.73}
    assert {round(v, 1) for k, v in sweep.items() if "sigma=0.5" in k[0]} == {140.3}
    for value in ("| 1.479 |", "| 2.025 |", "| 4.317 |", "| 45.73 |", "| 140.3 |"):
        assert value in text


@pytest.mark.parametrize(
    "defense,dataset,value",
    [("fed-cdp", "mnist5k", 0.22), ("fed-cdp", "breast-cancer", 0.75), ("fed-sdp", "breast-cancer", 1.64)],
)
def test_the_paper_model_values_are_sampling_poisson(defense, dataset, value):
    """The tables' own epsilon column is the paper's model (sampling=poisson) at the accuracy table's
    setting."""
    eps = _epsilons(defenses=(f"{defense}[sampling=poisson]",), datasets=(dataset,))
    assert {round(v, 2) for v in eps.values()} == {value}
