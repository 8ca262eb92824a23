"""Torch core of the fully-connected-layer attacks (`fc-leakage`, `trap-weights`).

Imported lazily by `fedbench.attacks.fc_leakage` when an attack runs, so listing plugins never
imports torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn


def first_linear(model: nn.Module) -> tuple[str, nn.Module | None]:
    """(name, module) of the first leaf module holding parameters; module None if the model has none."""
    for name, module in model.named_modules():
        if next(module.children(), None) is None and any(True for _ in module.parameters(recurse=False)):
            return name, module
    return "", None


def first_layer_reason(model: nn.Module) -> str | None:
    """Why the analytic first-layer recovery does not apply to `model`, or None."""
    name, module = first_linear(model)
    if module is None:
        return "the model has no parameters"
    if not isinstance(module, nn.Linear):
        return (
            f"needs a model whose first layer is fully connected (nn.Linear); "
            f"its first layer '{name}' is {type(module).__name__}"
        )
    if module.bias is None:
        return f"needs a bias in the first fully connected layer '{name}' (x = dL/dW_i / dL/db_i)"
    return None


def trap_weights(
    rows: int,
    cols: int,
    mu: float,
    sigma: float,
    scale: float,
    sign: str,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Algorithm 3 of spec 004 (Boenisch et al. trap weights): a [rows, cols] weight matrix.

    Per row: a uniformly random half N of the inputs gets z_-, the rest P gets z_+ = s * z_-, each
    shuffled. sign='boenisch': z_- = -|N(mu, sigma)| (negative half) and z_+ = s * |z_-| (positive,
    magnitudes scaled by s); sign='literal': z_- ~ N(mu, sigma) signed and z_+ = s * z_- (the
    pseudocode as printed). With an odd input size P has one more entry than N: ceil(n/2) values are
    drawn and N uses the first floor(n/2) of them.
    """
    half = cols // 2
    rest = cols - half
    perm = torch.argsort(torch.rand(rows, cols, generator=generator, dtype=torch.float64), dim=1)
    z = mu + sigma * torch.randn(rows, rest, generator=generator, dtype=torch.float64)
    if sign == "boenisch":
        z_minus, z_plus = -z.abs(), scale * z.abs()
    elif sign == "literal":
        z_minus, z_plus = z, scale * z
    else:
        raise ValueError(f"trap sign must be 'boenisch' or 'literal', got {sign!r}")
    # each row of z_plus is shuffled independently of z_minus's order (the two Shuffle calls)
    shuffle = torch.argsort(torch.rand(rows, rest, generator=generator, dtype=torch.float64), dim=1)
    z_plus = torch.gather(z_plus, 1, shuffle)
    w = torch.empty(rows, cols, dtype=torch.float64)
    w.scatter_(1, perm[:, :half], z_minus[:, :half])
    w.scatter_(1, perm[:, half:], z_plus)
    return w.to(dtype)


def fc_keys(state: dict[str, torch.Tensor], layer: str, attack: str) -> tuple[str, str]:
    """The weight and bias keys of the first FC layer `layer` in a broadcast state, checked."""
    wkey, bkey = f"{layer}.weight", f"{layer}.bias"
    if wkey not in state or bkey not in state:
        raise KeyError(f"{attack}: the broadcast state has no '{wkey}'/'{bkey}' (first FC layer)")
    if state[wkey].dim() != 2:
        raise ValueError(f"{attack}: '{wkey}' must be a 2-d weight, got shape {tuple(state[wkey].shape)}")
    return wkey, bkey


def fold_normalisation(
    weight: torch.Tensor, bias: torch.Tensor, meta: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """(W, B) built for [0,1] pixels -> the same layer on normalised inputs x_n = (x - mean) / std.

    W x + B = (W * std) x_n + (B + W mean), per channel; identity when `meta` has no normalisation.
    The trap and SDAN constructions assume non-negative inputs (the paper feeds raw pixels).
    """
    if meta is None or not meta.mean:
        return weight, bias
    shape = tuple(meta.input_shape)
    per = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    mean_vec = torch.tensor(meta.mean, dtype=weight.dtype).repeat_interleave(per)
    std_vec = torch.tensor(meta.std, dtype=weight.dtype).repeat_interleave(per)
    return weight * std_vec[None, :], bias + weight @ mean_vec


def deliver(
    state: dict[str, torch.Tensor],
    keys: tuple[str, str],
    malicious: tuple[torch.Tensor, torch.Tensor],
    delivery: str,
    tau: float,
) -> dict[str, torch.Tensor]:
    """Put the malicious fc1 (W*, B*) into the broadcast `state` (spec 004 §1, Eq. 8-9).

    delivery='gradient': the server sends g* = (theta - theta*) / tau in place of fc1's averaged
    gradient and the client applies theta - tau * g* in the model's dtype (= theta* up to rounding);
    delivery='replace': the weights are set directly (a weight-broadcast server).
    """
    if delivery not in ("gradient", "replace"):
        raise ValueError(f"delivery must be 'gradient' or 'replace', got {delivery!r}")
    for key, value in zip(keys, malicious, strict=True):
        theta = state[key]
        star = value.to(dtype=theta.dtype, device=theta.device)
        if delivery == "gradient":
            crafted = (theta - star) / tau  # what the server broadcasts
            star = theta - tau * crafted  # what the honest client computes from it
        state[key] = star
    return state


def poison_state(
    state: dict[str, torch.Tensor], params: Any, meta: Any, round: int
) -> dict[str, torch.Tensor]:
    """Trap weights (Algorithm 3) and a zero bias for `params.layer`, delivered into the broadcast `state`."""
    from fedbench.fl.seeding import torch_generator

    keys = fc_keys(state, params.layer, "trap-weights")
    w = state[keys[0]]
    gen = torch_generator(params.seed, "trap-weights", round)
    trap = trap_weights(w.shape[0], w.shape[1], params.mu, params.sigma, params.scale, params.sign, gen)
    bias = torch.zeros(w.shape[0], dtype=trap.dtype)
    if params.pixel_space:
        trap, bias = fold_normalisation(trap, bias, meta)
    return deliver(state, keys, (trap, bias), params.delivery, params.tau)


def candidates(
    shared: dict[str, torch.Tensor], layer: str, rel_tol: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Analytic recovery x_t = (dL/dW_t) / (dL/db_t) for every neuron t with |dL/db_t| > rel_tol*max.

    Works on a gradient or a weight delta (a constant factor -lr cancels). Returns the candidates
    [M, n] (float64), the neuron indices [M] and the bias gradient [l].
    """
    wkey, bkey = f"{layer}.weight", f"{layer}.bias"
    if wkey not in shared or bkey not in shared:
        raise KeyError(f"the observation has no '{wkey}'/'{bkey}' (first FC layer)")
    gw = shared[wkey].detach().to("cpu", torch.float64)
    gb = shared[bkey].detach().to("cpu", torch.float64).reshape(-1)
    if gw.dim() != 2 or gw.shape[0] != gb.shape[0]:
        raise ValueError(f"'{wkey}' {tuple(gw.shape)} and '{bkey}' {tuple(gb.shape)} do not match")
    peak = float(gb.abs().max()) if gb.numel() else 0.0
    idx = torch.nonzero(gb.abs() > rel_tol * peak, as_tuple=False).reshape(-1) if peak > 0 else gb[:0].long()
    return gw[idx] / gb[idx, None], idx, gb


def dedupe(images: np.ndarray, tol_mse: float) -> np.ndarray:
    """Indices of `images` [M, d] kept after dropping later images within `tol_mse` MSE of a kept one."""
    m = images.shape[0]
    if m == 0 or tol_mse <= 0:
        return np.arange(m)
    flat = images.reshape(m, -1).astype(np.float64)
    sq = (flat**2).sum(1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * flat @ flat.T, 0.0) / flat.shape[1]
    keep: list[int] = []
    dropped = np.zeros(m, dtype=bool)
    for i in range(m):
        if dropped[i]:
            continue
        keep.append(i)
        dropped |= d2[i] <= tol_mse
    return np.asarray(keep, dtype=np.int64)


def recover(attack: Any, observation: Any, model: nn.Module, meta: Any) -> Any:
    """The shared `run` of the FC attacks: candidates -> pixel space -> filter/dedupe -> AttackOutput."""
    from fedbench.errors import FedbenchError
    from fedbench.plugin import AttackOutput

    reason = first_layer_reason(model)
    if reason:
        raise FedbenchError(f"{attack.name}: {reason}")
    layer, _ = first_linear(model)
    p = attack.params
    cand, idx, gb = candidates(observation.shared, layer, p.bias_tol)
    shape = tuple(meta.input_shape)
    n = int(np.prod(shape))
    if cand.shape[1] != n:
        raise FedbenchError(
            f"{attack.name}: first layer '{layer}' has {cand.shape[1]} inputs, the data {shape} has {n}"
        )
    x = cand.reshape(-1, *shape)
    if meta.mean:
        view = (1, -1) + (1,) * (x.dim() - 2)
        x = x * torch.tensor(meta.std, dtype=x.dtype).view(view) + torch.tensor(
            meta.mean, dtype=x.dtype
        ).view(view)
    pix = x.numpy()
    flat = pix.reshape(len(pix), n)  # n, not -1: no neuron fired (a dead crafted layer) is 0 candidates
    finite = np.isfinite(flat).all(1)
    in_range = finite & (flat.min(1, initial=0.0) >= -p.range_tol)
    in_range &= flat.max(1, initial=1.0) <= 1 + p.range_tol
    keep = np.nonzero(in_range if p.selection == "in-range" and in_range.any() else finite)[0]
    pix = np.clip(pix[keep], 0.0, 1.0)
    order = np.argsort(-np.abs(gb[idx].numpy()[keep]), kind="stable")  # strongest neurons first
    pix, keep = pix[order], keep[order]
    uniq = dedupe(pix, p.dedupe_mse)
    pix, keep = pix[uniq], keep[uniq]
    if p.max_candidates and len(pix) > p.max_candidates:
        pix, keep = pix[: p.max_candidates], keep[: p.max_candidates]
    return AttackOutput(
        images=pix.astype(np.float32),
        extra={
            "fc_layer": layer,
            "fc_width": int(gb.numel()),
            "active_neurons": int(idx.numel()),
            "in_range_candidates": int(in_range.sum()),
            "candidates": int(len(pix)),
            "candidate_neurons": [int(i) for i in idx.numpy()[keep]],
        },
    )
