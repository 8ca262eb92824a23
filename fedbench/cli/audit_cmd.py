"""`fedbench audit`: an empirical epsilon lower bound for each row of a grid, by one training run with
canaries (Steinke, Nasr & Jagielski, NeurIPS 2023), beside the row's formal epsilon."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from fedbench.cli._common import (
    CacheDirOption,
    DataRootOption,
    PluginOption,
    ThreadsOption,
    cache_dir_option,
    data_root_option,
    err,
    handle_errors,
    literal,
    load_plugins,
    out,
)

_PRESET_HELP = literal(
    "Preset whose scenario (and, without -D, defenses) the audit takes [default: quickstart]."
)


@handle_errors
def audit_cmd(
    preset: Annotated[str | None, typer.Argument(help=_PRESET_HELP)] = None,
    dataset: Annotated[
        list[str] | None,
        typer.Option("-d", "--dataset", help=literal("Dataset pattern name[k=v].")),
    ] = None,
    model: Annotated[list[str] | None, typer.Option("-m", "--model", help="Model pattern.")] = None,
    defense: Annotated[
        list[str] | None,
        typer.Option(
            "-D", "--defense", help=literal("Defense pattern, e.g. 'dp-sgd[epsilon=4]'; repeatable.")
        ),
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override, e.g. scenario.rounds=20; repeatable.")
    ] = None,
    seed: Annotated[
        list[int] | None,
        typer.Option("--seed", help=literal("Seed of the audited run; repeatable [default: 0].")),
    ] = None,
    canaries: Annotated[int, typer.Option("--canaries", help="Number of canaries m.")] = 1000,
    canary_kind: Annotated[
        str,
        typer.Option(
            "--canary-kind",
            help="mislabeled (unused real records, wrong label) or noise (random inputs, random label).",
        ),
    ] = "mislabeled",
    confidence: Annotated[float, typer.Option("--confidence", help="Confidence of the bound.")] = 0.95,
    k_plus: Annotated[
        int | None,
        typer.Option("--k-plus", help="Fixed number of 'in' guesses (with --k-minus; default: search)."),
    ] = None,
    k_minus: Annotated[
        int | None, typer.Option("--k-minus", help="Fixed number of 'out' guesses (with --k-plus).")
    ] = None,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    data_root: DataRootOption = None,
    cache_dir: CacheDirOption = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the cache.")] = False,
    threads: ThreadsOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per row instead of text.")] = False,
    plugin: PluginOption = None,
) -> None:
    """Empirical epsilon lower bound of each row (one training run with canaries), beside its formal epsilon.

    m canaries (records with a wrong label, by default) are each added to the row's training by a fair
    coin; after the one run, the canaries with the highest scores (minus the final model's loss) are
    guessed "in" and the lowest "out", and the number of correct guesses bounds epsilon from below at
    the stated confidence (Steinke, Nasr & Jagielski, NeurIPS 2023). The rule (k+, k-) is searched over
    a fixed grid with a Bonferroni correction unless --k-plus/--k-minus fix it.

    A bound above the row's formal epsilon refutes the claim: it is flagged VIOLATION and the exit code
    is 1. A bound far below it is expected: a black-box one-run audit is not tight (docs/auditing.md).

    Examples:

      fedbench audit -d mnist5k -m mlp -D "dp-sgd\\[epsilon=4,per_example=ghost]" --canaries 1000

      fedbench audit -d mnist5k -m "mlp\\[hidden=[64]]" -D none -D "dp-sgd\\[epsilon=1]" --canaries 200
      --set scenario.protocol=fedavg --set scenario.clients=2 --set scenario.train_size=100

      fedbench audit board-fedavg -D "dp-gaussian\\[sigma=0.1,clip=1]" --seed 0 --seed 1 --json

    Exit codes: 0 no bound exceeds its formal epsilon, 1 some bound does, 2 bad input.
    """
    from fedbench.auditing import AuditConfig, audit_spec
    from fedbench.auditing.audit import preflight
    from fedbench.cli.running import _overrides
    from fedbench.errors import FedbenchError
    from fedbench.execution.cache import RunCache
    from fedbench.execution.runner import RunContext, check_device
    from fedbench.spec.grid import build_grid

    load_plugins(plugin)
    if canary_kind not in ("mislabeled", "noise"):
        raise FedbenchError(f"--canary-kind {canary_kind}: use mislabeled or noise")
    if canaries < 2:
        raise FedbenchError(f"--canaries {canaries}: give at least 2")
    seeds = list(seed or [0])
    if any(s < 0 for s in seeds):
        raise FedbenchError(f"--seed {min(seeds)}: seeds are integers >= 0")
    config = AuditConfig(canaries, canary_kind, confidence, k_plus, k_minus)
    config.check()
    sets = [*(set_ or ()), f"grid.seeds={json.dumps(seeds)}"]
    grid = build_grid(preset or "quickstart", _overrides(dataset, model, defense, None, sets, None))
    rows = list({s.utility_id: s for s in grid.specs}.values())  # one audit per training, attacks ignored
    ctx = RunContext(device=check_device(device), data_root=data_root_option(data_root), threads=threads)
    if threads:
        import torch

        torch.set_num_threads(threads)
    for spec in rows:  # every usage error before any training
        preflight(spec, config, ctx)
    cache = RunCache(None if no_cache else cache_dir_option(cache_dir))
    err.print(f"{grid.name}: auditing {len(rows)} row(s) with {canaries} canaries each", highlight=False)
    violations = 0
    for spec in rows:
        result = audit_spec(spec, config, cache, ctx)
        violations += result.violation
        for message in cache.take_warnings():
            err.print(f"warning: {message}", highlight=False)
        if as_json:
            out.print(json.dumps(result.as_dict()), highlight=False)
        else:
            out.print(_text(result), highlight=False)
    if violations:
        err.print(f"{violations} row(s) exceed their formal epsilon", highlight=False)
        raise typer.Exit(1)


def _text(r) -> str:
    formal = (
        f"formal epsilon {r.formal_eps:.4g} at delta {r.formal_delta:g} ({r.dp_level} level)"
        if r.formal_eps is not None
        else "no formal epsilon"
    )
    flag = "  VIOLATION: the lower bound exceeds the formal epsilon" if r.violation else ""
    return (
        f"{r.row}\n  epsilon >= {r.eps_lower:.4g} at {r.confidence:.0%} confidence (delta {r.delta:g}); "
        f"{formal}{flag}\n  method: {r.method_line}; {r.included} canaries trained on; "
        f"audit run test acc {r.test_acc:.3f}"
    )
