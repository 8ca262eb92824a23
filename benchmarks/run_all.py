"""Run every benchmark in this folder and collect a JSON file each plus one markdown summary.

    python benchmarks/run_all.py --out benchmarks/results [--quick]

Each benchmark reports ratios against a baseline measured in the same run, so the figures hold on
a noisy machine, with peak memory. Benchmarks are not tests: they are run on demand (`make bench`).
summary.md opens with the targets ("checks") every benchmark's JSON declares, then each table.
On a machine with a GPU the benchmarks that run tensors (inversion, per_example, fl) report GPU
figures.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "results"), help="folder for the JSON and summary.md")
    ap.add_argument("--quick", action="store_true", help="pass --quick to benchmarks that support it")
    ap.add_argument("--only", nargs="*", default=None, help="run only these benchmarks (e.g. grid cli)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary, failed, checks = [], [], []
    for script in sorted(HERE.glob("bench_*.py")):
        name = script.stem.removeprefix("bench_")
        if args.only is not None and name not in args.only:
            continue
        cmd = [sys.executable, str(script), "--out", str(out / f"{name}.json")]
        if args.quick and "--quick" in script.read_text():
            cmd.append("--quick")
        print(f"== {name}", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        print(proc.stdout, end="")
        if proc.returncode:
            failed.append(name)
            print(proc.stderr, file=sys.stderr)
        if not proc.returncode:
            (out / f"{name}.md").write_text(proc.stdout)
    # the summary covers every benchmark with results in `out`, so `--only` refreshes some of them
    # without dropping the others (each section says when its run was written)
    for script in sorted(HERE.glob("bench_*.py")):
        name = script.stem.removeprefix("bench_")
        table, result = out / f"{name}.md", out / f"{name}.json"
        if not (table.exists() and result.exists()) or name in failed:
            continue
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(result.stat().st_mtime))
        summary.append(f"## {name} ({when})\n\n{table.read_text().strip()}\n")
        for c in json.loads(result.read_text()).get("checks", []):
            checks.append({"benchmark": name, **c})
    head = [
        f"# fedbench benchmarks{' (--quick: short runs, noisy figures)' if args.quick else ''}",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M')}, {platform.processor() or platform.machine()}, "
        f"python {platform.python_version()}; command: `python benchmarks/run_all.py"
        f"{' --quick' if args.quick else ''}`",
        "",
        "| benchmark | target | measured | ok |",
        "|---|---|---|---|",
    ]
    head += [
        f"| {c['benchmark']}: {c['what']} | {c['target']} | {c['value']:.3g} | {'yes' if c['ok'] else 'NO'} |"
        for c in checks
    ]
    (out / "summary.md").write_text("\n".join(head) + "\n\n" + "\n".join(summary))
    print(f"wrote {out / 'summary.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
