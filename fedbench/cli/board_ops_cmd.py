"""`fedbench leaderboard verify|add|describe`: re-run a sample of a board's runs and check the numbers
they feed; put one new defense configuration on a board without touching any other entry
(`fedbench.reporting.board_verify`); refresh a board's descriptive text from its preset
(`fedbench.reporting.board_describe`)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Annotated

import typer

from fedbench.cli._common import (
    CacheDirOption,
    DataRootOption,
    NJobsOption,
    PluginOption,
    ThreadsOption,
    err,
    literal,
    out,
)
from fedbench.cli.board_runs import _board_grid, _board_specs, _load_v2, _run_specs  # noqa: F401  (re-exported)
from fedbench.cli.leaderboard_cmd import DirOption, _command
from fedbench.cli.running import PresetDirOption
from fedbench.errors import FedbenchError

BoardArgument = Annotated[str, typer.Argument(help="Board name (a folder under --dir).", show_default=False)]
StampOption = Annotated[bool, typer.Option("--stamp/--no-stamp", help="Write the result into board.json.")]


@_command("verify")
def verify_cmd(
    board: BoardArgument,
    sample: Annotated[
        int, typer.Option("--sample", min=0, help="How many runs to re-run, drawn at random.")
    ] = 2,
    entry: Annotated[
        str | None, typer.Option("--entry", help="Re-run every run of this entry (a defense label) instead.")
    ] = None,
    run: Annotated[
        list[str] | None, typer.Option("--run", help="Re-run this run id (repeatable) instead of a sample.")
    ] = None,
    rng_seed: Annotated[
        int | None, typer.Option("--rng-seed", help=literal("Seed of the draw [default: random]."))
    ] = None,
    stamp: StampOption = True,
    root: DirOption = Path("leaderboards"),
    data_root: DataRootOption = None,
    threads: ThreadsOption = None,
    n_jobs: NJobsOption = 1,
    preset_dir: PresetDirOption = None,
    plugin: PluginOption = None,
) -> None:
    """Re-run a sample of a board's runs from an empty cache and check every number they feed.

    A run is one seed x attack x victim batch of one entry. Its numbers are its inputs' values
    (re-identification, PSNR, ...), its seed's test accuracy and its run-level values. Where the board
    was built (or last verified) with the same torch version and CPU capability, each must be identical
    to the 6 significant digits entries keep; elsewhere an optimisation attack's trajectory depends on
    the CPU's kernels, so each must keep its row inside the published 95 % intervals. Exit 1 naming the
    first number that differs; the result is stamped into board.json (--no-stamp: not).

    Examples:

      fedbench leaderboard verify inversion-fedsgd-mnist5k-mlp --sample 2

      fedbench leaderboard verify inversion-fedsgd-mnist5k-mlp --entry "soteria\\[prune=0.8]"

      fedbench leaderboard verify my-board --dir boards --preset-dir my_presets --no-stamp
    """
    import random

    import torch

    from fedbench.execution.provenance import fedbench_version
    from fedbench.reporting import leaderboard as lb
    from fedbench.reporting.board_build import compute_environment
    from fedbench.reporting.board_schema import VerifyStamp
    from fedbench.reporting.board_verify import board_runs, compare, sample_runs

    b, entries = _load_v2(root, board)
    refs = board_runs(entries)
    if run:
        unknown = [r for r in run if r not in {x.run_id for x in refs}]
        if unknown:
            raise FedbenchError(f"--run {unknown[0]}: not a run of board {board}; see its entries' run ids")
        chosen = [x for x in refs if x.run_id in set(run)]
    elif entry is not None:
        labels = [e["defense"] for e in entries]
        if entry not in labels:
            raise FedbenchError(f"--entry {entry!r}: not on board {board} (entries: {', '.join(labels)})")
        chosen = [x for x in refs if x.defense == entry]
    else:
        seed = random.SystemRandom().randrange(2**31) if rng_seed is None else rng_seed
        chosen = sample_runs(refs, sample, seed)
        err.print(
            f"{board}: re-running {len(chosen)} of {len(refs)} runs (--rng-seed {seed})", highlight=False
        )
    from fedbench.spec.grid import Overrides, build_grid

    path, extra = _board_grid(b, preset_dir, plugin)
    grid = build_grid(path, Overrides(), extra_dirs=extra)
    every = _board_specs(b, grid, path, extra, entries)
    wanted = {x.run_id for x in chosen}
    specs = list({s.run_id: s for s in every if s.run_id in wanted}.values())
    missing = wanted - {s.run_id for s in specs}
    if missing:
        raise FedbenchError(
            f"run {sorted(missing)[0]} is not in preset {b.preset}'s grid any more (the preset changed since "
            f"the board was built); rebuild the board with '{b.command}'"
        )
    results, _records = _run_specs(grid, specs, (data_root, threads, n_jobs), None)
    env = compute_environment()
    reference = b.verified and {
        "torch_version": b.verified.torch_version,
        "cpu_capability": b.verified.cpu_capability,
    }
    exact = env == (b.environment or reference or {})
    found = compare(b, entries, chosen, results.frame, results.per_image, exact)
    mode = "bit-identical (same torch and CPU capability)" if exact else "within the published intervals"
    for c in found.failures[:10]:
        out.print(f"DIFFERS: {c.where}: committed {c.committed}, re-run {c.rerun}", highlight=False)
    result = "pass" if found.passed else f"FAIL: {found.failures[0].where}"
    out.print(
        f"{board}: {len(found.checks)} numbers from {len(chosen)} runs, {mode}: {result}", highlight=False
    )
    if stamp:
        b2 = b.model_copy(
            update={
                "verified": VerifyStamp(
                    date=datetime.date.today().isoformat(),
                    fedbench_version=fedbench_version(),
                    torch_version=torch.__version__,
                    cpu_capability=env["cpu_capability"],
                    sample=len(chosen),
                    runs=sorted(wanted),
                    result="pass" if found.passed else "fail",
                    numbers=len(found.checks),
                )
            }
        )
        lb.write_board_file(root, b2)
        lb.render(root, [board])
    if not found.passed:
        raise typer.Exit(1)


@_command("add")
def add_cmd(
    board: BoardArgument,
    defense: Annotated[
        list[str] | None,
        typer.Option(
            "-D", "--defense", help=literal('The configuration to add, e.g. -D "mine[strength=0.5]".')
        ),
    ] = None,
    attack: Annotated[
        list[str] | None,
        typer.Option(
            "-a",
            "--attack",
            help=literal(
                'An attack to evaluate against every row it applies to, e.g. -a "my-adaptive[steps=500]": '
                "each row's worst case then includes it."
            ),
        ),
    ] = None,
    root: DirOption = Path("leaderboards"),
    cache_dir: CacheDirOption = None,
    data_root: DataRootOption = None,
    n_jobs: NJobsOption = 1,
    threads: ThreadsOption = None,
    preset_dir: PresetDirOption = None,
    plugin: PluginOption = None,
) -> None:
    """Put a new defense configuration on a board (-D), or evaluate a new attack against its rows (-a).

    -D runs the board's exact scenario, seeds and attack suite for the configuration and puts it on the
    board, ranked, without touching any other entry. The baseline is the committed `none` entry
    (accuracy drops are paired with its per-seed accuracy), so `none` is not re-run. The new entry
    records the plugin file's source digest.

    -a (an external evaluation, e.g. an adaptive attack of your own) runs the attack on every row it
    applies to (an adaptive attack: the rows of its defenses), on the cached trainings, and adds its
    per-input values to each of those entries: each row's worst case, and so its rank, then includes
    it. The board records the attack as external, with the plugin file's source digest.

    Ranks are computed when the board renders (no entry stores one). What to send upstream afterwards:
    docs/submitting.md.

    Examples:

      fedbench leaderboard add inversion-fedsgd-mnist5k-mlp -D "mine\\[strength=0.5]" --plugin mine.py

      fedbench leaderboard add my-board -D "dp-gaussian\\[sigma=0.05]" --dir boards --preset-dir presets

      fedbench leaderboard add inversion-fedsgd-mnist5k-mlp -a "my-adaptive\\[steps=500]" --plugin mine.py
    """
    from fedbench.cli._common import cache_dir_option, data_root_option
    from fedbench.execution.cascade import cascade_skipped
    from fedbench.reporting import leaderboard as lb
    from fedbench.reporting.board_build import build
    from fedbench.reporting.board_verify import source_digest

    if bool(defense) == bool(attack):
        raise FedbenchError(
            "give -D (a configuration to add) or -a (an attack to evaluate), not both or neither"
        )
    b, entries = _load_v2(root, board)
    from fedbench.spec.grid import Overrides, build_grid

    path, extra = _board_grid(b, preset_dir, plugin)
    ctx_args = (data_root_option(data_root), threads, n_jobs)
    if attack:
        _add_attacks(
            root,
            b,
            entries,
            build_grid(path, Overrides(attacks=tuple(attack)), extra),
            plugin,
            ctx_args,
            cache_dir_option(cache_dir),
        )
        return
    grid = build_grid(path, Overrides(defenses=tuple(defense)), extra_dirs=extra)
    labels = sorted({s.defense.label for s in grid.specs})
    taken = [x for x in labels if x in {e["defense"] for e in entries}]
    if taken:
        raise FedbenchError(
            f"-D {taken[0]!r}: already on board {board}; its entry is entries/{lb.slug(taken[0])}.json"
        )
    results, records = _run_specs(grid, grid.specs, ctx_args, cache_dir_option(cache_dir), cascade=True)
    failed = [r for r in records if r.status != "ok" and not cascade_skipped(r)]
    if failed:
        raise FedbenchError(
            f"{len(failed)} run(s) of {defense[0]} failed (first: {failed[0]['attack']} seed "
            f"{failed[0]['seed']}: {failed[0].get('reason')}); nothing added"
        )
    none = next((e for e in entries if e["defense"] == "none"), None)
    _board, new = build(results, b.name, baseline=none)
    written = []
    for e in new:
        e["attack_suite"] = list(b.attack_suite)
        extras = set(e.get("per_seed") or {}) - set(b.attack_suite)
        if extras:
            raise FedbenchError(
                f"{e['defense']} brings attacks the board's suite lacks ({', '.join(sorted(extras))}); "
                "add them to the board's preset and rebuild it"
            )
        if plugin:
            e["plugin"] = {"file": Path(plugin[0]).name, "digest": source_digest(plugin[0])}
        lb.validate_entry(e, b, f"new entry {e['defense']}")
        target = root / board / lb.ENTRIES_DIR / f"{lb.slug(e['defense'])}.json"
        target.write_text(lb.dump_json(e), encoding="utf-8")
        written.append(target)
    lb.render(root, [board])
    _board2, entries2 = lb.load_board(root / board)
    ranks = {e["defense"]: rank for rank, e in lb.ranked(_board2, entries2)}
    for target, e in zip(written, new, strict=True):
        rank = ranks.get(e["defense"]) or "not ranked (outside the utility budget)"
        out.print(f"added {e['defense']} to {board}: rank {rank} -> {target}", highlight=False)


def _add_attacks(root, b, entries, grid, plugin, ctx_args, cache_dir) -> None:
    """`leaderboard add -a`: run the attack(s) against the board's rows it applies to and add their
    per-input and per-seed values (and leakage means) to those entries; record them as external."""
    import datetime

    from fedbench.reporting import leaderboard as lb
    from fedbench.reporting.board_build import build
    from fedbench.reporting.board_schema import ExternalAttack
    from fedbench.reporting.board_verify import source_digest

    rows = {e["defense"]: e for e in entries}
    specs = [s for s in grid.specs if s.defense.label in rows]
    labels = sorted({s.attack.label for s in specs if s.attack is not None})
    taken = [a for a in labels if a in b.attack_suite]
    if taken:
        raise FedbenchError(f"-a {taken[0]!r}: already in board {b.name}'s attack suite")
    if not specs:
        raise FedbenchError(f"-a {', '.join(labels) or '?'}: applies to no row of board {b.name}")
    results, records = _run_specs(grid, specs, ctx_args, cache_dir)
    failed = [r for r in records if r.status not in ("ok", "skipped")]
    if failed:
        raise FedbenchError(
            f"{len(failed)} run(s) failed (first: {failed[0]['defense']} seed {failed[0]['seed']}: "
            f"{failed[0].get('reason')}); nothing added"
        )
    none = rows.get("none")
    _board, new = build(results, b.name, baseline=none)
    digest = {"file": Path(plugin[0]).name, "digest": source_digest(plugin[0])} if plugin else None
    suite = [*b.attack_suite, *labels]
    changed = []
    for n in new:
        e = rows.get(n["defense"])
        if e is None or not n.get("per_input") and not n.get("per_seed"):
            continue
        for table in ("per_input", "per_seed"):
            e[table] = {**(e.get(table) or {}), **(n.get(table) or {})}
        leakage = n["metrics"].get("leakage") or {}
        e["metrics"]["leakage"] = {**(e["metrics"].get("leakage") or {}), **leakage}
        e["run_ids"] = sorted(set(e["run_ids"]) | set(n["run_ids"]))
        changed.append(e)
    today = datetime.date.today().isoformat()
    external = [*b.external_attacks, *(ExternalAttack(attack=a, date=today, plugin=digest) for a in labels)]
    b2 = b.model_copy(update={"attack_suite": tuple(suite), "external_attacks": tuple(external)})
    for e in entries:  # every entry checked before any file is written
        e["attack_suite"] = suite
        lb.validate_entry(e, b2, f"entry {e['defense']}")
    for e in entries:
        target = root / b.name / lb.ENTRIES_DIR / f"{lb.slug(e['defense'])}.json"
        target.write_text(lb.dump_json(e), encoding="utf-8")
    lb.write_board_file(root, b2)
    lb.render(root, [b.name])
    out.print(
        f"evaluated {', '.join(labels)} on {len(changed)} row(s) of {b.name}: "
        + ", ".join(e["defense"] for e in changed),
        highlight=False,
    )


@_command("describe")
def describe_cmd(
    board: BoardArgument,
    root: DirOption = Path("leaderboards"),
    preset_dir: PresetDirOption = None,
    plugin: PluginOption = None,
) -> None:
    """Refresh a board's descriptive text (title, description, threat model, knowledge, tuning rule,
    substitution) from its preset, without re-running anything, and re-render it.

    Exit 2 when the preset changed what decides the numbers (primary, utility_budget, headline) or
    what the board ran (a run of an entry no longer in its grid): those need `fedbench leaderboard build`.

    Examples:

      fedbench leaderboard describe inversion-fedsgd-mnist5k-mlp
    """
    from fedbench.reporting import leaderboard as lb
    from fedbench.reporting.board_describe import described
    from fedbench.spec.grid import Overrides, build_grid

    lb.check_board_name(root, board)
    current, entries = lb.load_board(root / board)
    path, extra = _board_grid(current, preset_dir, plugin)
    grid = build_grid(path, Overrides(), extra_dirs=extra)
    ran = {s.run_id for s in _board_specs(current, grid, path, extra, entries)}
    stale = sorted({r for e in entries for r in e.get("run_ids", [])} - ran)
    if stale:  # the words would describe runs the board does not hold
        raise FedbenchError(
            f"run {stale[0]} is not in preset {current.preset}'s grid any more (the preset changed what "
            f"the board ran); rebuild the board with '{current.command}'"
        )
    new, changed = described(current, grid)
    if not changed:
        out.print(f"{board}: its description is the preset's already", highlight=False)
        return
    lb.write_board_file(root, new)
    lb.render(root, [board])
    out.print(f"{board}: {', '.join(changed)} refreshed from {path.name}", highlight=False)
