"""What the index of the boards (leaderboards/README.md and the site's index page) says about a board
in one short row: its attack suite by plugin name, how far the suite's no-defense worst case sits from
the board's baseline, and its rank-1 configuration.

The index is read at a glance, so a row stays short (`MAX_ROW` characters in the markdown): the
attacks' parameters, the observation points and the full statistics are on the board's own page.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from fedbench.metrics.catalogue import metric
from fedbench.reporting.board_build import plugin_name
from fedbench.reporting.board_schema import Board

#: characters in a row of leaderboards/README.md's table (a v2 suite names six attacks; the build cell with
#: its slice's time)
MAX_ROW = 200
ADAPTIVE = "adaptive"


def adaptive_attacks() -> frozenset[str]:
    """The attacks that adapt to a defense, by canonical name: those a defense declares as the one that
    breaks it (`Defense.adaptive_attack`: LODA's loda-adaptive, MixUp's mixup-decode) and those that
    declare the defenses they adapt to (`adapts_to`: soteria-adaptive, noise-aware, ...)."""
    from fedbench.registry import attacks
    from fedbench.spec.applicability import adapts_to

    return frozenset(cls.name for cls in attacks.list() if adapts_to(cls.name))


def attack_names(suite: Sequence[str], adaptive: Collection[str] = ()) -> str:
    """A suite by plugin name only, in suite order: 'dlg, idlg, inverting-gradients, cpl + adaptive'.

    A plugin run at several settings is named once with their count ('sdan-poisoning ×2'); the attacks
    in `adaptive` (each a defense's own adaptive attack) are summed up as '+ adaptive' after the others;
    observation points (labels 'cpl[...] @update') follow once ('@ example/update/server')."""
    if not suite:
        return "—"
    settings: dict[str, set[str]] = {}
    points: list[str] = []
    for label in suite:
        base, _, point = label.partition(" @")
        settings.setdefault(plugin_name(base), set()).add(base)
        if point and point not in points:
            points.append(point)

    def named(names: list[str]) -> str:
        return ", ".join(n + (f" ×{len(settings[n])}" if len(settings[n]) > 1 else "") for n in names)

    plain = [n for n in settings if n not in adaptive]
    text = f"{named(plain)} + {ADAPTIVE}" if plain and len(plain) < len(settings) else named(list(settings))
    return text + (f" @ {'/'.join(points)}" if points else "")


def baseline_gap(board: Board) -> str:
    """How far the suite's worst case without a defense sits above the board's baseline (random-image
    floor, chance, majority class), with its 95 % interval over seeds: 'psnr +87.95 [56.80, 119.11]';
    '—' for a board without a baseline. Which baseline it is, and its value, are on the board's page."""
    base = board.baseline
    if base is None or base.gap is None:
        return "—"
    m = metric(base.metric)
    gap = base.gap
    sign = "+" if gap.mean >= 0 else ""
    interval = (
        f" [{m.fmt(gap.low)}, {m.fmt(gap.high)}]" if gap.low is not None and gap.high is not None else ""
    )
    return f"{m.name} {sign}{m.fmt(gap.mean)}{interval}"


def build_cell(board: Board, slice_board: Board | None = None) -> str:
    """The index's build cell of a board (`build_wall.index_cell`): its wall time from an empty cache,
    else the CPU time of its runs; then its committed slice's ('47 min; slice 9 min')."""
    from fedbench.reporting.build_wall import index_cell

    def cell(b: Board) -> str:
        return index_cell(b.build_wall.model_dump() if b.build_wall else None, b.build_seconds)

    return cell(board) + (f"; slice {cell(slice_board)}" if slice_board is not None else "")


def index_boards(
    loaded: Sequence[tuple[Board, list[dict[str, Any]]]],
) -> list[tuple[Board, list[dict[str, Any]], Board | None]]:
    """The boards an index lists, each with its committed slice (`board_slice`): a slice is no row of
    its own, its build time sits in its full board's build cell."""
    slices = {board.slice_of: board for board, _ in loaded if board.slice_of}
    return [(board, entries, slices.get(board.name)) for board, entries in loaded if not board.slice_of]


def v2_summary(board: Board, entries: list[dict[str, Any]]) -> tuple[str, str]:
    """A v2 board's (headline, rank 1) cells: `none`'s primary rate beside the floor ('reid: none
    98.4%, floor 1.6%'; 'n/a' with a reason's first words), and the top ranked configuration, or what
    keeps every row from being ranked, or that no row beats `none` (a rank-1 cell naming one of the
    rows tied with `none` would read as a winner)."""
    from fedbench.reporting.board_rank import rank_board
    from fedbench.reporting.board_table import FLOOR_OF

    ranking = rank_board(entries, board.primary, board.utility_budget, FLOOR_OF.get(board.primary, ""))
    m = metric(board.primary)
    none = next((r for r in ranking.rows if r.defense == "none"), None)
    if ranking.unresolved:
        head = f"{m.name}: n/a"
    else:
        rate = (
            "—"
            if none is None or none.rate is None
            else f"{m.fmt(none.rate)}{'%' if m.unit == 'pct' else ''}"
        )
        floor = (
            "" if ranking.floor is None else f", floor {m.fmt(ranking.floor)}{'%' if m.unit == 'pct' else ''}"
        )
        head = f"{m.name}: none {rate}{floor}"
    ranked = [r for r in ranking.ranked if r.defense != "none"]
    if ranking.unresolved:
        top = "— (primary n/a)"
    elif not ranked:
        top = "— (only none in budget)"
    elif none is not None and none.rank is not None and ranked[0].rank >= none.rank:
        tied = sum(r.rank == none.rank for r in ranked)
        top = f"— ({tied} tie with none)" if tied else "— (none ranks first)"
    else:
        top = ranked[0].defense
    return head, top
