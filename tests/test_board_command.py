"""A board's recorded command and what protects a board (issue 26, item 7).

- `fedbench export --to leaderboard` over a board that another command wrote exits 2 without --force,
  names the entries it would lose and changes nothing on disk; with --force it replaces the board. A
  board's own command (its Regenerate line, `leaderboard build` of its own preset) needs no --force.
- The recorded command is the whole command: run's grid options (-D/-a, ...) and export's, in one normal
  form, with paths relative to the current folder and without -o, --cache-dir, --n-jobs, --threads,
  --dir; run in a fresh folder it rebuilds the same board (tiny boards of tests/test_leaderboard_build.py).
- No committed board or results page records an absolute local path.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
from pathlib import Path

import pytest
from test_leaderboard_build import PROGRESS, TINY
from test_tables import write_synthetic
from typer.testing import CliRunner

from fedbench.cli import app
from fedbench.cli.board_write import absolute_path, export_command, grid_run_words
from fedbench.reporting import leaderboard as lb
from fedbench.spec.boards import rebuild_command, resolve_boards

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
NONE_IDLG = ("-D", "none", "-a", "idlg[iterations=2]")  # a slice of the tiny preset's grid: 2 runs


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def ok(*args):
    res = run(*args)
    assert res.exit_code == 0, f"fedbench {shlex.join(map(str, args))}:\n{res.output[-3000:]}"
    return res


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under `root`: its SHA-256 and modification time (ns)."""
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def replay(command: str) -> None:
    """Run a recorded command (`fedbench ... && fedbench ...`) in the current folder."""
    words = shlex.split(command)
    segments: list[list[str]] = [[]]
    for word in words:
        if word == "&&":
            segments.append([])
        else:
            segments[-1].append(word)
    for segment in segments:
        assert segment[0] == "fedbench", command
        ok(*segment[1:])


def board_files(folder: Path) -> dict[str, object]:
    """A board's JSON files (board.json and the entries) as data."""
    files = [folder / lb.BOARD_FILE, *sorted((folder / lb.ENTRIES_DIR).glob("*.json"))]
    return {p.name: json.loads(p.read_text()) for p in files}


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A folder `a` (the current folder) with the tiny preset in presets/, and results of the preset's whole
    grid (`full`, 8 runs) and of its none x idlg slice (`part`), run with options that do not change a
    board (absolute -o and --cache-dir, -j, --threads). Runs are computed once per session (one cache)."""
    a = tmp_path / "a"
    (a / "presets").mkdir(parents=True)
    (a / "presets" / "tiny-board.toml").write_text(TINY)
    monkeypatch.chdir(a)
    extra = ("--cache-dir", _cache(), "-j", "1", "--threads", "1")
    ok("run", "presets/tiny-board.toml", "-o", a / "full", *extra)
    ok("run", "presets/tiny-board.toml", *NONE_IDLG, "-o", a / "part", *extra)
    return a


def _cache() -> str:
    return os.environ["FEDBENCH_CACHE_DIR"]  # conftest's cache for the session: runs computed once


# ---------------------------------------------------------------------------------------- overwrite


def test_export_over_a_board_another_command_wrote_exits_2_and_changes_nothing(tiny):
    boards = tiny / "leaderboards"
    ok("export", tiny / "full", "--to", "leaderboard", "--board", "tiny", "--dest", boards)
    assert len(list((boards / "tiny" / lb.ENTRIES_DIR).glob("*.json"))) == 2
    before = snapshot(boards)
    res = run("export", tiny / "part", "--to", "leaderboard", "--board", "tiny", "--dest", boards)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: board tiny in "), res.output
    assert "holds 2 entries (written by: fedbench run presets/tiny-board.toml && fedbench export" in lines[0]
    assert "remove 1 (dp-gaussian[clip=1,sigma=0.1]) and replace 1 (none)" in lines[0]
    assert "pass --force" in lines[0]
    assert snapshot(boards) == before  # not a byte, not a modification time
    res = ok("export", tiny / "part", "--to", "leaderboard", "--board", "tiny", "--dest", boards, "--force")
    assert sorted(p.name for p in (boards / "tiny" / lb.ENTRIES_DIR).iterdir()) == ["none.json"]
    board, _entries = lb.load_board(boards / "tiny")
    assert board.command.startswith("fedbench run presets/tiny-board.toml -D none -a")
    assert lb.stale(boards) == []


def test_a_new_or_empty_board_and_a_boards_own_command_need_no_force(tiny):
    boards = tiny / "leaderboards"
    empty = boards / "tiny" / lb.ENTRIES_DIR
    empty.mkdir(parents=True)  # a board folder without entries: nothing to lose
    ok("export", tiny / "full", "--to", "leaderboard", "--board", "tiny", "--dest", boards)
    # the same results again: the board's own command, regenerating itself
    res = ok("export", tiny / "full", "--to", "leaderboard", "--board", "tiny", "--dest", boards)
    assert "rendered nothing new" in res.output


def test_leaderboard_build_refuses_a_board_another_command_wrote(tiny):
    """`leaderboard build` of a preset rebuilds the board it wrote itself, but a board of the same name that
    `fedbench export` (or another preset) wrote is refused before any run unless --force."""
    boards = tiny / "leaderboards"
    ok("export", tiny / "part", "--to", "leaderboard", "--dest", boards)  # the preset's board name
    before = snapshot(boards)
    build = ("leaderboard", "build", "tiny-board", "--preset-dir", "presets", "--dir", boards)
    res = run(*build)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: board tiny-digits in "), res.output
    assert "(written by: fedbench run presets/tiny-board.toml -D none -a" in lines[0]
    assert "replace 1 (none)" in lines[0] and "pass --force" in lines[0]
    assert not any(PROGRESS.match(line) for line in lines)  # refused before any run
    assert snapshot(boards) == before
    ok(*build, "--force")
    assert lb.load_board(boards / "tiny-digits")[0].command == (
        "fedbench leaderboard build tiny-board --preset-dir presets"
    )
    ok(*build)  # its own board now: rebuilt without --force


# ------------------------------------------------------------------------------- recorded command


def test_the_sidecar_records_the_command_as_parsed(tiny):
    """Not sys.argv (pytest's here): the options as fedbench parsed them, in normal form."""
    side = json.loads(next((tiny / "part").glob("*.json")).read_text())
    assert shlex.split(side["command"]) == [
        "fedbench", "run", "presets/tiny-board.toml", *NONE_IDLG, "-o", str(tiny / "part"),
        "--cache-dir", _cache(), "--threads", "1",
    ]  # fmt: skip


@pytest.mark.parametrize("how", ["export", "build"])
def test_the_recorded_command_rebuilds_the_same_board(tiny, tmp_path, monkeypatch, how):
    """Build a tiny board with options that do not change it, read the command it records, run that
    command in a fresh folder (the preset copied there) and get the same board.json and entries."""
    first = tiny / "first"
    if how == "export":  # a slice of the preset's grid: the command must carry -D and -a
        ok("export", tiny / "part", "--to", "leaderboard", "--board", "tiny-part", "--dest", first)
        name = "tiny-part"
        expected = (
            "fedbench run presets/tiny-board.toml -D none -a 'idlg[iterations=2]' && "
            "fedbench export --to leaderboard --board tiny-part"
        )
    else:
        ok(
            "leaderboard", "build", "tiny-board", "--preset-dir", tiny / "presets", "--dir", first,
            "--cache-dir", _cache(), "-j", "1", "--threads", "1",
        )  # fmt: skip
        name = "tiny-digits"
        expected = "fedbench leaderboard build tiny-board --preset-dir presets"
    board, _ = lb.load_board(first / name)
    assert board.command == expected
    assert expected in (first / name / lb.README_FILE).read_text()  # the README's Regenerate section
    fresh = tmp_path / "b"
    fresh.mkdir()
    shutil.copytree(tiny / "presets", fresh / "presets")
    monkeypatch.chdir(fresh)
    replay(board.command)
    assert board_files(fresh / "leaderboards" / name) == board_files(first / name)


def test_grid_run_words_keep_what_decides_the_grid_in_one_normal_form(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = (
        "fedbench run smoke --threads=1 -j2 -o /tmp/out --cache-dir /tmp/c --device cpu --no-cache --force "
        "--timeout 5 --fail-fast --data-root /data --seeds 3 --set scenario.rounds=2 -a idlg -D none "
        "--defense 'dp-gaussian[sigma=0.1]' -m mlp -d digits"
    )
    assert grid_run_words(text) == [
        "fedbench", "run", "smoke", "-d", "digits", "-m", "mlp", "-D", "none", "-D", "dp-gaussian[sigma=0.1]",
        "-a", "idlg", "--set", "scenario.rounds=2", "--seeds", "3",
    ]  # fmt: skip
    paths = f"fedbench run {tmp_path}/p/x.toml --preset-dir {tmp_path}/p/ --plugin {tmp_path}/q.py -j auto"
    assert grid_run_words(paths) == [
        "fedbench", "run", "p/x.toml", "--preset-dir", "p", "--plugin", "q.py"
    ]  # fmt: skip
    assert grid_run_words("fedbench run") == ["fedbench", "run", "quickstart"]
    assert grid_run_words("fedbench leaderboard build x") is None
    assert grid_run_words("") is None


def test_a_board_of_several_results_files_records_each_run_and_the_export_that_reads_them():
    sidecars = [
        {"command": "fedbench run smoke -o /tmp/a -D none"},
        {"command": "fedbench run smoke -a idlg"},
    ]
    command, missing = export_command(sidecars, "b", ["dataset=digits"], "all")
    assert missing is None and command == (
        "fedbench run smoke -D none -o results/b-1 && fedbench run smoke -a idlg -o results/b-2 && "
        "fedbench export results/b-1 results/b-2 --to leaderboard --board b --keep all --where dataset=digits"
    )
    assert export_command([*sidecars, {"command": ""}], "b", [], "last") == (None, 2)


def test_a_command_naming_an_absolute_path_is_refused(tmp_path):
    results = write_synthetic(tmp_path / "synthetic-20260102-030405.csv")
    dest = tmp_path / "boards"
    res = run(
        "export", results, "--to", "leaderboard", "--dest", dest, "--command", "fedbench run x -o /tmp/y"
    )
    assert res.exit_code == 2 and "absolute path /tmp/y" in res.output and "--command" in res.output
    assert not dest.exists()
    # results without a recorded `fedbench run` (the Python API's): a warning, and no local path
    res = ok("export", results, "--to", "leaderboard", "--dest", dest)
    assert "records no 'fedbench run' command" in res.output
    assert absolute_path(lb.load_board(dest / "synthetic")[0].command) is None


def test_absolute_path_finds_posix_and_windows_paths():
    assert (
        absolute_path("fedbench leaderboard build b --dir /work/main/leaderboards")
        == "/work/main/leaderboards"
    )
    assert absolute_path("fedbench run x --preset-dir=C:\\presets") == "C:\\presets"
    assert absolute_path("fedbench run x --preset-dir 'D:\\my presets'") == "D:\\my presets"
    assert absolute_path("fedbench run x --preset-dir presets -o results/x && fedbench export") is None


# ------------------------------------------------------------------------------- committed files

ABSOLUTE = re.compile(
    r"(?<![\w.~:/\\-])(?:/(?:work|tmp|home|root|Users|mnt|var|opt|private|scratch)\b|[A-Za-z]:\\)"
)


def test_no_committed_board_or_results_page_records_an_absolute_path():
    files = [
        p
        for pattern in (
            "leaderboards/**/*.json",
            "leaderboards/**/*.md",
            "leaderboards/**/*.csv",
            "docs/results/**/*",
        )
        for p in ROOT.glob(pattern)
        if p.is_file() and p.suffix in {".json", ".md", ".csv", ".txt"}
    ]
    assert len(files) > 100  # the six boards' entries and the results pages
    found = [
        f"{p.relative_to(ROOT)}:{n}: {m.group(0)}"
        for p in files
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if (m := ABSOLUTE.search(line))
    ]
    assert found == []


def test_each_committed_board_records_the_command_its_build_records():
    """So `fedbench leaderboard build --all` rebuilds them without --force, and their README says how."""
    for folder in sorted((ROOT / "leaderboards").glob("*/board.json")):
        board = json.loads(folder.read_text())
        (source,) = resolve_boards([board["preset"]], False)
        sliced = " --slice" if board.get("slice_of") else ""  # a committed slice, built from its preset
        assert board["command"] == rebuild_command(source) + sliced, folder
