"""`fedbench leaderboard epsilon`: a fixed accountant reaches committed boards from their entries, and
every committed entry states today's accountant's epsilon for the mechanism as simulated."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedbench.cli import app
from fedbench.reporting.board_epsilon import NotRefreshable, refresh_epsilon

ROOT = Path(__file__).resolve().parent.parent / "leaderboards"
ENTRY = "fed-cdp_clip_4_per_example_materialise_sigma_6.json"
BOARD = "leakage-example-mnist5k-mlp"  # its fed-cdp rows are sigma-based (not calibrated), refreshable


def _entries(root: Path, board: str) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted((root / board / "entries").glob("*.json"))}


def _aged(tmp_path: Path) -> Path:
    """A copy of the leakage-example board whose fed-cdp sigma=6 entry states the paper model's 13.6
    (what the FedAvg board published before the accountant was fixed)."""
    root = tmp_path / "boards"
    shutil.copytree(ROOT / BOARD, root / BOARD)
    res = CliRunner().invoke(app, ["leaderboard", "epsilon", BOARD, "--dir", str(root)])  # today's first
    assert res.exit_code == 0, res.output
    path = root / BOARD / "entries" / ENTRY
    entry = json.loads(path.read_text())
    entry["metrics"]["epsilon"] = 13.6047
    entry["params"]["sampling"] = "poisson"
    path.write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
    return root


def test_epsilon_command_refreshes_an_aged_entry_and_nothing_else(tmp_path):
    root = _aged(tmp_path)
    before = _entries(root, BOARD)
    runner = CliRunner()
    res = runner.invoke(app, ["leaderboard", "epsilon", BOARD, "--dir", str(root), "--check"])
    assert res.exit_code == 1 and "13.6047 ->" in res.output
    assert _entries(root, BOARD) == before  # --check writes nothing
    res = runner.invoke(app, ["leaderboard", "epsilon", BOARD, "--dir", str(root)])
    assert res.exit_code == 0, res.output
    after = _entries(root, BOARD)
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {ENTRY}
    entry = after[ENTRY]
    # 10 clients of 100 records, all per round, 100 rounds of 3 B = 1 steps, MLP 256 (4 tensors): the
    # committed (today's) epsilon again
    committed = _entries(ROOT, BOARD)[ENTRY]["metrics"]["epsilon"]
    assert entry["metrics"]["epsilon"] == pytest.approx(committed, rel=1e-6) and 3 < committed < 4
    assert entry["params"]["sampling"] == "participation"
    assert "M=4 tensors" in entry["metrics"]["accountant"]
    assert entry["run_ids"] == before[ENTRY]["run_ids"]  # the same runs
    res = runner.invoke(app, ["leaderboard", "check", BOARD, "--dir", str(root)])
    assert res.exit_code == 0, res.output  # re-rendered
    res = runner.invoke(app, ["leaderboard", "epsilon", BOARD, "--dir", str(root), "--check"])
    assert res.exit_code == 0 and "today's accountant" in res.output


def test_epsilon_command_names_an_unknown_board(tmp_path):
    res = CliRunner().invoke(app, ["leaderboard", "epsilon", "no-such-board", "--dir", str(ROOT)])
    assert res.exit_code == 2 and "no-such-board" in res.output


def test_a_calibrated_defense_is_not_refreshed_from_its_entry():
    entries = _entries(ROOT, "membership-mnist5k-mlp").values()
    entry = next(e for e in entries if e["defense_name"] == "dp-sgd")
    with pytest.raises(NotRefreshable, match="rebuild"):
        refresh_epsilon(entry)


def test_every_committed_entry_states_todays_epsilon():
    """Issue 26: the published epsilon is the simulated mechanism's, for every board and DP entry."""
    checked = 0
    for board in sorted(p.name for p in ROOT.iterdir() if (p / "board.json").is_file()):
        for name, entry in _entries(ROOT, board).items():
            try:
                fresh = refresh_epsilon(entry)
            except NotRefreshable:
                continue
            if entry["metrics"].get("epsilon") is None and not entry["metrics"].get("epsilon_infinite"):
                continue
            checked += 1
            eps, want = entry["metrics"]["epsilon"], fresh["metrics"]["epsilon"]
            assert eps == want or (eps is not None and math.isclose(eps, want, rel_tol=1e-9)), (board, name)
            assert entry["metrics"]["accountant"] == fresh["metrics"]["accountant"], (board, name)
    assert checked >= 30
