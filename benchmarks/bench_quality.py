"""Quality sooner: Inverting Gradients' PSNR against wall time, breaching's schedule vs fedbench's.

One fixed problem: digit `--index` of fedbench's shipped mnist5k (1x28x28, training split), batch 1,
label known, observed through its FedSGD gradient (cross-entropy, the model in eval mode) on a fixed
model (`--model`, default `lenet`: DLG's sigmoid LeNet, 4 conv layers of 12 channels, 17k parameters,
seeded with `--seed`). LeNet is the model of the DLG / iDLG / IG comparisons at 28x28 (breaching's
`LeNetZhu`, fedbench's dlg-ig preset at batch 1); breaching's ConvNet at width 64 (`--model convnet`)
is the IG paper's CIFAR model and costs about 40x more per evaluation on this CPU (0.4 s single
thread: 24,000 iterations would take about 3 hours).

Every run is Inverting Gradients as the paper and breaching's `invertinggradients` config set it:
cosine cost over all layers, Adam lr 0.1 on the sign of the image gradient, boxed, N(0, 1) init (the
same initial image in every run), TV 0 (one-channel digits). The runs:

- baseline `breaching schedule (fedbench loop)`: breaching's schedule, 24,000 iterations with
  MultiStepLR x0.1 at 3/8, 5/8 and 7/8, run through fedbench's own optimiser loop
  (`_inversion.reconstruct_batched`, optimizer 'adam-signed'). The review of issue 19 measured
  fedbench's cost per objective evaluation at parity with breaching's (0.96-1.05x), so this run's
  trace stands for breaching's schedule at breaching's speed; the parity runs below re-measure that.
- `breaching (real)` (optional): breaching itself (github:JonasGeiping/breaching) on the same model,
  gradient, label and initial image, in a separate interpreter (`_breaching_ig.py`, see there for
  how it is driven and traced), the whole 24,000 iterations. Skipped with a printed reason when
  `--breaching-src` or `--breaching-python` is not there or the run fails.
- parity (with breaching): fedbench's loop and real breaching on breaching's schedule,
  `PARITY_EVALS` evaluations each, alternated `PARITY_REPEATS` times (load from other processes
  then falls on both alike), the best steady-state cost per evaluation of each; checked on CPU time.
- the configurations in `CONFIGS` below (one line each): attack spec strings as users write them,
  built with `fedbench.api.create_attack(name, **params)` and run through the attack's own `run`
  on a hand-made FedSGD `Observation`, so whatever schedule and stopping rule the attack's defaults
  select is what is measured.

The trace: `GradientMatcher.objective` is wrapped for the duration of each fedbench run (fedbench's
attack code is not changed). Every `--every` objective evaluations the wrapper records the PSNR
(`fedbench.metrics.reconstruction.psnr`, [0, 1] pixels) of the candidate being evaluated (with
restarts, the one of lowest objective), the evaluation count and the wall / CPU seconds since the run
began, less the time spent tracing. Every run's code is warmed up first, untimed. From the trace: the
best PSNR reached and the first wall seconds and evaluations at which the iterate reached each
target; `returned` is the PSNR of what the run returned and the wall time of the whole run (what a
user waits for). Targets: `--target` (default 35.8 dB, the review's "breaching's best IG PSNR"),
50 dB, and the baseline's own best PSNR. The ratios divide by the baseline's time to its first
iterate at the same target, measured in the same process.

--quick stops the baseline once its iterate has reached `--target`: on this digit that is right
after its first step-size decay at iteration 9,000 (its lr-0.1 plateau holds 29-30 dB), so its time
to `--target` is exact; the `baseline's best` target is then the best within that cap. Real
breaching then runs the parity runs only (its row is the last of them); its time to the targets needs
the full run. A quick run takes about 2 minutes, a full one about 7 on a 2-core machine.

    python benchmarks/bench_quality.py --quick --out /tmp/bench_quality.json
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from _common import check, environment, markdown_table, write_json

from fedbench.attacks import _inversion as inv

HERE = Path(__file__).resolve().parent

#: The configurations measured against the baseline, as users write them: (row label, attack spec).
#: Adding one is one line. `DEFAULT` names the row the target check is about.
CONFIGS: list[tuple[str, str]] = [
    ("ig[iterations=500]", "inverting-gradients[iterations=500]"),  # the default budget until issue 19
    ("ig[iterations=2000]", "inverting-gradients[iterations=2000]"),  # RecUP-FL's budget
    ("ig (default)", "inverting-gradients"),  # whatever the shipped defaults are
]
DEFAULT = "ig (default)"

#: breaching's IG schedule (config/attack/invertinggradients.yaml): max_iterations, step-lr decay.
BREACHING_ITERATIONS = 24_000
BASELINE = "breaching schedule (fedbench loop)"
REAL = "breaching (real)"
FIXED_TARGETS = (50.0,)
#: The cost-per-evaluation comparison: fedbench's loop and real breaching run breaching's schedule for
#: this many evaluations each, alternately, this many times; the best of each is compared.
PARITY_EVALS, PARITY_REPEATS = 400, 3


# ------------------------------------------------------------------------------------- the problem


def make_problem(model_name: str, index: int, seed: int) -> dict[str, Any]:
    """The digit, the model, its FedSGD gradient and the initial candidate shared by every run."""
    from fedbench.data import load_dataset
    from fedbench.models import build_model

    bundle = load_dataset("mnist5k")
    meta = bundle.meta
    x = bundle.x_train[index : index + 1].float()
    y = bundle.y_train[index : index + 1].long()
    params = {"width": 64} if model_name == "convnet" else {}
    torch.manual_seed(seed)
    model = build_model(model_name, params, meta.input_shape, meta.num_classes)
    model.eval()
    grads = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
    target = {n: g.detach() for (n, _), g in zip(model.named_parameters(), grads, strict=True)}
    x0 = torch.randn((1, *meta.input_shape), generator=torch.Generator().manual_seed(seed))
    return {
        "meta": meta,
        "model": model,
        "model_name": model_name,
        "model_params": params,
        "n_params": sum(p.numel() for p in model.parameters()),
        "x": x,
        "y": y,
        "target": target,
        "true": inv.to_pixels(x, meta).numpy(),
        "x0": x0,
        "seed": seed,
        "index": index,
    }


# ---------------------------------------------------------------------------------------- tracing


class StopTrace(Exception):
    """Raised by the tracer to end a capped baseline run."""


class Tracer:
    """Wraps `GradientMatcher.objective` while active: counts evaluations and, every `every` of them,
    records the PSNR of the lowest-objective candidate and the time since the start less its own."""

    def __init__(
        self,
        true: np.ndarray,
        meta: Any,
        every: int,
        stop_psnr: float | None = None,
        stop_evals: int | None = None,
    ):
        self.true, self.meta, self.every = true, meta, every
        self.stop_psnr, self.stop_evals = stop_psnr, stop_evals
        self.trace: list[dict[str, float]] = []
        self.evals = 0
        self.hook_wall = self.hook_cpu = 0.0
        self.stopped = False

    def psnr(self, images: torch.Tensor) -> float:
        from fedbench.metrics.reconstruction import psnr

        return float(psnr(self.true, images.detach().cpu().numpy())[0])

    def elapsed(self) -> tuple[float, float]:
        return (
            time.perf_counter() - self.t0 - self.hook_wall,
            time.process_time() - self.c0 - self.hook_cpu,
        )

    def __enter__(self) -> Tracer:
        original = self._original = inv.GradientMatcher.objective
        tracer = self

        def objective(matcher: inv.GradientMatcher, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out = original(matcher, x, y)
            n = tracer.evals
            tracer.evals = n + 1
            last = tracer.stop_evals is not None and n + 1 >= tracer.stop_evals
            if n % tracer.every == 0 or last:
                w0, c0 = time.perf_counter(), time.process_time()
                best = int(out.detach().argmin()) if out.numel() > 1 else 0
                p = tracer.psnr(inv.to_pixels(x[best], tracer.meta))
                tracer.trace.append(
                    {
                        "evaluations": n + 1,
                        "seconds": w0 - tracer.t0 - tracer.hook_wall,
                        "cpu_seconds": c0 - tracer.c0 - tracer.hook_cpu,
                        "psnr": p,
                        "objective": float(out.detach().min()),
                    }
                )
                tracer.hook_wall += time.perf_counter() - w0
                tracer.hook_cpu += time.process_time() - c0
                if last or (tracer.stop_psnr is not None and p >= tracer.stop_psnr):
                    tracer.stopped = True
                    raise StopTrace
            return out

        inv.GradientMatcher.objective = objective
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.seconds, self.cpu_seconds = self.elapsed()
        inv.GradientMatcher.objective = self._original
        return bool(exc[0] is StopTrace)


def summarise(label: str, trace: list[dict], seconds: float, cpu: float, evals: int, **extra: Any) -> dict:
    """A run's row; the cost per evaluation is the steady-state slope of its trace (first to last point)."""
    best = max((t["psnr"] for t in trace), default=float("nan"))
    first, last = (trace[0], trace[-1]) if trace else ({}, {})
    n = last.get("evaluations", 0) - first.get("evaluations", 0)
    return {
        "label": label,
        "evaluations": evals,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "startup_seconds": first.get("seconds"),
        "ms_per_evaluation": 1000 * (last["seconds"] - first["seconds"]) / n if n else None,
        "cpu_ms_per_evaluation": 1000 * (last["cpu_seconds"] - first["cpu_seconds"]) / n if n else None,
        "best_psnr": best,
        "trace": trace,
        **extra,
    }


def warm_up(prob: dict) -> None:
    """Run fedbench's objective paths once (single candidate and vmapped), untimed, so that no timed
    run pays torch.func's first-call cost; breaching's runner warms its code up likewise."""
    model = inv.prepare_model(
        copy.deepcopy(prob["model"]), prob["model"].state_dict(), "eval", torch.device("cpu")
    )
    matcher = inv.GradientMatcher(model, prob["target"], cost="cosine")
    for r in (1, 2):
        x0 = prob["x0"].unsqueeze(0).expand(r, *prob["x0"].shape).clone()
        inv.reconstruct_batched(matcher, x0, labels=prob["y"], optimizer="adam-signed", iterations=3, lr=0.1)


def thin(trace: list[dict], points: int = 500) -> list[dict]:
    """At most about `points` evenly spaced points of a trace (and its last) for the JSON file."""
    step = max(1, len(trace) // points)
    return trace[::step] + ([trace[-1]] if (len(trace) - 1) % step else [])


def first_hit(trace: list[dict], level: float) -> dict | None:
    return next((t for t in trace if t["psnr"] >= level), None)


# ------------------------------------------------------------------------------------------- runs


def run_baseline(
    prob: dict,
    every: int,
    stop_psnr: float | None = None,
    stop_evals: int | None = None,
    iterations: int = BREACHING_ITERATIONS,
) -> dict:
    """breaching's schedule through fedbench's optimiser loop (reconstruct_batched, adam-signed)."""
    meta = prob["meta"]
    model = inv.prepare_model(
        copy.deepcopy(prob["model"]), prob["model"].state_dict(), "eval", torch.device("cpu")
    )
    matcher = inv.GradientMatcher(model, prob["target"], cost="cosine", tv_weight=0.0)
    box = inv.box_bounds(meta, meta.input_shape[0], torch.device("cpu"))
    rec = None
    with Tracer(prob["true"], meta, every, stop_psnr, stop_evals) as tr:
        rec = inv.reconstruct_batched(
            matcher,
            prob["x0"].unsqueeze(0),
            labels=prob["y"],
            optimizer="adam-signed",
            iterations=iterations,
            lr=0.1,
            box=box,
            lr_decay=True,
        )
    final = tr.psnr(inv.to_pixels(rec.x[0], meta)) if rec is not None else None
    return summarise(
        BASELINE,
        tr.trace,
        tr.seconds,
        tr.cpu_seconds,
        tr.evals,
        spec=f"reconstruct_batched(adam-signed, iterations={iterations}, lr=0.1, lr_decay, boxed)",
        returned_psnr=final,
        stopped=tr.stopped,
    )


def run_config(label: str, spec: str, prob: dict, every: int) -> dict:
    """An attack spec as users write it, through the attack's own `run` on a FedSGD observation."""
    from fedbench.api import create_attack
    from fedbench.plugin import Observation
    from fedbench.spec.params import params_to_dict
    from fedbench.spec.patterns import parse_pattern

    name, params = parse_pattern(spec)
    attack = create_attack(name, **params)
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
    # the attack draws its initial candidates from this generator: the baseline's x0 for restarts=1
    gen = torch.Generator().manual_seed(prob["seed"])
    with Tracer(prob["true"], prob["meta"], every) as tr:
        out = attack.run(obs, copy.deepcopy(model), prob["meta"], gen, "cpu")
    final = tr.psnr(torch.from_numpy(out.images))
    extra = {k: out.extra.get(k) for k in ("iterations", "evaluations", "final_objective") if k in out.extra}
    return summarise(
        label,
        tr.trace,
        tr.seconds,
        tr.cpu_seconds,
        tr.evals,
        spec=spec,
        params=params_to_dict(attack.params),
        returned_psnr=final,
        attack_extra=extra,
    )


def run_breaching(
    prob: dict,
    every: int,
    stop_psnr: float | None,
    stop_evals: int | None,
    src: Path,
    python: str,
    iterations: int = BREACHING_ITERATIONS,
) -> dict | str:
    """REAL breaching in its own interpreter (`iterations`: its max_iterations, the milestones at 3/8,
    5/8 and 7/8 of them); the summary dict, or why it was skipped."""
    if not (src / "breaching" / "attacks" / "__init__.py").exists():
        return f"no breaching checkout at {src} (--breaching-src)"
    if not Path(python).exists():
        return f"no interpreter with breaching's deps at {python} (--breaching-python)"
    model = prob["model"]
    problem = {
        "model": prob["model_name"],
        "model_params": prob["model_params"],
        "shape": list(prob["meta"].input_shape),
        "num_classes": prob["meta"].num_classes,
        "state": model.state_dict(),
        "gradients": [prob["target"][n] for n, _ in model.named_parameters()],
        "labels": prob["y"],
        "true_pixels": torch.from_numpy(prob["true"]),
        "mean": list(prob["meta"].mean),
        "std": list(prob["meta"].std),
        "x0": prob["x0"],
        "max_iterations": iterations,
        "tv_weight": 0.0,
        "trace_every": every,
        "stop_psnr": stop_psnr,
        "stop_evals": stop_evals,
    }
    with tempfile.TemporaryDirectory() as tmp:
        pfile, ofile = Path(tmp) / "problem.pt", Path(tmp) / "out.json"
        torch.save(problem, pfile)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
        }
        env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"})
        cmd = [python, str(HERE / "_breaching_ig.py"), str(pfile), str(ofile), "--src", str(src)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode or not ofile.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return f"breaching run failed (exit {proc.returncode}): {' | '.join(tail)}"
        res = json.loads(ofile.read_text())
    trace = res.pop("trace")
    return summarise(
        REAL,
        trace,
        res.pop("seconds"),
        res.pop("cpu_seconds"),
        res.pop("evaluations"),
        spec=f"breaching invertinggradients (max_iterations={iterations}, TV 0)",
        returned_psnr=res.pop("final_psnr"),
        stopped=res.get("stopped_at") is not None,
        breaching=res,
    )


def measure_parity(prob: dict, src: Path, python: str) -> dict | str:
    """Cost per objective evaluation of fedbench's loop and of breaching on breaching's schedule:
    PARITY_EVALS evaluations each, alternated PARITY_REPEATS times so that load from other processes
    falls on both alike; the best steady-state cost of each (the dict), or why breaching was skipped."""
    ours, theirs = [], []
    for _ in range(PARITY_REPEATS):
        ours.append(run_baseline(prob, PARITY_EVALS // 10, stop_evals=PARITY_EVALS))
        got = run_breaching(prob, PARITY_EVALS // 10, None, PARITY_EVALS, src, python)
        if isinstance(got, str):
            return got
        theirs.append(got)
    out: dict[str, Any] = {
        "evaluations": PARITY_EVALS,
        "repeats": PARITY_REPEATS,
        "last_breaching_run": theirs[-1],
    }
    for unit in ("ms_per_evaluation", "cpu_ms_per_evaluation"):
        a, b = min(r[unit] for r in ours), min(r[unit] for r in theirs)
        out[f"fedbench_{unit}"], out[f"breaching_{unit}"], out[f"ratio_{unit}"] = a, b, a / b
    return out


# ----------------------------------------------------------------------------------------- report


def fmt(v: Any, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "not reached"
    if isinstance(v, float):
        return f"{v:.3g}{unit}" if abs(v) < 100 else f"{v:.0f}{unit}"
    return f"{v}{unit}"


def budgets_table(rows: list[dict], budgets: list[int]) -> str:
    """PSNR of the iterate at a few evaluation budgets (the traced point at or before each)."""
    header = ["run"] + [f"{b} evals" for b in budgets]
    out = []
    for r in rows:
        cells = []
        for b in budgets:
            pts = [t for t in r["trace"] if t["evaluations"] <= b]
            cells.append(f"{pts[-1]['psnr']:.1f}" if pts and r["evaluations"] >= b else "-")
        out.append([r["label"]] + cells)
    return markdown_table(header, out)


def to_target(rows: list[dict], refs: dict[str, dict], targets: list[float]) -> None:
    """Per row and target: the first traced iterate at the target, the run's return if at the target,
    and their ratios to each reference run's first iterate at the same target."""
    for r in rows:
        r["to_target"] = {}
        for level in targets:
            hit = first_hit(r["trace"], level)
            returned = (
                r["seconds"] if (r.get("returned_psnr") or 0) >= level and not r.get("stopped") else None
            )
            entry: dict[str, Any] = {
                "target_db": level,
                "seconds": hit["seconds"] if hit else None,
                "cpu_seconds": hit["cpu_seconds"] if hit else None,
                "evaluations": hit["evaluations"] if hit else None,
                # a user holds the result when the run returns: its whole wall time, if what it
                # returned is at the target
                "returned_seconds": returned,
            }
            for key, ref in refs.items():
                ref_hit = first_hit(ref["trace"], level)
                both = hit is not None and ref_hit is not None
                entry[f"{key}_seconds"] = hit["seconds"] / ref_hit["seconds"] if both else None
                entry[f"{key}_cpu_seconds"] = hit["cpu_seconds"] / ref_hit["cpu_seconds"] if both else None
                entry[f"{key}_evaluations"] = hit["evaluations"] / ref_hit["evaluations"] if both else None
                entry[f"{key}_returned"] = returned / ref_hit["seconds"] if ref_hit and returned else None
            r["to_target"][str(level)] = entry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="cap the baselines (see the module docstring; < 3 min)"
    )
    ap.add_argument("--model", default="lenet", choices=["lenet", "convnet"])
    ap.add_argument("--index", type=int, default=0, help="the mnist5k training digit")
    ap.add_argument("--seed", type=int, default=0, help="model weights and initial image")
    ap.add_argument("--target", type=float, default=35.8, help="PSNR target of the check (dB)")
    ap.add_argument("--every", type=int, default=5, help="trace the PSNR every this many evaluations")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--breaching-src",
        default=os.environ.get("FEDBENCH_BREACHING_SRC", "/work/breaching-src"),
        help="a breaching checkout (the folder with breaching/); missing = that row is skipped",
    )
    ap.add_argument(
        "--breaching-python",
        default=os.environ.get("FEDBENCH_BREACHING_PYTHON", "/work/venv-breach/bin/python"),
        help="an interpreter with torch, hydra-core and omegaconf for breaching",
    )
    ap.add_argument("--no-breaching", action="store_true", help="skip the real-breaching row")
    ap.add_argument("--out", default=None, help="write JSON results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    prob = make_problem(args.model, args.index, args.seed)
    warm_up(prob)
    cap = args.target if args.quick else None
    rows = [run_config(label, spec, prob, args.every) for label, spec in CONFIGS]
    base = run_baseline(prob, args.every, cap)
    rows.insert(0, base)
    skipped = "--no-breaching" if args.no_breaching else None
    real = parity = None
    src = Path(args.breaching_src)
    if not skipped:
        got = measure_parity(prob, src, args.breaching_python)
        if isinstance(got, str):
            skipped = got
        else:
            parity = got
            real = parity.pop("last_breaching_run")
            if not args.quick:
                got = run_breaching(prob, args.every, None, None, src, args.breaching_python)
                if isinstance(got, str):
                    skipped = got
                    real = None
                else:
                    real = got
    if real is not None:
        rows.insert(1, real)
    if skipped:
        print(f"breaching (real) skipped: {skipped}\n")

    best_level = math.floor(base["best_psnr"] * 10) / 10  # reached by the baseline's trace
    targets = sorted({args.target, *FIXED_TARGETS, best_level})
    refs = {"vs_baseline": base}
    if real is not None and not real["stopped"]:
        refs["vs_real"] = real
    to_target(rows, refs, targets)

    # ---- tables
    capped = f" (--quick: stopped at its first iterate >= {args.target:g} dB)" if args.quick else ""
    print(
        f"Inverting Gradients on mnist5k training digit {args.index} (label {int(prob['y'][0])}), "
        f"{args.model} ({prob['n_params']} parameters, seed {args.seed}), batch 1, label known, "
        f"{args.threads} thread(s). Baseline: breaching's {BREACHING_ITERATIONS}-iteration schedule "
        f"through fedbench's loop{capped}."
        + (
            f" breaching (real): its last {PARITY_EVALS}-evaluation parity run (--quick)."
            if args.quick and real
            else ""
        )
        + "\n"
    )
    header = [
        "run",
        "evals",
        "wall s",
        "startup s",
        "ms/eval (wall)",
        "ms/eval (CPU)",
        "best dB",
        "returned dB",
    ]
    table = [
        [
            r["label"] + (" (capped)" if r.get("stopped") else ""),
            r["evaluations"],
            r["seconds"],
            r["startup_seconds"],
            r["ms_per_evaluation"],
            r["cpu_ms_per_evaluation"],
            r["best_psnr"],
            r["returned_psnr"] if r.get("returned_psnr") is not None else "- (stopped)",
        ]
        for r in rows
    ]
    print(markdown_table(header, table) + "\n")
    budgets = [
        1,
        100,
        250,
        500,
        1000,
        2000,
        5000,
        9000,
        9500,
        15000,
        15500,
        21000,
        21500,
        BREACHING_ITERATIONS,
    ]
    print("PSNR (dB) of the iterate after n objective evaluations:\n")
    print(budgets_table(rows, budgets) + "\n")
    for level in targets:
        what = "the baseline's best" if level == best_level else "target"
        header = [f"to {level:.1f} dB ({what})", "evals", "wall s", "vs baseline: wall", "CPU", "evals"]
        if "vs_real" in refs:
            header.append("vs real breaching: wall")
        header += ["returned at (wall s)", "vs baseline"]
        table = []
        for r in rows:
            e = r["to_target"][str(level)]
            row = [
                r["label"],
                fmt(e["evaluations"]),
                fmt(e["seconds"]),
                fmt(e["vs_baseline_seconds"], "x"),
                fmt(e["vs_baseline_cpu_seconds"], "x"),
                fmt(e["vs_baseline_evaluations"], "x"),
            ]
            if "vs_real" in refs:
                row.append(fmt(e["vs_real_seconds"], "x"))
            row += [fmt(e["returned_seconds"]), fmt(e["vs_baseline_returned"], "x")]
            table.append(row)
        print(markdown_table(header, table) + "\n")

    if parity is not None:
        print(
            f"Cost per objective evaluation, breaching's schedule, best of {PARITY_REPEATS} alternated runs "
            f"of {PARITY_EVALS} evaluations each (the review of issue 19 measured 0.96-1.05x):\n"
        )
        print(
            markdown_table(
                ["", "fedbench loop ms", "breaching ms", "fedbench / breaching"],
                [
                    [
                        unit,
                        parity[f"fedbench_{key}"],
                        parity[f"breaching_{key}"],
                        f"{parity[f'ratio_{key}']:.3f}x",
                    ]
                    for unit, key in (("wall", "ms_per_evaluation"), ("CPU", "cpu_ms_per_evaluation"))
                ],
            )
            + "\n"
        )

    # ---- checks
    checks = []
    e = next(r for r in rows if r["label"] == DEFAULT)["to_target"][str(args.target)]

    def ratio_check(what: str, value: float | None) -> None:
        checks.append(
            check(
                what,
                value if value is not None else float("inf"),
                "<= 0.33",
                value is not None and value <= 0.33,
            )
        )

    ratio_check(
        f"{DEFAULT}: wall time to {args.target:g} dB vs breaching's schedule (first iterate at the target)",
        e["vs_baseline_seconds"],
    )
    ratio_check(
        f"{DEFAULT}: wall time until it returns >= {args.target:g} dB vs breaching's schedule reaching it",
        e["vs_baseline_returned"],
    )
    if parity is not None:
        ratio = parity["ratio_cpu_ms_per_evaluation"]
        checks.append(
            check(
                f"fedbench's loop vs breaching: CPU time per objective evaluation "
                f"(best of {PARITY_REPEATS} alternated {PARITY_EVALS}-evaluation runs each)",
                ratio,
                "<= 1.05",
                ratio <= 1.05,
            )
        )
    if "vs_real" in refs:
        ratio_check(f"{DEFAULT}: wall time to {args.target:g} dB vs real breaching", e["vs_real_seconds"])
    print(
        markdown_table(
            ["check", "target", "measured", "ok"],
            [[c["what"], c["target"], c["value"], "yes" if c["ok"] else "NO"] for c in checks],
        )
    )

    env = {
        **environment("cpu", args.quick, args.threads),
        "model": args.model,
        "model_params": prob["model_params"],
        "n_params": prob["n_params"],
        "digit_index": args.index,
        "digit_label": int(prob["y"][0]),
        "seed": args.seed,
        "every": args.every,
        "targets_db": targets,
        "baseline_cap_db": cap,
        "parity": parity,
        "breaching_skipped": skipped,
    }
    for r in rows:  # the figures above used every traced point; the file keeps about 500 a run
        r["trace"] = thin(r["trace"])
    write_json(args.out, {"rows": rows, "checks": checks, "env": env})


if __name__ == "__main__":
    sys.exit(main())
