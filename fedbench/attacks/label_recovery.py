"""Label recovery from a shared gradient, used by every gradient-inversion attack (`labels` param).

Strategies:

- 'known': the threat model grants the labels; the only place an attack reads `y_true`.
- 'idlg' (Zhao et al. 2020, iDLG), batch of one: for the mean cross-entropy the last layer's bias
  gradient is softmax(z) - onehot(y), whose only negative entry is the label; without a bias, the
  weight-gradient row of the label is (p_y - 1) h with h >= 0 after ReLU/sigmoid, so the label is
  argmin over classes of the row sums (the CPL code's rule). For B > 1 it falls back to 'batch'.
- 'batch' (B > 1): the classes with a negative last-layer bias gradient (or weight-row sum) are
  exactly the classes present in the batch (an absent class's entry (1/B) sum_i p_ic is > 0).
  Counts follow Geng et al. 2021 ("Towards general deep leakage in FL"): for the mean loss the bias
  gradient is g_c = mean_i p_ic - n_c / B, so n_c = B (pbar_c - g_c), where pbar_c, the batch-mean
  softmax, is estimated from the model's mean prediction on random dummy inputs (the attacker has no
  data). Each class with a negative entry gets one example and the remaining B - #negative slots go,
  one at a time, to the largest residual estimated count over all classes (a class the model
  already favours can be present with a positive entry). Without a bias only presence is used
  and the remaining slots go to the most negative row sums (Yin et al. 2021's ordering).
- 'optimise': none recovered here; DLG optimises soft labels jointly with the images.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

LabelStrategy = Literal["known", "idlg", "batch", "optimise"]


@dataclass(frozen=True)
class LabelGuess:
    """Recovered labels (int64 [B]) or None for 'optimise', with the strategy actually applied."""

    labels: torch.Tensor | None
    strategy: str


def last_layer(
    model: nn.Module, grads: dict[str, torch.Tensor], num_classes: int
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(weight gradient [K, F], bias gradient [K] or None) of the last linear layer to the K logits.

    The last `nn.Linear` with `num_classes` outputs whose weight is in `grads`; failing that, the last
    2-D shared tensor with K rows.
    """
    found: tuple[str, nn.Linear] | None = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and mod.out_features == num_classes and f"{name}.weight" in grads:
            found = (name, mod)
    if found is not None:
        name, _ = found
        w = grads[f"{name}.weight"]
        b = grads.get(f"{name}.bias")
        return w.detach().float(), (b.detach().float() if b is not None else None)
    for key in reversed(list(grads)):
        g = grads[key]
        if g.dim() == 2 and g.shape[0] == num_classes:
            return g.detach().float(), None
    return None, None


def class_scores(
    weight_grad: torch.Tensor | None, bias_grad: torch.Tensor | None
) -> tuple[torch.Tensor, bool]:
    """Per-class score whose negative entries mark present classes, and whether it is the bias."""
    if bias_grad is not None and bool((bias_grad != 0).any()):
        return bias_grad, True
    if weight_grad is None:
        raise ValueError("no last-layer gradient to recover labels from")
    return weight_grad.sum(1), False


def idlg_label(weight_grad: torch.Tensor | None, bias_grad: torch.Tensor | None) -> int:
    """iDLG: the label of a single example from the last layer's gradient."""
    scores, _ = class_scores(weight_grad, bias_grad)
    return int(torch.argmin(scores).item())


def batch_labels(
    weight_grad: torch.Tensor | None,
    bias_grad: torch.Tensor | None,
    batch: int,
    mean_probs: torch.Tensor | None = None,
) -> torch.Tensor:
    """The label multiset of a batch (sorted int64 [batch]); see the module docstring."""
    scores, is_bias = class_scores(weight_grad, bias_grad)
    k = scores.numel()
    present = torch.nonzero(scores < 0).flatten()
    if present.numel() == 0:
        present = torch.argmin(scores).view(1)
    if present.numel() > batch:  # noisy gradient: keep the most negative
        present = present[torch.argsort(scores[present])[:batch]]
    counts = torch.zeros(k, dtype=torch.long)
    counts[present] = 1
    remaining = batch - int(present.numel())
    if remaining > 0:
        if is_bias:
            pbar = mean_probs if mean_probs is not None else torch.full((k,), 1.0 / k)
            est = (batch * (pbar.to(scores) - scores)).cpu()
            resid = est - counts  # over all classes: a class can be present with a positive entry
            for _ in range(remaining):  # give one slot at a time to the largest residual count
                c = int(torch.argmax(resid))
                counts[c] += 1
                resid[c] -= 1
        else:
            order = present[torch.argsort(scores[present])]
            for j in range(remaining):
                counts[order[j % order.numel()]] += 1
    return torch.repeat_interleave(torch.arange(k), counts)


@torch.no_grad()
def mean_prediction(
    model: nn.Module,
    input_shape: tuple[int, ...],
    generator: torch.Generator,
    device: torch.device,
    n: int = 32,
) -> torch.Tensor:
    """The model's mean softmax over `n` random N(0, 1) inputs in normalised space (pbar estimate)."""
    x = torch.randn((n, *input_shape), generator=generator).to(device)
    was = model.training
    model.eval()  # eval: no running-stat updates; dummy inputs are not the victim's batch
    try:
        return model(x).softmax(-1).mean(0).cpu()
    finally:
        model.train(was)


def recover_labels(
    strategy: str,
    *,
    model: nn.Module,
    grads: dict[str, torch.Tensor],
    num_classes: int,
    batch: int,
    y_true: torch.Tensor | None,
    input_shape: tuple[int, ...],
    generator: torch.Generator,
    device: torch.device,
) -> LabelGuess:
    """Apply a label strategy. `y_true` is read only for 'known' (the threat model grants it)."""
    if strategy == "optimise":
        return LabelGuess(None, "optimise")
    if strategy == "known":
        if y_true is None:
            raise ValueError("labels='known' needs the observation's labels")
        return LabelGuess(y_true.detach().long().to(device), "known")
    w, b = last_layer(model, grads, num_classes)
    if w is None and b is None:
        return LabelGuess(None, "optimise (no last linear layer found)")
    if strategy == "idlg" and batch == 1:
        return LabelGuess(torch.tensor([idlg_label(w, b)], dtype=torch.long, device=device), "idlg")
    pbar = mean_prediction(model, input_shape, generator, device) if b is not None else None
    used = "batch" if strategy == "batch" else "batch (idlg needs batch 1)"
    return LabelGuess(batch_labels(w, b, batch, pbar).to(device), used)
