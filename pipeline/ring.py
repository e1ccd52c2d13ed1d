"""Bucketed ring buffers of per-slot sums, and the folded cells handed to them tick by tick.

A :class:`Ring` holds, for every slot (a GPU, a port, a node), ``n_buckets`` cells of
``n_stats`` float64 sums, one cell per ``bucket_s`` seconds of telemetry time. Cell
``pos = b % n_buckets`` of bucket index ``b = floor(ts / bucket_s)`` is tagged with
``b``; a cell whose tag is not the bucket a window asks for is stale and reads as
empty. So memory per slot is fixed (``n_buckets * n_stats * 8`` bytes) however long
the stream runs, and a window is a sum over at most ``n_buckets`` cells.

Samples are reduced to cells by the window states' ``fold`` (with the helpers of
:mod:`pipeline.deltas`) and handed to the ring one tick at a time as :class:`Folded` cells.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class Ring:
    """``n_buckets`` × capacity × ``n_stats`` sums, tagged by bucket index, growing by doubling.

    The stats may be stored as several column *parts* (``parts``: where each part after the
    first starts), each its own contiguous (n_buckets, capacity, width) array: a weighted sum
    over the columns of one part (:meth:`weighted_sums`) then reads contiguous memory
    instead of a few columns out of every cell. Parts change no sum: every column is still
    added bucket position by position.
    """

    def __init__(self, n_buckets: int, capacity: int, n_stats: int, parts: tuple[int, ...] = ()) -> None:
        self.n_buckets = n_buckets
        self.n_stats = n_stats
        self.bounds = list(zip((0, *parts), (*parts, n_stats)))
        self.accs = [np.zeros((n_buckets, capacity, hi - lo)) for lo, hi in self.bounds]
        self.tag = np.full((n_buckets, capacity), -1, np.int64)

    @property
    def capacity(self) -> int:
        return self.tag.shape[1]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.accs) + self.tag.nbytes

    def ensure(self, capacity: int) -> None:
        """Grow (by doubling) to hold at least *capacity* slots."""
        cap = self.capacity
        if capacity <= cap:
            return
        while cap < capacity:
            cap *= 2
        accs = []
        for old in self.accs:
            acc = np.zeros((self.n_buckets, cap, old.shape[2]))
            acc[:, : self.capacity] = old
            accs.append(acc)
        tag = np.full((self.n_buckets, cap), -1, np.int64)
        tag[:, : self.capacity] = self.tag
        self.accs, self.tag = accs, tag

    def _part(self, stats: slice) -> tuple[np.ndarray, slice]:
        """The part holding columns *stats* (a slice inside one part), and their slice in it."""
        lo, hi, _ = stats.indices(self.n_stats)
        for (a, b), acc in zip(self.bounds, self.accs):
            if a <= lo and hi <= b:
                return acc, slice(lo - a, hi - a)
        raise ValueError(f"stats {lo}:{hi} span more than one part of {self.bounds}")

    def _claim(self, slot: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Positions of cells (slot, b); cells that held an older bucket are zeroed first."""
        pos = b % self.n_buckets
        stale = self.tag[pos, slot] != b
        if stale.any():
            for acc in self.accs:
                acc[pos[stale], slot[stale]] = 0.0
            self.tag[pos[stale], slot[stale]] = b[stale]
        return pos

    def add_cells(self, slot: np.ndarray, b: np.ndarray, sums: np.ndarray) -> None:
        """Add ``sums[i]`` (n_stats,) to cell (slot[i], b[i]); the (slot, b) pairs are distinct."""
        pos = self._claim(slot, b)
        for (lo, hi), acc in zip(self.bounds, self.accs):
            acc[pos, slot] += sums[:, lo:hi]

    def add_at(self, slot: np.ndarray, b: np.ndarray, stat: np.ndarray, w: float | np.ndarray = 1.0) -> None:
        """Add *w* to stat ``stat[i]`` of cell (slot[i], b[i]); pairs may repeat (rare rows: events)."""
        pos = self._claim(slot, b)
        for (lo, hi), acc in zip(self.bounds, self.accs):
            at = (stat >= lo) & (stat < hi)
            if at.all():
                np.add.at(acc, (pos, slot, stat - lo), w)
            elif at.any():
                np.add.at(acc, (pos[at], slot[at], stat[at] - lo), w if np.ndim(w) == 0 else w[at])

    def window_buckets(self, n: int, b_end: int) -> np.ndarray:
        """Bucket index each ring position stands for in the window ending before *b_end*.

        The ring is exactly as long as the long window, so every position is in it; cells
        of slots ``< n`` holding an older bucket are stale and are zeroed here (their
        content can never be read again), so a plain sum over positions is the window;
        they are then tagged as the (empty) bucket they stand for, so each is zeroed once.
        """
        buckets = np.empty(self.n_buckets, np.int64)
        wanted = np.arange(b_end - self.n_buckets, b_end, dtype=np.int64)
        buckets[wanted % self.n_buckets] = wanted
        stale = self.tag[:, :n] != buckets[:, None]
        if stale.any():
            for acc in self.accs:
                acc[:, :n][stale] = 0.0
            self.tag[:, :n][stale] = np.broadcast_to(buckets[:, None], stale.shape)[stale]
        return buckets

    def weighted_sums(self, n: int, weights: np.ndarray, stats: slice = slice(None)) -> list[np.ndarray]:
        """``Σ_pos weights[k, pos] · cell[pos, slot, stats]`` for slots ``< n``: one (n, n_stats')
        per row of *weights*, each read over the positions that row weighs. *stats* must lie
        in one part (contiguous when it is the whole part).

        Meant for a few columns (*stats*): the plain sums of every column come from
        :meth:`window`. ``einsum`` over the ring view, not a BLAS product: no copy of the
        ring, and no BLAS threads spinning against a busy core.
        """
        acc, cols = self._part(stats)
        out = []
        for w in weights:
            pos = np.flatnonzero(w)
            if len(pos) == 1:  # one bucket (the short window): a product, no sum
                out.append(acc[pos[0], :n, cols] * w[pos[0]])
            elif len(pos) == self.n_buckets:
                out.append(np.einsum("b,bsc->sc", w, acc[:, :n, cols]))
            else:
                out.append(np.einsum("b,bsc->sc", w[pos], acc[pos, :n, cols]))
        return out

    def window_parts(self, n: int, b_end: int, n_short: int) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
        """Bucket index of every ring position (see :meth:`window_buckets`), and the sums over
        the short and the long window ending before bucket *b_end*, per part: (n, width) each."""
        buckets = self.window_buckets(n, b_end)
        pos = np.flatnonzero(buckets >= b_end - n_short)
        short, long = [], []
        for acc in self.accs:
            cells = acc[:, :n]
            long.append(cells.sum(axis=0))  # into a fresh contiguous array: much faster than out=
            short.append(cells[pos[0]].copy() if len(pos) == 1 else cells[pos].sum(axis=0))
        return buckets, short, long

    def window(self, n: int, b_end: int, n_short: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`window_parts` with the parts side by side: two (n, n_stats)."""
        buckets, short, long = self.window_parts(n, b_end, n_short)
        if len(self.accs) == 1:
            return buckets, short[0], long[0]
        return buckets, np.concatenate(short, axis=1), np.concatenate(long, axis=1)

    def columns(self, parts: list[np.ndarray], stats: slice) -> np.ndarray:
        """View of columns *stats* (inside one part) of per-part arrays from :meth:`window_parts`."""
        lo, hi, _ = stats.indices(self.n_stats)
        for (a, b), part in zip(self.bounds, parts):
            if a <= lo and hi <= b:
                return part[:, lo - a: hi - a]
        raise ValueError(f"stats {lo}:{hi} span more than one part of {self.bounds}")


@dataclass
class Folded:
    """Rows of one or more ticks reduced to ring cells (slot, bucket, sums) and each slot's
    last row per tick (slot, ts, values), to add to a window state one tick at a time."""

    cells: "ByTick"
    lasts: "ByTick"
    #: when set, the cells' sums are (row, cell) and ``sums[stat_rows]`` are the ring stats
    stat_rows: np.ndarray | None = None


class ByTick:
    """Arrays of rows (row axis given per array) regrouped by tick, to hand out one tick
    at a time. Rows keep their order inside a tick (stable)."""

    def __init__(self, tick: np.ndarray, arrays: tuple[np.ndarray, ...], axes: tuple[int, ...]) -> None:
        if len(tick) > 1 and not bool((tick[1:] >= tick[:-1]).all()):
            order = np.argsort(tick, kind="stable")
            tick = tick[order]
            arrays = tuple(np.take(a, order, axis=ax) for a, ax in zip(arrays, axes))
        self.tick, self.arrays, self.axes = tick, arrays, axes

    def of(self, k: int) -> tuple[np.ndarray, ...]:
        i0, i1 = np.searchsorted(self.tick, (k, k + 1))
        return tuple(a[i0:i1] if ax == 0 else a[:, i0:i1] for a, ax in zip(self.arrays, self.axes))
