"""The leaderboards as a static website: `fedbench leaderboard site -o DIR`.

One index page (a row per board) and per board a page with the sortable leaderboard, its scenario and
threat model, the command that rebuilds it, the trade-off plot, the reconstruction thumbnails the board
commits (`fedbench leaderboard thumbnails`) and the papers' reported numbers; for a v2 board also what
its README says beyond the table: the tuning rule, the realistic protocol's rates ("works in realistic
FL?"), the attack-budget check, the verification stamp and the rows taken off it. Plain
HTML/CSS and a few lines of hand-written JS (`static/`), copied into the site: a page loads nothing
from the network, so the folder can be opened from disk or served by any static host.

Everything comes from the committed JSON entries through the leaderboard modules (`load_board`,
`ranked`, `board_pivot`, `format_cell`, `tradeoff_points`): the site shows the numbers the README
shows, in the same order. What needs cached runs is never drawn here: a board's reconstructions.png is
copied as committed, or the page names the command that draws it.

The site is written into a temporary folder beside DIR and moved into place at the end, so a failure
leaves DIR as it was; DIR is replaced only when it is empty or a site written before (its marker file).
"""

from __future__ import annotations

import functools
import re
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import markupsafe

from fedbench.errors import FedbenchError
from fedbench.metrics.catalogue import metric
from fedbench.reporting import board_index, board_notes, ranking
from fedbench.reporting import leaderboard as lb
from fedbench.reporting.board_schema import Board
from fedbench.reporting.board_table import build_table
from fedbench.reporting.tables import Pivot, format_cell
from fedbench.reporting.thumbnails import THUMBNAIL_FILE

MARKER = ".fedbench-site"  # marks a folder this module wrote, so a rebuild may replace it
STATIC_FILES = ("site.css", "site.js")
PAGE = "index.html"
PLOT = "tradeoff.png"
OBSERVATION = ("sc_observe", "sc_observe_round", "sc_victim")  # the attacker's vantage point


@functools.cache
def _templates() -> jinja2.Environment:
    """The site templates (templates/site_*.html.j2): HTML, so every value is escaped; an undefined
    name is an error rather than an empty string."""
    env = lb.jinja_environment(True)
    env.globals.update(entries_dir=lb.ENTRIES_DIR, csv_file=lb.CSV_FILE)
    env.filters["code"] = _code
    return env


_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_EMPHASIS = re.compile(r"(?<![\w*])\*([^*]+)\*(?![\w*])")


def _code(text: str) -> markupsafe.Markup:
    """The inline markdown of the leaderboard module's notes as HTML, the rest escaped: `code` spans as
    <code>, *emphasis* as <em>, and a link [text](path) as the text with its repository path (a page of
    the site cannot follow a README's relative link: the site is served on its own)."""
    escaped = _LINK.sub(lambda m: f"{m[1]} (`{m[2].lstrip('./')}`)", str(markupsafe.escape(text)))
    parts = escaped.split("`")
    html = "".join(
        f"<code>{x}</code>" if i % 2 else _EMPHASIS.sub(r"<em>\1</em>", x) for i, x in enumerate(parts)
    )
    return markupsafe.Markup(html)


# ---------------------------------------------------------------------------------------- tables


def _sort_value(text: str) -> str:
    """What a column sorts by when its cells are text ('3', '73% [1–3]', '—'): the leading number,
    or the text itself; '' (missing) sorts last."""
    if text in ("", "—"):
        return ""
    found = re.match(r"[<>]?\s*(-?\d+(?:\.\d+)?)", text)
    return found.group(1) if found else text


def table(p: Pivot) -> dict[str, Any]:
    """A pivot as header and row dicts for the template: each cell's text (`format_cell`: 'mean ±
    spread') and the raw value it sorts by, each header's type (number or text)."""
    headers = [{"label": e, "type": "number"} for e in p.extra]
    headers += [{"label": k, "type": "text"} for k in p.row_keys]
    headers += [{"label": c.header, "type": "number"} for c in p.columns]
    rows = []
    for i, (key, _cells) in enumerate(p.rows):
        cells = [{"text": p.extra[e][i], "sort": _sort_value(p.extra[e][i])} for e in p.extra]
        cells += [{"text": k, "sort": k} for k in key]
        for c in p.columns:
            cell = p.cell(i, c.key)
            value = "" if cell.value is None else repr(float(cell.value)).replace("inf", "Infinity")
            cells.append({"text": format_cell(cell, c.metric), "sort": value})
        rows.append(cells)
    return {"caption": p.title, "headers": headers, "rows": rows}


TEXT_COLUMNS = ("defense", "verdict", "worst attack")


def v2_table(board: Board, t: Any) -> dict[str, Any]:
    """A v2 board's table (`board_table`) for the template: rank, defense and the primary metric first;
    the rows within the utility budget ranked, the others after them with rank '—'."""
    headers = [{"label": h, "type": "text" if h in TEXT_COLUMNS else "number"} for h in t.headers]
    rows = [
        [{"text": text.strip("`"), "sort": _sort_value(text.strip("`"))} for text in row]
        for row in (*t.ranked, *t.outside)
    ]
    caption = (
        f"Ranked by {board.primary} within a utility budget of {board.utility_budget:g} points; rows "
        "outside it (rank —) are listed after the ranked ones"
    )
    return {"caption": caption, "headers": headers, "rows": rows}


def realistic_section(board: Board) -> dict[str, Any] | None:
    """The realistic protocol beside the board's textbook rates (`board_realistic.realistic_table`), as
    the README's section shows it; None when the board has not run one."""
    from fedbench.reporting.board_realistic import realistic_table

    if not board.realistic:
        return None
    intro, headers, rows = realistic_table(board.realistic)
    return {"intro": intro, "headers": headers, "rows": rows}


def scenario_rows(board: Board, entries: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(what, value) of the board's scenario, as its README's scenario table lists it."""
    sc = board.scenario
    training = ", ".join(
        f"{k[3:]}={lb.scenario_value(v)}"
        for k, v in sc.items()
        if k.startswith("sc_") and k not in OBSERVATION
    )
    rows = [
        ("dataset", str(sc.get("dataset", ""))),
        ("model", str(sc.get("model", ""))),
        ("FL scenario", training),
        *lb.entries_provenance(entries).items(),
    ]
    return rows + ([("substitution", board.substitution)] if board.substitution else [])


def threat_model(board: Board, entries: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(what, value) of the attacker: the board's threat model, the suite, where it looks, and how the
    leakage is scored."""
    stated = [("attacker", board.threat_model)] if board.threat_model else []
    if not board.attack_suite:
        return [*stated, ("attack suite", "— (utility only: no attack is run on this board)")]
    head = metric(board.headline)
    observe = ", ".join(
        f"{k[3:]}={lb.scenario_value(board.scenario[k])}" for k in OBSERVATION if k in board.scenario
    )
    return [
        *stated,
        ("attack suite", ", ".join(board.attack_suite)),
        ("attacker observes", observe or "the defaults of the scenario"),
        ("headline leakage", f"{head.name} {head.arrow} ({head.direction})"),
        ("worst case", board_notes.worst_rule(entries, board.headline)),
    ]


def reported_rows(
    board: Board, entries: list[dict[str, Any]], preset_dirs: tuple[Path, ...] = ()
) -> dict[str, Any] | None:
    """The papers' own numbers for the board (`leaderboard.board_reported`: those board.json keeps, or
    the matching `[[reported]]` rows of the preset that built it) as the README's table; None when
    there are none."""
    return board_notes.reported_table(board_notes.board_reported(board, entries, preset_dirs))


# ---------------------------------------------------------------------------------------- pages


@dataclass(frozen=True)
class BoardSite:
    """What the index says about a board (`board_index`: the suite by plugin name, the no-defense gap
    to the baseline) and where its page is."""

    name: str
    title: str
    attack_suite: str
    baseline_gap: str
    entries: int
    rank1: str
    build: str

    @property
    def href(self) -> str:
        return f"{self.name}/{PAGE}"


def _plot(board: Board, entries: list[dict[str, Any]], path: Path) -> str:
    """Draw the trade-off plot from the entries; returns why not ('' when drawn)."""
    from fedbench.reporting.plots import save_tradeoff

    family = {e["defense"]: e["defense_name"] for e in entries}
    try:
        points, ulabel, llabel = lb.tradeoff_points(lb.board_pivot(board, entries), board.headline, family)
    except FedbenchError:
        return "no trade-off plot: the board has no leakage column (no attack suite)."
    save_tradeoff(points, path, ulabel, llabel, title=board.title)
    return ""


def board_page(
    board: Board,
    entries: list[dict[str, Any]],
    folder: Path,
    preset_dirs: tuple[Path, ...] = (),
    thumbnails: Path | None = None,
) -> None:
    """Write a board's page, its trade-off plot and its leaderboard.csv into `folder`, and a copy of its
    committed reconstruction thumbnails (`thumbnails`: the board's reconstructions.png) when it has them."""
    from fedbench.reporting.board_remove import removed_note

    folder.mkdir(parents=True)
    no_plot = _plot(board, entries, folder / PLOT)
    if thumbnails is not None:
        shutil.copyfile(thumbnails, folder / THUMBNAIL_FILE)
    (folder / lb.CSV_FILE).write_text(lb.render_csv(board, entries), encoding="utf-8")
    v2 = build_table(board, entries) if board.board_version >= 2 else None  # one bootstrap per page
    html = (
        _templates()
        .get_template("site_board.html.j2")
        .render(
            board=board,
            table=v2_table(board, v2) if v2 is not None else table(lb.board_pivot(board, entries)),
            scenario=scenario_rows(board, entries),
            threat=threat_model(board, entries),
            stability=ranking.stability_note(board, entries),
            views=lb.board_views(board, entries),
            plot="" if no_plot else PLOT,
            no_plot=no_plot,
            reported=reported_rows(board, entries, preset_dirs),
            realistic=realistic_section(board),
            budget_check=lb.budget_note(board.budget_check),
            verified=lb.verified_note(board),
            notes=[
                n
                for n in (
                    board_notes.baseline_note(board, entries) if board.board_version < 2 else None,
                    board_notes.audit_note(board, entries),
                    board_notes.cost_note(board),
                    *(v2.notes if v2 is not None else ()),
                    removed_note(board),
                )
                if n
            ],
            rebuilds_itself=board.command.startswith("fedbench leaderboard build"),
            thumbnails=THUMBNAIL_FILE if thumbnails is not None else "",
        )
    )
    (folder / PAGE).write_text(html, encoding="utf-8")


def _summary(
    board: Board, entries: list[dict[str, Any]], part: Board | None, adaptive: frozenset[str]
) -> BoardSite:
    if board.board_version >= 2:
        headline, top = board_index.v2_summary(board, entries)
    else:
        headline, top = board_index.baseline_gap(board), ranking.ranked(board, entries)[0][1]["defense"]
    return BoardSite(
        name=board.name,
        title=board.title,
        attack_suite=board_index.attack_names(board.attack_suite, adaptive),
        baseline_gap=headline,
        entries=len(entries),
        rank1=top,
        build=board_index.build_cell(board, part),
    )


def index_table(boards: list[BoardSite]) -> dict[str, Any]:
    """The index's table (as `table` returns one): a row per board, its name linking to its page; the
    same short cells as leaderboards/README.md (the attacks' parameters are on the board's page)."""
    heads = ("board", "title", "attack suite", "no defense − baseline", "entries", "rank 1", "build")
    rows = []
    for b in boards:
        texts = (b.name, b.title, b.attack_suite, b.baseline_gap, str(b.entries), b.rank1, b.build)
        rows.append([{"text": t, "sort": t} for t in texts])
        rows[-1][0]["href"] = b.href
    return {
        "caption": f"{len(boards)} board{'' if len(boards) == 1 else 's'}",
        "headers": [{"label": h, "type": "number" if h == "entries" else "text"} for h in heads],
        "rows": rows,
    }


def _check_target(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise FedbenchError(f"{out} is a file; give a folder for the site")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise FedbenchError(
            f"{out} is not empty and holds no site written before; give an empty or new folder"
        )


def build_site(
    root: str | Path, out: str | Path, boards: list[str] | None = None, preset_dirs: tuple[Path, ...] = ()
) -> list[str]:
    """Write the site for the boards under `root` (all by default) into `out`; returns the boards.

    Every board is loaded and validated before anything is written; the pages go into a temporary
    folder beside `out` that replaces it at the end (`out` must be empty, new, or a site from before).
    """
    root, out = Path(root), Path(out)
    names = list(boards) if boards else lb.board_names(root)
    if not names:
        raise FedbenchError(f"{root}: no boards (folders with {lb.BOARD_FILE})")
    for name in names:
        lb.check_board_name(root, name)
    loaded = [lb.load_board(root / name) for name in names]
    adaptive = board_index.adaptive_attacks()
    _check_target(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a site is for serving
    try:
        for name in STATIC_FILES:
            source = resources.files("fedbench.reporting").joinpath("static", name)
            (tmp / name).write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
        for board, entries in loaded:
            thumbs = root / board.name / THUMBNAIL_FILE
            board_page(board, entries, tmp / board.name, preset_dirs, thumbs if thumbs.is_file() else None)
        html = (
            _templates()
            .get_template("site_index.html.j2")
            .render(t=index_table([_summary(*b, adaptive) for b in board_index.index_boards(loaded)]))
        )
        (tmp / PAGE).write_text(html, encoding="utf-8")
        (tmp / MARKER).write_text("written by `fedbench leaderboard site`; replaced on rebuild\n")
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [b.name for b, _ in loaded]


def _replace(new: Path, out: Path) -> None:
    """Move the finished site to `out`, removing the site (or empty folder) it replaces."""
    if out.is_dir():
        old = out.with_name(f"{new.name}-old")
        out.rename(old)
        new.rename(out)
        shutil.rmtree(old)
    else:
        new.rename(out)
