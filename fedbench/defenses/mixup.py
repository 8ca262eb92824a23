"""MixUp and InstaHide as input encodings (spec 001 §4; Zhang et al. 2018, Huang et al. 2020).

Each private image x_i is replaced, once per client before training (`prepare_data`), by
`encodings` encodings  x~ = sum_j lambda_j x_{s_j}  of k images: x_i itself (s_0 = i) and k - 1
distinct other images of the client's data, with (lambda_0, ..., lambda_{k-1}) ~ Dirichlet(3, 1, ..., 1)
rejection-sampled until max lambda <= 0.65 (GradAttack's sampler; the paper leaves it open). Several
encodings per image stand in for GradAttack's fresh mapping per epoch. Mixing happens on the
normalised images (the same as mixing pixels, the coefficients sum to 1). InstaHide then multiplies
every pixel of the mixture by an independent random sign (the sigma of Eq. 2).

The label of an encoding is the label of its largest-weight component (a hard label; GradAttack mixes
one-hot labels, which fedbench's integer-label attacks and metrics cannot carry), and that component
is the private image a reconstruction is compared with (the paper's protocol without the adaptive
attack). Both defenses keep the mapping and coefficients per client (`mixing(client)`): the oracle
knowledge GradAttack grants its decoding attack (`mixup-decode`, spec §2.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedbench.api import Defense, HookContext, Paper
from fedbench.params import param
from fedbench.registry import register_defense


def sample_coefficients(n: int, k: int, rng: Any, alpha_first: float = 3.0, max_coef: float = 0.65) -> Any:
    """[n, k] mixing coefficients ~ Dirichlet(alpha_first, 1, ..., 1), each row with max <= max_coef.

    Rows are redrawn until they satisfy the bound (GradAttack's rejection sampler); a bound below 1/k
    cannot be met and is refused.
    """
    import numpy as np

    if k < 1:
        raise ValueError("k must be >= 1")
    if k == 1:
        return np.ones((n, 1))
    if max_coef * k < 1:
        raise ValueError(f"max_coef={max_coef} < 1/k: no coefficients summing to 1 satisfy it")
    alpha = np.array([alpha_first] + [1.0] * (k - 1))
    out = rng.dirichlet(alpha, size=n)
    bad = out.max(1) > max_coef
    while bad.any():
        out[bad] = rng.dirichlet(alpha, size=int(bad.sum()))
        bad = out.max(1) > max_coef
    return out


def sample_partners(n: int, k: int, copies: int, rng: Any) -> Any:
    """[copies * n, k] component indices: row e*n + i mixes image i with k - 1 distinct others.

    With fewer than k images, the others are drawn with replacement.
    """
    import numpy as np

    rows = []
    for _ in range(copies):
        for i in range(n):
            others = np.delete(np.arange(n), i)
            pick = rng.choice(others, size=k - 1, replace=len(others) < k - 1) if k > 1 and n > 1 else []
            if k > 1 and n == 1:
                pick = np.zeros(k - 1, dtype=np.int64)
            rows.append(np.concatenate([[i], pick]).astype(np.int64))
    return np.stack(rows)


@dataclass(frozen=True)
class Mixing:
    """A client's encodings: component indices [M, k], coefficients [M, k], sign masks (InstaHide), the
    encoded inputs and their labels (the oracle attacker replays their gradients as further observed
    iterations, with the labels its threat model grants)."""

    components: Any
    coefficients: Any
    signs: Any
    encoded: Any
    labels: Any


@register_defense("mixup")
class MixUp(Defense):
    """MixUp as an encoding: train on convex mixtures of k private images (Dirichlet(3,1,..) weights)."""

    version = "1"
    paper = Paper(
        "zhang2018mixup", "mixup: Beyond Empirical Risk Minimization", "https://arxiv.org/abs/1710.09412"
    )
    adaptive_attack = "mixup-decode"
    flip_signs = False

    @dataclass(frozen=True)
    class Params:
        k: int = param(4, "images per encoding (LODA: 4, 6)", min=1)
        encodings: int = param(
            1, "encodings per private image (fresh mappings, like GradAttack's epochs)", min=1
        )
        alpha_first: float = param(
            3.0, "Dirichlet concentration of the image's own weight", min=0, min_open=True
        )
        max_coef: float = param(0.65, "upper bound on every mixing weight (rejection sampling)", min=0, max=1)

        def validate(self) -> str | None:
            if self.max_coef * self.k < 1:
                return f"max_coef={self.max_coef} is below 1/k={1 / self.k:.3g}: no mixing weights satisfy it"
            return None

    def __init__(self, params: Any = None):
        super().__init__(params)
        self._mixing: dict[int, Mixing] = {}

    def mixing(self, client: int) -> Mixing:
        """The client's encodings (prepared by `prepare_data`)."""
        return self._mixing[client]

    def prepare_data(self, x: Any, y: Any, ctx: HookContext) -> tuple:
        import numpy as np
        import torch

        p = self.params
        n = len(x)
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=ctx.generator))
        rng = np.random.default_rng(seed)
        comp = sample_partners(n, p.k, p.encodings, rng)
        coef = sample_coefficients(len(comp), p.k, rng, p.alpha_first, p.max_coef)
        comp_t = torch.as_tensor(comp, device=x.device)
        coef_t = torch.as_tensor(coef, dtype=x.dtype, device=x.device)
        shape = (len(comp), p.k) + (1,) * (x.dim() - 1)
        mixed = (x[comp_t] * coef_t.view(shape)).sum(1)
        signs = None
        if self.flip_signs:
            g = torch.Generator().manual_seed(seed + 1)
            signs = (torch.randint(0, 2, mixed.shape, generator=g) * 2 - 1).to(mixed.dtype).to(x.device)
            mixed = mixed * signs
        dominant = comp_t[torch.arange(len(comp)), coef_t.argmax(1)]
        labels = y[dominant]
        self._mixing[ctx.client] = Mixing(comp_t.cpu(), coef_t.cpu(), signs, mixed.detach().clone(), labels)
        return mixed, labels, x[dominant]


@register_defense("instahide")
class InstaHide(MixUp):
    """InstaHide: MixUp of k private images, then every pixel's sign flipped at random (p = 0.5)."""

    paper = Paper(
        "huang2020instahide",
        "InstaHide: Instance-hiding Schemes for Private Distributed Learning",
        "https://arxiv.org/abs/2010.02772",
    )
    flip_signs = True
