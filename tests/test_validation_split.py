"""The `validation` dataset parameter (issue 30): a fixed, stratified part of the training split served
as the test set, for tuning on validation and never on test; run ids and tensors unchanged at 0."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fedbench.cli import app
from fedbench.data import clear_memo, load_dataset
from fedbench.data.shipped import (
    Digits,
    Mnist5k,
    fixed_split,
    make_bundle,
    standardize,
    validation_split,
)
from fedbench.errors import ParamError
from fedbench.plugin import DatasetMeta, Scenario
from fedbench.registry import datasets
from fedbench.spec.run import ComponentSpec, RunSpec

SHIPPED = ("mnist5k", "digits", "breast-cancer", "lfw-subset")

# (run_id, utility_id) of RunSpec(dataset, mlp, none, no attack, Scenario(), seed 0), computed with the
# tree before the `validation` parameter existed (commit 0d9188a): adding it must change none of them.
RUN_IDS = {
    "mnist5k": ("ec9cf7828804ca03", "7010ac5dc1ba4850"),
    "digits": ("81e91c45b16d342e", "fc43620441284524"),
    "breast-cancer": ("6885c32cbcf03116", "929b36ca088d5870"),
    "lfw-subset": ("9b6d1ed6eea6be91", "574fdf20b5ebeb74"),
    "adult": ("4e382148970dc3cc", "fe7c0b389cea246f"),
    "mnist": ("67c5fb8e454fa273", "ccc5c6165622bc02"),
    "cifar10": ("04e7dc871e9ef196", "ce4ad232452f2054"),
    "lfw": ("e87f7847c2fa9238", "66752587e16341b9"),
    "audio-mnist": ("5b83131234521852", "712ecbc6193b3383"),
}


def _spec(name: str, params: dict | None = None) -> RunSpec:
    return RunSpec(
        ComponentSpec.resolve("dataset", name, params),
        ComponentSpec.resolve("model", "mlp"),
        ComponentSpec.resolve("defense", "none"),
        None,
        Scenario(),
        0,
    )


@pytest.mark.parametrize("name", sorted(RUN_IDS))
def test_run_ids_without_a_validation_split_are_those_of_before(name):
    assert (_spec(name).run_id, _spec(name).utility_id) == RUN_IDS[name]
    # an explicit 0 is no split: the same key (the label shows what the grid set)
    zero = _spec(name, {"validation": 0})
    assert (zero.run_id, zero.utility_id) == RUN_IDS[name]
    assert "validation" not in zero.key()["dataset"]["params"]
    split = _spec(name, {"validation": 0.2})
    assert split.run_id != _spec(name).run_id and split.utility_id != _spec(name).utility_id
    assert split.dataset.label == f"{name}[validation=0.2]"
    assert split.key()["dataset"]["params"]["validation"] == 0.2
    assert RunSpec.from_key(split.key()).run_id == split.run_id  # the key reads back
    assert RunSpec.from_key(_spec(name).key()).dataset.params_dict["validation"] == 0.0


def _old_load(cls: type, test_fraction: float = 0.2):
    """A shipped dataset's bundle as `FixedSplitDataset.load` built it before the parameter existed."""
    plugin = cls()
    x, y = plugin.examples()
    tr, te = fixed_split(y, test_fraction, shuffle=cls.shuffle)
    meta = DatasetMeta(
        name=cls.name,
        input_shape=tuple(x.shape[1:]),
        num_classes=cls.num_classes,
        modality=cls.modality,
        class_names=cls.class_names,
        source=cls.source,
        license=cls.license,
    )
    if meta.is_image:
        return make_bundle(meta, x[tr], y[tr], x[te], y[te])
    x_tr, x_te = standardize(x[tr], x[te])
    return make_bundle(meta, x_tr, y[tr], x_te, y[te])


def _equal(a, b) -> bool:
    tensors = ("x_train", "y_train", "x_test", "y_test")
    return a.meta == b.meta and all(torch.equal(getattr(a, t), getattr(b, t)) for t in tensors)


@pytest.mark.parametrize("name", SHIPPED)
def test_no_validation_split_is_bit_identical_to_before(name):
    cls = datasets.get(name)
    clear_memo()
    for params in ({}, {"validation": 0}, {"validation": 0.0, "test_fraction": 0.2}):
        assert _equal(load_dataset(name, params), _old_load(cls))
    assert _equal(load_dataset(name, {"test_fraction": 0.3, "validation": 0}), _old_load(cls, 0.3))


def _pixel_rows(bundle, x: torch.Tensor, scale: float) -> list[bytes]:
    """Each example as the bytes of its pixels in the source's integer levels (normalisation undone)."""
    px = torch.round(bundle.denormalize(x) * scale).to(torch.int16)
    return [row.numpy().tobytes() for row in px]


@pytest.mark.parametrize("name,scale", [("mnist5k", 255.0), ("digits", 16.0)])
def test_validation_set_is_disjoint_from_train_and_from_the_real_test_set(name, scale):
    full = load_dataset(name)
    tuned = load_dataset(name, {"validation": 0.2})
    n_train = len(full.y_train)
    n_val = int(np.ceil(0.2 * n_train))
    assert len(tuned.y_test) == n_val and len(tuned.y_train) == n_train - n_val
    if name == "mnist5k":
        assert (len(tuned.y_train), len(tuned.y_test)) == (3200, 800)
    # every example of both sources differs, so an example's pixels identify it
    train, val = _pixel_rows(tuned, tuned.x_train, scale), _pixel_rows(tuned, tuned.x_test, scale)
    real_train, real_test = _pixel_rows(full, full.x_train, scale), _pixel_rows(full, full.x_test, scale)
    assert len(set(real_train) | set(real_test)) == len(real_train) + len(real_test)
    assert len(set(train)) == len(train) and len(set(val)) == len(val)
    assert set(train).isdisjoint(val) and set(train) | set(val) == set(real_train)
    assert set(val).isdisjoint(real_test) and set(train).isdisjoint(real_test)
    # the labels travel with their examples
    label = dict(zip(real_train, full.y_train.tolist(), strict=True))
    assert [label[r] for r in val] == tuned.y_test.tolist()


def test_split_indices_are_disjoint_fixed_and_stratified():
    y = Mnist5k().examples()[1]
    tr, te = fixed_split(y, 0.2, shuffle=True)
    keep, val = validation_split(y[tr], 0.2, "dataset 'mnist5k'", shuffle=True)
    assert len(keep) == 3200 and len(val) == 800
    assert set(tr[keep]).isdisjoint(tr[val]) and set(tr[keep]) | set(tr[val]) == set(tr)
    assert set(tr[val]).isdisjoint(te)
    assert np.bincount(y[tr[val]], minlength=10).tolist() == [80] * 10  # 500 a class: 400 train, 80 val
    again = validation_split(y[tr], 0.2, "dataset 'mnist5k'", shuffle=True)
    assert np.array_equal(again[0], keep) and np.array_equal(again[1], val)  # fixed, not per call
    # shuffle=False keeps the source order (sorted), shuffle=True a fixed random one, same sets
    plain = validation_split(y[tr], 0.2, "dataset 'mnist5k'")
    assert np.array_equal(np.sort(keep), plain[0]) and np.array_equal(np.sort(val), plain[1])
    assert not np.array_equal(keep, plain[0])


@pytest.mark.parametrize("name", SHIPPED)
def test_validation_bundle_is_stratified_deterministic_and_normalised_on_its_train_set(name):
    clear_memo()
    a = load_dataset(name, {"validation": 0.25})
    clear_memo()
    b = load_dataset(name, {"validation": 0.25})
    assert a is not b and _equal(a, b)  # the same split every load (the run seed plays no part)
    k = a.meta.num_classes
    for y in (a.y_train, a.y_test):
        assert (torch.bincount(y, minlength=k) > 0).all()  # every class on both sides
    ftr = torch.bincount(a.y_train, minlength=k).double() / len(a.y_train)
    fval = torch.bincount(a.y_test, minlength=k).double() / len(a.y_test)
    assert (ftr - fval).abs().max() < 0.05
    if a.meta.is_image:  # statistics recomputed on train': its mean pixel is 0 once normalised
        assert a.meta.mean != load_dataset(name).meta.mean
        assert a.x_train.mean(dim=(0, 2, 3)).abs().max() < 1e-3
    else:
        assert a.x_train.mean(dim=0).abs().max() < 1e-4


def test_train_size_prefix_of_train_prime_samples_every_class():
    """mnist5k is stored sorted by class: the prefix a `train_size` run takes must not be."""
    b = load_dataset("mnist5k", {"validation": 0.2})
    for y, n in ((b.y_train, 200), (b.y_test, 100)):
        counts = torch.bincount(y[:n], minlength=10).double()
        assert (counts > 0).all() and counts.max() / counts.mean() < 2.0
        assert (y[1:] != y[:-1]).float().mean() > 0.3


def test_adult_validation_split_comes_from_the_official_train_file():
    full = load_dataset("adult")
    tuned = load_dataset("adult", {"validation": 0.2})
    assert len(tuned.y_test) == 6033 and len(tuned.y_train) == 30162 - 6033
    assert tuned.x_train.shape[1] == tuned.x_test.shape[1] == 103
    for attrs, y in ((tuned.attr_train, tuned.y_train), (tuned.attr_test, tuned.y_test)):
        assert set(attrs) == {"race", "sex"} and all(len(v) == len(y) for v in attrs.values())
    assert set(tuned.y_test.tolist()) == {0, 1}

    # the one-hot columns are exact: a row of adult.data is a row of the full load's train set, never of
    # its test set (the 5 numeric columns are scaled differently, so compare the 98 one-hot columns)
    def rows(x):
        return {r.numpy().tobytes() for r in x[:, 5:]}

    assert rows(tuned.x_test) <= rows(full.x_train)
    assert tuned.x_train[:, :5].mean(dim=0).abs().max() < 1e-4  # standardised on train'
    assert load_dataset("adult", {"validation": 0.2, "scaling": "minmax"}).x_train[:, :5].min() == 0


BAD = [
    (1.0, "parameter 'validation' must be [0, 1); got 1.0"),
    (-0.1, "parameter 'validation' must be [0, 1); got -0.1"),
    (0.999, "parameter 'validation' = 0.999 leaves 1 training and 1436 validation examples of 1437"),
    (0.005, "parameter 'validation' = 0.005 leaves 1429 training and 8 validation examples of 1437"),
]


@pytest.mark.parametrize("value,message", BAD)
def test_bad_values_are_refused_in_one_line_naming_the_parameter(value, message):
    with pytest.raises(ParamError) as info:
        load_dataset("digits", {"validation": value})
    text = str(info.value)
    assert text.startswith("dataset 'digits': ") and message in text and "\n" not in text


runner = CliRunner()


def test_cli_run_on_a_validation_split_completes_and_labels_its_rows(tmp_path):
    from fedbench.reporting.results import newest_results, read_results

    args = ["run", "smoke", "-d", "digits[validation=0.25]", "-D", "none", "-D", "dp-gaussian[sigma=0.01]"]
    sets = ["--set", "scenario.rounds=1", "--set", "scenario.train_size=300"]
    res = runner.invoke(app, [*args, *sets, "-o", str(tmp_path / "o"), "--no-cache"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    frame = read_results(newest_results(tmp_path / "o"))
    assert set(frame["dataset"]) == {"digits[validation=0.25]"} and set(frame["status"]) == {"ok"}
    assert set(frame["p_dataset_validation"]) == {0.25} and (frame["test_acc"] > 0.2).all()
    assert "| dataset" in (table := next((tmp_path / "o").glob("*.md")).read_text())
    assert "digits[validation=0.25]" in table  # the board's markdown names the split it measured on


def test_cli_refuses_a_split_too_large_before_any_run(tmp_path):
    out = tmp_path / "o"
    args = ["run", "smoke", "-d", "digits[validation=0.999]", "-o", str(out), "--cache-dir", str(tmp_path)]
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "parameter 'validation' = 0.999" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert not out.exists()


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">I", 0x0800 + array.ndim) + struct.pack(">" + "I" * array.ndim, *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def test_torchvision_dataset_holds_out_part_of_its_official_train_split(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    x_tr = rng.integers(0, 256, size=(40, 28, 28), dtype=np.uint8)
    y_tr = np.arange(40) % 10
    x_te = rng.integers(0, 256, size=(10, 28, 28), dtype=np.uint8)
    _write_idx(raw / "train-images-idx3-ubyte", x_tr)
    _write_idx(raw / "train-labels-idx1-ubyte", y_tr)
    _write_idx(raw / "t10k-images-idx3-ubyte", x_te)
    _write_idx(raw / "t10k-labels-idx1-ubyte", np.arange(10))
    b = load_dataset("mnist", {"validation": 0.25}, data_root=str(tmp_path))
    assert b.x_train.shape == (30, 1, 28, 28) and b.x_test.shape == (10, 1, 28, 28)
    assert b.meta.mean == (0.1307,)  # the published statistics, as without a split
    keep, val = validation_split(y_tr, 0.25, "dataset 'mnist'")

    def pixels(x: torch.Tensor) -> np.ndarray:
        return torch.round(b.denormalize(x) * 255)[:, 0].to(torch.uint8).numpy()

    assert np.array_equal(pixels(b.x_test), x_tr[val]) and not np.array_equal(pixels(b.x_test), x_te)
    assert np.array_equal(pixels(b.x_train), x_tr[keep])
    assert b.y_test.tolist() == y_tr[val].tolist() and sorted(b.y_test.tolist()) == list(range(10))


def test_audio_mnist_holds_out_part_of_its_training_split(tmp_path):
    from scipy.io import wavfile

    data = tmp_path / "AudioMNIST" / "data"
    rng = np.random.default_rng(0)
    meta = {}
    for s in (1, 2):
        meta[str(s)] = {"gender": "male" if s == 1 else "female", "native speaker": "yes", "accent": "x"}
        (data / f"{s:02d}").mkdir(parents=True)
        for d in range(10):
            for i in range(3):
                wave = (rng.normal(0, 3000, 4000)).astype(np.int16)
                wavfile.write(data / f"{s:02d}" / f"{d}_{s:02d}_{i}.wav", 8000, wave)
    (data / "audioMNIST_meta.txt").write_text(repr(meta))
    full = load_dataset("audio-mnist", {"size": 8}, data_root=str(tmp_path))
    tuned = load_dataset("audio-mnist", {"size": 8, "validation": 0.25}, data_root=str(tmp_path))
    assert (len(full.y_train), len(full.y_test)) == (48, 12)
    assert (len(tuned.y_train), len(tuned.y_test)) == (36, 12)
    assert (torch.bincount(tuned.y_test, minlength=10) > 0).all()  # stratified: every digit
    assert len(tuned.groups_train) == 36 and all(len(v) == 12 for v in tuned.attr_test.values())
    assert tuned.x_train.reshape(36, -1).mean(dim=0).abs().max() < 1e-4  # standardised on train'


def test_param_help_says_what_the_split_is_for():
    from fedbench.spec.params import describe_params

    for cls in (Digits, datasets.get("adult"), datasets.get("cifar10"), datasets.get("lfw")):
        info = {p.name: p for p in describe_params(cls.Params)}["validation"]
        assert info.default == 0.0 and info.range == "[0, 1)"
        assert "validation set" in info.help and "test set" in info.help
