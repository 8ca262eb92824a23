"""Trade-off tables: loading/dedup, filters, aggregation over seeds, worst case over attacks, views,
and golden files for the markdown, latex and csv renderings (update: FEDBENCH_UPDATE_GOLDEN=1)."""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import pytest

from fedbench.errors import FedbenchError, UnknownNameError
from fedbench.metrics.catalogue import METRICS, Threshold
from fedbench.reporting.tables import (
    WORST,
    aggregate,
    budget_view,
    load_results,
    pivot,
    target_view,
    to_csv,
    to_json,
    to_latex,
    to_markdown,
    worst_case,
)

GOLDEN = Path(__file__).parent / "golden"

DEFENSES = {
    # label: (name, params, accuracy per seed)
    "none": ("none", {}, (0.92, 0.93)),
    "dp-gaussian[clip=1,sigma=0.1]": ("dp-gaussian", {"clip": 1.0, "sigma": 0.1}, (0.85, 0.87)),
    "sparsification[fraction=0.1]": ("sparsification", {"fraction": 0.1}, (0.90, 0.91)),
}
# psnr per (defense, attack) and seed: the worst attack differs between seeds for `none`
PSNR = {
    ("none", "idlg"): (30.0, 32.0),
    ("none", "ig"): (25.0, 35.0),
    ("dp-gaussian[clip=1,sigma=0.1]", "idlg"): (12.0, 14.0),
    ("dp-gaussian[clip=1,sigma=0.1]", "ig"): (15.0, 13.0),
    ("sparsification[fraction=0.1]", "idlg"): (20.0, 22.0),
    ("sparsification[fraction=0.1]", "ig"): (18.0, 19.0),
}


# the bookkeeping columns of a finished, freshly computed run in the synthetic results files
FINISHED = {
    "status": "ok",
    "from_cache": False,
    "reason": "",
    "fedbench_version": "0.1.0",
    "created_at": "2026-01-02T03:04:05+00:00",
}


def make_rows(attacks=("idlg", "ig"), seeds=(0, 1), preset="synthetic", dataset="mnist5k"):
    """Results rows as `fedbench run` writes them, with hand-made numbers (no training)."""
    rows = []
    for label, (name, params, accs) in DEFENSES.items():
        for seed in seeds:
            for attack in attacks:
                row = {
                    "run_id": hashlib.sha256(f"{dataset}|{label}|{attack}|{seed}".encode()).hexdigest()[:16],
                    "utility_id": f"u-{dataset}-{label}-{seed}",
                    "preset": preset,
                    "dataset": dataset,
                    "model": "mlp",
                    "defense": label,
                    "attack": attack,
                    "defense_name": name,
                    "attack_name": attack,
                    "seed": seed,
                    "sc_rounds": 20,
                    "sc_clients": 10,
                    **{f"p_defense_{k}": v for k, v in params.items()},
                    "psnr": PSNR[(label, attack)][seed],
                    "ssim": PSNR[(label, attack)][seed] / 40.0,
                    "label_acc": 1.0,
                    "test_acc": accs[seed],
                    "test_loss": 0.3,
                    "epsilon": None,
                    "seconds": 1.0,
                    "utility_seconds": 2.0,
                    "attack_seconds": 0.5,
                    **FINISHED,
                }
                rows.append(row)
    return rows


def write_synthetic(path: Path, rows=None, sidecar=None) -> Path:
    from fedbench.reporting.results import write_results

    side = {"preset": "synthetic", "description": "synthetic board", "reported": [], "board": {}}
    side.update(sidecar or {})
    return write_results(rows if rows is not None else make_rows(), side, path)


@pytest.fixture
def results(tmp_path):
    return write_synthetic(tmp_path / "synthetic-20260102-030405.csv")


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("FEDBENCH_UPDATE_GOLDEN") or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{name} changed; FEDBENCH_UPDATE_GOLDEN=1 to accept"


# -------------------------------------------------------------------------------------------- golden


def test_markdown_golden(results):
    _golden("compare.md", to_markdown(pivot(load_results([results]))))


def test_latex_golden(results):
    _golden("compare.tex", to_latex(pivot(load_results([results]), metrics=["psnr", "ssim"])))


def test_csv_golden(results):
    _golden("compare.csv", to_csv(pivot(load_results([results]))))


def test_csv_and_json_hold_numbers(results):
    import json

    p = pivot(load_results([results]))
    doc = json.loads(to_json(p))
    rec = {r["defense"]: r for r in doc["records"]}
    assert rec["none"]["test_acc"] == pytest.approx(0.925)
    assert rec["none"][f"{WORST}:psnr"] == pytest.approx(32.5)  # seed 0: idlg 30, seed 1: ig 35
    assert isinstance(rec["none"][f"{WORST}:psnr_attack"], str)
    assert {c["better"] for c in doc["columns"]} == {"higher", "lower"}


# ---------------------------------------------------------------------------------------- aggregation


def test_mean_std_for_two_seeds_and_ci_for_three():
    m = METRICS["psnr"]
    two = aggregate([1.0, 3.0], m)
    assert (two.value, two.spread, two.spread_kind, two.n) == (2.0, pytest.approx(math.sqrt(2)), "std", 2)
    three = aggregate([1.0, 2.0, 3.0], m)
    assert three.spread_kind == "ci95"
    assert three.spread == pytest.approx(4.302653 * 1.0 / math.sqrt(3), rel=1e-5)
    assert aggregate([1.0, 5.0, 2.0], m, "median").value == 2.0
    assert aggregate([1.0, 5.0, 2.0], m, "worst").value == 5.0  # most leakage
    assert aggregate([0.9, 0.8], METRICS["test_acc"], "worst").value == 0.8  # lowest accuracy
    assert aggregate([float("nan")], m).value is None


def test_acc_drop_is_paired_by_seed(results):
    p = pivot(load_results([results]))
    i = [k for k, _ in p.rows].index(("dp-gaussian[clip=1,sigma=0.1]",))
    assert p.cell(i, "acc_drop").value == pytest.approx(((0.92 - 0.85) + (0.93 - 0.87)) / 2)
    assert p.cell(i, "acc_drop").n == 2


def test_epsilon_column_exists_even_when_empty(results):
    p = pivot(load_results([results]))
    assert "epsilon" in [c.key for c in p.columns]
    assert p.cell(0, "epsilon").value is None


# ---------------------------------------------------------------------------------------- worst case


def test_worst_case_over_attacks_names_the_attack(results):
    rs = load_results([results])
    wc = worst_case(rs.frame, METRICS["psnr"], ["defense"])
    got = {(k[0], s): (v, a) for k, s, v, a, *_ in wc}
    assert got[("none", 0)] == (30.0, "idlg")
    assert got[("none", 1)] == (35.0, "ig")
    # not the average of attacks: mean over seeds of the per-seed maximum
    p = pivot(rs)
    assert p.cell(0, f"{WORST}:psnr").value == pytest.approx(32.5)  # > 31 (idlg mean) and 30 (ig mean)


def test_worst_case_is_per_input_when_per_image_scores_exist(tmp_path):
    rows = make_rows(seeds=(0,))
    per_image = {}
    for r in rows:  # two images; idlg wins image 0, ig wins image 1 -> per-input worst beats both means
        hi = r["attack"] == "idlg"
        per_image[r["run_id"]] = {"psnr": [40.0, 10.0] if hi else [10.0, 30.0]}
        r["psnr"] = 25.0 if hi else 20.0
    path = write_synthetic(tmp_path / "pi.csv", rows, {"per_image": per_image})
    rs = load_results([path])
    wc = {
        k[0]: (v, a, per)
        for k, _, v, a, per, *_ in worst_case(rs.frame, METRICS["psnr"], ["defense"], rs.per_image)
    }
    assert wc["none"] == (35.0, "idlg", True)  # mean of max per image (40, 30), not max of means (25)
    row_level = {k[0]: v for k, _, v, *_ in worst_case(rs.frame, METRICS["psnr"], ["defense"])}
    assert row_level["none"] == 25.0


# ----------------------------------------------------------------------------------- files and filters


def test_dedup_by_run_id_keep_last_or_all(tmp_path):
    a = write_synthetic(tmp_path / "a.csv")
    rows = make_rows()
    for r in rows:
        r["test_acc"] += 0.01
    b = write_synthetic(tmp_path / "b.csv", rows)
    last = load_results([a, b], keep="last").frame
    assert len(last) == len(rows)
    assert last["test_acc"].max() == pytest.approx(0.94)
    both = load_results([a, b], keep="all").frame
    assert len(both) == 2 * len(rows)


def test_newest_file_in_a_folder_is_the_default(tmp_path):
    import time

    write_synthetic(tmp_path / "old.csv")
    time.sleep(0.02)
    newest = write_synthetic(tmp_path / "new.csv", make_rows(attacks=("idlg",)))
    assert load_results([], default_dir=tmp_path).paths == (newest,)


def test_where_filters_and_bad_where_fails(results):
    rs = load_results([results])
    p = pivot(rs, where=["defense=none"])
    assert [k for k, _ in p.rows] == [("none",)]
    with pytest.raises(FedbenchError, match="matches no run"):
        pivot(rs, where=["dataset=cifar10"])
    with pytest.raises(UnknownNameError, match="did you mean 'dataset'"):
        pivot(rs, where=["datset=mnist5k"])
    with pytest.raises(FedbenchError, match="column=value"):
        pivot(rs, where=["dataset"])


def test_unknown_metric_suggests(results):
    with pytest.raises(UnknownNameError, match="did you mean 'psnr'"):
        pivot(load_results([results]), metrics=["psnt"])


def test_foreign_and_empty_csv_fail(tmp_path):
    foreign = tmp_path / "foreign.csv"
    foreign.write_text("a,b\n1,2\n")
    with pytest.raises(FedbenchError, match="not a fedbench results file"):
        load_results([foreign])
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(FedbenchError, match="not a readable CSV"):
        load_results([empty])
    header = tmp_path / "header.csv"
    header.write_text("run_id,defense,status\n")
    with pytest.raises(FedbenchError, match="holds no runs"):
        load_results([header])


def test_rows_and_cols_options(results):
    p = pivot(load_results([results]), rows=["defense", "seed"], cols=["attack"], metrics=["psnr"])
    assert p.row_keys == ("defense", "seed")
    assert len(p.rows) == 6
    assert p.cell(0, "idlg:psnr").n == 1


# ----------------------------------------------------------------------------------------------- views


def test_budget_view_best_privacy_within_accuracy_drop(results):
    p = budget_view(pivot(load_results([results])), Threshold.parse("acc_drop<=2", "--budget"))
    assert [k[0] for k, _ in p.rows] == ["sparsification[fraction=0.1]", "none"]  # dp drops 6.5 pp


def test_target_view_best_utility_at_privacy_target(results):
    p = target_view(pivot(load_results([results])), Threshold.parse("psnr<=20", "--target"))
    assert [k[0] for k, _ in p.rows] == ["dp-gaussian[clip=1,sigma=0.1]"]
    p = target_view(pivot(load_results([results])), Threshold.parse("psnr<=25", "--target"))
    assert [k[0] for k, _ in p.rows] == ["sparsification[fraction=0.1]", "dp-gaussian[clip=1,sigma=0.1]"]
    with pytest.raises(FedbenchError, match="no configuration meets"):
        target_view(pivot(load_results([results])), Threshold.parse("psnr<=1", "--target"))
    with pytest.raises(FedbenchError, match="metric<=number"):
        Threshold.parse("psnr is low", "--target")


def test_reported_numbers_beside_measured(tmp_path):
    path = write_synthetic(
        tmp_path / "r.csv",
        sidecar={"reported": [{"defense": "none", "attack": "idlg", "psnr": 33.0, "test_acc": 0.95}]},
    )
    p = pivot(load_results([path]), reported=True)
    i = [k for k, _ in p.rows].index(("none",))
    cell = p.cell(i, "idlg:psnr")
    assert cell.reported == 33.0 and cell.diff == pytest.approx(31.0 - 33.0)
    assert "[paper 33.00, Δ -2.00]" in to_markdown(p)
    assert p.cell(i, "test_acc").diff == pytest.approx(0.925 - 0.95)
    with pytest.raises(FedbenchError, match="no \\[\\[reported\\]\\]"):
        pivot(load_results([write_synthetic(tmp_path / "n.csv")]), reported=True)


def test_reported_rows_with_conditions_on_row_keys(tmp_path):
    """A paper table over a scenario parameter: `sc_rounds = 20` applies only to rows showing rounds 20."""
    rows = make_rows()
    for r in rows:
        if r["seed"] == 0:
            r["sc_rounds"] = 10
    reported = [
        {"defense": "none", "attack": "idlg", "sc_rounds": 20, "psnr": 40.0},
        {"defense": "none", "attack": "idlg", "sc_rounds": 10.0, "psnr": 10.0},
    ]
    path = write_synthetic(tmp_path / "r.csv", rows=rows, sidecar={"reported": reported})
    p = pivot(load_results([path]), rows=["defense", "sc_rounds"], reported=True)
    got = {k: p.cell(i, "idlg:psnr").reported for i, (k, _) in enumerate(p.rows) if k[0] == "none"}
    assert got == {("none", "10"): 10.0, ("none", "20"): 40.0}
    # without the condition's column among the rows, a conditioned paper number matches nothing
    p = pivot(load_results([path]), rows=["defense"], reported=True)
    i = [k for k, _ in p.rows].index(("none",))
    assert p.cell(i, "idlg:psnr").reported is None


def test_utility_counts_each_training_once_across_observation_points(tmp_path):
    """Issue #16 defect 7: one training read at three observation points enters the mean and CI once.

    The rows carry one `utility_id` per observation point, as results written before the observation
    point left the utility key do, so the table must tell the distinct trainings from the columns.
    """
    accs = {"none": (0.08, 0.10, 0.15), "dp-gaussian[clip=1,sigma=0.1]": (0.11, 0.12, 0.09)}
    rows = []
    for row in make_rows(attacks=("idlg",), seeds=(0,)):
        if row["defense"] not in accs:
            continue
        for seed in (0, 1, 2):
            for point in ("example", "update", "server"):
                rows.append(
                    {
                        **row,
                        "run_id": hashlib.sha256(f"{row['defense']}|{seed}|{point}".encode()).hexdigest()[:9],
                        "utility_id": f"u-{row['defense']}-{seed}-{point}",
                        "seed": seed,
                        "sc_observe": point,
                        "psnr": 10.0 + seed + len(point),
                        "test_acc": accs[row["defense"]][seed],
                    }
                )
    frame = load_results([write_synthetic(tmp_path / "observed-20260102-030405.csv", rows)])
    p = pivot(frame, metrics=["psnr"], rows=["defense"], cols=["sc_observe"])
    labels = [k[0] for k, _ in p.rows]
    for label, values in accs.items():
        i = labels.index(label)
        distinct = aggregate(values, METRICS["test_acc"])
        cell = p.cell(i, "test_acc")
        assert cell.n == 3 and cell.spread_kind == "ci95"
        assert cell.value == pytest.approx(distinct.value) and cell.spread == pytest.approx(distinct.spread)
        drop = p.cell(i, "acc_drop")  # paired with `none` of the same seed, whichever point it was read at
        assert drop.n == 3 and drop.value == pytest.approx(
            sum(a - b for a, b in zip(accs["none"], values, strict=True)) / 3
        )
    # the leakage cells are distinct runs: one per seed in each observation point's column
    assert {p.cell(0, c.key).n for c in p.columns if c.metric.name == "psnr"} == {3}


# ---------------------------------------------------------------------------------- attack families


def membership_rows(attacks=("mia-loss",)) -> list[dict]:
    """Rows of membership attacks (mia_* columns, no reconstruction metric), numbers from make_rows."""
    rows = []
    for row in make_rows(attacks=("idlg",)):
        base = {k: v for k, v in row.items() if k not in ("psnr", "ssim", "label_acc")}
        for i, attack in enumerate(attacks):
            auc = 0.5 + row["psnr"] / 100 - i / 50
            rows.append(
                {
                    **base,
                    "run_id": f"{row['run_id']}-{attack}",
                    "attack": attack,
                    "attack_name": attack,
                    "mia_auc": auc,
                    "mia_acc": auc - 0.05,
                    "mia_base_rate": 0.5,
                }
            )
    return rows


def _leak_keys(p) -> list[str]:
    return [c.key for c in p.columns if c.metric.per_attack]


def test_membership_results_show_their_family_by_default(tmp_path):
    from fedbench.reporting.leaderboard import tradeoff_points

    rs = load_results([write_synthetic(tmp_path / "mia.csv", membership_rows())])
    p = pivot(rs)
    assert _leak_keys(p) == ["mia-loss:mia_auc", "mia-loss:mia_acc"]
    assert [c.header for c in p.columns][-2:] == ["mia-loss mia_auc ↓", "mia-loss mia_acc (%) ↓"]
    _points, _ulabel, llabel = tradeoff_points(pivot(rs, rows=["defense"]))
    assert llabel == "mia_auc ↓ (attack mia-loss; lower = less leakage)"
    two = load_results([write_synthetic(tmp_path / "mia2.csv", membership_rows(("mia-loss", "mia-direct")))])
    # several attacks of the family: its headline per attack and the worst case over them
    assert _leak_keys(pivot(two)) == ["mia-loss:mia_auc", "mia-direct:mia_auc", f"{WORST}:mia_auc"]


def test_mixed_families_each_cover_their_own_attacks(tmp_path):
    from fedbench.reporting.leaderboard import tradeoff_points

    rows = make_rows() + membership_rows()
    p = pivot(load_results([write_synthetic(tmp_path / "mixed.csv", rows)]))
    assert _leak_keys(p) == [
        "idlg:psnr",
        "ig:psnr",
        f"{WORST}:psnr",  # over the reconstruction attacks only
        "mia-loss:mia_auc",
        "mia-loss:mia_acc",
    ]
    explicit = pivot(load_results([write_synthetic(tmp_path / "m2.csv", rows)]), metrics=["ssim", "mia_acc"])
    assert _leak_keys(explicit) == ["idlg:ssim", "ig:ssim", f"{WORST}:ssim", "mia-loss:mia_acc"]
    _points, _ulabel, llabel = tradeoff_points(p)  # the first family's headline
    assert llabel.startswith("psnr ↓ (worst case over the attack suite")


def test_every_direction_comes_from_the_catalogue():
    from fedbench.metrics.catalogue import attack_families
    from fedbench.metrics.reconstruction import LEAKAGE_DIRECTION

    for name, sign in LEAKAGE_DIRECTION.items():
        assert METRICS[name].leakage_sign == sign
    assert [f.name for f in attack_families()][:3] == ["reconstruction", "membership", "attribute"]
    for fam in attack_families():
        assert all(METRICS[n].family == fam.name and METRICS[n].per_attack for n in fam.metrics)
    assert not METRICS["test_acc"].per_attack and METRICS["attack_seconds"].per_attack
