"""The one-run audit (fedbench.auditing, Steinke, Nasr & Jagielski, NeurIPS 2023): the bound by hand and
against an independent root-finding, its validity and power on randomized response (a mechanism whose
epsilon is exact), the canaries' split, and end to end on a FedAvg scenario in the style of the
inversion boards (mnist5k, MLP): a deliberately broken DP-SGD is caught above its formal epsilon, the
correct one is not; `fedbench audit` prints both and exits 1 on the broken one."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import binom
from typer.testing import CliRunner

from fedbench.auditing import AuditConfig, audit_spec, epsilon_lower_bound, p_value, search_guesses
from fedbench.auditing.bound import correct_guesses, default_choices
from fedbench.errors import FedbenchError

# ------------------------------------------------------------------------------------------- bound


def test_p_value_by_hand_with_the_delta_term():
    # eps = log 3: q = 3/4. All 10 of 10 correct: P[Bin(10, 3/4) >= 10] = 0.75^10. The delta term is
    # 2 m delta max_i P[10 > Bin >= 10 - i] / i; the running sums of pmf(9), pmf(8), pmf(7), ... over i
    # peak at i = 3 (0.7196 / 3).
    pmf = [math.comb(10, k) * 0.75**k * 0.25 ** (10 - k) for k in range(11)]
    sums = np.cumsum([pmf[10 - i] for i in range(1, 11)])
    alpha = max(sums[i - 1] / i for i in range(1, 11))
    assert alpha == pytest.approx((pmf[9] + pmf[8] + pmf[7]) / 3)
    assert alpha == pytest.approx(0.23986, abs=1e-5)
    assert p_value(10, 10, 10, math.log(3), 0.0) == pytest.approx(0.75**10)
    assert p_value(10, 10, 10, math.log(3), 1e-3) == pytest.approx(0.75**10 + 2 * 10 * 1e-3 * alpha)
    assert p_value(10, 10, 10, math.log(3), 1e-3) == pytest.approx(0.061111, abs=1e-6)
    assert p_value(10, 10, 0, 1.0, 0.5) == 1.0  # no correct guess: nothing to reject


def test_all_correct_guesses_closed_form():
    # delta = 0, r of r correct: p = q^r, so the bound solves q = beta^(1/r), eps = log(q / (1 - q))
    for r, beta in ((10, 0.05), (50, 0.05), (100, 0.01)):
        q = beta ** (1 / r)
        assert epsilon_lower_bound(r, r, r, 0.0, beta) == pytest.approx(math.log(q / (1 - q)), abs=1e-7)
    assert epsilon_lower_bound(10, 10, 10, 0.0) == pytest.approx(1.05187, abs=1e-5)
    assert epsilon_lower_bound(1000, 100, 100, 1e-5) == pytest.approx(3.4654, abs=1e-3)


def test_bound_matches_independent_root_finding():
    # delta = 0: the bound is the eps at which P[Bin(r, e^eps / (1 + e^eps)) >= v] = beta
    for r, v in ((100, 80), (400, 300), (60, 59)):
        root = brentq(lambda e, r=r, v=v: binom.sf(v - 1, r, 1 / (1 + math.exp(-e))) - 0.05, 0, 30)
        assert epsilon_lower_bound(1000, r, v, 0.0) == pytest.approx(root, abs=1e-6)


def test_bound_is_monotone_in_correct_guesses_and_zero_at_chance():
    bounds = [epsilon_lower_bound(1000, 200, v, 1e-5) for v in range(0, 201, 5)]
    assert all(a <= b for a, b in zip(bounds, bounds[1:], strict=False))
    assert bounds[-1] > 3 and bounds[0] == 0
    for r in (10, 100, 500):
        assert epsilon_lower_bound(1000, r, r // 2, 1e-5) == 0  # half right: what a coin gets
    # delta loosens the bound, and a larger m with the same guesses does too (the 2 m delta term)
    assert epsilon_lower_bound(1000, 100, 90, 1e-3) < epsilon_lower_bound(1000, 100, 90, 0.0)
    assert epsilon_lower_bound(10**5, 100, 90, 1e-5) < epsilon_lower_bound(100, 100, 90, 1e-5)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="correct"):
        p_value(10, 5, 6, 1.0, 0.0)
    with pytest.raises(ValueError, match="beta"):
        epsilon_lower_bound(10, 5, 5, 0.0, beta=1.5)
    with pytest.raises(ValueError, match="k\\+"):
        correct_guesses(np.zeros(4), np.zeros(4, bool), 3, 2)


def test_guesses_by_hand_and_the_bonferroni_search():
    scores = np.array([0.9, 0.1, 0.8, 0.2, 0.5, 0.4])
    included = np.array([True, False, False, False, True, True])
    # top 2 (0.9 in, 0.8 out) -> 1 correct; bottom 2 (0.1 out, 0.2 out) -> 2 correct
    assert correct_guesses(scores, included, 2, 0) == 1
    assert correct_guesses(scores, included, 0, 2) == 2
    assert correct_guesses(scores, included, 2, 2) == 3
    # one fixed rule: no correction; K rules: each at beta / K, and the best of them is reported
    rng = np.random.default_rng(0)
    inc = rng.random(500) < 0.5
    s = inc + rng.normal(size=500)
    one = search_guesses(s, inc, 1e-5, 0.05, ((50, 50),))
    assert one.tests == 1
    assert one.eps_lower == epsilon_lower_bound(500, 100, correct_guesses(s, inc, 50, 50), 1e-5, 0.05)
    best = search_guesses(s, inc, 1e-5, 0.05)
    assert best.tests == len(default_choices(500))
    v = correct_guesses(s, inc, best.k_plus, best.k_minus)
    assert best.correct == v
    assert best.eps_lower == epsilon_lower_bound(500, best.guesses, v, 1e-5, 0.05 / best.tests)
    assert best.eps_lower > 0.5  # the signal (a shift of one standard deviation) is found


@pytest.mark.parametrize("eps", [0.5, 2.0, 4.0])
def test_randomized_response_is_never_overbounded_and_nearly_reached(eps):
    """eps-DP randomized response on each canary's bit is the worst case of the paper's theorem (every
    guess right with probability exactly e^eps / (1 + e^eps)): over 10 draws the 95 % bound never
    exceeds eps, and with m = 1000 it gets within half of it."""
    bounds = []
    for seed in range(10):
        rng = np.random.default_rng(seed)
        inc = rng.random(1000) < 0.5
        flipped = rng.random(1000) < 1 / (1 + math.exp(eps))
        scores = (inc ^ flipped) + 1e-3 * rng.random(1000)  # the released bit; ties broken at random
        bounds.append(search_guesses(scores, inc, 0.0).eps_lower)
    assert max(bounds) <= eps
    assert np.median(bounds) > 0.5 * eps


# ------------------------------------------------------------------------------- training with canaries

DATASET, MODEL = ("mnist5k", {}), ("mlp", {"hidden": [64]})
# FedAvg, 2 clients of 50 digits, 4 rounds of 10 local epochs: small enough for seconds, long enough
# that a model trained without noise memorises its mislabeled canaries
SCENARIO = {
    "protocol": "fedavg",
    "clients": 2,
    "rounds": 4,
    "local_epochs": 10,
    "batch_size": 16,
    "lr": 0.2,
    "train_size": 100,
    "eval_every": 4,
}
CLAIM = 0.5  # the epsilon both DP rows claim (example level, delta 1e-5)
DP = {"epsilon": CLAIM, "clip": 10.0, "per_example": "ghost"}
M = 200


def spec_of(defense: str, params: dict | None = None, seed: int = 0):
    from fedbench.plugin import Scenario
    from fedbench.spec.run import ComponentSpec, RunSpec

    return RunSpec(
        ComponentSpec.resolve("dataset", *DATASET),
        ComponentSpec.resolve("model", *MODEL),
        ComponentSpec.resolve("defense", defense, params or {}),
        None,
        Scenario.from_dict(SCENARIO),
        seed,
    )


@pytest.fixture
def broken_dp():
    """`audit-broken-dpsgd`: dp-sgd that clips but forgets its noise, while its accounting is dp-sgd's
    untouched (the sigma calibrated to `epsilon`): every row claims the formal epsilon of a correct
    dp-sgd. Registered for the test, unregistered afterwards."""
    from fedbench import registry
    from fedbench.defenses.dp_calibrated import DPSGD

    @registry.register_defense("audit-broken-dpsgd")
    class BrokenDPSGD(DPSGD):
        """dp-sgd without its Gaussian noise (the bug); it still reports dp-sgd's epsilon."""

        version = "1"
        paper = None

        def per_example(self, grads, ctx):
            return self.clipped_means(grads, self.clip_at(ctx))  # the noise is never added

    yield "audit-broken-dpsgd"
    registry.defenses.unregister("audit-broken-dpsgd")


def test_canaries_join_the_rows_own_split():
    """The row's records keep the split of the row's own run; an included canary joins its drawn owner."""
    from fedbench.auditing.canaries import make_canaries
    from fedbench.auditing.training import audit_bundle, client_split
    from fedbench.data import load_dataset
    from fedbench.data.partition import partition

    bundle = load_dataset("mnist5k", {}, None, False)
    spec = spec_of("none")
    canaries = make_canaries(bundle, 100, 50, "mislabeled", 2, 0)
    assert 10 < canaries.included.sum() < 40  # fair coins
    true = bundle.y_train[100:150]
    assert (canaries.y != true).all() and torch_equal(canaries.x, bundle.x_train[100:150])
    split = client_split(bundle, spec.scenario, 100, canaries, 0)
    own = partition(bundle.y_train[:100].numpy(), 2, "iid", seed=0)
    for c in range(2):
        assert list(split[c][split[c] < 100]) == list(own[c])
        canary_rows = split[c][split[c] >= 100] - 100
        assert (canaries.owner[canaries.included][canary_rows] == c).all()
    data = audit_bundle(bundle, 100, canaries)
    assert len(data.y_train) == 100 + canaries.included.sum()
    # the coins are independent of where a canary goes, and re-drawn per seed
    other = make_canaries(bundle, 100, 50, "mislabeled", 2, 1)
    assert (other.included != canaries.included).any()
    with pytest.raises(FedbenchError, match="lower --canaries"):
        make_canaries(bundle, 100, 4901, "mislabeled", 2, 0)
    noise = make_canaries(bundle, 4000, 30, "noise", 2, 0)  # no spare record needed
    assert noise.x.shape == (30, 1, 28, 28)


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


@pytest.mark.numeric
def test_broken_dp_is_caught_above_its_formal_epsilon_and_correct_dp_is_not(broken_dp, tmp_path):
    """The MUST of issue 28: a deliberately broken DP mechanism gets a lower bound above its formal
    epsilon (here a FedAvg scenario in the style of the inversion boards, not membership), and the
    correct mechanism at the same claim does not exceed its formal epsilon."""
    from fedbench.execution.cache import RunCache

    cache = RunCache(tmp_path / "cache")
    broken = audit_spec(spec_of(broken_dp, DP), AuditConfig(canaries=M), cache)
    correct = audit_spec(spec_of("dp-sgd", DP), AuditConfig(canaries=M), cache)
    for r in (broken, correct):
        assert r.formal_eps == pytest.approx(CLAIM, rel=1e-3) and r.dp_level == "example"
        assert r.m == M and r.confidence == 0.95 and r.delta == 1e-5
        assert r.correct <= r.guesses == r.k_plus + r.k_minus
    # measured 2.29 (80 of 80 guesses right): the noiseless model memorised its canaries
    assert broken.eps_lower > 2 * CLAIM and broken.violation
    assert correct.eps_lower <= correct.formal_eps and not correct.violation  # measured 0
    assert "Steinke" in broken.method_line and f"m={M}" in broken.method_line


def test_the_audit_training_is_cached(tmp_path, monkeypatch):
    from fedbench.auditing import audit as audit_module
    from fedbench.execution.cache import RunCache

    calls = []
    real = audit_module._train
    monkeypatch.setattr(audit_module, "_train", lambda *a: calls.append(1) or real(*a))
    config = AuditConfig(canaries=20, kind="noise")
    spec = spec_of("none")
    spec = dataclasses.replace(spec, scenario=spec.scenario.replace(rounds=1, local_epochs=1, eval_every=1))
    cache = RunCache(tmp_path / "cache")
    first = audit_spec(spec, config, cache)
    again = audit_spec(spec, AuditConfig(canaries=20, kind="noise", confidence=0.9), cache)
    assert len(calls) == 1  # the bound's settings are not part of the training's key
    assert first.formal_eps is None and not first.violation and again.confidence == 0.9
    audit_spec(spec, AuditConfig(canaries=21, kind="noise"), cache)
    assert len(calls) == 2


# ----------------------------------------------------------------------------------------------- CLI

runner = CliRunner()
SETS = [a for k, v in SCENARIO.items() for a in ("--set", f"scenario.{k}={v}")]


def _dp(name: str) -> str:
    return f"{name}[{','.join(f'{k}={v}' for k, v in DP.items())}]"


@pytest.mark.numeric
def test_cli_flags_the_violation_with_exit_1(broken_dp, tmp_path):
    from fedbench.cli import app

    args = ["audit", "-d", "mnist5k", "-m", "mlp[hidden=[64]]", "--canaries", str(M), *SETS]
    args += ["--cache-dir", str(tmp_path / "cache"), "--threads", "1"]
    res = runner.invoke(app, [*args, "-D", _dp(broken_dp), "-D", _dp("dp-sgd")])
    assert res.exit_code == 1, res.output
    lines = res.output
    assert lines.count("VIOLATION") == 1 and "1 row(s) exceed their formal epsilon" in lines
    assert f"one-run audit (Steinke, Nasr & Jagielski, NeurIPS 2023), black-box, m={M}" in lines
    assert "at 95% confidence" in lines and "formal epsilon 0.5" in lines
    res = runner.invoke(app, [*args, "-D", _dp("dp-sgd"), "--json"])  # from the cache
    assert res.exit_code == 0, res.output
    import json

    row = json.loads(res.stdout.strip().splitlines()[-1])
    assert row["violation"] is False and row["m"] == M and row["eps_lower"] <= row["formal_eps"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--canaries", "1"], "--canaries 1"),
        (["--canaries", "4901"], "lower --canaries"),
        (["--k-plus", "3"], "--k-plus and --k-minus go together"),
        (["--k-plus", "300", "--k-minus", "300", "--canaries", "500"], "0 < sum <="),
        (["--confidence", "1.5"], "--confidence 1.5"),
        (["--canary-kind", "pixels"], "--canary-kind pixels"),
        (["-D", "dp-sgdd"], "did you mean"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    from fedbench.cli import app

    base = ["audit", "-d", "mnist5k", "-m", "mlp", "--cache-dir", str(tmp_path), *SETS]
    res = runner.invoke(app, [*base, *args])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert len([line for line in res.output.splitlines() if line.startswith("error:")]) == 1


def test_cli_help_keeps_its_bracketed_examples():
    from fedbench.cli import app

    res = runner.invoke(app, ["audit", "--help"], terminal_width=200)
    assert res.exit_code == 0
    assert "dp-sgd[epsilon=4,per_example=ghost]" in res.output
    assert "[default: 0]" in res.output and "Steinke" in res.output
