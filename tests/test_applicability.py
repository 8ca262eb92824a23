"""Grids pair attacks only where they apply (issue 28): adaptive attacks with their own defenses, attacks
with the observation points they read; `[grid.suite]` adds every applicable registered attack; what a
grid leaves out is listed, and an attack named on the command line that applies nowhere is an error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
from typer.testing import CliRunner

from fedbench import registry
from fedbench.attacks.inverting_gradients import InvertingGradients
from fedbench.cli import app
from fedbench.errors import SpecError, UnknownNameError
from fedbench.spec.applicability import MALICIOUS_SERVER, adaptive_attacks, adapts_to, threat
from fedbench.spec.grid import Overrides, build_grid

BASE = """
[grid]
name = "t"
{grid}

[scenario]
protocol = "fedsgd"
clients = 4
rounds = 1
batch_size = 1
train_size = 40
{scenario}

[[dataset]]
name = "digits"

[[model]]
name = "mlp"
params = {{ hidden = [16] }}

[[defense]]
name = "none"

[[defense]]
name = "soteria"
params = {{ prune = 0.5 }}

{attacks}
"""


def _preset(tmp_path, grid="", scenario="", attacks='[[attack]]\nname = "dlg"'):
    path = tmp_path / "t.toml"
    path.write_text(BASE.format(grid=grid, scenario=scenario, attacks=attacks))
    return str(path)


@pytest.fixture
def soteria_aware():
    """A test attack that declares it adapts to Soteria (a real one: IG under another name)."""

    @registry.register_attack("test-soteria-aware")
    class SoteriaAware(InvertingGradients):
        summary = "test: IG declared as Soteria's adaptive attack"
        adapts_to: ClassVar[tuple[str, ...]] = ("soteria",)

        @dataclass(frozen=True)
        class Params(InvertingGradients.Params):
            pass

    yield "test-soteria-aware"
    registry.attacks.unregister("test-soteria-aware")


def test_declarations_of_the_shipped_attacks():
    assert adapts_to("loda-adaptive") == {"loda"}
    assert adapts_to("mixup-decode") == {"mixup", "instahide"}
    assert adapts_to("dlg") == frozenset()
    assert adaptive_attacks("loda") == ("loda-adaptive",)
    assert adaptive_attacks("none") == ()
    assert threat("trap-weights") == MALICIOUS_SERVER and threat("sdan-poisoning") == MALICIOUS_SERVER
    assert threat("dlg") == "honest" and threat("fc-leakage") == "honest"


def test_an_adaptive_attack_runs_only_against_its_defense(tmp_path, soteria_aware):
    attacks = '[[attack]]\nname = "dlg"\nadaptive = true\n'
    grid = build_grid(_preset(tmp_path, attacks=attacks))
    pairs = {(s.attack.name, s.defense.name) for s in grid.specs}
    # the test attack and fedbench's own soteria-adaptive both adapt to Soteria, and only to it
    assert pairs == {
        ("dlg", "none"),
        ("dlg", "soteria"),
        ("soteria-adaptive", "soteria"),
        (soteria_aware, "soteria"),
    }
    # named in a block of its own, its pair with `none` is left out and listed, not run
    attacks = f'[[attack]]\nname = "dlg"\n\n[[attack]]\nname = "{soteria_aware}"\n'
    grid = build_grid(_preset(tmp_path, attacks=attacks))
    assert (soteria_aware, "none") not in {(s.attack.name, s.defense.name) for s in grid.specs}
    assert grid.skipped == ((soteria_aware, "none", f"{soteria_aware} adapts to soteria only"),)


def test_a_named_attack_that_applies_to_no_pair_is_an_error(tmp_path):
    path = _preset(tmp_path)
    with pytest.raises(SpecError, match="-a loda-adaptive applies to no pair of this grid"):
        build_grid(path, Overrides(attacks=("loda-adaptive",)))
    # with one applicable pair left, the other is listed and the grid runs
    grid = build_grid(path, Overrides(attacks=("loda-adaptive",), defenses=("none", "loda[steps=5]")))
    assert [s.defense.name for s in grid.specs] == ["loda"]
    assert [s[:2] for s in grid.skipped] == [("loda-adaptive", "none")]
    res = CliRunner().invoke(app, ["run", path, "-a", "loda-adaptive", "--dry-run"])
    assert res.exit_code == 2 and "applies to no pair" in res.output


def test_an_observation_point_the_attack_cannot_read_is_left_out(tmp_path):
    path = _preset(tmp_path, scenario='observe = "model"', attacks='[[attack]]\nname = "mia-loss"')
    with pytest.raises(SpecError, match="needs one of the observations"):
        build_grid(path, Overrides(attacks=("ig",)))
    res = CliRunner().invoke(app, ["run", path, "-a", "ig", "-a", "mia-loss", "--dry-run"])
    assert res.exit_code == 2 and "-a inverting-gradients applies to no pair" in res.output


def test_the_suite_takes_every_applicable_attack_of_the_named_family_and_threat(tmp_path):
    suite = '[grid.suite]\nexclude = { cpl = "too slow for this test" }'
    grid = build_grid(_preset(tmp_path, grid=suite))
    names = {s.attack.name for s in grid.specs}
    assert {"dlg", "idlg", "inverting-gradients", "fc-leakage"} <= names
    assert "cpl" not in names and grid.excluded == (("cpl", "too slow for this test"),)
    # another family, another threat model, an adaptive attack whose defense is not in the grid: out
    assert not names & {"mia-loss", "attribute-inference", "trap-weights", "sdan-poisoning", "loda-adaptive"}
    # a grid with LODA gets LODA's adaptive attack, against LODA only
    with_loda = BASE.replace('name = "soteria"', 'name = "loda"').replace("prune = 0.5", "steps = 5")
    path = tmp_path / "loda.toml"
    path.write_text(with_loda.format(grid=suite, scenario="", attacks='[[attack]]\nname = "dlg"'))
    grid = build_grid(str(path))
    assert {s.defense.name for s in grid.specs if s.attack.name == "loda-adaptive"} == {"loda"}


def test_the_suite_follows_the_named_attacks_threat_model(tmp_path):
    grid = build_grid(_preset(tmp_path, grid="[grid.suite]", attacks='[[attack]]\nname = "trap-weights"'))
    names = {s.attack.name for s in grid.specs}
    assert "sdan-poisoning" in names and "dlg" not in names


def test_suite_errors_name_the_input(tmp_path):
    with pytest.raises(UnknownNameError, match=r"\[grid.suite\] exclude"):
        build_grid(_preset(tmp_path, grid='[grid.suite]\nexclude = { nosuch = "x" }'))
    with pytest.raises(SpecError, match="needs at least one"):
        build_grid(_preset(tmp_path, grid="[grid.suite]", attacks=""))
    with pytest.raises(SpecError, match="include"):
        build_grid(_preset(tmp_path, grid='[grid.suite]\ninclude = "all"'))


def test_the_dry_run_lists_what_the_grid_left_out(tmp_path, soteria_aware):
    attacks = f'[[attack]]\nname = "dlg"\n\n[[attack]]\nname = "{soteria_aware}"\n'
    path = _preset(tmp_path, grid='[grid.suite]\nexclude = { cpl = "slow" }', attacks=attacks)
    res = CliRunner().invoke(app, ["run", path, "--dry-run"])
    assert res.exit_code == 0, res.output
    assert f"skipped {soteria_aware} x none: {soteria_aware} adapts to soteria only" in res.output
    assert "excluded cpl: slow" in res.output


def test_an_attack_block_may_run_against_some_defenses_only(tmp_path):
    attacks = '[[attack]]\nname = "dlg"\n\n[[attack]]\nname = "idlg"\ndefenses = ["soteria"]\n'
    grid = build_grid(_preset(tmp_path, attacks=attacks))
    pairs = {(s.attack.name, s.defense.name) for s in grid.specs}
    assert pairs == {("dlg", "none"), ("dlg", "soteria"), ("idlg", "soteria")}
    with pytest.raises(SpecError, match="defenses"):
        build_grid(_preset(tmp_path, attacks='[[attack]]\nname = "dlg"\ndefenses = "none"\n'))
