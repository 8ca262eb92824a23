"""`fedbench list` and `fedbench show`: what plugins and presets exist, and their parameters."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from fedbench.cli._common import PLUGIN_HELP, err, handle_errors, load_plugins, out

KINDS = ("datasets", "models", "defenses", "attacks", "presets")


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
    kind: str = typer.Argument(None, help="datasets, models, defenses, attacks or presets (default: all)."),
    pattern: str = typer.Argument(None, help="fnmatch pattern on names and aliases, e.g. 'dp-*'."),
    preset_dir: list[Path] = typer.Option(None, "--preset-dir", help="Extra folder of presets."),
    plugin: list[Path] = typer.Option(None, "--plugin", help=PLUGIN_HELP),
) -> None:
    """List registered plugins and presets.

    Examples:

      fedbench list defenses

      fedbench list attacks 'i*'

      fedbench list presets
    """
    from fedbench.errors import UnknownNameError
    from fedbench.registry import unavailable

    load_plugins(plugin)
    if kind is not None and kind.rstrip("s") + "s" not in KINDS:
        import difflib

        hint = difflib.get_close_matches(kind, KINDS, n=1)
        more = f"did you mean '{hint[0]}'? " if hint else ""
        raise UnknownNameError(f"unknown kind '{kind}'; {more}(kinds: {', '.join(KINDS)})")
    kinds = [kind.rstrip("s") + "s"] if kind else list(KINDS)
    for k in kinds:
        if k == "presets":
            from fedbench.grid import list_presets

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
    kind: str = typer.Argument(..., help="dataset, model, defense or attack."),
    name: str = typer.Argument(..., help="Name or alias."),
    plugin: list[Path] = typer.Option(None, "--plugin", help=PLUGIN_HELP),
) -> None:
    """Show a plugin: description, parameters (type, default, range) and paper.

    Examples:

      fedbench show defense dp-gaussian

      fedbench show model mlp
    """
    import inspect

    from fedbench.params import describe_params
    from fedbench.registry import registry_for

    load_plugins(plugin)
    cls = registry_for(kind).get(name)
    out.print(
        f"[bold]{cls.kind} {cls.name}[/bold]  (aliases: {', '.join(cls.aliases) or '-'}; "
        f"version {cls.version})",
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
