"""The telemetry wire format through a real Kafka broker (no mocks).

Produces with kafka-python the way the collector does (keyed by node, lz4) and consumes
with a consumer group the way the pipeline does, against the broker started by
deploy/testservices/kafka_up.sh.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from collector.wire import TelemetryMessage, decode_telemetry, encode_telemetry
from tests.helpers import wait_until

pytestmark = pytest.mark.kafka

NODES = [f"gpu-node-{i:03d}" for i in range(1, 6)]
TICKS = 10
T0 = 1_767_225_600.0


def telemetry_message(node_index: int, tick: int) -> TelemetryMessage:
    """One node's samples for one tick: 8 GPUs and 2 ports, some fields unsupported (NaN)."""
    ts = T0 + 10.0 * tick
    gpus = list(range(8))
    return TelemetryMessage(
        node=NODES[node_index],
        ts=ts,
        gpu={
            "ts": [ts] * 8,
            "gpu": gpus,
            "util_gpu": [float((tick * 7 + g * 13 + node_index) % 101) for g in gpus],
            "temp_c": [40.0 + g + 0.5 * tick for g in gpus],
            "power_w": [350.25 + node_index + g for g in gpus],
            # a field this device does not report travels as NaN and comes back as null
            "ecc_sbe_total": [float("nan") if g % 3 == 0 else float(tick) for g in gpus],
            "xid_last": [None] * 8,
        },
        net={
            "ts": [ts, ts],
            "device": ["mlx5_0", "mlx5_1"],
            "port": [1, 1],
            "symbol_error": [tick, float("nan")],
            "link_downed": [0, 0],
        },
    )


def as_decoded(msg: TelemetryMessage) -> TelemetryMessage:
    """What a message must look like after the round trip: NaN → None, nothing else changed."""
    def clean(cols):
        return {k: [None if isinstance(x, float) and math.isnan(x) else x for x in col] for k, col in cols.items()}
    return TelemetryMessage(node=msg.node, ts=msg.ts, gpu=clean(msg.gpu), net=clean(msg.net), v=msg.v)


def consume(consumer: KafkaConsumer, count: int, timeout_s: float) -> list:
    """Poll until ``count`` records arrived or the deadline passed; return what arrived."""
    records: list = []
    deadline = time.monotonic() + timeout_s
    while len(records) < count and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=200).values():
            records.extend(batch)
    return records


def test_telemetry_batch_comes_back_equal_and_in_per_node_order(kafka_bootstrap, kafka_topic):
    sent = [telemetry_message(n, tick) for tick in range(TICKS) for n in range(len(NODES))]
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, compression_type="lz4", acks="all",
                             linger_ms=5, client_id="test-collector")
    try:
        futures = [producer.send(kafka_topic, key=m.node.encode(), value=encode_telemetry(m)) for m in sent]
        producer.flush(timeout=30)
        partition_of: dict[str, set[int]] = defaultdict(set)
        for m, f in zip(sent, futures):
            partition_of[m.node].add(f.get(timeout=30).partition)
    finally:
        producer.close(timeout=10)
    assert all(len(p) == 1 for p in partition_of.values()), f"a node's messages spread over partitions: {dict(partition_of)}"

    consumer = KafkaConsumer(kafka_topic, bootstrap_servers=kafka_bootstrap, group_id=f"{kafka_topic}.pipeline",
                             auto_offset_reset="earliest", enable_auto_commit=False, client_id="test-pipeline")
    try:
        records = consume(consumer, len(sent), timeout_s=30)
    finally:
        consumer.close()

    assert len(records) == len(sent)
    received: dict[str, list[TelemetryMessage]] = defaultdict(list)
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        msg = decode_telemetry(r.value)
        assert r.key == msg.node.encode(), "record key is the node name"
        assert r.partition in partition_of[msg.node]
        received[msg.node].append(msg)
    for node in NODES:
        expected = [as_decoded(m) for m in sent if m.node == node]
        assert [m.ts for m in received[node]] == [m.ts for m in expected], f"{node}: order changed"
        assert received[node] == expected, f"{node}: content changed in transit"
    assert received[NODES[0]][0].gpu["ecc_sbe_total"][0] is None  # NaN came back as null


def test_unknown_topic_is_auto_created_with_four_partitions_on_first_produce(kafka_bootstrap, kafka_admin):
    # the test broker's settings other tests rely on (kafka_up.sh): auto-create, 4 partitions
    topic = f"test.autocreate.{time.time_ns()}"
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    try:
        msg = TelemetryMessage(node="gpu-node-001", ts=T0, gpu={"gpu": [0], "util_gpu": [1.0]})
        meta = producer.send(topic, key=b"gpu-node-001", value=encode_telemetry(msg)).get(timeout=30)
    finally:
        producer.close(timeout=10)
    assert meta.topic == topic and meta.offset == 0
    described = kafka_admin.describe_topics([topic])
    assert len(described[0]["partitions"]) == 4
    kafka_admin.delete_topics([topic], timeout_ms=30_000)


def test_second_consumer_in_a_group_resumes_after_the_committed_offset(kafka_bootstrap, kafka_topic):
    tp = TopicPartition(kafka_topic, 0)
    total, processed = 20, 8
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, compression_type="lz4", acks="all")
    try:
        for i in range(total):
            msg = TelemetryMessage(node="gpu-node-001", ts=T0 + i, gpu={"gpu": [0], "util_gpu": [float(i)]})
            producer.send(kafka_topic, key=b"gpu-node-001", value=encode_telemetry(msg), partition=0)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)

    group = f"{kafka_topic}.resume"
    first = KafkaConsumer(kafka_topic, bootstrap_servers=kafka_bootstrap, group_id=group,
                          auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        seen = consume(first, processed, timeout_s=30)
        assert len(seen) >= processed
        # this consumer "processed" the first 8 and commits exactly that much
        assert [decode_telemetry(r.value).ts for r in seen[:processed]] == [T0 + i for i in range(processed)]
        first.commit({tp: OffsetAndMetadata(seen[processed - 1].offset + 1, "", -1)})
        assert first.committed(tp) == processed
    finally:
        first.close()  # leaves the group

    second = KafkaConsumer(kafka_topic, bootstrap_servers=kafka_bootstrap, group_id=group,
                           auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        rest = consume(second, total - processed, timeout_s=30)
        # nothing more arrives: the second consumer did not re-read what the first committed
        extra = consume(second, 1, timeout_s=1.0)
        wait_until(lambda: second.assignment(), timeout_s=10, message="second consumer has an assignment")
        assert second.position(tp) == total
    finally:
        second.close()
    assert extra == []
    assert [r.offset for r in rest] == list(range(processed, total))
    assert [decode_telemetry(r.value).ts for r in rest] == [T0 + i for i in range(processed, total)]
