"""What a board's README (and its site page) says around the leaderboard table, from board.json and
the entries: how epsilon reads (its column, legend and the audit of it), the headline's baseline, what
the board cost to build, the worst-case rule and the papers' reported numbers.

Each note is text (or None when the board has nothing to say); `leaderboard` puts them into the
README template, `site` into the HTML one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedbench.errors import FedbenchError
from fedbench.metrics.catalogue import METRICS, Metric, metric
from fedbench.reporting.board_build import POOLED_OBSERVATION, match_reported, plugin_name, reported_records
from fedbench.reporting.board_schema import Board
from fedbench.reporting.board_stats import stat_cell
from fedbench.reporting.build_wall import describe
from fedbench.reporting.tables import HELD_OUT, IN_SAMPLE, ONLY_ATTACK, PER_INPUT, PER_SEED

# --------------------------------------------------------------------------------- epsilon and audit


@dataclasses.dataclass(frozen=True)
class EpsilonMetric(Metric):
    """The epsilon column of a board: its header states delta, the DP level and the accountant (`legend`,
    when the configurations share them); values format as every metric does (`Metric.fmt`: '∞' for no
    finite bound, '—' for no guarantee, scientific form from 1000 on)."""

    legend: str = ""

    @property
    def header(self) -> str:
        return f"{self.name} ({self.legend}) {self.arrow}" if self.legend else f"{self.name} {self.arrow}"


@functools.cache
def epsilon_metric(legend: str = "") -> EpsilonMetric:
    base = METRICS["epsilon"]
    return EpsilonMetric(**{f.name: getattr(base, f.name) for f in dataclasses.fields(Metric)}, legend=legend)


def epsilon_text(m: dict[str, Any]) -> str:
    """An entry's epsilon as the README shows it: '∞' (DP-accounted, no finite bound), '—' (none),
    3 significant digits in scientific form from 1000 on (4.04e+05), else 2 decimals."""
    return epsilon_metric().fmt(epsilon_value(m))


def epsilon_value(m: dict[str, Any]) -> float | None:
    return math.inf if m.get("epsilon_infinite") else m.get("epsilon")


def audit_note(board: Board, entries: list[dict[str, Any]]) -> str | None:
    """Whether every entry's empirical lower bound (eps_lower) is at most its formal epsilon: None when
    no entry carries an audit."""
    audited = [e for e in entries if e["metrics"].get("eps_lower")]
    if not audited:
        return None
    over = [
        e
        for e in audited
        if e["metrics"].get("epsilon") is not None
        and e["metrics"]["eps_lower"]["max"] > e["metrics"]["epsilon"]
    ]
    formal = [e for e in audited if e["metrics"].get("epsilon") is not None]
    deltas = sorted({e["metrics"]["eps_lower"]["delta"] for e in audited} - {None})
    at = f" at δ={', '.join(f'{d:g}' for d in deltas)}" if deltas else ""
    head = (
        f"Audit: `eps_lower` is the largest empirical lower bound on epsilon over a configuration's "
        f"attacks and seeds (each a one-sided 95% bound from the attack's scores{at})."
    )
    if not formal:
        return head + " No configuration has a formal epsilon to compare it with."
    if not over:
        return head + (
            f" Every configuration's eps_lower is at most its formal epsilon ({len(formal)} with one; "
            "the others claim no guarantee)."
        )
    names = ", ".join(
        f"`{e['defense']}` ({e['metrics']['eps_lower']['max']:.2f} > {epsilon_text(e['metrics'])})"
        for e in over
    )
    return head + f" eps_lower exceeds the formal epsilon for {names}: mis-implemented or mis-accounted."


def one_run_audit_note(entries: list[dict[str, Any]]) -> str | None:
    """The `leaderboard audit` bounds of a board's DP rows in words (None when no row was audited)."""
    audited = [e for e in entries if e["metrics"].get("one_run_audit")]
    if not audited:
        return None
    rows = []
    over = []
    for e in audited:
        a = e["metrics"]["one_run_audit"]
        formal = a.get("formal_eps")
        rows.append(
            f"`{e['defense']}` ≥ {a['eps_lower']:.2f} (formal {formal:.2f})" if formal is not None else ""
        )
        if formal is not None and a["eps_lower"] > formal:
            over.append(f"`{e['defense']}`")
    method = audited[0]["metrics"]["one_run_audit"]["method"]
    verdict = (
        f" The bound exceeds the formal epsilon for {', '.join(over)}: mis-implemented or mis-accounted."
        if over
        else " No bound exceeds its formal epsilon."
    )
    return (
        "Empirical epsilon (`fedbench leaderboard audit`, one training run per row, lower bounds at "
        f"{100 * audited[0]['metrics']['one_run_audit']['confidence']:.0f} % confidence): "
        + "; ".join(r for r in rows if r)
        + f". Method of the first row: {method}."
        + verdict
        + " A black-box one-run bound far below the formal epsilon is expected (docs/auditing.md)."
    )


def epsilon_legend(entries: list[dict[str, Any]]) -> str:
    """'δ=1e-05, client-level, rdp' when every DP-accounted entry shares them, else ''."""
    keys = {_budget_key(e["metrics"]) for e in entries if _accounted(e["metrics"])}
    return _budget_text(*keys.pop()) if len(keys) == 1 else ""


def _accounted(m: dict[str, Any]) -> bool:
    return m.get("epsilon") is not None or bool(m.get("epsilon_infinite")) or bool(m.get("dp_level"))


def _budget_key(m: dict[str, Any]) -> tuple[Any, Any, Any]:
    return (m.get("delta"), m.get("dp_level"), m.get("accountant"))


def _budget_text(delta: Any, level: Any, accountant: Any) -> str:
    parts = [f"δ={delta:g}" if isinstance(delta, int | float) else "", f"{level}-level" if level else ""]
    return ", ".join(x for x in [*parts, short_accountant(accountant)] if x)


def entry_budget(m: dict[str, Any]) -> str:
    """An entry's own delta, DP level and accountant ('δ=1e-05, client-level, rdp'): '' when it is not
    DP-accounted."""
    return _budget_text(*_budget_key(m)) if _accounted(m) else ""


def short_accountant(text: Any) -> str:
    """The accountant's name without its description: 'rdp (local gaussian, ...): z = ...' -> 'rdp'."""
    return re.split(r"[\s(:;,]", str(text or "").strip(), maxsplit=1)[0]


def epsilon_columns_note(entries: list[dict[str, Any]]) -> str:
    """What the README's Columns line says about epsilon (and eps_lower when the board has an audit)."""
    legend = epsilon_legend(entries)
    where = f" ({legend})" if legend else " (each cell names its delta, DP level and accountant)"
    text = (
        f"epsilon: the formal (ε, δ)-DP guarantee of DP-accounted defenses{where}, in scientific form "
        "from 1000 on, ∞ when the accountant finds no finite bound, — for defenses without one"
    )
    described = dict.fromkeys(
        str(e["metrics"]["accountant"])
        for e in entries
        if e["metrics"].get("accountant")
        and str(e["metrics"]["accountant"]) != short_accountant(e["metrics"]["accountant"])
    )
    if described:
        text += f" (accountant{'s' if len(described) > 1 else ''}: {'; '.join(described)})"
    if any(e["metrics"].get("eps_lower") for e in entries):
        text += "; eps_lower: the privacy audit's empirical lower bound on epsilon (see Audit below)"
    return text


# ------------------------------------------------------------------------ baseline, cost, worst case


_BASELINE_WORDS = {  # kind -> (sentence label, "above ___")
    "random image": ("Random-image floor", "the floor"),
    "chance": ("Chance level", "chance"),
    "majority class": ("Majority-class rate", "it"),
}


def _unit(m, difference: bool = False) -> str:
    if m.name.startswith("psnr"):
        return " dB"
    return {"pct": " pp" if difference else "%", "pp": " pp"}.get(m.unit, "")


def _num_text(m, v: float) -> str:
    return f"{v:.1f}" if m.name.startswith("psnr") else m.fmt(v)


def baseline_note(board: Board, entries: list[dict[str, Any]]) -> str | None:
    """'Random-image floor: 5.1 dB. No defense, worst case: 12.0 ± 0.2 dB, 6.9 dB above the floor
    (95% CI ...).': the README's line on whether the suite beats guessing without a defense."""
    b = board.baseline
    if b is None:
        return None
    m = metric(b.metric)
    label, what = _BASELINE_WORDS.get(b.kind, (b.kind, "the baseline"))
    named = "" if b.kind == "random image" else f" of {m.name}"
    text = f"{label}{named}: {_num_text(m, b.value)}{_unit(m)}"
    about = ["always answering the most common class"] if b.kind == "majority class" else []
    about += [f"the mean `{b.column}` of the runs"] if b.column else []
    text += f" ({'; '.join(about)})." if about else "."
    none = next((e for e in entries if e["defense"] == "none"), None)
    stat = ((none or {}).get("metrics", {}).get("worst_case") or {}).get(b.metric) if none else None
    if not stat:
        return text
    if stat_cell(stat).bracketed:  # a rate's interval, or one the range clipped
        spread = f" [{_num_text(m, stat['low'])}, {_num_text(m, stat['high'])}]"
    else:
        spread = f" ± {_num_text(m, stat['spread'])}" if stat.get("spread") is not None else ""
    text += f" No defense, worst case: {_num_text(m, stat['mean'])}{spread}{_unit(m)}"
    if b.gap is None:
        return text + "."
    g = b.gap
    du = _unit(m, difference=True)
    side = "above" if g.mean >= 0 else "below"
    text += f", {_num_text(m, abs(g.mean))}{du} {side} {what}"
    if g.low is None or g.high is None:
        return text + " (one seed: no interval)."
    excludes = g.low > 0 or g.high < 0
    verdict = (
        "it excludes 0: the suite beats guessing without a defense"
        if excludes and g.mean > 0
        else "it excludes 0"
        if excludes
        else "it includes 0: without a defense the suite does not clearly beat guessing"
    )
    return (
        text + f" (95% CI of the difference over {g.n} seeds: {_num_text(m, g.low)} to "
        f"{_num_text(m, g.high)}{du}; {verdict})."
    )


def _seconds(s: float) -> str:
    text = f"{s:,.0f} s"
    return f"{text} ({s / 3600:.1f} h)" if s >= 3600 else text


def cost_note(board: Board) -> str | None:
    """The README's line on what the board costs to build (None for boards built before it)."""
    wall = f" {describe(board.build_wall.model_dump())}" if board.build_wall is not None else ""
    c = board.cost
    if c is None or board.build_seconds is None:
        return wall.strip() or None
    return (
        f"Cost: building the board takes {_seconds(board.build_seconds)} of compute (CPU-seconds summed "
        "over runs): "
        f"{c.trainings} FL trainings ({_seconds(c.utility_seconds)}; every attack and observation point "
        f"of a training reads the same run) and {c.attack_runs} attack runs ({_seconds(c.attack_seconds)}). "
        "The table's `utility_seconds` and `attack_seconds` are a configuration's mean per training and "
        "per attack run." + wall
    )


def failures_note(board: Board) -> str | None:
    """The README's line on runs that failed and are not in the means (None when none failed)."""
    if not board.failures:
        return None
    parts = [
        f"`{f.defense}`: {f.failed} of {f.runs} runs"
        + (" (no entry: every run failed)" if f.failed == f.runs else "")
        + (f", e.g. {f.reason}" if f.reason else "")
        for f in board.failures
    ]
    return "Failed runs, not in the means: " + "; ".join(parts) + "."


_SELECTION_RULES = {
    PER_SEED: "the leakiest attack per run, averaged over seeds",
    HELD_OUT: (
        "on each seed, the value of the attack with the highest mean over the other seeds, averaged over "
        "seeds; the attack is chosen out of sample, so that the noise of attacks near chance does not "
        "count as leakage"
    ),
    IN_SAMPLE: "the leakiest attack of the one seed (none held out to choose it on: may overstate leakage)",
    ONLY_ATTACK: "the value of the one attack of the suite that reports it",
}


def _worst_stats(entries: list[dict[str, Any]], headline: str) -> list[dict[str, Any]]:
    stats = [(e["metrics"].get("worst_case") or {}).get(headline) for e in entries]
    return [st for st in stats if st]


def worst_rule(entries: list[dict[str, Any]], headline: str) -> str:
    """How the worst case over the suite is taken: per input image (AutoAttack's rule), or by the
    selection the entries record (`tables.SELECTIONS`; entries before it: the leakiest attack per run)."""
    stats = _worst_stats(entries, headline)
    pooled = any(isinstance(e["scenario"].get(c), list) for e in entries[:1] for c in POOLED_OBSERVATION)
    if stats and all(st.get("per_input") for st in stats):
        if pooled:
            return "taken per input image of each victim, then averaged over victims' images and seeds"
        return "taken per input image, then averaged over images and seeds"
    selections = sorted({st["selection"] for st in stats if st.get("selection")} - {PER_INPUT})
    if selections:
        return "; or ".join(_SELECTION_RULES.get(s, s) for s in selections)
    return "the leakiest attack per run, averaged over seeds"


def worst_attack_named(entries: list[dict[str, Any]], headline: str) -> str:
    """Which attack a worst-case cell names: the one that won most inputs, or chosen on most seeds."""
    stats = _worst_stats(entries, headline)
    if any(st.get("selection") in (HELD_OUT, IN_SAMPLE) for st in stats):
        return "the attack chosen on most seeds"
    return "the attack that achieved it (on most inputs)"


# ------------------------------------------------------------------------------- the papers' numbers


def preset_reported(board: Board, preset_dirs: tuple[Path, ...] = ()) -> list[dict[str, Any]]:
    """The `[[reported]]` rows of the preset that built the board (boards built before board.json kept
    them): [] when the board names no preset, the preset is not found, or it carries none."""
    from fedbench.spec.grid import find_preset, load_preset

    if not board.preset:
        return []
    try:
        return list(load_preset(find_preset(board.preset, preset_dirs), preset_dirs).get("reported") or [])
    except FedbenchError:
        return []


def board_reported(
    board: Board, entries: list[dict[str, Any]], preset_dirs: tuple[Path, ...] | None = None
) -> list[dict[str, Any]]:
    """The papers' numbers for the board as `ReportedRow` records: those board.json keeps, else (with
    `preset_dirs`: the site) the matching rows of its preset."""
    if board.reported:
        return [r.model_dump() for r in board.reported]
    if preset_dirs is None:
        return []
    families = {plugin_name(e["defense"]) for e in entries}
    return reported_records(match_reported(preset_reported(board, preset_dirs), families, board.attack_suite))


def reported_table(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Header and text rows of the papers' numbers (README and site): dataset, defense, attack, each
    reported metric, and how the paper's setting differs (conditions, source, note); None when none."""
    if not rows:
        return None
    names = list(dict.fromkeys(k for r in rows for k in r["values"]))
    body = []
    for r in rows:
        setting = [f"{k}={v}" for k, v in r.get("conditions", {}).items()]
        setting += [str(r[k]) for k in ("source", "note") if r.get(k)]
        body.append(
            [r.get("dataset", ""), r["defense"], r.get("attack", "") or "—"]
            + [_reported_text(n, r["values"].get(n)) for n in names]
            + ["; ".join(setting)]
        )
    return {
        "headers": ["dataset", "defense", "attack", *(METRICS[n].header for n in names), "paper's setting"],
        "rows": body,
    }


def _reported_text(name: str, value: float | None) -> str:
    if value is None:
        return ""
    return epsilon_text({"epsilon": value}) if name == "epsilon" else METRICS[name].fmt(value)


def reported_markdown(rows: list[dict[str, Any]]) -> str:
    from tabulate import tabulate

    t = reported_table(rows)
    if t is None:
        return ""
    return tabulate(t["rows"], headers=t["headers"], tablefmt="github", disable_numparse=True)
