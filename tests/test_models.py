"""Model plugins: shapes on every shipped dataset, gradients, torch.func per-example grads, params."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
import torch
from torch.func import functional_call, grad, vmap

from fedbench.errors import ParamError, UnknownNameError
from fedbench.models import build_model, create_model
from fedbench.registry import models

# shipped dataset shapes: mnist5k, digits, breast-cancer, lfw-subset, adult; plus CIFAR-sized images
SHAPES = [(1, 28, 28), (1, 8, 8), (30,), (1, 25, 25), (103,), (3, 32, 32)]
# small variants keep the sweep fast; the default sizes are checked separately
FAST = {
    "convnet": {"width": 8},
    "resnet18": {"width": 4},
    "resnet34": {"width": 4},
    "fcnn": {"fc1_width": 64},
}
BUILTIN = ("mlp", "lenet", "convnet", "fcnn", "resnet18")


def _fast_params(name: str) -> dict:
    return dict(FAST.get(models.canonical(name), {}))


def test_builtin_models_registered():
    for name in BUILTIN:
        assert name in models
        cls = models.get(name)
        assert cls.summary()
        assert cls.version == "1"


@pytest.mark.parametrize("name", models.names())
def test_forward_backward_every_shape(name):
    torch.manual_seed(0)
    for shape in SHAPES:
        model = build_model(name, _fast_params(name), shape, 3)
        x = torch.randn(2, *shape)
        out = model(x)
        assert out.shape == (2, 3), (name, shape)
        assert torch.isfinite(out).all(), (name, shape)
        torch.nn.functional.cross_entropy(out, torch.tensor([0, 2])).backward()
        for pname, p in model.named_parameters():
            assert p.grad is not None, (name, shape, pname)
            assert torch.isfinite(p.grad).all(), (name, shape, pname)


def _per_example_grads(model, x, y):
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def loss_fn(p, xi, yi):
        out = functional_call(model, (p, buffers), (xi.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, yi.unsqueeze(0))

    return vmap(grad(loss_fn), in_dims=(None, 0, 0))(params, x, y)


def _loop_grads(model, x, y):
    out = {k: [] for k, _ in model.named_parameters()}
    for i in range(x.shape[0]):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        for k, p in model.named_parameters():
            out[k].append(p.grad.detach().clone())
    return {k: torch.stack(v) for k, v in out.items()}


@pytest.mark.numeric
@pytest.mark.parametrize(
    "name,params,shape,mode",
    [
        ("mlp", None, (1, 8, 8), "train"),
        ("mlp", {"activation": "tanh", "hidden": [16]}, (30,), "train"),
        ("lenet", None, (1, 8, 8), "train"),
        ("lenet", {"init": "default", "activation": "relu"}, (103,), "train"),
        ("fcnn", {"fc1_width": 32, "depth": 3, "activation": "sigmoid"}, (30,), "train"),
        ("fcnn", {"fc1_width": 16, "depth": 4}, (1, 8, 8), "train"),
        ("convnet", {"width": 4}, (1, 8, 8), "eval"),
        ("convnet", {"width": 4, "batchnorm": False}, (1, 25, 25), "train"),
        ("resnet18", {"width": 4, "norm": "group"}, (1, 8, 8), "train"),
        ("resnet18", {"width": 4}, (30,), "eval"),
        ("cdp-cnn", None, (1, 28, 28), "train"),
    ],
)
def test_per_example_grads_match_loop(name, params, shape, mode):
    torch.manual_seed(1)
    model = build_model(name, params, shape, 4).double()
    model.train(mode == "train")
    x = torch.randn(5, *shape, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 3, 1])
    fast = _per_example_grads(model, x, y)
    slow = _loop_grads(model, x, y)
    assert fast.keys() == slow.keys()
    for k in slow:
        torch.testing.assert_close(fast[k], slow[k], atol=1e-6, rtol=1e-5, msg=f"{name} {k}")


@pytest.mark.numeric
def test_per_example_grads_float32_mlp_lenet_fcnn():
    torch.manual_seed(2)
    for name, params in (("mlp", None), ("lenet", None), ("fcnn", {"fc1_width": 32, "depth": 3})):
        model = build_model(name, params, (1, 8, 8), 3)
        x, y = torch.rand(4, 1, 8, 8), torch.tensor([0, 1, 2, 0])
        fast, slow = _per_example_grads(model, x, y), _loop_grads(model, x, y)
        for k in slow:
            torch.testing.assert_close(fast[k], slow[k], atol=1e-6, rtol=1e-4, msg=f"{name} {k}")


@pytest.mark.parametrize("name,params", [("lenet", None), ("convnet", {"width": 4}), ("mlp", None)])
def test_double_backward_for_gradient_inversion(name, params):
    torch.manual_seed(3)
    model = build_model(name, params, (1, 8, 8), 3).eval()
    target = [
        g.detach()
        for g in torch.autograd.grad(
            torch.nn.functional.cross_entropy(model(torch.rand(1, 1, 8, 8)), torch.tensor([1])),
            list(model.parameters()),
        )
    ]
    dummy = torch.rand(1, 1, 8, 8, requires_grad=True)
    grads = torch.autograd.grad(
        torch.nn.functional.cross_entropy(model(dummy), torch.tensor([1])),
        list(model.parameters()),
        create_graph=True,
    )
    loss = sum(((g - t) ** 2).sum() for g, t in zip(grads, target, strict=True))
    (dx,) = torch.autograd.grad(loss, dummy)
    assert torch.isfinite(dx).all() and dx.abs().sum() > 0


def test_convnet_matches_breaching_size():
    model = build_model("convnet", None, (3, 32, 32), 10)
    n = sum(p.numel() for p in model.parameters())
    assert n == pytest.approx(2.9e6, rel=0.02)
    assert n == 2_904_970  # 8 convs + 8 BN + Linear(36 * 64, 10)
    assert model.linear.in_features == 36 * 64
    assert sum(isinstance(m, torch.nn.Conv2d) for m in model.modules()) == 8
    assert build_model("convnet", None, (1, 28, 28), 10).linear.in_features == 36 * 64
    no_bn = build_model("convnet", {"batchnorm": False, "width": 8}, (3, 32, 32), 10)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in no_bn.modules())


def test_convnet_build_does_not_touch_bn_stats():
    model = build_model("convnet", {"width": 4}, (1, 8, 8), 2)
    assert model.training
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            assert int(m.num_batches_tracked) == 0


def test_lenet_is_dlg_lenet():
    model = build_model("lenet", None, (3, 32, 32), 10)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.stride[0] for c in convs] == [2, 2, 1, 1]
    assert all(c.out_channels == 12 and c.kernel_size == (5, 5) and c.padding == (2, 2) for c in convs)
    assert model.fc.in_features == 768
    assert all(p.abs().max() <= 0.5 for p in model.parameters())
    assert sum(isinstance(m, torch.nn.Sigmoid) for m in model.modules()) == 4
    three = build_model("lenet", {"depth": 3}, (3, 32, 32), 10)
    assert sum(isinstance(m, torch.nn.Conv2d) for m in three.modules()) == 3


def test_fcnn_layers_and_fc1():
    model = build_model("fcnn", None, (1, 28, 28), 10)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [
        (784, 1024),
        (1024, 2048),
        (2048, 3072),
        (3072, 2048),
        (2048, 1024),
        (1024, 10),
    ]
    assert model.fc1 is linears[0]
    assert list(dict(model.named_parameters()))[:2] == ["fc1.weight", "fc1.bias"]
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in model.modules())
    small = build_model("fcnn", {"fc1_width": 128, "depth": 4, "activation": "tanh"}, (30,), 2)
    assert [m.out_features for m in small.modules() if isinstance(m, torch.nn.Linear)] == [128, 1024, 1024, 2]
    assert sum(isinstance(m, torch.nn.Tanh) for m in small.modules()) == 3


def test_mlp_structure():
    model = build_model("mlp", {"hidden": "600,100", "bias": False, "activation": "sigmoid"}, (103,), 2)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(103, 600), (600, 100), (100, 2)]
    assert all(m.bias is None for m in linears)
    assert model.fc1 is linears[0]
    logistic = build_model("mlp", {"hidden": []}, (1, 8, 8), 10)
    assert [m.out_features for m in logistic.modules() if isinstance(m, torch.nn.Linear)] == [10]


def test_resnet18_structure():
    model = build_model("resnet18", None, (3, 32, 32), 10)
    n = sum(p.numel() for p in model.parameters())
    assert n == pytest.approx(11.17e6, rel=0.01)  # the CIFAR ResNet-18
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 20 and convs[0].kernel_size == (3, 3) and convs[0].stride == (1, 1)
    gn = build_model("resnet18", {"norm": "group", "width": 8}, (1, 8, 8), 3)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in gn.modules())
    rn = build_model("resnet18", {"stem": "imagenet", "width": 4}, (3, 224, 224), 5)
    assert rn(torch.randn(1, 3, 224, 224)).shape == (1, 5)


def test_large_and_2d_inputs():
    torch.manual_seed(0)
    for name, params in (("lenet", None), ("convnet", {"width": 4}), ("mlp", None), ("cdp-cnn", None)):
        model = build_model(name, params, (3, 224, 224), 7).eval()
        assert model(torch.randn(1, 3, 224, 224)).shape == (1, 7)
        model = build_model(name, params, (12, 12), 2)
        assert model(torch.randn(3, 12, 12)).shape == (3, 2)


def test_aliases_and_determinism():
    assert models.canonical("rn18") == "resnet18"
    torch.manual_seed(5)
    a = build_model("lenet-dlg", None, (1, 8, 8), 3)
    torch.manual_seed(5)
    b = build_model("lenet", None, (1, 8, 8), 3)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_models_pickle():
    for name in ("mlp", "lenet", "convnet", "resnet18"):
        model = build_model(name, _fast_params(name), (1, 8, 8), 3).eval()
        clone = pickle.loads(pickle.dumps(model))
        x = torch.randn(2, 1, 8, 8)
        torch.testing.assert_close(clone(x), model(x))


@pytest.mark.parametrize(
    "name,params,error",
    [
        ("mlp", {"activation": "gelu"}, ParamError),
        ("mlp", {"hidden": [256, 0]}, ParamError),
        ("mlp", {"hiden": [3]}, UnknownNameError),
        ("fcnn", {"fc1_width": 0}, ParamError),
        ("fcnn", {"activation": "softplus"}, ParamError),
        ("fcnn", {"depth": 1}, ParamError),
        ("convnet", {"width": 0}, ParamError),
        ("convnet", {"batchnorm": "maybe"}, ParamError),
        ("lenet", {"depth": 0}, ParamError),
        ("resnet18", {"norm": "layer"}, ParamError),
        ("cdp-cnn", {"dropout": 1.0}, ParamError),
    ],
)
def test_param_validation(name, params, error):
    with pytest.raises(error, match=name):
        create_model(name, params)


def test_unknown_model_and_bad_shapes():
    with pytest.raises(UnknownNameError, match="did you mean 'lenet'"):
        build_model("lenett", None, (1, 8, 8), 3)
    with pytest.raises(ParamError, match="input_shape"):
        build_model("mlp", None, (1, 0, 8), 3)
    with pytest.raises(ParamError, match="input_shape"):
        build_model("lenet", None, (1, 1, 8, 8), 3)
    with pytest.raises(ParamError, match="num_classes"):
        build_model("convnet", None, (1, 8, 8), 0)


def test_model_modules_import_without_torch():
    code = (
        "import sys, fedbench, fedbench.plugin, fedbench.registry; before = 'torch' in sys.modules; "
        "import fedbench.models, fedbench.models.mlp, fedbench.models.convnets, fedbench.models.resnet; "
        "assert before or 'torch' not in sys.modules, 'a model module imported torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_resnet_group_norm_matches_torch():
    from fedbench.models.resnet import GroupNorm

    torch.manual_seed(4)
    ours, ref = GroupNorm(4, 8), torch.nn.GroupNorm(4, 8)
    with torch.no_grad():
        ours.weight.normal_(), ours.bias.normal_()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, 8, 5, 5)
    torch.testing.assert_close(ours(x), ref(x))
