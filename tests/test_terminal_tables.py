"""The terminal (rich) trade-off table fits 80 and 120 columns (issue 20): short attack labels with a
legend, `mean ± spread` never broken, no row over two lines, columns split over several tables when
too narrow; `--wide` keeps the full labels. Markdown/LaTeX/CSV goldens live in tests/test_tables.py."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console
from test_tables import FINISHED
from typer.testing import CliRunner

from fedbench.cli import app
from fedbench.cli._common import out
from fedbench.metrics.catalogue import METRICS
from fedbench.reporting.renderers import terminal_layout, to_rich
from fedbench.reporting.tables import (
    WORST,
    Cell,
    Column,
    Pivot,
    load_results,
    pivot,
    to_markdown,
)

ATTACKS = ("inverting-gradients[iterations=100]", "idlg[iterations=1]")
DEFENSES = {  # label: (name, params), as the quickstart grid names them
    "none": ("none", {}),
    "dp-gaussian[clip=1,sigma=0.01]": ("dp-gaussian", {"clip": 1.0, "sigma": 0.01}),
    "dp-laplace[b=0.1,clip=1]": ("dp-laplace", {"b": 0.1, "clip": 1.0}),
    "sparsification[fraction=0.01]": ("sparsification", {"fraction": 0.01}),
}


def quickstart_rows(attacks=ATTACKS, defenses=DEFENSES, seeds=(0, 1, 2)):
    """Results rows shaped like `fedbench run quickstart` (two attacks with parameters, four defenses,
    three seeds: 95% CI cells), with hand-made numbers."""
    rows = []
    for di, (label, (name, params)) in enumerate(defenses.items()):
        for seed in seeds:
            for ai, attack in enumerate(attacks):
                rows.append(
                    {
                        "run_id": hashlib.sha256(f"{label}|{attack}|{seed}".encode()).hexdigest()[:16],
                        "utility_id": f"u-{label}-{seed}",
                        "preset": "quickstart",
                        "dataset": "mnist5k",
                        "model": "mlp",
                        "defense": label,
                        "attack": attack,
                        "defense_name": name,
                        "attack_name": attack.split("[")[0],
                        "seed": seed,
                        "sc_rounds": 20,
                        "sc_clients": 10,
                        **{f"p_defense_{k}": v for k, v in params.items()},
                        "psnr": 20.0 - 3 * di + ai + 0.1 * seed,
                        "ssim": 0.5 - 0.1 * di + 0.01 * seed,
                        "label_acc": 1.0 - 0.1 * ai,
                        "test_acc": 0.92 - 0.02 * di + 0.001 * seed,
                        "test_loss": 0.3,
                        "epsilon": 1.5 + 0.01 * seed if name.startswith("dp") else None,
                        "seconds": 1.0,
                        "utility_seconds": 2.0,
                        "attack_seconds": 0.5,
                        **FINISHED,
                    }
                )
    return rows


def write_quickstart(path: Path, rows=None, board: dict | None = None) -> Path:
    from fedbench.reporting.results import write_results

    side = {"preset": "quickstart", "description": "quickstart-like", "reported": [], "board": board or {}}
    return write_results(rows if rows is not None else quickstart_rows(), side, path)


@pytest.fixture
def results(tmp_path):
    return write_quickstart(tmp_path / "res" / "quickstart-20260102-030405.csv")


def show(renderable, width: int) -> str:
    console = Console(width=width, record=True, markup=False)
    console.print(renderable)
    return console.export_text()


def table_rows(text: str) -> list[list[list[str]]]:
    """Per table printed in `text` (a body after a '───' rule, up to a blank line), its rows as lines: a
    row starts on a line holding a number (every row of these tables has a `±` on its first line)."""
    tables, body = [], None
    for line in text.splitlines():
        if set(line.strip()) == {"─"}:
            body = []
            tables.append(body)
        elif body is not None and not line.strip():
            body = None
        elif body is not None:
            if "±" in line or not body:
                body.append([line])
            else:
                body[-1].append(line)
    return tables


def check_fits(text: str, width: int, nrows: int) -> None:
    assert all(cell_len(line.rstrip()) <= width for line in text.splitlines()), text
    tables = table_rows(text)
    assert tables, text
    for rows in tables:
        assert len(rows) == nrows, text
        assert all(len(lines) <= 2 for lines in rows), text


def numbers(p: Pivot) -> set[str]:
    """Every `mean ± spread` of a pivot, as the markdown writes it."""
    return {
        f"{c.metric.fmt(p.cell(i, c.key).value)} ± {c.metric.fmt(p.cell(i, c.key).spread)}"
        for c in p.columns
        for i in range(len(p.rows))
        if p.cell(i, c.key).spread is not None
    }


# ------------------------------------------------------------------------------------------- widths


@pytest.mark.parametrize("width", [80, 100, 120])
def test_quickstart_table_fits_the_terminal(results, width):
    p = pivot(load_results([results]))
    text = show(to_rich(p), width)
    check_fits(text, width, nrows=len(DEFENSES))
    for number in numbers(p):  # never broken over two lines
        assert number in text, (number, text)
    legend = [line for line in text.splitlines() if " = inverting-gradients[iterations=100]" in line]
    assert len(legend) == 1 and legend[0].split(" = ")[0] in text.split(legend[0])[0], text
    assert "idlg[iterations=1]" in text
    for label in DEFENSES:  # every defense label readable: whole or wrapped at '[' or ','
        assert label in text or any(part in text for part in re.split(r"(?<=[\[,])", label)[1:]), label


def test_the_old_table_fails_the_check_at_80_columns(results):
    """The check above can fail: the full labels folded rows over many lines."""
    p = pivot(load_results([results]))
    with pytest.raises(AssertionError):
        check_fits(show(to_rich(p, wide=True), 80), 80, nrows=len(DEFENSES))


def test_120_columns_is_one_table_with_whole_defense_labels(results):
    text = show(to_rich(pivot(load_results([results]))), 120)
    (rows,) = table_rows(text)
    assert all(len(lines) == 1 for lines in rows), text
    assert all(label in text for label in DEFENSES)
    assert "A1 = inverting-gradients[iterations=100]" in text and "(idlg)" in text


def test_wider_terminal_names_the_attacks(results):
    text = show(to_rich(pivot(load_results([results]))), 140)
    assert "A1" not in text and "  inverting-gradients  " in text  # in the header
    assert "inverting-gradients = inverting-gradients[iterations=100]" in text


def test_80_columns_splits_utility_and_worst_case_from_per_attack(results):
    p = pivot(load_results([results]))
    layout = terminal_layout(p, 80)
    assert len(layout.tables) == 2
    first, second = ([c.header for c in t if not c.key] for t in layout.tables)
    assert first[:3] == ["test_acc (%) ↑", "acc_drop (pp) ↓", "epsilon ↓"] and first[-1].startswith(WORST)
    assert second == ["A1 psnr ↓", "idlg psnr ↓"]
    assert layout.legend == ("A1 = inverting-gradients[iterations=100]", "idlg = idlg[iterations=1]")
    assert all(t[0].header == "defense" for t in layout.tables)


def test_same_attack_twice_gets_numbered_labels(tmp_path):
    rows = quickstart_rows(attacks=("idlg[iterations=1]", "idlg[iterations=5]"))
    p = pivot(load_results([write_quickstart(tmp_path / "r.csv", rows)]))
    text = show(to_rich(p), 120)
    check_fits(text, 120, nrows=len(DEFENSES))
    assert "A1 = idlg[iterations=1]" in text and "A2 = idlg[iterations=5]" in text
    assert "A1 psnr ↓" in text and "(A2)" in text


def test_very_long_defense_label_wraps_or_goes_to_the_legend():
    label = "soteria[layer=fc1,pruning=0.5,defended_layers=all,seed_offset=3,mode=strict]"
    names = ("test_acc", "acc_drop", "test_loss")
    cells = {n: Cell(0.9, 0.01, "std", 2) for n in names}
    rows = ((("none",), cells), ((label,), cells))
    p = Pivot("t", ("defense",), tuple(Column(n, METRICS[n]) for n in names), rows)
    wide = show(to_rich(p), 120)  # room to wrap it onto two lines
    check_fits(wide, 120, nrows=2)
    assert "D1" not in wide and "soteria[layer=fc1," in wide
    narrow = show(to_rich(p), 60)  # no room: an alias and the label under the table
    check_fits(narrow, 60, nrows=2)
    assert f"D1 = {label}" in narrow.replace("\n", "") and len(table_rows(narrow)) == 1


def test_paper_numbers_and_worst_attack_stay_within_two_lines():
    m = METRICS["psnr"]
    cell = Cell(21.1, 0.25, "ci95", 3, attack="inverting-gradients[iterations=100]", reported=14.2)
    rows = tuple(((d,), {f"{WORST}:psnr": cell}) for d in DEFENSES)
    p = Pivot("t", ("defense",), (Column(f"{WORST}:psnr", m, WORST),), rows)
    for width in (60, 120):
        text = show(to_rich(p), width)
        check_fits(text, width, nrows=len(DEFENSES))
        assert "21.10 ± 0.25" in text and "[paper 14.20, Δ +6.90]" in text
    assert "+6.90" in show(to_rich(p), 40).replace("\n", "")  # too narrow: folded, never cut off


def test_too_narrow_still_prints_every_number(results):
    p = pivot(load_results([results]))
    text = show(to_rich(p), 40)
    assert all(number in text for number in numbers(p)), text


def test_run_summary_board_fits_80_columns(tmp_path):
    """The table `fedbench run` prints (the compact leaderboard, rank columns first)."""
    from fedbench.reporting import leaderboard as lb

    board = {"name": "b", "title": "B", "headline": "psnr", "metrics": ["psnr", "ssim", "label_acc"]}
    rs = load_results([write_quickstart(tmp_path / "q.csv", board=board)])
    text = show(to_rich(lb.board_pivot(*lb.build(rs), compact=True)), 80)
    check_fits(text, 80, nrows=len(DEFENSES))
    assert "rank" in text and "21.10 ± 0.25" in text


# ---------------------------------------------------------------------------------------------- CLI

runner = CliRunner()


def compare(monkeypatch, width, *args):
    monkeypatch.setattr(out, "_width", width)  # the CLI console's width, as COLUMNS sets it at start-up
    return runner.invoke(app, ["compare", *map(str, args)])


def test_cli_compare_fits_80_columns(monkeypatch, results):
    res = compare(monkeypatch, 80, results)
    assert res.exit_code == 0, res.output
    check_fits(res.output, 80, nrows=len(DEFENSES))
    assert "A1 = inverting-gradients[iterations=100]" in res.output


def test_cli_wide_keeps_the_full_labels(monkeypatch, results):
    res = compare(monkeypatch, 400, results, "--wide")
    assert res.exit_code == 0, res.output
    header = next(line for line in to_markdown(pivot(load_results([results]))).splitlines() if "|" in line)
    for label in (h.strip() for h in header.strip("|").split("|")):
        assert label in res.output, label
    assert "(idlg[iterations=1])" in res.output and "= inverting" not in res.output  # no legend


def test_cli_wide_with_a_text_format_is_a_usage_error(monkeypatch, results):
    res = compare(monkeypatch, 80, results, "--wide", "--format", "markdown")
    assert res.exit_code == 2
    lines = [line for line in res.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "--wide" in lines[0] and "Traceback" not in res.output
