"""Update-level noise defenses of the RecUP-FL baselines: clip the client update, add noise.

Both follow spec 000 §4.1-4.2: the whole client update (all parameters flattened) is clipped to L2
norm C (`clip`), then i.i.d. noise is added per coordinate. sigma and b are ABSOLUTE scales, not noise
multipliers, as in the papers that use them (empirical-privacy baselines); their formal guarantee is
nevertheless reported, however large, so that a reader sees what the noise buys (`accounting`).

The guarantee is local DP at the client level: what leaves a client in a round it takes part in is
u + noise with ||u||_2 <= C, whatever its data, so the server (and every later observer, by
post-processing) sees a local mechanism. Neighbouring relation: replace-one, the client's whole data
replaced by any other, so two clipped updates differ by at most 2C in L2 (the sensitivity). The rounds
compose (`fedbench.metrics.accounting.local_epsilon`): the server knows who takes part, so client
selection gives no amplification by sampling; with participation below 1 each round is taken part in
with probability p = K_t/K (the simulation's draw), except the attack's observed round, which the
observed client always takes part in (`Simulation._participants`). The view of a single local step
(`observe=step` or `example`) is before clipping and noise and is not covered.

- dp-gaussian: the Gaussian mechanism, noise multiplier z = sigma / (2C); its RDP is exact.
- dp-laplace: no parameter count is known where epsilon is computed (per row, outside the cache, from
  the scenario and the training-set size alone), and the pure-DP bound needs one (the L1 sensitivity of
  a vector of L2 norm 2C in d dimensions is 2C sqrt(d)). The bound used is dimension-free: Laplace
  noise of scale b on a shift of L2 norm 2C has Renyi divergence at most that of Gaussian noise of
  std b (Bun & Steinke 2016, Prop. 3.3, summed over coordinates), the supremum over all d; so
  dp-laplace[b] is accounted as the Gaussian mechanism of z = b / (2C), an (epsilon, delta) bound.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

from fedbench.defenses._tensors import clip_global
from fedbench.defenses.fed_dp import _participation_rate, _reported_delta
from fedbench.plugin import Accounting, Defense, HookContext, Paper, Scenario
from fedbench.registry import register_defense
from fedbench.spec.params import param

DP_GAUSSIAN_PAPER = Paper(
    "wei2021",
    "Gradient-leakage resilient federated learning (DP-Gaussian baseline)",
    "https://arxiv.org/abs/2107.01154",
)
DP_LAPLACE_PAPER = Paper(
    "liu2020",
    "Adaptive privacy-preserving federated learning (DP-Laplace baseline)",
    "https://doi.org/10.1007/s12083-019-00869-2",
)


class _ClipAndNoise(Defense):
    """Clip the whole update to L2 norm `params.clip`, then add i.i.d. noise of the scale held by the
    Params field `scale_param` (no noise, and no draw from the generator, when it is 0).

    A subclass names its noise scale (`scale_param`) and declares it (`scale_field`, a `param`); its
    Params are made here, the same for every subclass: the noise scale, `clip`, `delta`, in this order.
    """

    scale_param: ClassVar[str]
    scale_field: ClassVar[Any]  # the `param(...)` of the noise scale, the first field of Params
    mechanism: ClassVar[str]  # how `accounting` names the local mechanism
    # `delta` was added with the accounting; epsilon is computed outside the cache, so at its default
    # it stays out of the cache key and every earlier run_id holds.
    key_optional = ("delta",)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields = {
            cls.scale_param: cls.scale_field,
            "clip": param(1.0, "L2 bound C on the whole client update", min=0, min_open=True),
            "delta": _reported_delta(),
        }
        namespace = {
            "__module__": cls.__module__,
            "__qualname__": f"{cls.__qualname__}.Params",  # as a nested class: pickled by reference
            "__annotations__": dict.fromkeys(fields, float),
            **fields,
        }
        cls.Params = dataclass(frozen=True)(type("Params", (), namespace))

    def noise(self, shape: tuple[int, ...], generator: Any, scale: float) -> Any:
        """A float64 CPU tensor of noise of `shape` at `scale` (> 0), drawn from `generator`."""
        raise NotImplementedError

    def update(self, delta, ctx: HookContext):
        clipped = clip_global(delta, self.params.clip)
        scale = getattr(self.params, self.scale_param)
        if scale == 0:
            return clipped
        return {
            k: v + self.noise(tuple(v.shape), ctx.generator, scale).to(v.device, v.dtype)
            for k, v in clipped.items()
        }

    def accounting(self, scenario: Scenario, train_size: int, tensors: int | None = None) -> Accounting:
        """Client-level local DP over the rounds (module docstring); scale 0 is an infinite epsilon,
        said in the row's warnings (an AccountingWarning)."""
        from fedbench.metrics.accounting import AccountingWarning, local_epsilon

        p = self.params
        scale = getattr(p, self.scale_param)
        z = scale / (2 * p.clip)
        rate = _participation_rate(scenario)
        rounds = scenario.rounds
        certain = rounds if rate >= 1 else 1
        taken = f"all {rounds} rounds" if rate >= 1 else f"1 + Binomial({rounds - 1}, {rate:.4g}) rounds"
        label = (
            f"rdp (local {self.mechanism}, replace-one, 2C): z = {self.scale_param}/(2C) = {z:.4g}, "
            f"{taken}; selection known to the server, no amplification by sampling"
        )
        if scale == 0:
            warnings.warn(
                f"{self.name} with {self.scale_param}=0 adds no noise: the clipped update itself is "
                "released, so no finite epsilon bounds it (epsilon = inf)",
                AccountingWarning,
                stacklevel=2,
            )
            return Accounting(math.inf, p.delta, "client", label, 0.0, rate, rounds)
        res = local_epsilon(z, rate, rounds, p.delta, certain)
        return Accounting(res.epsilon, p.delta, "client", label, z, rate, rounds)


@register_defense("dp-gaussian", "dpg")
class DPGaussian(_ClipAndNoise):
    """Clip the client update to L2 norm `clip`, add Gaussian noise N(0, sigma^2) per coordinate.

    epsilon: local DP at the client level, the Gaussian mechanism of sensitivity 2C (replace-one) and
    noise multiplier sigma / (2C), exact RDP per round, composed over the rounds taken part in.
    """

    paper = DP_GAUSSIAN_PAPER
    scale_param = "sigma"
    scale_field = param(0.01, "noise standard deviation (absolute, per coordinate)", min=0)
    mechanism = "gaussian"

    def noise(self, shape, generator, scale):
        import torch

        return torch.randn(shape, generator=generator) * scale


@register_defense("dp-laplace", "dpl")
class DPLaplace(_ClipAndNoise):
    """Clip the client update to L2 norm `clip`, add Laplace(0, b) noise per coordinate.

    epsilon: local DP at the client level (replace-one, L2 sensitivity 2C), a dimension-free (epsilon,
    delta) bound: that of the Gaussian mechanism of noise multiplier b / (2C), which dominates Laplace(b)
    noise on an L2 shift of 2C in Renyi divergence at every order, whatever the number of coordinates.
    """

    paper = DP_LAPLACE_PAPER
    scale_param = "b"
    scale_field = param(0.01, "Laplace scale b (absolute, per coordinate; std = b*sqrt(2))", min=0)
    mechanism = "laplace, dimension-free zCDP bound"

    def noise(self, shape, generator, scale):
        import torch

        # Laplace(0, b) by inverse CDF from a seeded uniform on (-1/2, 1/2)
        u = (torch.rand(shape, generator=generator, dtype=torch.float64) - 0.5).clamp(
            -0.5 + 1e-12, 0.5 - 1e-12
        )
        return -scale * torch.sign(u) * torch.log1p(-2 * u.abs())
