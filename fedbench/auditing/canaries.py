"""Canaries for the one-run audit: records easy to memorise, each included by a fair coin.

Why these canaries: a black-box audit reads only the final model's loss on each canary, so the bound
is as strong as the gap between the loss of an included canary and an excluded one. Records that a
model learns only by memorising them make that gap large (Steinke, Nasr & Jagielski 2023, Section 7,
and the auditing literature before them: Jagielski et al. 2020, Nasr et al. 2021):

- `mislabeled` (default): real records the run does not otherwise use (training records beyond the
  scenario's `train_size`, then test records, which are then dropped from the audit run's test set),
  each with a label drawn uniformly among the classes other than its own. An excluded one is
  predicted as its true class (high loss on the canary's label); an included one has its label
  learnt only if the model memorises it.
- `noise`: out-of-distribution inputs, uniform noise in pixel space (images) or standard normal
  features (tabular), each with a uniformly drawn label.

Everything here is drawn from seeded generators keyed on the run seed and fixed before training: the
canaries, their inclusion bits S (i.i.d. fair coins, the theorem's premise) and the client each canary
goes to when included (drawn for every canary, independent of S).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

CanaryKind = Literal["mislabeled", "noise"]
CANARY_KINDS: tuple[str, ...] = ("mislabeled", "noise")


@dataclass(frozen=True)
class Canaries:
    """m canaries: inputs `x` (normalised like the dataset), labels `y`, inclusion flags `included`
    (S_i = +1), the client `owner` each goes to when included, and, for `mislabeled`, the test rows they
    came from (`test_rows`, removed from the audit run's test set)."""

    x: Any
    y: Any
    included: Any  # numpy bool array
    owner: Any  # numpy int array
    test_rows: tuple[int, ...] = ()

    @property
    def m(self) -> int:
        return len(self.included)


def make_canaries(bundle: Any, n_train: int, m: int, kind: str, clients: int, seed: int) -> Canaries:
    """The m canaries of `kind` for a run that trains on the first `n_train` records of `bundle`."""
    import numpy as np
    import torch

    from fedbench.errors import FedbenchError
    from fedbench.fl.seeding import numpy_rng

    if m < 2:
        raise FedbenchError(f"--canaries {m}: the audit needs at least 2 canaries")
    if kind not in CANARY_KINDS:
        raise FedbenchError(f"canary kind '{kind}': use one of {', '.join(CANARY_KINDS)}")
    classes = int(bundle.meta.num_classes)
    rng = numpy_rng(seed, "audit-canaries")
    test_rows: tuple[int, ...] = ()
    if kind == "mislabeled":
        spare_train = len(bundle.y_train) - n_train
        spare = spare_train + len(bundle.y_test)
        if m > spare:
            raise FedbenchError(
                f"--canaries {m}: only {spare} records are outside the run's training set "
                f"({spare_train} training records beyond train_size={n_train}, {len(bundle.y_test)} test "
                "records); lower --canaries, lower scenario.train_size, or use --canary-kind noise"
            )
        from_train = min(m, spare_train)
        x_parts = [bundle.x_train[n_train : n_train + from_train]]
        y_true = [bundle.y_train[n_train : n_train + from_train]]
        if m > from_train:  # the rest from the end of the test set (the audit run tests on the others)
            rows = range(len(bundle.y_test) - (m - from_train), len(bundle.y_test))
            test_rows = tuple(rows)
            x_parts.append(bundle.x_test[rows.start :])
            y_true.append(bundle.y_test[rows.start :])
        x = torch.cat(x_parts).clone()
        true = torch.cat(y_true).numpy()
        shift = rng.integers(1, classes, size=m)  # a label other than the record's own, uniformly
        y = torch.as_tensor((true + shift) % classes, dtype=torch.int64)
    else:
        shape = (m, *bundle.meta.input_shape)
        gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        if bundle.meta.is_image:
            x = _normalise(torch.rand(shape, generator=gen), bundle.meta)
        else:
            x = torch.randn(shape, generator=gen)
        y = torch.as_tensor(rng.integers(0, classes, size=m), dtype=torch.int64)
    included = numpy_rng(seed, "audit-inclusion").random(m) < 0.5
    owner = numpy_rng(seed, "audit-owners").integers(0, clients, size=m)
    return Canaries(x.to(bundle.x_train.dtype), y, included, np.asarray(owner), test_rows)


def _normalise(pixels: Any, meta: Any) -> Any:
    import torch

    if not meta.mean:
        return pixels
    shape = (1, -1) + (1,) * (pixels.dim() - 2)
    mean = torch.tensor(meta.mean, dtype=pixels.dtype).view(shape)
    std = torch.tensor(meta.std, dtype=pixels.dtype).view(shape)
    return (pixels - mean) / std
