"""`RunRecord`: what one run produces, typed, from the runner to the results file and the progress line.

A record is the run's CSV row (`columns`: identity, scenario, parameters, utility, epsilon, leakage,
status, cost, provenance) plus what does not belong in a CSV cell: the per-round utility history
(written once per utility group to the JSON sidecar), the per-image leakage values (the sidecar; boards
take the worst case over attacks per input) and warning lines to show the user (a recomputed cache
entry, a metric that could not be computed). Nothing travels in the row under a private key.

A record reads like its row (`record["psnr"]`, `record.get("reason")`, `"epsilon" in record`): the columns
are what a caller of `execute` most often wants, and code that read the row before records existed reads
it unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fedbench.execution.provenance import fedbench_version, torch_version
from fedbench.reporting.results import SCENARIO_PREFIX
from fedbench.spec.params import params_to_dict
from fedbench.spec.run import RunSpec, canonical_json

STOP_STATUSES = ("failed", "timeout")  # statuses that --fail-fast stops at and that exit 1


@dataclass
class RunRecord(Mapping[str, Any]):
    """One run's results: its CSV columns and its sidecar detail; as a mapping, its columns."""

    columns: dict[str, Any]
    history: list[dict[str, Any]] | None = None  # per-round utility, keyed by utility_id in the sidecar
    per_image: dict[str, list[float]] | None = None  # per-image leakage, keyed by run_id in the sidecar
    warnings: list[str] = field(default_factory=list)  # the run's notes, then its cache's, in order

    def __getitem__(self, column: str) -> Any:
        return self.columns[column]

    def __iter__(self) -> Iterator[str]:
        return iter(self.columns)

    def __len__(self) -> int:
        return len(self.columns)

    @property
    def status(self) -> str:
        """ok | skipped | failed | timeout."""
        return self.columns["status"]

    @property
    def progress(self) -> str:
        """The status a progress line shows: a finished run is `done` or `cached`."""
        if self.status == "ok":
            return "cached" if self.columns.get("from_cache") else "done"
        return self.status

    @property
    def run_id(self) -> str:
        return self.columns["run_id"]

    @property
    def utility_id(self) -> str:
        return self.columns["utility_id"]


def base_columns(spec: RunSpec) -> dict[str, Any]:
    """The columns every record of `spec` has, whatever its outcome: identity, scenario, parameters,
    provenance."""
    row: dict[str, Any] = {
        "run_id": spec.run_id,
        "utility_id": spec.utility_id,
        "preset": spec.preset,
        "dataset": spec.dataset.label,
        "model": spec.model.label,
        "defense": spec.defense.label,
        "attack": spec.attack.label if spec.attack else "",
        "defense_name": spec.defense.name,
        "attack_name": spec.attack.name if spec.attack else "",
        "seed": spec.seed,
    }
    for key, value in params_to_dict(spec.scenario).items():
        row[SCENARIO_PREFIX + key] = value
    if spec.victims:  # a victim batch: the clients its attack covered, in victim order ("[0,1,2]")
        row[SCENARIO_PREFIX + "victim"] = canonical_json(list(spec.victims))
    for comp in (spec.dataset, spec.model, spec.defense, spec.attack):
        if comp is None:
            continue
        for key, value in comp.params_dict.items():
            row[f"p_{comp.kind}_{key}"] = canonical_json(value) if isinstance(value, list) else value
    row.update(
        {
            "fedbench_version": fedbench_version(),
            "torch_version": torch_version(),
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
    )
    return row


def failed_record(spec: RunSpec, reason: str, seconds: float = float("nan")) -> RunRecord:
    """The record of a run that did not finish (its worker died, the scheduler failed to run it)."""
    columns = base_columns(spec)
    columns.update(status="failed", from_cache=False, reason=reason[:500], seconds=seconds)
    return RunRecord(columns)


def skipped_record(spec: RunSpec, reason: str) -> RunRecord:
    """The record of a run that was not run, with the reason (the attack cascade's: nothing left to
    attack). It took no time and is not cached: the same grid decides the same again."""
    columns = base_columns(spec)
    columns.update(status="skipped", from_cache=False, reason=reason[:500], seconds=0.0)
    return RunRecord(columns)
