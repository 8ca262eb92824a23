"""Torch core of RecUP-FL (spec 000 §4.5-4.6): the defender zoo and the FGSM perturbations.

The zoo of one sensitive attribute at one round: `size` defender MLPs (3 hidden ReLU layers, widths
from `zoo_widths`, member #0 being the architecture the `stru-nn` adversary uses), each preceded by
the shared `FeatureMap` (max-pool + standardisation), trained with CE + SGD on the updates of the
defender's labelled pool at the round's global weights. Training is the expensive part, so a zoo is
built once per (global weights, attribute, settings): memoised in process and cached on disk beside
the runs through `fedbench.plugin.artifact` (the utility run and every attack run of a configuration
replay the same rounds and share it).

Perturbations act on the flat update of the selected layers, with the gradient of the defender's
CE loss with respect to that update, taken through the max-pool (so only arg-max coordinates move).
`sign(0) = 0` leaves coordinates without gradient untouched.

Two paths compute them (issue 29): `perturb`, one update at a time (one forward and backward per FGSM
step: 50 of them per update at P = 10, Q = 5), and `perturb_batch`, many updates at once. The batch
draws every update's zoo members first (`draw_members`: from the update's own generator, in the order
`perturb` draws them), then takes each FGSM step of all updates together, with one batched backward
per zoo member over the updates that step uses it. The updates are independent rows (the zoo members
are MLPs in eval mode after a row-wise feature map), so the batch computes the same gradients; only
the float rounding of a batched matrix product differs from a one-row one. It decides a step where it
meets a quantity within rounding of zero: a gradient coordinate (its sign flips), a hidden ReLU
pre-activation at the kink (the unit's gradient path opens or closes), or a saturated loss; that
update's later steps then differ too. Measured on the attribute board's case: 2 of 100 updates of a
round, 0 of 440 others (`docs/benchmarks.md`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fedbench.attacks._attribute_core import (
    ZOO_SEED,
    FeatureMap,
    UpdateLayout,
    mlp,
    train_classifier,
    zoo_widths,
)
from fedbench.fl.seeding import derive_seed

_MEMO: OrderedDict[str, list[nn.Module]] = OrderedDict()
_MEMO_SIZE = 8


@dataclass(frozen=True)
class ZooSpec:
    """Everything a zoo depends on besides the pool updates' inputs (part of its cache key)."""

    size: int
    widths: tuple[int, ...]
    epochs: int
    lr: float
    batch: int
    n_classes: int


def build_zoo(
    flat: torch.Tensor, labels: torch.Tensor, layout: UpdateLayout, window: int, spec: ZooSpec, attr: str
) -> list[nn.Module]:
    """Train the zoo on pool updates `flat` [N, D] with attribute `labels` [N].

    Each member is initialised from the global CPU generator seeded for it; the FL run's own global
    generator is restored afterwards (`fork_rng`), so where in a round the zoo is built (the first
    client's `update`, or after the round's clients trained, for `update_batch`), or whether it came
    from the cache, changes no draw of the run.
    """
    fmap = FeatureMap(layout, window).to(flat.device).fit(flat)
    with torch.no_grad():
        feats = fmap(flat)
    zoo = []
    with torch.random.fork_rng():  # torch.manual_seed seeds every device: restore them all
        for i, widths in enumerate(zoo_widths(spec.size, spec.widths, ZOO_SEED)):
            seed = derive_seed(ZOO_SEED, f"recup-zoo-{attr}", i) % (2**31)
            torch.manual_seed(seed)
            net = mlp(fmap.dim, widths, spec.n_classes).to(flat.device)
            train_classifier(net, feats, labels, spec.epochs, spec.lr, spec.batch, seed)
            member = nn.Sequential(FeatureMap(layout, window), net).to(flat.device)
            member[0].load_state_dict(fmap.state_dict())
            zoo.append(member.eval().requires_grad_(False))
    return zoo


def cached_zoo(key: dict, compute) -> list[nn.Module]:
    """The zoo for `key` (a JSON-able dict): in-process memo, then the on-disk artifact cache."""
    from fedbench.plugin import artifact

    text = json.dumps(key, sort_keys=True)
    if text in _MEMO:
        _MEMO.move_to_end(text)
        return _MEMO[text]
    zoo = artifact("recup-zoo", text, compute)
    _MEMO[text] = zoo
    while len(_MEMO) > _MEMO_SIZE:
        _MEMO.popitem(last=False)
    return zoo


def clear_memo() -> None:
    _MEMO.clear()


# ---------------------------------------------------------------------------------------- perturbation


def loss_grad(model: nn.Module, x: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """d CE(model(x), label) / dx for one flat update x [D]."""
    xi = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        loss = nn.functional.cross_entropy(model(xi.unsqueeze(0)), label.view(1))
        (g,) = torch.autograd.grad(loss, xi)
    return g


def _sample(zoo_size: int, q: int, generator: torch.Generator) -> list[int]:
    """q zoo members without replacement (a different composition each call)."""
    return torch.randperm(zoo_size, generator=generator)[: min(q, zoo_size)].tolist()


def perturb(
    g: torch.Tensor,
    label: int,
    zoo: Sequence[nn.Module],
    eps: float,
    p: int,
    q: int,
    variant: str,
    generator: torch.Generator,
    mu: float = 0.9,
    meta_start: str = "current",
) -> torch.Tensor:
    """The perturbed update of one attribute (spec §4.5 `recup_single`, §4.6 variants).

    meta: P times, sample Q models; iterative FGSM (step eps/Q) on Q-1 of them from the current
    output (or the original update, meta_start=original), then one FGSM step of size eps on the
    held-out one; only that meta-test step is added, so ||result - g||_inf <= P * eps.
    one-step / average / iterative / momentum: the single-shot ablations of App. E (Eqs. 10-14), on
    Q sampled models, each with ||result - g||_inf <= eps.
    """
    a = torch.tensor(label, device=g.device)
    if variant == "meta":
        out = g.clone()
        for _ in range(p):
            chosen = _sample(len(zoo), q, generator)
            x = (out if meta_start == "current" else g).clone()
            for idx in chosen[:-1]:  # meta-train: simulated white-box attacks
                x = x + (eps / len(chosen)) * torch.sign(loss_grad(zoo[idx], x, a))
            out = out + eps * torch.sign(loss_grad(zoo[chosen[-1]], x, a))  # meta-test step only
        return out
    chosen = _sample(len(zoo), q, generator)
    if variant == "one-step":
        return g + eps * torch.sign(loss_grad(zoo[chosen[0]], g, a))
    if variant == "average":
        return g + sum(eps * torch.sign(loss_grad(zoo[i], g, a)) for i in chosen) / len(chosen)
    x, u = g.clone(), torch.zeros_like(g)
    for i in chosen:
        grad = loss_grad(zoo[i], x, a)
        if variant == "momentum":
            u = mu * u + grad / grad.abs().sum().clamp_min(1e-30)
            grad = u
        x = x + (eps / len(chosen)) * torch.sign(grad)
    return x


# ------------------------------------------------------------------------------ batched perturbation


def draw_members(zoo_size: int, q: int, p: int, variant: str, generator: torch.Generator) -> list[list[int]]:
    """The zoo members one update's perturbation uses: P draws for meta, one for the single-shot
    variants, each of min(Q, zoo) members, taken from `generator` in the order `perturb` takes them."""
    return [_sample(zoo_size, q, generator) for _ in range(p if variant == "meta" else 1)]


def loss_grads(model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """d CE(model(x_i), label_i) / dx_i for each row of x [N, D]: one forward and backward.

    The rows are independent (eval mode, a row-wise feature map), so the gradient of the summed loss
    with respect to row i is that of row i's own loss, as `loss_grad` computes it alone.
    """
    xi = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        loss = nn.functional.cross_entropy(model(xi), labels, reduction="sum")
        (g,) = torch.autograd.grad(loss, xi)
    return g


def _step_grads(zoo: Sequence[nn.Module], members: torch.Tensor, x: torch.Tensor, labels: torch.Tensor):
    """Row i's loss gradient under zoo member `members[i]`: one batched backward per member used."""
    out = torch.empty_like(x)
    for m in members.unique().tolist():
        rows = (members == m).nonzero().squeeze(1)
        out[rows] = loss_grads(zoo[m], x[rows], labels[rows])
    return out


def perturb_batch(
    g: torch.Tensor,
    labels: torch.Tensor,
    zoo: Sequence[nn.Module],
    eps: float,
    members: Sequence[Sequence[Sequence[int]]],
    variant: str,
    mu: float = 0.9,
    meta_start: str = "current",
) -> torch.Tensor:
    """`perturb` of each row of g [N, D] (labels [N]) with its drawn zoo members (`draw_members`).

    The FGSM arithmetic is `perturb`'s, row by row (element-wise operations give the same floats in a
    batch); only the gradients come from batched products (see the module docstring).
    """
    if len(g) == 0:
        return g.clone()
    picks = torch.tensor([[list(draw) for draw in m] for m in members], dtype=torch.long)  # [N, draws, k]
    k = picks.shape[2]

    def grads(step: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return _step_grads(zoo, step, x, labels)

    if variant == "meta":
        out = g.clone()
        for r in range(picks.shape[1]):
            x = (out if meta_start == "current" else g).clone()
            for j in range(k - 1):  # meta-train: simulated white-box attacks
                x = x + (eps / k) * torch.sign(grads(picks[:, r, j], x))
            out = out + eps * torch.sign(grads(picks[:, r, k - 1], x))  # meta-test step only
        return out
    chosen = picks[:, 0]
    if variant == "one-step":
        return g + eps * torch.sign(grads(chosen[:, 0], g))
    if variant == "average":
        return g + sum(eps * torch.sign(grads(chosen[:, j], g)) for j in range(k)) / k
    x, u = g.clone(), torch.zeros_like(g)
    for j in range(k):
        grad = grads(chosen[:, j], x)
        if variant == "momentum":
            u = mu * u + grad / grad.abs().sum(dim=1, keepdim=True).clamp_min(1e-30)
            grad = u
        x = x + (eps / k) * torch.sign(grad)
    return x
