"""The summary `fedbench run` prints (board or trade-off table, markdown, plot data) is stored in the run
cache by its results, code and environment (issue 29: a warm-cache re-run does only what changed)."""

from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from fedbench.cli import app
from fedbench.reporting import run_summary


@pytest.fixture
def summaries(monkeypatch):
    """Counts the summaries computed (`run_summary.compute_summary`, looked up at call time)."""
    calls = []
    real = run_summary.compute_summary
    monkeypatch.setattr(run_summary, "compute_summary", lambda path: calls.append(path) or real(path))
    return calls


def _run(tmp_path, *extra):
    res = CliRunner().invoke(app, ["run", "smoke", "-o", str(tmp_path / "out"), *extra])
    assert res.exit_code == 0, res.output
    return res


def _table(res) -> str:
    """The printed table: standard output without the written files' names (progress is on stderr)."""
    return "\n".join(line for line in res.stdout.splitlines() if "out/smoke-" not in line)


def test_a_warm_rerun_reads_its_summary_back(tmp_path, summaries):
    cache = ["--cache-dir", str(tmp_path / "cache")]
    first = _run(tmp_path, *cache)
    second = _run(tmp_path, *cache)
    assert len(summaries) == 1  # computed once, then read
    assert _table(second) == _table(first) and "none" in _table(first)
    md = sorted((tmp_path / "out").glob("smoke-*.md"))
    assert len(md) >= 1 and len({p.read_text() for p in md}) == 1


def test_without_a_cache_the_summary_is_computed_each_time(tmp_path, summaries):
    _run(tmp_path, "--no-cache")
    _run(tmp_path, "--no-cache")
    assert len(summaries) == 2


def test_edited_code_computes_the_summary_again(tmp_path, summaries, monkeypatch):
    cache = ["--cache-dir", str(tmp_path / "cache")]
    _run(tmp_path, *cache)
    monkeypatch.setattr(run_summary, "code_digest", lambda: "edited")
    _run(tmp_path, *cache)
    _run(tmp_path, *cache)
    assert len(summaries) == 2  # the edited code's summary is stored in turn


def test_a_damaged_summary_entry_is_computed_again(tmp_path, summaries):
    cache = ["--cache-dir", str(tmp_path / "cache")]
    _run(tmp_path, *cache)
    (entry,) = [p for p in (tmp_path / "cache").rglob("output.pkl") if "_summary_entry" in p.parts]
    entry.write_bytes(b"not a pickle")
    res = _run(tmp_path, *cache)
    assert len(summaries) == 2 and "corrupted summary cache entry" in res.output


def _results(tmp_path, rows, sidecar=None):
    path = tmp_path / "r.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    path.with_suffix(".json").write_text(json.dumps(sidecar or {"preset": "p"}))
    return run_summary.results_digest(path)


ROW = {
    "defense": "none",
    "test_acc": "0.91",
    "seconds": "0.01",
    "peak_rss_mb": "300",
    "created_at": "2026-11-28T17:00:00",
}


@pytest.mark.parametrize(
    "change, same",
    [
        ({"seconds": "0.02", "peak_rss_mb": "301", "from_cache": "True"}, True),  # the run read back
        ({"created_at": "2026-11-28T18:30:00"}, True),  # the same date: a board shows only the date
        ({"created_at": "2026-11-29T17:00:00"}, False),
        ({"test_acc": "0.92"}, False),
        ({"defense": "dp-gaussian[sigma=0.1]"}, False),
    ],
)
def test_the_results_digest_skips_only_what_no_summary_reads(tmp_path, change, same):
    before = _results(tmp_path, [ROW])
    assert (_results(tmp_path, [{**ROW, **change}]) == before) is same


def test_the_results_digest_reads_the_sidecar(tmp_path):
    assert _results(tmp_path, [ROW]) != _results(tmp_path, [ROW], sidecar={"preset": "q"})


def test_the_key_names_results_code_and_environment(tmp_path):
    _results(tmp_path, [ROW])
    fields = json.loads(run_summary.summary_key(tmp_path / "r.csv"))
    assert set(fields) == {"results", "code", "environment"}
    assert set(fields["environment"]) == set(run_summary.PACKAGES)
    assert fields["code"] == run_summary.code_digest()
