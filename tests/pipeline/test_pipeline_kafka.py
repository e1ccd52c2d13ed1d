"""Live through a real Kafka broker gives exactly the replay features (issue 3, item 1).

Two streams: a small synthetic one with hand-placed XIDs (tests/pipeline/synth.py), and
a recording written by the fleet simulator, replayed through ``Recording.iter_windows``
exactly as ``gpuops replay`` does. Adding a stream is adding a ``stream_*`` function.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson
import pandas as pd
import pytest

from collector.recording import Recording
from collector.schema import RecordType
from collector.simulator import SimConfig, simulate_recording
from pipeline.batch import FeatureBatch
from pipeline.kafka_bus import KafkaBus
from pipeline.settings import PipelineSettings
from pipeline.stream import FeaturePipeline
from pipeline.worker import StreamTopics, StreamWorker
from tests.helpers import wait_until
from tests.pipeline.synth import Fleet, event_messages, events_frame, gpu_frame, net_frame, telemetry_messages

pytestmark = pytest.mark.kafka

SETTINGS = PipelineSettings(cadence_s=60, bucket_s=60, short_window_s=60, long_window_s=600)


def stream_synthetic(tmp_path: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, float, list[FeatureBatch]]:
    """gpu, net and event frames of the stream, the sampling interval, and the replay features."""
    fleet = Fleet(nodes=6, gpus=8, ports=2, samples=60, interval_s=10.0, jitter_s=2.0, seed=11)
    events = events_frame(fleet, [(95, 0, 3, 79), (96, 2, None, 48), (300, 4, 1, 13), (420, 5, 6, 74)])
    gpu, net = gpu_frame(fleet), net_frame(fleet)
    pipe = FeaturePipeline(SETTINGS)
    pipe.ingest_frames(gpu, net, events)
    return gpu, net, events, fleet.interval_s, pipe.flush()


def stream_simulator(tmp_path: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, float, list[FeatureBatch]]:
    """A simulated recording (4 nodes x 8 GPUs, 2 ports each, 100 min), replayed in 300 s windows."""
    simulate_recording(SimConfig(nodes=4, hours=100 / 60, seed=3, ports_per_node=2), tmp_path / "rec")
    rec = Recording(tmp_path / "rec")
    replayed = list(FeaturePipeline(SETTINGS).replay(rec.iter_windows(300)))
    return (rec.read_all(RecordType.GPU), rec.read_all(RecordType.NET), rec.events(), rec.manifest.interval_s,
            replayed)


@pytest.mark.parametrize("stream", [stream_synthetic, stream_simulator], ids=["synthetic", "simulator"])
def test_features_through_real_kafka_equal_the_replay_features(kafka_bootstrap: str, kafka_topic: str,
                                                                tmp_path: Path, stream) -> None:
    gpu, net, events, interval, want = stream(tmp_path)
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

    assert worker.deadlettered == 1 and worker.pipeline.counts.late_rows == 0
    assert len(want) >= 10 and [b.ts for b in got] == [b.ts for b in want]
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
