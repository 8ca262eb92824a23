"""The committed leaderboards as issue 18 defines them: six boards, every shipped method on one, attacks
that clearly work without a defense, intervals and rank stability stated.

These read the committed `leaderboards/` files only (no run): a rebuilt board that loses a method, or
whose no-defense attack falls to its baseline, fails here before it lands.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedbench import registry
from fedbench.reporting.board_build import plugin_name
from fedbench.spec.grid import list_presets

ROOT = Path(__file__).resolve().parents[1] / "leaderboards"
BOARDS = {
    "inversion-fedsgd-mnist5k-mlp": "board-fedsgd",
    "inversion-fedavg-mnist5k-mlp": "board-fedavg",
    "inversion-fedsgd-mnist5k-cnn-b1": "board-cnn",
    "inversion-fedsgd-mnist5k-cnn-b8": "board-cnn-b8",
    "malicious-server-mnist5k-fcnn": "board-malicious",
    "malicious-imprint-mnist5k-fcnn": "board-malicious-imprint",
    "attribute-inference-adult-mlp": "board-attribute",
    "membership-mnist5k-mlp": "board-membership",
    "leakage-example-mnist5k-mlp": "board-leakage-example",
    "leakage-update-mnist5k-mlp": "board-leakage-update",
    "leakage-server-mnist5k-mlp": "board-leakage-server",
}
MIN_INVERSION_GAP_DB = 25.0  # issue 18: no defense >= 25 dB above the random-image floor
#: Shipped methods deliberately on no board (issue 30: "DP defenses whose level the scenario cannot
#: support are left off that board, with the sweep linked"; an attack that cannot run on a board's design
#: is not in its suite), each with the file that shows why: it must name the method.
OFF_BOARD = {
    # client-level DP at epsilon <= 8: 62 % at epsilon 8 on the FedAvg board's scenario (86 % without),
    # diverged at 10 clients on the membership board's
    "dp-fedavg": "docs/results/dp-tuning.md",
    # central shadow models on attacker-owned records, and the membership pool is queried whole: offline
    # LiRA runs there as mia-lira-online mode = "offline", on references trained on halves of the pool
    "mia-lira": "registry/presets/board-membership.toml",
    "mia-shadow": "registry/presets/board-membership.toml",
    # k = 4 does not train on the FedSGD board's scenario (12 % accuracy, 74 points outside its budget);
    # MixUp k = 4 stays as the row of its family
    "instahide": "registry/presets/board-fedsgd.toml",
}
TARGET_EPSILON = 8.0  # issue 30: DP rows at a target epsilon of 1, 4 or 8; above 100 they are noise
#: v1 boards (built before issue 27's method) still to be rebuilt under issue 30's operating points: their
#: DP rows are the papers' sigma values, some at 8 < epsilon <= 100. The exemption ends with the rebuild.
PENDING_REBUILD = {"attribute-inference-adult-mlp"}


def _board(name: str) -> dict:
    return json.loads((ROOT / name / "board.json").read_text())


def _entries(name: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((ROOT / name / "entries").glob("*.json"))]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_board_is_committed_from_its_preset(name):
    folder = ROOT / name
    assert (folder / "README.md").is_file() and (folder / "leaderboard.csv").is_file()
    assert _entries(name), f"{name} has no entries"
    board = _board(name)
    assert board["preset"] == BOARDS[name]
    assert BOARDS[name] in {preset for preset, _, _ in list_presets()}
    assert f"fedbench leaderboard build {BOARDS[name]}" in (folder / "README.md").read_text()


def test_every_shipped_defense_and_attack_is_on_a_board():
    """Every shipped method is on a committed board, or (an attack added since the board was built) in
    the grid of a board preset, so the board's next build puts it on, or in OFF_BOARD with the file
    that says why: a method on no board without a reason fails."""
    from fedbench.spec.grid import build_grid

    registry.load_builtins()
    defenses = {e["defense_name"] for name in BOARDS for e in _entries(name)}
    attacks = {plugin_name(a) for name in BOARDS for a in _board(name)["attack_suite"]}
    for preset, _, _ in list_presets():
        if preset.startswith("board-"):
            attacks |= {s.attack.name for s in build_grid(preset).specs if s.attack is not None}
    shipped = {
        kind: {c.name for c in registry.registry_for(kind).list() if c.__module__.startswith("fedbench.")}
        for kind in ("defense", "attack")  # fedbench's own plugins, not those other tests register
    }
    assert shipped["defense"] - defenses <= OFF_BOARD.keys(), shipped["defense"] - defenses - OFF_BOARD.keys()
    assert shipped["attack"] - attacks <= OFF_BOARD.keys(), shipped["attack"] - attacks - OFF_BOARD.keys()
    assert not OFF_BOARD.keys() & (defenses | attacks), "on a board again: drop it from OFF_BOARD"
    for name, why in OFF_BOARD.items():
        assert name in (ROOT.parent / why).read_text(), f"{why} does not say why {name} is on no board"


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_a_board_whose_preset_names_a_realistic_protocol_carries_its_rates(name):
    """Issue 30: the realistic-protocol column, with a rate and an exact interval at each of the three
    checkpoints for every attack, on each board whose preset declares one ([grid.board] realistic)."""
    from fedbench.spec.grid import build_grid

    declared = build_grid(BOARDS[name]).board.get("realistic")
    record = _board(name).get("realistic") or {}
    assert bool(record) == bool(declared), f"{name}: preset names {declared!r}, board has {bool(record)}"
    if declared:
        assert record["preset"] == declared and len(record["rounds"]) == 3
        for attack in record["attacks"]:
            for cell in attack["checkpoints"]:
                assert cell["n"] >= 100 and 0 <= cell["low"] <= cell["rate"] <= cell["high"] <= 1


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_dp_row_is_at_a_target_epsilon_of_at_most_8_or_labelled_noise(name):
    """Issue 30: a DP row is at a target epsilon <= 8, or its epsilon exceeds 100 and the board labels it
    noise (no meaningful DP guarantee); a v2 board names the rule that tuned its rows."""
    from fedbench.reporting.board_notes import epsilon_value
    from fedbench.reporting.board_rank import is_noise

    board = _board(name)
    if name in PENDING_REBUILD:
        assert (board.get("board_version") or 1) < 2, f"{name} was rebuilt: drop it from PENDING_REBUILD"
        return
    assert board.get("tuning"), f"{name} names no tuning rule ([grid.board] tuning)"
    readme = (ROOT / name / "README.md").read_text()
    for entry in _entries(name):
        eps = epsilon_value(entry["metrics"])
        if eps is None:
            continue
        assert eps <= TARGET_EPSILON * (1 + 1e-6) or is_noise(eps), f"{entry['defense']}: epsilon {eps:.3g}"
        if is_noise(eps):
            line = next(row for row in readme.splitlines() if f"`{entry['defense']}`" in row)
            assert "noise" in line, f"{entry['defense']}: epsilon {eps:.3g} is not labelled noise"


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_no_defense_clearly_beats_its_baseline(name):
    """The gap between the no-defense worst case and the board's baseline (random image, majority
    class, chance) has a 95 % interval above zero. An inversion board's attacks clearly work without a
    defense: on a v1 board the PSNR gap is >= 25 dB; a v2 board is judged by its primary metric, as it
    ranks (issue 27: PSNR disagrees with the eye), so `none`'s primary rate has its interval above the
    floor of the best input-independent guess and re-identifies a majority of the inputs."""
    from fedbench.reporting.board_rank import rank_board
    from fedbench.reporting.board_table import FLOOR_OF

    board = _board(name)
    baseline = board["baseline"]
    gap = baseline["gap"]
    assert gap["low"] > 0, f"{name}: the no-defense attack does not beat its {baseline['kind']}"
    if (board.get("board_version") or 1) < 2:
        if baseline["metric"] == "psnr":
            assert gap["mean"] >= MIN_INVERSION_GAP_DB
        return
    ranking = rank_board(
        _entries(name), board["primary"], board["utility_budget"], FLOOR_OF.get(board["primary"], "")
    )
    none = next(r for r in ranking.rows if r.defense == "none")
    if ranking.floor is not None:
        assert none.low > ranking.floor, f"{name}: none {none.low} not above the floor {ranking.floor}"
    if board["primary"] == "reid":
        assert none.low > 0.5, f"{name}: none re-identifies {none.rate:.1%} [{none.low:.1%}, ...]"


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_rows_carry_intervals_and_the_board_states_rank_stability(name):
    readme = (ROOT / name / "README.md").read_text()
    assert "Rank stability:" in readme
    for entry in _entries(name):
        acc = entry["metrics"]["test_acc"]
        assert acc["n"] >= 2 and acc["spread_kind"] in ("ci95", "std"), entry["defense"]
        if acc["n"] >= 3:
            assert acc["spread_kind"] == "ci95"
