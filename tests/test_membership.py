"""Membership inference: metrics against hand-computed ROC points, the balanced design, the attacks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedbench.attacks import _membership_core as core
from fedbench.metrics.membership import membership_scores, operating_point, roc_points
from fedbench.plugin import DatasetBundle, DatasetMeta, RunData

# 2 members, 2 non-members; a member and a non-member tie at 0.5
TIES = dict(is_member=[1, 0, 1, 0], scores=[0.9, 0.5, 0.5, 0.1])


def test_roc_points_by_hand():
    fpr, tpr = roc_points(**TIES)
    # thresholds inf, 0.9, 0.5, 0.1 -> (0,0), (0,1/2), (1/2,1), (1,1)
    assert np.allclose(fpr, [0, 0, 0.5, 1]) and np.allclose(tpr, [0, 0.5, 1, 1])


def test_tpr_at_low_fpr_is_an_operating_point_of_the_scores():
    # at FPR <= 1/2 (2 non-members): t = 0.5 flags both members and the tied non-member
    p = operating_point(**TIES, target=0.5)
    assert (p.threshold, p.tp, p.fp, p.members, p.nonmembers) == (0.5, 2, 1, 2, 2)
    # at FPR <= 0.49 the tie at 0.5 cannot be split: only the member at 0.9 is claimed
    p = operating_point(**TIES, target=0.49)
    assert (p.threshold, p.tp, p.fp) == (0.9, 1, 0)
    # 2 non-members resolve no FPR below 10 / 2: n/a, not a number below the data's resolution
    assert not p.resolved and p.tpr is None and p.fpr is None


def test_membership_scores_by_hand():
    s = membership_scores(TIES["is_member"], TIES["scores"], predictions=[1, 1, 0, 0])
    assert s.accuracy == 0.5 and s.advantage == pytest.approx(0.0)  # TPR 1/2 - FPR 1/2
    assert s.auc == pytest.approx(3.5 / 4)  # 3 ordered pairs + one tie counted half
    assert s.base_rate == 0.5 and s.examples == 4
    assert s.row()["mia_tpr_at_1pct_fpr"] is None and "n/a" in s.row()["mia_low_fpr_note"]
    perfect = membership_scores([1, 1, 0, 0], [4, 3, 2, 1], [1, 1, 0, 0])
    assert perfect.accuracy == 1 and perfect.advantage == 1 and perfect.auc == 1
    with pytest.raises(ValueError, match="both members and non-members"):
        membership_scores([1, 1], [0.2, 0.3], [1, 1])


def test_best_threshold_maximises_calibration_accuracy():
    thr = core.best_threshold(np.array([0.9, 0.8, 0.4]), np.array([0.1, 0.3, 0.5]))
    assert 0.5 < thr < 0.8 or 0.3 < thr < 0.4
    assert core.best_threshold(np.array([5.0, 6.0]), np.array([1.0, 2.0])) == pytest.approx(3.5)


def _run_data(n_train=200, n_test=120, classes=4, reserved=()):
    g = torch.Generator().manual_seed(0)
    meta = DatasetMeta("toy", (6,), classes, "tabular")
    bundle = DatasetBundle(
        meta,
        torch.randn(n_train + 40, 6, generator=g),
        torch.arange(n_train + 40) % classes,
        torch.randn(n_test, 6, generator=g),
        torch.arange(n_test) % classes,
    )
    kept = [i for i in range(n_train) if i not in set(reserved)]
    clients = (
        tuple(i for i in kept if bundle.y_train[i] < 2),
        tuple(i for i in kept if bundle.y_train[i] >= 2),
    )
    return RunData(bundle, n_train, n_test, clients, tuple(reserved))


def test_design_is_balanced_class_matched_and_excludes_reserved_examples():
    data = _run_data(reserved=(0, 1, 2, 3))
    split, unused = core.membership_split(
        data, 0, "victim", "test", "class-matched", 0, np.random.default_rng(0)
    )
    assert split.is_member.mean() == 0.5  # the stated base rate
    assert len(split.y_in) == len(split.y_out)
    members = split.y_eval[split.is_member == 1]
    non = split.y_eval[split.is_member == 0]
    assert set(members.tolist()) <= {0, 1} and set(non.tolist()) <= {0, 1}  # the victim's 2 classes only
    # each half is class-matched on its own (one shuffle of the pairs): a label-only attack is at chance
    assert sorted(split.y_in.tolist()) == sorted(split.y_out.tolist())
    assert sorted(members.tolist()) == sorted(non.tolist())
    victim_rows = data.bundle.x_train[list(data.client_indices[0])]
    reserved_rows = data.bundle.x_train[:4]
    for row in torch.cat([split.x_in, split.x_eval[split.is_member == 1]]):
        assert (victim_rows == row).all(1).any() and not (reserved_rows == row).all(1).any()
    assert len(unused) == data.test_size - len(split.y_out) - len(non)
    with pytest.raises(Exception, match="member/non-member pairs"):
        core.membership_split(data, 0, "victim", "test", "class-matched", 3, np.random.default_rng(0))


@pytest.mark.numeric
def test_loss_and_direct_attacks_detect_a_memorising_model():
    """An MLP that memorised random labels: members have near-zero loss, non-members do not."""
    data = _run_data(n_train=120, n_test=120)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 128), nn.ReLU(), nn.Linear(128, 4))
    x, y = data.bundle.x_train[:120], data.bundle.y_train[:120]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(300):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    split, _ = core.membership_split(data, 0, "all", "test", "class-matched", 0, np.random.default_rng(1))
    probs = {
        k: core.probabilities(model, getattr(split, f"x_{k}"), torch.device("cpu"))
        for k in ("in", "out", "eval")
    }
    cal_in = core.loss_scores(probs["in"], split.y_in, "loss")
    cal_out = core.loss_scores(probs["out"], split.y_out, "loss")
    scores = core.loss_scores(probs["eval"], split.y_eval, "loss")
    loss_attack = membership_scores(split.is_member, scores, scores > core.best_threshold(cal_in, cal_out))
    assert loss_attack.accuracy > 0.8 and loss_attack.auc > 0.9
    g = torch.Generator().manual_seed(0)
    net = core.train_membership_net(
        probs["in"], split.y_in, probs["out"], split.y_out, 4, "spec", 60, 1e-2, 32, g
    )
    out = core.net_output(net, probs["eval"], split.y_eval)
    assert membership_scores(split.is_member, out.scores, out.predictions).accuracy > 0.7


def test_members_all_are_exactly_the_records_some_client_trained_on():
    # issue 16 (3): members=all counted the server's reserved records (FRL's auxiliary set) as members
    data = _run_data(reserved=tuple(range(40)))
    split, _ = core.membership_split(data, 0, "all", "test", "uniform", 0, np.random.default_rng(0))
    reserved_rows = data.bundle.x_train[:40]
    trained = data.bundle.x_train[sorted(i for ix in data.client_indices for i in ix)]
    members = torch.cat([split.x_in, split.x_eval[split.is_member == 1]])
    for row in members:
        assert not (reserved_rows == row).all(1).any(), "a reserved record was scored as a member"
        assert (trained == row).all(1).any()
    assert len(members) == min(160, 120)  # every non-reserved record is eligible; capped by the test split


def test_row_states_how_many_members_and_non_members_were_scored():
    from fedbench.metrics import attack_metrics

    class _Attack:
        family = "membership"

    is_member = [1, 1, 1, 0, 0, 0]
    result = {
        "output": {
            "scores": [0.9, 0.8, 0.4, 0.3, 0.2, 0.6],
            "predictions": [1, 1, 0, 0, 0, 1],
            "extra": {"is_member": is_member},
        },
        "truth": {},
        "observation": {"point": "model"},
    }
    row = attack_metrics(_Attack(), result).columns
    assert row["mia_n_members"] == 3 and row["mia_n_nonmembers"] == 3
