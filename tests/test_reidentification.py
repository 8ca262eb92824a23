"""Re-identification (issue 27): the victim among 99 same-class training records, its floor and chance.

Properties with margins, never exact floats: these hold on any CPU.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from fedbench.data import load_dataset
from fedbench.metrics.reconstruction import score_reconstruction, score_reconstruction_run
from fedbench.metrics.reidentification import POOL_OTHERS, candidate_pools, reidentified


def _pixels(bundle, rows) -> np.ndarray:
    """Training records `rows` in [0, 1] pixel space, as the runner gives true images."""
    import torch

    x = bundle.x_train[torch.as_tensor(np.asarray(rows))]
    return bundle.denormalize(x).clamp(0, 1).numpy().astype(np.float32)


@pytest.fixture(scope="module")
def mnist():
    return load_dataset("mnist5k")


def _victims(bundle, rows):
    images = _pixels(bundle, rows)
    return images, bundle.y_train[list(rows)].numpy()


def _bundle(x: np.ndarray, y: np.ndarray):
    """A dataset made here: pixel images [N, C, H, W] in [0, 1] with labels (test split: the same)."""
    from fedbench.data.shipped import make_bundle
    from fedbench.plugin import DatasetMeta

    meta = DatasetMeta("made", tuple(x.shape[1:]), int(y.max()) + 1, "image")
    return make_bundle(
        meta, x.astype(np.float32), y.astype(np.int64), x.astype(np.float32), y.astype(np.int64)
    )


def test_the_pool_is_fixed_per_seed_and_victim(mnist):
    images, y = _victims(mnist, range(3))
    first = candidate_pools(mnist, images, y, seed=0)
    again = candidate_pools(mnist, images, y, seed=0)
    alone = candidate_pools(mnist, images[1:2], y[1:2], seed=0)  # a victim's pool ignores its batch
    other_seed = candidate_pools(mnist, images, y, seed=1)
    assert list(first["reid_victims"]) == [0, 1, 2]
    labels = mnist.y_train.numpy()
    for i, pool in enumerate(first["reid_pools"]):
        assert len(pool) == POOL_OTHERS == len(set(pool.tolist()))
        assert i not in pool and (labels[pool] == y[i]).all()  # same class, never the victim
        assert np.array_equal(pool, again["reid_pools"][i])
        assert np.array_equal(first["reid_others"][i], _pixels(mnist, pool))
    assert np.array_equal(first["reid_pools"][1], alone["reid_pools"][0])
    assert not np.array_equal(first["reid_pools"][0], other_seed["reid_pools"][0])


def test_a_perfect_reconstruction_reidentifies_and_another_record_does_not(mnist):
    images, y = _victims(mnist, range(4))
    pools = candidate_pools(mnist, images, y, seed=0)
    perfect = score_reconstruction(images, images, reid_others=pools["reid_others"])
    assert perfect.summary()["reid"] == 1.0 and perfect.per_image()["reid"] == [1, 1, 1, 1]
    assert perfect.summary()["reid_chance"] == pytest.approx(1 / (POOL_OTHERS + 1))
    # each reconstruction is a record of the victim's pool: it re-identifies that record, not the victim
    wrong = np.stack([pools["reid_others"][i][0] for i in range(4)])
    scores = score_reconstruction(images, wrong, reid_others=pools["reid_others"])
    assert scores.per_image()["reid"] == [0, 0, 0, 0]
    # a slightly noisy copy of the victim still singles it out
    noisy = np.clip(images + np.random.default_rng(0).normal(0, 0.05, images.shape), 0, 1)
    assert score_reconstruction(images, noisy, reid_others=pools["reid_others"]).summary()["reid"] == 1.0


def test_the_class_mean_does_not_beat_chance_on_real_digits(mnist):
    images, y = _victims(mnist, range(20))
    pools = candidate_pools(mnist, images, y, seed=0)
    labels = mnist.y_train.numpy()
    for i in range(3):  # the class-mean image is the mean of the training split's records of the class
        expected = _pixels(mnist, np.flatnonzero(labels == y[i])).mean(axis=0)
        assert np.abs(pools["class_means"][i] - expected).max() < 1e-4
    s = score_reconstruction(
        images, images, reid_others=pools["reid_others"], class_means=pools["class_means"]
    )
    floor = s.per_image()["reid_floor"]
    assert len(floor) == 20 and set(floor) <= {0, 1}
    assert sum(floor) <= 3  # chance is 1/100 per victim: 0.2 of 20 expected


def test_tie_rule():
    victim, other = np.zeros((1, 2, 2)), np.ones((1, 2, 2))
    others = other[None]
    assert reidentified(victim, np.full((1, 2, 2), 0.5), others) == 0  # equidistant: a tie fails
    assert reidentified(victim, np.full((1, 2, 2), 0.49), others) == 1
    assert reidentified(victim, other, others) == 0
    assert reidentified(victim, victim, np.stack([other, victim])) == 1  # distance 0 to the victim
    assert reidentified(victim, other, others[:0]) == 1  # no other candidate: chance is 1


def test_a_small_class_uses_every_other_record_and_records_the_pool_size():
    bundle = load_dataset("synthetic", {"n_train": 40, "classes": 4})  # 10 records per class
    images, y = _victims(bundle, range(2))
    pools = candidate_pools(bundle, images, y, seed=3)
    assert [len(p) for p in pools["reid_pools"]] == [9, 9]
    s = score_reconstruction(images, images, reid_others=pools["reid_others"])
    assert s.per_image()["reid_pool"] == [10, 10]
    assert s.summary()["reid_chance"] == pytest.approx(0.1)


def test_rgb_batches_and_duplicates_of_the_victim():
    rng = np.random.default_rng(0)
    x = rng.random((90, 3, 6, 6)).astype(np.float32)
    y = np.arange(90) % 3
    x[45] = x[3]  # an exact duplicate of record 3 (same class: 45 % 3 == 3 % 3)
    bundle = _bundle(x, y)
    rows = [45, 1, 2]  # B = 3, three classes; victim 45 is record 3's duplicate
    images, labels = _victims(bundle, rows)
    pools = candidate_pools(bundle, images, labels, seed=0)
    assert list(pools["reid_victims"]) == [3, 1, 2]  # a duplicate is keyed on the first of its copies
    # 30 per class: all but the victim, and for victim 0 all but its duplicate too
    assert [len(p) for p in pools["reid_pools"]] == [28, 29, 29]
    for i, pool in enumerate(pools["reid_pools"]):
        assert (y[pool] == labels[i]).all() and rows[i] not in pool
    assert 3 not in pools["reid_pools"][0]
    assert pools["reid_others"][0].shape == (28, 3, 6, 6)
    s = score_reconstruction(images, images[::-1], reid_others=pools["reid_others"])  # order matched
    assert s.per_image()["reid"] == [1, 1, 1]


def test_the_scorer_leaves_reid_empty_without_a_pool_or_images(mnist):
    images, y = _victims(mnist, range(2))
    attack = SimpleNamespace()
    direct = score_reconstruction_run(attack, {"images": images}, {"images": images, "y": y})
    assert direct.columns["reid"] is None and direct.columns["psnr"] == 100.0
    assert "psnr_floor" not in direct.columns
    assert direct.per_image["reid"] == [None, None] and direct.per_image["exact"] == [1, 1]
    truth = {"images": images, "y": y, **candidate_pools(mnist, images, y, seed=0)}
    label_only = score_reconstruction_run(attack, {"images": None, "labels": y}, truth)
    assert label_only.columns.get("reid") is None and label_only.per_image is None
    pooled = score_reconstruction_run(attack, {"images": images}, truth)
    assert pooled.columns["reid"] == 1.0 and pooled.columns["reid_floor"] <= 0.5
    assert 8 < pooled.columns["psnr_floor"] < 16 and pooled.columns["psnr_random"] < 8  # mean digit
    assert pooled.per_image["reid"] == [1, 1] and pooled.per_image["reid_pool"] == [100, 100]


def _tiny(defense: str, params: dict, seed: int = 0):
    """A tiny FedSGD B=1 run of `defense` under a 2-iteration iDLG on sklearn digits."""
    from fedbench.plugin import Scenario
    from fedbench.spec.run import ComponentSpec, RunSpec

    sc = dict(protocol="fedsgd", clients=2, rounds=1, batch_size=1, lr=0.05, train_size=40, test_size=20)
    return RunSpec(
        ComponentSpec.resolve("dataset", "digits", {}),
        ComponentSpec.resolve("model", "mlp", {"hidden": [8]}),
        ComponentSpec.resolve("defense", defense, params),
        ComponentSpec.resolve("attack", "idlg", {"iterations": 2}),
        Scenario.from_dict(sc),
        seed,
        preset="test",
    )


def test_every_defense_sees_the_same_pool_for_a_victim(tmp_path):
    from fedbench.execution.cache import RunCache
    from fedbench.execution.runner import Job, RunContext, attack_result, with_reid_pools

    cache, ctx = RunCache(tmp_path / "c"), RunContext()
    truths = []
    for defense, params in (("none", {}), ("dp-gaussian", {"sigma": 1.0})):
        spec = _tiny(defense, params)
        truths.append(with_reid_pools(Job(spec, ctx), attack_result(spec, cache, ctx))["truth"])
    a, b = truths
    assert np.array_equal(a["images"], b["images"]) and a["reid_victims"][0] >= 0
    assert np.array_equal(a["reid_victims"], b["reid_victims"])
    assert np.array_equal(a["reid_pools"][0], b["reid_pools"][0]) and len(a["reid_pools"][0]) == POOL_OTHERS


def test_fedbench_run_writes_reid_to_the_results_and_the_sidecar(tmp_path):
    from typer.testing import CliRunner

    from fedbench.cli import app
    from fedbench.reporting.results import newest_results, read_results

    out = tmp_path / "out"
    args = ["run", "smoke", "-a", "idlg[iterations=10]", "-D", "none", "-D", "dp-gaussian[sigma=1]"]
    sets = ["protocol=fedsgd", "batch_size=1", "rounds=1", "clients=2", "train_size=40"]
    args += [a for s in sets for a in ("--set", f"scenario.{s}")]
    res = CliRunner().invoke(app, [*args, "-o", str(out), "--cache-dir", str(tmp_path / "c")])
    assert res.exit_code == 0, res.output
    path = newest_results(out)
    frame = read_results(path).set_index("defense")
    assert set(frame.index) == {"none", "dp-gaussian[sigma=1]"}
    for column in ("reid", "reid_floor"):
        assert set(frame[column]) <= {0.0, 1.0}
    assert frame["reid_chance"].between(0.0099, 0.0101).all()
    assert frame["psnr_floor"].between(6, 20).all() and (frame["psnr_floor"] > frame["psnr_random"]).all()
    for defense, row in frame.iterrows():  # a reconstruction close to its victim must re-identify it
        assert row["psnr"] < 30 or row["reid"] == 1.0, defense
    per_image = json.loads(path.with_suffix(".json").read_text())["per_image"]
    for run_id in frame["run_id"]:
        scores = per_image[run_id]
        assert len(scores["reid"]) == len(scores["psnr"]) == len(scores["exact"]) == 1
        assert scores["reid"][0] in (0, 1) and scores["reid_floor"][0] in (0, 1)
        assert scores["reid_pool"] == [100]
