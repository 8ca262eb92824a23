"""The v2 board method (design §7.1, `board_rank`/`board_table`) and `leaderboard verify|add`.

Unit tests rank synthetic entries whose answer is known; the end-to-end tests build a tiny v2 board
(FedSGD, B = 1, two seeds x two victims) once per module and verify, alter and extend copies of it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fedbench.cli import app
from fedbench.reporting.board_rank import Draws, Leakage, rank_board, worst_per_input

runner = CliRunner()


# ------------------------------------------------------------------------------ synthetic entries


def _entry(name: str, accs: list[float], reid: dict[str, list[list[int]]]) -> dict:
    """An entry with per-seed accuracy and, per attack, per seed, per-victim 0/1 re-identification."""
    seeds = list(range(len(accs)))
    per_input = {
        attack: {
            str(s): {
                "victims": list(range(len(values))),
                "counts": [1] * len(values),
                "runs": [f"{name}-{attack}-{s}-{v}" for v in range(len(values))],
                "values": {"reid": [float(x) for x in values]},
            }
            for s, values in enumerate(per_seed)
        }
        for attack, per_seed in reid.items()
    }
    per_seed = {
        a: {str(s): {"runs": rec["runs"]} for s, rec in seeds_.items()} for a, seeds_ in per_input.items()
    }
    return {
        "defense": name,
        "defense_name": name.split("[")[0],
        "seeds": seeds,
        "metrics": {"test_acc": {"mean": float(np.mean(accs)), "per_seed": accs}},
        "per_input": per_input,
        "per_seed": per_seed,
        "fedbench_version": "test",
        "date": "2026-11-27",
    }


def _rows(rng, rate: float, seeds: int = 4, inputs: int = 25) -> list[list[int]]:
    return [list((rng.random(inputs) < rate).astype(int)) for _ in range(seeds)]


def test_worst_case_is_taken_per_input_over_attacks():
    e = _entry("none", [0.9], {"a": [[1, 0, 0]], "b": [[0, 0, 1]]})
    lk = worst_per_input(e, "reid")
    assert lk.inputs[0].tolist() == [1.0, 0.0, 1.0]
    assert lk.point() == pytest.approx(2 / 3)
    # input 1 is 0 under both: a tie credits both attacks, not the first one read
    assert lk.attack[0] == [("a",), ("a", "b"), ("b",)]


def test_worst_attack_column_credits_every_tied_attack():
    """On a binary metric most inputs tie; the column must name the attacks that reach the worst case
    most often, not the alphabetically first attack of each tie (a board once showed `cpl, dlg` as its
    worst attacks while cpl re-identified 86 % and inverting-gradients 100 %)."""
    from fedbench.reporting.board_table import _worst_attacks

    e = _entry(
        "none",
        [0.9],
        {
            "a-first": [[1, 0, 1, 0]],
            "b-weak": [[0, 0, 1, 0]],
            "c-best": [[1, 1, 1, 1]],
            "d-good": [[1, 1, 0, 1]],
        },
    )
    row = rank_board([e], "reid", 5.0).rows[0]
    assert _worst_attacks(row) == "c-best, d-good"
    # two configurations of one attack stay apart by the parameters in which they differ
    e = _entry(
        "none", [0.9], {"lira[mode=offline,n=4]": [[1, 1, 0, 0]], "lira[mode=online,n=4]": [[1, 1, 1, 0]]}
    )
    assert _worst_attacks(rank_board([e], "reid", 5.0).rows[0]) == "lira[mode=online], lira[mode=offline]"


def test_ranking_follows_the_method():
    rng = np.random.default_rng(0)
    entries = [
        _entry("none", [0.90, 0.91, 0.89, 0.90], {"a": _rows(rng, 0.95)}),
        # leaks like none, costs nothing: "no protection", and never ranked above none-level leakage
        _entry("leaky[lam=5]", [0.92, 0.92, 0.91, 0.93], {"a": _rows(rng, 0.93)}),
        # protects, within the budget
        _entry("good", [0.88, 0.90, 0.87, 0.89], {"a": _rows(rng, 0.05)}),
        # protects as well: statistically tied with good
        _entry("good2", [0.89, 0.89, 0.88, 0.88], {"a": _rows(rng, 0.06)}),
        # protects perfectly but at chance accuracy: outside the 5-point budget, not ranked
        _entry("broken", [0.10, 0.11, 0.09, 0.12], {"a": _rows(rng, 0.0)}),
    ]
    ranking = rank_board(entries, "reid", 5.0)
    ranks = {r.defense: r.rank for r in ranking.rows}
    assert ranks["broken"] is None and [r.defense for r in ranking.outside] == ["broken"]
    assert ranks["good"] == ranks["good2"] == 1  # tied: neither beats the other with confidence
    assert ranks["leaky[lam=5]"] >= ranks["none"] > 1
    verdict = {r.defense: r.protection for r in ranking.rows}
    assert (
        verdict["leaky[lam=5]"] == "no protection" and verdict["good"] == "" and verdict["none"] == "baseline"
    )
    for r in ranking.rows:
        assert 0.0 <= r.low <= r.rate <= r.high <= 1.0
        assert r.leakage.n_inputs == 100
    for r in ranking.ranked:
        assert r.drop * 100 <= 5.0
        assert 0.0 <= r.same_rank <= 1.0 and r.rank_low <= r.rank_high


def test_ranking_is_deterministic_and_paired():
    rng = np.random.default_rng(1)
    rows = _rows(rng, 0.5)
    a = _entry("none", [0.9] * 4, {"x": rows})
    b = _entry("same", [0.9] * 4, {"x": rows})
    one, two = rank_board([a, b], "reid", 5.0), rank_board([a, b], "reid", 5.0)
    assert [(r.low, r.high) for r in one.rows] == [(r.low, r.high) for r in two.rows]
    # identical inputs on identical draws: the paired difference is exactly 0, a tie, "no protection"
    assert one.rows[0].rank == one.rows[1].rank == 1
    assert {r.protection for r in one.rows} == {"baseline", "no protection"}


def test_two_stage_interval_is_wider_than_a_binomial_when_seeds_differ():
    # seeds disagree (a seed's inputs share its model): 0 % on two seeds, 100 % on two
    e = _entry("none", [0.9] * 4, {"a": [[0] * 25, [0] * 25, [1] * 25, [1] * 25]})
    row = rank_board([e], "reid", 5.0).rows[0]
    assert row.rate == 0.5
    assert row.high - row.low > 0.5  # a binomial over 100 inputs would give about 0.2


def test_membership_tpr_is_na_when_non_members_cannot_resolve_the_fpr():
    e = {
        "defense": "none",
        "defense_name": "none",
        "seeds": [0, 1],
        "metrics": {"test_acc": {"mean": 0.9, "per_seed": [0.9, 0.9]}},
        "per_seed": {
            "lira": {
                str(s): {"mia_tpr_at_1pct_fpr": 0.05, "mia_tpr_at_1pct_fpr:n": 100, "mia_n_nonmembers": 100}
                for s in (0, 1)
            }
        },
    }
    lk = worst_per_input(e, "mia_tpr_at_1pct_fpr")
    assert lk.point() is None and "1000 needed" in lk.unresolved
    e["per_seed"]["lira"] = {
        str(s): {"mia_tpr_at_1pct_fpr": 0.05, "mia_tpr_at_1pct_fpr:n": 1000, "mia_n_nonmembers": 1000}
        for s in (0, 1)
    }
    lk = worst_per_input(e, "mia_tpr_at_1pct_fpr")
    assert lk.point() == pytest.approx(0.05) and lk.successes == pytest.approx(100)


def test_binomial_draws_stay_in_range():
    lk = Leakage(counts={0: (3.0, 10.0), 1: (10.0, 10.0)})
    d = Draws([0, 1], 1).rates(lk)
    assert d.min() >= 0.0 and d.max() <= 1.0


# ----------------------------------------------------------------------------------- end to end

TINY = """
[grid]
name = "tiny-v2"
description = "a tiny v2 board for the tests"
seeds = 2

[grid.board]
name = "tiny-v2"
title = "tiny v2 board"
threat_model = "Honest-but-curious server: it reads the round-0 gradient of the victim."
primary = "reid"
utility_budget = 60
threat_id = "A"
knowledge = { labels = true, defense = true }
tuning = "none: every row at its paper's default"

[scenario]
protocol = "fedsgd"
clients = 3
rounds = 2
batch_size = 1
lr = 0.1
train_size = 90
eval_every = 2
observe_round = 0
victim = [0, 1]

[[dataset]]
name = "mnist5k"

[[model]]
name = "mlp"
params = { hidden = [16] }

[[defense]]
name = "none"

[[defense]]
name = "sparsification"
params = { fraction = 0.01 }

[[attack]]
name = "inverting-gradients"
params = { iterations = 10 }
"""

PLUGIN = Path(__file__).resolve().parents[1] / "docs" / "examples" / "qsgd.py"


@pytest.fixture(scope="module")
def tiny_board(tmp_path_factory):
    base = tmp_path_factory.mktemp("v2")
    (base / "presets").mkdir()
    (base / "presets" / "tiny-v2.toml").write_text(TINY, encoding="utf-8")
    args = ["leaderboard", "build", "tiny-v2", "--preset-dir", "presets", "--dir", "boards"]
    args += ["--cache-dir", str(base / "cache"), "--threads", "1"]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(base)
        res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return base


def _copy(base: Path, tmp_path: Path) -> Path:
    shutil.copytree(base / "boards", tmp_path / "boards")
    shutil.copytree(base / "presets", tmp_path / "presets")
    return tmp_path


def test_v2_entries_keep_inputs_and_no_rank(tiny_board):
    folder = tiny_board / "boards" / "tiny-v2"
    board = json.loads((folder / "board.json").read_text())
    assert board["board_version"] == 2 and board["primary"] == "reid" and board["utility_budget"] == 60
    for path in (folder / "entries").glob("*.json"):
        e = json.loads(path.read_text())
        assert e["schema"] == 3 and "rank_stability" not in e and "rank" not in e
        rec = e["per_input"]["inverting-gradients[iterations=10]"]["0"]
        assert rec["victims"] == [0, 1] and rec["counts"] == [1, 1] and len(rec["values"]["psnr"]) == 2
    readme = (folder / "README.md").read_text()
    assert board["tuning"] and f"Tuning rule: {board['tuning']}" in readme  # the declared rule, stated
    header = next(line for line in readme.splitlines() if line.startswith("| rank"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert cells[:3] == ["rank", "defense", "reid (%) ↓"]  # the primary metric first after rank and defense
    csv = (folder / "leaderboard.csv").read_text().splitlines()
    assert csv[0].startswith("rank,defense,defense_name,within_budget,reid,reid_low,reid_high,reid_k")


def test_verify_passes_and_names_an_altered_number(tiny_board, tmp_path, monkeypatch):
    base = _copy(tiny_board, tmp_path)
    monkeypatch.chdir(base)
    res = runner.invoke(
        app, ["leaderboard", "verify", "tiny-v2", "--dir", "boards", "--sample", "2", "--rng-seed", "3"]
    )
    assert res.exit_code == 0, res.output
    assert "bit-identical" in res.output and ": pass" in res.output
    assert "[2/2] done" in res.output  # the re-runs' progress, a line per run (stderr is no terminal)
    stamp = json.loads((base / "boards" / "tiny-v2" / "board.json").read_text())["verified"]
    assert stamp["result"] == "pass" and stamp["sample"] == 2 and stamp["numbers"] > 0
    assert "leaderboard verify" in (base / "boards" / "tiny-v2" / "README.md").read_text()
    # alter one committed number: verify exits 1 and names it
    path = base / "boards" / "tiny-v2" / "entries" / "none.json"
    entry = json.loads(path.read_text())
    rec = entry["per_input"]["inverting-gradients[iterations=10]"]["1"]
    rec["values"]["psnr"][1] = 77.0
    path.write_text(json.dumps(entry, indent=1, sort_keys=True))
    res = runner.invoke(
        app, ["leaderboard", "verify", "tiny-v2", "--dir", "boards", "--run", rec["runs"][1], "--no-stamp"]
    )
    assert res.exit_code == 1, res.output
    assert "psnr[1]: committed 77.0" in res.output and rec["runs"][1] in res.output


def test_verify_rejects_bad_input(tiny_board, tmp_path, monkeypatch):
    base = _copy(tiny_board, tmp_path)
    monkeypatch.chdir(base)
    res = runner.invoke(
        app, ["leaderboard", "verify", "tiny-v2", "--dir", "boards", "--run", "0123456789abcdef"]
    )
    assert res.exit_code == 2 and "not a run of board tiny-v2" in res.output
    res = runner.invoke(app, ["leaderboard", "verify", "tiny-v2", "--dir", "boards", "--entry", "nope"])
    assert res.exit_code == 2 and "not on board" in res.output


@pytest.fixture
def forget_qsgd():
    """`add --plugin` registers example-qsgd in this process: unregister it afterwards and drop its
    module (as tests/test_docs_examples.py does), so later tests see no `example-*` plugin."""
    import sys

    from fedbench import registry

    yield
    registry.defenses.unregister("example-qsgd")
    for module in [m for m in sys.modules if m.startswith(f"fedbench_plugin_{PLUGIN.stem}_")]:
        del sys.modules[module]


def test_add_puts_a_plugin_defense_on_a_copy_without_touching_other_entries(
    tiny_board, tmp_path, monkeypatch, forget_qsgd
):
    base = _copy(tiny_board, tmp_path)
    monkeypatch.chdir(base)
    entries = base / "boards" / "tiny-v2" / "entries"
    before = {p.name: p.read_bytes() for p in entries.glob("*.json")}
    args = ["leaderboard", "add", "tiny-v2", "-D", "example-qsgd[levels=8]", "--plugin", str(PLUGIN)]
    res = runner.invoke(app, [*args, "--dir", "boards", "--cache-dir", str(tiny_board / "cache")])
    assert res.exit_code == 0, res.output
    assert "added example-qsgd[levels=8] to tiny-v2: rank" in res.output
    after = {p.name: p.read_bytes() for p in entries.glob("*.json")}
    assert set(after) == set(before) | {"example-qsgd_levels_8.json"}
    assert all(after[name] == data for name, data in before.items())  # byte-identical
    new = json.loads(after["example-qsgd_levels_8.json"])
    assert new["plugin"]["file"] == "qsgd.py" and len(new["plugin"]["digest"]) == 16
    readme = (base / "boards" / "tiny-v2" / "README.md").read_text()
    row = next(line for line in readme.splitlines() if "`example-qsgd[levels=8]`" in line)
    assert row.split("|")[1].strip().isdigit()  # ranked (the budget of 60 points admits it)
    # the same configuration again: refused, nothing written
    res = runner.invoke(app, [*args, "--dir", "boards", "--cache-dir", str(tiny_board / "cache")])
    assert res.exit_code == 2 and "already on board" in res.output


def test_v1_boards_cannot_be_verified(tmp_path):
    root = Path(__file__).resolve().parent / "golden" / "boards"  # the retired v1 leakage-types board
    res = runner.invoke(
        app, ["leaderboard", "verify", "leakage-types-mnist5k-mlp", "--dir", str(root), "--no-stamp"]
    )
    assert res.exit_code == 2 and "v1 board" in res.output


def test_load_returns_the_board_as_a_dataframe_in_rank_order(tiny_board):
    from fedbench import leaderboard
    from fedbench.errors import FedbenchError

    frame = leaderboard.load("tiny-v2", root=tiny_board / "boards")
    assert list(frame.columns[:5]) == ["rank", "defense", "defense_name", "within_budget", "reid"]
    assert set(frame["defense"]) == {"none", "sparsification[fraction=0.01]"}
    ranks = frame["rank"].dropna().tolist()
    assert ranks == sorted(ranks)
    with pytest.raises(FedbenchError, match="no board 'nope'"):
        leaderboard.load("nope", root=tiny_board / "boards")


def test_ci_verifies_one_cheap_run_of_a_committed_v2_board(tmp_path, monkeypatch):
    """The malicious-server board's fc-leakage run of `none`, seed 0 (a 30-round FCNN training and an
    analytic attack: seconds), re-run from an empty cache: every number it feeds holds."""
    repo = Path(__file__).resolve().parents[1]
    shutil.copytree(repo / "leaderboards", tmp_path / "leaderboards")
    monkeypatch.chdir(tmp_path)
    name = "malicious-server-mnist5k-fcnn"
    entry = json.loads((tmp_path / "leaderboards" / name / "entries" / "none.json").read_text())
    run = entry["per_input"]["fc-leakage"]["0"]["runs"][0]
    res = runner.invoke(app, ["leaderboard", "verify", name, "--run", run, "--no-stamp", "--threads", "1"])
    assert res.exit_code == 0, res.output
    assert ": pass" in res.output and "numbers from 1 runs" in res.output


def test_add_an_external_attack_to_every_row_it_applies_to(tiny_board, tmp_path, monkeypatch):
    """`add -a` (issue 28): the attack runs on the cached trainings of every row, each entry gains its
    per-input values, the board records it as external, and verify re-runs its runs too."""
    base = _copy(tiny_board, tmp_path)
    monkeypatch.chdir(base)
    cache = ["--dir", "boards", "--cache-dir", str(tiny_board / "cache")]
    res = runner.invoke(app, ["leaderboard", "add", "tiny-v2", "-a", "fc-leakage", *cache])
    assert res.exit_code == 0, res.output
    assert "evaluated fc-leakage on 2 row(s) of tiny-v2" in res.output
    folder = base / "boards" / "tiny-v2"
    board = json.loads((folder / "board.json").read_text())
    assert board["attack_suite"][-1] == "fc-leakage"
    assert [x["attack"] for x in board["external_attacks"]] == ["fc-leakage"]
    runs = []
    for path in (folder / "entries").glob("*.json"):
        e = json.loads(path.read_text())
        assert set(e["per_input"]) == {"inverting-gradients[iterations=10]", "fc-leakage"}
        assert e["attack_suite"] == board["attack_suite"]
        runs += e["per_seed"]["fc-leakage"]["0"]["runs"]
    # fc-leakage recovers the undefended MLP's input exactly: none's worst case is every input
    none = json.loads((folder / "entries" / "none.json").read_text())
    assert none["per_input"]["fc-leakage"]["0"]["values"]["reid"] == [1.0, 1.0]
    assert "fc-leakage" in (folder / "README.md").read_text()
    res = runner.invoke(app, ["leaderboard", "verify", "tiny-v2", "--dir", "boards", "--run", runs[0]])
    assert res.exit_code == 0, res.output
    # again: already in the suite; an attack that applies to no row; -D with -a
    for args, message in (
        (["-a", "fc-leakage"], "already in board tiny-v2's attack suite"),
        (["-a", "loda-adaptive"], "applies to no pair"),
        (["-a", "dlg", "-D", "none"], "not both or neither"),
    ):
        res = runner.invoke(app, ["leaderboard", "add", "tiny-v2", *args, *cache])
        assert res.exit_code == 2 and message in res.output, res.output


def test_budget_check_reruns_with_doubled_budgets_and_records_it(tiny_board, tmp_path, monkeypatch):
    """`budget-check` (issue 28): the suite's optimisation attacks at 2x their iterations on none and
    the rank-1 rows; each row's rate on the same seeds before and after; stamped into board.json and
    the README."""
    base = _copy(tiny_board, tmp_path)
    monkeypatch.chdir(base)
    args = ["leaderboard", "budget-check", "tiny-v2", "--dir", "boards", "--seeds", "1"]
    res = runner.invoke(app, [*args, "--cache-dir", str(tiny_board / "cache")])
    assert res.exit_code in (0, 1), res.output
    folder = base / "boards" / "tiny-v2"
    check = json.loads((folder / "board.json").read_text())["budget_check"]
    assert check["factor"] == 2 and check["seeds"] == [0]
    assert check["attacks"] == ["inverting-gradients[iterations=10]"]
    rows = {r["defense"]: r for r in check["rows"]}
    assert "none" in rows and all(0.0 <= r["doubled"] <= 1.0 for r in rows.values())
    assert check["result"] == ("pass" if res.exit_code == 0 else "fail")
    assert all(
        r["passed"]
        == (abs(r["doubled"] - r["rate"]) < (r["high"] - r["low"]) / 2 or r["doubled"] == r["rate"])
        for r in rows.values()
    )
    readme = (folder / "README.md").read_text()
    assert "## Attack budgets" in readme and "inverting-gradients[iterations=10] multiplied by 2" in readme
    res = runner.invoke(app, [*args, "--entry", "nosuch", "--cache-dir", str(tiny_board / "cache")])
    assert res.exit_code == 2 and "--entry 'nosuch': not on board" in res.output


def test_budget_check_ceiling_is_one_sided():
    """A row whose every input is already re-identified cannot leak more with more budget: it is at the
    ceiling on exactly the seeds where all its inputs are at 1.0, and only there."""
    from fedbench.reporting import budget_check as bc

    full = _entry("none", [0.9, 0.9], {"a": [[1, 1, 1], [1, 0, 1]], "b": [[0, 1, 0], [0, 0, 1]]})
    row = rank_board([full], "reid", 5.0).rows[0]
    check = bc.at_ceiling(row, "reid", [0])
    assert check is not None and check.ceiling and check.passed and check.rate == check.doubled == 1.0
    assert bc.at_ceiling(row, "reid", [0, 1]) is None  # seed 1's second input is not re-identified
    assert bc.at_ceiling(row, "reid", [1]) is None
    assert bc.leakage_ceiling("reid") == 1.0 and bc.leakage_ceiling("mse") == 0.0
    record = {"date": "d", "factor": 2, "seeds": [0], "attacks": ["a"], "result": "pass"}
    record["rows"] = [{"defense": "none", "rate": 1.0, "doubled": 1.0, "low": 1.0, "high": 1.0}]
    record["rows"][0] |= {"passed": True, "ceiling": True}
    assert "no attack was re-run" in bc.note(record)  # every row at the ceiling
    record["rows"].append(
        {"defense": "x", "rate": 0.5, "doubled": 0.5, "low": 0.4, "high": 0.6, "passed": True}
    )
    assert "`none` 100.0 % (at the ceiling" in bc.note(record) and "`x` 50.0 % → 50.0 %" in bc.note(record)


def test_budget_check_does_not_rerun_rows_at_the_ceiling(tiny_board, tmp_path, monkeypatch):
    """With every checked input of `none` re-identified, the check records the ceiling and runs
    nothing (running would only measure the attacks' noise)."""
    from fedbench.cli import budget_check_cmd

    base = _copy(tiny_board, tmp_path)
    monkeypatch.chdir(base)
    path = base / "boards" / "tiny-v2" / "entries" / "none.json"
    entry = json.loads(path.read_text())
    for seeds in entry["per_input"].values():
        for rec in seeds.values():
            rec["values"]["reid"] = [1.0] * len(rec["values"]["reid"])
    path.write_text(json.dumps(entry))

    def no_runs(*args, **kwargs):
        raise AssertionError("a row at the ceiling was re-run")

    monkeypatch.setattr(budget_check_cmd, "_run_specs", no_runs)
    args = ["leaderboard", "budget-check", "tiny-v2", "--dir", "boards", "--seeds", "1", "--entry", "none"]
    res = runner.invoke(app, [*args, "--cache-dir", str(tmp_path / "empty-cache")])
    assert res.exit_code == 0, res.output
    assert "at the ceiling" in res.output
    check = json.loads((base / "boards" / "tiny-v2" / "board.json").read_text())["budget_check"]
    assert check["rows"][0]["ceiling"] is True and check["result"] == "pass"
    assert "no attack was re-run" in (base / "boards" / "tiny-v2" / "README.md").read_text()


def test_describe_refreshes_the_words_and_refuses_what_moves_numbers(tiny_board, tmp_path, monkeypatch):
    """`leaderboard describe`: a new tuning rule or threat model in the preset reaches board.json and
    the README without a run; a changed utility budget is refused (exit 2, nothing written)."""
    base = _copy(tiny_board, tmp_path)
    monkeypatch.chdir(base)
    folder = base / "boards" / "tiny-v2"
    args = ["leaderboard", "describe", "tiny-v2", "--dir", "boards", "--preset-dir", "presets"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0 and "already" in res.output, res.output
    preset = base / "presets" / "tiny-v2.toml"
    text = preset.read_text()
    preset.write_text(
        text.replace('tuning = "none: every row at its paper\'s default"', 'tuning = "clip by sweep X"')
    )
    entries = {p.name: p.read_text() for p in (folder / "entries").glob("*.json")}
    res = runner.invoke(app, args)
    assert res.exit_code == 0 and "tuning refreshed" in res.output, res.output
    assert json.loads((folder / "board.json").read_text())["tuning"] == "clip by sweep X"
    assert "Tuning rule: clip by sweep X" in (folder / "README.md").read_text()
    assert {p.name: p.read_text() for p in (folder / "entries").glob("*.json")} == entries
    before = (folder / "board.json").read_text()
    preset.write_text(preset.read_text().replace("utility_budget = 60", "utility_budget = 5"))
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "utility_budget" in res.output and "rebuild" in res.output, res.output
    assert (folder / "board.json").read_text() == before
    preset.write_text(text.replace("fraction = 0.01", "fraction = 0.02"))  # other runs, same words
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "not in preset" in res.output and "rebuild" in res.output, res.output
    assert (folder / "board.json").read_text() == before
    res = runner.invoke(app, ["leaderboard", "describe", "no-such", "--dir", "boards"])
    assert res.exit_code == 2 and "no-such" in res.output


def test_audit_stores_each_dp_rows_one_run_bound(tiny_board, tmp_path, monkeypatch):
    """`leaderboard audit` (issue 28): a board without a DP row is a usage error; with one (added by
    `add -D`), its one-run bound, the method and the formal epsilon go into its entry and the README."""
    base = _copy(tiny_board, tmp_path)
    monkeypatch.chdir(base)
    cache = ["--dir", "boards", "--cache-dir", str(tiny_board / "cache")]
    res = runner.invoke(app, ["leaderboard", "audit", "tiny-v2", *cache])
    assert res.exit_code == 2 and "has no DP row" in res.output, res.output
    res = runner.invoke(app, ["leaderboard", "add", "tiny-v2", "-D", "dp-gaussian[sigma=0.5,clip=1]", *cache])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["leaderboard", "audit", "tiny-v2", "--canaries", "40", *cache])
    assert res.exit_code in (0, 1), res.output
    entry = json.loads(
        (base / "boards" / "tiny-v2" / "entries" / "dp-gaussian_clip_1_sigma_0.5.json").read_text()
    )
    audit = entry["metrics"]["one_run_audit"]
    assert audit["formal_eps"] == pytest.approx(entry["metrics"]["epsilon"]) and audit["confidence"] == 0.95
    assert 0.0 <= audit["eps_lower"] and "Steinke" in audit["method"] and "m=40" in audit["method"]
    assert (res.exit_code == 1) == (audit["eps_lower"] > audit["formal_eps"])
    assert (
        "Empirical epsilon (`fedbench leaderboard audit`"
        in (base / "boards" / "tiny-v2" / "README.md").read_text()
    )


def test_the_floor_note_counts_the_chance_hits_of_the_worst_case_over_the_suite():
    """A defended row whose reconstructions are noise still re-identifies by chance, and the worst case
    per input over k attacks adds the chances: 7 guesses at a 1.7 % floor give 11.3 %, the rate the
    leakage-update board's Fed-CDP rows show with a median PSNR of 10 dB."""
    from fedbench.reporting.board_table import attacks_per_input, suite_floor, suite_floor_note

    # a row meets every plain attack and one adaptive attack (its own defense's)
    assert attacks_per_input(["dlg", "idlg", "soteria-adaptive[iterations=200]", "noise-aware"]) == 3
    assert attacks_per_input(["dlg", "idlg"]) == 2
    assert suite_floor(0.017, 7) == pytest.approx(1 - 0.983**7)
    assert round(100 * suite_floor(0.017, 7), 1) == 11.3
    assert suite_floor(0.0, 5) == 0.0 and suite_floor(1.0, 3) == 1.0
    assert "11.3 % of the inputs" in suite_floor_note(0.017, 7)
    assert suite_floor_note(0.02, 1) == ""  # one attack: the floor itself says it


def test_an_attribute_boards_floor_is_the_majority_guess_without_the_suites_chance_hits():
    """An attribute board ranks by asr, the worst attack chosen on held-out seeds from per-seed counts
    (k of n victims); its floor is always answering the most common class (asr_majority), and no chance
    hits add up, since no worst case is taken per input."""
    from fedbench.reporting.board_table import FLOOR_OF, floor_note

    def entry(name, accs, asr):
        per_seed = {
            attack: {
                str(s): {"asr": rate, "asr:n": 64, "asr_majority": 0.85, "runs": [f"{name}-{attack}-{s}"]}
                for s, rate in enumerate(rates)
            }
            for attack, rates in asr.items()
        }
        return {**_entry(name, accs, {}), "per_input": {}, "per_seed": per_seed}

    entries = [
        entry("none", [0.85, 0.84, 0.85], {"svm": [0.92, 0.94, 0.93], "rf": [0.90, 0.91, 0.92]}),
        entry("dp[eps=8]", [0.84, 0.83, 0.84], {"svm": [0.86, 0.85, 0.86], "rf": [0.85, 0.86, 0.85]}),
    ]
    ranking = rank_board(entries, "asr", 3.0, FLOOR_OF["asr"])
    assert ranking.floor == pytest.approx(0.85)
    none = next(r for r in ranking.rows if r.defense == "none")
    assert none.leakage.counts and not none.leakage.inputs  # per-seed counts, worst attack held out
    note = floor_note(
        "asr", ranking, ["attribute-inference[adversary=svm]", "attribute-inference[adversary=rf]"]
    )
    assert "always answering the attribute's most common class) scores 85.0 %" in note
    assert "chance hits" not in note
    # a per-input board keeps the chance-hit sentence
    reid = [_entry("none", [0.9], {"a": [[1, 0, 1, 0]], "b": [[0, 0, 1, 1]]})]
    for e in reid:
        for seed in e["per_input"]["a"].values():
            seed["values"]["reid_floor"] = [0.02] * 4
    note = floor_note("reid", rank_board(reid, "reid", 5.0, FLOOR_OF["reid"]), ["a", "b"])
    assert "class-mean image" in note and "2 attacks adds their chance hits" in note
