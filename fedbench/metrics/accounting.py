"""Privacy accounting for the DP defenses: epsilon of the sampled Gaussian mechanism, and its inverse.

Three accountants, named in every result row:
- `rdp` (default): Opacus `RDPAccountant` (RDP of the sampled Gaussian mechanism, Mironov et al.
  2019, over Opacus' default orders, with the improved RDP -> (epsilon, delta) conversion of Balle et
  al. 2020).
- `prv`: Opacus `PRVAccountant` (numerical composition of privacy loss random variables), a
  cross-check of `rdp` (it is tighter, and fails for some extreme settings: opacus#591).
- `paper` (spec 002 §4.3): what TF-Privacy's `compute_dp_sgd_privacy` did when the Fed-CDP paper was
  written: the same RDP, the order list `[1.25, ..., 4.5] + range(5, 64) + [128, 256, 512]` and the
  *old* conversion epsilon = min_a RDP(a) - log(delta) / (a - 1). With the paper's step counts
  (`paper_steps`) it reproduces every cell of the paper's Table VI.

Inputs are validated here (sigma > 0, q in (0, 1], steps >= 1, delta in (0, 1)): a bad value is a
`FedbenchError` naming the input. Opacus and dp-accounting are imported inside the functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from fedbench.errors import FedbenchError

AccountantName = Literal["rdp", "prv", "paper"]
ACCOUNTANTS: tuple[str, ...] = ("rdp", "prv", "paper")

# TF-Privacy's compute_dp_sgd_privacy orders (Fed-CDP era); 128/256/512 matter for small epsilons.
PAPER_ORDERS: tuple[float, ...] = (
    (1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 4.5)
    + tuple(float(a) for a in range(5, 64))
    + (128.0, 256.0, 512.0)
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
    """RDP of `steps` compositions of the sampled Gaussian mechanism at each order (Opacus' port of
    TF-Privacy's `_compute_rdp`: the integer-order binomial sum and the fractional-order erfc series).
    """
    from opacus.accountants.analysis.rdp import compute_rdp

    return [float(v) for v in compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=list(orders))]


def old_conversion(orders: tuple[float, ...], rdp: list[float], delta: float) -> tuple[float, float]:
    """The pre-2020 RDP -> (epsilon, delta) conversion: min over orders of rdp - log(delta)/(a - 1)."""
    best, order = math.inf, None
    for a, r in zip(orders, rdp, strict=True):
        eps = r - math.log(delta) / (a - 1)
        if eps < best:
            best, order = eps, a
    return best, order


def epsilon(
    sigma: float, q: float, steps: int, delta: float, accountant: AccountantName = "rdp"
) -> EpsilonResult:
    """epsilon of `steps` sampled-Gaussian steps (noise multiplier sigma, sampling rate q) at delta."""
    validate(sigma, q, steps, delta, accountant)
    steps = int(steps)
    if accountant == "paper":
        eps, order = old_conversion(PAPER_ORDERS, sgm_rdp(sigma, q, steps, PAPER_ORDERS), delta)
        return EpsilonResult(eps, delta, sigma, q, steps, accountant, order)
    import warnings

    if accountant == "rdp":
        from opacus.accountants import RDPAccountant

        acc = RDPAccountant()
        acc.history = [(sigma, q, steps)]
        with (
            warnings.catch_warnings()
        ):  # "optimal order is the largest alpha": the value is still an upper bound
            warnings.simplefilter("ignore")
            eps, order = acc.get_privacy_spent(delta=delta)
        return EpsilonResult(float(eps), delta, sigma, q, steps, accountant, float(order))
    from opacus.accountants import PRVAccountant

    acc = PRVAccountant()
    acc.history = [(sigma, q, steps)]
    try:
        with warnings.catch_warnings():  # PRV sizes its domain with RDP, which warns the same way
            warnings.simplefilter("ignore")
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
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise FedbenchError(f"target epsilon {target_epsilon}: must be a finite number > 0")

    def eps_at(s: float) -> float:
        try:
            return epsilon(s, q, steps, delta, accountant).epsilon
        except FedbenchError:
            return math.inf

    hi_eps = eps_at(sigma_max)
    if not hi_eps <= target_epsilon:
        raise FedbenchError(
            f"target epsilon {target_epsilon} is unreachable with the {accountant} accountant at q={q}, "
            f"steps={steps}, delta={delta}: even sigma={sigma_max:g} gives epsilon={hi_eps:.4g}; "
            "raise the target, or lower q, steps or delta"
        )
    lo, hi = 1e-3, sigma_max
    if eps_at(lo) <= target_epsilon:
        return epsilon(lo, q, steps, delta, accountant)
    while hi / lo > 1 + tolerance:
        mid = math.sqrt(lo * hi)
        if eps_at(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return epsilon(hi, q, steps, delta, accountant)


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
