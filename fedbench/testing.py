"""Contract checks for plugins: run one end to end on a tiny offline scenario and assert what fedbench
relies on. fedbench's registry test matrix calls `check_plugin` for every attack and defense; a plugin
author calls it from their own pytest suite:

    from fedbench.registry import load_plugin_file
    from fedbench.testing import check_plugin

    def test_my_attack_keeps_the_contract():
        load_plugin_file("my_plugin.py")  # or nothing, for a plugin installed by entry point
        row = check_plugin("attack", "my-attack")
        assert row["my_auc"] > 0.5

The tiny scenario: 2 clients, 1 round of 2 local steps (batch 2; batch 1 for attacks) on 40 training
examples of the shipped sklearn digits (8x8 images, no download), or of a generated set with a planted
sensitive attribute for attribute-inference plugins; an 8-unit MLP, or LeNet for attacks (a
fully-connected net for attacks that skip LeNet). Nothing is cached. The checks, each failing with a
`PluginContractError` (an AssertionError) that names the plugin and the broken promise:

- metadata: a one-line summary (the class docstring), a version, a paper (optional) with key and title;
- parameters: they survive the cache key (params -> JSON -> params) and the label the results show
  (`name[k=v]` parsed back gives the same configuration);
- the run: status `ok`; every catalogued column in the row lies in its declared range; an attack's row
  holds the threat-model columns and every metric its family declares `required`;
- determinism: a second run with the same seed gives the same record: columns (timings aside),
  per-round history and per-image scores.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fedbench.execution.cache import RunCache
from fedbench.execution.record import RunRecord
from fedbench.execution.runner import RunContext, execute
from fedbench.metrics.catalogue import METRICS, family
from fedbench.plugin import OBSERVATION_POINTS, Paper, Plugin, Scenario
from fedbench.registry import registry_for
from fedbench.spec.params import params_to_dict
from fedbench.spec.patterns import parse_pattern
from fedbench.spec.run import ComponentSpec, RunSpec

TINY_SCENARIO: dict[str, Any] = dict(
    clients=2, rounds=1, local_steps=2, batch_size=2, lr=0.05, train_size=40, test_size=20
)
# Plugins that need sensitive attributes run on a synthetic set with one planted.
ATTRIBUTE_DATA: dict[str, Any] = {
    "shape": [1, 8, 8],
    "classes": 4,
    "n_train": 120,
    "n_test": 20,
    "attribute": True,
}
ATTRIBUTE_DEFENSES = ("recup-fl",)  # attacks of the `attribute` family need the attribute too
# The cheapest settings of built-in plugins that train something of their own (attacks with an
# `iterations` parameter get iterations=2 instead).
CHEAPEST: dict[str, dict[str, Any]] = {
    "attribute-inference": {"pool_size": 40, "epochs": 2, "stru_widths": [8]},
    "recup-fl": {"zoo": 2, "widths": [8], "epochs": 2, "p": 2, "q": 2, "pool_size": 40},
    "mia-lira": {"shadows": 2, "shadow_epochs": 2},
    "mia-shadow": {"shadows": 1, "shadow_epochs": 2},
}
TINY_MODEL = ("mlp", {"hidden": [8]})
# Columns that measure the machine or the moment, not the method: left out of the determinism check.
VOLATILE = ("seconds", "utility_seconds", "attack_seconds", "peak_rss_mb", "created_at", "from_cache")


class PluginContractError(AssertionError):
    """A plugin breaks a promise fedbench relies on; the message names the plugin and the promise."""


def cheapest_params(kind: str, name: str) -> dict[str, Any]:
    """The cheapest settings of a plugin for end-to-end plumbing checks ({} when its defaults are)."""
    cls = registry_for(kind).get(name)
    if cls.kind == "attack" and "iterations" in cls.Params.__dataclass_fields__:
        return {"iterations": 2}
    return dict(CHEAPEST.get(cls.name, {}))


def needs_attributes(cls: type[Plugin]) -> bool:
    return getattr(cls, "family", "") == "attribute" or cls.name in ATTRIBUTE_DEFENSES


# the tiny models an attack is tried on, in order: the first one it does not skip runs it
TINY_ATTACK_MODELS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("lenet", {}),
    ("fcnn", {"fc1_width": 64, "depth": 3}),
    ("imprint", {"base": "mlp[hidden=[8]]", "bins": 16}),
)


def model_for(attack: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """LeNet for gradient-matching attacks; a small FC-first net for attacks that skip LeNet; the
    imprint model for attacks that need the architecture a malicious server ships (robbing-the-fed)."""
    from fedbench.models import build_model

    plugin = registry_for("attack").get(attack)(params)
    for name, model_params in TINY_ATTACK_MODELS:
        if not plugin.check_model(build_model(name, model_params, (1, 8, 8), 10)):
            return name, model_params
    return TINY_ATTACK_MODELS[1]


def tiny_spec(kind: str, name: str, params: dict[str, Any] | None = None, seed: int = 0) -> RunSpec:
    """The run `check_plugin` executes: the plugin (with `params`, default its cheapest settings) in
    the tiny scenario, defense `none`, no attack, and the cheapest choice for every other component."""
    cls = registry_for(kind).get(name)
    raw = cheapest_params(kind, name) if params is None else dict(params)
    chosen: dict[str, tuple[str, dict[str, Any]] | None] = {
        "dataset": ("synthetic", ATTRIBUTE_DATA) if needs_attributes(cls) else ("digits", {}),
        "model": TINY_MODEL,
        "defense": ("none", {}),
        "attack": None,
    }
    scenario = dict(TINY_SCENARIO)
    chosen[cls.kind] = (cls.name, raw)
    if cls.kind == "attack":
        chosen["model"] = model_for(cls.name, raw)
        scenario["batch_size"] = 1

    def resolve(k: str) -> Any:
        choice = chosen[k]
        return None if choice is None else ComponentSpec.resolve(k, *choice)

    return RunSpec(
        resolve("dataset"),
        resolve("model"),
        resolve("defense"),
        resolve("attack"),
        Scenario.from_dict(scenario),
        seed,
        preset="check",
    )


def check_plugin(kind: str, name: str, params: dict[str, Any] | None = None, *, seed: int = 0) -> RunRecord:
    """Run a registered plugin end to end on the tiny scenario and assert its contract (module
    docstring); returns the run's record (a mapping of its result row's columns; `per_image` and
    `history` hold the sidecar detail). `params` default to the plugin's cheapest settings."""
    cls = registry_for(kind).get(name)
    who = f"{cls.kind} '{cls.name}'"
    _check_metadata(cls, who)
    _check_params(cls, cheapest_params(kind, name) if params is None else params, who)
    spec = tiny_spec(kind, name, params, seed)
    row = execute(spec, RunCache(None), RunContext())
    if row["status"] != "ok":
        raise PluginContractError(f"{who}: the tiny run ended '{row['status']}': {row.get('reason')}")
    _check_ranges(row, who)
    if cls.kind == "attack":
        _check_attack_columns(cls, row, who)
    _check_same(row, execute(spec, RunCache(None), RunContext()), who, seed)
    return row


def _check_metadata(cls: type[Plugin], who: str) -> None:
    if not cls.summary():
        raise PluginContractError(f"{who}: give the class a docstring; its first line is the summary")
    if not isinstance(cls.version, str) or not cls.version:
        raise PluginContractError(f"{who}: version must be a non-empty string (it is part of the cache key)")
    if cls.paper is not None and not (isinstance(cls.paper, Paper) and cls.paper.key and cls.paper.title):
        raise PluginContractError(f"{who}: paper must be None or a fedbench.plugin.Paper with key and title")


def _check_params(cls: type[Plugin], raw: dict[str, Any], who: str) -> None:
    """Params survive the cache key (JSON) and the label shown in results (parsed back as a pattern)."""
    params = cls.make_params(raw)
    stored = json.loads(json.dumps(params_to_dict(params)))
    if cls.make_params(stored) != params:
        raise PluginContractError(
            f"{who}: params {params_to_dict(params)} do not survive a JSON round trip ({stored}); "
            "use JSON-able field types (numbers, strings, booleans, tuples of them)"
        )
    spec = ComponentSpec.resolve(cls.kind, cls.name, raw)
    again = ComponentSpec.resolve(cls.kind, *parse_pattern(spec.label))
    if again != spec:
        raise PluginContractError(
            f"{who}: the label '{spec.label}' reads back as {again.params_dict}, not {spec.params_dict}"
        )


def _number(value: Any) -> float | None:
    """The value as a float, None when empty (None or NaN); a non-number is a contract error upstream."""
    if value is None:
        return None
    number = float(value)
    return None if math.isnan(number) else number


def _check_ranges(row: RunRecord, who: str) -> None:
    """Every catalogued column of the row holds a number inside the metric's declared bounds."""
    for name, value in row.items():
        if name not in METRICS:
            continue
        m = METRICS[name]
        try:
            number = _number(value)
        except (TypeError, ValueError):
            raise PluginContractError(f"{who}: column '{name}' holds {value!r}, not a number") from None
        if number is not None and not m.within_bounds(number):
            raise PluginContractError(f"{who}: {name} = {number:g} is outside its declared range {m.bounds}")


def _check_attack_columns(cls: type[Plugin], row: RunRecord, who: str) -> None:
    """The threat-model columns, and every metric the attack's family declares required."""
    if row.get("tm_observation") not in OBSERVATION_POINTS:
        raise PluginContractError(f"{who}: tm_observation is {row.get('tm_observation')!r}")
    fam = family(cls.family, cls.name)  # type: ignore[attr-defined]
    missing = [n for n in fam.metrics if METRICS[n].required and _number(row.get(n)) is None]
    if missing:
        raise PluginContractError(
            f"{who}: family '{fam.name}' declares {', '.join(missing)} but the row has no value for "
            "them; return what the family's scorer reads (docs/writing-an-attack.md)"
        )


def _check_same(first: RunRecord, second: RunRecord, who: str, seed: int) -> None:
    """Two runs with one seed give the same record, timings and first-time notes aside."""
    one, two = _comparable(first), _comparable(second)
    differ = [k for k in sorted(set(one) | set(two)) if not _same(one.get(k), two.get(k))]
    if differ:
        shown = "; ".join(f"{k}: {one.get(k)!r} vs {two.get(k)!r}" for k in differ[:3])
        raise PluginContractError(
            f"{who}: two runs with seed {seed} differ ({shown}); draw randomness from the generator "
            "fedbench passes (or torch's seeded global state), never from unseeded sources"
        )


def _comparable(record: RunRecord) -> dict[str, Any]:
    """The record's columns but the volatile ones, and its per-round and per-image detail."""
    out = {k: v for k, v in record.items() if k not in VOLATILE}
    out.update(history=record.history, per_image=record.per_image)
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN, through lists and dicts."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)
