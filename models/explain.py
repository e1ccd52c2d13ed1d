"""Explanations a person can read: a signal, its value and the part's own baseline.

An alert says which feature is off, by how much, and against what: the part's own
baseline when the features carry one (a feature ``X_baseline`` beside ``X``, as the
pipeline's per-part baselines will add), otherwise the healthy fleet's p99 (or p1)
that the failure classifier keeps from training, or the healthy median the anomaly
detector centres on — and it names which one it used.

Baselines are pluggable: a :class:`Baseline` looks one feature up for one row, and
:func:`baselines_for` chains them, the most specific first.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

#: suffixes that mark a feature as another feature's per-part baseline (``X_baseline`` for ``X``)
BASELINE_SUFFIXES = ("_baseline",)
#: window suffixes a baseline may leave out (``ecc_sbe_per_h_baseline`` for ``ecc_sbe_per_h_long``)
WINDOW_SUFFIXES = ("_short", "_long")


class Baseline(Protocol):
    """Where one feature's reference value comes from."""

    def lookup(self, feature: int, row: np.ndarray) -> tuple[float, str] | None:
        """(reference value, what it is) for *feature* on *row*; None when this source has none."""
        ...


class PartBaseline:
    """The part's own baseline, from features named ``<feature><suffix>`` in the same row."""

    def __init__(self, feature_names: Sequence[str], suffixes: Sequence[str] = BASELINE_SUFFIXES):
        names = {n: i for i, n in enumerate(feature_names)}
        self.index: dict[int, int] = {}
        for i, n in enumerate(feature_names):
            stems = [n] + [n[: -len(w)] for w in WINDOW_SUFFIXES if n.endswith(w)]
            found = [names[s + suf] for s in stems for suf in suffixes if s + suf in names and s + suf != n]
            if found:
                self.index[i] = found[0]

    def lookup(self, feature: int, row: np.ndarray) -> tuple[float, str] | None:
        j = self.index.get(feature)
        if j is None or not np.isfinite(row[j]):
            return None
        return float(row[j]), "this part's baseline"


class HealthyFleetBaseline:
    """The healthy fleet's p99 (or p1 for a value below the median) from training."""

    def __init__(self, healthy_q: np.ndarray | None):
        self.q = healthy_q  # (3, F): p1, p50, p99 of healthy rows

    def lookup(self, feature: int, row: np.ndarray) -> tuple[float, str] | None:
        if self.q is None:
            return None
        lo, mid, hi = self.q[:, feature]
        v = float(row[feature])
        return (float(lo), "healthy p1") if v < mid else (float(hi), "healthy p99")


class HealthyMedianBaseline:
    """The healthy median the anomaly detector centres on (its log-scaled ``center`` per column of
    ``cols``, mapped back), for bundles without a classifier's quantiles."""

    def __init__(self, cols: np.ndarray | None, center: np.ndarray | None):
        self.median = {} if cols is None or center is None else {
            int(c): float(np.sign(m) * np.expm1(abs(m))) for c, m in zip(cols, center)}

    def lookup(self, feature: int, row: np.ndarray) -> tuple[float, str] | None:
        m = self.median.get(feature)
        return None if m is None else (m, "healthy median")


def baselines_for(feature_names: Sequence[str], healthy_q: np.ndarray | None,
                  anomaly_cols: np.ndarray | None = None, anomaly_center: np.ndarray | None = None) -> list[Baseline]:
    """The default chain: the part's own baseline, then the healthy fleet's p99/p1, then its median."""
    return [PartBaseline(feature_names), HealthyFleetBaseline(healthy_q),
            HealthyMedianBaseline(anomaly_cols, anomaly_center)]


def describe(feature_names: Sequence[str], feature: int, row: np.ndarray, baselines: Sequence[Baseline]) -> str:
    """``name=value (reference kind value)``, with the first baseline that knows the feature."""
    text = f"{feature_names[feature]}={fmt(float(row[feature]))}"
    for b in baselines:
        ref = b.lookup(feature, row)
        if ref is not None:
            return f"{text} ({ref[1]} {fmt(ref[0])})"
    return f"{text} (no baseline known)"


def outside_healthy(feature_names: Sequence[str], features: Sequence[int], healthy_q: np.ndarray | None,
                    row: np.ndarray, baselines: Sequence[Baseline], k: int = 3) -> str:
    """The first *k* of *features* outside the healthy fleet's p1-p99 range on *row*, each
    described against the first baseline that knows it (the same selection as
    :meth:`models.classifier.FailureClassifier.explain`, with the part's own baseline shown
    when the features carry one)."""
    if healthy_q is None:
        return ""
    lo, mid, hi = healthy_q
    parts = []
    for i in features:
        v = float(row[i])
        if np.isfinite(v) and ((v > hi[i] and v > mid[i]) or (v < lo[i] and v < mid[i])):
            parts.append(describe(feature_names, i, row, baselines))
            if len(parts) == k:
                break
    return ", ".join(parts)


def most_deviant(center: np.ndarray, scale: np.ndarray, cols: np.ndarray, row: np.ndarray) -> int | None:
    """The feature (index into *row*) furthest from the healthy centre in robust units, on the
    anomaly detector's log-scaled view (``center``/``scale`` per column of ``cols``); None if none."""
    if len(cols) == 0:
        return None
    v = row[cols].astype(np.float64)
    z = np.abs(np.sign(v) * np.log1p(np.abs(v)) - center) / scale
    z = np.where(np.isfinite(z), z, -1.0)
    k = int(np.argmax(z))
    return int(cols[k]) if z[k] >= 0 else None


def risk_phrase(fault: str, p: float, gpu: int) -> str:
    """How a prediction is told: its fault class, its probability, its GPU."""
    return f"{fault} failure risk {p:.0%} on GPU {gpu}"


def anomaly_phrase(gpu: int | None, level: float) -> str:
    """How an anomaly is told: its GPU (when known) and how strange it is against healthy GPUs."""
    return f"anomaly{'' if gpu is None else f' on GPU {gpu}'} (stranger than {level:.3%} of healthy GPUs)"


def fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
