"""Per-port (IB/RoCE) window state, and node-level XID counts.

Ports work like GPUs (:mod:`pipeline.state`): a :class:`~pipeline.ring.Ring` per port
slot of Σincrement and Σdt for each counter of :data:`pipeline.columns.NET_STATE_COUNTERS`
(reset-safe), plus counts of samples, samples with a known link state and samples not
``ACTIVE``. XID events that name no GPU (the kernel line could not be resolved to a
device) are counted per node here and shown to every GPU of that node.
"""

from __future__ import annotations

import numpy as np

from pipeline.columns import NET_STATE_COUNTERS, NetRows
from pipeline.ring import ByTick, Folded, Ring
from pipeline.runs import carried, counter_deltas, last_rows, new_samples_order, previous, previous_rows, runs
from pipeline.state import XID_CLASSES, xid_class

_K = len(NET_STATE_COUNTERS)
PORT_STATS = {"cnt_delta": slice(0, _K), "cnt_dt": slice(_K, 2 * _K), "samples": slice(2 * _K, 2 * _K + 1),
              "state_known": slice(2 * _K + 1, 2 * _K + 2), "not_active": slice(2 * _K + 2, 2 * _K + 3)}
N_PORT_STATS = 2 * _K + 3


class PortWindowState:
    """Window state of every port slot; fed one closed tick of rows at a time."""

    def __init__(self, n_buckets: int, bucket_s: float, capacity: int = 1024) -> None:
        self.bucket_s = float(bucket_s)
        self.ring = Ring(n_buckets, capacity, N_PORT_STATS)
        self.last_ts = np.full(capacity, np.nan)
        self.last_vals = np.full((_K, capacity), np.nan)
        self.duplicates = 0

    @property
    def nbytes(self) -> int:
        return self.ring.nbytes + self.last_ts.nbytes + self.last_vals.nbytes

    def ensure(self, capacity: int) -> None:
        if capacity <= len(self.last_ts):
            return
        self.ring.ensure(capacity)
        cap = self.ring.capacity
        last_ts = np.full(cap, np.nan)
        last_ts[: len(self.last_ts)] = self.last_ts
        last_vals = np.full((_K, cap), np.nan)
        last_vals[:, : self.last_vals.shape[1]] = self.last_vals
        self.last_ts, self.last_vals = last_ts, last_vals

    def update(self, rows: NetRows) -> None:
        """Fold one tick's port samples (any order) into the state."""
        folded = self.fold(rows)
        if folded is not None:
            self.apply(folded, 0)

    def fold(self, rows: NetRows, tick: np.ndarray | None = None) -> Folded | None:
        """Port samples of one or more ticks reduced per tick, state untouched (see
        :meth:`pipeline.state.GpuWindowState.fold`)."""
        if len(rows) == 0:
            return None
        self.ensure(int(rows.port.max()) + 1)
        order, port, ts, n_dup = new_samples_order(rows.ts, rows.port, self.last_ts, tick)
        self.duplicates += n_dup
        if len(order) == 0:
            return None
        tick = np.zeros(len(ts), np.int64) if tick is None else tick[order]
        vals = np.empty((_K, len(ts)))
        for i in range(_K):  # one contiguous row at a time; order is a permutation: "clip" skips a buffer
            np.take(rows.vals[i], order, out=vals[i], mode="clip")
        active = rows.active[order]
        b = np.floor(ts / self.bucket_s).astype(np.int64)
        first, starts = runs(port, b, tick)
        first_at = np.flatnonzero(first)
        fp = port[first_at]
        prev = previous_rows(port, first_at)
        delta = counter_deltas(vals, first_at, carried(vals, prev, self.last_vals[:, fp]))
        dt = ts - previous(ts, first_at, carried(ts, prev, self.last_ts[fp]))
        dt_ok = np.isfinite(dt)
        known = np.isfinite(delta) & dt_ok
        sums = np.empty((len(starts), N_PORT_STATS))
        sums[:, PORT_STATS["cnt_delta"]] = np.add.reduceat(np.where(known, delta, 0.0), starts, axis=1).T
        own = (~known & dt_ok).any(axis=1)  # counters unknown somewhere dt is known sum their own Σdt
        col = PORT_STATS["cnt_dt"]
        if not own.all():
            sums[:, col] = np.add.reduceat(np.where(dt_ok, dt, 0.0), starts)[:, None]
        if own.any():
            sums[:, np.arange(col.start, col.stop)[own]] = np.add.reduceat(
                np.where(known[own], dt, 0.0), starts, axis=1).T
        sums[:, PORT_STATS["samples"]] = np.diff(np.append(starts, len(ts)))[:, None]
        sums[:, PORT_STATS["state_known"]] = np.add.reduceat((active >= 0).astype(np.float64), starts)[:, None]
        sums[:, PORT_STATS["not_active"]] = np.add.reduceat((active == 0).astype(np.float64), starts)[:, None]
        last = last_rows(first)
        return Folded(ByTick(tick[starts], (port[starts], b[starts], sums), (0, 0, 0)),
                      ByTick(tick[last], (port[last], ts[last], vals[:, last]), (0, 0, 1)))

    def apply(self, folded: Folded, k: int) -> None:
        """Add tick *k* of :meth:`fold`'s result to the state (ticks in order)."""
        self.ring.add_cells(*folded.cells.of(k))
        lp, ts, vals = folded.lasts.of(k)
        self.last_ts[lp] = ts
        self.last_vals[:, lp] = vals

    def windows(self, n: int, tick_end: float, n_short: int) -> tuple[np.ndarray, np.ndarray]:
        """Short- and long-window sums for port slots ``< n`` at *tick_end*."""
        self.ensure(n)
        return self.ring.window(n, int(round(tick_end / self.bucket_s)), n_short)[1:]


class NodeXidState:
    """XID counts per node and class for events not resolved to a GPU."""

    def __init__(self, n_buckets: int, bucket_s: float, capacity: int = 256) -> None:
        self.bucket_s = float(bucket_s)
        self.ring = Ring(n_buckets, capacity, len(XID_CLASSES))

    @property
    def nbytes(self) -> int:
        return self.ring.nbytes

    def add(self, nodes: np.ndarray, ts: np.ndarray, codes: np.ndarray) -> None:
        if len(nodes) == 0:
            return
        self.ring.ensure(int(nodes.max()) + 1)
        self.ring.add_at(nodes, np.floor(ts / self.bucket_s).astype(np.int64), xid_class(codes))

    def windows(self, n: int, tick_end: float, n_short: int) -> tuple[np.ndarray, np.ndarray]:
        """Short- and long-window counts for nodes ``< n`` at *tick_end*."""
        self.ring.ensure(n)
        return self.ring.window(n, int(round(tick_end / self.bucket_s)), n_short)[1:]
