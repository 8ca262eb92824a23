"""Attacks that converge sooner (issue 29): default IG against breaching's 500-iteration IG, CPU time.

For each model (`--models`, default LeNet-12 and breaching's ConvNet at width 64) and each of the
first `--images` mnist5k training digits (batch 1, label known, the FedSGD gradient of a seed-0 model
in eval mode, one randn start shared by both sides; `bench_quality.make_problem`):

1. the baseline: REAL breaching (github:JonasGeiping/breaching, `_breaching_ig.py`, its
   `invertinggradients` config, TV 0) with `max_iterations=500` (MultiStepLR x0.1 at 187, 312, 437),
   run in full in its own interpreter; its final PSNR (what it returns: its best-objective candidate)
   is the image's target, its CPU time the reference. Without a breaching checkout the baseline is
   breaching's 500-iteration schedule through fedbench's own loop (`bench_quality.run_baseline`; per
   evaluation at parity with breaching, 0.83-0.98x in `bench_quality.py`), and the output says so.
2. fedbench's default `inverting-gradients` (no parameters: the stall schedule), through the attack's
   own `run`, traced (`bench_quality.Tracer`): the CPU seconds to its first iterate at the target.
   `--stop-at-target` ends it there (ConvNet-64: saves the rest of its run on a loaded CPU); otherwise
   it runs to its own stop and its returned PSNR is reported too.

The order of the two alternates from image to image, so load from other processes falls on both
alike. Per model: the ratio (default's CPU time to the target / the baseline's CPU time for its 500
iterations) per image, its median and range; the check is median <= 0.5. The 1-minute load average
is recorded before and after each run. One thread. ConvNet-64 costs about 0.4 CPU-s per evaluation
(~6 CPU-minutes an image); `--time-box` stops starting new images of a model after that many wall
seconds (the images measured are stated).

    python benchmarks/bench_ig_converge.py --out benchmarks/results/ig_converge.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from _common import check, environment, markdown_table, write_json
from bench_quality import Tracer, make_problem, run_baseline, run_breaching, warm_up

BASE_ITERATIONS = 500


def run_default(prob: dict, target: float | None, every: int) -> dict:
    """fedbench's default IG on the problem; trace, CPU time to the target, returned PSNR."""
    import copy

    from fedbench.api import create_attack
    from fedbench.plugin import Observation

    attack = create_attack("inverting-gradients")
    model = prob["model"]
    obs = Observation(
        point="update",
        round=0,
        client=0,
        kind="gradient",
        shared={k: v.clone() for k, v in prob["target"].items()},
        global_state={k: v.clone() for k, v in model.state_dict().items()},
        x_true=prob["x"],
        y_true=prob["y"],
        lr=0.1,
        local_steps=1,
        batch_size=1,
        model_mode="eval",
    )
    gen = torch.Generator().manual_seed(prob["seed"])  # its x0 is the baseline's
    out = None
    with Tracer(prob["true"], prob["meta"], every, stop_psnr=target) as tr:
        out = attack.run(obs, copy.deepcopy(model), prob["meta"], gen, "cpu")
    return {
        "evaluations": tr.evals,
        "cpu_seconds": tr.cpu_seconds,
        "stopped_at_target": tr.stopped,
        "returned_psnr": None if out is None else tr.psnr(torch.from_numpy(out.images)),
        "stopped": None if out is None else out.extra.get("stopped"),
        "lr_decays": None if out is None else out.extra.get("lr_decays"),
        "best_psnr": max((t["psnr"] for t in tr.trace), default=None),
        "trace": tr.trace,
    }


def at_target(run: dict, target: float) -> dict:
    """The run with its first traced iterate at `target` (CPU seconds, evaluations), trace dropped."""
    hit = next((t for t in run.pop("trace") if t["psnr"] >= target), None)
    return {
        **run,
        "to_target_cpu_seconds": hit["cpu_seconds"] if hit else None,
        "to_target_evaluations": hit["evaluations"] if hit else None,
    }


def run_reference(prob: dict, src: Path, python: str, every: int) -> dict:
    """breaching's 500-iteration IG, real when available, else its schedule through fedbench's loop."""
    got = run_breaching(prob, every, None, None, src, python, iterations=BASE_ITERATIONS)
    if isinstance(got, dict):
        return {
            "kind": "breaching (real)",
            "cpu_seconds": got["cpu_seconds"],
            "evaluations": got["evaluations"],
            "final_psnr": got["returned_psnr"],
            "commit": got.get("breaching", {}).get("breaching_commit"),
        }
    base = run_baseline(prob, every, iterations=BASE_ITERATIONS)
    return {
        "kind": f"breaching's schedule, fedbench loop ({got})",
        "cpu_seconds": base["cpu_seconds"],
        "evaluations": base["evaluations"],
        "final_psnr": base["returned_psnr"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["lenet", "convnet"], choices=["lenet", "convnet"])
    ap.add_argument("--images", type=int, default=3, help="mnist5k training digits 0 .. N-1")
    ap.add_argument("--every", type=int, default=1, help="trace the PSNR every this many evaluations")
    ap.add_argument("--stop-at-target", action="store_true", help="end the default's run at the target")
    ap.add_argument("--time-box", type=float, default=None, help="wall seconds per model for new images")
    ap.add_argument(
        "--breaching-src", default=os.environ.get("FEDBENCH_BREACHING_SRC", "/work/breaching-src")
    )
    ap.add_argument(
        "--breaching-python",
        default=os.environ.get("FEDBENCH_BREACHING_PYTHON", "/work/venv-breach/bin/python"),
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    src = Path(args.breaching_src)
    results, checks = {}, []
    for model in args.models:
        rows, start = [], time.perf_counter()
        for index in range(args.images):
            if args.time_box is not None and rows and time.perf_counter() - start > args.time_box:
                break
            prob = make_problem(model, index, 0)
            warm_up(prob)
            load = [os.getloadavg()[0]]
            # alternate the order (load falls on both alike); the default runs second when it stops at
            # the target, which is breaching's result
            ours_first = index % 2 == 1 and not args.stop_at_target
            if ours_first:
                ours = run_default(prob, None, args.every)
                load.append(os.getloadavg()[0])
            ref = run_reference(prob, src, args.breaching_python, args.every)
            load.append(os.getloadavg()[0])
            if not ours_first:
                stop = ref["final_psnr"] if args.stop_at_target else None
                ours = run_default(prob, stop, args.every)
                load.append(os.getloadavg()[0])
            ours = at_target(ours, ref["final_psnr"])
            t = ours["to_target_cpu_seconds"]
            row = {
                "image": index,
                "reference": ref,
                "default": ours,
                "ratio": t / ref["cpu_seconds"] if t is not None else None,
                "load_1min": load,
                "order": "default first" if ours_first else "breaching first",
            }
            rows.append(row)
            print(
                f"{model} digit {index}: {ref['kind']} {ref['final_psnr']:.2f} dB in "
                f"{ref['cpu_seconds']:.1f} CPU-s; default IG to it: {fmt(t)} CPU-s "
                f"({ours['to_target_evaluations']} evals), "
                f"ratio {fmt(row['ratio'])}, returned {fmt(ours['returned_psnr'])} dB; load "
                f"{' / '.join(f'{v:.1f}' for v in load)}",
                flush=True,
            )
        ratios = [r["ratio"] if r["ratio"] is not None else float("inf") for r in rows]
        med = statistics.median(ratios)
        results[model] = {"rows": rows, "median_ratio": med, "range": [min(ratios), max(ratios)]}
        checks.append(
            check(
                f"{model}: default IG's CPU time to breaching's {BASE_ITERATIONS}-iteration final PSNR / "
                f"breaching's CPU time (median over {len(rows)} images)",
                med,
                "<= 0.5",
                med <= 0.5,
            )
        )
    print()
    print(
        markdown_table(
            ["model", "images", "median ratio", "range", "load (1 min)", "ok"],
            [
                [
                    m,
                    len(r["rows"]),
                    r["median_ratio"],
                    f"{r['range'][0]:.3f}-{r['range'][1]:.3f}",
                    f"{min(v for x in r['rows'] for v in x['load_1min']):.1f}-"
                    f"{max(v for x in r['rows'] for v in x['load_1min']):.1f}",
                    "yes" if r["median_ratio"] <= 0.5 else "NO",
                ]
                for m, r in results.items()
            ],
        )
    )
    write_json(args.out, {"results": results, "checks": checks, "env": environment("cpu", False, 1)})


def fmt(v: float | None) -> str:
    return "not reached" if v is None else f"{v:.3g}"


if __name__ == "__main__":
    sys.exit(main())
