"""Property tests over every parser of user input: a malformed input is a one-line FedbenchError.

Parsers: component patterns (`name[k=v]`), `--set`, `--where`, preset files, results files and
leaderboard folders. Each property runs a few hundred generated inputs (derandomized, so CI sees the
same ones) and checks that the input is either accepted or rejected with a `FedbenchError` whose
message is one line; the CLI properties add: exit code 0 or 2, no traceback, nothing written.
"""

from __future__ import annotations

import json
import math
import shutil
import string
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fedbench import registry
from fedbench.cli import app
from fedbench.errors import FedbenchError
from fedbench.spec.grid import Overrides, build_grid
from fedbench.spec.patterns import parse_assignment, parse_pattern

runner = CliRunner()
LIB = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
CLI = settings(LIB, max_examples=40)
FEW = settings(LIB, max_examples=200)  # the slower parsers (file I/O + pandas / full grid expansion)
ROOT = Path(__file__).resolve().parents[1]


def _rejects_cleanly(call) -> object:
    """Run `call`; a FedbenchError must be one line. Returns the value or the error."""
    try:
        return call()
    except FedbenchError as exc:
        message = str(exc)
        assert message and "\n" not in message, repr(message)
        return exc


def _cli_ok_or_usage_error(args: list[str]) -> int:
    """Run a command: exit 0, or exit 2 with exactly one 'error:' line; never a traceback."""
    res = runner.invoke(app, args)
    assert res.exit_code in (0, 2), (args, res.exit_code, res.output, res.exception)
    assert "Traceback" not in res.output
    if res.exit_code == 2:
        errors = [line for line in res.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, res.output
    return res.exit_code


# ---------------------------------------------------------------------------------------- values

NASTY = "[]{}=,\"'.-_*? \t\\#\n"
words = st.text(alphabet=string.ascii_letters + string.digits + "-_.", min_size=0, max_size=12)
atoms = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False).map(repr),
    st.sampled_from(["true", "false", "nan", "inf", "-inf", "1e999", "0x10", '"s"', "'s'", "", "[]", "{}"]),
    words,
    st.text(alphabet=NASTY + "ab1", max_size=8),
)
values = st.recursive(
    atoms, lambda inner: st.lists(inner, max_size=4).map(lambda xs: f"[{','.join(xs)}]"), max_leaves=6
)


def _names(kind: str) -> list[str]:
    return sorted({c.name for c in registry.registry_for(kind).list()})


def _param_names(kind: str) -> list[str]:
    import dataclasses

    return sorted({f.name for c in registry.registry_for(kind).list() for f in dataclasses.fields(c.Params)})


@st.composite
def patterns(draw, kind: str = "defense") -> str:
    """Near-valid `name[k=v,...]` patterns, and arbitrary text."""
    if draw(st.integers(0, 3)) == 0:
        return draw(st.text(alphabet=NASTY + string.ascii_letters + string.digits + "é☃", max_size=30))
    name = draw(st.one_of(st.sampled_from(_names(kind)), words))
    if draw(st.booleans()):
        return name
    keys = st.one_of(st.sampled_from(_param_names(kind)), words)
    items = draw(st.lists(st.tuples(keys, values), max_size=3))
    body = ",".join(f"{k}={v}" for k, v in items)
    return draw(st.sampled_from([f"{name}[{body}]", f"{name}[{body}", f"{name}{body}]", f"{name}[[{body}]]"]))


@given(text=patterns())
@LIB
def test_defense_patterns(text):
    name_params = _rejects_cleanly(lambda: parse_pattern(text))
    if not isinstance(name_params, FedbenchError):
        assert isinstance(name_params[0], str) and isinstance(name_params[1], dict)
    _rejects_cleanly(lambda: build_grid("smoke", Overrides(defenses=(text,))))


@given(text=patterns("attack"))
@LIB
def test_attack_patterns(text):
    _rejects_cleanly(lambda: build_grid("smoke", Overrides(attacks=(text,), models=("lenet",))))


SCENARIO_KEYS = ["rounds", "clients", "lr", "batch_size", "partition", "alpha", "protocol", "observe"]


@st.composite
def assignments(draw) -> str:
    if draw(st.integers(0, 3)) == 0:
        return draw(st.text(alphabet=NASTY + string.ascii_letters + string.digits, max_size=30))
    section = draw(st.sampled_from(["scenario", "grid", "defense", "", "scenario.x"]))
    key = draw(st.one_of(st.sampled_from([*SCENARIO_KEYS, "seeds", "train_size", "victim"]), words))
    return f"{section}.{key}={draw(values)}" if section else f"{key}={draw(values)}"


@given(text=assignments())
@LIB
def test_set_overrides(text):
    _rejects_cleanly(lambda: parse_assignment(text))
    grid = _rejects_cleanly(lambda: build_grid("smoke", Overrides(sets=(text,))))
    if not isinstance(grid, FedbenchError):
        assert grid.specs


@pytest.fixture(scope="module")
def results_frame():
    return pd.DataFrame(
        {
            "run_id": ["a" * 16, "b" * 16],
            "dataset": ["digits", "mnist5k"],
            "defense": ["none", "dp-gaussian[sigma=0.1]"],
            "seed": [0, 1],
            "test_acc": [0.5, float("nan")],
            "status": ["ok", "failed"],
        }
    )


@st.composite
def wheres(draw) -> str:
    if draw(st.integers(0, 2)) == 0:
        return draw(st.text(alphabet=NASTY + "!<>~" + string.ascii_letters, max_size=25))
    col = draw(st.one_of(st.sampled_from(["dataset", "defense", "seed", "test_acc", "status"]), words))
    op = draw(st.sampled_from(["=", "!=", "==", "<", "", " = "]))
    return f"{col}{op}{draw(values)}"


@given(text=wheres())
@LIB
def test_where_filters(results_frame, text):
    from fedbench.reporting.tables import apply_where

    kept = _rejects_cleanly(lambda: apply_where(results_frame, [text]))
    if not isinstance(kept, FedbenchError):
        assert 1 <= len(kept) <= len(results_frame)


# ---------------------------------------------------------------------------------------- presets


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return (
            "nan"
            if math.isnan(value)
            else ("inf" if value > 0 else "-inf")
            if math.isinf(value)
            else repr(value)
        )
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"


toml_scalars = st.one_of(
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_subnormal=False),
    st.text(max_size=10),
    st.sampled_from(["digits", "mlp", "none", "dp-gaussian", "ig", "fedavg", "iid", "mnist5k", "smoke"]),
)
toml_values = st.recursive(
    toml_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(words, inner, max_size=3)),
    max_leaves=8,
)
grid_keys = st.sampled_from(["name", "description", "seeds", "extends", "paper", "board", "bogus"])
block_keys = st.sampled_from(["name", "params", "datasets", "models", "bogus"])


@st.composite
def preset_texts(draw) -> str:
    """Preset files: structured ones with random values, and byte-level mutations of smoke.toml."""
    if draw(st.booleans()):
        text = (ROOT / "registry" / "presets" / "smoke.toml").read_text()
        for _ in range(draw(st.integers(1, 4))):
            pos = draw(st.integers(0, len(text)))
            cut = draw(st.integers(0, 5))
            text = (
                text[:pos] + draw(st.text(alphabet=NASTY + "0123456789abcz", max_size=3)) + text[pos + cut :]
            )
        return text
    lines = ["[grid]"]
    for key, value in draw(st.dictionaries(grid_keys, toml_values, max_size=3)).items():
        lines.append(f"{key} = {_toml(value)}")
    lines.append("[scenario]")
    for key, value in draw(st.dictionaries(st.sampled_from(SCENARIO_KEYS), toml_values, max_size=3)).items():
        lines.append(f"{key} = {_toml(value)}")
    for kind in draw(st.lists(st.sampled_from(["dataset", "model", "defense", "attack", "reported", "x"]))):
        lines.append(f"[[{kind}]]")
        block = draw(st.dictionaries(block_keys, toml_values, max_size=3))
        block.setdefault("name", draw(st.sampled_from(["digits", "mlp", "none", "idlg", "nope"])))
        for key, value in block.items():
            lines.append(f"{key} = {_toml(value)}")
    return "\n".join(lines) + "\n"


@given(text=preset_texts())
@FEW
def test_preset_files(tmp_path, text):
    path = tmp_path / "fuzzed.toml"
    path.write_text(text, encoding="utf-8")
    _rejects_cleanly(lambda: build_grid(str(path)))


@given(text=preset_texts())
@CLI
def test_validate_and_dry_run_cli(tmp_path, text):
    path = tmp_path / "fuzzed.toml"
    path.write_text(text, encoding="utf-8")
    _cli_ok_or_usage_error(["validate", str(path)])
    out = tmp_path / "never"
    _cli_ok_or_usage_error(["run", str(path), "--dry-run", "-o", str(out), "--cache-dir", str(out / "c")])
    assert not out.exists()


@given(pattern=patterns(), where=assignments())
@CLI
def test_run_with_bad_options_writes_nothing(tmp_path, pattern, where):
    out = tmp_path / "never"
    args = ["run", "smoke", "-D", pattern, "--set", where, "-o", str(out), "--cache-dir", str(out / "c")]
    res = runner.invoke(app, [*args, "--device", "tpu"])  # a valid grid still stops at the device
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert len([line for line in res.output.splitlines() if line.startswith("error:")]) == 1, res.output
    assert not out.exists()


# ---------------------------------------------------------------------------------------- results


@pytest.fixture(scope="module")
def good_results(tmp_path_factory):
    """A real results file (smoke, one round) to mutate."""
    out = tmp_path_factory.mktemp("results")
    res = runner.invoke(app, ["run", "smoke", "--set", "scenario.rounds=1", "--threads", "1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return next(out.glob("*.csv"))


cells = st.one_of(
    st.just(""),
    st.integers(-5, 5).map(str),
    st.floats(allow_subnormal=False).map(repr),
    st.sampled_from(["ok", "failed", "none", "nan", "inf", '"a,b"', '"', "dp-gaussian[sigma=0.1]", "NA"]),
    st.text(alphabet=NASTY + "ab\x00", max_size=5),
)


@st.composite
def results_texts(draw, good: str) -> str:
    lines = good.splitlines()
    choice = draw(st.integers(0, 3))
    if choice == 0:  # a mutated cell
        rows = [line.split(",") for line in lines]
        for _ in range(draw(st.integers(1, 6))):
            r = draw(st.integers(1, len(rows) - 1))
            c = draw(st.integers(0, len(rows[r]) - 1))
            rows[r][c] = draw(cells)
        return "\n".join(",".join(r) for r in rows) + "\n"
    if choice == 1:  # a mutated header
        header = lines[0].split(",")
        for _ in range(draw(st.integers(1, 3))):
            header[draw(st.integers(0, len(header) - 1))] = draw(st.one_of(words, st.just("run_id")))
        return "\n".join([",".join(header), *lines[1:]]) + "\n"
    if choice == 2:  # truncated anywhere
        return good[: draw(st.integers(0, len(good)))]
    cols = draw(
        st.lists(st.one_of(st.sampled_from(["run_id", "defense", "status", "test_acc", "psnr"]), words))
    )
    body = draw(st.lists(st.lists(cells, min_size=len(cols), max_size=len(cols)), max_size=3))
    return "\n".join(",".join(r) for r in [cols, *body]) + "\n"


@given(data=st.data())
@FEW
def test_results_files(tmp_path, good_results, data):
    """The results reader; rendering what it accepts is the CLI property below."""
    from fedbench.reporting.tables import load_results

    text = data.draw(results_texts(good_results.read_text()))
    path = tmp_path / "r.csv"
    path.write_text(text, encoding="utf-8")
    shutil.copy(good_results.with_suffix(".json"), path.with_suffix(".json"))
    _rejects_cleanly(lambda: load_results([path]))


@given(data=st.data())
@CLI
def test_compare_and_export_cli_on_bad_results(tmp_path, good_results, data):
    text = data.draw(results_texts(good_results.read_text()))
    path = tmp_path / "r.csv"
    path.write_text(text, encoding="utf-8")
    side = good_results.with_suffix(".json").read_text()
    if data.draw(st.booleans()):
        side = side[: data.draw(st.integers(0, len(side)))]
    path.with_suffix(".json").write_text(side, encoding="utf-8")
    _cli_ok_or_usage_error(["compare", str(path)])
    boards = tmp_path / "boards"
    if boards.exists():
        shutil.rmtree(boards)
    if _cli_ok_or_usage_error(["export", str(path), "--to", "leaderboard", "--dest", str(boards)]) == 2:
        assert not boards.exists()


# ------------------------------------------------------------------------------------ leaderboards

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-3, 10**6),
        st.floats(allow_subnormal=False),
        st.text(max_size=8),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(words, inner, max_size=3)),
    max_leaves=6,
)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


def _mutate(obj, path, value, delete):
    if not path:
        return value
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    if delete and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return obj


@pytest.fixture(scope="module")
def board_copy(tmp_path_factory):
    """A copy of a real board to mutate (each example restores the file it changed): a version 2 board
    with per-input tables, the smallest committed one (the FedSGD board is 5x its size, which made
    these two properties the slowest tests of the suite without finding more)."""
    root = tmp_path_factory.mktemp("boards")
    name = "leakage-example-mnist5k-mlp"
    shutil.copytree(ROOT / "leaderboards" / name, root / name)
    return root / name


@contextmanager
def _mutated_board_file(folder: Path, data) -> Iterator[None]:
    """Replace values/keys of board.json or one entry with generated JSON, or truncate it; restore after."""
    files = [folder / "board.json", *sorted((folder / "entries").glob("*.json"))]
    target = data.draw(st.sampled_from(files))
    original = target.read_text()
    obj = json.loads(original)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(list(_paths(obj))))
        obj = _mutate(obj, path, data.draw(json_values), data.draw(st.booleans()))
    text = json.dumps(obj)
    if data.draw(st.integers(0, 5)) == 0:
        text = text[: data.draw(st.integers(0, len(text)))]
    target.write_text(text, encoding="utf-8")
    try:
        yield
    finally:
        target.write_text(original, encoding="utf-8")


@given(data=st.data())
@LIB
def test_leaderboard_files(board_copy, data):
    """Entries and board.json are validated against the schema before anything renders them."""
    from fedbench.reporting import leaderboard as lb

    def render():
        board, entries = lb.load_board(board_copy)
        lb.render_readme(board, entries)
        lb.render_csv(board, entries)
        lb.board_pivot(board, entries, compact=True)

    with _mutated_board_file(board_copy, data):
        _rejects_cleanly(render)


@given(data=st.data())
@CLI
def test_leaderboard_render_cli_writes_nothing_on_bad_files(board_copy, data):
    before = {p: p.read_bytes() for p in board_copy.parent.rglob("*") if p.is_file()}
    with _mutated_board_file(board_copy, data):
        changed = {p for p in board_copy.parent.rglob("*") if p.is_file() and p.read_bytes() != before.get(p)}
        if _cli_ok_or_usage_error(["leaderboard", "render", "--dir", str(board_copy.parent)]) == 2:
            after = {
                p for p in board_copy.parent.rglob("*") if p.is_file() and p.read_bytes() != before.get(p)
            }
            assert after == changed  # only the file the test damaged differs: nothing half-rendered
    for path in board_copy.parent.rglob("*"):  # a successful render may rewrite; start the next clean
        if path.is_file() and path in before:
            path.write_bytes(before[path])


@pytest.mark.parametrize(
    "args",
    [
        ["--seeds", "1000000000"],
        ["--set", "grid.seeds=1000000000"],
        ["--set", "scenario.rounds=[]"],
        ["-D", f"dp-gaussian[sigma=[{','.join(['0.1'] * 400)}],clip=[{','.join(['1'] * 400)}]]"],
    ],
)
def test_huge_or_empty_grids_are_refused_before_expansion(tmp_path, args):
    """A typo that would expand to millions of runs (or to none) is a usage error, not a hang."""
    res = runner.invoke(app, ["run", "smoke", *args, "-o", str(tmp_path / "o")])
    assert res.exit_code == 2 and ("more than 100000" in res.output or "empty list" in res.output), res.output
    assert not (tmp_path / "o").exists()
