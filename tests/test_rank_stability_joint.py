"""Rank stability resamples the board's seeds jointly (issue 26, item 4): a seed is the same split,
initialisation and victims for every defense, so one draw of seeds applies to every configuration.
Also: the bootstrap is recomputed from what the entries keep (`board_stats.restat_board`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_tables import FINISHED, write_synthetic

from fedbench.errors import FedbenchError
from fedbench.reporting import board_stats, ranking
from fedbench.reporting import leaderboard as lb
from fedbench.reporting.tables import load_results

# a seed effect much larger than the gap between A and B: per seed, B has 1 point more accuracy and
# 1 dB less leakage than A, so B dominates A on every seed
SEED_ACC = (0.50, 0.90, 0.70, 0.60, 0.80)
SEED_PSNR = (30.0, 10.0, 25.0, 15.0, 20.0)


def _dominated_per_seed():
    a = (list(SEED_ACC), list(SEED_PSNR))
    b = ([x + 0.01 for x in SEED_ACC], [x - 1.0 for x in SEED_PSNR])
    return a, b


def test_a_defense_dominating_on_every_shared_seed_keeps_its_rank():
    a, b = _dominated_per_seed()
    stable_a, stable_b = ranking.rank_stability([a, b], [2, 1])
    assert stable_b["same_rank"] >= 0.95 and stable_a["same_rank"] >= 0.95
    assert (stable_a["interval"], stable_b["interval"]) == ([2, 2], [1, 1])
    assert stable_a["joint"] is True


def test_drawn_independently_the_same_seeds_would_look_unstable():
    """What the old bootstrap did (each configuration's seeds drawn on their own): A often moves."""
    a, b = _dominated_per_seed()
    rng = np.random.default_rng(ranking.STABILITY_SEED)
    util, leak = np.empty((1000, 2)), np.empty((1000, 2))
    for i, (u, lk) in enumerate((a, b)):
        picks = rng.integers(0, len(u), size=(1000, len(u)))
        util[:, i], leak[:, i] = np.asarray(u)[picks].mean(axis=1), np.asarray(lk)[picks].mean(axis=1)
    independent = float(np.mean(ranking.pareto_ranks_batch(util, leak)[:, 0] == 2))
    assert independent < 0.8  # the joint draw gives 1.0


def test_seeds_are_matched_by_label_not_position():
    """A configuration lacking a seed is matched on the seeds it has; one whose seeds are not drawn
    keeps its mean, so a one-seed configuration never moves."""
    a, b = _dominated_per_seed()
    shuffled = [4, 2, 0, 3, 1]
    b_shuffled = ([b[0][i] for i in shuffled], [b[1][i] for i in shuffled])
    got = ranking.rank_stability([a, b_shuffled], [2, 1], seeds=[[0, 1, 2, 3, 4], shuffled])
    assert [s["same_rank"] for s in got] == [1.0, 1.0]
    lone = ranking.rank_stability([a, ([0.99], [1.0])], [2, 1], seeds=[[0, 1, 2, 3, 4], [7]])
    assert lone[1]["same_rank"] == 1.0  # far ahead, and never a missing mean
    with pytest.raises(ValueError, match="one utility and one leakage value per seed"):
        ranking.rank_stability([a], [1], seeds=[[0, 1]])


def test_rank_stability_weights_a_rate_by_its_inputs():
    """A rate's mean is its pooled k / n: seeds weighted by their inputs (here 1 of 1 and 0 of 9)."""
    per_seed = [([0.9, 0.9], [1.0, 0.0], [1.0, 9.0]), ([0.9, 0.9], [0.2, 0.2])]
    # pooled 0.1 < 0.2: rank 1 for the first, 2 for the second, whatever seed is drawn twice
    first, second = ranking.rank_stability(per_seed, [1, 2])
    assert first["interval"][0] == 1 and second["interval"][1] == 2


def _close(a, b) -> None:
    """Equal up to the 6 significant digits entries keep (nested dicts and lists)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _close(a[key], b[key])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _close(x, y)
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-9)
    else:
        assert a == b


def _rows():
    """A board where `b` beats `a` on every seed, with seed effects larger than the gap."""
    rows = []
    for defense, du, dl in (("none", -0.2, 5.0), ("a", 0.0, 0.0), ("b", 0.01, -1.0)):
        for seed, (acc, psnr) in enumerate(zip(SEED_ACC, SEED_PSNR, strict=True)):
            for attack in ("idlg", "ig"):
                rows.append(
                    {
                        "run_id": f"{defense}-{seed}-{attack}",
                        "utility_id": f"u-{defense}-{seed}",
                        "preset": "joint",
                        "dataset": "mnist5k",
                        "model": "mlp",
                        "defense": defense,
                        "attack": attack,
                        "defense_name": defense,
                        "attack_name": attack,
                        "seed": seed,
                        "sc_rounds": 1,
                        "psnr": psnr + dl - (2.0 if attack == "ig" else 0.0),
                        "label_acc": 1.0,
                        "tm_observed_examples": 4,
                        "test_acc": acc + du,
                        "test_loss": 0.3,
                        "epsilon": None,
                        "seconds": 1.0,
                        "utility_seconds": 2.0,
                        "attack_seconds": 0.5,
                        **FINISHED,
                    }
                )
    return rows


@pytest.fixture
def joint_board(tmp_path):
    path = write_synthetic(tmp_path / "joint.csv", _rows())
    board, entries = lb.build(load_results([path]), "joint", command="fedbench run joint")
    return board, {e["defense"]: e for e in entries}


def test_a_board_built_from_runs_resamples_its_seeds_jointly(joint_board):
    board, by = joint_board
    a, b = by["a"]["rank_stability"], by["b"]["rank_stability"]
    assert b["same_rank"] >= 0.95 and a["same_rank"] >= 0.95 and a["joint"] and b["joint"]
    readme = lb.render_readme(board, list(by.values()))
    assert "draws the board's seeds with replacement once for every configuration" in readme


def test_intervals_and_rank_stability_recompute_from_the_entries(joint_board, tmp_path):
    """What a re-render needs is in the entries: recomputing from them gives the built board's numbers;
    entries exported before they kept per-seed values say to rebuild from the runs."""
    board, by = joint_board
    entries = list(by.values())
    again = board_stats.restat_board(board, entries)
    for old, new in zip(entries, again, strict=True):
        assert new["rank_stability"] == old["rank_stability"]
        _close(new["metrics"], old["metrics"])
    legacy = json.loads(json.dumps(entries[0]))
    legacy["metrics"]["test_acc"].pop("per_seed")
    with pytest.raises(FedbenchError, match="keep no per-seed values"):
        board_stats.restat_board(board, [legacy, *entries[1:]])
