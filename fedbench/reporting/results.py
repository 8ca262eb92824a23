"""The results schema: one row per run, read/write/merge, and the newest-file lookup.

Column groups, in order: identity, scenario, `p_<kind>_<param>` parameters, privacy metrics,
utility, epsilon, cost, status, provenance. A results file is a CSV plus a JSON sidecar (same stem)
holding the expanded grid, the environment and per-round / per-image detail, and the catalogue
entries of any plugin family among its metric columns (`metric_families`, see
`fedbench.metrics.catalogue.describe_families`), so the file renders without the plugin. Files are written
atomically (temporary file, then rename) and named `<preset>-<UTC timestamp>.csv` so the newest is
easy to find; numbers stay numbers.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedbench.errors import FedbenchError
from fedbench.metrics.catalogue import METRICS, describe_families

IDENTITY = [
    "run_id",
    "utility_id",
    "preset",
    "dataset",
    "model",
    "defense",
    "attack",
    "defense_name",
    "attack_name",
    "seed",
]
UTILITY = ["test_acc", "test_loss"]
EPSILON = ["epsilon", "delta", "dp_level", "accountant"]
COST = ["seconds", "utility_seconds", "attack_seconds", "peak_rss_mb"]
STATUS = ["status", "from_cache", "reason"]
PROVENANCE = ["fedbench_version", "torch_version", "device", "created_at"]
SCENARIO_PREFIX = "sc_"
METRIC_FAMILIES_KEY = "metric_families"
_FILE_MODE = 0o644


def order_columns(columns: list[str]) -> list[str]:
    """Schema order: identity, scenario, params, metrics, utility, epsilon, cost, status, provenance."""
    fixed = set(IDENTITY + UTILITY + EPSILON + COST + STATUS + PROVENANCE)
    scenario = sorted(c for c in columns if c.startswith(SCENARIO_PREFIX))
    params = sorted(c for c in columns if c.startswith("p_"))
    metrics = [c for c in columns if c not in fixed and not c.startswith((SCENARIO_PREFIX, "p_"))]
    tail = UTILITY + EPSILON + COST + STATUS + PROVENANCE
    return (
        [c for c in IDENTITY if c in columns]
        + scenario
        + params
        + metrics
        + [c for c in tail if c in columns]
    )


def _finished_temp(path: Path, text: str) -> str:
    """A complete temporary file holding `text`, beside `path` (same file system), shareable mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, _FILE_MODE)  # mkstemp makes it 0600; results are meant to be shared
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def atomic_write(path: Path, text: str) -> None:
    """Replace `path` with `text` all at once: a reader sees the old file or the new, never a part."""
    tmp = _finished_temp(path, text)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _atomic_create(path: Path, text: str) -> Path:
    """Write `text` to `path`, or to `<stem>-2<suffix>`, ... when that name is taken; never overwrites.

    The file is complete before its name appears (hard link of a finished temporary file, which fails
    when the name exists), so two processes finishing in the same second keep both files.
    """
    tmp = _finished_temp(path, text)
    try:
        for n in range(1, 1000):
            target = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
            try:
                os.link(tmp, target)
                return target
            except FileExistsError:
                continue
            except OSError:  # no hard links on this file system: reserve the name, then rename over it
                try:
                    os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                except FileExistsError:
                    continue
                os.replace(tmp, target)
                return target
        raise FedbenchError(f"{path.parent}: too many results files named {path.stem}-N; pass another -o")
    finally:
        Path(tmp).unlink(missing_ok=True)


def results_path(out_dir: str | Path, preset: str, when: datetime | None = None) -> Path:
    when = when or datetime.now(UTC)
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in preset) or "results"
    return Path(out_dir) / f"{safe}-{when.strftime('%Y%m%d-%H%M%S')}.csv"


def write_results(rows: list[dict[str, Any]], sidecar: dict[str, Any], path: Path) -> Path:
    """Write the CSV and its JSON sidecar atomically; returns the CSV path.

    When `path` exists (another run finished in the same second) the CSV gets a `-2`, `-3`... suffix;
    the sidecar is written after the CSV, so a CSV with a sidecar is always complete.
    A folder that cannot hold them (a file in its place, a read-only or full file system) is a one-line
    `FolderError` naming it; a CSV whose sidecar could not be written is removed, so no half-written
    results are left behind.
    """
    import pandas as pd

    from fedbench.execution.paths import folder_error, writable_dir

    frame = pd.DataFrame(rows)
    frame = frame[order_columns(list(frame.columns))]
    described = describe_families(list(frame.columns))
    if described:
        sidecar = {**sidecar, METRIC_FAMILIES_KEY: described}
    sidecar_text = json.dumps(sidecar, indent=1, sort_keys=True, default=_json_default)
    writable_dir(path.parent, "results folder", "-o")
    written: Path | None = None
    try:
        written = _atomic_create(path, frame.to_csv(index=False))
        atomic_write(written.with_suffix(".json"), sidecar_text)
    except BaseException as exc:
        if written is not None:
            written.unlink(missing_ok=True)  # a CSV without its sidecar would be half a result
        if isinstance(exc, OSError):
            raise folder_error(path.parent, exc, "results folder", _UNWRITTEN) from None
        raise
    return written


_UNWRITTEN = "no results were written (finished runs are cached): pass a writable folder with -o, run again"


def _json_default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def newest_results(out_dir: str | Path) -> Path:
    """The most recently written results CSV in `out_dir`."""
    out = Path(out_dir)
    files = (
        sorted(
            (p for p in out.glob("*.csv") if p.with_suffix(".json").exists()), key=lambda p: p.stat().st_mtime
        )
        if out.is_dir()
        else []
    )
    if not files:
        raise FedbenchError(f"no results in {out}; run 'fedbench run' first or pass a results file")
    return files[-1]


def read_results(path: str | Path):
    """Load a results CSV as a DataFrame, checking it is a fedbench results file."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FedbenchError(f"results file {path} does not exist; pass a CSV written by 'fedbench run'")
    try:
        frame = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise FedbenchError(
            f"{path}: not a readable CSV ({type(exc).__name__}); "
            "pass a results file written by 'fedbench run'"
        ) from None
    missing = [c for c in ("run_id", "defense", "status") if c not in frame.columns]
    if missing:
        raise FedbenchError(f"{path}: not a fedbench results file (missing columns: {', '.join(missing)})")
    check_sidecar(path)
    return _check_utility(_check_numbers(frame, path), path)


def _check_utility(frame, path: Path):
    """Every run that finished (`status` ok) trained a model, so it has a utility (`test_acc`): a file
    whose finished runs have none was cut down or hand-made, and would render as an empty table."""
    ok = frame["status"].astype(str) == "ok"
    if not ok.any():
        return frame
    if "test_acc" not in frame.columns:
        raise FedbenchError(
            f"{path}: no utility column 'test_acc' (the test accuracy every finished run has); "
            "the file was cut down: pass the results file 'fedbench run' wrote"
        )
    if frame.loc[ok, "test_acc"].isna().all():
        raise FedbenchError(
            f"{path}: column 'test_acc' is blank in all {int(ok.sum())} finished (ok) runs; "
            "the file was cut down: pass the results file 'fedbench run' wrote"
        )
    return frame


# What each part of a sidecar that readers index into must be: (Python type, how it reads in JSON).
_SIDECAR_SHAPE: dict[str, tuple[type, str]] = {
    "runs": (dict, "an object"),
    "history": (dict, "an object"),
    "per_image": (dict, "an object"),
    "board": (dict, "an object"),
    METRIC_FAMILIES_KEY: (dict, "an object"),
    "reported": (list, "a list of objects"),
}
_JSON_TYPE = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}


def check_sidecar(csv_path: str | Path) -> dict[str, Any] | None:
    """The JSON sidecar beside `csv_path` (None when there is none), checked to be what `fedbench run`
    writes: an object whose parts (`reported`, `board`, `per_image`, ...) have the right shape.

    A hand-edited or damaged sidecar (a list, `"reported": 5`) would otherwise surface as a traceback deep
    in `compare`; here it is one line naming the file, the part and the fix.
    """
    side = Path(csv_path).with_suffix(".json")
    if not side.is_file():
        return None
    fix = f"rewrite it with 'fedbench run', or delete it and pass the CSV {Path(csv_path).name} itself"
    try:
        data = json.loads(side.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise FedbenchError(f"{side}: sidecar is not valid JSON; rewrite it with 'fedbench run'") from None
    except OSError as exc:
        raise FedbenchError(f"{side}: cannot read the sidecar ({exc.strerror}); {fix}") from None
    if not isinstance(data, dict):
        got = _JSON_TYPE.get(type(data), "a " + type(data).__name__)
        raise FedbenchError(f"{side}: the sidecar holds {got}, not an object; {fix}")
    for key, (kind, wanted) in _SIDECAR_SHAPE.items():
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, kind):
            got = _JSON_TYPE.get(type(value), type(value).__name__)
            raise FedbenchError(f"{side}: sidecar '{key}' must be {wanted}, got {got}; {fix}")
    for i, row in enumerate(data.get("reported") or []):
        if not isinstance(row, dict):
            raise FedbenchError(
                f"{side}: sidecar 'reported' #{i + 1} must be an object (a [[reported]] table), "
                f"got {json.dumps(row)[:40]}; {fix}"
            )
    return data


def _check_numbers(frame, path: Path):
    """Numeric columns (utility, epsilon, cost, every catalogued metric) must hold numbers or blanks."""
    import pandas as pd

    numeric = {*UTILITY, *COST, "epsilon", "delta", "seed", *METRICS}
    flags = {"True": 1.0, "False": 0.0, True: 1.0, False: 0.0}  # a flag beside shares in one column
    for col in [c for c in frame.columns if c in numeric]:
        # a victim batch's flag is a bool where its victims agree and their share where they differ
        # (`scoring._joined_column`), so a CSV column of a flag mixes "True"/"False" with numbers
        column = frame[col]
        if not pd.api.types.is_numeric_dtype(column):  # only a text column can hold "True"/"False"
            column = column.map(lambda v: flags.get(v, v) if isinstance(v, str | bool) else v)
        values = pd.to_numeric(column, errors="coerce")
        bad = frame[col].notna() & values.isna()
        if bad.any():
            first = frame[col][bad].iloc[0]
            raise FedbenchError(
                f"{path}: column '{col}' holds a non-number ({str(first)[:40]!r}); "
                "the file is damaged: rewrite it with 'fedbench run'"
            )
        frame[col] = values
    return frame


def find_run(run_id: str, out_dir: str | Path) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """(row, key, csv path) of a run by id (or a unique prefix of >= 6 digits), newest file first."""
    import pandas as pd

    if len(run_id) < 6:
        raise FedbenchError(f"run id '{run_id}' is too short; give at least 6 hex digits")
    out = Path(out_dir)
    files = sorted(out.glob("*.csv"), key=lambda p: p.stat().st_mtime, reverse=True) if out.is_dir() else []
    for path in files:
        side = path.with_suffix(".json")
        if not side.exists():
            continue
        try:
            runs = json.loads(side.read_text()).get("runs", {})
        except (json.JSONDecodeError, OSError):
            continue
        matches = [r for r in runs if r.startswith(run_id)]
        if len(matches) > 1:
            raise FedbenchError(f"run id '{run_id}' is ambiguous in {path}; give more digits")
        if matches:
            frame = pd.read_csv(path)
            rows = frame[frame["run_id"] == matches[0]].to_dict("records")
            return (rows[0] if rows else {"run_id": matches[0]}), runs[matches[0]], path
    raise FedbenchError(f"run '{run_id}' not found in the results under {out}; pass --results DIR")
