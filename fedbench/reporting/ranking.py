"""A board's ranking: Pareto ranks on (utility ↑, worst-case leakage ↓) and how far to trust them.

Rows are ranked by Pareto rank — rank 1 is the non-dominated front — ties broken by utility
(`pareto_rank`, `ranked_order`, `ranked`). How far to trust a rank is estimated from the per-seed
values (`board_stats.with_rank_stability`): a bootstrap over the board's seeds, resampled jointly for
every configuration (`rank_stability`), gives each entry the share of resamples that reproduce its
rank and the rank's 95 % interval. It is shown only while it still describes the board's ranks
(`stability_state`), as a table column (`stability_text`) and a README summary (`stability_note`).

This module sits below the rest of the leaderboard code: it knows the board and its entries, and
`rounded`, the precision the entries keep their numbers at.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fedbench.metrics.catalogue import metric
from fedbench.reporting.board_schema import Board


def pareto_rank(utility: Sequence[float], leakage: Sequence[float]) -> list[int]:
    """Pareto rank of each point on (utility ↑, leakage ↓): 1 = non-dominated, 2 = next front, ...

    A point dominates another when it is at least as good on both and strictly better on one;
    identical points share a rank. A missing leakage (NaN/None) counts as the worst leakage,
    a missing utility as the worst utility.
    """
    u = [-math.inf if is_missing(x) else float(x) for x in utility]
    lk = [math.inf if is_missing(x) else float(x) for x in leakage]
    if len(u) != len(lk):
        raise ValueError("utility and leakage must have the same length")
    ranks = [0] * len(u)
    left = set(range(len(u)))
    rank = 1
    while left:
        front = {
            i
            for i in left
            if not any(
                u[j] >= u[i] and lk[j] <= lk[i] and (u[j] > u[i] or lk[j] < lk[i]) for j in left if j != i
            )
        }
        for i in front:
            ranks[i] = rank
        left -= front
        rank += 1
    return ranks


def ranked_order(utility: Sequence[float], leakage: Sequence[float], labels: Sequence[str]) -> list[int]:
    """Indices sorted by Pareto rank, then utility (higher first), then leakage, then label."""
    ranks = pareto_rank(utility, leakage)

    def key(i: int):
        u = -math.inf if is_missing(utility[i]) else utility[i]
        lk = math.inf if is_missing(leakage[i]) else leakage[i]
        return (ranks[i], -u, lk, labels[i])

    return sorted(range(len(ranks)), key=key)


def is_missing(x: Any) -> bool:
    """None or NaN: a value a rank counts as the worst."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def rounded(v: float | None) -> float | None:
    """A number as the entries keep it (6 significant digits; None for a missing one), so that the
    bootstrap ranks the means the board shows."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return float(f"{v:.6g}")


# ------------------------------------------------------------------------------------ rank stability


STABILITY_RESAMPLES = 1000
STABILITY_SEED = 0  # the bootstrap's RNG seed: a board rebuilt from the same results gets the same numbers


def pareto_ranks_batch(utility, leakage):
    """`pareto_rank` of many samples at once: `utility` and `leakage` are (samples, points) arrays (NaN =
    missing, counted as the worst value, as there); returns the (samples, points) integer ranks.

    The fronts are peeled for all samples together: a point is on the current front of its sample when
    no point still left in that sample dominates it.
    """
    import numpy as np

    u = np.where(np.isnan(utility), -np.inf, np.asarray(utility, dtype=float))
    lk = np.where(np.isnan(leakage), np.inf, np.asarray(leakage, dtype=float))
    if u.shape != lk.shape or u.ndim != 2:
        raise ValueError("utility and leakage must be (samples, points) arrays of one shape")
    uj, ui = u[:, None, :], u[:, :, None]  # [s, i, j]: point j against point i
    lj, li = lk[:, None, :], lk[:, :, None]
    dominated_by = (uj >= ui) & (lj <= li) & ((uj > ui) | (lj < li))  # [s, i, j]: j dominates i
    ranks = np.zeros(u.shape, dtype=int)
    left = np.ones(u.shape, dtype=bool)
    rank = 1
    while left.any():
        front = left & ~(dominated_by & left[:, None, :]).any(axis=2)
        ranks[front] = rank
        left &= ~front
        rank += 1
    return ranks


def _resampled_means(values, picks, weights=None):
    """Per resample (a row of `picks`, indices into `values`), the mean of the picked values, weighted
    by `weights` when given (NaN = missing, left out), rounded as entries are. A resample that picked
    none of the values present keeps the mean of all of them (it says nothing about this
    configuration); NaN only when every value is missing."""
    import numpy as np

    values = np.asarray(values, dtype=float)
    w = np.ones_like(values) if weights is None else np.asarray(weights, dtype=float)
    w = np.where(np.isnan(values) | np.isnan(w), 0.0, w)
    values = np.where(w > 0, values, 0.0)
    count = w[picks].sum(axis=1)
    total = (values * w)[picks].sum(axis=1)
    full = float((values * w).sum() / w.sum()) if w.sum() > 0 else math.nan
    means = np.divide(total, count, out=np.full(len(picks), full), where=count > 0)
    return np.array([math.nan if math.isnan(m) else rounded(float(m)) for m in means])


def _by_seed(per_seed, seeds):
    """(utility, leakage, weights) as (configurations, board seeds) arrays over the union of the seeds
    (NaN where a configuration lacks a seed), and the union's labels."""
    import numpy as np

    labels = sorted({s for own in seeds for s in own})
    column = {s: j for j, s in enumerate(labels)}
    shape = (len(per_seed), len(labels))
    util, leak, weights = np.full(shape, np.nan), np.full(shape, np.nan), np.full(shape, np.nan)
    for i, (values, own) in enumerate(zip(per_seed, seeds, strict=True)):
        u, lk, w = (*values, None) if len(values) == 2 else values
        if len(u) != len(lk) or not len(u) or len(own) != len(u) or (w is not None and len(w) != len(u)):
            raise ValueError(f"configuration {i}: one utility and one leakage value per seed, at least one")
        cols = [column[s] for s in own]
        util[i, cols], leak[i, cols] = u, lk
        weights[i, cols] = 1.0 if w is None else w
    return util, leak, weights, labels


def rank_stability(
    per_seed: Sequence[tuple[Sequence[float], ...]],
    reported: Sequence[int],
    resamples: int = STABILITY_RESAMPLES,
    seed: int = STABILITY_SEED,
    seeds: Sequence[Sequence[Any]] | None = None,
) -> list[dict[str, Any]]:
    """How stable each configuration's Pareto rank is under resampling of the board's seeds (a bootstrap).

    `per_seed[i]` holds configuration i's per-seed utility and leakage (leakage signed so that lower is
    less leakage, as `ranked` compares it; NaN = missing) and optionally per-seed weights of the
    leakage (a rate's inputs, so a mean is the pooled k / n); `seeds[i]` labels them (default: position
    j is seed j for every configuration); `reported[i]` is the rank the board shows.

    A seed is the same data split, initialisation and victims for every configuration, so the seeds are
    resampled jointly: each of `resamples` resamples draws the board's seeds (the union of the
    configurations' seeds) with replacement once and applies that draw to every configuration, which
    averages its values at the drawn seeds (a seed it lacks is left out; a configuration none of whose
    seeds is drawn keeps its mean, so a one-seed configuration never moves). A seed's utility and
    leakage stay together. Each resample
    recomputes the means and the Pareto ranks of all configurations. Per configuration: the share of
    resamples giving the reported rank (`same_rank`) and the 95 % percentile interval of its rank
    (`interval`). This is the bootstrap of a ranking of Hall & Miller (2009, "Using the bootstrap to
    quantify the authority of an empirical ranking", Annals of Statistics 37(6B)), with the percentile
    interval of Efron & Tibshirani (1993, "An Introduction to the Bootstrap", ch. 13); the RNG `seed`
    makes it reproducible. Drawn independently per configuration instead, a defense that beats
    another on every seed could lose to it in a resample that pairs its hard seeds with the other's
    easy ones.

    With few seeds the bootstrap distribution is coarse (3 seeds give 10 distinct resamples), so the
    share is an indication of how close a configuration sits to a neighbouring front, not a p-value.
    """
    import numpy as np

    if len(per_seed) != len(reported):
        raise ValueError("one reported rank per configuration")
    if not per_seed:
        return []
    if seeds is None:
        seeds = [list(range(len(values[0]))) for values in per_seed]
    util, leak, weights, labels = _by_seed(per_seed, seeds)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(labels), size=(resamples, len(labels)))  # one draw for every configuration
    util_means = np.stack([_resampled_means(u, picks) for u in util], axis=1)
    leak_means = np.stack(
        [_resampled_means(lk, picks, w) for lk, w in zip(leak, weights, strict=True)], axis=1
    )
    ranks = pareto_ranks_batch(util_means, leak_means)
    out = []
    for i, rank in enumerate(reported):
        lo, hi = np.quantile(ranks[:, i], [0.025, 0.975], method="inverted_cdf")
        out.append(
            {
                "rank": int(rank),
                "same_rank": rounded(float(np.mean(ranks[:, i] == rank))),
                "interval": [int(lo), int(hi)],
                "resamples": int(resamples),
                "rng_seed": int(seed),
                "joint": True,
            }
        )
    return out


# ----------------------------------------------------------------------------------- a board's ranks


def _leak_value(entry: dict[str, Any], name: str) -> float | None:
    stat = (entry["metrics"].get("worst_case") or {}).get(name)
    return stat["mean"] if stat else None


def ranked(board: Board, entries: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """(Pareto rank, entry), in leaderboard order. A v2 board (`board_table`): its rank within the
    utility budget, rows outside it after them with rank 0 (not ranked)."""
    if board.board_version >= 2:
        from fedbench.reporting.board_rank import rank_board

        rows = rank_board(entries, board.primary, board.utility_budget).rows
        return [(r.rank or 0, r.entry) for r in rows]
    sign = metric(board.headline).leakage_sign
    util = [e["metrics"]["test_acc"]["mean"] for e in entries]
    leak = [None if (v := _leak_value(e, board.headline)) is None else v * sign for e in entries]
    ranks = pareto_rank(util, leak)
    order = ranked_order(util, leak, [e["defense"] for e in entries])
    return [(ranks[i], entries[i]) for i in order]


def stability_state(board: Board, entries: list[dict[str, Any]]) -> bool | None:
    """Whether the entries' rank stability can be shown: None when no entry carries it (boards exported
    before it), True when it is current, False when it is out of date.

    Rank stability belongs to the board as a whole (one bootstrap over all its entries), so it is
    current only when every entry carries it, from one bootstrap (resamples, RNG seed), each computed
    for the rank the board gives the entry now. An entry edited or removed by hand breaks that: the
    board then renders the column as "—" and says the numbers are out of date, rather than showing
    the share of a rank the board no longer gives (rebuilding or re-exporting recomputes them).
    """
    have = [e.get("rank_stability") for e in entries]
    if not any(have):
        return None
    if not all(have) or len({(s["resamples"], s["rng_seed"], s.get("joint", False)) for s in have}) > 1:
        return False
    return all(e["rank_stability"]["rank"] == rank for rank, e in ranked(board, entries))


STABILITY_COLUMN = "rank stability"


def stability_text(stable: dict[str, Any]) -> str:
    """'73% [1–3]': the share of resamples giving the rank shown, and the rank's 95 % interval."""
    lo, hi = stable["interval"]
    share = _percent(stable["same_rank"])
    return f"{share} [{lo}]" if lo == hi else f"{share} [{lo}–{hi}]"


def _percent(share: float) -> str:
    """A share as a whole percentage; one that is neither 0 nor 1 never prints as 0% or 100%."""
    pct = round(100 * share)
    return "<1%" if share > 0 and pct == 0 else ">99%" if share < 1 and pct == 100 else f"{pct}%"


def stability_note(board: Board, entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the README says about rank stability (None when the entries carry none): a summary over
    the board and what the bootstrap recomputes."""
    state = stability_state(board, entries)
    if state is None:
        return None
    if not state:
        return {"summary": "", "stale": True}
    rows = ranked(board, entries)
    stable = [e for _, e in rows if e["rank_stability"]["same_rank"] >= 0.95]
    summary = f"{len(stable)} of {len(rows)} configurations keep their rank in at least 95% of resamples"
    if len(stable) < len(rows):
        shakiest = min((e for _, e in rows), key=lambda e: e["rank_stability"]["same_rank"])
        summary += (
            f"; the least stable, `{shakiest['defense']}`, in "
            f"{_percent(shakiest['rank_stability']['same_rank'])}"
        )
    if any(len(e["seeds"]) < 2 for e in entries):
        summary += " (a configuration with one seed has nothing to resample: only its neighbours move)"
    first = entries[0]["rank_stability"]
    means = (
        f"the mean accuracy, the mean worst-case {board.headline} and the Pareto ranks"
        if board.attack_suite
        else "the mean accuracy and the ranks"
    )
    return {
        "summary": summary + ".",
        "stale": False,
        "resamples": first["resamples"],
        "rng_seed": first["rng_seed"],
        "joint": bool(first.get("joint")),
        "means": means,
    }
