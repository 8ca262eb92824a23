"""What `fedbench run` prints and writes after its runs: the board (or trade-off) table, its markdown and
the trade-off plot's data, stored in the run cache by what they are computed from.

Issue 29 asks a warm-cache re-run to do only what changed. Once every run and its derived columns were
read back (`fedbench.execution.derived`), a third of a cached quickstart re-run was this summary: the
results read into pandas, the board built and ranked (its bootstrap and exact intervals, importing
scipy), the markdown rendered and the trade-off points computed, though nothing had changed. So the
summary is stored too (`RunCache.summary`), under a key naming everything it is computed from:

- `results`: a digest of the results file and its sidecar, as `load_results` reads them, without the
  columns that change between invocations and that no summary shows (`VOLATILE`: the wall seconds and
  peak memory of computing or reading a run back, and which of the two it was) and with `created_at`
  cut to its date (a board shows only the date);
- `code`: a digest of every module of the fedbench package, byte for byte (any edit, a docstring's too,
  computes the summary anew: the summary costs little, a stale table would mislead);
- `environment`: the versions of the packages the tables, intervals and rendering call.

The table is printed with the terminal's width each time (rich renders it at print time); the plot is
drawn only when its own digest differs from the previous plot's (`plots.save_tradeoff`).
"""

from __future__ import annotations

import csv
import hashlib
import io
from functools import cache
from pathlib import Path
from typing import Any

#: Results columns that differ between two invocations over the same runs and that no summary reads.
VOLATILE = ("seconds", "peak_rss_mb", "from_cache")
#: Packages whose version can change a summary's numbers or text.
PACKAGES = ("numpy", "scipy", "pandas", "jinja2", "tabulate")
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def summary_key(path: Path) -> str:
    """The cache key of the summary of the results file `path` (see the module docstring)."""
    from fedbench.spec.run import canonical_json

    return canonical_json(
        {"results": results_digest(path), "code": code_digest(), "environment": environment()}
    )


def results_digest(path: Path) -> str:
    """A digest of what `load_results` reads from `path` and its sidecar, less `VOLATILE` columns."""
    h = hashlib.blake2b(digest_size=16)
    rows = csv.reader(io.StringIO(path.read_text(encoding="utf-8"), newline=""))
    header = next(rows, [])
    keep = [i for i, name in enumerate(header) if name not in VOLATILE]
    created = header.index("created_at") if "created_at" in header else -1
    for row in (header, *rows):
        cells = [row[i] if i < len(row) else "" for i in keep]
        if created >= 0 and row is not header and created < len(row):
            cells[keep.index(created)] = row[created][:10]
        h.update(repr(cells).encode())
    side = path.with_suffix(".json")
    h.update(side.read_bytes() if side.is_file() else b"no sidecar")
    return h.hexdigest()


@cache
def code_digest() -> str:
    """sha256 of every .py file of the fedbench package (path and bytes), once per process."""
    h = hashlib.sha256()
    for file in sorted(_PACKAGE_ROOT.rglob("*.py")):
        h.update(str(file.relative_to(_PACKAGE_ROOT)).encode() + b"\0" + file.read_bytes() + b"\0")
    return h.hexdigest()


@cache
def environment() -> dict[str, str | None]:
    from fedbench.execution.derived import package_versions

    return package_versions(PACKAGES)


def compute_summary(path: Path) -> dict[str, Any]:
    """{"table": Pivot, "markdown": str, "plot": {"points", "utility_label", "leakage_label", "title",
    "floor"} or {"error": why it is not drawn}} of the results file `path`: the run's leaderboard, or
    the plain trade-off table when it spans several scenarios or has no `none` baseline."""
    from fedbench.errors import FedbenchError
    from fedbench.reporting import leaderboard as lb
    from fedbench.reporting.tables import load_results, pivot, to_markdown

    rs = load_results([path])
    try:
        board, entries = lb.build(rs)
        table = lb.board_pivot(board, entries, compact=True)
        markdown = lb.render_readme(board, entries)
    except FedbenchError:
        table = pivot(rs)
        markdown = to_markdown(table)
    try:
        from fedbench.reporting.plots import random_floor

        points, ulabel, llabel = lb.tradeoff_points(
            pivot(rs, rows=["defense"]) if len(table.row_keys) == 1 else pivot(rs)
        )
        plot: dict[str, Any] = {
            "points": points,
            "utility_label": ulabel,
            "leakage_label": llabel,
            "title": str(rs.sidecars[-1].get("description", "")),
            # the label starts with the metric's name
            "floor": random_floor(rs.frame, llabel.split(" ", 1)[0]),
        }
    except FedbenchError as exc:
        plot = {"error": str(exc)}
    return {"table": table, "markdown": markdown, "plot": plot}


def run_summary(path: Path, cache: Any = None) -> dict[str, Any]:
    """`compute_summary(path)`, read back from `cache` (a `RunCache`) when it holds the same summary."""
    if cache is None or not getattr(cache, "enabled", False):
        return compute_summary(path)
    return cache.summary(summary_key(path), lambda: compute_summary(path))[0]
