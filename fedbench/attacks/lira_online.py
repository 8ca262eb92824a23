"""Online LiRA (`mia-lira-online`): Carlini et al.'s likelihood-ratio attack with IN and OUT references
(and, `mode=offline`, the paper's offline test on the same references' OUT halves).

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

`mode=offline` (issue 30): the paper's offline attack on the same references. Why: `mia-lira` trains
its OUT models on the attacker's own data, which a design that queries the whole pool leaves empty
(mnist5k at test_fraction 0.5: 2,500 members and 2,500 non-members, every one a candidate). The paper
trains its references on random halves of the pool and, offline, scores each candidate against only
the references where it is OUT (§VI-C, the "offline" variant of Algorithm 1). So do we: the references
are those of `mode=online` (the same halves, the same artifacts: both modes of one run cost one set),
and step 3-4 become
3'. N(mu_out, sigma_out^2) from the candidate's OUT references' phi alone (sigma pooled as above);
4'. score = (phi_target - mu_out) / sigma_out, the one-sided test that the target is more confident
    than a model without x. Its p-value 1 - Phi(score) orders the candidates exactly as Phi(score)
    does (`mia-lira`'s score), so thresholds, TPR and AUC are the same, without Phi rounding to 1 above
    score ~ 8, which would tie the most exposed candidates.
An IN reference's phi never enters the score (each candidate's IN models are masked out, not averaged
with weight 0), so the attack uses nothing a model trained on x could tell it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from fedbench.attacks._references import ReferenceAttack, ReferenceParams
from fedbench.attacks.lira import LIRA_PAPER, masked_gaussian
from fedbench.registry import register_attack
from fedbench.spec.params import param

if TYPE_CHECKING:
    import numpy as np

MIN_REFERENCES = 4  # two IN and two OUT values per example: a variance needs two


def _arrays(phi_target, phi_ref, is_in) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    import numpy as np

    target = np.asarray(phi_target, dtype=np.float64)
    ref = np.asarray(phi_ref, dtype=np.float64)
    inn = np.asarray(is_in, dtype=bool)
    if ref.ndim != 2 or ref.shape[1] != len(target) or inn.shape != ref.shape:
        raise ValueError(f"phi_ref and is_in must be (K, {len(target)}); got {ref.shape}, {inn.shape}")
    return target, ref, inn


def lira_online_scores(phi_target, phi_ref, is_in, fixed_variance: bool = True) -> np.ndarray:
    """Online LiRA scores: log N(phi; mu_in, s_in^2) - log N(phi; mu_out, s_out^2) per example.

    phi_target: (n,); phi_ref: (K, n); is_in: (K, n) bool, example i in reference k's training set.
    Means per example; standard deviations per example (ddof=1) or, with `fixed_variance`, the root of
    the mean per-example variance, one for IN and one for OUT.
    """
    from scipy.stats import norm

    target, ref, inn = _arrays(phi_target, phi_ref, is_in)
    mu_in, s_in = masked_gaussian(ref, inn, fixed_variance, "IN ")
    mu_out, s_out = masked_gaussian(ref, ~inn, fixed_variance, "OUT ")
    return norm.logpdf(target, mu_in, s_in) - norm.logpdf(target, mu_out, s_out)


def lira_offline_scores(phi_target, phi_ref, is_in, fixed_variance: bool = True) -> np.ndarray:
    """Offline LiRA from references on halves of the pool: (phi - mu_out) / sigma_out per example.

    The arguments are `lira_online_scores`'; only each example's OUT references (is_in False) enter
    mu_out and sigma_out (with `fixed_variance` one pooled OUT sigma). Higher = member; Phi of the
    score is the one-sided test's `mia-lira` score, in the same order (module docstring, 4').
    """
    target, ref, inn = _arrays(phi_target, phi_ref, is_in)
    mu_out, s_out = masked_gaussian(ref, ~inn, fixed_variance, "OUT ")
    return (target - mu_out) / s_out


@register_attack("mia-lira-online", "lira-online")
class MIALiRAOnline(ReferenceAttack):
    """Online LiRA (Carlini et al. 2022): IN and OUT Gaussians per example from reference models."""

    version = "1"
    key_optional = ("mode",)  # added later: at its default (online) the run ids stay those of before
    paper = LIRA_PAPER
    online = True  # the references train on halves of the queried candidates, in both modes

    @dataclass(frozen=True)
    class Params(ReferenceParams):
        fixed_variance: bool = param(
            True, "one global sigma per side (paper's advice below 64 models) or per example"
        )
        mode: Literal["online", "offline"] = param(
            "online",
            "online: IN vs OUT likelihood ratio; offline: one-sided test against each candidate's OUT "
            "references only (the same references, trained on halves of the queried pool)",
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
        rule = lira_online_scores if self.params.mode == "online" else lira_offline_scores
        return rule(model_phi(target, x, y, device), phi_ref, refs.is_in, self.params.fixed_variance)
