"""The index of the boards (leaderboards/README.md, the site's index): a short row per board, its
attacks by plugin name, the no-defense gap to the baseline; parameters are left to the board's page."""

from __future__ import annotations

from pathlib import Path

from fedbench.reporting import leaderboard as lb
from fedbench.reporting.board_index import MAX_ROW, adaptive_attacks, attack_names

COMMITTED = Path(__file__).resolve().parents[1] / "leaderboards"


def _full_boards(root: Path) -> list[str]:
    """The boards an index lists: every board but the slices (their build time is in their board's row)."""
    return [n for n in lb.board_names(root) if not lb.load_board(root / n)[0].slice_of]


def test_every_row_of_the_committed_index_is_short():
    text = (COMMITTED / lb.README_FILE).read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert len(rows) == len(_full_boards(COMMITTED)) + 2  # header, rule, a row per board
    long = {len(r): r[:60] for r in rows if len(r) > MAX_ROW}
    assert not long, f"index rows over {MAX_ROW} characters: {long}"
    assert text == lb.render_index(COMMITTED)  # and it is what render writes


def test_the_index_links_every_board_and_names_attacks_without_parameters():
    text = (COMMITTED / lb.README_FILE).read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| [")]
    for name in _full_boards(COMMITTED):
        assert f"\n[{name}]: {name}/{lb.README_FILE}\n" in text
        row = next(r for r in rows if r.startswith(f"| [{name}] "))
        board, _ = lb.load_board(COMMITTED / name)
        assert "=" not in row.split("|")[2]  # no attack parameters in the suite's cell
        assert all(a.split("[")[0].split(" @")[0] in row or "adaptive" in row for a in board.attack_suite)
    assert "submitting.md" in text


def test_attack_names():
    adaptive = {"loda-adaptive", "mixup-decode"}
    suite = ["dlg[iterations=50]", "idlg[restarts=4]", "inverting-gradients[iterations=200]"]
    assert attack_names(suite, adaptive) == "dlg, idlg, inverting-gradients"
    assert attack_names([*suite, "mixup-decode[pool=8]"], adaptive) == (
        "dlg, idlg, inverting-gradients + adaptive"
    )
    assert attack_names(["mixup-decode[pool=8]", "loda-adaptive"], adaptive) == "mixup-decode, loda-adaptive"
    assert attack_names(["sdan", "fc-leakage", "sdan[k=2]"]) == "sdan ×2, fc-leakage"
    points = [f"{a} @{p}" for p in ("example", "update") for a in ("cpl[iterations=100]", "ig")]
    assert attack_names(points) == "cpl, ig @ example/update"
    assert attack_names([]) == "—"


def test_adaptive_attacks_are_the_defenses_and_the_attacks_declared_ones():
    assert {"loda-adaptive", "mixup-decode"} <= adaptive_attacks()  # Defense.adaptive_attack
    assert {"soteria-adaptive", "pruning-adaptive", "noise-aware", "frl-adaptive"} <= adaptive_attacks()
    assert not {"dlg", "fc-leakage", "inverting-gradients"} & adaptive_attacks()


def test_a_board_where_no_row_beats_none_names_no_winner():
    """The FedSGD board ties its 9 other in-budget rows with `none` (all re-identify 100 %): its rank-1 cell
    must not name one of them as if it won."""
    from fedbench.reporting.board_index import v2_summary

    board, entries = lb.load_board(COMMITTED / "inversion-fedsgd-mnist5k-mlp")
    assert v2_summary(board, entries) == ("reid: none 100.0%, floor 2.0%", "— (9 tie with none)")
    board, entries = lb.load_board(COMMITTED / "malicious-server-mnist5k-fcnn")
    assert not v2_summary(board, entries)[1].startswith("—")  # a row there beats none


def test_a_slice_is_no_row_its_build_time_sits_in_its_boards_cell(tmp_path):
    import json
    import shutil

    name = "inversion-fedsgd-mnist5k-cnn-b8"
    shutil.copytree(COMMITTED / name, tmp_path / name)
    part = tmp_path / f"{name}-slice"
    shutil.copytree(COMMITTED / name, part)
    board = json.loads((part / lb.BOARD_FILE).read_text())
    board.update(name=f"{name}-slice", slice_of=name)
    board["build_wall"] = dict(board["build_wall"], seconds=540.0)
    (part / lb.BOARD_FILE).write_text(json.dumps(board), encoding="utf-8")
    for path in (part / "entries").glob("*.json"):
        path.write_text(path.read_text().replace(f'"board": "{name}"', f'"board": "{name}-slice"'))
    text = lb.render_index(tmp_path)
    rows = [line for line in text.splitlines() if line.startswith("| [")]
    assert len(rows) == 1 and rows[0].endswith("| 47 min; slice 9 min |"), rows
    assert "-slice]" not in text
