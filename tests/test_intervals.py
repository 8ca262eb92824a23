"""Intervals that stay inside what their metric allows (issue 26, item 6): rates get an exact binomial
(Clopper-Pearson) interval on k of n inputs pooled over seeds, bounded means a t interval clipped to
the metric's range; tables and boards print them as [low, high]; the entry schema keeps them."""

from __future__ import annotations

import pytest
from scipy.stats import binomtest

from fedbench.metrics.catalogue import METRICS
from fedbench.reporting import intervals

# ------------------------------------------------------------------------------------ the statistics


@pytest.mark.parametrize("k,n", [(4, 5), (0, 5), (5, 5), (0, 1), (1, 1), (37, 100), (1, 2)])
def test_clopper_pearson_is_the_exact_binomial_interval(k, n):
    low, high = intervals.clopper_pearson(k, n)
    ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    assert (low, high) == pytest.approx((ref.low, ref.high), abs=1e-9)
    assert 0.0 <= low <= k / n <= high <= 1.0


def test_clopper_pearson_edges_and_bad_counts():
    assert intervals.clopper_pearson(0, 5)[0] == 0.0 and intervals.clopper_pearson(5, 5)[1] == 1.0
    assert intervals.clopper_pearson(5, 5)[0] == pytest.approx(0.025 ** (1 / 5))  # all successes
    with pytest.raises(ValueError, match="at least one input"):
        intervals.clopper_pearson(0, 0)
    with pytest.raises(ValueError, match="between 0 and n"):
        intervals.clopper_pearson(6, 5)


def test_which_metrics_are_rates_and_what_they_count():
    rates = {n for n, m in METRICS.items() if intervals.is_rate(m)}
    assert {"label_acc", "recovered", "exact", "attack_success", "asr", "mia_acc"} <= rates
    assert {"mia_tpr_at_0.1pct_fpr", "mia_tpr_at_1pct_fpr"} <= rates
    assert not rates & {"psnr", "ssim", "mia_auc", "asr_advantage", "mia_advantage", "test_acc", "acc_drop"}
    columns = {
        n: intervals.inputs_column(METRICS[n]) for n in ("label_acc", "asr", "mia_acc", "attack_success")
    }
    assert columns == {
        "label_acc": "tm_observed_examples",
        "asr": "aia_victims",
        "mia_acc": "mia_examples",
        "attack_success": intervals.ONE_PER_RUN,
    }
    assert intervals.inputs_column(METRICS["mia_tpr_at_1pct_fpr"]) == "mia_n_members"
    assert intervals.inputs_column(METRICS["psnr"]) is None
    assert intervals.value_range(METRICS["psnr"]) == (0.0, 100.0)  # the scorer's cap
