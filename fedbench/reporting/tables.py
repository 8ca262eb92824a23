"""Trade-off tables from results files: loading, filtering, pivoting over seeds, rendering.

A `Pivot` has one row per configuration (default: per defense, plus dataset/model/scenario columns
when they vary) and columns for utility (accuracy, drop vs `none`, epsilon) and, per attack, the
chosen leakage metrics, plus the worst case over the attack suite when there are several attacks.
By default the leakage metrics are each present attack family's defaults (reconstruction: psnr, ssim,
label_acc; membership: mia_auc, mia_acc; ...), a family's columns covering its own attacks only.
Cells aggregate seeds: mean ± std (95% CI when n >= 3), median, or the worst seed. Header arrows
point to the better direction for the defender (↑ accuracy; ↓ PSNR, i.e. less leakage), as the
metric catalogue (`fedbench.metrics.catalogue`) declares it.

Worst case over the suite is computed per input then aggregated when the results' sidecar holds
per-image scores (`per_image` keyed by run_id); membership and attribute attacks are chosen out of
sample (on each seed, the attack with the highest mean over the other seeds); otherwise per
(configuration, seed) from the row-level means; the attack achieving it is named either way
(`worst_case`). A mean's interval stays inside the metric's range (`intervals`): a rate's is the
Clopper-Pearson interval of k of n inputs pooled over seeds, printed as [low, high]. Thresholds in
`--budget`/`--target` use the units shown in the tables (accuracy and drops in percent / percentage
points).

Paper numbers (`--reported`) come from the presets' `[[reported]]` rows in the sidecar: a `defense`
pattern, an optional `attack` pattern, and metric values in results units (accuracy as a fraction),
e.g. `{ defense = "dp-gaussian[sigma=0.01]", attack = "idlg", psnr = 14.2, source = "Table 2" }`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from fedbench.errors import FedbenchError, UnknownNameError, did_you_mean
from fedbench.metrics.catalogue import (
    METRICS,
    Metric,
    Threshold,
    adopt_families,
    attack_families,
    metric,
)
from fedbench.reporting.input_keys import input_keys, sort_key
from fedbench.reporting.intervals import ONE_PER_RUN, RATE, inputs_column, summarise, t95

Agg = Literal["mean", "median", "worst"]
Keep = Literal["last", "all"]
FORMATS = ("rich", "markdown", "latex", "csv", "json")
WORST = "worst-case"


UTILITY_BLOCK = ("test_acc", "acc_drop", "epsilon")


# -------------------------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class ResultSet:
    """Rows of one or more results files (deduplicated by run_id) and their JSON sidecars."""

    frame: Any
    sidecars: tuple[dict[str, Any], ...]
    paths: tuple[Path, ...]

    @property
    def reported(self) -> list[dict[str, Any]]:
        return [r for s in self.sidecars for r in s.get("reported", []) or []]

    @property
    def per_image(self) -> dict[str, dict[str, list]]:
        out: dict[str, dict[str, list]] = {}
        for s in self.sidecars:
            out.update(s.get("per_image", {}) or {})
        return out

    @property
    def board(self) -> dict[str, Any]:
        for s in reversed(self.sidecars):
            if s.get("board"):
                return dict(s["board"])
        return {}


def resolve_paths(paths: Sequence[str | Path], default_dir: str | Path = "results") -> list[Path]:
    """Files as given; a directory (or nothing: `default_dir`) means its newest results file."""
    from fedbench.reporting.results import newest_results

    if not paths:
        return [newest_results(default_dir)]
    out = []
    for p in map(Path, paths):
        out.append(newest_results(p) if p.is_dir() else p)
    return out


def load_results(paths: Sequence[str | Path], keep: Keep = "last", default_dir: str | Path = "results"):
    """Read results files in order; with keep='last' a run_id seen again replaces the earlier row."""
    import pandas as pd

    from fedbench.reporting.results import METRIC_FAMILIES_KEY, read_results

    if keep not in ("last", "all"):
        raise FedbenchError(f"--keep {keep}: use 'last' or 'all'")
    files = resolve_paths(paths, default_dir)
    frames, sidecars = [], []
    for path in files:
        frame = read_results(path)
        if frame.empty:
            raise FedbenchError(f"{path}: the results file holds no runs; run 'fedbench run' again")
        frame["_file"] = str(path)
        frames.append(frame)
        side = path.with_suffix(".json")
        if side.is_file():
            try:
                sidecars.append(json.loads(side.read_text(encoding="utf-8")))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise FedbenchError(
                    f"{side}: sidecar is not valid JSON; rewrite it with 'fedbench run'"
                ) from None
            # a plugin family's metrics render from the file's own description, plugin loaded or not
            adopt_families(sidecars[-1].get(METRIC_FAMILIES_KEY) or {}, str(side))
        else:
            sidecars.append({})
    frame = pd.concat(frames, ignore_index=True, sort=False)
    if keep == "last":
        frame = frame.drop_duplicates(subset="run_id", keep="last").reset_index(drop=True)
    for col in ("attack", "attack_name", "reason"):
        if col in frame.columns:
            frame[col] = frame[col].fillna("").astype(str)
    return ResultSet(frame, tuple(sidecars), tuple(files))


# ------------------------------------------------------------------------------------------- filters


_WHERE = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(!=|=)\s*(.*?)\s*$")


def apply_where(frame, wheres: Sequence[str]):
    """Keep rows matching every 'column=value' / 'column!=value' (values compared as text)."""
    for text in wheres or ():
        m = _WHERE.match(text)
        if not m:
            raise FedbenchError(f"--where {text!r}: write column=value, e.g. --where dataset=mnist5k")
        col, op, value = m.groups()
        if col not in frame.columns:
            cols = [c for c in frame.columns if not c.startswith("_")]
            more = did_you_mean(col, cols, prefix="; ", suffix="")
            raise UnknownNameError(f"--where {text!r}: no column '{col}'{more}")
        as_text = frame[col].map(_as_text)
        mask = (as_text == value) if op == "=" else (as_text != value)
        if not mask.any():
            values = sorted(set(as_text))[:8]
            raise FedbenchError(f"--where {text!r} matches no run ({col} values: {', '.join(values)})")
        frame = frame[mask]
    return frame


def _as_text(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


# ------------------------------------------------------------------------------------------- pivoting


@dataclass(frozen=True)
class Cell:
    """One aggregated value: mean/median/worst over n seeds, its spread (std or CI half-width) and its
    95 % interval inside the metric's range (`low`, `high`; `intervals.summarise`).

    A rate pooled over seeds also carries its counts (`k` successes in `inputs` inputs). `per_seed`
    keeps the values the mean averages, as (seed, value, inputs) triples, so a board entry can store
    them; a worst-case cell names its attack and how the attack was chosen (`selection`).
    """

    value: float | None
    spread: float | None = None
    spread_kind: str = ""
    n: int = 0
    attack: str = ""  # worst-case cells: the attack that achieved it
    reported: float | None = None
    per_input: bool = False  # worst-case cells: taken per input (image) before averaging
    low: float | None = None
    high: float | None = None
    k: float | None = None
    inputs: float | None = None
    per_seed: tuple[tuple[Any, float, float | None], ...] = ()
    selection: str = ""  # worst-case cells: `SELECTIONS`

    @property
    def diff(self) -> float | None:
        if self.reported is None or self.value is None or math.isnan(self.value):
            return None
        return self.value - self.reported

    @property
    def bracketed(self) -> bool:
        """Whether the interval shows as [low, high]: a rate's, or one the metric's range clipped (an
        unclipped t interval stays mean ± half-width)."""
        if self.value is None or self.low is None or self.high is None:
            return False
        if self.spread is None or self.spread_kind == RATE:
            return True
        tol = 1e-5 * max(1.0, abs(self.value), abs(self.spread))
        return (
            abs(self.value - self.spread - self.low) > tol or abs(self.value + self.spread - self.high) > tol
        )


@dataclass(frozen=True)
class Column:
    key: str
    metric: Metric
    group: str = ""  # attack label, WORST, or "" for per-defense metrics

    @property
    def header(self) -> str:
        return f"{self.group} {self.metric.header}" if self.group else self.metric.header


@dataclass(frozen=True)
class Pivot:
    """A rendered-ready trade-off table: row keys, columns, and cells per row."""

    title: str
    row_keys: tuple[str, ...]
    columns: tuple[Column, ...]
    rows: tuple[tuple[tuple[str, ...], dict[str, Cell]], ...]
    agg: str = "mean"
    extra: dict[str, tuple[str, ...]] = field(default_factory=dict)  # e.g. rank column values

    def cell(self, i: int, key: str) -> Cell:
        return self.rows[i][1].get(key, Cell(None))


_t95 = t95  # the t quantile, as other reporting modules import it from here


def aggregate(
    values: Sequence[float],
    m: Metric,
    agg: Agg = "mean",
    inputs: Sequence[float | None] | None = None,
    seeds: Sequence[Any] | None = None,
) -> Cell:
    """Aggregate per-seed values: the mean with its interval (`intervals.summarise`: a rate with
    `inputs` pooled as k of n with Clopper-Pearson; otherwise ± std for n < 3, ± 95% t CI clipped to
    the metric's range for n >= 3), the median, or the worst. `seeds` (parallel to `values`) labels
    the values the cell keeps in `per_seed`."""
    import numpy as np

    present = [i for i, v in enumerate(values) if v is not None and not math.isnan(v)]
    vals = np.asarray([values[i] for i in present], dtype=float)
    n = int(vals.size)
    if n == 0:
        return Cell(None, n=0)
    if agg == "median":
        return Cell(float(np.median(vals)), n=n)
    if agg == "worst":
        return Cell(float(vals.min() if m.better == "higher" else vals.max()), n=n)
    s = summarise(m, [float(v) for v in vals], None if inputs is None else [inputs[i] for i in present])
    per_seed = (
        tuple((seeds[i], float(values[i]), None if inputs is None else inputs[i]) for i in present)
        if seeds is not None
        else ()
    )
    return Cell(
        s.value,
        s.spread,
        s.spread_kind,
        s.n,
        low=s.low,
        high=s.high,
        k=s.k,
        inputs=s.inputs,
        per_seed=per_seed,
    )


def slice_columns(frame) -> list[str]:
    """Columns that define a comparable slice (baseline `none` is looked up within it)."""
    return [c for c in ("dataset", "model") if c in frame.columns] + sorted(
        c for c in frame.columns if c.startswith("sc_")
    )


def default_rows(frame) -> list[str]:
    varying = [c for c in slice_columns(frame) if frame[c].map(_as_text).nunique() > 1]
    return varying + ["defense"]


def _key(values: Any) -> tuple[str, ...]:
    return tuple(_as_text(v) for v in (values if isinstance(values, tuple) else (values,)))


def observation_columns(frame) -> list[str]:
    """The scenario columns of the attacker's vantage point (`sc_observe`, ...): not part of the training."""
    from fedbench.reporting.results import SCENARIO_PREFIX
    from fedbench.spec.run import OBSERVATION_FIELDS

    return [c for c in (SCENARIO_PREFIX + f for f in OBSERVATION_FIELDS) if c in frame.columns]


def training_columns(frame) -> list[str]:
    """The columns that identify one FL training (the utility key, as results columns): dataset, model,
    defense and their parameters, the scenario without the observation point, and the seed.

    Taken from the columns rather than `utility_id`, so results written before the observation point
    left the utility key (where each observation point had its own `utility_id`) count a training once.
    """
    observe = set(observation_columns(frame))
    named = [c for c in ("dataset", "model", "defense", "seed") if c in frame.columns]
    params = [c for c in frame.columns if c.startswith(("p_dataset_", "p_model_", "p_defense_"))]
    scenario = [c for c in slice_columns(frame) if c.startswith("sc_") and c not in observe]
    return named + sorted(params) + scenario


def utility_frame(frame, row_keys: Sequence[str] = ()):
    """One row per distinct FL training (defense config x seed; x row keys such as attack that vary
    within one), with `acc_drop` vs `none` of the same slice and seed.

    Runs that share a training (several attacks, or several observation points, reading one FL run)
    enter once, so a mean and its CI count each training once.
    """
    ok = frame[frame["status"] == "ok"]
    cols = [c for c in ok.columns if not c.startswith("_")]
    subset = [*training_columns(ok), *[k for k in row_keys if k in ok.columns]]
    util = ok.drop_duplicates(subset=list(dict.fromkeys(subset)) or None)[cols].copy()
    observe = set(observation_columns(util))
    keys = [c for c in slice_columns(util) if c not in observe] + ["seed"]
    base = util[util["defense"] == "none"]
    lookup = {
        _key(tuple(r[c] for c in keys)): r["test_acc"] for _, r in base.iterrows() if "test_acc" in base
    }
    util["acc_drop"] = [
        (lookup.get(_key(tuple(r[c] for c in keys))) - r["test_acc"])
        if lookup.get(_key(tuple(r[c] for c in keys))) is not None
        else float("nan")
        for _, r in util.iterrows()
    ]
    return util


def _present(frame, name: str) -> bool:
    return name in frame.columns and frame[name].notna().any()


def row_families(frame):
    """Per row, the attack family whose metrics the row holds; '' when it holds none (a utility-only
    row, or an attack run whose output gave nothing to score)."""
    import pandas as pd

    out = pd.Series("", index=frame.index, dtype=object)
    for fam in attack_families():
        cols = [c for c in fam.metrics if c in frame.columns]
        if cols:
            out[frame[cols].notna().any(axis=1) & (out == "")] = fam.name
    return out


def _of_family(frame, m: Metric):
    """The rows a per-attack column of `m` covers: those of its attack family, or of no family; every
    row for a metric that belongs to no single family (attack_success, attack_seconds)."""
    if m.family not in {f.name for f in attack_families()}:
        return frame
    return frame[row_families(frame).isin([m.family, ""])]


def family_defaults(frame) -> list[list[Metric]]:
    """Per attack family with values in `frame`, in family order (reconstruction first): its default
    metrics that hold values (reconstruction: psnr, ssim, label_acc; membership: mia_auc, mia_acc)."""
    present = ([metric(n) for n in fam.default_metrics if _present(frame, n)] for fam in attack_families())
    return [ms for ms in present if ms]


def leakage_metrics(frame, names: Sequence[str] | None) -> list[Metric]:
    """The chosen metrics, or by default each present attack family's default metrics, only its
    headline (the first) when the family counts several attacks."""
    if names:
        return [metric(n) for n in names]
    out: list[Metric] = []
    for present in family_defaults(frame):
        attacks = 0
        if "attack" in frame:
            rows = _of_family(frame, present[0])
            attacks = rows.loc[rows["attack"] != "", "attack"].nunique()
        out += present[:1] if attacks > 1 else present
    return out


# how a worst-case cell chose its attack (`Cell.selection`, an entry's worst case `selection`)
PER_INPUT = "per-input max"  # the leakiest attack on each input, then averaged (AutoAttack)
PER_SEED = "per-seed max"  # the leakiest attack's value on each seed
HELD_OUT = "held-out seeds"  # on each seed, the attack with the highest mean over the other seeds
IN_SAMPLE = "in-sample (one seed)"  # HELD_OUT with one seed: nothing held out to choose on
ONLY_ATTACK = "only attack"  # one attack of the suite reports the metric: its value
SELECTIONS = (PER_INPUT, PER_SEED, HELD_OUT, IN_SAMPLE, ONLY_ATTACK)
# Attack families whose attacks answer from a small set (member or not, an attribute's class): a
# maximum over several such attacks counts lucky answers as leakage near chance, so their worst
# attack is chosen out of sample (`_held_out_worst`) instead of by a maximum.
SELECTED_FAMILIES = ("membership", "attribute")


class WorstSeed(NamedTuple):
    """One configuration's worst case on one seed (`worst_case`)."""

    key: tuple[str, ...]
    seed: Any
    value: float
    attack: str
    per_input: bool
    inputs: float | None = None  # the inputs the value counts, for a rate (`intervals.inputs_column`)
    selection: str = ""


RUNS_COLUMN = "_runs"  # how many runs a row stands for (a board's victim-pooled rows; absent: one)


def row_inputs(rows, column: str | None) -> list[float | None]:
    """Each row's input count for a rate (`intervals.inputs_column`); None where it is unknown. A rate
    counted per run (`ONE_PER_RUN`) counts the runs a pooled row stands for (`RUNS_COLUMN`)."""
    if column == ONE_PER_RUN:
        if RUNS_COLUMN not in rows:
            return [1.0] * len(rows)
        return [
            1.0 if _as_float(v) is None or math.isnan(_as_float(v)) else float(v) for v in rows[RUNS_COLUMN]
        ]
    if column is None or column not in rows:
        return [None] * len(rows)
    counts = [_as_float(v) for v in rows[column]]
    return [None if c is None or math.isnan(c) else c for c in counts]


def _as_float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def worst_case(
    frame, m: Metric, by: Sequence[str], per_image: dict[str, dict[str, list]] | None = None
) -> list[WorstSeed]:
    """Per (`by` + seed): the worst case over attacks, the attack that achieved it, how it was chosen.

    - With per-image scores for every attack of a group, the worst case is taken per input (image i:
      the leakiest attack on that image), then averaged; the attack named is the one that won most
      images (`PER_INPUT`, AutoAttack's rule: any attack's success on an input counts).
    - The attacks of `SELECTED_FAMILIES` (membership, attribute inference) are chosen out of sample:
      see `_held_out_worst` (`HELD_OUT`).
    - Otherwise it is the leakiest attack's row-level value on each seed (`PER_SEED`).
    """
    import numpy as np

    att = frame[(frame["status"] == "ok") & (frame["attack"] != "")]
    if not _present(att, m.name):
        return []
    att = att[att[m.name].notna()]
    column = inputs_column(m)
    if m.family in SELECTED_FAMILIES:
        return _held_out_worst(att, m, by, column)
    out = []
    sign = m.leakage_sign
    for keys, grp in att.groupby([*by, "seed"], sort=False, dropna=False):
        keys = keys if isinstance(keys, tuple) else (keys,)
        arrays = [(per_image or {}).get(r, {}).get(m.name) for r in grp["run_id"]]
        arrays = [a if a is not None and all(v is not None for v in a) else None for a in arrays]
        mat = _inputs_matrix(arrays, list(grp["sc_victim"]) if "sc_victim" in grp else None)
        if per_image and mat is not None:
            mat = mat * sign  # attacks x inputs, larger = leakier; NaN: an input the attack did not cover
            win = np.nanargmax(mat, axis=0)
            value = float(np.mean(mat[win, np.arange(mat.shape[1])]) * sign)
            attack = list(grp["attack"])[Counter(win.tolist()).most_common(1)[0][0]]
            out.append(WorstSeed(_key(keys[:-1]), keys[-1], value, attack, True, None, PER_INPUT))
        else:
            scores = grp[m.name].astype(float) * sign
            best = scores.idxmax()
            inputs = row_inputs(grp.loc[[best]], column)[0]
            value = float(grp.loc[best, m.name])
            out.append(
                WorstSeed(_key(keys[:-1]), keys[-1], value, grp.loc[best, "attack"], False, inputs, PER_SEED)
            )
    return out


def _inputs_matrix(arrays: list[list | None], victims: list[Any] | None):
    """Attacks x inputs of one group's per-image scores, or None when an attack has none. Inputs are
    matched by (victim, position) when every run says its victims (`input_keys`: a cascade's later
    attacks cover fewer victims, NaN elsewhere), else by position when the runs have equal lengths."""
    import numpy as np

    if any(a is None for a in arrays) or not arrays:
        return None
    keyed = [input_keys(v, len(a)) for v, a in zip(victims, arrays, strict=True)] if victims else []
    if keyed and all(k is not None for k in keyed):
        union = sorted({k for ks in keyed for k in ks}, key=sort_key)
        index = {k: i for i, k in enumerate(union)}
        mat = np.full((len(arrays), len(union)), np.nan)
        for row, (ks, a) in enumerate(zip(keyed, arrays, strict=True)):
            mat[row, [index[k] for k in ks]] = np.asarray(a, dtype=float)
        return mat
    if len({len(a) for a in arrays}) == 1:
        return np.asarray(arrays, dtype=float)
    return None


def _held_out_worst(att, m: Metric, by: Sequence[str], column: str | None) -> list[WorstSeed]:
    """The worst attack chosen out of sample, so that selection noise is not counted as leakage.

    Per configuration and seed s, the attack is the one with the highest mean over the configuration's
    other seeds (leave-one-seed-out cross-fitting: a seed is an independent draw of the split, the
    initialisation and the attacks' randomness, so the choice does not see seed s's noise), and the
    value reported for s is that attack's value on s; the configuration's worst case is the mean of
    these over its seeds. Ties go to the attack listed first; an attack without a value on the other
    seeds is chosen last. With one seed nothing is held out: the leakiest attack of that seed is
    taken and the selection says so (`IN_SAMPLE`).

    Design §7.1 asks for the choice on a held-out split of the scored inputs; the membership and
    attribute scorers keep only each run's statistics (an AUC, an accuracy), not per-input scores, and
    an AUC does not split over inputs into a mean, so the seeds are the held-out split here.
    Several runs of one (seed, attack) (victims or other settings a table does not split) enter as
    their mean, weighted by their inputs for a rate.
    """
    import numpy as np

    sign = m.leakage_sign
    out = []
    groups = att.groupby(list(by), sort=False, dropna=False) if by else [((), att)]
    for keys, grp in groups:
        keys = keys if isinstance(keys, tuple) else (keys,)
        attacks = list(dict.fromkeys(grp["attack"]))
        seeds = list(dict.fromkeys(grp["seed"]))
        runs: dict[tuple[Any, str], tuple[float, float | None]] = {}
        for (seed, attack), rows in grp.groupby(["seed", "attack"], sort=False):
            values = [float(v) for v in rows[m.name]]
            counts = row_inputs(rows, column)
            known = all(c is not None for c in counts) and sum(counts) > 0
            value = sum(v * c for v, c in zip(values, counts, strict=True)) / sum(counts) if known else None
            runs[(seed, attack)] = (
                float(np.mean(values)) if value is None else value,
                float(sum(counts)) if known else None,
            )

        for s, pick, selection in _held_out_picks(runs, attacks, seeds, sign):
            value, inputs = runs[(s, pick)]
            out.append(WorstSeed(_key(keys), s, value, pick, False, inputs, selection))
    return out


def _held_out_picks(runs: dict[tuple[Any, str], tuple[float, float | None]], attacks, seeds, sign: int):
    """(seed, attack, selection) per seed: the attack with the highest mean (signed: larger = leakier)
    over the other seeds among those with a value on the seed (`_held_out_worst`)."""

    def score(attack: str, on: list[Any]) -> float:
        vals = [runs[(t, attack)][0] for t in on if (t, attack) in runs]
        return sign * sum(vals) / len(vals) if vals else -math.inf

    for s in seeds:
        others = [t for t in seeds if t != s]
        present = [a for a in attacks if (s, a) in runs]
        pick = max(present, key=lambda a: (score(a, others or [s]), -attacks.index(a)))
        yield s, pick, HELD_OUT if others else IN_SAMPLE


_REPORTED_KEYS = ("dataset", "defense", "attack", "source", "note")


@dataclass(frozen=True)
class Reported:
    """One `[[reported]]` row: where it applies (dataset, defense, attack, column conditions) and values.

    Extra fields that are not metrics (e.g. `sc_batch_size = 64`) are conditions on the table's row
    keys, so a paper table over a scenario parameter (Table 3 of spec 004: PSNR per batch size) can be
    carried cell by cell. A condition on a column the table does not show never matches.
    """

    dataset: str
    defense: str
    attack: str
    conditions: tuple[tuple[str, str], ...]
    values: dict[str, float]


def _reported_lookup(reported: Sequence[dict[str, Any]]) -> list[Reported]:
    """The reported rows with labels canonicalised when possible.

    A reported row without `dataset` applies to every dataset (''), one with it only to that dataset,
    so a preset can carry a paper's numbers for several datasets and the same defense.
    """
    out: list[Reported] = []
    for r in reported:
        if "defense" not in r:
            continue
        values = {k: float(v) for k, v in r.items() if k in METRICS and isinstance(v, int | float)}
        conditions = tuple(
            sorted((k, str(v)) for k, v in r.items() if k not in METRICS and k not in _REPORTED_KEYS)
        )
        out.append(
            Reported(
                _canonical_label("dataset", str(r["dataset"])) if r.get("dataset") else "",
                _canonical_label("defense", str(r["defense"])),
                _canonical_label("attack", str(r.get("attack", ""))),
                conditions,
                values,
            )
        )
    return out


def _reported_value(
    lookup: list[Reported],
    dataset: str,
    defense: str,
    attack: str,
    name: str,
    per_defense: bool,
    row: dict[str, str] | None = None,
) -> float | None:
    """The paper's value for a cell: this dataset first, then rows that name no dataset.

    `row` maps the table's row keys to this row's values (as text) for the rows' extra conditions.
    """
    row = row or {}

    def applies(r: Reported, ds: str) -> bool:
        return (
            r.dataset == ds
            and r.defense == defense
            and name in r.values
            and all(k in row and _same(row[k], v) for k, v in r.conditions)
        )

    for ds in (dataset, ""):
        for r in lookup:
            if applies(r, ds) and r.attack == attack:
                return r.values[name]
        if per_defense:  # a per-defense metric (accuracy, epsilon) may sit on any attack's row
            for r in lookup:
                if applies(r, ds):
                    return r.values[name]
    return None


def _same(shown: str, wanted: str) -> bool:
    """Row value vs reported condition, numerically when both are numbers (64 == 64.0)."""
    try:
        return float(shown) == float(wanted)
    except ValueError:
        return shown == wanted


def _canonical_label(kind: str, text: str) -> str:
    if not text:
        return ""
    try:
        from fedbench.spec.patterns import parse_pattern
        from fedbench.spec.run import ComponentSpec

        name, params = parse_pattern(text)
        return ComponentSpec.resolve(kind, name, params).label
    except Exception:  # a reported row for a plugin not loaded: keep its text
        return text


def pivot(
    results: ResultSet | Any,
    metrics: Sequence[str] | None = None,
    rows: Sequence[str] | None = None,
    cols: Sequence[str] | None = None,
    agg: Agg = "mean",
    where: Sequence[str] = (),
    reported: bool = False,
    title: str = "",
    per_image: dict[str, dict[str, list]] | None = None,
) -> Pivot:
    """The trade-off table of a `ResultSet` (or a results DataFrame with its `per_image` scores)."""
    frame = results.frame if isinstance(results, ResultSet) else results
    if per_image is None:
        per_image = results.per_image if isinstance(results, ResultSet) else {}
    if agg not in ("mean", "median", "worst"):
        raise FedbenchError(f"--agg {agg}: use mean, median or worst")
    frame = apply_where(frame, where)
    ok = frame[frame["status"] == "ok"]
    if ok.empty:
        reasons = Counter(frame["status"])
        raise FedbenchError(
            f"no successful runs to compare ({', '.join(f'{v} {k}' for k, v in reasons.items())})"
        )
    row_keys = list(rows) if rows else default_rows(ok)
    col_keys = list(cols) if cols else ["attack"]
    for c in row_keys + col_keys:
        if c not in ok.columns:
            more = did_you_mean(c, [x for x in ok.columns if not x.startswith("_")], prefix="; ", suffix="")
            raise UnknownNameError(f"no column '{c}' in the results{more}")
    chosen = list(metrics) if metrics else []
    per_defense = [metric(n) for n in UTILITY_BLOCK]
    per_defense += [metric(n) for n in chosen if not metric(n).per_attack and n not in UTILITY_BLOCK]
    leak = [metric(n) for n in chosen if metric(n).per_attack] if metrics else leakage_metrics(ok, None)
    for m in leak:
        if m.name not in ok.columns:
            raise FedbenchError(f"metric '{m.name}' is not in these results (no attack produced it)")

    util = utility_frame(ok, row_keys)
    order = list(dict.fromkeys(_key(tuple(r[c] for c in row_keys)) for _, r in ok.iterrows()))
    cells: dict[tuple[str, ...], dict[str, Cell]] = {k: {} for k in order}
    columns: list[Column] = [Column(m.name, m) for m in per_defense]

    def keyed(df, keys):
        return df.groupby(keys, sort=False, dropna=False) if keys else [((), df)]

    for m in per_defense:
        if m.name not in util.columns:
            continue
        for k, grp in keyed(util, row_keys):
            cells[_key(k)][m.name] = aggregate(
                list(grp[m.name].astype(float)), m, agg, seeds=list(grp["seed"])
            )

    attacked = ok[ok["attack"] != ""] if "attack" in ok.columns else ok.iloc[0:0]
    for m in leak:
        covered = _of_family(attacked, m)
        groups = list(dict.fromkeys(_key(tuple(r[c] for c in col_keys)) for _, r in covered.iterrows()))
        for g in groups:
            label = " ".join(
                (x if c == "attack" else f"{c}={x}") for c, x in zip(col_keys, g, strict=True) if x
            )
            col = Column(f"{label}:{m.name}", m, label)
            columns.append(col)
            sub = attacked[[_key(tuple(r[c] for c in col_keys)) == g for _, r in attacked.iterrows()]]
            for k, grp in keyed(sub, row_keys):
                cells[_key(k)][col.key] = aggregate(
                    list(grp[m.name].astype(float)),
                    m,
                    agg,
                    inputs=row_inputs(grp, inputs_column(m)),
                    seeds=list(grp["seed"]),
                )
        if col_keys == ["attack"] and len(groups) > 1 and "attack" not in row_keys:
            col = Column(f"{WORST}:{m.name}", m, WORST)
            columns.append(col)
            by: dict[tuple[str, ...], list[WorstSeed]] = {}
            for w in worst_case(attacked, m, row_keys, per_image):
                by.setdefault(w.key, []).append(w)
            for k, items in by.items():
                cell = aggregate(
                    [w.value for w in items],
                    m,
                    agg,
                    inputs=[w.inputs for w in items],
                    seeds=[w.seed for w in items],
                )
                cells.setdefault(k, {})[col.key] = dataclasses.replace(
                    cell,
                    attack=Counter(w.attack for w in items).most_common(1)[0][0],
                    per_input=all(w.per_input for w in items),
                    selection=", ".join(dict.fromkeys(w.selection for w in items)),
                )

    if reported:
        lookup = _reported_lookup(results.reported if isinstance(results, ResultSet) else [])
        if not lookup:
            raise FedbenchError("--reported: these results carry no [[reported]] paper numbers")
        if "defense" not in row_keys:
            raise FedbenchError("--reported needs 'defense' among --rows")
        di = row_keys.index("defense")
        datasets = list(dict.fromkeys(frame["dataset"])) if "dataset" in frame else []
        only = datasets[0] if len(datasets) == 1 else ""
        for k, row_cells in cells.items():
            dataset = k[row_keys.index("dataset")] if "dataset" in row_keys else only
            for col in columns:
                att = col.group if col.group and col.group != WORST else ""
                value = _reported_value(
                    lookup,
                    dataset,
                    k[di],
                    att,
                    col.metric.name,
                    per_defense=not col.group,
                    row={c: str(x) for c, x in zip(row_keys, k, strict=True)},
                )
                if value is not None and col.key in row_cells:
                    c = row_cells[col.key]
                    row_cells[col.key] = dataclasses.replace(c, reported=value)
    # drop columns with no value at all (e.g. epsilon for non-DP grids is kept: the schema asks for it)
    columns = [c for c in columns if c.key == "epsilon" or any(c.key in r for r in cells.values())]
    bracketed = any(cell.bracketed for row in cells.values() for cell in row.values())
    return Pivot(
        title=title or _title(agg, bracketed),
        row_keys=tuple(row_keys),
        columns=tuple(columns),
        rows=tuple((k, cells[k]) for k in order),
        agg=agg,
    )


INTERVAL_NOTE = (
    "[low, high] = 95% interval inside the metric's range (rates: Clopper-Pearson on k of n inputs pooled "
    "over seeds)"
)


def _title(agg: str, bracketed: bool = False) -> str:
    what = {"mean": "mean ± std over seeds (± 95% CI when n ≥ 3)", "median": "median over seeds"}
    note = f"; {INTERVAL_NOTE}" if bracketed else ""
    return f"trade-off per configuration, {what.get(agg, 'worst seed')}{note}; ↑/↓ = better direction"


# --------------------------------------------------------------------------------------------- views


def headline_column(p: Pivot, name: str | None = None) -> Column | None:
    """The leakage column used for ranking and views: worst case over the suite, else the only one."""
    leak = [c for c in p.columns if c.metric.kind == "leakage" and (name is None or c.metric.name == name)]
    worst = [c for c in leak if c.group == WORST]
    if worst:
        return worst[0]
    groups = {c.group for c in leak}
    return leak[0] if leak and (len(groups) == 1 or name) else (leak[0] if leak else None)


def select_rows(p: Pivot, keep: Sequence[int], title: str) -> Pivot:
    return Pivot(title, p.row_keys, p.columns, tuple(p.rows[i] for i in keep), p.agg, dict(p.extra))


def budget_view(p: Pivot, budget: Threshold) -> Pivot:
    """Best privacy at a utility budget: rows meeting the budget, least leakage first."""
    if budget.metric not in {c.key for c in p.columns}:
        raise FedbenchError(f"--budget {budget}: '{budget.metric}' is not a column of this table")
    lc = headline_column(p)
    if lc is None:
        raise FedbenchError("--budget needs leakage columns: these results hold no attack runs")
    keep = [i for i in range(len(p.rows)) if budget.ok(p.cell(i, budget.metric).value)]
    if not keep:
        raise FedbenchError(f"--budget {budget}: no configuration meets it")
    sign = lc.metric.leakage_sign
    keep.sort(key=lambda i: (_num(p.cell(i, lc.key).value) * sign, -_num(p.cell(i, "test_acc").value, -1)))
    return select_rows(p, keep, f"best privacy at {budget} (sorted by {lc.header})")


def target_view(p: Pivot, target: Threshold) -> Pivot:
    """Best utility at a privacy target: rows whose headline leakage meets it, best accuracy first."""
    col = headline_column(p, target.metric) if metric(target.metric).kind == "leakage" else None
    key = col.key if col else target.metric
    if key not in {c.key for c in p.columns}:
        raise FedbenchError(f"--target {target}: '{target.metric}' is not a column of this table")
    keep = [i for i in range(len(p.rows)) if target.ok(p.cell(i, key).value)]
    if not keep:
        raise FedbenchError(f"--target {target}: no configuration meets it")
    keep.sort(key=lambda i: -_num(p.cell(i, "test_acc").value, -1))
    where = col.header if col else target.metric
    return select_rows(p, keep, f"best utility at {target} (on {where}; sorted by test_acc)")


def _family(label: str) -> str:
    """The defense family of a row label: the plugin name before its parameters."""
    return label.split("[", 1)[0]


def match_view(p: Pivot, text: str) -> Pivot:
    """Matched utility (the RecUP-FL fairness protocol), one configuration per defense family.

    `test_loss=0.53` (display units) keeps, per family, the configuration whose metric is closest to
    the target; `test_loss=0.53~0.02` keeps, among the family's configurations within the tolerance,
    the least leaky one (equal utility, so the fair comparison is the best privacy each family reaches
    there), and drops families with none within it. Rows are sorted by headline leakage.
    """
    m = re.match(
        r"^\s*([A-Za-z_]\w*)\s*=\s*(-?[\d.]+(?:e-?\d+)?)\s*(?:~\s*([\d.]+(?:e-?\d+)?))?\s*$", text or ""
    )
    if not m:
        raise FedbenchError(f"--match {text!r}: write metric=number[~tolerance], e.g. --match test_loss=0.53")
    name, target, tol = m.group(1), float(m.group(2)), m.group(3)
    scale = metric(name).scale
    if name not in {c.key for c in p.columns}:
        raise FedbenchError(
            f"--match {text}: '{name}' is not a column of this table; add it with --metric {name}"
        )
    if "defense" not in p.row_keys:
        raise FedbenchError("--match needs the defense among the row columns (--rows defense,...)")
    lc = headline_column(p)

    def leak(i: int) -> float:
        return _num(p.cell(i, lc.key).value) * lc.metric.leakage_sign if lc is not None else 0.0

    di = p.row_keys.index("defense")
    others = [j for j in range(len(p.row_keys)) if j != di]
    best: dict[tuple, tuple[float, int]] = {}
    for i, (key, _cells) in enumerate(p.rows):
        value = p.cell(i, name).value
        if value is None or math.isnan(value):
            continue
        gap = abs(value * scale - target)
        if tol is not None and gap > float(tol):
            continue
        score = leak(i) if tol is not None else gap
        group = (_family(key[di]), *(key[j] for j in others))
        if group not in best or score < best[group][0]:
            best[group] = (score, i)
    if not best:
        raise FedbenchError(f"--match {text}: no configuration has a {name} within the tolerance")
    keep = sorted((i for _score, i in best.values()), key=leak)
    how = f"within ±{float(tol):g}, least leaky" if tol is not None else "closest"
    return select_rows(p, keep, f"{name} = {target:g} per defense family ({how}; matched utility)")


def _num(v: float | None, missing: float = math.inf) -> float:
    return missing if v is None or math.isnan(v) else v


# ------------------------------------------------------------------------------------------ rendering


def format_cell(c: Cell, m: Metric, show_attack: bool = True) -> str:
    text = m.fmt(c.value)
    if c.bracketed:
        text += f" [{m.fmt(c.low)}, {m.fmt(c.high)}]"
    elif c.value is not None and c.spread is not None and not math.isnan(c.spread):
        text += f" ± {m.fmt(c.spread)}"
    if c.attack and show_attack:
        text += f" ({c.attack})"
    if c.reported is not None:
        text += f" {paper_tag(c, m)}"
    return text


def paper_tag(c: Cell, m: Metric) -> str:
    """'[paper 14.20, Δ +1.30]': the paper's number for a cell and the difference to ours."""
    d = c.diff
    return f"[paper {m.fmt(c.reported)}, Δ {'—' if d is None else ('+' if d >= 0 else '') + m.fmt(d)}]"


def text_rows(p: Pivot) -> tuple[list[str], list[list[str]]]:
    extra = list(p.extra)
    headers = extra + list(p.row_keys) + [c.header for c in p.columns]
    body = []
    for i, (key, _cells) in enumerate(p.rows):
        body.append(
            [p.extra[e][i] for e in extra]
            + list(key)
            + [format_cell(p.cell(i, c.key), c.metric) for c in p.columns]
        )
    return headers, body


def to_markdown(p: Pivot) -> str:
    from tabulate import tabulate

    headers, body = text_rows(p)
    table = tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)
    return (f"{p.title}\n\n" if p.title else "") + table + "\n"


_LATEX_ESC = {"&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#", "$": r"\$", "{": r"\{", "}": r"\}"}
_LATEX_SYM = {
    "±": r"$\pm$",
    "↑": r"$\uparrow$",
    "↓": r"$\downarrow$",
    "Δ": r"$\Delta$",
    "—": "--",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
}


def _latex(text: str) -> str:
    return "".join(_LATEX_SYM.get(ch, _LATEX_ESC.get(ch, ch)) for ch in text)


def to_latex(p: Pivot) -> str:
    """A booktabs tabular (needs \\usepackage{booktabs}); symbols as math, specials escaped."""
    headers, body = text_rows(p)
    nkey = len(p.extra) + len(p.row_keys)
    spec = "l" * nkey + "r" * len(p.columns)
    lines = [f"% {_latex(p.title)}" if p.title else "", f"\\begin{{tabular}}{{{spec}}}", "\\toprule"]
    lines.append(" & ".join(_latex(h) for h in headers) + r" \\")
    lines.append("\\midrule")
    for r in body:
        lines.append(" & ".join(_latex(x) for x in r) + r" \\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(line for line in lines if line) + "\n"


def records(p: Pivot) -> list[dict[str, Any]]:
    """Numbers, not strings: per column `<key>`, `<key>_spread`, `<key>_n` (+ attack, reported, diff)."""
    out = []
    for i, (key, _cells) in enumerate(p.rows):
        rec: dict[str, Any] = {e: p.extra[e][i] for e in p.extra}
        rec.update(dict(zip(p.row_keys, key, strict=True)))
        for c in p.columns:
            cell = p.cell(i, c.key)
            rec[c.key] = _round(cell.value)
            rec[f"{c.key}_spread"] = _round(cell.spread)
            rec[f"{c.key}_n"] = cell.n
            if cell.low is not None:  # a 95 % interval inside the metric's range
                rec[f"{c.key}_low"] = _round(cell.low)
                rec[f"{c.key}_high"] = _round(cell.high)
            if cell.k is not None:  # a rate: k successes in `inputs` inputs, pooled over seeds
                rec[f"{c.key}_k"] = _round(cell.k)
                rec[f"{c.key}_inputs"] = _round(cell.inputs)
            if c.group == WORST:
                rec[f"{c.key}_attack"] = cell.attack
            if cell.reported is not None:
                rec[f"{c.key}_reported"] = _round(cell.reported)
                rec[f"{c.key}_diff"] = _round(cell.diff)
        out.append(rec)
    return out


def _round(v: float | None) -> float | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return float(f"{v:.6g}")


def records_to_csv(recs: list[dict[str, Any]]) -> str:
    """CSV text of a list of records: the union of their keys as columns, None as an empty cell."""
    import csv
    import io

    fields = list(dict.fromkeys(k for r in recs for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for r in recs:
        writer.writerow({k: "" if v is None else v for k, v in r.items()})
    return buf.getvalue()


def to_csv(p: Pivot) -> str:
    return records_to_csv(records(p))


def to_json(p: Pivot) -> str:
    spread = {
        "mean": "std (n < 3) or ci95 half-width (n >= 3); <key>_low/_high: the 95% interval inside the "
        "metric's range (rates: Clopper-Pearson on <key>_k of <key>_inputs inputs pooled over seeds)",
        "median": "none",
        "worst": "none",
    }
    doc = {
        "title": p.title,
        "agg": p.agg,
        "spread": spread.get(p.agg, ""),
        "rows": list(p.row_keys),
        "columns": [
            {"key": c.key, "metric": c.metric.name, "group": c.group, "better": c.metric.better}
            for c in p.columns
        ],
        "records": records(p),
    }
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
