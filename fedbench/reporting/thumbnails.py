"""A board's reconstruction thumbnails (`fedbench leaderboard thumbnails`): one small committed PNG,
`leaderboards/<board>/reconstructions.png`, that shows what the attack suite recovers under each defense.

The picture is a grid: the private images of a few victims on top, then one row per defense (in rank
order) with, per victim, its worst-case reconstruction: the one of the board's attack suite that leaks
most by the board's headline metric (the board's own rule: the worst case is taken per input, over
every attack of the suite, adaptive ones included). The victims are the first inputs of one seed
(seed 0 by default) that the most defenses' runs attack, in the grid's order, the same for every row,
so the rows compare at a glance and nothing is picked by how it looks. A defense whose runs attack
other inputs (FRL reserves an auxiliary set of training data, which shifts the clients' shards and so
the victims) shows its own first victims, drawn above its row.

The runs are the board's own: the attack runs of its preset's grid whose run ids the entries list.
Their outputs come through `load` (the CLI reads them from the run cache, and computes a missing one
unless told not to), are scored as the board scored them (`attack_metrics`) and drawn by
`plots.save_reconstructions_by_defense`. Boards of face datasets are refused: fedbench does not ship
pictures of real people's faces (`refuse_faces`).
"""

from __future__ import annotations

import hashlib
import io
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedbench.errors import FedbenchError
from fedbench.metrics.catalogue import metric
from fedbench.reporting.board_schema import Board

THUMBNAIL_FILE = "reconstructions.png"
MAX_BYTES = 150_000  # a committed thumbnail stays small
DPI = 72  # the grid's resolution: an image is drawn 86 px wide, the labels (7-8 pt) still readable
# Datasets of pictures of real people's faces (canonical names); a dataset whose plugin describes
# itself as faces is refused too (`is_face_dataset`).
FACE_DATASETS = frozenset({"lfw", "lfw-subset", "celeba"})
_FACES = re.compile(r"\bfaces?\b", re.I)


class FaceDatasetError(FedbenchError):
    """A board of a face dataset: its reconstructions are pictures of real people."""


def dataset_name(board: Board) -> str:
    """The board's dataset by canonical plugin name ('mnist5k[test_fraction=0.8]' -> 'mnist5k')."""
    from fedbench.registry import datasets

    name = str(board.scenario.get("dataset", "")).split("[", 1)[0]
    return datasets.canonical(name) if name in datasets else name


def is_face_dataset(name: str) -> bool:
    """Whether a dataset holds pictures of people's faces: a known face dataset, or a registered one
    whose description says faces."""
    from fedbench.registry import datasets

    if name in FACE_DATASETS:
        return True
    doc = (datasets.get(name).__doc__ or "") if name in datasets else ""
    return bool(_FACES.search(doc))


def refuse_faces(board: Board) -> None:
    """Raise FaceDatasetError for a board whose dataset is a face dataset (LFW, CelebA, ...)."""
    name = dataset_name(board)
    if is_face_dataset(name):
        raise FaceDatasetError(
            f"board {board.name}: its dataset '{name}' holds pictures of real people's faces; fedbench "
            "does not write or ship reconstructions of faces (the people in them did not agree to "
            "appear in a leaderboard); use 'fedbench plot reconstructions' on your own runs instead"
        )


def board_runs(
    board: Board, entries: list[dict[str, Any]], specs: Sequence[Any], seed: int
) -> dict[str, list]:
    """defense -> the attack runs (RunSpecs) of seed `seed` the board rests on, in grid order: those of
    `specs` (its preset's grid) whose run ids its entries list. An entry without runs there means the
    preset no longer builds this board: an error naming it."""
    seeds = sorted({s for e in entries for s in e["seeds"]})
    if seed not in seeds:
        raise FedbenchError(f"board {board.name} has no seed {seed} (its seeds: {seeds}); pick one of them")
    ids = {r for e in entries for r in e["run_ids"]}
    runs: dict[str, list] = {e["defense"]: [] for e in entries}
    for spec in specs:
        ours = spec.run_id in ids and spec.defense.label in runs
        if ours and spec.attack is not None and spec.seed == seed:
            runs[spec.defense.label].append(spec)
    missing = [d for d, r in runs.items() if not r]
    if missing:
        raise FedbenchError(
            f"board {board.name}: no attack run of seed {seed} for {', '.join(missing)} in its preset's grid "
            "(the preset no longer builds the committed entries); rebuild the board first"
        )
    return runs


@dataclass(frozen=True)
class Thumbnails:
    """What the picture shows: the victims' private images, and per defense (in rank order) the
    victims its runs attacked (`truth` unless the defense attacked other inputs), the worst-case
    reconstruction of each, its PSNR, and the attack that made it."""

    board: str
    metric: str
    seed: int
    truth: np.ndarray  # [N, C, H, W] in [0, 1]: the victims most rows show
    rows: tuple[tuple[str, np.ndarray, np.ndarray, tuple[float | None, ...], tuple[str, ...]], ...]


def _input_key(image: np.ndarray) -> str:
    """An input's identity across runs: the digest of its pixels (every run of a seed attacks the same
    private images, whichever defense or observation point)."""
    return hashlib.sha1(np.ascontiguousarray(image, dtype=np.float32).tobytes()).hexdigest()


def worst_case(
    board: Board,
    runs: dict[str, list],
    load: Callable[[Any], dict[str, Any]],
    victims: int = 4,
    seed: int = 0,
) -> Thumbnails:
    """Per defense (the order of `runs`), the worst-case reconstruction of the first `victims` inputs
    that the most defenses' runs attack (a defense whose runs attack other inputs shows its own first
    ones). `load(spec)` returns a run's cached attack result."""
    from fedbench.metrics import attack_metrics

    if victims < 1:
        raise FedbenchError(f"--victims {victims}: show at least 1 victim")
    head = metric(board.headline)
    if head.family != "reconstruction":
        raise FedbenchError(
            f"board {board.name}: its headline {board.headline} is not an image metric; thumbnails are "
            "drawn for inversion boards only"
        )
    chosen_metric = board.headline
    truth: dict[str, np.ndarray] = {}
    order: list[str] = []
    best: dict[str, dict[str, tuple[float, np.ndarray, float | None, str]]] = {}
    for defense, specs in runs.items():
        mine = best.setdefault(defense, {})
        for spec in specs:
            result = load(spec)
            images, true = result["output"].get("images"), result["truth"].get("images")
            if images is None or true is None:
                continue
            per_image = attack_metrics(spec.attack.instantiate(), result).per_image or {}
            values = per_image.get(chosen_metric) or []
            match = per_image.get("match") or []
            psnr = per_image.get("psnr") or [None] * len(values)
            for i, value in enumerate(values):
                if value is None:
                    continue
                key = _input_key(true[i])
                if key not in truth:
                    truth[key] = np.asarray(true[i], dtype=np.float32)
                    order.append(key)
                j = match[i] if i < len(match) else i
                rec = np.asarray(images[j]) if j >= 0 else np.zeros_like(truth[key])
                score = float(value) * head.leakage_sign
                if key not in mine or score > mine[key][0]:
                    mine[key] = (score, rec, psnr[i], spec.attack.label)
    if not any(best.values()):
        raise FedbenchError(f"board {board.name}: no run of seed {seed} holds a scored reconstruction")
    empty = [defense for defense, mine in best.items() if not mine]
    if empty:
        raise FedbenchError(
            f"board {board.name}: no run of seed {seed} under {', '.join(empty)} holds a scored "
            "reconstruction"
        )
    reach = {k: sum(k in mine for mine in best.values()) for k in order}
    most = max(reach.values())
    shared = [k for k in order if reach[k] == most][:victims]

    def row(defense: str, mine: dict) -> tuple:
        keys = shared if all(k in mine for k in shared) else [k for k in order if k in mine][:victims]
        return (
            defense,
            np.stack([truth[k] for k in keys]),
            np.stack([np.clip(mine[k][1], 0.0, 1.0) for k in keys]).astype(np.float32),
            tuple(mine[k][2] for k in keys),
            tuple(mine[k][3] for k in keys),
        )

    rows = tuple(row(defense, mine) for defense, mine in best.items())
    return Thumbnails(board.name, chosen_metric, seed, np.stack([truth[k] for k in shared]), rows)


def save_thumbnails(thumbs: Thumbnails, path: str | Path) -> Path:
    """Draw the grid (private images on top, a row per defense, PSNR under each reconstruction) as a
    small PNG: grey when every image is grey, else a 128-colour palette; at most MAX_BYTES."""
    from PIL import Image

    from fedbench.reporting.plots import ReconstructionPanel, save_reconstructions_by_defense

    path = Path(path)
    n = len(thumbs.truth)
    panels = [
        ReconstructionPanel(defense, truth, rec, tuple(psnr)) for defense, truth, rec, psnr, _ in thumbs.rows
    ]
    title = f"worst case over the suite by {thumbs.metric} · seed {thumbs.seed}"
    with tempfile.TemporaryDirectory(prefix="fedbench-thumbnails-") as tmp:
        drawn = save_reconstructions_by_defense(
            panels, Path(tmp) / THUMBNAIL_FILE, title=title, max_images=n, dpi=DPI
        )
        image = Image.open(io.BytesIO(drawn.read_bytes()))
    rgb = np.asarray(image.convert("RGB"))
    grey = bool((rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all())
    small = image.convert("L") if grey else image.convert("RGB").quantize(colors=128)
    out = io.BytesIO()
    small.save(out, format="PNG", optimize=True)
    data = out.getvalue()
    if len(data) > MAX_BYTES:
        raise FedbenchError(
            f"{path.name} would be {len(data) // 1000} KB (limit {MAX_BYTES // 1000} KB); "
            "show fewer --victims"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path
