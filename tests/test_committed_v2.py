"""What issue 27 asks of every committed v2 board, checked over its committed entries: no ranked row
outside the utility budget, >= 100 attacked inputs per cell on a B = 1 board, every rate's interval
inside [0, 1] and the one the rendered files state, and the primary metric first after the rank and
the defense."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from fedbench.metrics.catalogue import metric
from fedbench.reporting import leaderboard as lb
from fedbench.reporting.board_rank import rank_board
from fedbench.reporting.intervals import is_rate

ROOT = Path(__file__).resolve().parents[1] / "leaderboards"
V2 = [n for n in lb.board_names(ROOT) if lb.load_board(ROOT / n)[0].board_version >= 2]


def test_some_boards_are_v2():
    assert len(V2) >= 2, V2


@pytest.mark.parametrize("name", V2)
def test_committed_v2_board_meets_the_method(name):
    board, entries = lb.load_board(ROOT / name)
    ranking = rank_board(entries, board.primary, board.utility_budget)
    for row in ranking.ranked:
        assert row.admissible and (row.defense == "none" or row.drop * 100 <= board.utility_budget + 1e-9)
        assert row.rank >= 1
    for row in ranking.outside:
        assert row.rank is None
    if board.scenario.get("sc_batch_size") == 1 and board.attack_suite and not board.slice_of:
        for row in ranking.rows:  # >= 100 inputs per row (a slice has fewer by design)
            assert row.leakage.n_inputs >= 100, f"{row.defense}: {row.leakage.n_inputs} inputs"
    prim = metric(board.primary)
    rows = {r["defense"]: r for r in csv.DictReader(io.StringIO(lb.render_csv(board, entries)))}
    for row in ranking.rows:
        if row.rate is None:
            continue
        if is_rate(prim):
            assert 0.0 <= row.low <= row.rate <= row.high <= 1.0, row.defense
        stated = rows[row.defense]
        assert float(stated[f"{prim.name}_low"]) == pytest.approx(row.low)
        assert float(stated[f"{prim.name}_high"]) == pytest.approx(row.high)
    header = (ROOT / name / "leaderboard.csv").read_text().splitlines()[0].split(",")
    assert header[:2] == ["rank", "defense"] and prim.name in header[2:5]
    readme = (ROOT / name / "README.md").read_text()
    table = next(line for line in readme.splitlines() if line.startswith("| rank"))
    cells = [c.strip() for c in table.strip("|").split("|")]
    assert cells[:2] == ["rank", "defense"] and cells[2].startswith(prim.name)
