"""The one-run audit's epsilon lower bound: Steinke, Nasr & Jagielski, "Privacy Auditing with One (1)
Training Run" (NeurIPS 2023, arXiv 2305.08846).

Setting: m canaries, each included in the training set independently with probability 1/2 (S_i = +1
in, -1 out). After one training run the auditor scores every canary and guesses T_i = +1 for the k_+
highest scores, -1 for the k_- lowest, and abstains on the rest; r = k_+ + k_- guesses, v of them
correct. The guesses may depend on the trained model and on randomness of the auditor's own, never on
S.

Why a lower bound: if training is (eps, 0)-DP with respect to adding or removing one canary, the
number of correct guesses is stochastically dominated by Binomial(r, e^eps / (1 + e^eps)) (their
Theorem 3.1: each guess is at best randomized response, even when the canaries are guessed together).
With delta > 0 the tail gains a term (their Theorem 5.2 / Proposition 5.7):

    P[W >= v] <= P[Binomial(r, q) >= v] + 2 m delta * max_{i = 1..v} P[v > Binomial(r, q) >= v - i] / i,

q = e^eps / (1 + e^eps). This is their reference procedure `p_value_DP_audit` (paper, Appendix),
re-implemented here with the inner loop vectorised. The reported lower bound at confidence 1 - beta is
the largest eps whose p-value is still below beta (their `get_eps_audit`: bisection, 30 halvings of an
interval grown by steps of 1 until the p-value reaches beta): every eps below it is rejected at level
beta, so the mechanism is not (eps, delta)-DP for any such eps, with confidence 1 - beta.

Choosing k: the paper sweeps k_+ (and k_-) and reports the best. Taking the maximum over K choices
on the same scores is K tests; `search_guesses` applies each at level beta / K (Bonferroni), so by the
union bound the maximum holds at confidence 1 - beta. A single (k_+, k_-) fixed in advance needs no
correction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: the paper's bisection: 30 halvings of [eps_min, eps_max]
BISECTIONS = 30


def p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """P-value of v or more correct guesses out of r (m canaries) if training is (eps, delta)-DP: the
    module docstring's tail bound, capped at 1."""
    from scipy.stats import binom

    if not 0 <= v <= r <= m:
        raise ValueError(f"one-run audit: need 0 <= correct ({v}) <= guesses ({r}) <= canaries ({m})")
    if eps < 0 or not 0 <= delta <= 1:
        raise ValueError(f"one-run audit: eps={eps} must be >= 0 and delta={delta} in [0, 1]")
    q = 1 / (1 + math.exp(-eps))  # the accuracy of eps-DP randomized response
    tail = float(binom.sf(v - 1, r, q))  # P[Binomial(r, q) >= v]
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    import numpy as np

    below = np.cumsum(binom.pmf(np.arange(v - 1, -1, -1), r, q))  # i-th: P[v > Bin >= v - i], i = 1..v
    alpha = float(np.max(below / np.arange(1, v + 1)))
    return min(tail + alpha * delta * 2 * m, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, beta: float = 0.05) -> float:
    """The largest eps (to the bisection's precision, from below) at which v correct guesses of r have a
    p-value below `beta`; 0 when even eps = 0 is not rejected (e.g. guesses at chance)."""
    if not 0 < beta < 1:
        raise ValueError(f"one-run audit: beta={beta} must be in (0, 1)")
    if p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    low, high = 0.0, 1.0  # p_value(low) < beta <= p_value(high)
    while p_value(m, r, v, high, delta) < beta:
        high += 1.0
    for _ in range(BISECTIONS):
        mid = (low + high) / 2
        if p_value(m, r, v, mid, delta) < beta:
            low = mid
        else:
            high = mid
    return low


@dataclass(frozen=True)
class GuessOutcome:
    """The best guessing rule of a search: its bound and how it was reached.

    `tests`: how many (k_+, k_-) choices were tried (the Bonferroni factor on beta)."""

    eps_lower: float
    k_plus: int
    k_minus: int
    guesses: int
    correct: int
    tests: int


def default_choices(m: int) -> tuple[tuple[int, int], ...]:
    """The (k_+, k_-) grid `search_guesses` tries by default: k_+ and k_- each in {0} and about
    1, 2, 5, 10, 20, 30 and 50 % of m (at least 1), both not 0, k_+ + k_- <= m. Asymmetric pairs matter
    for loss scores: a memorised member has a low loss, but a high loss says little (an unmemorised
    member has one too), so the best rule often guesses "in" more than "out"."""
    sizes = sorted({max(1, round(m * f)) for f in (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)} | {0})
    return tuple((a, b) for a in sizes for b in sizes if 0 < a + b <= m)


def correct_guesses(scores: Any, included: Any, k_plus: int, k_minus: int, seed: int = 0) -> int:
    """Correct guesses of "in" for the k_plus highest scores and "out" for the k_minus lowest. Ties are
    broken by a permutation drawn from `seed` (the auditor's own randomness, independent of who is in)."""
    import numpy as np

    s, inc = np.asarray(scores, dtype=float), np.asarray(included, dtype=bool)
    if s.shape != inc.shape or s.ndim != 1:
        raise ValueError(f"one-run audit: {s.shape} scores for {inc.shape} inclusion flags")
    if np.isnan(s).any():
        raise ValueError("one-run audit: the canary scores hold NaN")
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > len(s):
        raise ValueError(f"one-run audit: k+={k_plus}, k-={k_minus} must be >= 0 with k+ + k- <= {len(s)}")
    order = _ranked(s, seed)  # lowest first
    low, high = order[:k_minus], order[len(s) - k_plus :]
    return int(inc[high].sum() + (~inc[low]).sum())


def _rank(o: GuessOutcome) -> tuple[float, float, int]:
    """Best bound first; among equal bounds (0 when nothing is certified) the most accurate rule, then
    the one with the most guesses: the rule a reader learns most from."""
    return (o.eps_lower, o.correct / o.guesses, o.guesses)


def _ranked(scores: Any, seed: int) -> Any:
    import numpy as np

    shuffle = np.random.default_rng(seed).permutation(len(scores))
    return shuffle[np.argsort(scores[shuffle], kind="stable")]


def search_guesses(
    scores: Any,
    included: Any,
    delta: float,
    beta: float = 0.05,
    choices: tuple[tuple[int, int], ...] | None = None,
    seed: int = 0,
) -> GuessOutcome:
    """The largest lower bound over `choices` of (k_+, k_-) (default: `default_choices`), each tested
    at level beta / len(choices), so the maximum holds at confidence 1 - beta (module docstring)."""
    import numpy as np

    s = np.asarray(scores, dtype=float)
    m = len(s)
    choices = tuple(choices) if choices is not None else default_choices(m)
    if not choices:
        raise ValueError("one-run audit: no (k+, k-) choice to try")
    level = beta / len(choices)
    best: GuessOutcome | None = None
    for k_plus, k_minus in choices:
        v = correct_guesses(s, included, k_plus, k_minus, seed)
        if (
            best is not None
            and best.eps_lower > 0
            and p_value(m, k_plus + k_minus, v, best.eps_lower, delta) >= level
        ):
            continue  # not rejected at the best bound so far: its own bound is no higher (skip the bisection)
        eps = epsilon_lower_bound(m, k_plus + k_minus, v, delta, level)
        outcome = GuessOutcome(eps, k_plus, k_minus, k_plus + k_minus, v, len(choices))
        if best is None or _rank(outcome) > _rank(best):
            best = outcome
    assert best is not None
    return best
