"""The message bus the scoring workers consume from and produce to.

:class:`Bus` is the whole contract: poll keyed messages, commit offsets, produce,
flush, and say how much is left to read per partition (for the watermark). Two
back-ends, picked by name from :data:`BUSES`: ``inprocess`` (:class:`InProcessBus`, the
embedded default — partitions by a stable hash of the key, deterministic) and ``kafka``
(:class:`pipeline.kafka_bus.KafkaBus`, a consumer group on ``gpu.telemetry`` /
``gpu.events``). An unknown name fails at start-up listing the valid ones.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence

from collector.wire import TOPIC_EVENTS, TOPIC_TELEMETRY
from pipeline.settings import PipelineSettings

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class BusMessage:
    """One consumed message: where it came from and its raw bytes."""

    topic: str
    key: str | None
    value: bytes
    partition: int
    offset: int


class Bus(Protocol):
    """Consume and produce keyed messages (key = node name, so a node stays on one partition)."""

    def poll(self, max_records: int, timeout_s: float) -> list[BusMessage]:
        """Up to *max_records* messages, waiting at most *timeout_s* when none are ready."""

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Commit *offsets* (next offset to read, per partition); ``None`` = all polled so far."""

    def produce(self, topic: str, key: str | None, value: bytes) -> None:
        """Queue one message (sent asynchronously; :meth:`flush` waits)."""

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every produced message is delivered."""

    def backlog(self) -> dict[TopicPartition, int | None]:
        """Messages not yet polled per assigned partition (``None``: not known yet)."""

    def close(self) -> None:
        """Leave the group and release connections."""


class InProcessBus:
    """In-memory partitioned logs with the :class:`Bus` interface (no Kafka needed).

    Partition = CRC-32 of the key mod *partitions* (stable across runs, unlike ``hash``).
    The consumer reads *topics*; any topic can be produced to and read back with
    :meth:`messages` (scores, dead letters).
    """

    def __init__(self, partitions: int = 4, topics: Sequence[str] = (TOPIC_TELEMETRY, TOPIC_EVENTS)) -> None:
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        self.partitions = partitions
        self.topics = tuple(topics)
        self._logs: dict[TopicPartition, list[BusMessage]] = {}
        self._position: dict[TopicPartition, int] = {}
        self.committed: dict[TopicPartition, int] = {}

    def partition_for(self, key: str | None) -> int:
        return zlib.crc32((key or "").encode()) % self.partitions

    def produce(self, topic: str, key: str | None, value: bytes) -> None:
        tp = (topic, self.partition_for(key))
        log = self._logs.setdefault(tp, [])
        log.append(BusMessage(topic, key, bytes(value), tp[1], len(log)))

    def flush(self, timeout_s: float = 30.0) -> None:
        return None  # delivery is immediate

    def poll(self, max_records: int, timeout_s: float) -> list[BusMessage]:
        out: list[BusMessage] = []
        assigned = self._assigned()
        while len(out) < max_records:
            progressed = False
            for tp in assigned:  # round-robin, a few per partition, like a Kafka fetch
                log, pos = self._logs.get(tp, []), self._position.get(tp, self.committed.get(tp, 0))
                take = log[pos: pos + min(64, max_records - len(out))]
                if take:
                    out.extend(take)
                    self._position[tp] = pos + len(take)
                    progressed = True
                if len(out) >= max_records:
                    break
            if not progressed:
                break
        return out

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        self.committed.update(dict(self._position) if offsets is None else offsets)

    def backlog(self) -> dict[TopicPartition, int | None]:
        return {tp: len(self._logs.get(tp, [])) - self._position.get(tp, self.committed.get(tp, 0))
                for tp in self._assigned()}

    def close(self) -> None:
        self._position.clear()  # a restarted consumer resumes from the committed offsets

    def consumer(self, topics: Sequence[str]) -> "InProcessBus":
        """Another consumer of the same logs with its own positions (a second consumer group).

        The embedded service's scoring worker reads telemetry from this bus while its API
        and engine read ``gpu.scores`` and ``gpu.events`` through a consumer of their own.
        """
        other = InProcessBus(self.partitions, topics)
        other._logs = self._logs
        return other

    def messages(self, topic: str) -> list[BusMessage]:
        """Everything produced to *topic*, by partition then offset (tests, dry runs)."""
        return [m for tp in sorted(self._logs) if tp[0] == topic for m in self._logs[tp]]

    def _assigned(self) -> list[TopicPartition]:
        return [(t, p) for t in self.topics for p in range(self.partitions)]


def _kafka(settings: PipelineSettings, topics: Sequence[str]) -> Bus:
    from pipeline.kafka_bus import KafkaBus  # kafka-python loads only when asked for

    return KafkaBus(settings.kafka_bootstrap, settings.kafka_group, topics)


#: Back-ends by name.
BUSES: dict[str, Callable[[PipelineSettings, Sequence[str]], Bus]] = {
    "inprocess": lambda settings, topics: InProcessBus(topics=topics),
    "kafka": _kafka,
}


def make_bus(settings: PipelineSettings, topics: Sequence[str] = (TOPIC_TELEMETRY, TOPIC_EVENTS)) -> Bus:
    """Build the bus named by ``settings.bus``; an unknown name lists the valid ones."""
    try:
        factory = BUSES[settings.bus]
    except KeyError:
        raise ValueError(f"unknown bus {settings.bus!r} (valid: {', '.join(sorted(BUSES))})") from None
    return factory(settings, topics)
