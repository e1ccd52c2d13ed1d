"""The live loop: bus → decode → :class:`FeaturePipeline` → scores → commit.

One :meth:`StreamWorker.run_once` polls a batch, dead-letters what cannot be used
(``gpu.deadletter``, with the reason), ingests the rest, advances the pipeline to the
watermark and hands each closed tick's :class:`FeatureBatch` to ``on_features`` (the
scorer, which publishes to ``gpu.scores``). Then it flushes the producer and commits,
per partition, only the messages whose ticks are closed — so a crash replays the
open ticks rather than losing them.

Watermark: the newest telemetry time seen on each partition; partitions that still
have unread messages hold it back (the oldest of those wins), caught-up partitions do
not. Ticks close ``allowed_lateness_s`` after the watermark passes their end.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Callable

from collector.wire import TOPIC_DEADLETTER, TOPIC_EVENTS, TOPIC_TELEMETRY, encode_deadletter
from pipeline.batch import FeatureBatch
from pipeline.bus import Bus, TopicPartition
from pipeline.decode import MessageDecoder
from pipeline.stream import FeaturePipeline

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamTopics:
    """Topic names (defaults from collector.wire; tests use fresh ones)."""

    telemetry: str = TOPIC_TELEMETRY
    events: str = TOPIC_EVENTS
    deadletter: str = TOPIC_DEADLETTER


class StreamWorker:
    """Drives one :class:`FeaturePipeline` from one :class:`~pipeline.bus.Bus`."""

    def __init__(self, bus: Bus, pipeline: FeaturePipeline, on_features: Callable[[FeatureBatch], None],
                 topics: StreamTopics = StreamTopics()) -> None:
        self.bus = bus
        self.pipeline = pipeline
        self.on_features = on_features
        self.topics = topics
        self.decoder = MessageDecoder(pipeline.keys, pipeline.settings.max_gpus_per_node,
                                      (topics.telemetry,), (topics.events,))
        self.deadlettered = 0
        self.messages = 0
        self._newest: dict[TopicPartition, float] = {}
        self._uncommitted: dict[TopicPartition, deque[tuple[int, float]]] = {}

    def run_once(self) -> list[FeatureBatch]:
        """Poll, decode, ingest, close due ticks, publish, commit. Returns the closed ticks."""
        s = self.pipeline.settings
        msgs = self.bus.poll(s.poll_max_records, s.poll_timeout_s)
        self.messages += len(msgs)
        decoded = self.decoder.decode(msgs)
        for r in decoded.rejected:
            self.bus.produce(self.topics.deadletter, None, encode_deadletter(
                r.reason, r.payload, topic=r.topic, partition=r.partition, offset=r.offset))
            self.deadlettered += 1
        if decoded.rejected:
            log.warning("dead-lettered %d messages/samples (first: %s)", len(decoded.rejected), decoded.rejected[0].reason)
        self.pipeline.ingest(decoded.gpu, decoded.net, decoded.xids, decoded.bmc)
        self.pipeline.ingest_events(decoded.events)  # operator maintenance: muted time (docs/pipeline.md)
        for tp, offset, newest in decoded.progress:
            self._uncommitted.setdefault(tp, deque()).append((offset, newest))
            if newest > self._newest.get(tp, -math.inf):
                self._newest[tp] = newest
        return self._publish(self.pipeline.advance(self.watermark() - s.allowed_lateness_s))

    def drain(self) -> list[FeatureBatch]:
        """Close every open tick (shutdown, or the end of a finite stream) and commit all."""
        return self._publish(self.pipeline.flush())

    def watermark(self) -> float:
        """Telemetry time up to which every partition is believed complete."""
        backlog = self.bus.backlog()
        holding = [self._newest.get(tp, -math.inf) for tp, n in backlog.items() if n is None or n > 0]
        if holding:
            return min(holding)
        return max(self._newest.values(), default=-math.inf)

    def _publish(self, batches: list[FeatureBatch]) -> list[FeatureBatch]:
        for b in batches:
            self.on_features(b)
        self.bus.flush()  # scores and dead letters are out before offsets move
        self._commit()
        return batches

    def _commit(self) -> None:
        # a message is done when every row it carried is in a closed tick (or it had none)
        done_before = self.pipeline.closed_until
        offsets: dict[TopicPartition, int] = {}
        done: dict[TopicPartition, int] = {}
        for tp, q in self._uncommitted.items():
            n = 0
            for offset, newest in q:
                if newest >= done_before:
                    break
                n += 1
                offsets[tp] = offset + 1
            if n:
                done[tp] = n
        if offsets:
            self.bus.commit(offsets)  # a commit the broker does not take raises: the offsets wait for the next
            for tp, n in done.items():
                q = self._uncommitted[tp]
                for _ in range(n):
                    q.popleft()
