"""The v2 board as tables (design §7.1): rank, defense and the primary metric first; rows within the
utility budget ranked (`board_rank`), the others listed apart with their numbers, unranked.

One `V2Table` feeds every surface: the README's markdown, leaderboard.csv (numbers), the site's table
and `fedbench.leaderboard.load` (a DataFrame). Nothing here is stored in an entry.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fedbench.metrics.catalogue import METRICS, metric
from fedbench.reporting.board_notes import entry_budget, epsilon_value
from fedbench.reporting.board_rank import (
    Ranking,
    Row,
    has_adaptive,
    held_out,
    is_adaptive,
    is_noise,
    operating_point,
    plain_ranking,
    rank_board,
    secondary_medians,
    worst_per_input,
)
from fedbench.reporting.board_schema import Board
from fedbench.reporting.intervals import is_rate

# the input-independent guess of a primary metric: (the results column of its rate, what the guess is)
FLOORS = {
    "reid": ("reid_floor", "the class-mean image of the victim's class"),
    "asr": ("asr_majority", "always answering the attribute's most common class"),
}
FLOOR_OF = {primary: column for primary, (column, _) in FLOORS.items()}
# how a row's leakage is taken over the suite (`board_rank.worst_per_input`), by whether it is held out
WORST_CASE = {
    False: "the worst case per input over the attack suite",
    True: (
        "the worst attack of the suite per seed, chosen by its rate on the other seeds (the best of several "
        "guesses per input would count luck as leakage)"
    ),
}
# secondary per-input columns an inversion board shows (medians over inputs, best attack per input)
MEDIANS = ("psnr", "ssim", "lpips")


def is_v2(board: Board) -> bool:
    return board.board_version >= 2


@dataclass
class V2Table:
    board: Board
    ranking: Ranking
    headers: list[str]
    ranked: list[list[str]]
    outside: list[list[str]]
    records: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _pct(v: float | None) -> str:
    return "—" if v is None or math.isnan(v) else f"{100 * v:.1f}"


def _interval(lo: float | None, hi: float | None, scale: float = 100.0, digits: int = 1) -> str:
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        return ""
    return f" [{scale * lo:.{digits}f}, {scale * hi:.{digits}f}]"


def _epsilon(m: dict[str, Any]) -> tuple[str, float | None, str]:
    """(text, value, label) of an entry's epsilon; rows whose epsilon says nothing are noise."""
    eps = epsilon_value(m)
    if eps is None:
        return "—", None, ""
    text = "∞" if math.isinf(eps) else (f"{eps:.2e}" if eps >= 1000 else f"{eps:.2f}")
    if is_noise(eps):
        return f"{text} (noise)", eps, "noise (no meaningful DP guarantee)"
    return text, eps, "DP"


def _secondary(board: Board, entries: list[dict[str, Any]]) -> list[str]:
    """The secondary columns: the exact-recovery rate (inversion boards) and medians of the board's
    per-input metrics, then the other metrics the board lists (worst attack's mean over seeds)."""
    per_input = {
        m
        for e in entries
        for seeds in (e.get("per_input") or {}).values()
        for r in seeds.values()
        for m in r.get("values", {})
    }
    names = [m for m in ("exact",) if board.primary != m and m in per_input]
    names += [m for m in MEDIANS if m in board.metrics]
    names += [m for m in board.metrics if m not in names and m != board.primary and m in METRICS]
    return names


def _secondary_value(entry: dict[str, Any], name: str) -> float | None:
    """A secondary column's value: a median over inputs (best attack per input), a rate's worst case,
    or the worst attack's mean over seeds of a run-level metric (AUC)."""
    if name in MEDIANS:
        return secondary_medians(entry, name)
    lk = worst_per_input(entry, name)
    if lk.point() is not None:
        return lk.point()
    sign = metric(name).leakage_sign
    means = []
    for seeds in (entry.get("per_seed") or {}).values():
        values = [rec[name] for rec in seeds.values() if rec.get(name) is not None]
        if values:
            means.append(sum(values) / len(values))
    return max(means, key=lambda v: sign * v) if means else None


def _worst_attacks(row: Row) -> str:
    """The attacks that give the per-input worst case most often (the two most frequent); an input whose
    worst case several attacks reach counts for each of them, so a tie is not credited to the first."""
    counts = Counter(a for tied in row.leakage.attack.values() for attacks in tied for a in attacks)
    if not counts:
        return "—"
    return ", ".join(distinct_names([a for a, _ in counts.most_common(2)]))


def distinct_names(labels: list[str]) -> list[str]:
    """Attack labels as short as they stay apart: the plugin name, plus the parameters in which labels
    of the same plugin differ ('mia-lira-online[mode=online]', 'mia-lira-online[mode=offline]')."""

    def parts(label: str) -> tuple[str, dict[str, str]]:
        name, _, rest = label.partition("[")
        pairs = [p.split("=", 1) for p in rest.rstrip("]").split(",") if "=" in p] if rest else []
        return name, {k: v for k, v in pairs}

    parsed = [parts(a) for a in labels]
    out = []
    for name, params in parsed:
        others = [p for n, p in parsed if n == name and p is not params]
        keys = [k for k in params if any(o.get(k) != params[k] for o in others)]
        out.append(name + (f"[{','.join(f'{k}={params[k]}' for k in keys)}]" if keys else ""))
    return out


def build_table(board: Board, entries: list[dict[str, Any]]) -> V2Table:
    ranking = rank_board(entries, board.primary, board.utility_budget, FLOOR_OF.get(board.primary, ""))
    prim = metric(board.primary)
    secondary = _secondary(board, entries)
    # a board with adaptive attacks also shows the non-adaptive worst case, and flags moved ranks
    plain = (
        {r.defense: r for r in plain_ranking(entries, board.primary, board.utility_budget).rows}
        if has_adaptive(entries)
        else None
    )
    headers = [
        "rank",
        "defense",
        prim.header,
        *([f"{prim.name} without adaptive attacks"] if plain is not None else []),
        "verdict",
        "acc drop (pp) ↓",
        "test acc (%) ↑",
        "ε",
        *[
            f"median {n}"
            if n in MEDIANS
            else f"{n}{' (%)' if METRICS[n].unit == 'pct' else ''} {METRICS[n].arrow}"
            for n in secondary
        ],
        "worst attack",
        "inputs",
        "rank stability",
    ]
    ranked, outside, records = [], [], []
    for row in ranking.rows:
        e = row.entry
        m = e["metrics"]
        eps_text, eps, eps_label = _epsilon(m)
        in_rank = row.rank is not None
        verdict = [row.protection] if row.protection else []
        if row.borderline:
            verdict.append("borderline utility")
        if not in_rank and not row.admissible:
            verdict.append("outside budget")
        if eps_label.startswith("noise"):
            verdict.append("noise, not DP")
        before = plain.get(row.defense) if plain is not None else None
        if before is not None and in_rank and before.rank != row.rank:
            verdict.append(f"rank moved by an adaptive attack (was {before.rank})")
        lk = row.leakage
        point = operating_point(lk, board.primary)  # a TPR's realised FPR and thresholds, else None
        if lk.unresolved:
            primary_text = "n/a"
        else:
            primary_text = prim.fmt(row.rate) + _interval(
                row.low, row.high, prim.scale, 1 if prim.scale > 1 else 2
            )
            if row.rate is not None and is_rate(prim):
                primary_text += f" ({lk.successes:.0f}/{lk.n_inputs})"
            if row.rate is not None and point is not None:
                primary_text += f" at FPR {point[0]:.0f}/{point[1]:.0f}"
        acc = m["test_acc"]
        acc_text = _pct(acc.get("mean")) + _interval(acc.get("low"), acc.get("high"))
        drop_text = (
            "—" if row.drop is None else f"{100 * row.drop:.1f}" + _interval(row.drop_low, row.drop_high)
        )
        sec_values = {n: _secondary_value(e, n) for n in secondary}
        sec_text = [(METRICS[n].fmt(v) if v is not None else "—") for n, v in sec_values.items()]
        seeds = len(lk.seeds)
        stability = (
            f"{100 * row.same_rank:.0f}% [{row.rank_low}–{row.rank_high}]"
            if row.same_rank is not None
            else "—"
        )
        plain_text = (
            []
            if plain is None
            else [
                "—"
                if before is None or before.rate is None
                else prim.fmt(before.rate) + _interval(before.low, before.high, prim.scale, 1)
            ]
        )
        text = [
            str(row.rank) if in_rank else "—",
            f"`{row.defense}`",
            primary_text,
            *plain_text,
            ", ".join(verdict),
            drop_text,
            acc_text,
            eps_text,
            *sec_text,
            _worst_attacks(row),
            f"{lk.n_inputs} ({seeds} seeds)",
            stability if in_rank else "—",
        ]
        (ranked if in_rank else outside).append(text)
        records.append(
            {
                "rank": row.rank,
                "defense": row.defense,
                "defense_name": e["defense_name"],
                "within_budget": row.admissible,
                board.primary: None if lk.unresolved else row.rate,
                f"{board.primary}_low": None if lk.unresolved else row.low,
                f"{board.primary}_high": None if lk.unresolved else row.high,
                f"{board.primary}_k": lk.successes if is_rate(prim) and not lk.unresolved else None,
                f"{board.primary}_inputs": lk.n_inputs,
                "realised_fpr": None if point is None or not point[1] else point[0] / point[1],
                "thresholds": " ".join(f"{t:.6g}" for t in (point[2] if point else []) if t is not None),
                **(
                    {}
                    if plain is None
                    else {
                        f"{board.primary}_non_adaptive": None if before is None else before.rate,
                        "rank_non_adaptive": None if before is None else before.rank,
                    }
                ),
                "verdict": ", ".join(verdict),
                "acc_drop": row.drop,
                "acc_drop_low": row.drop_low,
                "acc_drop_high": row.drop_high,
                "test_acc": acc.get("mean"),
                "test_acc_low": acc.get("low"),
                "test_acc_high": acc.get("high"),
                "epsilon": eps,
                "epsilon_label": eps_label,
                "dp_budget": entry_budget(m),
                **{(f"median_{n}" if n in MEDIANS else n): v for n, v in sec_values.items()},
                "worst_attack": _worst_attacks(row),
                "seeds": seeds,
                "rank_same": row.same_rank,
                "rank_low": row.rank_low,
                "rank_high": row.rank_high,
                "fedbench_version": e["fedbench_version"],
                "date": e["date"],
            }
        )
    notes = _notes(board, ranking)
    if plain is not None:
        notes.append(_adaptive_note(ranking, plain))
    return V2Table(board, ranking, headers, ranked, outside, records, notes)


def _adaptive_note(ranking: Ranking, plain: dict[str, Row]) -> str:
    """Which rows' ranks the adaptive attacks moved (the README names them, issue 28)."""
    moved = [
        f"`{r.defense}` ({plain[r.defense].rank} → {r.rank})"
        for r in ranking.ranked
        if r.defense in plain and plain[r.defense].rank != r.rank
    ]
    head = (
        "Ranked by the worst case over the whole suite, adaptive attacks included; the column "
        '"without adaptive attacks" is the worst case over the non-adaptive attacks alone. '
    )
    if not moved:
        return head + "The adaptive attacks moved no rank."
    return head + "Rows whose rank the adaptive attacks moved (without → with): " + ", ".join(moved) + "."


def attacks_per_input(suite: list[str]) -> int:
    """The most attacks one input of a row meets: every plain attack of the suite and one adaptive
    attack (each row's own defense's; `none` meets none)."""
    adaptive = [a for a in suite if is_adaptive(a)]
    return len(suite) - len(adaptive) + (1 if adaptive else 0)


def suite_floor(floor: float, attacks: int) -> float:
    """What the worst case per input over `attacks` input-independent guesses, each re-identifying at
    `floor` and independent of one another, scores: 1 - (1 - floor)^attacks."""
    return 1.0 - (1.0 - floor) ** attacks


def suite_floor_note(guess: float, attacks: int) -> str:
    """The sentence that puts a row's rate beside what guessing gives once the worst case over the
    suite is taken: a reconstruction that is noise still hits the victim among the candidates by
    chance, and the worst case over k attacks adds those chances up, so a defended row can read 10 %
    with nothing recognisable (median PSNR 10 dB). `guess`: one guess's rate (the floor or chance,
    whichever is higher). Empty for a suite of one attack."""
    if attacks < 2:
        return ""
    return (
        f" The worst case per input over up to {attacks} attacks adds their chance hits: {attacks} "
        "independent guesses, each at the floor or chance (the higher), would re-identify "
        f"{100 * suite_floor(guess, attacks):.1f} % "
        "of the inputs, so a row near that rate is at the level of guessing, not of a recognisable "
        "reconstruction."
    )


def floor_note(primary: str, ranking: Ranking, suite: list[str]) -> str | None:
    """The board's floor sentence: what the best input-independent guess scores (`FLOORS`), and, where
    the worst case is taken per input over the suite, what that worst case adds by chance
    (`suite_floor_note`); a worst attack chosen on held-out seeds (membership, attribute) adds none.
    None when the board has no floor."""
    if ranking.floor is None:
        return None
    chance = "" if ranking.chance is None else f"; chance is {100 * ranking.chance:.1f} %"
    per_input = not held_out(primary) and any(
        r.leakage is not None and r.leakage.inputs for r in ranking.rows
    )
    chance_hits = max(ranking.floor, ranking.chance or 0.0)
    return (
        f"Floor: the same test applied to the best input-independent guess ({ranking.floor_metric}: "
        f"{FLOORS[primary][1]}) scores {100 * ranking.floor:.1f} %{chance}."
        + (suite_floor_note(chance_hits, attacks_per_input(suite)) if per_input else "")
    )


def _notes(board: Board, ranking: Ranking) -> list[str]:
    prim = metric(board.primary)
    out = [
        f"Ranked by {prim.name} ({prim.about}), {WORST_CASE[held_out(prim.name)]}, lower is "
        f"better, among the configurations whose accuracy drop vs `none` (paired by seed) is at most "
        f"{board.utility_budget:g} points (the utility budget). A rate's interval is a two-stage bootstrap "
        f"(seeds, then inputs within a seed; {ranking.draws} draws, fixed RNG), so inputs that share a "
        "seed's model are not counted as independent, widened to contain the exact (Clopper-Pearson) "
        "interval of the pooled count: 0 of 100 is [0, 3.6] %, not [0, 0]."
    ]
    out.append(
        "Rank: b beats a when the 95 % interval of the paired difference of their rates (same seeds, same "
        "inputs) lies above 0; a row's rank is 1 + the rows that beat it, so rows no other row beats with "
        "confidence share a rank (statistical ties): a rank should not separate configurations the data "
        "cannot tell apart, and the paired difference, on the same seeds and inputs, separates more pairs "
        'than two overlapping intervals would. "no protection": the rate is not distinguishably '
        "below `none`'s. Rank stability: the share of bootstrap draws whose rank falls in the row's tie "
        "band, and the 95 % interval of its drawn rank."
    )
    if (floor := floor_note(board.primary, ranking, board.attack_suite)) is not None:
        out.append(floor)
    if ranking.unresolved:
        out.append(f"The primary metric is {ranking.unresolved}; the rows are not ranked by it.")
    if board.cascade:
        order = ", ".join(board.cascade)
        out.append(
            f"Attack cascade (AutoAttack's evaluation order): on every row but `none`, the suite's attacks "
            f"ran one after another ({order}, then the others, each defense's adaptive attack last), each "
            f"only on the victims whose inputs no earlier attack re-identified. The {prim.name} of a row "
            "is what running every attack on every input gives (an input already re-identified cannot "
            "score higher); a per-attack number of such a row covers only the inputs left to that "
            "attack. `none` ran every attack on every input."
        )
    out.append(f"ε above {100:g} is labelled noise: no meaningful DP guarantee.")
    return out


def to_markdown(t: V2Table) -> str:
    from tabulate import tabulate

    parts = []
    if t.ranked:
        parts.append(tabulate(t.ranked, headers=t.headers, tablefmt="github", disable_numparse=True))
    if t.outside:
        parts.append(
            f"Outside the utility budget (accuracy drop > {t.board.utility_budget:g} points) or not "
            "ranked:\n\n" + tabulate(t.outside, headers=t.headers, tablefmt="github", disable_numparse=True)
        )
    return "\n\n".join(parts) + "\n"
