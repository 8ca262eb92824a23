"""Presets, patterns and overrides -> run specs; keys and run ids are stable; bad input fails early."""

from __future__ import annotations

import pytest

from fedbench.errors import FedbenchError, ParamError, SpecError, UnknownNameError
from fedbench.grid import Overrides, build_grid, find_preset, list_presets
from fedbench.patterns import parse_assignment, parse_pattern
from fedbench.spec import ComponentSpec

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
    from fedbench.api import Scenario
    from fedbench.spec import RunSpec

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
    ],
)
def test_malformed_presets_name_file_and_table(tmp_path, text, err, match):
    path = _write(tmp_path, text, "bad.toml")
    with pytest.raises(err, match=match) as info:
        build_grid(path)
    assert "bad.toml" in str(info.value)


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


def test_bad_set_override(tmp_path):
    with pytest.raises(SpecError, match="only scenario"):
        build_grid(_write(tmp_path, GOOD), Overrides(sets=("defense.sigma=1",)))
