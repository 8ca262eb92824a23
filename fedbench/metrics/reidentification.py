"""Re-identification: does a reconstruction single out its victim among records of the victim's class?

PSNR disagrees with the eye: a sparsified-gradient reconstruction at 11 dB shows a clearly readable
digit. The per-input leakage an inversion board ranks by is therefore re-identification (design §7.1):

- The candidate pool of a true image (the victim) is the victim plus up to `POOL_OTHERS` (99) other
  records of the dataset's training split (the records the FL training set is drawn from) with the
  victim's label, drawn without replacement. The victim's own record and every exact pixel duplicate
  of it are left out of the others. The draw is keyed on (run seed, the victim record's index in the
  training split), so every defense and every attack of a board sees the same pool for a victim. A class
  with fewer other records uses them all; the pool size (victim included) is recorded.
- `reidentified`: success (1) when the victim is strictly the nearest candidate to the reconstruction by
  pixel L2 distance; a tie with another candidate is a failure, except a distance of 0 to the victim,
  which is a success.
- The floor is the same test applied to the class-mean image (the mean over the training split's records
  of the victim's class): the best input-independent guess once the label is known (labels are recovered
  analytically). Chance is 1 / pool size.

`candidate_pools` builds what the scorer needs from the run's dataset; the runner calls it on the attack
result outside the cache (a pool is a function of the data, the seed and the victim, not of the attack),
so cached attack results are scored without recomputation. The victim's record is found by its pixels:
the training record of its class within `DUPLICATE_TOL` of the true image (the lowest index when there
are duplicates), so nothing about the victim's index has to be stored with the attack result. A true
image that is no record of its class (data a defense replaced, where the engine could not trace it back)
gets no pool, and its re-identification stays empty.
"""

from __future__ import annotations

import weakref
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

POOL_OTHERS = 99  # other records of the victim's class in a pool (design §7.1: the victim and 99 others)
# Largest absolute pixel difference (in [0, 1] pixel space) under which two images are the same record:
# de-normalisation on another device may differ in the last bit, an 8-bit pixel step is 0.0039.
DUPLICATE_TOL = 1e-5
_POOL_TAG = zlib.crc32(b"reid-pool")  # keeps the pool's random stream apart from other uses of a seed
_CHUNK = 4096  # records de-normalised at a time for the means


def reidentified(true: np.ndarray, guess: np.ndarray, others: np.ndarray) -> int:
    """1 when the victim `true` [C, H, W] is strictly the nearest candidate to `guess` among itself and
    `others` [P-1, C, H, W] by pixel L2 distance, else 0.

    A tie with another candidate is a failure (the guess does not single the victim out), except a
    distance of exactly 0 to the victim, which is a success. With no other candidate the victim is
    re-identified (chance is then 1).
    """
    g = np.asarray(guess, dtype=np.float64).reshape(-1)
    d_victim = float(np.sum((np.asarray(true, dtype=np.float64).reshape(-1) - g) ** 2))
    if d_victim == 0.0 or len(others) == 0:
        return 1
    o = np.asarray(others, dtype=np.float64).reshape(len(others), -1)
    return int(d_victim < float(np.min(np.sum((o - g[None]) ** 2, axis=1))))


@dataclass(frozen=True)
class _ClassStats:
    """Per training split: record indices per label, per-label mean images and the mean image (pixels)."""

    labels: np.ndarray  # [n] int64
    members: dict[int, np.ndarray]  # label -> sorted record indices
    class_means: dict[int, np.ndarray]  # label -> [C, H, W] float32
    mean_image: np.ndarray  # [C, H, W] float32


_stats: dict[int, tuple[weakref.ref, _ClassStats]] = {}  # id(bundle) -> (weak ref, its stats)


def _pixels(bundle: Any, rows: np.ndarray | slice) -> np.ndarray:
    """Training records `rows` in [0, 1] pixel space, float32, computed as the runner computes the truth."""
    import torch

    x = bundle.x_train[torch.as_tensor(rows) if isinstance(rows, np.ndarray) else rows]
    return bundle.denormalize(x).clamp(0, 1).cpu().numpy().astype(np.float32)


def class_stats(bundle: Any) -> _ClassStats:
    """The training split's label index and mean images, computed once per loaded dataset (memoised)."""
    key = id(bundle)
    hit = _stats.get(key)
    if hit is not None and hit[0]() is bundle:
        return hit[1]
    labels = bundle.y_train.cpu().numpy().astype(np.int64)
    n = len(labels)
    shape = tuple(int(s) for s in bundle.x_train.shape[1:])
    classes = np.unique(labels)
    sums = np.zeros((len(classes), *shape))
    for start in range(0, n, _CHUNK):
        block = _pixels(bundle, slice(start, start + _CHUNK)).astype(np.float64)
        at = np.searchsorted(classes, labels[start : start + _CHUNK])
        np.add.at(sums, at, block)
    counts = np.bincount(np.searchsorted(classes, labels), minlength=len(classes))
    stats = _ClassStats(
        labels=labels,
        members={int(c): np.flatnonzero(labels == c) for c in classes},
        class_means={
            int(c): (sums[k] / counts[k]).astype(np.float32) for k, c in enumerate(classes) if counts[k]
        },
        mean_image=(sums.sum(0) / max(n, 1)).astype(np.float32),
    )
    for k in [k for k, (ref, _) in _stats.items() if ref() is None]:  # datasets no longer loaded
        del _stats[k]
    _stats[key] = (weakref.ref(bundle), stats)
    return stats


def draw_pool(candidates: np.ndarray, seed: int, victim: int, others: int = POOL_OTHERS) -> np.ndarray:
    """`others` entries of `candidates` (sorted), drawn without replacement by an RNG keyed on (run seed,
    the victim's record index); all of them when there are fewer. The same arguments give the same pool."""
    rng = np.random.default_rng([_POOL_TAG, int(seed) & 0xFFFFFFFF, int(victim)])
    k = min(int(others), len(candidates))
    return np.sort(candidates[rng.choice(len(candidates), size=k, replace=False)])


def candidate_pools(
    bundle: Any, images: Any, labels: Sequence[int], seed: int, others: int = POOL_OTHERS
) -> dict[str, Any]:
    """What re-identification scores need for the true `images` [N, C, H, W] ([0, 1] pixels) of a run.

    Returns the entries the runner adds to the attack's truth:
    - `reid_victims`: [N] int64, each victim's record index in the training split (-1: no record of
      its class matches it, no pool);
    - `reid_pools`: per true image the record indices of the pool's others [P-1] int64, or None;
    - `reid_others`: per true image those records [P-1, C, H, W] float32, or None;
    - `class_means`: [N, C, H, W] float32, the mean image of each victim's class (zeros without a pool);
    - `mean_image`: [C, H, W] float32, the mean image of the training split.
    """
    stats = class_stats(bundle)
    true = np.asarray(images, dtype=np.float32)
    ys = np.asarray(labels, dtype=np.int64).reshape(-1)
    if len(ys) != len(true):
        raise ValueError(f"{len(ys)} labels for {len(true)} true images")
    victims = np.full(len(true), -1, dtype=np.int64)
    pools: list[np.ndarray | None] = [None] * len(true)
    others_px: list[np.ndarray | None] = [None] * len(true)
    means = np.zeros_like(true)
    records: dict[int, np.ndarray] = {}  # label -> its records in pixel space (once per label)
    for i, (image, y) in enumerate(zip(true, ys, strict=True)):
        members = stats.members.get(int(y))
        if members is None:
            continue
        if int(y) not in records:
            records[int(y)] = _pixels(bundle, members)
        pixels = records[int(y)]
        gap = np.abs(pixels - image[None]).reshape(len(members), -1).max(axis=1)
        same = gap <= DUPLICATE_TOL
        if not same.any():
            continue
        victims[i] = int(members[same][0])
        candidates = np.flatnonzero(~same)  # positions in `members`: not the victim, no duplicate of it
        picked = draw_pool(candidates, seed, victims[i], others)
        pools[i], others_px[i] = members[picked], pixels[picked]
        means[i] = stats.class_means[int(y)]
    return {
        "reid_victims": victims,
        "reid_pools": pools,
        "reid_others": others_px,
        "class_means": means,
        "mean_image": stats.mean_image,
    }
