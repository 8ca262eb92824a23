"""`fedbench list` and `fedbench show`: what plugins and presets exist, and their parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, get_args

import typer
from rich.table import Table

from fedbench.cli._common import (
    PluginOption,
    choice,
    data_root_param,
    err,
    handle_errors,
    literal,
    load_plugins,
    out,
)

ListKind = Literal["datasets", "models", "defenses", "attacks", "presets"]
KINDS: tuple[str, ...] = get_args(ListKind)


def _plural(kind: str) -> str:
    """`fedbench list` takes a kind in the singular too ('defense' lists the defenses)."""
    return kind.rstrip("s") + "s"


def _plugin_table(kind: str, pattern: str | None) -> Table:
    from fedbench.registry import registry_for

    reg = registry_for(kind)
    table = Table(title=f"{reg.kind}s", title_justify="left")
    for col in ("name", "aliases", "version", "summary"):
        table.add_column(col, overflow="fold")
    for cls in reg.list(pattern):
        table.add_row(cls.name, ", ".join(cls.aliases), cls.version, cls.summary())
    return table


@handle_errors
def list_cmd(
    kind: Annotated[
        ListKind | None,
        typer.Argument(
            parser=choice(ListKind, "kind", "kinds", normalize=_plural),
            help="datasets, models, defenses, attacks or presets (default: all).",
        ),
    ] = None,
    pattern: Annotated[
        str | None, typer.Argument(help="fnmatch pattern on names and aliases, e.g. 'dp-*'.")
    ] = None,
    preset_dir: Annotated[
        list[Path] | None, typer.Option("--preset-dir", help="Extra folder of presets.")
    ] = None,
    plugin: PluginOption = None,
) -> None:
    """List registered plugins and presets.

    Examples:

      fedbench list defenses

      fedbench list attacks 'i*'

      fedbench list presets
    """
    from fedbench.registry import unavailable

    load_plugins(plugin)
    kinds = [kind] if kind else list(KINDS)
    for k in kinds:
        if k == "presets":
            from fedbench.spec.grid import list_presets

            table = Table(title="presets", title_justify="left")
            table.add_column("name")
            table.add_column("description", overflow="fold")
            import fnmatch

            for name, _path, desc in list_presets(tuple(preset_dir or ())):
                if pattern is None or fnmatch.fnmatchcase(name, pattern):
                    table.add_row(name, desc)
            out.print(table)
        else:
            out.print(_plugin_table(k, pattern))
    bad = unavailable()
    if bad:
        table = Table(title="unavailable (failed to load)", title_justify="left")
        table.add_column("source")
        table.add_column("error", overflow="fold")
        for item in bad:
            table.add_row(item.source, item.error)
        err.print(table)


@handle_errors
def show_cmd(
    kind: Annotated[str, typer.Argument(help="dataset, model, defense, attack, or run.")],
    name: Annotated[str, typer.Argument(help="Name or alias; for 'run', a run id (or its first 6+ digits).")],
    save_images: Annotated[
        Path | None,
        typer.Option("--save-images", help="run: write a PNG grid of truth vs reconstruction here."),
    ] = None,
    results: Annotated[
        Path,
        typer.Option("--results", help="run: results directory to search."),
    ] = Path("results"),
    cache_dir: Annotated[
        Path | None,
        typer.Option("--cache-dir", help=literal("run: cache directory [env FEDBENCH_CACHE_DIR].")),
    ] = None,
    data_root: Annotated[
        Path | None, data_root_param("run: folder of full datasets, if the run used one.")
    ] = None,
    plugin: PluginOption = None,
) -> None:
    """Show a plugin (description, parameters with type, default and range, paper) or a finished run.

    Examples:

      fedbench show defense dp-gaussian

      fedbench show model mlp

      fedbench show run 3f2a9c01d4e5b6a7 --save-images figures/
    """
    import inspect

    from fedbench.registry import registry_for
    from fedbench.spec.params import describe_params

    load_plugins(plugin)
    if kind == "run":
        _show_run(name, results, save_images, cache_dir, data_root)
        return
    cls = registry_for(kind).get(name)
    out.print(
        f"{cls.kind} {cls.name}  (aliases: {', '.join(cls.aliases) or '-'}; version {cls.version})",
        highlight=False,
    )
    doc = inspect.getdoc(cls) or ""
    if doc:
        out.print(doc, highlight=False)
    if cls.paper:
        out.print(f"paper: {cls.paper}", highlight=False)
    table = Table(title="parameters", title_justify="left")
    for col in ("name", "type", "default", "range", "help"):
        table.add_column(col, overflow="fold")
    for p in describe_params(cls.Params):
        table.add_row(p.name, p.type, repr(p.default), p.range, p.help)
    out.print(table if table.row_count else "parameters: none")


def rerun_command(spec) -> str:
    """The `fedbench run` command line that recomputes exactly this run (same run id).

    Every scenario field is set explicitly, so the preset's own scenario values cannot change it.
    """
    import shlex

    from fedbench.spec.params import params_to_dict

    parts = [
        "fedbench",
        "run",
        spec.preset or "smoke",
        "-d",
        spec.dataset.label,
        "-m",
        spec.model.label,
        "-D",
        spec.defense.label,
        "-a",
        spec.attack.label if spec.attack else "none",
    ]
    for key, value in params_to_dict(spec.scenario).items():
        if key == "victim" and spec.victims:  # a victim batch: its clients, the first among them
            value = "[" + ",".join(map(str, spec.victims)) + "]"
            key = "victims"
        parts += ["--set", f"scenario.{key}={value}"]
    parts += ["--set", f"grid.seeds=[{spec.seed}]"]
    return " ".join(shlex.quote(p) for p in parts)


def _show_run(
    run_id: str, results: Path, save_images: Path | None, cache_dir: Path | None, data_root: Path | None
) -> None:
    import math

    from fedbench.cli._common import cache_dir_option, data_root_option
    from fedbench.reporting.results import find_run
    from fedbench.spec.run import RunSpec

    row, key, path = find_run(run_id, results)
    spec = RunSpec.from_key(key, preset=str(row.get("preset", "")))
    table = Table(title=f"run {spec.run_id} (from {path})", title_justify="left", show_header=False)
    table.add_column("field")
    table.add_column("value", overflow="fold")
    for field, value in row.items():
        if isinstance(value, float) and math.isnan(value):
            continue
        table.add_row(str(field), str(value))
    out.print(table)
    out.print("rerun: " + rerun_command(spec))
    if save_images is None:
        return
    if spec.attack is None:
        from fedbench.errors import FedbenchError

        raise FedbenchError(f"run {spec.run_id} has no attack, so no reconstructions; pick an attack run")
    written = save_run_images(spec, cache_dir_option(cache_dir), data_root_option(data_root), save_images)
    err.print(f"wrote {written}")


def save_run_images(spec, cache_dir: Path, data_root: str | None, folder: Path) -> Path:
    """Truth-over-reconstruction PNG of an attack run (from the cache; computed and cached when missing)."""
    from fedbench.errors import FedbenchError
    from fedbench.execution.cache import RunCache
    from fedbench.execution.runner import RunContext, attack_result
    from fedbench.reporting.plots import save_reconstruction_grid
    from fedbench.reporting.reconstructions import Reconstruction

    rec = Reconstruction.from_result(
        attack_result(spec, RunCache(cache_dir), RunContext(data_root=data_root))
    )
    if rec is None:
        raise FedbenchError(f"run {spec.run_id}: the attack returned no images to show")
    matched, psnrs = rec.aligned()
    title = f"{spec.attack.name} vs {spec.defense.label} ({spec.dataset.name}, {spec.model.name})"
    return save_reconstruction_grid(
        rec.truth, matched, psnrs, Path(folder) / f"run-{spec.run_id}.png", title=title
    )
