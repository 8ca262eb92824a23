"""Leaderboards: Pareto ranking, entries (schema, numbers), rendering, the stale check, committed boards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_tables import make_rows, write_synthetic

from fedbench.errors import FedbenchError
from fedbench.reporting import board_schema, board_stats, ranking
from fedbench.reporting import leaderboard as lb
from fedbench.reporting.tables import load_results

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------- Pareto


def test_pareto_rank_with_ties_and_dominated_points():
    #            a     b     c (tie a) d (dominated by a)  e (dominated by d)  f (trade-off vs a)
    utility = [0.90, 0.80, 0.90, 0.85, 0.70, 0.95]
    leakage = [20.0, 10.0, 20.0, 25.0, 30.0, 28.0]
    assert ranking.pareto_rank(utility, leakage) == [1, 1, 1, 2, 3, 1]
    order = ranking.ranked_order(utility, leakage, list("abcdef"))
    assert order == [5, 0, 2, 1, 3, 4]  # rank 1 by utility (a and c tied: by label), then d, e


def test_pareto_rank_equal_utility_less_leakage_dominates():
    assert ranking.pareto_rank([0.9, 0.9], [10.0, 12.0]) == [1, 2]
    assert ranking.pareto_rank([0.9, 0.8], [10.0, 10.0]) == [1, 2]


def test_pareto_rank_missing_leakage_counts_as_worst():
    assert ranking.pareto_rank([0.9, 0.8, 0.7], [None, 10.0, float("nan")]) == [1, 1, 2]
    assert ranking.pareto_rank([0.9, 0.8], [None, None]) == [1, 2]  # utility alone


# ----------------------------------------------------------------------------------------- entries


def test_entries_hold_numbers_seeds_run_ids_and_provenance(board_root):
    board, entries = lb.load_board(board_root / "synthetic")
    assert board.attack_suite == ("idlg", "ig") and board.headline == "psnr"
    by = {e["defense"]: e for e in entries}
    assert set(by) == {"none", "dp-gaussian[clip=1,sigma=0.1]", "sparsification[fraction=0.1]"}
    e = by["dp-gaussian[clip=1,sigma=0.1]"]
    assert e["params"] == {"clip": 1.0, "sigma": 0.1}
    assert e["seeds"] == [0, 1] and len(e["run_ids"]) == 4
    assert e["metrics"]["test_acc"]["mean"] == pytest.approx(0.86)
    assert e["metrics"]["worst_case"]["psnr"] == {
        "mean": 14.5,
        "spread": pytest.approx(0.707107),
        "spread_kind": "std",
        "n": 2,
        "attack": "ig",
        "per_input": False,  # no per-image scores in this results file
        "selection": "per-seed max",
        "per_seed": [15.0, 14.0],  # seeds 0 and 1: what rank stability and intervals are recomputed from
    }
    assert e["metrics"]["epsilon"] is None
    assert e["fedbench_version"] == "0.1.0" and e["date"] == "2026-01-02"


def test_rendered_rows_are_in_pareto_order(board_root):
    text = (board_root / "synthetic" / lb.CSV_FILE).read_text()
    lines = text.splitlines()
    assert lines[0].startswith("rank,defense,")
    assert [line.split(",")[0] for line in lines[1:]] == ["1", "1", "1"]
    assert lines[1].split(",")[1] == "none"  # rank ties broken by utility
    readme = (board_root / "synthetic" / lb.README_FILE).read_text()
    assert "fedbench run synthetic" in readme and "| rank" in readme
    index = (board_root / lb.README_FILE).read_text()
    assert "| [synthetic] " in index and "\n[synthetic]: synthetic/README.md\n" in index


def _without_rank_stability(folder: Path) -> None:
    """Make a board like the committed ones, exported before entries carried rank stability."""
    for path in (folder / lb.ENTRIES_DIR).glob("*.json"):
        entry = json.loads(path.read_text())
        entry.pop("rank_stability")
        path.write_text(json.dumps(entry))


@pytest.mark.parametrize("stability", [True, False])
def test_check_passes_then_fails_on_an_edited_entry(board_root, stability):
    if not stability:
        _without_rank_stability(board_root / "synthetic")
        lb.render(board_root)
    assert lb.stale(board_root) == []
    path = board_root / "synthetic" / lb.ENTRIES_DIR / "none.json"
    entry = json.loads(path.read_text())
    entry["metrics"]["test_acc"]["mean"] = 0.5  # moves none to rank 2: its rank stability is out of date
    path.write_text(json.dumps(entry))
    stale = lb.stale(board_root)
    assert board_root / "synthetic" / lb.CSV_FILE in stale
    assert board_root / "synthetic" / lb.README_FILE in stale
    lb.render(board_root)
    assert lb.stale(board_root) == []


def test_check_fails_on_a_hand_edited_rendered_file(board_root):
    readme = board_root / "synthetic" / lb.README_FILE
    readme.write_text(readme.read_text().replace("none", "nothing", 1))
    assert lb.stale(board_root) == [readme]


def test_entry_with_a_string_metric_is_rejected(board_root):
    path = board_root / "synthetic" / lb.ENTRIES_DIR / "none.json"
    entry = json.loads(path.read_text())
    entry["metrics"]["test_acc"]["mean"] = "92.5%"
    path.write_text(json.dumps(entry))
    with pytest.raises(FedbenchError, match="test_acc.mean must be a number"):
        lb.stale(board_root)


def test_entry_from_another_scenario_is_rejected(board_root):
    path = board_root / "synthetic" / lb.ENTRIES_DIR / "none.json"
    entry = json.loads(path.read_text())
    entry["scenario"]["sc_rounds"] = 5
    path.write_text(json.dumps(entry))
    with pytest.raises(FedbenchError, match="scenario differs"):
        lb.load_board(board_root / "synthetic")


def test_build_needs_one_scenario_and_the_none_baseline(tmp_path):
    rows = make_rows() + make_rows(dataset="digits")
    path = write_synthetic(tmp_path / "two.csv", rows)
    with pytest.raises(FedbenchError, match="vary in dataset"):
        lb.build(load_results([path]))
    board, _ = lb.build(load_results([path]), where=["dataset=digits"])
    assert board.scenario["dataset"] == "digits"
    no_base = [r for r in make_rows() if r["defense"] != "none"]
    with pytest.raises(FedbenchError, match="'none' baseline"):
        lb.build(load_results([write_synthetic(tmp_path / "nb.csv", no_base)]))


def test_committed_leaderboards_are_up_to_date():
    """CI runs this (make test): the committed boards' rendered files match their entries."""
    root = ROOT / "leaderboards"
    if not lb.board_names(root):
        pytest.skip("no committed boards")
    assert lb.stale(root) == [], "run 'fedbench leaderboard render' and commit the result"


def test_board_views_from_the_preset_board_table(tmp_path):
    board_spec = {"name": "v", "budget": "acc_drop<=2", "target": "psnr<=15", "headline": "psnr"}
    path = write_synthetic(tmp_path / "v.csv", sidecar={"board": board_spec})
    board, entries = lb.build(load_results([path]))
    assert board.name == "v" and board.views == ("budget:acc_drop<=2", "target:psnr<=15")
    readme = lb.render_readme(board, entries)
    assert "- best privacy at acc_drop <= 2: `sparsification[fraction=0.1]`" in readme
    assert "- best utility at psnr <= 15: `dp-gaussian[clip=1,sigma=0.1]`" in readme
    bad = write_synthetic(tmp_path / "b.csv", sidecar={"board": {"budget": "acc_drop"}})
    with pytest.raises(FedbenchError, match="metric<=number"):
        lb.build(load_results([bad]))


def test_worst_case_per_input_is_recorded_in_entries(tmp_path):
    rows = make_rows(seeds=(0,))
    per_image = {r["run_id"]: {"psnr": [r["psnr"] + 1.0, r["psnr"] - 1.0]} for r in rows}
    path = write_synthetic(tmp_path / "pi.csv", rows, {"per_image": per_image})
    board, entries = lb.build(load_results([path]))
    stat = {e["defense"]: e for e in entries}["none"]["metrics"]["worst_case"]["psnr"]
    assert stat["per_input"] is True and stat["mean"] == 30.0  # max(31, 26) and max(29, 24), averaged
    assert "taken per input image" in lb.render_readme(board, entries)


# ------------------------------------------------------------------------------------------ schema


_DELETE = object()


def _set(doc, path, value):
    *parents, key = path
    for p in parents:
        doc = doc[p]
    if value is _DELETE:
        del doc[key]
    else:
        doc[key] = value


@pytest.mark.parametrize(
    "file,path,value,match",
    [
        ("entry", ("metrcis",), {}, r"has unknown key 'metrcis'; did you mean 'metrics'\?"),
        ("entry", ("schema",), 4, r"none.json: schema 4 is not one of 1, 2, 3; re-export the board"),
        ("entry", ("metrics", "test_acc"), _DELETE, r"none.json: metrics: missing key 'test_acc'"),
        ("entry", ("metrics", "test_acc", "n"), True, r"metrics.test_acc.n must be an integer, got True"),
        ("entry", ("metrics", "test_acc", "n"), 0, r"metrics.test_acc.n must be >= 1, got 0"),
        ("entry", ("metrics", "test_acc", "mean"), float("nan"), "test_acc.mean must be a finite number"),
        ("entry", ("metrics", "acc_drop", "sprad"), 1.0, r"acc_drop has unknown key 'sprad'; did you"),
        ("entry", ("metrics", "worst_case", "psnrr"), None, r"worst_case.psnrr: unknown metric 'psnrr'; did"),
        ("entry", ("metrics", "leakage", "ig"), None, r"metrics.leakage.ig must be an object, got None"),
        ("entry", ("seeds",), [0, "1"], r"seeds\[1\] must be an integer, got '1'"),
        ("board", ("titel",), "x", r"board.json: has unknown key 'titel'; did you mean 'title'\?"),
        (
            "board",
            ("headline",),
            "psnrr",
            r"board.json: headline: unknown metric 'psnrr'; did you mean 'psnr'",
        ),
        ("board", ("views",), ["budgt:acc_drop<=2"], r"views\[0\]: view 'budgt:acc_drop<=2' must start with"),
        ("board", ("views",), ["budget:acc_drop"], r"views\[0\]: budget 'acc_drop': write metric<=number"),
        ("board", ("attack_suite",), "ig", r"board.json: attack_suite must be a list, got 'ig'"),
    ],
)
def test_schema_errors_name_the_file_and_the_key_in_one_line(board_root, file, path, value, match):
    """board.json and entries are checked against `board_schema` (pydantic): a typo or a wrong type is
    a one-line FedbenchError naming the file and the key, with a did-you-mean for unknown names."""
    folder = board_root / "synthetic"
    target = folder / (lb.BOARD_FILE if file == "board" else f"{lb.ENTRIES_DIR}/none.json")
    doc = json.loads(target.read_text())
    _set(doc, path, value)
    target.write_text(json.dumps(doc))
    with pytest.raises(FedbenchError, match=match) as info:
        lb.load_board(folder)
    assert str(target) in str(info.value) and "\n" not in str(info.value)


def test_board_round_trips_through_its_schema(board_root):
    board, _ = lb.load_board(board_root / "synthetic")
    text = (board_root / "synthetic" / lb.BOARD_FILE).read_text()
    assert json.loads(text) == board.to_json() and board.to_json()["schema"] == board_schema.SCHEMA_VERSION


def test_readme_templates_ship_with_the_package():
    """The README templates are package data (pyproject), loaded through the package, not a path."""
    import tomllib
    from fnmatch import fnmatch

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    templates = sorted((ROOT / "fedbench" / "reporting" / "templates").iterdir())
    assert {t.name for t in templates} >= {"board_readme.md.j2", "index.md.j2"}
    for template in templates:
        assert any(fnmatch(template.name, g) for g in globs["fedbench.reporting.templates"])


def test_export_targets_are_the_librarys_table_formats():
    from typing import get_args

    from fedbench.cli.export_cmd import SUFFIX, ExportTarget
    from fedbench.reporting.tables import FORMATS

    assert set(get_args(ExportTarget)) - {"leaderboard"} == set(SUFFIX) <= set(FORMATS)


# ------------------------------------------------------------------------------------ rank stability


def test_batch_pareto_ranks_equal_pareto_rank_per_sample():
    """The vectorised ranks of the bootstrap are `pareto_rank`'s, ties and missing values included."""
    import numpy as np

    rng = np.random.default_rng(7)
    util = rng.integers(0, 4, size=(300, 7)).astype(float)  # few levels: many ties and equal points
    leak = rng.integers(0, 4, size=(300, 7)).astype(float)
    util[rng.random(util.shape) < 0.1] = np.nan
    leak[rng.random(leak.shape) < 0.1] = np.nan
    batch = ranking.pareto_ranks_batch(util, leak)
    for s in range(len(util)):
        assert batch[s].tolist() == ranking.pareto_rank(util[s].tolist(), leak[s].tolist()), s


def test_rank_stability_matches_the_exact_bootstrap_probability():
    """Two configurations tied in the means: A's seeds give accuracy 0.9 and 0.7, B's 0.8 twice, equal
    leakage. A resample of A's two seeds has mean 0.9 (p 1/4: A alone on the front), 0.7 (1/4: B alone)
    or 0.8 (1/2: both rank 1), so each keeps its reported rank 1 with probability 3/4."""
    per_seed = [([0.9, 0.7], [10.0, 10.0]), ([0.8, 0.8], [10.0, 10.0])]
    a, b = ranking.rank_stability(per_seed, [1, 1])
    assert a["same_rank"] == pytest.approx(0.75, abs=0.04) and b["same_rank"] == pytest.approx(0.75, abs=0.04)
    assert a["interval"] == [1, 2] and b["interval"] == [1, 2]
    assert a["resamples"] == ranking.STABILITY_RESAMPLES and a["rng_seed"] == ranking.STABILITY_SEED
    assert ranking.rank_stability(per_seed, [1, 1]) == [a, b]  # a fixed RNG seed: reproducible
    assert ranking.rank_stability(per_seed, [1, 1], seed=1) != [a, b]


def test_rank_stability_of_separated_and_single_seed_configurations():
    far = [([0.9, 0.91, 0.9], [5.0, 5.1, 5.0]), ([0.5, 0.52, 0.51], [20.0, 21.0, 19.0])]
    assert [(s["same_rank"], s["interval"]) for s in ranking.rank_stability(far, [1, 2])] == [
        (1.0, [1, 1]),
        (1.0, [2, 2]),
    ]
    # a reported rank the bootstrap never gives has share 0 (the interval says where the rank lies)
    assert ranking.rank_stability(far, [2, 1])[0]["same_rank"] == 0.0
    one = ranking.rank_stability([([0.9], [5.0]), ([0.8], [float("nan")])], [1, 2])
    assert [s["same_rank"] for s in one] == [1.0, 1.0]  # nothing to resample; missing leakage = worst
    with pytest.raises(ValueError, match="one utility and one leakage value per seed"):
        ranking.rank_stability([([0.9, 0.8], [5.0])], [1])


def test_rank_stability_resamples_seeds_jointly():
    """A seed's utility and leakage stay together: A trades accuracy for leakage seed by seed along B's
    front, so no resample of A's seeds dominates B or is dominated by it; drawn independently, half
    the resamples would pair A's high accuracy with its low leakage and push B to rank 2."""
    per_seed = [([0.9, 0.7], [20.0, 10.0]), ([0.8, 0.8], [15.0, 15.0])]
    assert [s["same_rank"] for s in ranking.rank_stability(per_seed, [1, 1])] == [1.0, 1.0]


def test_entries_carry_rank_stability_and_the_readme_states_it(board_root):
    board, entries = lb.load_board(board_root / "synthetic")
    stable = {e["defense"]: e["rank_stability"] for e in entries}
    assert set(stable) == {e["defense"] for e in entries}
    shown = {e["defense"]: rank for rank, e in ranking.ranked(board, entries)}
    assert all(s["rank"] == shown[d] for d, s in stable.items())
    readme = (board_root / "synthetic" / lb.README_FILE).read_text()
    assert "| rank   | rank stability   | defense" in readme
    assert "Rank stability: 3 of 3 configurations keep their rank" in readme
    assert "resamples that give a configuration the rank shown" in readme
    header = (board_root / "synthetic" / lb.CSV_FILE).read_text().splitlines()[0]
    assert header.startswith("rank,defense,defense_name,rank_same,rank_low,rank_high,test_acc,")
    compact = lb.board_pivot(board, entries, compact=True)
    assert compact.extra[ranking.STABILITY_COLUMN] == ("100% [1]",) * 3


def test_per_seed_values_are_those_the_board_averages(tmp_path):
    """The bootstrap resamples the values behind the entries' means: the worst case per input image
    (several attacks), or the one attack's value (a one-attack suite); accuracy once per training."""
    import numpy as np

    rows = make_rows(seeds=(0, 1))
    per_image = {r["run_id"]: {"psnr": [r["psnr"] + 1.0, r["psnr"] - 3.0]} for r in rows}
    for attacks, sidecar in (
        (("idlg", "ig"), {"per_image": per_image}),
        (("ig",), {}),
    ):
        kept = [r for r in rows if r["attack"] in attacks]
        rs = load_results([write_synthetic(tmp_path / f"{len(attacks)}.csv", kept, sidecar)])
        board, entries = lb.build(rs)
        for e in entries:
            util, leak, _inputs = board_stats.headline_per_seed(e, "psnr")
            assert len(util) == len(leak) == 2
            assert float(np.mean(util)) == pytest.approx(e["metrics"]["test_acc"]["mean"])
            assert float(np.mean(leak)) == pytest.approx(e["metrics"]["worst_case"]["psnr"]["mean"])


def test_committed_boards_render_rank_stability_only_when_built_with_it():
    """Entries exported before rank stability validate and render without it; a board built since
    (`fedbench leaderboard build`) states it for every entry."""
    root = ROOT / "leaderboards"
    for name in lb.board_names(root):
        board, entries = lb.load_board(root / name)
        if board.board_version >= 2:  # v2: computed at render time, never stored in an entry
            assert not any("rank_stability" in e for e in entries), name
            assert "rank stability" in lb.render_readme(board, entries), name
            continue
        built = [("rank_stability" in e) for e in entries]
        assert all(built) or not any(built), name
        readme, csv = lb.render_readme(board, entries).lower(), lb.render_csv(board, entries)
        assert ("rank stability" in readme) == all(built), name
        assert ("rank_same" in csv) == all(built), name


def _edit_entry(folder: Path, defense: str, edit) -> None:
    path = folder / lb.ENTRIES_DIR / f"{lb.slug(defense)}.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["rank_stability"].update(rank=2),  # an entry edited by hand since the build
        lambda d: d.pop("rank_stability"),  # an entry added by hand
        lambda d: d["rank_stability"].update(rng_seed=5),  # entries from two bootstraps
    ],
)
def test_out_of_date_rank_stability_renders_as_such(board_root, edit):
    """Rank stability is one bootstrap over the whole board: after a hand edit that breaks it, the
    board renders "—" and says so (and `check` flags the README until it is rendered again)."""
    folder = board_root / "synthetic"
    _edit_entry(folder, "none", edit)
    board, entries = lb.load_board(folder)
    assert ranking.stability_state(board, entries) is False
    assert set(lb.board_pivot(board, entries).extra[ranking.STABILITY_COLUMN]) == {"—"}
    readme = lb.render_readme(board, entries)
    assert "Rank stability: out of date" in readme and "bootstrap resamples" not in readme
    assert ",none,none,,,," in lb.render_csv(board, entries)  # rank_same, rank_low, rank_high empty
    assert folder / lb.README_FILE in lb.stale(board_root)
    lb.render(board_root)
    assert lb.stale(board_root) == []


@pytest.mark.parametrize(
    "edit,match",
    [
        (
            lambda d: d["rank_stability"].update(same_rank=1.5),
            r"same_rank: 1.5 must be a share between 0 and",
        ),
        (lambda d: d["rank_stability"].update(interval=[3, 1]), r"interval \[3, 1\] must be \[low, high\]"),
        (lambda d: d["rank_stability"].update(interval=[1]), r"must be \[low, high\]"),
        (lambda d: d["rank_stability"].update(ranks=1), r"has unknown key 'ranks'; did you mean 'rank'"),
        (lambda d: d["rank_stability"].update(resamples=0), r"rank_stability.resamples must be >= 1"),
    ],
)
def test_malformed_rank_stability_is_rejected(board_root, edit, match):
    folder = board_root / "synthetic"
    _edit_entry(folder, "none", edit)
    with pytest.raises(FedbenchError, match=match) as info:
        lb.load_board(folder)
    assert "\n" not in str(info.value) and "none.json" in str(info.value)
