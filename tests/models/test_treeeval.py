"""The compiled tree scorers give exactly scikit-learn's numbers."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier, IsolationForest

from models.treeeval import BoostedTrees, IsolationTrees, _threshold32


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6000, 12)).astype(np.float32)
    x[:, 3] = np.round(x[:, 3] * 4) / 4  # ties exactly at split thresholds
    y = (x[:, 0] + x[:, 1] ** 2 + 0.5 * rng.standard_normal(6000) > 1).astype(int)
    y[x[:, 2] > 1.2] = 2
    x[rng.random(x.shape) < 0.05] = np.nan  # missing values take the learned side
    return x, y


def test_threshold_rounding_keeps_every_float32_comparison() -> None:
    t = np.array([0.1, -0.1, 1 / 3, 2.5, 1e-30, -1e30, np.inf])
    t32 = _threshold32(t)
    probe = np.concatenate([t32, np.nextafter(t32, np.float32(np.inf)), np.nextafter(t32, np.float32(-np.inf))])
    for v in probe.astype(np.float32):
        assert np.array_equal(v > t, v > t32)


def test_binary_boosting_equals_sklearn(data) -> None:
    x, y = data
    model = HistGradientBoostingClassifier(max_iter=60, max_leaf_nodes=15, random_state=0).fit(x, y > 0)
    trees = BoostedTrees.from_sklearn(model)
    assert np.array_equal(trees.raw(x), model._raw_predict(x))
    assert np.array_equal(trees.proba_binary(x), model.predict_proba(x)[:, 1])
    assert np.array_equal(trees.predict_class(x, model.classes_), model.predict(x))


def test_multiclass_boosting_equals_sklearn(data) -> None:
    x, y = data
    model = HistGradientBoostingClassifier(max_iter=30, max_leaf_nodes=31, random_state=0).fit(x, y)
    trees = BoostedTrees.from_sklearn(model)
    assert trees.n_outputs == 3
    assert np.array_equal(trees.raw(x), model._raw_predict(x))
    assert np.array_equal(trees.predict_class(x, model.classes_), model.predict(x))
    assert trees.raw(x[:0]).shape == (0, 3)


def test_too_many_leaves_is_refused(data) -> None:
    x, y = data
    model = HistGradientBoostingClassifier(max_iter=3, max_leaf_nodes=64, min_samples_leaf=5).fit(x, y > 0)
    with pytest.raises(ValueError, match="at most 32"):
        BoostedTrees.from_sklearn(model)


def test_isolation_forest_equals_sklearn(data) -> None:
    x, _ = data
    x = np.nan_to_num(x)
    forest = IsolationForest(n_estimators=40, max_samples=512, random_state=0).fit(x[:4000])
    trees = IsolationTrees.from_sklearn(forest)
    assert np.array_equal(trees.score_samples(x), forest.score_samples(x))


def test_isolation_forest_with_feature_subsets_equals_sklearn(data) -> None:
    x, _ = data
    x = np.nan_to_num(x)
    forest = IsolationForest(n_estimators=20, max_features=0.5, random_state=1).fit(x)
    assert np.array_equal(IsolationTrees.from_sklearn(forest).score_samples(x), forest.score_samples(x))
