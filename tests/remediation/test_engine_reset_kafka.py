"""A GPU reset end to end on a real broker: the armed engine decides it, signs it onto gpu.commands, the
node agent (fake NVML) resets the idle GPU, and the result it publishes on gpu.events closes the action."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import pytest

from api.commands.agent import compose_agent
from collector.agent_settings import AgentSettings
from collector.command_loop import CommandLoop
from collector.gpu_reset import NvmlGpuOps
from collector.schema import Action
from collector.sinks.kafka import KafkaSink
from pipeline.kafka_bus import KafkaBus
from remediation.actions import ActionKind, ActionState
from remediation.adapters.agent_commands import CommandSender, parse_result
from remediation.adapters.dryrun import DryRunAdapter
from remediation.engine import Engine
from remediation.safety import SafetyConfig
from tests.helpers import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collector"))
from fake_nvml import FakeGpu, FakeNvml  # noqa: E402
from tests.remediation.test_engine import POLICY, explain, fleet  # noqa: E402

pytestmark = pytest.mark.kafka
KEY = b"engine-and-agents-share-this-key!" * 2


class Cluster(DryRunAdapter):
    name = "cluster"


def test_an_armed_engine_resets_a_gpu_through_the_agent_and_records_its_result(
        store, kafka_bootstrap: str, kafka_topic: str, make_kafka_topic, tmp_path: Path) -> None:
    # created before the engine subscribes: a group member subscribed to a missing topic sees no
    # partitions until its next metadata refresh and would miss the agent's result
    events = make_kafka_topic(kafka_topic + ".events", partitions=1)
    make_kafka_topic(events + ".tel", partitions=1)
    key_file = tmp_path / "command.key"
    key_file.write_bytes(KEY)
    key_file.chmod(0o600)
    nvml = FakeNvml([FakeGpu(), FakeGpu()])
    node = "n00001"
    settings = AgentSettings(node=node, bootstrap=kafka_bootstrap, sources="nvml", telemetry_topic=events + ".tel",
                             events_topic=events, health_file=None, commands_enabled=True, command_key_file=key_file,
                             command_topic=kafka_topic, kafka_request_timeout_s=5, kafka_max_block_s=5,
                             shutdown_flush_timeout_s=30)
    agent = compose_agent(settings, nvml=nvml, sink=KafkaSink.from_settings(settings),
                          gpu_ops=NvmlGpuOps(nvml, run=nvml.nvidia_smi))
    [loop] = [f.__self__ for f in agent.loops if isinstance(getattr(f, "__self__", None), CommandLoop)]
    bus = KafkaBus(kafka_bootstrap, f"test-engine-{uuid.uuid4().hex[:8]}", [events])
    engine = Engine(store, Cluster(), policy=POLICY, safety=SafetyConfig(), clock=time.time,
                    commands=CommandSender(bus, KEY, topic=kafka_topic, ttl_s=300))
    engine.start()
    engine.arm("operator:test")
    try:
        [rec] = engine.tick(fleet(2, time.time(), rule_nodes=[1], rule_action=Action.RESET, rule_fault="hbm_ecc"),
                            explain)
        assert (rec.kind, rec.state, rec.gpu) == (ActionKind.RESET, ActionState.EXECUTING, 1)
        bus.flush(10)
        wait_until(lambda: loop.poll_once() is not None and loop.handled >= 1, timeout_s=60, interval_s=0.01,
                   message="the agent handled the engine's reset")
        assert agent.flush(timeout_s=30) and nvml.resets == {1: 1}

        def recorded() -> bool:
            for m in bus.poll(100, 0.5):
                r = parse_result(m.value)
                if r is not None:
                    engine.on_command_result(r.command_id, r.status.value, r.detail)
            return store.get(rec.id).state is ActionState.SUCCEEDED

        wait_until(recorded, timeout_s=60, interval_s=0.01, message="the reset's result recorded on its action")
        assert store.get(rec.id).result["reset"].startswith("reset")
    finally:
        loop.close()
        agent.close()
        bus.close()
