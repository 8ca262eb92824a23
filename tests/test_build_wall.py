"""The build wall-time ledger (`fedbench.reporting.build_wall`): one measurement per build, summed over
the invocations of an interrupted and resumed build; a re-export from the cache measures nothing."""

from __future__ import annotations

import json

from fedbench.reporting.board_schema import BuildWall, parse
from fedbench.reporting.build_wall import Invocation, describe, fingerprint, index_cell, ledger_path, record


def call(seconds: float, computed: int, finished: bool, runs: int = 10) -> Invocation:
    return Invocation(seconds, computed, runs, n_jobs="2", threads="1", finished=finished)


def test_one_build_from_an_empty_cache(tmp_path):
    path = ledger_path(tmp_path, "b")
    wall = record(path, "g", call(60.0, 10, True))
    assert wall is not None and wall["from_empty"] and wall["seconds"] == 60.0
    assert (wall["runs"], wall["computed"], wall["invocations"]) == (10, 10, 1)
    parse(BuildWall, wall, "wall")  # what board.json validates
    assert "1 min on" in describe(wall) and "from an empty cache" in describe(wall)


def test_an_interrupted_build_adds_its_seconds_when_it_resumes(tmp_path):
    path = ledger_path(tmp_path, "b")
    assert record(path, "g", call(3000.0, 6, False)) is None  # interrupted: nothing written to a board
    wall = record(path, "g", call(4200.0, 4, True))
    assert wall["seconds"] == 7200.0 and wall["computed"] == 10 and wall["from_empty"]
    assert wall["invocations"] == 2
    text = describe(wall)
    assert "2.0 h" in text and "in 2 invocations (resumed)" in text and "--n-jobs 2 --threads 1" in text


def test_a_build_resumed_from_runs_of_before_is_not_from_empty(tmp_path):
    wall = record(ledger_path(tmp_path, "b"), "g", call(100.0, 3, True))
    assert not wall["from_empty"] and wall["computed"] == 3
    assert "3 of 10 runs computed, the others read from the cache" in describe(wall)


def test_a_rebuild_served_from_the_cache_measures_nothing(tmp_path):
    path = ledger_path(tmp_path, "b")
    first = record(path, "g", call(60.0, 10, True))
    before = path.read_text()
    assert record(path, "g", call(2.0, 0, True)) is None  # the board keeps `first`
    assert path.read_text() == before and first is not None


def test_a_new_grid_or_a_closed_build_starts_a_new_measurement(tmp_path):
    path = ledger_path(tmp_path, "b")
    record(path, "g", call(50.0, 5, False))
    wall = record(path, "other", call(70.0, 10, True))  # the preset changed in between
    assert wall["seconds"] == 70.0 and wall["invocations"] == 1
    again = record(path, "other", call(30.0, 10, True))  # after a closed build: a new one (--force)
    assert again["seconds"] == 30.0 and again["invocations"] == 1


def test_a_damaged_ledger_never_stops_a_build(tmp_path):
    path = ledger_path(tmp_path, "b")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    wall = record(path, "g", call(10.0, 10, True))
    assert wall["from_empty"] and json.loads(path.read_text())["closed"]


def test_without_a_cache_the_invocation_is_the_build():
    assert ledger_path(None, "b") is None
    wall = record(None, "g", call(10.0, 10, True))
    assert wall["from_empty"] and wall["invocations"] == 1


def test_fingerprint_names_the_grid_by_its_run_ids():
    assert fingerprint(["a", "b"]) == fingerprint(["b", "a"]) != fingerprint(["a", "c"])


def test_the_index_states_a_wall_time_only_when_the_build_ran_from_empty():
    wall = {"seconds": 2820.0, "runs": 38, "computed": 38, "from_empty": True, "invocations": 1}
    wall |= {"n_jobs": "2", "threads": "1", "cores": 2, "date": "2026-11-28"}
    assert index_cell(wall, 6000.0) == "47 min"
    assert index_cell({**wall, "seconds": 7300.0}, None) == "2.0 h"
    resumed = {**wall, "computed": 10, "from_empty": False}
    assert index_cell(resumed, 34058.0) == "(9.5 h CPU)"
    assert index_cell(None, 540.0) == "(9 min CPU)"
    assert index_cell(None, None) == "—"
