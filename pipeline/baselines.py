"""Per-part baselines of error-counter rates, learned online on the fleet being watched.

A healthy part of a real fleet is rarely at zero: one IB port logs a receive error an
hour, one GPU a steady trickle of corrected ECC errors, for years. What predicts a
failure is a part that errs *more than it usually does*. So every part (GPU, port) keeps,
per counter, a Gamma–Poisson posterior of its own rate with exponential forgetting
(shared/research/robust-detection.md §3):

    K ← K·d + k,   T ← T·d + t,   d = exp(-Δt / τ)      (k events over t seconds of exposure)
    λ̂ = (a₀ + K) / (b₀ + T)                              (events per second)

``b₀`` seconds of prior exposure at the prior rate ``a₀ / b₀`` shrink a short or quiet
history towards "rare", so a part seen for minutes is not a part with a known rate of 0.
Everything is per second of measured exposure, so the baseline does not depend on the
sampling interval, and forgetting uses telemetry time between updates, not tick counts.

Operator context (issue 13): a part whose node is silenced or under maintenance is *frozen*
— nothing is learnt and nothing is forgotten — so the burn-in test of a repair does not
become the part's normal, and a long window does not wash out the normal from before it.
A repaired part (GPU reset, reboot, a new GPU at the same index) *restarts* at the prior:
its old history says nothing about the part now in the slot.

The feature a model reads is the **excess over the own baseline** of a window:
``ln((k_w + 1) / (λ̂·T_w + 1))`` — 0 for a part doing what it always does, ~ln(k) for a
burst on a quiet part, small for one more error on a part that always has some.

Each baseline also runs a **Poisson likelihood-ratio CUSUM** against its own rate
(research/robust-detection.md §2, §9.4): with λ0 the part's rate before this window and
λ1 = ρ·λ0 ("the part now errs ρ times as often as it usually does"),

    S ← max(0, S + k·ln ρ − (ρ − 1)·λ0·t)

per window of k events over t seconds — additive over any split of time, so it does not
depend on the sampling interval. What a detector reads is ``max(0, S − h)``, the evidence
beyond the alarm level h = H_EVENTS·ln ρ: one or two stray errors on a quiet part never
show (they only ever lift S by ln ρ each, and it drains between them); a part whose errors
keep coming faster than ρ times its own rate does, whatever that rate is on this fleet.
The CUSUM starts once a part's baseline holds an hour of telemetry (its prior's weight).
"""

from __future__ import annotations

import numpy as np

#: Forgetting time constant of every baseline, s. Six hours is long against the 30 min
#: long window (a precursor that grows over minutes to an hour is not absorbed while it
#: grows), and short enough that a part's new normal after a repair is learnt within a day.
TAU_S = 6 * 3600.0
#: Prior exposure, s: the baseline of a new part weighs like an hour of telemetry.
PRIOR_EXPOSURE_S = 3600.0
#: Prior events per prior exposure: one event an hour, a "somewhat noisy part". A weak,
#: fleet-agnostic prior: it only sets how surprising the first errors of a new part are.
PRIOR_EVENTS = 1.0
#: CUSUM alternative: a part erring RHO times its own rate. Ten, chosen a priori and not tuned
#: (D): a precursor worth acting on is a rise by an order of magnitude, while a healthy part's
#: rate wanders within a few times its own.
RHO = 10.0
#: Alarm level of the CUSUM, in events' worth of evidence (h = H_EVENTS·ln ρ): three, so one
#: or two stray errors are never evidence (research §2: "one or two stray events never alarm").
H_EVENTS = 3.0


class RateBaselines:
    """Forgetting Gamma–Poisson rate posteriors for C counters of up to *capacity* parts."""

    def __init__(self, n_counters: int, capacity: int, *, tau_s: float = TAU_S,
                 prior_exposure_s: float = PRIOR_EXPOSURE_S, prior_events: float = PRIOR_EVENTS) -> None:
        self.tau_s, self.b0, self.a0 = float(tau_s), float(prior_exposure_s), float(prior_events)
        self.k = np.zeros((n_counters, capacity))
        self.t = np.zeros((n_counters, capacity))
        self.s = np.zeros((n_counters, capacity))  # CUSUM statistic, nats
        self.seen = np.zeros((n_counters, capacity), bool)  # the counter ever had exposure on the part
        self.updated = np.full(capacity, np.nan)  # telemetry time of each part's last update
        self.log_rho, self.h = float(np.log(RHO)), H_EVENTS * float(np.log(RHO))

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.t.nbytes + self.s.nbytes + self.seen.nbytes + self.updated.nbytes

    def ensure(self, capacity: int) -> None:
        """Grow to hold *capacity* parts (new parts start at the prior)."""
        have = len(self.updated)
        if capacity <= have:
            return
        cap = max(capacity, 2 * have)
        k, t, cs = (np.zeros((len(self.k), cap)) for _ in range(3))
        seen = np.zeros((len(self.k), cap), bool)
        k[:, :have], t[:, :have], cs[:, :have], seen[:, :have] = self.k, self.t, self.s, self.seen
        upd = np.full(cap, np.nan)
        upd[:have] = self.updated
        self.k, self.t, self.s, self.seen, self.updated = k, t, cs, seen, upd

    def rate(self, parts: np.ndarray) -> np.ndarray:
        """Posterior mean rate (events/s), (counter, part)."""
        return (self.a0 + self.k[:, parts]) / (self.b0 + self.t[:, parts])

    def excess(self, parts: np.ndarray, events: np.ndarray, exposure_s: np.ndarray) -> np.ndarray:
        """``ln((k + 1) / (λ̂·t + 1))`` of a window with *events* over *exposure_s* (counter, part);
        NaN where the counter is unsupported or the window has no exposure."""
        expected = self.rate(parts) * exposure_s
        out = np.full(np.shape(events), np.nan)
        ok = np.isfinite(events) & np.isfinite(exposure_s) & (exposure_s > 0)
        np.log((np.maximum(events, 0.0) + 1.0) / (expected + 1.0), out=out, where=ok)
        return out

    def cusum_excess(self, parts: np.ndarray) -> np.ndarray:
        """``max(0, S − h)`` of *parts* (counter, part): evidence, in nats, that a part errs ρ
        times its own rate beyond the alarm level; NaN for a counter the part never reported."""
        return np.where(self.seen[:, parts], np.maximum(self.s[:, parts] - self.h, 0.0), np.nan)

    def restart(self, parts: np.ndarray) -> None:
        """Put *parts* back at the prior (a repaired or replaced part: its history is another part's)."""
        self.k[:, parts] = 0.0
        self.t[:, parts] = 0.0
        self.s[:, parts] = 0.0
        self.updated[parts] = np.nan

    def update(self, parts: np.ndarray, now: float, events: np.ndarray, exposure_s: np.ndarray,
               frozen: np.ndarray | None = None) -> None:
        """Add a window's *events* over *exposure_s* (counter, part) at telemetry time *now*.

        Unsupported counters (NaN) add nothing. Forgetting uses the time since each part's
        last update, so a part that reports every second and one that reports every minute
        forget at the same pace. Parts flagged in *frozen* (muted time) neither learn nor
        forget: only their clock moves to *now*, so the time frozen never decays them later.
        """
        if len(parts) == 0:
            return
        last = self.updated[parts]
        gap = np.where(np.isfinite(last), np.maximum(now - last, 0.0), 0.0)
        d = np.exp(-gap / self.tau_s)
        ok = np.isfinite(events) & np.isfinite(exposure_s) & (exposure_s > 0)
        if frozen is not None and frozen.any():
            d = np.where(frozen, 1.0, d)
            ok &= ~frozen
        k = np.where(ok, np.maximum(events, 0.0), 0.0)
        t = np.where(ok, exposure_s, 0.0)
        lam0 = self.rate(parts)  # the part's rate before this window
        # the CUSUM starts once the baseline holds as much telemetry as its prior (an hour): before
        # that λ0 is the prior's guess, and every steadily noisy part would read as ρ x it
        warm = self.t[:, parts] >= self.b0
        step = np.maximum(self.s[:, parts] + k * self.log_rho - (RHO - 1.0) * lam0 * t, 0.0)
        self.s[:, parts] = np.where(warm, step, 0.0)
        self.seen[:, parts] |= ok
        self.k[:, parts] = self.k[:, parts] * d + k
        self.t[:, parts] = self.t[:, parts] * d + t
        self.updated[parts] = now


#: Time constant of a GPU's clock-deficit trend (:class:`DeficitTrend`), telemetry seconds.
TREND_TAU_S = 600.0


class DeficitTrend:
    """Per GPU, its clock deficit against its busy peers averaged exponentially over its own busy
    ticks: a straggler stays slow, while a healthy GPU at its power cap dips for a sample and
    comes back (DVFS), so the trend separates what one short window cannot.

    The trend starts at 0 (a GPU is presumed as fast as its peers) and each busy tick of
    *step_s* seconds moves it by ``1 - exp(-step_s / tau)`` towards that tick's deficit, so a
    constant deficit ``d`` reads ``d (1 - exp(-t / tau))`` after ``t`` seconds of busy time: a
    deep straggler shows within minutes, a shallow one only after a long spell, and one slow
    tick never does. Idle time decays it towards 0 at the same rate (an idle GPU is not slow).
    The trend reads NaN while the GPU idles; a repaired GPU restarts at 0. A tick without a
    reading of the GPU (*unread*: no sample in the window) is neither: the trend neither learns
    nor decays over it, so its level does not depend on how often the GPU is sampled.

    With *columns* > 1 it keeps that many averages per GPU over the same minutes (a deficit and a
    0/1 "slow this minute", whose mean is a share of time): ``update`` then takes and returns one
    column each, NaN in every column of a minute that is not steady, and one clock serves them all.
    """

    def __init__(self, capacity: int, tau_s: float = TREND_TAU_S, columns: int = 1) -> None:
        self.tau_s = float(tau_s)
        self.shape = () if columns == 1 else (columns,)
        self.value = np.zeros((capacity, *self.shape))
        self.updated = np.full(capacity, np.nan)

    @property
    def nbytes(self) -> int:
        return self.value.nbytes + self.updated.nbytes

    def ensure(self, capacity: int) -> None:
        have = len(self.value)
        if capacity > have:
            cap = max(capacity, 2 * have)
            self.value = np.concatenate([self.value, np.zeros((cap - have, *self.shape))])
            self.updated = np.concatenate([self.updated, np.full(cap - have, np.nan)])

    def restart(self, parts: np.ndarray) -> None:
        self.value[parts] = 0.0
        self.updated[parts] = np.nan

    def update(self, parts: np.ndarray, now: float, step_s: float, deficit: np.ndarray,
               frozen: np.ndarray | None = None, unread: np.ndarray | None = None) -> np.ndarray:
        """Fold this tick's *deficit* (NaN: idle) over the *step_s* seconds ending at *now* into
        *parts*' trends; the trend per part, NaN where the part idles this tick. Parts flagged in
        *frozen* (muted time) do not learn; parts flagged in *unread* (no sample this tick) skip the
        tick: its *step_s* seconds count neither as work nor as idle time."""
        steady = np.isfinite(deficit) if not self.shape else np.isfinite(deficit[:, 0])
        ok = steady if frozen is None else steady & ~frozen
        old, last = self.value[parts], self.updated[parts]
        since = np.where(np.isfinite(last), np.maximum(now - last, step_s), step_s)
        col = (slice(None),) + (None,) * len(self.shape)   # one clock per GPU, over its columns
        new = old * np.exp(-since / self.tau_s)[col] + (1.0 - np.exp(-step_s / self.tau_s)) * np.where(
            ok[col], deficit, 0.0)
        self.value[parts] = np.where(ok[col], new, old)
        if unread is not None:  # skip the unread tick's seconds: the next reading does not decay over them
            skip = unread & ~ok & np.isfinite(last)
            last = np.where(skip, last + np.clip(now - last, 0.0, step_s), last)
        self.updated[parts] = np.where(ok, now, last)
        return np.where(steady[col], self.value[parts], np.nan)
