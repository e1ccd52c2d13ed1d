"""The engine's side of GPU resets: signed commands keyed by node, and the agent's answers read back."""

from __future__ import annotations

import orjson
import pytest

from collector.commands import CommandResult, ResultStatus, result_event, verify
from collector.wire import TOPIC_EVENTS, encode_event
from pipeline.bus import InProcessBus
from remediation.adapters.agent_commands import CommandSender, parse_result
from remediation.adapters.base import PermanentAdapterError, TransientAdapterError
from remediation.actions import ActionKind, action_id

KEY = b"e" * 32
NOW = 1_767_225_600.0


def _sender(bus, **kw) -> CommandSender:
    nonces = iter(f"{i:032x}" for i in range(100))
    return CommandSender(bus, KEY, nonce=lambda: next(nonces), **kw)


def test_a_reset_is_published_signed_and_keyed_by_node_with_the_action_id() -> None:
    bus = InProcessBus(topics=("gpu.commands",))
    aid = action_id("gpu-node-009", ActionKind.RESET, 2, "hbm_ecc", NOW)
    cmd = _sender(bus, ttl_s=120).send_reset(aid, "gpu-node-009", 2, "gpuops: pending row remap", NOW)
    [msg] = bus.messages("gpu.commands")
    assert msg.key == "gpu-node-009" and cmd.id == aid and cmd.expires_at == NOW + 120
    assert verify(msg.value, KEY, node="gpu-node-009", now=NOW, max_skew_s=0) == cmd


def test_each_command_gets_a_fresh_nonce() -> None:
    bus = InProcessBus(topics=("gpu.commands",))
    sender = _sender(bus)
    a = sender.send_reset("a1", "n1", 0, "r", NOW)
    b = sender.send_reset("a2", "n1", 0, "r", NOW)
    assert a.nonce != b.nonce


@pytest.mark.parametrize("node, gpu, now", [("bad node", 0, NOW), ("n1", -1, NOW), ("n1", True, NOW),
                                            ("n1", 0, float("nan"))])
def test_bad_input_is_a_permanent_error(node, gpu, now) -> None:
    with pytest.raises(PermanentAdapterError):
        _sender(InProcessBus()).send_reset("a1", node, gpu, "r", now)


def test_a_delivery_failure_is_transient() -> None:
    class DownBus:
        def produce(self, topic, key, value):
            raise ConnectionError("broker down")

        def flush(self, timeout_s=30.0):
            pass

    with pytest.raises(TransientAdapterError, match="not delivered"):
        _sender(DownBus()).send_reset("a1", "n1", 0, "r", NOW)


def test_the_ttl_is_bounded_by_what_agents_accept() -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        CommandSender(InProcessBus(), KEY, ttl_s=7200)


def test_results_are_picked_out_of_the_events_and_everything_else_ignored() -> None:
    bus = InProcessBus(topics=(TOPIC_EVENTS,))
    result = CommandResult("a1", "n1", 0, ResultStatus.SUCCEEDED, "reset: GPU 0 reset", NOW)
    bus.produce(TOPIC_EVENTS, "n1", encode_event({"ts": NOW, "node": "n1", "gpu": 0, "source": "kmsg",
                                                   "kind": "xid", "code": 79, "message": "x"}))
    bus.produce(TOPIC_EVENTS, "n1", encode_event(result_event(result)))
    bus.produce(TOPIC_EVENTS, "n1", orjson.dumps({"not": "an event"}))
    assert [parse_result(m.value) for m in bus.poll(10, 0)] == [None, result, None]
    assert parse_result(result_event(result)) == result
