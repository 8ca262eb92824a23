"""Issue 30's membership design: the whole pool queried (every member and every non-member a candidate),
references trained on halves of it, and offline LiRA (`mia-lira-online` with `mode=offline`) scoring
each candidate against its OUT references only. Synthetic phi values, no training: seconds."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import fedbench.attacks.lira_online  # noqa: F401  (registers the attack)
from fedbench import registry
from fedbench.attacks import _references_core as refcore
from fedbench.attacks.lira_online import lira_offline_scores, lira_online_scores
from fedbench.cli import app
from fedbench.errors import FedbenchError
from fedbench.metrics.membership import operating_point
from fedbench.spec.run import ComponentSpec


def _halves(n_members: int, k: int, shift: float, seed: int = 0):
    """phi of n members and n non-members under k references on balanced halves, and the target's.

    Each example has its own difficulty d_i (a model without it predicts d_i + noise); a reference
    holding it is `shift` more confident, and so is the target on its members only."""
    rng = np.random.default_rng(seed)
    n = 2 * n_members
    difficulty = rng.normal(0.0, 3.0, n)  # wide spread: a global threshold (mia-loss) is weak here
    is_in = refcore.balanced_in(k, n, rng)
    phi_ref = difficulty + rng.normal(0.0, 1.0, (k, n)) + shift * is_in
    member = np.arange(n) < n_members
    phi_target = difficulty + rng.normal(0.0, 1.0, n) + shift * member
    return phi_target, phi_ref, is_in, member


def test_offline_scores_from_halves_find_shifted_members_at_low_fpr():
    """Members shifted by 3 reference sigmas: at 1 % FPR over 2,000 non-members (20 false positives
    allowed) the one-sided test finds most members (expected TPR ~ 0.6; the bound leaves a wide margin),
    where the raw phi (a global threshold, as mia-loss) finds few."""
    phi_target, phi_ref, is_in, member = _halves(2000, 8, shift=3.0)
    scores = lira_offline_scores(phi_target, phi_ref, is_in)
    point = operating_point(member, scores, 0.01)
    assert point.fpr <= 0.01 and point.tpr > 0.3, point
    raw = operating_point(member, phi_target, 0.01).tpr
    assert point.tpr > raw + 0.2, (point.tpr, raw)
    # no shift: no leak, TPR at chance (1 %) within sampling noise
    phi_target, phi_ref, is_in, member = _halves(2000, 8, shift=0.0, seed=1)
    null_tpr = operating_point(member, lira_offline_scores(phi_target, phi_ref, is_in), 0.01).tpr
    assert null_tpr < 0.03


def test_offline_score_is_the_one_sided_z_of_the_out_references_by_hand():
    ref = np.array([[4.0, 0.0], [6.0, 2.0], [0.0, 5.0], [2.0, 7.0]])
    is_in = np.array([[True, False], [True, False], [False, True], [False, True]])
    target = np.array([5.0, 1.0])
    # example 0: OUT {0, 2} mean 1; example 1: OUT {0, 2} mean 1; per-example and pooled var 2
    want = [(5 - 1) / np.sqrt(2), (1 - 1) / np.sqrt(2)]
    assert lira_offline_scores(target, ref, is_in, fixed_variance=False) == pytest.approx(want)
    assert lira_offline_scores(target, ref, is_in) == pytest.approx(want)
    with pytest.raises(ValueError, match="at least 2 OUT"):
        lira_offline_scores(target, ref[:3], is_in[:3])


def test_an_out_only_score_never_reads_an_in_reference():
    """Any value in an IN slot (NaN, huge) leaves the offline scores unchanged; the online rule reads them."""
    phi_target, phi_ref, is_in, _ = _halves(50, 6, shift=2.0)
    clean = lira_offline_scores(phi_target, phi_ref, is_in, fixed_variance=False)
    for poison in (np.nan, 1e12, -1e12):
        dirty = np.where(is_in, poison, phi_ref)
        assert lira_offline_scores(phi_target, dirty, is_in, fixed_variance=False) == pytest.approx(clean)
        assert lira_offline_scores(phi_target, dirty, is_in) == pytest.approx(
            lira_offline_scores(phi_target, phi_ref, is_in)
        )
    moved = lira_online_scores(phi_target, np.where(is_in, 1e3, phi_ref), is_in)
    assert not np.allclose(moved, lira_online_scores(phi_target, phi_ref, is_in))


def test_mode_is_key_optional_so_online_runs_keep_their_ids():
    online = ComponentSpec.resolve("attack", "mia-lira-online", {"members": "all"})
    named = ComponentSpec.resolve("attack", "mia-lira-online", {"members": "all", "mode": "online"})
    offline = ComponentSpec.resolve("attack", "mia-lira-online", {"members": "all", "mode": "offline"})
    assert "mode" not in online.key()["params"] and online.key() == named.key()
    assert offline.key()["params"]["mode"] == "offline"
    assert registry.attacks.get("mia-lira-online").make_params({"mode": "offline"}).mode == "offline"


# ------------------------------------------------------------------------------ reference size


def test_a_pool_queried_whole_fills_references_without_own_data():
    """2,500 pairs: 5,000 candidates, each reference holds 2,500 of them, the target's size."""
    refcore.check_fill(2500, refcore.balanced_in(4, 5000, np.random.default_rng(0)).sum(axis=1), 0, 0)


@pytest.mark.parametrize(
    "size, held, own, requested, match",
    [
        # RMIA's population takes half of the 100 spare records: 50 cannot top 2,400 up to 2,500
        (2500, [2400, 2400], 50, 0, r"reference_size = 0 \(the target's 2500\).*set reference_size <= 2450"),
        # an odd candidate count: the reference holding the fewer (n // 2) needs one more record
        (10, [5, 4], 5, 10, r"reference_size = 10: 5 attacker .* needs 6 more\); set reference_size <= 9"),
        # a size below what the halves already hold
        (100, [150, 150], 1000, 100, r"reference_size = 100: .* up to 150 .* raise reference_size to >= 150"),
    ],
)
def test_references_that_cannot_be_filled_fail_in_one_line_naming_reference_size(
    size, held, own, requested, match
):
    with pytest.raises(FedbenchError, match=match) as err:
        refcore.check_fill(size, np.array(held), own, requested)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------ the presets


@pytest.mark.parametrize("preset", ["board-membership", "tune-dp-membership"])
def test_validate_accepts_the_membership_presets(preset):
    res = CliRunner().invoke(app, ["validate", preset], catch_exceptions=False)
    assert res.exit_code == 0 and "valid" in res.output, res.output


def test_reference_halves_do_not_depend_on_the_candidates_order():
    """The references are the attacker's: the same candidates shuffled by another target seed must give
    the same training sets (so one set of trained references serves every seed), and `is_in` must still
    say, in the run's own order, which reference holds which candidate."""
    import numpy as np
    import torch

    from fedbench.attacks._references_core import assign_halves

    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(40, 1, 4, 4, generator=gen), torch.randint(0, 3, (40,), generator=gen)
    perm = torch.randperm(40, generator=gen)
    is_in, picks = assign_halves(4, x, y, np.random.default_rng(7), online=True)
    is_in_p, picks_p = assign_halves(4, x[perm], y[perm], np.random.default_rng(7), online=True)
    for j in range(4):
        assert torch.equal(x[picks[j]], x[perm][picks_p[j]])  # the same examples, in the same order
        assert set(np.nonzero(is_in[j])[0]) == set(picks[j].tolist())
        assert set(perm[np.nonzero(is_in_p[j])[0]].tolist()) == set(np.nonzero(is_in[j])[0].tolist())
    assert (is_in.sum(axis=0) == 2).all()  # each candidate IN for exactly half of the 4
    off, none = assign_halves(4, x, y, np.random.default_rng(7), online=False)
    assert not off.any() and all(len(p) == 0 for p in none)
