"""What makes a board citable: its threat model, the baseline the no-defense attack must beat (random-image
floor, chance, majority class) with a CI, epsilon with its delta/level/accountant (large and infinite
values) beside the audit's empirical lower bound, the papers' reported numbers, the build cost, and
boards whose attacker vantage point varies (victims pooled, observation points as attack columns).

Synthetic results (hand-made rows, no training), as tests/test_tables.py writes them; one tiny real
build at the end checks the columns a real run writes."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
from test_leaderboard_build import TINY_COMPONENTS
from test_tables import FINISHED, make_rows, write_synthetic

from fedbench.errors import FedbenchError, SpecError
from fedbench.reporting import board_build, board_notes, site
from fedbench.reporting import leaderboard as lb
from fedbench.reporting.tables import load_results

DEFENSES = {
    "none": ("none", {}),
    "dp-gaussian[clip=1,sigma=0.1]": ("dp-gaussian", {"clip": 1.0, "sigma": 0.1}),
}


def synth(values, seeds=(0, 1, 2), extra=None, **scenario):
    """Rows with `values[(defense, attack)][seed]` (a dict of metric columns) and `extra` (per defense: more
    columns, e.g. epsilon); scenario columns given as keyword lists vary (sc_victim=[0, 1])."""
    keys = sorted(scenario)
    combos = [{}]
    for k in keys:
        combos = [dict(c, **{k: v}) for c in combos for v in scenario[k]]
    rows = []
    for (defense, attack), per_seed in values.items():
        name, params = DEFENSES[defense]
        for seed in seeds:
            for combo in combos:
                cols = per_seed[seed]
                cols = cols(combo) if callable(cols) else cols
                rid = f"{defense}|{attack}|{seed}|{sorted(combo.items())}"
                rows.append(
                    {
                        "run_id": hashlib.sha256(rid.encode()).hexdigest()[:16],
                        "utility_id": f"u-{defense}-{seed}",
                        "preset": "synthetic",
                        "dataset": "mnist5k",
                        "model": "mlp",
                        "defense": defense,
                        "attack": attack,
                        "defense_name": name,
                        "attack_name": attack.split("[")[0],
                        "seed": seed,
                        "sc_rounds": 20,
                        **combo,
                        **{f"p_defense_{k}": v for k, v in params.items()},
                        **cols,
                        "test_acc": 0.9 if defense == "none" else 0.8 + 0.01 * seed,
                        "test_loss": 0.3,
                        "seconds": 1.0,
                        "utility_seconds": 10.0 + seed,
                        "attack_seconds": 1.5,
                        **FINISHED,
                        **(extra or {}).get(defense, {}),
                    }
                )
    return rows


def build(tmp_path, rows, sidecar=None, name="b"):
    rs = load_results([write_synthetic(tmp_path / f"{name}.csv", rows, sidecar)])
    board, entries = lb.build(rs)
    return rs, board, entries


def by_defense(entries):
    return {e["defense"]: e for e in entries}


def t_interval(xs):
    from scipy import stats

    xs = np.asarray(xs, dtype=float)
    half = stats.t.ppf(0.975, len(xs) - 1) * xs.std(ddof=1) / math.sqrt(len(xs))
    return xs.mean() - half, xs.mean() + half


# ------------------------------------------------------------------------------------- threat model


def test_threat_model_goes_from_the_board_table_into_board_json_readme_and_site(tmp_path):
    text = "Honest-but-curious server: it reads the victim's round-0 update."
    path = write_synthetic(tmp_path / "t.csv", sidecar={"board": {"name": "t", "threat_model": text}})
    board, entries = lb.build(load_results([path]))
    assert board.threat_model == text and board.to_json()["threat_model"] == text
    readme = lb.render_readme(board, entries)
    assert f"Threat model: {text}" in readme
    assert readme.index("Threat model:") < readme.index("## Leaderboard")  # near the top
    assert site.threat_model(board, entries)[0] == ("attacker", text)
    # a board without one says nothing about it
    plain, plain_entries = lb.build(load_results([write_synthetic(tmp_path / "p.csv")]))
    assert plain.threat_model == "" and "Threat model:" not in lb.render_readme(plain, plain_entries)


def test_the_preset_schema_takes_threat_model_in_grid_board(tmp_path):
    from fedbench.spec.preset_schema import check_preset

    preset = {"grid": {"name": "x", "board": {"name": "x", "threat_model": "a server"}}}
    assert check_preset(preset, tmp_path / "x.toml").grid.board.threat_model == "a server"
    with pytest.raises(SpecError, match="threat_modle"):
        check_preset({"grid": {"board": {"threat_modle": "a"}}}, tmp_path / "x.toml")
    with pytest.raises(SpecError, match="threat_model"):
        check_preset({"grid": {"board": {"threat_model": 3}}}, tmp_path / "x.toml")


def test_a_board_json_without_the_new_fields_still_loads(board_root):
    """Boards built before these fields (the committed ones) load: every new key is optional."""
    folder = board_root / "synthetic"
    doc = json.loads((folder / lb.BOARD_FILE).read_text())
    for key in ("threat_model", "baseline", "build_seconds", "cost", "reported"):
        doc.pop(key, None)
    (folder / lb.BOARD_FILE).write_text(json.dumps(doc))
    for path in (folder / lb.ENTRIES_DIR).glob("*.json"):
        entry = json.loads(path.read_text())
        for key in ("accountant", "epsilon_infinite", "eps_lower"):
            entry["metrics"].pop(key, None)
        path.write_text(json.dumps(entry))
    board, entries = lb.load_board(folder)
    readme = lb.render_readme(board, entries)
    assert board.baseline is None and "floor" not in readme and "Cost:" not in readme


# ---------------------------------------------------------------------------------------- baselines


def _psnr(values, floor=None):
    def cols(v):
        return {"psnr": v, "ssim": v / 100} | ({"psnr_random": floor, "ssim_random": 0.01} if floor else {})

    return {k: [cols(v) for v in seeds] for k, seeds in values.items()}


PSNR = {
    ("none", "idlg"): (30.0, 32.0, 31.0),
    ("none", "ig"): (25.0, 35.0, 36.0),
    ("dp-gaussian[clip=1,sigma=0.1]", "idlg"): (8.0, 9.0, 8.5),
    ("dp-gaussian[clip=1,sigma=0.1]", "ig"): (7.0, 7.5, 9.5),
}


def test_random_image_floor_is_stored_and_the_readme_states_the_gap_with_its_ci(tmp_path):
    rows = synth(_psnr(PSNR, floor=5.1))
    _rs, board, entries = build(tmp_path, rows)
    b = board.baseline
    assert (b.metric, b.value, b.kind, b.column) == ("psnr", 5.1, "random image", "psnr_random")
    worst = [30.0, 35.0, 36.0]  # the leakiest attack per seed (row level: no per-image scores)
    gaps = [w - 5.1 for w in worst]
    low, high = t_interval(gaps)
    assert b.gap.mean == pytest.approx(np.mean(gaps), rel=1e-5) and b.gap.n == 3
    assert (b.gap.low, b.gap.high) == (pytest.approx(low, rel=1e-5), pytest.approx(high, rel=1e-5))
    assert board.to_json()["baseline"]["kind"] == "random image"
    readme = lb.render_readme(board, entries)
    none = by_defense(entries)["none"]["metrics"]["worst_case"]["psnr"]
    line = next(x for x in readme.splitlines() if x.startswith("Random-image floor"))
    assert line.startswith(
        f"Random-image floor: 5.1 dB (the mean `psnr_random` of the runs). No defense, worst case: "
        f"{none['mean']:.1f} ± {none['spread']:.1f} dB, {np.mean(gaps):.1f} dB above the floor"
    )
    assert f"{low:.1f} to {high:.1f} dB" in line and "it excludes 0" in line


def test_the_index_states_each_boards_distance_to_its_baseline(tmp_path):
    rows = synth(_psnr(PSNR, floor=5.1))
    _rs, board, _entries = build(tmp_path, rows)
    gap = board.baseline.gap
    assert lb.index_headline(board) == f"psnr +{gap.mean:.2f} [{gap.low:.2f}, {gap.high:.2f}]"
    no_floor = board.model_copy(update={"baseline": None})
    assert lb.index_headline(no_floor) == "—"  # a board built before baselines, or one without a floor


def test_ssim_headline_uses_the_ssim_floor(tmp_path):
    rows = synth(_psnr(PSNR, floor=5.1))
    _rs, board, entries = build(tmp_path, rows, {"board": {"headline": "ssim"}})
    assert (board.baseline.metric, board.baseline.value, board.baseline.column) == (
        "ssim",
        0.01,
        "ssim_random",
    )
    assert "Random-image floor: 0.01 (the mean `ssim_random`" in lb.render_readme(board, entries)


def test_no_floor_column_means_no_floor_line_and_no_crash(tmp_path):
    _rs, board, entries = build(tmp_path, synth(_psnr(PSNR)))
    assert board.baseline is None and "baseline" in board.to_json()
    readme = lb.render_readme(board, entries)
    assert "floor" not in readme.lower()


def test_no_none_row_still_fails(tmp_path):
    rows = [r for r in synth(_psnr(PSNR, floor=5.1)) if r["defense"] != "none"]
    with pytest.raises(FedbenchError, match="'none' baseline"):
        build(tmp_path, rows)


def test_an_interval_that_includes_zero_is_said_so(tmp_path):
    values = {
        ("none", "idlg"): (6.0, 4.0, 5.5),
        ("dp-gaussian[clip=1,sigma=0.1]", "idlg"): (5.0, 5.0, 5.0),
    }
    _rs, board, entries = build(tmp_path, synth(_psnr(values, floor=5.0)))
    assert board.baseline.gap.low < 0 < board.baseline.gap.high
    readme = lb.render_readme(board, entries)
    assert "it includes 0: without a defense the suite does not clearly beat guessing" in readme


MIA = {
    ("none", "mia-loss"): [0.70, 0.72, 0.68],
    ("none", "mia-lira"): [0.80, 0.78, 0.83],
    ("dp-gaussian[clip=1,sigma=0.1]", "mia-loss"): [0.52, 0.50, 0.51],
    ("dp-gaussian[clip=1,sigma=0.1]", "mia-lira"): [0.55, 0.49, 0.50],
}


def _mia(eps_lower=None):
    def cols(defense, attack, auc):
        out = {"mia_auc": auc, "mia_acc": auc - 0.1, "mia_base_rate": 0.5}
        if eps_lower is not None:
            out.update(eps_lower=eps_lower[defense] * auc, eps_lower_delta=1e-5)
        return out

    return {k: [cols(*k, v) for v in seeds] for k, seeds in MIA.items()}


DP = {
    "dp-gaussian[clip=1,sigma=0.1]": {
        "epsilon": 8.0,
        "delta": 1e-5,
        "dp_level": "example",
        "accountant": "rdp",
    }
}


def test_membership_baseline_is_chance_and_the_gap_is_a_t_interval_over_seeds(tmp_path):
    _rs, board, entries = build(tmp_path, synth(_mia(), extra=DP), {"board": {"headline": "mia_auc"}})
    b = board.baseline
    assert (b.metric, b.value, b.kind, b.column) == ("mia_auc", 0.5, "chance", "")
    gaps = [0.80 - 0.5, 0.78 - 0.5, 0.83 - 0.5]  # lira wins every seed
    assert b.gap.mean == pytest.approx(np.mean(gaps), rel=1e-5)
    assert (b.gap.low, b.gap.high) == tuple(pytest.approx(x, rel=1e-5) for x in t_interval(gaps))
    readme = lb.render_readme(board, entries)
    assert "Chance level of mia_auc: 0.50. No defense, worst case: 0.80 ± " in readme
    assert "above chance (95% CI of the difference over 3 seeds" in readme
    assert "it excludes 0: the suite beats guessing without a defense" in readme
    # mia_acc: the chance level is the base rate
    _rs, board, _ = build(tmp_path, synth(_mia(), extra=DP), {"board": {"headline": "mia_acc"}}, "acc")
    assert (board.baseline.value, board.baseline.column) == (0.5, "mia_base_rate")
    assert board.baseline.gap.mean == pytest.approx(np.mean(gaps) - 0.1, rel=1e-5)


def test_attribute_baseline_is_the_majority_class_rate_paired_by_seed(tmp_path):
    majority = [0.6, 0.7, 0.65]
    values = {
        ("none", "attribute-inference"): [
            {"asr": a, "asr_majority": m, "asr_advantage": a - m}
            for a, m in zip((0.8, 0.85, 0.8), majority, strict=True)
        ],
        ("dp-gaussian[clip=1,sigma=0.1]", "attribute-inference"): [
            {"asr": m, "asr_majority": m, "asr_advantage": 0.0} for m in majority
        ],
    }
    _rs, board, entries = build(tmp_path, synth(values), {"board": {"headline": "asr"}})
    b = board.baseline
    assert (b.kind, b.column, b.value) == ("majority class", "asr_majority", pytest.approx(0.65))
    gaps = [0.8 - 0.6, 0.85 - 0.7, 0.8 - 0.65]  # paired: each seed's own majority rate
    assert b.gap.mean == pytest.approx(np.mean(gaps), rel=1e-5)
    assert (b.gap.low, b.gap.high) == tuple(pytest.approx(x, rel=1e-5) for x in t_interval(gaps))
    readme = lb.render_readme(board, entries)
    assert (
        "Majority-class rate of asr: 65.0% (always answering the most common class; "
        "the mean `asr_majority` of the runs)." in readme
    )
    assert "No defense, worst case: 81.7 ± " in readme and "16.7 pp above it" in readme


# ------------------------------------------------------------------------------------------ epsilon


def test_large_and_infinite_epsilons_render_and_the_header_states_delta_level_accountant(tmp_path):
    eps = {
        "dp-gaussian[clip=1,sigma=0.1]": {
            "epsilon": 404291.3,
            "delta": 1e-5,
            "dp_level": "client",
            "accountant": "rdp",
        }
    }
    _rs, board, entries = build(tmp_path, synth(_psnr(PSNR, floor=5.0), extra=eps))
    dp = by_defense(entries)["dp-gaussian[clip=1,sigma=0.1]"]["metrics"]
    assert (dp["epsilon"], dp["delta"], dp["dp_level"], dp["accountant"]) == (404291.0, 1e-5, "client", "rdp")
    p = lb.board_pivot(board, entries)
    col = next(c for c in p.columns if c.key == "epsilon")
    assert col.header == "epsilon (δ=1e-05, client-level, rdp) ↓"
    readme = lb.render_readme(board, entries)
    assert "| 4.04e+05 " in readme and "404291.00" not in readme
    assert (
        "epsilon: the formal (ε, δ)-DP guarantee of DP-accounted defenses (δ=1e-05, client-level, rdp)"
        in readme
    )
    # an infinite epsilon: null in the JSON (valid JSON, valid schema), ∞ in the tables
    eps["dp-gaussian[clip=1,sigma=0.1]"]["epsilon"] = math.inf
    _rs, board, entries = build(tmp_path, synth(_psnr(PSNR, floor=5.0), extra=eps), name="inf")
    dp = by_defense(entries)["dp-gaussian[clip=1,sigma=0.1]"]["metrics"]
    assert dp["epsilon"] is None and dp["epsilon_infinite"] is True
    root = tmp_path / "boards"
    lb.write_board(root, board, entries)
    lb.render(root)
    text = (root / board.name / lb.ENTRIES_DIR / "dp-gaussian_clip_1_sigma_0.1.json").read_text()
    assert "Infinity" not in text and json.loads(text)["metrics"]["epsilon"] is None
    loaded, loaded_entries = lb.load_board(root / board.name)
    readme = (root / board.name / lb.README_FILE).read_text()
    assert "| ∞ " in readme and "| — " in readme  # none has no guarantee
    assert "inf" in (root / board.name / lb.CSV_FILE).read_text()
    assert board_notes.epsilon_text({"epsilon": None, "epsilon_infinite": True}) == "∞"
    assert (
        board_notes.epsilon_text({"epsilon": 8.0}) == "8.00"
        and board_notes.epsilon_text({"epsilon": None}) == "—"
    )
    table = site.table(lb.board_pivot(loaded, loaded_entries))
    assert any(c["text"] == "∞" and c["sort"] == "Infinity" for row in table["rows"] for c in row)


def test_differing_dp_levels_are_named_per_cell(tmp_path):
    DEFENSES["dp-sgd[epsilon=4]"] = ("dp-sgd", {"epsilon": 4.0})
    try:
        values = dict(_psnr(PSNR, floor=5.0))
        values[("dp-sgd[epsilon=4]", "idlg")] = [{"psnr": 6.0, "ssim": 0.06, "psnr_random": 5.0}] * 3
        extra = {
            "dp-gaussian[clip=1,sigma=0.1]": {
                "epsilon": 8.0,
                "delta": 1e-5,
                "dp_level": "client",
                "accountant": "rdp",
            },
            "dp-sgd[epsilon=4]": {"epsilon": 4.0, "delta": 1e-5, "dp_level": "example", "accountant": "prv"},
        }
        _rs, board, entries = build(tmp_path, synth(values, extra=extra))
    finally:
        del DEFENSES["dp-sgd[epsilon=4]"]
    readme = lb.render_readme(board, entries)
    assert "| epsilon ↓ " in readme
    assert "8.00 (δ=1e-05, client-level, rdp)" in readme and "4.00 (δ=1e-05, example-level, prv)" in readme
    assert "each cell names its delta, DP level and accountant" in readme


def test_membership_boards_show_eps_lower_beside_epsilon_and_audit_it(tmp_path):
    lower = {"none": 2.0, "dp-gaussian[clip=1,sigma=0.1]": 1.0}  # x auc: at most 0.55 for the DP row
    _rs, board, entries = build(tmp_path, synth(_mia(lower), extra=DP), {"board": {"headline": "mia_auc"}})
    e = by_defense(entries)
    audit = e["dp-gaussian[clip=1,sigma=0.1]"]["metrics"]["eps_lower"]
    assert audit == {"max": 0.55, "attack": "mia-lira", "seed": 0, "n": 6, "delta": 1e-5}
    assert e["none"]["metrics"]["eps_lower"]["max"] == pytest.approx(1.66)
    p = lb.board_pivot(board, entries)
    keys = [c.key for c in p.columns]
    assert keys.index("eps_lower") == keys.index("epsilon") + 1
    readme = lb.render_readme(board, entries)
    assert "Every configuration's eps_lower is at most its formal epsilon (1 with one" in readme
    assert "eps_lower,utility_seconds" not in (csv := lb.render_csv(board, entries)) and ",eps_lower," in csv
    # a bound above the formal epsilon is named
    lower["dp-gaussian[clip=1,sigma=0.1]"] = 20.0
    _rs, board, entries = build(
        tmp_path, synth(_mia(lower), extra=DP), {"board": {"headline": "mia_auc"}}, "v"
    )
    readme = lb.render_readme(board, entries)
    assert "eps_lower exceeds the formal epsilon for `dp-gaussian[clip=1,sigma=0.1]` (11.00 > 8.00)" in readme
    # a reconstruction board has no eps_lower column
    _rs, board, entries = build(tmp_path, synth(_psnr(PSNR, floor=5.0)), name="r")
    assert "eps_lower" not in [c.key for c in lb.board_pivot(board, entries).columns]
    assert "Audit:" not in lb.render_readme(board, entries)


# ------------------------------------------------------------------------------- reported numbers


REPORTED = [
    {"dataset": "mnist", "defense": "dp-gaussian", "attack": "idlg", "psnr": 12.5, "source": "Table 3"},
    {"defense": "none", "test_acc": 0.98, "sc_batch_size": 64, "note": "full MNIST, K=1000"},
    {"dataset": "mnist", "defense": "soteria", "psnr": 9.0},  # not on the board
    {"dataset": "mnist", "defense": "dp-gaussian", "attack": "cpl", "psnr": 11.0},  # attack not in the suite
    {"dataset": "mnist", "defense": "dp-gaussian", "epsilon": 1.2e6, "source": "Table 5"},
]


def test_reported_rows_that_match_the_board_are_kept_and_rendered(tmp_path):
    path = write_synthetic(tmp_path / "r.csv", sidecar={"reported": REPORTED})
    board, entries = lb.build(load_results([path]))
    kept = [r.model_dump() for r in board.reported]
    assert [(r["defense"], r["attack"]) for r in kept] == [
        ("dp-gaussian", "idlg"),
        ("none", ""),
        ("dp-gaussian", ""),
    ]
    assert kept[1]["conditions"] == {"sc_batch_size": "64"} and kept[1]["note"] == "full MNIST, K=1000"
    assert kept[0]["values"] == {"psnr": 12.5} and kept[0]["source"] == "Table 3"
    readme = lb.render_readme(board, entries)
    section = readme[readme.index("## Reported by the papers") : readme.index("## Regenerate")]
    assert "as they report them (not measured here)" in section
    assert "| mnist     | dp-gaussian | idlg     | 12.50" in section and "Table 3" in section
    assert "sc_batch_size=64; full MNIST, K=1000" in section and "98.0" in section
    assert "1.20e+06" in section  # epsilon as the board writes it
    # the site shows the same rows, from board.json (no preset needed)
    root = tmp_path / "boards"
    lb.write_board(root, board, entries)
    site.build_site(root, tmp_path / "site")
    html = (tmp_path / "site" / board.name / site.PAGE).read_text()
    assert "Reported by the papers" in html and "full MNIST, K=1000" in html and "soteria" not in html
    assert "Cost: building the board takes" in html  # the README's notes are on the page too


def test_no_reported_rows_no_section(tmp_path):
    board, entries = lb.build(load_results([write_synthetic(tmp_path / "n.csv")]))
    assert board.reported == () and "Reported by the papers" not in lb.render_readme(board, entries)


# --------------------------------------------------------------------------------------------- cost


def test_build_seconds_count_each_training_once_plus_every_attack_run(tmp_path):
    rows = make_rows()  # 3 defenses x 2 seeds x 2 attacks; utility 2 s per training, 0.5 s per attack
    _rs, board, entries = build(tmp_path, rows)
    assert board.cost.model_dump() == {
        "utility_seconds": 12.0,
        "attack_seconds": 6.0,
        "trainings": 6,
        "attack_runs": 12,
    }
    assert board.build_seconds == 18.0
    readme = lb.render_readme(board, entries)
    cost = "Cost: building the board takes 18 s of compute (CPU-seconds summed over runs): 6 FL trainings"
    assert f"{cost} (12 s;" in readme
    assert "12 attack runs (6 s)" in readme and "attack_seconds" in readme
    assert by_defense(entries)["none"]["metrics"]["cost"] == {"utility_seconds": 2.0, "attack_seconds": 0.5}


def test_victims_and_observation_points_share_their_training_in_the_cost(tmp_path):
    rows = synth(_psnr(PSNR, floor=5.0), sc_victim=[0, 1], sc_observe=["update", "example"])
    _rs, board, _ = build(tmp_path, rows)
    # 2 defenses x 3 seeds trainings (utility 10 + seed s); 2 x 2 attacks x 3 seeds x 2 victims x 2 points
    assert board.cost.trainings == 6 and board.cost.utility_seconds == 2 * (10 + 11 + 12)
    assert board.cost.attack_runs == 48 and board.cost.attack_seconds == 48 * 1.5


# -------------------------------------------------------------------------------- observation points


def test_victims_are_pooled_worst_case_per_seed_victim_and_image(tmp_path):
    # per (defense, attack, seed, victim): two images; the leakiest attack differs per victim and image
    images = {
        ("none", "idlg", 0): [10.0, 30.0],
        ("none", "ig", 0): [20.0, 25.0],
        ("none", "idlg", 1): [40.0, 10.0],
        ("none", "ig", 1): [12.0, 11.0],
    }

    def cols(defense, attack):
        def per_seed(combo):
            imgs = images.get((defense, attack, combo["sc_victim"]), [5.0, 6.0])
            return {"psnr": float(np.mean(imgs)), "ssim": 0.1, "psnr_random": 5.0}

        return [per_seed] * 2

    values = {k: cols(*k) for k in [(d, a) for d in DEFENSES for a in ("idlg", "ig")]}
    rows = synth(values, seeds=(0, 1), sc_victim=[0, 1])
    per_image = {}
    for r in rows:
        imgs = images.get((r["defense"], r["attack"], r["sc_victim"]), [5.0, 6.0])
        per_image[r["run_id"]] = {"psnr": [x + r["seed"] for x in imgs]}
        r["psnr"] += r["seed"]
    rs, board, entries = build(tmp_path, rows, {"per_image": per_image})
    assert board.scenario["sc_victim"] == [0, 1]
    assert "victim=[0, 1]" in lb.render_readme(board, entries)
    assert "psnr: taken per input image of each victim" in lb.render_readme(board, entries)
    none = by_defense(entries)["none"]
    # worst per (seed, victim, image): victim 0: max(10,20), max(30,25); victim 1: max(40,12), max(10,11)
    per_seed = [np.mean([20, 30, 40, 11]) + s for s in (0, 1)]
    worst = none["metrics"]["worst_case"]["psnr"]
    assert worst["per_input"] is True and worst["n"] == 2  # n counts seeds; victims are inputs
    assert worst["mean"] == pytest.approx(np.mean(per_seed))
    # per attack: the victims' mean per seed, then over seeds
    idlg = none["metrics"]["leakage"]["idlg"]["psnr"]
    assert idlg["n"] == 2 and idlg["mean"] == pytest.approx(np.mean([22.5, 23.5]))
    assert len(none["run_ids"]) == 8 and none["seeds"] == [0, 1]  # every victim's run is kept
    assert board.attack_suite == ("idlg", "ig")
    # the bootstrap resamples the same per-seed values
    view, pooled = board_build.observation_view(
        rs.frame[rs.frame["status"] == "ok"], rs.per_image, ["sc_victim"]
    )
    assert len(view) == 8 and all("+" in r for r in view["run_id"])
    assert len(pooled[view["run_id"].iloc[0]]["psnr"]) == 4  # 2 victims x 2 images


def test_pooled_victims_without_per_image_scores_enter_as_one_input_each(tmp_path):
    def victim_psnr(defense, attack):
        table = {("none", "idlg"): (30.0, 10.0), ("none", "ig"): (12.0, 20.0)}
        a, b = table.get((defense, attack), (6.0, 7.0))
        return [lambda c, a=a, b=b: {"psnr": a if c["sc_victim"] == 0 else b, "ssim": 0.1}] * 3

    values = {(d, a): victim_psnr(d, a) for d in DEFENSES for a in ("idlg", "ig")}
    _rs, board, entries = build(tmp_path, synth(values, sc_victim=[0, 1]))
    worst = by_defense(entries)["none"]["metrics"]["worst_case"]["psnr"]
    assert worst["mean"] == pytest.approx(25.0)  # max(30, 12) and max(10, 20) per victim, averaged
    assert worst["n"] == 3


def test_observation_points_become_attack_columns_with_the_worst_case_over_all(tmp_path):
    def at(defense, attack):
        base = {("none", "cpl"): 20.0, ("none", "ig"): 15.0}.get((defense, attack), 6.0)
        return [
            lambda c, b=base: {"psnr": b + (10.0 if c["sc_observe"] == "example" else 0.0), "ssim": 0.1}
        ] * 3

    DEFENSES_ATTACKS = [(d, a) for d in DEFENSES for a in ("cpl", "ig")]
    rows = synth({k: at(*k) for k in DEFENSES_ATTACKS}, sc_observe=["example", "update"])
    _rs, board, entries = build(tmp_path, rows)
    assert board.attack_suite == ("cpl @example", "cpl @update", "ig @example", "ig @update")
    assert board.scenario["sc_observe"] == ["example", "update"]
    none = by_defense(entries)["none"]["metrics"]
    assert set(none["leakage"]) == set(board.attack_suite)
    assert none["leakage"]["cpl @update"]["psnr"]["mean"] == 20.0
    assert (
        none["worst_case"]["psnr"]["mean"] == 30.0 and none["worst_case"]["psnr"]["attack"] == "cpl @example"
    )
    readme = lb.render_readme(board, entries)
    assert "cpl @example psnr ↓" in readme and "observe=[example, update]" in readme
    compact = lb.board_pivot(board, entries, compact=True)
    assert {c.metric.name for c in compact.columns} >= {"psnr"}
    assert lb.short_labels(("cpl[iterations=100] @update", "cpl[iterations=100] @example")) == {
        "cpl[iterations=100] @update": "cpl @update",
        "cpl[iterations=100] @example": "cpl @example",
    }
    # the site's threat model lists the observation points
    assert ("attacker observes", "observe=[example, update]") in site.threat_model(board, entries)


def test_other_scenario_columns_still_may_not_vary(tmp_path):
    rows = synth(_psnr(PSNR), sc_victim=[0, 1], sc_batch_size=[1, 4])
    with pytest.raises(FedbenchError, match="vary in sc_batch_size;"):
        build(tmp_path, rows)


# ------------------------------------------------------------------------------------ a real build


TINY = (
    """
[grid]
name = "tiny-victims"
seeds = 1

[grid.board]
name = "tiny-victims"
title = "digits · 2 victims · 2 observation points"
threat_model = "A curious observer reads two victims' per-example gradients and updates."

[scenario]
protocol = "fedsgd"
clients = 2
rounds = 1
batch_size = 1
lr = 0.05
train_size = 20
test_size = 20
victim = [0, 1]
observe = ["example", "update"]

"""
    + TINY_COMPONENTS
)


def test_a_real_board_with_two_victims_and_two_observation_points(tmp_path):
    from typer.testing import CliRunner

    from fedbench.cli import app

    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "tiny-victims.toml").write_text(TINY)
    root = tmp_path / "leaderboards"
    result = CliRunner().invoke(
        app, ["leaderboard", "build", "tiny-victims", "--preset-dir", str(presets), "--dir", str(root)]
    )
    assert result.exit_code == 0, result.output
    board, entries = lb.load_board(root / "tiny-victims")
    assert board.scenario["sc_victim"] == [0, 1] and board.scenario["sc_observe"] == ["example", "update"]
    assert board.attack_suite == ("idlg[iterations=2] @example", "idlg[iterations=2] @update")
    assert board.threat_model.startswith("A curious observer")
    assert board.baseline is not None and board.baseline.kind == "random image"
    assert board.cost.trainings == 2 and board.cost.attack_runs == 8
    none = by_defense(entries)["none"]
    assert len(none["run_ids"]) == 4 and none["metrics"]["worst_case"]["psnr"]["per_input"] is True
    dp = by_defense(entries)["dp-gaussian[clip=1,sigma=0.1]"]["metrics"]
    assert dp["dp_level"] and dp["accountant"] and (dp["epsilon"] is not None or dp.get("epsilon_infinite"))
    header = next(c.header for c in lb.board_pivot(board, entries).columns if c.key == "epsilon")
    assert header == f"epsilon (δ={dp['delta']:g}, {dp['dp_level']}-level, rdp) ↓"  # the accountant's name
    assert f"(accountant: {dp['accountant']})" in (root / "tiny-victims" / lb.README_FILE).read_text()
    assert lb.stale(root) == []


def test_failed_runs_are_counted_and_named_and_a_config_with_only_failures_is_still_mentioned(tmp_path):
    rows = synth(_psnr(PSNR, floor=5.1))
    for r in rows:  # one dp-gaussian seed's runs fail: training diverged
        if r["defense"].startswith("dp-gaussian") and r["seed"] == 1:
            r.update(status="failed", reason="RunFailure: training diverged: non-finite loss in round 3")
    broken = [
        dict(
            r,
            run_id="x" + r["run_id"][1:],
            defense="dp-laplace[b=0.1,clip=1]",
            status="failed",
            reason="RunFailure: boom",
        )
        for r in rows
        if r["defense"] == "none"
    ]
    _rs, board, entries = build(tmp_path, rows + broken)
    assert [f.defense for f in board.failures] == [
        "dp-gaussian[clip=1,sigma=0.1]",
        "dp-laplace[b=0.1,clip=1]",
    ]
    dpg, dpl = board.failures
    assert (dpg.failed, dpg.runs) == (2, 6) and "diverged" in dpg.reason
    assert (dpl.failed, dpl.runs) == (6, 6)
    assert "dp-laplace[b=0.1,clip=1]" not in by_defense(entries)  # no entry, but the README says why
    readme = lb.render_readme(board, entries)
    line = next(x for x in readme.splitlines() if x.startswith("Failed runs"))
    assert "`dp-gaussian[clip=1,sigma=0.1]`: 2 of 6 runs, e.g. RunFailure: training diverged" in line
    assert (
        "`dp-laplace[b=0.1,clip=1]`: 6 of 6 runs (no entry: every run failed), e.g. RunFailure: boom" in line
    )
    _rs, clean, clean_entries = build(tmp_path, synth(_psnr(PSNR, floor=5.1)), name="clean")
    assert clean.failures == () and "Failed runs" not in lb.render_readme(clean, clean_entries)
