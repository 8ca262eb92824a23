"""Gradient-inversion attacks (dlg, idlg, cpl, inverting-gradients), label recovery and the batched core.

The victim is a tiny sigmoid LeNet (DLG-style, U(-0.5, 0.5) weights) on real 8x8 sklearn digits; the
observation is the gradient of the mean cross-entropy at that random init, computed here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedbench.attacks import _inversion as inv
from fedbench.attacks.gradient_matching import CPL, DLG, IDLG
from fedbench.attacks.inverting_gradients import InvertingGradients
from fedbench.attacks.label_recovery import batch_labels, idlg_label, last_layer, mean_prediction
from fedbench.errors import RunFailure
from fedbench.plugin import DatasetMeta, Observation, Scenario

MEAN, STD = 0.3, 0.4
META = DatasetMeta("digits8", (1, 8, 8), 10, "image", (MEAN,), (STD,))
CPU = torch.device("cpu")

# every test here follows an optimiser or compares float paths: rerun under each CPU capability (.ci/run)
pytestmark = pytest.mark.numeric


def lenet(seed: int = 1) -> nn.Module:
    torch.manual_seed(seed)
    m = nn.Sequential(
        nn.Conv2d(1, 12, 5, 2, 2),
        nn.Sigmoid(),
        nn.Conv2d(12, 12, 5, 1, 2),
        nn.Sigmoid(),
        nn.Conv2d(12, 12, 5, 1, 2),
        nn.Sigmoid(),
        nn.Flatten(),
        nn.Linear(12 * 16, 10),
    )
    for p in m.parameters():
        nn.init.uniform_(p, -0.5, 0.5)
    return m


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny problems: one thread is as fast and immune to oversubscription on a busy 2-core machine."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images / 16.0, dtype=torch.float32).unsqueeze(1)
    return x, torch.tensor(d.target, dtype=torch.long)


def observe(
    digits, idx: list[int], *, model: nn.Module | None = None, kind: str = "gradient", lr: float = 0.1
) -> Observation:
    """Victim gradient of the mean CE; x_true is NaN so any read of it would poison the attack."""
    x01, y = digits[0][idx], digits[1][idx]
    m = model or lenet()
    x = (x01 - MEAN) / STD
    g = torch.autograd.grad(F.cross_entropy(m(x), y), list(m.parameters()))
    shared = {n: gi.detach() for (n, _), gi in zip(m.named_parameters(), g, strict=True)}
    if kind == "delta":
        shared = {n: -lr * v for n, v in shared.items()}
    return Observation(
        "step",
        0,
        0,
        kind,
        shared,
        {k: v.clone() for k, v in m.state_dict().items()},
        torch.full_like(x, float("nan")),
        y.clone(),
        lr,
        1,
        len(idx),
        "train" if m.training else "eval",
    )


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(1.0 / max(np.mean((a - b) ** 2), 1e-12)))


def run(attack, obs, model=None, seed=0):
    return attack.run(obs, model or lenet(), META, torch.Generator().manual_seed(seed), CPU)


def test_idlg_label_batch_of_one(digits):
    for i in range(8):
        obs = observe(digits, [i])
        w, b = last_layer(lenet(), obs.shared, 10)
        assert idlg_label(w, b) == int(digits[1][i])
        assert idlg_label(w, None) == int(digits[1][i])  # weight-row-sum rule (no bias)


def test_batch_label_recovery_distinct(digits):
    idx = [0, 1, 2, 3]  # labels 0, 1, 2, 3 in load_digits order
    obs = observe(digits, idx)
    w, b = last_layer(lenet(), obs.shared, 10)
    pbar = mean_prediction(lenet(), (1, 8, 8), torch.Generator().manual_seed(0), CPU)
    assert sorted(batch_labels(w, b, 4, pbar).tolist()) == sorted(digits[1][idx].tolist())
    rep = [0, 10, 5, 9]  # a repeated label (two zeros)
    w, b = last_layer(lenet(), observe(digits, rep).shared, 10)
    assert sorted(batch_labels(w, b, 4, pbar).tolist()) == sorted(digits[1][rep].tolist())
    out = run(IDLG({"iterations": 1, "labels": "batch"}), obs)
    assert sorted(out.labels.tolist()) == sorted(digits[1][idx].tolist())
    assert out.extra["label_strategy"] == "batch" and out.extra["labels_known"] is False


def test_idlg_and_dlg_reach_high_psnr(digits):
    gt = digits[0][[0]].numpy()
    out = run(IDLG({"iterations": 30}), observe(digits, [0]))
    assert out.labels.tolist() == [0]
    assert psnr(out.images, gt) > 25
    # DLG from one random init is unstable (as in the paper's code): 4 batched restarts, best kept
    out = run(DLG({"iterations": 30, "restarts": 4}), observe(digits, [2]))
    assert psnr(out.images, digits[0][[2]].numpy()) > 25
    assert out.labels.tolist() == [2]
    objs = out.extra["restart_objectives"]
    assert out.extra["best_restart"] == int(np.nanargmin([math.inf if v is None else v for v in objs]))
    assert out.extra["final_objective"] == min(v for v in objs if v is not None)


def test_cpl_records_iterations_to_success(digits):
    out = run(CPL({}), observe(digits, [1]))
    assert out.extra["success"] is True
    assert 0 <= out.extra["iterations_to_success"] <= 300
    assert out.extra["final_objective"] < 1e-4
    assert psnr(out.images, digits[0][[1]].numpy()) > 25
    out = run(CPL({"iterations": 1, "max_iter": 2, "success_threshold": 1e-12}), observe(digits, [1]))
    assert out.extra["success"] is False and out.extra["iterations_to_success"] is None


def test_ig_beats_random_and_output_contract(digits):
    idx = [5, 6]
    obs = observe(digits, idx)
    out = run(InvertingGradients({"iterations": 150, "labels": "batch"}), obs)
    assert out.images.shape == (2, 1, 8, 8) and out.images.dtype == np.float32
    assert out.images.min() >= 0 and out.images.max() <= 1
    assert out.labels.shape == (2,) and out.labels.dtype == np.int64
    gt = digits[0][idx].numpy()
    # match reconstructions to ground truth by the better of the two orders
    score = max(psnr(out.images, gt), psnr(out.images[::-1], gt))
    rand = psnr(np.random.default_rng(0).random(gt.shape, dtype=np.float32), gt)
    assert score > rand + 8
    assert out.extra["tv_weight"] == 0.0 and out.extra["bn_stats_known"] is False
    assert out.extra["model_mode"] == "train"
    json_ok = __import__("json").dumps(out.extra)
    assert "iterations" in json_ok


def test_x_true_never_read(digits):
    obs = observe(digits, [3])
    assert torch.isnan(obs.x_true).all()
    for attack in (IDLG({"iterations": 5}), InvertingGradients({"iterations": 20}), CPL({"iterations": 3})):
        out = run(attack, obs)
        assert np.isfinite(out.images).all()


def test_nan_raises_run_failure_naming_the_attack(digits):
    obs = observe(digits, [0])
    shared = dict(obs.shared)
    key = next(iter(shared))
    shared[key] = shared[key].clone()
    shared[key].view(-1)[0] = float("nan")
    bad = Observation(**{**obs.__dict__, "shared": shared})
    for attack in (DLG({"iterations": 2}), InvertingGradients({"iterations": 3}), CPL({"iterations": 2})):
        with pytest.raises(RunFailure, match=f"{attack.name}: non-finite objective at iteration"):
            run(attack, bad)


def test_pruning_aware_matching_ignores_pruned_coordinates(digits):
    obs = observe(digits, [0])
    pruned = {}
    for k, v in obs.shared.items():  # keep the top 10% magnitudes per tensor (spec 001 §2.2)
        kk = max(1, int(v.numel() * 0.1))
        thr = v.abs().flatten().topk(kk).values[-1]
        pruned[k] = torch.where(v.abs() >= thr, v, torch.zeros_like(v))
    on, frac = inv.resolve_pruning("auto", True, list(pruned.values()))
    assert on and frac > 0.8
    # auto follows the defense's declaration, never the zeros alone
    assert inv.resolve_pruning("auto", False, list(pruned.values()))[0] is False
    assert inv.resolve_pruning("on", False, list(obs.shared.values()))[0] is True
    model = inv.prepare_model(lenet(), obs.global_state, "train", CPU)
    x = torch.randn(1, 1, 1, 8, 8)
    y = torch.zeros(1, 1, dtype=torch.long)
    for cost in ("l2", "cosine"):
        m_on = inv.GradientMatcher(model, pruned, cost=cost, pruning_aware=True)
        m_off = inv.GradientMatcher(model, pruned, cost=cost, pruning_aware=False)
        g = m_on.gradients(x, y)
        g2 = [
            gi + 3.0 * (t == 0).to(gi) * torch.randn_like(gi) for gi, t in zip(g, m_on.targets, strict=True)
        ]
        assert torch.allclose(m_on.match(g), m_on.match(g2), rtol=1e-5, atol=1e-7)
        assert not torch.allclose(m_off.match(g), m_off.match(g2), rtol=1e-3)
    out = run(
        InvertingGradients({"iterations": 10}),
        Observation(**{**obs.__dict__, "shared": pruned, "sparsified": True}),
    )
    assert out.extra["pruning_aware"] is True


def _problem(digits, cost="cosine"):
    obs = observe(digits, [4])
    model = inv.prepare_model(lenet(), obs.global_state, "train", CPU)
    return inv.GradientMatcher(model, dict(obs.shared), cost=cost), obs.y_true


def test_batched_ig_equals_separate_runs(digits):
    matcher, y = _problem(digits)
    x0 = torch.randn((3, 1, 1, 8, 8), generator=torch.Generator().manual_seed(3))
    box = inv.box_bounds(META, 1, CPU)
    kw = dict(labels=y, optimizer="adam-signed", iterations=40, lr=0.1, box=box)
    batched = inv.reconstruct_batched(matcher, x0, **kw)
    for r in range(3):
        single = inv.reconstruct_batched(matcher, x0[r : r + 1], **kw)
        assert torch.allclose(single.x[0], batched.x[r], atol=1e-4)
        assert torch.allclose(single.objective[0], batched.objective[r], atol=1e-5)
    assert batched.best == int(torch.argmin(batched.objective))


def test_batched_lbfgs_equals_torch_lbfgs_and_separate_runs(digits):
    # float64: L-BFGS amplifies rounding differences, so exactness is checked in double precision
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        matcher, y = _problem((digits[0].double(), digits[1]), cost="l2")
        x0 = torch.randn((2, 1, 1, 8, 8), generator=torch.Generator().manual_seed(5))
        for iterations, max_iter in ((2, 5), (1, 3)):
            kw = dict(labels=y, optimizer="lbfgs", iterations=iterations, lr=1.0, lbfgs_max_iter=max_iter)
            batched = inv.reconstruct_batched(matcher, x0, **kw)
            for r in range(2):
                xr = x0[r].clone().requires_grad_(True)
                opt = torch.optim.LBFGS([xr], lr=1.0, max_iter=max_iter, history_size=100)
                best = {"loss": float("inf"), "x": None}  # the attack returns the best iterate

                def closure(opt=opt, xr=xr, best=best):
                    opt.zero_grad()
                    loss = matcher.objective(xr.unsqueeze(0), y.unsqueeze(0)).sum()
                    loss.backward()
                    if float(loss.detach()) < best["loss"]:
                        best["loss"], best["x"] = float(loss), xr.detach().clone()
                    return loss

                for _ in range(iterations):
                    opt.step(closure)
                closure()
                assert torch.allclose(best["x"], batched.x[r], atol=1e-8)
                single = inv.reconstruct_batched(matcher, x0[r : r + 1], **kw)
                assert torch.allclose(single.x[0], batched.x[r], atol=1e-8)
    finally:
        torch.set_default_dtype(prev)


def test_delta_observation_and_eval_mode_bn(digits):
    obs = observe(digits, [7], kind="delta", lr=0.05)
    out = run(IDLG({"iterations": 20}), obs)
    assert out.labels.tolist() == [7] and "equivalent gradient" in out.extra["observation_note"]
    assert psnr(out.images, digits[0][[7]].numpy()) > 25
    for mode in ("train", "eval"):
        torch.manual_seed(0)
        m = nn.Sequential(
            nn.Conv2d(1, 4, 3, 1, 1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(256, 10)
        )
        m.train(mode == "train")
        obs = observe(digits, [1, 2], model=m)
        fresh = nn.Sequential(
            nn.Conv2d(1, 4, 3, 1, 1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(256, 10)
        )
        out = run(InvertingGradients({"iterations": 5, "restarts": 2, "labels": "batch"}), obs, model=fresh)
        assert out.images.shape == (2, 1, 8, 8) and out.extra["model_mode"] == mode


def test_checks_and_params():
    tab = DatasetMeta("adult", (103,), 2, "tabular")
    for cls in (DLG, IDLG, CPL, InvertingGradients):
        a = cls()
        assert a.check_meta(tab) and a.check_meta(META) is None
        assert a.check(Scenario()) is None and a.check(Scenario(loss="mse"))
        assert a.observation_point == "update" and set(a.accepted_points) == {
            "example",
            "step",
            "update",
            "server",
        }
        assert a.paper is not None and a.version.isdigit()
    with pytest.raises(Exception, match="optimise"):
        InvertingGradients({"labels": "optimise"})
    assert InvertingGradients().settings(META)["tv_weight"] == 0.0
    rgb = DatasetMeta("cifar", (3, 32, 32), 10, "image", (0.5,) * 3, (0.25,) * 3)
    assert InvertingGradients().settings(rgb)["tv_weight"] == 1e-4


def test_lbfgs_that_diverges_keeps_each_candidates_best_finite_iterate():
    # a quadratic whose objective turns NaN after a few evaluations (as a noisy target can make L-BFGS
    # without a line search overshoot): the run returns the best finite iterate, flagged as diverged
    calls = {"n": 0}

    def closure(z):
        calls["n"] += 1
        loss = ((z - 1.0) ** 2).sum(1)
        grad = 2 * (z - 1.0)
        if calls["n"] > 3:
            loss = loss * float("nan")
        return loss, grad

    z0 = torch.zeros(2, 4)
    z, final, _iters, _evals, _success, dead = inv._lbfgs(closure, z0, 10, 0.1, 5, 10, None, False, "dlg")
    assert dead == [True, True]
    assert torch.isfinite(final).all() and (final < 4.0).all()  # better than the start (loss 4)
    assert torch.allclose(((z - 1.0) ** 2).sum(1), final)


def test_lbfgs_with_no_finite_objective_fails_naming_the_attack():
    def closure(z):
        return torch.full((z.shape[0],), float("nan")), torch.zeros_like(z)

    with pytest.raises(RunFailure, match="dlg: non-finite objective"):
        inv._lbfgs(closure, torch.zeros(2, 3), 5, 0.1, 5, 10, None, False, "dlg")


# ------------------------------------------------------------------ the plateau ("auto") schedule


def test_plateau_schedule_batched_runs_decide_per_candidate_and_stop_when_converged(digits):
    from fedbench.attacks._schedules import Plateau

    matcher, y = _problem(digits)
    x0 = torch.randn((3, 1, 1, 8, 8), generator=torch.Generator().manual_seed(3))
    box = inv.box_bounds(META, 1, CPU)
    plateau = Plateau(patience=10, check_every=5)
    kw = dict(labels=y, optimizer="adam-signed", iterations=5000, lr=0.1, box=box, plateau=plateau)
    batched = inv.reconstruct_batched(matcher, x0, **kw)
    assert batched.stopped == "converged" and batched.iterations < 5000
    for r in range(3):  # each candidate decays and stops on its own
        decays = batched.lr_decays[r]
        assert len(decays) == 3 and decays == sorted(set(decays)) and decays[-1] < batched.iterations
    single = inv.reconstruct_batched(matcher, x0[:1], **kw)
    assert single.stopped == "converged" and len(single.lr_decays[0]) == 3
    # batched (vmap) and single gradients differ in the last float digits, and signed steps amplify
    # that over hundreds of iterations: the same candidate ends at a comparable objective, not the same
    assert float(single.objective[0]) == pytest.approx(float(batched.objective[0]), rel=1.0, abs=1e-3)


def test_plateau_schedule_reaches_the_paper_schedules_objective_sooner(digits):
    """The point of the schedule: what the paper's fixed milestones reach at the end of their budget
    (to within 2x in objective), the plateau schedule reaches in far fewer iterations, both measured here.

    Both schedules end at the float32 floor of the cosine cost (|objective| ~ 1e-7, rounding noise), so
    the target is 2x the paper's final objective or 1e-6, whichever is larger. The paper's schedule holds
    lr 0.1 until its first milestone (600 * 3/8 = 225), and signed Adam at lr 0.1 jitters at ~1e-5: it
    needs ~230 iterations whatever the kernels. The plateau schedule decays as soon as lr 0.1 stalls
    (~75-95 iterations) and is at the target by 90-110 (starts 0, 1, 3 under ATEN default and avx2,
    each also with MKL/oneDNN capped to SSE4). Two thirds of the paper's count (~155) leaves 45-65
    iterations of margin. When it *stops* is not asserted here: at the float floor rounding noise reads
    as progress, so the stop iteration (140-360 on those kernels) is the float path's, not the
    schedule's; stopping is test_plateau_schedule_batched_runs_decide_per_candidate_and_stop_when_converged's.
    """
    from fedbench.attacks._schedules import Plateau

    matcher, y = _problem(digits)
    x0 = torch.randn((1, 1, 1, 8, 8), generator=torch.Generator().manual_seed(3))
    box = inv.box_bounds(META, 1, CPU)
    kw = dict(labels=y, optimizer="adam-signed", lr=0.1, box=box)
    paper = inv.reconstruct_batched(matcher, x0, iterations=600, **kw)
    target = max(2 * float(paper.objective[0]), 1e-6)
    paper_needs = inv.reconstruct_batched(matcher, x0, iterations=600, success_threshold=target, **kw)
    paper_iterations = paper_needs.iterations_to_success[0]
    assert paper_iterations is not None
    # a capped plateau run is the uncapped run's prefix (its decisions read only the past)
    budget = 2 * paper_iterations // 3
    auto = inv.reconstruct_batched(matcher, x0, iterations=budget, plateau=Plateau(10, check_every=5), **kw)
    assert float(auto.objective[0]) <= target, (budget, paper_iterations, auto.lr_decays)
    assert auto.lr_decays[0], "reached without a decay: the problem no longer tells the schedules apart"


def test_plateau_schedule_without_decay_stops_at_the_first_plateau_and_respects_the_cap(digits):
    from fedbench.attacks._schedules import Plateau

    matcher, y = _problem(digits)
    x0 = torch.randn((1, 1, 1, 8, 8), generator=torch.Generator().manual_seed(3))
    box = inv.box_bounds(META, 1, CPU)
    kw = dict(labels=y, optimizer="adam-signed", lr=0.1, box=box)
    flat = inv.reconstruct_batched(
        matcher, x0, iterations=5000, lr_decay=False, plateau=Plateau(10, 1e-3, 3, 0.1, 5), **kw
    )
    assert flat.stopped == "converged" and flat.lr_decays == [[]]
    capped = inv.reconstruct_batched(matcher, x0, iterations=30, plateau=Plateau(patience=1000), **kw)
    assert capped.stopped == "budget" and capped.iterations == 30


def test_plateau_schedule_sees_a_plateau_below_zero():
    """A cosine cost can dip just below 0 by rounding; a constant negative objective is a plateau (an
    improvement must beat best by rtol of |best|), so the schedule decays and stops instead of running
    to its cap (it did, on AVX2 kernels: best -2.4e-7 recurring counted as progress)."""
    from fedbench.attacks._schedules import Plateau

    class Flat:
        def objective(self, x, y):
            return (x * 0).flatten(1).sum(1) - 2.4e-7

    x0 = torch.zeros((2, 1, 1, 4, 4))
    res = inv.reconstruct_batched(
        Flat(), x0, labels=torch.zeros(1, dtype=torch.long), optimizer="adam-signed", iterations=5000,
        lr=0.1, box=None, plateau=Plateau(patience=10, check_every=5),
    )  # fmt: skip
    assert res.stopped == "converged" and res.iterations < 100
    assert [len(d) for d in res.lr_decays] == [3, 3]


def test_ig_default_is_the_stall_schedule_and_a_number_keeps_the_papers(digits):
    obs = observe(digits, [4])
    auto = run(InvertingGradients({}), obs)
    assert auto.extra["schedule"] == "stall" and auto.extra["stopped"] == "converged"
    assert auto.extra["iterations"] < 24000 and len(auto.extra["lr_decays"]) == 3
    assert psnr(auto.images, digits[0][[4]].numpy()) > 25
    # issue 29: converges sooner than the plateau schedule (the default before), which stays by name
    old = run(InvertingGradients({"schedule": "plateau"}), obs)
    assert old.extra["schedule"] == "plateau" and old.extra["stopped"] == "converged"
    assert auto.extra["iterations"] < 0.9 * old.extra["iterations"], (auto.extra, old.extra)
    assert auto.extra["lr_decays"][0] < old.extra["lr_decays"][0]
    fixed = run(InvertingGradients({"iterations": 10}), obs)
    assert fixed.extra["iterations"] == 10 and "schedule" not in fixed.extra
    forced = run(InvertingGradients({"iterations": 60, "schedule": "plateau"}), obs)
    assert forced.extra["schedule"] == "plateau" and forced.extra["iterations"] <= 60


def test_explicit_budgets_run_the_papers_milestones_untouched_by_the_stall_schedule(digits, monkeypatch):
    """A preset's `iterations=N` (every committed board) must give the results of before: no plateau
    object reaches the optimiser, and the milestone loop is the one it always was (its output equals
    a direct `_adam_signed` call, whatever the stall constants are)."""
    from fedbench.attacks import _schedules

    obs = observe(digits, [4])
    attack = InvertingGradients({"iterations": 40})
    cfg = attack.settings(META)
    assert cfg["plateau"] is None and cfg["schedule"] == "milestones" and cfg["iterations"] == 40
    before = run(attack, obs)
    monkeypatch.setattr(_schedules, "STALL", _schedules.Plateau(patience=1, rtol=0.5, check_every=1))
    after = run(InvertingGradients({"iterations": 40}), obs)
    assert np.array_equal(before.images, after.images)
    # the paper's schedule by name, without a number: its 24,000 iterations
    assert InvertingGradients({"schedule": "milestones"}).settings(META)["iterations"] == 24000
    # budget_scale does not reach a fixed-budget milestone run
    assert InvertingGradients({"iterations": 40, "budget_scale": 2}).settings(META)["plateau"] is None


def test_stall_schedule_constants_cap_and_growth():
    from fedbench.attacks._schedules import STALL, Plateau, auto_schedule, stall_schedule

    cap, sched = stall_schedule((1, 28, 28))
    assert cap == 24000 and sched == STALL
    assert [sched.patience_after(k) for k in range(4)] == [10, 20, 40, 80]
    assert Plateau(patience=50).patience_after(3) == 50  # growth 1: the plateau schedule of before
    assert stall_schedule((3, 32, 32))[1].patience == 20 and stall_schedule((3, 64, 64))[1].patience == 40
    cap2, sched2 = stall_schedule((1, 28, 28), 2.0)
    assert cap2 == 48000 and sched2.patience == 20 and sched2.rtol == STALL.rtol
    # the plateau schedule's table is unchanged (schedule=plateau reproduces the old default)
    assert auto_schedule((1, 28, 28)) == (4800, 50) and auto_schedule((1, 32, 32)) == (4800, 50)
    assert auto_schedule((3, 32, 32)) == (4800, 100) and auto_schedule((3, 64, 64)) == (24000, 200)


def test_stall_patience_grows_after_each_decay():
    """A flat objective decays at the base patience, then waits `growth` times longer per phase."""
    from fedbench.attacks._schedules import Plateau

    class Flat:
        def objective(self, x, y):
            return (x * 0).flatten(1).sum(1) + 1.0

    res = inv.reconstruct_batched(
        Flat(), torch.zeros((1, 1, 1, 4, 4)), labels=torch.zeros(1, dtype=torch.long),
        optimizer="adam-signed", iterations=5000, lr=0.1, box=None,
        plateau=Plateau(patience=10, rtol=2e-2, check_every=5, growth=2.0),
    )  # fmt: skip
    assert res.stopped == "converged" and res.lr_decays == [[10, 30, 70]] and res.iterations == 150


def test_budget_scale_keys_and_scaled_budgets():
    from fedbench.reporting.budget_check import doubled_attack
    from fedbench.spec.run import ComponentSpec

    # a preset's explicit budget keeps its run id: `schedule` and `budget_scale` at their defaults stay
    # out of the key
    key = ComponentSpec.resolve("attack", "ig", {"iterations": 200}).key()
    assert "schedule" not in key["params"] and "budget_scale" not in key["params"]
    assert key["params"]["iterations"] == 200 and key["version"] == "2"
    default = ComponentSpec.resolve("attack", "ig", {})
    assert "budget_scale" not in default.key()["params"]
    assert (
        ComponentSpec.resolve("attack", "ig", {"schedule": "plateau"}).key()["params"]["schedule"]
        == "plateau"
    )
    # the budget check: an explicit budget doubles its iterations; the stall schedule its cap and
    # patience; an explicit adaptive schedule both
    assert doubled_attack(ComponentSpec.resolve("attack", "ig", {"iterations": 200}), 2).label == (
        "inverting-gradients[iterations=400]"
    )
    auto = doubled_attack(default, 2)
    assert auto.label == "inverting-gradients[budget_scale=2]"
    cfg = auto.instantiate().settings(META)
    assert cfg["iterations"] == 48000 and cfg["plateau"].patience == 20
    both = doubled_attack(ComponentSpec.resolve("attack", "ig", {"iterations": 60, "schedule": "plateau"}), 3)
    assert both.params_dict["iterations"] == 180 and both.params_dict["budget_scale"] == 3
    assert both.instantiate().settings(META)["plateau"].patience == 150
    paper = doubled_attack(ComponentSpec.resolve("attack", "ig", {"schedule": "milestones"}), 2)
    assert paper.params_dict["iterations"] == 48000
    assert doubled_attack(ComponentSpec.resolve("attack", "dlg", {}), 2).params_dict["iterations"] == 100
    # an auto schedule that declares no budget to scale is not doubled
    assert doubled_attack(ComponentSpec.resolve("attack", "noise-aware", {}), 2) is None
    with pytest.raises(Exception, match="budget_scale"):
        ComponentSpec.resolve("attack", "ig", {"budget_scale": 0})


def test_restarts_are_batched_only_where_it_pays(digits, monkeypatch):
    matcher, y = _problem(digits)
    x0 = torch.randn((3, 1, 1, 8, 8), generator=torch.Generator().manual_seed(3))
    state = torch.random.get_rng_state()
    assert inv.restarts_pay_as_one_batch(matcher, x0[0])  # a tiny LeNet: a few kFLOP per candidate
    assert torch.equal(torch.random.get_rng_state(), state)  # counting FLOPs draws nothing
    monkeypatch.setattr(inv, "BATCH_RESTARTS_MAX_FLOPS", 10.0)  # as if the model were ConvNet-64
    assert not inv.restarts_pay_as_one_batch(matcher, x0[0])
    kw = dict(labels=y, optimizer="adam-signed", iterations=20, lr=0.1, box=inv.box_bounds(META, 1, CPU))
    one_at_a_time = inv.reconstruct_restarts(matcher, x0, batched=False, **kw)
    for r in range(3):
        single = inv.reconstruct_batched(matcher, x0[r : r + 1], **kw)
        assert torch.equal(single.x[0], one_at_a_time.x[r]) and torch.equal(
            single.objective[0], one_at_a_time.objective[r]
        )
    batched = inv.reconstruct_restarts(matcher, x0, batched=True, **kw)
    assert torch.allclose(batched.x, one_at_a_time.x, atol=1e-4) and batched.best == one_at_a_time.best
    out = run(InvertingGradients({"iterations": 5, "restarts": 2}), observe(digits, [4]))
    assert out.extra["restarts_batched"] is False and len(out.extra["restart_objectives"]) == 2
