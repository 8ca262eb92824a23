"""LODA, MixUp/InstaHide, gradient pruning and the adaptive attacks of spec 001 (issue 8)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedbench.data import load_dataset
from fedbench.defenses import _loda_core as core
from fedbench.defenses.gradient_pruning import prune_smallest
from fedbench.defenses.loda import Loda, layer_indices, to_unit
from fedbench.defenses.mixup import InstaHide, MixUp, sample_coefficients
from fedbench.errors import FedbenchError
from fedbench.execution.cache import RunCache
from fedbench.metrics.reconstruction import psnr
from fedbench.plugin import HookContext, RunData, Scenario, using_artifacts

FAST_LODA = {"steps": 10, "extractor_epochs": 1, "extractor_width": 4, "c": 300.0, "public_size": 200}


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _ctx(meta, client=0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return HookContext(round=-1, client=client, step=0, scenario=Scenario(), generator=gen, meta=meta)


def _loda(digits, **params):
    d = Loda({**FAST_LODA, **params})
    d.bind_data(RunData(digits, 40, 20, (tuple(range(20)), tuple(range(20, 40)))))
    return d


def test_layer_choices_of_both_papers_and_code():
    assert layer_indices("first:5", 20) == [0, 1, 2, 3, 4]  # LODA1
    assert layer_indices("all", 20) == list(range(20))  # LODA2, paper
    assert layer_indices("slice:0:15", 20) == list(range(15))  # LODA2, reference code
    assert layer_indices("last:5", 20) == [15, 16, 17, 18, 19]  # LODA3, paper
    assert layer_indices("slice:5:10", 20) == [5, 6, 7, 8, 9]  # LODA3, reference code
    model = core.build_extractor((1, 8, 8), 10, 4)
    assert len(core.conv_layers(model)) == 20  # the 20 Conv2d of ResNet-18 incl. shortcuts
    with pytest.raises(FedbenchError, match="layers"):
        Loda({"layers": "middle:3"})


@pytest.mark.numeric
def test_obscuring_objective_decreases_and_images_stay_in_box(digits):
    torch.manual_seed(0)
    tap = core.FeatureTap(core.build_extractor((1, 8, 8), 10, 4), layer_indices("first:5", 20))
    x_star = to_unit(digits.x_train[:6], digits.meta)
    x_init = to_unit(digits.x_train[100:106], digits.meta)
    out = core.obscure(tap, x_star, x_init, c=5.0, steps=30, step_size=0.1)
    assert out.objective[-1] < out.objective[0]
    assert out.x.min() >= 0 and out.x.max() <= 1
    assert out.pixel[-1] > out.pixel[0]  # pushed away from the private image


@pytest.mark.numeric
def test_loda_keeps_labels_returns_private_source_and_valid_images(digits):
    d = _loda(digits)
    x, y = digits.x_train[:8], digits.y_train[:8]
    xo, yo, src = d.prepare_data(x, y, _ctx(digits.meta))
    assert torch.equal(yo, y) and torch.equal(src, x) and xo.shape == x.shape
    pixels = digits.denormalize(xo)  # obscured images are valid [0, 1] images (normalised like the data)
    assert pixels.min() >= -1e-5 and pixels.max() <= 1 + 1e-5
    assert float(psnr(to_unit(x, digits.meta), pixels.clamp(0, 1)).mean()) < 30
    trace = d.traces[0]["objective"]
    assert trace[-1] < trace[0]


def test_extractor_and_obscured_data_come_from_cache(digits, tmp_path, monkeypatch):
    calls = {"train": 0, "obscure": 0}
    train, obscure = core.train_extractor, core.obscure

    def counting_train(*a, **k):
        calls["train"] += 1
        return train(*a, **k)

    def counting_obscure(*a, **k):
        calls["obscure"] += 1
        return obscure(*a, **k)

    monkeypatch.setattr(core, "train_extractor", counting_train)
    monkeypatch.setattr(core, "obscure", counting_obscure)
    x, y = digits.x_train[:5], digits.y_train[:5]
    with using_artifacts(RunCache(tmp_path / "cache").artifacts):  # as during a run with an on-disk cache
        first = _loda(digits).prepare_data(x, y, _ctx(digits.meta))[0]
        assert calls == {"train": 1, "obscure": 1}
        second = _loda(digits).prepare_data(x, y, _ctx(digits.meta))[0]  # a fresh defense: a second run
        assert calls == {"train": 1, "obscure": 1}
        assert torch.equal(first, second)
        _loda(digits, c=30.0).prepare_data(x, y, _ctx(digits.meta))  # same extractor, new obscuring
        assert calls == {"train": 1, "obscure": 2}


def test_loda_public_set_must_exist(digits):
    d = Loda(FAST_LODA)
    d.bind_data(RunData(digits, len(digits.y_train), 20, (tuple(range(10)),)))
    with pytest.raises(FedbenchError, match="public=unused"):
        d.prepare_data(digits.x_train[:4], digits.y_train[:4], _ctx(digits.meta))


def test_mixup_lambdas_sum_to_one_and_respect_the_bound():
    coef = sample_coefficients(500, 4, np.random.default_rng(0))
    assert np.allclose(coef.sum(1), 1.0) and (coef >= 0).all() and coef.max() <= 0.65
    assert coef[:, 0].mean() > coef[:, 1].mean()  # Dirichlet(3, 1, 1, 1): the own image weighs most
    with pytest.raises(FedbenchError, match="max_coef"):
        MixUp({"k": 6, "max_coef": 0.1})


@pytest.mark.numeric
def test_mixup_and_instahide_encodings(digits):
    x, y = digits.x_train[:10], digits.y_train[:10]
    mix = MixUp({"k": 4, "encodings": 2})
    xm, ym, src = mix.prepare_data(x, y, _ctx(digits.meta))
    m = mix.mixing(0)
    assert xm.shape == (20, 1, 8, 8) and (m.components[:10, 0] == torch.arange(10)).all()
    expected = (x[m.components] * m.coefficients.view(20, 4, 1, 1, 1)).sum(1)
    assert torch.allclose(xm, expected, atol=1e-6)
    dominant = m.components[torch.arange(20), m.coefficients.argmax(1)]
    assert torch.equal(ym, y[dominant]) and torch.equal(src, x[dominant])
    ih = InstaHide({"k": 4, "encodings": 2})
    xi, _, _ = ih.prepare_data(x, y, _ctx(digits.meta))
    assert torch.allclose(xi.abs(), xm.abs(), atol=1e-6)  # same mixing, then random signs
    assert set(ih.mixing(0).signs.unique().tolist()) == {-1.0, 1.0}


def test_gradient_pruning_zeroes_the_smallest_fraction_per_tensor():
    g = torch.randn(1000)
    pruned = prune_smallest(g, 0.9)
    kept = pruned != 0
    assert 95 <= int(kept.sum()) <= 101
    assert g[kept].abs().min() >= g[~kept].abs().max()
    assert torch.equal(prune_smallest(g, 0.0), g)


@pytest.mark.numeric
def test_decoding_breaks_mixup_given_its_encodings(digits):
    from fedbench.attacks._adaptive_core import decode

    x, y = digits.x_train[:6], digits.y_train[:6]
    mix = MixUp({"k": 3, "encodings": 3})
    mix.prepare_data(x, y, _ctx(digits.meta))
    m = mix.mixing(0)
    images, history = decode(m.encoded, m.components, m.coefficients, digits.meta, False, 300, 0.05, 0.0)
    decoded = torch.stack([images[i] for i in range(6)])
    assert history[-1] < history[0]
    assert float(psnr(to_unit(x, digits.meta), decoded).mean()) > 20


@pytest.mark.numeric
def test_stationary_inversion_reduces_the_residual(digits):
    torch.manual_seed(0)
    tap = core.FeatureTap(core.build_extractor((1, 8, 8), 10, 4), layer_indices("first:5", 20))
    x_obs = to_unit(digits.x_train[:3], digits.meta)
    _, history = core.invert_stationary(tap, x_obs, c=1.0, steps=20, lr=0.01, optimizer="adam")
    assert history[-1] < history[0]


def _job(defense, dparams, attack, aparams):
    from fedbench.execution.runner import Job, RunContext
    from fedbench.spec.run import ComponentSpec, RunSpec

    sc = Scenario.from_dict(
        dict(protocol="fedsgd", clients=2, rounds=1, batch_size=1, lr=0.05, train_size=40, test_size=20)
    )
    spec = RunSpec(
        ComponentSpec.resolve("dataset", "digits"),
        ComponentSpec.resolve("model", "lenet", {}),
        ComponentSpec.resolve("defense", defense, dparams),
        ComponentSpec.resolve("attack", attack, aparams),
        sc,
        0,
        preset="test",
    )
    return Job(spec, RunContext())


@pytest.mark.parametrize(
    "defense, dparams, attack, aparams",
    [
        ("loda", FAST_LODA, "loda-adaptive", {"iterations": 5, "steps": 5}),
        ("mixup", {"k": 2}, "mixup-decode", {"iterations": 5, "pool": 3, "decode_steps": 20}),
        ("instahide", {"k": 2}, "mixup-decode", {"iterations": 5, "pool": 3, "decode_steps": 20}),
    ],
)
def test_adaptive_attacks_run_against_their_defense(defense, dparams, attack, aparams):
    from fedbench.execution.runner import compute_attack

    result = compute_attack(_job(defense, dparams, attack, aparams))
    assert result["output"]["extra"]["adaptive"] is True
    images, truth = result["output"]["images"], result["truth"]
    assert images.shape == truth["images"].shape and 0 <= images.min() and images.max() <= 1
    assert "shared_images" in truth  # metrics compare with the private image, the shared one is kept
    if defense == "mixup":
        assert result["output"]["extra"]["pooled_encodings"] == 3


def test_adaptive_attack_is_plain_gla_against_other_defenses():
    from fedbench.execution.runner import compute_attack

    ig = compute_attack(_job("none", {}, "ig", {"iterations": 5}))
    ad = compute_attack(_job("none", {}, "loda-adaptive", {"iterations": 5}))
    assert ad["output"]["extra"]["adaptive"] is False
    assert np.array_equal(ig["output"]["images"], ad["output"]["images"])


def test_grid_adds_the_declared_adaptive_attack(tmp_path):
    from fedbench.spec.grid import build_grid

    preset = tmp_path / "p.toml"
    preset.write_text(
        '[grid]\nname = "p"\n[scenario]\nclients = 2\n'
        '[[dataset]]\nname = "digits"\n[[model]]\nname = "lenet"\n'
        '[[defense]]\nname = "none"\n[[defense]]\nname = "loda"\n[[defense]]\nname = "instahide"\n'
        '[[attack]]\nname = "ig"\nadaptive = true\nparams = { iterations = 7 }\n'
    )
    grid = build_grid(preset)
    pairs = [(s.defense.name, s.attack.label) for s in grid.specs]
    assert pairs == [
        ("none", "inverting-gradients[iterations=7]"),
        ("loda", "inverting-gradients[iterations=7]"),
        ("loda", "loda-adaptive[iterations=7]"),
        ("instahide", "inverting-gradients[iterations=7]"),
        ("instahide", "mixup-decode[iterations=7]"),
    ]
