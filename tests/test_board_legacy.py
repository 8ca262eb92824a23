"""Schema-1 board entries brought inside their metrics' ranges without their runs (`board_legacy`,
`fedbench leaderboard restat`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from scipy.stats import binomtest
from typer.testing import CliRunner

from fedbench.cli import app
from fedbench.reporting.board_legacy import bound_stat, inputs_per_seed

GOLDEN_BOARDS = Path(__file__).resolve().parent / "golden" / "boards"  # boards kept as fixtures


def test_a_rate_of_known_inputs_gets_the_exact_binomial_interval_of_its_counts():
    """Label accuracy 100 % over 3 seeds of 2 attacked images: 6 of 6, Clopper-Pearson [0.54, 1], where
    mean ± t gave "100.0 ± 0.0"."""
    stat = {"mean": 1.0, "spread": 0.0, "spread_kind": "ci95", "n": 3}
    out = bound_stat(stat, "label_acc", 2)
    ci = binomtest(6, 6).proportion_ci(0.95, method="exact")
    assert (out["k"], out["inputs"], out["spread_kind"]) == (6, 6, "cp95")
    assert out["low"] == pytest.approx(ci.low, rel=1e-5) and out["high"] == 1.0
    one = bound_stat({"mean": 0.166667, "spread": 0.717, "spread_kind": "ci95", "n": 3}, "label_acc", 2)
    ci = binomtest(1, 6).proportion_ci(0.95, method="exact")
    assert one["k"] == 1 and (one["low"], one["high"]) == pytest.approx((ci.low, ci.high), rel=1e-5)


def test_a_rate_whose_counts_do_not_fit_is_clipped_not_guessed():
    """0.3 is not k / 6 for a whole k: the stated inputs are not the rate's, so no count is invented;
    the t interval is clipped to [0, 1] instead."""
    out = bound_stat({"mean": 0.3, "spread": 0.5, "spread_kind": "ci95", "n": 3}, "label_acc", 2)
    assert "k" not in out and (out["low"], out["high"]) == (0.0, 0.8)


def test_bounded_means_are_clipped_and_two_seed_spreads_left_alone():
    acc = bound_stat({"mean": 0.106, "spread": 0.155, "spread_kind": "ci95", "n": 3}, "test_acc", None)
    assert acc["low"] == 0.0 and acc["high"] == pytest.approx(0.261)
    std = {"mean": 0.9, "spread": 0.2, "spread_kind": "std", "n": 2}
    assert bound_stat(std, "test_acc", None) == std
    done = {"mean": 0.5, "low": 0.2, "high": 0.8, "n": 3}
    assert bound_stat(done, "label_acc", 2) is done


def test_inputs_per_seed_from_a_boards_scenario():
    assert inputs_per_seed({"sc_victim": [0, 1, 2], "sc_batch_size": 1}, "reconstruction") == 3
    assert inputs_per_seed({"sc_victim": 0, "sc_batch_size": 64}, "reconstruction") == 64
    assert inputs_per_seed({"sc_victim": 0, "sc_batch_size": 0}, "reconstruction") is None
    assert inputs_per_seed({"sc_clients": 400, "sc_participation": 0.25}, "attribute") == 100
    assert inputs_per_seed({}, "membership") is None


def test_restat_command_on_a_schema_1_board(tmp_path):
    """An old-style copy of a board (the version 1 leakage-types board's entries without their
    intervals): --check exits 1 and writes nothing; restat bounds every rate; then check and --check
    pass."""
    board = "leakage-types-mnist5k-mlp"  # retired from leaderboards/, kept as this fixture
    root = tmp_path / "boards"
    shutil.copytree(GOLDEN_BOARDS / board, root / board)
    for path in (root / board / "entries").glob("*.json"):  # back to schema 1: mean ± spread only
        entry = json.loads(path.read_text())

        def strip(stat):
            if not stat:
                return stat
            if stat.get("spread_kind") == "cp95":
                stat = {**stat, "spread_kind": "ci95", "spread": 0.0}
            return {k: v for k, v in stat.items() if k not in ("low", "high", "k", "inputs")}

        m = entry["metrics"]
        m["leakage"] = {a: {n: strip(s) for n, s in st.items()} for a, st in m["leakage"].items()}
        m["worst_case"] = {n: strip(s) for n, s in m["worst_case"].items()}
        path.write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
    runner = CliRunner()
    assert runner.invoke(app, ["leaderboard", "render", "--dir", str(root)]).exit_code == 0
    before = {p.name: p.read_text() for p in (root / board / "entries").glob("*.json")}
    res = runner.invoke(app, ["leaderboard", "restat", "--dir", str(root), "--check"])
    assert res.exit_code == 1 and "restat" in res.output
    assert before == {p.name: p.read_text() for p in (root / board / "entries").glob("*.json")}
    res = runner.invoke(app, ["leaderboard", "restat", "--dir", str(root)])
    assert res.exit_code == 0, res.output
    none = json.loads((root / board / "entries" / "none.json").read_text())
    label_acc = none["metrics"]["worst_case"]["label_acc"]
    assert (label_acc["k"], label_acc["inputs"]) == (4, 4)  # 4 attacked inputs, every label right
    assert label_acc["low"] == pytest.approx(0.025 ** (1 / 4), abs=1e-6)  # Clopper-Pearson at 4/4
    assert runner.invoke(app, ["leaderboard", "check", "--dir", str(root)]).exit_code == 0
    res = runner.invoke(app, ["leaderboard", "restat", "--dir", str(root), "--check"])
    assert res.exit_code == 0 and "current" in res.output
