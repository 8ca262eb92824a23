"""Issue 19: Fed-CDP's clipped mean from ghost norms equals the torch.func path to float tolerance.

The ghost path (`fed-cdp[per_example=ghost]`, the default since issue 29, `fedbench.fl.ghost`) computes
per-layer per-example norms from activations and output gradients and the clipped mean without [B, ...]
buffers; `materialise` keeps the torch.func per-example gradients and the results of the runs before
(issue 29's own tests: `tests/test_cdp_default.py`).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedbench.api import create_defense
from fedbench.data import load_dataset
from fedbench.fl.ghost import coverage
from fedbench.fl.losses import loss_function
from fedbench.fl.per_example import PerExampleGrads, per_example_grads, vmap_per_example_grads
from fedbench.fl.simulation import Simulation
from fedbench.models import build_model
from fedbench.plugin import HookContext, Scenario

# every model Fed-CDP is run with, at the paper's input shape
MODELS = [
    ("mlp", {"hidden": [256, 256]}),  # the MLP 784-256-256-10 of the benchmark
    ("mlp", {"hidden": [600, 100], "bias": False}),  # spec 002's tabular MLP
    ("cdp-cnn", {}),  # the Fed-CDP CNN (no biases)
    ("cdp-cnn", {"bias": True}),
    ("lenet", {}),  # DLG's LeNet: 5x5 convs with strides 2, 2, 1, 1 and biases
]


def _batch(n=12, shape=(1, 28, 28), seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *shape, generator=g), torch.randint(0, 10, (n,), generator=g)


def _ctx(seed=0, rnd=0, rounds=5):
    gen = torch.Generator().manual_seed(seed)
    return HookContext(round=rnd, client=0, step=0, scenario=Scenario(rounds=rounds), generator=gen)


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-5) -> bool:
    """Equal to float32 tolerance relative to the tensor's scale."""
    return bool((a - b).abs().max() <= rtol * b.abs().max().clamp_min(1e-30))


@pytest.mark.numeric
@pytest.mark.parametrize("loss", ["ce", "mse"])
@pytest.mark.parametrize("name,params", MODELS)
def test_ghost_norms_and_weighted_mean_equal_torch_func(name, params, loss):
    torch.manual_seed(0)
    model = build_model(name, params, (1, 28, 28), 10)
    assert coverage(model) is None
    x, y = _batch()
    grads = per_example_grads(model, x, y, loss_function(loss))
    ghost = grads.ghost()
    assert ghost is not None and not grads.materialised  # no [B, ...] buffers made
    ref = vmap_per_example_grads(model, x, y, loss_function(loss))
    factors = {k: torch.rand(len(x), generator=torch.Generator().manual_seed(1)) for k in ref}
    means = ghost.weighted_mean(factors)
    assert list(ghost.norms()) == list(ref) == list(means)
    for k, g in ref.items():
        norms = torch.linalg.vector_norm(g.flatten(1), dim=1)
        assert torch.allclose(ghost.norms()[k], norms, rtol=1e-5, atol=1e-9), k
        assert _close(means[k], torch.tensordot(factors[k], g, dims=1) / len(x)), k


@pytest.mark.numeric
@pytest.mark.parametrize("noise", ["batch", "example"])
@pytest.mark.parametrize("name,params", MODELS)
def test_fed_cdp_ghost_equals_materialise(name, params, noise):
    """The defense's output (clipped mean + the same noise draws) agrees to float tolerance, with
    clipping active (C below most per-example norms) and inactive on some layers."""
    torch.manual_seed(0)
    model = build_model(name, params, (1, 28, 28), 10)
    x, y = _batch(16)
    loss_fn = loss_function("ce")
    for clip in (0.05, 4.0):
        kw = {"sigma": 1e-3, "clip": clip, "noise": noise}
        old = create_defense("fed-cdp", per_example="materialise", **kw)
        old = old.per_example(per_example_grads(model, x, y, loss_fn), _ctx())
        grads = per_example_grads(model, x, y, loss_fn)
        new = create_defense("fed-cdp", **kw).per_example(grads, _ctx())  # the default: ghost
        assert not grads.materialised
        for k in old:
            assert _close(new[k], old[k]), (clip, k)


@pytest.mark.numeric
def test_fed_cdp_decay_ghost_uses_the_round_bound():
    torch.manual_seed(0)
    model = build_model("cdp-cnn", {}, (1, 28, 28), 10)
    x, y = _batch(8)
    loss_fn = loss_function("ce")
    for rnd in (0, 9):
        a = create_defense("fed-cdp-decay", sigma=1e-4, per_example="materialise")
        b = create_defense("fed-cdp-decay", sigma=1e-4)  # the default: ghost
        old = a.per_example(per_example_grads(model, x, y, loss_fn), _ctx(rnd=rnd, rounds=10))
        new = b.per_example(per_example_grads(model, x, y, loss_fn), _ctx(rnd=rnd, rounds=10))
        for k in old:
            assert _close(new[k], old[k]), (rnd, k)


class _Positions(nn.Module):
    """Layers applied at several positions: a conv with few output positions and many channels (the
    Gram-matrix ghost norm), a conv with many positions (per-example weight gradients) and a Linear on
    [B, T, d] inputs, both ways."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Conv2d(1, 3, 3, padding=1, stride=1)  # 8x8 positions: materialised
        self.deep = nn.Conv2d(3, 40, 3, stride=3, dilation=2, padding=(1, 2))  # 2x3 positions: Gram
        self.tokens = nn.Linear(6, 50)  # T = 40 tokens of width 6: 2 T^2 >= 50*6, materialised
        self.mix = nn.Linear(50, 80)  # T = 40: 2 T^2 < 50*80, Gram
        self.head = nn.Linear(80, 10, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.deep(torch.tanh(self.wide(x))))  # [B, 40, 2, 3]
        h = torch.tanh(self.mix(torch.tanh(self.tokens(h.flatten(2)))))  # [B, 40, 80]
        return self.head(h.mean(1))


@pytest.mark.numeric
@pytest.mark.parametrize("loss", ["ce", "mse"])
def test_ghost_norms_at_several_positions(loss):
    torch.manual_seed(0)
    model = _Positions()
    x, y = _batch(6, (1, 8, 8))
    grads = per_example_grads(model, x, y, loss_function(loss))
    ghost = grads.ghost()
    assert ghost is not None
    ref = vmap_per_example_grads(model, x, y, loss_function(loss))
    layers = {layer.weight: layer for layer in ghost._layers}
    factors = {k: torch.linspace(0.2, 1.0, len(x)) for k in ref}
    means = ghost.weighted_mean(factors)
    # the two ways of each layer type were both taken
    assert layers["wide.weight"].full is not None and layers["deep.weight"].patches is not None
    assert layers["tokens.weight"].full is not None and layers["mix.weight"].full is None
    for k, g in ref.items():
        assert torch.allclose(ghost.norms()[k], torch.linalg.vector_norm(g.flatten(1), dim=1), rtol=1e-4), k
        assert _close(means[k], torch.tensordot(factors[k], g, dims=1) / len(x), rtol=1e-4), k


class _Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.fc(x)))


@pytest.mark.parametrize(
    "factory,problem",
    [
        (
            lambda: nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3)),
            "LayerNorm has parameters",
        ),
        (lambda: nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8).eval(), nn.Linear(8, 3)), "BatchNorm1d"),
        (
            lambda: nn.Sequential(
                nn.Unflatten(1, (1, 2, 2)), nn.Conv2d(1, 3, 1, padding_mode="reflect"), nn.Flatten()
            ),
            "padding_mode=reflect",
        ),
        (
            lambda: nn.Sequential(nn.Unflatten(1, (2, 1, 2)), nn.Conv2d(2, 6, 1, groups=2), nn.Flatten()),
            "grouped",
        ),
        (_Twice, "called 2 times"),
    ],
)
def test_uncovered_models_fall_back_to_torch_func_bit_for_bit(factory, problem):
    """A layer the ghost path does not cover: `per_example=ghost` gives exactly the materialised result."""
    torch.manual_seed(0)
    model = factory()
    if isinstance(model, nn.Sequential) and isinstance(model[1], nn.BatchNorm1d):
        model.eval()  # BatchNorm has per-example gradients in eval mode, but is not a covered layer
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    loss_fn = loss_function("ce")
    grads = per_example_grads(model, x, y, loss_fn)
    assert grads.ghost() is None and problem in grads.ghost_problem
    kw = {"sigma": 0.5, "clip": 0.1}
    with pytest.warns(UserWarning, match=f"uses torch.func per-example gradients here: .*{problem}"):
        new = create_defense("fed-cdp", per_example="ghost", **kw).per_example(grads, _ctx())
    old = create_defense("fed-cdp", per_example="materialise", **kw)
    old = old.per_example(per_example_grads(model, x, y, loss_fn), _ctx())
    for k in old:
        assert torch.equal(new[k], old[k]), k


def test_layers_that_mix_or_draw_per_batch_are_not_covered_in_train_mode():
    """BatchNorm and active Dropout in train mode: the ghost path's batched forward would differ from
    one example at a time; coverage says so (and torch.func refuses them itself)."""
    bn = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8, affine=False), nn.Linear(8, 3))
    assert "BatchNorm1d in train mode" in coverage(bn)
    assert coverage(bn.eval()) is None  # no parameters, no mixing in eval mode
    drop = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    assert "Dropout in train mode" in coverage(drop)
    assert coverage(drop.eval()) is None


@pytest.mark.numeric
def test_dp_sgd_flat_clipping_from_ghost_norms_equals_materialise():
    """dp-sgd clips each whole per-example gradient: its flat factor comes from the per-layer ghost
    norms (||g_i||^2 = sum of the layers' squares), so `per_example=ghost` needs no per-example
    gradients and agrees with `materialise` to float tolerance, clipping active or not."""
    torch.manual_seed(0)
    model = build_model("mlp", {"hidden": [16]}, (20,), 10)
    x, y = _batch(6, (20,))
    loss_fn = loss_function("ce")
    sc = Scenario(rounds=2, clients=2)
    for clip in (0.05, 100.0):
        a = create_defense("dp-sgd", clip=clip, per_example="materialise")
        b = create_defense("dp-sgd", clip=clip)  # the default: ghost
        a._train_size = b._train_size = 100
        old = a.per_example(
            per_example_grads(model, x, y, loss_fn),
            HookContext(0, 0, 0, sc, torch.Generator().manual_seed(0)),
        )
        grads = per_example_grads(model, x, y, loss_fn)
        new = b.per_example(grads, HookContext(0, 0, 0, sc, torch.Generator().manual_seed(0)))
        assert not grads.materialised
        for k in old:
            assert _close(new[k], old[k]), (clip, k)
    flat = a.norm_factors({"w": torch.tensor([3.0, 0.0]), "b": torch.tensor([4.0, 0.1])}, 1.0)
    assert torch.allclose(flat["w"], torch.tensor([0.2, 1.0], dtype=torch.float64)) and flat["w"] is flat["b"]


def test_plain_dicts_use_the_per_example_path():
    """A hook given a plain dict (the attacks' replay, the `example` observation) has nothing to take
    ghost norms from: both settings give the same result."""
    g = {"w": torch.randn(4, 3, 2), "b": torch.randn(4, 3)}
    a = create_defense("fed-cdp", clip=0.5, per_example="materialise").per_example(g, _ctx())
    b = create_defense("fed-cdp", clip=0.5, per_example="ghost").per_example(g, _ctx())
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name,params", MODELS)
def test_lazy_gradients_equal_the_eager_call_and_the_batch_loss_is_the_forward(name, params):
    torch.manual_seed(0)
    model = build_model(name, params, (1, 28, 28), 10)
    x, y = _batch(8)
    loss_fn = loss_function("ce")
    grads = per_example_grads(model, x, y, loss_fn)
    assert isinstance(grads, PerExampleGrads) and not grads.materialised
    assert list(grads) == [n for n, p in model.named_parameters() if p.requires_grad] and len(grads) == len(
        list(model.parameters())
    )
    eager = vmap_per_example_grads(model, x, y, loss_fn)
    assert all(torch.equal(grads[k], eager[k]) for k in eager) and grads.materialised
    with torch.no_grad():
        forward = float(loss_fn(model(x), y))
    lazy = per_example_grads(model, x, y, loss_fn)
    assert lazy.batch_loss() == forward  # no ghost pass yet: the same no-grad forward
    assert lazy.ghost() is not None and lazy.batch_loss() == forward  # the ghost pass's forward, same bits


def test_reading_after_the_weights_changed_raises():
    model = build_model("mlp", {"hidden": [8]}, (4,), 3)
    x, y = torch.randn(3, 4), torch.randint(0, 3, (3,))
    grads = per_example_grads(model, x, y, loss_function("ce"))
    with torch.no_grad():
        model.fc1.weight.add_(1.0)
    with pytest.raises(RuntimeError, match="weights changed"):
        grads["fc1.weight"]
    with pytest.raises(RuntimeError, match="weights changed"):
        grads.ghost()


@pytest.mark.numeric
def test_simulation_with_ghost_clipping_trains_like_the_default():
    """A whole Fed-CDP run (noise, clipping, FedAvg) through the engine: the two settings agree to float
    tolerance, and the ghost path never makes per-example buffers of the training steps."""
    bundle = load_dataset("digits", {})
    sc = Scenario.from_dict(
        dict(clients=3, rounds=2, local_steps=3, batch_size=16, lr=0.1, train_size=300, test_size=100)
    )
    shape, classes = bundle.meta.input_shape, bundle.meta.num_classes
    states = []
    for mode in ("materialise", "ghost"):
        sim = Simulation(
            sc,
            bundle,
            lambda: build_model("cdp-cnn", {}, shape, classes),
            create_defense("fed-cdp", sigma=0.05, clip=0.5, per_example=mode),
            seed=0,
        )
        res = sim.run()
        states.append((sim.global_state, res))
    (a, ra), (b, rb) = states
    for k in a:
        assert _close(b[k], a[k], rtol=1e-4), k
    assert ra.history[-1]["train_loss"] == pytest.approx(rb.history[-1]["train_loss"], rel=1e-4)
