"""Training labels: which feature rows precede (or show) a failure, from ``incidents.jsonl``.

A row (GPU g of node n at telemetry time t) is labelled with an incident's fault class
when the incident is on that GPU (or on that node, for node-level faults) and
``start <= t <= failure_ts + 300`` where ``start`` is the onset (or the failure time
for failures without warning), within ``horizon_s`` of the failure. Rows of a failed
node after that, until ``exclude_after_s`` past the failure (the node is broken or in
repair, and already acted on), are excluded from training rather than called healthy.
``app_error`` incidents label nothing: they are the healthy class the models must learn
to leave alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from collector.schema import FaultClass

from .base import NO_FAULT, class_index

#: Same slack after the failure as the replay scoring rules (spec/recording.md).
AFTER_FAILURE_S = 300.0


@dataclass(frozen=True)
class LabelSettings:
    """How incidents become row labels."""

    #: longest lead the classifier is asked to predict, s (6 h: the longest HBM precursors).
    horizon_s: float = 6 * 3600
    #: rows of a failed node this long after the failure are left out of training, s.
    #: A broken / in-repair node is neither a precursor nor healthy: calling it healthy
    #: teaches the model that a replay storm or a hot node is normal. Recordings do not
    #: say when repair ended, so this must exceed repair times (2-6 h in field reports).
    exclude_after_s: float = 8 * 3600


def label_rows(ts: np.ndarray, node: np.ndarray, gpu: np.ndarray, incidents: Sequence[dict[str, Any]],
               settings: LabelSettings = LabelSettings()) -> tuple[np.ndarray, np.ndarray]:
    """Labels (index into ``models.base.CLASSES``) and a keep-mask for feature rows.

    *ts*, *node*, *gpu* are per-row arrays (object array of node names for *node*).
    """
    ts = np.asarray(ts, dtype=np.float64)
    y = np.full(len(ts), NO_FAULT, np.int8)
    keep = np.ones(len(ts), bool)
    if not incidents:
        return y, keep
    by_node: dict[str, np.ndarray] = {}
    for inc in incidents:
        fault = FaultClass(inc["fault"])
        if fault is FaultClass.APP_ERROR:
            continue
        rows = by_node.get(inc["node"])
        if rows is None:
            rows = by_node[inc["node"]] = np.flatnonzero(node == inc["node"])
        if rows.size == 0:
            continue
        t = ts[rows]
        failure = float(inc["failure_ts"])
        start = float(inc["onset_ts"]) if inc.get("onset_ts") is not None else failure
        start = max(start, failure - settings.horizon_s)
        on_gpu = np.ones(rows.size, bool) if inc.get("gpu") is None else gpu[rows] == int(inc["gpu"])
        pos = on_gpu & (t >= start) & (t <= failure + AFTER_FAILURE_S)
        y[rows[pos]] = class_index(fault)
        broken = (t > failure + AFTER_FAILURE_S) & (t <= failure + settings.exclude_after_s)
        keep[rows[broken]] = False
    return y, keep
