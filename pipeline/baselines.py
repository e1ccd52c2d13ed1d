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


class RateBaselines:
    """Forgetting Gamma–Poisson rate posteriors for C counters of up to *capacity* parts."""

    def __init__(self, n_counters: int, capacity: int, *, tau_s: float = TAU_S,
                 prior_exposure_s: float = PRIOR_EXPOSURE_S, prior_events: float = PRIOR_EVENTS) -> None:
        self.tau_s, self.b0, self.a0 = float(tau_s), float(prior_exposure_s), float(prior_events)
        self.k = np.zeros((n_counters, capacity))
        self.t = np.zeros((n_counters, capacity))
        self.updated = np.full(capacity, np.nan)  # telemetry time of each part's last update

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.t.nbytes + self.updated.nbytes

    def ensure(self, capacity: int) -> None:
        """Grow to hold *capacity* parts (new parts start at the prior)."""
        have = len(self.updated)
        if capacity <= have:
            return
        cap = max(capacity, 2 * have)
        k, t = np.zeros((len(self.k), cap)), np.zeros((len(self.t), cap))
        k[:, :have], t[:, :have] = self.k, self.t
        upd = np.full(cap, np.nan)
        upd[:have] = self.updated
        self.k, self.t, self.updated = k, t, upd

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

    def restart(self, parts: np.ndarray) -> None:
        """Put *parts* back at the prior (a repaired or replaced part: its history is another part's)."""
        self.k[:, parts] = 0.0
        self.t[:, parts] = 0.0
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
        self.k[:, parts] = self.k[:, parts] * d + np.where(ok, np.maximum(events, 0.0), 0.0)
        self.t[:, parts] = self.t[:, parts] * d + np.where(ok, exposure_s, 0.0)
        self.updated[parts] = now
