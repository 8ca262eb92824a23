"""The preset file (TOML) as pydantic models: which tables and keys exist and what their values are.

`fedbench.spec.grid.load_preset` checks every preset (and the preset it `extends`) against `Preset`
before anything expands it. What depends on the rest of fedbench is checked where it is used: plugin
names and parameters when the blocks expand, `[scenario]` keys against `Scenario`, `seeds` together with
`--seeds`/`--set grid.seeds` (which replace it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from fedbench.errors import SpecError
from fedbench.spec.schema import FileModel, Loc, MetricName, Syntax, ThresholdText, dotted, expect, validate


class SliceTable(FileModel):
    """[grid.board.slice]: the board on fewer seeds and inputs (`fedbench.reporting.board_slice`)."""

    seeds: Annotated[int, Field(ge=1)]
    victims: Annotated[int, Field(ge=1)] | None = None  # victims per run (the inputs of a seed)


class BoardTable(FileModel):
    """[grid.board]: what `fedbench export --to leaderboard` puts on the board (leaderboard.build)."""

    name: str | None = None
    title: str | None = None
    description: str | None = None
    threat_model: str | None = None  # who attacks, what it observes and knows (the board's README states it)
    headline: MetricName | None = None
    metrics: Annotated[list[MetricName], expect('a list of metric names, e.g. metrics = ["psnr"]')] = []
    budget: ThresholdText | None = None
    target: ThresholdText | None = None
    command: str | None = None
    # the v2 method (design §7.1): one primary leakage metric ranked within a utility budget
    primary: MetricName | None = None  # e.g. "reid" (inversion), "mia_tpr_at_1pct_fpr" (membership)
    utility_budget: Annotated[float, Field(ge=0)] | None = None  # accuracy drop vs none, in points
    threat_id: str | None = None  # the SoK threat model, e.g. "A (honest-but-curious server)"
    knowledge: dict[str, bool] = {}  # the attacker's knowledge switches, e.g. { labels = true }
    # how the rows' hyper-parameters were chosen (issue 30: a small grid selected on a validation split,
    # never on test), stated so that anyone can rerun it; the README prints it
    tuning: str | None = None
    slice: SliceTable | None = None  # `fedbench leaderboard build NAME --slice` builds it as NAME-slice
    # an inversion board's realistic-protocol companion preset (`fedbench.reporting.board_realistic`)
    realistic: str | None = None

    @model_validator(mode="after")
    def _v2(self) -> BoardTable:
        if (self.primary is None) != (self.utility_budget is None):
            raise ValueError("primary and utility_budget come together (the v2 ranking needs both)")
        return self


class SuiteTable(FileModel):
    """[grid.suite]: the suite is every applicable registered attack (`fedbench.spec.applicability`)."""

    include: Literal["applicable"] = "applicable"
    # attacks left out of the suite, each with the reason the board states
    exclude: Annotated[
        dict[str, str], expect('a table of attack = "reason", e.g. exclude = { sdan-poisoning = "..." }')
    ] = {}
    # the attack cascade (`fedbench.execution.cascade`): these attacks first, in this order; each later
    # attack of a defended row runs only on the inputs no earlier one re-identified
    cascade: Annotated[list[str], expect('a list of attack names, e.g. cascade = ["fc-leakage", "dlg"]')] = []


class GridTable(FileModel):
    """[grid]: the preset's name and provenance."""

    name: str | None = None
    description: str | None = None
    paper: str | None = None
    seeds: Any = None  # a count or a list of seeds: checked with the overrides (grid._seeds)
    substitution: str | None = None
    extends: str | None = None
    full_data: str | None = None
    board: BoardTable | None = None
    suite: SuiteTable | None = None


class Block(FileModel):
    """[[dataset]], [[model]], [[defense]] or [[attack]]: a plugin and its (swept) parameters."""

    name: str
    params: Annotated[dict[str, Any], expect("a table, e.g. params = { sigma = 0.1 }")] = {}
    # a model or attack block runs only for these datasets, an attack block only against these models
    datasets: Annotated[list[str], expect('a list of dataset names, e.g. datasets = ["digits"]')] = []
    models: Annotated[list[str], expect('a list of model names, e.g. models = ["mlp"]')] = []
    # an attack block runs only against these defenses (e.g. a costly attack on `none` and one DP row)
    defenses: Annotated[list[str], expect('a list of defense names, e.g. defenses = ["none"]')] = []
    adaptive: bool = False  # an attack block: also each defense's adaptive attack
    adaptive_params: Annotated[dict[str, Any], expect("a table, e.g. adaptive_params = { pool = 8 }")] = {}


Blocks = Annotated[list[Block], expect("an array of tables: write [[{key}]]")]
Rows = Annotated[list[dict[str, Any]], expect("an array of tables: write [[{key}]]")]


class Preset(FileModel):
    """A whole preset file."""

    unknown_key = "unknown table [{key}]{hint}"

    grid: GridTable | None = None
    scenario: dict[str, Any] | None = None  # keys checked against Scenario when the grid expands
    dataset: Blocks = []
    model: Blocks = []
    defense: Blocks = []
    attack: Blocks = []
    reported: Rows = []  # a paper's own numbers (fedbench.reporting.tables reads them)


SUBTABLES = ("board",)  # tables inside [grid]: [grid.board]


def toml_place(loc: Loc) -> str:
    """A place in a preset as its author reads it: ('grid', 'board', 'metrics', 1) -> '[grid.board]
    metrics[1]', ('attack', 0, 'params') -> '[[attack]] #1 params', ('scenario',) -> '[scenario]'."""
    if not loc:
        return ""
    head, rest = loc[0], loc[1:]
    if rest and isinstance(rest[0], int):
        table, rest = f"[[{head}]] #{rest[0] + 1}", rest[1:]
    elif rest and rest[0] in SUBTABLES:
        table, rest = f"[{head}.{rest[0]}]", rest[1:]
    else:
        table = f"[{head}]"
    return f"{table} {dotted(rest)}" if rest else table


TOML = Syntax(place=toml_place, table="a table", missing="needs {key}")


def check_preset(data: dict[str, Any], path: Path) -> Preset:
    """`data` (a parsed preset file) against the schema; a SpecError naming the file and table if not."""
    preset = validate(Preset, data, str(path), TOML, SpecError)
    for i, row in enumerate(preset.reported):
        _check_reported(row, f"{path}: [[reported]] #{i + 1}")
    return preset


# `[[reported]]` keys that name where a paper's number applies: plugin labels, and the paper's table
_REPORTED_LABELS = ("dataset", "defense", "attack", "source")


def _check_reported(row: dict[str, Any], where: str) -> None:
    """One `[[reported]]` row: labels are strings, a catalogued metric is a finite number, any other key
    (a condition on a row key such as `sc_batch_size = 64`) a single value. `compare --reported` reads
    these rows from the results' sidecar, where a table or a list in their place used to be a traceback."""
    import math

    from fedbench.metrics.catalogue import METRICS

    for key, value in row.items():
        if key in _REPORTED_LABELS:
            if not isinstance(value, str):
                raise SpecError(f"{where} {key} must be a string (a name), got {value!r}")
        elif key in METRICS or key in ("test_acc", "test_loss", "epsilon"):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise SpecError(f"{where} {key} must be a number (the paper's value), got {value!r}")
        elif isinstance(value, dict | list):
            raise SpecError(f"{where} {key} must be a single value (a condition on '{key}'), got {value!r}")
