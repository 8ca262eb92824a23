"""Which attacks apply where: the declarations a grid reads to pair attacks with defenses and scenarios.

A board is only as strong as its attack suite (issue 28), so a grid must neither run an attack where it
cannot work (an adaptive attack against another defense, an attack of the client update on a server
aggregate) nor leave out one that would work. Every attack declares what it applies to, on its class:

- **the observation point**: `accepted_points` (`Attack.check(scenario)` says why a scenario's point is not
  among them);
- **the defense it adapts to**: `adapts_to = ("soteria",)` on the attack, or `adaptive_attack = "..."` on
  the defense (LODA -> loda-adaptive). An adaptive attack runs only against its own defenses;
- **the threat model**: `threat` on the attack, else "malicious server" for an attack with a server hook
  (it sets the parameters the clients receive) and "honest" for the others;
- **the family** (`family`: reconstruction, membership, attribute), which a board's primary metric fixes;
- **the model and dataset**: `check_model` and `check_meta`, which need the built model and the dataset's
  metadata; the runner applies them per run (a `skipped` record with its reason), not the grid.

`[grid.suite]` in a preset makes the suite "every registered attack applicable to the scenario": with
`include = "applicable"`, each registered attack of the listed attacks' families and threat models that
no block names joins with its default parameters, unless `exclude = { name = "reason" }` leaves it out
with a stated reason. An adaptive attack joins only when one of its defenses is in the grid.
"""

from __future__ import annotations

from typing import Any

from fedbench.registry import registry_for

HONEST = "honest"
MALICIOUS_SERVER = "malicious server"


def adapts_to(attack: str) -> frozenset[str]:
    """The defenses attack `attack` adapts to (empty for a non-adaptive attack): its own `adapts_to`
    plus every defense that declares it as its `adaptive_attack`."""
    cls = registry_for("attack").get(attack)
    own = {registry_for("defense").canonical(d) for d in getattr(cls, "adapts_to", ())}
    declared = {
        d.name for d in registry_for("defense").list() if getattr(d, "adaptive_attack", "") == cls.name
    }
    return frozenset(own | declared)


def adaptive_attacks(defense: str) -> tuple[str, ...]:
    """The attacks that adapt to `defense`: the one it declares first, then the others by name."""
    first = getattr(registry_for("defense").get(defense), "adaptive_attack", "")
    name = registry_for("defense").canonical(defense)
    others = sorted(
        a.name for a in registry_for("attack").list() if name in adapts_to(a.name) and a.name != first
    )
    return (first, *others) if first else tuple(others)


def threat(attack: str) -> str:
    """The attack's threat model: its `threat`, else whether it acts as a malicious server."""
    from fedbench.plugin import Attack

    cls = registry_for("attack").get(attack)
    declared = getattr(cls, "threat", "")
    if declared:
        return str(declared)
    return MALICIOUS_SERVER if cls.server_hook is not Attack.server_hook else HONEST


def pair_reason(attack: Any, defense: Any, scenario: Any) -> str | None:
    """Why attack spec `attack` does not apply to defense spec `defense` in `scenario`, or None."""
    targets = adapts_to(attack.name)
    if targets and defense.name not in targets:
        return f"{attack.name} adapts to {', '.join(sorted(targets))} only"
    return attack.instantiate().check(scenario)


def applicable_extras(
    named: list[str], defenses: list[str], scenarios: list[Any], exclude: dict[str, str]
) -> list[str]:
    """`[grid.suite] include = "applicable"`: the registered attacks that join a suite whose blocks name
    `named`, in a grid of `defenses` and `scenarios`: same family and threat model as a named attack,
    applicable to some scenario, adaptive ones only when one of their defenses is in the grid, minus
    `exclude`. Sorted by name."""
    reg = registry_for("attack")
    named_set = {reg.canonical(n) for n in named}
    families = {reg.get(n).family for n in named_set}
    threats = {threat(n) for n in named_set}
    out = []
    for cls in reg.list():
        name = cls.name
        if name in named_set or name in exclude or cls.family not in families or threat(name) not in threats:
            continue
        targets = adapts_to(name)
        if targets and not targets & set(defenses):
            continue
        attack = cls(cls.make_params({}))
        if all(attack.check(sc) for sc in scenarios):
            continue
        out.append(name)
    return sorted(out)
