"""A board's reconstruction thumbnails (`fedbench leaderboard thumbnails`): the worst case per victim
over the suite, the same victims in every row, small committed PNGs, and no faces."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from test_leaderboard_build import TINY
from typer.testing import CliRunner

from fedbench.cli import app
from fedbench.errors import FedbenchError
from fedbench.reporting import leaderboard as lb
from fedbench.reporting import thumbnails as th
from fedbench.spec.run import ComponentSpec

COMMITTED = Path(__file__).resolve().parents[1] / "leaderboards"
PNG = b"\x89PNG\r\n\x1a\n"
runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_committed_thumbnails_are_small_pngs_of_inversion_boards_without_faces():
    found = sorted(COMMITTED.glob(f"*/{th.THUMBNAIL_FILE}"))
    assert found, "no committed board has reconstruction thumbnails"
    for path in found:
        data = path.read_bytes()
        assert data[:8] == PNG and len(data) <= th.MAX_BYTES, (path, len(data))
        board, _ = lb.load_board(path.parent)
        assert board.headline in ("psnr", "ssim", "mse", "lpips"), path
        assert not th.is_face_dataset(th.dataset_name(board)), path


# ------------------------------------------------------------------------------------- worst case


def _board(**scenario):
    board, _ = lb.load_board(COMMITTED / "malicious-server-mnist5k-fcnn")
    return board.model_copy(update={"scenario": {**board.scenario, **scenario}})


def _spec(attack: str):
    return SimpleNamespace(attack=ComponentSpec.resolve("attack", attack, {}))


def _result(truth: np.ndarray, images: np.ndarray) -> dict:
    return {"output": {"images": images, "labels": None, "extra": {}}, "truth": {"images": truth}}


def test_each_victim_shows_the_attack_that_leaks_most_on_it():
    rng = np.random.default_rng(0)
    truth = rng.random((3, 1, 8, 8)).astype(np.float32)
    close = np.clip(truth + 0.01 * rng.standard_normal(truth.shape), 0, 1).astype(np.float32)
    far = np.clip(truth + 0.3 * rng.standard_normal(truth.shape), 0, 1).astype(np.float32)
    a = np.stack([close[0], far[1], far[2]])  # dlg recovers victim 0
    b = np.stack([far[2], close[1], far[0]])  # idlg recovers victim 1, its outputs in another order
    results = {
        ("none", "dlg"): _result(truth, a),
        ("none", "idlg"): _result(truth, b),
        ("dp", "dlg"): _result(truth[1:], far[1:]),  # this defense's runs attack victims 1 and 2 only
    }
    runs = {"none": [_spec("dlg"), _spec("idlg")], "dp": [_spec("dlg")]}
    names = {id(s): (d, s.attack.name) for d, specs in runs.items() for s in specs}
    thumbs = th.worst_case(_board(), runs, lambda s: results[names[id(s)]], victims=4)
    assert np.array_equal(thumbs.truth, truth[1:])  # victims every defense's runs attack, in order
    (none, seen, rec, psnr, attacks), (dp, seen_dp, rec_dp, _, _) = thumbs.rows
    assert (none, dp) == ("none", "dp") and attacks == ("idlg", "dlg")
    assert np.array_equal(seen, truth[1:]) and np.array_equal(seen_dp, truth[1:])
    assert np.array_equal(rec[0], close[1]) and np.array_equal(rec[1], far[2])  # idlg's, matched
    assert np.array_equal(rec_dp, far[1:])
    assert psnr[0] > 30 > psnr[1]
    one = th.worst_case(_board(), runs, lambda s: results[names[id(s)]], victims=1)
    assert len(one.truth) == 1 and one.rows[0][4] == ("idlg",)


def test_a_defense_that_attacked_other_inputs_shows_its_own():
    """FRL reserves training data, so its runs attack other victims: its row shows its own first
    inputs (drawn above it), the others the victims most defenses share."""
    rng = np.random.default_rng(2)
    truth = rng.random((3, 1, 8, 8)).astype(np.float32)
    other = rng.random((2, 1, 8, 8)).astype(np.float32)
    results = {"none": _result(truth, truth), "dp": _result(truth, truth[::-1]), "frl": _result(other, other)}
    runs = {d: [_spec("dlg")] for d in results}
    names = {id(s): d for d, specs in runs.items() for s in specs}
    thumbs = th.worst_case(_board(), runs, lambda s: results[names[id(s)]], victims=2)
    assert np.array_equal(thumbs.truth, truth[:2])
    rows = {d: (seen, rec) for d, seen, rec, _, _ in thumbs.rows}
    assert np.array_equal(rows["none"][0], truth[:2]) and np.array_equal(rows["dp"][0], truth[:2])
    assert np.array_equal(rows["frl"][0], other) and np.array_equal(rows["frl"][1], other)
    empty = {**results, "frl": _result(other, None)}  # no reconstruction under one defense
    with pytest.raises(FedbenchError, match="under frl holds a scored reconstruction"):
        th.worst_case(_board(), runs, lambda s: empty[names[id(s)]], victims=2)


def test_thumbnails_png_is_a_small_grey_grid(tmp_path):
    rng = np.random.default_rng(1)
    truth = rng.random((4, 1, 28, 28)).astype(np.float32)
    rows = tuple(
        (f"defense-{k}", truth, truth[::-1], (12.0, 13.0, None, 100.0), ("dlg",) * 4) for k in range(20)
    )
    path = th.save_thumbnails(th.Thumbnails("b", "psnr", 0, truth, rows), tmp_path / th.THUMBNAIL_FILE)
    from PIL import Image

    image = Image.open(path)
    assert image.mode == "L" and path.stat().st_size <= th.MAX_BYTES
    assert image.height > 20 * image.width / 6  # a row per defense under the truth
    own = (("frl", truth[::-1], truth, (12.0, 13.0, None, 100.0), ("dlg",) * 4),)
    th.save_thumbnails(th.Thumbnails("b", "psnr", 0, truth, rows + own), tmp_path / "own.png")
    taller = Image.open(tmp_path / "own.png")
    assert taller.width == image.width and taller.height > image.height  # one more defense and its inputs


def test_face_datasets_are_refused():
    for name in ("lfw-subset", "lfw-faces", "lfw[min_faces=20]", "celeba"):
        with pytest.raises(th.FaceDatasetError, match="faces"):
            th.refuse_faces(_board(dataset=name))
    th.refuse_faces(_board(dataset="mnist5k"))
    assert th.is_face_dataset("lfw-subset") and not th.is_face_dataset("cifar10")


# --------------------------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny board of tests/test_leaderboard_build.py, built with its own cache."""
    presets = tmp_path_factory.mktemp("presets")
    (presets / "tiny-board.toml").write_text(TINY)
    root = tmp_path_factory.mktemp("boards") / "leaderboards"
    cache = tmp_path_factory.mktemp("cache")
    build = ("leaderboard", "build", "tiny-board", "--preset-dir", presets)
    res = run(*build, "--dir", root, "--cache-dir", cache)
    assert res.exit_code == 0, res.output
    return root, presets, cache


def test_cli_draws_the_thumbnails_from_the_cache(tiny, tmp_path):
    root, presets, cache = tiny
    args = ("leaderboard", "thumbnails", "tiny-digits", "--dir", root, "--preset-dir", presets)
    res = run(*args, "--cache-dir", cache, "--cached-only", "--victims", "2")
    assert res.exit_code == 0, res.output
    path = root / "tiny-digits" / th.THUMBNAIL_FILE
    assert path.read_bytes()[:8] == PNG and path.stat().st_size <= th.MAX_BYTES
    assert "4 runs read from the cache, 0 computed" in res.output  # 2 defenses x 2 attacks of seed 0
    fresh = tmp_path / "empty-cache"
    res = run(*args, "--cache-dir", fresh, "--cached-only")
    assert res.exit_code == 2 and "4 of the 4 attack runs of seed 0" in res.output, res.output
    res = run(*args, "--cache-dir", fresh, "--seed", "1", "--out", tmp_path / "t.png")
    assert res.exit_code == 0, res.output
    assert "[4/4] computed" in res.output and (tmp_path / "t.png").is_file()
    res = run(*args, "--cache-dir", cache, "--seed", "7")
    assert res.exit_code == 2 and "no seed 7" in res.output


def test_cli_refuses_a_face_board_and_writes_nothing(tiny, tmp_path):
    import shutil

    root, presets, cache = tiny
    copy = tmp_path / "boards"
    shutil.copytree(root, copy)
    folder = copy / "tiny-digits"
    (folder / th.THUMBNAIL_FILE).unlink(missing_ok=True)
    for path in [folder / lb.BOARD_FILE, *(folder / lb.ENTRIES_DIR).glob("*.json")]:
        doc = json.loads(path.read_text())
        doc["scenario"]["dataset"] = "lfw-subset"
        path.write_text(json.dumps(doc))
    res = run("leaderboard", "thumbnails", "tiny-digits", "--dir", copy, "--cache-dir", cache)
    assert res.exit_code == 2 and "faces" in res.output, res.output
    assert not (folder / th.THUMBNAIL_FILE).exists()


def test_help_says_how_long_and_why_no_faces():
    res = run("leaderboard", "thumbnails", "--help")
    assert res.exit_code == 0 and "Examples" in res.output
    text = " ".join(res.output.split())
    assert "about 15 s" in text and "faces" in text and "real people" in text
