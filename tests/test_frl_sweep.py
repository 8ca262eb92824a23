"""FRL's simulated attacker is swept, not fixed (issue 26, item 8): the `frl` preset crosses the SA
network's steps per classifier step (`sa_steps`) with its Adam learning rate (`sa_lr`), the swept values
are valid FRL parameters, and each one reaches the SA network's training (not a label only)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_frl import _bound, _ctx, _frl

from fedbench.spec.grid import build_grid


@pytest.fixture(scope="module")
def frl_configs() -> list[dict]:
    """The parameters of every FRL configuration the `frl` preset runs (as resolved: defaults filled)."""
    grid = build_grid("frl")  # resolving a block validates its parameters (ranges, types)
    configs = {s.defense.label: s.defense.params_dict for s in grid.specs if s.defense.name == "frl"}
    return list(configs.values())


def test_the_frl_preset_sweeps_sa_steps_and_sa_lr(frl_configs):
    steps = {c["sa_steps"] for c in frl_configs}
    lrs = {c["sa_lr"] for c in frl_configs}
    assert len(steps) >= 2 and 1 in steps, steps  # the default and another schedule
    assert len(lrs) >= 3 and 1e-3 in lrs, lrs  # the default and a decade either side
    assert min(lrs) < 1e-3 < max(lrs)
    # crossed at one lambda: every schedule with every learning rate, the rest of FRL unchanged
    for lam in {c["lam"] for c in frl_configs}:
        at = {(c["sa_steps"], c["sa_lr"]) for c in frl_configs if c["lam"] == lam}
        if at == {(s, lr) for s in steps for lr in lrs}:
            break
    else:
        pytest.fail(f"no lambda crosses sa_steps {sorted(steps)} with sa_lr {sorted(lrs)}")
    swept = [c for c in frl_configs if c["lam"] == lam]
    rest = {k for k in swept[0] if k not in ("sa_steps", "sa_lr")}
    assert all({k: c[k] for k in rest} == {k: swept[0][k] for k in rest} for c in swept)


def test_each_swept_configuration_is_a_valid_frl(frl_configs):
    from fedbench.registry import defenses

    cls = defenses.get("frl")
    for config in frl_configs:
        frl = cls(config)
        assert frl.params.sa_steps == config["sa_steps"] and frl.params.sa_lr == config["sa_lr"]


@pytest.mark.parametrize(("sa_steps", "sa_lr"), [(1, 1e-3), (5, 1e-3), (1, 1e-2), (5, 1e-4)])
def test_sa_steps_and_sa_lr_drive_the_sa_networks_training(sa_steps, sa_lr, monkeypatch):
    """One classifier step trains the SA network `sa_steps` times with Adam at `sa_lr`."""
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    x, y = torch.randn(8, 5), torch.arange(8) % 3
    frl = _frl(lam=5.0, sa_steps=sa_steps, sa_lr=sa_lr)
    _bound(frl)
    calls = []
    original = torch.optim.Adam.step

    def counted(self, *args, **kwargs):
        calls.append(self.param_groups[0]["lr"])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", counted)
    frl.loss(model, x, y, F.cross_entropy(model(x), y), _ctx(model))
    assert calls == [sa_lr] * sa_steps
