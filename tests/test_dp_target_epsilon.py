"""fed-cdp and fed-sdp at a target epsilon (issue 30: every DP defense on a board at epsilon 1, 4, 8 with
sigma from the accountant): `epsilon > 0` calibrates sigma for the per-layer clip's sensitivity
C*sqrt(M), the row's epsilon is the target, checked against an independent computation
(dp-accounting's privacy loss distributions), the training noise uses that sigma, and the runs at the
given sigma keep their run ids."""

from __future__ import annotations

import math

import pytest

from fedbench import create_defense
from fedbench.errors import ParamError
from fedbench.plugin import Scenario
from fedbench.spec.run import ComponentSpec
from tests.test_dp_as_simulated import _matches, _row

CLIENT = dict(
    protocol="fedavg", clients=10, participation=0.3, rounds=5, local_steps=1, batch_size=4,
    train_size=80, test_size=40,
)  # fmt: skip
EXAMPLE = dict(
    protocol="fedavg", clients=20, participation=0.25, rounds=4, local_epochs=2, batch_size=4,
    train_size=160, test_size=40,
)  # fmt: skip


@pytest.mark.parametrize("placement", ["client", "server"])
def test_fed_sdp_at_a_target_epsilon_is_accounted_at_it(tmp_path, placement):
    row = _row(tmp_path, "fed-sdp", {"epsilon": 4.0, "clip": 1.0, "placement": placement}, CLIENT)
    assert row["dp_level"] == "client" and "M=6 tensors" in row["accountant"]
    assert row["epsilon"] <= 4.0 and row["epsilon"] == pytest.approx(4.0, rel=1e-3)
    sigma = create_defense("fed-sdp", epsilon=4.0).sigma_for(Scenario.from_dict(CLIENT), 6)
    assert f"noise multiplier {sigma / math.sqrt(6):.4g}" in row["accountant"]
    assert _matches(row["epsilon"], 1e-5, sigma, math.sqrt(6), 0.3, 5)  # independent of fedbench
    # sigma of the per-layer clip is the flat clip's calibrated multiplier times sqrt(M)
    flat = create_defense("dp-fedavg", epsilon=4.0, delta=1e-5).sigma_for(Scenario.from_dict(CLIENT))
    assert sigma == pytest.approx(flat * math.sqrt(6), rel=1e-9)


def test_fed_cdp_at_a_target_epsilon_is_accounted_at_it(tmp_path):
    row = _row(tmp_path, "fed-cdp", {"epsilon": 8.0, "clip": 1.0}, EXAMPLE)
    assert row["dp_level"] == "example" and row["epsilon"] <= 8.0
    assert row["epsilon"] == pytest.approx(8.0, rel=1e-3)
    cdp = create_defense("fed-cdp", epsilon=8.0)
    cdp._train_size = 160
    sigma = cdp.sigma_for(Scenario.from_dict(EXAMPLE), 6)
    assert _matches(row["epsilon"], 1e-5, sigma, math.sqrt(6 * 2), 0.25, 4)
    assert cdp.sigma_for(Scenario.from_dict(EXAMPLE), 6, 160) == sigma


def test_the_training_noise_is_the_calibrated_sigma():
    """The per-example hook adds N(0, (sigma C / B)^2) with the calibrated sigma (noise=batch)."""
    import torch

    from fedbench.plugin import HookContext

    sc = Scenario.from_dict(EXAMPLE)
    cdp = create_defense("fed-cdp", epsilon=8.0, clip=1.0, noise="batch", per_example="materialise")
    cdp._train_size = 160
    grads = {f"t{i}": torch.zeros(4, 50_000) for i in range(6)}  # zero gradients: the output is the noise
    ctx = HookContext(round=0, client=0, step=0, scenario=sc, generator=torch.Generator().manual_seed(0))
    noise = torch.cat([v.flatten() for v in cdp.per_example(grads, ctx).values()])
    want = cdp.sigma_for(sc, 6) * 1.0 / 4
    assert float(noise.std()) == pytest.approx(want, rel=0.01)


def test_bad_inputs_and_unchanged_run_ids():
    with pytest.raises(ParamError, match="participation accountant"):
        create_defense("fed-cdp", epsilon=4.0, sampling="poisson")
    with pytest.raises(ParamError, match="participation accountant"):
        create_defense("fed-sdp", epsilon=4.0, sampling="poisson")
    with pytest.raises(ParamError):
        create_defense("fed-sdp", epsilon=-1.0)
    from fedbench.errors import FedbenchError

    with pytest.raises(FedbenchError, match="C\\*sqrt\\(M\\)"):  # per-layer: M is needed
        create_defense("fed-sdp", epsilon=4.0).sigma_for(Scenario.from_dict(CLIENT))
    # epsilon = 0 (sigma as given) is keyless: the rows built before it keep their run ids
    given = ComponentSpec.resolve("defense", "fed-cdp", {"sigma": 1.0, "clip": 4.0})
    assert "epsilon" not in given.label and "epsilon" not in given.key()["params"]
    target = ComponentSpec.resolve("defense", "fed-cdp", {"epsilon": 8.0})
    assert target.label == "fed-cdp[epsilon=8]"


def test_noise_aware_reads_the_calibrated_sigma():
    """The noise-aware attack (knowing the defense and its parameters) models the calibrated noise."""
    from types import SimpleNamespace

    import torch

    from fedbench.attacks._noise_core import noise_model

    sc = Scenario.from_dict(CLIENT)
    shared = {f"t{i}": torch.zeros(2) for i in range(6)}  # the observed update's M = 6 tensors
    obs = SimpleNamespace(
        kind="gradient", lr=0.1, local_steps=1, defense_hooks=("update",), round=0, client=0,
        batch_size=1, y_true=torch.zeros(1), point="update", shared=shared,
    )  # fmt: skip
    sdp = create_defense("fed-sdp", epsilon=4.0, clip=1.0)
    assert noise_model(sdp, obs, sc).scale == pytest.approx(sdp.sigma_for(sc, 6))
