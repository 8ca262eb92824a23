"""A new attack family is one plugin file: tests/plugins/gradient_norm_mia.py, loaded with --plugin and
no edit anywhere else, is listed, runs, scores its own metrics, shows in the default compare table
(even where the plugin is not loaded: the results describe its metrics) and in the run summary, and
keeps the plugin contract (`fedbench.testing.check_plugin`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fedbench import registry
from fedbench.cli import app
from fedbench.errors import UnknownNameError
from fedbench.metrics import attack_metrics
from fedbench.reporting.results import read_results
from fedbench.testing import check_plugin

PLUGIN = Path(__file__).parent / "plugins" / "gradient_norm_mia.py"
FAMILY_METRICS = ("gn_auc", "gn_acc", "gn_tpr_at_1pct_fpr", "gn_norm_ratio")


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """`fedbench run smoke -a gradient-norm-mia` on two defenses, one round: (CLI result, results CSV)."""
    out = tmp_path_factory.mktemp("gradient-norm")
    res = invoke(
        "run",
        "smoke",
        "-a",
        "gradient-norm-mia",
        "-D",
        "none",
        "-D",
        "dp-gaussian[sigma=0.1]",
        "--set",
        "scenario.rounds=1",
        "--no-cache",
        "--threads",
        "1",
        "-o",
        str(out),
        "--plugin",
        str(PLUGIN),
    )
    assert res.exit_code == 0, res.output
    return res, next(out.glob("*.csv"))


def test_list_shows_the_plugin():
    res = invoke("list", "attacks", "--plugin", str(PLUGIN))
    assert res.exit_code == 0 and "gradient-norm-mia" in res.output


def test_run_writes_the_family_metrics(grid):
    _res, path = grid
    frame = read_results(path)
    assert set(frame["status"]) == {"ok"} and set(frame["attack"]) == {"gradient-norm-mia"}
    for name in FAMILY_METRICS:
        if name == "gn_tpr_at_1pct_fpr":  # exact TPR at FPR <= 1%: n/a with a smoke run's few non-members
            assert frame[name].isna().all(), name
            continue
        assert frame[name].notna().all(), name
    assert set(frame["tm_observation"]) == {"model"}  # the columns every family shares


def test_default_compare_shows_them_without_the_plugin(grid):
    """A fresh process that never loads the plugin file: the results' sidecar describes the metrics."""
    _res, path = grid
    shown = subprocess.run(
        [sys.executable, "-m", "fedbench", "compare", str(path), "--format", "markdown"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "gradient-norm-mia gn_auc ↓" in shown and "gradient-norm-mia gn_acc (%) ↓" in shown


def test_run_summary_shows_them(grid):
    res, path = grid
    assert "gn_auc" in res.output  # the leaderboard printed after the run
    assert "gn_auc" in path.with_suffix(".md").read_text(encoding="utf-8")
    assert path.with_name(path.stem + "-tradeoff.png").is_file()  # its leakage axis: gn_auc


def test_check_plugin_passes():
    registry.load_plugin_file(PLUGIN)
    row = check_plugin("attack", "gradient-norm-mia")
    assert set(FAMILY_METRICS) <= set(row) and row["tm_mia_members"] == "victim"


@pytest.mark.numeric
def test_members_have_smaller_gradient_norms():
    """The method is real: on a model that fits its training examples, the score separates them."""
    import torch
    from sklearn.datasets import load_digits
    from sklearn.metrics import roc_auc_score

    registry.load_plugin_file(PLUGIN)
    module = sys.modules[registry.attacks.get("gradient-norm-mia").__module__]
    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
    members, others = slice(0, 60), slice(60, 120)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(300):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[members]), y[members]).backward()
        opt.step()
    model.eval()
    scores = np.concatenate(
        [
            module._minus_gradient_norms(model, x[s], y[s], "ce", torch.device("cpu"))
            for s in (members, others)
        ]
    )
    assert roc_auc_score(np.r_[np.ones(60), np.zeros(60)], scores) > 0.7  # chance: 0.5


def test_an_unknown_family_names_the_attack_and_the_fix():
    class _Typo:
        name = "my-attack"
        family = "gradient-nrom"

    result = {"output": {}, "truth": {}, "observation": {}}
    registry.load_plugin_file(PLUGIN)
    with pytest.raises(UnknownNameError) as info:
        attack_metrics(_Typo(), result)
    message = str(info.value)
    assert "attack 'my-attack' declares family 'gradient-nrom'" in message
    assert "did you mean 'gradient-norm'?" in message and "@register_family('gradient-nrom'" in message


def test_the_guide_shows_the_plugin_and_every_family_metric():
    """docs/writing-an-attack.md cannot drift: it holds the plugin file verbatim and names every metric
    each built-in family declares."""
    import re

    from fedbench.metrics.catalogue import attack_families

    page = (Path(__file__).parents[1] / "docs" / "writing-an-attack.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert PLUGIN.read_text(encoding="utf-8") in blocks, "docs/writing-an-attack.md: paste the plugin again"
    for fam in attack_families():
        if fam.builtin:
            assert f"`{fam.name}`" in page
            missing = [n for n in fam.metrics if f"`{n}`" not in page]
            assert not missing, f"docs/writing-an-attack.md does not name {missing} ({fam.name})"
