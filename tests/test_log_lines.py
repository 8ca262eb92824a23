"""Issue 20: a grid's progress as plain lines when stderr is not a terminal (CI, nohup, a log file)."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from fedbench import registry
from fedbench.cli import app
from fedbench.cli.progress import LogLines
from fedbench.execution.record import RunRecord, base_columns
from fedbench.execution.runner import RunEvent
from fedbench.spec.grid import Overrides, build_grid

runner = CliRunner()  # its stderr is not a terminal, as in a log
FAIL_PLUGIN = (
    "from fedbench.plugin import Defense\nfrom fedbench.registry import register_defense\n\n"
    "@register_defense('test-log-fail')\nclass Fail(Defense):\n    '''Always fails.'''\n\n"
    "    def update(self, delta, ctx):\n        raise RuntimeError('broken defense')\n"
)
TINY = [
    a
    for s in ("rounds=1", "clients=2", "local_steps=2", "batch_size=4", "train_size=40", "test_size=20")
    for a in ("--set", f"scenario.{s}")
]
LINE = re.compile(r"^\[(\d+)/(\d+)\] (done|failed|timeout) ")


@pytest.fixture
def fail_plugin(tmp_path):
    path = tmp_path / "log_fail_plugin.py"
    path.write_text(FAIL_PLUGIN)
    yield path
    if "test-log-fail" in registry.defenses:
        registry.defenses.unregister("test-log-fail")


def _run(tmp_path, plugin, *extra):
    args = ["run", "smoke", "--plugin", str(plugin), "-D", "dp-gaussian[sigma=[0.01,0.02,0.03,0.04,0.05]]"]
    args += ["-D", "test-log-fail", *TINY, "--threads", "1", "--device", "cpu", *extra]
    args += ["-o", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c")]
    return runner.invoke(app, args, catch_exceptions=False)


def test_a_log_gets_a_line_per_computed_run_and_one_for_the_cached(tmp_path, fail_plugin):
    first = _run(tmp_path, fail_plugin)
    assert first.exit_code == 1, first.output
    lines = [m for m in map(LINE.match, first.output.splitlines()) if m]
    assert sorted(int(m[1]) for m in lines) == [1, 2, 3, 4, 5, 6]  # every finished run, counted
    assert {int(m[2]) for m in lines} == {6}
    assert [m[3] for m in lines].count("done") == 5
    (failed,) = [line for line in first.output.splitlines() if LINE.match(line) and " failed " in line]
    assert "test-log-fail x - seed 0: RuntimeError: broken defense" in failed  # names the run and why
    assert re.search(r"\] done \d+\.\d s  dp-gaussian\[sigma=0\.01\] x - seed 0$", first.output, re.M)

    again = _run(tmp_path, fail_plugin)  # 5 runs cached, the failed one computed (and failing) again
    lines = [line for line in again.output.splitlines() if line.startswith("[")]
    assert [line for line in lines if LINE.match(line)] == [lines[0]] and "] failed " in lines[0]
    cached = [re.fullmatch(r"\[\d/6\] (\d) cached", line) for line in lines[1:]]
    assert all(cached) and sum(int(m[1]) for m in cached) == 5, again.output  # summed up, not one each
    assert lines[-1].startswith("[6/6] ") and len(lines) <= 3  # the rest at the end of the grid


def test_the_terminal_keeps_its_progress_bar(tmp_path, fail_plugin, monkeypatch):
    from fedbench.cli import running

    buffer = io.StringIO()
    monkeypatch.setattr(running, "err", Console(file=buffer, force_terminal=True, width=120, markup=False))
    res = _run(tmp_path, fail_plugin, "--fail-fast")
    assert res.exit_code == 1, res.output
    shown = buffer.getvalue()
    assert "failed=1" in shown and "broken defense" in shown  # the bar's status and the failure line
    assert not any(LINE.match(line) for line in shown.splitlines())


def _events(n: int, status: str = "cached"):
    specs = build_grid("smoke", Overrides(defenses=("none",))).specs
    record = RunRecord({**base_columns(specs[0]), "status": "ok", "from_cache": status == "cached"})
    record.columns.update(seconds=0.01, reason="")
    return [RunEvent(i + 1, n, specs[0], record) for i in range(n)], specs


def test_cached_runs_are_summed_up_at_most_every_few_seconds():
    console = Console(file=io.StringIO(), width=200)
    now = [0.0]
    events, specs = _events(1000)
    lines = LogLines(console, specs * 1000, every=5.0, clock=lambda: now[0])
    for event in events:  # 1000 cached runs, 10 ms each: 10 s
        now[0] += 0.01
        lines(event)
    lines.close()
    written = console.file.getvalue().splitlines()
    assert 2 <= len(written) <= 3, written
    assert sum(int(re.match(r"\[\d+/1000\] (\d+) cached$", line)[1]) for line in written) == 1000
    assert written[-1].startswith("[1000/1000] ")


def test_a_board_s_lines_are_prefixed_with_its_name():
    console = Console(file=io.StringIO(), width=200)
    events, specs = _events(2, "done")
    lines = LogLines(console, specs, prefix="my-board: ")
    for event in events:
        lines(event)
    lines.close()
    assert console.file.getvalue().splitlines() == [
        "my-board: [1/2] done 0.0 s  none x - seed 0",
        "my-board: [2/2] done 0.0 s  none x - seed 0",
    ]
