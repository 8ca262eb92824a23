"""Full datasets read through torchvision from a local root (`--data-root`): mnist, fashion-mnist,
cifar10, cifar100, svhn, celeba, lfw.

Nothing is downloaded unless `download=True` (`--download`) is given on a connected machine. A missing
root or missing files is a `DataError` naming the dataset and the fix. Official train/test splits are
used where they exist; torchvision datasets are turned into tensors through their numpy `.data`
arrays, or decoded with PIL (never torchvision.io). CelebA and LFW decode thousands of JPEGs, so their
resized uint8 arrays are cached under `<cache dir>/data/`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from fedbench.data.shipped import (
    LFW_PAPER,
    MNIST_PAPER,
    atomic_save_npz,
    data_cache_dir,
    fixed_split,
    load_npz,
    make_bundle,
    validation_param,
    validation_split,
)
from fedbench.errors import DataError
from fedbench.plugin import Dataset, DatasetBundle, DatasetMeta, Paper
from fedbench.registry import register_dataset
from fedbench.spec.params import param

# ----------------------------------------------------------------------------------------- helpers


def _missing(name: str, files: str, extra: str = "", why: str = "") -> DataError:
    fix = extra or "(or --download on a connected machine)"
    return DataError(
        f"dataset '{name}' needs --data-root DIR holding the {files} files {fix}"
        + (f"; {why}" if why else "")
    )


def _root(name: str, files: str, data_root: str | os.PathLike | None, extra: str = "") -> str:
    if data_root is None or str(data_root) == "":
        raise _missing(name, files, extra)
    return str(Path(data_root).expanduser())


def _open(name: str, files: str, root: str, download: bool, make: Callable[[], Any], extra: str = "") -> Any:
    """Build a torchvision dataset, turning its 'not found' and download errors into DataError."""
    if not download and not Path(root).is_dir():
        raise _missing(name, files, extra, f"{root} is not a directory")
    try:
        return make()
    except (RuntimeError, FileNotFoundError, ValueError, OSError) as exc:
        if download:
            raise DataError(
                f"dataset '{name}': download into {root} failed ({_short(exc)}); "
                f"fetch the {files} files on a connected machine and pass --data-root DIR"
            ) from None
        why = f"none found in {root}"
        if not str(exc).startswith("Dataset not found"):
            why += f" ({_short(exc)})"
        raise _missing(name, files, extra, why) from None


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _tv_datasets():
    from fedbench._compat import import_torchvision

    return import_torchvision().datasets


def _array(data: Any) -> np.ndarray:
    """A torchvision `.data` or `.targets` (tensor, array or list) as a numpy array."""
    return data.numpy() if hasattr(data, "numpy") else np.asarray(data)


def _nchw01(data: Any, channels_last: bool) -> np.ndarray:
    """uint8 images ([N,H,W], [N,H,W,C] or [N,C,H,W]) -> float32 [N,C,H,W] in [0,1]."""
    a = _array(data)
    if a.ndim == 3:
        a = a[:, None]
    elif channels_last:
        a = a.transpose(0, 3, 1, 2)
    return a.astype(np.float32) / 255.0


def _targets(t: Any) -> np.ndarray:
    return _array(t).astype(np.int64)


def _pil_resize(path: str, size: int, crop: int | None = None) -> np.ndarray:
    """Decode one image with PIL, optional centre crop, resize to size x size; uint8 [C,H,W] RGB."""
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB")
        if crop:
            w, h = im.size
            c = min(crop, w, h)
            left, top = (w - c) // 2, (h - c) // 2
            im = im.crop((left, top, left + c, top + c))
        im = im.resize((size, size), Image.BILINEAR)
        return np.asarray(im, dtype=np.uint8).transpose(2, 0, 1).copy()


def _cached_images(key: str, paths: list[str], size: int, crop: int | None = None) -> np.ndarray:
    """Decode + resize a list of image files once; the uint8 array is cached under the cache dir."""
    digest = hashlib.sha256("\n".join([key, str(size), str(crop), *paths]).encode()).hexdigest()[:16]
    path = data_cache_dir() / f"{key}-{size}-{digest}.npz"
    cached = load_npz(path)
    if cached is not None and "x" in cached and len(cached["x"]) == len(paths):
        return cached["x"]
    x = np.empty((len(paths), 3, size, size), dtype=np.uint8)
    for i, p in enumerate(paths):
        x[i] = _pil_resize(p, size, crop)
    atomic_save_npz(path, x=x)
    return x


# ------------------------------------------------------------------------- torchvision array datasets


@dataclasses.dataclass(frozen=True)
class TorchvisionSource:
    """Where a torchvision dataset read through its `.data` arrays comes from, and their layout."""

    tv_class: str  # the torchvision.datasets class
    files: str  # what --data-root must hold (named in errors)
    shape: tuple[int, int, int]
    classes: int = 10
    channels_last: bool = False  # `.data` is [N, H, W, C]
    split_kw: tuple[tuple[str, Any], tuple[str, Any]] = (("train", True), ("train", False))
    license: str = ""


@dataclasses.dataclass(frozen=True)
class OfficialSplitParams:
    """Parameters of a torchvision dataset with an official split."""

    validation: float = validation_param()


class _TorchvisionArrays(Dataset):
    """Loader shared by the torchvision datasets with numpy/tensor `.data` and official splits: a
    subclass names its `source` and the published per-channel `mean_std` it is normalised with.

    `validation` > 0 holds a fixed stratified part of the official train split out
    (`validation_split`) and serves it as the test set, for tuning; the official test split is then not
    read. The normalisation stays the published `mean_std`: it is no statistic of the run's data.
    """

    version = "1"
    needs_root = True
    Params = OfficialSplitParams
    key_optional = ("validation",)  # added later: at 0 (none) every run id stays the one it was
    source: ClassVar[TorchvisionSource]
    mean_std: ClassVar[tuple[tuple[float, ...], tuple[float, ...]]]

    def _make(self, root: str, split: tuple[str, Any], download: bool) -> Any:
        cls = getattr(_tv_datasets(), self.source.tv_class)
        return _open(
            self.name,
            self.source.files,
            root,
            download,
            lambda: cls(root=root, download=download, **{split[0]: split[1]}),
        )

    def load(self, data_root: str | None = None, download: bool = False) -> DatasetBundle:
        s = self.source
        root = _root(self.name, s.files, data_root)
        tr = self._make(root, s.split_kw[0], download)
        labels_attr = "labels" if hasattr(tr, "labels") and not hasattr(tr, "targets") else "targets"
        x_tr, y_tr = _array(tr.data), _targets(getattr(tr, labels_attr))
        if self.params.validation:  # the official test split is not read: the validation set stands in
            keep, val = validation_split(y_tr, self.params.validation, f"dataset '{self.name}'")
            x_tr, y_tr, x_te, y_te = x_tr[keep], y_tr[keep], x_tr[val], y_tr[val]
        else:
            te = self._make(root, s.split_kw[1], download)
            x_te, y_te = _array(te.data), _targets(getattr(te, labels_attr))
        class_names = tuple(str(c) for c in getattr(tr, "classes", ()))
        if len(class_names) != s.classes:
            class_names = tuple(map(str, range(s.classes)))
        meta = DatasetMeta(
            name=self.name,
            input_shape=s.shape,
            num_classes=s.classes,
            modality="image",
            mean=self.mean_std[0],
            std=self.mean_std[1],
            class_names=class_names,
            source=f"torchvision.datasets.{s.tv_class}",
            license=s.license,
        )
        return make_bundle(meta, _nchw01(x_tr, s.channels_last), y_tr, _nchw01(x_te, s.channels_last), y_te)


CIFAR_PAPER = Paper(
    "krizhevsky2009cifar",
    "Learning Multiple Layers of Features from Tiny Images",
    "https://www.cs.toronto.edu/~kriz/cifar.html",
)


@register_dataset("mnist")
class Mnist(_TorchvisionArrays):
    """MNIST handwritten digits, 60k/10k official split (1x28x28, 10 classes), from --data-root."""

    paper = MNIST_PAPER
    source = TorchvisionSource("MNIST", "MNIST (MNIST/raw/*-idx?-ubyte)", (1, 28, 28), license="CC BY-SA 3.0")
    mean_std = (0.1307,), (0.3081,)


@register_dataset("fashion-mnist", "fmnist")
class FashionMnist(_TorchvisionArrays):
    """Fashion-MNIST, 60k/10k official split (1x28x28, 10 classes), from --data-root."""

    paper = Paper(
        "xiao2017fashion",
        "Fashion-MNIST: a Novel Image Dataset for Benchmarking ML Algorithms",
        "https://arxiv.org/abs/1708.07747",
    )
    source = TorchvisionSource(
        "FashionMNIST", "Fashion-MNIST (FashionMNIST/raw/*)", (1, 28, 28), license="MIT"
    )
    mean_std = (0.2860,), (0.3530,)


@register_dataset("cifar10", "cifar-10")
class Cifar10(_TorchvisionArrays):
    """CIFAR-10, 50k/10k official split (3x32x32, 10 classes), from --data-root."""

    paper = CIFAR_PAPER
    source = TorchvisionSource("CIFAR10", "CIFAR-10 (cifar-10-batches-py)", (3, 32, 32), channels_last=True)
    mean_std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


@register_dataset("cifar100", "cifar-100")
class Cifar100(_TorchvisionArrays):
    """CIFAR-100, 50k/10k official split (3x32x32, 100 fine classes), from --data-root."""

    paper = CIFAR_PAPER
    source = TorchvisionSource(
        "CIFAR100", "CIFAR-100 (cifar-100-python)", (3, 32, 32), 100, channels_last=True
    )
    mean_std = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)


@register_dataset("svhn")
class Svhn(_TorchvisionArrays):
    """SVHN cropped digits, 73k/26k official split (3x32x32, 10 classes), from --data-root."""

    paper = Paper(
        "netzer2011svhn",
        "Reading Digits in Natural Images with Unsupervised Feature Learning",
        "http://ufldl.stanford.edu/housenumbers/",
    )
    source = TorchvisionSource(
        "SVHN",
        "SVHN (train_32x32.mat, test_32x32.mat)",
        (3, 32, 32),
        split_kw=(("split", "train"), ("split", "test")),
    )
    mean_std = (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)


# ------------------------------------------------------------------------------------------ CelebA

CELEBA_MEAN, CELEBA_STD = (0.5063, 0.4258, 0.3832), (0.3106, 0.2904, 0.2897)


@dataclasses.dataclass(frozen=True)
class CelebAParams:
    """Parameters of CelebA."""

    size: int = param(32, "images are resized (after a 178x178 centre crop) to size x size", min=4)
    target: str = param("Male", "the binary attribute used as the task label")
    max_train: int = param(0, "use only the first N official train images; 0 = all", min=0)
    max_test: int = param(0, "use only the first N official test images; 0 = all", min=0)


@register_dataset("celeba")
class CelebA(Dataset):
    """CelebA aligned faces, official train/test split, 40 binary attributes (task default: Male).

    All 40 attributes are in attr_train/attr_test (0/1); celebrity identities are the natural client
    ids (groups_train). Images are centre-cropped to 178x178 and resized to `size`.
    """

    version = "1"
    needs_root = True
    paper = Paper(
        "liu2015celeba",
        "Deep Learning Face Attributes in the Wild",
        "https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html",
    )
    Params = CelebAParams
    FILES = "CelebA (celeba/img_align_celeba + list_attr_celeba.txt, identity_CelebA.txt, ...)"

    def load(self, data_root: str | None = None, download: bool = False) -> DatasetBundle:
        p = self.params
        root = _root(self.name, self.FILES, data_root)
        tvd = _tv_datasets()
        splits = {}
        for split, limit in (("train", p.max_train), ("test", p.max_test)):
            ds = _open(
                self.name,
                self.FILES,
                root,
                download,
                lambda split=split: tvd.CelebA(root=root, split=split, target_type="attr", download=download),
            )
            names = [n for n in ds.attr_names if n]
            if p.target not in names:
                raise DataError(
                    f"dataset 'celeba': target '{p.target}' is not a CelebA attribute; "
                    f"choose one of {', '.join(names)}"
                )
            n = len(ds.filename) if not limit else min(limit, len(ds.filename))
            folder = os.path.join(ds.root, ds.base_folder, "img_align_celeba")
            paths = [os.path.join(folder, f) for f in ds.filename[:n]]
            x = _cached_images(f"celeba-{split}", paths, p.size, crop=178)
            attr = ds.attr[:n].numpy().astype(np.int64)
            identity = ds.identity[:n].numpy().reshape(-1).astype(np.int64)
            splits[split] = (x, attr, identity, names)
        (x_tr, a_tr, id_tr, names), (x_te, a_te, _, _) = splits["train"], splits["test"]
        t = names.index(p.target)
        _, groups = np.unique(id_tr, return_inverse=True)
        meta = DatasetMeta(
            name=self.name,
            input_shape=(3, p.size, p.size),
            num_classes=2,
            modality="image",
            mean=CELEBA_MEAN,
            std=CELEBA_STD,
            class_names=(f"not {p.target}", p.target),
            attribute_names={n: ("0", "1") for n in names},
            source="torchvision.datasets.CelebA",
            license="CelebA: non-commercial research only",
        )
        return make_bundle(
            meta,
            x_tr.astype(np.float32) / 255.0,
            a_tr[:, t],
            x_te.astype(np.float32) / 255.0,
            a_te[:, t],
            attr_train={n: a_tr[:, i] for i, n in enumerate(names)},
            attr_test={n: a_te[:, i] for i, n in enumerate(names)},
            groups_train=groups,
        )


# --------------------------------------------------------------------------------------------- LFW

LFW_ATTRIBUTE_GROUPS: dict[str, tuple[str, ...]] = {
    "race": ("Asian", "White", "Black"),
    "age": ("Baby", "Child", "Youth", "Middle Aged", "Senior"),
    "glasses": ("Eyeglasses", "Sunglasses", "No Eyewear"),
    "hair": ("Black Hair", "Blond Hair", "Brown Hair", "Bald"),
}
LFW_FILES = "LFW (lfw-py/lfw_funneled, people.txt, lfw-names.txt; optional lfw_attributes.txt)"


@dataclasses.dataclass(frozen=True)
class LfwParams:
    """Parameters of LFW."""

    size: int = param(32, "images are centre-cropped to `crop` then resized to size x size", min=4)
    crop: int = param(128, "centre crop (pixels of the 250x250 original) before resizing", min=8, max=250)
    min_faces: int = param(20, "keep people with at least this many images (identity classes)", min=1)
    target: Literal["identity", "smiling", "gender"] = param(
        "identity", "task label; smiling/gender need lfw_attributes.txt"
    )
    test_fraction: float = param(
        0.25, "fixed stratified test fraction (seed 0)", min=0, max=1, min_open=True, max_open=True
    )
    validation: float = validation_param()


def _find_attributes(root: str) -> Path | None:
    for cand in (Path(root) / "lfw_attributes.txt", Path(root) / "lfw-py" / "lfw_attributes.txt"):
        if cand.is_file():
            return cand
    return None


def _read_lfw_attributes(path: Path) -> dict[tuple[str, int], dict[str, float]]:
    """Kumar et al.'s attribute scores keyed by (person with underscores, image number)."""
    out: dict[tuple[str, int], dict[str, float]] = {}
    header: list[str] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("#"):
                cols = line.lstrip("#").strip().split("\t")
                if "person" in cols:
                    header = cols
                continue
            parts = line.rstrip("\n").split("\t")
            if not header or len(parts) != len(header):
                continue
            rec = dict(zip(header, parts, strict=True))
            key = (rec["person"].strip().replace(" ", "_"), int(rec["imagenum"]))
            out[key] = {k: float(v) for k, v in rec.items() if k not in ("person", "imagenum")}
    return out


@register_dataset("lfw", "lfw-people")
class Lfw(Dataset):
    """Labeled Faces in the Wild (RGB), people with >= min_faces images; identity task by default.

    Identities are the natural client ids (groups_train). When Kumar et al.'s lfw_attributes.txt lies
    in the root, the images that have scores get attributes race(3)/age(5)/glasses(3)/hair(4) (argmax),
    gender and smiling (score > 0), and the others are dropped; without the file there are none.
    `validation` > 0 serves a fixed part of the training split as the test set (`validation_split`),
    normalised with the statistics of the rest.
    """

    version = "2"  # 2: fixed shuffled split order (1 kept the stored order)
    needs_root = True
    paper = LFW_PAPER
    Params = LfwParams
    key_optional = ("validation",)  # added later: at 0 (none) every run id stays the one it was

    def load(self, data_root: str | None = None, download: bool = False) -> DatasetBundle:
        p = self.params
        extra = "(torchvision cannot download LFW any more: fetch it manually)"
        root = _root(self.name, LFW_FILES, data_root, extra)
        tvd = _tv_datasets()
        ds = _open(
            self.name,
            LFW_FILES,
            root,
            False,
            lambda: tvd.LFWPeople(root=root, split="10fold", image_set="funneled"),
            extra,
        )
        paths = list(ds.data)
        ident = np.asarray(ds.targets, dtype=np.int64)
        keep = np.ones(len(paths), dtype=bool)
        attr_file = _find_attributes(root)
        scores: list[dict[str, float]] | None = None
        if attr_file is not None:
            table = _read_lfw_attributes(attr_file)
            keys = []
            for path in paths:
                stem = Path(path).stem  # Name_Surname_0001
                person, num = stem.rsplit("_", 1)
                keys.append((person, int(num)))
            keep &= np.array([k in table for k in keys])
            scores = [table.get(k, {}) for k in keys]
        elif p.target != "identity":
            raise DataError(
                f"dataset 'lfw': target '{p.target}' needs lfw_attributes.txt (Kumar et al.'s "
                f"LFW attributes) in --data-root {root}; or use target=identity"
            )
        counts = np.bincount(ident[keep], minlength=int(ident.max()) + 1 if len(ident) else 0)
        keep &= counts[ident] >= p.min_faces
        idx = np.flatnonzero(keep)
        if len(idx) == 0:
            raise DataError(
                f"dataset 'lfw': no person has >= {p.min_faces} images in {root}; lower min_faces"
            )
        _, identity = np.unique(ident[idx], return_inverse=True)
        attrs: dict[str, np.ndarray] = {}
        attr_names: dict[str, tuple[str, ...]] = {}
        if scores is not None:
            for group, cols in LFW_ATTRIBUTE_GROUPS.items():
                attrs[group] = np.array(
                    [np.argmax([scores[i][c] for c in cols]) for i in idx], dtype=np.int64
                )
                attr_names[group] = cols
            attrs["gender"] = np.array([scores[i]["Male"] > 0 for i in idx], dtype=np.int64)
            attrs["smiling"] = np.array([scores[i]["Smiling"] > 0 for i in idx], dtype=np.int64)
            attr_names["gender"] = ("female", "male")
            attr_names["smiling"] = ("not smiling", "smiling")
        if p.target == "identity":
            y = identity
            names = tuple(sorted({Path(paths[i]).parent.name for i in idx}))
            class_names = names if len(names) == int(identity.max()) + 1 else ()
        else:
            y = attrs[p.target]
            class_names = attr_names[p.target]
        x = _cached_images("lfw", [paths[i] for i in idx], p.size, crop=p.crop)
        tr, te = fixed_split(y, p.test_fraction, shuffle=True)  # stored by person
        if p.validation:  # the test split is dropped: the validation set stands in (train' statistics)
            keep, val = validation_split(y[tr], p.validation, f"dataset '{self.name}'", shuffle=True)
            tr, te = tr[keep], tr[val]
        x01 = x.astype(np.float32) / 255.0
        meta = DatasetMeta(
            name=self.name,
            input_shape=(3, p.size, p.size),
            num_classes=int(y.max()) + 1,
            modality="image",
            class_names=class_names,
            attribute_names=attr_names,
            source="torchvision.datasets.LFWPeople",
            license="LFW: research use",
        )
        return make_bundle(
            meta,
            x01[tr],
            y[tr],
            x01[te],
            y[te],
            attr_train={k: v[tr] for k, v in attrs.items()},
            attr_test={k: v[te] for k, v in attrs.items()},
            groups_train=identity[tr],
        )
