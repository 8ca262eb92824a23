"""Per-example gradients with torch.func (vmap over grad of a functional model call), computed on first read.

One vectorised call instead of a Python loop over examples. BatchNorm in train mode mixes examples
and cannot be vmapped: such models must compute per-example gradients in eval mode (the error says
so). `chunk_size` bounds the memory of the vmapped computation for large batches.

`per_example_grads` returns a `PerExampleGrads` mapping {name: [B, *param.shape]} whose tensors are
computed when first read, so a consumer that needs only per-example norms and a clip-weighted sum
(Fed-CDP with `per_example=ghost`) can ask for them through `ghost()` (`fedbench.fl.ghost`) without
the [B, ...] buffers ever being made (69 M floats for an MLP 784-256-256-10 at B=256). Reading any
tensor computes all of them, exactly as an eager call would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedbench.fl.ghost import GhostBatch, NotCovered, ghost_batch

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _check_vmappable(model: nn.Module) -> None:
    if model.training and any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise ValueError(
            "per-example gradients of a model with BatchNorm need model_mode=eval "
            "(set scenario.model_mode=eval or use a model without BatchNorm)"
        )


def vmap_per_example_grads(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn, chunk_size: int | None = None
) -> dict[str, torch.Tensor]:
    """{name: [B, *param.shape]} gradients of `loss_fn` for each example separately, now (torch.func)."""
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    _check_vmappable(model)

    def loss_one(p: dict, b: dict, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (p, b), (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0))

    return vmap(grad(loss_one), in_dims=(None, None, 0, 0), chunk_size=chunk_size)(params, buffers, x, y)


class PerExampleGrads(Mapping):
    """The per-example gradients {name: [B, *param.shape]} of one batch at the model's current weights.

    The keys (trainable parameters, in the model's order) are known at once; the tensors are computed
    (`vmap_per_example_grads`) when one is first read. `ghost()` gives the per-example norms and
    clip-weighted sums instead, without the buffers, where `fedbench.fl.ghost` covers the model.
    Both must be asked for before the weights change: an in-place update of a parameter after this
    object was made raises instead of giving gradients at other weights.
    """

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn, chunk_size=None):
        self.model, self.x, self.y, self.loss_fn, self.chunk_size = model, x, y, loss_fn, chunk_size
        self._params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._versions = [p._version for _, p in self._params]
        self._grads: dict[str, torch.Tensor] | None = None
        self._ghost: GhostBatch | None = None
        self._ghost_problem: str | None = None

    def _check_weights(self) -> None:
        changed = [n for (n, p), v in zip(self._params, self._versions, strict=True) if p._version != v]
        if changed:
            raise RuntimeError(
                f"per-example gradients read after the weights changed ({', '.join(changed[:3])}): "
                "read them before the update"
            )

    @property
    def materialised(self) -> bool:
        """Whether the [B, ...] tensors have been computed."""
        return self._grads is not None

    def materialise(self) -> dict[str, torch.Tensor]:
        """The per-example gradients as a plain dict (computed on the first call). Those of an empty
        batch (a Poisson lot may be one) are [0, *param.shape] zeros: no model takes zero examples."""
        if self._grads is None:
            self._check_weights()
            if not self.batch:
                self._grads = {n: p.detach().new_zeros((0, *p.shape)) for n, p in self._params}
            else:
                self._grads = vmap_per_example_grads(
                    self.model, self.x, self.y, self.loss_fn, self.chunk_size
                )
        return self._grads

    def ghost(self) -> GhostBatch | None:
        """Per-example norms and weighted sums without the buffers (`fedbench.fl.ghost`), or None where
        the model has a layer that is not covered (`ghost_problem` says which)."""
        if self._ghost is None and self._ghost_problem is None:
            self._check_weights()
            try:
                self._ghost = ghost_batch(self.model, self.x, self.y, self.loss_fn)
            except NotCovered as exc:
                self._ghost_problem = str(exc)
        return self._ghost

    @property
    def ghost_problem(self) -> str | None:
        """Why `ghost()` gave None (after it was called), else None."""
        return self._ghost_problem

    def batch_loss(self) -> float:
        """The mean loss of the batch: that of `ghost()`'s forward pass when it ran (no further forward),
        else one no-grad forward. Both are the same batched forward, so the value is the same."""
        self._check_weights()
        if self._ghost is not None:
            return float(self._ghost.loss)
        with torch.no_grad():
            return float(self.loss_fn(self.model(self.x), self.y))

    @property
    def batch(self) -> int:
        return len(self.x)

    def copy(self) -> dict[str, torch.Tensor]:
        return dict(self.materialise())

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.materialise()[name]

    def __iter__(self) -> Iterator[str]:
        return (n for n, _ in self._params)

    def __len__(self) -> int:
        return len(self._params)

    def __repr__(self) -> str:
        state = "materialised" if self.materialised else "not materialised"
        return f"PerExampleGrads({len(self)} tensors, B={self.batch}, {state})"


def per_example_grads(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    chunk_size: int | None = None,
) -> PerExampleGrads:
    """{name: [B, *param.shape]} gradients of `loss_fn` for each example separately (computed on first read).

    Raises at once for a model that cannot have per-example gradients (BatchNorm in train mode).
    """
    _check_vmappable(model)
    return PerExampleGrads(model, x, y, loss_fn, chunk_size)
