"""Issue 30: dp-sgd with real Poisson sampling of local records (`sampling=poisson-records`) and the
matching amplified accountant, beside the participation accounting of the shuffled batches.

The engine draws each local step's lot with every record of the client in it independently with
probability q = B / n (`Defense.batch_sampling`, `Simulation._lots`); dp-sgd divides the lot's clipped
sum plus one N(0, sigma^2 C^2) by the expected size B; the sampled Gaussian mechanism at q for every
local step of every round calibrates sigma and gives the row's epsilon. Every other run keeps its
batches, results and run id.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedbench.api import create_defense
from fedbench.data import load_dataset
from fedbench.errors import FedbenchError, ParamError, RunFailure
from fedbench.fl.losses import loss_function
from fedbench.fl.per_example import per_example_grads
from fedbench.fl.simulation import ObservationRequest, Simulation
from fedbench.models import build_model
from fedbench.plugin import Defense, HookContext, RunData, Scenario

LOTS = {"sampling": "poisson-records"}


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _factory(bundle, name="mlp", params=None):
    params = {"hidden": [16]} if params is None else params
    return lambda: build_model(name, params, bundle.meta.input_shape, bundle.meta.num_classes)


def _sim(bundle, defense, seed=0, observe=None, model=("mlp", None), **scenario):
    base = dict(clients=1, rounds=1, batch_size=8, lr=0.1, train_size=100, test_size=100)
    return Simulation(
        Scenario.from_dict({**base, **scenario}),
        bundle,
        _factory(bundle, *model),
        defense,
        seed=seed,
        observe=observe,
    )


def _lots_of(sim, client=0, rounds=range(1), epochs=range(1)):
    """Every lot the engine draws for `client` in these rounds and epochs, as sorted index arrays."""
    n = len(sim.client_indices[client])
    return [lot.numpy() for r in rounds for e in epochs for lot in sim._batches(client, r, n, epoch=e)]


# ------------------------------------------------------------------------------------------- the lots


def test_lots_are_poisson_samples_of_expected_size_b(digits):
    """n = 100 records, B = 8: 3,900 lots (300 rounds x 13 per epoch). A lot's size is Binomial(100,
    0.08): mean 8, sd 2.71, so their mean is within 5 standard errors (0.22) of 8, and every record
    is in a fraction q of them (sd 0.0043 over 3,900 lots, 5 of them: 0.022). The draws are seeded,
    so these bounds hold for good, not with a probability."""
    sim = _sim(digits, create_defense("dp-sgd", **LOTS))
    lots = _lots_of(sim, rounds=range(300))
    sizes = np.array([len(lot) for lot in lots])
    q, n = 8 / 100, 100
    assert len(lots) == 300 * math.ceil(n / 8)
    se = math.sqrt(n * q * (1 - q) / len(lots))
    assert abs(sizes.mean() - 8) < 5 * se
    assert sizes.var() == pytest.approx(n * q * (1 - q), rel=0.1)  # binomial, not a fixed size
    assert sizes.min() < 4 and sizes.max() > 12
    counts = np.bincount(np.concatenate(lots), minlength=n) / len(lots)
    assert np.abs(counts - q).max() < 5 * math.sqrt(q * (1 - q) / len(lots))
    assert all((np.diff(lot) > 0).all() for lot in lots)  # rows in order, none twice


def test_lots_are_reproducible_and_distinct_per_round_client_and_epoch(digits):
    def draw(seed, **kw):
        return _lots_of(_sim(digits, create_defense("dp-sgd", **LOTS), seed=seed, clients=2), **kw)

    first = draw(0, rounds=range(3), epochs=range(2))
    again = draw(0, rounds=range(3), epochs=range(2))
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    other_seed = draw(1, rounds=range(3), epochs=range(2))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other_seed, strict=True))
    base = draw(0)
    for kw in (dict(rounds=range(1, 2)), dict(epochs=range(1, 2)), dict(client=1)):
        assert not all(np.array_equal(a, b) for a, b in zip(base, draw(0, **kw), strict=True)), kw


def _fixed_sigma(defense, sigma=1.0):
    """`defense` with its noise multiplier fixed (the calibration, seconds per setting, is tested apart)."""
    defense.sigma_for = lambda scenario, train_size=None: sigma
    return defense


@pytest.mark.parametrize("scenario, steps", [(dict(local_epochs=2), 26), (dict(local_steps=5), 5)])
def test_the_steps_per_round_keep_the_scenarios_count(digits, scenario, steps):
    """local_epochs x ceil(n / B) lots (100 records, B = 8: 13 per epoch), or local_steps."""
    sim = _sim(digits, _fixed_sigma(create_defense("dp-sgd", **LOTS)), **scenario)
    sizes = []
    real = sim._gradient
    sim._gradient = lambda x, *args: sizes.append(len(x)) or real(x, *args)
    sim.run()
    assert len(sizes) == steps and len(set(sizes)) > 1


# ---------------------------------------------------------------- the normalisation and an empty lot


def _bound_dpsgd(train_size=400, **params):
    d = create_defense("dp-sgd", **{**LOTS, **params})
    d.bind_data(RunData(bundle=None, train_size=train_size, test_size=0, client_indices=()))
    return d


def _ctx(sc, seed=0):
    return HookContext(0, 0, 0, sc, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("size", [0, 3, 11])
def test_a_lot_is_divided_by_the_expected_size_not_its_own(size):
    """(sum of the flat-clipped per-example gradients + N(0, sigma^2 C^2)) / B for a lot of any size,
    none included: an empty lot is the noise alone, with no forward pass."""
    sc = Scenario.from_dict(dict(clients=1, rounds=2, batch_size=8))
    torch.manual_seed(0)
    model = build_model("mlp", {"hidden": [6]}, (5,), 3)
    x, y = torch.randn(size, 5) * 5, torch.randint(0, 3, (size,))
    for way in ("ghost", "materialise"):
        d = _bound_dpsgd(per_example=way, clip=0.5)
        got = d.per_example(per_example_grads(model, x, y, loss_function("ce")), _ctx(sc))
        std = d.sigma_for(sc) * 0.5 / 8
        gen = torch.Generator().manual_seed(0)
        total = torch.zeros(size, dtype=torch.float64)
        grads = per_example_grads(model, x, y, loss_function("ce")).materialise()
        for g in grads.values():
            total += g.flatten(1).double().pow(2).sum(1)
        factor = (0.5 / total.sqrt().clamp_min(1e-12)).clamp(max=1.0)
        for name, g in grads.items():
            clipped = torch.tensordot(factor.to(g.dtype), g, dims=1) if size else torch.zeros(g.shape[1:])
            want = clipped / 8 + torch.randn(g.shape[1:], generator=gen) * std
            assert torch.allclose(got[name], want, rtol=1e-5, atol=1e-7), (way, name)
            if not size:
                assert torch.equal(got[name], want)  # the noise alone, exactly


def test_the_shuffled_batches_keep_their_own_size_as_divisor():
    sc = Scenario.from_dict(dict(clients=1, rounds=2, batch_size=8))
    assert create_defense("dp-sgd").lot_size(3, sc) == 3
    assert create_defense("dp-sgd", sampling="poisson").lot_size(3, sc) == 3
    assert create_defense("fed-cdp").lot_size(3, sc) == 3
    assert create_defense("dp-sgd", **LOTS).lot_size(3, sc) == 8


def test_a_lots_loss_is_its_sum_over_b_and_zero_when_empty(digits):
    sim = _sim(digits, create_defense("dp-sgd", **LOTS))
    x, y = sim.x_train[:5], sim.y_train[:5]
    lot = per_example_grads(sim.model, x, y, sim.loss_fn)
    assert sim._lot_loss(lot) == pytest.approx(lot.batch_loss() * 5 / 8)
    assert sim._lot_loss(per_example_grads(sim.model, x[:0], y[:0], sim.loss_fn)) == 0.0


def _count_empty(sim):
    """Wrap `sim._lots` to count the empty lots it draws; returns the counter."""
    seen = {"lots": 0, "empty": 0}
    real = sim._lots

    def counted(rng, n):
        lots = real(rng, n)
        seen["lots"] += len(lots)
        seen["empty"] += sum(1 for lot in lots if not len(lot))
        return lots

    sim._lots = counted
    return seen


@pytest.mark.parametrize(
    "model, params",
    [
        (("mlp", None), {}),  # ghost clipping
        (("mlp", None), {"per_example": "materialise"}),
        (("convnet", {"width": 4}), {"per_example": "materialise"}),  # BatchNorm (in eval mode)
    ],
)
def test_runs_with_empty_lots_complete(digits, model, params):
    """10 records per client at B = 1: a lot is empty with probability 0.9^10 = 0.35. The run trains
    through them (zero sum, the noise alone, loss 0) and stays finite, BatchNorm models included."""
    scenario = dict(clients=4, rounds=3, batch_size=1, train_size=40, test_size=40)
    if model[0] == "convnet":
        scenario["model_mode"] = "eval"  # per-example gradients of BatchNorm need it, lots or not
    sim = _sim(digits, _fixed_sigma(create_defense("dp-sgd", **LOTS, **params)), model=model, **scenario)
    seen = _count_empty(sim)
    result = sim.run()
    assert seen["lots"] == 4 * 3 * 10 and seen["empty"] > 10
    assert all(torch.isfinite(v).all() for v in sim.global_state.values())
    assert all(math.isfinite(h["train_loss"]) for h in result.history)
    assert 0.0 <= result.test_acc <= 1.0


def test_batchnorm_in_train_mode_is_refused_in_one_line(digits):
    """As for every dp-sgd run: per-example gradients cannot see through BatchNorm in train mode."""
    sim = _sim(digits, create_defense("dp-sgd", **LOTS), model=("convnet", {"width": 4}), train_size=40)
    with pytest.raises(ValueError, match="need model_mode=eval"):
        sim.run()


def test_an_observation_of_an_empty_lot_fails_the_run_with_the_reason(digits):
    """The attacker of a step whose lot is empty sees noise alone: a failed run that says so."""
    scenario = dict(clients=4, rounds=1, batch_size=1, train_size=40, test_size=40)
    d = create_defense("dp-sgd", **LOTS)
    seed = next(s for s in range(100) if not len(_lots_of(_sim(digits, d, seed=s, **scenario))[0]))
    sim = _sim(digits, d, seed=seed, observe=ObservationRequest("step", 0, 0), **scenario)
    with pytest.raises(RunFailure, match="holds no record"):
        sim.run()


# ------------------------------------------------------------------------------------ the accountant


def _setting(clients: int) -> Scenario:
    """4,000 records, B = 64, 20 rounds of one local epoch, every client in every round."""
    return Scenario.from_dict(
        dict(protocol="fedavg", clients=clients, rounds=20, local_epochs=1, batch_size=64, train_size=4000)
    )


@pytest.mark.parametrize("target", [1.0, 4.0, 8.0])
@pytest.mark.parametrize("clients", [1, 10])
def test_the_calibrated_sigma_meets_the_target_and_is_amplified(clients, target):
    """One client of 4,000 records: q = 64/4000 for 20 x 63 lots; ten of 400: q = 0.16 for 20 x 7. The
    amplified sigma is far below the participation accounting's (one shuffled batch per epoch, no
    amplification) for the same target."""
    sc = _setting(clients)
    lots = create_defense("dp-sgd", epsilon=target, **LOTS).accounting(sc, 4000)
    n = 4000 // clients
    assert lots.sample_rate == pytest.approx(64 / n) and lots.steps == 20 * math.ceil(n / 64)
    assert lots.epsilon <= target and lots.epsilon == pytest.approx(target, rel=1e-3)
    participation = create_defense("dp-sgd", epsilon=target).accounting(sc, 4000)
    assert participation.epsilon <= target
    assert lots.noise_multiplier < 0.75 * participation.noise_multiplier


@pytest.mark.parametrize("clients", [1, 10])
def test_the_epsilon_is_opacus_rdp_for_q_sigma_and_steps(clients):
    """The row's epsilon is Opacus' RDPAccountant for (sigma, q, steps), computed directly, to 1e-6 (the
    optimum lies inside Opacus' own orders here; fedbench's list only adds larger ones)."""
    from opacus.accountants import RDPAccountant

    acc = create_defense("dp-sgd", epsilon=4.0, **LOTS).accounting(_setting(clients), 4000)
    opacus = RDPAccountant()
    opacus.history = [(acc.noise_multiplier, acc.sample_rate, acc.steps)]
    assert acc.epsilon == pytest.approx(opacus.get_epsilon(delta=1e-5), abs=1e-6, rel=0)
    assert acc.epsilon <= 4.0 and acc.accountant.startswith("opacus-rdp; Poisson lots as simulated")


def test_participation_below_one_counts_every_round_and_says_it_is_a_bound():
    full = create_defense("dp-sgd", **LOTS).accounting(_setting(10), 4000)
    sc = _setting(10).replace(participation=0.3)
    part = create_defense("dp-sgd", **LOTS).accounting(sc, 4000)
    assert (part.sample_rate, part.steps, part.noise_multiplier) == (
        full.sample_rate,
        full.steps,
        full.noise_multiplier,
    )
    assert "3 of 10 clients drawn per round" in part.accountant and "upper bound" in part.accountant
    assert "upper bound" not in full.accountant


def test_unequal_clients_take_the_smallest_q_and_the_largest_lot_count():
    """4,001 records over 10 clients: 400 or 401 each; q = 64/400 and ceil(401/64) = 7 lots."""
    acc = create_defense("dp-sgd", **LOTS).accounting(_setting(10), 4001)
    assert acc.sample_rate == pytest.approx(64 / 400) and acc.steps == 20 * 7
    assert "clients of 400-401 records" in acc.accountant
    shards = _setting(10).replace(partition="shards", shards_per_client=2)
    assert create_defense("dp-sgd", **LOTS).accounting(shards, 4001).sample_rate == pytest.approx(64 / 400)


def test_the_other_accounting_models_are_unchanged():
    """participation and poisson compute what they did (values of the code before issue 30)."""
    sc = Scenario.from_dict(
        dict(protocol="fedavg", clients=20, participation=0.2, rounds=100, local_epochs=5, batch_size=10)
    )
    sigma = create_defense("dp-sgd", epsilon=4.0).sigma_for(sc, 200)
    assert sigma == pytest.approx(11.582561809566723, rel=1e-9)
    old = create_defense("dp-sgd", epsilon=4.0, sampling="poisson").accounting(sc, 200)
    assert (old.noise_multiplier, old.sample_rate, old.steps) == pytest.approx((5.285375736918022, 0.2, 500))
    assert old.epsilon == pytest.approx(3.9997731221521007, rel=1e-9)
    assert old.accountant.endswith(
        "Poisson sampling at q per local step (paper's Prop. 1; not the simulated mechanism)"
    )


# ---------------------------------------------------------------------------------- end to end, ids


def _spec(params, **scenario):
    from fedbench.spec.run import ComponentSpec, RunSpec

    sc = dict(clients=2, rounds=2, local_steps=2, batch_size=4, lr=0.1, train_size=40, test_size=20)
    return RunSpec(
        ComponentSpec.resolve("dataset", "digits"),
        ComponentSpec.resolve("model", "mlp", {"hidden": [8]}),
        ComponentSpec.resolve("defense", "dp-sgd", params),
        None,
        Scenario.from_dict({**sc, **scenario}),
        0,
        preset="test",
    )


def test_a_run_through_the_runner_reports_epsilon_at_most_the_target(tmp_path):
    from fedbench.execution.cache import RunCache
    from fedbench.execution.runner import RunContext, execute

    spec = _spec({"epsilon": 2.0, **LOTS}, local_steps=0, local_epochs=1, batch_size=5)
    row = execute(spec, RunCache(tmp_path / "cache"), RunContext())
    assert row["status"] == "ok", row["reason"]
    assert row["epsilon"] <= 2.0 and row["epsilon"] == pytest.approx(2.0, rel=1e-3)
    assert row["dp_level"] == "example" and "Poisson lots as simulated" in row["accountant"]
    assert row["defense"] == "dp-sgd[epsilon=2,sampling=poisson-records]"
    assert 0.0 <= row["test_acc"] <= 1.0


def test_existing_run_ids_are_unchanged_and_the_new_value_has_its_own():
    """Run ids of the code before issue 30 (a utility run of each): the new value of `sampling`
    enters only the keys of the runs that use it."""
    assert _spec({}).utility_id == "aa62604112db1166"
    assert _spec({"sampling": "participation"}).utility_id == "aa62604112db1166"
    assert _spec({"sampling": "poisson"}).utility_id == "e616f22d963a173d"
    assert _spec({"per_example": "materialise", "epsilon": 1.0}).utility_id == "a63032a9e00b2edc"
    assert _spec(LOTS).defense.key()["params"]["sampling"] == "poisson-records"
    assert _spec(LOTS).utility_id not in ("aa62604112db1166", "e616f22d963a173d")


# ---------------------------------------------------------------------- every other run is unchanged


def test_every_other_defense_keeps_the_shuffled_batches():
    from fedbench.registry import registry_for

    defenses = registry_for("defense")
    for name in defenses.names():
        assert defenses.get(name)().batch_sampling() == "shuffle", name
    assert Defense.batch_sampling(create_defense("none")) == "shuffle"
    assert create_defense("dp-sgd", sampling="poisson").batch_sampling() == "shuffle"
    assert create_defense("dp-sgd", **LOTS).batch_sampling() == "poisson"


@pytest.mark.parametrize(
    "defense, params", [("none", {}), ("dp-sgd", {}), ("dp-sgd", {"sampling": "poisson"}), ("fed-cdp", {})]
)
def test_the_default_path_never_draws_a_lot(digits, monkeypatch, defense, params):
    def refuse(self, rng, n):
        raise AssertionError("a Poisson lot was drawn")

    monkeypatch.setattr(Simulation, "_lots", refuse)
    chosen = create_defense(defense, **params)
    chosen = _fixed_sigma(chosen) if defense == "dp-sgd" else chosen
    sim = _sim(digits, chosen, clients=2, local_steps=3, batch_size=8)
    assert not sim._poisson
    sim.run()


#: Parameter sums of runs of the code before issue 30 (seed 3; 4 clients of 100 digits, 2 rounds of 3
#: local steps at B = 8, MLP 64-16-10), compared to 1e-5 of the absolute sum as in
#: test_fl.test_dp_gaussian_noise_stream_is_unchanged (torch's kernels may move the last bits across
#: machines; another batch, normalisation or noise stream moves the sums by whole units). On the
#: machine that recorded them, the weights of these runs were equal to the last bit.
RECORDED = {
    "none": ({}, [-1.337881487706909, -0.028458112850785255, 2.7825376202818006, 0.027546673081815243]),
    "ghost": ({}, [-1.0769504924537614, 0.05702826951164752, 3.1364207062870264, 0.03954995051026344]),
    "materialise": (
        {"per_example": "materialise"},
        [-1.076950488728471, 0.05702826951164752, 3.136420652270317, 0.03954995051026344],
    ),
}


@pytest.mark.numeric
@pytest.mark.parametrize("case", list(RECORDED))
def test_existing_runs_train_the_weights_they_trained_before(digits, case):
    params, sums = RECORDED[case]
    defense = create_defense("none" if case == "none" else "dp-sgd", **params)
    sc = dict(clients=4, rounds=2, batch_size=8, lr=0.1, train_size=400, test_size=200, local_steps=3)
    sim = _sim(digits, defense, seed=3, **sc)
    sim.run()
    for (name, p), want in zip(sim.global_state.items(), sums, strict=True):
        p = p.double()
        assert float(p.sum()) == pytest.approx(want, rel=0, abs=1e-5 * float(p.abs().sum())), name


# --------------------------------------------------------------------------------- negative paths


@pytest.mark.parametrize(
    "scenario, says",
    [
        (dict(protocol="fedsgd"), "use protocol=fedavg"),
        (dict(batch_size=0), "set batch_size > 0"),
        (dict(partition="dirichlet"), "use partition=iid or shards"),
    ],
)
def test_combinations_without_poisson_lots_are_refused_in_one_line(scenario, says):
    sc = Scenario.from_dict({**dict(clients=2, rounds=2, batch_size=4), **scenario})
    reason = create_defense("dp-sgd", **LOTS).check(sc)
    assert reason and says in reason and "sampling=poisson-records" in reason and "\n" not in reason
    assert create_defense("dp-sgd").check(sc) is None  # the other models run there as before
    with pytest.raises(FedbenchError, match=says):
        create_defense("dp-sgd", **LOTS).accounting(sc, 400)


def test_a_refused_combination_is_a_skipped_row(tmp_path):
    from fedbench.execution.cache import RunCache
    from fedbench.execution.runner import RunContext, execute

    row = execute(_spec(LOTS, protocol="fedsgd"), RunCache(tmp_path / "cache"), RunContext())
    assert row["status"] == "skipped" and "use protocol=fedavg" in row["reason"]


@pytest.mark.parametrize(
    "params, says",
    [({"noise": "example"}, "use noise=batch"), ({"sample_rate": 0.01}, "drop sample_rate")],
)
def test_parameters_without_meaning_for_lots_are_refused(params, says):
    with pytest.raises(ParamError, match=says):
        create_defense("dp-sgd", **LOTS, **params)
    create_defense("dp-sgd", accountant="prv", **LOTS)  # the accountant applies to the lots
    with pytest.raises(ParamError, match="add sampling=poisson"):
        create_defense("dp-sgd", accountant="prv")  # as before: not to the participation model


def test_a_batch_larger_than_the_smallest_client_is_refused(digits):
    sc = Scenario.from_dict(dict(clients=10, rounds=2, batch_size=64))
    with pytest.raises(FedbenchError, match="batch_size=64 exceeds the smallest client's 40 records"):
        create_defense("dp-sgd", **LOTS).accounting(sc, 400)
    sim = _sim(digits, create_defense("dp-sgd", **LOTS), clients=4, batch_size=32, train_size=40)
    with pytest.raises(FedbenchError, match="lower batch_size"):
        sim.run()


def test_the_engine_refuses_lots_without_a_per_example_hook(digits):
    class Lots(Defense):
        name = "lots-only"

        def batch_sampling(self):
            return "poisson"

    with pytest.raises(FedbenchError, match="without a per_example hook"):
        _sim(digits, Lots())
