"""Reconstructions on both sides of the re-identification decision: docs/img/reid-decision.png.

The FedSGD B = 1 scenario of the `inversion-fedsgd-mnist5k-mlp` board (registry/presets/board-fedsgd.toml:
mnist5k, MLP 256, 10 clients, B = 1, the round-0 gradient), reduced to what the figure needs: defenses
none, sparsification[fraction=0.01], gradient-pruning[p=0.99] and dp-gaussian[sigma=0.1,clip=1];
attacks inverting-gradients (200 iterations) and idlg (20 L-BFGS iterations x 4 restarts), the board's
budgets; one seed; victims (observed clients) 0-5, one private image each. Only the attacks run: the
attack reads the victim's round-0 gradient and its simulation stops there, so the FL training (the
utility columns) is never computed; the board's 150 rounds stay in the scenario only so that the runs'
cache keys are the board's.

Per victim and defense, the figure shows the reconstruction of the attack with the best PSNR and
whether it re-identifies its victim, as fedbench's scorer decides it (`attack_metrics` on the result
with the runner's `with_reid_pools`): strictly nearer, by pixel L2, to the victim than to any of the 99
other training records of its class in its pool. Beside it, the pool's nearest other record. The top
row holds the victims and their class-mean image (the `reid_floor` guess). Usage (docs/metrics.md's
numbers; about 2-4 minutes on 2 busy cores):

    PYTHONPATH=. .venv/bin/python docs/reid_figure.py
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np

from fedbench.execution.cache import RunCache
from fedbench.execution.runner import Job, RunContext, attack_result, with_reid_pools
from fedbench.metrics import attack_metrics
from fedbench.spec.grid import build_grid

HERE = Path(__file__).resolve().parent
BOARD_PRESET = HERE.parent / "registry" / "presets" / "board-fedsgd.toml"
OUT = HERE / "img" / "reid-decision.png"
MAX_BYTES = 150_000
DEFENSES = """
[[defense]]
name = "none"

[[defense]]
name = "sparsification"
params = { fraction = 0.01 }

[[defense]]
name = "gradient-pruning"
params = { p = 0.99 }

[[defense]]
name = "dp-gaussian"
params = { sigma = 0.1, clip = 1.0 }

[[attack]]
name = "inverting-gradients"
params = { iterations = 200 }

[[attack]]
name = "idlg"
params = { iterations = 20, restarts = 4 }
"""
SHORT = {"inverting-gradients": "IG", "idlg": "iDLG"}


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def write_preset(folder: Path, victims: int) -> Path:
    """The reduced preset: the board's [scenario], dataset and model, the figure's defenses and attacks."""
    board = tomllib.loads(BOARD_PRESET.read_text())
    scenario = {**board["scenario"], "victim": list(range(victims))}
    if scenario.get("protocol") != "fedsgd" or scenario.get("batch_size") != 1:
        raise SystemExit(f"{BOARD_PRESET} is no longer the FedSGD B = 1 board")
    model = board["model"][0]
    lines = [
        "[grid]",
        'name = "reid-figure"',
        'description = "docs/reid_figure.py: board-fedsgd reduced to the re-identification figure"',
        "seeds = 1",
        "",
        "[scenario]",
        *(f"{k} = {_toml(v)}" for k, v in scenario.items()),
        "",
        "[[dataset]]",
        f'name = "{board["dataset"][0]["name"]}"',
        "",
        "[[model]]",
        f'name = "{model["name"]}"',
        f"params = {{ hidden = {_toml(model['params']['hidden'])} }}",
        DEFENSES,
    ]
    path = folder / "reid-figure.toml"
    path.write_text("\n".join(lines))
    return path


def collect(preset: Path, cache_dir: Path, threads: int) -> tuple[dict, dict]:
    """Per (defense, victim): the best-PSNR reconstruction and its scores; per victim: its image,
    class-mean image and whether that re-identifies it."""
    import torch

    torch.set_num_threads(threads)
    cache, ctx = RunCache(cache_dir), RunContext(threads=threads)
    specs = build_grid(preset).specs
    cells: dict[tuple[str, int], dict] = {}
    victims: dict[int, dict] = {}
    for n, spec in enumerate(specs, 1):
        started = time.perf_counter()
        job = Job(spec, ctx)
        result = with_reid_pools(job, attack_result(spec, cache, ctx))
        per = attack_metrics(job.parts.attack, result).per_image
        truth, images = result["truth"], result["output"]["images"]
        j = per["match"][0]  # B = 1: one private image per run
        if j < 0:
            raise SystemExit(f"{spec.describe()}: no reconstruction was matched to the private image")
        rec = np.clip(np.asarray(images[j], dtype=np.float64), 0, 1)
        others = np.asarray(truth["reid_others"][0], dtype=np.float64)
        victim = np.asarray(truth["images"][0], dtype=np.float64)
        d_victim = float(np.linalg.norm(rec - victim))
        d_others = np.linalg.norm((others - rec[None]).reshape(len(others), -1), axis=1)
        if per["reid"][0] != int(d_victim == 0 or d_victim < d_others.min()):  # the drawn distances
            raise SystemExit(f"{spec.describe()}: the scorer's decision disagrees with the distances drawn")
        cell = {
            "psnr": per["psnr"][0],
            "reid": per["reid"][0],
            "attack": spec.attack.name,
            "rec": rec,
            "nearest": others[int(np.argmin(d_others))],
            "d_victim": d_victim,
            "d_other": float(d_others.min()),
        }
        key = (spec.defense.label, spec.scenario.victim)
        if key not in cells or cell["psnr"] > cells[key]["psnr"]:
            cells[key] = cell
        victims[spec.scenario.victim] = {
            "image": victim,
            "mean": np.asarray(truth["class_means"][0], dtype=np.float64),
            "reid_floor": per["reid_floor"][0],
            "pool": per["reid_pool"][0],
        }
        took = time.perf_counter() - started
        print(
            f"[{n}/{len(specs)}] {spec.defense.label} x {spec.attack.name} victim {spec.scenario.victim}: "
            f"PSNR {cell['psnr']:.1f} dB, reid {cell['reid']} ({took:.1f} s)",
            flush=True,
        )
    return cells, victims


def draw(cells: dict, victims: dict, defenses: list[str], out: Path) -> int:
    """The grid: victims (and their class mean) on top, then per defense each victim's best
    reconstruction beside its pool's nearest other record; a green or red frame says the decision."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    ids = sorted(victims)
    rows = 1 + len(defenses)
    # per victim: its reconstruction and the nearest other record, then a narrow gap before the next
    ratios = [w for _ in ids for w in (1.0, 1.0, 0.28)][:-1]
    width = 0.78 * sum(ratios) + 1.4
    fig = plt.figure(figsize=(width, 1.12 * rows + 0.3))
    grid = fig.add_gridspec(
        rows,
        len(ratios),
        width_ratios=ratios,
        left=1.3 / width,
        right=0.99,
        top=0.93,
        bottom=0.07,
        hspace=0.75,
        wspace=0.06,
    )
    axes = np.array(
        [[fig.add_subplot(grid[r, 3 * k + i]) for k in range(len(ids)) for i in (0, 1)] for r in range(rows)]
    )

    def show(ax, image, color=None, note="", note_color="black"):
        ax.imshow(np.asarray(image).reshape(np.asarray(image).shape[-2:]), cmap="gray", vmin=0, vmax=1)
        ax.set_xticks([])
        ax.set_yticks([])
        for spine in ax.spines.values():
            spine.set_edgecolor(color or "#bbbbbb")
            spine.set_linewidth(3 if color else 0.6)
        if note:
            ax.text(
                0.0,
                -0.06,
                note,
                transform=ax.transAxes,
                ha="left",
                va="top",
                fontsize=6.5,
                color=note_color,
                clip_on=False,
            )

    green, red = "#1a9641", "#d7191c"
    for k, v in enumerate(ids):
        floor = victims[v]["reid_floor"]
        show(axes[0, 2 * k], victims[v]["image"], note=f"victim {v}")
        show(
            axes[0, 2 * k + 1],
            victims[v]["mean"],
            green if floor else red,
            "class mean:\n" + ("re-identified" if floor else "not re-identified"),
            green if floor else red,
        )
    axes[0, 0].set_ylabel("victim's image |\nits class mean", fontsize=7, rotation=0, ha="right", va="center")
    for r, defense in enumerate(defenses, 1):
        axes[r, 0].set_ylabel(defense.replace("[", "\n["), fontsize=7, rotation=0, ha="right", va="center")
        for k, v in enumerate(ids):
            c = cells[(defense, v)]
            ok = bool(c["reid"])
            mark = green if ok else red
            show(
                axes[r, 2 * k],
                c["rec"],
                mark,
                f"{c['psnr']:.1f} dB {SHORT.get(c['attack'], c['attack'])}\n"
                + ("re-identified" if ok else "not re-identified"),
                mark,
            )
            show(
                axes[r, 2 * k + 1], c["nearest"], note=f"L2 {c['d_victim']:.2f} vs\n{c['d_other']:.2f} other"
            )
    fig.suptitle(
        "Per victim: the best-PSNR reconstruction of IG and iDLG (frame: green re-identified, red not) | "
        "the nearest other record of its pool; L2 from the reconstruction to the victim vs to that record",
        fontsize=7.5,
    )
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    small = Image.open(io.BytesIO(buf.getvalue())).convert("RGB").quantize(colors=64)
    data = io.BytesIO()
    small.save(data, format="PNG", optimize=True)
    if len(data.getvalue()) > MAX_BYTES:
        raise SystemExit(f"{out} would be {len(data.getvalue()) // 1000} KB, over {MAX_BYTES // 1000} KB")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data.getvalue())
    return len(data.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, help="run cache to read and fill [default: a temp dir]")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--victims", type=int, default=6, help="observed clients 0..N-1 (at most 10)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedbench-reid-figure-") as tmp:
        preset = write_preset(Path(tmp), args.victims)
        cells, victims = collect(preset, args.cache_dir or Path(tmp) / "cache", args.threads)
    defenses = list(dict.fromkeys(d for d, _ in cells))
    size = draw(cells, victims, defenses, args.out)
    n = len(victims)
    floor = sum(int(v["reid_floor"] or 0) for v in victims.values())
    print("\n| defense | re-identified | median PSNR (dB) |\n|---|---|---|")
    for defense in defenses:
        mine = [cells[(defense, v)] for v in sorted(victims)]
        k = sum(int(c["reid"] or 0) for c in mine)
        print(f"| {defense} | {k}/{n} | {statistics.median(c['psnr'] for c in mine):.1f} |")
    pools = sorted({int(v["pool"]) for v in victims.values()})
    print(
        f"| class-mean image (floor) | {floor}/{n} | - |\n\npool size {pools}; best of "
        f"inverting-gradients and idlg per victim, seed 0; wrote {args.out} ({size // 1000} KB) "
        f"in {time.perf_counter() - started:.0f} s\n"
        "regenerate: PYTHONPATH=. .venv/bin/python docs/reid_figure.py"
    )


if __name__ == "__main__":
    main()
