"""Unsupervised anomaly detector for faults no label covers.

Two views of "unlike the healthy fleet", on a compact, log-scaled selection of the
features — workload-driven gauges compared with the GPU's peers and the fleet (clock,
utilisation, temperature and power deviations, temperature slopes):

* an ``IsolationForest`` for unusual *combinations*;
* a robust z-score (distance from the healthy median in units of the healthy MAD,
  with a floor) for a single feature far outside its healthy range.

Error counters are not in the view. A counter is zero on most healthy GPUs and has a
heavy benign tail on a few (SBE trickles and bursts, NVLink CRC, PCIe replays, IB
errors, lone XID 94s): it has no healthy scale, and whichever benign pattern the
training worlds lacked reads as "unlike healthy" on the next fleet. Counters are judged
against their own part's baseline by rate CUSUMs, the classifier and the catalogue's
rules; peer comparison with persistence is for gauges (research/robust-detection.md §1
and §9: no MAD z-scores on sparse error counts). This also makes the detector's
agreement a second signal *independent* of the counters a prediction reads.

Each is calibrated to the fraction of healthy held-out rows that are *less* anomalous;
the level is the larger of the two, so 0.999 means "stranger than 99.9 % of healthy
GPUs". gpuops uses it to *alert* a person, never to drain on its own.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np
from sklearn.ensemble import IsolationForest

from .base import NO_FAULT, Detector, DetectorOutput
from .treeeval import IsolationTrees

#: the features the detector sees: a gauge's deviation from its peers or the fleet now (names ending so), and
#: temperature slopes. Matched at the end, so a feature derived from a deviation (the straggler rule's slow
#: average, ``sm_clock_deficit_vs_busy_peers_trend``) is not a deviation itself
VIEW = re.compile(r"(_vs_peers|_vs_busy_peers|_fleet_z)$|^temp_gpu_c_slope_")


class AnomalyDetector(Detector):
    """IsolationForest on healthy rows, calibrated against held-out healthy rows."""

    kind = "anomaly"

    def __init__(self, feature_names: Sequence[str], inputs: Sequence[str] | None = None, *, n_estimators: int = 100,
                 max_samples: int = 4096, seed: int = 0):
        super().__init__(feature_names, inputs)
        self.cols = np.array([i for i, n in enumerate(self.inputs)
                              if VIEW.search(n)])
        self.params = dict(n_estimators=n_estimators, max_samples=max_samples, random_state=seed)
        self.forest: IsolationForest | None = None
        self.fill: np.ndarray | None = None
        self.ref: np.ndarray | None = None  # sorted forest scores of healthy held-out rows
        self.center: np.ndarray | None = None
        self.scale: np.ndarray | None = None
        self.ref_z: np.ndarray | None = None  # sorted max-|z| of healthy held-out rows
        self._compiled: IsolationTrees | None = None  # the forest as compiled tables, built on first use

    def _view(self, x: np.ndarray) -> np.ndarray:
        v = x[:, self.cols]
        v = np.sign(v) * np.log1p(np.abs(v))
        if self.fill is not None:
            v = np.where(np.isnan(v), self.fill, v)
        return v

    def _fit(self, x: np.ndarray, y: np.ndarray | None, *, sample_weight: np.ndarray | None,
             x_val: np.ndarray | None = None, y_val: np.ndarray | None = None, **kw: Any) -> None:
        healthy = x if y is None else x[y == NO_FAULT]
        v = np.sign(healthy[:, self.cols]) * np.log1p(np.abs(healthy[:, self.cols]))
        self.fill = np.nan_to_num(np.nanmedian(v, axis=0), nan=0.0).astype(np.float32)
        v = np.where(np.isnan(v), self.fill, v)
        params = self.params | {"max_samples": min(self.params["max_samples"], len(v))}
        self.forest = IsolationForest(**params).fit(v)
        self._compiled = None
        self.center = np.median(v, axis=0).astype(np.float32)
        mad = 1.4826 * np.median(np.abs(v - self.center), axis=0)
        spread = np.quantile(v, 0.999, axis=0) - np.quantile(v, 0.001, axis=0)
        self.scale = np.maximum(mad, np.maximum(0.1 * spread, 0.05)).astype(np.float32)  # log1p units
        ref_x = healthy if x_val is None else (x_val if y_val is None else x_val[y_val == NO_FAULT])
        ref_v = self._view(ref_x)
        self.ref = np.sort(-self._forest_scores(ref_v))
        self.ref_z = np.sort(self._max_z(ref_v))

    def _forest_scores(self, v: np.ndarray) -> np.ndarray:
        """``forest.score_samples(v)``, computed by the compiled trees (same numbers, cheaper)."""
        if self._compiled is None:
            assert self.forest is not None
            self._compiled = IsolationTrees.from_sklearn(self.forest)
        return self._compiled.score_samples(v)

    def _max_z(self, v: np.ndarray) -> np.ndarray:
        return np.max(np.abs(v - self.center) / self.scale, axis=1) if v.shape[1] else np.zeros(len(v))

    def _score(self, x: np.ndarray) -> DetectorOutput:
        assert self.forest is not None and self.ref is not None and self.ref_z is not None
        v = self._view(x)
        s = -self._forest_scores(v)
        z = self._max_z(v)
        level_forest = np.searchsorted(self.ref, s, side="left") / max(len(self.ref), 1)
        level_z = np.searchsorted(self.ref_z, z, side="left") / max(len(self.ref_z), 1)
        p = np.maximum(level_forest, level_z).astype(np.float32)
        return DetectorOutput(p, np.zeros(len(x), np.int8), {"raw": s.astype(np.float32), "max_z": z.astype(np.float32)})

    def get_state(self) -> dict[str, Any]:
        return {"params": self.params, "cols": self.cols, "forest": self.forest, "fill": self.fill, "ref": self.ref,
                "center": self.center, "scale": self.scale, "ref_z": self.ref_z}

    def set_state(self, state: dict[str, Any]) -> None:
        self.params, self.cols, self.forest = state["params"], state["cols"], state["forest"]
        self._compiled = None
        self.fill, self.ref = state["fill"], state["ref"]
        self.center, self.scale, self.ref_z = state["center"], state["scale"], state["ref_z"]
        self.fitted = self.forest is not None
