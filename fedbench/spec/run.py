"""Run specifications and their cache keys.

A `RunSpec` is one point of a grid: (scenario, dataset, model, defense, attack, seed), and, for a
victim batch, the clients its attack covers (`victims`). Its key is the canonical JSON (sorted keys,
resolved defaults, canonical names, plugin versions) and the first 16 hex digits of its SHA-256 are
the `run_id`. The utility part of a run is keyed without the attack, without the observation point
(`OBSERVATION_FIELDS`) and without the victim batch, so every attack, every observation point and
every victim batch of a grid cell shares one FL training run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from fedbench.errors import SpecError
from fedbench.plugin import Scenario
from fedbench.registry import registry_for
from fedbench.spec.params import keyless_values, params_to_dict


@dataclass(frozen=True)
class ComponentSpec:
    """A resolved plugin choice: canonical name, validated params, version, and which were given."""

    kind: str
    name: str
    params: tuple[tuple[str, Any], ...]
    version: str
    given: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def resolve(cls, kind: str, name: str, raw: dict[str, Any] | None = None) -> ComponentSpec:
        """Look the plugin up (did-you-mean on typos) and validate its params."""
        plugin = registry_for(kind).get(name)
        params = plugin.make_params(raw)
        items = tuple(sorted(params_to_dict(params).items()))
        return cls(kind, plugin.name, _freeze(items), plugin.version, tuple(sorted(raw or {})))

    @property
    def params_dict(self) -> dict[str, Any]:
        return {k: _thaw(v) for k, v in self.params}

    @property
    def label(self) -> str:
        """`dp-gaussian[sigma=0.01]`: the name with the parameters the grid set explicitly."""
        shown = [(k, v) for k, v in self.params if k in self.given]
        if not shown:
            return self.name
        return f"{self.name}[{','.join(f'{k}={_fmt(_thaw(v))}' for k, v in shown)}]"

    def key(self) -> dict[str, Any]:
        """The plugin's part of the cache key: params in full, except one at the value a key without it
        stands for (`keyless`: a `key_optional` param's default, a `param(keyless=...)` one's value)."""
        plugin = registry_for(self.kind).get(self.name)
        omit = keyless(plugin)
        params = {k: v for k, v in self.params_dict.items() if k not in omit or v != omit[k]}
        return {"name": self.name, "params": params, "version": self.version}

    @classmethod
    def from_key(cls, kind: str, part: dict[str, Any]) -> ComponentSpec:
        """Rebuild a component from its part of a stored key: a param the key leaves out has the value
        such a key stands for, which for a `param(keyless=...)` is not the default (`keyless`)."""
        plugin = registry_for(kind).get(part["name"])
        absent = keyless_values(plugin.Params)
        raw = {**{k: v for k, v in absent.items() if k not in part["params"]}, **part["params"]}
        return cls.resolve(kind, part["name"], raw)

    def instantiate(self) -> Any:
        plugin = registry_for(self.kind).get(self.name)
        return plugin(plugin.make_params(self.params_dict))


def keyless(plugin: type) -> dict[str, Any]:
    """{param: value} the plugin's key leaves out at that value: each `key_optional` param at its default,
    each `param(keyless=...)` at its keyless value (what runs before it or before its default changed had).
    """
    out = {}
    if plugin.key_optional:
        defaults = params_to_dict(plugin.make_params({}))
        out = {k: defaults[k] for k in plugin.key_optional}
    return {**out, **{k: _thaw(v) for k, v in keyless_values(plugin.Params).items()}}


def _freeze(items: Any) -> Any:
    if isinstance(items, list):
        return tuple(_freeze(x) for x in items)
    if isinstance(items, tuple):
        return tuple(_freeze(x) for x in items)
    return items


def _thaw(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_thaw(x) for x in v]
    return v


# a string value holding one of these is quoted in a label, so the label parses back as a pattern
# (`imprint[base="fcnn[fc1_width=1024]",bins=64]`)
_PATTERN_CHARS = frozenset("[]{},=\"'")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    if isinstance(v, str) and _PATTERN_CHARS & set(v):
        return json.dumps(v)
    return str(v)


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# Scenario fields that say where and when the attacker looks, not how the federation trains: the
# utility run (the training without an observer) never reads them, so they stay out of its key and
# runs that differ only in them share one training. The attack run's key keeps them.
OBSERVATION_FIELDS = ("observe", "observe_round", "victim")


def training_scenario(scenario: Scenario) -> Scenario:
    """`scenario` with the observation fields at their defaults: what the utility run trains on, so
    its result cannot depend on a field its key leaves out."""
    default = Scenario()
    return scenario.replace(**{f: getattr(default, f) for f in OBSERVATION_FIELDS})


def check_victims(victims: tuple[int, ...] | list[int], clients: int) -> None:
    """A victim batch's clients: one or more distinct client indices below `clients`; a SpecError
    (one line) naming the first that is not."""
    if not victims:
        raise SpecError("victims: give at least one client index")
    for v in victims:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise SpecError(f"victims: {v!r} is not a client index (an integer >= 0)")
        if v >= clients:
            raise SpecError(
                f"victims: client {v} does not exist with clients = {clients} (clients are 0..{clients - 1})"
            )
    if len(set(victims)) != len(victims):
        raise SpecError(f"victims {list(victims)}: a client is listed twice")


@dataclass(frozen=True)
class RunSpec:
    """One grid point. `preset` is provenance only: it is not part of the key.

    `victims` is a victim batch: the clients (two or more, ascending) whose observations one attack
    run covers, `scenario.victim` being the first. Empty (every run before victim batches, and a batch
    of one, which is that victim's own run): the attack covers `scenario.victim` alone, and the key is
    the one it always was.
    """

    dataset: ComponentSpec
    model: ComponentSpec
    defense: ComponentSpec
    attack: ComponentSpec | None
    scenario: Scenario
    seed: int
    preset: str = field(default="", compare=False)
    victims: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        victims = self.victims
        if not victims:
            return
        if len(victims) < 2 or list(victims) != sorted(set(victims)):
            raise SpecError(
                f"a victim batch is two or more distinct clients in ascending order; got {victims}"
            )
        if self.scenario.victim != victims[0]:
            raise SpecError(
                f"victim batch {victims}: scenario.victim must be its first, got {self.scenario.victim}"
            )
        check_victims(victims, self.scenario.clients)

    def with_victims(self, victims: tuple[int, ...] | list[int]) -> RunSpec:
        """This spec with its attack covering `victims` (any order, no repeats): the batch's first client
        goes in `scenario.victim`; a batch of one is that victim's own run (`victims` empty)."""
        ordered = sorted(victims)
        check_victims(ordered, self.scenario.clients)
        scenario = self.scenario.replace(victim=ordered[0])
        return dataclasses.replace(
            self, scenario=scenario, victims=tuple(ordered) if len(ordered) > 1 else ()
        )

    @property
    def victim_clients(self) -> tuple[int, ...]:
        """The clients the attack covers, in victim order: the batch, or `scenario.victim` alone."""
        return self.victims or (self.scenario.victim,)

    def utility_key(self) -> dict[str, Any]:
        """The FL training's key: the run's key without the attack, without the attacker's vantage
        point (`OBSERVATION_FIELDS`) and without the victim batch, so runs that differ only there share
        one training."""
        out = self._key()
        out["scenario"] = {k: v for k, v in out["scenario"].items() if k not in OBSERVATION_FIELDS}
        return out

    def _key(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset.key(),
            "model": self.model.key(),
            "defense": self.defense.key(),
            "scenario": params_to_dict(self.scenario),
            "seed": self.seed,
            "schema": 1,
        }

    def key(self) -> dict[str, Any]:
        """The run's key: the whole scenario (observation point included), the attack and the victim
        batch (only when there is one: a single victim's key is the one it always was)."""
        out = self._key()
        out["attack"] = self.attack.key() if self.attack else None
        if self.victims:
            out["victims"] = list(self.victims)
        return out

    @property
    def run_id(self) -> str:
        return short_hash(canonical_json(self.key()))

    @property
    def utility_id(self) -> str:
        return short_hash(canonical_json(self.utility_key()))

    @classmethod
    def from_key(cls, key: dict[str, Any], preset: str = "") -> RunSpec:
        """Rebuild a spec from its key (as stored in a results sidecar); names and params re-validated."""

        def comp(kind: str) -> ComponentSpec | None:
            part = key.get(kind)
            return ComponentSpec.from_key(kind, part) if part else None

        return cls(
            comp("dataset"),
            comp("model"),
            comp("defense"),
            comp("attack"),
            Scenario.from_dict(key["scenario"]),
            int(key["seed"]),
            preset=preset,
            victims=tuple(int(v) for v in key.get("victims", ())),
        )

    def describe(self) -> str:
        attack = self.attack.label if self.attack else "-"
        victims = f" victims={','.join(map(str, self.victims))}" if self.victims else ""
        head = f"{self.dataset.label}/{self.model.label} {self.defense.label}"
        return f"{head} x {attack} seed={self.seed}{victims}"
