"""Held inputs: a trained model reads a feature gpuops no longer trusts as a constant, and model.json says so."""

from __future__ import annotations

import json

import numpy as np
import pytest

from models.base import CLASSES, FeatureMismatch, ModelError
from models.bundle import ModelBundle, load_default
from models.classifier import FailureClassifier
from models.inputs import exclusion_reason
from models.rules import RulesDetector
from pipeline.features import FEATURE_NAMES

SIGNAL = "xid_informational_count_long"   # excluded by models/inputs.py: a driver's log line


def _toy(seed: int = 0, n: int = 3000) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose only signal is an informational XID count (what a simulator taught the shipped trees)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (n, len(FEATURE_NAMES))).astype(np.float32)
    y = np.zeros(n, np.int8)
    hot = rng.random(n) < 0.1
    x[hot, FEATURE_NAMES.index(SIGNAL)] += 50
    y[hot] = CLASSES.index("hbm_ecc")
    return x, y


@pytest.fixture(scope="module")
def trained() -> FailureClassifier:
    x, y = _toy()
    return FailureClassifier(FEATURE_NAMES, max_iter=20).fit(x, y)


def test_a_held_input_is_read_as_its_constant_whatever_the_row_says(trained):
    x, y = _toy(seed=1)
    free = trained.score(x).p
    assert free[y > 0].mean() > 0.7          # the trees learned the log line
    clf = FailureClassifier(FEATURE_NAMES)
    clf.set_state(trained.get_state())
    clf.hold({SIGNAL: 0})
    held = clf.score(x).p
    zeroed = x.copy()
    zeroed[:, FEATURE_NAMES.index(SIGNAL)] = 0
    np.testing.assert_array_equal(held, trained.score(zeroed).p)
    assert held[y > 0].mean() < 0.2          # ... and no longer acts on it
    assert x[y > 0, FEATURE_NAMES.index(SIGNAL)].min() > 40   # the caller's rows are not changed


def test_held_inputs_are_saved_in_model_json_and_loaded_back(tmp_path, trained):
    trained.hold({SIGNAL: 0, "node_xid_app_count_short": 0})
    try:
        path = ModelBundle(RulesDetector(FEATURE_NAMES), trained).save(tmp_path / "m")
    finally:
        trained.hold({})
    meta = json.loads((path / "model.json").read_text())
    assert meta["held_inputs"] == {"classifier": {SIGNAL: 0.0, "node_xid_app_count_short": 0.0}}
    back = ModelBundle.load(path)
    assert back.classifier.held == {SIGNAL: 0.0, "node_xid_app_count_short": 0.0}
    x, _ = _toy(seed=2, n=300)
    zeroed = x.copy()
    zeroed[:, [FEATURE_NAMES.index(SIGNAL), FEATURE_NAMES.index("node_xid_app_count_short")]] = 0
    np.testing.assert_array_equal(back.score(x).p_fail, trained.score(zeroed).p)
    plain = ModelBundle(RulesDetector(FEATURE_NAMES), trained).save(tmp_path / "plain")
    assert "held_inputs" not in json.loads((plain / "model.json").read_text())


@pytest.mark.parametrize("held, says", [
    ({"classifier": {"ecc_sbe_per_h_long": 0}}, "does not exclude"),          # a trusted input may not be held
    ({"classifier": {"not_a_feature_total": 0}}, "not among the inputs"),     # excluded by name, never read
    ({"classifier": {SIGNAL: "none"}}, "is not a number"),
    ({"classifier": {SIGNAL: True}}, "is not a number"),
    ({"anomaly": {SIGNAL: 0}}, "detectors it does not list"),
    ({"classifier": [SIGNAL]}, "must map a detector"),
])
def test_a_model_json_that_holds_what_it_may_not_is_refused_with_why(tmp_path, trained, held, says):
    path = ModelBundle(RulesDetector(FEATURE_NAMES), trained).save(tmp_path / "m")
    meta = json.loads((path / "model.json").read_text())
    (path / "model.json").write_text(json.dumps(meta | {"held_inputs": held}))
    with pytest.raises(ModelError, match=says):
        ModelBundle.load(path)


def test_holding_an_input_the_detector_does_not_read_fails_at_once(trained):
    with pytest.raises(FeatureMismatch, match="not among the inputs"):
        FailureClassifier(FEATURE_NAMES, FEATURE_NAMES[:10]).hold({SIGNAL: 0})


def test_the_shipped_classifier_holds_the_app_and_informational_xid_counts_at_none():
    clf = load_default().classifier
    assert clf is not None
    xid_counts = {"xid_app_count_short", "xid_app_count_long", "xid_informational_count_short",
                  "xid_informational_count_long", "node_xid_app_count_short", "node_xid_informational_count_short"}
    assert set(clf.held) == xid_counts
    assert set(clf.held.values()) == {0.0}
    # every other input a retrain would drop is read as trained: power against the node's median GPU was taken
    # out of the anomaly detector's view (A2, which refit only that detector); the classifier keeps it
    untrusted = {n for n in clf.inputs if exclusion_reason(n) is not None}
    assert untrusted - xid_counts == {"power_abs_dev_vs_peers"}
