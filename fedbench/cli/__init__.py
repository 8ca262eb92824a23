"""The `fedbench` command line: a thin Typer layer over the library (one module per command group)."""

from __future__ import annotations

from typing import Annotated

import typer

from fedbench.cli import (
    board_audit_cmd,  # noqa: F401  (registers leaderboard audit)
    board_ops_cmd,  # noqa: F401  (registers leaderboard verify/add)
    board_realistic_cmd,  # noqa: F401  (registers leaderboard realistic)
    board_remove_cmd,  # noqa: F401  (registers leaderboard remove)
    budget_check_cmd,  # noqa: F401  (registers leaderboard budget-check)
)
from fedbench.cli.audit_cmd import audit_cmd
from fedbench.cli.cache_cmd import cache_app
from fedbench.cli.compare import compare_cmd
from fedbench.cli.epsilon_cmd import epsilon_cmd
from fedbench.cli.export_cmd import export_cmd
from fedbench.cli.leaderboard_cmd import leaderboard_app
from fedbench.cli.listing import list_cmd, show_cmd
from fedbench.cli.plot_cmd import plot_app
from fedbench.cli.running import run_cmd, validate_cmd
from fedbench.execution.provenance import fedbench_version

app = typer.Typer(
    name="fedbench",
    help="Privacy attacks and defenses in federated learning, measured with utility.\n\n"
    "Examples:\n\n  fedbench run            # quickstart on shipped data\n\n"
    "  fedbench list defenses\n\n  fedbench show defense dp-gaussian",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("list")(list_cmd)
app.command("show")(show_cmd)
app.command("run")(run_cmd)
app.command("validate")(validate_cmd)
app.command("compare")(compare_cmd)
app.command("export")(export_cmd)
app.command("epsilon")(epsilon_cmd)
app.command("audit")(audit_cmd)
app.add_typer(leaderboard_app, name="leaderboard")
app.add_typer(plot_app, name="plot")
app.add_typer(cache_app, name="cache")


def _version(value: bool) -> None:
    if value:
        print(f"fedbench {fedbench_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Privacy attacks and defenses in federated learning, measured with utility."""


def main() -> None:
    app()
