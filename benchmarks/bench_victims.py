"""Victim batches (issues 27, 29): one attack run over V victims vs V single-victim runs.

On the FedSGD board's scenario (`registry/presets/board-fedsgd.toml`: mnist5k, MLP 256, 10 clients,
B = 1, round-0 gradient) with `none`, for dlg, idlg, inverting-gradients and cpl at the board's budgets
(`--quick`: smaller ones), it times the attack computation of a run (`runner.compute_attack`: the
simulation up to the observation, the attack, the truth; no cache) for one run over victims 0..V-1
(`[scenario] victims = V`) and for the V runs of one victim each, in one process at `--threads`
threads, alternating the two, and reports the medians of `--repeats` of CPU time (process time: the
other jobs of a shared machine do not count) and their ratio (> 1: the batch is cheaper). Beside them:
how far the batch's reconstructions are from the single runs' (per-victim PSNR against the true image;
L-BFGS amplifies the rounding difference of a vmap batch in float32, signed Adam does not).

    python benchmarks/bench_victims.py --threads 1 --out benchmarks/results/victims.json
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import check, environment, markdown_table, write_json

#: attack -> its pattern at the board's budgets, and at --quick's
ATTACKS = {
    "dlg": ("dlg[iterations=50]", "dlg[iterations=10]"),
    "idlg": ("idlg[iterations=20,restarts=4]", "idlg[iterations=5,restarts=4]"),
    "inverting-gradients": ("inverting-gradients[iterations=200]", "inverting-gradients[iterations=50]"),
    "cpl": ("cpl[iterations=100]", "cpl[iterations=30]"),
}


def cpu_seconds(fn) -> tuple[float, object]:
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def psnr_per_victim(result: dict) -> list[float]:
    """Each victim's PSNR: its reconstruction (batch of one) against its true image."""
    from fedbench.metrics.reconstruction import psnr

    parts = result.get("victims") or [result]
    return [float(psnr(p["truth"]["images"], p["output"]["images"])[0]) for p in parts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller attack budgets (smoke run)")
    ap.add_argument("--victims", type=int, default=10, help="V: victims 0..V-1 (the board has 10 clients)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats of each (medians)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=list(ATTACKS))
    ap.add_argument("--out", default=None, help="write JSON results here")
    args = ap.parse_args()
    import torch

    from fedbench.execution.runner import Job, RunContext, compute_attack
    from fedbench.spec.grid import Overrides, build_grid

    torch.set_num_threads(args.threads)
    ctx = RunContext(threads=args.threads)
    pick = 1 if args.quick else 0
    rows = []
    for name in args.attacks:
        pattern = ATTACKS[name][pick]
        overrides = Overrides(defenses=("none",), attacks=(pattern,), seeds=1, sets=("scenario.victim=0",))
        (spec,) = build_grid("board-fedsgd", overrides).specs
        batch = spec.with_victims(range(args.victims))
        singles = [spec.with_victims([v]) for v in range(args.victims)]

        def run_batch(batch=batch) -> dict:
            return compute_attack(Job(batch, ctx))

        def run_singles(singles=singles) -> list[dict]:
            return [compute_attack(Job(s, ctx)) for s in singles]

        compute_attack(Job(singles[0], ctx))  # warm-up: imports, the dataset, first-call overheads
        batch_s, single_s = [], []
        for r in range(args.repeats):  # alternate, starting with each in turn
            order = (("batch", run_batch), ("singles", run_singles))
            for label, fn in order if r % 2 == 0 else order[::-1]:
                seconds, out = cpu_seconds(fn)
                (batch_s if label == "batch" else single_s).append(seconds)
                if label == "batch":
                    batch_result = out
                else:
                    single_results = out
        together = psnr_per_victim(batch_result)
        alone = [p for res in single_results for p in psnr_per_victim(res)]
        gaps = [abs(a - b) for a, b in zip(together, alone, strict=True)]
        how = sorted({p["output"]["extra"].get("victim_batch", "") for p in batch_result["victims"]})
        rows.append(
            {
                "attack": pattern,
                "victims": args.victims,
                "batch_cpu_s": statistics.median(batch_s),
                "singles_cpu_s": statistics.median(single_s),
                "speedup": statistics.median(single_s) / statistics.median(batch_s),
                "batch_cpu_s_all": batch_s,
                "singles_cpu_s_all": single_s,
                "psnr_batch_mean": statistics.fmean(together),
                "psnr_singles_mean": statistics.fmean(alone),
                "psnr_abs_gap_mean": statistics.fmean(gaps),
                "psnr_abs_gap_max": max(gaps),
                "how": ", ".join(how),
            }
        )
    print(
        f"CPU time (process time, median of {args.repeats}, --threads {args.threads}) of the attack "
        f"computation of one run over {args.victims} victims vs {args.victims} single-victim runs, "
        "FedSGD board scenario (mnist5k, MLP 256, B = 1), `none`:\n"
    )
    table = [
        [
            r["attack"],
            r["singles_cpu_s"],
            r["batch_cpu_s"],
            f"{r['speedup']:.2f}x",
            f"{r['psnr_singles_mean']:.2f} / {r['psnr_batch_mean']:.2f}",
            f"{r['psnr_abs_gap_mean']:.2f} / {r['psnr_abs_gap_max']:.2f}",
            r["how"],
        ]
        for r in rows
    ]
    header = [
        "attack",
        f"{args.victims} single runs, CPU s",
        "one batch run, CPU s",
        "speed-up",
        "mean PSNR single / batch",
        "|PSNR gap| mean / max",
        "batch computed",
    ]
    print(markdown_table(header, table))
    checks = [
        check(
            f"{r['attack']}: {r['victims']} victims in one run vs one run each",
            r["speedup"],
            ">= 2x",
            r["speedup"] >= 2,
        )
        for r in rows
    ]
    write_json(
        args.out, {"rows": rows, "checks": checks, "env": environment("cpu", args.quick, args.threads)}
    )


if __name__ == "__main__":
    main()
