"""Each source samples in its own thread, so one that hangs cannot hold the others.

A GPU that falls off the bus is the failure in which NVML is most likely to block: the
driver can sit in one call for minutes. Sampled in the agent's own thread, that call
would also hold the kernel-log source, whose XID 79 line is what says what happened,
and the InfiniBand ports, and the health file. So every source gets one daemon thread
(:class:`GuardedSource`, on :class:`~collector.call_thread.CallThread`) and the agent's
tick waits for them only until a deadline:

* a source that returns in time publishes with its tick, as before;
* a source still running at the deadline is not called again until it returns. What it
  returns then goes out with the next tick: its rows carry the time they were sampled
  for (``ts``), and an event its call read (a SEL entry whose id the ipmi source has
  already saved) is not lost;
* a call that has run for ``source_stall_s`` is *stalled*: logged once, counted once in
  the agent's ``source_errors``, shown in the health record until it returns.

:meth:`GuardedSource.close` gives up on a source whose call is still running instead of
blocking shutdown behind it (or calling ``close()`` beside it, inside a library that is
not answering).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from collector.call_thread import CallThread
from collector.sources.base import Source, SourceBatch, SourceError

#: Seconds :meth:`GuardedSource.close` waits for a source's ``close()`` before leaving it.
CLOSE_WAIT_S = 5.0


class SourceStalled(SourceError):
    """A source's call has not returned for longer than the agent's ``source_stall_s``."""


class StartingSource:
    """A source whose start did not finish in time (NVML's init on a node whose GPU is off the bus).

    The agent starts without waiting for it; its first :meth:`sample`, in its guard's thread,
    waits for the start to finish and then samples, so until then it is a call that has not
    returned: reported stalled, and holding nothing else. A start that fails later fails every
    sample with its error.
    """

    def __init__(self, name: str, starting: CallThread, source_of: Callable[[Any], Source] = lambda v: v) -> None:
        self.name = name
        self._starting = starting
        self._source_of = source_of
        self._source: Source | None = None
        self._error: SourceError | None = None

    @property
    def started(self) -> Source | None:
        """The source once its start has been taken (by a sample or :meth:`close`), else None."""
        return self._source

    def _settle(self, timeout_s: float | None) -> bool:
        """Take the start's outcome once it has returned (waiting at most *timeout_s*; None: for
        ever): the source, or the error every sample raises. False while it is still running."""
        if self._source is None and self._error is None:
            try:
                done, built = self._starting.take(timeout_s)
                if not done:
                    return False
                self._source = self._source_of(built)
            except Exception as e:  # noqa: BLE001 - whatever the start raised, every sample reports it
                self._error = SourceError(f"{self.name} did not start: {type(e).__name__}: {e}")
            self._starting.stop()  # its one call is over
        return True

    def sample(self, now: float) -> SourceBatch:
        self._settle(None)
        if self._error is not None:
            raise self._error
        return self._source.sample(now)

    def close(self) -> None:
        """Close the source; one whose start finished but was never sampled (the agent stopped
        first) is closed too, and a start still running is left to the process's exit."""
        if self._settle(0.0) and self._source is not None:
            self._source.close()


def start_bounded(name: str, build: Callable[[], Any], wait_s: float,
                  source_of: Callable[[Any], Source] = lambda v: v) -> tuple[bool, Any]:
    """``(True, build())`` when it returns within *wait_s* (raising what it raises); else
    ``(False, StartingSource)`` that takes over the start still running (*source_of* picks the
    source out of what *build* returns)."""
    starting = CallThread(f"gpuops-source-{name}-start")
    done, value = starting.call(build, wait_s)
    return (True, value) if done else (False, StartingSource(name, starting, source_of))


class GuardedSource:
    """One source and the thread that calls it; at most one call in flight.

    *monotonic* measures how long a call has run (the agent's clock, so tests can step
    it); the wait for a call to finish is real time.
    """

    def __init__(self, source: Source, monotonic: Callable[[], float] = time.monotonic,
                 every_s: float | None = None, slack_s: float = 0.0, stall_s: float = math.inf) -> None:
        self.source = source
        self.name = source.name
        self._thread = CallThread(f"gpuops-source-{self.name}", monotonic)
        #: Seconds between two samples (None: whenever asked), with *slack_s* for ticks that run a little
        #: early (half an interval: a 60 s source on a 10 s tick samples every sixth tick).
        self.every_s, self._slack_s = every_s, slack_s
        #: Seconds a call may run before it counts as stalled: *stall_s*, or until the next sample is due
        #: if that is later (a BMC's walk of dozens of chassis is slow, not stuck).
        self.stall_s = max(stall_s, every_s or 0.0)
        self._last_for: float | None = None  # the ``now`` of the last sample asked for
        self._closed = False
        #: True once the running call has been reported stalled (reported once per call).
        self.stall_reported = False

    @property
    def busy(self) -> bool:
        """A sample was asked for and its result has not been taken yet."""
        return self._thread.busy

    def running_s(self) -> float:
        """Seconds the call in flight has run (0 when none is)."""
        return self._thread.running_s()

    @property
    def sampled_for(self) -> float | None:
        """The ``now`` the call in flight samples for."""
        return self._last_for if self._thread.busy else None

    def due(self, now: float) -> bool:
        """A sample is due at *now*: never sampled, or ``every_s`` (less the slack) has passed."""
        return self.every_s is None or self._last_for is None or now - self._last_for >= self.every_s - self._slack_s

    def start(self, now: float) -> bool:
        """Ask for ``sample(now)``; False (nothing asked) while an earlier call is still out or it is not due."""
        if not self.due(now):
            return False
        started = self._thread.start(lambda: self.source.sample(now))
        if started:
            self._last_for = now
        return started

    def take(self, timeout_s: float) -> SourceBatch | None:
        """The call's batch once it has returned (raising what it raised), else None after *timeout_s*.

        A returned call's result is handed over once; the next :meth:`start` asks again.
        """
        if not self._thread.busy:
            return None
        try:
            done, batch = self._thread.take(timeout_s)
        except BaseException:
            self.stall_reported = False
            raise
        if done:
            self.stall_reported = False
        return batch if done else None

    def close(self, wait_s: float = CLOSE_WAIT_S) -> bool:
        """Close the source through its thread, waiting at most *wait_s*; False if it could not.

        A source whose call has not returned is left as it is. Closing twice is safe.
        """
        if self._closed:
            return True
        if self._thread.busy and not self._thread.returned:
            return False
        done, _ = self._thread.call(self.source.close, wait_s)
        if done:
            self._closed = True
            self._thread.stop()
        return done
