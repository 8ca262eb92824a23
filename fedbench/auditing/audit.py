"""The one-run audit of one board row: (scenario, dataset, model, defense, seed) -> `AuditResult`.

What it runs: the row's FL training once, with m canaries each included by a fair coin
(`fedbench.auditing.training`), then the Steinke-Nasr-Jagielski bound on the canaries' black-box
scores (`fedbench.auditing.bound`). What it compares with: the row's formal epsilon, from the
defense's own accountant exactly as a run's row gets it (`fedbench.execution.runner._accounting`),
for the training the audit ran (the row's records plus the included canaries).

Caching: the canaries' scores are an artifact of the run cache (`fedbench.plugin.artifact`, kind
`one-run-audit`), keyed by the row's training key (`RunSpec.utility_key`: dataset, model, defense with
their versions, scenario, seed), the canary settings and the code digests of the row's plugins and of
the engine (`code_digests`); the store also stamps the digest of this package. The bound and the
accounting are computed outside the cache, like a run's metrics.

Reading the number: a lower bound above the formal epsilon at 95 % confidence means the defense's
implementation or its accounting is wrong (or a 5 % event happened). A lower bound far below the
formal epsilon is expected and proves nothing: a black-box audit of one run sees only the final
model's losses, and the paper's own black-box audits of DP-SGD are far from tight (docs/auditing.md).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from fedbench.auditing.bound import GuessOutcome, search_guesses

#: bump when the canaries, the training or the scores change for the same inputs
AUDIT_VERSION = "1"
#: the delta the bound is taken at when the row has no formal guarantee
DEFAULT_DELTA = 1e-5
METHOD = "one-run audit (Steinke, Nasr & Jagielski, NeurIPS 2023), black-box"


@dataclass(frozen=True)
class AuditConfig:
    """How to audit: `canaries` (m), their `kind` (`fedbench.auditing.canaries`), the `confidence`
    1 - beta, and optionally one fixed guessing rule (`k_plus`, `k_minus`; both None: the default
    search with its Bonferroni correction)."""

    canaries: int = 1000
    kind: str = "mislabeled"
    confidence: float = 0.95
    k_plus: int | None = None
    k_minus: int | None = None

    def check(self) -> None:
        from fedbench.errors import FedbenchError

        if not 0 < self.confidence < 1:
            raise FedbenchError(f"--confidence {self.confidence}: must be in (0, 1), e.g. 0.95")
        if (self.k_plus is None) != (self.k_minus is None):
            raise FedbenchError("--k-plus and --k-minus go together (or neither: search and correct)")
        if self.k_plus is not None and self.k_minus is not None:
            if self.k_plus < 0 or self.k_minus < 0 or not 0 < self.k_plus + self.k_minus <= self.canaries:
                raise FedbenchError(
                    f"--k-plus {self.k_plus} --k-minus {self.k_minus}: both >= 0, 0 < sum <= "
                    f"--canaries ({self.canaries})"
                )


@dataclass(frozen=True)
class AuditResult:
    """One row's audit. `eps_lower`: the lower bound at `confidence` and `delta`; `formal_eps`: the
    defense's epsilon for the audited training (None: no formal guarantee); `guesses` and `correct`:
    of the chosen rule (`k_plus` "in", `k_minus` "out"), out of `m` canaries of which `included` were
    trained on; `tests`: the number of rules tried (beta was divided by it)."""

    eps_lower: float
    confidence: float
    delta: float
    method: str
    m: int
    k_plus: int
    k_minus: int
    guesses: int
    correct: int
    tests: int
    included: int
    formal_eps: float | None
    formal_delta: float | None
    dp_level: str | None
    canary_kind: str
    test_acc: float
    row: str

    @property
    def violation(self) -> bool:
        """Whether the bound exceeds the formal epsilon (the claim is refuted at `confidence`)."""
        return self.formal_eps is not None and self.eps_lower > self.formal_eps

    @property
    def method_line(self) -> str:
        """The method as a row states it."""
        return (
            f"{METHOD}, m={self.m}, k+={self.k_plus}, k-={self.k_minus}, correct={self.correct}/"
            f"{self.guesses}, {self.tests} rule{'s' if self.tests != 1 else ''} tried (Bonferroni), "
            f"{self.canary_kind} canaries"
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"violation": self.violation, "method_line": self.method_line}


def audit_spec(
    spec: Any, config: AuditConfig = AuditConfig(), cache: Any = None, ctx: Any = None
) -> AuditResult:
    """Audit the row of `spec` (its attack is ignored): train once with canaries (cached in `cache`, a
    `RunCache`, when given), bound epsilon from the canaries' scores, and get the row's formal epsilon."""
    from fedbench.execution.runner import Components, Job, RunContext, _accounting, resolve_device
    from fedbench.plugin import artifact, using_artifacts

    ctx = ctx or RunContext()
    preflight(spec, config, ctx)
    spec = dataclasses.replace(spec, attack=None, victims=())
    job = Job(spec, ctx, Components.of(spec))
    bundle = job.bundle()
    key = _key(spec, config)

    def compute() -> dict[str, Any]:
        return _train(spec, job.parts, bundle, config, resolve_device(ctx.device))

    with using_artifacts(cache.artifacts if cache is not None else None):
        run = artifact("one-run-audit", key, compute)
    guarantee = _accounting(job, {"n_train": run["n_train"]})
    acc = guarantee[0] if guarantee else None
    formal = float(acc["epsilon"]) if acc else None
    delta = float(acc["delta"]) if acc else DEFAULT_DELTA
    outcome = _bound(run["scores"], run["included"], delta, config)
    return AuditResult(
        eps_lower=outcome.eps_lower,
        confidence=config.confidence,
        delta=delta,
        method=METHOD,
        m=len(run["scores"]),
        k_plus=outcome.k_plus,
        k_minus=outcome.k_minus,
        guesses=outcome.guesses,
        correct=outcome.correct,
        tests=outcome.tests,
        included=int(run["included"].sum()),
        formal_eps=formal,
        formal_delta=float(acc["delta"]) if acc else None,
        dp_level=str(acc["level"]) if acc else None,
        canary_kind=config.kind,
        test_acc=float(run["test_acc"]),
        row=spec.describe().replace(" x - ", " "),
    )


def preflight(spec: Any, config: AuditConfig = AuditConfig(), ctx: Any = None) -> None:
    """Fail before any training when `spec`'s row cannot be audited with `config` (a FedbenchError naming
    the fix): bad settings, a plugin that does not apply, a defense that reserves records, too few
    records for the canaries. Loads the row's dataset (memoised per process)."""
    from fedbench.auditing.canaries import make_canaries
    from fedbench.errors import FedbenchError
    from fedbench.execution.runner import Components, Job, RunContext
    from fedbench.spec.run import training_scenario

    config.check()
    spec = dataclasses.replace(spec, attack=None, victims=())
    job = Job(spec, ctx or RunContext(), Components.of(spec))
    reason = job.parts.skip_reason(spec.scenario)
    if reason:
        raise FedbenchError(f"audit: {spec.describe()} does not apply: {reason}")
    if job.parts.defense.implements("reserve"):
        raise FedbenchError(
            f"audit: defense '{job.parts.defense.name}' sets training records aside for the server; "
            "the one-run audit does not support it"
        )
    bundle = job.bundle()
    scenario = training_scenario(spec.scenario)
    n_base = min(scenario.train_size or len(bundle.y_train), len(bundle.y_train))
    make_canaries(bundle, n_base, config.canaries, config.kind, scenario.clients, spec.seed)


def _key(spec: Any, config: AuditConfig) -> str:
    """Everything the canaries' scores depend on (module docstring); not the bound's settings."""
    from fedbench.execution.sources import code_digests
    from fedbench.spec.run import canonical_json

    return canonical_json(
        {
            "audit": AUDIT_VERSION,
            "run": spec.utility_key(),
            "canaries": {"m": config.canaries, "kind": config.kind},
            "code": code_digests(spec, attack=False),
        }
    )


def _train(spec: Any, parts: Any, bundle: Any, config: AuditConfig, device: str) -> dict[str, Any]:
    from fedbench.auditing.training import train_with_canaries
    from fedbench.fl.simulation import fast_float_mode

    start = time.perf_counter()
    fast_float_mode()
    run = train_with_canaries(spec, parts, bundle, config.canaries, config.kind, device)
    return {
        "scores": run.scores,
        "included": run.included,
        "n_train": run.n_train,
        "test_acc": run.test_acc,
        "seconds": time.perf_counter() - start,
    }


def _bound(scores: Any, included: Any, delta: float, config: AuditConfig) -> GuessOutcome:
    beta = 1 - config.confidence
    choices = None if config.k_plus is None else ((config.k_plus, int(config.k_minus or 0)),)
    return search_guesses(scores, included, delta, beta, choices)
