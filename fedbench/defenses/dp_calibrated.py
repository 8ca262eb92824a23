"""DP baselines calibrated to a target (epsilon, delta): `dp-sgd` (example level), `dp-fedavg` (client level).

The FRL paper (spec 003 §3.5) compares against "DP-based" models given by their epsilon, not their
noise: sample-level DP-SGD (Abadi et al. 2016, via Rahman et al. 2018) at epsilon 4, 2, 1 (Table I),
and client-level DP-FedAvg (Geyer et al. 2017) at (8, 1e-3) and (8, 1e-6) (Table II). Both are thin
subclasses of the Fed-CDP/Fed-SDP defenses (`fedbench.defenses.fed_dp`) whose noise multiplier is
the smallest one the Opacus accountant certifies for the target over the whole run
(`fedbench.metrics.accounting.sigma_for_epsilon`, bisection), so every row reports epsilon <= target.

- `dp-sgd`: every per-example gradient is clipped *as a whole* (flat L2 norm over all layers, so the
  sensitivity is exactly C), one Gaussian N(0, sigma^2 C^2) per batch sum (Abadi). Accounted at
  the level of the mechanism the simulation runs (`sampling=participation`, the default since
  version 2; `accounting.participation_epsilon`): example level, a client takes part in a round
  with probability p = K_t / K, and a participating example is in E local steps of the round (one
  batch per shuffled epoch), with no amplification by subsampling (the batches are not Poisson
  samples). Version 1 took every one of the T * L local steps as an independent Poisson sample at
  q = B * K_t / N, which understates epsilon (in the `frl` preset's setting, epsilon 4 needs sigma
  11.6 where version 1 used 5.3); `sampling=poisson` keeps that accounting for comparison.
  `sampling=poisson-records` (issue 30) runs Abadi et al.'s setting, the one of their MNIST numbers:
  the engine draws each local step's batch as a Poisson lot (`Defense.batch_sampling`): every record
  of the client independently with probability q = B / n (B = batch_size, the expected lot size, n
  the client's records), so a lot varies in size and may be empty. The lot's clipped sum plus one
  N(0, sigma^2 C^2) is divided by B, not by the lot's size: replacing a record by one of zero
  gradient (zero-out neighbours, as the participation accounting's; n, q and the lot count stay put)
  moves the sum by at most C whatever the lot holds, which is the sampled Gaussian mechanism (a
  division by the realised size would depend on the data). Calibrated and accounted with the
  amplified RDP (or PRV) accountant of the SGM at q for T x L steps (`lot_sampling`: L = local_steps,
  or local_epochs x ceil(n / B)), exact when every client takes part in every round and the clients
  hold equal shares; otherwise an upper bound, said in the row: with K_t of K clients drawn per round
  (without replacement, not Poisson) every round is counted, and unequal clients take the smallest
  client's q and the largest client's L. It needs protocol=fedavg, batch_size > 0, noise=batch and an
  iid or shards partition (whose client sizes the accountant knows): `check` and the parameter
  validation refuse the rest in one line.
- `dp-fedavg`: each client's round update is clipped as a whole to S, the server averages uniformly
  and adds one N(0, sigma^2 S^2) to the sum (Geyer / McMahan et al. 2018): client level, calibrated
  and accounted for the mechanism the simulation runs (version 3, `sampling=participation`): exactly
  K_t of K clients drawn per round, the draw visible, a client in j ~ Binomial(T, K_t/K) rounds,
  no amplification by subsampling (`accounting.participation_epsilon` with one release per round).
  Version 2 took client sampling as Poisson at q = K_t / K (McMahan et al.'s amplified SGM), which
  the simulation does not run; `sampling=poisson` keeps it for comparison. The clip S is fixed
  (spec default) where Geyer takes the median of the round's norms.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Literal

from fedbench.defenses.fed_dp import (  # participation_sigma: the memoised solver both modules use
    CLIENT_EXPOSURE,
    FedSDP,
    WholeSensitivity,
    _account,
    _account_participation,
    _exposure,
    _participants,
    _participation_rate,
    _PerExampleDP,
    _PerExampleDPParams,
    _poisson_only,
    client_sizes,
    participation_sigma,
)
from fedbench.errors import FedbenchError
from fedbench.plugin import Paper, Scenario
from fedbench.registry import register_defense
from fedbench.spec.params import param

_ACCOUNTANT_HELP = "accountant the noise is calibrated with: rdp (Opacus) or prv (Opacus PRV)"
_SGD_ACCOUNTANT_HELP = "sampling=poisson only: " + _ACCOUNTANT_HELP
_FEDAVG_SAMPLING_HELP = (
    "accounting model: participation (the simulated mechanism: K_t of K clients drawn per round, the "
    "draw visible, no amplification) or poisson (Poisson client sampling at K_t/K, McMahan et al. 2018; "
    "version 2; not what the simulation runs)"
)
_SGD_SAMPLING_HELP = (
    "participation (the simulated mechanism: shuffled batches, client participation K_t/K per round, E "
    "steps per round, no amplification), poisson (accounting only: each local step a Poisson sample at "
    "B*K_t/N; version 1; not what the simulation runs) or poisson-records (Abadi: each local step's lot "
    "is a real Poisson sample of the client's n records at q = B/n, normalised by B; amplified accountant)"
)
_LOTS_ACCOUNTANT_HELP = "sampling=poisson or poisson-records only: " + _ACCOUNTANT_HELP


@functools.lru_cache(maxsize=256)
def calibrated_sigma(target: float, q: float, steps: int, delta: float, accountant: str) -> float:
    """The noise multiplier whose epsilon at `delta` is at most `target` (memoised per setting)."""
    from fedbench.metrics.accounting import sigma_for_epsilon

    return sigma_for_epsilon(target, q, steps, delta, accountant).sigma  # type: ignore[arg-type]


@register_defense("dp-sgd", "dpsgd")
class DPSGD(_PerExampleDP):
    """DP-SGD in local training: flat per-example clip to C, Gaussian noise, sigma calibrated to epsilon."""

    # 2: accounted and calibrated at the simulated mechanism's level (sampling=participation); 3: an
    # example in a partial epoch's batches (FedSGD's one batch, local steps that are not whole epochs)
    # counts with the probability it is in them, not always (the calibrated sigma moves only there).
    # sampling=poisson-records (issue 30) is a new value, named in the keys of its runs only: no bump,
    # as every earlier configuration computes what it did
    version = "3"
    per_layer = False  # one flat clip of the whole per-example gradient: sensitivity C
    paper = Paper(
        "abadi2016dpsgd",
        "Deep Learning with Differential Privacy (Abadi et al., CCS 2016)",
        "https://arxiv.org/abs/1607.00133",
    )

    @dataclass(frozen=True)
    class Params(_PerExampleDPParams):
        epsilon: float = param(
            4.0, "target epsilon over the whole run (FRL Table I: 4, 2, 1)", min=0, min_open=True
        )
        clip: float = param(1.0, "L2 bound C on each whole per-example gradient", min=0, min_open=True)
        noise: Literal["example", "batch"] = param(
            "batch", "batch: one noise per batch (Abadi); example: Fed-CDP's"
        )
        accountant: Literal["rdp", "prv"] = param("rdp", _LOTS_ACCOUNTANT_HELP)
        # `poisson-records` appears in the run keys of the runs that use it only (`key_optional`)
        sampling: Literal["participation", "poisson", "poisson-records"] = param(
            "participation", _SGD_SAMPLING_HELP
        )

        def validate(self) -> str | None:
            if self.sampling == "poisson-records":
                return _lots_params_problem(self)
            return super().validate()

    def clip_at(self, ctx) -> float:
        return self.params.clip

    def check(self, scenario: Scenario) -> str | None:
        if self.params.sampling == "poisson-records":
            return _lots_problem(scenario)
        return None

    def batch_sampling(self) -> Literal["shuffle", "poisson"]:
        """Poisson lots with `sampling=poisson-records`; the shuffled batches otherwise (the engine's)."""
        return "poisson" if self.params.sampling == "poisson-records" else "shuffle"

    def lot_size(self, batch: int, scenario: Scenario) -> int:
        """A Poisson lot's sum is divided by the expected lot size B = q * n (Abadi's normalisation),
        whatever the lot holds, so a record moves the step by at most C / B; the shuffled batches by
        their own size."""
        return scenario.batch_size if self.params.sampling == "poisson-records" else batch

    def example_factors(self, grads, bound):
        sq = sum(g.reshape(g.shape[0], -1).double().pow(2).sum(1) for g in grads.values())
        return _flat_factors(sq, bound, grads)

    def norm_factors(self, norms, bound):
        """The flat clip (Abadi et al.): one factor min(1, C / ||g_i||) per example for every layer,
        with ||g_i||^2 the sum of the layers' squared per-example norms, so the ghost path
        (`per_example=ghost`) needs no per-example gradients either."""
        return _flat_factors(sum(n.double().pow(2) for n in norms.values()), bound, norms)

    def sigma_for(
        self, scenario: Scenario, tensors: int | None = None, train_size: int | None = None
    ) -> float:
        """sigma calibrated to `epsilon` (a flat clip: M = `tensors` does not enter)."""
        p = self.params
        n = train_size or self._train_size
        if p.sampling == "participation":
            rate = _participation_rate(scenario)
            return participation_sigma(p.epsilon, rate, scenario.rounds, _exposure(scenario, n), p.delta)
        q, steps, _ = self._sgm(scenario, n)
        return calibrated_sigma(p.epsilon, q, steps, p.delta, p.accountant)

    def _sgm(self, scenario: Scenario, train_size: int) -> tuple[float, int, int]:
        """(q, steps, local steps) of the sampled Gaussian mechanism of `sampling=poisson-records`
        (the lots as simulated, `lot_sampling`) or `sampling=poisson` (version 1's model)."""
        if self.params.sampling == "poisson-records":
            return lot_sampling(scenario, train_size)
        return self.sampling(scenario, train_size)

    def accounting(self, scenario: Scenario, train_size: int, tensors: int | None = None):
        p = self.params
        sigma = self.sigma_for(scenario, train_size=train_size)
        if p.sampling == "participation":
            exposure = _exposure(scenario, train_size)
            whole = WholeSensitivity.of(False, tensors, self.name)
            return _account_participation(
                sigma, scenario, p.delta, level="example", exposure=exposure, whole=whole
            )
        q, steps, local = self._sgm(scenario, train_size)
        how = _lots_label(scenario, train_size, q, local) if p.sampling == "poisson-records" else None
        return _account(sigma, q, steps, p.delta, "example", p.accountant, local, how=how)


@register_defense("dp-fedavg", "geyer")
class DPFedAvg(FedSDP):
    """Client-level DP-FedAvg: flat clip of each update to S, server noise on the sum, sigma calibrated."""

    # 2: RDP orders up to 10240 (the calibrated sigma of few rounds can be smaller); 3: calibrated and
    # accounted for the mechanism as simulated (K_t of K clients drawn per round, no amplification),
    # not Poisson client sampling, which the simulation does not run (sampling=poisson keeps that)
    version = "3"
    per_layer = False  # the whole update clipped to S: sensitivity S
    paper = Paper(
        "geyer2017",
        "Differentially Private Federated Learning: A Client Level Perspective (Geyer et al., 2017)",
        "https://arxiv.org/abs/1712.07557",
    )

    @dataclass(frozen=True)
    class Params:
        epsilon: float = param(8.0, "target epsilon over the run (FRL Table II: 8)", min=0, min_open=True)
        delta: float = param(
            1e-3,
            "delta (FRL Table II: 1e-3 at 100 clients, 1e-6 at 1000)",
            min=0,
            max=1,
            min_open=True,
            max_open=True,
        )
        clip: float = param(1.0, "L2 bound S on each whole client update", min=0, min_open=True)
        placement: Literal["client", "server"] = param("server", "where the noise is added (Geyer: server)")
        noise: Literal["per-client", "central"] = param(
            "central", "central: one N(0, sigma^2 S^2) on the sum (Geyer); per-client: on each update"
        )
        accountant: Literal["rdp", "prv"] = param("rdp", _SGD_ACCOUNTANT_HELP)
        sampling: Literal["participation", "poisson"] = param("participation", _FEDAVG_SAMPLING_HELP)

        def validate(self) -> str | None:
            return _poisson_only(self, ("accountant",))

    def clip_update(self, delta):
        from fedbench.defenses._tensors import clip_global

        return clip_global(delta, self.params.clip)

    def sigma_for(self, scenario: Scenario, tensors: int | None = None) -> float:
        """sigma calibrated to `epsilon` (a flat clip: M = `tensors` does not enter)."""
        p = self.params
        rate = _participation_rate(scenario)
        if p.sampling == "participation":
            return participation_sigma(p.epsilon, rate, scenario.rounds, CLIENT_EXPOSURE, p.delta)
        return calibrated_sigma(p.epsilon, rate, scenario.rounds, p.delta, p.accountant)


def _flat_factors(sq: Any, bound: float, names: Any) -> dict[str, Any]:
    """One factor min(1, C / sqrt(sq_i)) per example, shared by every layer in `names`."""
    import torch

    factor = (bound / torch.sqrt(sq).clamp_min(1e-12)).clamp(max=1.0)
    return {k: factor for k in names}


# --------------------------------------------------------------- Poisson lots (sampling=poisson-records)


def _lots_params_problem(params: Any) -> str | None:
    """Why dp-sgd's parameters cannot go with `sampling=poisson-records` (None when they can)."""
    if params.noise != "batch":
        return (
            "noise=example with sampling=poisson-records: the sampled Gaussian mechanism adds one "
            "N(0, sigma^2 C^2) to a lot's sum whatever its size; use noise=batch"
        )
    if params.sample_rate:
        return (
            f"sample_rate={params.sample_rate} with sampling=poisson-records: the lots are drawn at "
            "q = batch_size / n, which the accountant takes; drop sample_rate"
        )
    return None


def _lots_problem(scenario: Scenario) -> str | None:
    """Why Poisson lots do not apply in `scenario` (None when they do): the skip reason of `check`."""
    if scenario.protocol != "fedavg":
        return (
            f"sampling=poisson-records samples the lots of local DP-SGD steps, which protocol="
            f"{scenario.protocol} has not: use protocol=fedavg (local_steps=1 is one lot per round)"
        )
    if not scenario.batch_size:
        return (
            "sampling=poisson-records draws lots of expected size batch_size, and batch_size=0 (all "
            "local data) is no sample: set batch_size > 0"
        )
    if scenario.partition not in ("iid", "shards"):
        return (
            f"sampling=poisson-records accounts q = batch_size / n at the smallest client's n, which "
            f"partition={scenario.partition} does not fix: use partition=iid or shards"
        )
    return None


def lot_sampling(scenario: Scenario, train_size: int) -> tuple[float, int, int]:
    """(q, steps, lots per round) of `sampling=poisson-records` as accounted: the sampled Gaussian
    mechanism at q = B / n for `steps` = T x L steps.

    A client of n records runs L lots a round (local_steps, or local_epochs x ceil(n / B)), each
    holding each of its records with probability B / n. Neighbours are zero-out (a record replaced by
    one of zero gradient), so n, q and L do not depend on the record and a lot's clipped sum moves by
    at most C: each lot is the SGM at q exactly. A record is in the SGM steps of its own client
    only; epsilon grows with both q and L, so the smallest client's q and the largest client's L bound
    every record's (exact when the clients hold equal shares). Every one of the T rounds is counted:
    exact when every client takes part in every round; with K_t of K clients drawn per round (without
    replacement: not a Poisson sample, no amplification claimed) a round the client skips composes
    nothing, so counting it is an upper bound.
    """
    problem = _lots_problem(scenario)
    if problem:
        raise FedbenchError(problem)
    smallest, largest = client_sizes(scenario, train_size)  # type: ignore[misc]
    batch = scenario.batch_size
    if batch > smallest:
        raise FedbenchError(
            f"sampling=poisson-records: batch_size={batch} exceeds the smallest client's {smallest} "
            f"records ({train_size} over {scenario.clients} clients), so q = B / n > 1: lower batch_size"
        )
    lots = scenario.local_steps or scenario.local_epochs * math.ceil(largest / batch)
    return batch / smallest, scenario.rounds * lots, lots


def _lots_label(scenario: Scenario, train_size: int, q: float, lots: int) -> str:
    """What the row's accountant column says of the Poisson lots, and where the epsilon is a bound."""
    smallest, largest = client_sizes(scenario, train_size)  # type: ignore[misc]
    label = (
        f"Poisson lots as simulated (amplified SGM): each local step holds each record of its client "
        f"with probability q = B/n = {scenario.batch_size}/{smallest} = {q:.4g}, {lots} lots per round, "
        f"all T={scenario.rounds} rounds counted, zero-out neighbours (examples)"
    )
    rate = _participation_rate(scenario)
    if rate < 1:
        label += (
            f"; {_participants(scenario)} of {scenario.clients} clients drawn per round (p={rate:.4g}, "
            "not Poisson): counting every round is an upper bound"
        )
    if largest != smallest:
        label += f"; clients of {smallest}-{largest} records: the smallest's q, the largest's lots (a bound)"
    return label
