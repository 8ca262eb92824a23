"""Offline LiRA (`mia-lira`): the likelihood-ratio membership attack of Carlini et al. (S&P 2022).

Why: a global threshold on the loss (`mia-loss`) or one attack model for every example (`mia-direct`,
`mia-shadow`) treats all examples alike, yet some are confidently predicted by any model (an easy,
typical digit) and others by none that did not train on them (an outlier, a mislabelled point). A
confident prediction on the first says little about membership, a confident one on the second says
a lot. LiRA calibrates each example by its own difficulty: reference ("shadow") models that never
saw it tell how confident a non-member's model is on exactly that example, and the target model's
confidence is scored against that per-example distribution. That is what makes it strong where it
matters, at low false-positive rates (the paper's TPR at 0.1% FPR), not just on average.

What it does (the paper's Algorithm 1 with OUT models only, the "offline" variant of §VI-C), on the
evaluation design every membership attack shares (`fedbench.attacks._membership_core`):
1. K reference models of the target's architecture, each freshly initialised and trained centrally
   (as `mia-shadow` trains its shadows: SGD at the scenario's lr and batch size) on a random subset of
   the attacker's own data (training examples no client holds, else pool examples not evaluated), so
   no evaluated example is in any of them.
2. For each queried example (x, y), the logit-scaled confidence phi = log(p_y / (1 - p_y)), computed
   stably as z_y - logsumexp_{j != y} z_j from the logits z, on the target model and on each
   reference model.
3. A Gaussian N(mu_out, sigma_out^2) fitted to the K reference values of each example; with
   `fixed_variance` (default, the paper's advice below 64 reference models) sigma_out is one global
   value, the pooled within-example standard deviation over all queried examples.
4. Score = Phi((phi_target - mu_out) / sigma_out): the one-sided test that the target is more confident
   than a model that did not train on x (the normal CDF; higher = member).
5. Decisions (for `mia_acc`): the accuracy-maximising threshold on the scores of the calibration halves
   (members / non-members not evaluated), as `mia-loss` sets its own. AUC and TPR at low FPR come
   from the scores alone.

Deviations from the paper:
- offline only: no IN models (they would have to train on the evaluated examples, which the design
  keeps from the attacker); the paper's offline attack is a few points weaker than the online one;
- no augmented queries (the paper also averages phi over flipped / shifted copies of x): one query
  per example, which keeps the attack modality-agnostic (tabular and audio data too);
- fewer reference models by default (8; the paper uses 64 to 256): a cost choice, raise `shadows`;
- the reference models are trained centrally on the attacker's data, not federatedly: the attacker
  knows the architecture and the scenario's lr and batch size, not the federation's schedule. LiRA
  assumes references trained like the target; match `shadow_epochs` to the target's fit (on the frl
  preset cut to 30 rounds, 10 epochs beat the default 30: AUC 0.65 against 0.60, 3 seeds);
- with `fixed_variance` the global sigma is the pooled within-example standard deviation (the
  reference code takes the standard deviation over all values, which also counts how much the
  per-example means differ); the per-example mean is the mean, not the reference code's median.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedbench.attacks.membership import _DesignParams, _MembershipAttack
from fedbench.plugin import AttackOutput, Paper
from fedbench.registry import register_attack
from fedbench.spec.params import param

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

LIRA_PAPER = Paper(
    "carlini2022lira",
    "Membership Inference Attacks From First Principles (Carlini et al., S&P 2022)",
    "https://arxiv.org/abs/2112.03570",
)
SIGMA_FLOOR = 1e-6  # a reference spread of exactly 0 (identical or saturated models) stays finite


def scaled_logit(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """phi = log(p_y / (1 - p_y)) = z_y - logsumexp_{j != y} z_j, in float64 (no softmax underflow)."""
    import torch

    z = logits.double()
    true = z.gather(1, y.view(-1, 1)).squeeze(1)
    others = z.scatter(1, y.view(-1, 1), float("-inf"))
    return true - torch.logsumexp(others, dim=1)


def model_phi(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device, batch: int = 512) -> np.ndarray:
    """The scaled logit of the true label of every (x, y) under `model`, batched, as float64."""
    import numpy as np
    import torch

    model.eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(y), batch):
            logits = model(x[i : i + batch].to(device)).cpu()
            out.append(scaled_logit(logits, y[i : i + batch].cpu()).numpy())
    return np.concatenate(out) if out else np.zeros(0)


def masked_gaussian(
    ref: np.ndarray, mask: np.ndarray, fixed_variance: bool, side: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """Per-example mean and standard deviation of the (K, n) `ref` values where `mask` is True (`side`,
    "IN " or "OUT ", names them in the error).

    Values outside the mask are dropped (`np.where`), not weighted by 0, so a non-finite value there
    cannot leak in. Standard deviations per example (ddof=1) or, with `fixed_variance`, the root of the
    mean per-example variance; floored at `SIGMA_FLOOR`."""
    import numpy as np

    count = mask.sum(axis=0)
    if count.min() < 2:
        raise ValueError(f"LiRA needs at least 2 {side}reference values per example to fit a Gaussian")
    mu = np.where(mask, ref, 0.0).sum(axis=0) / count
    var = np.where(mask, (ref - mu) ** 2, 0.0).sum(axis=0) / (count - 1)
    sigma = np.sqrt(var.mean()) if fixed_variance else np.sqrt(var)
    return mu, np.maximum(sigma, SIGMA_FLOOR)


def lira_scores(phi_target, phi_ref, fixed_variance: bool = True) -> np.ndarray:
    """Offline LiRA scores: Phi((phi_target - mu_out) / sigma_out) per example.

    phi_target: (n,) the target model's scaled logits; phi_ref: (K, n) the reference (OUT) models'.
    mu_out is each example's mean over the K references; sigma_out each example's standard deviation
    (ddof=1), or with `fixed_variance` one global value: the root of the mean per-example variance.
    """
    import numpy as np
    from scipy.stats import norm

    target = np.asarray(phi_target, dtype=np.float64)
    ref = np.asarray(phi_ref, dtype=np.float64)
    if ref.ndim != 2 or ref.shape[1] != target.shape[0]:
        raise ValueError(f"phi_ref must be (K, {target.shape[0]}), got {ref.shape}")
    mu, sigma = masked_gaussian(ref, np.ones(ref.shape, dtype=bool), fixed_variance)
    return norm.cdf((target - mu) / sigma)


def reference_phis(
    target: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    x_own: torch.Tensor,
    y_own: torch.Tensor,
    shadows: int,
    size: int,
    epochs: int,
    lr: float,
    batch: int,
    device,
    generator: torch.Generator,
    rng: np.random.Generator,
) -> np.ndarray:
    """(K, n): phi of every queried (x, y) under K fresh reference models of the target's architecture,
    each trained on `size` random examples of the attacker's own data (x_own, y_own)."""
    import numpy as np
    import torch

    from fedbench.attacks import _membership_core as core

    rows = []
    for _ in range(shadows):
        pick = torch.as_tensor(rng.permutation(len(y_own))[:size])
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        ref = core.fresh_copy(target, seed)
        core.train_shadow(ref, x_own[pick], y_own[pick], epochs, lr, batch, device, generator)
        rows.append(model_phi(ref, x, y, device))
    return np.stack(rows)


@register_attack("mia-lira", "lira")
class MIALiRA(_MembershipAttack):
    """Offline LiRA (Carlini et al. 2022): the target's scaled confidence vs. per-example reference models."""

    version = "1"
    paper = LIRA_PAPER

    @dataclass(frozen=True)
    class Params(_DesignParams):
        shadows: int = param(
            8, "reference (OUT) models; the paper uses 64-256 (a Gaussian needs at least 2)", min=2
        )
        shadow_size: int = param(
            0, "training examples per reference model; 0 = as many as evaluated members", min=0
        )
        shadow_epochs: int = param(30, "centralised SGD epochs per reference model", min=1)
        fixed_variance: bool = param(
            True, "one global sigma for every example (paper's advice below 64 models) or per example"
        )

    def score(self, split, unused, target, observation, meta, generator, device, rng) -> AttackOutput:
        import numpy as np
        import torch

        from fedbench.attacks import _membership_core as core
        from fedbench.errors import FedbenchError

        p = self.params
        x_own, y_own = core.shadow_data(self.data, p.source, unused, rng)
        size = p.shadow_size or int(split.is_member.sum())
        if len(y_own) < size:
            raise FedbenchError(
                f"mia-lira: {len(y_own)} attacker examples cannot give reference models of {size}; "
                "lower shadow_size or scenario.train_size (training examples beyond it are the attacker's)"
            )
        # the calibration halves (first) and the evaluated set, scored by one set of reference models
        x = torch.cat([split.x_in, split.x_out, split.x_eval])
        y = torch.cat([split.y_in, split.y_out, split.y_eval])
        batch = observation.batch_size or 32
        ref = reference_phis(
            target,
            x,
            y,
            x_own,
            y_own,
            p.shadows,
            size,
            p.shadow_epochs,
            observation.lr,
            batch,
            device,
            generator,
            rng,
        )
        scores = lira_scores(model_phi(target, x, y, device), ref, p.fixed_variance)
        n_in, n_out = len(split.y_in), len(split.y_out)
        threshold = core.best_threshold(scores[:n_in], scores[n_in : n_in + n_out])
        evaluated = scores[n_in + n_out :]
        return AttackOutput(
            scores=evaluated,
            predictions=(evaluated > threshold).astype(np.int8),
            extra={"threshold": float(threshold)},
        )
