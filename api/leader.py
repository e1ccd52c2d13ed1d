"""Engine leadership across replicas: a lease in the action store, renewed every third of its ttl.

Exactly one replica's engine acts (runs the policy on each tick and calls the scheduler);
the others record people's requests and keep their fleet view. :class:`LeaderElector`
tries to take the lease (``ActionStore.acquire_lease``: compare-and-set, with a fencing
epoch per term) and, once held, renews it every ``ttl_s / 3``. On gaining it, ``on_gain``
runs (the service arms ``engine.acting`` and calls ``engine.start()``: reconcile in-flight
actions, rebuild the holds) *before* :meth:`is_leader` turns true; on losing it — a failed
renewal, or the local deadline passing while the store does not answer — ``on_loss`` runs at
once. A standby takes over at most ``ttl_s + ttl_s / 3`` after the leader died (its lease
lapses, then the standby's next attempt), or at once when the leader released it on a
graceful shutdown.

The local deadline is counted on the monotonic clock from *before* each successful store
call, so a leader stops believing it leads no later than the store's lease says, whatever
the wall clocks do; the wall clock (``clock``) only writes ``expires_at`` for the others.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from remediation.store import ActionStore, StoreError

log = logging.getLogger(__name__)

ENGINE_LEASE = "engine"


class LeaderElector:
    """Holds, renews and gives up the engine lease for *holder* (see the module docstring)."""

    def __init__(self, store: ActionStore, holder: str, ttl_s: float, *, name: str = ENGINE_LEASE,
                 on_gain: Callable[[int], None] = lambda epoch: None, on_loss: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        if ttl_s <= 0:
            raise ValueError(f"lease ttl must be > 0 s, got {ttl_s!r}")
        self.store, self.holder, self.ttl_s, self.name = store, holder, ttl_s, name
        self.on_gain, self.on_loss = on_gain, on_loss
        self._clock, self._mono = clock, monotonic
        self._epoch: int | None = None
        self._deadline = 0.0
        self._lock = threading.Lock()
        #: (monotonic time, epoch) of each term this replica held, for tests and /v1/engine
        self.terms: list[tuple[float, int]] = []

    @property
    def renew_every_s(self) -> float:
        return self.ttl_s / 3

    @property
    def epoch(self) -> int | None:
        """The fencing epoch of the term held now, None when not leading."""
        return self._epoch if self.is_leader() else None

    def is_leader(self) -> bool:
        """Leading now: a term is held and its local deadline has not passed."""
        return self._epoch is not None and self._mono() < self._deadline

    def step(self) -> bool:
        """One attempt to take or renew the lease; whether this replica leads afterwards."""
        with self._lock:
            started = self._mono()
            try:
                if self._epoch is None:
                    epoch = self.store.acquire_lease(self.name, self.holder, self.ttl_s, self._clock())
                    if epoch is not None:
                        self._gain(epoch, started)
                elif self.store.renew_lease(self.name, self.holder, self.ttl_s, self._clock(), epoch=self._epoch):
                    self._deadline = started + self.ttl_s
                else:
                    self._lose("the lease was lost (lapsed, or taken by another replica)")
            except StoreError as e:
                if self._epoch is not None and self._mono() >= self._deadline:
                    self._lose(f"the store did not answer before the lease's deadline ({e})")
                else:
                    log.warning("leader lease: store error (%s); trying again in %.1f s", e, self.renew_every_s)
            if self._epoch is not None and self._mono() >= self._deadline:
                self._lose("the lease's deadline passed")
            return self.is_leader()

    def _gain(self, epoch: int, started: float) -> None:
        log.warning("%s leads the engine (lease %r, epoch %d)", self.holder, self.name, epoch)
        try:
            self.on_gain(epoch)
        except Exception:
            log.exception("taking over the engine failed; giving the lease back")
            self.on_loss()
            try:
                self.store.release_lease(self.name, self.holder)
            except StoreError:
                pass
            return
        self._deadline = started + self.ttl_s
        self._epoch = epoch
        self.terms.append((self._mono(), epoch))

    def _lose(self, why: str) -> None:
        log.error("%s no longer leads the engine: %s", self.holder, why)
        self._epoch = None
        self.on_loss()

    def run(self, stop: threading.Event) -> None:
        """Take or renew the lease every ``ttl_s / 3`` until *stop* is set."""
        while not stop.is_set():
            self.step()
            stop.wait(self.renew_every_s)

    def release(self) -> None:
        """Give the lease up (graceful shutdown): a standby takes it on its next attempt."""
        with self._lock:
            if self._epoch is None:
                return
            self._epoch = None
            self.on_loss()
            try:
                self.store.release_lease(self.name, self.holder)
                log.warning("%s released the engine lease", self.holder)
            except StoreError as e:
                log.warning("could not release the engine lease (%s); it lapses in %.0f s", e, self.ttl_s)
