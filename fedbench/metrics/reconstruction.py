"""Image reconstruction metrics: MSE, PSNR, SSIM, LPIPS, one-to-one matching, label recovery.

Conventions (design §6, anchors §6.2 item 7):

- Images are [N, C, H, W] float arrays in [0, 1] pixel space (after de-normalisation); numpy or torch.
- PSNR = 10 log10(data_range^2 / MSE) per image, capped at `cap` (default 100 dB); identical images
  (MSE == 0) score exactly the cap instead of +inf, so means stay finite.
- SSIM is scikit-image's `structural_similarity` with its defaults (uniform 7x7 window, K1=0.01,
  K2=0.03, sample covariance, data_range=1, mean over channels for C > 1), computed vectorised with
  `scipy.ndimage.uniform_filter`; images smaller than 7 px use the largest odd window that fits
  (5 for 5x5), and images below 3 px are rejected. Matches skimage within 1e-10.
- A batch of reconstructions is matched to the true images one-to-one by
  `scipy.optimize.linear_sum_assignment` on the pairwise MSE matrix (minimum total MSE) before scoring,
  so scores do not depend on the order in which an attack returns its images.
- Direction (the catalogue entries below): higher PSNR / SSIM = more leakage; lower MSE / LPIPS =
  more leakage. The `*_worst` summary columns are the worst case for privacy (the best-reconstructed
  image).

- Re-identification (`reid`, the per-input success rate an inversion board ranks by, design §7.1): the
  reconstruction matched to a true image re-identifies it when the victim is strictly the nearest, by
  pixel L2 distance, among itself and up to 99 other training records of its class
  (`fedbench.metrics.reidentification`: the pool, the tie rule). Its floor `reid_floor` is the same test
  on the class-mean image; `reid_chance` is 1 / pool size. The pools come with the truth the runner
  builds; without them (a direct call, a test) the re-identification columns stay empty.
- Floors, the input-independent guesses scored like an attack's output: `psnr_random` / `ssim_random`
  (uniform random images) and `psnr_floor` / `ssim_floor` (the training split's mean image).

The `reconstruction` attack family: its scorer reads the attack's `images` (reconstructions in [0, 1]
pixel space) and `labels` (label guesses, optional) against the true images and labels, with the
keyword arguments of the attack's `scoring()` (matching, success threshold).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fedbench.metrics.catalogue import Metric, register_family
from fedbench.metrics.reidentification import reidentified
from fedbench.metrics.scoring import AttackScores

# Scores given to a true image that no reconstruction was matched to (fewer reconstructions than true
# images). They are the "nothing leaked" end of each scale for images in [0, 1]: MSE 1 (the largest
# possible), PSNR 0 dB (= MSE 1), SSIM 0 (no structural correlation), LPIPS 1 (the nominal maximum).
UNMATCHED_SCORES: dict[str, float] = {"psnr": 0.0, "ssim": 0.0, "mse": 1.0, "lpips": 1.0, "st_lpips": 1.0}

SUMMARY_KEYS: tuple[str, ...] = (
    "psnr",
    "psnr_worst",
    "ssim",
    "ssim_worst",
    "mse",
    "mse_worst",
    "lpips",
    "lpips_worst",
    "label_acc",
    "label_acc_matched",
    "recovered",
    "exact",
    "reid",
    "reid_floor",
    "reid_chance",
)


def _mean_and_worst(mean: Metric) -> tuple[Metric, Metric]:
    """A per-image metric's mean over images and its worst case for privacy (the best image)."""
    return mean, dataclasses.replace(mean, name=f"{mean.name}_worst", about=f"{mean.about}, best image")


RECONSTRUCTION_METRICS: tuple[Metric, ...] = (
    *_mean_and_worst(Metric("psnr", "lower", "leakage", "fixed", (0, None), about="PSNR (dB)")),
    *_mean_and_worst(Metric("ssim", "lower", "leakage", "fixed", (-1, 1), about="SSIM")),
    *_mean_and_worst(Metric("mse", "higher", "leakage", "sig", (0, 1), about="MSE")),
    *_mean_and_worst(
        Metric("lpips", "higher", "leakage", "fixed", (0, None), False, "LPIPS (trunk weights)")
    ),
    Metric("label_acc", "lower", "leakage", "pct", (0, 1), False, "recovered labels (multiset)"),
    Metric("label_acc_matched", "lower", "leakage", "pct", (0, 1), False, "recovered labels per image"),
    Metric("recovered", "lower", "leakage", "pct", (0, 1), False, "share of images above the success PSNR"),
    Metric("exact", "lower", "leakage", "pct", (0, 1), False, "share of images recovered to the PSNR cap"),
    Metric(
        "reid",
        "lower",
        "leakage",
        "pct",
        (0, 1),
        False,
        "victims re-identified among up to 100 same-class training records (pixel L2)",
    ),
    Metric("reid_floor", "lower", "reference", "pct", (0, 1), False, "reid of the class-mean image"),
    Metric("reid_chance", "lower", "reference", "pct", (0, 1), False, "reid by chance: mean of 1/pool size"),
    *_mean_and_worst(Metric("st_lpips", "higher", "leakage", "fixed", (0, None), False, "ST-LPIPS (extra)")),
    # the floor: random images scored like an attack's output (a reference, not a leakage measure)
    Metric("psnr_random", "lower", "reference", "fixed", (0, None), about="PSNR of uniform random images"),
    Metric("ssim_random", "lower", "reference", "fixed", (-1, 1), about="SSIM of uniform random images"),
    # the best input-independent guess: the training split's mean image (the runner gives it)
    Metric("psnr_floor", "lower", "reference", "fixed", (0, None), False, "PSNR of the dataset's mean image"),
    Metric("ssim_floor", "lower", "reference", "fixed", (-1, 1), False, "SSIM of the dataset's mean image"),
)
# +1: a higher value means more leakage; -1: a lower value means more leakage (from the catalogue entries).
LEAKAGE_DIRECTION: dict[str, int] = {
    m.name: m.leakage_sign for m in RECONSTRUCTION_METRICS if m.name in UNMATCHED_SCORES
}
# Present in `summary()` / `per_image()` only when ST-LPIPS was computed (the optional `stlpips` extra).
ST_LPIPS_KEYS: tuple[str, ...] = ("st_lpips", "st_lpips_worst")


# ------------------------------------------------------------------------------------------- inputs


def _to_numpy(x: Any, name: str) -> np.ndarray:
    if x is None:
        raise ValueError(f"{name} is None")
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch tensor, without importing torch
        x = x.detach().cpu()
        x = (x.double() if x.is_floating_point() else x).numpy()  # bfloat16 has no numpy dtype
    arr = np.asarray(x)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise ValueError(f"{name} must be a numeric array, got dtype {arr.dtype}")
    return arr.astype(np.float64, copy=False)


def _images(x: Any, name: str) -> np.ndarray:
    arr = _to_numpy(x, name)
    if arr.ndim != 4:
        raise ValueError(
            f"{name} must be a batch of images [N, C, H, W], got shape {tuple(arr.shape)}"
            + ("; add a batch axis with x[None]" if arr.ndim == 3 else "")
        )
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf values")
    return arr


def _pair(true: Any, rec: Any) -> tuple[np.ndarray, np.ndarray]:
    t, r = _images(true, "true"), _images(rec, "rec")
    if t.shape != r.shape:
        raise ValueError(f"true and rec must have the same shape, got {tuple(t.shape)} and {tuple(r.shape)}")
    return t, r


# ------------------------------------------------------------------------------------ per-image scores


def mse(true: Any, rec: Any) -> np.ndarray:
    """Mean squared error per image, [N] (lower = closer = more leakage)."""
    t, r = _pair(true, rec)
    return ((t - r) ** 2).reshape(t.shape[0], -1).mean(axis=1)


def psnr(true: Any, rec: Any, cap: float = 100.0, data_range: float = 1.0) -> np.ndarray:
    """Peak signal-to-noise ratio in dB per image, [N] (higher = more leakage).

    PSNR = 10 log10(data_range^2 / MSE), then min(PSNR, cap). The cap (default 100 dB) is what identical
    images (MSE == 0) score. Equals `skimage.metrics.peak_signal_noise_ratio(t, r, data_range=...)` below
    the cap.
    """
    if cap <= 0:
        raise ValueError(f"psnr cap must be > 0, got {cap}")
    if data_range <= 0:
        raise ValueError(f"psnr data_range must be > 0, got {data_range}")
    err = mse(true, rec)
    out = np.full(err.shape, float(cap))
    pos = err > 0
    out[pos] = np.minimum(10.0 * np.log10(data_range**2 / err[pos]), cap)
    return out


def ssim_window(height: int, width: int) -> int:
    """The SSIM window: 7 (skimage's default), or the largest odd size <= the shorter side if smaller."""
    side = min(height, width)
    if side < 3:
        raise ValueError(f"SSIM needs images of at least 3x3 pixels, got {height}x{width}")
    return 7 if side >= 7 else (side if side % 2 == 1 else side - 1)


def ssim(true: Any, rec: Any, data_range: float = 1.0, win_size: int | None = None) -> np.ndarray:
    """Structural similarity per image, [N] (higher = more leakage; 1 for identical images).

    Equals `skimage.metrics.structural_similarity(t, r, data_range=data_range, win_size=w,
    channel_axis=0)` for C > 1 (and without channel_axis on the [H, W] image for C == 1): uniform window,
    sample covariance, K1=0.01, K2=0.03, the window border cropped, then the mean over pixels and
    channels. `w` defaults to `ssim_window(H, W)` (7, smaller for tiny images).
    """
    from scipy.ndimage import uniform_filter

    t, r = _pair(true, rec)
    n, c, h, w = t.shape
    win = ssim_window(h, w) if win_size is None else int(win_size)
    if win < 3 or win % 2 == 0 or win > min(h, w):
        raise ValueError(f"SSIM win_size must be odd, >= 3 and <= the shorter image side, got {win}")
    if n == 0:
        return np.zeros(0)

    def filt(a: np.ndarray) -> np.ndarray:
        return uniform_filter(a, size=(1, 1, win, win))

    np_ = win**2
    cov_norm = np_ / (np_ - 1)
    ux, uy = filt(t), filt(r)
    uxx, uyy, uxy = filt(t * t), filt(r * r), filt(t * r)
    vx = cov_norm * (uxx - ux * ux)
    vy = cov_norm * (uyy - uy * uy)
    vxy = cov_norm * (uxy - ux * uy)
    c1 = (0.01 * data_range) ** 2
    c2 = (0.03 * data_range) ** 2
    s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux**2 + uy**2 + c1) * (vx + vy + c2))
    pad = (win - 1) // 2
    s = s[:, :, pad : h - pad, pad : w - pad]
    return s.reshape(n, -1).mean(axis=1)


# ------------------------------------------------------------------------------------------ matching


def pairwise_mse(true: Any, rec: Any) -> np.ndarray:
    """[N, M] matrix of MSE between every true image and every reconstruction."""
    t, r = _images(true, "true"), _images(rec, "rec")
    if t.shape[1:] != r.shape[1:]:
        raise ValueError(
            "true and rec images must have the same [C, H, W], "
            f"got {tuple(t.shape[1:])} and {tuple(r.shape[1:])}"
        )
    d = int(np.prod(t.shape[1:]))
    tf, rf = t.reshape(t.shape[0], d), r.reshape(r.shape[0], d)  # d, not -1: no reconstruction is [N, 0]
    sq = (tf**2).sum(1)[:, None] + (rf**2).sum(1)[None, :] - 2.0 * tf @ rf.T
    return np.maximum(sq, 0.0) / max(d, 1)


def best_match(true: Any, rec: Any) -> np.ndarray:
    """Per true image, the reconstruction of minimum MSE (maximum PSNR); one may serve several images.

    The oracle scoring of the FC-layer attacks (spec 004 §2.6): the attacker returns many candidates and
    each private image is credited with its best one. Always >= the one-to-one `match` per image.
    Returns -1 for every image when there is no reconstruction.
    """
    c = pairwise_mse(true, rec)
    if c.shape[1] == 0:
        return np.full(c.shape[0], -1, dtype=np.int64)
    return np.argmin(c, axis=1).astype(np.int64)


def match(true: Any, rec: Any, cost: Literal["mse"] = "mse") -> np.ndarray:
    """One-to-one assignment of reconstructions to true images (Hungarian, minimum total MSE).

    Returns an int64 array of length N (one entry per true image): the index in `rec` of the matched
    reconstruction, or -1 when the true image is unmatched. With M reconstructions and N true images,
    min(M, N) pairs are formed: if M > N the attacker's best N guesses are kept (the conservative choice
    for privacy); if M < N, N - M true images stay unmatched and score as `UNMATCHED_SCORES`.
    """
    from scipy.optimize import linear_sum_assignment

    if cost != "mse":
        raise ValueError(f"match cost must be 'mse', got {cost!r}")
    c = pairwise_mse(true, rec)
    out = np.full(c.shape[0], -1, dtype=np.int64)
    if c.size:
        rows, cols = linear_sum_assignment(c)
        out[rows] = cols
    return out


# -------------------------------------------------------------------------------------------- labels


def _labels(y: Any, name: str) -> np.ndarray:
    arr = _to_numpy(y, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of class labels, got shape {tuple(arr.shape)}")
    if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
        raise ValueError(f"{name} must hold integer class labels")
    return arr.astype(np.int64)


def label_accuracy(y_true: Any, y_pred: Any) -> float:
    """Order-independent label recovery: sum over classes of min(count_true, count_pred) / N.

    Batch label-recovery attacks (iDLG/LLG style, from the last layer's gradient) return the labels of
    a batch as an unordered multiset with no link to individual images, so the labels are compared as
    multisets: e.g. true [1, 1, 2] vs predicted [2, 1, 3] recovers 2 of 3. Extra predicted labels do
    not help (N is the number of true labels); a missing prediction counts as wrong.
    """
    t, p = _labels(y_true, "y_true"), _labels(y_pred, "y_pred")
    if t.size == 0:
        raise ValueError("y_true is empty")
    tv, tc = np.unique(t, return_counts=True)
    pv, pc = np.unique(p, return_counts=True)
    _, it, ip = np.intersect1d(tv, pv, assume_unique=True, return_indices=True)
    return float(np.minimum(tc[it], pc[ip]).sum() / t.size)


def matched_label_accuracy(y_true: Any, y_pred: Any, assignment: np.ndarray) -> float:
    """Exact per-image label accuracy after matching: y_pred[j] is the label of reconstruction j.

    `assignment` comes from `match`; an unmatched true image (-1) counts as wrong.
    """
    t, p = _labels(y_true, "y_true"), _labels(y_pred, "y_pred")
    a = np.asarray(assignment, dtype=np.int64)
    if a.shape != t.shape:
        raise ValueError(f"assignment has shape {a.shape}, y_true has {t.shape}")
    if a.size and a.max() >= p.size:
        raise ValueError(f"y_pred has {p.size} labels but the assignment refers to reconstruction {a.max()}")
    ok = (a >= 0) & (p[np.clip(a, 0, None)] == t) if p.size else np.zeros(a.shape, bool)
    return float(ok.mean()) if t.size else 0.0


# ------------------------------------------------------------------------------------------ scoring


def _mean(x: np.ndarray | None) -> float | None:
    return None if x is None or x.size == 0 else float(np.mean(x))


def _best(x: np.ndarray | None, direction: int) -> float | None:
    if x is None or x.size == 0:
        return None
    return float(np.max(x) if direction > 0 else np.min(x))


def _share(x: np.ndarray | None) -> float | None:
    """The mean of the values that exist (NaN: not available for that image); None when there are none."""
    if x is None or not np.isfinite(x).any():
        return None
    return float(np.nanmean(x))


def exact_images(psnr_values: np.ndarray, psnr_cap: float) -> np.ndarray:
    """Per image, whether it was recovered exactly: its PSNR reaches the cap (MSE 0 scores the cap).

    The one definition of `exact`: the per-image 0/1 values and the summary's share both come from here.
    """
    return np.asarray(psnr_values) >= psnr_cap


@dataclass(frozen=True, eq=False)
class ReconstructionScores:
    """Per-image scores of one batch, aligned with the true images (index i = true image i).

    `assignment[i]` is the reconstruction matched to true image i (-1: unmatched). `lpips` is None
    when no LPIPS function was given (unavailable); the image arrays are None when the attack returned
    no images (label-only attack).
    """

    assignment: np.ndarray | None
    psnr: np.ndarray | None
    ssim: np.ndarray | None
    mse: np.ndarray | None
    lpips: np.ndarray | None
    label_acc: float | None = None
    label_acc_matched: float | None = None
    psnr_cap: float = 100.0
    success_psnr: float | None = None
    st_lpips: np.ndarray | None = None  # shift-tolerant LPIPS (its own metric), None when not computed
    # re-identification, 0/1 per true image (NaN: the image has no pool); None when no pools were given
    reid: np.ndarray | None = None
    reid_floor: np.ndarray | None = None  # the same test on the class-mean image
    pool_size: np.ndarray | None = None  # candidates per image, the victim included (NaN: no pool)

    @property
    def n(self) -> int:
        return 0 if self.psnr is None else int(self.psnr.size)

    def summary(self) -> dict[str, float | None]:
        """Mean and worst case (max leakage) per metric, label accuracy and the recovered share.

        Keys (`SUMMARY_KEYS`): psnr, psnr_worst (max), ssim, ssim_worst (max), mse, mse_worst (min),
        lpips, lpips_worst (min), label_acc (multiset), label_acc_matched (per image, only when labels
        are aligned with the reconstructions), recovered (share of true images with PSNR >=
        success_psnr), exact (share at the PSNR cap, `exact_images`; reported with `recovered`), reid
        (share of the images with a pool that were re-identified), reid_floor (the same for the
        class-mean image), reid_chance (mean of 1 / pool size). A value is None when it cannot be
        computed (no LPIPS, no labels, no threshold, no pools).
        """
        recovered = exact = None
        if self.success_psnr is not None and self.psnr is not None and self.psnr.size:
            recovered = float(np.mean(self.psnr >= self.success_psnr))
            exact = float(np.mean(exact_images(self.psnr, self.psnr_cap)))
        out = {
            "psnr": _mean(self.psnr),
            "psnr_worst": _best(self.psnr, LEAKAGE_DIRECTION["psnr"]),
            "ssim": _mean(self.ssim),
            "ssim_worst": _best(self.ssim, LEAKAGE_DIRECTION["ssim"]),
            "mse": _mean(self.mse),
            "mse_worst": _best(self.mse, LEAKAGE_DIRECTION["mse"]),
            "lpips": _mean(self.lpips),
            "lpips_worst": _best(self.lpips, LEAKAGE_DIRECTION["lpips"]),
            "label_acc": self.label_acc,
            "label_acc_matched": self.label_acc_matched,
            "recovered": recovered,
            "exact": exact,
            "reid": _share(self.reid),
            "reid_floor": _share(self.reid_floor),
            "reid_chance": None if self.pool_size is None else _share(1.0 / self.pool_size),
        }
        if self.st_lpips is not None:
            out["st_lpips"] = _mean(self.st_lpips)
            out["st_lpips_worst"] = _best(self.st_lpips, LEAKAGE_DIRECTION["st_lpips"])
        return out

    def per_image(self) -> dict[str, list]:
        """JSON-able per-image values: index, match (-1 unmatched), psnr, ssim, mse, lpips, and the 0/1
        outcomes exact, reid, reid_floor with the pool size reid_pool (None where n/a)."""
        n = self.n

        def col(x: np.ndarray | None) -> list:
            return [None] * n if x is None else [float(v) for v in x]

        def flags(x: np.ndarray | None) -> list:
            return [None] * n if x is None else [None if np.isnan(v) else int(v) for v in x]

        out = {
            "index": list(range(n)),
            "match": [] if self.assignment is None else [int(v) for v in self.assignment],
            "psnr": col(self.psnr),
            "ssim": col(self.ssim),
            "mse": col(self.mse),
            "lpips": col(self.lpips),
            "exact": [] if self.psnr is None else [int(v) for v in exact_images(self.psnr, self.psnr_cap)],
            "reid": flags(self.reid),
            "reid_floor": flags(self.reid_floor),
            "reid_pool": flags(self.pool_size),
        }
        if self.st_lpips is not None:
            out["st_lpips"] = col(self.st_lpips)
        return out


def score_reconstruction(
    true: Any,
    rec: Any | None,
    y_true: Any | None = None,
    y_pred: Any | None = None,
    psnr_cap: float = 100.0,
    success_psnr: float | None = None,
    lpips_fn: Callable[[np.ndarray, np.ndarray], Any] | None = None,
    labels_aligned: bool = False,
    range_tol: float = 1e-4,
    matching: Literal["one-to-one", "best"] = "one-to-one",
    st_lpips_fn: Callable[[np.ndarray, np.ndarray], Any] | None = None,
    reid_others: Sequence[Any | None] | None = None,
    class_means: Any | None = None,
) -> ReconstructionScores:
    """Match `rec` [M, C, H, W] to `true` [N, C, H, W] (both in [0, 1]) and score every true image.

    `rec=None` scores labels only. `lpips_fn(true_matched, rec_matched) -> [K]` is e.g.
    `fedbench.metrics.lpips_metric.get_lpips()`; None leaves LPIPS empty. Labels: `label_acc` is the
    multiset accuracy of `y_pred` vs `y_true`; when `labels_aligned` (y_pred[j] is the label the attack
    gave reconstruction j), `label_acc_matched` is the exact accuracy after matching. Values outside
    [0, 1] by more than `range_tol` are an error (clamp reconstructions to [0, 1]); smaller excursions
    (rounding after de-normalisation) are clipped. `matching`: one-to-one (Hungarian, the default) or
    best (each true image gets its best reconstruction, reuse allowed; see `best_match`).
    `st_lpips_fn` (e.g. `lpips_metric.get_st_lpips()`) fills the separate `st_lpips` scores the same way.
    `reid_others` (one entry per true image: the other candidates of its pool [P-1, C, H, W] in [0, 1],
    or None for no pool; `fedbench.metrics.reidentification.candidate_pools`) fills `reid`, and with
    `class_means` [N, C, H, W] (each victim's class-mean image) `reid_floor`; without them both stay None.
    """
    if matching not in ("one-to-one", "best"):
        raise ValueError(f"matching must be 'one-to-one' or 'best', got {matching!r}")
    t = _images(true, "true")
    if t.shape[0] == 0:
        raise ValueError("true holds no images")
    if t.min() < -range_tol or t.max() > 1 + range_tol:
        raise ValueError(
            "true images must be in [0, 1] pixel space (de-normalise first), "
            f"got range [{t.min():.4g}, {t.max():.4g}]"
        )
    t = np.clip(t, 0.0, 1.0)
    assignment = psnr_v = ssim_v = mse_v = lpips_v = st_lpips_v = None
    reid_v = reid_floor_v = pool_v = None
    if rec is not None:
        r = _images(rec, "rec")
        if r.shape[1:] != t.shape[1:]:
            raise ValueError(
                f"rec images are {tuple(r.shape[1:])} but true images are {tuple(t.shape[1:])} ([C, H, W])"
            )
        if r.size and (r.min() < -range_tol or r.max() > 1 + range_tol):
            raise ValueError(
                f"rec images must be in [0, 1] (clamp the reconstruction), "
                f"got range [{r.min():.4g}, {r.max():.4g}]"
            )
        r = np.clip(r, 0.0, 1.0)
        assignment = match(t, r) if matching == "one-to-one" else best_match(t, r)
        m = assignment >= 0
        tm, rm = t[m], r[assignment[m]]
        psnr_v = np.full(t.shape[0], UNMATCHED_SCORES["psnr"])
        ssim_v = np.full(t.shape[0], UNMATCHED_SCORES["ssim"])
        mse_v = np.full(t.shape[0], UNMATCHED_SCORES["mse"])
        if m.any():
            psnr_v[m] = psnr(tm, rm, cap=psnr_cap)
            ssim_v[m] = ssim(tm, rm)
            mse_v[m] = mse(tm, rm)
        lpips_v = _distances(lpips_fn, "lpips", tm, rm, m)
        st_lpips_v = _distances(st_lpips_fn, "st_lpips", tm, rm, m)
        if reid_others is not None:
            reid_v, reid_floor_v, pool_v = _reidentification(t, r, assignment, reid_others, class_means)
    label_acc = label_acc_matched = None
    if y_true is not None and y_pred is not None:
        yt = _labels(y_true, "y_true")
        if yt.size != t.shape[0]:
            raise ValueError(f"y_true has {yt.size} labels for {t.shape[0]} true images")
        label_acc = label_accuracy(yt, y_pred)
        if labels_aligned:
            if assignment is None:
                raise ValueError("labels_aligned needs reconstructed images to align the labels with")
            yp = _labels(y_pred, "y_pred")
            if yp.size != r.shape[0]:
                raise ValueError(
                    f"labels_aligned: y_pred has {yp.size} labels for {r.shape[0]} reconstructions"
                )
            label_acc_matched = matched_label_accuracy(yt, yp, assignment)
    return ReconstructionScores(
        assignment=assignment,
        psnr=psnr_v,
        ssim=ssim_v,
        mse=mse_v,
        lpips=lpips_v,
        label_acc=label_acc,
        label_acc_matched=label_acc_matched,
        psnr_cap=psnr_cap,
        success_psnr=success_psnr,
        st_lpips=st_lpips_v,
        reid=reid_v,
        reid_floor=reid_floor_v,
        pool_size=pool_v,
    )


def _reidentification(
    t: np.ndarray, r: np.ndarray, assignment: np.ndarray, others: Sequence[Any | None], class_means: Any
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Per true image: whether its matched reconstruction re-identifies it (an unmatched image: 0),
    whether its class-mean image does (None without `class_means`), and its pool size; NaN for an image
    without a pool."""
    n = t.shape[0]
    if len(others) != n:
        raise ValueError(f"reid_others has {len(others)} pools for {n} true images")
    means = None
    if class_means is not None:
        means = _images(class_means, "class_means")
        if means.shape != t.shape:
            raise ValueError(f"class_means has shape {tuple(means.shape)}, true images {tuple(t.shape)}")
    reid, floor, size = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    for i, pool in enumerate(others):
        if pool is None:
            continue
        p = _to_numpy(pool, "reid_others")
        if p.ndim != 4 or p.shape[1:] != t.shape[1:]:
            raise ValueError(f"a pool must be [P, C, H, W] like the true images, got {tuple(p.shape)}")
        p = np.clip(p, 0.0, 1.0)
        size[i] = len(p) + 1
        reid[i] = 0 if assignment[i] < 0 else reidentified(t[i], r[assignment[i]], p)
        if means is not None:
            floor[i] = reidentified(t[i], np.clip(means[i], 0.0, 1.0), p)
    return reid, (None if means is None else floor), size


def _distances(
    fn: Callable | None, name: str, tm: np.ndarray, rm: np.ndarray, m: np.ndarray
) -> np.ndarray | None:
    """Per true image, `fn`'s distance to its matched reconstruction (unmatched: `UNMATCHED_SCORES`)."""
    if fn is None:
        return None
    out = np.full(m.shape[0], UNMATCHED_SCORES[name])
    if m.any():
        d = np.asarray(fn(tm, rm), dtype=np.float64).reshape(-1)
        if d.shape[0] != int(m.sum()):
            raise ValueError(f"{name}_fn returned {d.shape[0]} values for {int(m.sum())} image pairs")
        out[m] = d
    return out


def random_baseline(true: Any, seed: int | Any = 0, psnr_cap: float = 100.0) -> dict[str, float | None]:
    """Scores of uniform random images in [0, 1] against `true`, scored exactly like an attack's output.

    One random image per true image, matched and scored by `score_reconstruction`; returns the mean and
    worst-case columns for psnr, ssim and mse (a floor for reports: an attack at this level leaked nothing).
    `seed` is an int, a `numpy.random.Generator` or a `torch.Generator`.
    """
    t = _images(true, "true")
    if hasattr(seed, "manual_seed"):  # torch.Generator
        import torch

        rand = torch.rand(tuple(t.shape), generator=seed, dtype=torch.float64).numpy()
    else:
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        rand = rng.random(t.shape)
    s = score_reconstruction(t, rand, psnr_cap=psnr_cap).summary()
    return {k: s[k] for k in ("psnr", "psnr_worst", "ssim", "ssim_worst", "mse", "mse_worst")}


def mean_image_baseline(true: Any, mean_image: Any, psnr_cap: float = 100.0) -> dict[str, float]:
    """PSNR and SSIM of one image, the dataset's mean image [C, H, W] in [0, 1], against every true image
    (means over them): the best input-independent guess, a floor for reports (`psnr_floor`, `ssim_floor`).
    """
    t = np.clip(_images(true, "true"), 0.0, 1.0)
    m = np.clip(_to_numpy(mean_image, "mean_image"), 0.0, 1.0)
    if m.shape != t.shape[1:]:
        raise ValueError(f"mean_image has shape {tuple(m.shape)}, true images {tuple(t.shape[1:])}")
    guess = np.broadcast_to(m, t.shape)
    return {"psnr": float(np.mean(psnr(t, guess, cap=psnr_cap))), "ssim": float(np.mean(ssim(t, guess)))}


@register_family(
    "reconstruction", metrics=RECONSTRUCTION_METRICS, default_metrics=("psnr", "ssim", "label_acc")
)
def score_reconstruction_run(attack: Any, output: dict[str, Any], truth: dict[str, Any]) -> AttackScores:
    """The reconstruction columns of one run (none when it returned no images), per-image scores for
    the sidecar, and why LPIPS / ST-LPIPS are empty (stated once per process)."""
    from fedbench.metrics.lpips_metric import run_lpips, run_st_lpips, state_once

    images = output.get("images")
    if images is None or "images" not in truth:
        return AttackScores({})
    scoring = attack.scoring() if hasattr(attack, "scoring") else {}
    # LPIPS whenever its trunk weights load (else the column stays empty and the reason is stated
    # once); ST-LPIPS, its own column, whenever the optional package is installed
    lpips_fn, lpips_reason = run_lpips()
    st_lpips_fn, st_reason = run_st_lpips()
    scores = score_reconstruction(
        truth["images"],
        images,
        y_true=truth.get("y"),
        y_pred=output.get("labels"),
        lpips_fn=lpips_fn,
        st_lpips_fn=st_lpips_fn,
        reid_others=truth.get("reid_others"),
        class_means=truth.get("class_means"),
        **scoring,
    )
    notes = [state_once(r) for r in ((lpips_reason if lpips_fn is None else None), st_reason) if r]
    # per-image values go to the JSON sidecar (the worst case over attacks is taken per input)
    row: dict[str, Any] = scores.summary()
    # the floor: uniform random images scored the same way (an attack at this level leaked nothing)
    floor = random_baseline(truth["images"], seed=0)
    row["psnr_random"], row["ssim_random"] = floor["psnr"], floor["ssim"]
    # the best input-independent guess: the training split's mean image (when the runner gave it)
    if truth.get("mean_image") is not None:
        guess = mean_image_baseline(truth["images"], truth["mean_image"])
        row["psnr_floor"], row["ssim_floor"] = guess["psnr"], guess["ssim"]
    return AttackScores(row, scores.per_image(), [n for n in notes if n])
