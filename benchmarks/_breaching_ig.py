"""Run REAL breaching's Inverting Gradients on a problem written by bench_quality.py; trace its PSNR.

    <python with breaching's deps> benchmarks/_breaching_ig.py PROBLEM.pt OUT.json --src BREACHING_CHECKOUT

Setup (offline, once): a breaching checkout without its notebooks, e.g. from a clone of
github:JonasGeiping/breaching (tested at 8bd99d52), `git archive HEAD breaching | tar -x -C DIR`
(optionally `git rev-parse HEAD > DIR/.breaching_commit`), and an interpreter with its light deps:
`python3.11 -m venv V && V/bin/pip install torch torchvision hydra-core omegaconf scipy` (torchvision
need not load; no weights are downloaded). bench_quality.py looks for DIR=/work/breaching-src and
V=/work/venv-breach (`--breaching-src`, `--breaching-python`, or FEDBENCH_BREACHING_SRC / _PYTHON).

Run by `bench_quality.py` in a separate interpreter (breaching needs hydra-core / omegaconf, which
fedbench's environment does not have). PROBLEM.pt holds the model name and state, the observed
gradient (in `model.parameters()` order), the known label, the true image, the dataset's mean/std,
the initial candidate and the budget; the model is rebuilt with `fedbench.models.build_model`.

breaching is driven as its README does: `breaching.attacks.prepare_attack(model, loss, cfg_attack)`
with the `invertinggradients` attack config (cosine similarity, Adam on the hard sign of the image
gradient, lr 0.1, boxed, MultiStepLR x0.1 at 3/8, 5/8, 7/8 of 24,000 iterations), TV scale set to 0
(1-channel digits), then `attacker.reconstruct(server_payload, shared_data, {}, initial_data=x0)`
with a hand-made payload (the server's parameters, no buffers) and shared data (the gradient, 1
data point, the label). On CPU, one thread.

The trace wraps the attacker's `_compute_objective` closure (breaching's code is not changed): every
`trace_every` objective evaluations it records the PSNR of the candidate being evaluated (the
current iterate) and of the candidate breaching would return if stopped there (its best-objective
candidate so far, tracked exactly as its loop does: the post-step candidate of the step whose
objective was the lowest). The time spent tracing is subtracted from the timestamps; three untimed
`dryrun` reconstructions (one iteration each) first warm breaching's code up, as the benchmark warms
fedbench's up before its runs. Once
`stop_evals` evaluations are done, or the iterate reached `stop_psnr`, the hook raises
KeyboardInterrupt, which breaching's loop catches and treats as an early stop (it returns its best
candidate so far).

Importing breaching: its package `__init__` imports its case/data code, which imports torchvision.
When that fails (torchvision's C ops do not load against this CPU torch build) the runner imports
`breaching.attacks` under empty namespace packages for `breaching`, `breaching.cases` and
`breaching.cases.models` (the attack code reaches only `transformer_dictionary` there, plain torch),
and says so in its output (`import_mode`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import sys
import time
import types
from pathlib import Path


def import_breaching(src: Path) -> tuple[object, str]:
    sys.path.insert(0, str(src))
    try:
        import breaching  # noqa: F401

        return importlib.import_module("breaching.attacks"), "package"
    except Exception as exc:  # torchvision's ops not loading, lpips missing, ...
        reason = f"{type(exc).__name__}: {str(exc)[:160]}"
        for name in [k for k in sys.modules if k == "breaching" or k.startswith("breaching.")]:
            del sys.modules[name]
        root = src / "breaching"
        for name, path in [
            ("breaching", root),
            ("breaching.cases", root / "cases"),
            ("breaching.cases.models", root / "cases" / "models"),
        ]:
            mod = types.ModuleType(name)
            mod.__path__ = [str(path)]
            sys.modules[name] = mod
        return importlib.import_module(
            "breaching.attacks"
        ), f"attacks only (import breaching failed: {reason})"


def attack_config(src: Path, overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(src / "breaching" / "config" / "attack"), version_base="1.1"):
        return compose(config_name="invertinggradients", overrides=overrides)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem")
    ap.add_argument("out")
    ap.add_argument("--src", required=True, help="a breaching checkout (the folder holding breaching/)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from fedbench.metrics.reconstruction import psnr
    from fedbench.models import build_model

    src = Path(args.src)
    prob = torch.load(args.problem, weights_only=False)
    attacks, import_mode = import_breaching(src)
    max_iterations = int(prob["max_iterations"])
    cfg = attack_config(
        src,
        [
            f"optim.max_iterations={max_iterations}",
            f"regularization.total_variation.scale={prob['tv_weight']}",
            "optim.callback=1000000000",  # its log line every `callback` iterations: not needed
        ],
    )
    torch.manual_seed(0)
    model = build_model(prob["model"], prob["model_params"], tuple(prob["shape"]), prob["num_classes"])
    model.load_state_dict(prob["state"])
    setup = dict(dtype=torch.float, device=torch.device("cpu"))
    attacker = attacks.prepare_attack(model, torch.nn.CrossEntropyLoss(), cfg, setup)

    metadata = types.SimpleNamespace(
        shape=tuple(prob["shape"]), mean=list(prob["mean"]), std=list(prob["std"]), modality="vision"
    )
    server_payload = [
        dict(parameters=[p.detach().clone() for p in model.parameters()], buffers=None, metadata=metadata)
    ]
    shared_data = [
        dict(
            gradients=[g.clone() for g in prob["gradients"]],
            buffers=None,
            metadata=dict(num_data_points=1, labels=prob["labels"].clone(), local_hyperparams=None),
        )
    ]
    true = prob["true_pixels"].numpy()
    mean = torch.tensor(prob["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(prob["std"]).view(1, -1, 1, 1)

    def pixel_psnr(x: torch.Tensor) -> float:
        return float(psnr(true, (x.detach() * std + mean).clamp(0, 1).numpy())[0])

    every, stop_evals, stop_psnr = int(prob["trace_every"]), prob.get("stop_evals"), prob.get("stop_psnr")
    state = {"evals": 0, "hook_wall": 0.0, "hook_cpu": 0.0, "best": float("inf"), "pending": None}
    trace: list[dict] = []
    best_candidate: list[torch.Tensor | None] = [None]
    original = attacker._compute_objective

    def traced(candidate, labels, rec_model, optimizer, shared, iteration):
        closure = original(candidate, labels, rec_model, optimizer, shared, iteration)

        def wrapped():
            w0, c0 = time.perf_counter(), time.process_time()
            # breaching keeps the post-step candidate of the step with the lowest objective so far:
            # that candidate is the one evaluated now, the pending value the previous step's objective
            if state["pending"] is not None and state["pending"] < state["best"]:
                state["best"] = state["pending"]
                best_candidate[0] = candidate.detach().clone()
            state["hook_wall"] += time.perf_counter() - w0
            state["hook_cpu"] += time.process_time() - c0
            value = closure()
            w0, c0 = time.perf_counter(), time.process_time()
            n = state["evals"]
            state["evals"] = n + 1
            state["pending"] = float(value)
            if n % every == 0 or (stop_evals is not None and n + 1 >= stop_evals):
                p = pixel_psnr(candidate)
                trace.append(
                    {
                        "evaluations": n + 1,
                        "seconds": w0 - state["t0"] - state["hook_wall"],
                        "cpu_seconds": c0 - state["c0"] - state["hook_cpu"],
                        "psnr": p,
                        "returned_psnr": pixel_psnr(best_candidate[0])
                        if best_candidate[0] is not None
                        else None,
                        "objective": float(value),
                        "lr": optimizer.param_groups[0]["lr"],
                    }
                )
                stop = (stop_evals is not None and n + 1 >= stop_evals) or (
                    stop_psnr is not None and p >= stop_psnr
                )
                state["hook_wall"] += time.perf_counter() - w0
                state["hook_cpu"] += time.process_time() - c0
                if stop:
                    state["stopped_at"] = n + 1
                    raise KeyboardInterrupt  # breaching's loop ends the trial and returns its best candidate
            else:
                state["hook_wall"] += time.perf_counter() - w0
                state["hook_cpu"] += time.process_time() - c0
            return value

        return wrapped

    x0 = prob["x0"].clone()
    with contextlib.redirect_stdout(io.StringIO()):
        # warm-up, untimed: one-iteration dryruns run its TorchScript cosine and autograd paths
        for _ in range(3):
            attacker.reconstruct(server_payload, shared_data, {}, initial_data=x0, dryrun=True)
    attacker._compute_objective = traced
    state["t0"], state["c0"] = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):  # its "Recovery interrupted manually" print
        result, _ = attacker.reconstruct(server_payload, shared_data, {}, initial_data=x0)
    seconds = time.perf_counter() - state["t0"] - state["hook_wall"]
    cpu = time.process_time() - state["c0"] - state["hook_cpu"]
    commit = None
    head = src / ".breaching_commit"
    if head.exists():
        commit = head.read_text().strip()
    out = {
        "import_mode": import_mode,
        "breaching_commit": commit,
        "config": {k: str(v) for k, v in cfg.optim.items()},
        "objective": str(cfg.objective.type),
        "regularizers": [repr(r) for r in attacker.regularizers],
        "evaluations": state["evals"],
        "stopped_at": state.get("stopped_at"),
        "seconds": seconds,
        "cpu_seconds": cpu,
        "final_psnr": pixel_psnr(result["data"]),
        "trace": trace,
    }
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
