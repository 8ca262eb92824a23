"""Training losses named by `Scenario.loss`."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def loss_function(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Mean-reduced loss of logits vs int labels: 'ce' cross-entropy, 'mse' on softmax vs one-hot."""
    if name == "ce":
        return F.cross_entropy

    def mse(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # one-hot by comparison, not F.one_hot (whose range check breaks vmap'd per-example gradients)
        target = (y.unsqueeze(-1) == torch.arange(logits.shape[-1], device=y.device)).to(logits.dtype)
        return F.mse_loss(torch.softmax(logits, dim=-1), target)

    return mse
