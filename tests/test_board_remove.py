"""`fedbench leaderboard remove`: a row leaves a built board with its reason on record, the other rows
untouched, a rebuild keeps the record while the preset leaves the row out, and the negative paths."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from fedbench.cli import app
from tests.test_board_v2 import TINY

runner = CliRunner()


def _built(tmp_path, monkeypatch, preset: str = TINY):
    (tmp_path / "presets").mkdir(exist_ok=True)
    (tmp_path / "presets" / "tiny-v2.toml").write_text(preset, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    args = ["leaderboard", "build", "tiny-v2", "--preset-dir", "presets", "--dir", "boards"]
    res = runner.invoke(app, [*args, "--cache-dir", str(tmp_path / "cache"), "--threads", "1"])
    assert res.exit_code == 0, res.output
    return tmp_path / "boards" / "tiny-v2"


def test_remove_records_the_row_and_keeps_the_others(tmp_path, monkeypatch):
    folder = _built(tmp_path, monkeypatch)
    row = "sparsification[fraction=0.01]"
    before = (folder / "entries" / "none.json").read_text()
    res = runner.invoke(
        app, ["leaderboard", "remove", "tiny-v2", "-D", row, "--reason", "a test", "--dir", "boards"]
    )
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (folder / "entries").glob("*.json")) == ["none.json"]
    assert (folder / "entries" / "none.json").read_text() == before  # the others are not touched
    (rec,) = json.loads((folder / "board.json").read_text())["removed"]
    assert rec["defense"] == row and rec["reason"] == "a test" and rec["measured"].startswith("reid ")
    readme = (folder / "README.md").read_text()
    assert f"Removed from this board after it was built: `{row}` (" in readme and "a test" in readme
    assert runner.invoke(app, ["leaderboard", "check", "--dir", "boards"]).exit_code == 0
    # a rebuild from a preset that leaves the row out keeps the record; one that has it drops it
    without = TINY.replace('[[defense]]\nname = "sparsification"\nparams = { fraction = 0.01 }\n', "")
    _built(tmp_path, monkeypatch, without)
    assert [r["defense"] for r in json.loads((folder / "board.json").read_text())["removed"]] == [row]
    _built(tmp_path, monkeypatch)
    assert not json.loads((folder / "board.json").read_text()).get("removed")


def test_remove_refuses_what_it_cannot_remove(tmp_path, monkeypatch):
    folder = _built(tmp_path, monkeypatch)
    board_json = (folder / "board.json").read_text()
    for args, message in [
        (["-D", "mine[a=1]", "--reason", "x"], "is not on board tiny-v2"),
        (["-D", "none", "--reason", "x"], "baseline"),
        (["-D", "sparsification[fraction=0.01]", "--reason", " "], "--reason is empty"),
    ]:
        res = runner.invoke(app, ["leaderboard", "remove", "tiny-v2", *args, "--dir", "boards"])
        assert res.exit_code == 2 and message in res.output, res.output
    assert (folder / "board.json").read_text() == board_json  # nothing written
    res = runner.invoke(app, ["leaderboard", "remove", "nope", "-D", "x", "--reason", "x", "--dir", "boards"])
    assert res.exit_code == 2
