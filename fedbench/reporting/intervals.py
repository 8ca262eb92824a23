"""Intervals that fit their metric: which metrics are rates, how many inputs a rate counts, and the
95 % interval of a mean over seeds that never leaves the metric's range.

- A **rate** is a share of inputs, 0 or 1 per input: a leakage metric shown in percent whose
  catalogued range is [0, 1] (label accuracy, recovered and exact shares, the attack's declared
  success, attack accuracy, ASR, TPR at a low FPR). Its interval is the exact binomial
  (Clopper-Pearson, 1934) interval at 95 % of k successes in n inputs, where n is the sum of the
  inputs of the runs it averages (pooled over seeds) and k the sum of each run's rate times its
  inputs; the rate shown is k / n. Pooling treats the inputs of one seed as independent, which they
  are not quite (they share a model): the interval is the one the design asks of a rate (§7.1), the
  clustered two-stage bootstrap is left to the per-input boards.
- How many inputs a run's rate counts is a results column (`inputs_column`): the images observed for
  reconstruction rates, the evaluated examples (members for a TPR) for membership, the victims for
  attribute inference; the attack's declared success counts the run as one input. A rate whose count
  is unknown (a plugin family's) is treated as a bounded mean.
- Every other metric is a **bounded mean** over seeds: its 95 % Student-t interval (n >= 3 seeds),
  clipped to the metric's range (`value_range`: the catalogue's bounds, PSNR capped where its scorer
  caps it). Clipping is the transform: the interval keeps its level where it fits and stops at the
  bound where the t approximation would leave the range.

Functions return numbers; `tables.aggregate` turns them into cells, `board_stats` into entries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fedbench.metrics.catalogue import Metric

LEVEL = 0.95
RATE = "cp95"  # the spread kind of a rate's Clopper-Pearson interval (no symmetric spread)
ONE_PER_RUN = "run"  # a rate whose run is its one input (the attack's declared success)

# the results column that counts a run's inputs, per attack family (a rate's n); a metric's own
# entry first: a TPR is a share of the members, not of every evaluated example
_INPUTS_BY_METRIC = {
    "attack_success": ONE_PER_RUN,
    "mia_tpr_at_0.1pct_fpr": "mia_n_members",
    "mia_tpr_at_1pct_fpr": "mia_n_members",
}
_INPUTS_BY_FAMILY = {
    "reconstruction": "tm_observed_examples",  # the attacked images (labels, recovered, exact)
    "membership": "mia_examples",  # the evaluated members and non-members
    "attribute": "aia_victims",  # the victims whose attribute is inferred
}
# the results columns that count inputs (summed when a board pools victims' runs into one row)
INPUT_COLUMNS = tuple(
    dict.fromkeys(c for c in (*_INPUTS_BY_METRIC.values(), *_INPUTS_BY_FAMILY.values()) if c != ONE_PER_RUN)
)


def is_rate(m: Metric) -> bool:
    """A share of inputs (0/1 per input): a leakage metric in percent whose range is [0, 1]."""
    return m.kind == "leakage" and m.unit == "pct" and tuple(m.bounds) == (0, 1)


def inputs_column(m: Metric) -> str | None:
    """The results column counting a run's inputs for rate `m` (`ONE_PER_RUN`: the run is one input);
    None for a metric that is not a rate or a rate whose count fedbench does not know."""
    if not is_rate(m):
        return None
    return _INPUTS_BY_METRIC.get(m.name) or _INPUTS_BY_FAMILY.get(m.family)


def value_range(m: Metric) -> tuple[float, float]:
    """The values `m` can take (open ends as ±inf): the catalogue's bounds, PSNR up to its scorer's cap."""
    low, high = m.bounds
    if high is None and m.name in ("psnr", "psnr_worst"):
        from fedbench.metrics.reconstruction import ReconstructionScores

        high = ReconstructionScores.psnr_cap
    return (-math.inf if low is None else float(low), math.inf if high is None else float(high))


def clopper_pearson(k: float, n: float, level: float = LEVEL) -> tuple[float, float]:
    """The exact binomial (Clopper-Pearson) interval of k successes in n trials: the beta quantiles
    B(a/2; k, n-k+1) and B(1-a/2; k+1, n-k) with a = 1 - level, 0 at k = 0 and 1 at k = n. A
    non-integer k (a TPR read off an interpolated ROC curve) enters the beta quantiles as it is."""
    if not n > 0:
        raise ValueError(f"a rate needs at least one input, got n = {n}")
    if not 0 <= k <= n:
        raise ValueError(f"k = {k} successes must lie between 0 and n = {n}")
    from scipy.special import betaincinv  # scipy.special: scipy.stats costs ~1 s of import

    a = (1 - level) / 2
    low = 0.0 if k <= 0 else float(betaincinv(k, n - k + 1, a))
    high = 1.0 if k >= n else float(betaincinv(k + 1, n - k, 1 - a))
    return low, high


def t95(n: int) -> float:
    """Student-t 97.5 % quantile with n - 1 degrees of freedom."""
    from scipy.special import stdtrit

    return float(stdtrit(n - 1, 0.975))


@dataclass(frozen=True)
class Summary:
    """A mean over seeds and its interval: `spread` is the symmetric half-width (t) or std (two seeds),
    `low`/`high` the interval inside the metric's range; `k`/`inputs` are a rate's pooled counts."""

    value: float | None
    n: int
    spread: float | None = None
    spread_kind: str = ""
    low: float | None = None
    high: float | None = None
    k: float | None = None
    inputs: float | None = None


def summarise(m: Metric, values: Sequence[float], inputs: Sequence[float | None] | None = None) -> Summary:
    """The mean over `values` (one per seed or run; missing ones left out) and its interval.

    A rate with an input count for every value (`inputs`, parallel to `values`) is pooled: k =
    sum(value x inputs), n = sum(inputs), value k / n, Clopper-Pearson at 95 % (no interval when n is
    0). Anything else is a bounded mean: one value has no interval, two give mean ± std (a spread,
    not an interval), three or more the 95 % t interval clipped to `value_range`.
    """
    pairs = [
        (float(v), None if inputs is None else inputs[i])
        for i, v in enumerate(values)
        if v is not None and not math.isnan(v)
    ]
    n = len(pairs)
    if n == 0:
        return Summary(None, 0)
    counts = [c for _, c in pairs]
    if is_rate(m) and inputs is not None and all(c is not None and not math.isnan(c) for c in counts):
        total = float(sum(counts))
        if total <= 0:
            return Summary(sum(v for v, _ in pairs) / n, n, inputs=0.0)
        k = min(max(sum(v * c for v, c in pairs), 0.0), total)
        k = round(k, 6)  # rates times counts: integers up to float noise (a TPR's stays fractional)
        low, high = clopper_pearson(k, total)
        return Summary(k / total, n, None, RATE, low, high, k, total)
    import numpy as np

    vals = np.asarray([v for v, _ in pairs], dtype=float)
    mean = float(vals.mean())
    if n == 1:
        return Summary(mean, 1)
    std = float(vals.std(ddof=1))
    if n == 2:
        return Summary(mean, 2, std, "std")
    half = t95(n) * std / math.sqrt(n)
    lo, hi = value_range(m)
    return Summary(mean, n, half, "ci95", max(mean - half, lo), min(mean + half, hi))
