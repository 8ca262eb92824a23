"""The FL simulation: protocol equivalence, determinism, observation points, hooks, per-example grads."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedbench.api import create_defense
from fedbench.data import load_dataset
from fedbench.errors import FedbenchError, RunFailure
from fedbench.fl.losses import loss_function
from fedbench.fl.per_example import per_example_grads
from fedbench.fl.simulation import ObservationRequest, Simulation
from fedbench.models import build_model
from fedbench.plugin import Defense, Scenario


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _factory(bundle, name="mlp", params=None):
    params = {"hidden": [16]} if params is None and name == "mlp" else params
    return lambda: build_model(name, params, bundle.meta.input_shape, bundle.meta.num_classes)


def _sim(bundle, defense="none", observe=None, **sc):
    base = dict(clients=4, rounds=2, batch_size=8, lr=0.1, train_size=400, test_size=200)
    base.update(sc)
    return Simulation(
        Scenario.from_dict(base), bundle, _factory(bundle), create_defense(defense), seed=3, observe=observe
    )


@pytest.mark.numeric
def test_fedavg_one_step_equals_fedsgd(digits):
    a = _sim(digits, protocol="fedsgd")
    a.run()
    b = _sim(digits, protocol="fedavg", local_steps=1)
    b.run()
    for k in a.global_state:
        assert torch.allclose(a.global_state[k], b.global_state[k], atol=1e-6), k


def test_fedavg_multi_step_differs_from_fedsgd(digits):
    a = _sim(digits, protocol="fedsgd")
    a.run()
    b = _sim(digits, protocol="fedavg", local_steps=3)
    b.run()
    assert any(not torch.allclose(a.global_state[k], b.global_state[k]) for k in a.global_state)


def test_deterministic_from_seed(digits):
    r1, r2 = _sim(digits, defense="dpg").run(), _sim(digits, defense="dpg").run()
    assert r1.history == r2.history
    r3 = Simulation(
        Scenario.from_dict(dict(clients=4, rounds=2, train_size=400, test_size=200)),
        digits,
        _factory(digits),
        create_defense("dpg"),
        seed=4,
    ).run()
    assert r3.history != r1.history


@pytest.mark.numeric
def test_training_learns(digits):
    res = _sim(digits, rounds=8, local_epochs=2, train_size=0, test_size=0).run()
    assert res.test_acc > 0.8
    assert len(res.history) == 8 and res.history[-1]["round"] == 8


@pytest.mark.parametrize(
    "point,kind",
    [
        ("step", "gradient"),
        ("update", "delta"),
        ("example", "gradient"),
        ("aggregate", "delta"),
        ("model", "model"),
    ],
)
def test_observation_points(digits, point, kind):
    obs_round = 0 if point != "model" else 0
    sim = _sim(digits, observe=ObservationRequest(point, obs_round, 2), participation=0.5)
    res = sim.run()
    obs = res.observation
    assert obs is not None and obs.point == point and obs.kind == kind
    params = dict(sim.model.named_parameters())
    if point != "model":
        assert set(obs.shared) == set(params)
        for k, v in obs.shared.items():
            assert v.shape == params[k].shape
    if point == "example":
        assert len(obs.y_true) == 1
    if point == "step":
        assert len(obs.y_true) == 8
    if point in ("step", "update", "example"):
        assert obs.client == 2  # the victim takes part even with participation 0.5


@pytest.mark.numeric
def test_step_observation_is_the_batch_gradient(digits):
    sim = _sim(digits, observe=ObservationRequest("step", 0, 0))
    obs = sim.run().observation
    model = _factory(digits)()
    model.load_state_dict(obs.global_state)
    loss = nn.functional.cross_entropy(model(obs.x_true), obs.y_true)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    for (name, _), g in zip(model.named_parameters(), grads, strict=True):
        assert torch.allclose(obs.shared[name], g, atol=1e-6)


def test_update_observation_sees_the_defense(digits):
    sim = _sim(digits, defense="sparsification", observe=ObservationRequest("update", 0, 0))
    obs = sim.run().observation
    total = sum(v.numel() for v in obs.shared.values())
    nonzero = sum(int((v != 0).sum()) for v in obs.shared.values())
    assert nonzero <= 0.11 * total


def test_stop_after_observation(digits):
    sc = Scenario.from_dict(dict(clients=4, rounds=5, observe_round=1, train_size=400, test_size=100))
    sim = Simulation(
        sc,
        digits,
        _factory(digits),
        create_defense("none"),
        0,
        observe=ObservationRequest("update", 1, 0),
        stop_after_observation=True,
    )
    res = sim.run()
    assert res.rounds_run == 2 and res.observation.round == 1


@pytest.mark.numeric
def test_per_example_grads_match_loop():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 7), nn.Tanh(), nn.Linear(7, 3))
    x, y = torch.randn(5, 3, 4), torch.randint(0, 3, (5,))
    loss_fn = loss_function("ce")
    batched = per_example_grads(model, x, y, loss_fn)
    for i in range(5):
        model.zero_grad()
        loss_fn(model(x[i : i + 1]), y[i : i + 1]).backward()
        for name, p in model.named_parameters():
            assert torch.allclose(batched[name][i], p.grad, atol=1e-6)


def test_per_example_grads_refuse_batchnorm_in_train_mode():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).train()
    with pytest.raises(ValueError, match="model_mode=eval"):
        per_example_grads(model, torch.randn(3, 4), torch.zeros(3, dtype=torch.long), loss_function("ce"))


class _Recorder(Defense):
    """Records which hooks ran (test only)."""

    name = "recorder"

    def __init__(self):
        super().__init__({})
        self.calls = []

    def prepare_data(self, x, y, ctx):
        self.calls.append(("prepare", ctx.client))
        return x, y

    def per_example(self, grads, ctx):
        self.calls.append(("per_example", next(iter(grads.values())).shape[0]))
        return {k: g.mean(0) for k, g in grads.items()}

    def step(self, grad, ctx):
        self.calls.append(("step", ctx.round))
        return grad

    def update(self, delta, ctx):
        self.calls.append(("update", ctx.client))
        return delta

    def aggregate(self, updates, weights, ctx):
        self.calls.append(("aggregate", len(updates)))
        return None


def test_every_hook_is_called(digits):
    rec = _Recorder()
    sc = Scenario.from_dict(
        dict(clients=3, rounds=2, local_steps=2, batch_size=4, train_size=60, test_size=30)
    )
    Simulation(sc, digits, _factory(digits), rec, 0).run()
    kinds = [c[0] for c in rec.calls]
    assert kinds.count("prepare") == 3  # once per client, not per round
    assert kinds.count("per_example") == 3 * 2 * 2
    assert kinds.count("step") == 3 * 2 * 2
    assert kinds.count("update") == 3 * 2
    assert kinds.count("aggregate") == 2
    assert ("per_example", 4) in rec.calls


@pytest.mark.numeric
def test_per_example_path_matches_plain_path(digits):
    """A per-example hook that just averages must give the same model as plain autograd."""
    sc = Scenario.from_dict(
        dict(clients=2, rounds=2, local_steps=2, batch_size=4, train_size=40, test_size=20)
    )
    plain = Simulation(sc, digits, _factory(digits), create_defense("none"), 0)
    plain.run()
    rec = Simulation(sc, digits, _factory(digits), _Recorder(), 0)
    rec.run()
    for k in plain.global_state:
        assert torch.allclose(plain.global_state[k], rec.global_state[k], atol=1e-5)


def test_divergence_is_a_run_failure(digits):
    with pytest.raises(RunFailure, match="non-finite"):
        _sim(digits, lr=1e6, rounds=3, local_steps=20).run()


def test_too_many_clients_is_a_clear_error(digits):
    with pytest.raises(FedbenchError, match="exceeds the 10 training examples"):
        _sim(digits, clients=20, train_size=10)


class _ZeroingServer:
    """A malicious server that sends all-zero weights in round 0 (test only)."""

    def __init__(self):
        self.rounds = []

    def broadcast(self, state, rnd):
        self.rounds.append(rnd)
        return {k: torch.zeros_like(v) if rnd == 0 else v for k, v in state.items()}


def test_malicious_server_replaces_the_model_it_sends(digits):
    server = _ZeroingServer()
    sc = Scenario.from_dict(dict(clients=3, rounds=2, train_size=60, test_size=30))
    sim = Simulation(
        sc,
        digits,
        _factory(digits),
        create_defense("none"),
        0,
        observe=ObservationRequest("update", 0, 1),
        server_hook=server,
    )
    obs = sim.run().observation
    assert server.rounds == [0, 1]
    assert all(float(v.abs().sum()) == 0 for v in obs.global_state.values())  # the victim got the poison


def test_train_and_test_size_beyond_the_dataset_take_all_of_it(digits):
    """train_size/test_size are caps (fed-cdp's 4000 on breast-cancer's 455 records takes all 455); a
    regression once indexed past the end of the training set."""
    sim = _sim(digits, train_size=10_000, test_size=10_000, rounds=1)
    assert len(sim.y_train) == len(digits.y_train) and len(sim.y_test) == len(digits.y_test)
    assert sorted(i for ix in sim.client_indices for i in ix) == list(range(len(digits.y_train)))
    sim.run()


# ---------------------------------------------------------------- issue 19: the per-client fast path


def _update(dtype16=torch.float16):
    """An update of tensors of three dtypes (finite)."""
    return {
        "a.weight": torch.randn(5, 4),
        "a.bias": torch.randn(4, dtype=torch.float64),
        "b.weight": torch.randn(3, 3).to(dtype16),
    }


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("name", ["a.weight", "a.bias", "b.weight"])
def test_finiteness_check_catches_and_names_every_non_finite_entry(bad, name):
    from fedbench.fl.simulation import _check_finite

    update = _update()
    update[name].view(-1)[-1] = bad  # the last entry: any position of any tensor is seen
    with pytest.raises(RunFailure, match=f"non-finite values in {name} of client 7's update in round 2$"):
        _check_finite(update, "of client 7's update in round 2")


def test_finiteness_check_passes_finite_updates_whose_sum_overflows():
    """The fused test sums the tensors; a finite update whose sum overflows (float16 max 65504, and
    float32 max ~3.4e38) is finite, and the exact per-tensor test then lets it pass."""
    from fedbench.fl.simulation import _check_finite

    _check_finite(_update(), "x")
    huge = {"h": torch.full((4,), 60000.0, dtype=torch.float16), "f": torch.full((3,), 3e38)}
    assert not torch.isfinite(huge["h"].sum()) and not torch.isfinite(huge["f"].sum())
    _check_finite(huge, "x")
    _check_finite({}, "x")
    # +Inf in one tensor and -Inf in another: the total is NaN, still caught, the first one named
    with pytest.raises(RunFailure, match="in p "):
        _check_finite({"p": torch.tensor([float("inf")]), "q": torch.tensor([float("-inf")])}, "x")


class _Poison(Defense):
    """Puts a non-finite value into one tensor of one client's update (test only)."""

    name = "poison"

    def __init__(self, tensor, client, rnd, value):
        super().__init__({})
        self.where = (tensor, client, rnd, value)

    def update(self, delta, ctx):
        tensor, client, rnd, value = self.where
        if (ctx.client, ctx.round) == (client, rnd):
            delta = dict(delta)
            delta[tensor] = delta[tensor].clone()
            delta[tensor].view(-1)[0] = value
        return delta


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_update_fails_the_run_and_says_where(digits, value):
    """A streamed round tests its weighted mean once (issue 29): the run fails in the round of the
    non-finite update, naming the tensor and the round."""
    sc = Scenario.from_dict(
        dict(clients=3, rounds=2, local_steps=1, batch_size=4, train_size=60, test_size=30)
    )
    sim = Simulation(sc, digits, _factory(digits), _Poison("fc2.bias", 1, 1, value), 0)
    assert sim._streaming and not sim._check_each
    where = "non-finite values in fc2.bias of the weighted mean of the 3 client updates in round 1$"
    with pytest.raises(RunFailure, match=where):
        sim.run()


class _PoisonReceived(_Poison):
    """Also has a server-side `receive` hook (identity), which could change an update after it left."""

    name = "poison-received"

    def receive(self, update, ctx):
        return update


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_with_a_receive_hook_each_update_is_tested_and_its_client_named(digits, value):
    sc = Scenario.from_dict(
        dict(clients=3, rounds=2, local_steps=1, batch_size=4, train_size=60, test_size=30)
    )
    sim = Simulation(sc, digits, _factory(digits), _PoisonReceived("fc2.bias", 1, 1, value), 0)
    assert sim._check_each
    with pytest.raises(RunFailure, match="non-finite values in fc2.bias of client 1's update in round 1"):
        sim.run()


def test_a_finite_run_is_not_failed_by_the_round_test(digits):
    """The round's test passes every finite round: a whole run of sampled, unequal clients."""
    cfg = dict(clients=10, participation=0.5, partition="dirichlet", alpha=0.3, rounds=3)
    assert _sim(digits, **cfg).run().rounds_run == 3


class _Drawer(Defense):
    """Draws two numbers from the generator of every hook call it gets (test only)."""

    name = "drawer"

    def __init__(self):
        super().__init__({})
        self.draws = []

    def _draw(self, hook, ctx):
        values = torch.rand(2, generator=ctx.generator, dtype=torch.float64).tolist()
        self.draws.append((hook, ctx.round, ctx.client, ctx.step, values))

    def step(self, grad, ctx):
        self._draw("step", ctx)
        return grad

    def update(self, delta, ctx):
        self._draw("update", ctx)
        return delta

    def receive(self, update, ctx):
        self._draw("receive", ctx)
        return update


_STREAM_SC = dict(
    clients=4, rounds=2, local_steps=2, batch_size=8, lr=0.1, train_size=400, test_size=200, participation=0.5
)


@pytest.mark.numeric
def test_hook_generator_streams_are_unchanged(digits):
    """The generators handed to the hooks give the draws they gave before they were made lazily
    (values recorded with the eager code: seed 3, participants [2, 3] then [1, 3])."""
    expected = [
        ("step", 0, 2, 0, [0.3562312334029827, 0.5252853234930952]),
        ("step", 0, 2, 1, [0.3385783006664418, 0.6735826128663602]),
        ("update", 0, 2, 0, [0.45039904745149095, 0.6000261333966362]),
        ("receive", 0, 2, 0, [0.8515954436785218, 0.35908085091475717]),
        ("step", 0, 3, 0, [0.5128609918919071, 0.34072008873924864]),
        ("step", 0, 3, 1, [0.7137016022787308, 0.9605277349955716]),
        ("update", 0, 3, 0, [0.5429180372783661, 0.30924678026969477]),
        ("receive", 0, 3, 0, [0.1930922074089998, 0.18757909399431028]),
        ("step", 1, 1, 0, [0.3915059938998564, 0.18792724400654526]),
        ("step", 1, 1, 1, [0.5669554912626203, 0.12560427769872407]),
        ("update", 1, 1, 0, [0.8716357695732494, 0.9360627840765933]),
        ("receive", 1, 1, 0, [0.6703271558799404, 0.18862288924249637]),
        ("step", 1, 3, 0, [0.125901971715357, 0.4866353376416971]),
        ("step", 1, 3, 1, [0.29870542166663305, 0.6456018724439679]),
        ("update", 1, 3, 0, [0.3743033001084013, 0.41909844135728513]),
        ("receive", 1, 3, 0, [0.05150368431189467, 0.6570339213335548]),
    ]
    drawer = _Drawer()
    Simulation(Scenario.from_dict(_STREAM_SC), digits, _factory(digits), drawer, seed=3).run()
    assert [d[:4] for d in drawer.draws] == [e[:4] for e in expected]
    for got, want in zip(drawer.draws, expected, strict=True):
        assert got[4] == pytest.approx(want[4], rel=1e-12, abs=0)


@pytest.mark.numeric
def test_dp_gaussian_noise_stream_is_unchanged(digits):
    """dp-gaussian's noise for seed 3 (per client update, the first tensor's sum) and the model it
    trains equal the values recorded before the generators were made lazily.

    The same stream gives the same draws only up to float32 rounding: torch's scalar and vectorised
    normal kernels (ATEN_CPU_CAPABILITY default vs avx2) differ in the last bits of each value, which
    moves a sum of 1024 draws by ~3e-8 of its absolute sum (a relative 1.8e-6 of a signed sum with
    cancellation, over pytest.approx's 1e-6). So each sum is compared to 1e-6 of the absolute sum it
    is made of (~8 ulp per value; ~4e-4 here): 30x the kernels' difference, and 4 orders of magnitude
    under what any other stream gives (a sum of 1024 N(0, 0.5^2) draws moves by ~16). The model sums
    likewise, to 1e-5 of the absolute parameter sum (the kernels move them by 4e-8 of it; another
    noise stream or training step moves them by whole units).
    """
    dpg = create_defense("dp-gaussian", sigma=0.5, clip=1.0)
    drawn = []
    noise = dpg.noise
    dpg.noise = lambda shape, gen, scale: drawn.append(noise(shape, gen, scale)) or drawn[-1]
    sim = Simulation(Scenario.from_dict(_STREAM_SC), digits, _factory(digits), dpg, seed=3)
    sim.run()
    assert len(drawn) == 4 * 4  # 2 rounds x 2 clients x 4 tensors
    recorded = [-15.022770769079216, 6.5352134791901335, 7.114601374458289, -36.011926220875466]
    for t, want in zip(drawn[::4], recorded, strict=True):
        t = t.double()
        assert float(t.sum()) == pytest.approx(want, rel=0, abs=1e-6 * float(t.abs().sum()))
    want = {
        "fc1.weight": -20.336024682968855,
        "fc1.bias": -0.23133303225040436,
        "fc2.weight": 6.742716699838638,
    }
    for k, v in want.items():
        p = sim.global_state[k].double()
        assert float(p.sum()) == pytest.approx(v, rel=0, abs=1e-5 * float(p.abs().sum())), k


@pytest.mark.parametrize("defense, made", [("none", 0), ("gradient-pruning", 0), ("drawer", 16)])
def test_generators_are_made_only_when_a_hook_draws(digits, monkeypatch, defense, made):
    """No generator for a defense without hooks, nor for a hook that draws nothing (gradient pruning's
    `step`); one per hook call that reads it."""
    import fedbench.fl.simulation as simulation

    calls = []
    real = simulation.torch_generator
    monkeypatch.setattr(simulation, "torch_generator", lambda *a: calls.append(a) or real(*a))
    chosen = _Drawer() if defense == "drawer" else create_defense(defense)
    Simulation(Scenario.from_dict(_STREAM_SC), digits, _factory(digits), chosen, seed=3).run()
    assert len(calls) == made


def test_a_lazy_context_keeps_one_stream_and_survives_replace(digits):
    import dataclasses

    from fedbench.fl.seeding import derive_seed

    sim = _sim(digits)
    ctx = sim._ctx(1, 2, 3, "step")
    assert "generator" not in vars(ctx)  # not made yet
    first = ctx.generator
    assert ctx.generator is first  # made once, then kept: hooks of one step share the stream
    eager = torch.Generator().manual_seed(derive_seed(3, "step", 1, 2, 3))
    assert torch.equal(torch.rand(5, generator=first), torch.rand(5, generator=eager))
    copy = dataclasses.replace(sim._ctx(1, 2, 3, "step"), step=9)
    assert copy.step == 9 and isinstance(copy.generator, torch.Generator)


def test_streamed_aggregate_equals_the_list_aggregate(digits):
    """The weighted mean summed as the updates arrive is bit for bit the one summed from the list
    (unequal client sizes, sampled participants, several local steps)."""
    cfg = dict(clients=10, participation=0.3, partition="dirichlet", alpha=0.3, local_epochs=2, rounds=3)
    streamed, listed = _sim(digits, **cfg), _sim(digits, **cfg)
    assert streamed._streaming
    listed._streaming = False
    r1, r2 = streamed.run(), listed.run()
    assert r1.history == r2.history
    for k in streamed.global_state:
        assert torch.equal(streamed.global_state[k], listed.global_state[k]), k


def test_clients_train_without_copies_of_their_data(digits):
    """Without prepare_data the batches are picked from x_train through the client's rows: no
    per-client copy is kept, and an observation is still located in the client's data."""
    sim = _sim(digits, observe=ObservationRequest("update", 1, 2))
    obs = sim.locate(sim.run().observation)
    assert set(sim._client_data) <= {2}  # only the observed client's rows were copied, for the observation
    x, _ = sim.client_data(2)
    assert obs.rows is not None and torch.equal(x[list(obs.rows)], obs.x_true)


def test_fast_load_checks_each_new_state_once(digits):
    from fedbench.fl.simulation import _Params

    model = _factory(digits)()
    params = _Params(model)
    state = {k: v.clone() + 1 for k, v in model.state_dict().items()}
    params.load(state)  # checked by load_state_dict
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3)
    params.modified()  # what the engine says after an in-place step
    params.load(state)  # the fast copy: the same values again
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    params.load(state)  # unmodified since: nothing to copy, the values stay
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    bad = dict(state)
    bad.pop(next(iter(bad)))
    with pytest.raises(RuntimeError, match="Missing key"):
        params.load(bad)


# ---------------------------------------------------------------- issue 29: the per-client fast path, part 2


def _states_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def _straightforward(sim):
    """`sim` set to the loop before issue 29: every stream seeded on its own (numpy_rng), each update
    tested, fresh deltas, every step in place and every client loaded."""
    import fedbench.fl.seeding as seeding

    for streams in (sim._orders, sim._draws):
        streams.expect = lambda coords: None  # nothing announced: each generator from numpy_rng
        assert streams.rng.__func__ is seeding.SeededStreams.rng
    sim._plain_delta = False
    sim._engine_only = False
    sim._receives = True  # `_check_each`: every update tested (an identity `receive` changes nothing)
    return sim


@pytest.mark.parametrize(
    "cfg",
    [
        dict(clients=100, participation=0.1, rounds=4, batch_size=2),  # one step per client
        dict(clients=10, participation=0.3, partition="dirichlet", alpha=0.3, local_epochs=2, rounds=3),
        dict(clients=5, rounds=3, batch_size=16, local_steps=7),  # steps across epochs
        dict(protocol="fedsgd", clients=20, participation=0.2, rounds=4),
    ],
)
def test_the_fast_loop_equals_the_straightforward_loop_bit_for_bit(digits, cfg):
    """Announced streams (batch orders and participants seeded together), the round's finiteness test,
    deltas in scratch tensors, FedAvg's last step out of place and skipped loads give the same model
    and history as the loop without them, to the last bit."""
    fast, slow = _sim(digits, **cfg), _straightforward(_sim(digits, **cfg))
    assert fast._engine_only and not fast._check_each
    r1, r2 = fast.run(), slow.run()
    assert r1.history == r2.history
    _states_equal(fast.global_state, slow.global_state)


@pytest.mark.parametrize("point", ["update", "server", "step"])
def test_observations_of_the_fast_loop_equal_the_straightforward_ones(digits, point):
    """An observation copies the delta before the weighted sum scales the scratch tensors in place."""
    cfg = dict(clients=6, participation=0.5, rounds=3, batch_size=8, local_steps=2)
    obs = ObservationRequest(point, 1, 2)
    fast = _sim(digits, observe=obs, **cfg)
    slow = _straightforward(_sim(digits, observe=obs, **cfg))
    a, b = fast.run().observation, slow.run().observation
    _states_equal(a.shared, b.shared)
    _states_equal(a.global_state, b.global_state)
    assert torch.equal(a.x_true, b.x_true) and torch.equal(a.y_true, b.y_true)
    _states_equal(fast.global_state, slow.global_state)


def test_batch_norm_models_load_every_client(digits):
    """A model with buffers (BatchNorm: a forward in train mode updates them) is never trusted to
    still hold the received state: each client reloads it, and the result equals the plain loop's."""
    cfg = dict(clients=4, rounds=2, batch_size=8, train_size=80, test_size=40)

    def sim():
        factory = _factory(digits, "convnet", {"width": 4})
        return Simulation(Scenario.from_dict(cfg), digits, factory, create_defense("none"), seed=3)

    fast, slow = sim(), _straightforward(sim())
    assert not fast._engine_only
    fast.run(), slow.run()
    _states_equal(fast.global_state, slow.global_state)


def test_the_mode_is_set_only_when_a_module_is_in_the_other_one(digits, monkeypatch):
    sim = _sim(digits, model_mode="train")
    calls = []
    real = type(sim.model).train
    monkeypatch.setattr(type(sim.model), "train", lambda m, mode=True: calls.append(mode) or real(m, mode))
    sim._set_mode()
    assert calls == []  # every module already trains
    next(iter(sim.model.children())).eval()  # e.g. a hook that left one layer in eval mode
    sim._set_mode()
    assert calls == [True] and all(m.training for m in sim.model.modules())
