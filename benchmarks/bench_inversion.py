"""Speed of the gradient-inversion core: one reconstruction vs R reconstructions batched with torch.func.

For dlg (per-candidate L-BFGS, L2 cost) and ig (signed Adam, cosine cost) at 1x28x28 on three models
from `fedbench.models` (issue 19: every model is labelled with its width):
- `lenet-12`: DLG's LeNet (4 conv5x5 layers of 12 channels, sigmoid; the DLG papers' model);
- `convnet-8`: breaching's ConvNet (8 conv3x3+BN+ReLU layers, channels 1,2,2,4,4,4,4,4 x width, two
  max-pools of 3, linear) at width 8 (the small model of the earlier tables, labelled `convnet`);
- `convnet-64`: the same at width 64, breaching's own `convnet` (its `ConvNet(width=64)`).
fedbench's `ConvNet` has breaching's layer sequence and names under `.model` (conv0..7, bn0..7,
relu0..7, pool0, pool1, flatten); the differences: the linear layer is `.linear` beside `.model`
rather than inside it, a 1x28x28 input here (breaching's CIFAR cases are 3x32x32; both end in a 3x3
map, 36 x width features), the pools clamp to the map left (equal to breaching's from 9x9 up), and
the model is evaluated in eval mode (BN running statistics, as `inv.prepare_model(..., "eval")`).
The weights are torch's default initialisation in both (seed 0 here).

It times `reconstruct_batched` with R=1 and R=R (default 8) candidates in the same run, the single
run bracketing the batched one (the faster of the two single runs is kept), and reports
reconstructions x objective evaluations per second, the batched/single ratio (> 1 means batching pays
per reconstruction; the target is >= 3x on LeNet) and the peak memory of one iteration single and
batched (see _common) with their ratio. ConvNet-64 is slow on a CPU (about 1.4 GFLOP per forward of
one 1x28x28 image), so it gets fewer iterations, fewer L-BFGS inner evaluations and fewer repeats
(`MODELS`; the ratio is per objective evaluation, so it compares alike). On a machine with a GPU it
runs there (`--device auto`).

    python benchmarks/bench_inversion.py --quick --threads 1 --out bench_inversion.json
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from _common import check, environment, peak_memory_mb, pick_device, sync, write_json
from torch import nn

from fedbench.attacks import _inversion as inv
from fedbench.plugin import DatasetMeta

META = DatasetMeta("mnist-like", (1, 28, 28), 10, "image", (0.1307,), (0.3081,))

#: label -> (registry name, params, width, budget). The budget: iterations of ig / dlg (quick, full),
#: L-BFGS inner evaluations per dlg iteration, and timed repeats (best of) (quick, full).
MODELS: dict[str, tuple[str, dict, int, dict]] = {
    "lenet-12": ("lenet", {}, 12, {"ig": (10, 60), "dlg": (1, 3), "lbfgs_max_iter": 20, "repeats": (3, 3)}),
    "convnet-8": (
        "convnet",
        {"width": 8},
        8,
        {"ig": (10, 60), "dlg": (1, 3), "lbfgs_max_iter": 20, "repeats": (3, 3)},
    ),
    "convnet-64": (
        "convnet",
        {"width": 64},
        64,
        {"ig": (2, 10), "dlg": (1, 1), "lbfgs_max_iter": 3, "repeats": (2, 2)},
    ),
}


def build(label: str) -> tuple[nn.Module, str]:
    from fedbench.models import build_model

    name, params, _, _ = MODELS[label]
    torch.manual_seed(0)
    return build_model(name, params, META.input_shape, 10), f"fedbench.models {name}{params or ''}"


def problem(label: str, cost: str, device: str) -> tuple[inv.GradientMatcher, torch.Tensor, str]:
    model, source = build(label)
    model.eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn((1, 1, 28, 28), generator=g)
    y = torch.tensor([3])
    grads = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
    target = {n: gi.detach().to(device) for (n, _), gi in zip(model.named_parameters(), grads, strict=True)}
    model = inv.prepare_model(model, model.state_dict(), "eval", torch.device(device))
    return inv.GradientMatcher(model, target, cost=cost), y.to(device), source


def time_run(
    attack: str,
    matcher: inv.GradientMatcher,
    y: torch.Tensor,
    R: int,
    iterations: int,
    device: str,
    repeats: int = 3,
    lbfgs_max_iter: int = 20,
) -> dict:
    dev = torch.device(device)
    x0 = torch.randn((R, 1, 1, 28, 28), generator=torch.Generator().manual_seed(1)).to(dev)
    if attack == "ig":
        kw = dict(
            labels=y,
            optimizer="adam-signed",
            iterations=iterations,
            lr=0.1,
            box=inv.box_bounds(META, 1, dev),
        )
    else:  # dlg: joint labels, L-BFGS; tolerances disabled in effect by the short budget
        kw = dict(
            label_logits0=torch.randn((R, 1, 10), generator=torch.Generator().manual_seed(2)).to(dev),
            optimizer="lbfgs",
            iterations=iterations,
            lr=1.0,
            lbfgs_max_iter=lbfgs_max_iter,
        )
    inv.reconstruct_batched(matcher, x0, **{**kw, "iterations": 1})  # warm-up
    dt = float("inf")
    for _ in range(repeats):  # best of: load from other processes only ever slows a run down
        sync(device)
        t0 = time.perf_counter()
        rec = inv.reconstruct_batched(matcher, x0, **kw)
        sync(device)
        dt = min(dt, time.perf_counter() - t0)
    peak = peak_memory_mb(lambda: inv.reconstruct_batched(matcher, x0, **{**kw, "iterations": 1}), device)
    return {
        "seconds": dt,
        "evaluations": rec.evaluations,
        "iterations_per_s": rec.iterations / dt,
        "rec_evals_per_s": R * rec.evaluations / dt,
        "peak_mb": peak,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few iterations (smoke run)")
    ap.add_argument("--R", type=int, default=8, help="batched reconstructions")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="auto", help="auto (cuda when visible), cpu or cuda")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS), help="models to run")
    ap.add_argument("--out", default=None, help="write JSON results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    pick = 0 if args.quick else 1
    rows = []
    for label in args.models:
        _, _, width, budget = MODELS[label]
        for attack in ("dlg", "ig"):
            matcher, y, source = problem(label, "cosine" if attack == "ig" else "l2", device)
            kw = dict(repeats=budget["repeats"][pick], lbfgs_max_iter=budget["lbfgs_max_iter"])
            its = budget[attack][pick]
            single = time_run(attack, matcher, y, 1, its, device, **kw)
            batched = time_run(attack, matcher, y, args.R, its, device, **kw)
            single2 = time_run(attack, matcher, y, 1, its, device, **kw)  # bracket the batched timing
            if single2["rec_evals_per_s"] > single["rec_evals_per_s"]:
                single = single2
            rows.append(
                {
                    "model": label,
                    "width": width,
                    "model_source": source,
                    "parameters": sum(p.numel() for p in matcher.model.parameters()),
                    "attack": attack,
                    "R": args.R,
                    "iterations": its,
                    "lbfgs_max_iter": budget["lbfgs_max_iter"] if attack == "dlg" else None,
                    "single_iterations_per_s": single["iterations_per_s"],
                    "single_rec_evals_per_s": single["rec_evals_per_s"],
                    "batched_rec_evals_per_s": batched["rec_evals_per_s"],
                    "ratio": batched["rec_evals_per_s"] / single["rec_evals_per_s"],
                    "single_evaluations": single["evaluations"],
                    "batched_evaluations": batched["evaluations"],
                    "single_peak_mb": single["peak_mb"],
                    "batched_peak_mb": batched["peak_mb"],
                    # below 1 MB the sampled peak is noise (a tiny model's single run)
                    "peak_ratio": batched["peak_mb"] / single["peak_mb"] if single["peak_mb"] >= 1 else None,
                }
            )
    print(
        "| model (width) | params | attack | iterations | single rec*evals/s "
        f"| R={args.R} batched rec*evals/s | batched / single | peak MB single / batched "
        "| peak batched / single |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mem = f"{r['peak_ratio']:.1f}x" if r["peak_ratio"] is not None else "n/a (single < 1 MB)"
        print(
            f"| {r['model']} | {r['parameters']} | {r['attack']} | {r['iterations']} | "
            f"{r['single_rec_evals_per_s']:.1f} | {r['batched_rec_evals_per_s']:.1f} | {r['ratio']:.2f}x | "
            f"{r['single_peak_mb']:.0f} / {r['batched_peak_mb']:.0f} | {mem} |"
        )
    checks = [
        check(
            f"batched {r['attack']} on {r['model']}: reconstructions/s vs one at a time",
            r["ratio"],
            ">= 3x",
            r["ratio"] >= 3,
        )
        for r in rows
        if r["model"].startswith("lenet")
    ]
    budgets = {label: MODELS[label][3] for label in args.models}
    env = {**environment(device, args.quick, args.threads), "budgets": budgets}
    write_json(args.out, {"rows": rows, "checks": checks, "env": env})


if __name__ == "__main__":
    main()
