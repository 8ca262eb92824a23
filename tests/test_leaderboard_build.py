"""`fedbench leaderboard build`: a preset with a `[grid.board]` run and exported in one command, on a
tiny board (sklearn digits, an 8-unit MLP, one FL round, two cheap attacks, two seeds; seconds)."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedbench.cli import app
from fedbench.errors import FedbenchError, UnknownNameError
from fedbench.reporting import leaderboard as lb
from fedbench.reporting import ranking
from fedbench.spec.boards import BoardSource, rebuild_command, resolve_boards

runner = CliRunner()

# the components of the tiny boards (test_leaderboard_citable.py builds one with them too)
TINY_COMPONENTS = """
[[dataset]]
name = "digits"

[[model]]
name = "mlp"
params = { hidden = [8] }

[[defense]]
name = "none"

[[defense]]
name = "dp-gaussian"
params = { sigma = 0.1, clip = 1.0 }

[[attack]]
name = "idlg"
params = { iterations = 2 }
"""

TINY = (
    """
[grid]
name = "tiny-board"
description = "tiny board on sklearn digits"
seeds = 2

[grid.board]
name = "tiny-digits"
title = "digits · MLP 8 · 1 round"
headline = "psnr"
metrics = ["psnr", "label_acc"]
command = "fedbench run tiny-board && fedbench export --to leaderboard"

[scenario]
protocol = "fedavg"
clients = 2
rounds = 1
local_steps = 2
batch_size = 1
lr = 0.05
train_size = 40
test_size = 20

"""
    + TINY_COMPONENTS
    + """
[[attack]]
name = "dlg"
params = { iterations = 2 }
"""
)

# utility only, one seed: the cheapest boards, for the failure paths
UTILITY = """
[grid]
name = "{name}"
seeds = 1
{board}
[scenario]
clients = 2
rounds = 1
local_steps = 1
batch_size = 4
train_size = 40
test_size = 20

[[dataset]]
name = "digits"

[[model]]
name = "mlp"
params = {{ hidden = [8] }}
{defenses}
"""

BOARD = '\n[grid.board]\nname = "{}-board"\n'


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _lines(result) -> list[str]:
    """The output's lines but the per-run progress lines (CliRunner's stderr is not a terminal)."""
    return [line for line in result.output.strip().splitlines() if line.strip() and not PROGRESS.match(line)]


PROGRESS = re.compile(r"^[\w-]+: \[\d+/\d+\] ")


@pytest.fixture(scope="module")
def presets(tmp_path_factory):
    folder = tmp_path_factory.mktemp("presets")
    (folder / "tiny-board.toml").write_text(TINY)
    (folder / "plain.toml").write_text(UTILITY.format(name="plain", board="", defenses=""))
    return folder


@pytest.fixture(scope="module")
def built(presets, tmp_path_factory):
    """The tiny board built twice into one folder with one cache: (root, cache, first, second)."""
    root = tmp_path_factory.mktemp("boards") / "leaderboards"
    cache = tmp_path_factory.mktemp("cache")
    args = (
        "leaderboard",
        "build",
        "tiny-board",
        "--preset-dir",
        presets,
        "--dir",
        root,
        "--cache-dir",
        cache,
    )
    first = run(*args, "--threads", "1")
    assert first.exit_code == 0, first.output
    entries = {p.name: p.read_text() for p in (root / "tiny-digits" / lb.ENTRIES_DIR).iterdir()}
    second = run(*args)
    assert second.exit_code == 0, second.output
    return root, cache, first, second, entries


def test_build_writes_the_board_folder(built, presets):
    root, _cache, first, _second, _entries = built
    folder = root / "tiny-digits"
    assert {p.name for p in folder.iterdir()} == {"README.md", "board.json", "leaderboard.csv", "entries"}
    assert sorted(p.name for p in (folder / lb.ENTRIES_DIR).iterdir()) == [
        "dp-gaussian_clip_1_sigma_0.1.json",
        "none.json",
    ]
    assert (root / "README.md").is_file()  # the index
    board, entries = lb.load_board(folder)
    assert board.preset == "tiny-board" and board.attack_suite == ("idlg[iterations=2]", "dlg[iterations=2]")
    assert all(e["seeds"] == [0, 1] and len(e["run_ids"]) == 4 for e in entries)
    assert all(e["rank_stability"]["resamples"] == ranking.STABILITY_RESAMPLES for e in entries)
    # the board records the command that rebuilt it, not the preset's run && export line; a path
    # relative to the current folder, and no --dir or --cache-dir (they do not change the board)
    assert shlex.split(board.command) == [
        "fedbench", "leaderboard", "build", "tiny-board", "--preset-dir", os.path.relpath(presets)
    ]  # fmt: skip
    readme = (folder / lb.README_FILE).read_text()
    assert board.command in readme and "| rank stability" in readme and "bootstrap resamples" in readme
    # progress: one line per board with its runs and seconds (the LPIPS warning aside)
    lines = [line for line in _lines(first) if not line.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("tiny-digits: 8 runs (8 done) in "), first.output
    assert lines[0].endswith(f" s -> {folder}")
    # stderr is not a terminal here (a log): a line per computed run, named by the board
    runs = [line for line in first.output.splitlines() if PROGRESS.match(line)]
    assert len(runs) == 8 and all(line.startswith("tiny-digits: [") and " done " in line for line in runs)


def test_a_second_build_is_served_from_the_cache_and_reproduces_the_entries(built):
    root, _cache, _first, second, entries = built
    lines = [line for line in _lines(second) if not line.startswith("warning:")]
    assert lines[0].startswith("tiny-digits: 8 runs (8 cached) in "), second.output
    runs = [line for line in second.output.splitlines() if PROGRESS.match(line)]
    assert runs[-1].startswith("tiny-digits: [8/8] ") and len(runs) < 8, second.output
    assert sum(int(line.split("] ")[1].split()[0]) for line in runs) == 8  # summed up, not one line each
    again = {p.name: p.read_text() for p in (root / "tiny-digits" / lb.ENTRIES_DIR).iterdir()}
    assert again == entries  # same runs, same numbers, same bootstrap (fixed RNG seed)


def test_check_passes_on_the_built_board_and_render_changes_nothing(built):
    root = built[0]
    res = run("leaderboard", "check", "--dir", root)
    assert res.exit_code == 0, res.output
    assert lb.render(root) == []


def test_build_by_board_name_matches_a_fresh_export(built, presets, tmp_path):
    """The board name selects the same preset, and the build is `export --to leaderboard` of a run."""
    root, cache, *_ = built
    res = run(
        "leaderboard", "build", "tiny-digits", "--preset-dir", presets, "--dir", root, "--cache-dir", cache
    )
    assert res.exit_code == 0 and "8 cached" in res.output, res.output
    out = tmp_path / "results"
    ran = run("run", presets / "tiny-board.toml", "-o", out, "--cache-dir", cache)
    assert ran.exit_code == 0, ran.output
    exported = tmp_path / "exported"
    res = run("export", "-o", out, "--to", "leaderboard", "--dest", exported)
    assert res.exit_code == 0, res.output
    for path in (root / "tiny-digits" / lb.ENTRIES_DIR).iterdir():
        assert json.loads(path.read_text()) == json.loads(
            (exported / "tiny-digits" / "entries" / path.name).read_text()
        )


@pytest.mark.parametrize(
    "args,pattern",
    [
        (("tiny-bord",), "unknown board 'tiny-bord'; did you mean 'tiny-board'?"),
        (("smoke",), "preset 'smoke' declares no [grid.board]"),
        (("plain",), "preset 'plain' declares no [grid.board]"),
        ((), "give board names or --all"),
        (("tiny-board", "--all"), "give board names or --all (not both)"),
        (("nowhere/x.toml",), "preset file nowhere/x.toml does not exist"),
    ],
)
def test_a_bad_board_is_a_one_line_usage_error(presets, tmp_path, args, pattern):
    root = tmp_path / "boards"
    res = run("leaderboard", "build", *args, "--preset-dir", presets, "--dir", root)
    assert res.exit_code == 2, res.output
    lines = _lines(res)
    assert len(lines) == 1 and lines[0].startswith("error:") and pattern in lines[0], res.output
    assert not root.exists()  # nothing ran, nothing written


def test_all_selects_every_preset_with_a_board(presets):
    chosen = resolve_boards([], True, (presets,))
    found = [(s.preset, s.board, s.builtin) for s in chosen]
    assert found == sorted(found)  # by preset name
    assert {
        ("board-fedsgd", "inversion-fedsgd-mnist5k-mlp", True),
        ("board-membership", "membership-mnist5k-mlp", True),
    } <= set(found)  # the built-in presets with a board (more boards may join them)
    assert ("tiny-board", "tiny-digits", False) in found
    assert [s.board for s in resolve_boards([], True)] == [b for _, b, builtin in found if builtin]
    # a preset and its board name are one board
    assert len(resolve_boards(["tiny-board", "tiny-digits"], False, (presets,))) == 1
    with pytest.raises(UnknownNameError, match="did you mean 'board-fedsgd'"):
        resolve_boards(["board-fedsgdd"], False)
    with pytest.raises(FedbenchError, match="preset 'quickstart' declares no \\[grid.board\\]"):
        resolve_boards(["quickstart"], False)  # the quickstart is a preset without a board


def test_a_broken_preset_stops_all_but_not_a_named_board(presets, tmp_path):
    """--all asked for every board, so a preset that does not load is an error; naming another board
    leaves it aside (it is no board anyone asked for), and naming it shows its own error."""
    (tmp_path / "broken.toml").write_text('[grid]\nnmae = "x"\n')
    dirs = (tmp_path, presets)
    with pytest.raises(FedbenchError, match="broken.toml: \\[grid\\] has unknown key 'nmae'"):
        resolve_boards([], True, dirs)
    assert [s.board for s in resolve_boards(["tiny-digits"], False, dirs)] == ["tiny-digits"]
    with pytest.raises(FedbenchError, match="unknown key 'nmae'"):
        resolve_boards(["broken"], False, dirs)


def test_two_presets_declaring_one_board_are_refused(presets, tmp_path):
    (tmp_path / "twin.toml").write_text(TINY.replace('name = "tiny-board"', 'name = "twin"'))
    with pytest.raises(FedbenchError, match="both declare board tiny-digits"):
        resolve_boards(["twin", "tiny-board"], False, (tmp_path, presets))


def test_rebuild_command_names_where_the_preset_is(tmp_path, monkeypatch):
    """The preset, and for one of yours the folders it and its base are found in and the plugins its
    grid uses; paths relative to the current folder; nothing else (no --dir: not part of the board)."""
    monkeypatch.chdir(tmp_path)
    builtin = BoardSource("mnist5k-fedavg", Path("/x/mnist5k-fedavg.toml"), "mnist5k-mlp-fedavg", True)
    assert rebuild_command(builtin) == "fedbench leaderboard build mnist5k-fedavg"
    assert rebuild_command(builtin, (Path("mine"),), (Path("p.py"),)) == rebuild_command(builtin)
    (tmp_path / "my dir").mkdir()
    (tmp_path / "my dir" / "b.toml").write_text('[grid]\nextends = "base"\n')
    (tmp_path / "bases").mkdir()
    (tmp_path / "bases" / "base.toml").write_text("[grid]\n")
    by_path = BoardSource("my dir/b.toml", Path("my dir/b.toml"), "b", False)
    assert rebuild_command(by_path, (Path("bases"),)) == (
        "fedbench leaderboard build 'my dir/b.toml' --preset-dir bases"
    )
    by_name = BoardSource("b", tmp_path / "my dir" / "b.toml", "b", False)
    unused = tmp_path / "unused"
    assert rebuild_command(by_name, (unused, tmp_path / "bases"), (tmp_path / "plug.py",)) == (
        "fedbench leaderboard build b --preset-dir 'my dir' --preset-dir bases --plugin plug.py"
    )


FAIL_PLUGIN = """
from fedbench.plugin import Defense
from fedbench.registry import register_defense


@register_defense("test-lb-fail")
class Fail(Defense):
    '''Always fails.'''

    def update(self, delta, ctx):
        raise RuntimeError("broken defense")
"""


def test_failed_boards_exit_1_after_the_others_and_are_named(built, presets, tmp_path):
    """A failed run (or results a board cannot be made of) leaves that board unwritten; the other
    boards are built, and the command exits 1 naming the failed ones."""
    from fedbench import registry

    root, cache, *_ = built
    extra = tmp_path / "more"
    extra.mkdir()
    none = '\n[[defense]]\nname = "none"\n'
    (extra / "broken.toml").write_text(
        UTILITY.format(
            name="broken",
            board=BOARD.format("broken"),
            defenses=none + '\n[[defense]]\nname = "test-lb-fail"\n',
        )
    )
    (extra / "nobase.toml").write_text(
        UTILITY.format(
            name="nobase", board=BOARD.format("nobase"), defenses='\n[[defense]]\nname = "sparsification"\n'
        )
    )
    plugin = tmp_path / "fail_plugin.py"
    plugin.write_text(FAIL_PLUGIN)
    dirs = ("--preset-dir", extra, "--preset-dir", presets)
    try:
        res = run(
            "leaderboard", "build", "broken", "tiny-board", "nobase", *dirs,
            "--dir", root, "--cache-dir", cache, "--plugin", plugin,
        )  # fmt: skip
    finally:
        registry.defenses.unregister("test-lb-fail")
    assert res.exit_code == 1, res.output
    lines = [line for line in _lines(res) if not line.startswith("warning:")]
    assert lines[0].startswith("broken-board: 2 runs (1 done, 1 failed) in "), res.output
    assert "FAILED: 1 of 2 runs failed or timed out" in lines[0] and "broken defense" in lines[0]
    assert lines[1].startswith("tiny-digits: 8 runs (8 cached)")
    assert lines[2].startswith("nobase-board: 1 run (1 done)") and "'none' baseline" in lines[2]
    assert lines[-1] == "not built: broken-board, nobase-board"
    assert not (root / "broken-board").exists() and not (root / "nobase-board").exists()
    assert lb.stale(root) == []


def test_the_board_records_its_wall_time_and_a_cached_rebuild_keeps_it(built):
    """The first build computed every run (an empty cache): its wall time, cores and jobs are in
    board.json and the README; the second build, served from the cache, measures nothing and keeps it."""
    root, cache, _first, _second, _entries = built
    board, _ = lb.load_board(root / "tiny-digits")
    wall = board.build_wall
    assert wall is not None and wall.from_empty and wall.runs == wall.computed == 8
    assert wall.invocations == 1 and wall.n_jobs == "1" and wall.threads == "1" and wall.seconds > 0
    readme = (root / "tiny-digits" / lb.README_FILE).read_text()
    assert "Wall time: " in readme and "from an empty cache" in readme
    ledger = json.loads((cache / "builds" / "tiny-digits.json").read_text())
    assert ledger["closed"] and ledger["computed"] == 8 and ledger["invocations"] == 1
