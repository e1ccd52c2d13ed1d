"""Failure-in-horizon classifier: P(this GPU fails within the horizon), its fault class, and why.

Two gradient-boosted models over the pipeline's features:

* a binary ``HistGradientBoostingClassifier`` gives P(any node fault within the
  horizon) for every row, calibrated on a held-out (later-in-time) split by Platt
  scaling (a logistic fit on the log-odds: monotone and smooth; isotonic regression on
  the few incidents of a validation split makes plateaus that cap the probability);
* a multi-class one, trained on failing rows only, names the fault class; it runs
  only on rows whose probability reaches ``class_min_p`` (a few per tick), so scoring
  every GPU costs one tree per boosting round instead of one per class. Explanations are the
features of the predicted class that sit furthest outside their healthy range,
written so an on-call engineer can read them ("ecc_sbe_per_h_long = 41 (healthy
p99 0)").
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression

from collector.xid import HARDWARE_XID_KEYS

from .base import NO_FAULT, Detector, DetectorOutput
from .treeeval import BoostedTrees

#: features listed per class in explanations (strongest separating first)
EXPLAIN_TOP = 10

#: Feature-name fragments whose growth can only mean *more* risk: error rates and counts,
#: hardware throttling, failure XIDs, links down, being slower/hotter than peers. The
#: failure probability is constrained to be non-decreasing in them, so a storm of PCIe
#: replays never looks healthier than a trickle — trees would otherwise learn whatever
#: shape the few incidents of a class happen to have.
MONOTONE_UP = ("ecc_sbe_per_h", "ecc_dbe", "retired_pages", "remapped_rows", "row_remap", "pcie_replay",
               "nvlink_", "thermal_violation", "throttle_hw_", *HARDWARE_XID_KEYS,
               "net_symbol_error", "net_link_error_recovery", "net_link_downed", "net_port_rcv_errors",
               "net_port_rcv_remote_physical", "net_local_link_integrity", "net_ports_not_active",
               "net_port_down_after_active",
               "sm_clock_deficit_vs_peers", "temp_gpu_excess_vs_peers", "_excess_long")


def monotone_constraints(feature_names: Sequence[str]) -> list[int]:
    """+1 for features in :data:`MONOTONE_UP`, else 0 (unconstrained)."""
    return [1 if any(k in n for k in MONOTONE_UP) else 0 for n in feature_names]


class FailureClassifier(Detector):
    """Gradient-boosted trees with a calibrated any-fault probability."""

    kind = "classifier"

    def __init__(self, feature_names: Sequence[str], inputs: Sequence[str] | None = None, *, max_iter: int = 300,
                 learning_rate: float = 0.1, max_leaf_nodes: int = 15, min_samples_leaf: int = 100,
                 l2_regularization: float = 5.0, max_features: float = 0.5, seed: int = 0, class_min_p: float = 0.02,
                 members: int = 1):
        super().__init__(feature_names, inputs)
        if members < 1:
            raise ValueError(f"members must be >= 1, got {members}")
        #: binary models averaged (a seed ensemble): one model's few-incident quirks vary with its seed
        self.members = members
        # small, strongly regularised trees with feature subsampling: a fleet gives only a few
        # incidents per class, and bigger trees learn their incidental conjunctions (a power
        # slope, a temperature level) instead of the error signals
        self.params = dict(max_iter=max_iter, learning_rate=learning_rate, max_leaf_nodes=max_leaf_nodes,
                           min_samples_leaf=min_samples_leaf, l2_regularization=l2_regularization,
                           max_features=max_features, random_state=seed)
        #: rows below this calibrated probability get no fault class (not worth the second model)
        self.class_min_p = class_min_p
        self.model: HistGradientBoostingClassifier | None = None
        self.class_model: HistGradientBoostingClassifier | None = None
        self.calibrator: LogisticRegression | None = None
        #: the other members of a seed ensemble: (binary model, its calibrator), seeds seed+1 ...
        self.extra: list[tuple[HistGradientBoostingClassifier, LogisticRegression | None]] = []
        self.healthy_q: np.ndarray | None = None  # (3, F): p1, p50, p99 of healthy rows
        self.explain_features: dict[int, list[int]] = {}
        self._compiled: tuple[BoostedTrees, BoostedTrees] | None = None  # built from the models on first score
        self._compiled_extra: list[BoostedTrees] | None = None

    def _fit(self, x: np.ndarray, y: np.ndarray | None, *, sample_weight: np.ndarray | None,
             x_val: np.ndarray | None = None, y_val: np.ndarray | None = None,
             w_val: np.ndarray | None = None, **kw: Any) -> None:
        if y is None:
            raise ValueError("the classifier needs labels")
        target = (y != NO_FAULT).astype(np.int8)
        members = [HistGradientBoostingClassifier(early_stopping=False, monotonic_cst=monotone_constraints(self.inputs),
                                                  **(self.params | {"random_state": self.params["random_state"] + k}))
                   .fit(x, target, sample_weight=sample_weight) for k in range(self.members)]
        self.model, self.extra = members[0], [(m, None) for m in members[1:]]
        self._compiled, self._compiled_extra = None, None
        pos = target == 1
        self.class_model = HistGradientBoostingClassifier(
            early_stopping=False, **(self.params | {"max_iter": 150, "min_samples_leaf": 20}))
        self.class_model.fit(x[pos], y[pos])
        self._fit_explanations(x, y)
        if x_val is not None and y_val is not None and len(np.unique(y_val != NO_FAULT)) == 2:
            target_val = (y_val != NO_FAULT).astype(int)

            def platt(raw: np.ndarray) -> LogisticRegression:   # each member calibrated on its own
                return LogisticRegression(C=1e4).fit(_logit(raw), target_val, sample_weight=w_val)

            self.calibrator = platt(self._raw_any(x_val))
            self.extra = [(m, platt(t.proba_binary(x_val))) for (m, _), t in zip(self.extra, self._extra_trees())]

    def _fit_explanations(self, x: np.ndarray, y: np.ndarray) -> None:
        healthy = x[y == NO_FAULT]
        # a column with no value in a class's rows (a counter its fleet lacks) has no median:
        # NaN, then strength 0 below; numpy's "All-NaN slice" warning says nothing more
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            self.healthy_q = np.nanquantile(healthy, [0.01, 0.5, 0.99], axis=0) if len(healthy) else None
            scale = np.nanstd(healthy, axis=0) + 1e-6 if len(healthy) else np.ones(x.shape[1])
            for k in np.unique(y):
                if k == NO_FAULT:
                    continue
                pos = x[y == k]
                diff = np.abs(np.nanmedian(pos, axis=0) - (self.healthy_q[1] if self.healthy_q is not None else 0))
                strength = np.nan_to_num(diff / scale, nan=0.0)
                self.explain_features[int(k)] = [int(i) for i in np.argsort(-strength)[:EXPLAIN_TOP]
                                                 if strength[i] > 0]

    def _trees(self) -> tuple[BoostedTrees, BoostedTrees]:
        """The two models as compiled tables (same outputs as scikit-learn, ~20x cheaper)."""
        if self._compiled is None:
            assert self.model is not None and self.class_model is not None
            self._compiled = BoostedTrees.from_sklearn(self.model), BoostedTrees.from_sklearn(self.class_model)
        return self._compiled

    def _extra_trees(self) -> list[BoostedTrees]:
        if self._compiled_extra is None:
            self._compiled_extra = [BoostedTrees.from_sklearn(m) for m, _ in self.extra]
        return self._compiled_extra

    def _raw_any(self, x: np.ndarray) -> np.ndarray:
        return self._trees()[0].proba_binary(x)

    def _score(self, x: np.ndarray) -> DetectorOutput:
        assert self.class_model is not None
        raw = self._raw_any(x)
        each = [_calibrated(self.calibrator, raw)] + [_calibrated(cal, t.proba_binary(x))
                                                      for (_, cal), t in zip(self.extra, self._extra_trees())]
        p = (sum(each) / len(each)).astype(np.float32)   # a seed ensemble's mean (one member: its p)
        fault = np.zeros(len(x), np.int8)
        risky = np.flatnonzero(p >= self.class_min_p)
        if risky.size:
            fault[risky] = self._trees()[1].predict_class(x[risky], self.class_model.classes_).astype(np.int8)
        return DetectorOutput(p, fault, {"raw": raw.astype(np.float32)})

    def explain(self, row: np.ndarray, fault: int, k: int = 3) -> str:
        """The *k* features of class *fault* furthest outside their healthy range, as text
        (*row* is a whole pipeline feature row)."""
        if self.healthy_q is None:
            return ""
        row = self.select(np.asarray(row))
        lo, mid, hi = self.healthy_q
        parts = []
        for i in self.explain_features.get(int(fault), []):
            v = float(row[i])
            if not np.isfinite(v):
                continue
            if v > hi[i] and v > mid[i]:
                parts.append(f"{self.inputs[i]}={_fmt(v)} (healthy p99 {_fmt(hi[i])})")
            elif v < lo[i] and v < mid[i]:
                parts.append(f"{self.inputs[i]}={_fmt(v)} (healthy p1 {_fmt(lo[i])})")
            if len(parts) == k:
                break
        return ", ".join(parts)

    def get_state(self) -> dict[str, Any]:
        return {"params": self.params, "class_min_p": self.class_min_p, "model": self.model,
                "class_model": self.class_model, "calibrator": self.calibrator, "extra": self.extra,
                "healthy_q": self.healthy_q, "explain_features": self.explain_features}

    def set_state(self, state: dict[str, Any]) -> None:
        self.params = state["params"]
        self.model, self.calibrator = state["model"], state["calibrator"]
        self.extra = list(state.get("extra", []))      # bundles from before seed ensembles have none
        self.members = 1 + len(self.extra)
        self._compiled, self._compiled_extra = None, None
        self.class_model, self.class_min_p = state["class_model"], state["class_min_p"]
        self.healthy_q, self.explain_features = state["healthy_q"], {int(k): v for k, v in
                                                                     state["explain_features"].items()}
        self.fitted = self.model is not None


def _calibrated(calibrator: LogisticRegression | None, raw: np.ndarray) -> np.ndarray:
    return calibrator.predict_proba(_logit(raw))[:, 1] if calibrator is not None else raw.astype(np.float64)


def _logit(p: np.ndarray) -> np.ndarray:
    q = np.clip(p.astype(np.float64), 1e-7, 1 - 1e-7)
    return np.log(q / (1 - q))[:, None]


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
