"""Samples sorted into runs, and the per-sample helpers that reduce them to ring cells.

Updates arrive as rows sorted by (tick, slot, ts) (:func:`new_samples_order`): :func:`runs`
finds where each (tick, slot)'s and each (tick, slot, bucket)'s rows start,
:func:`previous_rows` links each group to the same slot's rows of an earlier tick,
:func:`counter_deltas` turns cumulative counters into non-negative increments with reset
handling, and ``np.add.reduceat`` sums each run into one cell — no Python loop per sample.
"""

from __future__ import annotations

import numpy as np


def sort_order(ts: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Permutation sorting rows by (key, ts). Each slot's rows usually arrive in time
    order already (one collector per node), so a stable sort by key is tried first and
    the full two-key sort is done only when some key's rows are out of order."""
    order = np.argsort(key, kind="stable")
    if len(ts) < 2:
        return order
    s, t = key[order], ts[order]
    if bool(((t[1:] >= t[:-1]) | (s[1:] != s[:-1])).all()):
        return order
    return np.lexsort((ts, key))


def new_samples_order(ts: np.ndarray, slot: np.ndarray, last_ts: np.ndarray, tick: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Rows sorted by (tick, slot, ts) without repeats: a second sample of a slot at the same ts,
    or one at or before the slot's last folded sample (the same sample sent again).

    *tick* (each row's scoring tick, a non-decreasing function of ts) is the major key, so
    each tick's rows are contiguous and gathering them stays within a tick's rows; without
    it rows are sorted by (slot, ts). Returns (order into the input rows, their slots, their
    ts, how many rows were dropped).
    """
    if tick is None or len(tick) == 0:
        key = slot
    else:
        key = (tick - tick.min()) * np.int64(len(last_ts)) + slot  # slots < len(last_ts)
    order = sort_order(ts, key)
    slot, ts = slot[order], ts[order]
    dup = np.zeros(len(ts), bool)
    np.equal(ts[1:], ts[:-1], out=dup[1:])  # same ts implies the same tick: only a slot change breaks a repeat
    dup[1:] &= slot[1:] == slot[:-1]
    dup |= ts <= last_ts[slot]
    if not dup.any():
        return order, slot, ts, 0
    keep = ~dup
    return order[keep], slot[keep], ts[keep], int(dup.sum())


def runs(slot: np.ndarray, b: np.ndarray | None = None, tick: np.ndarray | None = None
         ) -> tuple[np.ndarray, np.ndarray]:
    """For rows sorted by (tick,) slot, ts: mask of each (tick, slot) group's first row,
    and the start indices of each (tick, slot, bucket) run when *b* is given (else of
    each group)."""
    n = len(slot)
    first = np.ones(n, bool)
    np.not_equal(slot[1:], slot[:-1], out=first[1:])
    if tick is not None:
        first[1:] |= tick[1:] != tick[:-1]
    if b is None:
        return first, np.flatnonzero(first)
    cell = first.copy()
    cell[1:] |= b[1:] != b[:-1]
    return first, np.flatnonzero(cell)


def last_rows(first: np.ndarray) -> np.ndarray:
    """Index of each (tick, slot) group's last row (*first*: each group's first row, see :func:`runs`)."""
    return np.flatnonzero(np.append(first[1:], True))


def previous_rows(slot: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """For the first row of each (tick, slot) group (*starts*: their indices, rows sorted by
    tick, slot, ts): the row of the same slot just before it — the last row of that slot's
    latest earlier tick — or -1 when this fold has none (the slot's state then holds the
    previous sample)."""
    ends = np.append(starts[1:], len(slot)) - 1
    g_slot = slot[starts]
    by_slot = np.argsort(g_slot, kind="stable")  # each slot's groups in tick order
    prev = np.full(len(starts), -1, np.int64)
    same = g_slot[by_slot[1:]] == g_slot[by_slot[:-1]]
    prev[by_slot[1:][same]] = ends[by_slot[:-1][same]]
    return prev


def carried(values: np.ndarray, prev: np.ndarray, state: np.ndarray) -> np.ndarray:
    """Value before each group's first row: ``values[..., prev]`` where the fold has that row
    (:func:`previous_rows`), else *state* (the slot's last value from earlier folds, aligned to
    the groups; modified in place and returned)."""
    has = prev >= 0
    if has.any():
        state[..., has] = values[..., prev[has]]
    return state


def previous(values: np.ndarray, first: np.ndarray, carried: np.ndarray) -> np.ndarray:
    """Value of the previous row of the same slot: the row before, or *carried* (see
    :func:`carried`, aligned to the first rows) for a group's first row (*first*: indices
    of the groups' first rows, or their mask)."""
    prev = np.empty_like(values)
    prev[..., 1:] = values[..., :-1]
    prev[..., first] = carried
    return prev


def counter_deltas(cur: np.ndarray, first: np.ndarray, carried: np.ndarray, out: np.ndarray | None = None,
                   lifetime: np.ndarray | None = None, resets: np.ndarray | None = None) -> np.ndarray:
    """Increments of cumulative counters (rows on the last axis, sorted by slot then ts).

    *first* indexes (or masks) each group's first row, *carried* is the value before it
    (see :func:`carried`).
    A counter that went down was reset (driver reload, GPU reset, reboot): the
    increment is the new value, counted from zero — never negative. NaN (field not
    supported, or no previous sample) stays NaN, so it never reads as "no errors".
    Rows flagged in *lifetime* (one flag per row: aggregate ECC, remapped rows, retired
    pages — kept by the GPU across reboots) cannot be reset by a driver reload: one that
    goes down is another part at that index (a GPU swap) or an admin clear, so it is
    re-anchored there (increment 0) instead of counting the new part's whole history.
    Written into *out* when given (same shape as *cur*); *resets* (bool, one per row), when
    given, is set where some counter that is not a lifetime one went down: the part was reset.
    """
    delta = np.empty_like(cur) if out is None else out
    np.subtract(cur[..., 1:], cur[..., :-1], out=delta[..., 1:])
    delta[..., first] = cur[..., first] - carried
    down = delta < 0
    if lifetime is not None and lifetime.any():
        anchored = down & lifetime.reshape((-1,) + (1,) * (cur.ndim - 1))
        np.copyto(delta, 0.0, where=anchored)
        down &= ~anchored
    np.copyto(delta, cur, where=down)
    if resets is not None:
        np.any(down, axis=0, out=resets)
    return delta


def group_flags(flags: np.ndarray, first_at: np.ndarray) -> np.ndarray:
    """Per (tick, slot) group (*first_at*: each group's first row): whether any of its rows is flagged."""
    out = np.zeros(len(first_at), bool)
    hit = np.flatnonzero(flags)
    if len(hit):
        out[np.searchsorted(first_at, hit, side="right") - 1] = True
    return out


def anchor_rows(slot: np.ndarray, ts: np.ndarray, anchors: np.ndarray | None) -> np.ndarray:
    """Rows (sorted) at one of *anchors* ((slot, ts) pairs, (2, m): a new part's first sample)."""
    if anchors is None or anchors.shape[1] == 0:
        return np.zeros(0, np.intp)
    hit = np.zeros(len(slot), bool)
    for a_slot, a_ts in anchors.T.tolist():  # a handful at most: GPU swaps are rare
        hit |= (slot == a_slot) & (ts == a_ts)
    return np.flatnonzero(hit)
