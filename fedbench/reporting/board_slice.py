"""A board's slice: every row and the whole attack suite on fewer seeds and inputs (issue 30).

A full board takes hours on a 2-core CPU; a maintainer, a reviewer or CI needs a version that builds in
a sitting of 30 minutes and still says the same thing. A preset declares its slice in
`[grid.board.slice]` (fewer `seeds`, fewer `victims` per run: the inputs); `fedbench leaderboard build
NAME --slice` builds it as a board of its own, `<name>-slice`, whose board.json names the full board
(`slice_of`). Nothing else differs: the same scenario, rows, suite and ranking method.

A slice is only worth its time if its ranks agree with the full board's. `slice_disagreements` says
where they do not, and `fedbench leaderboard check` runs it on every slice beside its full board: a
row must be on the same side of the utility budget (unless either is borderline), and a ranked row's
ranks (its tie band joined with the bootstrap's 95 % range of its drawn rank, `_ranks`) and its primary
metric's interval must overlap the full board's (for a rate, the table's interval contains the exact
interval of its count, so 0 of 20 on a slice, [0, 16.8 %], overlaps 5 of 100:
`board_rank.rate_interval`).
A slice has wider intervals, so agreement within them is the claim it can make.
"""

from __future__ import annotations

from typing import Any

from fedbench.reporting.board_rank import Row, rank_board

SUFFIX = "-slice"


def slice_name(board: str) -> str:
    return f"{board}{SUFFIX}"


def slice_overrides(spec: dict[str, Any]) -> tuple[str, ...]:
    """The `--set` overrides of a `[grid.board.slice]` table: its seeds and victims."""
    sets = [f"grid.seeds={int(spec['seeds'])}"] if spec.get("seeds") else []
    if spec.get("victims"):
        sets.append(f"scenario.victims={int(spec['victims'])}")
    return tuple(sets)


def _overlap(a: tuple[float | None, float | None], b: tuple[float | None, float | None]) -> bool:
    if None in a or None in b:
        return True  # nothing to compare: no disagreement shown
    return a[0] <= b[1] and b[0] <= a[1]  # type: ignore[operator]


def _rows(board: Any, entries: list[dict[str, Any]]) -> dict[str, Row]:
    ranking = rank_board(entries, board.primary, board.utility_budget)
    return {r.defense: r for r in ranking.rows}


def slice_disagreements(full: tuple[Any, list], part: tuple[Any, list]) -> list[str]:
    """Where the slice `part` (board, entries) says something else than its `full` board, one line per
    row (empty: they agree within their intervals). Rows of only one of them are named too."""
    board, entries = full
    sboard, sentries = part
    return compare_rows(_rows(board, entries), _rows(sboard, sentries), board.primary)


def compare_rows(rows: dict[str, Row], srows: dict[str, Row], primary: str) -> list[str]:
    """`slice_disagreements` on ranked rows by defense: the full board's `rows`, the slice's `srows`."""
    out = [f"{d}: on the full board, not on the slice" for d in sorted(set(rows) - set(srows))]
    out += [f"{d}: on the slice, not on the full board" for d in sorted(set(srows) - set(rows))]
    for name in sorted(set(rows) & set(srows)):
        r, s = rows[name], srows[name]
        if r.admissible != s.admissible and not (r.borderline or s.borderline):
            side = "within" if r.admissible else "outside"
            out.append(f"{name}: {side} the utility budget on the full board, not on the slice")
            continue
        full_interval, slice_interval = (r.low, r.high), (s.low, s.high)
        if not _overlap(full_interval, slice_interval):
            out.append(
                f"{name}: {primary} [{_pct(full_interval[0])}, {_pct(full_interval[1])}] on the full "
                f"board, [{_pct(slice_interval[0])}, {_pct(slice_interval[1])}] on the slice"
            )
        if r.rank is not None and s.rank is not None and not _overlap(_ranks(r), _ranks(s)):
            (a, b), (c, d) = _ranks(r), _ranks(s)
            out.append(f"{name}: rank {a}-{b} on the full board, {c}-{d} on the slice")
    return out


def _ranks(row: Row) -> tuple[int, int]:
    """The ranks a ranked row may hold: its published tie band (rank .. rank + tied - 1, the rows no
    paired test separates from it) joined with the bootstrap's 95 % interval of its drawn rank. The
    drawn rank (1 + the rows with a lower drawn rate) orders rows the tests call tied by noise: on the
    attribute board, two rows at rank 2 drew ranks 3-6 on 3 seeds and 1-2 on the 1-seed slice, where
    their rates agree within their intervals."""
    low, high = row.rank, row.rank + row.tied - 1
    if row.rank_low is not None and row.rank_high is not None:
        low, high = min(low, row.rank_low), max(high, row.rank_high)
    return low, high


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}"


def check_slices(root: Any, names: list[str] | None = None) -> list[str]:
    """`slice_disagreements` of every slice under `root` (or of `names`, slices or their full boards)
    whose full board is there too, each line prefixed with the slice's name."""
    from pathlib import Path

    from fedbench.reporting.leaderboard import board_names, load_board, raw_board_field

    root = Path(root)
    known = board_names(root)
    out = []
    for name in known:
        full_name = str(raw_board_field(root / name, "slice_of") or "")
        if not full_name or full_name not in known:
            continue
        if names and name not in names and full_name not in names:
            continue
        full, part = load_board(root / full_name), load_board(root / name)
        out += [f"{name}: {line}" for line in slice_disagreements(full, part)]
    return out
