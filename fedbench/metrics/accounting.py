"""Privacy accounting for the DP defenses: epsilon of the sampled Gaussian mechanism, of example-level
DP-SGD inside FL with client participation, and their inverses.

Three accountants of the sampled Gaussian mechanism (SGM), named in every result row:
- `rdp` (default): RDP of the SGM (Mironov et al. 2019; Opacus' `compute_rdp`) over `ORDERS`
  (Opacus' default orders 1.1-63 extended with integer orders up to 10240, so that the optimum of
  small-epsilon settings is inside the list: sigma 6, q 0.0125, one step has its optimum at order
  256, where Opacus' list stops at 63 and gives 0.103 instead of 0.020), with the improved
  RDP -> (epsilon, delta) conversion of Balle et al. 2020. When the optimum still lies at an end
  of the list, an `AccountingWarning` says so (the value is then a valid but loose bound).
- `prv`: Opacus `PRVAccountant` (numerical composition of privacy loss random variables), a
  cross-check of `rdp` (it is tighter, and fails for some extreme settings: opacus#591).
- `paper` (spec 002 §4.3): what TF-Privacy's `compute_dp_sgd_privacy` did when the Fed-CDP paper was
  written: the same RDP, the order list `[1.25, ..., 4.5] + range(5, 64) + [128, 256, 512]` and the
  *old* conversion epsilon = min_a RDP(a) - log(delta) / (a - 1). With the paper's step counts
  (`paper_steps`) it reproduces every cell of the paper's Table VI.

And accountants of two other mechanisms:
- `participation_epsilon` (see there): example-level DP-SGD inside FL, where a selected client's
  examples take part in several local steps of its round and clients take part in a round with
  probability p. It is exact for that mechanism's dominating pair (a binomial mixture of
  Gaussians), so it needs no order list.
- `local_epsilon` (see there): a local mechanism on a clipped client update (dp-gaussian,
  dp-laplace), released in the rounds the client takes part in, the selection visible (no
  amplification by sampling); RDP over `LOCAL_ORDERS` (orders down to 1 + 1e-6: little noise puts
  the optimum close to 1).

Inputs are validated here (sigma > 0, q in (0, 1], steps >= 1, delta in (0, 1)): a bad value is a
`FedbenchError` naming the input. Opacus and dp-accounting are imported inside the functions.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from fedbench.errors import FedbenchError


class AccountingWarning(UserWarning):
    """The epsilon is a valid but possibly loose bound (e.g. the best RDP order is an end of the list)."""


AccountantName = Literal["rdp", "prv", "paper"]
ACCOUNTANTS: tuple[str, ...] = ("rdp", "prv", "paper")

# TF-Privacy's compute_dp_sgd_privacy orders (Fed-CDP era); 128/256/512 matter for small epsilons.
PAPER_ORDERS: tuple[float, ...] = (
    (1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 4.5)
    + tuple(float(a) for a in range(5, 64))
    + (128.0, 256.0, 512.0)
)

# The `rdp` accountant's orders: Opacus' DEFAULT_ALPHAS (1.1, ..., 10.9, 12, ..., 63) and integer orders
# up to 10240 (about 1.25x apart): large orders are where the optimum of few steps at a small q lies.
ORDERS: tuple[float, ...] = (
    tuple(1 + x / 10.0 for x in range(1, 100))
    + tuple(float(a) for a in range(12, 64))
    + (64.0, 80.0, 96.0, 112.0, 128.0, 160.0, 192.0, 224.0, 256.0, 320.0, 384.0, 448.0, 512.0)
    + (640.0, 768.0, 896.0, 1024.0, 1280.0, 1536.0, 1792.0, 2048.0, 2560.0, 3072.0, 4096.0)
    + (5120.0, 6144.0, 8192.0, 10240.0)
)

ACCOUNTANT_LABELS = {
    "rdp": "opacus-rdp",
    "prv": "opacus-prv",
    "paper": "rdp-tfp2021 (paper-compat)",
}

# Table VI of the Fed-CDP paper (sigma 6, delta 1e-5): dataset -> (T, Fed-CDP L=1, Fed-CDP L=100, Fed-SDP)
TABLE_VI: dict[str, tuple[int, float, float, float]] = {
    "mnist": (100, 0.0845, 0.8227, 0.8536),
    "cifar10": (100, 0.0845, 0.8227, 0.8536),
    "lfw": (60, 0.0689, 0.6356, 0.6677),
    "adult": (10, 0.0494, 0.2761, 0.3025),
    "cancer": (3, 0.0467, 0.1469, 0.2065),
}


@dataclass(frozen=True)
class EpsilonResult:
    """epsilon at `delta` of `steps` compositions of the sampled Gaussian mechanism (sigma, q)."""

    epsilon: float
    delta: float
    sigma: float
    q: float
    steps: int
    accountant: str
    order: float | None = None  # the optimal RDP order (rdp / paper accountants)
    warning: str | None = None  # why the value may be loose (the optimum at an end of the order list)

    @property
    def label(self) -> str:
        return ACCOUNTANT_LABELS[self.accountant]


def validate(
    sigma: float | None = None,
    q: float | None = None,
    steps: int | None = None,
    delta: float | None = None,
    accountant: str | None = None,
) -> None:
    """Raise a FedbenchError naming the first input outside its domain."""
    if sigma is not None and not (sigma > 0 and math.isfinite(sigma)):
        raise FedbenchError(f"sigma={sigma}: the noise multiplier must be a finite number > 0")
    if q is not None and not (0 < q <= 1):
        raise FedbenchError(f"q={q}: the sampling rate must be in (0, 1]")
    if steps is not None and (int(steps) != steps or steps < 1):
        raise FedbenchError(f"steps={steps}: the number of steps must be an integer >= 1")
    if delta is not None and not (0 < delta < 1):
        raise FedbenchError(f"delta={delta}: delta must be in (0, 1), e.g. 1e-5")
    if accountant is not None and accountant not in ACCOUNTANTS:
        raise FedbenchError(f"accountant '{accountant}': use one of {', '.join(ACCOUNTANTS)}")


def sgm_rdp(sigma: float, q: float, steps: int, orders: tuple[float, ...]) -> list[float]:
    """RDP of `steps` compositions of the sampled Gaussian mechanism at each order (Mironov et al. 2019).

    Integer orders: the binomial sum log A_a = logsumexp_i [log C(a, i) + i log q + (a - i) log(1 - q)
    + (i^2 - i) / (2 sigma^2)], vectorised (TF-Privacy's `_compute_log_a_int` is a Python loop over
    i, slow at the large orders of `ORDERS`). Fractional orders: Opacus' `compute_rdp` (the erfc
    series). q = 1 is the Gaussian mechanism, a / (2 sigma^2).
    """
    import numpy as np
    from scipy.special import gammaln, logsumexp

    ints = [a for a in orders if float(a).is_integer()]
    fracs = [a for a in orders if not float(a).is_integer()]
    out: dict[float, float] = {}
    if fracs:
        from opacus.accountants.analysis.rdp import compute_rdp

        out.update(
            zip(
                fracs,
                (float(v) for v in compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=fracs)),
                strict=True,
            )
        )
    for a in ints:
        if q >= 1:
            out[a] = steps * a / (2 * sigma**2)
            continue
        n = int(a)
        i = np.arange(n + 1, dtype=float)
        terms = (
            gammaln(n + 1)
            - gammaln(i + 1)
            - gammaln(n - i + 1)
            + i * math.log(q)
            + (n - i) * math.log1p(-q)
            + (i * i - i) / (2 * sigma**2)
        )
        out[a] = steps * float(logsumexp(terms)) / (n - 1)
    return [out[a] for a in orders]


def old_conversion(orders: tuple[float, ...], rdp: list[float], delta: float) -> tuple[float, float]:
    """The pre-2020 RDP -> (epsilon, delta) conversion: min over orders of rdp - log(delta)/(a - 1)."""
    best, order = math.inf, None
    for a, r in zip(orders, rdp, strict=True):
        eps = r - math.log(delta) / (a - 1)
        if eps < best:
            best, order = eps, a
    return best, order


def rdp_conversion(orders: tuple[float, ...], rdp: list[float], delta: float) -> tuple[float, float]:
    """RDP -> (epsilon, delta) of Balle et al. 2020 (Theorem 21; Opacus and dp-accounting use it):
    min over orders a of rdp(a) + log((a - 1) / a) - (log(delta) + log(a)) / (a - 1)."""
    best, order = math.inf, None
    for a, r in zip(orders, rdp, strict=True):
        if not math.isfinite(r):
            continue
        eps = r + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1)
        if eps < best:
            best, order = eps, a
    return max(0.0, best), order


def edge_warning(orders: tuple[float, ...], order: float | None, what: str) -> str | None:
    """The message for an optimum at an end of the order list (None when it is inside)."""
    if order is None or (order != orders[0] and order != orders[-1]):
        return None
    end = "largest" if order == orders[-1] else "smallest"
    return (
        f"{what}: the optimal RDP order {order:g} is the {end} of the accountant's order list "
        f"({orders[0]:g}-{orders[-1]:g}), so the epsilon is a loose upper bound; extend the orders"
    )


def epsilon(
    sigma: float,
    q: float,
    steps: int,
    delta: float,
    accountant: AccountantName = "rdp",
    orders: tuple[float, ...] | None = None,
    warn: bool = True,
) -> EpsilonResult:
    """epsilon of `steps` sampled-Gaussian steps (noise multiplier sigma, sampling rate q) at delta.

    `orders` replaces the rdp accountant's order list (`ORDERS`; the paper accountant always uses
    `PAPER_ORDERS`). When the optimal order is an end of the list, the result carries a `warning`
    and, with `warn`, an `AccountingWarning` is issued (never silenced: the caller decides).
    """
    validate(sigma, q, steps, delta, accountant)
    steps = int(steps)
    what = f"epsilon of sigma={sigma:g}, q={q:g}, steps={steps}, delta={delta:g}"
    if accountant in ("rdp", "paper"):
        if accountant == "paper":
            orders = PAPER_ORDERS
            eps, order = old_conversion(orders, sgm_rdp(sigma, q, steps, orders), delta)
        else:
            orders = tuple(float(a) for a in (orders or ORDERS))
            if not orders or min(orders) <= 1:
                raise FedbenchError(f"orders {orders}: RDP orders must be numbers > 1")
            eps, order = rdp_conversion(orders, sgm_rdp(sigma, q, steps, orders), delta)
        message = edge_warning(orders, order, f"{what} ({ACCOUNTANT_LABELS[accountant]})")
        if message and warn:
            warnings.warn(message, AccountingWarning, stacklevel=2)
        return EpsilonResult(float(eps), delta, sigma, q, steps, accountant, order, message)
    from opacus.accountants import PRVAccountant

    acc = PRVAccountant()
    acc.history = [(sigma, q, steps)]
    try:
        eps = acc.get_epsilon(delta=delta)
    except Exception as exc:  # opacus#591: PRV cannot bound some settings; RDP still can
        raise FedbenchError(
            f"the prv accountant cannot compute epsilon for sigma={sigma}, q={q}, steps={steps}, "
            f"delta={delta} ({type(exc).__name__}: {exc}); use --accountant rdp"
        ) from None
    return EpsilonResult(float(eps), delta, sigma, q, steps, accountant)


def sigma_for_epsilon(
    target_epsilon: float,
    q: float,
    steps: int,
    delta: float,
    accountant: AccountantName = "rdp",
    tolerance: float = 1e-4,
    sigma_max: float = 1e4,
) -> EpsilonResult:
    """The smallest noise multiplier (to `tolerance` relative) whose epsilon is <= target_epsilon.

    Bisection on log(sigma) with the chosen accountant; an unreachable target (even sigma_max
    gives a larger epsilon, which happens when delta >= q or the target is tiny) is a FedbenchError.
    """
    validate(None, q, steps, delta, accountant)

    def eps_at(s: float, warn: bool = False) -> EpsilonResult:
        return epsilon(s, q, steps, delta, accountant, warn=warn)

    where = f"the {accountant} accountant at q={q}, steps={steps}, delta={delta}"
    return calibrate_sigma(eps_at, target_epsilon, where, tolerance, sigma_max)


def calibrate_sigma(
    eps_at: Callable[..., EpsilonResult],
    target_epsilon: float,
    where: str,
    tolerance: float = 1e-4,
    sigma_max: float = 1e4,
) -> EpsilonResult:
    """Bisection on log(sigma) for the smallest sigma with eps_at(sigma).epsilon <= target_epsilon.

    `eps_at(sigma, warn=False)` is the epsilon at one sigma; only the returned (final) sigma is
    evaluated with warn=True, so a warning concerns the reported value, not a bisection probe.
    """
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise FedbenchError(f"target epsilon {target_epsilon}: must be a finite number > 0")

    def value(s: float) -> float:
        try:
            return eps_at(s).epsilon
        except FedbenchError:
            return math.inf

    hi_eps = value(sigma_max)
    if not hi_eps <= target_epsilon:
        raise FedbenchError(
            f"target epsilon {target_epsilon} is unreachable with {where}: even sigma={sigma_max:g} gives "
            f"epsilon={hi_eps:.4g}; raise the target, or lower q, steps or delta"
        )
    lo, hi = 1e-3, sigma_max
    if value(lo) <= target_epsilon:
        return eps_at(lo, warn=True)
    while hi / lo > 1 + tolerance:
        mid = math.sqrt(lo * hi)
        if value(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return eps_at(hi, warn=True)


# ------------------------------------------------------------- example-level DP-SGD inside FL


@dataclass(frozen=True)
class ParticipationResult(EpsilonResult):
    """epsilon of example-level DP-SGD in FL: `rounds` rounds, participation `q` per round, `uses`
    noisy local steps per round in which a participating example takes part, plus one more with
    probability `extra` (`steps` = rounds)."""

    uses: int = 1
    extra: float = 0.0

    @property
    def label(self) -> str:
        return PARTICIPATION_LABEL


PARTICIPATION_LABEL = "exact-gaussian-mixture (client participation, no subsampling amplification)"


def gaussian_delta(eps: float, mu: Any) -> Any:
    """delta(eps) of the Gaussian mechanism with sensitivity / noise std = mu (Balle & Wang 2018):
    Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2); 0 where mu = 0. Vectorised over mu."""
    import numpy as np
    from scipy.special import log_ndtr

    mu = np.atleast_1d(np.asarray(mu, dtype=float))
    out = np.zeros_like(mu)
    pos = mu > 0
    m = mu[pos]
    a = np.exp(log_ndtr(-eps / m + m / 2))
    b = np.exp(eps + log_ndtr(-eps / m - m / 2))
    out[pos] = np.clip(a - b, 0.0, 1.0)
    return out


def participation_delta(
    eps: float, sigma: float, p: float, rounds: int, uses: int, extra: float = 0.0
) -> float:
    """delta(eps) of `rounds` rounds in each of which an example takes part with probability p (its
    client is selected; independent across rounds) in `uses` Gaussian steps of noise multiplier sigma,
    and in one more step with probability `extra` given that (independent across rounds).

    sum over (j, b) of Binom(j; rounds, p) Binom(b; j, extra) delta_Gauss(eps; sqrt(j * uses + b) /
    sigma): the selection pattern is independent of the data, so by joint convexity of the hockey-stick
    divergence delta is at most the mean over patterns of the pattern's delta; given the pattern, the
    adaptive composition of its j * uses + b Gaussian steps is exactly the Gaussian mechanism with
    mu = sqrt(j * uses + b) / sigma (Dong, Roth & Su 2019). The bound is tight when the selection is
    visible to the adversary.
    """
    return _participation_delta_fn(sigma, p, rounds, uses, extra)(eps)


def _participation_delta_fn(
    sigma: float, p: float, rounds: int, uses: int, extra: float = 0.0
) -> Callable[[float], float]:
    import numpy as np
    from scipy.stats import binom

    j = np.arange(rounds + 1)
    weights = binom.pmf(j, rounds, p)
    if extra > 0:  # b of the j participations hold the extra step: the pattern's weight splits by b
        keep = weights > 1e-300
        parts = [
            (int(jj), w * binom.pmf(np.arange(jj + 1), jj, extra))
            for jj, w in zip(j[keep], weights[keep], strict=True)
        ]
        counts = np.concatenate([jj * uses + np.arange(jj + 1) for jj, _ in parts])
        weights = np.concatenate([w for _, w in parts])
    else:
        counts = j * uses
    keep = weights > 1e-300
    weights, mus = weights[keep], np.sqrt(counts[keep]) / sigma
    return lambda eps: float(np.sum(weights * gaussian_delta(eps, mus)))


def participation_epsilon(
    sigma: float, p: float, rounds: int, uses: int, delta: float, warn: bool = True, extra: float = 0.0
) -> ParticipationResult:
    """epsilon at `delta` of example-level DP-SGD inside FL (the mechanism the simulation runs).

    The mechanism: T rounds; in each round a client is selected with probability p = K_t / K
    (independently across rounds: a fresh uniform draw of K_t out of K); a selected client runs its
    local steps over its own data, each step the sum of flat-clipped per-example gradients (L2 <= C)
    plus N(0, sigma^2 C^2) (per-example noise of std sigma*C is more noise, so it is covered); an
    example takes part in `uses` of those steps (one per local epoch: each epoch is a shuffle of the
    local data cut into batches, so every example is in exactly one batch per epoch), and in one more
    with probability `extra` (a partial epoch of r batches out of a fresh shuffle; FedSGD's one batch
    of B out of n: `uses` 0 and `extra` B / n).

    Neighbouring datasets differ in one example replaced by a null example with zero gradient
    ("zero-out", dp-accounting's REPLACE_SPECIAL): the relation under which a shuffled batch's sum has
    sensitivity C (add/remove would shift the batch boundaries). No amplification by subsampling is
    claimed: the batches are not Poisson samples, and client selection does not amplify an
    example-level guarantee in epsilon, because the selected client's other data changes the output
    whether or not the example is there (the rounds the client skips are not the neighbour's
    output). What client selection and batching do give is exact: the example is exposed in
    j ~ Binom(T, p) rounds, b ~ Binom(j, extra) of them with the extra step (`participation_delta`).
    epsilon is found by bisection on delta(eps) (decreasing in eps).
    """
    validate(sigma, p, rounds, delta)
    if int(uses) != uses or uses < 0 or (uses == 0 and not extra):
        raise FedbenchError(f"uses={uses}: the steps an example is in per round must be an integer >= 1")
    if not 0 <= extra <= 1:
        raise FedbenchError(f"extra={extra}: the probability of one more step per round must be in [0, 1]")
    rounds, uses = int(rounds), int(uses)

    d = _participation_delta_fn(sigma, p, rounds, uses, extra)

    lo, hi = 0.0, 1.0
    if d(lo) > delta:
        while d(hi) > delta:
            lo, hi = hi, 2 * hi
            if hi > 1e12:  # noise this small is no guarantee: infinite, said (as local_epsilon does)
                message = f"epsilon of sigma={sigma:g}, p={p:g}, rounds={rounds} exceeds 1e12: no bound, inf"
                if warn:
                    warnings.warn(message, AccountingWarning, stacklevel=2)
                return ParticipationResult(
                    math.inf, delta, sigma, p, rounds, "participation", None, message, uses, extra
                )
        for _ in range(100):
            mid = (lo + hi) / 2
            if d(mid) > delta:
                lo = mid
            else:
                hi = mid
            if hi - lo <= 1e-9 * max(1.0, hi):
                break
    else:
        hi = 0.0
    return ParticipationResult(hi, delta, sigma, p, rounds, "participation", None, None, uses, extra)


def participation_sigma(
    target_epsilon: float,
    p: float,
    rounds: int,
    uses: int,
    delta: float,
    tolerance: float = 1e-4,
    extra: float = 0.0,
) -> ParticipationResult:
    """The smallest sigma whose `participation_epsilon` is <= target_epsilon (bisection)."""
    validate(None, p, rounds, delta)

    def eps_at(s: float, warn: bool = False) -> EpsilonResult:
        return participation_epsilon(s, p, rounds, uses, delta, warn=warn, extra=extra)

    where = f"client participation p={p}, rounds={rounds}, {uses} uses per round, delta={delta}"
    return calibrate_sigma(eps_at, target_epsilon, where, tolerance)  # type: ignore[return-value]


def paper_steps(steps: int, level: Literal["example", "client"], local_steps: int) -> int:
    """The step count of the Fed-CDP paper's scripts (spec 002 §4.3): an off-by-one (+1) for client-
    level and L=1 cells and for short runs, none for the long MNIST/CIFAR L=100 cells.

    The rule that reproduces every Table VI cell: Fed-SDP (client level) uses T+1; Fed-CDP with
    L=1 uses T+1; Fed-CDP with L>1 uses T*L, plus 1 when T*L < 5000 (adult, cancer; the scripts
    index a cumulative list there).
    """
    if level == "client" or local_steps == 1 or steps < 5000:
        return steps + 1
    return steps


# --------------------------------------------- local mechanisms on a clipped update (dp-gaussian/laplace)

# `ORDERS` with orders close to 1 in front: a local mechanism at little noise (sigma = 0.01 on an update
# clipped to 1) has its RDP optimum at a - 1 of about sqrt(log(1/delta) / RDP-slope), far below 1.1.
LOCAL_ORDERS: tuple[float, ...] = tuple(1 + 10 ** (k / 8) for k in range(-48, -8)) + ORDERS


@dataclass(frozen=True)
class LocalResult(EpsilonResult):
    """epsilon of a per-round (1 / (2 z^2))-zCDP release composed over the rounds a client takes part
    in: `certain` rounds surely, each of the other `steps - certain` with probability `q`, the selection
    known to the adversary (`sigma` holds z)."""

    certain: int = 0

    @property
    def label(self) -> str:
        return "rdp (visible participation, no amplification)"


def local_rdp(z: float, p: float, rounds: int, certain: int, orders: tuple[float, ...]) -> list[float]:
    """RDP at each order a of `rounds` rounds of a mechanism that is (a / (2 z^2))-RDP per round taken
    part in: `certain` rounds surely, each other one independently with probability p, the selection
    data-independent and visible.

    Given the set S of rounds taken part in, adaptive composition gives |S| a / (2 z^2) (Mironov 2017,
    Prop. 1). S is part of what the adversary sees and has the same law under both neighbours, so
    exp((a - 1) D_a) of the whole is the mean over S of exp((a - 1) D_a(given S)): the binomial moment
    generating function, RDP(a) = certain r + (rounds - certain) log(1 - p + p e^((a - 1) r)) / (a - 1)
    with r = a / (2 z^2). No amplification: with p = 1 it is rounds * r, the plain composition.
    """
    import numpy as np

    a = np.asarray(orders, dtype=float)
    with np.errstate(over="ignore"):
        per = a / (2 * z) / z  # inf once z^2 underflows: no finite bound at any order
    out = np.zeros_like(a)
    if certain:
        out += certain * per
    others = rounds - certain
    if others and p >= 1:
        out += others * per
    elif others:
        out += others * np.logaddexp(math.log1p(-p), math.log(p) + (a - 1) * per) / (a - 1)
    return [float(v) for v in out]


def local_epsilon(
    z: float,
    p: float,
    rounds: int,
    delta: float,
    certain: int = 0,
    orders: tuple[float, ...] | None = None,
    warn: bool = True,
) -> LocalResult:
    """epsilon at `delta` of a local mechanism of noise multiplier z = noise scale / L2 sensitivity,
    released in the rounds a client takes part in (`local_rdp`), by the conversion of Balle et al. 2020.

    Exact RDP for the Gaussian mechanism (std z x sensitivity: a / (2 z^2), Mironov 2017); an upper
    bound for the Laplace mechanism of scale b = z x (L2 sensitivity) on a vector in any dimension
    (each coordinate's shift d_i gives a pair that is (d_i / b)-indistinguishable, hence of Renyi
    divergence at most a (d_i / b)^2 / 2 (Bun & Steinke 2016, Prop. 3.3); Renyi divergences of product
    distributions add over coordinates, so the sum is a ||d||_2^2 / (2 b^2) whatever the dimension,
    and it is the supremum over dimensions: a shift spread over many coordinates approaches it).
    When the optimum is an end of `orders` (default `LOCAL_ORDERS`), the result carries a warning; an
    infinite epsilon (z so small that the RDP overflows) does too.
    """
    validate(z, p, rounds, delta)
    if int(certain) != certain or not 0 <= certain <= rounds:
        raise FedbenchError(f"certain={certain}: the rounds surely taken part in must be in 0..{rounds}")
    rounds, certain = int(rounds), int(certain)
    orders = tuple(float(a) for a in (orders or LOCAL_ORDERS))
    if min(orders) <= 1:
        raise FedbenchError(f"orders {orders}: RDP orders must be numbers > 1")
    eps, order = rdp_conversion(orders, local_rdp(z, p, rounds, certain, orders), delta)
    what = f"local epsilon of z={z:g}, p={p:g}, rounds={rounds}, delta={delta:g}"
    message = None
    if order is not None and order in (orders[0], orders[-1]):  # edge_warning's :g would print 1 + 1e-6 as 1
        end = "largest" if order == orders[-1] else "smallest"
        message = (
            f"{what}: the optimal RDP order 1 + {order - 1:.3g} is the {end} of the order list "
            f"(1 + {orders[0] - 1:.3g} to {orders[-1]:g}), so the epsilon is a loose upper bound"
        )
    if not math.isfinite(eps):
        message = f"{what}: the RDP overflows at every order (z is too small), so no finite bound: inf"
    if message and warn:
        warnings.warn(message, AccountingWarning, stacklevel=2)
    return LocalResult(float(eps), delta, z, p, rounds, "rdp", order, message, certain)
