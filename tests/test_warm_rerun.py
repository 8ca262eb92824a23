"""A warm-cache re-run does only what changed (issue 29): derived columns stored by their code and
inputs, the thread setting deferred to the first computation, identical plots copied, not redrawn."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import fedbench.execution.runner as runner
from fedbench.execution import derived as derived_mod
from fedbench.execution import sources
from fedbench.execution.cache import RunCache
from fedbench.execution.runner import RunContext, execute
from fedbench.plugin import Scenario
from fedbench.spec.run import ComponentSpec, RunSpec, canonical_json
from fedbench.testing import TINY_MODEL, TINY_SCENARIO, cheapest_params


def _spec(defense="none", attack="dlg", seed=0):
    return RunSpec(
        ComponentSpec.resolve("dataset", "digits", {}),
        ComponentSpec.resolve("model", "mlp", TINY_MODEL[1]),
        ComponentSpec.resolve("defense", defense, cheapest_params("defense", defense)),
        ComponentSpec.resolve("attack", attack, cheapest_params("attack", attack)) if attack else None,
        Scenario.from_dict(TINY_SCENARIO),
        seed,
        preset="test",
    )


@pytest.fixture
def scorings(monkeypatch):
    """Counts the computations of derived columns (`runner._derived`, looked up at call time)."""
    calls = []
    real = runner._derived
    monkeypatch.setattr(runner, "_derived", lambda *a: calls.append(a[0].spec.run_id) or real(*a))
    return calls


def _same_row(a, b):
    skip = {"seconds", "peak_rss_mb", "from_cache", "created_at"}
    assert {k: v for k, v in a.columns.items() if k not in skip} == {
        k: v for k, v in b.columns.items() if k not in skip
    }
    assert a.per_image == b.per_image and a.warnings == b.warnings


def test_a_cached_run_is_not_scored_again(tmp_path, scorings):
    cache, ctx = RunCache(tmp_path / "c"), RunContext()
    spec = _spec("dp-gaussian")  # a guarantee and a reconstruction: both derived parts
    first = execute(spec, cache, ctx)
    again = execute(spec, RunCache(tmp_path / "c"), ctx)
    assert first["status"] == again["status"] == "ok" and again["from_cache"] is True
    assert scorings == [spec.run_id]  # scored once, then read
    assert first["epsilon"] > 0 and "psnr" in first.columns
    _same_row(first, again)


def test_without_a_cache_every_run_is_scored(tmp_path, scorings):
    spec = _spec()
    execute(spec, RunCache(None), RunContext())
    execute(spec, RunCache(None), RunContext())
    assert len(scorings) == 2


def test_edited_metric_code_scores_again(tmp_path, scorings, monkeypatch):
    cache, ctx = RunCache(tmp_path / "c"), RunContext()
    spec = _spec()
    execute(spec, cache, ctx)
    real = sources.derived_digest
    monkeypatch.setattr(sources, "derived_digest", lambda s, attack: "edited-" + real(s, attack))
    execute(spec, cache, ctx)
    assert len(scorings) == 2
    execute(spec, cache, ctx)
    assert len(scorings) == 2  # the edited code's values are stored in turn


def test_the_derived_digest_follows_the_metric_and_plugin_code(monkeypatch):
    spec = _spec()
    before = sources.derived_digest(spec, attack=True)
    assert sources.derived_digest(spec, attack=True) == before  # stable within a process
    assert sources.derived_digest(spec, attack=False) != before  # the attack plugin counts only with it
    real = sources._module

    def edited(name):
        info = real(name)
        return ("0" * 64, info[1]) if name == "fedbench.metrics.reconstruction" and info else info

    monkeypatch.setattr(sources, "_module", edited)
    sources.forget()
    try:
        assert sources.derived_digest(spec, attack=True) != before
    finally:
        monkeypatch.undo()
        sources.forget()


def test_the_key_names_the_inputs_the_code_and_the_environment(monkeypatch):
    spec = _spec()
    run = canonical_json(spec.key())
    result = {"output": {"images": np.zeros((1, 1, 8, 8))}, "seconds": 1.0}
    key = derived_mod.derived_key(run, spec, {"n_train": 40}, result)
    assert key == derived_mod.derived_key(run, spec, {"n_train": 40}, {**result})
    recomputed = {"output": {"images": np.full((1, 1, 8, 8), 1e-9)}, "seconds": 1.0}
    assert derived_mod.derived_key(run, spec, {"n_train": 40}, recomputed) != key  # --force, new digits
    assert derived_mod.derived_key(run, spec, {"n_train": 41}, result) != key
    fields = json.loads(key)
    assert fields["run"] == run and fields["code"] == sources.derived_digest(spec, True)
    assert set(fields["environment"]["packages"]) == set(derived_mod.PACKAGES)
    with_weights = {**derived_mod.environment(), "lpips_weights": ["alexnet-owt-7be5be79.pth"]}
    monkeypatch.setattr(derived_mod, "environment", lambda: with_weights)
    assert derived_mod.derived_key(run, spec, {"n_train": 40}, result) != key  # LPIPS now computable


def test_placed_lpips_weights_change_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    derived_mod.environment.cache_clear()
    try:
        assert derived_mod.environment()["lpips_weights"] == []
        (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
        (tmp_path / "hub" / "checkpoints" / "alexnet-owt-7be5be79.pth").write_bytes(b"")
        derived_mod.environment.cache_clear()
        assert derived_mod.environment()["lpips_weights"] == ["alexnet-owt-7be5be79.pth"]
    finally:
        derived_mod.environment.cache_clear()


def test_torch_hub_dir_matches_torch():
    import torch

    assert derived_mod.torch_hub_dir() == torch.hub.get_dir()


def test_a_failed_scoring_is_not_stored(tmp_path, monkeypatch):
    cache, ctx = RunCache(tmp_path / "c"), RunContext()
    spec = _spec()

    def broken(*args):
        raise RuntimeError("metric bug")

    monkeypatch.setattr(runner, "_derived", broken)
    row = execute(spec, cache, ctx)
    assert row["status"] == "failed" and "metric bug" in row["reason"]
    monkeypatch.undo()
    assert execute(spec, cache, ctx)["status"] == "ok"


def test_a_fully_cached_grid_imports_no_torch(tmp_path):
    """The grid's thread setting waits for a computation: a grid read whole from the cache (runs and
    derived columns) never imports torch."""
    from fedbench.execution.runner import run_grid

    specs = [_spec("dp-gaussian"), _spec("none", attack=None)]
    records = run_grid(specs, RunCache(tmp_path / "c"), RunContext(threads=1))
    assert [r["status"] for r in records] == ["ok", "ok"]
    code = f"""
import sys
from fedbench.execution.cache import RunCache
from fedbench.execution.runner import RunContext, run_grid
from fedbench.plugin import Scenario
from fedbench.spec.run import ComponentSpec, RunSpec
from fedbench.testing import TINY_MODEL, TINY_SCENARIO, cheapest_params
specs = [RunSpec(
    ComponentSpec.resolve("dataset", "digits", {{}}),
    ComponentSpec.resolve("model", "mlp", TINY_MODEL[1]),
    ComponentSpec.resolve("defense", d, cheapest_params("defense", d)),
    ComponentSpec.resolve("attack", a, cheapest_params("attack", a)) if a else None,
    Scenario.from_dict(TINY_SCENARIO), 0, preset="test") for d, a in (("dp-gaussian", "dlg"), ("none", None))]
records = run_grid(specs, RunCache({str(tmp_path / "c")!r}), RunContext(threads=1))
assert all(r["from_cache"] for r in records), [r.columns for r in records]
assert "torch" not in sys.modules, "a fully cached grid imported torch"
"""
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------- plots


def _points(shift=0.0):
    from fedbench.reporting.plots import TradeoffPoint

    return [
        TradeoffPoint("none", "none", 0.9, 30.0 + shift),
        TradeoffPoint("dp-gaussian[sigma=0.1]", "dp-gaussian", 0.7, 12.0, 0.01, (1.0, 2.0)),
    ]


@pytest.fixture
def drawings(monkeypatch):
    """Counts the trade-off figures drawn."""
    from fedbench.reporting import plots

    calls = []
    real = plots.tradeoff_figure
    monkeypatch.setattr(plots, "tradeoff_figure", lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


def test_an_identical_plot_is_copied_not_drawn(tmp_path, drawings):
    from fedbench.reporting.plots import DIGEST_KEY, png_text, save_tradeoff

    first = save_tradeoff(_points(), tmp_path / "run-1-tradeoff.png", "acc", "PSNR", title="t", floor=10.0)
    second = save_tradeoff(_points(), tmp_path / "run-2-tradeoff.png", "acc", "PSNR", title="t", floor=10.0)
    assert len(drawings) == 1
    assert second.read_bytes() == first.read_bytes() and png_text(second)[DIGEST_KEY]
    save_tradeoff(_points(), second, "acc", "PSNR", title="t", floor=10.0)  # already there: nothing to do
    assert len(drawings) == 1


@pytest.mark.parametrize(
    "change",
    [
        dict(points=_points(shift=0.5)),
        dict(title="another"),
        dict(floor=11.0),
        dict(leakage_label="SSIM"),
    ],
)
def test_a_plot_of_other_data_is_drawn(tmp_path, drawings, change):
    from fedbench.reporting.plots import DIGEST_KEY, png_text, save_tradeoff

    base = dict(points=_points(), utility_label="acc", leakage_label="PSNR", title="t", floor=10.0)
    one = save_tradeoff(path=tmp_path / "a-tradeoff.png", **base)
    two = save_tradeoff(path=tmp_path / "b-tradeoff.png", **{**base, **change})
    assert len(drawings) == 2
    assert png_text(one)[DIGEST_KEY] != png_text(two)[DIGEST_KEY]


def test_a_png_without_the_digest_is_redrawn(tmp_path, drawings):
    from fedbench.reporting.plots import png_text, save_tradeoff

    path = save_tradeoff(_points(), tmp_path / "x-tradeoff.png", "acc", "PSNR")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0\0\0\0IEND")  # replaced by another image
    assert png_text(path) == {}
    save_tradeoff(_points(), path, "acc", "PSNR")
    assert len(drawings) == 2 and png_text(path)
    (tmp_path / "y-tradeoff.png").write_text("not a png")
    assert png_text(tmp_path / "y-tradeoff.png") == {} and png_text(tmp_path / "missing.png") == {}


def test_svg_plots_are_drawn_every_time(tmp_path, drawings):
    from fedbench.reporting.plots import save_tradeoff

    save_tradeoff(_points(), tmp_path / "a.svg", "acc", "PSNR")
    save_tradeoff(_points(), tmp_path / "a.svg", "acc", "PSNR")
    assert len(drawings) == 2
