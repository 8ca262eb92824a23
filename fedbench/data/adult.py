"""The UCI Adult (census income) dataset, vendored as compressed package data (CC BY 4.0).

Features follow spec 000 §5: rows with a missing value ('?') are dropped (30,162 train / 15,060 test
rows from the official adult.data / adult.test files), the 8 categoricals are one-hot encoded
(98 columns; race stays an input feature) and 5 numerics are kept (fnlwgt, a sampling weight, is
dropped), 103 dims in all. Numerics are standardised (or min-max scaled) with train statistics.
Task: income >50K. Sensitive attributes: race (5 classes) and sex (2).
"""

from __future__ import annotations

import dataclasses
import gzip
import io
from importlib import resources
from typing import Literal

import numpy as np

from fedbench.data.shipped import validation_param
from fedbench.errors import DataError
from fedbench.plugin import Dataset, DatasetBundle, DatasetMeta, Paper
from fedbench.registry import register_dataset
from fedbench.spec.params import param

COLUMNS = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
    "income",
)
NUMERIC = ("age", "education-num", "capital-gain", "capital-loss", "hours-per-week")
CATEGORICAL = (
    "workclass",
    "education",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "native-country",
)
RACES = ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Black", "Other")
SEXES = ("Female", "Male")
CLASS_NAMES = ("<=50K", ">50K")
NUM_FEATURES = 103
LICENSE_TEXT = "CC BY 4.0; Becker, B. & Kohavi, R. (1996). Adult. UCI ML Repository. doi:10.24432/C5XW20"


def _read_file(name: str):
    import pandas as pd

    try:
        raw = resources.files("fedbench.data").joinpath("files", name).read_bytes()
    except (FileNotFoundError, OSError) as exc:
        raise DataError(
            f"dataset 'adult': packaged file {name} is missing ({exc}); reinstall fedbench"
        ) from None
    text = gzip.decompress(raw).decode("utf-8")
    df = pd.read_csv(
        io.StringIO(text),
        header=None,
        names=list(COLUMNS),
        skipinitialspace=True,
        na_values="?",
        comment="|",
        dtype=str,
    )
    df = df.dropna(how="any").reset_index(drop=True)
    df["income"] = df["income"].str.rstrip(".")
    return df


def _frames():
    return _read_file("adult.data.gz"), _read_file("adult.test.gz")


def _categories(train, test) -> dict[str, list[str]]:
    """Category levels of each categorical, sorted, over both official files (after dropping '?')."""
    out = {}
    for col in CATEGORICAL:
        out[col] = sorted(set(train[col]) | set(test[col]))
    return out


def feature_names() -> tuple[str, ...]:
    """The 103 feature names in column order: 5 numerics, then `column=level` one-hots."""
    train, test = _frames()
    cats = _categories(train, test)
    return tuple(NUMERIC) + tuple(f"{c}={v}" for c in CATEGORICAL for v in cats[c])


@dataclasses.dataclass(frozen=True)
class AdultParams:
    """Parameters of the Adult dataset."""

    scaling: Literal["standard", "minmax"] = param("standard", "scaling of the 5 numerics (train stats)")
    validation: float = validation_param()


@register_dataset("adult", "uci-adult", "census-income")
class Adult(Dataset):
    """UCI Adult census income (103 features, >50K task), official split, race (5) and sex (2) attributes.

    `validation` > 0 holds a fixed stratified part of adult.data out (`validation_split`) and serves it
    as the test set, for tuning; no adult.test row is then in the bundle. The numerics are then
    scaled with the statistics of the rest of adult.data, recomputed (as a run without a validation set
    scales with its own training set's). The one-hot columns keep the levels of both official files, so
    the 103 columns are the same with or without a validation set.
    """

    version = "1"
    paper = Paper(
        "becker1996adult", "Adult. UCI Machine Learning Repository", "https://doi.org/10.24432/C5XW20"
    )
    Params = AdultParams
    key_optional = ("validation",)  # added later: at 0 (none) every run id stays the one it was

    def load(self, data_root: str | None = None, download: bool = False) -> DatasetBundle:
        from fedbench.data.shipped import make_bundle, validation_split

        def labels(df) -> np.ndarray:
            return (df["income"] == ">50K").to_numpy(dtype=np.int64)

        train, test = _frames()
        cats = _categories(train, test)  # the levels of both official files: the columns never change
        if self.params.validation:  # the official test rows are dropped: the validation set stands in
            keep, val = validation_split(labels(train), self.params.validation, f"dataset '{self.name}'")
            train, test = train.iloc[keep].reset_index(drop=True), train.iloc[val].reset_index(drop=True)

        def encode(df) -> np.ndarray:
            parts = [df[list(NUMERIC)].to_numpy(dtype=np.float64)]
            for col in CATEGORICAL:
                levels = {v: i for i, v in enumerate(cats[col])}
                codes = df[col].map(levels).to_numpy(dtype=np.int64)
                parts.append(np.eye(len(levels), dtype=np.float64)[codes])
            return np.concatenate(parts, axis=1)

        x_tr, x_te = encode(train), encode(test)
        if x_tr.shape[1] != NUM_FEATURES:  # guards against a changed data file
            raise DataError(f"dataset 'adult': expected {NUM_FEATURES} features, built {x_tr.shape[1]}")
        k = len(NUMERIC)
        num_tr = x_tr[:, :k]
        if self.params.scaling == "standard":
            lo, scale = num_tr.mean(axis=0), num_tr.std(axis=0)
        else:
            lo, scale = num_tr.min(axis=0), num_tr.max(axis=0) - num_tr.min(axis=0)
        scale = np.where(scale > 1e-12, scale, 1.0)
        x_tr[:, :k] = (x_tr[:, :k] - lo) / scale
        x_te[:, :k] = (x_te[:, :k] - lo) / scale

        def attrs(df) -> dict[str, np.ndarray]:
            race = df["race"].map({v: i for i, v in enumerate(RACES)}).to_numpy(dtype=np.int64)
            sex = df["sex"].map({v: i for i, v in enumerate(SEXES)}).to_numpy(dtype=np.int64)
            return {"race": race, "sex": sex}

        meta = DatasetMeta(
            name=self.name,
            input_shape=(NUM_FEATURES,),
            num_classes=2,
            modality="tabular",
            class_names=CLASS_NAMES,
            attribute_names={"race": RACES, "sex": SEXES},
            source="UCI Adult, official adult.data/adult.test (vendored)",
            license=LICENSE_TEXT,
        )
        return make_bundle(
            meta, x_tr, labels(train), x_te, labels(test), attr_train=attrs(train), attr_test=attrs(test)
        )
