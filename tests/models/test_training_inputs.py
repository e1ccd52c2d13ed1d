"""Training leaves out model inputs the training recordings never carry (issue 13's BMC
features on recordings made without a BMC source): an all-NaN column teaches nothing, and it
broke scikit-learn's binning (``window shape cannot be larger than input array shape``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from collector.simulator import SimConfig, simulate_recording
from models.inputs import model_inputs
from models.training import TrainSettings, inputs_with_data, train_bundle
from pipeline.features import FEATURE_INDEX, FEATURE_NAMES

BMC = tuple(n for n in FEATURE_NAMES if n.startswith("node_bmc_"))


def test_inputs_without_a_finite_value_are_left_out_in_order() -> None:
    inputs = model_inputs(FEATURE_NAMES)
    x = np.zeros((3, len(FEATURE_NAMES)), np.float32)
    x[:, [FEATURE_INDEX[n] for n in BMC]] = np.nan
    x[1, FEATURE_INDEX[BMC[0]]] = 2.0  # one value is enough
    kept, left = inputs_with_data(inputs, x)
    assert left == BMC[1:]
    assert kept == tuple(n for n in inputs if n not in BMC[1:])
    assert inputs_with_data(inputs, x[:0]) == ((), inputs)


def test_a_model_trains_on_recordings_without_bmc_and_says_what_it_left_out(tmp_path: Path) -> None:
    rec = tmp_path / "no-bmc"
    simulate_recording(SimConfig(nodes=8, hours=6, seed=4, rate_multiplier=1500, bmc=False), rec)
    bundle = train_bundle([rec], TrainSettings(seed=0))
    assert set(BMC) <= set(bundle.metadata["training"]["inputs_without_data"])
    assert not set(BMC) & set(bundle.classifier.inputs)
    assert bundle.classifier.inputs and bundle.anomaly.inputs == bundle.classifier.inputs


def test_the_anomaly_detector_alone_is_refit_and_the_classifier_and_rules_are_kept(tmp_path: Path) -> None:
    from models.bundle import ModelBundle
    from models.training import TrainingError, retrain_anomaly

    rec = tmp_path / "rec"
    simulate_recording(SimConfig(nodes=8, hours=6, seed=5, rate_multiplier=1500), rec)
    base = train_bundle([rec], TrainSettings(seed=0))
    out = retrain_anomaly([rec], base, TrainSettings(seed=1))
    assert out.classifier is base.classifier and out.rules is base.rules and out.anomaly is not base.anomaly
    viewed = out.metadata["anomaly_training"]["viewed"]
    assert "sm_clock_deficit_vs_busy_peers" in viewed and "temp_gpu_excess_vs_peers" in viewed
    assert not {"power_abs_dev_vs_peers", "sm_clock_deficit_vs_busy_peers_trend"} & set(viewed)
    assert out.metadata["training"] == base.metadata["training"]   # the classifier's story is unchanged
    x = np.nan_to_num(np.random.default_rng(0).normal(size=(50, len(FEATURE_NAMES))).astype(np.float32))
    saved = ModelBundle.load(out.save(tmp_path / "m"))
    assert np.array_equal(saved.classifier.score(x).p, base.classifier.score(x).p)
    assert np.array_equal(saved.anomaly.score(x).p, out.anomaly.score(x).p)
    base.classifier = None
    with pytest.raises(TrainingError, match="no classifier"):
        retrain_anomaly([rec], base)
