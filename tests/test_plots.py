"""Plots: files open as images of the right size; axes carry metric and direction; legend present."""

from __future__ import annotations

import numpy as np
import pytest
from test_tables import make_rows, write_synthetic

from fedbench.errors import FedbenchError
from fedbench.reporting.leaderboard import tradeoff_points
from fedbench.reporting.plots import (
    ReconstructionPanel,
    save_reconstruction_grid,
    save_reconstructions_by_defense,
    save_tradeoff,
    tradeoff_figure,
)
from fedbench.reporting.tables import load_results, pivot


def _read(path):
    import matplotlib.image as mpimg

    return mpimg.imread(path)


def test_reconstruction_grid_png(tmp_path):
    rng = np.random.default_rng(0)
    true = rng.random((3, 1, 8, 8))
    rec = np.clip(true + 0.1 * rng.standard_normal(true.shape), 0, 1)
    path = save_reconstruction_grid(true, rec, [20.5, 18.0, float("nan")], tmp_path / "g.png", title="t")
    img = _read(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 200  # 2 rows x 3 images
    colour = save_reconstruction_grid(
        rng.random((2, 3, 8, 8)), rng.random((2, 3, 8, 8)), [1, 2], tmp_path / "c.svg"
    )
    assert colour.read_text().lstrip().startswith("<?xml")
    with pytest.raises(ValueError, match="psnr has 1 values"):
        save_reconstruction_grid(true, rec, [1.0], tmp_path / "x.png")
    with pytest.raises(FedbenchError, match=".png or .svg"):
        save_reconstruction_grid(true, rec, [1, 2, 3], tmp_path / "x.jpg")


def test_reconstructions_by_defense(tmp_path):
    rng = np.random.default_rng(1)
    panels = [
        ReconstructionPanel(
            name, rng.random((4, 1, 8, 8)), rng.random((4, 1, 8, 8)), (10.0, 11.0, 12.0, 13.0)
        )
        for name in ("none", "dp-gaussian[sigma=0.1]")
    ]
    img = _read(save_reconstructions_by_defense(panels, tmp_path / "r.png", max_images=3))
    assert img.shape[0] > 150  # three rows: truth + two defenses


def test_tradeoff_axes_legend_and_front(tmp_path):
    path = write_synthetic(tmp_path / "s.csv")
    points, ulabel, llabel = tradeoff_points(pivot(load_results([path])))
    assert {p.family for p in points} == {"none", "dp-gaussian", "sparsification"}
    assert all(p.pareto_rank == 1 for p in points)
    assert all(p.utility_err > 0 for p in points)  # error bars from seeds
    fig = tradeoff_figure(points, ulabel, llabel)
    ax = fig.axes[0]
    assert ax.get_ylabel().startswith("test accuracy (%) ↑")
    assert ax.get_xlabel().startswith("psnr ↓") and "worst case over the attack suite" in ax.get_xlabel()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"none", "dp-gaussian", "sparsification", "Pareto front (rank 1)"} <= set(legend)
    out = save_tradeoff(points, tmp_path / "t.png", ulabel, llabel, title="synthetic")
    img = _read(out)
    assert img.shape[1] >= 600 and img.shape[0] >= 400


def test_tradeoff_needs_leakage(tmp_path):
    rows = [dict(r, attack="", psnr=None, ssim=None, label_acc=None) for r in make_rows(attacks=("idlg",))]
    path = write_synthetic(tmp_path / "u.csv", rows)
    with pytest.raises(FedbenchError, match="no attack runs"):
        tradeoff_points(pivot(load_results([path])))


# ------------------------------------------------------------------ figures a person can look at (#20)


def _looked_at(path):
    """The PNG fits a screen's width and is not blank."""
    from fedbench.reporting.plots import MAX_WIDTH_PX

    img = _read(path)
    assert img.shape[1] <= MAX_WIDTH_PX, f"{path}: {img.shape[1]} px wide"
    assert float(np.var(img[..., :3])) > 0.0, f"{path} is blank"
    return img


def test_reconstruction_grid_wraps_and_caps(tmp_path):
    rng = np.random.default_rng(2)

    def grid(n, **kw):
        true = rng.random((n, 3, 16, 16))
        psnr = list(rng.random(n) * 30)
        return _looked_at(save_reconstruction_grid(true, true * 0.5, psnr, tmp_path / f"g{n}.png", **kw))

    one_row, two_rows, capped = grid(8), grid(16), grid(200)
    assert two_rows.shape[1] == one_row.shape[1]  # wraps at 8 images: never wider than one full row
    assert one_row.shape[0] < two_rows.shape[0] < capped.shape[0]  # the height grows with the count
    everything = grid(72, max_images=None)  # more than the 64 the capped grid shows
    assert everything.shape[1] == one_row.shape[1] and everything.shape[0] > capped.shape[0]
    with pytest.raises(ValueError, match="max_images"):
        grid(3, max_images=0)


def test_best_and_worst_selection():
    from fedbench.reporting.plots import best_and_worst

    assert best_and_worst([3.0, 1.0], 8) == ([0, 1], "")  # all fit: in order, no caption
    chosen, caption = best_and_worst([5.0, float("nan"), 30.0, 12.0, None, 20.0], 4)
    assert chosen == [2, 5, 1, 4]  # best two (30, 20 dB), then the worst two: no PSNR counts as worst
    assert caption == "best 2 and worst 2 of 6 images by PSNR"
    assert best_and_worst([1.0, 2.0, 3.0], 1) == ([2], "best 1 and worst 0 of 3 images by PSNR")


def test_reconstructions_by_defense_many_images_and_shared_truth(tmp_path, monkeypatch):
    from fedbench.reporting import plots

    rng = np.random.default_rng(3)
    psnr = tuple(float(x) for x in range(40))
    many = [
        ReconstructionPanel(f"{name}\nidlg", rng.random((40, 1, 8, 8)), rng.random((40, 1, 8, 8)), psnr)
        for name in ("none", "dp-gaussian[clip=1,sigma=0.1]", "soteria[pruning_rate=60]")
    ]
    wide = _looked_at(save_reconstructions_by_defense(many, tmp_path / "m.png", max_images=24))
    few = _looked_at(save_reconstructions_by_defense(many, tmp_path / "f.png", max_images=8))
    assert wide.shape[0] > few.shape[0]  # 24 images per defense wrap into 3 rows, 8 into one

    figures = []
    real_save = plots._save
    monkeypatch.setattr(
        plots, "_save", lambda fig, path, *dpi: figures.append(fig) or real_save(fig, path, *dpi)
    )
    save_reconstructions_by_defense(many, tmp_path / "c.png", max_images=8)
    texts = [ax.get_ylabel() for ax in figures[-1].axes]
    assert sum("best 4 and worst 4 of 40 images by PSNR" in t for t in texts) == 3
    truth = rng.random((5, 1, 8, 8))  # one private batch attacked under each defense: truth once
    same = [ReconstructionPanel(n, truth, rng.random((5, 1, 8, 8)), (1.0,) * 5) for n in ("a", "b")]
    save_reconstructions_by_defense(same, tmp_path / "s.png")
    assert [ax.get_ylabel() for ax in figures[-1].axes if ax.get_ylabel()] == ["truth", "a", "b"]


def test_save_lowers_the_dpi_of_a_wide_figure_and_refuses_an_absurd_one(tmp_path):
    from fedbench.reporting import plots

    plt = plots._pyplot()
    fig = plt.figure(figsize=(60, 2))  # 7,200 px at the default dpi
    fig.add_subplot().plot([0, 1], [0, 1])
    assert plots.save_dpi(fig) < plots.DPI
    _looked_at(plots._save(fig, tmp_path / "wide.png"))
    huge = plt.figure(figsize=(400, 2))  # would need < 10 dpi: unreadable, so lay it out narrower
    huge.add_subplot().plot([0, 1], [0, 1])
    with pytest.raises(ValueError, match="lay it out narrower"):
        plots._save(huge, tmp_path / "huge.png")
    assert not (tmp_path / "huge.png").exists()  # nothing half-written


def _dense_points(n=30):
    """`n` - 1 sweep points in a sliver of the axes (an undefended point far away sets the scale)."""
    from fedbench.reporting.plots import TradeoffPoint

    sweep = [
        TradeoffPoint(
            f"dp-gaussian[clip=1,sigma={0.01 * i:.2f}]",
            "dp-gaussian",
            utility=90.0 - 0.02 * i,
            leakage=20.0 - 0.01 * i,
            pareto_rank=1 if i % 4 == 0 else 2,
        )
        for i in range(n - 1)
    ]
    return [TradeoffPoint("none", "none", utility=95.0, leakage=35.0, pareto_rank=1), *sweep]


def test_tradeoff_dense_labels_do_not_overlap(tmp_path):
    from matplotlib.text import Annotation, Text

    points = _dense_points()
    fig = tradeoff_figure(points, "test accuracy (%) ↑", "psnr ↓")
    fig.canvas.draw()  # place the annotations as they are drawn
    renderer = fig.canvas.get_renderer()
    labels = [t for t in fig.axes[0].texts if isinstance(t, Annotation)]
    assert len(labels) == 30
    boxes = [Text.get_window_extent(t, renderer) for t in labels]  # the text, without its leader line
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not (a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1), (a, b)
    _looked_at(save_tradeoff(points, tmp_path / "dense.png", "acc", "psnr", title="30 dense points"))


def test_tradeoff_random_floor(tmp_path):
    from matplotlib.patches import Polygon, Rectangle

    points = _dense_points(5)
    fig = tradeoff_figure(points, "acc", "psnr", floor=9.5)
    ax = fig.axes[0]
    assert any(t.get_text().strip() == "random image" for t in ax.texts)
    assert "random image" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(list(line.get_xdata()) == [9.5, 9.5] for line in ax.get_lines())
    assert any(isinstance(p, Polygon | Rectangle) and p.get_alpha() for p in ax.patches)  # the band
    assert ax.get_xlim()[0] < 9.5 < ax.get_xlim()[1]  # drawn inside the axes even far from the points
    plain = tradeoff_figure(points, "acc", "psnr")
    assert not any("random image" in t.get_text() for t in plain.axes[0].texts)
    _looked_at(save_tradeoff(points, tmp_path / "floor.png", "acc", "psnr", floor=9.5))


def test_random_floor_reads_the_results_columns(tmp_path):
    from fedbench.reporting.plots import random_floor

    rows = [dict(r, psnr_random=10.0 + (r["seed"]), ssim_random=0.02) for r in make_rows()]
    frame = load_results([write_synthetic(tmp_path / "r.csv", rows)]).frame
    assert random_floor(frame, "psnr") == pytest.approx(10.5)
    assert random_floor(frame, "psnr_worst") == pytest.approx(10.5)
    assert random_floor(frame, "ssim") == pytest.approx(0.02)
    assert random_floor(frame, "label_acc") is None  # no floor for other metrics
    assert random_floor(load_results([write_synthetic(tmp_path / "n.csv")]).frame, "psnr") is None


def test_plot_tradeoff_cli_draws_the_floor(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from fedbench.cli import app
    from fedbench.reporting import plots

    rows = [dict(r, psnr_random=8.0, ssim_random=0.01) for r in make_rows()]
    path = write_synthetic(tmp_path / "f.csv", rows)
    seen = {}
    real = plots.save_tradeoff
    monkeypatch.setattr(plots, "save_tradeoff", lambda *a, **kw: seen.update(kw) or real(*a, **kw))
    res = CliRunner().invoke(app, ["plot", "tradeoff", str(path), "--out", str(tmp_path / "t.png")])
    assert res.exit_code == 0, res.output
    assert seen["floor"] == pytest.approx(8.0)
    _looked_at(tmp_path / "t.png")
