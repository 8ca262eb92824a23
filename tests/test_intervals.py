"""Intervals that stay inside what their metric allows (issue 26, item 6): rates get an exact binomial
(Clopper-Pearson) interval on k of n inputs pooled over seeds, bounded means a t interval clipped to
the metric's range; tables and boards print them as [low, high]; the entry schema keeps them."""

from __future__ import annotations

import json
import math

import pytest
from scipy.stats import binomtest
from test_tables import FINISHED, write_synthetic

from fedbench.errors import FedbenchError
from fedbench.metrics.catalogue import METRICS
from fedbench.reporting import board_stats, intervals
from fedbench.reporting import leaderboard as lb
from fedbench.reporting.board_stats import same_statistics as _close
from fedbench.reporting.tables import aggregate, format_cell, load_results, pivot, to_markdown

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


def test_a_rate_pools_k_of_n_inputs_over_seeds():
    m = METRICS["label_acc"]
    cell = aggregate([1.0, 0.75], m, inputs=[4, 4], seeds=[0, 1])
    assert (cell.value, cell.k, cell.inputs, cell.n, cell.spread_kind) == (0.875, 7, 8, 2, "cp95")
    assert (cell.low, cell.high) == pytest.approx(intervals.clopper_pearson(7, 8))
    assert cell.per_seed == ((0, 1.0, 4), (1, 0.75, 4)) and cell.bracketed
    # unequal inputs: the pooled share, not the mean of the seeds' shares
    assert aggregate([1.0, 0.0], m, inputs=[1, 3]).value == 0.25


def test_rate_edges_all_none_and_one_seed():
    m = METRICS["attack_success"]
    none_ = aggregate([0.0, 0.0, 0.0], m, inputs=[1, 1, 1])
    assert (none_.value, none_.low) == (0.0, 0.0) and none_.high == pytest.approx(1 - 0.025 ** (1 / 3))
    every = aggregate([1.0] * 5, m, inputs=[1] * 5)
    assert (every.value, every.high) == (1.0, 1.0) and every.low == pytest.approx(0.025 ** (1 / 5))
    one = aggregate([0.5], METRICS["label_acc"], inputs=[10])  # one seed still has an interval
    assert one.n == 1 and one.low is not None and one.low < 0.5 < one.high
    empty = aggregate([0.0], METRICS["label_acc"], inputs=[0])  # no inputs: no interval
    assert empty.low is None and empty.k is None
    assert aggregate([math.nan], m, inputs=[1]).value is None


def test_bounded_means_stay_in_range():
    psnr = aggregate([100.0, 100.0, 60.0], METRICS["psnr"])  # capped at 100 dB
    assert psnr.high == 100.0 and psnr.low >= 0.0 and psnr.bracketed
    auc = aggregate([0.97, 0.99, 1.0], METRICS["mia_auc"])
    assert auc.high == 1.0 and auc.bracketed
    inside = aggregate([20.0, 21.0, 22.0], METRICS["psnr"])  # far from the bounds: ± as before
    assert not inside.bracketed and format_cell(inside, METRICS["psnr"]) == "21.00 ± 2.48"
    unknown = aggregate([1.0, 0.9, 1.0], METRICS["label_acc"])  # a rate without counts: bounded mean
    assert unknown.spread_kind == "ci95" and unknown.high == 1.0


# --------------------------------------------------------------------------------------- the tables


def _success_rows(successes: dict[str, int], seeds: int = 5):
    """fed-cdp's leakage-types table: one attack run per seed, success or not."""
    rows = []
    for defense, k in successes.items():
        for seed in range(seeds):
            rows.append(
                {
                    "run_id": f"{defense}-{seed}",
                    "utility_id": f"u-{defense}-{seed}",
                    "preset": "fed-cdp",
                    "dataset": "mnist5k",
                    "model": "lenet",
                    "defense": defense,
                    "attack": "cpl",
                    "defense_name": defense,
                    "attack_name": "cpl",
                    "seed": seed,
                    "attack_success": float(seed < k),
                    "mse": 0.1,
                    "test_acc": 0.1,
                    "test_loss": 2.3,
                    "epsilon": None,
                    "seconds": 1.0,
                    "utility_seconds": 1.0,
                    "attack_seconds": 1.0,
                    **FINISHED,
                }
            )
    return rows


def test_compare_prints_a_success_rate_with_its_exact_interval(tmp_path):
    """docs/results/fed-cdp.md printed '100.0 ± 0.0' for 5 of 5 (and 4 of 5 elsewhere)."""
    path = write_synthetic(tmp_path / "s.csv", _success_rows({"none": 5, "fed-sdp": 4, "fed-cdp": 0}))
    p = pivot(load_results([path]), metrics=["attack_success"])
    text = to_markdown(p)
    assert "100.0 [47.8, 100.0]" in text and "80.0 [28.4, 99.5]" in text and "0.0 [0.0, 52.2]" in text
    assert "Clopper-Pearson" in p.title


# ------------------------------------------------------------------------------------------- boards

RATES_BOARD = {"headline": "label_acc", "metrics": ["label_acc", "attack_success"]}


def test_board_entries_keep_intervals_counts_and_per_seed_values(tmp_path):
    rows = _success_rows({"none": 5, "fed-cdp": 4})
    for r in rows:
        r["label_acc"], r["tm_observed_examples"] = (1.0 if r["seed"] else 0.5), 2
    path = write_synthetic(tmp_path / "b.csv", rows, {"board": RATES_BOARD})
    board, entries = lb.build(load_results([path]), "rates", command="fedbench run fed-cdp")
    by = {e["defense"]: e for e in entries}
    stat = by["fed-cdp"]["metrics"]["leakage"]["cpl"]["attack_success"]
    assert (stat["k"], stat["inputs"], stat["spread_kind"], stat["spread"]) == (4, 5, "cp95", None)
    assert stat["per_seed"] == [1.0, 1.0, 1.0, 1.0, 0.0] and stat["per_seed_k"] == [1, 1, 1, 1, 0]
    labels = by["none"]["metrics"]["worst_case"]["label_acc"]  # the only attack's value
    assert (labels["k"], labels["inputs"], labels["selection"]) == (9, 10, "only attack")
    assert labels["per_seed_inputs"] == [2] * 5
    again = board_stats.restat_board(board, entries)  # what a re-render recomputes: the same
    assert all(_close(new, old) for new, old in zip(again, entries, strict=True))
    folder = lb.write_board(tmp_path / "boards", board, entries)
    lb.render(tmp_path / "boards")
    readme = (folder / lb.README_FILE).read_text()
    assert "80.0 [28.4, 99.5]" in readme and "Clopper-Pearson" in readme
    csv = (folder / lb.CSV_FILE).read_text()
    assert "worst_label_acc_low" in csv and "worst_label_acc_k" in csv
    assert lb.stale(tmp_path / "boards") == []


def test_victims_pool_their_inputs(tmp_path):
    """Victims pooled on a board: a rate counts every victim's inputs (k / n over all of them)."""
    rows = []
    for r in _success_rows({"none": 3, "a": 1}, seeds=3):
        for victim, share in ((0, 1.0), (1, 0.0)):
            rows.append(
                dict(
                    r,
                    run_id=f"{r['run_id']}-v{victim}",
                    sc_victim=victim,
                    label_acc=share,
                    tm_observed_examples=1 + 3 * victim,
                )
            )
    path = write_synthetic(tmp_path / "v.csv", rows, {"board": RATES_BOARD})
    _board, entries = lb.build(load_results([path]), "pooled")
    stat = next(e for e in entries if e["defense"] == "a")["metrics"]["leakage"]["cpl"]["label_acc"]
    assert (stat["k"], stat["inputs"], stat["mean"]) == (3, 15, 0.2)  # 1 of 1 + 0 of 4, three seeds
    success = next(e for e in entries if e["defense"] == "a")["metrics"]["leakage"]["cpl"]["attack_success"]
    assert (success["k"], success["inputs"]) == (2, 6)  # each victim's run is one input


def test_old_entries_still_render_and_bad_intervals_are_rejected(board_root):
    """Entries of schema 1 (mean ± spread only) load and render; an interval outside the metric's
    range or not holding its mean is a schema error naming the file."""
    folder = board_root / "synthetic"
    path = folder / lb.ENTRIES_DIR / "none.json"
    doc = json.loads(path.read_text())
    legacy = json.loads(json.dumps(doc))
    legacy["schema"] = 1
    for stat in (legacy["metrics"]["test_acc"], legacy["metrics"]["worst_case"]["psnr"]):
        for key in ("low", "high", "per_seed", "selection"):
            stat.pop(key, None)
    path.write_text(json.dumps(legacy))
    lb.render(board_root)
    assert lb.stale(board_root) == []
    doc["metrics"]["worst_case"]["label_acc"] = {"mean": 1.0, "n": 2, "low": 0.9, "high": 1.2}
    path.write_text(json.dumps(doc))
    with pytest.raises(FedbenchError, match=r"none.json.*label_acc: interval \[0.9, 1.2\] leaves"):
        lb.load_board(folder)
    doc["metrics"]["worst_case"]["label_acc"] = {"mean": 0.5, "n": 2, "low": 0.6, "high": 0.9}
    path.write_text(json.dumps(doc))
    with pytest.raises(FedbenchError, match="must hold the mean"):
        lb.load_board(folder)


def test_the_tradeoff_plot_draws_a_rate_s_interval_as_it_is(tmp_path):
    path = write_synthetic(tmp_path / "s.csv", _success_rows({"none": 5, "fed-cdp": 4}))
    points, _, _ = lb.tradeoff_points(pivot(load_results([path]), metrics=["attack_success"]))
    bars = {p.label: p.leakage_err for p in points}
    assert bars["none"] == pytest.approx((100 * (1 - 0.025 ** (1 / 5)), 0.0))  # nothing above 100 %
