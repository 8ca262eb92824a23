"""RMIA (`mia-rmia`) and online LiRA (`mia-lira-online`): the scoring rules by hand, both beating the
loss threshold on a tiny overfit target, FL-aware references trained through the FL simulation and
shared across target seeds, and the negative paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import norm
from torch import nn

import fedbench.attacks.lira_online  # noqa: F401  (registers the attacks even where the built-in list lacks them)
import fedbench.attacks.rmia  # noqa: F401
from fedbench import registry
from fedbench.attacks import _membership_core as core
from fedbench.attacks import _references_core as refcore
from fedbench.attacks.lira_online import lira_online_scores
from fedbench.attacks.rmia import break_ties, rmia_scores
from fedbench.errors import FedbenchError, ParamError
from fedbench.execution.cache import RunCache
from fedbench.execution.runner import Job, RunContext, compute_attack, execute
from fedbench.metrics.membership import membership_scores
from fedbench.plugin import DatasetBundle, DatasetMeta, Observation, RunData, Scenario, using_artifacts
from fedbench.spec.run import ComponentSpec, RunSpec

# ------------------------------------------------------------------------------------- scoring rules


def test_rmia_score_is_the_papers_pairwise_likelihood_ratio_test_by_hand():
    p_x = np.array([0.9, 0.5, 0.1])
    ref_x = np.array([[0.5, 0.5, 0.5], [0.3, 0.5, 0.7]])  # OUT means 0.4, 0.5, 0.6
    p_z = np.full(4, 0.5)
    ref_z = np.array([[0.1, 0.4, 0.7, 1.0], [0.1, 0.4, 0.7, 1.0]])
    # a = 0.3: Pr(x) = (1.3 m + 0.7) / 2 = 0.61, 0.675, 0.74; Pr(z) = 0.415, 0.61, 0.805, 1.0
    # ratio_x = 1.475, 0.741, 0.135; ratio_z = 1.205, 0.820, 0.621, 0.5
    # LR(x0, z) = 1.22, 1.80, 2.38, 2.95; LR(x1, z) = 0.61, 0.90, 1.19, 1.48; LR(x2, z) < 1
    assert rmia_scores(p_x, ref_x, p_z, ref_z, a=0.3, gamma=1.0) == pytest.approx([1.0, 0.5, 0.0])
    assert rmia_scores(p_x, ref_x, p_z, ref_z, a=0.3, gamma=2.0) == pytest.approx([0.5, 0.0, 0.0])
    # a = 1: Pr is the OUT mean itself; the same test written out pair by pair
    pr_x, pr_z = ref_x.mean(0), ref_z.mean(0)
    by_pairs = [np.mean([(p_x[i] / pr_x[i]) / (p_z[j] / pr_z[j]) >= 1 for j in range(4)]) for i in range(3)]
    assert rmia_scores(p_x, ref_x, p_z, ref_z, a=1.0) == pytest.approx(by_pairs)
    # online: Pr(x) is the plain mean over IN and OUT references (no approximation for x)
    in_x = np.array([[True, False, False], [False, True, True]])
    online = rmia_scores(p_x, ref_x, p_z, ref_z, a=0.3, in_x=in_x)
    ratio_x = p_x / ref_x.mean(0)
    ratio_z = p_z / ((1.3 * ref_z.mean(0) + 0.7) / 2)
    assert online == pytest.approx((ratio_x[:, None] / ratio_z[None, :] >= 1).mean(1))
    # LR exactly gamma counts (>=): x identical to every z
    assert rmia_scores([0.5], [[0.4]], [0.5, 0.5], [[0.4, 0.4]])[0] == 1.0
    with pytest.raises(ValueError, match="population sample"):
        rmia_scores(p_x, ref_x, [], np.zeros((2, 0)))


def test_rmia_ties_are_broken_by_the_ratio_of_x_keeping_the_papers_order():
    rng = np.random.default_rng(0)
    n, m = 400, 20
    p_x, p_z = rng.uniform(0.05, 1, n), rng.uniform(0.05, 1, m)
    ref_x, ref_z = rng.uniform(0.05, 1, (3, n)), rng.uniform(0.05, 1, (3, m))
    share = rmia_scores(p_x, ref_x, p_z, ref_z, gamma=1.5)
    assert len(np.unique(share)) <= m + 1 < n  # the paper's share ties: m + 1 levels for 400 examples
    cont = rmia_scores(p_x, ref_x, p_z, ref_z, gamma=1.5, ties="ratio")
    assert len(np.unique(cont)) == n and ((0 <= cont) & (cont < 1)).all()
    assert (np.floor(cont * (m + 1)) == np.rint(share * m)).all()  # the paper's count is kept
    ratio_x = p_x / ((1.3 * ref_x.mean(0) + 0.7) / 2)
    assert (np.argsort(cont) == np.argsort(ratio_x)).all()  # one order: that of Pr(x|theta) / Pr(x)
    # beyond the extremes and on a sample: below every z in (0, 1/(m+1)), at the top sample k = m
    assert break_ties(np.array([0.0, 1.0, 1.0]), [0.1, 2.0, 50.0], [1.0, 2.0]) == pytest.approx(
        [0.1 / 3, 2 / 3, (2 + 1 - 1 / 25) / 3]
    )
    with pytest.raises(ValueError, match="ties"):
        rmia_scores(p_x, ref_x, p_z, ref_z, ties="random")


def test_online_lira_is_the_log_likelihood_ratio_of_in_and_out_gaussians_by_hand():
    ref = np.array([[4.0, 0.0], [6.0, 2.0], [0.0, 5.0], [2.0, 7.0]])
    is_in = np.array([[True, False], [True, False], [False, True], [False, True]])
    target = np.array([5.0, 1.0])
    # example 0: IN {4, 6} mean 5 var 2, OUT {0, 2} mean 1 var 2; example 1: IN {5, 7}, OUT {0, 2}
    per = lira_online_scores(target, ref, is_in, fixed_variance=False)
    s = np.sqrt(2.0)
    want = [norm.logpdf(5, 5, s) - norm.logpdf(5, 1, s), norm.logpdf(1, 6, s) - norm.logpdf(1, 1, s)]
    assert per == pytest.approx(want)
    assert per[0] > 0 > per[1]  # near the IN mean: member; near the OUT mean: non-member
    assert lira_online_scores(target, ref, is_in, fixed_variance=True) == pytest.approx(want)  # equal vars
    with pytest.raises(ValueError, match="at least 2 IN"):
        lira_online_scores(target, ref[1:], is_in[1:])


def test_balanced_assignment_puts_every_example_in_half_the_references():
    is_in = refcore.balanced_in(6, 50, np.random.default_rng(0))
    assert (is_in.sum(axis=0) == 3).all() and (is_in.sum(axis=1) == 25).all()
    assert (is_in[0] != is_in[1]).all()  # a pair splits the examples into complementary halves


# ------------------------------------------------------------------ a tiny overfit target, end to end


def _clusters(n: int, g: torch.Generator, dim: int = 8, classes: int = 4):
    """Gaussian clusters; every 4th example carries a wrong label (no model that did not train on it
    predicts it: the examples a per-example calibration finds and a global loss threshold misses)."""
    centres = torch.randn(classes, dim, generator=torch.Generator().manual_seed(7)) * 3
    cluster = torch.randint(0, classes, (n,), generator=g)
    x = centres[cluster] + torch.randn(n, dim, generator=g)
    y = cluster.clone()
    y[::4] = (cluster[::4] + torch.randint(1, classes, (len(y[::4]),), generator=g)) % classes
    return x, y


def _overfit_run(seed: int, members: int = 128):
    """RunData and the model observation of a target MLP memorising `members` examples (members=all)."""
    g = torch.Generator().manual_seed(seed)
    x_train, y_train = _clusters(members + 512, g)  # beyond the prefix: the attacker's own data
    x_test, y_test = _clusters(512, g)  # the non-member pool
    meta = DatasetMeta("clusters", (8,), 4, "tabular")
    bundle = DatasetBundle(meta, x_train, y_train, x_test, y_test)
    half = members // 2
    data = RunData(
        bundle, members, 512, (tuple(range(half)), tuple(range(half, members))), scenario=Scenario()
    )
    torch.manual_seed(seed)
    target = nn.Sequential(nn.Linear(8, 256), nn.ReLU(), nn.Linear(256, 4))
    lr, batch, epochs = 0.2, 16, 40
    core.train_shadow(target, x_train[:members], y_train[:members], epochs, lr, batch, torch.device("cpu"), g)
    obs = Observation(
        point="model", round=1, client=0, kind="model", shared={}, global_state=target.state_dict(),
        x_true=x_train[:members], y_true=y_train[:members], lr=lr, local_steps=0, batch_size=batch,
        model_mode="eval",
    )  # fmt: skip
    return data, obs, target, meta


def _auc(name: str, params: dict, data, obs, target, meta, seed: int) -> float:
    attack = registry.attacks.get(name)({"members": "all", **params})
    attack.bind_data(data)
    out = attack.run(obs, target, meta, torch.Generator().manual_seed(seed), torch.device("cpu"))
    return membership_scores(out.extra["is_member"], out.scores, out.predictions).auc


@pytest.mark.numeric
def test_rmia_and_online_lira_beat_the_loss_threshold_on_an_overfit_target():
    """Mean AUC over four targets (64 members + 64 non-members evaluated each; measured: loss 0.65,
    RMIA 0.73, online LiRA 0.72): both calibrated attacks clear the loss attack by 0.05 or more with 4
    central references trained like the target (40 epochs)."""
    refs = {"references": "central", "references_n": 4, "central_epochs": 40}
    aucs: dict[str, list[float]] = {"loss": [], "rmia": [], "lira": []}
    for seed in (0, 1, 2, 3):
        run = _overfit_run(seed)
        aucs["loss"].append(_auc("mia-loss", {}, *run, seed))
        aucs["rmia"].append(_auc("mia-rmia", refs, *run, seed))
        aucs["lira"].append(_auc("mia-lira-online", refs, *run, seed))
    mean = {k: float(np.mean(v)) for k, v in aucs.items()}
    assert mean["rmia"] > mean["loss"] + 0.05, mean
    assert mean["lira"] > mean["loss"] + 0.05, mean


# -------------------------------------------------------------------------------- FL-aware references


def _spec(attack: str, params: dict, seed: int, defense: tuple[str, dict] = ("none", {})) -> RunSpec:
    scenario = dict(clients=4, rounds=3, local_steps=2, batch_size=4, lr=0.05, train_size=40, test_size=40)
    return RunSpec(
        ComponentSpec.resolve("dataset", "digits", {}),
        ComponentSpec.resolve("model", "mlp", {"hidden": [16]}),
        ComponentSpec.resolve("defense", *defense),
        ComponentSpec.resolve("attack", attack, {"members": "all", **params}),
        Scenario.from_dict(scenario),
        seed,
        preset="test",
    )


def test_fl_references_are_runs_of_the_targets_protocol_and_defense(monkeypatch):
    from fedbench.fl import simulation

    seen = []
    original = simulation.Simulation.__init__

    def spy(self, scenario, bundle, factory, defense, seed, *args, **kwargs):
        seen.append((scenario, defense, len(bundle.y_train), seed))
        original(self, scenario, bundle, factory, defense, seed, *args, **kwargs)

    monkeypatch.setattr(simulation.Simulation, "__init__", spy)
    dp = ("dp-gaussian", {"sigma": 0.02, "clip": 0.5})
    spec = _spec("mia-lira-online", {"references_n": 4}, seed=3, defense=dp)
    result = compute_attack(Job(spec, RunContext()))
    # the attack's own simulation first, then the target's training (no cache: `trained_model` trains),
    # then one run per reference
    target, trained, *references = seen
    assert trained[2:] == target[2:] and trained[0].rounds == target[0].rounds
    assert len(references) == 4
    extra = result["output"]["extra"]
    assert extra["reference_rounds"] == [3] and extra["reference_clients"] == [4]
    assert extra["references"] == "fl" and extra["references_n"] == 4 and extra["references_online"]
    for sc, defense, n, seed in references:
        for field in ("protocol", "clients", "rounds", "local_steps", "batch_size", "lr", "partition"):
            assert getattr(sc, field) == getattr(target[0], field)
        assert defense.name == "dp-gaussian" and (defense.params.sigma, defense.params.clip) == (0.02, 0.5)
        assert defense is not target[1]  # a fresh instance per reference run
        assert n == 40 and seed != 3  # the target's training-set size; the attacker's seed, not the run's


def test_fl_references_are_one_artifact_for_two_target_seeds(tmp_path, monkeypatch):
    trained = []
    original = refcore._train_fl
    monkeypatch.setattr(refcore, "_train_fl", lambda *a, **k: trained.append(1) or original(*a, **k))
    cache = RunCache(tmp_path / "cache")
    rows = [execute(_spec("mia-rmia", {"references_n": 2}, seed), cache, RunContext()) for seed in (0, 1)]
    assert [r["status"] for r in rows] == ["ok", "ok"], [r.get("reason") for r in rows]
    assert len(trained) == 2  # seed 1 reads seed 0's two references
    entries = [p for p in (tmp_path / "cache").rglob("output.pkl") if "_artifact_entry" in str(p)]
    assert len(entries) == 4  # the two references and each seed's trained target (`trained-model`)


def test_a_diverged_fl_reference_is_redrawn_with_its_next_seed(monkeypatch):
    seeds = []
    original = refcore._train_fl

    def first_diverges(arch, defense, data, x, y, seed, device):
        seeds.append(seed)
        if len(seeds) == 1:
            return {"diverged": "training diverged: non-finite loss in round 2, client 1", "cpu_seconds": 0.0}
        return original(arch, defense, data, x, y, seed, device)

    monkeypatch.setattr(refcore, "_train_fl", first_diverges)
    result = compute_attack(Job(_spec("mia-rmia", {"references_n": 2}, 0), RunContext()))
    extra = result["output"]["extra"]
    assert len(seeds) == 3 and seeds[0] != seeds[1]  # reference 0 twice (a new seed), reference 1 once
    assert extra["references_diverged"] == 1 and extra["references_n"] == 2


def test_central_references_are_shared_by_the_cheap_mode_and_across_seeds(tmp_path, monkeypatch):
    trained = []
    original = refcore._train_central
    monkeypatch.setattr(refcore, "_train_central", lambda *a, **k: trained.append(1) or original(*a, **k))
    store = RunCache(tmp_path / "cache").artifacts
    with using_artifacts(store):
        for seed, n in ((0, 4), (1, 2)):  # offline: K=2 are the first 2 of K=4, for any target seed
            params = {"references": "central", "references_n": n, "central_epochs": 2}
            compute_attack(Job(_spec("mia-rmia", params, seed), RunContext()))
    assert len(trained) == 4


# ------------------------------------------------------------------------------------- negative paths


@pytest.mark.parametrize(
    "name, bad, match",
    [
        ("mia-lira-online", {"references_n": 3}, "references_n >= 4"),
        ("mia-rmia", {"mode": "online", "references_n": 1}, "references_n >= 2"),
        ("mia-rmia", {"offline_a": 1.5}, "offline_a"),
        ("mia-rmia", {"gamma": 0}, "gamma"),
        ("mia-rmia", {"references_n": 0}, "references_n"),
        ("mia-rmia", {"references": "shadow"}, "references"),
    ],
)
def test_bad_params_are_refused_in_one_line(name, bad, match):
    with pytest.raises(ParamError, match=match) as err:
        registry.attacks.get(name).make_params(bad)
    assert "\n" not in str(err.value)


def test_too_little_attacker_data_for_the_references_fails_in_one_line():
    data, obs, target, meta = _overfit_run(0)
    attack = registry.attacks.get("mia-rmia")({"members": "all", "reference_size": 5000})
    attack.bind_data(data)
    with pytest.raises(FedbenchError, match="attacker examples cannot fill") as err:
        attack.run(obs, target, meta, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert "\n" not in str(err.value)


def test_fl_references_without_a_bound_defense_are_refused():
    data, obs, target, meta = _overfit_run(0)
    attack = registry.attacks.get("mia-lira-online")({"members": "all", "references_n": 4})
    attack.bind_data(data)
    with pytest.raises(Exception, match="bind_defense"):
        attack.run(obs, target, meta, torch.Generator().manual_seed(0), torch.device("cpu"))


def test_the_attacks_are_registered_with_their_papers():
    assert registry.attacks.canonical("rmia") == "mia-rmia"
    assert registry.attacks.canonical("lira-online") == "mia-lira-online"
    assert "2312.03262" in registry.attacks.get("mia-rmia").paper.url
    assert "2112.03570" in registry.attacks.get("mia-lira-online").paper.url
    for name in ("mia-rmia", "mia-lira-online"):
        assert registry.attacks.get(name).family == "membership"
