"""The sweep behind Inverting Gradients' auto schedule for digits (`fedbench/attacks/_schedules.py`).

For a few mnist5k training digits, the FedSGD gradient of one digit (batch 1, labels known) on a fresh
model is inverted from the same randn start under the paper's fixed milestones at several budgets and
under the plateau schedule at several patiences; each line gives the final PSNR, the iterations run,
why the run stopped, the step-size decays and the first traced iteration at 30 / 35 / 40 dB (traced
every 50 evaluations). Not part of `run_all.py` (minutes per digit); its output is quoted in
docs/benchmarks.md.

    python benchmarks/sweep_ig_schedule.py --model lenet --digits 0 1 2 \
        --configs ms:500 ms:2000 pl:50 pl:100
"""

from __future__ import annotations

import argparse
import json
import time

CAP = 24000  # the plateau runs' cap: large enough that they stop on convergence, not on the budget


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="lenet", help="lenet, mlp (hidden 256) or convnet (width 64)")
    ap.add_argument("--digits", type=int, nargs="+", default=[0, 1, 2], help="mnist5k training indices")
    ap.add_argument(
        "--configs",
        nargs="+",
        default=["ms:500", "ms:2000", "pl:50", "pl:100"],
        help="ms:N = the paper's milestones over N iterations; pl:P = plateau schedule, patience P",
    )
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    import fedbench  # noqa: F401  (torchvision compatibility before any model import)
    from fedbench.attacks import _inversion as inv
    from fedbench.attacks._schedules import Plateau
    from fedbench.data import load_dataset
    from fedbench.metrics.reconstruction import psnr
    from fedbench.models import build_model

    torch.set_num_threads(1)
    bundle = load_dataset("mnist5k", {})
    meta = bundle.meta
    params = {"mlp": {"hidden": [256]}, "convnet": {"width": 64}}.get(args.model, {})
    box = inv.box_bounds(meta, 1, torch.device("cpu"))
    for idx in args.digits:
        x, y = bundle.x_train[idx : idx + 1], bundle.y_train[idx : idx + 1]
        torch.manual_seed(0)
        model = build_model(args.model, params, meta.input_shape, meta.num_classes).eval()
        grads = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
        target = {n: g.detach() for (n, _), g in zip(model.named_parameters(), grads, strict=True)}
        model = inv.prepare_model(model, model.state_dict(), "eval", torch.device("cpu"))
        truth = inv.to_pixels(x, meta).numpy()
        for cfg in args.configs:
            kind, value = cfg.split(":")
            matcher = inv.GradientMatcher(model, target, cost="cosine")
            trace: list[tuple[int, float]] = []  # (evaluations so far, PSNR of the current iterate)
            calls = [0]

            def traced(xx, yy, objective=matcher.objective, trace=trace, calls=calls, truth=truth):
                if calls[0] % 50 == 0:
                    trace.append(
                        (calls[0], float(psnr(truth, inv.to_pixels(xx[0].detach(), meta).numpy())[0]))
                    )
                calls[0] += 1
                return objective(xx, yy)

            matcher.objective = traced
            kw = dict(labels=y, optimizer="adam-signed", lr=0.1, box=box)
            if kind == "ms":
                kw["iterations"] = int(value)
            else:
                kw.update(iterations=CAP, plateau=Plateau(patience=int(value)))
            x0 = torch.randn((1, 1, *meta.input_shape), generator=torch.Generator().manual_seed(1))
            start = time.perf_counter()
            rec = inv.reconstruct_batched(matcher, x0, **kw)
            seconds = time.perf_counter() - start
            final = float(psnr(truth, inv.to_pixels(rec.x[0], meta).numpy())[0])

            def first(db, trace=trace):
                return next((it for it, p in trace if p >= db), None)

            row = {
                "model": args.model,
                "digit": idx,
                "config": cfg,
                "final_psnr": round(final, 2),
                "iterations": rec.iterations,
                "stopped": rec.stopped if kind == "pl" else "budget",
                "lr_decays": rec.lr_decays[0] if rec.lr_decays else None,
                "seconds": round(seconds, 1),
                "first_at_30_35_40_db": [first(30), first(35), first(40)],
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
