"""Fed-SDP / Fed-CDP / Fed-CDP(decay): per-example gradients, clipping, noise, leakage points, epsilon."""

from __future__ import annotations

import math

import pytest
import torch

from fedbench.api import create_defense
from fedbench.data import load_dataset
from fedbench.defenses.fed_dp import clip_per_example_per_layer, clip_per_layer, decayed_clip
from fedbench.fl.losses import loss_function
from fedbench.fl.per_example import per_example_grads
from fedbench.fl.simulation import ObservationRequest, Simulation
from fedbench.models import build_model
from fedbench.plugin import HookContext, Scenario


def _ctx(rnd: int = 0, rounds: int = 5, seed: int = 0) -> HookContext:
    return HookContext(
        round=rnd,
        client=0,
        step=0,
        scenario=Scenario(rounds=rounds),
        generator=torch.Generator().manual_seed(seed),
    )


def _batch(shape=(1, 28, 28), n=6, classes=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *shape, generator=g), torch.randint(0, classes, (n,), generator=g)


@pytest.mark.numeric
@pytest.mark.parametrize(
    "model,params,shape",
    [("lenet", {}, (1, 28, 28)), ("cdp-cnn", {}, (1, 28, 28)), ("mlp", {"hidden": [32, 16]}, (20,))],
)
def test_torch_func_per_example_grads_equal_a_loop(model, params, shape):
    torch.manual_seed(0)
    net = build_model(model, params, shape, 10).double()
    x, y = _batch(shape)
    x = x.double()
    loss_fn = loss_function("ce")
    vec = per_example_grads(net, x, y, loss_fn)
    for i in range(len(y)):
        net.zero_grad()
        loss_fn(net(x[i : i + 1]), y[i : i + 1]).backward()
        for name, p in net.named_parameters():
            assert torch.allclose(vec[name][i], p.grad, atol=1e-6, rtol=0), (model, name, i)


def test_every_clipped_per_example_layer_norm_is_at_most_c():
    torch.manual_seed(0)
    net = build_model("lenet", {}, (1, 28, 28), 10)
    x, y = _batch(n=16)
    grads = {k: v * 50 for k, v in per_example_grads(net, x, y, loss_function("ce")).items()}
    grads["fc.bias"][3] *= 1e-6  # one small layer of one example stays as it is
    for bound in (0.5, 1.0, 4.0):
        clipped = clip_per_example_per_layer(grads, bound)
        for name, g in clipped.items():
            norms = torch.linalg.vector_norm(g.reshape(len(g), -1), dim=1)
            assert float(norms.max()) <= bound * (1 + 1e-5), name
        small = grads["fc.bias"][3]
        if float(small.norm()) < bound:
            assert torch.equal(clipped["fc.bias"][3], small)


def test_clip_per_layer_bounds_each_tensor():
    upd = {"a": torch.full((10, 10), 3.0), "b": torch.full((4,), 0.01)}
    out = clip_per_layer(upd, 2.0)
    assert float(out["a"].norm()) == pytest.approx(2.0, rel=1e-6)
    assert torch.equal(out["b"], upd["b"])


@pytest.mark.parametrize("noise,scale", [("example", lambda b: math.sqrt(b)), ("batch", lambda b: b)])
def test_fed_cdp_noise_std(noise, scale):
    sigma, clip, batch = 2.0, 3.0, 16
    d = create_defense("fed-cdp", sigma=sigma, clip=clip, noise=noise)
    zero = {"w": torch.zeros(batch, 300, 100)}
    out = d.per_example(zero, _ctx())["w"]
    assert float(out.std()) == pytest.approx(sigma * clip / scale(batch), rel=0.03)


@pytest.mark.numeric
def test_fed_cdp_mean_of_clipped_gradients_without_noise_dominance():
    d = create_defense("fed-cdp", sigma=1e-9, clip=1.0)
    grads = {"w": torch.randn(8, 50) * 100}
    out = d.per_example(grads, _ctx())["w"]
    assert float(out.norm()) <= 1.0 + 1e-5
    assert torch.allclose(out, clip_per_example_per_layer(grads, 1.0)["w"].mean(0), atol=1e-6)


def test_decay_schedules():
    assert decayed_clip("linear", 6, 2, 0, 100) == 6
    assert decayed_clip("linear", 6, 2, 99, 100) == pytest.approx(2)
    assert decayed_clip("linear", 6, 2, 33, 100) == pytest.approx(6 - 4 * 33 / 99)
    assert decayed_clip("exponential", 6, 2, 99, 100) == pytest.approx(2)
    assert decayed_clip("exponential", 6, 2, 50, 101) == pytest.approx(math.sqrt(12))
    stairs = [decayed_clip("staircase", 6, 2, t, 100, stairs=4) for t in range(100)]
    assert sorted(set(stairs), reverse=True) == pytest.approx([6, 6 - 4 / 3, 6 - 8 / 3, 2])
    assert decayed_clip("linear", 6, 2, 0, 1) == 6
    d = create_defense("fed-cdp-decay", sigma=1e-9)
    big = {"w": (torch.randn(1000) * 100).expand(4, 1000)}  # identical examples: the mean has norm C_t
    assert float(d.per_example(big, _ctx(0, 10))["w"].norm()) == pytest.approx(6, rel=1e-4)
    assert float(d.per_example(big, _ctx(9, 10))["w"].norm()) == pytest.approx(2, rel=1e-4)


def test_fed_sdp_placements():
    upd = {"a": torch.randn(200, 50) * 10, "b": torch.randn(50) * 10}
    client = create_defense("fed-sdp", sigma=0.5, clip=1.0)
    out = client.update(upd, _ctx())
    noise = out["a"] - clip_per_layer(upd, 1.0)["a"]
    assert float(noise.std()) == pytest.approx(0.5, rel=0.05)
    assert client.receive(out, _ctx()) is out
    server = create_defense("fed-sdp", sigma=0.5, clip=1.0, placement="server")
    assert server.update(upd, _ctx()) is upd  # type-1 sees the raw update
    got = server.receive(upd, _ctx())
    assert float((got["a"] - clip_per_layer(upd, 1.0)["a"]).std()) == pytest.approx(0.5, rel=0.05)
    central = create_defense("fed-sdp", noise="central")
    assert "placement=server" in central.check(Scenario())
    # uniform mean over the participants, whatever their sizes (Algorithm 1)
    agg = client.aggregate([{"a": torch.ones(2)}, {"a": 3 * torch.ones(2)}], [1.0, 100.0], _ctx())
    assert torch.equal(agg["a"], 2 * torch.ones(2))


# ---------------------------------------------------------------------------------- leakage points

SC = dict(
    protocol="fedsgd",
    clients=4,
    rounds=1,
    batch_size=4,
    lr=0.1,
    train_size=200,
    test_size=50,
    observe_round=0,
)


def _observe(defense, point: str, **defense_params):
    bundle = load_dataset("digits", {})
    sc = Scenario.from_dict({**SC, "observe": point})
    sim = Simulation(
        sc,
        bundle,
        lambda: build_model("mlp", {"hidden": [16]}, bundle.meta.input_shape, bundle.meta.num_classes),
        create_defense(defense, **defense_params),
        seed=0,
        observe=ObservationRequest(point, 0, 0),
        stop_after_observation=True,
    )
    return sim.run().observation


def _same(a, b) -> bool:
    return all(torch.allclose(a.shared[k], b.shared[k], atol=1e-6) for k in a.shared)


def test_leakage_types_per_defense():
    raw = {p: _observe("none", p) for p in ("example", "update", "server")}
    assert raw["example"].x_true.shape[0] == 1 and raw["update"].x_true.shape[0] == 4
    assert _same(raw["update"], raw["server"])
    # type-2: Fed-SDP leaks the raw per-example gradient; Fed-CDP sanitises it
    assert _same(_observe("fed-sdp", "example"), raw["example"])
    assert not _same(_observe("fed-cdp", "example"), raw["example"])
    assert not _same(_observe("fed-cdp-decay", "example"), raw["example"])
    # server-side noise: type-1 (client update) raw, type-0 (at the server) noised
    assert _same(_observe("fed-sdp", "update", placement="server"), raw["update"])
    assert not _same(_observe("fed-sdp", "server", placement="server"), raw["update"])
    # client-side noise: both noised
    assert not _same(_observe("fed-sdp", "update"), raw["update"])
    assert not _same(_observe("fed-sdp", "server"), raw["update"])


def test_fed_dp_runs_train_and_stay_finite():
    bundle = load_dataset("digits", {})
    for name in ("fed-sdp", "fed-cdp", "fed-cdp-decay"):
        sc = Scenario.from_dict(
            {**SC, "protocol": "fedavg", "local_steps": 3, "rounds": 2, "observe": "default"}
        )
        sim = Simulation(
            sc,
            bundle,
            lambda: build_model("mlp", {"hidden": [16]}, bundle.meta.input_shape, bundle.meta.num_classes),
            create_defense(name, sigma=0.5),
            seed=0,
        )
        res = sim.run()
        assert 0.0 <= res.test_acc <= 1.0, name


# -------------------------------------------------------------------------------------- accounting


def test_accounting_fields_follow_the_scenario():
    sc = Scenario.from_dict(
        dict(
            protocol="fedavg",
            clients=100,
            participation=0.1,
            rounds=10,
            batch_size=5,
            local_steps=0,
            local_epochs=1,
        )
    )
    cdp = create_defense("fed-cdp", sampling="poisson").accounting(sc, 5000)
    # the paper's model: q = B*K_t/N = 5*10/5000; L = ceil(50/5) = 10 steps per round
    assert cdp.level == "example" and cdp.sample_rate == pytest.approx(0.01) and cdp.steps == 100
    assert cdp.noise_multiplier == 6.0 and cdp.delta == 1e-5
    assert cdp.accountant.startswith("opacus-rdp; Poisson sampling at q per local step (paper's Prop. 1")
    decay = create_defense("fed-cdp-decay", sampling="poisson").accounting(sc, 5000)
    assert decay.epsilon == cdp.epsilon  # sigma fixed: the decay does not change epsilon
    sdp = create_defense("fed-sdp", sampling="poisson").accounting(sc, 5000)
    assert sdp.level == "client" and sdp.sample_rate == pytest.approx(0.1) and sdp.steps == 10
    # the default, the mechanism as simulated: 4 tensors clipped to C each -> noise multiplier sigma / 2;
    # an example of a 50-example client is in one of its 10 batches per round (one local epoch)
    cdp = create_defense("fed-cdp").accounting(sc, 5000, tensors=4)
    assert cdp.level == "example" and cdp.sample_rate == pytest.approx(0.1) and cdp.steps == 10
    assert cdp.noise_multiplier == 3.0 and "sensitivity C*sqrt(M)" in cdp.accountant
    assert create_defense("fed-cdp-decay").accounting(sc, 5000, tensors=4).epsilon == cdp.epsilon
    sdp = create_defense("fed-sdp").accounting(sc, 5000, tensors=4)
    assert sdp.level == "client" and sdp.sample_rate == pytest.approx(0.1) and sdp.steps == 10
    assert sdp.noise_multiplier == 3.0 and sdp.epsilon == pytest.approx(cdp.epsilon)  # one use per round


def test_paper_accountant_reproduces_table_vi_from_a_scenario():
    # MNIST: K=1000, K_t=100, T=100, L=100 (500 examples per client, B=5), q set to 0.01
    sc = Scenario.from_dict(
        dict(protocol="fedavg", clients=1000, participation=0.1, rounds=100, batch_size=5, local_epochs=1)
    )
    cdp = create_defense("fed-cdp", sampling="poisson", accountant="paper", sample_rate=0.01)
    cdp = cdp.accounting(sc, 500_000)
    assert cdp.steps == 10000 and cdp.epsilon == pytest.approx(0.8227, abs=5e-4)
    sdp = create_defense("fed-sdp", sampling="poisson", accountant="paper").accounting(sc, 500_000)
    assert sdp.steps == 101 and sdp.epsilon == pytest.approx(0.8536, abs=5e-4)


def test_result_rows_carry_epsilon(tmp_path):
    from fedbench.execution.cache import RunCache
    from fedbench.execution.runner import RunContext, execute
    from fedbench.spec.run import ComponentSpec, RunSpec

    sc = Scenario.from_dict(
        dict(clients=2, rounds=1, local_steps=2, batch_size=2, train_size=40, test_size=20)
    )
    spec = RunSpec(
        ComponentSpec.resolve("dataset", "digits"),
        ComponentSpec.resolve("model", "mlp", {"hidden": [8]}),
        ComponentSpec.resolve("defense", "fed-cdp", {"sigma": 1.0}),
        None,
        sc,
        0,
        preset="test",
    )
    row = execute(spec, RunCache(tmp_path / "c"), RunContext())
    assert row["status"] == "ok", row["reason"]
    assert row["dp_level"] == "example" and "client participation" in row["accountant"]
    # the MLP 784->8->10 trains 4 tensors (2 weights, 2 biases), clipped to C each
    assert "M=4 tensors" in row["accountant"] and "noise multiplier 0.5" in row["accountant"]
    assert row["delta"] == 1e-5
    assert row["epsilon"] > 0 and math.isfinite(row["epsilon"])


@pytest.mark.parametrize(
    "name,params",
    [
        ("fed-cdp", {"sigma": 0.0}),
        ("fed-cdp", {"clip": 0.0}),
        ("fed-cdp", {"sigma": -1.0}),
        ("fed-cdp", {"sample_rate": 1.5}),
        ("fed-cdp", {"delta": 1.0}),
        ("fed-sdp", {"clip": -4.0}),
        ("fed-sdp", {"delta": 0.0}),
        ("fed-cdp-decay", {"clip_end": 0.0}),
        # options of the paper's Poisson model, meaningless for the exact default: an error, not ignored
        ("fed-cdp", {"accountant": "paper"}),
        ("fed-cdp", {"sample_rate": 0.01}),
        ("fed-sdp", {"accountant": "prv"}),
        ("dp-fedavg", {"accountant": "prv"}),
        ("dp-sgd", {"accountant": "prv"}),
    ],
)
def test_bad_defense_parameters_are_usage_errors(name, params):
    from fedbench.errors import ParamError

    with pytest.raises(ParamError):
        create_defense(name, **params)


def test_participation_accounting_counts_the_steps_an_example_is_in():
    """sampling=participation (dp-sgd's default; issue 16 defect 4): a client takes part with
    probability K_t/K per round, and its examples are in one batch per local epoch."""
    from fedbench.defenses.fed_dp import Exposure, _exposure
    from fedbench.metrics.accounting import participation_epsilon

    base = dict(protocol="fedavg", clients=20, participation=0.2, rounds=10, batch_size=10)
    sc = Scenario.from_dict(base | dict(local_epochs=5))
    assert _exposure(sc, 200) == Exposure(5)  # 10 examples per client, B=10: 5 steps, each uses them all
    # 100 examples per client, 10 batches per epoch: 7 of them hold an example with probability 0.7
    assert _exposure(Scenario.from_dict(base | dict(local_steps=7)), 2000) == Exposure(0, 0.7)
    assert _exposure(Scenario.from_dict(base | dict(local_steps=25)), 2000) == Exposure(2, 0.5)
    assert _exposure(Scenario.from_dict(base | dict(local_steps=20)), 2000) == Exposure(2)
    assert _exposure(Scenario.from_dict(base | dict(local_steps=7, partition="dirichlet")), 2000) == Exposure(
        7
    )
    assert _exposure(Scenario.from_dict(base | dict(protocol="fedsgd")), 200) == Exposure(1)  # B = n
    # FedSGD: the first batch of a fresh shuffle, B = 10 of 100 records
    assert _exposure(Scenario.from_dict(base | dict(protocol="fedsgd")), 2000) == Exposure(0, 0.1)
    assert _exposure(Scenario.from_dict(base | dict(protocol="fedsgd", batch_size=0)), 2000) == Exposure(1)
    acc = create_defense("fed-cdp", sampling="participation").accounting(sc, 200, tensors=1)
    assert acc.level == "example" and "client participation" in acc.accountant
    assert acc.sample_rate == pytest.approx(0.2) and acc.steps == 50
    assert acc.epsilon == pytest.approx(participation_epsilon(6.0, 0.2, 10, 5, 1e-5).epsilon)
    poisson = create_defense("fed-cdp", sampling="poisson").accounting(sc, 200)  # 50 steps at q = 0.2
    assert poisson.epsilon < acc.epsilon


def test_dp_sgd_is_calibrated_at_the_participation_level():
    from fedbench.metrics.accounting import participation_epsilon

    sc = Scenario.from_dict(
        dict(protocol="fedavg", clients=20, participation=0.2, rounds=100, local_epochs=5, batch_size=10)
    )
    dpsgd = create_defense("dp-sgd", epsilon=4.0)
    acc = dpsgd.accounting(sc, 200)
    assert acc.epsilon <= 4.0 and acc.epsilon == pytest.approx(4.0, rel=1e-3)
    assert participation_epsilon(acc.noise_multiplier, 0.2, 100, 5, 1e-5).epsilon == pytest.approx(
        acc.epsilon
    )
    old = create_defense("dp-sgd", epsilon=4.0, sampling="poisson").accounting(sc, 200)
    assert old.epsilon == pytest.approx(4.0, rel=1e-3) and old.noise_multiplier < 0.5 * acc.noise_multiplier
    # version 1's noise is far from epsilon 4 for the mechanism as simulated
    assert participation_epsilon(old.noise_multiplier, 0.2, 100, 5, 1e-5).epsilon > 8
