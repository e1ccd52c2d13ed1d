"""The agent against a real Kafka broker: delivery, lz4, a broker outage, a full buffer."""

from __future__ import annotations

import struct
import threading
from pathlib import Path

import pytest

from collector.agent import Agent
from collector.agent_settings import AgentSettings
from collector.sinks.kafka import KafkaSink
from collector.sources.infiniband import InfinibandSource
from collector.sources.kmsg import KmsgSource
from collector.sources.nvml import NvmlSource
from collector.wire import decode_event, decode_telemetry
from fake_nvml import FakeGpu, FakeNvml
from fakes import CountingSource
from tests.helpers import wait_until

pytestmark = pytest.mark.kafka


def _settings(topic: str, bootstrap: str, **kw) -> AgentSettings:
    base = dict(node="gpu-node-017", bootstrap=bootstrap, telemetry_topic=topic, events_topic=topic + ".events",
                health_file=None, interval_s=0.05, backoff_initial_s=0.2, backoff_max_s=1.0,
                kafka_request_timeout_s=2.0, kafka_max_block_s=1.0, shutdown_flush_timeout_s=30)
    return AgentSettings(**{**base, **kw})


def _consume(bootstrap: str, topic: str, n: int, timeout_s: float = 60) -> list:
    """The first *n* records of *topic* (all partitions), in partition/offset order."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, group_id=None)
    got: list = []
    try:
        def enough() -> bool:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(records)
            return len(got) >= n

        wait_until(enough, timeout_s=timeout_s, interval_s=0.01, message=f"{n} records on {topic}")
        for records in consumer.poll(timeout_ms=1000).values():  # anything beyond n is a duplicate
            got.extend(records)
    finally:
        consumer.close()
    return sorted(got, key=lambda r: (r.partition, r.offset))


def _seqs(records: list) -> list[int]:
    return [decode_telemetry(r.value).gpu["seq"][0] for r in records]


def test_agent_publishes_one_keyed_message_per_tick_and_one_per_event(kafka_bootstrap: str, kafka_topic: str,
                                                                      h100_sysfs: Path, shared_fixtures: Path) -> None:
    settings = _settings(kafka_topic, kafka_bootstrap)
    nvml = NvmlSource(settings.node, nvml=FakeNvml([FakeGpu(pci_bus_id=f"00000000:{0x18 + i:02x}:00.0")
                                                    for i in range(8)]))
    sources = [nvml, InfinibandSource(settings.node, h100_sysfs),
               KmsgSource(settings.node, shared_fixtures / "xid/gpud/dmesg.0.log", from_start=True,
                          gpu_index_by_pci=nvml.gpu_index_by_pci())]
    agent = Agent(settings, sources, KafkaSink.from_settings(settings))
    for _ in range(3):
        agent.tick()
    assert agent.flush(timeout_s=60)
    agent.close()
    records = _consume(kafka_bootstrap, kafka_topic, 3)
    assert len(records) == 3 and {r.key for r in records} == {b"gpu-node-017"}
    assert len({r.partition for r in records}) == 1  # one node, one partition, in order
    msgs = [decode_telemetry(r.value) for r in records]
    assert [(m.n_gpu, m.n_net) for m in msgs] == [(8, 9)] * 3
    assert [m.ts for m in msgs] == sorted(m.ts for m in msgs)
    events = [decode_event(r.value) for r in _consume(kafka_bootstrap, kafka_topic + ".events", 11)]
    assert [e["code"] for e in events] == [48, 63] + [94] * 9 and {e["gpu"] for e in events} == {1}


def test_messages_are_lz4_compressed_on_the_broker(private_kafka) -> None:
    settings = _settings("agent.lz4", private_kafka.bootstrap)
    agent = Agent(settings, [CountingSource()], KafkaSink.from_settings(settings))
    agent.tick()
    assert agent.flush(timeout_s=60)
    agent.close()
    segments = [p for p in (private_kafka.root / "data").glob("agent.lz4-*/*.log") if p.stat().st_size]
    assert segments, "no data segment written"
    head = segments[0].read_bytes()[:23]
    # record batch v2: baseOffset(8) length(4) leaderEpoch(4) magic(1) crc(4) attributes(2)
    magic, attributes = head[16], struct.unpack(">h", head[21:23])[0]
    assert (magic, attributes & 0x7) == (2, 3)  # codec 3 = lz4


def test_broker_outage_loses_no_record_within_the_buffer_bound_and_keeps_order(private_kafka) -> None:
    topic = "agent.outage"
    settings = _settings(topic, private_kafka.bootstrap)
    src = CountingSource("gpu-node-017")
    agent = Agent(settings, [src], KafkaSink.from_settings(settings), seed=0)
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,), name="agent-under-test")
    runner.start()
    try:
        wait_until(lambda: agent.published >= 20, timeout_s=60, message="20 ticks published before the outage")
        private_kafka.stop()
        try:
            wait_until(lambda: agent.health()["last_publish_error"], timeout_s=60, message="agent sees the outage")
            wait_until(lambda: len(agent.buffer) >= 20, timeout_s=60, message="backlog builds up")
        finally:
            private_kafka.start()
        wait_until(lambda: src.n > 0 and agent.health()["last_publish_error"] is None and len(agent.buffer) < 3,
                   timeout_s=120, message="backlog drained after the restart")
    finally:
        stop.set()
        runner.join(timeout=60)
    assert not runner.is_alive()
    h = agent.health()
    assert (h["buffer_depth"], h["dropped_total"]) == (0, 0)
    sampled = src.n
    seqs = _seqs(_consume(private_kafka.bootstrap, topic, sampled))
    assert list(dict.fromkeys(seqs)) == list(range(sampled))  # every record, in the order sampled
    assert seqs == sorted(seqs)  # duplicates (at-least-once), if any, never go back in time
    assert len(seqs) - sampled <= 1


def test_full_buffer_during_an_outage_drops_the_oldest_and_counts_them(private_kafka) -> None:
    topic = "agent.full"
    settings = _settings(topic, private_kafka.bootstrap, buffer_max_messages=10)
    agent = Agent(settings, [CountingSource("gpu-node-017")], KafkaSink.from_settings(settings))
    agent.tick()
    assert agent.flush(timeout_s=60)  # seq 0 delivered
    private_kafka.stop()
    try:
        agent.tick()
        assert not agent.publish_pending()  # the real broker is gone
        for _ in range(24):
            agent.tick()
    finally:
        private_kafka.start()
    assert agent.health()["dropped_total"] == 15 and len(agent.buffer) == 10
    assert agent.flush(timeout_s=60)
    agent.close()
    assert _seqs(_consume(private_kafka.bootstrap, topic, 11)) == [0] + list(range(16, 26))
