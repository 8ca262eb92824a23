"""Torch core of the attacker's reference models (`fedbench.attacks._references` says what and why):
which data each reference trains on, its training (an FL run of the target's protocol, or central SGD)
through the artifact store, and the per-example statistics of the queried examples under each.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedbench.attacks import _membership_core as core
from fedbench.errors import FedbenchError, RunFailure
from fedbench.plugin import DatasetBundle, RunData, artifact
from fedbench.spec.run import canonical_json

if TYPE_CHECKING:
    from torch import nn

    from fedbench.attacks._references import ReferenceParams
    from fedbench.plugin import Defense

ARTIFACT_KIND = "membership-reference"
MAX_ATTEMPTS = 3  # draws of an FL reference before a diverging protocol fails the attack
REFERENCE_TEST = 500  # test examples a reference FL run evaluates on (its accuracy is reported, not used)


@dataclass(frozen=True)
class ReferenceSet:
    """K trained references: their state dicts, which queried candidates each trained on, and facts."""

    states: tuple[dict[str, torch.Tensor], ...]
    is_in: np.ndarray  # (K, n_candidates) bool: candidate i was in reference k's training set
    facts: dict[str, Any]  # JSON-able: mode, K, size, rounds and clients of an FL reference, seconds


def target_train_size(data: RunData) -> int:
    """How many examples the target was trained on: every client's examples."""
    return int(sum(len(ix) for ix in data.client_indices))


def own_data(
    data: RunData, source: str, unused: np.ndarray, skip: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attacker's own data, in a fixed order: training examples no client holds; without any
    (`source=unused-train`, or no spare training data), the non-member pool's examples that are not
    queried, less their first `skip` (the population set RMIA compares with, `population`)."""
    b = data.bundle
    spare = np.asarray(list(data.unused_train()), dtype=np.int64)
    if source == "test" and len(spare):
        idx = torch.as_tensor(spare)
        return b.x_train[idx], b.y_train[idx]
    x_pool, y_pool = core._nonmember_pool(data, source)
    idx = torch.as_tensor(np.sort(unused)[skip:])
    return x_pool[idx], y_pool[idx]


def population(
    data: RunData, source: str, unused: np.ndarray, count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMIA's population samples z: non-member pool examples that are not queried (none is a member of
    the target, none trains a reference: `own_data` skips them where it draws from the same pool)."""
    x_pool, y_pool = core._nonmember_pool(data, source)
    idx = np.sort(unused)
    idx = torch.as_tensor(idx[:count] if count else idx)
    return x_pool[idx], y_pool[idx]


def balanced_in(k: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """(k, n) bool, which example each of k models trains on: models 2j and 2j+1 take complementary
    random halves of the n examples, so each example is IN for exactly k // 2 models (k even; an odd
    k's last model takes a random half of its own) and each model holds n // 2 or n - n // 2 of them
    (a reference never holds more candidates than half: none outgrows the target's training set)."""
    is_in = np.zeros((k, n), dtype=bool)
    for j in range(0, k, 2):
        order = rng.permutation(n)
        is_in[j, order[: n // 2]] = True
        if j + 1 < k:
            is_in[j + 1, order[n // 2 :]] = True
    return is_in


def canonical_order(x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Positions of the candidates sorted by their content (a digest of each example's x and y).

    Why: the candidates arrive in the order of the run's own shuffle (calibration halves, then the
    evaluated set), which changes with the target's seed. The references are the attacker's and do not
    depend on that seed: assigning the halves in content order makes the same candidates give the same
    references, so one set of trained references serves every seed of a grid row (the artifact store
    finds them) instead of one set per seed."""
    flat = x.detach().cpu().reshape(len(x), -1).contiguous().numpy()
    labels = y.detach().cpu().numpy()
    keys = [
        hashlib.sha256(row.tobytes() + np.asarray(label).tobytes()).hexdigest()
        for row, label in zip(flat, labels, strict=True)
    ]
    return np.asarray(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)


def assign_halves(
    k: int, x: torch.Tensor, y: torch.Tensor, rng: np.random.Generator, online: bool
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Which candidates each of k references trains on: `is_in` (k, n) in the candidates' order, and
    per reference the positions of its IN candidates in content order (`canonical_order`), so the same
    candidates in any order give the same training sets. Offline: nobody IN."""
    order = canonical_order(x, y)
    in_order = balanced_in(k, len(y), rng) if online else np.zeros((k, len(y)), dtype=bool)
    is_in = np.empty_like(in_order)
    is_in[:, order] = in_order
    return is_in, [order[np.nonzero(row)[0]] for row in in_order]


def _digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:32]


def _defense_key(defense: Defense) -> dict[str, Any]:
    from fedbench.spec.params import params_to_dict

    params = params_to_dict(defense.params) if dataclasses.is_dataclass(defense.params) else {}
    return {"name": defense.name, "version": defense.version, "params": params}


def _reference_scenario(data: RunData, size: int):
    """The target's training scenario (no observation fields) on a reference's own training set."""
    from fedbench.spec.run import training_scenario

    if data.scenario is None:
        raise RunFailure("references=fl: the run data carries no scenario to copy")
    sc = training_scenario(data.scenario)
    if sc.partition == "natural":
        raise FedbenchError(
            "references=fl: a natural partition (writer or identity ids) cannot be copied onto the "
            "attacker's data; use references=central"
        )
    return sc.replace(train_size=size, test_size=0, eval_every=sc.rounds)


def _train_fl(
    arch: nn.Module, defense: Defense, data: RunData, x: torch.Tensor, y: torch.Tensor, seed: int, device
) -> dict[str, Any]:
    """One FL reference: the target's protocol and a fresh copy of its defense on (x, y)."""
    from fedbench.fl.simulation import Simulation

    start = time.process_time()
    b = data.bundle
    bundle = DatasetBundle(
        meta=b.meta, x_train=x, y_train=y, x_test=b.x_test[:REFERENCE_TEST], y_test=b.y_test[:REFERENCE_TEST]
    )
    sc = _reference_scenario(data, len(y))
    fresh = type(defense)(defense.params)  # a pristine defense per simulation, as the runner gives
    with torch.random.fork_rng(devices=[]):  # the simulation seeds torch's global RNG: keep the caller's
        sim = Simulation(sc, bundle, lambda: core.fresh_copy(arch, seed), fresh, seed, device)
        try:
            result = sim.run()
        except RunFailure as error:  # a noisy protocol that diverged on this draw: kept, and replaced
            return {"diverged": str(error), "cpu_seconds": time.process_time() - start}
    return {
        "state": {k: v.detach().cpu().clone() for k, v in sim.global_state.items()},
        "rounds": int(result.rounds_run),
        "clients": len(result.client_sizes),
        "test_acc": float(result.test_acc),
        "cpu_seconds": time.process_time() - start,
    }


def _train_central(
    arch: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float, batch: int, seed: int, device
) -> dict[str, Any]:
    """One central reference: `mia-lira`'s SGD (`_membership_core.train_shadow`)."""
    start = time.process_time()
    model = core.fresh_copy(arch, seed)
    core.train_shadow(model, x, y, epochs, lr, batch, device, torch.Generator().manual_seed(seed))
    return {
        "state": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "cpu_seconds": time.process_time() - start,
    }


def check_fill(size: int, held: np.ndarray, own: int, requested: int) -> None:
    """Refuse reference sizes the data cannot give, in one line naming `reference_size`.

    Reference k trains on its `held[k]` queried candidates topped up with `size - held[k]` of the
    attacker's `own` examples, so every reference is exactly `size` only if the one holding the fewest
    candidates can be filled (an odd candidate count gives the two of a pair n // 2 and n - n // 2) and
    the one holding the most does not already exceed it. Where the whole pool is queried (mnist5k at
    test_fraction 0.5: 2,500 members, 2,500 non-members) the online halves alone fill the target's
    size and no own record is needed; where RMIA's population samples share the pool, they do not.
    """
    least = int(held.min()) if len(held) else 0
    most = int(held.max()) if len(held) else 0
    what = f"reference_size = {requested}" if requested else f"reference_size = 0 (the target's {size})"
    if most > size:
        raise FedbenchError(
            f"{what}: online references each train on up to {most} queried candidates, more than "
            f"{size}; raise reference_size to >= {most} or lower max_pairs"
        )
    if own < size - least:
        raise FedbenchError(
            f"{what}: {own} attacker examples cannot fill references of {size} (each holds {least} "
            f"queried candidates and needs {size - least} more); set reference_size <= {least + own}, "
            "or lower max_pairs, population or scenario.train_size (the attacker's data is the rest)"
        )


def train_references(
    p: ReferenceParams,
    arch: nn.Module,
    data: RunData,
    defense: Defense | None,
    candidates: tuple[torch.Tensor, torch.Tensor],
    own: tuple[torch.Tensor, torch.Tensor],
    online: bool,
    lr: float,
    batch: int,
    device,
) -> ReferenceSet:
    """K references (module docstring), each from the artifact store or trained now."""
    x_c, y_c = candidates
    x_own, y_own = own
    k = p.references_n
    size = p.reference_size or target_train_size(data)
    rng = np.random.default_rng([p.reference_seed, k if online else 0])
    is_in, picks = assign_halves(k, x_c, y_c, rng, online)
    check_fill(size, is_in.sum(axis=1), len(y_own), p.reference_size)
    if p.references == "fl" and defense is None:
        raise RunFailure("references=fl: the runner bound no defense to copy (bind_defense)")
    arch_key = repr(arch) + str([(n, tuple(t.shape)) for n, t in arch.state_dict().items()])
    states, rows, diverged = [], [], []
    for j in range(k):
        fill = np.random.default_rng([p.reference_seed, j, 1]).permutation(len(y_own))
        pick = torch.as_tensor(picks[j])
        n_fill = max(0, size - len(pick))
        x = torch.cat([x_c[pick], x_own[fill[:n_fill]]])
        y = torch.cat([y_c[pick], y_own[fill[:n_fill]]])
        for attempt in range(MAX_ATTEMPTS):  # a diverged FL reference is redrawn with its next seed
            seed = int(
                np.random.default_rng([p.reference_seed, j, *([attempt + 1] if attempt else [])]).integers(
                    2**31 - 1
                )
            )
            key: dict[str, Any] = {
                "arch": arch_key,
                "data": _digest(x, y),
                "seed": seed,
                "mode": p.references,
            }
            if p.references == "fl":
                sc = _reference_scenario(data, len(y))
                key |= {"scenario": dataclasses.asdict(sc), "defense": _defense_key(defense)}
                key["test"] = _digest(data.bundle.x_test[:REFERENCE_TEST])

                def compute(x=x, y=y, seed=seed) -> dict[str, Any]:
                    return _train_fl(arch, defense, data, x, y, seed, device)
            else:
                key |= {"epochs": p.central_epochs, "lr": lr, "batch": batch}

                def compute(x=x, y=y, seed=seed) -> dict[str, Any]:
                    return _train_central(arch, x, y, p.central_epochs, lr, batch, seed, device)

            value = artifact(ARTIFACT_KIND, canonical_json(key), compute)
            rows.append(value)
            if "diverged" not in value:
                states.append(value["state"])
                break
            diverged.append(value["diverged"])
        else:
            raise RunFailure(
                f"reference {j}: {MAX_ATTEMPTS} FL runs of the target's protocol diverged ({diverged[-1]})"
            )
    trained = [r for r in rows if "diverged" not in r]
    facts: dict[str, Any] = {
        "references": p.references,
        "references_n": k,
        "reference_size": size,
        "references_online": online,
        # CPU time their training took, when it ran (a reference read from the store costs nothing now)
        "references_cpu_seconds": float(sum(r["cpu_seconds"] for r in rows)),
    }
    if p.references == "fl":
        facts |= {
            "reference_rounds": sorted({r["rounds"] for r in trained}),
            "reference_clients": sorted({r["clients"] for r in trained}),
            "reference_test_acc": float(np.mean([r["test_acc"] for r in trained])),
            "references_diverged": len(diverged),  # redrawn with their next seed
        }
    return ReferenceSet(tuple(states), is_in, facts)


def reference_outputs(
    arch: nn.Module, refs: ReferenceSet, x: torch.Tensor, y: torch.Tensor, device, signal
) -> np.ndarray:
    """(K, n): `signal(model, x, y, device)` (a per-example statistic) under every reference."""
    model = copy.deepcopy(arch)
    rows = []
    for state in refs.states:
        model.load_state_dict(state)
        rows.append(signal(model.to(device).eval(), x, y, device))
    return np.stack(rows)


def own_from_pool(data: RunData, source: str) -> bool:
    """Whether the attacker's own data comes from the non-member pool (no spare training data)."""
    return not (source == "test" and len(data.unused_train()))
