"""Presets, patterns and overrides -> run specs; keys and run ids are stable; bad input fails early."""

from __future__ import annotations

import pytest

from fedbench.errors import FedbenchError, ParamError, SpecError, UnknownNameError
from fedbench.spec.grid import Overrides, build_grid, find_preset, list_presets
from fedbench.spec.patterns import parse_assignment, parse_pattern
from fedbench.spec.run import ComponentSpec

GOOD = """
[grid]
name = "t"
seeds = 2

[scenario]
rounds = 2
lr = [0.1, 0.05]

[[dataset]]
name = "digits"

[[model]]
name = "mlp"
params = { hidden = [[16], [8, 8]] }

[[defense]]
name = "none"

[[defense]]
name = "dpg"
params = { sigma = [0.01, 0.1], clip = 2 }
"""


def _write(tmp_path, text, name="t.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_parse_pattern():
    assert parse_pattern("dp-gaussian[sigma=[0.01,0.1],clip=1]") == (
        "dp-gaussian",
        {"sigma": [0.01, 0.1], "clip": 1},
    )
    assert parse_pattern("mlp[activation=tanh]") == ("mlp", {"activation": "tanh"})
    assert parse_pattern("none") == ("none", {})
    for bad in ("dp[sigma=1", "dp[sigma]", "[x=1]", "dp[sigma=1,sigma=2]", "dp[1x=2]", "dp[s=[1,2]"):
        with pytest.raises(SpecError):
            parse_pattern(bad)


def test_parse_assignment():
    assert parse_assignment("scenario.batch_size=4") == (["scenario", "batch_size"], 4)
    with pytest.raises(SpecError):
        parse_assignment("scenario.batch_size")


def test_expansion_is_cartesian_and_tuple_params_are_one_value(tmp_path):
    grid = build_grid(_write(tmp_path, GOOD))
    # 2 lr x 2 models x (1 none + 2 dpg) x 2 seeds
    assert len(grid.specs) == 2 * 2 * 3 * 2
    hidden = {
        s.model.params_dict["hidden"] == [16] or s.model.params_dict["hidden"] == [8, 8] for s in grid.specs
    }
    assert hidden == {True}
    labels = {s.defense.label for s in grid.specs}
    assert labels == {"none", "dp-gaussian[clip=2,sigma=0.01]", "dp-gaussian[clip=2,sigma=0.1]"}
    assert len({s.run_id for s in grid.specs}) == len(grid.specs)


def test_overrides_replace_components_and_scenario(tmp_path):
    ov = Overrides(defenses=("dp-laplace[b=[0.1,0.2]]",), sets=("scenario.lr=0.3",), seeds=1)
    grid = build_grid(_write(tmp_path, GOOD), ov)
    assert {s.defense.name for s in grid.specs} == {"dp-laplace"}
    assert {s.scenario.lr for s in grid.specs} == {0.3}
    assert {s.seed for s in grid.specs} == {0}
    assert len(grid.specs) == 2 * 2


def test_run_id_stable_and_alias_insensitive():
    a = ComponentSpec.resolve("defense", "dpg", {"sigma": 0.1})
    b = ComponentSpec.resolve("defense", "dp-gaussian", {"sigma": 0.1, "clip": 1.0})
    assert a.key() == b.key()
    c = ComponentSpec.resolve("defense", "dp-gaussian", {"sigma": 0.2})
    assert a.key() != c.key()


def test_run_id_golden():
    """The key format is part of the cache contract: a change here invalidates every cache."""
    from fedbench.plugin import Scenario
    from fedbench.spec.run import RunSpec

    spec = RunSpec(
        ComponentSpec.resolve("dataset", "digits"),
        ComponentSpec.resolve("model", "mlp"),
        ComponentSpec.resolve("defense", "none"),
        None,
        Scenario(),
        0,
        preset="x",
    )
    same = RunSpec(spec.dataset, spec.model, spec.defense, None, Scenario(), 0, preset="other preset")
    assert spec.run_id == same.run_id  # the preset is provenance, not key
    assert len(spec.run_id) == 16 and int(spec.run_id, 16) >= 0
    assert spec.utility_id != spec.run_id


def test_builtin_presets_found_and_valid():
    names = [n for n, _, _ in list_presets()]
    assert "smoke" in names and "quickstart" in names
    for name in names:
        assert build_grid(name).specs


@pytest.mark.parametrize(
    "text,err,match",
    [
        ("[grid\nname='x'", SpecError, "invalid TOML"),
        ("[grdi]\nname='x'", SpecError, r"unknown table \[grdi\]; did you mean 'grid'"),
        ("[grid]\nnaem='x'", SpecError, r"\[grid\] has unknown key 'naem'"),
        ("[[defense]]\nparams={}", SpecError, r"\[\[defense\]\] #1: needs name"),
        ("[defense]\nname='none'", SpecError, r"write \[\[defense\]\]"),
        (
            "[[dataset]]\nname='digits'\n[[model]]\nname='mlp'\n[[defense]]\nname='dp-gausian'",
            UnknownNameError,
            "did you mean 'dp-gaussian'",
        ),
        (
            "[[dataset]]\nname='digits'\n[[model]]\nname='mlp'\n[[defense]]\nname='dpg'\nparams={sigma=-1}",
            ParamError,
            r"\[\[defense\]\] #1 'dpg'.*sigma' must be >= 0",
        ),
        (
            "[[dataset]]\nname='digits'\n[[model]]\nname='mlp'\n[scenario]\nbatchsize=3",
            UnknownNameError,
            "did you mean 'batch_size'",
        ),
        ("[[dataset]]\nname='digits'\n[[model]]\nname='mlp'\n[scenario]\nclients=0", ParamError, "clients"),
        (
            "[grid]\nseeds=0\n[[dataset]]\nname='digits'\n[[model]]\nname='mlp'",
            SpecError,
            "seeds must be >= 1",
        ),
        ("[[model]]\nname='mlp'", SpecError, "no \\[\\[dataset\\]\\]"),
        # the schema (fedbench.spec.preset_schema): wrong types and unknown keys, in the file's own terms
        ("[grid]\nnaem='x'", SpecError, r"\[grid\] has unknown key 'naem'; did you mean 'name'\?"),
        ("[grid]\nname=3", SpecError, r"\[grid\] name must be a string, got 3"),
        ("grid=3", SpecError, r"\[grid\] must be a table, got 3"),
        (
            "[[model]]\nname='mlp'\nparmas={}",
            SpecError,
            r"\[\[model\]\] #1 has unknown key 'parmas'; did you",
        ),
        (
            "[[dataset]]\nname='digits'\nparams=3",
            SpecError,
            r"#1 params must be a table, e.g. params = \{ sigma",
        ),
        (
            "[[model]]\nname='mlp'\ndatasets='digits'",
            SpecError,
            r"#1 datasets must be a list of dataset names",
        ),
        (
            "[[attack]]\nname='idlg'\nadaptive=1",
            SpecError,
            r"\[\[attack\]\] #1 adaptive must be true or false",
        ),
        ("dataset=[1]", SpecError, r"\[\[dataset\]\] #1 must be a table, got 1"),
        ("reported=3", SpecError, r"\[reported\] must be an array of tables: write \[\[reported\]\]"),
    ],
)
def test_malformed_presets_name_file_and_table(tmp_path, text, err, match):
    path = _write(tmp_path, text, "bad.toml")
    with pytest.raises(err, match=match) as info:
        build_grid(path)
    assert "bad.toml" in str(info.value) and "\n" not in str(info.value)


def test_the_base_of_extends_is_checked_too(tmp_path):
    _write(tmp_path, "[grid]\nseeds = 1\n[[defense]]\nname = 'none'\nparmas = {}\n", "base.toml")
    child = _write(tmp_path, '[grid]\nextends = "base"\n', "child.toml")
    with pytest.raises(SpecError, match=r"base.toml: \[\[defense\]\] #1 has unknown key 'parmas'"):
        build_grid(child)


def test_unknown_preset_suggests():
    with pytest.raises(UnknownNameError, match="did you mean 'smoke'"):
        find_preset("smok")
    with pytest.raises(FedbenchError, match="does not exist"):
        find_preset("no/such/file.toml")


def test_extends_one_level(tmp_path):
    _write(tmp_path, GOOD, "base.toml")
    child = _write(
        tmp_path, '[grid]\nextends = "base"\nname = "child"\n[scenario]\nrounds = 3\n', "child.toml"
    )
    grid = build_grid(child)
    assert grid.name == "child"
    assert {s.scenario.rounds for s in grid.specs} == {3}
    assert {s.scenario.lr for s in grid.specs} == {0.1, 0.05}
    _write(tmp_path, '[grid]\nextends = "child"\n', "grandchild.toml")
    with pytest.raises(SpecError, match="at most one level"):
        build_grid(str(tmp_path / "grandchild.toml"))


def test_extends_merges_the_board_table_key_by_key(tmp_path):
    """A board at another batch size restates its name and title; its method (primary metric, utility
    budget, tuning) comes from the base, so it cannot fall back to a version 1 board by omission. A slice
    it declares replaces the base's."""
    board = '[grid.board]\nname = "b1"\ntitle = "B = 1"\nprimary = "reid"\nutility_budget = 5\n'
    board += "[grid.board.slice]\nseeds = 3\nvictims = 2\n"
    _write(tmp_path, GOOD.replace("[scenario]", board + "[scenario]", 1), "base.toml")
    child = '[grid]\nextends = "base"\nname = "child"\n[grid.board]\nname = "b8"\ntitle = "B = 8"\n'
    merged = build_grid(_write(tmp_path, child + "[grid.board.slice]\nseeds = 1\n", "child.toml")).board
    assert merged["name"] == "b8" and merged["title"] == "B = 8"
    assert merged["primary"] == "reid" and merged["utility_budget"] == 5
    assert merged["slice"] == {"seeds": 1}
    assert build_grid(_write(tmp_path, child, "child2.toml")).board["slice"] == {"seeds": 3, "victims": 2}


def test_bad_set_override(tmp_path):
    with pytest.raises(SpecError, match="only scenario"):
        build_grid(_write(tmp_path, GOOD), Overrides(sets=("defense.sigma=1",)))


OBSERVED = """
[grid]
name = "observed"
seeds = 2

[scenario]
protocol = "fedsgd"
clients = 2
rounds = 2
batch_size = 2
train_size = 40
test_size = 20
observe = ["step", "update"]
observe_round = [0, 1]

[[dataset]]
name = "digits"

[[model]]
name = "mlp"
params = { hidden = [8] }

[[defense]]
name = "dpg"
params = { sigma = 0.01 }

[[attack]]
name = "idlg"
params = { iterations = 2 }
"""


def test_observation_point_is_outside_the_utility_key(tmp_path):
    """Issue #16 defect 7: runs that differ only in where the attacker looks share one training."""
    grid = build_grid(_write(tmp_path, OBSERVED))
    specs = grid.specs
    assert len(specs) == 2 * 2 * 2  # seeds x observe x observe_round
    assert len({s.run_id for s in specs}) == len(specs)  # the observation point stays in the run key
    assert len({s.utility_id for s in specs}) == 2  # one training per seed
    other_victim = build_grid(_write(tmp_path, OBSERVED), Overrides(sets=("scenario.victim=1",))).specs
    assert {s.utility_id for s in other_victim} == {s.utility_id for s in specs}
    longer = build_grid(_write(tmp_path, OBSERVED), Overrides(sets=("scenario.rounds=3",))).specs
    assert not {s.utility_id for s in longer} & {s.utility_id for s in specs}  # training fields do count


def test_grid_over_observation_points_trains_once_per_seed(tmp_path, monkeypatch):
    """Issue #16 defect 7: two observation points x two rounds run one FL training per seed."""
    import fedbench.execution.runner as runner
    from fedbench.execution.cache import RunCache

    calls = []
    real = runner.compute_utility
    monkeypatch.setattr(runner, "compute_utility", lambda job: calls.append(job.spec.seed) or real(job))
    cache = RunCache(tmp_path / "cache")
    grid = build_grid(_write(tmp_path, OBSERVED))
    rows = runner.run_grid(grid.specs, cache, runner.RunContext(threads=1))
    assert [r["status"] for r in rows] == ["ok"] * len(grid.specs)
    assert sorted(calls) == [0, 1]  # one training per seed, not one per observation point
    assert cache.info().utility_entries == 2 and cache.info().attack_entries == len(grid.specs)
    by_seed = {}
    for r in rows:
        by_seed.setdefault(r["seed"], set()).add((r["utility_id"], r["test_acc"]))
    assert all(len(v) == 1 for v in by_seed.values())
    assert {(r["sc_observe"], r["sc_observe_round"]) for r in rows} == {
        (p, k) for p in ("step", "update") for k in (0, 1)
    }


BOARDED = """
[grid]
name = "b"
[grid.board]
name = "b"
{line}
[[dataset]]
name = "digits"
[[model]]
name = "mlp"
"""


@pytest.mark.parametrize(
    "line,match",
    [
        ('headlin = "psnr"', r"\[grid.board\] has unknown key 'headlin'; did you mean 'headline'\?"),
        ('budgt = "acc_drop<=2"', "did you mean 'budget'"),
        (
            'metrics = ["psnr", "ssmi"]',
            r"\[grid.board\] metrics\[1\]: unknown metric 'ssmi'; did you mean 'ssim'",
        ),
        ('headline = "psnrr"', "did you mean 'psnr'"),
        ('budget = "acc_dorp<=2"', "did you mean 'acc_drop'"),
        ('target = "psnr 8"', "write metric<=number"),
        ("metrics = 3", "metrics must be a list"),
    ],
)
def test_board_typos_fail_validation(tmp_path, line, match):
    """Issue #16 defect 13: a typo in [grid.board] fell back to a default instead of failing."""
    path = _write(tmp_path, BOARDED.format(line=line), "boarded.toml")
    with pytest.raises(SpecError, match=match) as info:
        build_grid(path)
    assert "boarded.toml" in str(info.value) and "\n" not in str(info.value)


def test_every_preset_board_is_valid():
    from fedbench.spec.grid import BOARD_KEYS

    boards = [build_grid(name).board for name, _, _ in list_presets()]
    assert any(boards) and all(set(b) <= set(BOARD_KEYS) for b in boards)


def test_requires_python_covers_tomllib():
    """Issue #16 defect 13: presets are read with the stdlib tomllib (3.11+); pyproject said 3.10."""
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    needs_tomllib = any("import tomllib" in p.read_text() for p in (root / "fedbench").rglob("*.py"))
    floor = re.fullmatch(r">=\s*3\.(\d+)", project["project"]["requires-python"].strip())
    assert floor and (int(floor.group(1)) >= 11 or not needs_tomllib)
    assert project["tool"]["ruff"]["target-version"] == f"py3{floor.group(1)}"


def test_a_label_with_a_pattern_valued_string_parses_back():
    """A string parameter holding a pattern (imprint's base model) is quoted in the label, so the label
    that boards store as the scenario's model parses back to the same component."""
    comp = ComponentSpec.resolve("model", "imprint", {"base": "fcnn[fc1_width=64,depth=2]", "bins": 8})
    assert comp.label == 'imprint[base="fcnn[fc1_width=64,depth=2]",bins=8]'
    name, params = parse_pattern(comp.label)
    assert ComponentSpec.resolve("model", name, params) == comp
    assert ComponentSpec.resolve("defense", "soteria", {"layer": "first"}).label == "soteria[layer=first]"
