"""GPU reset through a real Kafka broker: the engine's CommandSender to the node agent and back on gpu.events."""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path

import pytest

from api.commands.agent import compose_agent
from collector.agent_settings import AgentSettings
from collector.command_loop import CommandLoop
from collector.commands import CommandResult, ResultStatus, sign
from collector.gpu_reset import NvmlGpuOps
from collector.sinks.kafka import KafkaSink
from fake_nvml import FakeGpu, FakeNvml
from pipeline.kafka_bus import KafkaBus
from remediation.adapters.agent_commands import CommandSender, parse_result
from tests.helpers import wait_until

pytestmark = pytest.mark.kafka

KEY = b"0123456789abcdef" * 4


def _agent(bootstrap: str, commands_topic: str, events_topic: str, node: str, key_file: Path, nvml: FakeNvml):
    settings = AgentSettings(node=node, bootstrap=bootstrap, sources="nvml", telemetry_topic=events_topic + ".tel",
                             events_topic=events_topic, health_file=None, commands_enabled=True,
                             command_key_file=key_file, command_topic=commands_topic, kafka_request_timeout_s=5,
                             kafka_max_block_s=5, shutdown_flush_timeout_s=30)
    agent = compose_agent(settings, nvml=nvml, sink=KafkaSink.from_settings(settings),
                          gpu_ops=NvmlGpuOps(nvml, run=nvml.nvidia_smi))
    [loop] = [f.__self__ for f in agent.loops if isinstance(getattr(f, "__self__", None), CommandLoop)]
    return agent, loop


def _events_topics(make_kafka_topic, commands_topic: str) -> str:
    """Create the events and telemetry topics before the engine subscribes to them.

    A group member that subscribes to a topic that does not exist yet gets no partitions until
    its next metadata refresh, and would miss the agent's result.
    """
    events_topic = make_kafka_topic(commands_topic + ".events", partitions=1)
    make_kafka_topic(events_topic + ".tel", partitions=1)
    return events_topic


def test_a_signed_reset_reaches_its_agent_and_the_result_comes_back_while_bad_ones_are_refused(
        kafka_bootstrap: str, kafka_topic: str, make_kafka_topic, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    node_a, node_b = f"gpu-a-{uuid.uuid4().hex[:8]}", f"gpu-b-{uuid.uuid4().hex[:8]}"
    events_topic = _events_topics(make_kafka_topic, kafka_topic)
    key_file = tmp_path / "command.key"
    key_file.write_bytes(KEY + b"\n")
    key_file.chmod(0o600)
    nvml = FakeNvml([FakeGpu(pci_bus_id=f"00000000:{0x18 + i:02x}:00.0") for i in range(4)])
    agent, loop = _agent(kafka_bootstrap, kafka_topic, events_topic, node_a, key_file, nvml)
    engine_bus = KafkaBus(kafka_bootstrap, f"test-engine-{uuid.uuid4().hex[:8]}", [events_topic])
    sender = CommandSender(engine_bus, KEY, topic=kafka_topic, ttl_s=300)
    forger = CommandSender(engine_bus, b"not-the-key-but-long-enough-to-sign-with", topic=kafka_topic)
    now = time.time()
    try:
        good = sender.send_reset("act-good", node_a, 1, "gpuops: pending row remap, node idle", now)
        forger.send_reset("act-forged", node_a, 2, "gpuops: forged", now)
        sender.send_reset("act-expired", node_a, 3, "gpuops: stale decision", now - 1000)
        sender.send_reset("act-for-b", node_b, 0, "gpuops: other node", now)
        misrouted = sender.send_reset("act-misrouted", node_b, 0, "gpuops: keyed wrong", now)
        engine_bus.produce(kafka_topic, node_a, sign(misrouted, KEY))  # node B's, under A's key
        engine_bus.flush(10)

        with caplog.at_level(logging.INFO, logger="collector"):
            wait_until(lambda: loop.poll_once() is not None and loop.handled >= 4, timeout_s=60, interval_s=0.01,
                       message="the agent handled its four messages")
            assert agent.flush(timeout_s=30)
        assert nvml.resets == {1: 1}
        assert loop.skipped_other_nodes >= 1
        outcomes = agent.health()["commands"]["outcomes"]
        assert outcomes == {"succeeded": 1, "rejected:bad_signature": 1, "rejected:expired": 1,
                            "rejected:foreign_node": 1}
        for reason in ("bad_signature", "expired", "foreign_node"):
            assert f"command rejected ({reason}" in caplog.text

        results: dict[str, CommandResult] = {}

        def two_results() -> bool:
            for m in engine_bus.poll(100, 0.5):
                r = parse_result(m.value)
                if r is not None:
                    results[r.command_id] = r
            return {"act-good", "act-expired"} <= set(results)

        wait_until(two_results, timeout_s=60, interval_s=0.01, message="results of act-good and act-expired")
        assert results["act-good"].status is ResultStatus.SUCCEEDED and results["act-good"].node == node_a
        assert results["act-good"].gpu == good.gpu == 1
        assert results["act-expired"].status is ResultStatus.REJECTED and results["act-expired"].code == "expired"
        # forged and foreign commands get no answer from node A
        for m in engine_bus.poll(100, 1.0):
            r = parse_result(m.value)
            if r is not None:
                results[r.command_id] = r
        assert set(results) == {"act-good", "act-expired"}
    finally:
        loop.close()
        agent.close()
        engine_bus.close()



def test_a_running_agent_resets_through_its_command_thread_and_stops_with_the_event(
        kafka_bootstrap: str, kafka_topic: str, make_kafka_topic, tmp_path: Path) -> None:
    import threading

    node = f"gpu-run-{uuid.uuid4().hex[:8]}"
    events_topic = _events_topics(make_kafka_topic, kafka_topic)
    key_file = tmp_path / "command.key"
    key_file.write_bytes(KEY)
    key_file.chmod(0o400)
    nvml = FakeNvml([FakeGpu(), FakeGpu()])
    agent, loop = _agent(kafka_bootstrap, kafka_topic, events_topic, node, key_file, nvml)
    agent.settings.interval_s = 0.5
    engine_bus = KafkaBus(kafka_bootstrap, f"test-engine-{uuid.uuid4().hex[:8]}", [events_topic])
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,), name="test-agent")
    runner.start()
    try:
        CommandSender(engine_bus, KEY, topic=kafka_topic).send_reset("act-run", node, 0, "gpuops: test", time.time())
        wait_until(lambda: nvml.resets[0] == 1, timeout_s=60, message="GPU 0 reset by the running agent")

        def result() -> CommandResult | None:
            found = [parse_result(m.value) for m in engine_bus.poll(100, 0.5)]
            return next((r for r in found if r is not None), None)

        r = wait_until(result, timeout_s=60, interval_s=0.01, message="the reset's result on the events topic")
        assert (r.command_id, r.status) == ("act-run", ResultStatus.SUCCEEDED)
    finally:
        stop.set()
        runner.join(timeout=60)
        engine_bus.close()
    assert not runner.is_alive() and loop._consumer is None  # the command thread left its group
