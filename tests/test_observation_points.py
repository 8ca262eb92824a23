"""The threat model's plumbing: which defense hooks act before which observation point (issue 16).

`HOOKS_BEFORE` (fedbench.fl.simulation) is the table of docs/threat-model.md; these tests check the
engine against it with marker defenses (one hook each, scaling what passes through it), check every
registered defense against it, and check what the gradient-inversion attacks do with it: the
`example` observation under gradient pruning is pruned (defect 1), `pruning_aware=auto` follows the
defense's declaration and not the zeros of a ReLU network (defect 14), and a FedAvg update matched as
one gradient says so in the row (defect 12).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fedbench import registry
from fedbench.api import create_defense
from fedbench.attacks.inverting_gradients import InvertingGradients
from fedbench.data import load_dataset
from fedbench.defenses.gradient_pruning import prune_smallest
from fedbench.fl.simulation import HOOKS_BEFORE, ObservationRequest, Simulation
from fedbench.models import build_model
from fedbench.plugin import Defense, Scenario

POINTS = ("example", "step", "update", "server", "aggregate")
HOOKS = ("prepare_data", "loss", "per_example", "step", "update", "receive", "aggregate")
DOC = Path(__file__).resolve().parents[1] / "docs" / "threat-model.md"


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _observe(bundle, defense, point, model="mlp", **sc):
    base = dict(protocol="fedsgd", clients=2, rounds=1, batch_size=4, lr=0.1, train_size=60, test_size=20)
    base.update(sc)
    params = {"hidden": [16]} if model == "mlp" else {}
    sim = Simulation(
        Scenario.from_dict(base),
        bundle,
        lambda: build_model(model, params, bundle.meta.input_shape, bundle.meta.num_classes),
        create_defense(defense) if isinstance(defense, str) else defense,
        seed=0,
        observe=ObservationRequest(point, 0, 0),
        stop_after_observation=True,
    )
    return sim.run().observation


def _same(a, b, atol=1e-6) -> bool:
    return a.x_true.shape == b.x_true.shape and all(
        torch.allclose(a.shared[k], b.shared[k], atol=atol) for k in a.shared
    )


def _zero_fraction(obs) -> float:
    n = sum(v.numel() for v in obs.shared.values())
    return sum(int((v == 0).sum()) for v in obs.shared.values()) / n


# ------------------------------------------------------------------------------ defect 1: pruning


@pytest.mark.numeric
def test_example_observation_is_the_pruned_example_gradient(digits):
    """LODA's presets attack observe=example: under gradient pruning the attacker sees the pruned
    gradient (before the fix it saw the raw one, and the pruning rows equalled no defense)."""
    raw = _observe(digits, "none", "example")
    pruned = _observe(digits, create_defense("gradient-pruning", p=0.9), "example")
    assert torch.equal(pruned.x_true, raw.x_true)
    for k, v in raw.shared.items():
        assert torch.allclose(pruned.shared[k], prune_smallest(v, 0.9), atol=1e-7), k
        if v.numel() >= 100:
            assert float((pruned.shared[k] == 0).float().mean()) >= 0.89, k
    assert not _same(pruned, raw)
    assert pruned.defense_hooks == ("step",) and pruned.sparsified


@pytest.mark.numeric
@pytest.mark.parametrize("defense", ["none", "gradient-pruning", "soteria"])
def test_example_equals_step_at_batch_size_one(digits, defense):
    """The example observation is the per-step pipeline on a batch of that one example."""
    example = _observe(digits, defense, "example", batch_size=1)
    step = _observe(digits, defense, "step", batch_size=1)
    assert torch.equal(example.x_true, step.x_true)
    assert _same(example, step, atol=1e-6)


# -------------------------------------------------------------------- the table, with marker defenses


def _marker(hook: str) -> Defense:
    """A defense implementing only `hook`, which doubles what passes through it (halves the data)."""

    def prepare_data(self, x, y, ctx):
        return x * 0.5, y

    def loss(self, model, x, y, base_loss, ctx):
        return base_loss * 2.0

    def per_example(self, grads, ctx):
        return {k: g.mean(0) * 2.0 for k, g in grads.items()}

    def scale(self, tensors, ctx):
        return {k: v * 2.0 for k, v in tensors.items()}

    def aggregate(self, updates, weights, ctx):
        total = float(sum(weights))
        pairs = list(zip(updates, weights, strict=True))
        return {k: sum(u[k] * (w / total) for u, w in pairs) * 2.0 for k in updates[0]}

    body = {
        "prepare_data": prepare_data,
        "loss": loss,
        "per_example": per_example,
        "step": scale,
        "update": scale,
        "receive": scale,
        "aggregate": aggregate,
    }
    cls = type(f"Marker_{hook}", (Defense,), {hook: body[hook], "name": f"marker-{hook}"})
    return cls()


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("point", POINTS)
def test_hook_acts_before_point_as_the_table_says(digits, hook, point):
    raw = _observe(digits, "none", point)
    obs = _observe(digits, _marker(hook), point)
    acts = hook in HOOKS_BEFORE[point]
    assert obs.defense_hooks == ((hook,) if acts else ())
    if hook == "prepare_data":  # the data every gradient is computed on
        if point != "aggregate":
            assert torch.allclose(obs.x_true, raw.x_true * 0.5)
        return
    doubled = all(torch.allclose(obs.shared[k], 2.0 * raw.shared[k], atol=1e-6) for k in raw.shared)
    assert doubled is acts and _same(obs, raw) is not acts


def test_docs_table_is_the_engine_table():
    """docs/threat-model.md's table of hooks x observation points states HOOKS_BEFORE."""
    text = DOC.read_text(encoding="utf-8")
    header = next(line for line in text.splitlines() if line.startswith("| hook"))
    cols = [c.strip().strip("`") for c in header.strip("|").split("|")][1:]
    assert set(cols) == set(HOOKS_BEFORE)
    seen = set()
    for line in text.splitlines():
        m = re.match(r"\|\s*`(\w+)`\s*\|", line)
        if not m or m.group(1) not in HOOKS:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")][1:]
        for col, cell in zip(cols, cells, strict=True):
            assert cell.startswith("yes") == (m.group(1) in HOOKS_BEFORE[col]), (m.group(1), col, cell)
        seen.add(m.group(1))
    assert seen == set(HOOKS)


# ------------------------------------------------------------------- every registered defense


def _defense_cases():
    registry.load_builtins()
    cases = []
    for cls in registry.defenses.list():
        if cls.name.startswith("test-"):  # plugins other test modules register for their own checks
            continue
        marks = [pytest.mark.slow] if cls.name == "loda" else []  # trains its feature extractor
        for point in POINTS:
            cases.append(pytest.param(cls.name, point, marks=marks, id=f"{cls.name}-{point}"))
    return cases


ATTRIBUTE_DATA = {"shape": [1, 8, 8], "classes": 4, "n_train": 120, "n_test": 20, "attribute": True}
FAST = {"recup-fl": {"zoo": 2, "widths": [8], "epochs": 2, "p": 2, "q": 2, "pool_size": 40}}
# hooks that are no-ops in a default configuration: DP-FedAvg clips and noises at the server
# (placement=server), so its `update` hook passes the client's update on unchanged
NO_OP = {("dp-fedavg", "update")}


@pytest.fixture(scope="module")
def attribute_data():
    return load_dataset("synthetic", ATTRIBUTE_DATA)


@pytest.mark.parametrize("name,point", _defense_cases())
def test_registered_defense_acts_where_the_table_says(digits, attribute_data, name, point):
    """A defense changes the observation at a point iff one of its hooks acts before it (table), and
    the observation is marked sparsified iff one of those hooks zeroes entries (its declaration)."""
    bundle = attribute_data if name in FAST else digits
    defense = create_defense(name, **FAST.get(name, {}))
    obs = _observe(bundle, defense, point)
    raw = _observe(bundle, "none", point)
    acting = tuple(h for h in HOOKS_BEFORE[point] if defense.implements(h))
    assert obs.defense_hooks == acting
    assert obs.sparsified == bool(set(acting) & set(defense.sparsifying_hooks()))
    if not acting:
        assert torch.equal(obs.x_true, raw.x_true) and _same(obs, raw, atol=0)
    elif (name, point) not in NO_OP:
        assert not _same(obs, raw)


def test_sparsifying_declarations():
    registry.load_builtins()
    declared = {cls.name: cls().sparsifying_hooks() for cls in registry.defenses.list()}
    assert declared["gradient-pruning"] == ("step",)
    assert declared["sparsification"] == ("update",)
    assert declared["soteria"] == ("step",)
    assert declared["frl"] == ("step",)
    assert create_defense("frl", gm="round").sparsifying_hooks() == ("update",)
    assert create_defense("frl", gm="off").sparsifying_hooks() == ()
    for name in ("none", "dp-gaussian", "fed-cdp", "fed-sdp", "mixup", "instahide", "loda"):
        assert declared[name] == (), name


# --------------------------------------------------------------- defect 14: pruning_aware=auto


def test_pruning_aware_auto_follows_the_defense_not_relu_zeros(digits):
    """An undefended ReLU network's gradient is half exact zeros; auto must stay off there (the
    papers' objective) and switch on only where a sparsifying defense acted."""
    ig = InvertingGradients({"iterations": 1})
    raw = _observe(digits, "none", "example", model="cdp-cnn")
    assert _zero_fraction(raw) > 0.3  # what switched the old zero-count rule on
    out = ig.run(raw, build_model("cdp-cnn", {}, (1, 8, 8), 10), digits.meta, None, "cpu")
    assert out.extra["pruning_aware"] is False and out.extra["observation_sparsified"] is False
    pruned = _observe(digits, "gradient-pruning", "example", model="cdp-cnn")
    out = ig.run(pruned, build_model("cdp-cnn", {}, (1, 8, 8), 10), digits.meta, None, "cpu")
    assert out.extra["pruning_aware"] is True and out.extra["observation_sparsified"] is True
    # top-k of the update acts at `update`, not inside local training
    assert not _observe(digits, "sparsification", "step").sparsified
    assert _observe(digits, "sparsification", "update").sparsified


# ---------------------------------------------------------- defect 12 and the row's threat model


def _row(tmp_path, defense="none", **sc):
    from fedbench.execution.cache import RunCache
    from fedbench.execution.runner import RunContext, execute
    from fedbench.spec.run import ComponentSpec, RunSpec

    base = dict(clients=2, rounds=1, batch_size=2, lr=0.05, train_size=40, test_size=20, observe="update")
    spec = RunSpec(
        ComponentSpec.resolve("dataset", "digits", {}),
        ComponentSpec.resolve("model", "mlp", {"hidden": [8]}),
        ComponentSpec.resolve("defense", defense, {}),
        ComponentSpec.resolve("attack", "ig", {"iterations": 2}),
        Scenario.from_dict({**base, **sc}),
        0,
        preset="test",
    )
    row = execute(spec, RunCache(tmp_path / "cache"), RunContext())
    assert row["status"] == "ok", row.get("reason")
    return row


def test_fedavg_update_matched_as_one_gradient_is_stated_in_the_row(tmp_path):
    row = _row(tmp_path, protocol="fedavg", local_steps=3)
    assert row["tm_update_as_gradient"] == "-delta/(lr*3): approximate, 3 local steps"
    one = _row(tmp_path, protocol="fedavg", local_steps=1)
    assert one["tm_update_as_gradient"] == "-delta/(lr*1): exact, 1 local step"
    sgd = _row(tmp_path, protocol="fedsgd")
    assert sgd.get("tm_update_as_gradient") is None and sgd["tm_observation_kind"] == "gradient"


def test_row_names_the_defense_hooks_the_attacker_saw(tmp_path):
    row = _row(tmp_path, "gradient-pruning", protocol="fedsgd", observe="example")
    assert row["tm_defense_hooks"] == "step" and row["tm_pruning_aware"] is True
    row = _row(tmp_path, "sparsification", protocol="fedsgd", observe="step")
    assert row["tm_defense_hooks"] == "" and row["tm_pruning_aware"] is False
