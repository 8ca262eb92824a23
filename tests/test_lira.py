"""Offline LiRA (`mia-lira`): the scoring rule by hand, the per-example calibration on a memorising
model, the plugin end to end, and its parameter checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import norm
from torch import nn

import fedbench.attacks.lira  # noqa: F401  (registers mia-lira even where the built-in list lacks it)
from fedbench import registry
from fedbench.attacks import _membership_core as core
from fedbench.attacks.lira import lira_scores, model_phi, reference_phis, scaled_logit
from fedbench.errors import ParamError
from fedbench.metrics.membership import membership_scores
from fedbench.testing import check_plugin


def test_scaled_logit_is_log_odds_of_the_true_label_and_stays_finite():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0], [200.0, 0.0, 0.0]])
    y = torch.tensor([0, 1, 0])
    p = torch.softmax(logits.double(), dim=1)
    phi = scaled_logit(logits, y)
    assert phi[0].item() == pytest.approx(np.log(p[0, 0] / (1 - p[0, 0])).item())
    assert phi[1].item() == pytest.approx(np.log(0.5))  # 1/3 vs 2/3
    # p_y rounds to 1 in float64 (log(p/(1-p)) would be inf); the stable form gives 200 - log 2
    assert phi[2].item() == pytest.approx(200 - np.log(2))


def test_scores_by_hand_far_above_the_reference_mean_is_near_one_at_the_mean_one_half():
    ref = np.array([[0.0, 1.0, -2.0], [2.0, 3.0, 2.0]])  # K=2 models, 3 examples; means 1, 2, 0
    target = np.array([1.0, 40.0, -0.5])
    fixed = lira_scores(target, ref, fixed_variance=True)
    # per-example variances (ddof=1): 2, 2, 8 -> global sigma sqrt(4) = 2
    assert fixed == pytest.approx(norm.cdf([0.0, 38 / 2, -0.5 / 2]))
    assert fixed[0] == pytest.approx(0.5) and fixed[1] > 0.999 and fixed[2] < 0.5
    per = lira_scores(target, ref, fixed_variance=False)
    assert per == pytest.approx(norm.cdf([0.0, 38 / np.sqrt(2), -0.5 / np.sqrt(8)]))
    # the same target margin scores higher on a low-variance example than on a high-variance one
    steady = lira_scores(np.array([3.0, 3.0]), np.array([[0.0, -4.0], [0.2, 4.0], [-0.2, 0.0]]), False)
    assert steady[0] > 0.999 and steady[1] == pytest.approx(norm.cdf(0.75))
    with pytest.raises(ValueError, match="at least 2 reference"):
        lira_scores(target, ref[:1])
    with pytest.raises(ValueError, match="phi_ref must be"):
        lira_scores(target, ref[:, :2])


def _population(n, g, dim=8, classes=4, hard_every=4):
    """Gaussian clusters, one per class; every `hard_every`-th example carries a wrong (random) label."""
    centres = torch.randn(classes, dim, generator=torch.Generator().manual_seed(7)) * 3
    cluster = torch.randint(0, classes, (n,), generator=g)
    x = centres[cluster] + torch.randn(n, dim, generator=g)
    y = cluster.clone()
    hard = torch.zeros(n, dtype=torch.bool)
    hard[::hard_every] = True
    y[hard] = (cluster[hard] + torch.randint(1, classes, (int(hard.sum()),), generator=g)) % classes
    return x, y, hard


def _pair_auc(scores, positives, negatives):
    """P(score of a positive > score of a negative), ties counted half."""
    a, b = scores[positives][:, None], scores[negatives][None, :]
    return float((a > b).mean() + 0.5 * (a == b).mean())


@pytest.mark.numeric
def test_lira_calibrates_each_example_on_a_memorising_model():
    """An MLP that memorised 32 points, a quarter of them mislabelled ("hard": no model that did not
    train on one predicts its label): LiRA beats chance, and ranks the hard members above the easy
    non-members, which the loss threshold ranks the other way round (their loss is lower)."""
    g = torch.Generator().manual_seed(2)
    x, y, hard = _population(32 + 32 + 256, g)
    members, own = slice(0, 32), slice(64, None)
    cpu = torch.device("cpu")
    torch.manual_seed(2)
    target = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
    core.train_shadow(target, x[members], y[members], 40, 0.1, 8, cpu, g)
    xq, yq = x[:64], y[:64]  # 32 members, then 32 non-members
    is_member = np.r_[np.ones(32), np.zeros(32)].astype(np.int8)
    ref = reference_phis(target, xq, yq, x[own], y[own], 8, 32, 40, 0.1, 8, cpu, g, np.random.default_rng(2))
    assert ref.shape == (8, 64)
    scores = lira_scores(model_phi(target, xq, yq, cpu), ref)
    loss = core.loss_scores(core.probabilities(target, xq, cpu), yq, "loss")
    assert membership_scores(is_member, scores, scores > 0.5).auc > 0.6
    h = hard[:64].numpy()
    hard_members, easy_nonmembers = h & (is_member == 1), ~h & (is_member == 0)
    lira_pairs = _pair_auc(scores, hard_members, easy_nonmembers)
    loss_pairs = _pair_auc(loss, hard_members, easy_nonmembers)
    assert loss_pairs < 0.5 < 0.8 < lira_pairs, (loss_pairs, lira_pairs)


def test_mia_lira_runs_end_to_end_and_reports_the_membership_columns():
    assert registry.attacks.canonical("lira") == "mia-lira"
    cls = registry.attacks.get("mia-lira")
    assert cls.family == "membership" and "2112.03570" in cls.paper.url
    row = check_plugin("attack", "mia-lira", {"shadows": 2, "shadow_epochs": 2})
    assert row["attack_name"] == "mia-lira" and row["mia_base_rate"] == 0.5
    for col in ("mia_auc", "mia_acc"):
        assert 0 <= row[col] <= 1
    # a tiny evaluated set resolves no low FPR (10 / FPR non-members needed): n/a, and the row says why
    assert row["mia_n_nonmembers"] < 1000 and row["mia_tpr_at_1pct_fpr"] is None
    assert row["mia_tpr_at_0.1pct_fpr"] is None and "n/a" in row["mia_low_fpr_note"]
    assert -1 <= row["mia_advantage"] <= 1
    assert row["tm_mia_members"] == "victim" and row["mia_examples"] > 0


@pytest.mark.parametrize("bad", [{"shadows": 0}, {"shadows": 1}, {"shadow_epochs": 0}, {"shadow_size": -1}])
def test_bad_params_are_refused(bad):
    with pytest.raises(ParamError, match=next(iter(bad))):
        registry.attacks.get("mia-lira").make_params(bad)
