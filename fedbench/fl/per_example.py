"""Per-example gradients with torch.func (vmap over grad of a functional model call).

One vectorised call instead of a Python loop over examples. BatchNorm in train mode mixes examples
and cannot be vmapped: such models must compute per-example gradients in eval mode (the error says
so). `chunk_size` bounds the memory of the vmapped computation for large batches.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap


def per_example_grads(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    chunk_size: int | None = None,
) -> dict[str, torch.Tensor]:
    """{name: [B, *param.shape]} gradients of `loss_fn` for each example separately."""
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    if model.training and any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise ValueError(
            "per-example gradients of a model with BatchNorm need model_mode=eval "
            "(set scenario.model_mode=eval or use a model without BatchNorm)"
        )

    def loss_one(p: dict, b: dict, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (p, b), (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0))

    return vmap(grad(loss_one), in_dims=(None, None, 0, 0), chunk_size=chunk_size)(params, buffers, x, y)
