"""CLI start-up and fully cached re-run time, as ratios to `python -c "import torch"` in the same run.

- `fedbench --help` and `fedbench list`: must not import torch (target: well under 1 s).
- `fedbench run smoke` a second time on a warm cache: every run cached (target: under 5 s).

Each row also gives the command's peak memory (its process's peak RSS, from `os.wait4`).

    python benchmarks/bench_cli.py --out benchmarks/results/cli.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from _common import check, environment, run_child, write_json

REPEATS = 3


def wall(args: list[str], env: dict[str, str], repeats: int = REPEATS) -> tuple[float, float]:
    """(best wall time, peak RSS in MB) of `repeats` runs of a command."""
    runs = [run_child(args, env)[:2] for _ in range(repeats)]
    return min(r[0] for r in runs), max(r[1] for r in runs)


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write JSON results here")
    ap.add_argument("--quick", action="store_true", help="one timing per command instead of best of 3")
    args = ap.parse_args()
    reps = 1 if args.quick else REPEATS
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "FEDBENCH_CACHE_DIR": os.path.join(tmp, "cache")}
        baseline, baseline_mb = wall([py, "-c", "import torch"], env, reps)
        fb = [py, "-m", "fedbench"]
        results = {"baseline_import_torch_s": baseline, "baseline_import_torch_mb": baseline_mb, "rows": []}

        def row(name: str, cmd: list[str]) -> dict:
            t, mb = wall(cmd, env, reps)
            r = {"what": name, "seconds": t, "ratio_to_import_torch": t / baseline, "peak_mb": mb}
            results["rows"].append(r)
            return r

        row("fedbench --help", fb + ["--help"])
        listing = row("fedbench list", fb + ["list"])
        smoke = fb + ["run", "smoke", "-o", os.path.join(tmp, "out")]
        run_child(smoke, env)  # fill the cache
        row("fedbench run smoke (all cached)", smoke)
    lines = ["| what | seconds | ratio to `import torch` | peak MB |", "|---|---:|---:|---:|"]
    lines += [
        f"| {r['what']} | {r['seconds']:.2f} | {r['ratio_to_import_torch']:.2f} | {r['peak_mb']:.0f} |"
        for r in results["rows"]
    ]
    lines.append(f"\nbaseline `python -c 'import torch'`: {baseline:.2f} s, {baseline_mb:.0f} MB")
    results["markdown"] = "\n".join(lines)
    results["checks"] = [check("fedbench list (s)", listing["seconds"], "< 1 s", listing["seconds"] < 1)]
    results["env"] = environment("cpu", args.quick)
    print(results["markdown"])
    write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
