"""Live through a real Kafka broker gives exactly the replay features (issue 3, item 1).

The stream is synthetic for now (tests/pipeline/synth.py); to run it on a simulator
recording instead, swap ``stream_frames`` for one that opens the recording and returns
its gpu / net / events frames — the rest of the test does not change.
"""

from __future__ import annotations

import uuid

import orjson
import pandas as pd
import pytest

from pipeline.batch import FeatureBatch
from pipeline.kafka_bus import KafkaBus
from pipeline.settings import PipelineSettings
from pipeline.stream import FeaturePipeline
from pipeline.worker import StreamTopics, StreamWorker
from tests.helpers import wait_until
from tests.pipeline.synth import Fleet, event_messages, events_frame, gpu_frame, net_frame, telemetry_messages

pytestmark = pytest.mark.kafka

SETTINGS = PipelineSettings(cadence_s=60, bucket_s=60, short_window_s=60, long_window_s=600)


def stream_frames() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, float]:
    """gpu, net and event frames of the stream, and the sampling interval."""
    fleet = Fleet(nodes=6, gpus=8, ports=2, samples=60, interval_s=10.0, jitter_s=2.0, seed=11)
    events = events_frame(fleet, [(95, 0, 3, 79), (96, 2, None, 48), (300, 4, 1, 13), (420, 5, 6, 74)])
    return gpu_frame(fleet), net_frame(fleet), events, fleet.interval_s


def test_features_through_real_kafka_equal_the_replay_features(kafka_bootstrap: str, kafka_topic: str) -> None:
    gpu, net, events, interval = stream_frames()
    topics = StreamTopics(telemetry=kafka_topic, events=f"{kafka_topic}.events", deadletter=f"{kafka_topic}.dlq")
    producer = KafkaBus(kafka_bootstrap, f"producer-{uuid.uuid4().hex[:8]}", ())
    telemetry = telemetry_messages(gpu, net, interval)
    evs = event_messages(events)
    for node, raw in telemetry:
        producer.produce(topics.telemetry, node, raw)
    for node, raw in evs:
        producer.produce(topics.events, node, raw)
    producer.produce(topics.telemetry, "gpu-node-000", b"{broken")  # one dead letter on the way
    producer.flush()
    producer.close()

    got: list[FeatureBatch] = []
    bus = KafkaBus(kafka_bootstrap, f"test-{uuid.uuid4().hex[:8]}", (topics.telemetry, topics.events))
    worker = StreamWorker(bus, FeaturePipeline(SETTINGS), got.append, topics)
    total = len(telemetry) + len(evs) + 1
    try:
        def consumed_everything() -> bool:
            worker.run_once()
            return worker.messages >= total and not any(bus.backlog().values())

        wait_until(consumed_everything, timeout_s=120, interval_s=0.0, message=f"{total} messages consumed")
        worker.drain()
    finally:
        bus.close()

    pipe = FeaturePipeline(SETTINGS)
    pipe.ingest_frames(gpu, net, events)
    want = pipe.flush()
    assert worker.deadlettered == 1 and worker.pipeline.counts.late_rows == 0
    assert len(want) == 10 and [b.ts for b in got] == [b.ts for b in want]
    for g, w in zip(got, want):
        pd.testing.assert_frame_equal(g.to_frame(), w.to_frame(), check_exact=True)

    # the dead letter carries its reason
    check = KafkaBus(kafka_bootstrap, f"dlq-{uuid.uuid4().hex[:8]}", (topics.deadletter,))
    letters: list = []
    try:
        wait_until(lambda: letters.extend(check.poll(10, 1.0)) or letters, timeout_s=60, message="dead letter read")
    finally:
        check.close()
    assert "not valid JSON" in orjson.loads(letters[0].value)["reason"]
