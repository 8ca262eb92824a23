"""Victim batches (issues 27, 29): one attack run over several victims (`[scenario] victims`).

- The spec: the preset syntax, a batch of one is that victim's own run, the batch is in the run's key
  (not in the training's), a victim beyond the clients is a one-line error (exit 2).
- The attack core: vectorised gradient inversion (victims x restarts candidates) gives each victim what
  its own run gives, up to rounding (float64: L-BFGS amplifies float32 rounding differences between one
  candidate's autograd and a batch's vmap); an attack that cannot batch loops and gives exactly that.
- End to end: a batch run's per-image scores list every victim's images in victim order, aligned with
  the run's true images, each scored against its own victim only; victims the observed round did not
  sample get a simulation of their own.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from test_attacks_inversion import CPU, META, lenet, observe
from typer.testing import CliRunner

from fedbench.attacks import _inversion as inv
from fedbench.attacks import _victims
from fedbench.attacks.adaptive import MixupDecode
from fedbench.attacks.gradient_matching import CPL, DLG, IDLG
from fedbench.attacks.inverting_gradients import InvertingGradients
from fedbench.cli import app
from fedbench.errors import SpecError
from fedbench.execution.cache import RunCache
from fedbench.execution.runner import RunContext, attack_result, execute
from fedbench.metrics.scoring import victim_batch_metrics
from fedbench.plugin import Scenario
from fedbench.spec.grid import Overrides, build_grid
from fedbench.spec.run import ComponentSpec, RunSpec

# the attack-core tests follow optimisers: rerun under each CPU capability (.ci/run)
numeric = pytest.mark.numeric

PRESET = """
[grid]
name = "vb"
seeds = 1

[scenario]
protocol = "fedsgd"
clients = 4
rounds = 1
batch_size = 1
train_size = 40
test_size = 20
{victims}

[[dataset]]
name = "digits"

[[model]]
name = "mlp"
params = {{ hidden = [8] }}

[[attack]]
name = "ig"
params = {{ iterations = 5 }}
"""


def _grid(tmp_path, victims: str, *sets: str):
    path = tmp_path / "vb.toml"
    path.write_text(PRESET.format(victims=victims))
    return build_grid(path, Overrides(sets=sets)).specs


# ------------------------------------------------------------------------------------------ the spec


def test_preset_syntax_count_list_and_list_of_lists(tmp_path):
    (spec,) = _grid(tmp_path, "victims = 3")
    assert spec.victims == (0, 1, 2) and spec.scenario.victim == 0
    (spec,) = _grid(tmp_path, "victims = [3, 1]")
    assert spec.victims == (1, 3) and spec.scenario.victim == 1
    assert [s.victims for s in _grid(tmp_path, "victims = [[0, 1], [2, 3]]")] == [(0, 1), (2, 3)]
    # one per run, as before: a run per victim
    assert [(s.victims, s.scenario.victim) for s in _grid(tmp_path, "victim = [0, 1]")] == [((), 0), ((), 1)]


def test_a_batch_of_one_is_that_victims_own_run(tmp_path):
    (one,) = _grid(tmp_path, "victims = [2]")
    (own,) = _grid(tmp_path, "victim = 2")
    assert one == own and one.run_id == own.run_id and one.victims == ()
    assert "victims" not in one.key()  # the key (and run id) every run had before victim batches


def test_set_replaces_the_presets_victim_and_a_preset_gives_one_of_them(tmp_path):
    (spec,) = _grid(tmp_path, "victim = [0, 1]", "scenario.victims=4")
    assert spec.victims == (0, 1, 2, 3)
    assert [s.scenario.victim for s in _grid(tmp_path, "victims = 4", "scenario.victim=[1,2]")] == [1, 2]
    with pytest.raises(SpecError, match="both victim and victims"):
        _grid(tmp_path, "victim = 0\nvictims = 2")


def test_the_victim_batch_is_in_the_runs_key_not_the_trainings(tmp_path):
    (pair,) = _grid(tmp_path, "victims = 2")
    (three,) = _grid(tmp_path, "victims = 3")
    (alone,) = _grid(tmp_path, "victim = 0")
    assert len({pair.run_id, three.run_id, alone.run_id}) == 3
    assert pair.utility_id == three.utility_id == alone.utility_id  # one FL training for all of them
    assert pair.key()["victims"] == [0, 1]
    assert RunSpec.from_key(pair.key(), preset="vb") == pair
    assert RunSpec.from_key(alone.key()).victims == ()


@pytest.mark.parametrize("value", ["[0,4]", "5", "[[0],[1,9]]"])
def test_a_victim_beyond_the_clients_is_a_one_line_error(value):
    result = CliRunner().invoke(app, ["run", "smoke", "--set", f"scenario.victims={value}", "--dry-run"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "does not exist with clients = 4" in errors[0], result.output


@pytest.mark.parametrize("value", ["0", "true", "[]", "[1,1]", "[-1]"])
def test_a_malformed_victim_batch_is_a_one_line_error(value):
    result = CliRunner().invoke(app, ["run", "smoke", "--set", f"scenario.victims={value}", "--dry-run"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.startswith("error:")]) == 1


# ------------------------------------------------------------------------------------ the attack core


@pytest.fixture(scope="module")
def digits64():
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.images / 16.0).unsqueeze(1), torch.tensor(d.target, dtype=torch.long)


@pytest.fixture
def float64():
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(prev)


def _observations(digits, rows=(3, 10, 25)):
    """Observations of one model's gradient on different images: what the engine gives a batch (every
    victim received the same global state, one copy)."""
    obs = [observe(digits, [r]) for r in rows]
    state = obs[0].global_state
    return [dataclasses.replace(o, client=i, global_state=state) for i, o in enumerate(obs)]


def _alone_and_batched(attack, observations):
    alone = [attack.run(o, lenet(), META, torch.Generator().manual_seed(0), CPU) for o in observations]
    batched = _victims.run_victims(
        attack, observations, lenet, META, lambda: torch.Generator().manual_seed(0), CPU
    )
    return alone, batched


ATTACKS = {
    "dlg": lambda: DLG({"iterations": 3, "restarts": 2}),
    "idlg": lambda: IDLG({"iterations": 4}),
    # victims stop on success at different iterations (2, 2, 3): each where its own run stops
    "cpl": lambda: CPL({"iterations": 6, "restarts": 2, "success_threshold": 1e-3}),
    "ig": lambda: InvertingGradients({"iterations": 30, "restarts": 2}),
    "ig-plateau": lambda: InvertingGradients({"schedule": "plateau", "iterations": 60}),
}


@numeric
@pytest.mark.parametrize("name", list(ATTACKS))
def test_vectorised_victims_equal_their_own_runs(name, digits64, float64):
    alone, batched = _alone_and_batched(ATTACKS[name](), _observations(digits64))
    for a, b in zip(alone, batched, strict=True):
        assert b.extra.pop("victim_batch") == _victims.VECTORISED
        np.testing.assert_allclose(b.images, a.images, atol=1e-6)
        assert np.array_equal(b.labels, a.labels)
        assert b.extra.keys() == a.extra.keys()  # the extras of `run_inversion`, victim by victim
        # the chosen restart's objective; a restart far from converged follows a chaotic path under L-BFGS
        # without a line search (its objective moves with the last bits of a vmap batch's rounding)
        assert b.extra["final_objective"] == pytest.approx(a.extra["final_objective"], rel=1e-4, abs=1e-9)
        for key in ("best_restart", "label_strategy", "pruning_aware", "iterations_to_success", "success"):
            assert b.extra.get(key) == a.extra.get(key), key
        if name != "ig-plateau":  # the plateau run counts the shared optimisation's iterations
            assert b.extra["iterations"] == a.extra["iterations"]
    if name == "cpl":
        assert [b.extra["iterations"] for b in batched] != [batched[0].extra["iterations"]] * 3


@numeric
@pytest.mark.parametrize("cost", ["l2", "cosine"])
def test_the_victim_matcher_is_each_victims_matcher(cost, digits64, float64):
    """Per candidate, the objective and its gradient are those of its own victim's `GradientMatcher`
    (targets, pruning masks for the victims that prune, cosine norms, fixed labels)."""
    observations = _observations(digits64)
    model = inv.prepare_model(lenet(), observations[0].global_state, "train", CPU)
    pruning = [True, False, True]
    targets = [dict(o.shared) for o in observations]
    targets[0] = {k: torch.where(v.abs() > v.abs().median(), v, 0) for k, v in targets[0].items()}
    matcher = _victims.VictimMatcher(
        model, targets, restarts=2, labels=[o.y_true for o in observations], cost=cost, pruning=pruning
    )
    x = torch.randn((6, 1, 1, 8, 8), generator=torch.Generator().manual_seed(2), requires_grad=True)
    obj = matcher.objective(x, None)
    (grad,) = torch.autograd.grad(obj.sum(), x)
    for v, obs in enumerate(observations):
        own = inv.GradientMatcher(model, targets[v], cost=cost, pruning_aware=pruning[v])
        rows = slice(2 * v, 2 * v + 2)
        xv = x[rows].detach().requires_grad_(True)
        expected = own.objective(xv, obs.y_true.unsqueeze(0).expand(2, -1))
        torch.testing.assert_close(obj[rows], expected, rtol=1e-10, atol=1e-14)
        torch.testing.assert_close(
            grad[rows], torch.autograd.grad(expected.sum(), xv)[0], rtol=1e-9, atol=1e-14
        )


@numeric
def test_one_candidate_at_a_time_where_a_batch_does_not_pay(digits64, float64, monkeypatch):
    monkeypatch.setattr(inv, "BATCH_RESTARTS_MAX_FLOPS", 0)  # every candidate on its own, alone or not
    observations = _observations(digits64, rows=(3, 10))
    alone, batched = _alone_and_batched(IDLG({"iterations": 2, "restarts": 2}), observations)
    for a, b in zip(alone, batched, strict=True):
        assert not b.extra["restarts_batched"] and not a.extra["restarts_batched"]
        np.testing.assert_allclose(b.images, a.images, atol=1e-6)


@numeric
@pytest.mark.parametrize(("history", "iterations"), [(3, 8), (100, 6)])
def test_grouped_lbfgs_is_lbfgs_run_on_each_group(history, iterations, digits64, float64):
    """Three victims' groups of two restarts, each candidate evaluated on its own (so no vmap rounding
    differs): every group ends where `_lbfgs` on that group alone ends, through replaced curvature pairs
    (history 3), updates that drift apart and groups stopping on success at different iterations."""
    observations = _observations(digits64)
    model = inv.prepare_model(lenet(), observations[0].global_state, "train", CPU)
    matchers = [inv.GradientMatcher(model, dict(o.shared), cost="l2") for o in observations]
    restarts = 2

    def closure(zz, rows=None):
        rows = range(len(zz)) if rows is None else rows.tolist()
        objs, grads = [], []
        for zr, r in zip(zz, rows, strict=True):
            zr = zr.detach().unsqueeze(0).requires_grad_(True)
            obs = observations[r // restarts]
            obj = matchers[r // restarts].objective(zr.reshape(1, 1, 1, 8, 8), obs.y_true.unsqueeze(0))
            objs.append(obj.detach())
            grads.append(torch.autograd.grad(obj.sum(), zr)[0])
        return torch.cat(objs), torch.cat(grads)

    z = torch.randn((3 * restarts, 64), generator=torch.Generator().manual_seed(1))
    args = (iterations, 1.0, 6, history, 1e-2, True, "dlg")
    groups = torch.arange(len(z)) // restarts
    zg, fg, its, _, success, dead = _victims._lbfgs_grouped(closure, z, groups, *args)
    stops = set()
    for v in range(3):
        rows = slice(v * restarts, (v + 1) * restarts)

        def alone(zz, v=v):
            return closure(zz, torch.arange(v * restarts, v * restarts + len(zz)))

        z1, f1, it1, _, s1, d1 = inv._lbfgs(alone, z[rows], *args)
        torch.testing.assert_close(zg[rows], z1, rtol=0, atol=1e-9)
        torch.testing.assert_close(fg[rows], f1, rtol=1e-9, atol=1e-12)
        assert (its[rows], success[rows], dead[rows]) == ([it1] * restarts, s1, d1)
        stops.add(it1)
    assert len(stops) > 1  # the groups stopped at different iterations


def test_an_attack_with_a_run_of_its_own_loops_and_gives_its_own_runs(digits64):
    # mixup-decode without its defense returns its GLA: the same work through its own `run`
    attack = MixupDecode({"iterations": 5})
    observations = _observations((digits64[0].float(), digits64[1]))
    alone, batched = _alone_and_batched(attack, observations)
    for a, b in zip(alone, batched, strict=True):
        assert b.extra.pop("victim_batch").startswith("loop: mixup-decode has a run of its own")
        np.testing.assert_array_equal(b.images, a.images)


def test_what_falls_back_to_a_loop():
    obs = _observations((torch.rand(30, 1, 8, 8), torch.arange(30) % 10))
    ig = InvertingGradients({"iterations": 2})
    assert _victims.loop_reason(ig, obs, lenet(), META) is None
    moved = [
        obs[0],
        dataclasses.replace(obs[1], global_state={k: v + 1 for k, v in obs[1].global_state.items()}),
    ]
    assert "different models" in _victims.loop_reason(ig, moved, lenet(), META)
    dropout = torch.nn.Sequential(lenet(), torch.nn.Dropout(0.5))
    assert "dropout" in _victims.loop_reason(ig, obs, dropout, META)


def test_a_batch_is_scored_victim_by_victim():
    """Victim 0's reconstruction is victim 1's true image: scored against its own victim only, it leaks
    nothing of victim 0 and is no match for victim 1 (whose own reconstruction is exact)."""
    from fedbench.attacks.base import ImageReconstructionAttack

    rng = np.random.default_rng(0)
    true = rng.random((2, 1, 8, 8)).astype(np.float32)

    def part(client, images, rec):
        return {
            "client": client,
            "output": {
                "images": rec,
                "labels": np.array([1]),
                "scores": None,
                "predictions": None,
                "extra": {},
            },
            "truth": {"y": np.array([1]), "attributes": {}, "images": images},
            "observation": {
                "point": "step",
                "round": 0,
                "kind": "gradient",
                "examples": 1,
                "defense_hooks": [],
            },
        }

    attack = ImageReconstructionAttack()
    scores = victim_batch_metrics(attack, [part(3, true[:1], true[1:]), part(7, true[1:], true[1:])])
    assert scores.per_image["victim"] == [3, 7] and scores.per_image["index"] == [0, 1]
    assert scores.per_image["match"] == [0, 1]  # the run's reconstructions, victim after victim
    low, exact = scores.per_image["psnr"]
    assert exact == 100.0 and low < 20
    assert scores.columns["psnr"] == pytest.approx((low + exact) / 2)
    assert scores.columns["psnr_worst"] == 100.0 and scores.columns["tm_observed_examples"] == 2


# ---------------------------------------------------------------------------------------- end to end


def _spec(attack: str, params: dict, **scenario) -> RunSpec:
    sc = dict(protocol="fedsgd", clients=4, rounds=1, batch_size=1, lr=0.1, train_size=40, test_size=20)
    return RunSpec(
        ComponentSpec.resolve("dataset", "digits", {}),
        ComponentSpec.resolve("model", "mlp", {"hidden": [8]}),
        ComponentSpec.resolve("defense", "none", {}),
        ComponentSpec.resolve("attack", attack, params),
        Scenario.from_dict({**sc, **scenario}),
        0,
        preset="test",
    )


def _alone(spec: RunSpec, cache: RunCache) -> list:
    return [execute(spec.with_victims([v]), cache, RunContext()) for v in spec.victims]


def test_a_batch_run_lists_every_victims_images_in_victim_order(tmp_path):
    cache = RunCache(tmp_path / "c")
    spec = _spec("ig", {"iterations": 10}).with_victims([3, 0, 1])
    record = execute(spec, cache, RunContext())
    assert record.status == "ok", record.get("reason")
    assert record["sc_victim"] == "[0,1,3]" and record["tm_observed_examples"] == 3
    per_image = record.per_image
    assert per_image["victim"] == [0, 1, 3] and per_image["index"] == [0, 1, 2]
    alone = _alone(spec, cache)
    own = [r.per_image["psnr"][0] for r in alone]
    np.testing.assert_allclose(per_image["psnr"], own, atol=0.5)  # IG: signed steps, rounding rarely shows
    assert record["psnr_worst"] == pytest.approx(max(per_image["psnr"]))
    # aligned with the run's true images: the victims' own truths one after another
    result = attack_result(spec, cache, RunContext())
    truths = [
        attack_result(spec.with_victims([v]), cache, RunContext())["truth"]["images"] for v in spec.victims
    ]
    np.testing.assert_array_equal(result["truth"]["images"], np.concatenate(truths))
    assert [v["client"] for v in result["victims"]] == [0, 1, 3]


def test_a_looping_attack_in_a_batch_gives_its_per_victim_runs_even_for_unsampled_victims(tmp_path):
    """fc-leakage has a run of its own: it loops. With half the clients sampled per round, some victims
    are not in the first simulation's round and are observed in simulations of their own."""
    cache = RunCache(tmp_path / "c")
    spec = _spec("fc-leakage", {}, participation=0.5).with_victims([0, 1, 2, 3])
    record = execute(spec, cache, RunContext())
    assert record.status == "ok", record.get("reason")
    alone = _alone(spec, cache)
    assert record.per_image["victim"] == [0, 1, 2, 3]
    for key in ("psnr", "ssim", "mse"):
        np.testing.assert_allclose(record.per_image[key], [r.per_image[key][0] for r in alone], rtol=1e-6)
    assert record["psnr"] == pytest.approx(np.mean([r["psnr"] for r in alone]))
    result = attack_result(spec, cache, RunContext())
    how = {v["output"]["extra"]["victim_batch"] for v in result["victims"]}
    assert how <= {_victims.ALONE, "loop: fc-leakage has a run of its own"}, how


def test_a_membership_attack_skips_a_victim_batch_with_its_reason(tmp_path):
    spec = _spec("mia-loss", {}).with_victims([0, 1])
    record = execute(spec, RunCache(tmp_path / "c"), RunContext())
    assert record.status == "skipped" and "victim batches are for reconstruction attacks" in record["reason"]


@numeric
def test_grouped_lbfgs_steps_on_before_any_curvature_pair_is_accepted(float64):
    """A linear objective has y = 0, so no curvature pair is ever accepted (what a 99 %-pruned gradient's
    flat directions did to `dlg` on the FedSGD board: the recursion over 0 pairs raised). Every group
    then takes `_lbfgs`'s steepest-descent steps, scaled by the initial Hessian guess."""
    c = torch.tensor([[1.0, -2.0, 0.5], [0.25, 1.0, -1.0]], dtype=torch.float64)

    def closure(zz, rows=None):
        cc = c if rows is None else c[rows]
        return (zz * cc).sum(1), cc.clone()

    z = torch.zeros((2, 3), dtype=torch.float64)
    args = (3, 0.1, 4, 5, None, False, "dlg")
    zg, fg, its, _, success, dead = _victims._lbfgs_grouped(closure, z, torch.arange(2), *args)
    for v in range(2):

        def alone(zz, v=v):
            return closure(zz, torch.tensor([v]))

        z1, f1, _, _, _, _ = inv._lbfgs(alone, z[v : v + 1], *args)
        torch.testing.assert_close(zg[v : v + 1], z1, rtol=0, atol=1e-12)
        torch.testing.assert_close(fg[v : v + 1], f1, rtol=1e-12, atol=1e-12)
    assert (fg < 0).all() and not any(dead)  # it moved downhill
