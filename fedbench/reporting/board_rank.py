"""The v2 board method (design §7.1): one primary leakage metric, a utility budget, ranks by paired
bootstrap, computed from the entries at render time (ranks never live in an entry).

What it computes, per configuration c of a board with seeds s and attacked inputs i:

- **Per-input leakage**: `leak(c, s, i)` = the worst case over the attack suite for input i (the max of
  a 0/1 success such as `reid`; for a metric where lower leaks more, the min), taken before any
  averaging, as AutoAttack does. The entry keeps every attack's per-input values (`per_input`), so the
  worst case is taken here.
- **Rate** `L(c)` = the mean over all (s, i). Its 95 % interval is a two-stage bootstrap: seeds
  resampled, then inputs within each drawn seed, `DRAWS` draws from a fixed RNG (`RNG_SEED`). It
  respects that a seed's inputs share a model, and it stays inside the metric's range. For a 0/1
  rate it is widened to contain the exact (Clopper-Pearson) interval of the pooled k of n
  (`rate_interval`): the bootstrap of 0 successes collapses to [0, 0]. A primary known
  only per seed as a rate with its counts (a membership TPR: k of n members) draws the second stage as
  Binomial(n, k / n).
- **Pairing**: every configuration is evaluated on the same draws (the same seeds, and the same input
  positions within a seed), so `L(a) - L(b)` is a paired difference.
- **Utility budget**: `drop(c)` = mean over seeds of acc(none, s) - acc(c, s), in points; admissible
  when drop <= budget; its t interval over seeds is shown, and a row whose interval crosses the budget
  is "borderline".
- **Rank among admissible rows**: b is better than a when the 95 % interval of `L(a) - L(b)` lies
  above 0; rank(a) = 1 + the number of admissible rows better than a (competition ranking: rows no
  other row beats with confidence share a rank). Rows outside the budget are listed apart, unranked.
- **No protection**: a row whose rate is not distinguishably below `none`'s (the interval of
  `L(none) - L(c)` does not lie above 0).
- **Rank stability**: on each draw, every admissible row's rank by its drawn rate (1 + rows with a
  lower drawn rate); the share of draws that fall in its published tie band (rank .. rank + tied - 1)
  and the 95 % interval of the drawn rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedbench.metrics.catalogue import metric
from fedbench.reporting.input_keys import input_keys, sort_key
from fedbench.reporting.intervals import clopper_pearson, is_rate, t95
from fedbench.reporting.tables import SELECTED_FAMILIES

DRAWS = 2000
RNG_SEED = 0
LEVEL = 0.95
NOISE_EPSILON = 100.0  # above it a DP row is labelled noise: no meaningful guarantee
# membership: a TPR at a target FPR is resolved when a seed scores at least 10 / FPR non-members
RESOLUTION_FACTOR = 10


@dataclass
class Leakage:
    """One configuration's primary leakage: per seed, the per-input worst case over the suite
    (`inputs`: seed -> values) or, for a per-seed rate, its counts (`counts`: seed -> (k, n))."""

    inputs: dict[int, np.ndarray] = field(default_factory=dict)
    counts: dict[int, tuple[float, float]] = field(default_factory=dict)
    # per input: every attack that achieved it (a binary metric ties often: each tied attack is credited)
    attack: dict[int, list[tuple[str, ...]]] = field(default_factory=dict)
    unresolved: str = ""  # why the primary is n/a (membership: too few non-members)
    operating: list[dict[str, Any]] = field(default_factory=list)  # a TPR's per-seed FPR and threshold

    @property
    def seeds(self) -> list[int]:
        return sorted(self.inputs or self.counts)

    def point(self) -> float | None:
        if self.unresolved:
            return None
        if self.inputs:
            values = np.concatenate([self.inputs[s] for s in self.seeds])
            return float(values.mean()) if values.size else None
        k = sum(k for k, _ in self.counts.values())
        n = sum(n for _, n in self.counts.values())
        return k / n if n else None

    @property
    def n_inputs(self) -> int:
        if self.inputs:
            return int(sum(v.size for v in self.inputs.values()))
        return int(sum(n for _, n in self.counts.values()))

    @property
    def successes(self) -> float:
        if self.inputs:
            return float(sum(v.sum() for v in self.inputs.values()))
        return float(sum(k for k, _ in self.counts.values()))


def _seed_key(s: Any) -> int:
    return int(s)


Keep = Callable[[str], bool] | None  # which attacks (by label) a worst case takes; None: all


def _attacks(table: dict[str, Any] | None, keep: Keep) -> list[tuple[str, Any]]:
    return [(a, v) for a, v in (table or {}).items() if keep is None or keep(a)]


def held_out(name: str) -> bool:
    """Whether primary `name`'s worst case over the suite is the attack chosen on held-out seeds rather
    than the per-input maximum: the attacks of membership and attribute inference answer from a small
    set (`tables.SELECTED_FAMILIES`), and the best of several such answers per input credits each input
    to whichever guess was right, an oracle no attacker has (on the attribute board, 8 adversaries near
    the majority rate of 85 % reach 92-98 % that way, noise or not; design §7.1, "worst case over noisy
    attacks")."""
    return metric(name).family in SELECTED_FAMILIES


def worst_per_input(entry: dict[str, Any], name: str, keep: Keep = None) -> Leakage:
    """The entry's primary `name` per input, worst case over its attacks (those `keep` accepts),
    aligned by (seed, victim, position among the victim's inputs: `input_keys`, so attacks that
    covered different victims, as in a cascade, meet on the same inputs); for a `held_out` primary the
    per-input values of each seed's held-out worst attack; or its per-seed counts when no attack kept
    per-input values of it."""
    table = _attack_inputs(entry, name, keep)
    if not table:
        return _worst_counts(entry, name, keep)
    if held_out(name):
        return _held_out_inputs(table, name)
    sign = metric(name).leakage_sign
    out = Leakage()
    by_seed: dict[int, dict[tuple[Any, int], tuple[float, tuple[str, ...]]]] = {}
    for attack, seeds in table.items():
        for s, values in seeds.items():
            cells = by_seed.setdefault(s, {})
            for key, v in values.items():
                known = cells.get(key)
                if known is None or sign * v > sign * known[0]:
                    cells[key] = (v, (attack,))
                elif v == known[0]:
                    cells[key] = (known[0], (*known[1], attack))
    for s, cells in sorted(by_seed.items()):
        keys = sorted(cells, key=sort_key)
        out.inputs[s] = np.array([cells[k][0] for k in keys], dtype=float)
        out.attack[s] = [cells[k][1] for k in keys]
    return out


def _attack_inputs(entry: dict[str, Any], name: str, keep: Keep) -> dict[str, dict[int, dict[Any, float]]]:
    """{attack: {seed: {input key: value}}} of metric `name` over the entry's kept attacks (inputs
    without a value left out)."""
    out: dict[str, dict[int, dict[Any, float]]] = {}
    for attack, seeds in _attacks(entry.get("per_input"), keep):
        for s, rec in seeds.items():
            values = (rec.get("values") or {}).get(name)
            if values is None:
                continue
            cells = out.setdefault(attack, {}).setdefault(_seed_key(s), {})
            pos = 0
            for victim, count in zip(rec["victims"], rec["counts"], strict=True):
                keys = input_keys(victim, int(count)) or [(str(victim), j) for j in range(int(count))]
                for j, key in enumerate(keys):
                    if values[pos + j] is not None:
                        cells[key] = float(values[pos + j])
                pos += int(count)
    return out


def _held_out_inputs(table: dict[str, dict[int, dict[Any, float]]], name: str) -> Leakage:
    """Per seed, the per-input values of the attack whose mean over the other seeds' inputs leaks most
    (ties by name; with one seed, its own mean: nothing is held out)."""
    sign = metric(name).leakage_sign
    table = {a: {s: cells for s, cells in seeds.items() if cells} for a, seeds in table.items()}

    def rate(attack: str, seeds: list[int]) -> float:
        values = [v for t in seeds for v in table[attack].get(t, {}).values()]
        return sign * float(np.mean(values)) if values else -math.inf

    out = Leakage()
    for s, best in _held_out_picks(table, rate).items():
        cells = table[best][s]
        keys = sorted(cells, key=sort_key)
        out.inputs[s] = np.array([cells[k] for k in keys], dtype=float)
        out.attack[s] = [(best,)] * len(keys)
    return out


def _held_out_picks(
    per_attack: dict[str, dict[int, Any]], rate: Callable[[str, list[int]], float]
) -> dict[int, str]:
    """{seed: the attack with the highest `rate(attack, other seeds)` among those that ran on it} (ties
    by name; with one seed, its own rate: nothing is held out)."""
    seeds = sorted({s for recs in per_attack.values() for s in recs})
    picks = {}
    for s in seeds:
        others = [t for t in seeds if t != s] or [s]
        candidates = [a for a in per_attack if s in per_attack[a]]
        picks[s] = max(candidates, key=lambda a, others=others: (rate(a, others), a))
    return picks


def _worst_counts(entry: dict[str, Any], name: str, keep: Keep = None) -> Leakage:
    """A per-seed rate (k of n per seed and attack): the worst attack chosen on held-out seeds (for
    each seed, the attack with the highest rate on the other seeds: selection noise is not counted as
    leakage), its counts on that seed. n/a when a seed's non-members cannot resolve a TPR's FPR."""
    out = Leakage()
    fpr = _target_fpr(name)
    need = math.ceil(RESOLUTION_FACTOR / fpr - 1e-9) if fpr is not None else 0
    scored = [
        rec.get("mia_n_nonmembers")
        for seeds in (entry.get("per_seed") or {}).values()
        for rec in seeds.values()
        if rec.get("mia_n_nonmembers") is not None
    ]
    if fpr is not None and scored and min(scored) < need:
        members = {
            _seed_key(s): float(rec.get("mia_n_members") or 0)
            for seeds in (entry.get("per_seed") or {}).values()
            for s, rec in seeds.items()
        }
        out.counts = {s: (0.0, n) for s, n in members.items()}
        out.unresolved = (
            f"n/a: {int(min(scored))} non-members scored per seed cannot resolve an FPR of {fpr:g} "
            f"({need} needed)"
        )
        return out
    per_attack: dict[str, dict[int, dict[str, Any]]] = {}
    for attack, seeds in _attacks(entry.get("per_seed"), keep):
        for s, rec in seeds.items():
            if rec.get(name) is not None and rec.get(f"{name}:n"):
                per_attack.setdefault(attack, {})[_seed_key(s)] = rec
    if not per_attack:
        return out

    def rate(attack: str, seeds: list[int]) -> float:
        recs = per_attack[attack]
        k = sum(recs[t][name] * recs[t][f"{name}:n"] for t in seeds if t in recs)
        n = sum(recs[t][f"{name}:n"] for t in seeds if t in recs)
        return k / n if n else -math.inf

    for s, best in _held_out_picks(per_attack, rate).items():
        rec = per_attack[best][s]
        n = float(rec[f"{name}:n"])
        out.counts[s] = (round(rec[name] * n, 6), n)
        out.attack[s] = [(best,)]
        out.operating.append(
            {k: rec.get(k) for k in (f"mia_fp_at_{name[len('mia_tpr_at_') :]}", "mia_n_nonmembers")}
            | {"threshold": rec.get(f"mia_threshold_at_{name[len('mia_tpr_at_') :]}")}
            if fpr is not None
            else {}
        )
    return out


def operating_point(leak: Leakage, name: str) -> tuple[float, float, list[float]] | None:
    """A TPR-at-FPR primary's realised false positives k_fp of n_non (summed over seeds, the worst
    attack's of each seed) and the seeds' thresholds; None for another metric."""
    if _target_fpr(name) is None or not leak.operating:
        return None
    suffix = name[len("mia_tpr_at_") :]
    fp = [op.get(f"mia_fp_at_{suffix}") for op in leak.operating]
    non = [op.get("mia_n_nonmembers") for op in leak.operating]
    if any(v is None for v in fp + non):
        return None
    return float(sum(fp)), float(sum(non)), [op.get("threshold") for op in leak.operating]


def _target_fpr(name: str) -> float | None:
    """The FPR of a TPR-at-low-FPR metric ('mia_tpr_at_1pct_fpr' -> 0.01), None for other metrics."""
    if not name.startswith("mia_tpr_at_"):
        return None
    text = name[len("mia_tpr_at_") :].split("pct_fpr", 1)[0]
    try:
        return float(text) / 100.0
    except ValueError:
        return None


# ------------------------------------------------------------------------------------- the bootstrap


class Draws:
    """The bootstrap draws every configuration shares: per draw, the seeds drawn (positions into the
    board's seeds) and, per drawn position, uniform numbers that pick the inputs within that seed."""

    def __init__(self, seeds: Sequence[int], max_inputs: int, draws: int = DRAWS, rng_seed: int = RNG_SEED):
        rng = np.random.default_rng(rng_seed)
        self.seeds = list(seeds)
        self.picks = rng.integers(0, len(self.seeds), size=(draws, len(self.seeds)))
        self.uniform = rng.random((draws, len(self.seeds), max(max_inputs, 1)))
        self.binomial_rng_seed = rng_seed + 1

    @property
    def n(self) -> int:
        return int(self.picks.shape[0])

    def rates(self, leak: Leakage) -> np.ndarray | None:
        """`leak`'s rate on every draw ([draws]); None when it has no value."""
        if leak.point() is None:
            return None
        index = {s: j for j, s in enumerate(self.seeds)}
        if leak.inputs:
            width = self.uniform.shape[2]
            values = np.zeros((len(self.seeds), width))
            counts = np.zeros(len(self.seeds), dtype=int)
            for s, v in leak.inputs.items():
                if s in index and v.size:
                    counts[index[s]] = min(v.size, width)
                    values[index[s], : counts[index[s]]] = v[:width]
            n = counts[self.picks]  # [draws, S]
            idx = np.floor(self.uniform * n[..., None]).astype(int)  # [draws, S, width]
            idx = np.minimum(idx, np.maximum(n[..., None] - 1, 0))
            picked = values[self.picks[..., None], idx]
            mask = np.arange(width)[None, None, :] < n[..., None]
            total = np.where(mask, picked, 0.0).sum(axis=(1, 2))
            size = n.sum(axis=1)
            return np.divide(total, size, out=np.full(total.shape, np.nan), where=size > 0)
        rng = np.random.default_rng(self.binomial_rng_seed)
        k = np.zeros(len(self.seeds))
        n = np.zeros(len(self.seeds))
        for s, (ks, ns) in leak.counts.items():
            if s in index:
                k[index[s]], n[index[s]] = ks, ns
        nn = n[self.picks]
        p = np.divide(k, n, out=np.zeros_like(k), where=n > 0)[self.picks]
        drawn = rng.binomial(nn.astype(int), p)
        size = nn.sum(axis=1)
        return np.divide(drawn.sum(axis=1), size, out=np.full(size.shape, np.nan), where=size > 0)


def rate_interval(lk: Leakage, draws: np.ndarray, rate: float, primary: str) -> tuple[float, float]:
    """A configuration's published interval of its primary: the two-stage bootstrap's percentile
    interval (it respects that a seed's inputs share a model), widened to contain the exact
    (Clopper-Pearson) interval of the pooled count where the primary is a rate. A percentile bootstrap
    of a rate without a success (or without a failure) collapses to a point, [0, 0] for 0 of 100
    inputs, although 0 of 100 only says the rate is below 3.6 %; the exact interval is the least a
    reader may assume, the bootstrap adds the clustering by seed. One seed known only by its count (a
    TPR's k of n members) has the exact interval alone."""
    if lk.counts and not lk.inputs and len(lk.seeds) == 1:
        return clopper_pearson(lk.successes, lk.n_inputs)
    low, high = percentile_interval(draws)
    low, high = min(low, rate), max(high, rate)
    if is_rate(metric(primary)) and lk.n_inputs:
        exact_low, exact_high = clopper_pearson(lk.successes, lk.n_inputs)
        low, high = min(low, exact_low), max(high, exact_high)
    return low, high


def percentile_interval(x: np.ndarray) -> tuple[float, float]:
    x = x[np.isfinite(x)]
    if not x.size:
        return (math.nan, math.nan)
    lo, hi = np.quantile(x, [(1 - LEVEL) / 2, 1 - (1 - LEVEL) / 2])
    return float(lo), float(hi)


# ------------------------------------------------------------------------------------------ the rows


@dataclass
class Row:
    """One configuration as the v2 table shows it."""

    entry: dict[str, Any]
    leakage: Leakage
    rate: float | None
    low: float | None
    high: float | None
    drop: float | None
    drop_low: float | None
    drop_high: float | None
    admissible: bool
    borderline: bool
    protection: str  # "", "no protection", "baseline"
    rank: int | None = None
    tied: int = 1
    same_rank: float | None = None
    rank_low: int | None = None
    rank_high: int | None = None
    draws: np.ndarray | None = field(default=None, repr=False)

    @property
    def defense(self) -> str:
        return self.entry["defense"]


@dataclass
class Ranking:
    """A v2 board's rows: ranked (within the utility budget) and outside the budget; the floor."""

    primary: str
    budget: float | None
    ranked: list[Row]
    outside: list[Row]
    floor: float | None = None
    floor_metric: str = ""
    chance: float | None = None
    draws: int = DRAWS
    unresolved: str = ""

    @property
    def rows(self) -> list[Row]:
        return self.ranked + self.outside


def _per_seed_acc(entry: dict[str, Any]) -> dict[int, float]:
    stat = (entry.get("metrics") or {}).get("test_acc") or {}
    values = stat.get("per_seed") or []
    return {int(s): float(v) for s, v in zip(entry["seeds"], values, strict=False) if v is not None}


def utility_drop(
    entry: dict[str, Any], none: dict[str, Any]
) -> tuple[float | None, float | None, float | None]:
    """drop = mean over the shared seeds of acc(none, s) - acc(c, s) (a share; x100 for points), with
    its 95 % t interval (None with fewer than 2 seeds)."""
    own, base = _per_seed_acc(entry), _per_seed_acc(none)
    diffs = [base[s] - own[s] for s in sorted(own) if s in base]
    if not diffs:
        return None, None, None
    mean = float(np.mean(diffs))
    if len(diffs) < 2:
        return mean, None, None
    half = t95(len(diffs)) * float(np.std(diffs, ddof=1)) / math.sqrt(len(diffs))
    return mean, mean - half, mean + half


def rank_board(
    entries: list[dict[str, Any]],
    primary: str,
    budget_pp: float | None,
    floor_metric: str = "",
    keep: Keep = None,
) -> Ranking:
    """The v2 ranking of a board's entries (module docstring), by the worst case over the attacks that
    `keep` accepts (all by default)."""
    none = next((e for e in entries if e["defense"] == "none"), None)
    leaks = [worst_per_input(e, primary, keep) for e in entries]
    seeds = sorted({s for lk in leaks for s in lk.seeds})
    width = max([v.size for lk in leaks for v in lk.inputs.values()] or [1])
    draws = Draws(seeds, width)
    sign = metric(primary).leakage_sign
    rows: list[Row] = []
    for e, lk in zip(entries, leaks, strict=True):
        d = draws.rates(lk)
        rate = lk.point()
        low = high = None
        if rate is not None and d is not None:
            low, high = rate_interval(lk, d, rate, primary)
        drop, dlo, dhi = utility_drop(e, none) if none is not None else (None, None, None)
        budget = None if budget_pp is None else budget_pp / 100.0
        admissible = e["defense"] == "none" or (
            budget is not None and drop is not None and round(drop, 9) <= budget
        )
        borderline = (
            budget is not None
            and dlo is not None
            and dhi is not None
            and dlo <= budget < dhi
            and e is not none
        )
        rows.append(Row(e, lk, rate, low, high, drop, dlo, dhi, admissible, borderline, "", draws=d))
    base = next((r for r in rows if r.entry is none), None)
    for r in rows:
        if r is base:
            r.protection = "baseline"
        elif base is not None and r.draws is not None and base.draws is not None:
            lo, _ = percentile_interval(sign * (base.draws - r.draws))
            r.protection = "" if lo > 0 else "no protection"
    ranked_rows = [r for r in rows if r.admissible and r.draws is not None]
    for a in ranked_rows:
        better = 0
        for b in ranked_rows:
            if b is a:
                continue
            lo, _ = percentile_interval(sign * (a.draws - b.draws))
            better += lo > 0
        a.rank = 1 + better
    for a in ranked_rows:
        a.tied = sum(1 for b in ranked_rows if b.rank == a.rank)
    _stability(ranked_rows, sign)
    ranked_rows.sort(key=lambda r: (r.rank, sign * (r.rate if r.rate is not None else math.inf), r.defense))
    outside = [r for r in rows if r not in ranked_rows]
    outside.sort(key=lambda r: (r.rate is None, sign * (r.rate or 0.0), r.defense))
    floor = _floor(entries, floor_metric) if floor_metric else None
    chance = _floor(entries, "reid_chance")
    unresolved = next((lk.unresolved for lk in leaks if lk.unresolved), "")
    return Ranking(primary, budget_pp, ranked_rows, outside, floor, floor_metric, chance, draws.n, unresolved)


def is_adaptive(label: str) -> bool:
    """Whether the attack of a suite label (`soteria-adaptive[iterations=200]`) adapts to a defense
    (`fedbench.spec.applicability.adapts_to`); an attack this process does not know counts as plain."""
    from fedbench.errors import FedbenchError
    from fedbench.spec.applicability import adapts_to

    try:
        return bool(adapts_to(label.split("[", 1)[0]))
    except FedbenchError:
        return False


def has_adaptive(entries: list[dict[str, Any]]) -> bool:
    """Whether the suite has an adaptive attack: results of one, or one in the suite that the attack
    cascade never had to run (every input was re-identified before it)."""
    return any(
        is_adaptive(a)
        for e in entries
        for a in [*(e.get("attack_suite") or []), *(e.get("per_input") or {}), *(e.get("per_seed") or {})]
    )


def plain_ranking(
    entries: list[dict[str, Any]], primary: str, budget_pp: float | None, floor_metric: str = ""
) -> Ranking:
    """The ranking by the non-adaptive attacks' worst case: what the board would say without its
    adaptive attacks (issue 28 ranks by the adaptive worst case and flags the rows whose rank moved)."""
    return rank_board(entries, primary, budget_pp, floor_metric, keep=lambda a: not is_adaptive(a))


def _stability(rows: list[Row], sign: int) -> None:
    if not rows:
        return
    stack = np.stack([sign * r.draws for r in rows])  # [rows, draws]: lower = less leakage
    ranks = 1 + (stack[None, :, :] < stack[:, None, :]).sum(axis=1)  # [rows, draws]
    for i, r in enumerate(rows):
        band = (ranks[i] >= r.rank) & (ranks[i] <= r.rank + r.tied - 1)
        r.same_rank = float(band.mean())
        lo, hi = np.quantile(ranks[i], [(1 - LEVEL) / 2, 1 - (1 - LEVEL) / 2])
        r.rank_low, r.rank_high = int(math.floor(lo)), int(math.ceil(hi))


def _floor(entries: list[dict[str, Any]], name: str) -> float | None:
    """The mean of a reference metric over the `none` entry's inputs (the class-mean image's
    re-identification, the chance level): input-independent, so any attack's values serve."""
    none = next((e for e in entries if e["defense"] == "none"), None)
    if none is None:
        return None
    for seeds in (none.get("per_input") or {}).values():
        values = [
            v for rec in seeds.values() for v in (rec.get("values") or {}).get(name, []) if v is not None
        ]
        if values:
            return float(np.mean(values))
    for seeds in (none.get("per_seed") or {}).values():
        values = [rec.get(name) for rec in seeds.values() if rec.get(name) is not None]
        if values:
            return float(np.mean(values))
    return None


def secondary_medians(leak_entry: dict[str, Any], name: str) -> float | None:
    """The median over all inputs of a per-input secondary metric (PSNR, SSIM), best attack per input."""
    lk = worst_per_input(leak_entry, name)
    if not lk.inputs:
        return None
    values = np.concatenate([lk.inputs[s] for s in lk.seeds])
    return float(np.median(values)) if values.size else None


def is_noise(epsilon: float | None) -> bool:
    """A DP-accounted row whose epsilon says nothing: labelled noise, not DP."""
    return epsilon is not None and (math.isinf(epsilon) or epsilon > NOISE_EPSILON)
