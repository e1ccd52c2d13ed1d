"""Per GPU: its corrected-ECC rate over the last 10 minutes, against its own peak of the last 2 hours
and against its own rate of the hour before.

A benign storm of corrected errors rises, peaks and tails off over minutes to hours; a failing
HBM's precursor grows, or comes back after a lull (shared/research/field-rates.md §2). At the
moment a model reads a storm's long window as a failure, the storm is mostly *falling*: its
10-minute rate is a fraction of the highest it had lately (bench/results/robustness.md,
thirteenth session: 0.29–0.56 at every false drain measured, ≥ 0.6 at 55 of 63 true ones). A
ratio of the GPU's own rates means the same on every fleet, whatever its background.

:class:`SbeStorm` keeps, per GPU slot:

- the events and exposure of its short windows in **one-minute buckets** of telemetry time, the
  last ten of them: the 10-minute rate is their sum of events over their sum of exposure, so it
  does not depend on the sampling interval or the tick (two 30 s ticks add up in one bucket);
- the highest 10-minute rate it read in each **10-minute bucket**, the last twelve: the peak is
  their maximum, a horizon of 110–120 minutes;
- the events and exposure of each of those 10-minute buckets: the rate of **the hour before** is
  that of the six buckets that ended 10–20 minutes ago and the five before them, so it never
  overlaps the 10-minute rate. The rate now over that one (with a floor of 1 per hour) is the
  storm's **growth**: about 1 for a storm that holds its rate, under 1 for one that falls, well
  above 1 for a part that errs more and more, as a failing HBM does (bench/results/robustness.md,
  eighteenth session, candidate W21).

Buckets are told apart by their number (the bucket a window's end closes: a window ending on a
minute's last instant counts in that minute), so a GPU that was not scored
for a while reads only what is recent, never a stale slot. A repaired GPU starts afresh.
"""

from __future__ import annotations

import numpy as np

#: width of a rate bucket and how many make the rate window (10 minutes)
RATE_BUCKET_S, RATE_BUCKETS = 60.0, 10
#: width of a peak bucket and how many make the peak's horizon (2 hours)
PEAK_BUCKET_S, PEAK_BUCKETS = 600.0, 12
#: the hour the growth compares with: the peak buckets that ended 10-20 minutes ago and the five before
PRIOR_FIRST, PRIOR_LAST = 7, 2
#: least exposure in that hour for a growth reading (s): half of it
PRIOR_MIN_EXPOSURE_S = 1800.0
#: floor of the hour's rate (per hour): the baselines' prior rate, one error an hour (pipeline.baselines),
#: so a GPU quiet that hour reads as rising, not as a division by zero
PRIOR_FLOOR_PER_H = 1.0


class SbeStorm:
    """Per GPU slot: the 10-minute SBE rate (per hour), its ratio to the GPU's own 2-hour peak and
    to its own rate of the hour before (growth)."""

    def __init__(self, capacity: int) -> None:
        self.events = np.zeros((capacity, RATE_BUCKETS))
        self.exposure = np.zeros((capacity, RATE_BUCKETS))
        self.rate_id = np.full((capacity, RATE_BUCKETS), -1, np.int64)   # bucket number held by each slot
        self.peak = np.zeros((capacity, PEAK_BUCKETS))
        self.peak_id = np.full((capacity, PEAK_BUCKETS), -1, np.int64)
        self.bucket_events = np.zeros((capacity, PEAK_BUCKETS))    # per peak bucket (same ids)
        self.bucket_exposure = np.zeros((capacity, PEAK_BUCKETS))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.events, self.exposure, self.rate_id, self.peak, self.peak_id,
                                      self.bucket_events, self.bucket_exposure))

    def ensure(self, capacity: int) -> None:
        have = len(self.events)
        if capacity <= have:
            return
        cap = max(capacity, 2 * have)

        def grow(a: np.ndarray, fill: float) -> np.ndarray:
            out = np.full((cap, a.shape[1]), fill, a.dtype)
            out[:have] = a
            return out

        self.events, self.exposure, self.peak, self.bucket_events, self.bucket_exposure = (
            grow(a, 0.0) for a in (self.events, self.exposure, self.peak, self.bucket_events, self.bucket_exposure))
        self.rate_id, self.peak_id = grow(self.rate_id, -1), grow(self.peak_id, -1)

    def restart(self, parts: np.ndarray) -> None:
        """Forget *parts* (a repaired or replaced GPU: its storms were another part's)."""
        self.rate_id[parts] = -1
        self.peak_id[parts] = -1

    def update(self, parts: np.ndarray, now: float, events: np.ndarray,
               exposure_s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Add the short window ending at *now* (*events* over *exposure_s* per part; NaN: no counter
        or no interval) and return (SBE per hour over the last 10 minutes, that rate over the GPU's
        peak of the last 2 hours, that rate over the GPU's rate of the hour before). The rate is NaN
        without exposure in the last 10 minutes; the ratio is 1 where the GPU read no error in the
        last 2 hours, NaN where the rate is NaN; the growth divides by the hour's rate floored at
        :data:`PRIOR_FLOOR_PER_H`, NaN where the rate is NaN or the hour holds under
        :data:`PRIOR_MIN_EXPOSURE_S` of exposure."""
        n = len(parts)
        if n == 0:
            return np.zeros(0), np.zeros(0), np.zeros(0)
        b = int(np.ceil(now / RATE_BUCKET_S)) - 1  # the bucket a window ending at *now* closes
        col = b % RATE_BUCKETS
        ok = np.isfinite(events) & np.isfinite(exposure_s) & (exposure_s > 0)
        fresh = self.rate_id[parts, col] != b
        k, t = np.where(ok, np.maximum(events, 0.0), 0.0), np.where(ok, exposure_s, 0.0)
        self.events[parts, col] = np.where(fresh, 0.0, self.events[parts, col]) + k
        self.exposure[parts, col] = np.where(fresh, 0.0, self.exposure[parts, col]) + t
        self.rate_id[parts, col] = b
        recent = self.rate_id[parts] > b - RATE_BUCKETS
        ev = np.where(recent, self.events[parts], 0.0).sum(axis=1)
        ex = np.where(recent, self.exposure[parts], 0.0).sum(axis=1)
        rate = np.full(n, np.nan)
        np.divide(ev * 3600.0, ex, out=rate, where=ex > 0)

        pb = int(np.ceil(now / PEAK_BUCKET_S)) - 1
        pcol = pb % PEAK_BUCKETS
        known = np.isfinite(rate)
        same = self.peak_id[parts, pcol] == pb
        held = np.where(same, self.peak[parts, pcol], 0.0)
        self.peak[parts, pcol] = np.where(known, np.maximum(held, np.nan_to_num(rate)), held)
        self.bucket_events[parts, pcol] = np.where(same, self.bucket_events[parts, pcol], 0.0) + k
        self.bucket_exposure[parts, pcol] = np.where(same, self.bucket_exposure[parts, pcol], 0.0) + t
        self.peak_id[parts, pcol] = pb
        ids = self.peak_id[parts]
        peak = np.where(ids > pb - PEAK_BUCKETS, self.peak[parts], 0.0).max(axis=1)
        ratio = np.divide(rate, peak, out=np.ones(n), where=peak > 0)

        before = (ids >= pb - PRIOR_FIRST) & (ids <= pb - PRIOR_LAST)
        prior_ex = np.where(before, self.bucket_exposure[parts], 0.0).sum(axis=1)
        prior_ev = np.where(before, self.bucket_events[parts], 0.0).sum(axis=1)
        prior = np.full(n, np.nan)
        np.divide(prior_ev * 3600.0, prior_ex, out=prior, where=prior_ex > 0)
        growth = rate / np.maximum(prior, PRIOR_FLOOR_PER_H)
        growth = np.where(known & (prior_ex >= PRIOR_MIN_EXPOSURE_S), growth, np.nan)
        return rate, np.where(known, ratio, np.nan), growth
