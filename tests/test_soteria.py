"""Soteria: GGL's feature importance, the pruned columns of the defend layer, the engine hook."""

from __future__ import annotations

import pytest
import torch

from fedbench.api import create_defense
from fedbench.data import load_dataset
from fedbench.defenses.soteria import defend_layer, feature_scores, prune_mask
from fedbench.errors import FedbenchError
from fedbench.fl.simulation import ObservationRequest, Simulation
from fedbench.models import build_model
from fedbench.plugin import HookContext, Scenario


def _net():
    torch.manual_seed(0)
    return build_model("mlp", {"hidden": [24, 12]}, (20,), 5)


def _ctx(model, x, y) -> HookContext:
    return HookContext(
        round=0, client=0, step=0, scenario=Scenario(), generator=torch.Generator(), model=model, x=x, y=y
    )


def test_defend_layer_choice():
    net = _net()
    names = [n for n, m in net.named_modules() if isinstance(m, torch.nn.Linear)]
    assert defend_layer(net, "last")[0] == names[-1]
    assert defend_layer(net, "first")[0] == names[0]
    assert defend_layer(net, names[1])[0] == names[1]
    with pytest.raises(FedbenchError, match="not an nn.Linear"):
        defend_layer(net, "nope")
    with pytest.raises(FedbenchError, match="no nn.Linear"):
        defend_layer(torch.nn.Sequential(torch.nn.ReLU()), "last")


@pytest.mark.numeric
def test_feature_scores_equal_ggl_per_feature_loop():
    net = _net().double()
    x = torch.randn(6, 20, dtype=torch.float64)
    _, layer = defend_layer(net, "last")
    got = feature_scores(net, layer, x, chunk=5)
    # the reference: one backward pass per feature (GGL defense_soteria)
    captured = {}
    h = layer.register_forward_pre_hook(lambda _m, inp: captured.__setitem__("r", inp[0]))
    xin = x.clone().requires_grad_(True)
    net(xin)
    h.remove()
    r = captured["r"]
    ref = torch.zeros(r.shape[1], dtype=torch.float64)
    for f in range(r.shape[1]):
        (gx,) = torch.autograd.grad(r[:, f].sum(), xin, retain_graph=True)
        ref[f] = (gx.norm(dim=1) / (r[:, f].detach() + 0.1)).sum()  # the reference's + 0.1
    assert torch.isfinite(got).all()
    assert torch.allclose(got, ref.abs(), rtol=1e-9)


@pytest.mark.numeric
def test_relu_features_at_batch_32_are_ranked_not_tied():
    # issue 16 (6): on an MLP 256-256 at B=32, a ReLU feature that is zero for any one example got an
    # infinite score, so 253 of 256 features tied and pruning fell back to index order
    from fedbench.models import build_model

    torch.manual_seed(0)
    net = build_model("mlp", {"hidden": [256, 256]}, (1, 28, 28), 10)
    x = torch.rand(32, 1, 28, 28)
    _, layer = defend_layer(net, "last")
    value = feature_scores(net, layer, x)
    assert torch.isfinite(value).all()
    alive = value > 0  # features zero for the whole batch score 0 (their gradient column is 0 anyway)
    assert alive.sum() > 128
    assert len(torch.unique(value[alive])) == int(alive.sum()), "live features must not tie"


@pytest.mark.parametrize("prune", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_step_prunes_exactly_the_fraction_of_defend_layer_columns(prune):
    net = _net()
    x, y = torch.randn(8, 20), torch.randint(0, 5, (8,))
    grads = {n: torch.ones_like(p) for n, p in net.named_parameters()}
    name, layer = defend_layer(net, "last")
    out = create_defense("soteria", prune=prune).step(grads, _ctx(net, x, y))
    w = out[f"{name}.weight"]
    zero_cols = int((w == 0).all(0).sum())
    assert zero_cols == round(prune * layer.in_features)
    for n in grads:
        if n != f"{name}.weight":
            assert torch.equal(out[n], grads[n])
    # the pruned columns are the smallest scores (the largest iota = most revealing features)
    value = feature_scores(net, layer, x)
    mask = prune_mask(value, prune)
    assert torch.equal((w != 0).all(0).float(), mask)


def test_soteria_in_the_engine_prunes_the_shared_gradient():
    bundle = load_dataset("digits", {})
    sc = Scenario.from_dict(
        dict(
            protocol="fedsgd",
            clients=4,
            rounds=1,
            batch_size=4,
            train_size=100,
            test_size=40,
            observe="update",
        )
    )
    sim = Simulation(
        sc,
        bundle,
        lambda: build_model("lenet", {}, bundle.meta.input_shape, bundle.meta.num_classes),
        create_defense("soteria", prune=0.5),
        seed=0,
        observe=ObservationRequest("update", 0, 0),
    )
    res = sim.run()
    w = res.observation.shared["fc.weight"]
    assert int((w == 0).all(0).sum()) == round(0.5 * w.shape[1])
    assert 0 <= res.test_acc <= 1


def test_feature_scores_restore_batchnorm_statistics():
    torch.manual_seed(0)
    net = build_model("convnet", {"width": 4}, (1, 8, 8), 3).train()
    before = {k: v.clone() for k, v in net.named_buffers()}
    _, layer = defend_layer(net, "last")
    feature_scores(net, layer, torch.randn(4, 1, 8, 8))
    for k, v in net.named_buffers():
        assert torch.equal(v, before[k]), k
