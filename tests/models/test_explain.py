"""Explanations name the signal, its value and the part's own baseline, or say which fleet reference
they fell back to."""

from __future__ import annotations

import numpy as np

from models.explain import HealthyFleetBaseline, PartBaseline, baselines_for, describe, most_deviant

NAMES = ("ecc_sbe_per_h_long", "temp_gpu_c", "temp_gpu_c_baseline", "ecc_sbe_per_h_baseline", "clock_mhz")
Q = np.array([[0.0, 30.0, 30.0, 0.0, 1200.0],      # p1
              [0.0, 55.0, 55.0, 0.0, 1700.0],      # p50
              [2.0, 80.0, 80.0, 2.0, 1980.0]])     # p99


def test_the_parts_own_baseline_is_used_when_the_features_carry_one():
    row = np.array([41.0, 88.0, 61.0, 3.0, 1700.0])
    chain = baselines_for(NAMES, Q)
    assert describe(NAMES, 1, row, chain) == "temp_gpu_c=88 (this part's baseline 61)"
    # a baseline may leave the window suffix out
    assert describe(NAMES, 0, row, chain) == "ecc_sbe_per_h_long=41 (this part's baseline 3)"


def test_without_a_part_baseline_the_healthy_fleet_p99_or_p1_is_named():
    row = np.array([41.0, 88.0, np.nan, np.nan, 900.0])
    chain = baselines_for(NAMES, Q)
    assert describe(NAMES, 1, row, chain) == "temp_gpu_c=88 (healthy p99 80)"   # the part's baseline is missing
    assert describe(NAMES, 4, row, chain) == "clock_mhz=900 (healthy p1 1,200)"


def test_without_quantiles_the_anomaly_detectors_healthy_median_is_named():
    chain = baselines_for(NAMES, None, np.array([1]), np.log1p(np.array([55.0])))
    assert describe(NAMES, 1, np.array([0, 88.0, np.nan, 0, 0]), chain) == "temp_gpu_c=88 (healthy median 55)"


def test_a_feature_no_baseline_knows_says_so():
    assert describe(NAMES, 4, np.zeros(5), [PartBaseline(NAMES), HealthyFleetBaseline(None)]).endswith(
        "(no baseline known)")


def test_the_most_deviant_feature_is_the_furthest_from_the_healthy_centre_in_robust_units():
    cols = np.array([0, 1, 4])
    center = np.log1p(np.array([0.0, 55.0, 1700.0]))
    scale = np.array([0.5, 0.05, 0.05])
    row = np.array([3.0, 60.0, 0, 0, 1700.0])            # log1p(3)/0.5 = 2.8 ; |log(61/56)|/0.05 = 1.7
    assert most_deviant(center, scale, cols, row) == 0
    assert most_deviant(center, scale, np.array([], int), row) is None


def test_prediction_explanations_equal_the_classifiers_own_when_no_part_baseline_exists():
    from models.bundle import ModelBundle, default_model_path
    from models.explain import outside_healthy

    c = ModelBundle.load(default_model_path()).classifier
    names = c.inputs                      # explanations index the classifier's own inputs
    lo, mid, hi = c.healthy_q
    rng = np.random.default_rng(0)
    for _ in range(20):
        full = rng.normal(0, 1, len(c.feature_names)).astype(np.float32)   # a whole pipeline row
        row = np.where(rng.random(len(names)) < 0.5, hi + 1 + np.abs(hi), lo - 1 - np.abs(lo)).astype(np.float32)
        row[rng.random(len(names)) < 0.2] = np.nan
        full[[c.feature_names.index(n) for n in names]] = row
        for fault in c.explain_features:
            assert outside_healthy(names, c.explain_features[fault], c.healthy_q, c.select(full),
                                   baselines_for(names, c.healthy_q)) == c.explain(full, fault)
