"""Fakes at our own boundaries for the agent tests: a hand-stepped clock, a counting source."""

from __future__ import annotations

from collector.sources.base import SourceBatch


class FakeClock:
    """A clock tests step by hand: ``sleep`` advances it instead of waiting."""

    def __init__(self, t: float = 1_767_225_600.0) -> None:
        self.t = t
        self.mono = 1000.0

    def time(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.mono

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.mono += seconds


class CountingSource:
    """A source at our own boundary: one GPU row per sample carrying a sequence number ``seq``."""

    name = "counting"

    def __init__(self, node: str = "gpu-node-001") -> None:
        self.node = node
        self.n = 0
        self.closed = False

    def sample(self, now: float):
        row = {"ts": now, "node": self.node, "gpu": 0, "util_gpu": 50.0, "seq": self.n}
        self.n += 1
        return SourceBatch(gpu=[row])

    def close(self) -> None:
        self.closed = True

