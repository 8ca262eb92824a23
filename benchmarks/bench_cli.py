"""CLI start-up and fully cached re-run time, as ratios to `python -c "import torch"` in the same run.

- `fedbench --help` and `fedbench list`: must not import torch (target: well under 1 s).
- `fedbench run smoke` a second time on a warm cache: every run cached.
- `fedbench run quickstart` a second time on a warm cache (issue 29: <= 1.5 s on a quiet 2-core
  machine): 36 cached runs whose derived columns (epsilon, the reconstructions' scores) and trade-off
  plot are read back, not recomputed. Filling the quickstart's cache trains 18 FL runs (minutes on two
  idle cores): `--quickstart-cache DIR` names a cache that already holds them (filled by `fedbench run
  quickstart --cache-dir DIR`; the benchmark's first run there fills what is missing), and
  `--no-quickstart` leaves the row out.

Each command runs `--repeats` times, alternated with the baseline (ABBA), after one untimed run that
fills the cache and writes a plot. Reported per row: the median and range of wall seconds and of CPU
seconds (the child's user + system time, `os.wait4`), each as a ratio to the baseline's median of the
same kind, the peak memory (the largest process's peak RSS), and the 1-minute load average before and
after. On a busy machine the CPU-time ratio is the comparable figure: wall time there measures the
scheduler. The target is a wall time on a quiet machine; with the load above about 1 it cannot be
measured, and the report says so. The children run with Python's default bytecode cache (a
`PYTHONDONTWRITEBYTECODE` of the calling shell is dropped for them, as on a user's machine, where the
first run writes each module's .pyc): with it set and no .pyc beside a checkout, every command
compiles fedbench's modules from source, a cost no installed copy pays.

    python benchmarks/bench_cli.py --out benchmarks/results/cli.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from _common import check, environment, run_child_usage, write_json

REPEATS = 5
QUIET_LOAD = 1.0  # a 1-minute load average above this on 2 cores is not a quiet machine


def timed(cmd: list[str], baseline: list[str], env: dict[str, str], repeats: int) -> dict:
    """`repeats` runs of `cmd` and of `baseline`, alternated ABBA: medians and ranges of both."""
    runs: dict[str, list] = {"cmd": [], "base": []}
    for i in range(repeats):
        order = (("cmd", cmd), ("base", baseline)) if i % 2 == 0 else (("base", baseline), ("cmd", cmd))
        for name, args in order:
            runs[name].append(run_child_usage(args, env))

    def summary(kind: str) -> dict:
        mine = [getattr(r, kind) for r in runs["cmd"]]
        base = [getattr(r, kind) for r in runs["base"]]
        return {
            "median": statistics.median(mine),
            "min": min(mine),
            "max": max(mine),
            "baseline_median": statistics.median(base),
            "ratio": statistics.median(mine) / statistics.median(base),
        }

    return {
        "wall": summary("wall"),
        "cpu": summary("cpu"),
        "peak_mb": max(r.peak_mb for r in runs["cmd"]),
        "baseline_peak_mb": max(r.peak_mb for r in runs["base"]),
    }


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write JSON results here")
    ap.add_argument("--quick", action="store_true", help="3 timings per command instead of 5")
    ap.add_argument("--repeats", type=int, default=0, help="timings per command (default 5, --quick 3)")
    ap.add_argument("--quickstart-cache", default=None, help="a cache holding the quickstart's runs")
    ap.add_argument("--no-quickstart", action="store_true", help="leave out the quickstart row")
    args = ap.parse_args()
    reps = args.repeats or (3 if args.quick else REPEATS)
    py = sys.executable
    baseline = [py, "-c", "import torch"]
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["FEDBENCH_CACHE_DIR"] = os.path.join(tmp, "cache")
        fb = [py, "-m", "fedbench"]

        def row(name: str, cmd: list[str], fill: bool = False) -> dict:
            if fill:
                run_child_usage(cmd, env)  # fill the cache, write the plot once
            r = {"what": name, **timed(cmd, baseline, env, reps)}
            rows.append(r)
            return r

        row("fedbench --help", fb + ["--help"])
        listing = row("fedbench list", fb + ["list"])
        row("fedbench run smoke (all cached)", fb + ["run", "smoke", "-o", os.path.join(tmp, "out")], True)
        quick = None
        if not args.no_quickstart:
            cache = args.quickstart_cache or os.path.join(tmp, "cache")
            cmd = fb + ["run", "quickstart", "--cache-dir", cache, "-o", os.path.join(tmp, "qs")]
            quick = row("fedbench run quickstart (all cached)", cmd, True)
    load_after = os.getloadavg()
    quiet = max(load_before[0], load_after[0]) <= QUIET_LOAD
    lines = [
        "| what | wall s (median, range) | x import torch (wall) | CPU s (median, range) "
        "| x import torch (CPU) | peak MB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        w, c = r["wall"], r["cpu"]
        lines.append(
            f"| {r['what']} | {w['median']:.2f} ({w['min']:.2f}-{w['max']:.2f}) | {w['ratio']:.2f} "
            f"| {c['median']:.2f} ({c['min']:.2f}-{c['max']:.2f}) | {c['ratio']:.2f} | {r['peak_mb']:.0f} |"
        )
    base = rows[0]
    wall, cpu = base["wall"]["baseline_median"], base["cpu"]["baseline_median"]
    lines.append(
        f"\nbaseline `python -c 'import torch'` (alternated with each row): wall {wall:.2f} s, "
        f"CPU {cpu:.2f} s, {base['baseline_peak_mb']:.0f} MB; {reps} runs each; "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after, on {os.cpu_count()} cores"
        + ("" if quiet else " (not a quiet machine: the wall-time target cannot be measured here)")
    )
    results = {
        "rows": rows,
        "repeats": reps,
        "load_before": list(load_before),
        "load_after": list(load_after),
        "quiet": quiet,
        "markdown": "\n".join(lines),
    }
    checks = [check("fedbench list (s)", listing["wall"]["median"], "< 1 s", listing["wall"]["median"] < 1)]
    if quick is not None:
        seconds = quick["wall"]["median"]
        target = "<= 1.5 s on a quiet machine" + ("" if quiet else " (not quiet: not measurable)")
        checks.append(
            check("fedbench run quickstart, warm cache (wall s)", seconds, target, quiet and seconds <= 1.5)
        )
    results["checks"] = checks
    results["env"] = environment("cpu", args.quick)
    print(results["markdown"])
    write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
