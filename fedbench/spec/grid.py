"""Presets (TOML) and CLI overrides -> the list of `RunSpec`s of a grid.

A preset has a `[grid]` table (name, description, paper, seeds, substitution, optional `extends`),
a `[scenario]` table (a list value sweeps), and `[[dataset]]`, `[[model]]`, `[[defense]]`,
`[[attack]]` blocks with a `name` and `params` whose list values sweep as a cartesian product
(a list is one value for a list-typed parameter; a list of lists sweeps it). A model block may
restrict itself to `datasets = [...]`, an attack block to `models = [...]`, `datasets = [...]` and
`defenses = [...]`; an attack block with `adaptive = true` also runs, for every defense of the grid,
the attacks that adapt to it (`fedbench.spec.applicability`: LODA -> loda-adaptive) with the block's
parameters and those of `adaptive_params = {...}` they have, so boards take the worst case over both.
`[scenario] victims` makes victim batches: one attack run over several victims (`RunSpec.victims`)
instead of one run per victim (`victim = [0, 1]`): `victims = 10` is clients 0..9 in one run,
`victims = [0, 3, 7]` those clients in one run, `victims = [[0, 1], [2, 3]]` two runs. A preset gives
`victim` or `victims`, not both; one set with `--set` (or by a preset that `extends`) replaces the other.
A preset that `extends` another replaces its `[[...]]` blocks and `[grid.suite]` whole, and merges
`[scenario]`, `[grid]` and `[grid.board]` key by key (a `[grid.board.slice]` it gives replaces the base's).
`[[reported]]` rows carry a paper's own numbers. Everything is validated before any run: the file's
shape against the schema (`fedbench.spec.preset_schema`), then unknown names and parameters and bad
ranges as the grid expands; errors name the file and table.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from fedbench.errors import FedbenchError, SpecError, UnknownNameError, did_you_mean
from fedbench.execution.cascade import Cascade
from fedbench.metrics.catalogue import metric
from fedbench.plugin import Scenario
from fedbench.registry import registry_for
from fedbench.reporting.intervals import is_rate
from fedbench.spec.applicability import adaptive_attacks, applicable_extras, pair_reason
from fedbench.spec.params import is_sequence_param
from fedbench.spec.patterns import parse_assignment, parse_pattern
from fedbench.spec.preset_schema import BoardTable, check_preset
from fedbench.spec.run import ComponentSpec, RunSpec, check_victims

COMPONENTS = ("dataset", "model", "defense", "attack")
# [grid.board]: what `fedbench export --to leaderboard` reads (fedbench.reporting.leaderboard.build)
BOARD_KEYS = tuple(BoardTable.model_fields)
# A grid larger than this is a typo (a seed count of 10**9, a sweep pasted twice), not a benchmark.
MAX_RUNS = 100_000


def _check_size(n: int, what: str) -> None:
    if n > MAX_RUNS:
        raise SpecError(f"{what} expands to {n} runs, more than {MAX_RUNS}; narrow the sweep")


@dataclass(frozen=True)
class Overrides:
    """Command-line changes to a preset; None leaves the preset's choice."""

    datasets: tuple[str, ...] | None = None
    models: tuple[str, ...] | None = None
    defenses: tuple[str, ...] | None = None
    attacks: tuple[str, ...] | None = None
    sets: tuple[str, ...] = ()
    seeds: int | None = None


@dataclass(frozen=True)
class Grid:
    """An expanded grid: its metadata and run specs, in a stable order."""

    name: str
    description: str
    source: str
    specs: tuple[RunSpec, ...]
    paper: str = ""
    substitution: str = ""
    seeds: tuple[int, ...] = (0,)
    reported: tuple[dict[str, Any], ...] = ()
    board: dict[str, Any] = field(default_factory=dict)
    # (attack, defense, reason) of the pairs the grid left out because the attack does not apply
    skipped: tuple[tuple[str, str, str], ...] = ()
    # (attack, reason) of the registered attacks a `[grid.suite]` leaves out by name
    excluded: tuple[tuple[str, str], ...] = ()
    cascade: Cascade | None = None  # `[grid.suite] cascade`: the attack cascade of a board's build


# ------------------------------------------------------------------------------------------ presets


def builtin_preset_dir() -> Path:
    return Path(str(resources.files("fedbench._presets")))


def _preset_dirs(extra: tuple[str | Path, ...] = ()) -> list[Path]:
    return [Path(d) for d in extra] + [builtin_preset_dir()]


def list_presets(extra_dirs: tuple[str | Path, ...] = ()) -> list[tuple[str, Path, str]]:
    """(name, path, description) of every preset; earlier directories shadow later ones."""
    seen: dict[str, tuple[str, Path, str]] = {}
    for d in _preset_dirs(extra_dirs):
        for path in sorted(d.glob("*.toml")) if d.is_dir() else []:
            if path.stem in seen:
                continue
            try:
                desc = _read_toml(path).get("grid", {}).get("description", "")
            except FedbenchError as exc:
                desc = f"(invalid: {exc})"
            seen[path.stem] = (path.stem, path, str(desc))
    return [seen[k] for k in sorted(seen)]


def find_preset(name_or_path: str, extra_dirs: tuple[str | Path, ...] = ()) -> Path:
    """A preset file by path (`x.toml`, `dir/x.toml`) or by name in the preset directories."""
    if name_or_path.endswith(".toml") or "/" in name_or_path or "\\" in name_or_path:
        path = Path(name_or_path)
        if not path.is_file():
            raise SpecError(f"preset file {name_or_path} does not exist; give an existing .toml path")
        return path
    for d in _preset_dirs(extra_dirs):
        path = d / f"{name_or_path}.toml"
        if path.is_file():
            return path
    names = [n for n, _, _ in list_presets(extra_dirs)]
    more = did_you_mean(name_or_path, names)
    raise UnknownNameError(f"unknown preset '{name_or_path}'; {more}(presets: {', '.join(names)})")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8 by definition; a Latin-1 or UTF-16 save is not
        raise SpecError(
            f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
            "save the preset as UTF-8"
        ) from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror}") from None


def load_preset(path: Path, extra_dirs: tuple[str | Path, ...] = ()) -> dict[str, Any]:
    """Read a preset and check it against the schema, resolving one level of `extends`."""
    data = _read_toml(path)
    check_preset(data, path)
    base_name = data.get("grid", {}).get("extends")
    if base_name:
        base_path = find_preset(str(base_name), (path.parent, *extra_dirs))
        if base_path.resolve() == path.resolve():
            raise SpecError(f"{path}: [grid] extends itself")
        base = _read_toml(base_path)
        check_preset(base, base_path)
        if base.get("grid", {}).get("extends"):
            raise SpecError(f"{path}: [grid] extends '{base_name}', which extends again; at most one level")
        merged = {k: v for k, v in base.items()}
        merged["grid"] = {**base.get("grid", {}), **data.get("grid", {})}
        merged["grid"].pop("extends", None)
        if "board" in base.get("grid", {}) and "board" in data.get("grid", {}):
            # key by key: a board at another batch size restates its name and title, not its method
            merged["grid"]["board"] = {**base["grid"]["board"], **data["grid"]["board"]}
        merged["scenario"] = _victim_key_wins(base.get("scenario", {}), data.get("scenario", {}))
        for key in (*COMPONENTS, "reported"):
            if key in data:
                merged[key] = data[key]
        data = merged
    return data


# ---------------------------------------------------------------------------------------- expansion


def _sweep(kind: str, name: str, params: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """Expand list-valued params into the cartesian product of single-valued dicts."""
    try:
        plugin = registry_for(kind).get(name)
    except FedbenchError as exc:
        raise type(exc)(f"{where}: {exc}") from None
    fields = {f.name for f in dataclasses.fields(plugin.Params)}
    axes: list[list[tuple[str, Any]]] = []
    for key, value in params.items():
        if key in fields and is_sequence_param(plugin.Params, key):
            sweeps = isinstance(value, list) and value and all(isinstance(v, list) for v in value)
        else:
            sweeps = isinstance(value, list)
        if sweeps and not value:
            raise SpecError(f"{where}: parameter '{key}' sweeps over an empty list")
        axes.append([(key, v) for v in value] if sweeps else [(key, value)])
    _check_size(math.prod(len(a) for a in axes), where)
    return [dict(combo) for combo in itertools.product(*axes)] if axes else [{}]


def _components(kind: str, blocks: list[dict[str, Any]], source: str) -> list[tuple[ComponentSpec, dict]]:
    out = []
    for i, block in enumerate(blocks):
        where = f"{source}: [[{kind}]] #{i + 1} '{block['name']}'"
        for params in _sweep(kind, block["name"], block.get("params", {}), where):
            try:
                comp = ComponentSpec.resolve(kind, block["name"], params)
            except FedbenchError as exc:
                raise type(exc)(f"{where}: {exc}") from None
            out.append((comp, block))
    return out


def _adaptives(defense: ComponentSpec, attack: ComponentSpec, block: dict[str, Any]) -> list[ComponentSpec]:
    """The attacks that adapt to `defense` (`applicability.adaptive_attacks`: the one it declares, then
    those declaring `adapts_to` it), each with the parameters the standard attack's block set and those
    of its `adaptive_params` table that it has; none when the block's attack is one of them."""
    names = adaptive_attacks(defense.name)
    if attack.name in names:
        return []
    given = {k: v for k, v in attack.params_dict.items() if k in attack.given}
    extra = block.get("adaptive_params", {})
    out = []
    for name in names:
        fields = registry_for("attack").get(name).Params.__dataclass_fields__
        params = {k: v for k, v in {**given, **extra}.items() if k in fields}
        out.append(ComponentSpec.resolve("attack", name, params))
    return out


def _suite_blocks(
    suite: dict[str, Any],
    attack_blocks: list[dict[str, Any]],
    defenses: list[str],
    scenarios: list[Any],
    source: str,
) -> list[dict[str, Any]]:
    """`[grid.suite]`: the blocks of the registered attacks that join the named ones (their defaults)."""
    reg = registry_for("attack")
    exclude = {}
    for name, reason in suite.get("exclude", {}).items():
        try:
            exclude[reg.canonical(name)] = reason
        except FedbenchError as exc:
            raise type(exc)(f"{source}: [grid.suite] exclude: {exc}") from None
    named = [b["name"] for b in attack_blocks]
    if not named:
        raise SpecError(
            f"{source}: [grid.suite] needs at least one [[attack]] block: the suite takes the attacks of its "
            "family and threat model"
        )
    # attacks an `adaptive = true` block already pairs with their defenses stay with that block's params
    paired = {a for b in attack_blocks if b.get("adaptive") for d in defenses for a in adaptive_attacks(d)}
    extras = applicable_extras(named, defenses, scenarios, {**exclude, **dict.fromkeys(paired, "")})
    return [{"name": n} for n in extras]


def _pattern_blocks(patterns: tuple[str, ...]) -> list[dict[str, Any]]:
    blocks = []
    for text in patterns:
        name, params = parse_pattern(text)
        blocks.append({"name": name, "params": params})
    return blocks


VICTIM_KEYS = ("victim", "victims")  # one victim per run, or a victim batch per run: a scenario has one


def _victim_key_wins(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` updated with `changes`, where `victim` or `victims` in `changes` replaces either in `base`."""
    if any(k in changes for k in VICTIM_KEYS):
        base = {k: v for k, v in base.items() if k not in VICTIM_KEYS}
    return {**base, **changes}


def _victim_batches(value: Any, source: str) -> list[tuple[int, ...]]:
    """`[scenario] victims`: a count N (clients 0..N-1), a list of clients (one batch), or a list of
    such lists (one batch each)."""

    def clients(v: Any) -> bool:
        return (
            isinstance(v, list) and bool(v) and all(isinstance(c, int) and not isinstance(c, bool) for c in v)
        )

    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return [tuple(range(value))]
    if clients(value):
        return [tuple(value)]
    if isinstance(value, list) and value and all(clients(b) for b in value):
        return [tuple(b) for b in value]
    raise SpecError(
        f"{source}: [scenario] victims must be a count N (clients 0..N-1 in one run), a list of clients "
        f"(one run), or a list of such lists (one run each); got {value!r}"
    )


def _scenarios(values: dict[str, Any], source: str) -> list[tuple[Scenario, tuple[int, ...]]]:
    """(scenario, victim batch) of every point of the `[scenario]` sweep; the batch is () without
    `victims` (and for a batch of one: `RunSpec.with_victims`), else the scenario's victim is its first."""
    values = dict(values)
    if all(k in values for k in VICTIM_KEYS):
        raise SpecError(
            f"{source}: [scenario] gives both victim and victims; use victim for one run per victim, "
            "victims for one run over several victims"
        )
    batches: list[tuple[int, ...]] = (
        _victim_batches(values.pop("victims"), source) if "victims" in values else [()]
    )
    fields = {f.name for f in dataclasses.fields(Scenario)}
    for key in values:
        if key not in fields:
            more = did_you_mean(key, sorted(fields | {"victims"}))
            raise UnknownNameError(f"{source}: [scenario] unknown key '{key}'; {more}")
    for key, value in values.items():
        if isinstance(value, list) and not value:
            raise SpecError(f"{source}: [scenario] {key} sweeps over an empty list; give at least one value")
    axes = [[(k, x) for x in v] if isinstance(v, list) else [(k, v)] for k, v in values.items()]
    _check_size(math.prod(len(a) for a in axes) * len(batches), f"{source}: [scenario]")
    out = []
    for combo in itertools.product(*axes):
        try:
            scenario = Scenario.from_dict(dict(combo))
        except FedbenchError as exc:
            raise type(exc)(f"{source}: [scenario]: {exc}") from None
        if 0 < scenario.train_size < scenario.clients:  # else only the run would find a client with no data
            raise SpecError(
                f"{source}: [scenario] clients={scenario.clients} is more than train_size="
                f"{scenario.train_size} training examples; lower clients or raise train_size"
            )
        for batch in batches:
            if batch:
                try:
                    check_victims(batch, scenario.clients)
                except FedbenchError as exc:
                    raise type(exc)(f"{source}: [scenario] {exc}") from None
            out.append((scenario, batch))
    return out


def _seeds(value: Any, source: str) -> tuple[int, ...]:
    if isinstance(value, bool):
        raise SpecError(f"{source}: [grid] seeds must be a count or a list of integers")
    if isinstance(value, int):
        if value < 1:
            raise SpecError(f"{source}: [grid] seeds must be >= 1; got {value}")
        _check_size(value, f"{source}: [grid] seeds = {value}")
        return tuple(range(value))
    if (
        isinstance(value, list)
        and value
        and all(isinstance(s, int) and not isinstance(s, bool) for s in value)
    ):
        bad = [s for s in value if s < 0]
        if bad:  # numpy's and torch's generators take no negative seed: it would fail mid-run
            raise SpecError(f"{source}: [grid] seeds must be integers >= 0; got {bad[0]}")
        return tuple(value)
    raise SpecError(f"{source}: [grid] seeds must be a count or a list of integers; got {value!r}")


def _allowed(names: list[str] | None, name: str, kind: str) -> bool:
    """A block's optional `datasets = [...]` / `models = [...]` restriction."""
    if not names:
        return True
    return name in {registry_for(kind).canonical(n) for n in names}


def build_grid(
    preset: str | Path | None, overrides: Overrides = Overrides(), extra_dirs: tuple[str | Path, ...] = ()
) -> Grid:
    """Resolve, validate and expand a preset (by name or path) with CLI overrides."""
    path = find_preset(str(preset or "quickstart"), extra_dirs)
    data = load_preset(path, extra_dirs)
    source = str(path)
    meta = data.get("grid", {})
    scenario_values = dict(data.get("scenario", {}))
    seeds_value = meta.get("seeds", 1)
    for text in overrides.sets:
        keys, value = parse_assignment(text)
        if keys[0] == "scenario" and len(keys) == 2:
            scenario_values = _victim_key_wins(scenario_values, {keys[1]: value})
        elif keys == ["grid", "seeds"]:
            seeds_value = value
        else:
            raise SpecError(
                f"--set {text!r}: only scenario.<key> and grid.seeds can be set; "
                "use -d/-m/-D/-a for components"
            )
    if overrides.seeds is not None:
        if overrides.seeds < 1:
            raise SpecError(f"--seeds {overrides.seeds}: must be >= 1")
        seeds_value = overrides.seeds
    seeds = _seeds(seeds_value, source)
    scenarios = _scenarios(scenario_values, source)

    def blocks(kind: str, override: tuple[str, ...] | None) -> list[dict[str, Any]]:
        return _pattern_blocks(override) if override is not None else list(data.get(kind, []))

    datasets = _components("dataset", blocks("dataset", overrides.datasets), source)
    models = _components("model", blocks("model", overrides.models), source)
    defenses = _components("defense", blocks("defense", overrides.defenses) or [{"name": "none"}], source)
    attack_blocks = blocks("attack", overrides.attacks)
    attack_blocks = [b for b in attack_blocks if b["name"] != "none"]
    if meta.get("suite") is not None and overrides.attacks is None:
        attack_blocks += _suite_blocks(
            meta["suite"], attack_blocks, [d.name for d, _ in defenses], [sc for sc, _ in scenarios], source
        )
    attacks: list[tuple[ComponentSpec | None, dict]] = list(_components("attack", attack_blocks, source))
    if not attacks:
        attacks = [(None, {})]
    if not datasets:
        raise SpecError(f"{source}: no [[dataset]] given; add one or pass -d NAME")
    if not models:
        raise SpecError(f"{source}: no [[model]] given; add one or pass -m NAME")
    sizes = (datasets, models, scenarios, defenses, attacks, seeds)
    _check_size(math.prod(len(x) for x in sizes), f"{source}: the grid")

    specs = []
    skipped: dict[tuple[str, str], str] = {}  # (attack, defense) -> why the pair does not apply
    for (ds, _), (md, mblock), (sc, batch), (df, _), (at, ablock), seed in itertools.product(
        datasets, models, scenarios, defenses, attacks, seeds
    ):
        if not _allowed(mblock.get("datasets"), ds.name, "dataset"):
            continue
        if not _allowed(ablock.get("models"), md.name, "model"):
            continue
        if not _allowed(ablock.get("datasets"), ds.name, "dataset"):
            continue
        if not _allowed(ablock.get("defenses"), df.name, "defense"):
            continue
        # `adaptive = true`: the attacks that adapt to the defense run beside the block's attack
        adaptive = _adaptives(df, at, ablock) if ablock.get("adaptive") and at is not None else []
        for attack in (at, *adaptive):
            reason = pair_reason(attack, df, sc) if attack is not None else None
            if reason:
                skipped.setdefault((attack.label, df.label), reason)
                continue
            spec = RunSpec(ds, md, df, attack, sc, seed, preset=str(meta.get("name", path.stem)))
            specs.append(spec.with_victims(batch) if batch else spec)
    unique = list(dict.fromkeys(specs))
    if overrides.attacks is not None:
        _check_named_attacks(unique, skipped, source)
    if not unique:
        raise SpecError(f"{source}: the grid has no runs; the blocks' datasets/models lists exclude all")
    return Grid(
        name=str(meta.get("name", path.stem)),
        description=str(meta.get("description", "")),
        source=source,
        specs=tuple(unique),
        paper=str(meta.get("paper", "")),
        substitution=str(meta.get("substitution", "")),
        seeds=seeds,
        reported=tuple(data.get("reported", [])),
        board=dict(meta.get("board", {})),
        skipped=tuple((a, d, r) for (a, d), r in skipped.items()),
        excluded=tuple(dict(meta.get("suite", {}).get("exclude", {})).items()),
        cascade=_cascade(meta, unique, source) if overrides.attacks is None else None,
    )


def _cascade(meta: dict[str, Any], specs: list[RunSpec], source: str) -> Cascade | None:
    """`[grid.suite] cascade`: the attacks it names must be in the grid, and the board's primary must be
    a 0/1 rate per input (an input is done when an attack re-identified it)."""
    order = list(meta.get("suite", {}).get("cascade", []))
    if not order:
        return None
    primary = meta.get("board", {}).get("primary")
    if not primary or not is_rate(metric(str(primary))):
        raise SpecError(
            f"{source}: [grid.suite] cascade needs [grid.board] primary to be a rate per input (e.g. "
            f'primary = "reid"); got {primary!r}'
        )
    attacks = {s.attack.name for s in specs if s.attack is not None}
    for name in order:
        if name not in attacks:
            raise SpecError(
                f"{source}: [grid.suite] cascade names {name!r}, not an attack of this grid "
                f"(its attacks: {', '.join(sorted(attacks))})"
            )
    if len(set(order)) != len(order):
        raise SpecError(f"{source}: [grid.suite] cascade lists an attack twice: {order}")
    return Cascade(tuple(order), metric(str(primary)).name)


def _check_named_attacks(specs: list[RunSpec], skipped: dict[tuple[str, str], str], source: str) -> None:
    """An attack named on the command line (-a) that applies to none of the grid's pairs is an error:
    the user asked for it, so skipping it silently would hide the mistake."""
    running = {s.attack.label for s in specs if s.attack is not None}
    for (attack, _), reason in skipped.items():
        if attack not in running:
            raise SpecError(
                f"{source}: -a {attack} applies to no pair of this grid ({reason}); pick another -D or -a"
            )
