"""robbing-the-fed and the imprint model: exact recovery per bin, shared bins, skips, bad parameters."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedbench import registry
from fedbench.errors import FedbenchError, ParamError, UnknownNameError
from fedbench.execution.cache import RunCache
from fedbench.execution.runner import RunContext, execute
from fedbench.metrics.reconstruction import psnr
from fedbench.plugin import DatasetMeta, Observation, Scenario
from fedbench.spec.patterns import parse_pattern
from fedbench.spec.run import ComponentSpec, RunSpec

META = DatasetMeta("toy", (1, 6, 6), 3, "image", mean=(0.5,), std=(0.25,))
N = 36


def _model(bins: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return registry.models.get("imprint")({"base": "mlp[hidden=[8]]", "bins": bins}).build(
        META.input_shape, 3
    )


def _observation(model, x, y):
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    state = {n: p.detach().clone() for n, p in model.state_dict().items()}
    return Observation("update", 0, 0, "gradient", grads, state, x, y, 0.1, 1, len(x), "train")


def _set_bins(model, thresholds):
    """Brightness bins: every row reads the mean pixel, bin i fires above thresholds[i] (pixel space)."""
    k = len(thresholds)
    with torch.no_grad():
        w = torch.full((k, N), 1.0 / N)
        b = -torch.as_tensor(thresholds, dtype=torch.float32)
        # fold x_pixel = 0.25 x_n + 0.5 into the layer, as the server does for normalised inputs
        model.imprint.weight.copy_(w * 0.25)
        model.imprint.bias.copy_(b + w @ torch.full((N,), 0.5))
        model.decode.weight.fill_(1.0 / k)
        model.decode.bias.zero_()


def _batch(brightness, seed=0):
    """Images whose mean pixel is the given brightness (pixel values in [0, 1])."""
    g = torch.Generator().manual_seed(seed)
    pix = []
    for m in brightness:
        noise = torch.rand(N, generator=g, dtype=torch.float64)
        pix.append((m + 0.9 * min(m, 1 - m) * (noise - noise.mean())).float())  # in [0, 1], mean m
    pix = torch.stack(pix).reshape(-1, *META.input_shape)
    y = torch.randint(0, 3, (len(pix),), generator=g)
    return pix, (pix - 0.5) / 0.25, y


def _best_psnr(pixels, images):
    return np.array([max(float(psnr(p[None], r[None])[0]) for r in images) for p in pixels.numpy()])


@pytest.mark.numeric
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_images_in_distinct_bins_are_recovered_exactly(seed):
    rng = np.random.default_rng(seed)
    k, batch = 16, 6
    thresholds = np.concatenate([[-1.0], np.linspace(0.3, 0.7, k - 1)])  # bin i fires above thresholds[i]
    chosen = 1 + rng.choice(k - 2, size=batch, replace=False)  # distinct bins (t_i, t_i+1], one image each
    pix, x, y = _batch((thresholds[chosen] + thresholds[chosen + 1]) / 2, seed)
    measured = pix.reshape(batch, -1).mean(1).numpy()
    assert len(set(np.searchsorted(thresholds, measured))) == batch  # the property's premise
    model = _model(k, seed)
    _set_bins(model, thresholds)
    out = registry.attacks.get("robbing-the-fed")().run(_observation(model, x, y), model, META, None, None)
    values = _best_psnr(pix, out.images)
    assert (values >= 100.0).all(), values  # exact: at the PSNR cap
    assert out.extra["bins"] == k and out.extra["bins_hit"] == batch


@pytest.mark.numeric
def test_images_sharing_a_bin_are_not_claimed():
    k = 8
    thresholds = np.array([-1.0, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65])
    pix, x, y = _batch([0.37, 0.38, 0.47, 0.58])  # images 0 and 1 share bin (0.35, 0.4]
    model = _model(k)
    _set_bins(model, thresholds)
    out = registry.attacks.get("robbing-the-fed")().run(_observation(model, x, y), model, META, None, None)
    values = _best_psnr(pix, out.images)
    assert (values[2:] >= 100.0).all(), values
    assert (values[:2] < 60.0).all(), values  # a mixture of the two: neither image recovered
    assert out.extra["bins_hit"] == 3 and len(out.images) == 3  # one candidate per occupied bin


def test_server_hook_builds_equal_mass_bins_on_normalised_inputs():
    from fedbench.data import load_dataset

    bundle = load_dataset("digits")
    model = registry.models.get("imprint")({"base": "mlp[hidden=[8]]", "bins": 10}).build((1, 8, 8), 10)
    attack = registry.attacks.get("robbing-the-fed")({"quantiles": "data"})
    state = attack.server_hook(bundle.meta).broadcast(dict(model.state_dict()), 0)
    w, b = state["imprint.weight"], state["imprint.bias"]
    assert torch.allclose(w, w[:1].expand_as(w))  # every bin reads the same measurement
    assert (b[:-1] > b[1:]).all()  # thresholds ascend, so biases descend
    assert torch.allclose(state["decode.weight"], torch.full_like(state["decode.weight"], 0.1))
    fired = (bundle.x_test.reshape(len(bundle.x_test), -1) @ w.T + b > 0).sum(1)
    counts = torch.bincount(fired, minlength=11)[1:].float() / len(fired)
    assert (fired >= 1).all()  # bin 0 fires for every input
    assert counts.max() < 0.2 and counts.min() > 0.03  # about 1/k of the aux data per bin


def test_models_without_the_block_are_skipped_with_a_reason():
    attack = registry.attacks.get("robbing-the-fed")()
    for name, params in (("fcnn", {"fc1_width": 8, "depth": 2}), ("lenet", {})):
        reason = attack.check_model(registry.models.get(name)(params).build((1, 28, 28), 10))
        assert reason and "imprint" in reason
    assert attack.check_model(_model(4)) is None
    assert attack.threat == "malicious server, modifies the architecture"
    with pytest.raises(FedbenchError, match="imprint"):
        fcnn = registry.models.get("fcnn")({"fc1_width": 8, "depth": 2}).build(META.input_shape, 3)
        x = torch.zeros(2, *META.input_shape)
        attack.run(_observation(fcnn, x, torch.tensor([0, 1])), fcnn, META, None, None)
    with pytest.raises(FedbenchError, match="imprint block"):
        attack.server_hook(META).broadcast({"fc1.weight": torch.zeros(4, N)}, 0)


def test_imprint_model_shapes_and_forward():
    model = _model(5)
    names = dict(model.named_parameters())
    assert names["imprint.weight"].shape == (5, N) and names["decode.weight"].shape == (N, 5)
    assert any(n.startswith("base.") for n in names)
    assert model(torch.zeros(3, *META.input_shape)).shape == (3, 3)
    label = parse_pattern('imprint[base="fcnn[fc1_width=16,depth=2]",bins=4]')
    assert label == ("imprint", {"base": "fcnn[fc1_width=16,depth=2]", "bins": 4})


@pytest.mark.parametrize(
    "kind,name,params,error",
    [
        ("model", "imprint", {"bins": 1}, ParamError),
        ("model", "imprint", {"base": "no-such-model"}, ParamError),
        ("model", "imprint", {"base": "imprint"}, ParamError),
        ("model", "imprint", {"base": "mlp[hidden=[0]]"}, ParamError),
        ("model", "imprint", {"base": "mlp[hidden="}, ParamError),
        ("model", "imprint", {"width": 3}, UnknownNameError),
        ("attack", "robbing-the-fed", {"measurement": "fourier"}, ParamError),
        ("attack", "robbing-the-fed", {"quantiles": "laplace"}, ParamError),
        ("attack", "robbing-the-fed", {"aux": -1}, ParamError),
    ],
)
def test_bad_parameters_fail_before_any_work(kind, name, params, error):
    with pytest.raises(error):
        registry.registry_for(kind).get(name)(params)


def test_aux_dataset_must_match_the_layer():
    model = registry.models.get("imprint")({"base": "mlp[hidden=[8]]", "bins": 4}).build((1, 6, 6), 3)
    attack = registry.attacks.get("robbing-the-fed")({"dataset": "digits"})
    with pytest.raises(FedbenchError, match="aux dataset 'digits' has 64 inputs"):
        attack.server_hook(META).broadcast(dict(model.state_dict()), 0)
    with pytest.raises(FedbenchError, match="dataset=same needs"):
        registry.attacks.get("robbing-the-fed")().server_hook(None).broadcast(dict(model.state_dict()), 0)


@pytest.mark.parametrize(
    "model,params", [("imprint", {"base": "mlp[hidden=[16]]", "bins": 32}), ("fcnn", {})]
)
def test_end_to_end_row(tmp_path, model, params):
    spec = RunSpec(
        ComponentSpec.resolve("dataset", "mnist5k"),
        ComponentSpec.resolve("model", model, params or {"fc1_width": 16, "depth": 2}),
        ComponentSpec.resolve("defense", "none"),
        ComponentSpec.resolve("attack", "robbing-the-fed", {}),
        Scenario.from_dict(
            dict(protocol="fedsgd", clients=2, rounds=1, batch_size=8, train_size=40, test_size=20)
        ),
        0,
        preset="test",
    )
    row = execute(spec, RunCache(tmp_path / "c"), RunContext())
    if model == "fcnn":
        assert row["status"] == "skipped" and "imprint" in row["reason"]
        return
    assert row["status"] == "ok", row.get("reason")
    assert row["exact"] >= 0.25  # 8 images in 32 equal-mass bins: most sit alone in theirs
