"""A board's slice (`fedbench leaderboard build NAME --slice`, `fedbench.reporting.board_slice`): the
same rows and suite on fewer seeds and inputs, as the board NAME-slice, and `leaderboard check` comparing
it with its full board."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from fedbench.cli import app
from fedbench.reporting import leaderboard as lb
from fedbench.reporting.board_rank import Row
from fedbench.reporting.board_slice import compare_rows, slice_disagreements, slice_overrides
from tests.test_board_v2 import TINY

runner = CliRunner()
SLICED = TINY.replace("[scenario]", "[grid.board.slice]\nseeds = 1\nvictims = 1\n\n[scenario]", 1)


def row(name, low, high, admissible=True, rank=1, rank_low=1, rank_high=2, borderline=False) -> Row:
    rate = (low + high) / 2
    return Row(
        {"defense": name}, None, rate, low, high, 0.0, 0.0, 0.0, admissible, borderline, "",
        rank=rank, rank_low=rank_low, rank_high=rank_high,
    )  # fmt: skip


@pytest.fixture(scope="module")
def boards(tmp_path_factory):
    """The tiny v2 board and its slice, built into one folder with one cache."""
    base = tmp_path_factory.mktemp("slice")
    (base / "presets").mkdir()
    (base / "presets" / "tiny-v2.toml").write_text(SLICED, encoding="utf-8")
    common = [
        "--preset-dir",
        "presets",
        "--dir",
        "boards",
        "--cache-dir",
        str(base / "cache"),
        "--threads",
        "1",
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(base)
        for extra in ([], ["--slice"]):
            res = runner.invoke(app, ["leaderboard", "build", "tiny-v2", *extra, *common])
            assert res.exit_code == 0, res.output
    return base


def test_the_slice_is_a_board_of_its_own_on_fewer_seeds_and_inputs(boards):
    full, fentries = lb.load_board(boards / "boards" / "tiny-v2")
    part, sentries = lb.load_board(boards / "boards" / "tiny-v2-slice")
    assert part.slice_of == "tiny-v2" and not full.slice_of and part.title.endswith("(slice)")
    assert part.command.endswith(" --slice")  # its rebuild command builds the slice again
    assert {e["defense"] for e in sentries} == {e["defense"] for e in fentries}  # every row
    assert part.attack_suite == full.attack_suite  # the whole suite
    assert all(e["seeds"] == [0] for e in sentries) and all(e["seeds"] == [0, 1] for e in fentries)
    rec = sentries[0]["per_input"][part.attack_suite[0]]["0"]
    assert rec["victims"] == [0]  # one victim per run instead of two


def test_check_passes_when_the_slice_agrees_and_names_a_row_that_does_not(boards, tmp_path):
    root = tmp_path / "boards"
    shutil.copytree(boards / "boards", root)
    res = runner.invoke(app, ["leaderboard", "check", "--dir", str(root)])
    assert res.exit_code == 0, res.output
    assert slice_disagreements(lb.load_board(root / "tiny-v2"), lb.load_board(root / "tiny-v2-slice")) == []
    (root / "tiny-v2-slice" / "entries" / "sparsification_fraction_0.01.json").unlink()  # a row lost
    assert runner.invoke(app, ["leaderboard", "render", "--dir", str(root)]).exit_code == 0
    res = runner.invoke(app, ["leaderboard", "check", "--dir", str(root)])
    assert res.exit_code == 1
    assert (
        "slice disagrees: tiny-v2-slice: sparsification[fraction=0.01]: on the full board, not on the slice"
        in res.output
    )


def test_rows_disagree_beyond_their_intervals_only():
    agree = compare_rows(
        {"a": row("a", 0.2, 0.5)}, {"a": row("a", 0.4, 0.9, rank_low=2, rank_high=3)}, "reid"
    )
    assert agree == []
    apart = compare_rows(
        {"a": row("a", 0.1, 0.2)}, {"a": row("a", 0.5, 0.9, rank=3, rank_low=3, rank_high=4)}, "reid"
    )
    assert apart == ["a: reid [10.0, 20.0] on the full board, [50.0, 90.0] on the slice",
                     "a: rank 1-2 on the full board, 3-4 on the slice"]  # fmt: skip
    budget = compare_rows({"a": row("a", 0.1, 0.2)}, {"a": row("a", 0.1, 0.2, admissible=False)}, "reid")
    assert budget == ["a: within the utility budget on the full board, not on the slice"]
    borderline = {"a": row("a", 0.1, 0.2, admissible=False, borderline=True)}
    assert compare_rows({"a": row("a", 0.1, 0.2)}, borderline, "reid") == []


def test_a_rank_agrees_through_its_tie_band():
    """The attribute board's case: rank 2 on the full board, whose drawn ranks are 3-6 (two rows below it
    by noise-level margins), rank 1 in a tie of 6 on the slice, drawn 1-2; the rates agree. The tie band
    (the ranks no paired test separates) counts as the row's ranks beside the drawn interval."""
    full = row("a", 0.87, 0.96, rank=2, rank_low=3, rank_high=6)
    tied = row("a", 0.81, 0.97, rank=1, rank_low=1, rank_high=2)
    tied.tied = 6
    assert compare_rows({"a": full}, {"a": tied}, "asr") == []
    alone = row("a", 0.81, 0.97, rank=1, rank_low=1, rank_high=2)  # tied with none: 1-2 against 2-6
    assert compare_rows({"a": full}, {"a": alone}, "asr") == []
    apart = row("a", 0.81, 0.97, rank=7, rank_low=7, rank_high=8)
    assert compare_rows({"a": full}, {"a": apart}, "asr") == [
        "a: rank 2-6 on the full board, 7-8 on the slice"
    ]


def test_a_rate_with_no_success_has_its_exact_interval_and_a_slice_agrees_by_it():
    """A percentile bootstrap of 0 successes collapses to [0, 0]; the published interval of a rate
    contains the exact interval of its pooled count (`rate_interval`): 0 of 100 is [0, 3.6 %]. So 0 of 20
    re-identified on a slice ([0, 16.8 %]) agrees with 5 of 100 on the full board; 0 of 500 ([0, 0.7 %])
    does not."""
    import numpy as np

    from fedbench.reporting.board_rank import Draws, Leakage, rate_interval

    def rated(k, n):
        values = np.zeros(n)
        values[np.linspace(0, n - 1, k).astype(int)] = 1.0  # successes spread over both seeds
        leak = Leakage(inputs={0: values[: n // 2], 1: values[n // 2 :]})
        draws = Draws([0, 1], n // 2).rates(leak)
        low, high = rate_interval(leak, draws, k / n, "reid")
        assert low <= k / n <= high
        return Row({"defense": "a"}, leak, k / n, low, high, 0.5, 0.4, 0.6, False, False, "")

    none_of_100 = rated(0, 100)
    assert none_of_100.low == 0.0 and none_of_100.high == pytest.approx(1 - 0.025 ** (1 / 100))
    assert rated(100, 100).low == pytest.approx(0.025 ** (1 / 100))  # 100 of 100: [96.4 %, 100 %]
    full = {"a": rated(5, 100)}
    assert full["a"].low < 0.0165 and full["a"].high > 0.112  # at least the exact [1.6, 11.3] %
    assert compare_rows(full, {"a": rated(0, 20)}, "reid") == []
    (line,) = compare_rows(full, {"a": rated(0, 500)}, "reid")
    assert line.endswith("on the full board, [0.0, 0.7] on the slice")


def test_slice_overrides_and_a_preset_without_a_slice(tmp_path, monkeypatch):
    assert slice_overrides({"seeds": 2, "victims": 10}) == ("grid.seeds=2", "scenario.victims=10")
    assert slice_overrides({"seeds": 1}) == ("grid.seeds=1",)
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "tiny-v2.toml").write_text(TINY, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["leaderboard", "build", "tiny-v2", "--slice", "--preset-dir", "presets"])
    assert res.exit_code == 2 and "declares no [grid.board.slice]" in res.output
    assert not (tmp_path / "leaderboards").exists()  # nothing written


def test_a_bad_slice_table_is_a_usage_error(tmp_path, monkeypatch):
    bad = TINY.replace("[scenario]", "[grid.board.slice]\nseeds = 0\n\n[scenario]", 1)
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "tiny-v2.toml").write_text(bad, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["validate", "presets/tiny-v2.toml"])
    assert res.exit_code == 2 and "seeds" in res.output, res.output
    assert json.dumps(res.output)  # one readable message
