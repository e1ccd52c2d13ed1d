"""Each source samples in its own thread, so one that hangs cannot hold the others.

A GPU that falls off the bus is the failure in which NVML is most likely to block: the
driver can sit in one call for minutes. Sampled in the agent's own thread, that call
would also hold the kernel-log source, whose XID 79 line is what says what happened,
and the InfiniBand ports, and the health file. So every source gets one daemon thread
(:class:`GuardedSource`) and the agent's tick waits for them only until a deadline:

* a source that returns in time publishes with its tick, as before;
* a source still running at the deadline is not called again until it returns. What it
  returns then goes out with the next tick: its rows carry the time they were sampled
  for (``ts``), and an event its call read (a SEL entry whose id the ipmi source has
  already saved) is not lost;
* a call that has run for ``stall_s`` is *stalled*: logged once, counted once in the
  agent's ``source_errors``, shown in the health record until it returns.

A Python thread cannot be killed, so a hung call keeps its thread; there is never more
than one per source. The threads are daemons: a process that exits (SIGTERM, ``--once``)
does not wait for a call that never returns, and :meth:`GuardedSource.close` gives up on
a source whose thread is still busy instead of blocking shutdown behind it.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from collector.sources.base import Source, SourceBatch, SourceError

#: Seconds :meth:`GuardedSource.close` waits for a source's ``close()`` before leaving it.
CLOSE_WAIT_S = 5.0


class SourceStalled(SourceError):
    """A source's call has not returned for longer than the agent's ``source_stall_s``."""


@dataclass(eq=False)
class _Call:
    """One request to the source's thread: ``sample(now)`` (or ``close()`` when *now* is None)."""

    now: float | None
    started: float
    done: threading.Event = field(default_factory=threading.Event)
    batch: SourceBatch | None = None
    error: BaseException | None = None


class GuardedSource:
    """One source and the thread that calls it; at most one call in flight.

    *monotonic* measures how long a call has run (the agent's clock, so tests can step
    it); the wait for a call to finish is real time.
    """

    def __init__(self, source: Source, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.name = source.name
        self._monotonic = monotonic
        self._requests: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._call: _Call | None = None
        self._thread: threading.Thread | None = None
        #: True once the running call has been reported stalled (reported once per call).
        self.stall_reported = False
        self._closed = False

    # ------------------------------------------------------------------ the thread

    def _serve(self) -> None:
        while True:
            call = self._requests.get()
            if call is None:
                return
            try:
                if call.now is None:
                    self.source.close()
                else:
                    call.batch = self.source.sample(call.now)
            except BaseException as e:  # noqa: BLE001 - handed to the agent's tick, which classifies it
                call.error = e
            call.done.set()

    def _submit(self, call: _Call) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=f"gpuops-source-{self.name}", daemon=True)
            self._thread.start()
        self._call = call
        self._requests.put(call)

    # ------------------------------------------------------------------ the agent's side

    @property
    def busy(self) -> bool:
        """A call was started and its result has not been taken yet."""
        return self._call is not None

    def running_s(self) -> float:
        """Seconds the call in flight has run (0 when none is)."""
        return self._monotonic() - self._call.started if self._call is not None else 0.0

    def start(self, now: float) -> bool:
        """Ask for ``sample(now)``; False (nothing asked) while an earlier call is still out."""
        if self._call is not None:
            return False
        self._submit(_Call(now, self._monotonic()))
        return True

    def take(self, timeout_s: float) -> SourceBatch | None:
        """The call's batch once it has returned (raising what it raised), else None after *timeout_s*.

        A returned call's result is handed over once; the next :meth:`start` asks again.
        """
        call = self._call
        if call is None or not call.done.wait(max(0.0, timeout_s)):
            return None
        self._call = None
        self.stall_reported = False
        if call.error is not None:
            raise call.error
        return call.batch

    @property
    def sampled_for(self) -> float | None:
        """The ``now`` the call in flight samples for."""
        return self._call.now if self._call is not None else None

    def close(self, wait_s: float = CLOSE_WAIT_S) -> bool:
        """Close the source through its thread, waiting at most *wait_s*; False if it could not.

        A source whose call never returned is left as it is: closing it would queue behind the
        hung call (or, called from here, run beside it inside a library that is not answering).
        """
        if self._closed:
            return True
        if self._thread is None:
            self._closed = True
            self.source.close()
            return True
        if self._call is not None and not self._call.done.is_set():
            return False
        call = _Call(None, self._monotonic())
        self._submit(call)
        if not call.done.wait(wait_s):
            return False
        self._call, self._closed = None, True
        self._requests.put(None)  # the thread ends
        if call.error is not None:
            raise call.error
        return True
