"""The re-identification figure of docs/metrics.md (issue 27): committed, small, and shown with the
script that draws it (`docs/reid_figure.py`, which runs attacks and is not run here)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIGURE = ROOT / "docs" / "img" / "reid-decision.png"


def test_reid_figure_is_committed_and_small():
    assert FIGURE.is_file()
    assert FIGURE.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert FIGURE.stat().st_size <= 150_000


def test_metrics_page_shows_the_figure_and_how_to_redraw_it():
    text = (ROOT / "docs" / "metrics.md").read_text()
    assert "](img/reid-decision.png)" in text
    assert "docs/reid_figure.py" in text
    assert (ROOT / "docs" / "reid_figure.py").is_file()
