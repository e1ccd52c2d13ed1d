"""Node-level BMC state: SEL failure entries counted per node, and the latest inlet and fan margins.

BMC events (``source="bmc"``, :mod:`collector.sources.bmc_common`) name no GPU: they are the
node's own evidence, like XIDs that name no GPU (:class:`pipeline.ports.NodeXidState`).
Each becomes one :class:`BmcRows` row:

* an asserted SEL entry of a :data:`collector.bmc_events.SEL_CLASSES` class is counted in a
  per-node :class:`~pipeline.ring.Ring` (short and long window counts): gpuops' own ``kind="sel"``
  events by their fields, another collector's BMC events (any other kind) by their raw message
  (:func:`collector.bmc_events.sel_of_message`);
* an inlet temperature reading gives its margin to the BMC's own upper critical threshold
  (``upper_critical - value``, °C), a fan reading its margin above its lower critical one
  (``value - lower_critical``, RPM); per node the latest reading time is kept with the
  worst margin read at that time (a BMC reads all its sensors at once);
* any other BMC event only says the node has a BMC that speaks.

Features are NaN for a node with no BMC event in the long window (no BMC source, or a BMC
gone quiet), and a margin is NaN when the node has no such reading in the long window:
missing data is never read as healthy or failing.

The same conversion serves replay (:func:`bmc_rows_from_frame` on a recording's events) and
live (:func:`bmc_rows_from_records` on the decoded events, through the same frame code), so
the two give identical features. Sensor readings are a few per node-minute: the
conversion is column-wise, with one Python call per distinct sensor name and per SEL entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from collector.bmc_events import SEL_CLASSES, THRESHOLD_KEYS, is_inlet, sel_class, sel_of_message
from pipeline.samples import RowBatch
from pipeline.registry import Keys
from pipeline.ring import Ring

N_SEL = len(SEL_CLASSES)
#: row kinds after the SEL classes: an inlet reading, a fan reading, any other BMC event
KIND_INLET, KIND_FAN, KIND_SEEN = N_SEL, N_SEL + 1, N_SEL + 2
#: the margins kept per node, in feature order: (name, unit, meaning)
MARGINS: tuple[tuple[str, str, str], ...] = (
    ("node_bmc_inlet_margin_c", "degC", "BMC upper critical threshold minus the inlet air temperature (worst inlet "
     "sensor, latest reading); <= 0: at or past critical; NaN: no inlet reading with a threshold"),
    ("node_bmc_fan_margin_rpm", "RPM", "slowest fan's speed minus its BMC lower critical threshold (latest reading); "
     "<= 0: stalled or failing; NaN: no fan reading with a threshold"),
)


@dataclass
class BmcRows(RowBatch):
    """BMC events as rows: ts, node id, kind (SEL class index, or KIND_*), margin (NaN unless a reading)."""

    ts: np.ndarray      # float64
    node: np.ndarray    # int32
    kind: np.ndarray    # int8
    margin: np.ndarray  # float64

    @staticmethod
    def empty() -> "BmcRows":
        return BmcRows(np.zeros(0), np.zeros(0, np.int32), np.zeros(0, np.int8), np.zeros(0))


def _column(df: pd.DataFrame, name: str) -> np.ndarray:
    return df[name].to_numpy(object) if name in df.columns else np.full(len(df), None, object)


def _null(x: Any) -> bool:
    return x is None or x is pd.NA or (isinstance(x, float) and np.isnan(x))


def _numbers(df: pd.DataFrame, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(values as float64 with NaN for null, rows holding something that is not a number)."""
    if name not in df.columns:
        return np.full(len(df), np.nan), np.zeros(len(df), bool)
    s = df[name]
    if isinstance(s.dtype, np.dtype) and s.dtype.kind in "fiu":
        return s.to_numpy(np.float64), np.zeros(len(df), bool)
    obj = s.to_numpy(object)
    bad = np.array([not (_null(x) or (isinstance(x, (int, float, np.integer, np.floating))
                                       and not isinstance(x, (bool, np.bool_)))) for x in obj], bool)
    num = pd.to_numeric(s.where(~bad, None), errors="coerce").to_numpy(np.float64)
    return num, bad | np.isinf(num)


def bmc_rows_from_frame(df: pd.DataFrame | None, keys: Keys) -> tuple[BmcRows, int]:
    """BMC events of *df* (``source == "bmc"``) as :class:`BmcRows`, and how many were malformed
    (what :func:`collector.bmc_events.bmc_problem` refuses live: a reading or threshold that is
    not a number, a sensor or SEL text that is not a string, an ``asserted`` that is not a
    boolean): those are left out. Every other event is ignored."""
    if df is None or len(df) == 0 or "source" not in df.columns or "kind" not in df.columns:
        return BmcRows.empty(), 0
    mine = df["source"].to_numpy(object) == "bmc"
    if not mine.any():
        return BmcRows.empty(), 0
    d = df[mine]
    kind = d["kind"].to_numpy(object)
    out = np.full(len(d), KIND_SEEN, np.int8)
    margin = np.full(len(d), np.nan)
    bad = np.zeros(len(d), bool)
    sel = np.flatnonzero(kind == "sel")
    if len(sel):  # few: one Python call each, with the checks of collector.bmc_events.bmc_problem
        st, et, asserted = (_column(d, c)[sel] for c in ("sensor_type", "event_text", "asserted"))
        up = [bool(c) if isinstance(c, (bool, np.bool_)) else None for c in asserted]
        out[sel] = [sel_class(a, b, c) for a, b, c in zip(st, et, up)]
        out[sel] = np.where(out[sel] < 0, KIND_SEEN, out[sel])
        bad[sel] = [not (isinstance(a, str) and isinstance(b, str)) or (u is None and not _null(c))
                    for a, b, c, u in zip(st, et, asserted, up)]
    other = np.flatnonzero((kind != "sel") & (kind != "bmc_sensor"))
    if len(other):  # another collector's line: only its raw message says what happened (spec §3)
        read = [sel_of_message(m) for m in _column(d, "message")[other]]
        cls = np.array([-1 if r is None else sel_class(*r) for r in read], np.int8)
        out[other] = np.where(cls < 0, KIND_SEEN, cls)
    sen = np.flatnonzero(kind == "bmc_sensor")
    if len(sen):
        r = d.iloc[sen]
        vals = {}
        broken = np.zeros(len(sen), bool)
        for name in ("value", *THRESHOLD_KEYS):
            vals[name], b = _numbers(r, name)
            broken |= b
        names, stypes = _column(r, "sensor"), _column(r, "sensor_type")
        text = np.fromiter((isinstance(x, str) for x in names), bool, len(names))
        codes, uniq = pd.factorize(pd.Series(np.where(text, names, None), dtype=object), use_na_sentinel=True)
        inlet_name = np.array([is_inlet(u) for u in uniq] + [False], bool)
        broken |= ~text | ~np.fromiter((isinstance(x, str) for x in stypes), bool, len(stypes))
        is_temp, is_fan = stypes == "temperature", stypes == "fan"
        k = np.where(is_temp & inlet_name[codes], KIND_INLET, np.where(is_fan, KIND_FAN, KIND_SEEN))
        m = np.where(k == KIND_INLET, vals["upper_critical"] - vals["value"], vals["value"] - vals["lower_critical"])
        k = np.where(np.isfinite(m) | (k == KIND_SEEN), k, KIND_SEEN)
        out[sen], margin[sen], bad[sen] = k, np.where(k == KIND_SEEN, np.nan, m), broken
    keep = ~bad
    ts = d["ts"].to_numpy(np.float64)
    nodes = keys.nodes.ids_of(d["node"].to_numpy(object)[keep])
    return BmcRows(ts[keep], nodes.astype(np.int32), out[keep], margin[keep]), int(bad.sum())


def bmc_rows_from_records(events: Sequence[dict[str, Any]], keys: Keys) -> BmcRows:
    """:func:`bmc_rows_from_frame` of decoded event records (the live path: same code as replay)."""
    mine = [e for e in events if e.get("source") == "bmc"]
    if not mine:
        return BmcRows.empty()
    rows, _ = bmc_rows_from_frame(pd.DataFrame(mine), keys)
    return rows


class NodeBmcState:
    """Per node: SEL class counts in a ring, the latest inlet and fan margins, the last BMC event."""

    def __init__(self, n_buckets: int, bucket_s: float, capacity: int = 256) -> None:
        self.bucket_s = float(bucket_s)
        self.ring = Ring(n_buckets, capacity, N_SEL)
        self.last_seen = np.full(capacity, -np.inf)
        self.reading_ts = np.full((len(MARGINS), capacity), np.nan)
        self.margin = np.full((len(MARGINS), capacity), np.nan)

    @property
    def nbytes(self) -> int:
        return self.ring.nbytes + self.last_seen.nbytes + self.reading_ts.nbytes + self.margin.nbytes

    def ensure(self, capacity: int) -> None:
        self.ring.ensure(capacity)
        cap = self.ring.capacity
        if cap <= len(self.last_seen):
            return
        grow = cap - len(self.last_seen)
        self.last_seen = np.append(self.last_seen, np.full(grow, -np.inf))
        self.reading_ts = np.hstack([self.reading_ts, np.full((len(MARGINS), grow), np.nan)])
        self.margin = np.hstack([self.margin, np.full((len(MARGINS), grow), np.nan)])

    def add(self, rows: BmcRows) -> None:
        """Fold one closed tick's BMC rows (any order) into the state."""
        if len(rows) == 0:
            return
        self.ensure(int(rows.node.max()) + 1)
        np.maximum.at(self.last_seen, rows.node, rows.ts)
        sel = rows.kind < N_SEL
        if sel.any():
            self.ring.add_at(rows.node[sel], np.floor(rows.ts[sel] / self.bucket_s).astype(np.int64),
                             rows.kind[sel].astype(np.int64))
        for r, kind in enumerate((KIND_INLET, KIND_FAN)):
            m = rows.kind == kind
            if m.any():
                self._latest(r, rows.node[m], rows.ts[m], rows.margin[m])

    def _latest(self, r: int, node: np.ndarray, ts: np.ndarray, margin: np.ndarray) -> None:
        """Keep per node the newest reading time and the worst margin read at that time."""
        order = np.lexsort((margin, -ts, node))  # by node, newest first, worst first
        node, ts, margin = node[order], ts[order], margin[order]
        first = np.r_[True, node[1:] != node[:-1]]
        n, t, m = node[first], ts[first], margin[first]
        held = self.reading_ts[r, n]
        newer = ~(t <= held)  # nothing held (NaN) counts as older
        same = t == held
        self.reading_ts[r, n[newer]] = t[newer]
        self.margin[r, n[newer]] = m[newer]
        self.margin[r, n[same]] = np.minimum(self.margin[r, n[same]], m[same])

    def features(self, n: int, tick_end: float, n_short: int) -> tuple[np.ndarray, np.ndarray]:
        """((window, class, node) SEL counts, (margin, node) margins) for nodes ``< n`` at *tick_end*;
        NaN for nodes without a BMC event (counts) or reading (margins) in the long window."""
        self.ensure(n)
        max_age_s = self.ring.n_buckets * self.bucket_s
        _, short, long = self.ring.window(n, int(round(tick_end / self.bucket_s)), n_short)
        counts = np.stack([short.T, long.T])
        counts[:, :, ~(self.last_seen[:n] > tick_end - max_age_s)] = np.nan
        fresh = self.reading_ts[:, :n] > tick_end - max_age_s
        return counts, np.where(fresh, self.margin[:, :n], np.nan)
