"""Run every benchmark in this folder and collect a JSON file each plus one markdown summary.

    python benchmarks/run_all.py --out benchmarks/results [--quick]

Each benchmark reports ratios against a baseline measured in the same run, so the figures hold on
a noisy machine. Benchmarks are not tests: they are run on demand (`make bench`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "results"), help="folder for the JSON and summary.md")
    ap.add_argument("--quick", action="store_true", help="pass --quick to benchmarks that support it")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary, failed = [], []
    for script in sorted(HERE.glob("bench_*.py")):
        name = script.stem.removeprefix("bench_")
        cmd = [sys.executable, str(script), "--out", str(out / f"{name}.json")]
        if args.quick and "--quick" in script.read_text():
            cmd.append("--quick")
        print(f"== {name}", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        print(proc.stdout, end="")
        if proc.returncode:
            failed.append(name)
            print(proc.stderr, file=sys.stderr)
        summary.append(f"## {name}\n\n{proc.stdout.strip()}\n")
    (out / "summary.md").write_text("\n".join(summary))
    print(f"wrote {out / 'summary.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
