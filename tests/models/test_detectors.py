"""Detectors: labels from incidents, rules on features, the classifier and anomaly detector,
node aggregation and the saved-model round trip."""

from __future__ import annotations

import numpy as np
import pytest

from models.anomaly import AnomalyDetector
from models.base import CLASSES, FeatureMismatch, ModelNotFitted, class_index
from models.bundle import ModelBundle, ScoreBatch
from models.classifier import FailureClassifier
from models.labels import LabelSettings, label_rows
from models.node_scores import aggregate, score_batches
from models.rules import RulesDetector
from pipeline.batch import FeatureBatch
from pipeline.features import FEATURE_NAMES

F = len(FEATURE_NAMES)


def col(name):
    return FEATURE_NAMES.index(name)


def quiet_rows(n: int) -> np.ndarray:
    """*n* feature rows of a quiet GPU: every count and rate 0, no BMC data (a 0 BMC margin is at critical)."""
    x = np.zeros((n, F), np.float32)
    x[:, [i for i, name in enumerate(FEATURE_NAMES) if name.startswith("node_bmc_")]] = np.nan
    return x


def test_labels_mark_precursor_rows_of_the_faulty_gpu_and_exclude_the_broken_period():
    ts = np.arange(0, 20000, 600.0).repeat(2)
    node = np.array(["n1"] * len(ts), object)
    gpu = np.tile([0, 1], len(ts) // 2)
    inc = [{"node": "n1", "gpu": 1, "fault": "nvlink", "onset_ts": 3000.0, "failure_ts": 6000.0}]
    y, keep = label_rows(ts, node, gpu, inc, LabelSettings(exclude_after_s=3600))
    pos = (gpu == 1) & (ts >= 3000) & (ts <= 6300)
    assert (y[pos] == class_index("nvlink")).all() and (y[~pos] == 0).all()
    assert not keep[(ts > 6300) & (ts <= 9600)].any() and keep[ts > 9600].all()


def test_node_level_faults_label_every_gpu_and_app_errors_label_nothing():
    ts = np.array([100.0, 100.0, 100.0])
    node = np.array(["n1", "n1", "n2"], object)
    gpu = np.array([0, 1, 0])
    incs = [{"node": "n1", "gpu": None, "fault": "ib_link", "onset_ts": None, "failure_ts": 50.0},
            {"node": "n2", "gpu": 0, "fault": "app_error", "onset_ts": None, "failure_ts": 90.0}]
    y, keep = label_rows(ts, node, gpu, incs)
    assert y.tolist() == [class_index("ib_link")] * 2 + [0] and keep.all()


def test_rules_fire_in_priority_order_with_readable_reasons():
    x = quiet_rows(3)
    x[1, col("xid_nvlink_count_short")] = 1
    x[2, col("xid_nvlink_count_short")] = 2
    x[2, col("xid_off_bus_count_short")] = 1
    r = RulesDetector(FEATURE_NAMES)
    out = r.score(x)
    assert out.p.tolist() == [0, 1, 1]
    assert [CLASSES[k] for k in out.fault] == ["none", "nvlink", "gpu_off_bus"]
    assert "XID 74" in r.reason(int(out.detail["rule"][1]), x[1])


def test_rules_referring_to_unknown_features_fail_at_start():
    with pytest.raises(FeatureMismatch, match="unknown features"):
        RulesDetector(("a", "b"))


def _toy(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (n, F)).astype(np.float32)
    y = np.zeros(n, np.int8)
    hot = rng.random(n) < 0.1
    x[hot, col("ecc_sbe_per_h_long")] += 50
    y[hot] = class_index("hbm_ecc")
    return x, y


def test_classifier_learns_a_signal_and_calibrates_and_explains_it():
    x, y = _toy()
    xv, yv = _toy(seed=1)
    clf = FailureClassifier(FEATURE_NAMES, max_iter=30).fit(x, y, x_val=xv, y_val=yv)
    out = clf.score(xv)
    assert out.p[yv > 0].mean() > 0.9 and out.p[yv == 0].mean() < 0.1
    named = (yv > 0) & (out.p >= clf.class_min_p)  # below class_min_p no class is named, by design
    assert named.mean() > 0.95 * (yv > 0).mean() and (out.fault[named] == class_index("hbm_ecc")).all()
    row = xv[np.flatnonzero(yv > 0)[0]]
    assert "ecc_sbe_per_h_long" in clf.explain(row, class_index("hbm_ecc"))


def test_scoring_before_fitting_or_with_wrong_width_fails_clearly():
    with pytest.raises(ModelNotFitted):
        FailureClassifier(FEATURE_NAMES).score(np.zeros((1, F)))
    with pytest.raises(FeatureMismatch, match="expected"):
        RulesDetector(FEATURE_NAMES).score(np.zeros((1, 3)))


def test_anomaly_level_is_high_for_rows_unlike_healthy_ones():
    rng = np.random.default_rng(0)
    healthy = np.zeros((3000, F), np.float32)  # healthy GPUs: small peer deviations
    for name in ("sm_clock_deficit_vs_peers", "temp_gpu_excess_vs_peers", "node_temp_gpu_fleet_z"):
        healthy[:, col(name)] = rng.normal(0, 0.5, len(healthy))
    det = AnomalyDetector(FEATURE_NAMES, n_estimators=50).fit(healthy, np.zeros(len(healthy), np.int8))
    weird = healthy[:5].copy()
    weird[:, col("sm_clock_deficit_vs_peers")] = 20.0   # far slower than its peers, and hotter
    weird[:, col("temp_gpu_excess_vs_peers")] = 15.0
    assert det.score(weird).p.min() > 0.99 and det.score(healthy[:500]).p.mean() < 0.7


def test_the_anomaly_detector_reads_gauges_and_leaves_error_counters_to_their_baselines():
    """A counter is zero on most healthy GPUs with a heavy benign tail on a few (SBE bursts, CRC,
    a lone XID 94): no healthy scale, and the next fleet's benign pattern would read as strange.
    The detector compares gauges with peers; a counter's burst does not move its level."""
    from models.inputs import model_inputs

    det = AnomalyDetector(FEATURE_NAMES, model_inputs(FEATURE_NAMES))
    viewed = {det.inputs[i] for i in det.cols}
    assert {"sm_clock_deficit_vs_peers", "sm_clock_deficit_vs_busy_peers", "node_temp_gpu_fleet_z"} <= viewed
    assert not {n for n in viewed if any(k in n for k in ("_cusum", "_per_h_", "_per_min_", "xid_", "_frac_"))}
    rng = np.random.default_rng(1)
    healthy = np.zeros((3000, F), np.float32)
    healthy[:, col("temp_gpu_excess_vs_peers")] = rng.normal(0, 0.5, len(healthy))
    det.fit(healthy, np.zeros(len(healthy), np.int8))
    base = healthy[:3].copy()
    burst = base.copy()
    burst[:, col("nvlink_crc_cusum")] = 1e5
    burst[:, col("ecc_sbe_per_h_short")] = 5e3
    assert np.array_equal(det.score(burst).p, det.score(base).p)


def test_saved_bundle_loads_and_scores_identically(tmp_path):
    x, y = _toy()
    clf = FailureClassifier(FEATURE_NAMES, max_iter=20).fit(x, y, x_val=x, y_val=y)
    b = ModelBundle(RulesDetector(FEATURE_NAMES), clf, AnomalyDetector(FEATURE_NAMES, n_estimators=20).fit(x, y),
                    metadata={"training": {"recordings": ["r"]}}, metrics={"ap": 1.0})
    b.save(tmp_path / "m")
    back = ModelBundle.load(tmp_path / "m")
    a, c = b.score(x[:100]), back.score(x[:100])
    np.testing.assert_array_equal(a.p_fail, c.p_fail)
    np.testing.assert_array_equal(a.anomaly, c.anomaly)
    assert back.metrics == {"ap": 1.0} and back.metadata["training"]["recordings"] == ["r"]


def test_a_seed_ensemble_averages_its_members_calibrated_probabilities_and_saves_them(tmp_path):
    x, y = _toy()
    xv, yv = _toy(seed=1)
    one = FailureClassifier(FEATURE_NAMES, max_iter=20, max_features=0.3).fit(x, y, x_val=xv, y_val=yv)
    three = FailureClassifier(FEATURE_NAMES, max_iter=20, max_features=0.3, members=3).fit(x, y, x_val=xv, y_val=yv)
    assert len(three.extra) == 2 and all(cal is not None for _, cal in three.extra)
    seeds = [m.random_state for m in (three.model, *(m for m, _ in three.extra))]
    assert seeds == [0, 1, 2]
    # member 0 is the single model; the ensemble's p is the mean of the members' calibrated p
    np.testing.assert_array_equal(one.score(xv[:50]).detail["raw"], three.score(xv[:50]).detail["raw"])
    each = [cal.predict_proba(np.log(np.clip(r, 1e-7, 1 - 1e-7) / (1 - np.clip(r, 1e-7, 1 - 1e-7)))[:, None])[:, 1]
            for r, cal in [(m.predict_proba(xv[:50])[:, 1], c) for m, c in
                           [(three.model, three.calibrator), *three.extra]]]
    np.testing.assert_allclose(three.score(xv[:50]).p, np.mean(each, axis=0), atol=1e-5)
    b = ModelBundle(RulesDetector(FEATURE_NAMES), three, AnomalyDetector(FEATURE_NAMES, n_estimators=20).fit(x, y))
    b.save(tmp_path / "m")
    back = ModelBundle.load(tmp_path / "m")
    assert back.classifier.members == 3
    np.testing.assert_array_equal(b.score(xv[:100]).p_fail, back.score(xv[:100]).p_fail)
    with pytest.raises(ValueError, match="members"):
        FailureClassifier(FEATURE_NAMES, members=0)


def _saved_small_bundle(path, inputs=None):
    x, y = _toy()
    clf = FailureClassifier(FEATURE_NAMES, inputs, max_iter=10).fit(x, y)
    return ModelBundle(RulesDetector(FEATURE_NAMES), clf).save(path)


def test_a_model_that_reads_a_feature_this_gpuops_no_longer_computes_is_refused_with_the_fix(tmp_path):
    inputs = [n for n in FEATURE_NAMES if n != "pcie_replay_per_min_long"] + ["pcie_replay_per_min_long"]
    path = _saved_small_bundle(tmp_path / "m", inputs)
    with pytest.raises(FeatureMismatch, match="gpuops train"):
        ModelBundle.load(path, feature_names=[n for n in FEATURE_NAMES if n != "pcie_replay_per_min_long"])


def test_a_model_keeps_loading_and_scoring_the_same_when_the_pipeline_appends_features(tmp_path):
    x, _ = _toy()
    inputs = FEATURE_NAMES[:-5]
    path = _saved_small_bundle(tmp_path / "m", inputs)
    before = ModelBundle.load(path).score(x[:200]).p_fail
    wider = tuple(FEATURE_NAMES) + ("a_feature_added_later",)
    x_wide = np.c_[x[:200], np.full(200, 7.0, np.float32)]
    after = ModelBundle.load(path, feature_names=wider).score(x_wide).p_fail
    np.testing.assert_array_equal(before, after)


def test_a_model_is_refused_under_other_pipeline_windows_or_another_scikit_learn(tmp_path):
    import json

    from models.base import ModelError
    from pipeline.settings import PipelineSettings

    path = _saved_small_bundle(tmp_path / "m")
    with pytest.raises(ModelError, match="cadence_s=60.0 \\(now 30.0\\)"):
        ModelBundle.load(path, pipeline=PipelineSettings(cadence_s=30, bucket_s=30, short_window_s=30))
    meta = json.loads((path / "model.json").read_text())
    (path / "model.json").write_text(json.dumps(meta | {"sklearn_version": "0.1"}))
    with pytest.raises(ModelError, match="scikit-learn 0.1"):
        ModelBundle.load(path)


def test_the_model_records_its_windows_cadence_inputs_and_scikit_learn_version(tmp_path):
    import json

    import sklearn

    meta = json.loads((_saved_small_bundle(tmp_path / "m", FEATURE_NAMES[:50]) / "model.json").read_text())
    assert meta["pipeline"] == {"cadence_s": 60.0, "bucket_s": 60.0, "short_window_s": 60.0, "long_window_s": 1800.0}
    assert meta["sklearn_version"] == sklearn.__version__
    assert meta["inputs"]["classifier"] == list(FEATURE_NAMES[:50])


def test_node_aggregation_takes_the_worst_gpu_and_the_first_rule():
    x = np.zeros((4, F), np.float32)
    x[1, col("xid_nvlink_count_short")] = 1
    x[3, col("ecc_dbe_per_h_short")] = 5
    batch = FeatureBatch(60.0, np.array(["a", "a", "b", "b"], object), np.array([0, 1, 0, 1], np.int16), x)
    bundle = ModelBundle.rules_only()
    (sc,) = score_batches(bundle, [batch])
    ns = aggregate(batch, sc, bundle.rules)
    assert ns.node.tolist() == ["a", "b"]
    assert ns.rule_gpu.tolist() == [1, 1]
    assert [ns.rule_fault_class(i).value for i in range(2)] == ["nvlink", "hbm_ecc"]
    assert [a.value for a in ns.rule_action] == ["drain", "reset"]


def _two_nodes(column: str, values: list[float]) -> tuple[FeatureBatch, ScoreBatch, ModelBundle]:
    """Nodes a and b of two GPUs each, *column* set per row, scored by the rules only; the worst GPU
    (highest p_fail) is a's GPU 1 and b's GPU 0 until a test changes ``p_fail``."""
    x = np.zeros((4, F), np.float32)
    x[:, col(column)] = values
    batch = FeatureBatch(60.0, np.array(["a", "a", "b", "b"], object), np.array([0, 1, 0, 1], np.int16), x)
    bundle = ModelBundle.rules_only()
    (sc,) = score_batches(bundle, [batch])
    sc.p_fail[:] = [0.1, 0.9, 0.9, 0.1]
    return batch, sc, bundle


def test_node_aggregation_says_whether_the_worst_gpu_logged_corrected_errors_this_minute():
    batch, sc, bundle = _two_nodes("ecc_sbe_per_h_short", [0.0, 120.0, 0.0, 0.0])  # a's worst: errors; b's: none
    assert aggregate(batch, sc, bundle.rules).sbe_now.tolist() == [True, False]
    batch.x[2, col("ecc_sbe_per_h_short")] = np.nan  # b's worst GPU reports no ECC counter: unknown, not quiet
    assert aggregate(batch, sc, bundle.rules).sbe_now.tolist() == [True, True]


def test_node_aggregation_carries_the_worst_gpus_pcie_replay_rate():
    batch, sc, bundle = _two_nodes("pcie_replay_per_min_short", [40.0, 3.0, np.nan, 20.0])  # b's worst: no reading
    got = aggregate(batch, sc, bundle.rules).pcie_per_min
    assert got[0] == 3.0 and np.isnan(got[1])


def test_node_aggregation_says_whether_the_worst_gpu_was_read_this_tick():
    batch, sc, bundle = _two_nodes("samples_short", [3.0, 0.0, np.nan, 0.0])  # a's worst: no sample; b's: unknown
    ns = aggregate(batch, sc, bundle.rules)
    assert ns.fresh.tolist() == [False, True] and not ns.is_fresh(0) and ns.is_fresh(1)
    sc.p_fail[:] = [0.9, 0.1, 0.1, 0.9]           # now a's worst was read, b's was not
    assert aggregate(batch, sc, bundle.rules).fresh.tolist() == [True, False]


def test_node_aggregation_carries_how_many_gpus_the_node_has_lost_and_reading():
    batch, sc, bundle = _two_nodes("node_gpus_lost", [0.0, 0.0, 1.0, 1.0])  # a node feature: one value per node
    batch.x[:, col("node_gpus_reading")] = [2.0, 2.0, 1.0, 1.0]
    ns = aggregate(batch, sc, bundle.rules)
    assert ns.gpus_lost.tolist() == [0, 1] and ns.lost_gpus(0) == 0 and ns.lost_gpus(1) == 1
    assert ns.gpus_reading.tolist() == [2, 1] and ns.reading_gpus(1) == 1


def test_many_ticks_scored_at_once_equal_ticks_scored_one_by_one():
    x, y = _toy(600)
    clf = FailureClassifier(FEATURE_NAMES, max_iter=10).fit(x, y, x_val=x, y_val=y)
    bundle = ModelBundle(RulesDetector(FEATURE_NAMES), clf)
    batches = [FeatureBatch(60.0 * k, np.array(["n"] * 100, object), np.arange(100, dtype=np.int16),
                            x[k * 100:(k + 1) * 100]) for k in range(6)]
    together = score_batches(bundle, batches)
    apart = [score_batches(bundle, [b])[0] for b in batches]
    for a, b in zip(together, apart):
        np.testing.assert_allclose(a.p_fail, b.p_fail, rtol=1e-6)


def test_failure_probability_never_drops_as_an_error_rate_grows():
    rng = np.random.default_rng(2)
    x = np.zeros((4000, F), np.float32)
    x[:, col("util_gpu_mean_short")] = rng.uniform(0, 100, len(x))
    y = np.zeros(len(x), np.int8)
    # only moderate replay rates are ever seen failing; a naive tree model would call a storm healthy
    sick = rng.random(len(x)) < 0.1
    x[sick, col("pcie_replay_per_min_short")] = rng.uniform(50, 200, sick.sum())
    y[sick] = class_index("pcie")
    clf = FailureClassifier(FEATURE_NAMES, max_iter=30).fit(x, y, x_val=x, y_val=y)
    probe = np.zeros((6, F), np.float32)
    probe[:, col("pcie_replay_per_min_short")] = [0, 10, 60, 150, 1000, 10000]
    p = clf.score(probe).p
    assert np.all(np.diff(p) >= 0) and p[-1] > 0.5


def _rule_on(**features):
    x = quiet_rows(1)
    for k, v in features.items():
        x[0, col(k)] = v
    det = RulesDetector(FEATURE_NAMES)
    k = int(det.score(x).detail["rule"][0])
    return None if k < 0 else det.rules[k]


def test_a_link_flap_that_recovers_is_ignored_repeated_flaps_alert_and_a_port_that_stays_down_drains():
    assert _rule_on(net_link_downed_per_min_short=1.0, net_link_downed_per_min_port_max_long=1 / 30) is None
    flapping = _rule_on(net_link_downed_per_min_short=1.0, net_link_downed_per_min_port_max_long=4 / 30)
    assert flapping is not None and flapping.action.value == "alert"
    down = _rule_on(net_link_downed_per_min_short=1.0, net_port_down_after_active_s=180.0)
    assert down is not None and down.action.value == "drain"


def test_a_brief_or_facility_wide_power_brake_is_ridden_out_and_one_nodes_own_drains():
    assert _rule_on(throttle_hw_power_brake_frac_short=1.0, throttle_hw_power_brake_frac_long=0.05) is None
    rack = dict(throttle_hw_power_brake_frac_short=1.0, throttle_hw_power_brake_frac_long=0.5)
    assert _rule_on(**rack, other_nodes_power_brake_short=5) is None
    assert _rule_on(**rack, other_nodes_power_brake_short=1) is None  # two nodes at once: a shared cause
    held = _rule_on(**rack, other_nodes_power_brake_short=0)
    assert held is not None and held.name == "hw_power_brake" and held.action.value == "drain"


def test_a_shared_brakes_edge_is_not_one_nodes_own_but_a_failing_supply_beside_a_short_one_is():
    """At a shared brake's last tick one node may still brake alone: another node that braked at
    least half as much in the same 30 min shares the cause. A failing supply brakes far more."""
    alone_now = dict(throttle_hw_power_brake_frac_short=1.0, throttle_hw_power_brake_frac_long=0.13,
                     other_nodes_power_brake_short=0)
    assert _rule_on(**alone_now, other_nodes_power_brake_long_ratio=1.0) is None   # a rack's brake, its edge
    assert _rule_on(**alone_now, other_nodes_power_brake_long_ratio=0.5) is None   # another half as much
    own = _rule_on(**alone_now, other_nodes_power_brake_long_ratio=0.13)           # 13 % beside a dying supply's 100 %
    assert own is not None and own.name == "hw_power_brake"
    assert _rule_on(**alone_now, other_nodes_power_brake_long_ratio=0.0).name == "hw_power_brake"  # none braked


def test_a_node_that_goes_dark_right_after_braking_alone_has_lost_its_power_and_silence_alone_has_not():
    braked = dict(throttle_hw_power_brake_frac_long=0.2, throttle_hw_power_brake_frac_short=np.nan)
    lost = _rule_on(node_silent_s=180.0, **braked)
    assert lost is not None and lost.name == "power_lost" and lost.on_node
    assert lost.action.value == "drain" and lost.fault.value == "power"
    assert _rule_on(node_silent_s=170.0, **braked) is None                              # a missed scrape or two
    assert _rule_on(node_silent_s=900.0, throttle_hw_power_brake_frac_long=0.0) is None  # silence alone: agent, network
    assert _rule_on(node_silent_s=900.0, throttle_hw_power_brake_frac_long=0.04) is None  # a brake of a few seconds
    assert _rule_on(node_silent_s=900.0, **braked, other_nodes_power_brake_long=1) is None  # a rack's brake, then a gap
    assert _rule_on(node_silent_s=900.0, **braked, other_nodes_power_brake_short=1) is None


def test_a_gpu_that_stays_well_under_its_busy_peers_clock_drains_as_a_straggler_and_a_dip_does_not():
    slow = _rule_on(sm_clock_deficit_vs_busy_peers_trend=0.2, sm_clock_deficit_vs_busy_peers=0.25)
    assert slow is not None and slow.name == "fail_slow_sustained" and slow.action.value == "drain"
    assert slow.fault.value == "fail_slow" and slow.follow_up is None   # nothing here justifies a reset
    assert _rule_on(sm_clock_deficit_vs_busy_peers_trend=0.09, sm_clock_deficit_vs_busy_peers=0.4) is None  # one dip
    mild = _rule_on(sm_clock_deficit_vs_busy_peers_trend=0.11, sm_clock_deficit_vs_busy_peers=0.12)  # 12 % slow, held
    assert mild is not None and mild.name == "fail_slow_sustained"
    assert _rule_on(sm_clock_deficit_vs_busy_peers_trend=0.2, sm_clock_deficit_vs_busy_peers=0.02) is None  # recovered
    assert _rule_on(sm_clock_deficit_vs_busy_peers_trend=np.nan, sm_clock_deficit_vs_busy_peers=np.nan) is None  # idle


def test_a_gpu_slow_in_spells_drains_as_a_straggler_on_its_share_of_slow_minutes_while_slow_now():
    spells = dict(sm_clock_deficit_vs_busy_peers_trend=0.066, sm_clock_slow_share=0.4)  # its trend stays shallow
    slow = _rule_on(**spells, sm_clock_deficit_vs_busy_peers=0.13)
    assert slow is not None and slow.name == "fail_slow_spells" and slow.action.value == "drain"
    assert slow.fault.value == "fail_slow" and slow.follow_up is None
    assert _rule_on(**spells, sm_clock_deficit_vs_busy_peers=0.01) is None                 # in a fast spell now
    assert _rule_on(**spells, sm_clock_deficit_vs_busy_peers=0.13, util_deficit_vs_peers=12.0) is None  # less busy
    assert _rule_on(sm_clock_slow_share=0.3, sm_clock_deficit_vs_busy_peers=0.13) is None   # a healthy GPU's dips


def test_pcie_replays_over_dcgms_line_drain_only_while_rising_against_the_gpus_own_rate():
    rising = _rule_on(pcie_replay_per_min_short=24.0, pcie_replay_cusum=40.0)       # from none to 24/min
    assert rising is not None and rising.name == "pcie_replay_rising" and rising.action.value == "drain"
    assert rising.fault.value == "pcie" and rising.follow_up is None
    assert _rule_on(pcie_replay_per_min_short=19.0, pcie_replay_cusum=0.0) is None   # a link that always replays so
    assert _rule_on(pcie_replay_per_min_short=16.0, pcie_replay_cusum=40.0) is None  # at DCGM's line, not over it
    assert _rule_on(pcie_replay_per_min_short=24.0, pcie_replay_cusum=np.nan) is None  # no baseline yet: unknown
    storm = _rule_on(pcie_replay_per_min_short=1500.0, pcie_replay_cusum=0.0)
    assert storm is not None and storm.name == "pcie_replay_storm"                  # a storm drains at any rate


def test_a_gpu_without_throttle_reasons_at_the_hw_slowdown_temperature_drains_as_a_flagged_one_would():
    hot = _rule_on(temp_gpu_c_without_reasons_short=89.0)            # NVIDIA's HW slowdown on A100 and H100
    assert hot is not None and hot.name == "hw_thermal_by_temperature" and hot.action.value == "drain"
    assert hot.fault.value == "thermal" and hot.follow_up is None and not hot.on_node
    assert _rule_on(temp_gpu_c_without_reasons_short=88.5) is None    # warm, not in slowdown
    assert _rule_on(temp_gpu_c_without_reasons_short=np.nan) is None  # it sends its reasons: hw_thermal reads them
    flagged = _rule_on(throttle_hw_thermal_frac_short=1.0, temp_gpu_c_without_reasons_short=95.0)
    assert flagged is not None and flagged.name == "hw_thermal"       # a row holds one or the other; the flag first


def test_the_package_pins_the_scikit_learn_that_saved_the_shipped_model():
    import json
    import re
    from pathlib import Path

    from models.bundle import default_model_path

    root = Path(__file__).resolve().parents[2]
    pin = re.search(r'"scikit-learn==([0-9.]+)"', (root / "pyproject.toml").read_text()).group(1)
    assert json.loads((default_model_path() / "model.json").read_text())["sklearn_version"] == pin


def test_the_shipped_model_carries_the_rules_this_gpuops_defines():
    from models.bundle import load_default

    assert load_default().rules.get_state() == RulesDetector(FEATURE_NAMES).get_state()


def test_the_rules_say_which_acting_rule_a_veto_stopped_and_a_node_carries_it():
    from models.node_scores import aggregate
    from models.bundle import ModelBundle
    from pipeline.batch import FeatureBatch

    x = quiet_rows(3)
    brake = dict(throttle_hw_power_brake_frac_short=1.0, throttle_hw_power_brake_frac_long=0.5)
    for k, v in brake.items():
        x[0, col(k)] = x[1, col(k)] = v
    x[0, col("other_nodes_power_brake_short")] = 1          # row 0: another node brakes now, the rule is vetoed
    det = RulesDetector(FEATURE_NAMES)
    out = det.score(x).detail
    k = [r.name for r in det.rules].index("hw_power_brake")
    assert out["rule"].tolist() == [-1, k, -1] and out["vetoed"].tolist() == [k, -1, -1]
    batch = FeatureBatch(ts=60.0, node=np.array(["a", "b", "c"], object), gpu=np.array([0, 0, 0]), x=x,
                         names=FEATURE_NAMES)
    ns = aggregate(batch, ModelBundle.rules_only().score(x), det)
    assert ns.rule_vetoed.tolist() == [True, False, False] and ns.rule.tolist() == [-1, k, -1]
