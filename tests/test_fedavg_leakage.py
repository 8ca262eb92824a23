"""fedavg-leakage (Dimitrov et al., TMLR 2022): the simulated round equals the engine's, it beats
matching the update as one gradient on multi-step FedAvg, and it skips where it is plain matching."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from fedbench.api import create_defense
from fedbench.attacks._fedavg_core import UpdateSimulator
from fedbench.attacks._inversion import to_pixels
from fedbench.attacks.fedavg_leakage import FedAvgLeakage
from fedbench.attacks.inverting_gradients import InvertingGradients
from fedbench.data import load_dataset
from fedbench.errors import FedbenchError
from fedbench.fl.seeding import numpy_rng
from fedbench.fl.simulation import ObservationRequest, Simulation
from fedbench.models import build_model
from fedbench.plugin import Scenario

MLP = {"hidden": [32]}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny problems: one thread is as fast and immune to oversubscription on a busy machine."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _model(bundle):
    return build_model("mlp", MLP, bundle.meta.input_shape, bundle.meta.num_classes)


def _observe(bundle, victim=0, point="update", **sc):
    # 10 clients over 40 examples: 4 examples each
    base = dict(protocol="fedavg", clients=10, rounds=1, lr=0.5, train_size=40, test_size=20, victim=victim)
    base.update(sc)
    sim = Simulation(
        Scenario.from_dict(base),
        bundle,
        lambda: _model(bundle),
        create_defense("none"),
        seed=0,
        observe=ObservationRequest(point, 0, victim),
        stop_after_observation=True,
    )
    return sim.run().observation


def _max_error(bundle, obs, x, y) -> float:
    sim = UpdateSimulator(_model(bundle), obs, torch.device("cpu"))
    delta = sim.update(x.float(), y.long(), create_graph=False)
    assert set(delta) == set(obs.shared)
    return max(float((delta[k].detach() - obs.shared[k]).abs().max()) for k in delta)


def test_simulated_update_equals_the_clients_on_the_true_data(digits):
    # full-batch local steps: the order of the data does not matter
    obs = _observe(digits, local_steps=4, batch_size=0)
    assert obs.kind == "delta" and obs.local_steps == 4 and len(obs.y_true) == 4
    assert _max_error(digits, obs, obs.x_true, obs.y_true) < 1e-5
    # mini-batches within one epoch, in the client's (seeded) order: exact too
    obs = _observe(digits, local_steps=2, batch_size=2)
    order = torch.as_tensor(numpy_rng(0, "batches", 0, 0, 0).permutation(4))
    assert _max_error(digits, obs, obs.x_true[order], obs.y_true[order]) < 1e-5
    # the one-gradient view (what ig matches) is not exact: the simulation is what the attack adds
    obs = _observe(digits, local_steps=4, batch_size=0)
    one = UpdateSimulator(_model(digits), obs, torch.device("cpu"))
    one.steps = 1
    step = one.update(obs.x_true.float(), obs.y_true.long(), create_graph=False)
    assert max(float((4 * step[k].detach() - obs.shared[k]).abs().max()) for k in step) > 1e-2


def _psnr(images: np.ndarray, obs, meta) -> float:
    """Mean PSNR after one-to-one matching (as the reconstruction metrics do)."""
    truth = to_pixels(obs.x_true.float(), meta).numpy()
    mse = ((images[:, None] - truth[None]) ** 2).reshape(len(images), len(truth), -1).mean(-1)
    r, c = linear_sum_assignment(mse)
    return float(np.mean(10 * np.log10(1 / np.maximum(mse[r, c], 1e-10))))


def test_beats_one_gradient_matching_on_a_multi_step_update(digits):
    # 4 local full-batch steps at lr 0.5: the update is far from one gradient at the received weights
    ours, ig = [], []
    for victim in range(3):
        obs = _observe(digits, victim, local_steps=4, batch_size=0)
        for attack, scores in (
            (FedAvgLeakage({"iterations": 200}), ours),
            (InvertingGradients({"iterations": 200, "labels": "known"}), ig),
        ):
            out = attack.run(obs, _model(digits), digits.meta, torch.Generator().manual_seed(0), "cpu")
            assert out.images.shape == tuple(obs.x_true.shape)
            scores.append(_psnr(out.images, obs, digits.meta))
            assert out.extra.get("order", "exact") == "exact"
    # measured: 20.5 vs 15.0 dB mean
    assert np.mean(ours) > np.mean(ig) + 2.5, (ours, ig)


def test_skips_where_the_update_is_one_gradient():
    a = FedAvgLeakage()
    assert a.check(Scenario(protocol="fedavg", local_steps=4)) is None
    assert a.check(Scenario(protocol="fedavg", local_epochs=2, batch_size=0)) is None
    assert "fedsgd" in a.check(Scenario(protocol="fedsgd"))
    assert "local_steps=1" in a.check(Scenario(protocol="fedavg", local_steps=1))
    assert "one gradient step" in a.check(Scenario(protocol="fedavg", local_epochs=1, batch_size=0))
    assert "mse" in a.check(Scenario(protocol="fedavg", local_steps=4, loss="mse"))
    assert "observe=step" in a.check(Scenario(protocol="fedavg", local_steps=4, observe="step"))
    assert a.accepted_points == ("update", "server") and not hasattr(a, "adapts_to")
    assert a.check(Scenario(protocol="fedavg", local_steps=4, observe="server")) is None
    assert a.paper is not None and a.version.isdigit()


@pytest.mark.parametrize(
    "raw, word",
    [
        ({"iterations": 0}, "iterations"),
        ({"labels": "optimise"}, "labels"),
        ({"lr": 0}, "lr"),
        ({"nope": 1}, "nope"),
    ],
)
def test_bad_parameters_fail_in_one_line(raw, word):
    with pytest.raises(FedbenchError) as err:
        FedAvgLeakage(raw)
    assert word in str(err.value) and "\n" not in str(err.value).strip()


def test_reads_the_update_at_the_server_as_the_clients(digits):
    """At the server (Fed-CDP's type 0) without a server-side hook the update is the client's, and the
    simulated round reproduces it."""
    obs = _observe(digits, 1, point="server", local_steps=4, batch_size=0)
    assert obs.point == "server" and obs.kind == "delta" and obs.local_steps == 4
    assert _max_error(digits, obs, obs.x_true, obs.y_true) < 1e-5
