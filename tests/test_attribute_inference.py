"""attribute-inference: features, metrics, cohort observation, the attack on a planted attribute."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedbench import registry
from fedbench.attacks._attribute_core import FeatureMap, layout_for, pool_window, zoo_widths
from fedbench.data import load_dataset
from fedbench.errors import FedbenchError
from fedbench.execution.cache import RunCache
from fedbench.execution.runner import RunContext, execute
from fedbench.fl.simulation import ObservationRequest, Simulation
from fedbench.metrics.inference import attribute_scores, client_attribute
from fedbench.models import build_model
from fedbench.plugin import Scenario
from fedbench.spec.run import ComponentSpec, RunSpec

PLANTED = {"shape": [16], "classes": 2, "n_train": 600, "n_test": 100, "attribute": True}
SCENARIO = dict(protocol="fedsgd", clients=60, rounds=1, batch_size=0, lr=0.1, train_size=60, test_size=100)


def _spec(attack_params=None, defense="none", defense_params=None, dataset_params=None, **sc):
    return RunSpec(
        ComponentSpec.resolve(
            "dataset", "synthetic", dataset_params or {**PLANTED, "attribute_strength": 2.0}
        ),
        ComponentSpec.resolve("model", "mlp", {"hidden": [8]}),
        ComponentSpec.resolve("defense", defense, defense_params or {}),
        ComponentSpec.resolve(
            "attack",
            "attribute-inference",
            {"pool_size": 300, "epochs": 30, "stru_widths": [32], **(attack_params or {})},
        ),
        Scenario.from_dict({**SCENARIO, **sc}),
        0,
        preset="test",
    )


def test_scores_by_hand():
    s = attribute_scores([0, 0, 0, 1, 2], [0, 0, 1, 1, 0], majority_class=0)
    assert s["asr"] == pytest.approx(3 / 5)
    assert s["asr_balanced"] == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert s["asr_majority"] == pytest.approx(3 / 5) and s["asr_advantage"] == pytest.approx(0.0)
    assert client_attribute([2, 1, 2]) == 2
    with pytest.raises(ValueError, match="equal"):
        attribute_scores([0, 1], [0], 0)


def test_feature_map_pools_each_tensor_and_is_differentiable():
    model = build_model("mlp", {"hidden": [8]}, (16,), 2)
    state = model.state_dict()
    names = [n for n, _ in model.named_parameters()]
    layout = layout_for(state, names, "all")
    assert layout.dim == 16 * 8 + 8 + 8 * 2 + 2
    window = pool_window(layout, 40)
    fmap = FeatureMap(layout, window)
    assert fmap.dim <= 40 and window > 1
    x = torch.randn(3, layout.dim, requires_grad=True)
    fmap(x).sum().backward()
    # max-pool: one arg-max per window gets the gradient, the rest none (sparse FGSM)
    assert int((x.grad[0] != 0).sum()) == fmap.dim
    only_fc1 = layout_for(state, names, "fc1")
    assert only_fc1.names == ("fc1.weight", "fc1.bias")
    with pytest.raises(FedbenchError, match="layers=conv9"):
        layout_for(state, names, "conv9")


def test_zoo_member_zero_is_the_stru_nn_default():
    a = zoo_widths(20, (128, 256, 512, 1024, 2048), 0)
    assert len(a) == 20 == len(set(a)) and all(len(w) == 3 for w in a)
    assert a[0] == zoo_widths(1, (128, 256, 512, 1024, 2048), 0)[0]


def test_cohort_observation_holds_every_participant():
    bundle = load_dataset("synthetic", {**PLANTED})
    sc = Scenario.from_dict({**SCENARIO, "participation": 0.5})
    sim = Simulation(
        sc,
        bundle,
        lambda: build_model("mlp", {"hidden": [8]}, (16,), 2),
        registry.defenses.get("none")(),
        seed=0,
        observe=ObservationRequest("update", 0, 3, cohort=True),
        stop_after_observation=True,
    )
    obs = sim.run().observation
    clients = [o.client for o in obs.cohort]
    assert len(clients) == 30 and 3 in clients and obs.client == 3
    assert all(o.global_state is obs.cohort[0].global_state for o in obs.cohort)  # one shared copy
    assert all(len(o.attr_true["attr"]) == 1 for o in obs.cohort)


@pytest.mark.numeric
def test_attack_beats_majority_on_a_planted_attribute_with_every_adversary(tmp_path):
    cache = RunCache(tmp_path / "c")
    for adversary in ("stru-nn", "svm", "rf"):
        row = execute(_spec({"adversary": adversary}), cache, RunContext())
        assert row["status"] == "ok", row["reason"]
        assert row["aia_victims"] == 60 and row["aia_attribute"] == "attr"
        assert row["asr"] > row["asr_majority"] + 0.2, (adversary, row["asr"], row["asr_majority"])
    # no planted attribute: the updates carry nothing about it, so no advantage beyond chance noise
    flat = execute(
        _spec({"adversary": "rf"}, dataset_params={**PLANTED, "attribute_strength": 0.0}), cache, RunContext()
    )
    assert flat["asr_advantage"] < 0.15


def test_unknown_attribute_and_attribute_free_datasets_are_skipped(tmp_path):
    row = execute(_spec({"attribute": "race"}), RunCache(None), RunContext())
    assert row["status"] == "skipped" and "no attribute 'race'" in row["reason"]
    spec = _spec(dataset_params={"shape": [16], "classes": 2, "n_train": 200})
    row = execute(spec, RunCache(None), RunContext())
    assert row["status"] == "skipped" and "has none" in row["reason"]


def test_disjoint_pool_needs_records_beyond_train_size():
    row = execute(_spec(train_size=0, clients=60), RunCache(None), RunContext())
    assert row["status"] == "failed" and "pool=overlap" in row["reason"]
    row = execute(
        _spec({"pool": "overlap", "adversary": "rf"}, train_size=0, clients=60), RunCache(None), RunContext()
    )
    assert row["status"] == "ok" and row["aia_pool"] == 300


def test_metric_columns_are_declared():
    from fedbench.metrics.catalogue import METRICS

    for name in ("asr", "asr_balanced", "asr_advantage", "asr_majority"):
        assert METRICS[name].better == "lower"
    assert np.isclose(METRICS["asr"].scale, 100)


def test_audio_mnist_reads_a_local_root_with_speaker_attributes(tmp_path, monkeypatch):
    from scipy.io import wavfile

    monkeypatch.setenv("FEDBENCH_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "AudioMNIST" / "data"
    meta = {
        "1": {"gender": "male", "native speaker": "yes", "accent": "German"},
        "2": {"gender": "female", "native speaker": "no", "accent": "Spanish"},
    }
    (data).mkdir(parents=True)
    (data / "audioMNIST_meta.txt").write_text(repr(meta))
    rng = np.random.default_rng(0)
    for spk in ("01", "02"):
        (data / spk).mkdir()
        for digit in range(10):
            for k in range(2):
                wave = (rng.normal(size=48000 // 2) * 3000).astype(np.int16)
                wavfile.write(data / spk / f"{digit}_{spk}_{k}.wav", 48000, wave)
    bundle = load_dataset("audio-mnist", {"size": 16}, data_root=str(tmp_path))
    assert tuple(bundle.x_train.shape[1:]) == (1, 16, 16) and len(bundle.y_train) == 32
    assert bundle.meta.attribute_names["identity"][0] == "male native"
    male = bundle.attr_train["gender"] == 1
    assert set(bundle.attr_train["identity"][male].tolist()) == {0}  # male native speaker 01
    assert set(bundle.attr_train["identity"][~male].tolist()) == {3}  # female non-native speaker 02
    with pytest.raises(FedbenchError, match="--data-root"):
        load_dataset("audio-mnist", {"size": 16})


# ---------------------------------------------------------------- the adaptive adversary (train_on)


def test_train_on_defaults_to_clean_and_keeps_the_earlier_cache_key():
    default = ComponentSpec.resolve("attack", "attribute-inference", {})
    assert default.params_dict["train_on"] == "clean"
    assert "train_on" not in default.key()["params"]  # run_ids of clean runs are those before the option
    assert ComponentSpec.resolve("attack", "aia", {"train_on": "clean"}).key() == default.key()
    adaptive = ComponentSpec.resolve("attack", "aia", {"train_on": "defended"})
    assert (
        adaptive.key()["params"]["train_on"] == "defended"
        and adaptive.label == "attribute-inference[train_on=defended]"
    )
    with pytest.raises(FedbenchError, match="train_on"):
        ComponentSpec.resolve("attack", "aia", {"train_on": "adaptive"})


@pytest.mark.numeric
def test_replayed_pool_update_is_the_update_the_client_sent():
    """pool=overlap puts the victims in the pool: the replay of a deterministic defense must reproduce
    each victim's shared update exactly (one zoo member, Q = 1: RecUP-FL's sampling is fixed)."""
    from fedbench.attacks._attribute_core import defended_pool_features, pool_updates

    bundle = load_dataset("synthetic", {**PLANTED, "attribute_strength": 2.0})
    sc = Scenario.from_dict({**SCENARIO, "clients": 20, "train_size": 20})
    for name, params in (
        ("sparsification", {"fraction": 0.3}),
        ("recup-fl", {"zoo": 1, "q": 1, "p": 2, "eps": 0.05, "widths": [8], "epochs": 2, "pool": "overlap"}),
        ("dp-gaussian", {"sigma": 0.0, "clip": 1e6}),
    ):
        defense = registry.defenses.get(name)(params)
        sim = Simulation(
            sc,
            bundle,
            lambda: build_model("mlp", {"hidden": [8]}, (16,), 2),
            defense,
            seed=0,
            observe=ObservationRequest("update", 0, 0, cohort=True),
            stop_after_observation=True,
        )
        obs = sim.run().observation
        model = build_model("mlp", {"hidden": [8]}, (16,), 2)
        state = obs.global_state
        # fc1 only: the output layer's two per-class gradients are exact opposites, and pruning breaks
        # such magnitude ties by last-bit differences between batched and per-example autograd
        layout = layout_for(state, [n for n, _ in model.named_parameters()], "fc1")
        fmap = FeatureMap(layout, 1)
        idx = np.asarray([sim.client_indices[o.client][0] for o in obs.cohort])
        replay = defended_pool_features(sim.defense, sim.run_data(), idx, model, state, layout, fmap, obs, 5)
        sent = torch.stack([layout.flatten(o.shared) for o in obs.cohort])
        assert torch.allclose(replay, sent, atol=1e-6), name
        if name == "dp-gaussian":  # no noise, no clipping: the clean pool updates
            clean = pool_updates(
                model, state, layout, bundle.x_train[idx], bundle.y_train[idx], "ce", "gradient", 0.1
            )
            assert torch.allclose(replay, clean, atol=1e-6)
        else:
            assert not torch.allclose(
                replay,
                pool_updates(
                    model, state, layout, bundle.x_train[idx], bundle.y_train[idx], "ce", "gradient", 0.1
                ),
            )


@pytest.mark.numeric
def test_defense_aware_adversary_sees_through_dp_noise_and_recup(tmp_path):
    cache = RunCache(tmp_path / "c")
    asr = {}
    for defense, params in (
        ("dp-gaussian", {"sigma": 0.1, "clip": 100.0}),
        ("recup-fl", {"zoo": 3, "widths": [16], "epochs": 20, "p": 3, "q": 2, "pool_size": 300, "eps": 0.3}),
    ):
        for train_on in ("clean", "defended"):
            spec = _spec({"adversary": "svm", "train_on": train_on}, defense, params)
            row = execute(spec, cache, RunContext())
            assert row["status"] == "ok", row["reason"]
            asr[defense, train_on] = row["asr"]
            majority = row["asr_majority"]
    # measured: dp-gaussian 0.60 clean vs 1.00 defended; recup-fl 0.58 vs 1.00; majority 0.42
    for defense in ("dp-gaussian", "recup-fl"):
        assert asr[defense, "defended"] > asr[defense, "clean"] + 0.2, (defense, asr)
        assert asr[defense, "defended"] > majority + 0.3, (defense, asr, majority)


def test_defended_training_refuses_defenses_it_cannot_replay():
    spec = _spec({"adversary": "svm", "train_on": "defended"}, "mixup")
    row = execute(spec, RunCache(None), RunContext())
    assert row["status"] == "failed", row
    assert "prepare_data" in row["reason"] and "train_on=clean" in row["reason"]
