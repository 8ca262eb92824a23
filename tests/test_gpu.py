"""On a CUDA device: every registered defense and attack runs end to end there, a run on the GPU agrees
with the same run on the CPU within float tolerance, and the CLI's placement options work.

Marked `gpu` (deselected by default; CI has no GPU): `pytest -m gpu tests/test_gpu.py`. The CPU and GPU
kernels differ (cuBLAS, cuDNN and their reduction orders), so an optimiser's trajectory differs too: the
comparisons hold with a margin, never bit for bit. FEDBENCH_GPU_TEST_DEVICE=cpu runs the same tests on
the CPU (a check of the tests themselves on a machine without a GPU).
"""

from __future__ import annotations

import os

import pytest
import torch
from typer.testing import CliRunner

from fedbench import registry
from fedbench.cli import app
from fedbench.execution.cache import RunCache
from fedbench.execution.runner import RunContext, execute
from fedbench.testing import cheapest_params, tiny_spec

DEVICE = os.environ.get("FEDBENCH_GPU_TEST_DEVICE", "cuda")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="no CUDA device"),
]
registry.load_builtins()
DEFENSES = sorted(c.name for c in registry.defenses.list() if not c.name.startswith("test-"))
ATTACKS = sorted(c.name for c in registry.attacks.list())


def _on(device: str, kind: str, name: str, params=None) -> dict:
    return execute(tiny_spec(kind, name, params, 0), RunCache(None), RunContext(device=device))


@pytest.mark.parametrize("defense", DEFENSES)
def test_every_defense_runs_on_the_device(defense):
    row = _on(DEVICE, "defense", defense)
    assert row["status"] == "ok", row.get("reason")
    assert 0.0 <= row["test_acc"] <= 1.0


@pytest.mark.parametrize("attack", ATTACKS)
def test_every_attack_runs_on_the_device(attack):
    row = _on(DEVICE, "attack", attack)
    assert row["status"] == "ok", row.get("reason")
    assert row.get("psnr", 1.0) > 0  # a reconstruction is never scored as the unmatched floor


@pytest.mark.parametrize("defense", ["none", "fed-cdp", "soteria"])
def test_training_on_the_device_agrees_with_the_cpu(defense):
    """The same tiny FL run: accuracy within 5 points and loss within 10 % (float kernels differ)."""
    gpu, cpu = _on(DEVICE, "defense", defense), _on("cpu", "defense", defense)
    assert abs(gpu["test_acc"] - cpu["test_acc"]) <= 0.05, (gpu["test_acc"], cpu["test_acc"])
    assert gpu["test_loss"] == pytest.approx(cpu["test_loss"], rel=0.10)


@pytest.mark.parametrize("attack", ["dlg", "inverting-gradients"])
def test_an_attack_on_the_device_leaks_like_on_the_cpu(attack):
    """The tiny victims' reconstruction on the device and on the CPU: the same re-identifications to
    within one victim's share, PSNR within 6 dB (L-BFGS and Adam paths diverge with the kernels)."""
    gpu, cpu = _on(DEVICE, "attack", attack), _on("cpu", "attack", attack)
    if "reid" in cpu:
        assert abs(gpu["reid"] - cpu["reid"]) <= 0.5, (gpu["reid"], cpu["reid"])
    assert abs(gpu["psnr"] - cpu["psnr"]) <= 6.0, (gpu["psnr"], cpu["psnr"])


def test_ghost_clipping_equals_materialised_per_example_gradients_on_the_device():
    cheap = cheapest_params("defense", "fed-cdp")
    ghost = _on(DEVICE, "defense", "fed-cdp", {**cheap, "per_example": "ghost"})
    mat = _on(DEVICE, "defense", "fed-cdp", {**cheap, "per_example": "materialise"})
    assert ghost["status"] == mat["status"] == "ok"
    assert ghost["test_acc"] == pytest.approx(mat["test_acc"], abs=0.02)
    assert ghost["test_loss"] == pytest.approx(mat["test_loss"], rel=0.02)


@pytest.mark.skipif(not DEVICE.startswith("cuda"), reason="the placement options need CUDA")
def test_cli_runs_a_preset_on_the_gpu_and_on_a_listed_gpu(tmp_path):
    runner = CliRunner()
    common = ["--set", "scenario.rounds=1", "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "out")]
    res = runner.invoke(app, ["run", "smoke", "--device", "cuda", *common])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["run", "smoke", "--gpus", "0", "--force", *common])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["run", "smoke", "--gpus", str(torch.cuda.device_count()), *common])
    assert res.exit_code == 2 and "--gpus" in res.output  # an index that does not exist: one line
