"""The metric catalogue: every results column that is a metric, how it reads, and which family makes it.

One `Metric` entry per column: its direction (`better`: the direction that is better for the
defender, i.e. less leakage or better utility; the only place a direction is written), its role
(`kind`), how tables show it (`unit`: scale and header), the family it belongs to and its declared
range. Tables, the results schema, leaderboards and plots read directions, headers and scales from
here; nothing else decides whether a higher value leaks more. A `Threshold` (`acc_drop<=2`, in the
units tables show) is read through the same entries.

Families: `utility`, `privacy budget` and `cost` describe the FL training (one value per
configuration), `attack` holds the columns every attack family shares (success, cost), and each
attack family (`reconstruction`, `membership`, `attribute`, ...) registers its scorer and its
entries beside its scoring code with `register_family`, in `fedbench.metrics.<family>` or in a
plugin file. Built-in families load on first use, like built-in plugins (`fedbench.registry`).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fedbench.errors import FedbenchError, UnknownNameError, did_you_mean

Better = Literal["higher", "lower"]
Kind = Literal["utility", "leakage", "guarantee", "cost", "reference"]
Unit = Literal["pct", "pp", "fixed", "sig"]

# Families of per-configuration columns (one value per FL training, not per attack).
RUN_FAMILIES = ("utility", "privacy budget", "cost")
# The family of columns every attack family may fill (outcome, iterations, attack time).
SHARED_ATTACK_FAMILY = "attack"
_BUILTIN_FAMILY_MODULES = (
    "fedbench.metrics.reconstruction",
    "fedbench.metrics.membership",
    "fedbench.metrics.inference",
)


@dataclass(frozen=True)
class Metric:
    """One results column: direction, role, display unit, family and declared range.

    `better` is the direction that is better for the defender: "lower" for a leakage metric where a
    higher value leaks more (psnr), "higher" for one where a lower value does (mse), "higher" for
    accuracy. `unit` is how tables show it: pct (x100, "(%)"), pp (x100, "(pp)"), fixed (2
    decimals) or sig (3 significant digits). `bounds` is the range of raw values (None: open), which
    `fedbench.testing.check_plugin` asserts; `required`: the family's scorer fills it on every run
    (False: only when it can, e.g. LPIPS needs its trunk weights). `family` is set by the
    registration.
    """

    name: str
    better: Better
    kind: Kind
    unit: Unit = "fixed"
    bounds: tuple[float | None, float | None] = (None, None)
    required: bool = True
    about: str = ""
    family: str = ""

    @property
    def per_attack(self) -> bool:
        """True for a column each attack fills (shown per attack); False for one per configuration."""
        return self.family not in RUN_FAMILIES

    @property
    def arrow(self) -> str:
        return "↑" if self.better == "higher" else "↓"

    @property
    def header(self) -> str:
        suffix = {"pct": " (%)", "pp": " (pp)"}.get(self.unit, "")
        return f"{self.name}{suffix} {self.arrow}"

    @property
    def leakage_sign(self) -> int:
        """+1 when a higher value is worse for the defender (more leakage: psnr), -1 when lower is (mse)."""
        return -1 if self.better == "higher" else 1

    @property
    def direction(self) -> str:
        """The direction in words, for axis labels: 'lower = less leakage', 'higher = better utility'."""
        gain = {"leakage": "less leakage", "utility": "better utility"}.get(self.kind, "better")
        return f"{self.better} = {gain}"

    @property
    def scale(self) -> float:
        return 100.0 if self.unit in ("pct", "pp") else 1.0

    def fmt(self, value: float | None) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "—"
        v = value * self.scale
        if self.unit in ("pct", "pp"):
            return f"{v:.1f}"
        if math.isinf(v):
            return "∞" if v > 0 else "-∞"
        if self.unit == "sig":
            return f"{v:.3g}"
        # 2 decimals, or 3 significant digits in scientific form from 1000 on: a local DP mechanism's
        # epsilon can be 3011801.70, whose last digits say nothing
        return f"{v:.2e}" if abs(v) >= 1000 else f"{v:.2f}"

    def within_bounds(self, value: float) -> bool:
        low, high = self.bounds
        return (low is None or value >= low) and (high is None or value <= high)


@dataclass(frozen=True)
class Family:
    """An attack family: the scorer that turns an attack's output into columns, and its metrics.

    `scorer(attack, output, truth) -> fedbench.metrics.scoring.AttackScores`; None for a family known
    only from a results file's description (its plugin is not loaded: its runs render, none scores).
    `default_metrics` are shown by `fedbench compare` with no --metric; the first is the headline.
    """

    name: str
    metrics: tuple[str, ...]
    default_metrics: tuple[str, ...]
    scorer: Callable[..., Any] | None
    builtin: bool = False

    @property
    def headline(self) -> str:
        return self.default_metrics[0]


_entries: dict[str, Metric] = {}
_families: dict[str, Family] = {}
_loaded = False


def _add(family: str, entries: Sequence[Metric]) -> tuple[str, ...]:
    """Put `entries` in the catalogue under `family`; a name taken by another entry is an error."""
    for m in entries:
        entry = dataclasses.replace(m, family=family)
        known = _entries.get(m.name)
        if known is not None and known != entry:
            raise ValueError(f"metric '{m.name}' is already in the catalogue (family '{known.family}')")
        _entries[m.name] = entry
    return tuple(m.name for m in entries)


def register_family(
    name: str, metrics: Sequence[Metric], default_metrics: Sequence[str]
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator on an attack family's scorer: registers the family, its scorer and its catalogue entries.

    `@register_family("membership", metrics=(Metric("mia_auc", "lower", "leakage", ...), ...),
    default_metrics=("mia_auc", "mia_acc"))` on `def score(attack, output, truth) -> AttackScores`.
    An attack declares the family by its `family` class attribute. Works the same in a plugin file.
    """
    _load_builtins()
    if not default_metrics or any(d not in {m.name for m in metrics} for d in default_metrics):
        raise ValueError(f"family '{name}': default_metrics must be non-empty names among its metrics")
    if name in (*RUN_FAMILIES, SHARED_ATTACK_FAMILY):
        raise ValueError(f"family '{name}': an attack family cannot take the name of a catalogue section")

    def deco(scorer: Callable[..., Any]) -> Callable[..., Any]:
        known = _families.get(name)
        if known is not None and known.scorer is not None and known.scorer is not scorer:
            raise ValueError(f"attack family '{name}' is already registered")
        names = _add(name, metrics)
        builtin = scorer.__module__ in _BUILTIN_FAMILY_MODULES
        _families[name] = Family(name, names, tuple(default_metrics), scorer, builtin)
        return scorer

    return deco


def _load_builtins() -> None:
    """Import the built-in family modules once (their `register_family` calls fill the catalogue)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in _BUILTIN_FAMILY_MODULES:
        importlib.import_module(module)


def _ordered_entries() -> list[Metric]:
    """Catalogue order: per-configuration and shared sections first, then attack families in order."""
    sections = [*RUN_FAMILIES, SHARED_ATTACK_FAMILY, *(f.name for f in attack_families())]
    return sorted(_entries.values(), key=lambda m: sections.index(m.family))


class _Catalogue(Mapping[str, Metric]):
    """Read-only name -> `Metric` view of the catalogue (built-in families loaded on first access)."""

    def __getitem__(self, name: str) -> Metric:
        _load_builtins()
        return _entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter([m.name for m in _ordered_entries()])

    def __len__(self) -> int:
        _load_builtins()
        return len(_entries)

    def __contains__(self, name: object) -> bool:
        _load_builtins()
        return name in _entries


METRICS: Mapping[str, Metric] = _Catalogue()


def metric(name: str) -> Metric:
    """The metric called `name`; unknown names fail with a did-you-mean."""
    if name in METRICS:
        return METRICS[name]
    more = did_you_mean(name, list(METRICS))
    raise UnknownNameError(f"unknown metric '{name}'; {more}(metrics: {', '.join(METRICS)})")


def attack_families() -> list[Family]:
    """The attack families: built-in ones in their fixed order, then the others as registered."""
    _load_builtins()
    builtin = sorted(
        (f for f in _families.values() if f.builtin),
        key=lambda f: _BUILTIN_FAMILY_MODULES.index(f.scorer.__module__),  # type: ignore[union-attr]
    )
    return builtin + [f for f in _families.values() if not f.builtin]


def family(name: str, attack: str = "") -> Family:
    """The attack family `name`; unknown names fail naming the attack that declared it and the fix."""
    _load_builtins()
    if name in _families:
        return _families[name]
    who = f"attack '{attack}' declares family '{name}'" if attack else f"unknown attack family '{name}'"
    more = did_you_mean(name, list(_families), prefix="; ", suffix="")
    raise UnknownNameError(
        f"{who}, which has no registered scorer{more}; register one in the attack's plugin file with "
        f"@register_family('{name}', metrics=..., default_metrics=...) (fedbench.metrics), "
        f"or use one of: {', '.join(_families)}"
    )


@dataclass(frozen=True)
class Threshold:
    """A `metric<=value` condition in display units (% for accuracies, pp for drops)."""

    metric: str
    op: str
    value: float

    @classmethod
    def parse(cls, text: str, option: str) -> Threshold:
        m = re.match(r"^\s*([A-Za-z_]\w*)\s*(<=|>=|<|>)\s*(-?[\d.]+(?:e-?\d+)?)\s*$", text or "")
        if not m:
            raise FedbenchError(f"{option} {text!r}: write metric<=number, e.g. {option} acc_drop<=2")
        name, op, value = m.groups()
        metric(name)
        return cls(name, op, float(value))

    def ok(self, value: float | None) -> bool:
        if value is None or math.isnan(value):
            return False
        v = round(value * metric(self.metric).scale, 9)  # 2.0000000000000018 pp meets acc_drop<=2
        return {"<=": v <= self.value, ">=": v >= self.value, "<": v < self.value, ">": v > self.value}[
            self.op
        ]

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"


# ------------------------------------------------------------------ families described by results files


def describe_families(columns: Sequence[str]) -> dict[str, Any]:
    """JSON-able description of the non-built-in families whose metrics are among `columns`.

    Written into a results sidecar, so the file renders with its plugin's metrics (direction, unit,
    defaults) wherever it is read, with or without the plugin file.
    """
    present = set(columns)
    out: dict[str, Any] = {}
    for fam in attack_families():
        if fam.builtin or not present.intersection(fam.metrics):
            continue
        entries = [
            {**dataclasses.asdict(_entries[n]), "bounds": list(_entries[n].bounds)} for n in fam.metrics
        ]
        out[fam.name] = {"default_metrics": list(fam.default_metrics), "metrics": entries}
    return out


def adopt_families(described: Mapping[str, Any], source: str) -> None:
    """Add the families a results sidecar describes and the catalogue lacks (a loaded plugin wins)."""
    _load_builtins()
    for name, spec in (described or {}).items():
        if name in _families:
            continue
        try:
            entries = [Metric(**{**e, "bounds": tuple(e["bounds"])}) for e in spec["metrics"]]
            default = tuple(spec["default_metrics"])
        except (KeyError, TypeError) as exc:
            raise FedbenchError(
                f"{source}: the description of metric family '{name}' is damaged ({exc}); "
                "rewrite the file with 'fedbench run'"
            ) from None
        entries = [m for m in entries if m.name not in _entries or _entries[m.name].family == name]
        _families[name] = Family(name, _add(name, entries), default, None)


# ------------------------------------------------------------------ per-configuration and shared columns

_add(
    "utility",
    (
        Metric("test_acc", "higher", "utility", "pct", (0, 1), about="test accuracy of the global model"),
        Metric("acc_drop", "lower", "utility", "pp", (-1, 1), about="accuracy lost vs 'none', same seed"),
        Metric("test_loss", "lower", "utility", "sig", (0, None), about="test loss of the global model"),
    ),
)
_add(
    "privacy budget",
    (Metric("epsilon", "lower", "guarantee", bounds=(0, None), about="the defense's formal epsilon"),),
)
_add(
    SHARED_ATTACK_FAMILY,
    (
        Metric("attack_success", "lower", "leakage", "pct", (0, 1), False, "the attack declared success"),
        Metric("iterations_to_success", "higher", "cost", "sig", (0, None), False, "iterations it took"),
        Metric("attack_seconds", "lower", "cost", "sig", (0, None), about="attack wall time"),
    ),
)
_add(
    "cost",
    (
        Metric("seconds", "lower", "cost", "sig", (0, None), about="wall time of the run"),
        Metric("utility_seconds", "lower", "cost", "sig", (0, None), about="wall time of the FL training"),
        Metric("peak_rss_mb", "lower", "cost", "sig", (0, None), about="peak resident memory (MB)"),
    ),
)
