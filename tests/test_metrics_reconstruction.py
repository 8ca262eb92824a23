"""Reconstruction metrics: PSNR/SSIM vs scikit-image, matching, label recovery, LPIPS availability."""

from __future__ import annotations

import json
import math
import os
import socket

import numpy as np
import pytest
import torch
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from fedbench.metrics import lpips_metric
from fedbench.metrics.reconstruction import (
    SUMMARY_KEYS,
    UNMATCHED_SCORES,
    label_accuracy,
    match,
    matched_label_accuracy,
    mse,
    psnr,
    random_baseline,
    score_reconstruction,
    ssim,
    ssim_window,
)


def _sk_ssim(t: np.ndarray, r: np.ndarray, win: int | None = None) -> float:
    kw = {"data_range": 1.0}
    if win is not None:
        kw["win_size"] = win
    if t.shape[0] == 1:
        return structural_similarity(t[0], r[0], **kw)
    return structural_similarity(t, r, channel_axis=0, **kw)


def _noisy(x: np.ndarray, sigma: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(x + sigma * rng.standard_normal(x.shape), 0, 1)


def _camera_crops(n: int = 4, size: int = 32) -> np.ndarray:
    from skimage.data import camera

    img = camera().astype(np.float64) / 255.0
    return np.stack([img[None, 100 + 40 * i : 100 + 40 * i + size, 150 : 150 + size] for i in range(n)])


def _digits(n: int = 6) -> np.ndarray:
    from sklearn.datasets import load_digits

    return (load_digits().images[:n] / 16.0)[:, None]


def _astronaut(n: int = 3, size: int = 24) -> np.ndarray:
    from skimage.data import astronaut

    img = astronaut().astype(np.float64).transpose(2, 0, 1) / 255.0
    return np.stack([img[:, 50 + 60 * i : 50 + 60 * i + size, 200 : 200 + size] for i in range(n)])


# ------------------------------------------------------------------------------------ PSNR / SSIM


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.random.default_rng(0).random((5, 3, 16, 16)),
        lambda: np.random.default_rng(1).random((4, 1, 9, 12)),
        _camera_crops,
        _digits,
        _astronaut,
    ],
    ids=["random-rgb", "random-gray", "camera", "digits", "astronaut"],
)
def test_psnr_ssim_match_skimage(make):
    t = make()
    r = _noisy(t, 0.1, 42)
    p, s, m = psnr(t, r), ssim(t, r), mse(t, r)
    for i in range(t.shape[0]):
        assert p[i] == pytest.approx(peak_signal_noise_ratio(t[i], r[i], data_range=1.0), abs=1e-4)
        assert s[i] == pytest.approx(_sk_ssim(t[i], r[i]), abs=1e-4)
        assert m[i] == pytest.approx(np.mean((t[i] - r[i]) ** 2), abs=1e-12)


def test_torch_inputs_match_numpy():
    t = _digits(4)
    r = _noisy(t, 0.2, 3)
    np.testing.assert_allclose(psnr(torch.tensor(t), torch.tensor(r)), psnr(t, r), atol=1e-12)
    t32 = torch.tensor(t, dtype=torch.float32)
    np.testing.assert_allclose(ssim(t32, torch.tensor(r)), ssim(t, r), atol=1e-5)


@pytest.mark.parametrize("side,win", [(5, 5), (6, 5), (4, 3), (3, 3), (7, 7), (8, 7)])
def test_ssim_small_images_use_smaller_window(side, win):
    assert ssim_window(side, side + 3) == win
    t = np.random.default_rng(side).random((3, 2, side, side))
    r = _noisy(t, 0.15, side)
    s = ssim(t, r)
    for i in range(3):
        assert s[i] == pytest.approx(_sk_ssim(t[i], r[i], win=win), abs=1e-4)


def test_ssim_rejects_tiny_images():
    with pytest.raises(ValueError, match="at least 3x3"):
        ssim(np.zeros((1, 1, 2, 5)), np.zeros((1, 1, 2, 5)))


def test_identical_images_score_the_cap():
    t = _digits(3)
    assert np.all(psnr(t, t) == 100.0)
    assert np.all(psnr(t, t, cap=50.0) == 50.0)
    np.testing.assert_allclose(ssim(t, t), 1.0, atol=1e-12)
    assert np.all(mse(t, t) == 0)
    # the cap also bounds finite values
    assert psnr(t, t + 1e-9).max() <= 100.0


def test_psnr_data_range():
    t = _digits(2)
    r = _noisy(t, 0.1, 0)
    np.testing.assert_allclose(psnr(t * 255, r * 255, data_range=255.0), psnr(t, r), atol=1e-9)


# ------------------------------------------------------------------------------------- matching


def test_matching_makes_scores_order_independent():
    t = _camera_crops(8, 16)
    r = _noisy(t, 0.05, 7)
    base = score_reconstruction(t, r, success_psnr=20.0)
    assert list(base.assignment) == list(range(8))
    perm = np.random.default_rng(0).permutation(8)
    shuffled = score_reconstruction(t, r[perm], success_psnr=20.0)
    # per-image scores stay aligned with the true images, and the summary is unchanged
    np.testing.assert_allclose(shuffled.psnr, base.psnr, atol=1e-12)
    np.testing.assert_allclose(np.sort(shuffled.ssim), np.sort(base.ssim), atol=1e-12)
    np.testing.assert_array_equal(perm[shuffled.assignment], np.arange(8))
    assert shuffled.summary() == pytest.approx(base.summary())


def test_match_is_optimal_not_greedy():
    # pairwise MSE [[0.09, 0.81], [0.04, 0.16]]: greedy on the smallest cost pairs true 1 with rec 0
    # (total 0.85); the optimal assignment is the identity (total 0.25)
    t = np.array([0.0, 0.5]).reshape(2, 1, 1, 1) * np.ones((2, 1, 3, 3))
    r = np.array([0.3, 0.9]).reshape(2, 1, 1, 1) * np.ones((2, 1, 3, 3))
    np.testing.assert_array_equal(match(t, r), [0, 1])
    np.testing.assert_array_equal(match(t, r[::-1]), [1, 0])


def test_fewer_reconstructions_than_true_images():
    t = _digits(5)
    r = _noisy(t[[3, 1]], 0.02, 1)
    sc = score_reconstruction(t, r, success_psnr=25.0)
    assert sc.assignment[3] == 0 and sc.assignment[1] == 1
    assert (sc.assignment == -1).sum() == 3
    um = sc.assignment == -1
    assert np.all(sc.psnr[um] == UNMATCHED_SCORES["psnr"])
    assert np.all(sc.ssim[um] == UNMATCHED_SCORES["ssim"])
    assert np.all(sc.mse[um] == UNMATCHED_SCORES["mse"])
    s = sc.summary()
    assert s["recovered"] == pytest.approx(2 / 5)
    assert s["psnr_worst"] == pytest.approx(sc.psnr[[1, 3]].max())
    assert s["psnr"] == pytest.approx(sc.psnr.mean())


def test_more_reconstructions_than_true_images_keeps_best():
    t = _digits(3)
    junk = np.random.default_rng(0).random((4,) + t.shape[1:])
    r = np.concatenate([junk[:2], t[[2, 0, 1]], junk[2:]])
    sc = score_reconstruction(t, r)
    np.testing.assert_array_equal(sc.assignment, [3, 4, 2])
    assert np.all(sc.psnr == 100.0)


# --------------------------------------------------------------------------------------- labels


def test_label_accuracy_is_a_multiset_comparison():
    assert label_accuracy([1, 1, 2], [2, 1, 1]) == 1.0
    assert label_accuracy([1, 1, 2], [2, 1, 3]) == pytest.approx(2 / 3)
    assert label_accuracy([1, 1, 2], [1, 1, 1]) == pytest.approx(2 / 3)
    assert label_accuracy([0, 1, 2, 3], [3]) == pytest.approx(1 / 4)  # missing predictions are wrong
    assert label_accuracy([0, 1], [0, 1, 5, 6]) == 1.0  # extra predictions do not lower it
    assert label_accuracy(torch.tensor([4, 4]), np.array([4.0, 5.0])) == 0.5
    with pytest.raises(ValueError, match="integer"):
        label_accuracy([1, 2], [1.5, 2])
    with pytest.raises(ValueError, match="1-D"):
        label_accuracy([[1, 2]], [1, 2])


def test_matched_label_accuracy_after_matching():
    t = _digits(4)
    y = np.array([0, 1, 2, 3])
    perm = np.array([2, 0, 3, 1])
    r = t[perm]
    y_rec = y[perm].copy()
    y_rec[0] = 9  # the reconstruction of true image 2 gets a wrong label
    sc = score_reconstruction(t, r, y_true=y, y_pred=y_rec, labels_aligned=True)
    assert sc.label_acc == pytest.approx(3 / 4)
    assert sc.label_acc_matched == pytest.approx(3 / 4)
    # same multiset, wrong alignment: multiset accuracy is perfect, matched accuracy is not
    sc2 = score_reconstruction(t, r, y_true=y, y_pred=y, labels_aligned=True)
    assert sc2.label_acc == 1.0 and sc2.label_acc_matched == 0.0
    assert matched_label_accuracy(y, y[perm], np.array([1, 3, 0, 2])) == 1.0
    assert matched_label_accuracy(y, y[perm], np.array([1, 3, 0, -1])) == 0.75


# -------------------------------------------------------------------------------------- summary


def test_summary_keys_and_none_semantics():
    t = _digits(4)
    r = _noisy(t, 0.1, 5)
    s = score_reconstruction(t, r).summary()
    assert tuple(s) == SUMMARY_KEYS
    assert s["lpips"] is None and s["lpips_worst"] is None
    assert s["label_acc"] is None and s["label_acc_matched"] is None and s["recovered"] is None
    for k in ("psnr", "psnr_worst", "ssim", "ssim_worst", "mse", "mse_worst"):
        assert isinstance(s[k], float)
    assert s["psnr_worst"] >= s["psnr"] and s["ssim_worst"] >= s["ssim"] and s["mse_worst"] <= s["mse"]

    fake_lpips = lambda a, b: mse(a, b) * 3  # noqa: E731 - a stand-in distance
    sc = score_reconstruction(
        t, r, y_true=[0, 1, 2, 3], y_pred=[3, 2, 1, 0], success_psnr=0.0, lpips_fn=fake_lpips
    )
    s = sc.summary()
    assert s["lpips"] == pytest.approx(s["mse"] * 3) and s["lpips_worst"] == pytest.approx(s["mse_worst"] * 3)
    assert s["label_acc"] == 1.0 and s["label_acc_matched"] is None and s["recovered"] == 1.0

    per = sc.per_image()
    reid_keys = {"exact", "reid", "reid_floor", "reid_pool"}
    assert set(per) == {"index", "match", "psnr", "ssim", "mse", "lpips"} | reid_keys
    assert all(len(v) == 4 for v in per.values())
    json.dumps(per)
    assert score_reconstruction(t, r).per_image()["lpips"] == [None] * 4
    # without candidate pools (tests/test_reidentification.py) re-identification stays empty
    assert s["reid"] is None and s["reid_floor"] is None and s["reid_chance"] is None
    assert per["reid"] == per["reid_floor"] == [None] * 4 and set(per["exact"]) <= {0, 1}


def test_label_only_scoring():
    sc = score_reconstruction(_digits(3), None, y_true=[1, 2, 2], y_pred=[2, 2, 7])
    s = sc.summary()
    assert s["label_acc"] == pytest.approx(2 / 3)
    assert s["psnr"] is None and s["ssim_worst"] is None and s["recovered"] is None
    assert sc.per_image()["psnr"] == []


def test_random_baseline_is_low_and_seeded():
    t = _camera_crops(4, 16)
    b1, b2 = random_baseline(t, seed=3), random_baseline(t, seed=3)
    assert b1 == b2
    assert set(b1) == {"psnr", "psnr_worst", "ssim", "ssim_worst", "mse", "mse_worst"}
    assert b1["psnr"] < 10 and b1["ssim"] < 0.1
    g = torch.Generator().manual_seed(0)
    assert random_baseline(t, seed=g)["psnr"] < 10
    assert random_baseline(t, seed=np.random.default_rng(0))["psnr"] < 10


# ------------------------------------------------------------------------------- input checking


def test_shape_and_value_errors():
    t = _digits(3)
    with pytest.raises(ValueError, match=r"same shape"):
        psnr(t, t[:2])
    with pytest.raises(ValueError, match=r"\[N, C, H, W\].*x\[None\]"):
        ssim(t[0], t[0])
    with pytest.raises(ValueError, match=r"\[C, H, W\]"):
        score_reconstruction(t, np.zeros((3, 1, 8, 7)))
    with pytest.raises(ValueError, match="NaN"):
        score_reconstruction(t, np.full(t.shape, np.nan))
    with pytest.raises(ValueError, match=r"clamp"):
        score_reconstruction(t, t * 2)
    with pytest.raises(ValueError, match=r"de-normalise"):
        score_reconstruction(t - 0.5, t)
    with pytest.raises(ValueError, match="y_true has 2 labels"):
        score_reconstruction(t, t, y_true=[1, 2], y_pred=[1, 2])
    with pytest.raises(ValueError, match="y_pred has 2 labels for 3"):
        score_reconstruction(t, t, y_true=[1, 2, 3], y_pred=[1, 2], labels_aligned=True)
    with pytest.raises(ValueError, match="cost"):
        match(t, t, cost="l1")
    with pytest.raises(ValueError, match="lpips_fn returned"):
        score_reconstruction(t, t, lpips_fn=lambda a, b: np.zeros(1))
    # rounding after de-normalisation is tolerated and clipped
    assert score_reconstruction(t + 1e-6, t).summary()["psnr"] == 100.0


# ---------------------------------------------------------------------------------------- LPIPS


def test_lpips_unavailable_without_backbone_weights(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(torch.hub, "_hub_dir", None)  # make sure get_dir() follows TORCH_HOME

    from fedbench._compat import import_torchvision

    import_torchvision()  # lpips imports torchvision at module level
    import lpips

    def no_construction(*a, **k):
        raise AssertionError("lpips.LPIPS must not be constructed without backbone weights")

    def no_network(*a, **k):
        raise AssertionError("no network access allowed")

    monkeypatch.setattr(lpips, "LPIPS", no_construction)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_network)

    ok, reason = lpips_metric.lpips_available()
    ckpt = os.path.join(str(tmp_path), "hub", "checkpoints")
    assert not ok
    assert reason == (
        f"LPIPS unavailable: backbone weights alexnet-owt-7be5be79.pth not in {ckpt}; "
        "place them there (they download on a connected machine)"
    )
    assert lpips_metric.get_lpips() is None
    vgg_reason = lpips_metric.lpips_available("vgg")[1]
    assert vgg_reason.startswith("LPIPS unavailable: backbone weights vgg16-397923af.pth")
    with pytest.raises(ValueError, match="not one of"):
        lpips_metric.lpips_available("resnet")


def test_backbone_file_names_follow_torchvision():
    from fedbench._compat import import_torchvision

    tv = import_torchvision()
    urls = {
        "alex": tv.models.AlexNet_Weights.IMAGENET1K_V1.url,
        "vgg": tv.models.VGG16_Weights.IMAGENET1K_V1.url,
        "squeeze": tv.models.SqueezeNet1_1_Weights.IMAGENET1K_V1.url,
    }
    assert {k: u.rsplit("/", 1)[1] for k, u in urls.items()} == lpips_metric.BACKBONE_FILES


def test_lpips_loads_backbone_from_cache_file(monkeypatch, tmp_path):
    """Wiring test with a stand-in weights file (random AlexNet saved to the cache path, since real
    weights cannot be downloaded here): the trunk must equal the file's tensors and no network is used."""
    from fedbench._compat import import_torchvision

    tv = import_torchvision()
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(torch.hub, "_hub_dir", None)
    monkeypatch.setattr(lpips_metric, "_cache", {})

    def no_network(*a, **k):
        raise AssertionError("no network access allowed")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_network)

    torch.manual_seed(0)
    state = tv.models.alexnet(weights=None).state_dict()
    path = lpips_metric.backbone_path("alex")
    os.makedirs(os.path.dirname(path))
    torch.save(state, path)
    ok, reason = lpips_metric.lpips_available()
    assert ok, reason
    fn = lpips_metric.get_lpips()
    assert fn is not None
    model = next(iter(lpips_metric._cache.values()))
    torch.testing.assert_close(model.net.slice1[0].weight, state["features.0.weight"])
    torch.testing.assert_close(getattr(model.net.slice5, "10").weight, state["features.10.weight"])

    t = _digits(3)  # 8x8 grayscale: repeated to RGB and upsampled to 32x32
    r = _noisy(t, 0.2, 0)
    d = fn(t, r)
    assert d.shape == (3,) and d.dtype == np.float64 and np.all(np.isfinite(d))
    np.testing.assert_allclose(fn(t, t), 0.0, atol=1e-6)
    sc = score_reconstruction(t, r[[2, 0, 1]], lpips_fn=fn)
    np.testing.assert_allclose(sc.lpips, d, rtol=1e-5)
    assert math.isfinite(sc.summary()["lpips_worst"])

    # a weights file that does not fit the architecture is an error, never a random trunk
    monkeypatch.setattr(lpips_metric, "_cache", {})
    torch.save({"features.0.weight": torch.zeros(1)}, path)
    with pytest.raises(RuntimeError, match="do not fit"):
        lpips_metric.get_lpips()


def test_best_matching_reuses_a_candidate_and_dominates_one_to_one():
    rng = np.random.default_rng(0)
    t = rng.random((3, 1, 4, 4))
    # one candidate equal to image 0, one close to images 1 and 2 alike: best credits both with it
    r = np.stack([t[0], (t[1] + t[2]) / 2])
    best = score_reconstruction(t, r, matching="best", success_psnr=40.0)
    strict = score_reconstruction(t, r, matching="one-to-one", success_psnr=40.0)
    assert best.assignment.tolist()[0] == 0 and best.assignment[1] == best.assignment[2] == 1
    assert (best.psnr >= strict.psnr - 1e-12).all() and best.psnr.sum() > strict.psnr.sum()
    s = best.summary()
    assert s["exact"] == pytest.approx(1 / 3) and s["recovered"] == pytest.approx(1 / 3)
    assert best.psnr[0] == 100.0  # capped
    with pytest.raises(ValueError, match="matching"):
        score_reconstruction(t, r, matching="greedy")


# ------------------------------------------------------------------------ LPIPS and ST-LPIPS in runs


def _tiny_attack_run(tmp_path, tag):
    """A tiny DLG + IG grid through the CLI (smoke preset on digits); its results frame and output."""
    from typer.testing import CliRunner

    from fedbench.cli import app
    from fedbench.reporting.results import newest_results, read_results

    sets = ("rounds=1", "clients=2", "local_steps=1", "batch_size=2", "train_size=40", "test_size=20")
    args = ["run", "smoke", "-D", "none", "-a", "dlg[iterations=2]", "-a", "ig[iterations=2]"]
    args += [a for s in sets for a in ("--set", f"scenario.{s}")]
    out = tmp_path / f"o-{tag}"
    res = CliRunner().invoke(
        app, [*args, "--threads", "1", "-o", str(out), "--cache-dir", str(tmp_path / "c")]
    )
    assert res.exit_code == 0, res.output
    return read_results(newest_results(out)), res.output


@pytest.fixture
def offline_lpips(monkeypatch, tmp_path):
    """A private torch hub folder, fresh LPIPS state, and any network access an error."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(torch.hub, "_hub_dir", None)
    for name in ("_cache", "_failed"):
        monkeypatch.setattr(lpips_metric, name, {})
    monkeypatch.setattr(lpips_metric, "_stated", set())

    def no_network(*a, **k):
        raise AssertionError("no network access allowed")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_network)


def test_a_run_fills_the_lpips_column_when_the_backbone_weights_are_present(offline_lpips, tmp_path):
    from fedbench._compat import import_torchvision

    tv = import_torchvision()
    # a stand-in for the ImageNet file: the trunk's keys and shapes (all LPIPS reads), random values
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in tv.models.alexnet(weights=None).features.state_dict().items()}
    torch.manual_seed(0)
    path = lpips_metric.backbone_path("alex")
    os.makedirs(os.path.dirname(path))
    torch.save({f"features.{k}": torch.randn(shape) * 0.05 for k, shape in shapes.items()}, path)
    frame, output = _tiny_attack_run(tmp_path, "with")
    assert len(frame) == 2
    assert set(frame["attack"]) == {"dlg[iterations=2]", "inverting-gradients[iterations=2]"}
    assert np.isfinite(frame["lpips"]).all() and np.isfinite(frame["lpips_worst"]).all()
    assert (frame["lpips"] >= 0).all() and "LPIPS unavailable" not in output

    # the attack results come from the cache and the metric is recomputed outside it: the same values
    again, _ = _tiny_attack_run(tmp_path, "again")
    assert again["from_cache"].all()
    np.testing.assert_allclose(again["lpips"], frame["lpips"])


def test_without_backbone_weights_lpips_is_empty_and_the_reason_stated_once(offline_lpips, tmp_path):
    frame, output = _tiny_attack_run(tmp_path, "without")
    assert len(frame) == 2 and frame["lpips"].isna().all()
    assert frame["psnr"].notna().all()
    assert output.count("warning: LPIPS unavailable: backbone weights alexnet-owt-7be5be79.pth not in") == 1


def test_a_weights_file_that_does_not_load_leaves_lpips_empty_with_its_reason(offline_lpips, tmp_path):
    path = lpips_metric.backbone_path("alex")
    os.makedirs(os.path.dirname(path))
    torch.save({"features.0.weight": torch.zeros(1)}, path)
    fn, reason = lpips_metric.run_lpips()
    assert fn is None and reason.startswith(f"LPIPS unavailable: backbone weights {path} do not load")
    assert lpips_metric.state_once(reason) == reason and lpips_metric.state_once(reason) is None


@pytest.mark.skipif(not lpips_metric.stlpips_installed(), reason="optional extra 'stlpips' not installed")
def test_st_lpips_is_its_own_column_from_the_shipped_weights(monkeypatch, tmp_path):
    monkeypatch.setattr(lpips_metric, "_st_cache", {})

    def no_network(*a, **k):
        raise AssertionError("no network access allowed")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_network)
    fn, reason = lpips_metric.run_st_lpips()
    assert fn is not None and reason is None
    t = _digits(3)
    d = fn(t, _noisy(t, 0.2, 0))
    assert d.shape == (3,) and np.all(np.isfinite(d)) and np.all(d > 0)
    np.testing.assert_allclose(fn(t, t), 0.0, atol=1e-6)
    s = score_reconstruction(t, _noisy(t, 0.2, 0), st_lpips_fn=fn)
    assert s.summary()["st_lpips"] == pytest.approx(d.mean()) and s.summary()["lpips"] is None
    assert "st_lpips" in s.per_image()
    frame, _ = _tiny_attack_run(tmp_path, "st")
    assert np.isfinite(frame["st_lpips"]).all() and np.isfinite(frame["st_lpips_worst"]).all()
