"""Figures: the privacy-utility trade-off plot and reconstruction grids (matplotlib, Agg backend).

Functions take data and a path, write a PNG or SVG (by the path's suffix) and return the path;
matplotlib is imported inside them (never at module import) and always with the Agg backend, so
plotting works headless and `fedbench --help` stays fast. `tradeoff_figure` returns the Figure itself
so tests can check its axes labels and legend.

A trade-off plot is drawn only when no identical one exists (`save_tradeoff`): the digest of what it
plots (points, labels, title, floor) and of what draws it (this module's code, matplotlib's version) is
stored in the PNG (a `tEXt` chunk, `DIGEST_KEY`), and a PNG in the target folder that carries the same
digest is copied instead: a re-run of an unchanged grid writes its plot without importing matplotlib
(2.4 s of the quickstart's cached re-run, issue 29).

Figures are meant to be looked at: image grids wrap at `PER_ROW` images (truth over reconstruction,
PSNR under each), large batches show their best and worst few by PSNR, and `_save` never writes a
figure wider than `MAX_WIDTH_PX` (it lowers the dpi when a figure would be wider, and refuses when that
would make it unreadable) -- a run once wrote a 52,200 px wide strip that no viewer shows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import struct
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedbench.errors import FedbenchError

FORMATS = (".png", ".svg")
MAX_WIDTH_PX = 4000  # widest figure written: wider ones do not fit any screen and viewers shrink them
DPI = 120
MIN_DPI = 50  # below this, text is unreadable: the figure has to be laid out narrower instead
PER_ROW = 8  # images per row in the reconstruction grids
GRID_MAX_IMAGES = 64  # images a single run's grid shows; more: the best and worst half each, by PSNR
RANDOM_FLOOR_LABEL = "random image"
DIGEST_KEY = "fedbench-digest"  # the PNG text chunk holding what a plot shows (`save_tradeoff`)
REUSE_SCAN = 50  # the newest PNGs of the folder looked at for an identical plot


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _check_path(path: str | Path) -> Path:
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise FedbenchError(f"{path}: plots are written as .png or .svg; change the file suffix")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _png_width(path: Path) -> int:
    """Pixel width from a PNG's IHDR chunk (bytes 16-20), without decoding the image."""
    with open(path, "rb") as fh:
        head = fh.read(24)
    return struct.unpack(">I", head[16:20])[0]


def save_dpi(fig, dpi: int = DPI, max_width: int = MAX_WIDTH_PX) -> int:
    """The dpi at which `fig` (saved with bbox_inches="tight") is at most `max_width` pixels wide.

    The width is measured from the figure's tight bounding box (plus the 0.1 in padding savefig adds on
    each side) before anything is written, so an oversized figure is never half-written.
    """
    bbox = fig.get_tightbbox(fig.canvas.get_renderer())
    width_in = bbox.width + 0.2
    if width_in * dpi <= max_width - 4:  # 4 px slack for savefig's rounding
        return dpi
    fitted = math.floor((max_width - 4) / width_in)
    if fitted < MIN_DPI:
        raise ValueError(
            f"figure is {width_in:.0f} in wide: {max_width} px would need {fitted} dpi; lay it out narrower"
        )
    return fitted


def _save(fig, path: Path, dpi: int = DPI, digest: str | None = None) -> Path:
    """Write `fig` to `path`; a PNG gets `digest` (when given) in its `DIGEST_KEY` text chunk."""
    plt = _pyplot()
    png = path.suffix.lower() == ".png"
    try:
        dpi = save_dpi(fig, dpi)
        metadata = {DIGEST_KEY: digest} if digest and png else None
        fig.savefig(path, dpi=dpi, bbox_inches="tight", metadata=metadata)
    finally:
        plt.close(fig)
    if path.suffix.lower() == ".png":
        width = _png_width(path)
        assert width <= MAX_WIDTH_PX, f"{path}: {width} px wide (limit {MAX_WIDTH_PX})"
    return path


def _as_images(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 4:
        raise ValueError(f"{name} must be [N, C, H, W], got shape {tuple(arr.shape)}")
    return np.clip(arr, 0.0, 1.0)


def _db(value: float | None) -> str:
    return "—" if value is None or not np.isfinite(value) else f"{value:.1f} dB"


def best_and_worst(psnr: Sequence[float | None], keep: int) -> tuple[list[int], str]:
    """Indices of the `keep` images to show out of len(psnr), and a caption saying which.

    All of them (in order) when they fit; else the best ceil(keep/2) and worst floor(keep/2) by PSNR
    (best = highest PSNR = most leaked), best first; images without a PSNR count as worst.
    """
    n = len(psnr)
    if n <= keep:
        return list(range(n)), ""
    score = [(-math.inf if v is None or not np.isfinite(v) else float(v)) for v in psnr]
    order = sorted(range(n), key=lambda i: (-score[i], i))  # best first, stable
    n_best = (keep + 1) // 2
    n_worst = keep - n_best
    chosen = order[:n_best] + (order[-n_worst:] if n_worst else [])
    return chosen, f"best {n_best} and worst {n_worst} of {n} images by PSNR"


@dataclass(frozen=True)
class _Row:
    """One row of a grid: a label at its left, images, a caption under each."""

    label: str
    images: tuple[np.ndarray, ...]
    captions: tuple[str, ...]


_GAP = None  # a spacer row between blocks


def _chunks(indices: Sequence[int], per_row: int) -> list[list[int]]:
    return [list(indices[i : i + per_row]) for i in range(0, len(indices), per_row)] or [[]]


def _rgb(img: np.ndarray) -> np.ndarray:
    """[C, H, W] in [0, 1] -> [H, W, 3] (grey images repeated over the channels)."""
    rgb = img[:3] if img.shape[0] >= 3 else np.repeat(img[:1], 3, axis=0)
    return rgb.transpose(1, 2, 0)


def _mosaic(images: Sequence[np.ndarray], gap: int) -> np.ndarray:
    """Images side by side on white, `gap` pixels apart (one imshow per row draws fast)."""
    h = max(img.shape[1] for img in images)
    w = max(img.shape[2] for img in images)
    out = np.ones((h, len(images) * (w + gap) - gap, 3))
    for c, img in enumerate(images):
        out[: img.shape[1], c * (w + gap) : c * (w + gap) + img.shape[2]] = _rgb(img)
    return out


def _render_rows(rows: Sequence[_Row | None], title: str = "", caption: str = "", cell: float = 1.3):
    """A figure of image rows (None = a gap), at most PER_ROW images wide, labels left of rows.

    Each row is one axes showing the row's images as a mosaic (hundreds of images draw in a second),
    placed in inches (square images, room for the captions under them), so the figure has no slack
    whatever the row count; row labels sit left of the figure and the tight bounding box at save time
    takes them in.
    """
    plt = _pyplot()
    from matplotlib.patches import Rectangle

    ncols = max(1, max((len(r.images) for r in rows if r is not None), default=1))
    side = cell - 0.1
    heights = [0.25 if r is None else side + (0.22 if any(r.captions) else 0.08) for r in rows]
    top = 0.45 if title else 0.1
    width, height = cell * ncols, top + sum(heights) + 0.05
    fig = plt.figure(figsize=(width, height))
    y = height - top
    for row, h in zip(rows, heights, strict=True):
        y -= h
        if row is None or not row.images:
            continue
        k = len(row.images)
        ax = fig.add_axes((0.05 / width, (y + h - side) / height, (k * cell - 0.1) / width, side / height))
        w = max(img.shape[2] for img in row.images)
        gap = max(1, round(w * 0.1 / side))  # the 0.1 in between images, in image pixels
        ax.imshow(_mosaic(row.images, gap), vmin=0.0, vmax=1.0, interpolation="nearest", aspect="auto")
        ax.set_frame_on(False)
        for c, img in enumerate(row.images):  # a thin frame each keeps pale images off the background
            ax.add_patch(
                Rectangle(
                    (c * (w + gap) - 0.5, -0.5),
                    img.shape[2],
                    img.shape[1],
                    fill=False,
                    linewidth=0.6,
                    edgecolor="0.2",
                    clip_on=False,
                )
            )
        ax.set_xticks([])
        ax.set_yticks([])
        for c, text in enumerate(row.captions):
            if text:
                ax.annotate(
                    text,
                    (c * (w + gap) + (w - 1) / 2, 0.0),
                    xycoords=("data", "axes fraction"),
                    xytext=(0, -2),
                    textcoords="offset points",
                    ha="center",
                    va="top",
                    fontsize=7,
                )
        if row.label:
            ax.set_ylabel(row.label, fontsize=8, rotation=0, ha="right", va="center")
    if title:
        fig.suptitle(title, fontsize=10, y=1 - 0.12 / height, va="top")
    if caption:
        fig.text(0.5, 0.0, caption, ha="center", va="top", fontsize=8, style="italic")
    return fig


def _pair_rows(
    true: np.ndarray,
    rec: np.ndarray,
    psnr: Sequence[float | None],
    chosen: Sequence[int],
    rec_label: str,
    numbered: bool,
) -> list[_Row]:
    """Truth over reconstruction, wrapped at PER_ROW: two rows per chunk of chosen images."""
    rows: list[_Row] = []
    for chunk in _chunks(chosen, PER_ROW):
        rows.append(
            _Row("truth", tuple(true[i] for i in chunk), tuple(f"#{i}" if numbered else "" for i in chunk))
        )
        psnr_at = [psnr[i] if i < len(psnr) else None for i in chunk]
        rows.append(_Row(rec_label, tuple(rec[i] for i in chunk), tuple(_db(v) for v in psnr_at)))
    return rows


def save_reconstruction_grid(
    true_images: np.ndarray,
    reconstructions: np.ndarray,
    psnr: Sequence[float],
    path: str | Path,
    title: str = "",
    max_images: int | None = GRID_MAX_IMAGES,
) -> Path:
    """Ground truth over reconstructions, wrapped at PER_ROW images a row, PSNR under each reconstruction.

    `true_images` and `reconstructions` are [N, C, H, W] arrays in [0, 1], aligned (reconstruction i
    matched to true image i); `psnr` holds one value per image (None/NaN is shown as "—"). More than
    `max_images` (None: no limit): the best and worst few by PSNR, numbered, and a caption says so.
    """
    true = _as_images(true_images, "true_images")
    rec = _as_images(reconstructions, "reconstructions")
    if true.shape != rec.shape:
        raise ValueError(f"true_images {true.shape} and reconstructions {rec.shape} differ in shape")
    n = true.shape[0]
    if len(psnr) != n:
        raise ValueError(f"psnr has {len(psnr)} values for {n} images")
    if max_images is not None and max_images < 1:
        raise ValueError(f"max_images must be at least 1, got {max_images}")
    path = _check_path(path)
    chosen, caption = best_and_worst(psnr, n if max_images is None else max_images)
    rows: list[_Row | None] = []
    for k, row in enumerate(_pair_rows(true, rec, psnr, chosen, "reconstruction", numbered=bool(caption))):
        if k and k % 2 == 0:
            rows.append(_GAP)
        rows.append(row)
    return _save(_render_rows(rows, title, caption), path)


@dataclass(frozen=True)
class ReconstructionPanel:
    """One defense's best reconstruction batch for `reconstructions_figure`."""

    label: str
    true_images: np.ndarray
    reconstructions: np.ndarray
    psnr: tuple[float, ...]


def save_reconstructions_by_defense(
    panels: Sequence[ReconstructionPanel],
    path: str | Path,
    title: str = "",
    max_images: int = PER_ROW,
    dpi: int = DPI,
) -> Path:
    """One block per defense: its truth over its reconstruction (PSNR under), wrapped at PER_ROW images.

    When the panels show the same ground truth (the same private batch attacked under each defense),
    the truth is drawn once above the defenses' rows, so they compare at a glance. A defense that
    attacked other inputs (one that reserves training data, say, shifts the clients' shards) gets its
    own truth row, labelled "its inputs", right above its reconstructions; the common truth is the one
    most panels share. A panel with more than `max_images` images shows its best and worst few by PSNR;
    its row label says so (the panels are then drawn as pairs).
    """
    if not panels:
        raise FedbenchError("no reconstructions to plot; the results hold no image-attack runs")
    if max_images < 1:
        raise ValueError(f"max_images must be at least 1, got {max_images}")
    path = _check_path(path)
    prepared = []
    for panel in panels:
        true = _as_images(panel.true_images, "true_images")
        rec = _as_images(panel.reconstructions, "reconstructions")
        n = min(true.shape[0], rec.shape[0])
        chosen, which = best_and_worst(list(panel.psnr[:n]) + [None] * (n - len(panel.psnr[:n])), max_images)
        prepared.append((panel, true, rec, chosen, which))
    truths = [true for _p, true, *_x in prepared]
    common = max(truths, key=lambda t: sum(u.shape == t.shape and np.array_equal(u, t) for u in truths))
    same = [true.shape == common.shape and np.array_equal(true, common) for true in truths]
    rows: list[_Row | None] = []
    if not any(which for *_x, which in prepared) and sum(same) >= min(2, len(prepared)):
        # one truth row per chunk, every defense's reconstructions under it
        n = max(len(chosen) for *_x, chosen, _w in prepared)
        for k, chunk in enumerate(_chunks(list(range(n)), PER_ROW)):
            if k:
                rows.append(_GAP)
            rows.append(_Row("truth", tuple(common[i] for i in chunk if i < len(common)), ("",) * len(chunk)))
            for (panel, true, rec, chosen, _w), ours in zip(prepared, same, strict=True):
                idx = [i for i in chunk if i < len(chosen)]
                if not ours:
                    rows.append(_Row("its inputs", tuple(true[i] for i in idx), ("",) * len(idx)))
                rows.append(
                    _Row(
                        panel.label,
                        tuple(rec[i] for i in idx),
                        tuple(_db(panel.psnr[i] if i < len(panel.psnr) else None) for i in idx),
                    )
                )
    else:
        for k, (panel, true, rec, chosen, which) in enumerate(prepared):
            if k:
                rows.append(_GAP)
            label = panel.label + (f"\n({which})" if which else "")
            rows.extend(_pair_rows(true, rec, panel.psnr, chosen, label, numbered=bool(which)))
    return _save(_render_rows(rows, title), path, dpi)


# -------------------------------------------------------------------------------------- trade-off


@dataclass(frozen=True)
class TradeoffPoint:
    """One defense configuration on the trade-off plot (means over seeds, spread = error bar; an
    interval the metric's range clipped, or a rate's, is an asymmetric bar: (below, above))."""

    label: str
    family: str
    utility: float
    leakage: float
    utility_err: float | tuple[float, float] = 0.0
    leakage_err: float | tuple[float, float] = 0.0
    pareto_rank: int = 0


def _error_bars(errs: Sequence[float | tuple[float, float]]):
    """Matplotlib's xerr/yerr: one value per point, or (2, N) below/above when any bar is asymmetric."""
    if not any(isinstance(e, tuple) for e in errs):
        return [e or 0.0 for e in errs]
    pairs = [e if isinstance(e, tuple) else (e or 0.0, e or 0.0) for e in errs]
    return [[b for b, _ in pairs], [a for _, a in pairs]]


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h")
# leakage metrics with a random-image floor: the results column holding it
FLOOR_COLUMNS = {"psnr": "psnr_random", "psnr_worst": "psnr_random", "ssim": "ssim_random"}
FLOOR_COLUMNS["ssim_worst"] = "ssim_random"


def random_floor(frame, leakage_metric: str) -> float | None:
    """The random-image floor of a PSNR/SSIM leakage axis: the mean `psnr_random` / `ssim_random` of the
    results rows that have one (image attacks score uniform random images like their output; an attack
    at or below it learnt nothing). None for other metrics or when no row has the column."""
    column = FLOOR_COLUMNS.get(leakage_metric)
    if column is None or column not in frame.columns:
        return None
    values = frame[column].astype(float).dropna()
    return float(values.mean()) if len(values) else None


def _label_params(label: str) -> dict[str, str] | None:
    """`name[k=v,...]` -> {k: v} split at top-level commas (values may hold lists); None if not one."""
    if not label.endswith("]") or "[" not in label:
        return None
    body, depth, part, parts = label[label.index("[") + 1 : -1], 0, "", []
    for ch in body:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(part)
            part = ""
        else:
            part += ch
    parts.append(part)
    pairs = [x.split("=", 1) for x in parts if x]
    return {k: v for k, v in pairs} if all(len(kv) == 2 for kv in pairs) else None


def _point_labels(points: Sequence[TradeoffPoint]) -> list[str]:
    """Annotations of one family's points: only the parameters that vary within the family (the
    family is in the legend), so a sweep reads `eps=0.001` rather than its full configuration."""
    parsed = []
    for p in points:
        head, _, rest = p.label.rpartition(" ")  # "<other row keys> <defense label>"
        parsed.append((head, _label_params(rest)))
    if len(parsed) < 2 or any(params is None for _h, params in parsed):
        return [p.label for p in points]
    keys = sorted({k for _h, params in parsed for k in params})
    varying = [k for k in keys if len({params.get(k) for _h, params in parsed}) > 1]
    out = []
    for head, params in parsed:
        body = ",".join(f"{k}={params[k]}" for k in varying if k in params)
        out.append(" ".join(x for x in (head, body) if x) or "-")
    return out


def _overlaps(a, b, pad: float) -> bool:
    return a.x0 < b.x1 + pad and b.x0 < a.x1 + pad and a.y0 < b.y1 + pad and b.y0 < a.y1 + pad


def _free_shift(box, placed, pad: float, direction: float) -> float:
    """Smallest vertical move (up for direction > 0, else down) that clears every placed box."""
    shift = 0.0
    for _ in range(len(placed) + 1):  # each step passes one box for good, so this ends
        moved = box.translated(0, shift)
        hit = next((p for p in placed if _overlaps(moved, p, pad)), None)
        if hit is None:
            break
        shift = (hit.y1 + pad - box.y0) if direction > 0 else (hit.y0 - pad - box.y1)
    return shift


def spread_labels(ax, texts: Sequence, pad: float = 1.0) -> None:
    """Nudge annotations vertically apart (greedy, in display space) so no two labels overlap.

    Labels are placed bottom-up in the order of their anchors; each one that would touch an already
    placed label moves up just past it (or down, where up would leave the axes and down does not). A
    label moved more than a few points gets a white backing and a faint leader line (drawn beneath
    all labels) to its marker. Dense sweeps stay legible without a layout dependency. Call it once
    the figure is laid out (after tight_layout and a draw): it works on drawn positions.
    """
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    to_points = 72.0 / fig.dpi
    frame = ax.get_window_extent(renderer)
    to_data = ax.transData.inverted()
    placed = []
    for text in sorted(texts, key=lambda t: (t.xy[1], t.xy[0])):
        box = text.get_window_extent(renderer)
        shift = _free_shift(box, placed, pad, 1.0)
        if box.y1 + shift > frame.y1:
            down = _free_shift(box, placed, pad, -1.0)
            if box.y0 + down >= frame.y0:
                shift = down
        placed.append(box.translated(0, shift))
        if not shift:
            continue
        x, y = text.get_position()  # offset points from the anchor
        text.set_position((x, y + shift * to_points))
        if abs(shift * to_points) > 6:
            text.set_bbox({"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 0.2})
            text.set_zorder(5)
            end = to_data.transform((box.x0, (box.y0 + box.y1) / 2 + shift))
            leader = {"color": "0.7", "linewidth": 0.5, "zorder": 2, "scalex": False, "scaley": False}
            ax.plot([text.xy[0], end[0]], [text.xy[1], end[1]], **leader)


def tradeoff_figure(
    points: Sequence[TradeoffPoint],
    utility_label: str,
    leakage_label: str,
    title: str = "",
    floor: float | None = None,
):
    """The figure: leakage (x) vs utility (y), one marker per defense family, Pareto front as a line.

    `floor` (PSNR/SSIM axes): the random-image score, drawn as a line with a shaded band below it,
    labelled "random image" -- a defense whose leakage sits in the band let the attack learn nothing.
    """
    if not points:
        raise FedbenchError("nothing to plot: no defense has both a utility and a leakage value")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 4.8))
    families = list(dict.fromkeys(p.family for p in points))
    cmap = plt.get_cmap("tab10")
    texts = []
    for k, family in enumerate(families):
        pts = [p for p in points if p.family == family]
        ax.errorbar(
            [p.leakage for p in pts],
            [p.utility for p in pts],
            xerr=_error_bars([p.leakage_err for p in pts]),
            yerr=_error_bars([p.utility_err for p in pts]),
            fmt=_MARKERS[k % len(_MARKERS)],
            color=cmap(k % 10),
            markersize=7,
            capsize=3,
            linestyle="none",
            label=family,
        )
        for p, text in zip(pts, _point_labels(pts), strict=True):
            texts.append(
                ax.annotate(
                    text, (p.leakage, p.utility), textcoords="offset points", xytext=(5, 4), fontsize=7
                )
            )
    front = sorted((p for p in points if p.pareto_rank == 1), key=lambda p: (p.leakage, p.utility))
    if front:
        ax.plot(
            [p.leakage for p in front],
            [p.utility for p in front],
            color="black",
            linewidth=1.2,
            linestyle="--",
            zorder=0,
            label="Pareto front (rank 1)",
        )
        ax.scatter(
            [p.leakage for p in front],
            [p.utility for p in front],
            s=180,
            facecolors="none",
            edgecolors="black",
            linewidths=1.2,
            zorder=3,
        )
    if floor is not None and np.isfinite(floor):
        _draw_floor(ax, float(floor))
    ax.set_xlabel(textwrap.fill(leakage_label, 90), fontsize=9)  # long attack labels must not squash the axes
    ax.set_ylabel(utility_label)
    ax.grid(True, alpha=0.3)
    ax.legend(title="defense", fontsize=8, loc="best")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.canvas.draw()  # final transforms, so label boxes are measured where they are drawn
    spread_labels(ax, texts)
    return fig


def _draw_floor(ax, floor: float) -> None:
    """A dotted line at the floor and a grey band from the left edge up to it (no leakage there)."""
    lo, hi = ax.get_xlim()
    span = max(hi, floor) - min(lo, floor) or 1.0
    left = min(lo, floor - 0.05 * span)
    ax.axvspan(left, floor, color="0.5", alpha=0.12, zorder=0, linewidth=0)
    ax.axvline(floor, color="0.35", linestyle=":", linewidth=1.2, zorder=1, label=RANDOM_FLOOR_LABEL)
    ax.text(
        floor,
        0.98,
        f" {RANDOM_FLOOR_LABEL}",
        transform=ax.get_xaxis_transform(),
        rotation=90,
        ha="right",
        va="top",
        fontsize=7,
        color="0.3",
    )
    ax.set_xlim(left, max(hi, floor + 0.05 * span))


def save_tradeoff(
    points: Sequence[TradeoffPoint],
    path: str | Path,
    utility_label: str,
    leakage_label: str,
    title: str = "",
    floor: float | None = None,
) -> Path:
    """Write the trade-off plot (PNG or SVG by suffix); returns the path. `floor`: see `tradeoff_figure`."""
    path = _check_path(path)
    shown = {"points": [dataclasses.asdict(p) for p in points], "labels": [utility_label, leakage_label]}
    digest = plot_digest("tradeoff", {**shown, "title": title, "floor": floor})
    if path.suffix.lower() == ".png" and reuse_identical(path, digest):
        return path
    return _save(
        tradeoff_figure(points, utility_label, leakage_label, title, floor=floor), path, digest=digest
    )


def plot_digest(kind: str, data: dict[str, Any]) -> str:
    """The digest of a plot: its kind, the data it shows (JSON; tuples as lists, floats by repr) and
    what draws it: this module's source and the installed matplotlib's version (read without importing
    it). The same digest means the same figure, so a PNG carrying it can stand for a new drawing."""
    import importlib.metadata

    try:
        matplotlib = importlib.metadata.version("matplotlib")
    except importlib.metadata.PackageNotFoundError:
        matplotlib = None
    code = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    text = json.dumps([kind, data, code, matplotlib], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def png_text(path: Path) -> dict[str, str]:
    """The `tEXt` chunks of a PNG before its image data ({} for a file that is not a readable PNG)."""
    out: dict[str, str] = {}
    try:
        with open(path, "rb") as fh:
            if fh.read(8) != b"\x89PNG\r\n\x1a\n":
                return out
            while True:
                head = fh.read(8)
                if len(head) < 8:
                    return out
                length, kind = struct.unpack(">I", head[:4])[0], head[4:]
                if kind in (b"IDAT", b"IEND"):
                    return out
                data = fh.read(length)
                fh.seek(4, 1)  # the chunk's CRC
                if kind == b"tEXt" and b"\0" in data:
                    key, _, value = data.partition(b"\0")
                    out[key.decode("latin-1")] = value.decode("latin-1")
    except OSError:
        return out


def reuse_identical(path: Path, digest: str) -> bool:
    """Whether `path` now holds a plot with `digest`: already there, or copied from one of the folder's
    `REUSE_SCAN` newest PNGs that carries it (written through a temporary name, then renamed)."""
    if png_text(path).get(DIGEST_KEY) == digest:
        return True
    try:
        pngs = sorted(path.parent.glob("*.png"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    except OSError:  # a PNG removed while listing
        return False
    for other in pngs[:REUSE_SCAN]:
        if other != path and png_text(other).get(DIGEST_KEY) == digest:
            tmp = path.with_name(f".{path.name}.tmp")
            try:
                shutil.copyfile(other, tmp)
                tmp.replace(path)
            except OSError:
                tmp.unlink(missing_ok=True)
                return False
            return True
    return False
