"""Torch core of `robbing-the-fed`: the imprint block's parameters and the recovery per bin.

Imported lazily by `fedbench.attacks.rtf` when an attack runs, so listing plugins never imports torch.
"""

from __future__ import annotations

import dataclasses
import functools
from statistics import NormalDist
from typing import Any

import torch
from torch import nn

# the block's layers in the `imprint` model's state (fedbench.models.imprint)
IMPRINT, DECODE = "imprint", "decode"
FLOOR_SPREADS = 10.0  # c_0 = mean - 10 spreads: every input fires bin 0 (breaching's -10 on N(0, 1))


def imprint_reason(model: nn.Module) -> str | None:
    """Why `model` has no imprint block the attack can set and read, or None."""
    imprint, decode = getattr(model, IMPRINT, None), getattr(model, DECODE, None)
    if not isinstance(imprint, nn.Linear) or not isinstance(decode, nn.Linear):
        return (
            "needs the imprint block in front of the model (Robbing the Fed's server changes the "
            "architecture): run it on model 'imprint[base=...]'"
        )
    if imprint.bias is None:
        return "needs a bias in the imprint layer (the bins' thresholds)"
    if decode.in_features != imprint.out_features:
        return (
            f"the decode layer reads {decode.in_features} features, the imprint layer has "
            f"{imprint.out_features} bins"
        )
    return None


@functools.lru_cache(maxsize=16)
def measurement(
    dataset: str, aux: int, seed: int, kind: str, quantiles: str, n: int, bins: int
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(w [n], thresholds c [bins] ascending, spread) in [0, 1] pixel space, from the aux data.

    h(x) = <w, x>: w = 1/n (mean brightness) or a Gaussian direction of unit norm. The thresholds
    are the measurement's i/bins quantiles (i = 1..bins-1) of a normal fitted to h on the aux data, or
    of the aux data's own h, with c_0 = mean - 10 spreads. Memoised: every round's broadcast of a run,
    and every run of a grid over B or seeds, reads the same block.
    """
    from fedbench.attacks._sdan_core import aux_inputs
    from fedbench.errors import FedbenchError
    from fedbench.fl.seeding import torch_generator

    x, _ = aux_inputs(dataset, aux, seed, True)
    x = x.to(torch.float64)
    if x.shape[1] != n:
        raise FedbenchError(
            f"robbing-the-fed: aux dataset '{dataset}' has {x.shape[1]} inputs, the imprint layer {n}; "
            "set the attack's dataset param to the run's dataset"
        )
    if kind == "brightness":
        w = torch.full((n,), 1.0 / n, dtype=torch.float64)
    elif kind == "gaussian":
        w = torch.randn(n, generator=torch_generator(seed, "robbing-the-fed"), dtype=torch.float64)
        w = w / w.norm()
    else:
        raise ValueError(f"measurement must be 'brightness' or 'gaussian', got {kind!r}")
    h = x @ w
    mu, spread = float(h.mean()), float(h.std())
    if not spread > 0:
        raise FedbenchError(f"robbing-the-fed: the measurement is constant on the aux data of '{dataset}'")
    levels = [i / bins for i in range(1, bins)]
    if quantiles == "gaussian":
        normal = NormalDist(mu, spread)
        inner = torch.tensor([normal.inv_cdf(q) for q in levels], dtype=torch.float64)
    elif quantiles == "data":
        inner = torch.quantile(h, torch.tensor(levels, dtype=torch.float64))
    else:
        raise ValueError(f"quantiles must be 'gaussian' or 'data', got {quantiles!r}")
    floor = torch.tensor([min(mu, float(h.min())) - FLOOR_SPREADS * spread], dtype=torch.float64)
    return w, torch.cat([floor, inner]), spread


def block_parameters(
    n: int, bins: int, params: Any, meta: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(imprint W [bins, n], imprint b [bins], decode W [n, bins], decode b [n]) on the model's inputs.

    Built in pixel space in units of the measurement's spread, then folded into the dataset's
    normalisation (the rows stay identical, so the bins' order is the order of their biases).
    """
    from fedbench.attacks._fc_recovery import fold_normalisation
    from fedbench.errors import FedbenchError

    if params.dataset == "same" and meta is None:
        raise FedbenchError(
            "robbing-the-fed: dataset=same needs the run's dataset; name one with dataset=..."
        )
    source = meta.name if params.dataset == "same" else params.dataset
    w, c, spread = measurement(source, params.aux, params.seed, params.measurement, params.quantiles, n, bins)
    weight = (w / spread).repeat(bins, 1)
    bias = -c / spread
    weight, bias = fold_normalisation(weight, bias, meta)
    decode_w = torch.full((n, bins), 1.0 / bins, dtype=torch.float64)
    return weight, bias, decode_w, torch.zeros(n, dtype=torch.float64)


def imprint_state(state: dict[str, torch.Tensor], params: Any, meta: Any) -> dict[str, torch.Tensor]:
    """Set the imprint block's parameters in the broadcast `state` (the server ships them as weights)."""
    from fedbench.errors import FedbenchError

    keys = [f"{layer}.{kind}" for layer in (IMPRINT, DECODE) for kind in ("weight", "bias")]
    missing = [k for k in keys if k not in state]
    if missing:
        raise FedbenchError(
            f"robbing-the-fed: the broadcast state has no {', '.join(missing)} (imprint block)"
        )
    bins, n = state[keys[0]].shape
    values = block_parameters(n, bins, params, meta)
    for key, value in zip(keys, values, strict=True):
        old = state[key]
        if tuple(old.shape) != tuple(value.shape):
            raise FedbenchError(
                f"robbing-the-fed: '{key}' has shape {tuple(old.shape)}, expected {tuple(value.shape)}"
            )
        state[key] = value.to(dtype=old.dtype, device=old.device)
    return state


def bin_differences(
    gw: torch.Tensor, gb: torch.Tensor, sent_bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per bin, the gradient of the inputs inside it: consecutive differences of the cumulative bins.

    Bins are ordered by their thresholds, c_i = -bias_i (the rows are identical): bin i's gradient
    minus that of the next higher threshold, the highest bin as is. Rows keep their indices.
    """
    gw = gw.detach().to("cpu", torch.float64)
    gb = gb.detach().to("cpu", torch.float64).reshape(-1)
    if sent_bias is None:
        order = torch.arange(gb.numel())
    else:
        order = torch.argsort(-sent_bias.detach().to("cpu", torch.float64).reshape(-1), stable=True)
    sw, sb = gw[order], gb[order]
    dw, db = sw.clone(), sb.clone()
    dw[:-1] -= sw[1:]
    db[:-1] -= sb[1:]
    out_w, out_b = torch.empty_like(dw), torch.empty_like(db)
    out_w[order], out_b[order] = dw, db
    return out_w, out_b


def recover_bins(attack: Any, observation: Any, model: nn.Module, meta: Any) -> Any:
    """The attack's `run`: difference the cumulative bins, then the first-FC-layer recovery on them."""
    from fedbench.attacks._fc_recovery import recover
    from fedbench.errors import FedbenchError

    reason = imprint_reason(model)
    if reason:
        raise FedbenchError(f"{attack.name}: {reason}")
    wkey, bkey = f"{IMPRINT}.weight", f"{IMPRINT}.bias"
    if wkey not in observation.shared or bkey not in observation.shared:
        raise FedbenchError(f"{attack.name}: the observation has no '{wkey}'/'{bkey}' (imprint block)")
    sent = observation.global_state.get(bkey) if observation.global_state else None
    dw, db = bin_differences(observation.shared[wkey], observation.shared[bkey], sent)
    out = recover(attack, dataclasses.replace(observation, shared={wkey: dw, bkey: db}), model, meta)
    out.extra["bins"] = int(db.numel())
    out.extra["bins_hit"] = out.extra["active_neurons"]  # bins whose difference has a nonzero bias part
    return out
