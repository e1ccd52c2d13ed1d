"""Per-GPU window state: preallocated numpy arrays indexed by GPU slot.

For every GPU slot (see :mod:`pipeline.registry`) this keeps

* the last sample's time and raw values (counters for the next delta, gauges such as
  ``row_remap_pending`` and cumulative counters such as remapped rows for "since seen"
  features);
* a :class:`~pipeline.ring.Ring` of per-bucket sums (layout :data:`STATS`): for the
  window gauges n, Σx, Σx², Σt, Σt², Σtx (level, spread and least-squares slope of any
  window from sums); for every counter Σincrement and Σdt over rows where the
  increment is known (rates from real timestamp deltas, so irregular sampling is
  exact); throttle-bit counts; sample counts; XID counts per class.

Memory per GPU is ``n_buckets × len(STATS) × 8`` bytes plus a few hundred bytes of last
values, independent of how many ticks have been fed.
"""

from __future__ import annotations

import numpy as np

from collector import xid
from collector.schema import (
    GPU_COUNTERS,
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_HW_SLOWDOWN,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_POWER_CAP,
    THROTTLE_SW_THERMAL,
)
from pipeline.samples import GPU_COL, GPU_VALUE_COLUMNS, GpuRows
from pipeline.ring import ByTick, Folded, Ring
from pipeline.deltas import (
    anchor_rows,
    carried,
    counter_deltas,
    group_flags,
    last_rows,
    new_samples_order,
    previous,
    previous_rows,
    runs,
)

#: Gauges whose windows get level / spread / slope.
WINDOW_GAUGES: tuple[str, ...] = ("temp_gpu_c", "temp_mem_c", "power_w", "sm_clock_mhz", "util_gpu")

#: Throttle reason bits (name, nvmlClocksEventReasons mask).
THROTTLE_BITS: tuple[tuple[str, int], ...] = (
    ("sw_power_cap", THROTTLE_SW_POWER_CAP), ("hw_slowdown", THROTTLE_HW_SLOWDOWN),
    ("sw_thermal", THROTTLE_SW_THERMAL), ("hw_thermal", THROTTLE_HW_THERMAL),
    ("hw_power_brake", THROTTLE_HW_POWER_BRAKE))

#: XID classes counted in windows: :data:`collector.xid.XID_CLASSES` in order, each with its
#: catalogue codes; the last (``other``) also takes every code outside the catalogue.
XID_CLASSES: tuple[tuple[str, frozenset[int]], ...] = tuple((c.name, xid.codes_by_class()[c.name])
                                                            for c in xid.XID_CLASSES)
_XID_TABLE = np.full(1024, len(XID_CLASSES) - 1, np.int8)
for _k, (_name, _codes) in enumerate(XID_CLASSES):
    _XID_TABLE[sorted(_codes)] = _k


def xid_class(codes: np.ndarray) -> np.ndarray:
    """Index into :data:`XID_CLASSES` for each XID code."""
    c = np.clip(codes, 0, len(_XID_TABLE) - 1)
    return np.where((codes >= 0) & (codes < len(_XID_TABLE)), _XID_TABLE[c], len(XID_CLASSES) - 1)


def _layout() -> dict[str, slice]:
    g, k = len(WINDOW_GAUGES), len(GPU_COUNTERS)
    sizes = [("n", g), ("sx", g), ("st", g), ("sxx", g), ("stt", g), ("stx", g),  # n, Σx, Σt first: re-referenced
             ("cnt_delta", k), ("cnt_dt", k), ("thr_known", 1), ("thr_bits", len(THROTTLE_BITS)),
             ("samples", 1), ("xid", len(XID_CLASSES))]
    out, at = {}, 0
    for name, size in sizes:
        out[name] = slice(at, at + size)
        at += size
    return out


#: Stat name → columns of one ring cell.
STATS = _layout()
N_STATS = max(s.stop for s in STATS.values())
#: Ring parts: n, then Σx and Σt, then the rest — the columns the slope re-referencing weighs
#: (:meth:`GpuWindowState.windows`) each read as one contiguous block.
_RING_PARTS = (STATS["n"].stop, max(STATS[k].stop for k in ("sx", "st")))

_GAUGE_IDX = np.array([GPU_COL[g] for g in WINDOW_GAUGES])
_COUNTER_IDX = np.array([GPU_COL[c] for c in GPU_COUNTERS])
#: Counters the GPU keeps across reboots (InfoROM): a decrease re-anchors, it is not a reset.
LIFETIME_COUNTERS = tuple(c for c in GPU_COUNTERS if c.endswith("_agg") or c.startswith(("retired", "remapped")))
_LIFETIME = np.array([c in LIFETIME_COUNTERS for c in GPU_COUNTERS])
_LIFETIME_ROWS = np.flatnonzero(_LIFETIME)
_THR_IDX = GPU_COL["throttle_reasons"]
_RING_IDX = np.concatenate([_GAUGE_IDX, _COUNTER_IDX, [_THR_IDX]])
_THR_MASKS = np.array([m for _, m in THROTTLE_BITS], np.int64)


class GpuWindowState:
    """Window state of every GPU slot; fed one closed tick of rows at a time."""

    def __init__(self, n_buckets: int, bucket_s: float, capacity: int = 1024) -> None:
        self.bucket_s = float(bucket_s)
        self.ring = Ring(n_buckets, capacity, N_STATS, _RING_PARTS)
        self.last_ts = np.full(capacity, np.nan)
        self.last_seen = np.full(capacity, -np.inf)
        #: time of each slot's latest *reading*: a sample with at least one gauge value (a row of nulls, as an
        #: exporter may write for a GPU it lost, is not one); NaN before the first
        self.last_read = np.full(capacity, np.nan)
        self.last_vals = np.full((len(GPU_VALUE_COLUMNS), capacity), np.nan)
        self.duplicates = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the state arrays (bounded by capacity, not by stream length)."""
        return (self.ring.nbytes + self.last_ts.nbytes + self.last_seen.nbytes + self.last_read.nbytes
                + self.last_vals.nbytes)

    def ensure(self, capacity: int) -> None:
        """Make room for slots ``< capacity``."""
        if capacity <= len(self.last_ts):
            return
        self.ring.ensure(capacity)
        cap = self.ring.capacity
        self.last_ts = _pad(self.last_ts, cap, np.nan)
        self.last_seen = _pad(self.last_seen, cap, -np.inf)
        self.last_read = _pad(self.last_read, cap, np.nan)
        self.last_vals = _pad(self.last_vals, cap, np.nan)

    def update(self, rows: GpuRows) -> None:
        """Fold one tick's GPU samples (any order) into the state.

        Rows are sorted by (slot, ts) here; a repeated (slot, ts) is counted in
        :attr:`duplicates` and ignored.
        """
        folded = self.fold(rows)
        if folded is not None:
            self.apply(folded, 0)

    def fold(self, rows: GpuRows, tick: np.ndarray | None = None, anchors: np.ndarray | None = None
             ) -> Folded | None:
        """Reduce the samples of one or more ticks (*tick*: each row's tick, default all 0)
        to ring cells and each slot's last sample, per tick, without changing the state.

        Each slot's (tick's) last sample carries whether the GPU was repaired in it: a volatile
        counter went down (GPU reset, reboot), or a row is one of *anchors* ((slot, ts), (2, m):
        the first sample of a new GPU at that index), where lifetime counters are re-anchored
        (increment 0, up or down) — the new GPU's history is not an increment of the old one's.

        :meth:`apply` of every tick in order then leaves exactly the state that
        :meth:`update` tick by tick would: same rows, same sums, same order. Replay folds
        a whole read window at once, so the per-call cost is paid once, not per tick.
        """
        if len(rows) == 0:
            return None
        self.ensure(int(rows.slot.max()) + 1)
        order, slot, ts, n_dup = new_samples_order(rows.ts, rows.slot, self.last_ts, tick)
        self.duplicates += n_dup
        if len(order) == 0:
            return None
        n = len(ts)
        tick = np.zeros(n, np.int64) if tick is None else tick[order]
        # only the columns the ring needs, gathered one contiguous row at a time (tick-major
        # order keeps each gather within one tick's rows)
        vals = np.empty((len(_RING_IDX), n))
        for i, j in enumerate(_RING_IDX):
            np.take(rows.vals[j], order, out=vals[i], mode="clip")  # order is a permutation: "clip" skips a buffer
        x, cur, thr = vals[: len(_GAUGE_IDX)], vals[len(_GAUGE_IDX): -1], vals[-1]
        b = np.floor(ts / self.bucket_s).astype(np.int64)
        first, starts = runs(slot, b, tick)
        first_at = np.flatnonzero(first)  # integer indices: cheaper than the mask for 2-D rows
        first_slots = slot[first_at]
        prev = previous_rows(slot, first_at)

        # Every per-row weight is written into one (row, sample) block and reduced to cells by one
        # reduceat; stat_rows maps each ring stat to its row of the result (a shared row once).
        g, kc, nb = len(_GAUGE_IDX), len(_COUNTER_IDX), len(THROTTLE_BITS)
        t = ts - b * self.bucket_s
        ok = np.isfinite(x)
        some = ~ok.all(axis=1)  # gauges with a missing value get their own n, Σt, Σt²
        w = np.empty((6 * g + 3 + 2 * kc + 3 + nb, n))  # rows for the most stats any window needs
        stat_rows = np.empty(N_STATS, np.intp)
        at = 0

        def alloc(count: int, stats: np.ndarray) -> np.ndarray:
            """The next *count* rows of w, for the ring *stats* (one row each, or one shared)."""
            nonlocal at
            stat_rows[stats] = at + np.arange(count) if count == len(stats) else at
            at += count
            return w[at - count: at]

        cols = {k: np.arange(v.start, v.stop) for k, v in STATS.items()}
        # counters: increments with reset handling (computed in place), and the time they cover
        delta = alloc(kc, cols["cnt_delta"])
        reset = np.empty(n, bool)
        counter_deltas(cur, first_at, carried(cur, prev, self.last_vals[_COUNTER_IDX][:, first_slots]), out=delta,
                       lifetime=_LIFETIME, resets=reset)
        swapped = anchor_rows(slot, ts, anchors)
        if len(swapped):
            delta[np.ix_(_LIFETIME_ROWS, swapped)] = np.where(np.isfinite(delta[np.ix_(_LIFETIME_ROWS, swapped)]), 0.0,
                                                              np.nan)
            reset[swapped] = True
        dt = ts - previous(ts, first_at, carried(ts, prev, self.last_ts[first_slots]))
        dt_ok = np.isfinite(dt)
        unknown = ~np.isfinite(delta)
        unknown |= ~dt_ok
        own = (unknown & dt_ok).any(axis=1)  # counters unknown where dt is known sum their own Σdt
        np.copyto(delta, 0.0, where=unknown)
        # gauges: n, Σx, Σx², Σt, Σt², Σtx with t relative to the bucket start
        x0 = alloc(g, cols["sx"])
        np.copyto(x0, x)
        np.copyto(x0, 0.0, where=~ok)
        np.multiply(x0, x0, out=alloc(g, cols["sxx"]))
        np.multiply(x0, t, out=alloc(g, cols["stx"]))
        # n, Σt, Σt² are the same for every gauge without a missing value: summed once for those
        tt = t * t
        alloc(1, np.append(cols["n"][~some], cols["samples"]))[0] = 1.0
        alloc(1, cols["st"][~some])[0] = t
        alloc(1, cols["stt"][~some])[0] = tt
        if some.any():
            okf = ok[some]
            np.copyto(alloc(len(okf), cols["n"][some]), okf)
            np.multiply(okf, t, out=alloc(len(okf), cols["st"][some]))
            np.multiply(okf, tt, out=alloc(len(okf), cols["stt"][some]))
        np.copyto(alloc(1, cols["cnt_dt"][~own])[0], np.where(dt_ok, dt, 0.0))  # Σdt shared by the others
        if own.any():
            dst = alloc(int(own.sum()), cols["cnt_dt"][own])
            np.copyto(dst, dt)
            np.copyto(dst, 0.0, where=unknown[own])
        # throttle bits
        thr_ok = np.isfinite(thr)
        np.copyto(alloc(1, cols["thr_known"])[0], thr_ok)
        bits = np.where(thr_ok, thr, 0).astype(np.int64)[None, :] & _THR_MASKS[:, None]
        np.not_equal(bits, 0, out=alloc(nb, cols["thr_bits"]))
        alloc(1, cols["xid"])[0] = 0.0
        sums = np.add.reduceat(w[:at], starts, axis=1)  # (row, cell)

        last = last_rows(first)
        if some.all():  # every gauge misses a value somewhere: find the rows that carry one (-inf: none)
            read = np.maximum.reduceat(np.where(ok.any(axis=0), ts, -np.inf), first_at)
        else:           # a gauge with a value in every row: each group's last row is its last reading
            read = ts[last]
        return Folded(ByTick(tick[starts], (slot[starts], b[starts], sums), (0, 0, 1)),
                      ByTick(tick[last], (slot[last], ts[last], np.take(rows.vals, order[last], axis=1),
                                          group_flags(reset, first_at), read), (0, 0, 1, 0, 0)),
                      stat_rows)

    def apply(self, folded: Folded, k: int) -> np.ndarray:
        """Add tick *k* of :meth:`fold`'s result to the state (ticks in order); returns the slots
        whose GPU was reset or replaced in that tick."""
        slot, b, sums = folded.cells.of(k)
        self.ring.add_cells(slot, b, sums[folded.stat_rows].T)
        ls, ts, vals, repaired, read = folded.lasts.of(k)
        self.last_ts[ls] = ts
        self.last_vals[:, ls] = vals
        self.last_seen[ls] = np.maximum(self.last_seen[ls], ts)
        self.last_read[ls] = np.fmax(self.last_read[ls], np.where(np.isfinite(read), read, np.nan))  # ls: unique
        return ls[repaired]

    def add_xids(self, slots: np.ndarray, ts: np.ndarray, codes: np.ndarray) -> None:
        """Count XID events of known GPUs in their buckets."""
        if len(slots) == 0:
            return
        self.ensure(int(slots.max()) + 1)
        b = np.floor(ts / self.bucket_s).astype(np.int64)
        self.ring.add_at(slots, b, STATS["xid"].start + xid_class(codes))
        np.maximum.at(self.last_seen, slots, ts)

    def windows(self, n: int, tick_end: float, n_short: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Short- and long-window sums for slots ``< n`` at *tick_end*, per ring part ((n, width)
        each, columns ``self.ring.bounds``), with Σt, Σt², Σtx re-referenced from each bucket's
        start to the window end (t ≤ 0), so that the slope can be read off the sums:
        Σ(t+o) = Σt + o·n, Σ(t+o)² = Σt² + 2o·Σt + o²·n, Σ(t+o)x = Σtx + o·Σx for a bucket
        starting o seconds before the end."""
        b_end = int(round(tick_end / self.bucket_s))
        ring = self.ring
        buckets, short, long = ring.window_parts(n, b_end, n_short)
        o = (buckets - b_end) * self.bucket_s
        in_short = (buckets >= b_end - n_short).astype(np.float64)
        n_, sx, st, stt, stx = (STATS[k] for k in ("n", "sx", "st", "stt", "stx"))
        k = sx.stop - sx.start
        for plain, wo in ((short, in_short * o), (long, o)):  # only n, Σx, Σt are re-referenced
            by_o_n, = ring.weighted_sums(n, wo[None], n_)
            by_o, = ring.weighted_sums(n, wo[None], slice(sx.start, st.stop))  # one part: Σx then Σt
            by_o_sx, by_o_st = by_o[:, :k], by_o[:, k:]
            by_o2, = ring.weighted_sums(n, (wo * o)[None], n_)
            ring.columns(plain, st)[...] += by_o_n
            ring.columns(plain, stt)[...] += 2.0 * by_o_st + by_o2
            ring.columns(plain, stx)[...] += by_o_sx
        return short, long


def _pad(a: np.ndarray, cap: int, fill: float) -> np.ndarray:
    out = np.full(a.shape[:-1] + (cap,), fill, a.dtype)
    out[..., : a.shape[-1]] = a
    return out
