"""`noise-aware` (Balunovic et al.'s Bayes-optimal objective for a known noise) and `frl-adaptive`.

Closed forms of the likelihood (with the clipping simulation), the noise model read from each defense,
and small FedSGD runs (round 0, B = 1, an MLP, three mnist5k victims) where each adaptive attack must
recover at least as much as the plain attack it is compared with, with a margin.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from fedbench.api import create_defense
from fedbench.attacks._noise_core import (
    NoiseAwareMatcher,
    NoiseModel,
    clip_gradients,
    neg_log_likelihood,
    noise_model,
)
from fedbench.errors import FedbenchError, RunFailure
from fedbench.plugin import Scenario
from fedbench.spec.run import ComponentSpec, RunSpec

# ------------------------------------------------------------------------------------ closed forms


def test_likelihood_equals_the_closed_form_with_flat_and_per_layer_clipping():
    g = [torch.tensor([[3.0, 4.0]]), torch.tensor([[0.3, 0.4]])]
    t = [torch.tensor([0.5, 0.5]), torch.tensor([0.0, 0.0])]
    per_layer = clip_gradients(g, 1.0, per_layer=True)  # [0.6, 0.8] (norm 5 -> 1); [0.3, 0.4] kept (0.5)
    assert torch.allclose(per_layer[0], torch.tensor([[0.6, 0.8]]))
    assert torch.allclose(per_layer[1], g[1])
    # gaussian: ((0.1^2 + 0.3^2) + (0.3^2 + 0.4^2)) / (2 * 0.1^2) = 0.35 / 0.02
    assert neg_log_likelihood(per_layer, t, "gaussian", 0.1).item() == pytest.approx(17.5, rel=1e-5)
    # laplace: (0.1 + 0.3 + 0.3 + 0.4) / 0.1
    assert neg_log_likelihood(per_layer, t, "laplace", 0.1).item() == pytest.approx(11.0, rel=1e-5)
    flat = clip_gradients(g, 1.0, per_layer=False)  # one factor 1 / sqrt(25 + 0.25) for both tensors
    f = 1 / math.sqrt(25.25)
    assert torch.allclose(flat[0], g[0] * f) and torch.allclose(flat[1], g[1] * f)
    assert clip_gradients(g, 100.0, per_layer=False)[0].equal(g[0])  # inside the bound: unchanged


def test_the_matchers_objective_is_the_closed_form_on_a_linear_model():
    """A linear classifier's cross-entropy gradient is ((p - onehot) x^T, p - onehot): clipped to C by
    hand, the matcher's objective is ||clip(g) - g_obs||^2 / (2 s^2) + w * TV(pixels)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    for q in model.parameters():
        q.requires_grad_(False)
    meta = SimpleNamespace(mean=(0.5,), std=(0.25,))
    x = torch.randn(1, 1, 1, 2, 2)
    y = torch.tensor([[2]])
    obs = {"1.weight": torch.randn(3, 4) * 0.1, "1.bias": torch.randn(3) * 0.1}
    clip, s, w = 0.5, 0.05, 7.0
    matcher = NoiseAwareMatcher(model, obs, NoiseModel("gaussian", s, clip), w, meta)
    p = torch.softmax(model(x[0]), 1)[0]
    e = p - torch.nn.functional.one_hot(y[0, 0], 3)
    gw, gb = torch.outer(e, x.flatten()), e
    factor = min(1.0, clip / float(torch.sqrt(gw.pow(2).sum() + gb.pow(2).sum())))
    lik = ((gw * factor - obs["1.weight"]).pow(2).sum() + (gb * factor - obs["1.bias"]).pow(2).sum()) / (
        2 * s * s
    )
    u = x[0, 0, 0] * 0.25 + 0.5  # [0, 1] pixels
    tv = (u[:, 1:] - u[:, :-1]).abs().mean() + (u[1:, :] - u[:-1, :]).abs().mean()
    assert matcher.objective(x, y).item() == pytest.approx(float(lik + w * tv), rel=1e-4)


def _obs(**kw):
    base = dict(
        kind="gradient",
        lr=0.1,
        local_steps=1,
        defense_hooks=("update",),
        round=0,
        client=0,
        batch_size=1,
        y_true=torch.zeros(1),
        point="update",
        shared={"w": torch.zeros(3), "b": torch.zeros(1)},  # M = 2 tensors (a per-layer target epsilon's)
    )
    return SimpleNamespace(**{**base, **kw})


def test_noise_model_reads_each_defense():
    sc = Scenario.from_dict(dict(protocol="fedsgd", clients=4, rounds=10, batch_size=1))
    dpg = noise_model(create_defense("dp-gaussian", sigma=0.1, clip=2.0), _obs(), sc)
    assert (dpg.law, dpg.scale, dpg.clip, dpg.level, dpg.per_layer) == ("gaussian", 0.1, 2.0, "update", False)
    dpl = noise_model(create_defense("dp-laplace", b=0.03), _obs(), sc)
    assert (dpl.law, dpl.scale, dpl.clip) == ("laplace", 0.03, 1.0)
    # a FedAvg delta is matched as -delta/(lr*L): the update's scales in gradient units
    delta = noise_model(create_defense("dp-gaussian", sigma=0.1), _obs(kind="delta", local_steps=4), sc)
    assert delta.scale == pytest.approx(0.1 / 0.4) and delta.clip == pytest.approx(1 / 0.4)
    cdp = noise_model(
        create_defense("fed-cdp", sigma=1.0, clip=4.0), _obs(defense_hooks=("per_example",)), sc
    )
    assert (cdp.law, cdp.scale, cdp.clip, cdp.level, cdp.per_layer) == ("gaussian", 4.0, 4.0, "example", True)
    decay = create_defense("fed-cdp-decay", sigma=2.0)
    late = noise_model(decay, _obs(defense_hooks=("per_example",), round=9), sc)
    assert late.clip == pytest.approx(2.0) and late.scale == pytest.approx(4.0)  # C_T = 2 in the last round
    sdp = noise_model(create_defense("fed-sdp", sigma=1.0, clip=4.0), _obs(), sc)
    assert (sdp.scale, sdp.per_layer) == (4.0, True)
    server = noise_model(create_defense("fed-sdp", placement="server"), _obs(), sc)
    assert server.law == "none" and server.clip is None  # the client's own update is raw
    before = noise_model(create_defense("dp-gaussian"), _obs(defense_hooks=()), sc)
    assert before.law == "none"  # observed before the update hook acted
    with pytest.raises(RunFailure, match="noise-aware models the noise of"):
        noise_model(create_defense("soteria"), _obs(), sc)


# ------------------------------------------------------------------------------- small FedSGD runs


def _run(defense: str, dparams: dict, attack: str, aparams: dict, victims=(0, 1, 2)):
    from fedbench.execution.runner import Job, RunContext, compute_attack

    sc = Scenario.from_dict(
        dict(
            protocol="fedsgd",
            clients=4,
            rounds=1,
            batch_size=1,
            lr=0.1,
            train_size=80,
            test_size=20,
            observe_round=0,
            victim=victims[0],
        )
    )
    spec = RunSpec(
        ComponentSpec.resolve("dataset", "mnist5k"),
        ComponentSpec.resolve("model", "mlp", {"hidden": [32]}),
        ComponentSpec.resolve("defense", defense, dparams),
        ComponentSpec.resolve("attack", attack, aparams),
        sc,
        0,
        preset="test",
        victims=tuple(victims),
    )
    result = compute_attack(Job(spec, RunContext()))
    psnr = []
    for v in result["victims"]:
        a, b = v["output"]["images"], v["truth"]["images"]
        psnr.append(float(10 * np.log10(1 / max(np.mean((a - b) ** 2), 1e-10))))
    return np.array(psnr), result


def test_noise_aware_beats_dlg_on_small_gaussian_noise():
    """dp-gaussian[sigma=0.01]: the scaled, clipped L2 + prior recovers more than DLG's unclipped L2."""
    noise, res = _run("dp-gaussian", {"sigma": 0.01, "clip": 1.0}, "noise-aware", {"iterations": 40})
    dlg, _ = _run("dp-gaussian", {"sigma": 0.01, "clip": 1.0}, "dlg", {"iterations": 2})
    extra = res["victims"][0]["output"]["extra"]
    assert (
        extra["noise_law"] == "gaussian" and extra["adaptive"] is True and extra["label_strategy"] == "rows"
    )
    assert np.median(noise) > np.median(dlg) + 3, (noise, dlg)


def test_noise_aware_l1_on_laplace_noise_matches_its_l2_variant():
    """dp-laplace: the Laplace likelihood (L1 / b) reaches at least the PSNR of the same attack with the
    Gaussian likelihood of the same variance (L2), up to 1.5 dB on the mean over three victims (measured:
    at 100 iterations L1 trails L2 by 0.5 dB on the mean, either ahead on a given victim: L1 does not beat
    L2 here, it matches within the tolerance)."""
    l1, res = _run("dp-laplace", {"b": 0.01, "clip": 1.0}, "noise-aware", {"iterations": 100})
    l2, res2 = _run(
        "dp-laplace", {"b": 0.01, "clip": 1.0}, "noise-aware", {"iterations": 100, "likelihood": "l2"}
    )
    assert res["victims"][0]["output"]["extra"]["noise_law"] == "laplace"
    assert res2["victims"][0]["output"]["extra"]["noise_law"] == "gaussian"
    assert np.mean(l1) >= np.mean(l2) - 1.5, (l1, l2)


def test_frl_adaptive_recovers_at_least_as_much_as_dlg_on_frl():
    adaptive, res = _run("frl", {"lam": 5.0}, "frl-adaptive", {"iterations": 10})
    dlg, _ = _run("frl", {"lam": 5.0}, "dlg", {"iterations": 10})
    extra = res["victims"][0]["output"]["extra"]
    assert extra["sent_coordinates_only"] is True and extra["sa_step_simulated"] is True
    assert np.mean(adaptive) >= np.mean(dlg) - 0.5, (adaptive, dlg)


# ----------------------------------------------------------------------------------- negative paths


def test_noise_aware_against_no_defense_is_plain_l2_matching():
    _, res = _run("none", {}, "noise-aware", {"iterations": 3}, victims=(0, 1))
    extra = res["victims"][0]["output"]["extra"]
    assert extra["noise_law"] == "none" and extra["adaptive"] is False and extra["prior_weight"] == 0.0


def test_frl_adaptive_against_another_defense_is_plain_matching():
    _, res = _run("dp-gaussian", {}, "frl-adaptive", {"iterations": 2}, victims=(0, 1))
    extra = res["victims"][0]["output"]["extra"]
    assert extra["adaptive"] is False and "is not frl" in extra["fallback"]


@pytest.mark.parametrize(
    "defense, attack, message",
    [
        ("soteria", "noise-aware", "noise-aware models the noise of"),
    ],
)
def test_a_defense_the_attack_does_not_model_is_a_clear_error(defense, attack, message):
    with pytest.raises(RunFailure, match=message):
        _run(defense, {}, attack, {"iterations": 2}, victims=(0, 1))


@pytest.mark.parametrize(
    "attack, params",
    [
        ("noise-aware", {"prior_weight": -1.0}),
        ("noise-aware", {"likelihood": "l3"}),
        ("frl-adaptive", {"sa_step": "maybe"}),
        ("frl-adaptive", {"iterations": 0}),
    ],
)
def test_bad_parameters_are_a_one_line_error(attack, params):
    with pytest.raises(FedbenchError) as err:
        ComponentSpec.resolve("attack", attack, params)
    assert "\n" not in str(err.value) and next(iter(params)) in str(err.value)


def test_both_declare_the_defenses_they_adapt_to():
    from fedbench.registry import attacks

    assert attacks.get("noise-aware").adapts_to == (
        "dp-gaussian",
        "dp-laplace",
        "fed-sdp",
        "fed-cdp",
        "fed-cdp-decay",
        "dp-sgd",
        "dp-fedavg",
    )
    assert attacks.get("frl-adaptive").adapts_to == ("frl",)
