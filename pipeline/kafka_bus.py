"""Kafka back-end of :class:`pipeline.bus.Bus` (kafka-python).

A ``KafkaConsumer`` in the scoring consumer group with auto-commit off — offsets are
committed by the worker only after the scores a batch led to are published, so a
crash replays rather than loses data — and a ``KafkaProducer`` for ``gpu.scores`` and
``gpu.deadletter``. Connection problems at start-up raise :class:`BusUnavailable`.
"""

from __future__ import annotations

import logging
from typing import Mapping, Sequence

from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata
from kafka.structs import TopicPartition as KafkaTP

from pipeline.bus import BusMessage, TopicPartition


log = logging.getLogger(__name__)

_FETCH_MAX_BYTES = 16 << 20
#: the most :meth:`KafkaBus.backlog` waits on the broker for a partition's end offset or position. The
#: scoring loop asks on every poll; kafka-python would wait ``request_timeout_ms`` (305 s) for an end
#: offset and for ever for a position while the broker or the group's coordinator does not answer, and
#: the loop with it. Unanswered, the partition's backlog reads unknown (it holds the watermark: no tick
#: closes early) and the next poll asks again.
LOOKUP_TIMEOUT_MS = 1000
#: the most a commit waits for the group's coordinator (kafka-python's own default: for ever). A commit
#: not taken in time raises, the loop logs it and retries, and the offsets are committed with the next one
COMMIT_TIMEOUT_MS = 10_000


class BusUnavailable(RuntimeError):
    """The bus cannot be reached (transient: the service retries start-up later)."""


class KafkaBus:
    """Consumer group member on *topics* plus a producer, behind the :class:`~pipeline.bus.Bus` interface."""

    def __init__(self, bootstrap: str, group: str, topics: Sequence[str], *, client_id: str = "gpuops-pipeline",
                 auto_offset_reset: str = "earliest") -> None:
        try:
            self._consumer = KafkaConsumer(
                *topics, bootstrap_servers=bootstrap.split(","), group_id=group, client_id=client_id,
                enable_auto_commit=False, auto_offset_reset=auto_offset_reset,
                # kafka-python's default frame limit (1 MB) is below its own default fetch size,
                # so a backlog of a few MB fails every fetch: bound the fetch, allow the frame
                fetch_max_bytes=_FETCH_MAX_BYTES, receive_message_max_bytes=_FETCH_MAX_BYTES + (1 << 20))
            self._producer = KafkaProducer(bootstrap_servers=bootstrap.split(","), client_id=client_id,
                                           acks="all", linger_ms=5)
        except KafkaError as e:
            raise BusUnavailable(f"Kafka at {bootstrap} unavailable: {e!r}") from e
        self._polled: dict[TopicPartition, int] = {}

    def poll(self, max_records: int, timeout_s: float) -> list[BusMessage]:
        batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        out = []
        for tp, records in batches.items():
            for r in records:
                key = r.key.decode("utf-8", errors="replace") if r.key is not None else None
                out.append(BusMessage(tp.topic, key, r.value, tp.partition, r.offset))
            if records:
                self._polled[(tp.topic, tp.partition)] = records[-1].offset + 1
        return out

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        offsets = dict(self._polled) if offsets is None else offsets
        if offsets:
            self._consumer.commit({KafkaTP(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()},
                                  timeout_ms=COMMIT_TIMEOUT_MS)

    def produce(self, topic: str, key: str | None, value: bytes) -> None:
        self._producer.send(topic, key=key.encode() if key is not None else None, value=value)

    def flush(self, timeout_s: float = 30.0) -> None:
        self._producer.flush(timeout=timeout_s)

    def backlog(self) -> dict[TopicPartition, int | None]:
        out: dict[TopicPartition, int | None] = {}
        assigned = self._consumer.assignment()
        # highwater() is known only once a fetch answered for the partition; an assigned partition
        # that never gets a record (an empty one, in a group that split the topic) would stay
        # unknown and hold the watermark back for ever: ask the broker for its end offset instead
        unknown = [tp for tp in assigned if self._consumer.highwater(tp) is None]
        ends: dict = {}
        if unknown:
            try:  # the consumer's own end_offsets() takes no timeout in kafka-python 2.x: its fetcher's does
                ends = self._consumer._fetcher.end_offsets(unknown, LOOKUP_TIMEOUT_MS)
            except KafkaError:
                ends = {}
        for tp in assigned:
            hw = self._consumer.highwater(tp)
            if hw is None:
                hw = ends.get(tp)
            pos = self._polled.get((tp.topic, tp.partition))
            if pos is None and hw is not None:
                pos = self._consumer.position(tp, timeout_ms=LOOKUP_TIMEOUT_MS)
            out[(tp.topic, tp.partition)] = None if hw is None or pos is None else max(hw - pos, 0)
        return out

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what the producer holds and leave the group, each waiting at most *timeout_s* on the broker
        (during an outage, what was not sent is lost with the process, as on a crash; the offsets of the
        ticks it belonged to were never committed, so the partition's next owner scores them again)."""
        try:
            self._producer.flush(timeout=timeout_s)
        except KafkaError as e:
            log.warning("kafka: %s at close; closing anyway", e)
        self._producer.close(timeout=timeout_s)
        self._consumer.close(timeout_ms=int(timeout_s * 1000))
