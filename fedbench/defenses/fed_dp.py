"""Fed-SDP, Fed-CDP and Fed-CDP(decay) of Wei et al. (ICDCS 2021; spec 002 §3), with accounting.

- `fed-sdp` (Algorithm 1): client-level DP. Each client's round update is clipped *per layer* (each
  parameter tensor) to L2 norm C and gets N(0, sigma^2 C^2) per coordinate; the server averages
  uniformly (1/K_t). `placement=client` adds the noise before the update leaves the client (type-0
  and type-1 see it); `placement=server` adds it at the server (the client's own update, type-1, is
  raw). `noise=per-client` is the paper's Algorithm 1 (one noise per client, std sigma*C/sqrt(K_t) on
  the mean); `noise=central` is McMahan'18 / the authors' code (one N(0, sigma^2 C^2) on the sum, std
  sigma*C/K_t on the mean; server placement only).
- `fed-cdp` (Algorithm 2): example-level DP. At every local step each *per-example* gradient is
  clipped per layer to C and noised with N(0, sigma^2 C^2) per example (`noise=example`, the
  paper; the batch mean then carries noise of std sigma*C/sqrt(B)) or once per batch
  (`noise=batch`, Abadi DP-SGD, std sigma*C/B). Per-example gradients come from `torch.func`
  (the engine's `per_example` hook), so a type-2 reader of a per-example gradient sees it sanitised.
  By default (`per_example=ghost`, issue 29) the clipped mean is computed without them
  (`fedbench.fl.ghost`: per-layer per-example norms from activations and output gradients,
  Goodfellow 2015 / Li et al. 2022 / Bu et al. 2023), equal to `per_example=materialise` (the
  [B, ...] per-example gradients, what every run before issue 29 computed) to float tolerance, not
  bit for bit; models with a trainable layer other than nn.Linear / nn.Conv2d fall back to the
  per-example gradients. The step an `example` observer reads still materialises them (the engine
  reads the observed example's gradient from them), the batch mean of that step staying the ghost
  one, so training does not depend on whether it is watched. `materialise` is keyless
  (`fedbench.spec.params.param`): its runs keep the run ids they had, and the ghost default has
  its own (those of the `per_example=ghost` runs before it), so neither is served the other's results.
- `fed-cdp-decay` (§3.4): Fed-CDP with a per-round clipping bound C_t: linear from `clip_start`
  to `clip_end` over the T rounds (the paper: 6 -> 2), or the optional exponential / staircase
  schedules; sigma is fixed, so epsilon equals Fed-CDP's.

Noise of the `example` form is drawn as one Gaussian of std sigma*C/sqrt(B) for the batch mean,
which has exactly the distribution of the mean of B independent per-example noises.

Accounting (`fedbench.metrics.accounting`), stated in every row's `dp_level` and `accountant`. By
default (`sampling=participation`) epsilon is that of the mechanism the simulation runs:
- the simulation draws exactly K_t of K clients per round, afresh each round, and the server knows
  whom it drew: a client (and each of its examples) is exposed in j ~ Binomial(T, K_t/K) rounds,
  with no amplification by subsampling claimed (`accounting.participation_epsilon`, an exact
  binomial mixture of Gaussian mechanisms; zero-out neighbours: one example, or one client's whole
  data, replaced by null data with zero gradient);
- the sensitivity is that of the clipping as run: per-layer clipping of each of the model's M
  trained parameter tensors to C bounds the whole gradient or update by C*sqrt(M) (not C), so the
  noise multiplier of the whole is sigma / sqrt(M); a flat clip (dp-sgd, dp-fedavg) has sensitivity C;
- Fed-CDP: example level, an example in the noisy local steps of each round its client takes part in
  that hold it (`_exposure`: one batch per shuffled local epoch; FedSGD's one batch of B of n records
  holds it with probability B / n); Fed-SDP: client level, one release per round.
`sampling=poisson` is the paper's model instead, which the simulation does not run: Fed-CDP every one
of the T*L local steps an independent Poisson sample at q = B*K_t/N (Proposition 1; `sample_rate`
overrides q, the paper sets 0.01), Fed-SDP Poisson client sampling at q = K_t/K, both with sensitivity
C as in the paper. With `accountant=paper` it uses the paper's conversion and step convention and
reproduces Table VI; `accountant` and `sample_rate` apply to `sampling=poisson` only.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal

from fedbench.errors import FedbenchError
from fedbench.plugin import Accounting, Defense, HookContext, Paper, RunData, Scenario
from fedbench.registry import register_defense
from fedbench.spec.params import param

PAPER = Paper(
    "wei2021fedcdp",
    "Gradient-Leakage Resilient Federated Learning (Fed-SDP, Fed-CDP)",
    "https://arxiv.org/abs/2107.01154",
)
_ACCOUNTANT_HELP = (
    "sampling=poisson only: privacy accountant rdp (Opacus), prv (Opacus PRV), paper (Table VI convention)"
)


def _noise_multiplier(bound: str) -> Any:
    """The `sigma` parameter of the paper's mechanisms: noise std = sigma x the clipping `bound`."""
    return param(6.0, f"noise multiplier (noise std = sigma * {bound})", min=0, min_open=True)


def _target_epsilon() -> Any:
    """The `epsilon` parameter of fed-sdp and fed-cdp: a target instead of a given sigma (issue 30)."""
    return param(
        0.0,
        "target epsilon over the run (0: sigma as given); > 0: sigma is the smallest the participation "
        "accountant certifies for it at the clip's sensitivity C*sqrt(M), and the sigma param is unused",
        min=0,
        keyless=0.0,
    )


@functools.lru_cache(maxsize=256)
def participation_sigma(target: float, p: float, rounds: int, exposure: Exposure, delta: float) -> float:
    """The noise multiplier whose participation-level epsilon is at most `target` (memoised)."""
    from fedbench.metrics.accounting import participation_sigma as solve

    return solve(target, p, rounds, exposure.uses, delta, extra=exposure.extra).sigma


def calibrated_per_layer_sigma(
    target: float, scenario: Scenario, exposure: Exposure, delta: float, tensors: int | None, who: str
) -> float:
    """sigma of a per-layer clipped mechanism whose participation epsilon is at most `target`: the flat
    mechanism's calibrated multiplier times sqrt(M), since per-layer clipping of M tensors to C bounds
    the whole by C*sqrt(M) (`WholeSensitivity`) and the noise std is sigma*C per coordinate."""
    whole = WholeSensitivity.of(True, tensors, who)
    rate = _participation_rate(scenario)
    return participation_sigma(target, rate, scenario.rounds, exposure, delta) * whole.factor


def _target_problem(params: Any) -> str | None:
    """Why a target epsilon cannot go with these parameters (None when it can)."""
    if params.epsilon and params.sampling != "participation":
        return (
            f"epsilon={params.epsilon} is calibrated with the participation accountant (the simulated "
            "mechanism); drop sampling=poisson or give sigma instead"
        )
    return None


def _reported_delta() -> Any:
    """The `delta` parameter of the mechanisms accounted at a fixed delta."""
    return param(1e-5, "delta of the reported (epsilon, delta)", min=0, max=1, min_open=True, max_open=True)


_SAMPLING_HELP = (
    "accounting model: participation (the simulated mechanism: K_t of K clients per round, an example in "
    "E noisy steps per round, sensitivity C*sqrt(M) per layer) or poisson (the paper's Prop. 1: each "
    "local step a Poisson sample at q, sensitivity C; with accountant=paper, Table VI)"
)
_CLIENT_SAMPLING_HELP = (
    "accounting model: participation (the simulated mechanism: K_t of K clients drawn per round, "
    "sensitivity C*sqrt(M) per layer) or poisson (the paper's Poisson client sampling at K_t/K, "
    "sensitivity C; with accountant=paper, Table VI)"
)


def _poisson_only(params: Any, names: tuple[str, ...]) -> str | None:
    """The error for a Poisson-model option (accountant, sample_rate) set with sampling=participation,
    whose accountant is exact and has no such choice (a silently ignored option would mislead)."""
    if params.sampling == "poisson":
        return None
    defaults = {f.name: f.default for f in dataclasses.fields(params)}
    for name in names:
        if getattr(params, name) != defaults[name]:
            return (
                f"{name}={getattr(params, name)} applies to the paper's model: add sampling=poisson "
                f"(the default sampling=participation is accounted exactly, without {name})"
            )
    return None


# ------------------------------------------------------------------------------------ tensor helpers


def clip_per_layer(tensors: dict[str, Any], bound: float) -> dict[str, Any]:
    """Clip each tensor separately to L2 norm `bound`: t / max(1, ||t|| / C)."""
    import torch

    out = {}
    for k, t in tensors.items():
        norm = torch.linalg.vector_norm(t.double())
        out[k] = t * float(1.0 / max(1.0, float(norm) / bound))
    return out


def clip_per_example_per_layer(grads: dict[str, Any], bound: float) -> dict[str, Any]:
    """Per-example gradients {name: [B, ...]} with each example's each layer clipped to `bound`.

    Vectorised over the batch (no Python loop over examples): one norm per (example, layer).
    """
    out = {}
    for k, g in grads.items():
        out[k] = g * clip_factors(g, bound).view(-1, *([1] * (g.dim() - 1))).to(g.dtype)
    return out


def clip_factors(g: Any, bound: float) -> Any:
    """[B] factors min(1, C / ||g_i||) of per-example gradients g [B, ...] of one layer."""
    import torch

    return _factors_from_norms(torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1), bound)


def _factors_from_norms(norms: Any, bound: float) -> Any:
    """[B] factors min(1, C / ||g_i||) from the per-example norms [B] of one layer."""
    return (bound / norms.clamp_min(1e-12)).clamp(max=1.0)


def _gaussian_like(t: Any, std: float, generator: Any) -> Any:
    import torch

    return (torch.randn(t.shape, generator=generator) * std).to(t.device, t.dtype)


def _participants(scenario: Scenario) -> int:
    return max(1, round(scenario.participation * scenario.clients))


def _local_steps(scenario: Scenario, train_size: int) -> int:
    """L: local steps per round of an average client (one for FedSGD)."""
    if scenario.protocol == "fedsgd":
        return 1
    if scenario.local_steps:
        return scenario.local_steps
    n_client = max(1, train_size // scenario.clients)
    batch = scenario.batch_size or n_client
    return scenario.local_epochs * math.ceil(n_client / batch)


@dataclass(frozen=True)
class Exposure:
    """The noisy steps of one round an example of a participating client is in: `uses`, plus one more
    with probability `extra` (the selection of its batches is data-independent; the simulation's
    batching makes it exact)."""

    uses: int
    extra: float = 0.0

    @property
    def most(self) -> int:
        return self.uses + (1 if self.extra > 0 else 0)

    def describe(self) -> str:
        more = f", one more with probability {self.extra:.4g}" if self.extra > 0 else ""
        return f"{self.uses} noisy step(s) per round taken part in{more}"


CLIENT_EXPOSURE = Exposure(1)  # client level: one release (the round update) per round taken part in


def _exposure(scenario: Scenario, train_size: int) -> Exposure:
    """How many noisy local steps of a round one example takes part in (`Exposure`).

    Each local epoch is a fresh shuffle of the client's data cut into batches, so an example is in
    exactly one batch per epoch: E with `local_epochs`. FedSGD takes the first batch of a fresh
    shuffle, so an example of a client of n records is in it with probability B / n. `local_steps` S
    over n / B batches per epoch are e = S // ceil(n / B) whole epochs and r leftover batches of a
    fresh shuffle, which hold the example with probability r * B / n. n is the smallest client's
    size (N // K for the equal-size iid and shards splits, the worst case); for the other partitions
    (a client may hold B examples or fewer) and for B = 0 (every step is the whole local data) every
    step counts.
    """
    if scenario.protocol == "fedavg" and not scenario.local_steps:
        return Exposure(scenario.local_epochs)
    steps = 1 if scenario.protocol == "fedsgd" else scenario.local_steps
    sizes = client_sizes(scenario, train_size)
    if sizes is None or not scenario.batch_size:
        return Exposure(steps)  # a client may hold <= B examples (or B = all): every step is a whole epoch
    n = sizes[0]
    batches = math.ceil(n / scenario.batch_size)
    epochs, left = divmod(steps, batches)
    if not left:
        return Exposure(epochs)
    return Exposure(epochs, min(1.0, left * scenario.batch_size / n))


def client_sizes(scenario: Scenario, train_size: int) -> tuple[int, int] | None:
    """(smallest, largest) number of records a client holds, where the partition fixes them; None for
    dirichlet and natural, whose sizes depend on the labels or groups.

    iid cuts the N records into K parts and shards into K*s shards dealt s per client, both with
    np.array_split (parts of floor or ceil of N / parts), so a client holds between
    s * floor(N / (K s)) and s * ceil(N / (K s)) records (s = 1 for iid)."""
    if scenario.partition not in ("iid", "shards"):
        return None
    per = scenario.shards_per_client if scenario.partition == "shards" else 1
    parts = scenario.clients * per
    return max(1, per * (train_size // parts)), per * math.ceil(train_size / parts)


_SGM_SAMPLING = {
    "example": "Poisson sampling at q per local step (paper's Prop. 1; not the simulated mechanism)",
    "client": "Poisson client sampling at q = K_t/K per round (paper's model; the simulation draws K_t of K)",
}


def _account(
    sigma: float,
    q: float,
    steps: int,
    delta: float,
    level: str,
    accountant: str,
    local_steps: int,
    how: str | None = None,
) -> Accounting:
    """epsilon of `steps` sampled Gaussian steps at q; `how` says what the sampling is (by default the
    paper's model of `level`, `_SGM_SAMPLING`)."""
    from fedbench.metrics.accounting import ACCOUNTANT_LABELS, epsilon, paper_steps

    if accountant == "paper":
        steps = paper_steps(steps, level, local_steps)  # type: ignore[arg-type]
    res = epsilon(sigma, q, steps, delta, accountant)  # type: ignore[arg-type]
    label = f"{ACCOUNTANT_LABELS[accountant]}; {how or _SGM_SAMPLING[level]}"
    return Accounting(res.epsilon, delta, level, label, sigma, q, steps)  # type: ignore[arg-type]


def _account_participation(
    sigma: float,
    scenario: Scenario,
    delta: float,
    *,
    level: Literal["example", "client"],
    exposure: Exposure,
    whole: WholeSensitivity,
) -> Accounting:
    """epsilon of the mechanism as simulated (`accounting.participation_epsilon`): K_t of K clients drawn
    per round (a client in a round with probability p = K_t/K, the draw visible), the Gaussian
    releases of `exposure` per round taken part in, noise multiplier sigma / `whole.factor` of the
    whole gradient or update (per-layer clipping: sqrt(M))."""
    from fedbench.metrics.accounting import PARTICIPATION_LABEL, participation_epsilon

    p = _participation_rate(scenario)
    z = sigma / whole.factor
    res = participation_epsilon(z, p, scenario.rounds, exposure.uses, delta, extra=exposure.extra)
    unit = "examples" if level == "example" else "clients"
    label = (
        f"{PARTICIPATION_LABEL}; {level} level: p={p:.4g} per round ({_participants(scenario)} of "
        f"{scenario.clients} clients drawn per round), {exposure.describe()}, zero-out neighbours "
        f"({unit}); {whole.note}, noise multiplier {z:.4g}"
    )
    return Accounting(res.epsilon, delta, level, label, z, p, scenario.rounds * exposure.most)


@dataclass(frozen=True)
class WholeSensitivity:
    """How the clip bounds a whole gradient or update: `factor` x C (sqrt(M) per layer, 1 flat)."""

    factor: float
    note: str

    @classmethod
    def of(cls, per_layer: bool, tensors: int | None, who: str) -> WholeSensitivity:
        """Per-layer clipping of M tensors to C: sensitivity C*sqrt(M); a flat clip: C. M is the number
        of parameter tensors the model trains (the keys of every gradient and update); without it a
        per-layer mechanism cannot be accounted, which is an error rather than a guess."""
        if not per_layer:
            return cls(1.0, "flat clip: sensitivity C")
        if not tensors or tensors < 1:
            raise FedbenchError(
                f"{who}: per-layer clipping bounds a whole update by C*sqrt(M), so its epsilon needs M, the "
                "number of parameter tensors the model trains (pass tensors=M to accounting)"
            )
        return cls(math.sqrt(tensors), f"per-layer clip of M={tensors} tensors: sensitivity C*sqrt(M)")


def _participation_rate(scenario: Scenario) -> float:
    """The probability that a given client takes part in a round: K_t / K (the simulation's draw)."""
    return min(1.0, _participants(scenario) / scenario.clients)


# ------------------------------------------------------------------------------------------- Fed-SDP


@register_defense("fed-sdp", "fedsdp")
class FedSDP(Defense):
    """Fed-SDP: per-layer clip of each client update to C, Gaussian noise sigma*C (client or server)."""

    paper = PAPER

    @dataclass(frozen=True)
    class Params:
        sigma: float = _noise_multiplier("clip")
        clip: float = param(4.0, "per-layer L2 bound C on the client update", min=0, min_open=True)
        placement: Literal["client", "server"] = param(
            "client", "where the noise is added: client (before sending) or server (type-1 sees raw)"
        )
        noise: Literal["per-client", "central"] = param(
            "per-client", "per-client (Algorithm 1) or one noise on the sum (central; server only)"
        )
        delta: float = _reported_delta()
        accountant: Literal["rdp", "prv", "paper"] = param("rdp", _ACCOUNTANT_HELP)
        sampling: Literal["participation", "poisson"] = param("participation", _CLIENT_SAMPLING_HELP)
        epsilon: float = _target_epsilon()

        def validate(self) -> str | None:
            return _poisson_only(self, ("accountant",)) or _target_problem(self)

    # `sampling` (added with the participation accounting) changes only epsilon, computed outside the
    # cache: at its default it stays out of the key, so the run ids of the runs before it hold.
    key_optional = ("sampling",)
    per_layer = True  # each parameter tensor clipped to C (Algorithm 1); dp-fedavg clips flat

    def check(self, scenario: Scenario) -> str | None:
        if self.params.noise == "central" and self.params.placement == "client":
            return "noise=central is one noise on the server's sum; it needs placement=server"
        return None

    def sigma_for(self, scenario: Scenario, tensors: int | None = None) -> float:
        """The noise multiplier: the sigma param, or with `epsilon` the one calibrated to it for the
        model's M = `tensors` parameter tensors (`dp-fedavg` calibrates its flat clip)."""
        p = self.params
        if not p.epsilon:
            return p.sigma
        return calibrated_per_layer_sigma(p.epsilon, scenario, CLIENT_EXPOSURE, p.delta, tensors, self.name)

    def clip_update(self, delta: dict) -> dict:
        """Per-layer clipping to C (Algorithm 1); `dp-fedavg` clips the whole update."""
        return clip_per_layer(delta, self.params.clip)

    def _sanitise(self, delta: dict, ctx: HookContext) -> dict:
        p = self.params
        clipped = self.clip_update(delta)
        if p.noise == "central":
            return clipped
        std = self.sigma_for(ctx.scenario, len(delta)) * p.clip
        return {k: v + _gaussian_like(v, std, ctx.generator) for k, v in clipped.items()}

    def update(self, delta, ctx: HookContext):
        if self.params.placement == "client":
            return self._sanitise(delta, ctx)
        return delta

    def receive(self, delta, ctx: HookContext):
        if self.params.placement == "server":
            return self._sanitise(delta, ctx)
        return delta

    def aggregate(self, updates, weights, ctx: HookContext):
        """Uniform mean over the K_t participants (Algorithm 1), plus the central noise if chosen."""
        p = self.params
        k = len(updates)
        mean = {n: sum(u[n] for u in updates) / k for n in updates[0]}
        if p.noise == "central":
            std = self.sigma_for(ctx.scenario, len(updates[0])) * p.clip / k
            mean = {n: v + _gaussian_like(v, std, ctx.generator) for n, v in mean.items()}
        return mean

    def accounting(
        self, scenario: Scenario, train_size: int, tensors: int | None = None
    ) -> Accounting | None:
        """Client level. `sampling=participation` (default): the simulated mechanism, one release per
        round taken part in, sensitivity C*sqrt(M) per layer (C flat). `sampling=poisson`: the paper's
        Poisson client sampling at q = K_t/K with sensitivity C (`accountant=paper`: Table VI)."""
        p = self.params
        sigma = self.sigma_for(scenario, tensors)
        if p.sampling == "participation":
            whole = WholeSensitivity.of(self.per_layer, tensors, self.name)
            return _account_participation(
                sigma, scenario, p.delta, level="client", exposure=CLIENT_EXPOSURE, whole=whole
            )
        local = _local_steps(scenario, train_size)
        rate = _participation_rate(scenario)
        return _account(sigma, rate, scenario.rounds, p.delta, "client", p.accountant, local)


# ------------------------------------------------------------------------------------------- Fed-CDP


class _PerExampleDP(Defense):
    """Per-layer clipping of every per-example gradient to C_t and Gaussian noise sigma*C_t."""

    paper = PAPER
    # Epsilon is computed per row outside the cache (runner._accounting), so the accounting options
    # change no cached result: `sampling` at its default keeps the run_ids of the runs before it.
    # `per_example` is keyless at `materialise` (its param), not at its default: see the module doc.
    key_optional = ("sampling",)
    per_layer = True  # each parameter tensor of each example clipped to C (the paper); dp-sgd clips flat

    def clip_at(self, ctx: HookContext) -> float:
        raise NotImplementedError

    def __init__(self, params: Any = None):
        super().__init__(params)
        self._train_size = 0

    def bind_data(self, data: RunData) -> None:
        self._train_size = data.train_size - len(data.reserved)  # the records the exposure counts

    def sigma_for(
        self, scenario: Scenario, tensors: int | None = None, train_size: int | None = None
    ) -> float:
        """The noise multiplier: the sigma param, or with `epsilon` (fed-cdp) the one calibrated to it
        for M = `tensors` parameter tensors and the run's training records (`dp-sgd` calibrates a
        flat clip)."""
        p = self.params
        if not getattr(p, "epsilon", 0.0):
            return p.sigma
        exposure = _exposure(scenario, train_size or self._train_size)
        return calibrated_per_layer_sigma(p.epsilon, scenario, exposure, p.delta, tensors, self.name)

    def example_factors(self, grads: dict[str, Any], bound: float) -> dict[str, Any]:
        """Per-example clip factors [B] of each layer: per layer (the paper); `dp-sgd` clips flat."""
        return {k: clip_factors(g, bound) for k, g in grads.items()}

    def norm_factors(self, norms: dict[str, Any], bound: float) -> dict[str, Any] | None:
        """The factors of `example_factors` from per-example norms [B] of each layer (the ghost path).

        None for a subclass whose `example_factors` reads the gradients themselves and that gives no
        rule from norms here: the ghost path then falls back to the per-example gradients.
        """
        if type(self).example_factors is not _PerExampleDP.example_factors:
            return None
        return {k: _factors_from_norms(n, bound) for k, n in norms.items()}

    def clipped_sums(self, grads: Any, bound: float) -> dict[str, Any]:
        """{name: sum_i c_i g_i}: the sum of the clipped per-example gradients (`per_example` divides it).

        `per_example=ghost` (the default) computes it from per-example norms and activations
        (`fedbench.fl.ghost`) where the model and the clipping rule allow, without the [B, ...]
        gradients; otherwise (and with `per_example=materialise`, and for a plain dict such as the
        `example` observation's one gradient) from the per-example gradients. An empty batch (a
        Poisson lot may be one) sums to zeros, with no forward pass.
        """
        import torch

        from fedbench.fl.per_example import PerExampleGrads

        if not _batch_size(grads):
            return {k: g.sum(0) for k, g in grads.items()}
        if self.params.per_example == "ghost" and isinstance(grads, PerExampleGrads):
            ghost = grads.ghost()
            factors = self.norm_factors(ghost.norms(), bound) if ghost is not None else None
            if factors is not None:
                return ghost.weighted_sum(factors)
            self._say_fallback(grads.ghost_problem or f"{self.name} clips by a rule that needs the gradients")
        factors = self.example_factors(grads, bound)
        # the sum of the clipped examples, without materialising them
        return {k: torch.tensordot(factors[k].to(g.dtype), g, dims=1) for k, g in grads.items()}

    def clipped_means(self, grads: Any, bound: float) -> dict[str, Any]:
        """{name: (1/B) sum_i c_i g_i}: the mean of the clipped per-example gradients (`clipped_sums` / B)."""
        batch = _batch_size(grads)
        return {k: s / batch for k, s in self.clipped_sums(grads, bound).items()}

    def lot_size(self, batch: int, scenario: Scenario) -> int:
        """What the clipped sum (and the `batch` noise) is divided by: the batch's own size B, so the
        step is the mean of the clipped gradients (Fed-CDP, dp-sgd's shuffled batches); dp-sgd's
        Poisson lots divide by their expected size instead."""
        return batch

    def _say_fallback(self, why: str) -> None:
        """Warn (once per defense) that `per_example=ghost` uses the per-example gradients, and why."""
        if not getattr(self, "_fallback_said", False):
            self._fallback_said = True
            warnings.warn(
                f"{self.name}[per_example=ghost] uses torch.func per-example gradients here: {why}",
                stacklevel=3,
            )

    def per_example(self, grads, ctx: HookContext):
        """(sum of the clipped per-example gradients + noise) / `lot_size`: with the batch's own size,
        the clipped mean plus N(0, (sigma C / B)^2) (`batch`) or N(0, sigma^2 C^2 / B) (`example`)."""
        p = self.params
        bound = self.clip_at(ctx)
        batch = _batch_size(grads)
        lot = self.lot_size(batch, ctx.scenario)
        std = (
            self.sigma_for(ctx.scenario, len(grads))
            * bound
            / (math.sqrt(batch) if p.noise == "example" else lot)
        )
        sums = self.clipped_sums(grads, bound)
        # divided last, as the mean of the clipped gradients always was (the same bits at lot = batch)
        return {k: s / lot + _gaussian_like(s, std, ctx.generator) for k, s in sums.items()}

    def sampling(self, scenario: Scenario, train_size: int) -> tuple[float, int, int]:
        """(q, steps, local steps): example sampling rate B*K_t/N (or `sample_rate`) and T*L steps."""
        p = self.params
        local = _local_steps(scenario, train_size)
        if p.sample_rate:
            q = p.sample_rate
        else:
            batch = scenario.batch_size or max(1, train_size // scenario.clients)
            q = min(1.0, batch * _participants(scenario) / max(1, train_size))
        return q, scenario.rounds * local, local

    def accounting(
        self, scenario: Scenario, train_size: int, tensors: int | None = None
    ) -> Accounting | None:
        """Example level. `sampling=participation` (default): the simulated mechanism (an example in
        the noisy steps of each round its client takes part in that hold it), sensitivity C*sqrt(M)
        per layer (C flat). `sampling=poisson`: the paper's Proposition 1 (`accountant=paper`: Table VI)."""
        p = self.params
        sigma = self.sigma_for(scenario, tensors, train_size)
        if p.sampling == "participation":
            whole = WholeSensitivity.of(self.per_layer, tensors, self.name)
            exposure = _exposure(scenario, train_size)
            return _account_participation(
                sigma, scenario, p.delta, level="example", exposure=exposure, whole=whole
            )
        q, steps, local = self.sampling(scenario, train_size)
        return _account(sigma, q, steps, p.delta, "example", p.accountant, local)


def _batch_size(grads: Any) -> int:
    """B of per-example gradients: a `PerExampleGrads`' batch (read without computing them), or the
    first dimension of a plain dict's tensors."""
    from fedbench.fl.per_example import PerExampleGrads

    return grads.batch if isinstance(grads, PerExampleGrads) else next(iter(grads.values())).shape[0]


_NOISE_HELP = "example: N(0, sigma^2 C^2) per example (Algorithm 2); batch: once per batch (Abadi)"
_Q_HELP = (
    "sampling=poisson: example sampling rate q for accounting; 0 = B*K_t/N (Proposition 1; "
    "the paper sets 0.01)"
)
_PER_EXAMPLE_HELP = (
    "how the clipped mean is computed: ghost (per-example norms from activations and output gradients, "
    "no per-example buffers; falls back to materialise for layers other than Linear/Conv2d and for "
    "clipping rules without a rule from norms, `norm_factors`) or materialise (the [B, ...] per-example "
    "gradients, torch.func: every run before issue 29, and the committed boards); equal to float tolerance"
)


@dataclass(frozen=True)
class _PerExampleDPParams:
    """Parameters shared by fed-cdp and fed-cdp-decay: noise placement and accounting."""

    noise: Literal["example", "batch"] = param("example", _NOISE_HELP)
    delta: float = _reported_delta()
    sample_rate: float = param(0.0, _Q_HELP, min=0, max=1)
    accountant: Literal["rdp", "prv", "paper"] = param("rdp", _ACCOUNTANT_HELP)
    sampling: Literal["participation", "poisson"] = param("participation", _SAMPLING_HELP)
    # keyless at `materialise`: the runs before the ghost default keep their run ids (see the module doc)
    per_example: Literal["ghost", "materialise"] = param("ghost", _PER_EXAMPLE_HELP, keyless="materialise")

    def validate(self) -> str | None:
        return _poisson_only(self, ("accountant", "sample_rate"))


@register_defense("fed-cdp", "fedcdp")
class FedCDP(_PerExampleDP):
    """Fed-CDP: per-example, per-layer clipping to C and Gaussian noise sigma*C at every local step."""

    def clip_at(self, ctx: HookContext) -> float:
        return self.params.clip  # the same bound C in every round (fed-cdp-decay: C_t)

    @dataclass(frozen=True)
    class Params(_PerExampleDPParams):
        sigma: float = _noise_multiplier("clip")
        clip: float = param(4.0, "per-layer L2 bound C on each per-example gradient", min=0, min_open=True)
        epsilon: float = _target_epsilon()

        def validate(self) -> str | None:
            return super().validate() or _target_problem(self)


def decayed_clip(schedule: str, start: float, end: float, rnd: int, rounds: int, stairs: int = 4) -> float:
    """C_t of round `rnd` (0-based) out of `rounds`: linear (paper), exponential or staircase.

    linear: C_t = start - (start - end) * t / (T - 1), so round 0 uses `start` and the last `end`;
    exponential: C_t = start * (end / start) ** (t / (T - 1));
    staircase: `stairs` equal-length plateaus from `start` down to `end`.
    """
    if rounds <= 1:
        return start
    frac = min(1.0, max(0.0, rnd / (rounds - 1)))
    if schedule == "linear":
        return start - (start - end) * frac
    if schedule == "exponential":
        return start * (end / start) ** frac
    if schedule == "staircase":
        if stairs <= 1:
            return start
        level = min(stairs - 1, rnd * stairs // rounds)
        return start - (start - end) * level / (stairs - 1)
    raise ValueError(f"unknown clip schedule '{schedule}'")


@register_defense("fed-cdp-decay", "fedcdp-decay")
class FedCDPDecay(_PerExampleDP):
    """Fed-CDP(decay): Fed-CDP with a per-round clipping bound decaying from 6 to 2 (sigma fixed)."""

    @dataclass(frozen=True)
    class Params(_PerExampleDPParams):
        sigma: float = _noise_multiplier("C_t")
        clip_start: float = param(6.0, "clipping bound C_0 of the first round", min=0, min_open=True)
        clip_end: float = param(2.0, "clipping bound of the last round", min=0, min_open=True)
        schedule: Literal["linear", "exponential", "staircase"] = param(
            "linear", "C_t schedule over the rounds: linear (paper), exponential, staircase"
        )
        stairs: int = param(4, "plateaus of the staircase schedule", min=1)

    def clip_at(self, ctx: HookContext) -> float:
        p = self.params
        return decayed_clip(p.schedule, p.clip_start, p.clip_end, ctx.round, ctx.scenario.rounds, p.stairs)
