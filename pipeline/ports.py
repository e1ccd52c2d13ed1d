"""Per-port (IB/RoCE) window state, and node-level XID counts.

Ports work like GPUs (:mod:`pipeline.state`): a :class:`~pipeline.ring.Ring` per port
slot of Σincrement and Σdt for each counter of :data:`pipeline.samples.NET_STATE_COUNTERS`
(reset-safe), plus counts of samples, samples with a known link state and samples not
``ACTIVE``. Per port it also keeps, in telemetry time, when the link was last seen
``ACTIVE`` and since when it has been seen not ``ACTIVE`` after that (:meth:`PortWindowState.down_after_active_s`):
a port that never came up (unused) or came back up (a flap) is told apart from one
that went down and stayed down. XID events that name no GPU (the kernel line could not
be resolved to a device) are counted per node here, as the node's own features.
"""

from __future__ import annotations

import numpy as np

from pipeline.samples import NET_STATE_COUNTERS, NetRows
from pipeline.ring import ByTick, Folded, Ring
from pipeline.deltas import (
    carried,
    counter_deltas,
    group_flags,
    last_rows,
    new_samples_order,
    previous,
    previous_rows,
    runs,
)
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
        self.last_active_ts = np.full(capacity, np.nan)  # latest sample with the link ACTIVE
        self.down_since_ts = np.full(capacity, np.nan)   # first not-ACTIVE sample after it (NaN: up)
        self.duplicates = 0

    @property
    def nbytes(self) -> int:
        return (self.ring.nbytes + self.last_ts.nbytes + self.last_vals.nbytes + self.last_active_ts.nbytes
                + self.down_since_ts.nbytes)

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
        for name in ("last_active_ts", "down_since_ts"):
            a = np.full(cap, np.nan)
            a[: len(getattr(self, name))] = getattr(self, name)
            setattr(self, name, a)

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
        reset = np.empty(len(ts), bool)
        delta = counter_deltas(vals, first_at, carried(vals, prev, self.last_vals[:, fp]), resets=reset)
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
        up_at, down_at = _link_transitions(ts, active, np.flatnonzero(first))
        return Folded(ByTick(tick[starts], (port[starts], b[starts], sums), (0, 0, 0)),
                      ByTick(tick[last], (port[last], ts[last], vals[:, last], up_at, down_at,
                                          group_flags(reset, first_at)), (0, 0, 1, 0, 0, 0)))

    def apply(self, folded: Folded, k: int) -> np.ndarray:
        """Add tick *k* of :meth:`fold`'s result to the state (ticks in order); returns the port
        slots whose counters were reset in that tick (a port reset, an HCA reload, a reboot)."""
        self.ring.add_cells(*folded.cells.of(k))
        lp, ts, vals, up_at, down_at, repaired = folded.lasts.of(k)
        self.last_ts[lp] = ts
        self.last_vals[:, lp] = vals
        up = np.isfinite(up_at)  # seen ACTIVE in this tick: down only if a not-ACTIVE sample followed
        self.last_active_ts[lp[up]] = up_at[up]
        self.down_since_ts[lp[up]] = down_at[up]
        still = ~up & np.isfinite(down_at)  # only not ACTIVE in this tick: down since the first, unless already
        held = self.down_since_ts[lp[still]]
        self.down_since_ts[lp[still]] = np.where(np.isnan(held), down_at[still], held)
        return lp[repaired]

    def down_after_active_s(self, n: int) -> np.ndarray:
        """Per port slot ``< n``: seconds from its first not-ACTIVE sample to its latest sample,
        for ports seen ACTIVE at some time and not ACTIVE since; 0 for every other port (up,
        or never ACTIVE: unused).

        The time keeps counting however long the port stays down: "went down at" is kept per
        port until it is ACTIVE again, not read from the long window, so a dead port goes on
        firing the port-down rule and a node held for it is not resumed while the port is dead.
        """
        self.ensure(n)
        down = self.last_ts[:n] - self.down_since_ts[:n]  # NaN where up or never ACTIVE
        return np.nan_to_num(np.maximum(np.where(np.isfinite(self.last_active_ts[:n]), down, np.nan), 0.0), nan=0.0)

    def windows(self, n: int, tick_end: float, n_short: int) -> tuple[np.ndarray, np.ndarray]:
        """Short- and long-window sums for port slots ``< n`` at *tick_end*."""
        self.ensure(n)
        return self.ring.window(n, int(round(tick_end / self.bucket_s)), n_short)[1:]


def _link_transitions(ts: np.ndarray, active: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per (tick, port) group of rows (sorted by ts; *starts*: first rows): the ts of the last
    ACTIVE sample (NaN if none), and of the first not-ACTIVE sample after it — or of the
    first not-ACTIVE sample when none was ACTIVE (NaN if none). Unknown states count as neither."""
    idx = np.arange(len(ts))
    last_up = np.maximum.reduceat(np.where(active == 1, idx, -1), starts)
    group = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(ts))))
    first_down = np.minimum.reduceat(np.where((active == 0) & (idx > last_up[group]), idx, len(ts)), starts)
    ts_pad = np.append(ts, np.nan)
    return ts_pad[np.where(last_up >= 0, last_up, len(ts))], ts_pad[first_down]


class NodeXidState:
    """XID counts per node and class for events not resolved to a GPU (the node's own evidence)."""

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
