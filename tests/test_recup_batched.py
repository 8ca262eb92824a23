"""recup-fl's batched FGSM (issue 29): the same draws and the same perturbation as one update at a time
(signs may differ only where a gradient is within rounding of zero), the old path by name, and the
engine's batched `update` hook (`Defense.update_batch`) in the simulation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedbench import registry
from fedbench.attacks._attribute_core import FeatureMap, UpdateLayout
from fedbench.data import load_dataset
from fedbench.defenses import _recup_core
from fedbench.defenses._recup_core import draw_members, loss_grad, loss_grads, perturb, perturb_batch
from fedbench.fl.simulation import ObservationRequest, Simulation
from fedbench.models import build_model
from fedbench.plugin import Defense, HookContext, RunData, Scenario
from fedbench.spec.run import ComponentSpec

VARIANTS = ("meta", "one-step", "average", "iterative", "momentum")
TINY_ZOO = {"zoo": 3, "widths": [16], "epochs": 5, "p": 3, "q": 2, "pool_size": 200}
#: A quantity counts as near zero below this fraction of its row's (or layer's) largest magnitude: the
#: batched and one-row products differ by float32 rounding (~1e-7 relative), 100x below it. The one-row
#: and the batched gradient can differ only through such a quantity: a coordinate of the gradient (its
#: sign flips), a hidden ReLU pre-activation at the kink (the unit's gradient path opens or closes:
#: measured on the attribute board's case, a pre-activation of 1.6e-6 at scale 30 computed as 0.0 in a
#: batch, which moved that step's gradient by 15 %), or a saturated loss (all of a row's gradient near
#: 1e-31, its signs arbitrary).
NEAR_ZERO = 1e-5
SATURATED = 1e-20


def _fragile(member: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> bool:
    """Whether `loss_grad(member, x, .)` = grad went through a quantity within rounding of zero."""
    nonzero = grad[grad != 0].abs()
    if len(nonzero) and (nonzero.max() < SATURATED or (nonzero < NEAR_ZERO * nonzero.max()).any()):
        return True
    h = member[0](x.unsqueeze(0))
    layers = list(member[1])
    for layer, after in zip(layers, layers[1:] + [None], strict=True):
        h = layer(h)
        if isinstance(layer, nn.Linear) and isinstance(after, nn.ReLU):
            if bool((h.abs() < NEAR_ZERO * h.abs().max()).any()):
                return True
    return False


def _zoo(dim: int = 24, size: int = 4, classes: int = 3) -> list[nn.Module]:
    """Zoo members as RecUP-FL builds them: a max-pool feature map (window 2) before an MLP, eval mode."""
    torch.manual_seed(0)
    layout = UpdateLayout(("w", "b"), ((dim - 4,), (4,)))
    zoo = []
    for _ in range(size):
        fmap = FeatureMap(layout, 2)
        net = nn.Sequential(
            nn.Linear(fmap.dim, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, classes)
        )
        zoo.append(nn.Sequential(fmap, net).eval().requires_grad_(False))
    return zoo


def _record_gradients(monkeypatch) -> list[tuple[int, bool]]:
    """Make `perturb`'s `loss_grad` log (id of the zoo member, whether the call was `_fragile`)."""
    log = []

    def logged(model, x, label):
        g = loss_grad(model, x, label)
        log.append((id(model), _fragile(model, x, g)))
        return g

    monkeypatch.setattr(_recup_core, "loss_grad", logged)
    return log


def test_batched_gradients_equal_the_one_row_gradients_to_rounding():
    zoo = _zoo()
    torch.manual_seed(1)
    x, labels = torch.randn(40, 24), torch.randint(0, 3, (40,))
    for member in zoo:
        batch = loss_grads(member, x, labels)
        rows = torch.stack([loss_grad(member, x[i], labels[i]) for i in range(len(x))])
        clear = [i for i in range(len(x)) if not _fragile(member, x[i], rows[i])]
        assert len(clear) >= 0.9 * len(x)
        # the max-pool's zeros are exact in both; signs agree wherever rounding met no zero
        assert torch.equal(batch == 0, rows == 0)
        assert torch.equal(torch.sign(batch[clear]), torch.sign(rows[clear]))
        assert torch.allclose(batch[clear], rows[clear], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("variant", VARIANTS)
def test_batched_perturbation_equals_per_record_but_where_rounding_meets_zero(variant, monkeypatch):
    """Every row whose one-at-a-time perturbation met no quantity within rounding of zero (`_fragile`)
    is equal bit for bit; the others stay within the perturbation budget."""
    zoo = _zoo()
    torch.manual_seed(2)
    n, eps, p, q = 48, 0.05, 3, 3
    g, labels = torch.randn(n, 24), torch.randint(0, 3, (n,))
    draws = [draw_members(len(zoo), q, p, variant, torch.Generator().manual_seed(i)) for i in range(n)]
    batch = perturb_batch(g, labels, zoo, eps, draws, variant)
    log = _record_gradients(monkeypatch)
    clear = 0
    for i in range(n):
        del log[:]
        one = perturb(g[i], int(labels[i]), zoo, eps, p, q, variant, torch.Generator().manual_seed(i))
        if not any(fragile for _, fragile in log):
            clear += 1
            assert torch.equal(batch[i], one), (variant, i)
        else:  # a flipped sign moves coordinates by multiples of the step, never more than the budget
            bound = p * eps if variant == "meta" else eps
            assert float((batch[i] - g[i]).abs().max()) <= bound + 1e-6
    assert clear >= 0.9 * n  # the comparison covers nearly every row


@pytest.mark.parametrize("variant", VARIANTS)
def test_draws_are_the_per_record_draws_in_order(variant, monkeypatch):
    """`draw_members` takes from a record's generator what `perturb` takes, in the order it uses them."""
    zoo = _zoo(size=5)
    log = _record_gradients(monkeypatch)
    gen_one, gen_batch = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    perturb(torch.randn(24), 1, zoo, 0.01, 4, 3, variant, gen_one)
    draws = draw_members(len(zoo), 3, 4, variant, gen_batch)
    index = {id(m): i for i, m in enumerate(zoo)}
    used = [draw[0] for draw in draws] if variant == "one-step" else [m for draw in draws for m in draw]
    assert [index[mid] for mid, _ in log] == used
    assert torch.equal(gen_one.get_state(), gen_batch.get_state())  # nothing more, nothing less drawn


def _bound(params: dict, clients: int):
    bundle = load_dataset("adult")
    sc = Scenario.from_dict({"protocol": "fedsgd", "clients": clients, "batch_size": 0, "lr": 0.1})
    defense = registry.defenses.get("recup-fl")(params)
    defense.bind_data(RunData(bundle, clients, 50, tuple((i,) for i in range(clients)), scenario=sc))
    return defense, sc


def _contexts(sc, model, clients: int) -> list[HookContext]:
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return [
        HookContext(0, c, 0, sc, torch.Generator().manual_seed(100 + c), model, global_state=state)
        for c in range(clients)
    ]


@pytest.mark.numeric
def test_the_defense_batched_and_per_record_by_name(monkeypatch):
    """`fgsm=per-record` is the old path (perturb, one update at a time), `batched` the default; with two
    attributes and per-client groups the batch equals it but for near-zero gradient signs."""
    clients = 12
    torch.manual_seed(4)
    model = build_model("mlp", {"hidden": [4]}, (103,), 2)
    deltas = [{n: torch.randn_like(t) * 0.01 for n, t in model.named_parameters()} for _ in range(clients)]
    params = {**TINY_ZOO, "eps": 0.01, "attributes": ["race", "sex"], "assign": "race+sex|sex|none"}
    batched, sc = _bound(params, clients)
    old, _ = _bound({**params, "fgsm": "per-record"}, clients)
    assert batched.params.fgsm == "batched"
    out_b = batched.update_batch(deltas, _contexts(sc, model, clients))
    out_o = old.update_batch(deltas, _contexts(sc, model, clients))
    # the old path by name is `perturb` per client and attribute, as before the batch existed
    layout, zoos = old._zoos(_contexts(sc, model, 1)[0], ("race", "sex"))
    for c, ctx in enumerate(_contexts(sc, model, clients)):
        attrs = old.protected(c)
        if not attrs:
            assert out_o[c] is deltas[c] and out_b[c] is deltas[c]
            continue
        g = layout.flatten(deltas[c])
        peb = 0.0
        for a in attrs:
            label = old._client_label(c, a)
            peb = peb + 0.5 * (perturb(g, label, zoos[a], 0.01, 3, 2, "meta", ctx.generator) - g)
        assert torch.equal(layout.flatten(out_o[c]), g + peb)
    log = _record_gradients(monkeypatch)
    for c, ctx in enumerate(_contexts(sc, model, clients)):
        del log[:]
        one = old.update_batch([deltas[c]], [ctx])[0]
        if not any(fragile for _, fragile in log):
            assert all(torch.equal(out_b[c][k], one[k]) for k in one), c


def test_fgsm_at_its_default_keeps_the_run_ids():
    plain = ComponentSpec.resolve("defense", "recup-fl", {"eps": 0.001})
    assert (
        plain.key() == ComponentSpec.resolve("defense", "recup-fl", {"eps": 0.001, "fgsm": "batched"}).key()
    )
    assert "fgsm" not in plain.key()["params"]
    old = ComponentSpec.resolve("defense", "recup-fl", {"eps": 0.001, "fgsm": "per-record"})
    assert old.key() != plain.key() and old.key()["params"]["fgsm"] == "per-record"
    with pytest.raises(Exception, match="fgsm"):
        ComponentSpec.resolve("defense", "recup-fl", {"fgsm": "loop"})


# ------------------------------------------------------------------------------- the engine's hook


class _Noisy(Defense):
    """Adds generator noise in `update` and at the server (test only); logs each hook's batch."""

    name = "noisy"

    def __init__(self):
        super().__init__({})
        self.calls: list[tuple[str, int, tuple[int, ...]]] = []

    def update(self, delta, ctx):
        return {k: v + 0.01 * torch.randn(v.shape, generator=ctx.generator) for k, v in delta.items()}

    def receive(self, update, ctx):
        return {k: v + 0.01 * torch.randn(v.shape, generator=ctx.generator) for k, v in update.items()}


class _NoisyBatched(_Noisy):
    def update_batch(self, deltas, ctxs):
        self.calls.append(("update_batch", ctxs[0].round, tuple(c.client for c in ctxs)))
        return [self.update(d, c) for d, c in zip(deltas, ctxs, strict=True)]


@pytest.mark.parametrize("point", ["update", "server"])
def test_the_simulation_batches_a_rounds_updates_with_the_same_results(point):
    digits = load_dataset("digits")
    sc = Scenario.from_dict(
        dict(clients=6, rounds=2, batch_size=8, lr=0.1, train_size=300, test_size=100, participation=0.5)
    )

    def run(defense):
        factory = lambda: build_model("mlp", {"hidden": [8]}, digits.meta.input_shape, 10)  # noqa: E731
        observe = ObservationRequest(point, 1, 0, cohort=True)
        sim = Simulation(sc, digits, factory, defense, seed=3, observe=observe)
        return sim, sim.run()

    one_sim, one = run(_Noisy())
    batched = _NoisyBatched()
    batch_sim, batch = run(batched)
    # one call per round with its participants, in order
    assert [(r, len(c)) for _, r, c in batched.calls] == [(0, 3), (1, 3)]
    assert one.history == batch.history
    assert all(torch.equal(one_sim.global_state[k], batch_sim.global_state[k]) for k in one_sim.global_state)
    cohort_one, cohort_batch = one.observation.cohort, batch.observation.cohort
    assert [o.client for o in cohort_one] == [o.client for o in cohort_batch] and cohort_one
    for a, b in zip(cohort_one, cohort_batch, strict=True):
        assert all(torch.equal(a.shared[k], b.shared[k]) for k in a.shared)


@pytest.mark.numeric
def test_recup_in_the_simulation_perturbs_a_round_in_one_batch():
    """A RecUP-FL round through the simulation's batched hook: one call for the round's 16 clients, and
    the model it trains is the per-record one's, up to the budget of the updates a rounding flip moved
    (each within P * eps of the same update; the detailed equality is tested on the hook above)."""
    bundle = load_dataset("adult")
    sc = Scenario.from_dict(
        dict(protocol="fedsgd", clients=16, rounds=1, batch_size=0, lr=0.5, train_size=16, test_size=200)
    )
    states, calls = {}, []
    for fgsm in ("batched", "per-record"):
        _recup_core.clear_memo()
        defense = registry.defenses.get("recup-fl")({**TINY_ZOO, "eps": 0.01, "fgsm": fgsm})
        real = defense.update_batch
        defense.update_batch = lambda d, c, real=real, fgsm=fgsm: calls.append((fgsm, len(d))) or real(d, c)
        factory = lambda: build_model("mlp", {"hidden": [8]}, (103,), 2)  # noqa: E731
        sim = Simulation(sc, bundle, factory, defense, seed=1)
        sim.run()
        states[fgsm] = sim.global_state
    assert calls == [("batched", 16), ("per-record", 16)]  # per-record: the hook loops over the clients
    budget = 0.5 * 2 * TINY_ZOO["p"] * 0.01  # lr x the widest gap between two perturbations of one update
    for k, v in states["batched"].items():
        assert float((v - states["per-record"][k]).abs().max()) <= budget + 1e-6, k


def test_zoo_training_is_bit_for_bit_torch_sgd():
    """`train_classifier` writes SGD's step out (the zoo's training cost): the same weights as the
    `torch.optim.SGD` loop it replaced."""
    from fedbench.attacks._attribute_core import mlp, train_classifier

    torch.manual_seed(5)
    feats, labels = torch.randn(150, 12), torch.randint(0, 3, (150,))
    torch.manual_seed(6)
    net = mlp(12, (16, 8, 8), 3)
    ref = mlp(12, (16, 8, 8), 3)
    ref.load_state_dict(net.state_dict())
    train_classifier(net, feats, labels, 3, 0.05, 32, seed=9)
    gen, opt = torch.Generator().manual_seed(9), torch.optim.SGD(ref.parameters(), lr=0.05)
    for _ in range(3):
        order = torch.randperm(150, generator=gen)
        for i in range(0, 150, 32):
            opt.zero_grad()
            nn.functional.cross_entropy(ref(feats[order[i : i + 32]]), labels[order[i : i + 32]]).backward()
            opt.step()
    assert not net.training
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), ref.parameters(), strict=True))
