"""The realistic-protocol column of an inversion board (issue 30): rates with exact intervals per attack
and checkpoint beside the textbook row, the verdict rule, the board file and README, `leaderboard build`
and `leaderboard realistic` end to end on a tiny board, and the negative paths."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest
from typer.testing import CliRunner

from fedbench.cli import app
from fedbench.errors import FedbenchError
from fedbench.reporting import board_realistic as br
from fedbench.reporting.board_schema import Board

runner = CliRunner()


def _results(rows: list[tuple[str, int, int, list[float], list[float]]], acc: float = 0.8):
    """A ResultSet stand-in: (attack, round, seed, reid per input, floor per input) per run."""
    frame = pd.DataFrame(
        [
            {
                "run_id": f"r{i}",
                "status": "ok",
                "defense": "none",
                "attack": attack,
                "sc_observe_round": rnd,
                "sc_rounds": 10,
                "seed": seed,
                "test_acc": acc,
                "dataset": "mnist5k",
                "model": "mlp",
                "sc_clients": 4,
            }
            for i, (attack, rnd, seed, _, _) in enumerate(rows)
        ]
    )
    per_image = {f"r{i}": {"reid": v, "reid_floor": f} for i, (_, _, _, v, f) in enumerate(rows)}
    return SimpleNamespace(frame=frame, per_image=per_image)


NONE_ENTRY = {
    "defense": "none",
    "per_input": {
        "dlg[iterations=50]": {
            "0": {"values": {"reid": [1.0] * 10}},
            "1": {"values": {"reid": [1.0] * 9 + [0.0]}},
        }
    },
    "metrics": {"worst_case": {"reid": {"k": 20, "inputs": 20}}},
}


def test_rates_per_attack_and_checkpoint_with_exact_intervals_and_the_worst_case_per_record():
    floor = [0.0, 0.0, 1.0, 0.0]
    res = _results(
        [
            ("dlg", 0, 0, [1, 0, 0, 0], floor),
            ("dlg", 0, 1, [1, 1, 0, 0], floor),
            ("dlg", 9, 0, [0, 0, 0, 0], floor),
            ("dlg", 9, 1, [0, 0, 0, 0], floor),
            ("fc-leakage", 0, 0, [0, 1, 0, 0], floor),
            ("fc-leakage", 0, 1, [0, 0, 0, 1], floor),
            ("fc-leakage", 9, 0, [0, 0, 0, 0], floor),
            ("fc-leakage", 9, 1, [0, 0, 0, 0], floor),
        ]
    )
    rec = br.realistic_record(res, "reid", NONE_ENTRY, "p", "cmd", "a tiny federation")
    assert rec["rounds"] == [0, 9] and rec["checkpoints"] == ["untrained", "converged"]
    dlg, fc = rec["attacks"]
    assert dlg["textbook_label"] == "dlg[iterations=50]" and (dlg["textbook"]["k"], dlg["textbook"]["n"]) == (
        19,
        20,
    )
    assert fc["textbook"] is None  # the board's none row has no fc-leakage
    assert [(c["k"], c["n"]) for c in dlg["checkpoints"]] == [(3, 8), (0, 8)]
    lo, hi = br.clopper_pearson(3, 8)
    assert dlg["checkpoints"][0]["low"] == pytest.approx(lo, abs=1e-6) and dlg["checkpoints"][0][
        "high"
    ] == pytest.approx(hi, abs=1e-6)
    # per record, the best any attack did: seed 0 [1,1,0,0], seed 1 [1,1,0,1]
    assert [(c["k"], c["n"]) for c in rec["worst"]["checkpoints"]] == [(5, 8), (0, 8)]
    assert rec["worst"]["textbook"]["k"] == 19 and [f["k"] for f in rec["floor"]] == [2, 2]
    Board.model_validate(_board(rec))  # the record is what board.json accepts
    text = br.realistic_markdown(rec)
    assert (
        "| dlg (board: dlg[iterations=50]) | 95 % [" in text
        and "(3/8)" in text
        and "untrained, round 0" in text
    )
    assert "*class-mean guess (floor)*" in text and "a tiny federation" in text


def test_each_attack_stands_beside_the_boards_same_label_else_the_same_plugin():
    board = ["dlg[iterations=50]", "sdan-poisoning", "sdan-poisoning[loss=contrastive]", "idlg"]
    assert br.textbook_label("sdan-poisoning[loss=contrastive]", board) == "sdan-poisoning[loss=contrastive]"
    assert br.textbook_label("dlg", board) == "dlg[iterations=50]"  # other budgets: the table names both
    assert br.textbook_label("fedavg-leakage[iterations=200]", board) == ""


def test_verdict_rule():
    def r(k, n=100):
        return br.rate([1.0] * k + [0.0] * (n - k))

    floor = [r(4), r(4), r(4)]
    assert br.verdict([r(10), r(70), r(5)], floor) == "yes"  # a majority at its best checkpoint
    assert br.verdict([r(5), r(6), r(3)], floor) == "no"  # never above the class-mean guess
    assert br.verdict([r(20), r(15), r(5)], floor) == "partly"
    assert br.verdict([None, None, None], floor) == "n/a"
    assert br.rate([]) is None


def _board(realistic: dict) -> dict:
    return {
        "schema": 3,
        "name": "b",
        "title": "t",
        "scenario": {},
        "attack_suite": ["dlg"],
        "headline": "psnr",
        "metrics": ["psnr"],
        "command": "c",
        "board_version": 2,
        "primary": "reid",
        "utility_budget": 5,
        "realistic": realistic,
    }


def test_bad_inputs_are_refused():
    res = _results([("dlg", 0, 0, [1, 0], [0, 0])])
    res.frame["defense"] = "sparsification"
    with pytest.raises(FedbenchError, match="without a defense"):
        br.realistic_record(res, "reid", None, "p", "cmd", "")
    res.frame["status"] = "failed"
    with pytest.raises(FedbenchError, match="no successful"):
        br.realistic_record(res, "reid", None, "p", "cmd", "")
    uneven = _results([("dlg", 0, 0, [1, 0], [0, 0]), ("idlg", 0, 0, [1], [0])])
    with pytest.raises(FedbenchError, match="different numbers of inputs"):
        br.realistic_record(uneven, "reid", None, "p", "cmd", "")
    with pytest.raises(ValueError, match="works"):
        rec = br.realistic_record(_results([("dlg", 0, 0, [1, 0], [0, 0])]), "reid", None, "p", "c", "")
        rec["attacks"][0]["works"] = "maybe"
        Board.model_validate(_board(rec))
    # the worst case per record is validated like each attack's rates, so rendering never meets a bad one
    rec = br.realistic_record(_results([("dlg", 0, 0, [1, 0], [0, 0])]), "reid", None, "p", "c", "")
    worst = rec["worst"]
    for bad in ({**worst, "checkpoints": None}, {**worst, "textbook": {"k": 1}}, [worst]):
        with pytest.raises(ValueError, match="worst"):
            Board.model_validate(_board({**rec, "worst": bad}))


BOARD = """
[grid]
name = "tiny-real"
description = "a tiny v2 board with a realistic protocol"
seeds = 1

[grid.board]
name = "tiny-real"
primary = "reid"
utility_budget = 60
realistic = "tiny-real-fedavg"

[scenario]
protocol = "fedsgd"
clients = 3
rounds = 2
batch_size = 1
lr = 0.1
train_size = 90
eval_every = 2
observe_round = 0
victims = 2
"""

# the components both tiny presets share: one row (none) and one cheap attack
COMPONENTS = """[[dataset]]
name = "mnist5k"

[[model]]
name = "mlp"
params = { hidden = [16] }

[[defense]]
name = "none"

[[attack]]
name = "fc-leakage"
"""

BOARD += COMPONENTS

REALISTIC = (
    """
[grid]
name = "tiny-real-fedavg"
description = "a tiny realistic federation: 3 non-IID clients of 30 digits, 1 local epoch of B = 8."
seeds = 1

[scenario]
protocol = "fedavg"
clients = 3
partition = "shards"
shards_per_client = 2
rounds = 3
local_epochs = 1
batch_size = 8
lr = 0.1
train_size = 90
eval_every = 3
observe = "update"
observe_round = [0, 2]
victims = 2
"""
    + COMPONENTS
)


def test_build_puts_the_realistic_column_on_the_board_and_realistic_refreshes_it(tmp_path, monkeypatch):
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "tiny-real.toml").write_text(BOARD, encoding="utf-8")
    (tmp_path / "presets" / "tiny-real-fedavg.toml").write_text(REALISTIC, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    common = ["--preset-dir", "presets", "--dir", "boards", "--cache-dir", str(tmp_path / "cache")]
    res = runner.invoke(app, ["leaderboard", "build", "tiny-real", *common, "--threads", "1"])
    assert res.exit_code == 0, res.output
    board = json.loads((tmp_path / "boards" / "tiny-real" / "board.json").read_text())
    rec = board["realistic"]
    assert rec["preset"] == "tiny-real-fedavg" and rec["rounds"] == [0, 2]
    assert rec["checkpoints"] == ["untrained", "converged"]
    (fc,) = rec["attacks"]
    assert fc["textbook"]["n"] == 2 and [c["n"] for c in fc["checkpoints"]] == [60, 60]  # 2 victims x 30
    readme = (tmp_path / "boards" / "tiny-real" / "README.md").read_text()
    assert "## Works in realistic FL?" in readme and "| fc-leakage |" in readme
    # the command alone reproduces the record from the cache; check agrees the files are fresh
    res = runner.invoke(app, ["leaderboard", "realistic", "tiny-real", *common])
    assert res.exit_code == 0, res.output
    assert "works in realistic FL? fc-leakage" in res.output
    assert json.loads((tmp_path / "boards" / "tiny-real" / "board.json").read_text())["realistic"] == rec
    assert runner.invoke(app, ["leaderboard", "check", "--dir", "boards"]).exit_code == 0


def test_realistic_refuses_a_board_without_one(tmp_path, monkeypatch):
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "tiny-real.toml").write_text(
        BOARD.replace('realistic = "tiny-real-fedavg"\n', "")
    )
    monkeypatch.chdir(tmp_path)
    common = ["--preset-dir", "presets", "--dir", "boards", "--cache-dir", str(tmp_path / "cache")]
    assert runner.invoke(app, ["leaderboard", "build", "tiny-real", *common]).exit_code == 0
    res = runner.invoke(app, ["leaderboard", "realistic", "tiny-real", *common])
    assert res.exit_code == 2 and "names no realistic protocol" in res.output
    assert (
        "realistic" not in json.loads((tmp_path / "boards" / "tiny-real" / "board.json").read_text())
        or not (json.loads((tmp_path / "boards" / "tiny-real" / "board.json").read_text())["realistic"])
    )
    res = runner.invoke(app, ["leaderboard", "realistic", "no-such-board", *common])
    assert res.exit_code == 2
