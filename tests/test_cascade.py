"""The attack cascade (`[grid.suite] cascade`, `fedbench.execution.cascade`): order, narrowing, skipping,
and a board built with it whose primary equals the worst case over the suite on every input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedbench.cli import app
from fedbench.errors import SpecError
from fedbench.execution.cascade import Cascade, cascade_skipped
from fedbench.execution.record import RunRecord, base_columns
from fedbench.spec.grid import Overrides, build_grid

runner = CliRunner()

PRESET = """
[grid]
name = "tiny-cascade"
description = "a tiny cascaded board for the tests"
seeds = {seeds}

[grid.board]
name = "tiny-cascade"
title = "tiny cascaded board"
threat_model = "Honest-but-curious server: it reads the round-0 gradient of the victims."
primary = "reid"
utility_budget = 60
tuning = "none: every row at its paper's default"

[grid.suite]
include = "applicable"
cascade = {cascade}
exclude = {{ cpl = "slow", dlg = "slow", idlg = "slow" }}

[scenario]
protocol = "fedsgd"
clients = 3
rounds = 2
batch_size = 1
lr = 0.1
train_size = 90
eval_every = 2
observe_round = 0
victims = 3

[[dataset]]
name = "mnist5k"

[[model]]
name = "mlp"
params = {{ hidden = [16] }}

[[defense]]
name = "none"

[[defense]]
name = "dp-gaussian"
params = {{ sigma = [0.001, 0.03], clip = 1.0 }}

[[defense]]
name = "dp-gaussian"
params = {{ sigma = 10.0, clip = 1.0 }}

[[attack]]
name = "inverting-gradients"
params = {{ iterations = 10 }}
adaptive = true  # noise-aware against dp-gaussian, after the cascade's named attacks
"""


def _write(tmp_path: Path, seeds: int = 1, cascade: str = '["fc-leakage", "inverting-gradients"]') -> Path:
    path = tmp_path / "tiny-cascade.toml"
    path.write_text(PRESET.format(seeds=seeds, cascade=cascade), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------ the preset


def test_grid_reads_the_cascade_and_checks_it(tmp_path):
    grid = build_grid(_write(tmp_path))
    assert grid.cascade == Cascade(("fc-leakage", "inverting-gradients"), "reid")
    assert build_grid(_write(tmp_path, cascade="[]")).cascade is None
    # an attack named on the command line replaces the suite: no cascade to run
    assert build_grid(_write(tmp_path), Overrides(attacks=("inverting-gradients",))).cascade is None
    with pytest.raises(SpecError, match="'dlg', not an attack of this grid"):
        build_grid(_write(tmp_path, cascade='["dlg"]'))
    with pytest.raises(SpecError, match="lists an attack twice"):
        build_grid(_write(tmp_path, cascade='["fc-leakage", "fc-leakage"]'))
    text = _write(tmp_path).read_text().replace('primary = "reid"', 'primary = "psnr"')
    (tmp_path / "psnr.toml").write_text(text, encoding="utf-8")
    with pytest.raises(SpecError, match="primary to be a rate per input"):
        build_grid(tmp_path / "psnr.toml")


def test_order_named_first_then_plain_then_adaptive(tmp_path):
    grid = build_grid(_write(tmp_path, cascade='["fc-leakage"]'))
    c = grid.cascade
    specs = [s for s in grid.specs if s.defense.label == "dp-gaussian[clip=1,sigma=10]"]
    grid_order = ["inverting-gradients", "noise-aware", "fc-leakage"]
    assert [s.attack.name for s in specs] == grid_order
    names = [specs[i].attack.name for i in c.sort_group(range(len(specs)), specs)]
    assert names == ["fc-leakage", "inverting-gradients", "noise-aware"]


# ------------------------------------------------------------------------------------- narrowing


def _record(spec, reid: list[float] | None, status: str = "ok") -> RunRecord:
    columns = {**base_columns(spec), "status": status, "from_cache": False, "reason": ""}
    return RunRecord(columns, per_image=None if reid is None else {"reid": reid, "psnr": [1.0] * len(reid)})


def test_a_victim_is_done_only_when_all_its_inputs_are_reidentified(tmp_path):
    grid = build_grid(_write(tmp_path))
    c = grid.cascade
    spec = next(s for s in grid.specs if s.defense.name == "dp-gaussian" and s.attack.name == "fc-leakage")
    assert spec.victim_clients == (0, 1, 2)
    assert c.done_victims(spec, _record(spec, [1.0, 0.0, 1.0])) == {0, 2}
    # two inputs per victim (B = 2): victim 1 has one input left, so it is not done
    assert c.done_victims(spec, _record(spec, [1, 1, 1, 0, 0, 0])) == {0}
    assert c.done_victims(spec, _record(spec, [1.0, 1.0])) == set()  # not one value per input: no claim
    assert c.done_victims(spec, _record(spec, [1.0, 1.0, 1.0], status="failed")) == set()
    assert c.done_victims(spec, _record(spec, None)) == set()
    later = next(s for s in grid.specs if s.defense.name == "dp-gaussian" and s.attack.name != "fc-leakage")
    assert c.left(later, [(spec, _record(spec, [1.0, 0.0, 1.0]))]) == (1,)
    # a run that looked at another round does not narrow this one
    other = spec.__class__(
        spec.dataset, spec.model, spec.defense, spec.attack, spec.scenario.replace(observe_round=1), spec.seed
    ).with_victims((0, 1, 2))
    assert c.left(later, [(other, _record(other, [1.0, 1.0, 1.0]))]) == (0, 1, 2)
    none = next(s for s in grid.specs if s.defense.name == "none")
    assert not c.narrows(none) and c.narrows(later)


def test_run_grid_narrows_then_skips_and_keeps_none_whole(tmp_path, monkeypatch):
    from fedbench.execution import runner as rn
    from fedbench.execution.cache import RunCache
    from fedbench.execution.runner import RunContext, run_grid

    grid = build_grid(_write(tmp_path))
    broken = {  # (defense, attack) -> victims it re-identifies
        "fc-leakage": {1},
        "inverting-gradients": {0, 2},
    }
    ran = []

    def fake_execute(spec, cache, ctx, before=None):
        ran.append((spec.defense.label, spec.attack.name if spec.attack else "", spec.victim_clients))
        hits = broken.get(spec.attack.name if spec.attack else "", set())
        return _record(spec, [1.0 if v in hits else 0.0 for v in spec.victim_clients])

    monkeypatch.setattr(rn, "execute", fake_execute)
    specs = list(grid.specs)
    records = run_grid(specs, RunCache(tmp_path / "cache"), RunContext(threads=1), cascade=grid.cascade)
    by = {(r["defense"], r["attack_name"]): r for r in records}
    defended = "dp-gaussian[clip=1,sigma=10]"
    covered = {(d, a): v for d, a, v in ran}
    assert covered[(defended, "fc-leakage")] == (0, 1, 2)
    assert covered[(defended, "inverting-gradients")] == (0, 2)  # victim 1 was re-identified before
    assert (defended, "noise-aware") not in covered  # nothing left: not run
    skipped = by[(defended, "noise-aware")]
    assert cascade_skipped(skipped) and "victims 0, 1, 2" in skipped["reason"]
    assert covered[("none", "inverting-gradients")] == (0, 1, 2)  # none: every attack on every input
    # the caller's list holds the specs the records are of
    assert {s.run_id for s in specs} >= {r.run_id for r in records if r.status == "ok"}


def test_the_scheduler_runs_prepared_runs_and_ends_skipped_ones_unrun(tmp_path):
    from fedbench.execution import scheduler

    grid = build_grid(_write(tmp_path))
    specs = list(grid.specs)[:3]
    submitted, ended = [], []

    class Workers:
        capacity = 2

        def __init__(self):
            self.flight = []

        def submit(self, spec, alone):
            submitted.append(spec)
            self.flight.append(len(submitted) - 1)
            return len(submitted) - 1

        def wait(self, handles):
            return [handles[0]]

        def outcome(self, handle):
            return _record(submitted[handle], [0.0] * len(submitted[handle].victim_clients))

        def cancel(self, handles):
            pass

    narrowed = specs[1].with_victims((2,))

    def prepare(i):
        if i == 1:
            specs[1] = narrowed
        if i == 2:
            return _record(specs[2], None, status="skipped")
        return None

    scheduler.schedule(specs, [[0, 1, 2]], Workers(), lambda i, r: ended.append(i) or False, prepare)
    assert ended == [0, 1, 2] and submitted == [specs[0], narrowed]


# ------------------------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def cascaded_board(tmp_path_factory):
    base = tmp_path_factory.mktemp("cascade")
    (base / "presets").mkdir()
    _write(base / "presets", seeds=2)
    args = ["leaderboard", "build", "tiny-cascade", "--preset-dir", "presets", "--dir", "boards"]
    args += ["--cache-dir", str(base / "cache"), "--threads", "1"]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(base)
        res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return base


def _entries(base: Path) -> dict[str, dict]:
    folder = base / "boards" / "tiny-cascade" / "entries"
    return {e["defense"]: e for e in (json.loads(p.read_text()) for p in folder.glob("*.json"))}


def test_a_cascaded_board_covers_every_input_once_and_says_how(cascaded_board):
    from fedbench.reporting.board_rank import worst_per_input

    folder = cascaded_board / "boards" / "tiny-cascade"
    board = json.loads((folder / "board.json").read_text())
    assert board["cascade"] == ["fc-leakage", "inverting-gradients"]
    assert board["build_wall"]["from_empty"]  # the runs the cascade skipped were not read from a cache
    grid = build_grid(cascaded_board / "presets" / "tiny-cascade.toml")
    assert set(board["attack_suite"]) == {s.attack.label for s in grid.specs}  # skipped attacks included
    assert "Attack cascade (AutoAttack's evaluation order)" in (folder / "README.md").read_text()
    for defense, e in _entries(cascaded_board).items():
        leak = worst_per_input(e, "reid")
        assert sorted(leak.inputs) == [0, 1] and all(len(v) == 3 for v in leak.inputs.values()), defense
        first = e["per_input"]["fc-leakage"]
        for attack, seeds in e["per_input"].items():
            for seed, rec in seeds.items():
                victims = [v for cell in rec["victims"] for v in (cell if isinstance(cell, list) else [cell])]
                if defense == "none" or attack == "fc-leakage":
                    assert victims == [0, 1, 2]
                    continue
                # a later attack covers exactly the victims fc-leakage did not re-identify
                left = [v for v, hit in zip([0, 1, 2], first[seed]["values"]["reid"], strict=True) if hit < 1]
                assert set(victims) <= set(left), (defense, attack, seed)


def test_verify_reruns_narrowed_runs(cascaded_board, tmp_path, monkeypatch):
    shutil.copytree(cascaded_board / "boards", tmp_path / "boards")
    shutil.copytree(cascaded_board / "presets", tmp_path / "presets")
    monkeypatch.chdir(tmp_path)
    narrowed = [
        run
        for e in _entries(tmp_path).values()
        for attack, seeds in e["per_input"].items()
        for rec in seeds.values()
        for run, victims in zip(rec["runs"], rec["victims"], strict=True)
        if victims != [0, 1, 2]
    ]
    if not narrowed:
        pytest.skip("no run was narrowed on this CPU (every victim or none re-identified first)")
    args = ["leaderboard", "verify", "tiny-cascade", "--dir", "boards", "--preset-dir", "presets"]
    res = runner.invoke(app, [*args, "--run", narrowed[0], "--threads", "1", "--no-stamp"])
    assert res.exit_code == 0, res.output
    assert ": pass" in res.output


def test_a_rebuild_from_the_cache_keeps_the_wall_record(cascaded_board, tmp_path, monkeypatch):
    for part in ("boards", "presets", "cache"):
        shutil.copytree(cascaded_board / part, tmp_path / part)
    monkeypatch.chdir(tmp_path)
    wall = json.loads((tmp_path / "boards" / "tiny-cascade" / "board.json").read_text())["build_wall"]
    args = ["leaderboard", "build", "tiny-cascade", "--preset-dir", "presets", "--dir", "boards"]
    res = runner.invoke(app, [*args, "--cache-dir", str(tmp_path / "cache"), "--threads", "1"])
    assert res.exit_code == 0, res.output
    again = json.loads((tmp_path / "boards" / "tiny-cascade" / "board.json").read_text())["build_wall"]
    assert again == wall  # the skipped runs were decided again, nothing was computed: nothing measured
