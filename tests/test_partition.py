"""Client partitioners: sizes, disjoint + covering, determinism, label skew, natural ids, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedbench.data.partition import SCHEMES, partition
from fedbench.errors import DataError, FedbenchError, SpecError

LABELS = np.repeat(np.arange(10), 60)  # 600 examples, 10 balanced classes
GROUPS = np.arange(600) // 25  # 24 natural groups of 25


def _kwargs(scheme: str) -> dict:
    return {"groups": GROUPS} if scheme == "natural" else {}


def _check_cover(parts: list[np.ndarray], n: int) -> None:
    allidx = np.concatenate(parts)
    assert len(allidx) == n
    assert np.array_equal(np.sort(allidx), np.arange(n))  # disjoint and covering
    for p in parts:
        assert p.dtype == np.int64 and len(p) >= 1
        assert np.all(np.diff(p) > 0)  # sorted, no repeats


def _labels_per_client(parts: list[np.ndarray], labels: np.ndarray) -> list[int]:
    return [len(np.unique(labels[p])) for p in parts]


def _mean_tv_to_global(parts: list[np.ndarray], labels: np.ndarray) -> float:
    """Mean total-variation distance between each client's label histogram and the global one."""
    k = labels.max() + 1
    glob = np.bincount(labels, minlength=k) / len(labels)
    return float(
        np.mean([0.5 * np.abs(np.bincount(labels[p], minlength=k) / len(p) - glob).sum() for p in parts])
    )


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("clients", [1, 7, 20])
def test_disjoint_and_covering(scheme, clients):
    parts = partition(LABELS, clients, scheme, seed=0, **_kwargs(scheme))
    assert len(parts) == clients
    _check_cover(parts, len(LABELS))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_deterministic_from_seed(scheme):
    a = partition(LABELS, 8, scheme, seed=1, **_kwargs(scheme))
    b = partition(LABELS, 8, scheme, seed=1, **_kwargs(scheme))
    c = partition(LABELS, 8, scheme, seed=2, **_kwargs(scheme))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_iid_sizes_balanced():
    parts = partition(LABELS, 7, "iid", seed=0)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert _mean_tv_to_global(parts, LABELS) < 0.25


def test_shards_label_skew_and_sizes():
    parts = partition(LABELS, 20, "shards", seed=0, shards_per_client=2)
    assert all(len(p) == 30 for p in parts)  # 40 shards of 15
    assert all(n <= 2 for n in _labels_per_client(parts, LABELS))
    one = partition(LABELS, 10, "shards", seed=0, shards_per_client=1)
    assert all(n == 1 for n in _labels_per_client(one, LABELS))


def test_dirichlet_small_alpha_more_skewed_than_iid():
    iid = _mean_tv_to_global(partition(LABELS, 10, "iid", seed=0), LABELS)
    skewed = _mean_tv_to_global(partition(LABELS, 10, "dirichlet", seed=0, alpha=0.1), LABELS)
    mild = _mean_tv_to_global(partition(LABELS, 10, "dirichlet", seed=0, alpha=100.0), LABELS)
    assert skewed > 0.5 > iid
    assert skewed > mild
    assert np.mean(_labels_per_client(partition(LABELS, 10, "dirichlet", seed=0, alpha=0.1), LABELS)) < 6


def test_dirichlet_every_client_gets_an_example():
    for seed in range(5):
        parts = partition(LABELS, 60, "dirichlet", seed=seed, alpha=0.05)
        _check_cover(parts, len(LABELS))


def test_dirichlet_extreme_request_still_gives_every_client_one_example():
    labels = np.zeros(12, dtype=np.int64)
    parts = partition(labels, 12, "dirichlet", seed=0, alpha=0.001)
    assert [len(p) for p in parts] == [1] * 12
    _check_cover(parts, 12)
    with pytest.raises(SpecError, match="alpha"):
        partition(LABELS, 4, "dirichlet", seed=0, alpha=0.0)
    with pytest.raises(DataError, match="13 clients but only 12"):
        partition(labels, 13, "dirichlet", seed=0)


def test_natural_groups_stay_together_and_round_robin():
    parts = partition(LABELS, 5, "natural", seed=0, groups=GROUPS)
    owner = {}
    for c, p in enumerate(parts):
        for g in np.unique(GROUPS[p]):
            assert g not in owner  # a group is never split between clients
            owner[g] = c
    assert len(owner) == 24
    counts = np.bincount(list(owner.values()), minlength=5)
    assert counts.max() - counts.min() <= 1  # 24 groups dealt round-robin over 5 clients
    exact = partition(LABELS, 24, "natural", seed=0, groups=GROUPS)
    assert sorted(len(np.unique(GROUPS[p])) for p in exact) == [1] * 24


def test_natural_accepts_torch_tensors():
    parts = partition(torch.from_numpy(LABELS), 3, "natural", seed=0, groups=torch.from_numpy(GROUPS))
    _check_cover(parts, len(LABELS))


def test_natural_errors():
    with pytest.raises(DataError, match="natural client ids.*has none"):
        partition(LABELS, 4, "natural", seed=0)
    with pytest.raises(DataError, match="24 natural groups but 30 clients"):
        partition(LABELS, 30, "natural", seed=0, groups=GROUPS)
    with pytest.raises(DataError, match="aligned"):
        partition(LABELS, 3, "natural", seed=0, groups=GROUPS[:10])


def test_error_paths():
    with pytest.raises(DataError, match="700 clients but only 600"):
        partition(LABELS, 700, "iid", seed=0)
    with pytest.raises(SpecError, match="did you mean 'shards'"):
        partition(LABELS, 4, "shard", seed=0)
    with pytest.raises(SpecError, match="positive integer"):
        partition(LABELS, 0, "iid", seed=0)
    with pytest.raises(SpecError, match="seed"):
        partition(LABELS, 2, "iid", seed=-1)
    with pytest.raises(DataError, match="shards"):
        partition(LABELS, 400, "shards", seed=0, shards_per_client=2)
    with pytest.raises(SpecError, match="shards_per_client"):
        partition(LABELS, 4, "shards", seed=0, shards_per_client=0)
    with pytest.raises(DataError, match="empty"):
        partition(np.array([], dtype=np.int64), 1, "iid", seed=0)
    with pytest.raises(DataError, match="one-dimensional"):
        partition(np.zeros((4, 2)), 2, "iid", seed=0)
    for exc in (DataError, SpecError):
        assert issubclass(exc, FedbenchError)


def test_one_client_per_example():
    labels = np.arange(50) % 5
    for scheme in ("iid", "shards"):
        parts = partition(labels, 50, scheme, seed=0, shards_per_client=1)
        assert all(len(p) == 1 for p in parts)
        _check_cover(parts, 50)
