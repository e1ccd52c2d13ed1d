"""A bounded, thread-safe FIFO of outbound messages between sampling and publishing.

When the broker is unreachable the agent keeps sampling; messages wait here. The
buffer is bounded by message count *and* by bytes (a GPU node's memory belongs to its
training jobs). When a new message would exceed a bound, the policy decides what goes:

* ``drop_oldest`` (default): the oldest messages make room — the newest telemetry is
  what predicts an imminent failure, and the oldest is the least useful once late;
* ``drop_newest``: the new message is refused (keeps a contiguous early history).

Every dropped message is counted in ``dropped`` (never silent). Each message gets a
sequence number, so the publisher removes exactly what it delivered (``pop_through``)
even if overflow dropped some of those messages while they were in flight.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import replace
from typing import Literal

from collector.sinks.base import OutboundMessage

BufferPolicy = Literal["drop_oldest", "drop_newest"]


class OutboundBuffer:
    """FIFO with ``max_messages`` / ``max_bytes`` bounds and a drop policy (see module doc)."""

    def __init__(self, max_messages: int, max_bytes: int, policy: BufferPolicy = "drop_oldest") -> None:
        if max_messages < 1 or max_bytes < 1:
            raise ValueError("buffer bounds must be positive")
        if policy not in ("drop_oldest", "drop_newest"):
            raise ValueError(f"unknown buffer policy {policy!r} (valid: drop_oldest, drop_newest)")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.policy = policy
        self._q: deque[OutboundMessage] = deque()
        self._bytes = 0
        self._next_seq = 0
        self.dropped = 0
        self._cond = threading.Condition()

    def put(self, msg: OutboundMessage) -> int:
        """Append *msg*; return how many messages were dropped to respect the bounds."""
        size = len(msg.value)
        with self._cond:
            dropped = 0
            if size > self.max_bytes:
                self.dropped += 1
                return 1
            if self.policy == "drop_newest" and (len(self._q) >= self.max_messages
                                                 or self._bytes + size > self.max_bytes):
                self.dropped += 1
                return 1
            while self._q and (len(self._q) >= self.max_messages or self._bytes + size > self.max_bytes):
                old = self._q.popleft()
                self._bytes -= len(old.value)
                dropped += 1
            self._q.append(replace(msg, seq=self._next_seq))
            self._next_seq += 1
            self._bytes += size
            self.dropped += dropped
            self._cond.notify_all()
            return dropped

    def peek(self, n: int) -> list[OutboundMessage]:
        """The oldest *n* messages, left in place."""
        with self._cond:
            return [self._q[i] for i in range(min(n, len(self._q)))]

    def pop_through(self, seq: int) -> int:
        """Remove every message with sequence number ≤ *seq*; return how many were removed."""
        with self._cond:
            n = 0
            while self._q and self._q[0].seq <= seq:
                self._bytes -= len(self._q.popleft().value)
                n += 1
            return n

    def wait(self, timeout_s: float) -> bool:
        """Block until the buffer is non-empty or *timeout_s* passes; True if non-empty."""
        with self._cond:
            return self._cond.wait_for(lambda: bool(self._q), timeout=timeout_s)

    def wake(self) -> None:
        """Wake every :meth:`wait`er (shutdown)."""
        with self._cond:
            self._cond.notify_all()

    def __len__(self) -> int:
        return len(self._q)

    @property
    def bytes(self) -> int:
        """Bytes of message values held now."""
        return self._bytes
