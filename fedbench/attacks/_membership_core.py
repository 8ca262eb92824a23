"""Torch core of the membership-inference attacks (`fedbench.attacks.membership`).

One evaluation design for every membership attack, so their rows compare:
1. Members: the victim client's training examples (or every client's, `members=all`; never the
   server's reserved records, which no client trains on).
   Non-members: examples no client trained on, from the held-out test split (`source=test`) or the
   training examples beyond scenario.train_size (`source=unused-train`). With
   `nonmembers=class-matched` (spec 003 §2.2 default) each class contributes as many non-members as
   members, so a 2-class client's membership cannot be read off its label shift; `uniform` draws
   them at random. Members and non-members are then cut to the same count: the base rate is 50%.
2. The member/non-member pairs are split in halves by one seeded shuffle (so each half is
   class-matched too): the first halves train (mia-direct) or calibrate (mia-loss) the attack, the
   second halves, balanced 1:1, are the evaluated set.
   mia-shadow trains on its own data instead and is scored on the same evaluated set.
The attack model is `MembershipNet` on (softmax(F(x)), one-hot y), trained with BCE and Adam.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedbench.errors import FedbenchError
from fedbench.models._membership_net import MembershipNet
from fedbench.plugin import AttackOutput, Observation, RunData


@dataclass(frozen=True)
class MembershipSplit:
    """Attack-side (train/calibration) and evaluated member/non-member sets, balanced 1:1."""

    x_in: torch.Tensor
    y_in: torch.Tensor
    x_out: torch.Tensor
    y_out: torch.Tensor
    x_eval: torch.Tensor
    y_eval: torch.Tensor
    is_member: np.ndarray


def numpy_rng(generator: torch.Generator) -> np.random.Generator:
    """A numpy RNG drawn from the attack's seeded torch generator."""
    return np.random.default_rng(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))


def _nonmember_pool(data: RunData, source: str) -> tuple[torch.Tensor, torch.Tensor]:
    b = data.bundle
    if source == "test":
        return b.x_test, b.y_test
    idx = torch.as_tensor(list(data.unused_train()), dtype=torch.long)
    return b.x_train[idx], b.y_train[idx]


def _member_indices(data: RunData, members: str, victim: int) -> np.ndarray:
    if members == "all":
        # exactly the records some client trained on: the server's reserved records (FRL's auxiliary
        # set) are part of the training prefix but no client's data, so they are not members
        return np.unique(np.concatenate([np.asarray(ix, dtype=np.int64) for ix in data.client_indices]))
    if victim < 0 or victim >= len(data.client_indices):
        raise FedbenchError(f"membership attack: victim client {victim} does not exist")
    return np.asarray(data.client_indices[victim], dtype=np.int64)


def _matched(
    y_mem: np.ndarray, y_pool: np.ndarray, matching: str, cap: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the members and pool non-members kept, the same number of each."""
    if matching == "uniform":
        n = min(len(y_mem), len(y_pool), cap or len(y_mem))
        return rng.permutation(len(y_mem))[:n], rng.permutation(len(y_pool))[:n]
    keep_m, keep_n = [], []
    for c in np.unique(y_mem):
        mem_c = np.nonzero(y_mem == c)[0]
        pool_c = np.nonzero(y_pool == c)[0]
        k = min(len(mem_c), len(pool_c))
        keep_m.append(rng.permutation(mem_c)[:k])
        keep_n.append(rng.permutation(pool_c)[:k])
    m, n = np.concatenate(keep_m), np.concatenate(keep_n)
    if cap and len(m) > cap:  # drop pairs, keeping the per-class match
        pick = rng.permutation(len(m))[:cap]
        m, n = m[pick], n[pick]
    return m, n


def membership_split(
    data: RunData, victim: int, members: str, source: str, matching: str, cap: int, rng: np.random.Generator
) -> tuple[MembershipSplit, np.ndarray]:
    """The balanced design of the module docstring; also returns the unused pool positions (for shadows)."""
    b = data.bundle
    mem_idx = _member_indices(data, members, victim)
    x_pool, y_pool = _nonmember_pool(data, source)
    m_pos, n_pos = _matched(b.y_train[mem_idx].numpy(), y_pool.numpy(), matching, cap, rng)
    if len(m_pos) < 4:
        raise FedbenchError(
            f"membership attack: only {len(m_pos)} member/non-member pairs (members={members}, "
            f"source={source}, nonmembers={matching}); use members=all, nonmembers=uniform or more data"
        )
    # one permutation of the (member, non-member) pairs, not one per side: with class-matched pairs
    # each half then keeps the per-class match. Independent shuffles leave a class with more members
    # in the attack half and, the totals being equal, more non-members in the evaluated half, which a
    # label-only attack turns into an accuracy below 50% on a model that leaks nothing else.
    order = rng.permutation(len(m_pos))
    m_pos, n_pos = m_pos[order], n_pos[order]
    half = len(m_pos) // 2
    x_mem, y_mem = b.x_train[mem_idx[m_pos]], b.y_train[mem_idx[m_pos]]
    x_non, y_non = x_pool[n_pos], y_pool[n_pos]
    rest = len(m_pos) - half
    split = MembershipSplit(
        x_in=x_mem[:half],
        y_in=y_mem[:half],
        x_out=x_non[:half],
        y_out=y_non[:half],
        x_eval=torch.cat([x_mem[half:], x_non[half:]]),
        y_eval=torch.cat([y_mem[half:], y_non[half:]]),
        is_member=np.concatenate([np.ones(rest, dtype=np.int8), np.zeros(rest, dtype=np.int8)]),
    )
    unused = np.setdiff1d(np.arange(len(y_pool)), n_pos)
    return split, unused


def target_model(obs: Observation, model: nn.Module, device: torch.device) -> nn.Module:
    """The queried model: the final global state, in eval mode (black-box access to predictions)."""
    model.load_state_dict(obs.global_state)
    return model.to(device).eval()


@torch.no_grad()
def probabilities(model: nn.Module, x: torch.Tensor, device: torch.device, batch: int = 512) -> torch.Tensor:
    """softmax(F(x)) in batches, on the CPU."""
    model.eval()
    out = [torch.softmax(model(x[i : i + batch].to(device)), dim=1).cpu() for i in range(0, len(x), batch)]
    return torch.cat(out) if out else torch.zeros(0)


def train_membership_net(
    probs_in: torch.Tensor,
    y_in: torch.Tensor,
    probs_out: torch.Tensor,
    y_out: torch.Tensor,
    num_classes: int,
    arch: str,
    epochs: int,
    lr: float,
    batch: int,
    generator: torch.Generator,
) -> MembershipNet:
    """The attack model: MembershipNet trained with BCE (members 1, non-members 0) and Adam."""
    with torch.random.fork_rng():
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
        net = MembershipNet(num_classes, arch)  # type: ignore[arg-type]
    probs = torch.cat([probs_in, probs_out])
    ys = torch.cat([y_in, y_out])
    target = torch.cat([torch.ones(len(y_in)), torch.zeros(len(y_out))])
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    loss_fn = nn.BCEWithLogitsLoss()
    net.train()
    for _ in range(epochs):
        order = torch.randperm(len(target), generator=generator)
        for i in range(0, len(order), batch):
            idx = order[i : i + batch]
            opt.zero_grad()
            loss_fn(net(probs[idx], ys[idx]), target[idx]).backward()
            opt.step()
    return net.eval()


def net_output(net: MembershipNet, probs: torch.Tensor, y: torch.Tensor) -> AttackOutput:
    """Scores (membership logits) and decisions (logit > 0, i.e. probability > 1/2)."""
    with torch.no_grad():
        logits = net(probs, y).double().numpy()
    return AttackOutput(scores=logits, predictions=(logits > 0).astype(np.int8))


def loss_scores(probs: torch.Tensor, y: torch.Tensor, score: str) -> np.ndarray:
    """Higher = member: minus the cross-entropy loss, or the top confidence."""
    if score == "loss":
        p_true = probs.gather(1, y.view(-1, 1)).squeeze(1).double().clamp_min(1e-30)
        return torch.log(p_true).numpy()
    return probs.max(dim=1).values.double().numpy()


def best_threshold(members: np.ndarray, nonmembers: np.ndarray) -> float:
    """The score threshold maximising accuracy on a calibration set (midpoint between neighbours)."""
    values = np.concatenate([members, nonmembers])
    truth = np.concatenate([np.ones(len(members), bool), np.zeros(len(nonmembers), bool)])
    order = np.argsort(values, kind="stable")
    v, t = values[order], truth[order]
    # predicting "member" for scores > v[i]: correct = non-members at or below + members above
    correct = np.cumsum(~t) + (t.sum() - np.cumsum(t))
    candidates = np.concatenate([[t.sum()], correct])  # index 0: everything is a member
    best = int(np.argmax(candidates))
    if best == 0:
        return float(v[0] - 1.0)
    i = best - 1
    return float((v[i] + v[i + 1]) / 2) if i + 1 < len(v) else float(v[i])


def fresh_copy(model: nn.Module, seed: int) -> nn.Module:
    """A re-initialised copy of `model` (a shadow model of the same architecture)."""
    shadow = copy.deepcopy(model)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for module in shadow.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    return shadow


def train_shadow(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    lr: float,
    batch: int,
    device: torch.device,
    generator: torch.Generator,
) -> nn.Module:
    """Centralised SGD of a shadow model on its 'in' data (Shokri et al.'s shadow training)."""
    model.to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        for i in range(0, len(order), batch):
            idx = order[i : i + batch]
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx].to(device)), y[idx].to(device)).backward()
            opt.step()
    return model.eval()


def shadow_data(
    data: RunData, source: str, unused_pool: np.ndarray, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attacker's own data: training examples no client holds, else pool examples not evaluated."""
    b = data.bundle
    unused_train = np.asarray(list(data.unused_train()), dtype=np.int64)
    if source == "test" and len(unused_train):
        idx = torch.as_tensor(rng.permutation(unused_train))
        return b.x_train[idx], b.y_train[idx]
    x_pool, y_pool = _nonmember_pool(data, source)
    idx = torch.as_tensor(rng.permutation(unused_pool))
    return x_pool[idx], y_pool[idx]
