"""A v2 board with adaptive attacks ranks by the worst case over the whole suite and shows the
non-adaptive worst case beside it; rows whose rank the adaptive attacks moved are flagged and named
(issue 28)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedbench.reporting import leaderboard as lb
from fedbench.reporting.board_rank import has_adaptive, is_adaptive, plain_ranking, rank_board
from fedbench.reporting.board_table import build_table
from tests.test_board_v2 import _entry, _rows

BOARD = (
    Path(__file__).resolve().parents[1] / "leaderboards" / "malicious-server-mnist5k-fcnn"
)  # no adaptive attack


def _entries():
    rng = np.random.default_rng(1)
    return [
        _entry("none", [0.90, 0.91, 0.89, 0.90], {"dlg": _rows(rng, 0.95)}),
        # hides from dlg, broken by its adaptive attack: best without it, no protection with it
        _entry(
            "loda[c=100]",
            [0.89, 0.90, 0.89, 0.90],
            {"dlg": _rows(rng, 0.0), "loda-adaptive[pool=8]": _rows(rng, 0.9)},
        ),
        _entry("good", [0.88, 0.90, 0.87, 0.89], {"dlg": _rows(rng, 0.3)}),
    ]


def test_adaptive_labels_are_recognised():
    assert is_adaptive("loda-adaptive[pool=8]") and is_adaptive("mixup-decode")
    assert not is_adaptive("dlg[iterations=50]") and not is_adaptive("no-such-attack[x=1]")
    assert has_adaptive(_entries()) and not has_adaptive(_entries()[:1])


def test_ranks_by_the_adaptive_worst_case_and_flags_moved_ranks():
    entries = _entries()
    with_adaptive = {r.defense: r.rank for r in rank_board(entries, "reid", 5).ranked}
    without = {r.defense: r.rank for r in plain_ranking(entries, "reid", 5).ranked}
    assert without["loda[c=100]"] == 1 and with_adaptive["loda[c=100]"] > with_adaptive["good"]
    board, _ = lb.load_board(BOARD)
    table = build_table(board, entries)
    assert table.headers[2].startswith("reid") and table.headers[3] == "reid without adaptive attacks"
    loda = next(row for row in table.ranked if row[1] == "`loda[c=100]`")
    assert (
        loda[3].startswith("0.0")
        and f"rank moved by an adaptive attack (was {without['loda[c=100]']})" in loda[4]
    )
    note = table.notes[-1]
    assert "`loda[c=100]` (1 → " in note and "`good`" in note  # good moved up from 2 to 1
    record = next(r for r in table.records if r["defense"] == "loda[c=100]")
    assert record["rank_non_adaptive"] == 1 and record["reid_non_adaptive"] == 0.0


def test_a_board_without_adaptive_attacks_has_no_extra_column():
    board, entries = lb.load_board(BOARD)
    table = build_table(board, entries)
    assert not any("adaptive" in h for h in table.headers)
    assert not any("adaptive" in n for n in table.notes)
