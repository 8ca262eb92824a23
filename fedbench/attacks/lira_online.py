"""Online LiRA (`mia-lira-online`): Carlini et al.'s likelihood-ratio attack with IN and OUT references.

Why beside offline LiRA (`mia-lira`): the offline attack only asks whether the target is more
confident on x than models that never saw x. The online attack also models how confident a model
that *did* train on x is, and scores the likelihood ratio of the two hypotheses, the Neyman-Pearson
test the paper derives; it is the paper's strongest attack at low FPR (its Fig. 1 and §VI). The price:
references must train on the queried examples themselves, so they cannot be reused for other
candidates; each candidate is IN for half of them.

What it does (the paper's Algorithm 1, online), on the evaluation design every membership attack shares:
1. K reference models (`fedbench.attacks._references`): each queried candidate (the calibration halves
   and the evaluated set) is IN for exactly floor(K/2) of them (the reference code's balanced
   assignment), each reference is topped up with the attacker's own data to the target's training-set
   size; trained as FL runs of the target's protocol and defense (`references=fl`, default) or
   centrally (`references=central`, as `mia-lira`).
2. phi = log(p_y / (1 - p_y)) of each candidate under the target and every reference
   (`fedbench.attacks.lira.scaled_logit`).
3. Per candidate, N(mu_in, sigma_in^2) fitted to its IN references' phi and N(mu_out, sigma_out^2) to its
   OUT references'; with `fixed_variance` (default, the paper's advice below 64 models) each sigma is
   one global value, the pooled within-example standard deviation (as `mia-lira` pools it).
4. Score = log N(phi_target; mu_in, sigma_in^2) - log N(phi_target; mu_out, sigma_out^2) (higher = member).

Deviations, stated as `mia-lira` states them: no augmented queries; per-example mean, not the
reference code's median; K = 16 by default (the paper: 256; at least 4, two IN and two OUT per
example, or no variance can be pooled); K <= 4 is the cheap mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedbench.attacks._references import ReferenceAttack, ReferenceParams
from fedbench.attacks.lira import LIRA_PAPER, SIGMA_FLOOR
from fedbench.registry import register_attack
from fedbench.spec.params import param

if TYPE_CHECKING:
    import numpy as np

MIN_REFERENCES = 4  # two IN and two OUT values per example: a variance needs two


def lira_online_scores(phi_target, phi_ref, is_in, fixed_variance: bool = True) -> np.ndarray:
    """Online LiRA scores: log N(phi; mu_in, s_in^2) - log N(phi; mu_out, s_out^2) per example.

    phi_target: (n,); phi_ref: (K, n); is_in: (K, n) bool, example i in reference k's training set.
    Means per example; standard deviations per example (ddof=1) or, with `fixed_variance`, the root of
    the mean per-example variance, one for IN and one for OUT.
    """
    import numpy as np
    from scipy.stats import norm

    target = np.asarray(phi_target, dtype=np.float64)
    ref = np.asarray(phi_ref, dtype=np.float64)
    inn = np.asarray(is_in, dtype=bool)
    if ref.ndim != 2 or ref.shape[1] != len(target) or inn.shape != ref.shape:
        raise ValueError(f"phi_ref and is_in must be (K, {len(target)}); got {ref.shape}, {inn.shape}")

    def fit(mask: np.ndarray, side: str) -> tuple[np.ndarray, np.ndarray]:
        count = mask.sum(axis=0)
        if count.min() < 2:
            raise ValueError(f"online LiRA needs at least 2 {side} reference values per example")
        mu = (ref * mask).sum(axis=0) / count
        var = (((ref - mu) ** 2) * mask).sum(axis=0) / (count - 1)
        sigma = np.sqrt(var.mean()) if fixed_variance else np.sqrt(var)
        return mu, np.maximum(sigma, SIGMA_FLOOR)

    mu_in, s_in = fit(inn, "IN")
    mu_out, s_out = fit(~inn, "OUT")
    return norm.logpdf(target, mu_in, s_in) - norm.logpdf(target, mu_out, s_out)


@register_attack("mia-lira-online", "lira-online")
class MIALiRAOnline(ReferenceAttack):
    """Online LiRA (Carlini et al. 2022): IN and OUT Gaussians per example from reference models."""

    version = "1"
    paper = LIRA_PAPER
    online = True

    @dataclass(frozen=True)
    class Params(ReferenceParams):
        fixed_variance: bool = param(
            True, "one global sigma per side (paper's advice below 64 models) or per example"
        )

        def validate(self) -> str | None:
            if self.references_n < MIN_REFERENCES:
                return (
                    f"online LiRA needs references_n >= {MIN_REFERENCES} (2 IN and 2 OUT models per "
                    f"example); got {self.references_n}"
                )
            return None

    def calibrated(self, target, refs, x, y, z, device):
        from fedbench.attacks._references_core import reference_outputs
        from fedbench.attacks.lira import model_phi

        phi_ref = reference_outputs(target, refs, x, y, device, model_phi)
        return lira_online_scores(
            model_phi(target, x, y, device), phi_ref, refs.is_in, self.params.fixed_variance
        )
