"""TPR at a low FPR as an exact operating point (design §7.1): k_tp / n_mem at the threshold with the
largest TPR whose realised FPR k_fp / n_non is <= the target, n/a where the non-members cannot resolve
the target, and the per-input values (membership and attribute inference) in the JSON sidecar."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from fedbench.cli import app
from fedbench.metrics.catalogue import METRICS
from fedbench.metrics.inference import score_attribute
from fedbench.metrics.membership import LOW_FPRS, membership_scores, operating_point, score_membership
from fedbench.reporting.intervals import inputs_column, is_rate, summarise
from fedbench.reporting.results import read_results


def brute_force(is_member, scores, target):
    """Every candidate threshold (each distinct score and +inf), "member iff score >= t": the largest
    TP among those with FP / n_non <= target, then the fewest FP. Returns (t, tp, fp)."""
    truth = np.asarray(is_member, dtype=bool)
    s = np.asarray(scores, dtype=float)
    n_non = int((~truth).sum())
    best = None
    for t in [*np.unique(s).tolist(), math.inf]:
        flagged = s >= t
        tp, fp = int((flagged & truth).sum()), int((flagged & ~truth).sum())
        if fp / n_non > target:
            continue
        if best is None or (tp, -fp) > (best[1], -best[2]):
            best = (t, tp, fp)
    if best[1] == 0:
        return math.inf, 0, 0
    return best


@pytest.mark.parametrize("target", [0.001, 0.01, 0.05, 0.2])
def test_operating_point_matches_brute_force_on_scores_with_ties(target):
    rng = np.random.default_rng(int(target * 1000))
    for trial in range(60):
        n_mem, n_non = rng.integers(1, 60), rng.integers(1, 300)
        levels = rng.integers(2, 12)  # few distinct values: many ties, across members and non-members
        shift = rng.integers(0, 3)
        scores = np.r_[rng.integers(0, levels, n_mem) + shift, rng.integers(0, levels, n_non)] / 3.0
        is_member = np.r_[np.ones(n_mem, int), np.zeros(n_non, int)]
        perm = rng.permutation(len(scores))
        scores, is_member = scores[perm], is_member[perm]
        p = operating_point(is_member, scores, target)
        t, tp, fp = brute_force(is_member, scores, target)
        assert (p.threshold, p.tp, p.fp) == (t, tp, fp), trial
        assert (p.members, p.nonmembers) == (n_mem, n_non)
        # what the threshold says is what it does: ties at t are flagged together
        flagged = scores >= p.threshold
        assert p.tp == int((flagged & (is_member == 1)).sum()) and p.fp == int(
            (flagged & (is_member == 0)).sum()
        )
        assert p.fp / n_non <= target  # the realised FPR never exceeds the target


def test_a_tie_across_the_boundary_is_not_split():
    # 1000 non-members, so 10 false positives are allowed at 1 %; members: 4 at 0.95, 2 tie with 8
    # non-members at 0.9, 3 tie with 5 non-members at 0.5, 1 at -1
    scores = np.r_[[0.9] * 8, [0.5] * 5, np.zeros(987), [0.95] * 4, [0.9] * 2, [0.5] * 3, [-1.0]]
    is_member = np.r_[np.zeros(1000), np.ones(10)]
    p = operating_point(is_member, scores, 0.01)
    assert (p.threshold, p.tp, p.fp) == (0.9, 6, 8)  # t = 0.5 flags 13 non-members: over the budget
    assert p.tpr == 0.6 and p.fpr == 0.008
    # 0.95 is as good as 0.9 once the 0.9 members score 0.5: the fewer false positives win
    p = operating_point(is_member, np.r_[scores[:1004], [0.5] * 2, scores[1006:]], 0.01)
    assert (p.threshold, p.tp, p.fp) == (0.95, 4, 0)
    # everything tied: flagging anyone flags every non-member, so no member is claimed
    flat = operating_point([1, 0] * 1000, [0.3] * 2000, 0.01)
    assert (flat.threshold, flat.tp, flat.fp, flat.tpr) == (math.inf, 0, 0, 0.0)


def test_na_exactly_when_the_non_members_cannot_resolve_the_target():
    rng = np.random.default_rng(0)
    for n_non, resolved in ((999, False), (1000, True)):
        scores = rng.normal(size=200 + n_non)
        is_member = np.r_[np.ones(200), np.zeros(n_non)]
        row = membership_scores(is_member, scores, scores > 0).row()
        assert (row["mia_tpr_at_1pct_fpr"] is not None) is resolved
        for col in ("mia_tp_at_1pct_fpr", "mia_fp_at_1pct_fpr", "mia_realised_fpr_at_1pct_fpr"):
            assert (row[col] is not None) is resolved, col
        assert row["mia_tpr_at_0.1pct_fpr"] is None and row["mia_threshold_at_0.1pct_fpr"] is None
        assert (
            f"{n_non} non-members" in row["mia_low_fpr_note"] and "10000 for 0.1%" in row["mia_low_fpr_note"]
        )
        assert ("mia_tpr_at_1pct_fpr" in row["mia_low_fpr_note"]) is not resolved
        assert row["mia_n_members"] == 200 and row["mia_n_nonmembers"] == n_non
    p = operating_point(is_member, scores, 0.01)
    assert row["mia_tpr_at_1pct_fpr"] == p.tp / 200 and row["mia_tp_at_1pct_fpr"] == p.tp
    assert row["mia_fp_at_1pct_fpr"] == p.fp <= 10 and row["mia_threshold_at_1pct_fpr"] == p.threshold


def test_a_perfect_attack_has_tpr_one_at_fpr_zero():
    is_member = np.r_[np.ones(100), np.zeros(10_000)]
    scores = np.r_[np.linspace(1, 2, 100), np.linspace(-1, 0.5, 10_000)]
    row = membership_scores(is_member, scores, scores > 0.75).row()
    for suffix, _ in LOW_FPRS:
        assert row[f"mia_tpr_at_{suffix}"] == 1.0 and row[f"mia_tp_at_{suffix}"] == 100
        assert row[f"mia_fp_at_{suffix}"] == 0 and row[f"mia_realised_fpr_at_{suffix}"] == 0.0
        assert row[f"mia_threshold_at_{suffix}"] == 1.0  # the lowest member score
    assert row["mia_low_fpr_note"] == ""


def test_an_uninformative_attack_has_tpr_near_the_fpr():
    rng = np.random.default_rng(1)
    n = 20_000
    is_member = np.r_[np.ones(n), np.zeros(n)]
    scores = rng.random(2 * n)  # the same distribution for members and non-members
    row = membership_scores(is_member, scores, scores > 0.5).row()
    for suffix, target in LOW_FPRS:
        realised = row[f"mia_realised_fpr_at_{suffix}"]
        assert target - 5 / n <= realised <= target  # as close to the target as the ties allow
        assert abs(row[f"mia_tpr_at_{suffix}"] - target) < 5 * math.sqrt(target / n) + 1 / n, suffix


def test_the_rate_declares_its_count_and_pools_to_exact_counts():
    for suffix, _ in LOW_FPRS:
        m = METRICS[f"mia_tpr_at_{suffix}"]
        assert is_rate(m) and inputs_column(m) == "mia_n_members" and m.better == "lower"
        assert not m.required and "exact" in m.about
        assert METRICS[f"mia_realised_fpr_at_{suffix}"].kind == "reference"
    # two seeds: 7 of 50 and 3 of 40 members flagged -> 10 of 90, a Clopper-Pearson interval
    s = summarise(METRICS["mia_tpr_at_1pct_fpr"], [7 / 50, 3 / 40], [50, 40])
    assert (s.k, s.inputs, s.value) == (10, 90, 10 / 90) and 0 < s.low < s.value < s.high < 1


def test_scorers_put_per_input_values_in_the_sidecar_part():
    class _Membership:
        family = "membership"

    output = {
        "scores": [0.9, 0.2, 0.4, 0.1],
        "predictions": [1, 0, 1, 0],
        "extra": {"is_member": [1, 0, 1, 0]},
    }
    scores = score_membership(_Membership(), output, {})
    assert scores.per_image == {
        "mia_score": [0.9, 0.2, 0.4, 0.1],
        "mia_is_member": [1, 0, 1, 0],
        "mia_prediction": [1, 0, 1, 0],
    }
    assert scores.columns["mia_tpr_at_1pct_fpr"] is None and "n/a" in scores.warnings[0]

    cohort = [{"attributes": {"sex": v}} for v in ([0], [1, 1, 0], [1], [0], [2])]
    output = {"predictions": [0, 0, 1, 1, 0], "extra": {"attribute": "sex", "majority_class": 0}}
    attr = score_attribute(None, output, {"cohort": cohort})
    assert attr.per_image == {
        "asr": [1, 0, 1, 0, 0],
        "asr_majority": [1, 0, 0, 1, 0],
        "aia_true": [0, 1, 1, 0, 2],
        "aia_pred": [0, 0, 1, 1, 0],
    }
    row = attr.columns
    assert row["aia_correct"] == 2 and row["aia_victims"] == 5 and row["asr"] == pytest.approx(2 / 5)
    assert row["asr_majority"] == pytest.approx(2 / 5) and row["asr_advantage"] == pytest.approx(0.0)


def test_a_membership_run_writes_scores_and_truths_to_the_sidecar(tmp_path):
    res = CliRunner().invoke(
        app,
        ["run", "smoke", "-a", "mia-loss", "-D", "none", "--set", "scenario.rounds=1", "--no-cache"]
        + ["--threads", "1", "-o", str(tmp_path)],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    path = next(tmp_path.glob("*.csv"))
    frame = read_results(path)
    row = frame[frame["attack"] != ""].iloc[0]
    per = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))["per_image"][row["run_id"]]
    assert len(per["mia_score"]) == len(per["mia_is_member"]) == row["mia_examples"]
    assert sum(per["mia_is_member"]) == row["mia_n_members"] and set(per["mia_is_member"]) == {0, 1}
    # a smoke run scores a few dozen non-members: neither low FPR is resolved, and the row says why
    assert math.isnan(row["mia_tpr_at_1pct_fpr"]) and "n/a" in row["mia_low_fpr_note"]
    assert "n/a" in res.output  # and the run's warning says it once
