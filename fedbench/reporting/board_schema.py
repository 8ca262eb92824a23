"""A leaderboard's files as pydantic models: `Board` (board.json) and `Entry` (entries/<defense>.json).

Entries are committed and rendered without re-running anything, so the schema is what keeps a hand edit
or a bad export from reaching the README: numbers are finite numbers (never "92.5%"), metric names are
in the catalogue, every key is known. `Board` is also the board in memory (`leaderboard.build` makes one
through `parse`); an entry stays the JSON document `leaderboard.build` writes, checked by `Entry`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from fedbench.metrics.catalogue import METRICS, Threshold, metric
from fedbench.reporting.intervals import value_range
from fedbench.spec.schema import FileModel, MetricName, Model, Syntax, dotted, field_error, invalid, validate

SCHEMA_VERSION = 2
# the entry schema of a board built with the v2 method (`board_rank`): per-input and per-seed values
# of every attack, from which ranks and intervals are computed at render time (never stored)
METHOD2_SCHEMA = 3
# the versions read: 1 (means and spreads only) renders as it always did; 2 adds the intervals inside
# the metric's range, a rate's counts, the per-seed values and how a worst case chose its attack; 3
# (the v2 method) adds every attack's per-input and per-seed values
READ_VERSIONS = (1, 2, 3)

JSON = Syntax(place=dotted, table="an object", missing="missing key '{key}'")


def parse(model: type[Model], data: Any, where: str) -> Model:
    """A board file's JSON as `model`, or a FedbenchError naming `where` and the key."""
    return validate(model, data, where, JSON)


def _current(version: int) -> int:
    if version not in READ_VERSIONS:
        raise invalid(
            f"schema {version} is not one of {', '.join(map(str, READ_VERSIONS))}; re-export the board"
        )
    return version


def _view(text: str) -> str:
    kind, _, condition = text.partition(":")
    if kind not in ("budget", "target"):
        raise invalid(f"view {text!r:.40} must start with budget: or target:")
    with field_error():
        Threshold.parse(condition, kind)
    return text


Version = Annotated[int, AfterValidator(_current)]
View = Annotated[str, AfterValidator(_view)]
"""'budget:acc_drop<=2' (best privacy at a utility budget) or 'target:psnr<=15' (best utility at a
privacy target), as `fedbench compare --budget/--target` take them."""
Names = Annotated[tuple[str, ...], Field(strict=False)]  # a JSON list, held as a tuple


class Gap(FileModel):
    """The no-defense worst case minus the baseline: the mean over seeds and its 95 % t interval (low and
    high are None with one seed)."""

    mean: float
    low: float | None = None
    high: float | None = None
    n: Annotated[int, Field(ge=1)]


class Baseline(FileModel):
    """What an attack achieves by guessing, in the headline metric: the random-image floor (psnr/ssim of
    uniform random images, the mean of the rows' `column`), the chance level of membership (AUC 0.5, the
    base rate) or the majority-class rate of attribute inference; `gap` is `none`'s distance to it."""

    metric: MetricName
    value: float
    kind: str  # "random image", "chance", "majority class"
    column: str = ""  # the results column it is the mean of ("" for a constant)
    gap: Gap | None = None


class FailedRuns(FileModel):
    """A defense configuration some of whose runs failed (training diverged, an attack error, a timeout):
    they are not in the board's means, and the README says so with the first reason."""

    defense: str
    failed: Annotated[int, Field(ge=1)]
    runs: Annotated[int, Field(ge=1)]
    reason: str = ""


class BoardCost(FileModel):
    """What building the board costs: each FL training counted once (all attacks and observation points
    of a training read the same run), plus every attack run."""

    utility_seconds: float
    attack_seconds: float
    trainings: Annotated[int, Field(ge=0)]
    attack_runs: Annotated[int, Field(ge=0)]


class BuildWall(FileModel):
    """How long the board took to build on the clock (`fedbench.reporting.build_wall`): the seconds of
    one build, summed over its invocations when it was interrupted and resumed, and how it ran."""

    seconds: Annotated[float, Field(ge=0)]
    runs: Annotated[int, Field(ge=0)]
    computed: Annotated[int, Field(ge=0)]  # runs computed in this build (the others came from the cache)
    from_empty: bool  # every run computed in this build: the wall time of a build from an empty cache
    invocations: Annotated[int, Field(ge=1)]
    n_jobs: str
    threads: str
    cores: Annotated[int, Field(ge=0)]
    date: str


class ReportedRow(FileModel):
    """A paper's own number for a configuration on the board (a `[[reported]]` row of its preset): where it
    applies, its values, and how the paper's setting differs (`conditions`, `source`, `note`)."""

    dataset: str = ""
    defense: str
    attack: str = ""
    values: dict[MetricName, float]
    conditions: dict[str, str] = {}
    source: str = ""
    note: str = ""


class VerifyStamp(FileModel):
    """What the last `fedbench leaderboard verify` re-ran and found: date, fedbench and torch versions,
    the CPU capability torch used, the runs re-run and the result ("pass" or the first difference)."""

    date: str
    fedbench_version: str
    torch_version: str
    cpu_capability: str
    sample: Annotated[int, Field(ge=0)]
    runs: list[str]
    result: str
    numbers: Annotated[int, Field(ge=0)] = 0  # how many numbers were compared


class BudgetRow(FileModel):
    """One row of a budget check: its primary rate as published and with the doubled budgets."""

    defense: str
    rate: float
    doubled: float
    low: float
    high: float
    passed: bool
    ceiling: bool = False  # at the metric's maximum on every input: not re-run (budget_check.at_ceiling)


class BudgetCheck(FileModel):
    """What the last `fedbench leaderboard budget-check` ran and found (`fedbench.reporting.budget_check`)."""

    date: str
    factor: Annotated[int, Field(ge=2)]
    seeds: list[int]
    attacks: list[str]
    auto: list[str] = []
    rows: list[BudgetRow]
    result: str


def _budget_check(value: dict[str, Any]) -> dict[str, Any]:
    """An empty table (no check recorded) or a whole `BudgetCheck`; kept as the dict it was read as."""
    if value:
        _validated(BudgetCheck, value)
    return value


def _validated(model: type[FileModel], value: dict[str, Any]) -> None:
    """Validate a dict-valued board field against its model, the first error as one line."""
    from pydantic import ValidationError

    try:
        model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{where}: {first['msg']}" if where else first["msg"]) from None


class RealisticRate(FileModel):
    """k of n attacked records re-identified, with the exact 95 % interval (`board_realistic.rate`)."""

    k: Annotated[int, Field(ge=0)]
    n: Annotated[int, Field(ge=1)]
    rate: Annotated[float, Field(ge=0, le=1)]
    low: Annotated[float, Field(ge=0, le=1)]
    high: Annotated[float, Field(ge=0, le=1)]


class RealisticAttack(FileModel):
    """One attack of the realistic protocol: its textbook rate (the board's none row) and its rates at
    the checkpoints, with the verdict (`board_realistic.verdict`)."""

    attack: str
    label: str
    textbook_label: str = ""
    textbook: RealisticRate | None = None
    checkpoints: list[RealisticRate | None]
    works: Literal["yes", "partly", "no", "n/a"]


class RealisticWorst(FileModel):
    """The worst case per record over the attacks: its textbook rate and its rates at the checkpoints."""

    textbook: RealisticRate | None = None
    checkpoints: list[RealisticRate | None]
    works: Literal["yes", "partly", "no", "n/a", ""] = ""


class Realistic(FileModel):
    """The realistic-protocol record of an inversion board (`fedbench.reporting.board_realistic`)."""

    preset: str
    command: str
    description: str = ""
    primary: str
    rounds: list[int]
    checkpoints: list[str]
    seeds: list[int]
    scenario: dict[str, Any]
    test_acc: float | None = None
    attacks: list[RealisticAttack]
    worst: RealisticWorst
    floor: list[RealisticRate | None]


def _realistic(value: dict[str, Any]) -> dict[str, Any]:
    """An empty table (no realistic protocol run) or a whole `Realistic`; kept as the dict it was read as."""
    if value:
        _validated(Realistic, value)
    return value


class RemovedRow(FileModel):
    """A configuration taken off the board after it was built (`leaderboard remove`), with why and what
    it measured then, so the README still says it was there (`fedbench.reporting.board_remove`)."""

    defense: str
    reason: str
    date: str
    measured: str = ""  # its primary rate, accuracy and epsilon when it was removed


class ExternalAttack(FileModel):
    """An attack evaluated on the board after it was built (`leaderboard add -a`): RobustBench's external
    (adaptive) evaluations. Its values sit in the entries like the suite's; `verify` re-runs it too."""

    attack: str  # the attack's label, as in the suite
    date: str
    plugin: dict[str, str] | None = None  # the plugin file's name and source digest, when it came from one


class Board(FileModel):
    """board.json: one scenario slice with a fixed attack suite, its headline metric and how to rerun it."""

    version: Version = Field(alias="schema")
    name: str
    title: str
    description: str = ""
    scenario: dict[str, Any]  # dataset, model and the sc_* FL settings every entry shares
    attack_suite: Names
    headline: MetricName  # the leakage metric rows are ranked by (worst case over the suite)
    metrics: Annotated[tuple[MetricName, ...], Field(strict=False)]
    command: str  # the command that regenerates the board
    preset: str = ""
    substitution: str = ""  # what stands in for the paper's data, when something does
    views: Annotated[tuple[View, ...], Field(strict=False)] = ()
    # optional (boards built before them load and render without them)
    threat_model: str = ""  # who the attacker is, what it sees and knows ([grid.board] threat_model)
    baseline: Baseline | None = None  # the random-image floor / chance level of the headline
    build_seconds: float | None = None  # compute of all the board's runs, CPU-seconds summed over runs
    build_wall: BuildWall | None = None  # the build's wall-clock time (None: built before it was kept)
    cost: BoardCost | None = None
    reported: Annotated[tuple[ReportedRow, ...], Field(strict=False)] = ()  # the papers' numbers
    failures: Annotated[tuple[FailedRuns, ...], Field(strict=False)] = ()  # runs not in the means
    # the v2 method (`board_rank`, design §7.1): set by a preset's [grid.board] primary/utility_budget
    board_version: Annotated[int, Field(ge=1)] = 1  # 2: the v2 method; v1 boards render as before
    primary: str = ""  # the one leakage metric rows are ranked by (worst case per input)
    utility_budget: float | None = None  # accuracy drop vs none (points, paired by seed) a row may cost
    threat_id: str = ""  # the SoK threat model (gradient inversion SoK, USENIX Security 2025: A-H)
    knowledge: dict[str, bool] = {}  # the attacker's knowledge switches (labels, defense, ...)
    tuning: str = ""  # the declared rule that chose the rows' hyper-parameters ([grid.board] tuning)
    slice_of: str = ""  # a slice (`board_slice`): the full board it stands for
    verified: VerifyStamp | None = None  # the last `fedbench leaderboard verify`
    environment: dict[str, str] = {}  # torch version and CPU capability of the build (verify compares)
    external_attacks: Annotated[tuple[ExternalAttack, ...], Field(strict=False)] = ()  # `add -a`
    # the last `leaderboard budget-check` (`BudgetCheck`), {} when none was run
    budget_check: Annotated[dict[str, Any], AfterValidator(_budget_check)] = {}
    # the realistic protocol beside the textbook one (`Realistic`), {} when the board declares none
    realistic: Annotated[dict[str, Any], AfterValidator(_realistic)] = {}
    removed: Annotated[tuple[RemovedRow, ...], Field(strict=False)] = ()  # `leaderboard remove`
    # the attack cascade the build ran (`fedbench.execution.cascade`): the attacks first, in order
    cascade: Annotated[tuple[str, ...], Field(strict=False)] = ()

    @model_validator(mode="after")
    def _method(self) -> Board:
        if self.board_version >= 2:
            if not self.primary or self.utility_budget is None:
                raise invalid("a v2 board declares its primary metric and its utility_budget")
            metric(self.primary)
        return self

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


Count = Annotated[float, Field(ge=0, strict=False)]  # a number of successes or inputs (an int in JSON)
PerSeed = Annotated[list[float | None], Field(strict=False)]


class Stat(FileModel):
    """A metric aggregated over seeds: the mean over n seeds, its spread (std with two seeds, the 95 % t
    half-width with three or more) and (schema 2) its 95 % interval [low, high] inside the metric's
    range (`intervals`: Clopper-Pearson for a rate, whose `k` successes in `inputs` inputs are pooled
    over seeds; the t interval clipped to the range otherwise; `spread_kind` "cp95" for a rate). Schema
    2 also keeps the values the mean averages, one per seed of the entry (None where a seed has none),
    and a rate's successes and inputs per seed, so intervals and rank stability are recomputed from the
    entries (`board_stats.restat_board`). Like every float of a `FileModel`, the numbers are finite."""

    mean: float
    spread: float | None = None
    spread_kind: str = ""
    n: Annotated[int, Field(ge=1)]
    attack: str = ""  # a worst case: the attack that achieved it
    per_input: bool = False  # a worst case: taken per input image before averaging
    selection: str = ""  # a worst case: how its attack was chosen (`tables.SELECTIONS`)
    low: float | None = None
    high: float | None = None
    k: Count | None = None
    inputs: Count | None = None
    per_seed: PerSeed | None = None
    per_seed_k: PerSeed | None = None
    per_seed_inputs: PerSeed | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Stat:
        if (self.low is None) != (self.high is None):
            raise invalid("low and high come together")
        if self.low is not None and not self.low <= self.mean <= self.high:
            raise invalid(f"interval [{self.low}, {self.high}] must hold the mean {self.mean}")
        if (self.k is None) != (self.inputs is None) or (self.k is not None and self.k > self.inputs):
            raise invalid(f"k = {self.k} successes must come with inputs >= k (inputs = {self.inputs})")
        lists = [x for x in (self.per_seed, self.per_seed_k, self.per_seed_inputs) if x is not None]
        if len({len(x) for x in lists}) > 1:
            raise invalid("per_seed, per_seed_k and per_seed_inputs must have one value per seed each")
        return self


class Cost(FileModel):
    utility_seconds: float | None = None
    attack_seconds: float | None = None


class EpsLower(FileModel):
    """The empirical lower bound on epsilon of a privacy audit (membership attacks' scores): the largest
    over the configuration's runs (each a one-sided 95 % bound at `delta`), the run that gave it."""

    max: Annotated[float, Field(ge=0)]
    attack: str
    seed: int
    n: Annotated[int, Field(ge=1)]  # runs with a bound
    delta: float | None = None


def _within_range(name: str, stat: Stat | None) -> None:
    """An interval inside what its metric can take (`intervals.value_range`)."""
    if stat is None or stat.low is None:
        return
    lo, hi = value_range(metric(name))
    if stat.low < lo or stat.high > hi:
        raise invalid(f"{name}: interval [{stat.low}, {stat.high}] leaves the metric's range [{lo}, {hi}]")


class EntryMetrics(FileModel):
    test_acc: Stat
    acc_drop: Stat | None = None
    epsilon: float | None = None  # None: no formal guarantee, or (epsilon_infinite) no finite bound
    delta: float | None = None
    dp_level: str | None = None
    accountant: str | None = None
    epsilon_infinite: bool = False  # the accountant gave no finite epsilon (rendered as ∞)
    eps_lower: EpsLower | None = None
    # `leaderboard audit`: the one-run audit's bound (eps_lower, confidence, delta, formal_eps, seed, method)
    one_run_audit: dict[str, Any] | None = None
    leakage: dict[str, dict[str, Stat | None]] | None = None  # attack -> metric -> stat
    worst_case: dict[MetricName, Stat | None] | None = None  # over the attack suite
    cost: Cost | None = None

    @model_validator(mode="after")
    def _intervals_in_range(self) -> EntryMetrics:
        stats = [("test_acc", self.test_acc), ("acc_drop", self.acc_drop)]
        stats += [(n, st) for per in (self.leakage or {}).values() for n, st in per.items()]
        stats += list((self.worst_case or {}).items())
        for name, stat in stats:
            if name in METRICS:  # a leakage key is free text until the metric checks it
                _within_range(name, stat)
        return self


def _share(value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise invalid(f"{value} must be a share between 0 and 1")
    return value


def _interval(bounds: list[int]) -> list[int]:
    if len(bounds) != 2 or not 1 <= bounds[0] <= bounds[1]:
        raise invalid(f"interval {bounds} must be [low, high] ranks with 1 <= low <= high")
    return bounds


class RankStability(FileModel):
    """How stable an entry's Pareto rank is under a bootstrap over seeds (`ranking.rank_stability`):
    the rank the board gave it when it was built, the share of resamples giving that rank, and the 95 %
    percentile interval of its rank. Optional in an entry: boards exported before it render without the
    rank-stability column, as they always did."""

    rank: Annotated[int, Field(ge=1)]
    same_rank: Annotated[float, AfterValidator(_share)]
    interval: Annotated[list[int], AfterValidator(_interval)]
    resamples: Annotated[int, Field(ge=1)]
    rng_seed: int
    joint: bool = (
        False  # the board's seeds drawn once for every configuration (entries before: per configuration)
    )


SeedKey = Annotated[str, Field(pattern=r"^[0-9]+$")]  # a seed, as a JSON object's key


class PerInputRecord(FileModel):
    """per_input[attack][seed]: one attack's per-input values in one seed. `victims[i]` (an index, or
    a victim batch's indices) holds `counts[i]` inputs, whose values follow in order in each list of
    `values` (None: not scored); `runs` are the run ids they come from."""

    victims: list[int | list[int]]
    counts: list[Annotated[int, Field(ge=0)]]
    runs: list[str]
    values: dict[MetricName, list[float | None]]

    @model_validator(mode="after")
    def _aligned(self) -> PerInputRecord:
        if len(self.victims) != len(self.counts):
            raise invalid(f"{len(self.victims)} victims for {len(self.counts)} counts")
        n = sum(self.counts)
        for name, values in self.values.items():
            if len(values) != n:
                raise invalid(f"values.{name} has {len(values)} values for {n} inputs")
        return self


class Entry(FileModel):
    """entries/<defense>.json: one defense configuration on a board, with provenance."""

    version: Version = Field(alias="schema")
    board: str
    defense: str
    defense_name: str
    params: dict[str, Any]
    scenario: dict[str, Any]
    attack_suite: list[str]
    seeds: list[int]
    run_ids: list[str]
    metrics: EntryMetrics
    fedbench_version: str
    date: str
    rank_stability: RankStability | None = None
    # schema 3 (the v2 method, `board_inputs`): every attack's per-input and per-seed values
    per_input: dict[str, dict[SeedKey, PerInputRecord]] | None = None
    # per_seed[attack][seed]: the run's metric values ("name:n": how many inputs a rate counts) and runs
    per_seed: dict[str, dict[SeedKey, dict[str, float | list[str] | None]]] | None = None
    plugin: dict[str, str] | None = None  # `leaderboard add --plugin`: the file's name and source digest

    @model_validator(mode="after")
    def _one_value_per_seed(self) -> Entry:
        m = self.metrics
        stats = [m.test_acc, m.acc_drop, *(st for per in (m.leakage or {}).values() for st in per.values())]
        stats += list((m.worst_case or {}).values())
        for st in stats:
            if st is not None and st.per_seed is not None and len(st.per_seed) != len(self.seeds):
                raise invalid(f"per_seed has {len(st.per_seed)} values for {len(self.seeds)} seeds")
        return self
