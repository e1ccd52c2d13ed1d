"""One daemon thread that makes one call at a time, so the caller can stop waiting for it.

NVML, sysfs and BMCs are libraries and devices we do not control: a GPU that falls off
the bus can hold the driver, and any NVML call on that node, for minutes. A Python
thread cannot be killed, so the way to bound such a call is to make it in a thread of
its own and stop waiting: :class:`CallThread` is that thread. It makes at most one call
at a time; while a call has not returned, :meth:`CallThread.start` refuses the next one
instead of queueing it behind (or starting a new thread beside) a call that may never
return, so a hung library costs one thread, never one per attempt. The thread is a
daemon: a process that exits does not wait for it.

Used by the agent for its sources (``collector.source_guard``) and by the GPU-reset
commands for their NVML calls (``collector.gpu_reset``).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(eq=False)
class _Call:
    fn: Callable[[], Any]
    started: float
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None


class CallThread:
    """Calls functions in one daemon thread named *name*, one at a time.

    *monotonic* measures how long a call has run (an injected clock, so tests can step
    it); waiting for a call is real time.
    """

    def __init__(self, name: str, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._monotonic = monotonic
        self._requests: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._call: _Call | None = None
        self._thread: threading.Thread | None = None

    def _serve(self) -> None:
        while True:
            call = self._requests.get()
            if call is None:
                return
            try:
                call.value = call.fn()
            except BaseException as e:  # noqa: BLE001 - handed to whoever takes the result
                call.error = e
            call.done.set()

    @property
    def busy(self) -> bool:
        """A call was started and its result has not been taken yet."""
        return self._call is not None

    @property
    def returned(self) -> bool:
        """The call in flight has returned (its result waits to be taken)."""
        return self._call is not None and self._call.done.is_set()

    def running_s(self) -> float:
        """Seconds since the call in flight started (0 when none is)."""
        return self._monotonic() - self._call.started if self._call is not None else 0.0

    def start(self, fn: Callable[[], Any]) -> bool:
        """Call *fn* in the thread; False (nothing started) while an earlier call's result is out."""
        if self._call is not None:
            return False
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()
        self._call = _Call(fn, self._monotonic())
        self._requests.put(self._call)
        return True

    def take(self, timeout_s: float | None) -> tuple[bool, Any]:
        """``(True, value)`` once the call has returned, raising what it raised; ``(False, None)``
        if it has not after *timeout_s* (None: wait for it; or none was started). A result is
        handed over once."""
        call = self._call
        if call is None or not call.done.wait(None if timeout_s is None else max(0.0, timeout_s)):
            return False, None
        self._call = None
        if call.error is not None:
            raise call.error
        return True, call.value

    def call(self, fn: Callable[[], Any], timeout_s: float) -> tuple[bool, Any]:
        """Start *fn* and wait for it at most *timeout_s*: ``take``'s answer. Refused while busy:
        ``(False, None)`` at once. A call that did not return in time is still running; its result
        is dropped by the next :meth:`call` that finds it returned."""
        if self.returned:
            self._call = None  # an abandoned call came back: nobody waits for it any more
        if not self.start(fn):
            return False, None
        return self.take(timeout_s)

    def stop(self) -> None:
        """End the thread once the call in flight (if any) has returned; nothing is called after."""
        if self._thread is not None:
            self._requests.put(None)
            self._thread = None
