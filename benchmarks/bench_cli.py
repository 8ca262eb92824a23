"""CLI start-up and fully cached re-run time, as ratios to `python -c "import torch"` in the same run.

- `fedbench --help` and `fedbench list`: must not import torch (target: well under 1 s).
- `fedbench run smoke` a second time on a warm cache: every run cached (target: under 5 s).

    python benchmarks/bench_cli.py --out benchmarks/results/cli.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def wall(args: list[str], env: dict[str, str], repeats: int = 3) -> float:
    """Best wall time of `repeats` runs of a command (seconds)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(args, env=env, check=True, capture_output=True)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write JSON results here")
    args = ap.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "FEDBENCH_CACHE_DIR": os.path.join(tmp, "cache")}
        baseline = wall([py, "-c", "import torch"], env)
        fb = [py, "-m", "fedbench"]
        results = {"baseline_import_torch_s": baseline, "rows": []}
        for name, cmd, reps in [
            ("fedbench --help", fb + ["--help"], 3),
            ("fedbench list", fb + ["list"], 3),
        ]:
            t = wall(cmd, env, reps)
            results["rows"].append({"what": name, "seconds": t, "ratio_to_import_torch": t / baseline})
        smoke = fb + ["run", "smoke", "-o", os.path.join(tmp, "out")]
        subprocess.run(smoke, env=env, check=True, capture_output=True)  # fill the cache
        t = wall(smoke, env, 3)
        results["rows"].append(
            {"what": "fedbench run smoke (all cached)", "seconds": t, "ratio_to_import_torch": t / baseline}
        )
    lines = ["| what | seconds | ratio to `import torch` |", "|---|---:|---:|"]
    lines += [
        f"| {r['what']} | {r['seconds']:.2f} | {r['ratio_to_import_torch']:.2f} |" for r in results["rows"]
    ]
    lines.append(f"\nbaseline `python -c 'import torch'`: {baseline:.2f} s")
    results["markdown"] = "\n".join(lines)
    print(results["markdown"])
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    return results


if __name__ == "__main__":
    main()
