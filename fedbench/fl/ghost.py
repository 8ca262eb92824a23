"""Per-example gradient norms and reweighted sums without per-example gradient buffers ("ghost clipping").

DP-SGD style defenses (Fed-CDP) need, per step, only the norms of each example's gradient (per parameter
tensor) and the sum of the clipped gradients, sum_i c_i G_i, never the [B, *param.shape] per-example
gradients themselves. For a layer z = W a (+ b) both follow from the layer's input activations a_i and
output gradients g_i = dl_i/dz_i, which one ordinary batched forward and backward pass provides:

- nn.Linear on [B, in] inputs (Goodfellow 2015, "Efficient per-example gradient computations",
  arXiv:1510.01799): G_i = g_i a_i^T, so ||G_i|| = ||g_i|| ||a_i|| and the bias's is ||g_i||;
  the clipped sum is (c * g)^T a, one GEMM of the size of the ordinary weight gradient.
- Layers applied at T positions (nn.Linear on [B, T, in]; nn.Conv2d at its T output positions):
  G_i = g_i a_i^T sums over the positions (for a conv, a_i are the input patches, Rochette et al.
  2019, arXiv:1912.06015). Its norm is either the "ghost norm" of Li et al. 2022 ("Large language
  models can be strong differentially private learners", ICLR 2022, arXiv:2110.05679),
  ||G_i||^2 = <a_i a_i^T, g_i g_i^T> over two T x T Gram matrices, or G_i is materialised per
  example (a [B, out, in] buffer of this layer alone; for a conv by one convolution backward with
  the batch folded into the groups), whichever needs less memory: the "mixed ghost norm" rule
  2 T^2 < out*in of Bu et al. 2022 ("Scalable and efficient training of large convolutional neural
  networks with differential privacy", NeurIPS 2022, arXiv:2205.10683).
- The clipped sum is computed from the stored activations and output gradients (or the layer's
  materialised G_i), with no second backward pass: the "book-keeping" of Bu et al. 2023
  ("Differentially private optimization on large model at small cost", ICML 2023, arXiv:2210.00038).

The output gradients come from one `torch.autograd.grad` of the batch loss with respect to the
layers' outputs (captured by forward hooks), which skips the weight-gradient products of an ordinary
backward pass. The loss must be a mean of per-example losses (both of `fedbench.fl.losses` are), so
the initial gradient B makes g_i each example's own loss gradient, as `torch.func` gives it.

A model is covered when every trainable parameter is the weight or bias of an nn.Linear or of a
zero-padded, ungrouped nn.Conv2d, each called once per forward, and nothing mixes examples
(BatchNorm or active Dropout in train mode); `coverage` says why a model is not, and callers then
use `torch.func` (`fedbench.fl.per_example`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class NotCovered(Exception):
    """The model (or this forward pass) has something the ghost computation does not handle."""


def _conv_problem(conv: nn.Conv2d) -> str | None:
    if conv.groups != 1:
        return "grouped convolution"
    if conv.padding_mode != "zeros":
        return f"padding_mode={conv.padding_mode}"
    if isinstance(conv.padding, str) and conv.padding != "valid":
        return f"padding='{conv.padding}'"
    return None


def coverage(model: nn.Module) -> str | None:
    """None when the ghost computation covers `model`, else the reason it does not (stated to the user)."""
    owners: dict[int, str] = {}
    for prefix, module in model.named_modules():
        own = [(n, p) for n, p in module.named_parameters(recurse=False) if p.requires_grad]
        if module.training and isinstance(module, nn.modules.batchnorm._BatchNorm):
            return f"{type(module).__name__} in train mode mixes examples"
        if module.training and isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            return f"{type(module).__name__} in train mode"
        if not own:
            continue
        where = prefix or type(model).__name__
        if type(module) is nn.Conv2d:
            problem = _conv_problem(module)
            if problem:
                return f"{where}: {problem}"
        elif type(module) is not nn.Linear:
            return f"{where}: {type(module).__name__} has parameters (only nn.Linear and nn.Conv2d covered)"
        for n, p in own:
            if n not in ("weight", "bias"):
                return f"{where}: parameter '{n}'"
            if id(p) in owners:
                return f"{where}.{n} is shared with {owners[id(p)]}"
            owners[id(p)] = f"{where}.{n}"
    return None


def _mixed_ghost(positions: int, p: int, d: int) -> bool:
    """Whether the ghost norm (two T x T Gram matrices per example) needs less memory than the
    per-example weight gradient [p, d]: 2 T^2 < p d (Bu et al. 2022)."""
    return 2 * positions * positions < p * d


@dataclass
class _Layer:
    """One covered layer of the forward pass: its input `a` and per-example output gradients `g`.

    `weight`/`bias` are the parameter names (None when frozen or absent). Subclasses give the
    per-example weight-gradient norms and the clip-weighted sum, sum_i c_i G_i.
    """

    module: nn.Module
    weight: str | None
    bias: str | None
    a: torch.Tensor
    g: torch.Tensor
    full: torch.Tensor | None = None  # per-example weight gradients [B, p, d], where materialised

    def __post_init__(self) -> None:
        """Subclasses reshape `a` and `g` here."""

    def weight_norms(self) -> torch.Tensor:
        raise NotImplementedError

    def weight_sum(self, c: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def bias_grads(self) -> torch.Tensor:
        """[B, p] per-example bias gradients: the output gradients summed over positions."""
        raise NotImplementedError


class _Linear(_Layer):
    """nn.Linear on a [B, d] or [B, ..., d] input (T = the product of the middle dimensions)."""

    def __post_init__(self) -> None:
        if self.a.dim() > 2:  # [B, ..., d] -> [B, T, d] (and g likewise)
            self.a, self.g = self.a.flatten(1, -2), self.g.flatten(1, -2)

    def weight_norms(self) -> torch.Tensor:
        a, g = self.a, self.g
        if a.dim() == 2:  # ||g_i a_i^T|| = ||g_i|| ||a_i|| (Goodfellow 2015)
            return torch.linalg.vector_norm(g, dim=1) * torch.linalg.vector_norm(a, dim=1)
        if _mixed_ghost(a.shape[1], g.shape[2], a.shape[2]):  # Li et al. 2022
            gram = torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))
            return gram.sum((1, 2)).clamp_min(0).sqrt()
        self.full = torch.bmm(g.transpose(1, 2), a)  # [B, p, d]
        return torch.linalg.vector_norm(self.full.flatten(1), dim=1)

    def bias_grads(self) -> torch.Tensor:
        return self.g if self.g.dim() == 2 else self.g.sum(1)

    def weight_sum(self, c: torch.Tensor) -> torch.Tensor:
        a, g = self.a, self.g
        if self.full is not None:
            return torch.tensordot(c, self.full, dims=1)
        if a.dim() == 2:
            return (g * c[:, None]).t() @ a
        gc = (g * c[:, None, None]).reshape(
            -1, g.shape[2]
        )  # [B*T, p]: one product over examples and positions
        return gc.t() @ a.reshape(-1, a.shape[2])


#: Per-example conv weight gradients run as B groups; with 2..16 input channels per group torch's CPU
#: kernel is faster on channels-last tensors (LeNet's 12-channel convs: the whole Fed-CDP ghost step
#: 2.07x -> 1.79x of a plain step), and much slower with more channels (the Fed-CDP CNN's 32: 3-4x).
SMALL_GROUP_CHANNELS = 16


class _Conv2d(_Layer):
    """nn.Conv2d: input a [B, C_in, H, W], output gradients g [B, C_out, H', W'] (T = H' W' positions).

    The per-example weight gradients come from one convolution backward with the batch folded into
    the groups (B groups of C_in -> C_out, as torch.func's batching rule does), which measured faster
    than unfolding the input (im2col) for LeNet's and the Fed-CDP CNN's layers on CPU. Where the
    ghost norm needs less memory (few positions, many channels) the input is unfolded into patches
    [B, C_in*kh*kw, T] instead (Rochette et al. 2019) and only T x T Gram matrices are formed.
    """

    def __post_init__(self) -> None:
        self.patches: torch.Tensor | None = None  # [B, C_in*kh*kw, T], where the ghost norm is used

    def _padding(self) -> tuple[int, ...]:
        return (0, 0) if self.module.padding == "valid" else tuple(self.module.padding)

    def weight_norms(self) -> torch.Tensor:
        conv, a, g = self.module, self.a, self.g
        b, p, d = len(a), g.shape[1], conv.weight[0].numel()
        if _mixed_ghost(g.shape[2] * g.shape[3], p, d):
            self.patches = F.unfold(
                a, conv.kernel_size, dilation=conv.dilation, padding=self._padding(), stride=conv.stride
            )  # [B, d, T]
            gf = g.flatten(2)  # [B, p, T]
            gram = torch.bmm(self.patches.transpose(1, 2), self.patches) * torch.bmm(gf.transpose(1, 2), gf)
            return gram.sum((1, 2)).clamp_min(0).sqrt()
        # only the weight's shape is read; a real (uninitialised) tensor, as a stride-0 view is copied
        weight = g.new_empty((b * p, *conv.weight.shape[1:]))
        gg, aa = g.reshape(1, b * p, *g.shape[2:]), a.reshape(1, -1, *a.shape[2:])
        if 1 < a.shape[1] <= SMALL_GROUP_CHANNELS:  # LeNet's 12-channel groups: 1.3x faster channels-last
            gg = gg.contiguous(memory_format=torch.channels_last)
            aa = aa.contiguous(memory_format=torch.channels_last)
        self.full = torch.ops.aten.convolution_backward(
            gg,
            aa,
            weight,
            None,
            conv.stride,
            self._padding(),
            conv.dilation,
            False,
            [0, 0],
            b,
            [False, True, False],
        )[1].reshape(b, p, d)
        return torch.linalg.vector_norm(self.full.flatten(1), dim=1)

    def bias_grads(self) -> torch.Tensor:
        return self.g.flatten(2).sum(2)

    def weight_sum(self, c: torch.Tensor) -> torch.Tensor:
        shape = self.module.weight.shape
        if self.full is not None:
            return torch.tensordot(c, self.full, dims=1).view(shape)
        gc = (self.g.flatten(2) * c[:, None, None]).transpose(0, 1).reshape(shape[0], -1)  # [p, B*T]
        return (gc @ self.patches.transpose(1, 2).reshape(-1, self.patches.shape[1])).view(shape)


class GhostBatch:
    """Per-example gradient norms and clip-weighted sums of one batch, from one forward and backward.

    `norms()` gives {name: [B]} per-example L2 norms of every trainable parameter tensor (in the
    model's parameter order); `weighted_sum(factors)` gives {name: sum_i c_i G_i} for factors
    {name: [B]}, and `weighted_mean(factors)` that sum / B; `loss` is the batch loss of the forward
    pass (detached).
    """

    def __init__(self, layers: list[_Layer], names: list[str], loss: torch.Tensor, batch: int):
        self._layers = layers
        self.names = names
        self.loss = loss
        self.batch = batch
        self._norms: dict[str, torch.Tensor] | None = None

    def norms(self) -> dict[str, torch.Tensor]:
        if self._norms is None:
            found = {}
            for layer in self._layers:
                if layer.weight is not None:
                    found[layer.weight] = layer.weight_norms()
                if layer.bias is not None:
                    found[layer.bias] = torch.linalg.vector_norm(layer.bias_grads(), dim=1)
            self._norms = {n: found[n] for n in self.names}
        return self._norms

    def weighted_sum(self, factors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.norms()  # each layer's way (Gram matrices or per-example gradients) is chosen there
        found = {}
        for layer in self._layers:
            if layer.weight is not None:
                c = factors[layer.weight].to(layer.g.dtype)
                found[layer.weight] = layer.weight_sum(c).view(layer.module.weight.shape)
            if layer.bias is not None:
                c = factors[layer.bias].to(layer.g.dtype)
                found[layer.bias] = c @ layer.bias_grads()
        return {n: found[n] for n in self.names}

    def weighted_mean(self, factors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`weighted_sum` / B: the sum divided last, as a mean over the batch always was (same bits)."""
        return {n: s / self.batch for n, s in self.weighted_sum(factors).items()}


def ghost_batch(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> GhostBatch:
    """One batched forward with hooks and one backward to the layers' outputs (raises NotCovered)."""
    problem = coverage(model)
    if problem:
        raise NotCovered(problem)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    modules = {}
    for prefix, module in model.named_modules():
        own = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
        if own:
            modules[module] = {n: f"{prefix}.{n}" if prefix else n for n in own}
    seen: dict[nn.Module, list[tuple[torch.Tensor, torch.Tensor, int, int]]] = {m: [] for m in modules}

    def record(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        seen[module].append((inputs[0], output, inputs[0]._version, output._version))

    handles = [m.register_forward_hook(record) for m in modules]
    try:
        with torch.enable_grad():
            loss = loss_fn(model(x), y)
    finally:
        for h in handles:
            h.remove()
    calls = []
    for module, records in seen.items():
        if len(records) != 1:
            raise NotCovered(f"{type(module).__name__} called {len(records)} times in one forward")
        inp, out, v_in, v_out = records[0]
        if inp._version != v_in or out._version != v_out:
            raise NotCovered(f"{type(module).__name__}'s input or output was modified in place")
        calls.append((module, inp, out))
    # the initial gradient B undoes the batch mean: each g_i is example i's own loss gradient
    scale = torch.tensor(float(len(x)), dtype=loss.dtype, device=loss.device)
    grads = torch.autograd.grad(loss, [out for _, _, out in calls], grad_outputs=scale, allow_unused=True)
    layers: list[_Layer] = []
    for (module, inp, out), g in zip(calls, grads, strict=True):
        g = torch.zeros_like(out) if g is None else g.detach()
        kind = _Conv2d if isinstance(module, nn.Conv2d) else _Linear
        param = modules[module]
        layers.append(kind(module, param.get("weight"), param.get("bias"), inp.detach(), g))
    return GhostBatch(layers, names, loss.detach(), len(x))
