"""The agent's tick, buffer, backoff and health against a fake sink and clock (our boundaries)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Callable, Sequence

import orjson
import pytest

from collector.agent import Agent, Backoff
from collector.agent_settings import AgentSettings
from collector.sinks.base import OutboundMessage, SinkRejected, SinkUnavailable
from collector.sinks.buffer import OutboundBuffer
from collector.sources.base import SourceBatch, TransientSourceError
from collector.sources.infiniband import InfinibandSource
from collector.sources.kmsg import KmsgSource
from collector.sources.nvml import NvmlSource
from collector.wire import TOPIC_EVENTS, TOPIC_TELEMETRY, decode_event, decode_telemetry
from fakes import CountingSource, FakeClock
from fake_nvml import FakeGpu, FakeNvml
from tests.helpers import wait_until


class FakeSink:
    """Records what it delivers; ``down`` makes it fail; ``accept`` limits the next delivery."""

    name = "fake"

    def __init__(self) -> None:
        self.delivered: list[OutboundMessage] = []
        self.down = False
        self.accept: int | None = None
        self.reject_at: int | None = None
        self.calls = 0
        self.closed = False

    def publish(self, messages: Sequence[OutboundMessage]) -> None:
        self.calls += 1
        if self.down:
            raise SinkUnavailable("broker down")
        if self.reject_at is not None:
            k, self.reject_at = self.reject_at, None
            self.delivered.extend(messages[:k])
            raise SinkRejected("too large", delivered=k)
        if self.accept is not None:
            k, self.accept = self.accept, None
            self.delivered.extend(messages[:k])
            raise SinkUnavailable("connection reset", delivered=k)
        self.delivered.extend(messages)

    def close(self) -> None:
        self.closed = True


def _settings(**kw) -> AgentSettings:
    base = dict(node="gpu-node-001", interval_s=10.0, backoff_initial_s=0.5, backoff_max_s=8.0, health_file=None)
    return AgentSettings(**{**base, **kw})


def _seqs(messages: list[OutboundMessage]) -> list[int]:
    return [decode_telemetry(m.value).gpu["seq"][0] for m in messages]


def test_one_tick_gives_one_telemetry_message_for_the_node_and_one_per_event(h100_sysfs: Path, tmp_path: Path,
                                                                             fake_clock: FakeClock) -> None:
    log = tmp_path / "kern.log"
    log.write_text("[1.0] NVRM: Xid (PCI:0000:19:00): 48, DBE\n[2.0] NVRM: Xid (PCI:0000:19:00): 63, remap\n")
    gpus = [FakeGpu(pci_bus_id=f"00000000:{0x18 + i:02x}:00.0") for i in range(8)]
    nvml = NvmlSource("gpu-node-001", nvml=FakeNvml(gpus))
    sources = [nvml, InfinibandSource("gpu-node-001", h100_sysfs),
               KmsgSource("gpu-node-001", log, from_start=True, gpu_index_by_pci=nvml.gpu_index_by_pci())]
    sink = FakeSink()
    agent = Agent(_settings(), sources, sink, clock=fake_clock)
    assert agent.tick() == 3
    assert agent.publish_pending()
    tele, *events = sink.delivered
    assert tele.topic == TOPIC_TELEMETRY and tele.key == b"gpu-node-001"
    msg = decode_telemetry(tele.value)
    assert (msg.node, msg.ts, msg.n_gpu, msg.n_net) == ("gpu-node-001", fake_clock.t, 8, 9)
    assert "node" not in msg.gpu and msg.gpu["gpu"] == list(range(8))
    assert [e.topic for e in events] == [TOPIC_EVENTS] * 2
    assert [(decode_event(e.value)["code"], decode_event(e.value)["gpu"]) for e in events] == [(48, 1), (63, 1)]


def test_failing_source_is_logged_and_counted_and_the_others_still_publish(fake_clock: FakeClock) -> None:
    class Broken:
        name = "broken"

        def __init__(self, exc: Exception) -> None:
            self.exc = exc

        def sample(self, now: float) -> SourceBatch:
            raise self.exc

        def close(self) -> None:
            pass

    sink = FakeSink()
    agent = Agent(_settings(), [Broken(TransientSourceError("scrape timed out")), CountingSource(),
                                Broken(ZeroDivisionError("bug"))], sink, clock=fake_clock)
    for _ in range(3):
        agent.tick()
        agent.publish_pending()
    assert _seqs(sink.delivered) == [0, 1, 2]
    assert agent.health()["source_errors"] == {"broken": 6}


def test_unreachable_sink_buffers_and_everything_arrives_in_order_after_recovery(fake_clock: FakeClock) -> None:
    sink = FakeSink()
    agent = Agent(_settings(), [CountingSource()], sink, clock=fake_clock, seed=1)
    agent.tick()
    agent.publish_pending()
    sink.down = True
    for _ in range(20):
        fake_clock.advance(10)
        agent.tick()
        agent.publish_pending()
    assert len(agent.buffer) == 20 and agent.health()["last_publish_error"] == "broker down"
    sink.down = False
    fake_clock.advance(10)
    assert agent.flush(timeout_s=60)
    assert _seqs(sink.delivered) == list(range(21))
    h = agent.health()
    assert (h["buffer_depth"], h["dropped_total"], h["published_total"]) == (0, 0, 21)
    assert h["last_publish_ok_ts"] == fake_clock.t and h["last_publish_error"] is None


def test_publisher_backs_off_exponentially_up_to_the_cap_and_resets_on_success(fake_clock: FakeClock) -> None:
    sink = FakeSink()
    sink.down = True
    agent = Agent(_settings(), [CountingSource()], sink, clock=fake_clock, seed=7)
    agent.tick()
    waits = []
    for _ in range(7):
        calls = sink.calls
        assert not agent.publish_pending()
        assert sink.calls == calls + 1
        wait = agent._retry_at - fake_clock.monotonic()
        waits.append(wait)
        fake_clock.advance(wait * 0.99)
        assert not agent.publish_pending() and sink.calls == calls + 1  # still backing off: no attempt
        fake_clock.advance(wait * 0.02)
    for got, base in zip(waits, [0.5, 1, 2, 4, 8, 8, 8]):
        assert base * 0.8 <= got <= base * 1.2
    sink.down = False
    assert agent.publish_pending() and agent.backoff.failures == 0


def test_full_buffer_drops_the_oldest_and_counts_them(fake_clock: FakeClock) -> None:
    sink = FakeSink()
    sink.down = True
    agent = Agent(_settings(buffer_max_messages=5), [CountingSource()], sink, clock=fake_clock)
    for _ in range(12):
        agent.tick()
        agent.publish_pending()
        fake_clock.advance(10)
    assert agent.health()["dropped_total"] == 7 and agent.health()["buffer_depth"] == 5
    sink.down = False
    assert agent.flush(timeout_s=60)
    assert _seqs(sink.delivered) == [7, 8, 9, 10, 11]


def test_partial_delivery_removes_only_the_delivered_prefix(fake_clock: FakeClock) -> None:
    sink = FakeSink()
    agent = Agent(_settings(), [CountingSource()], sink, clock=fake_clock)
    for _ in range(4):
        agent.tick()
    sink.accept = 2
    assert not agent.publish_pending()
    assert len(agent.buffer) == 2 and agent.published == 2
    fake_clock.advance(1)
    assert agent.publish_pending()
    assert _seqs(sink.delivered) == [0, 1, 2, 3]


def test_a_message_the_sink_rejects_is_dropped_counted_and_the_rest_flow(fake_clock: FakeClock) -> None:
    sink = FakeSink()
    agent = Agent(_settings(), [CountingSource()], sink, clock=fake_clock)
    for _ in range(3):
        agent.tick()
    sink.reject_at = 1
    agent.publish_pending()
    agent.publish_pending()
    assert _seqs(sink.delivered) == [0, 2] and agent.health()["rejected_total"] == 1


def _msg(i: int, size: int = 10) -> OutboundMessage:
    return OutboundMessage("t", b"k", bytes([48 + i % 10]) * size)


def test_buffer_byte_bound_drops_oldest_until_the_new_message_fits() -> None:
    buf = OutboundBuffer(max_messages=100, max_bytes=35)
    for i in range(3):
        buf.put(_msg(i))
    assert buf.put(_msg(3, size=20)) == 2
    assert [m.value[:1] for m in buf.peek(10)] == [b"2", b"3"] and buf.bytes == 30 and buf.dropped == 2


def test_drop_newest_policy_keeps_the_earliest_messages() -> None:
    buf = OutboundBuffer(max_messages=2, max_bytes=1000, policy="drop_newest")
    for i in range(4):
        buf.put(_msg(i))
    assert [m.value[:1] for m in buf.peek(10)] == [b"0", b"1"] and buf.dropped == 2


def test_pop_through_ignores_messages_already_dropped_while_in_flight() -> None:
    buf = OutboundBuffer(max_messages=3, max_bytes=1000)
    for i in range(3):
        buf.put(_msg(i))
    in_flight = buf.peek(2)
    buf.put(_msg(3))  # drops message 0 while 0 and 1 are being published
    assert buf.pop_through(in_flight[-1].seq) == 1
    assert [m.value[:1] for m in buf.peek(10)] == [b"2", b"3"]


def test_ten_thousand_failed_publishes_keep_backing_off_at_the_cap_and_publish_after_recovery(
        fake_clock: FakeClock) -> None:
    # ~3.5 days of broker outage at the 30 s cap: 2 ** 1024 used to overflow and kill the publisher
    sink = FakeSink()
    sink.down = True
    agent = Agent(_settings(backoff_max_s=30.0), [CountingSource()], sink, clock=fake_clock, seed=5)
    agent.tick()
    longest = 0.0
    for _ in range(10_000):
        assert not agent.publish_pending()
        wait = agent._retry_at - fake_clock.monotonic()
        longest = max(longest, wait)
        fake_clock.advance(wait)
    assert agent.backoff.failures == 10_000 and sink.calls == 10_000
    assert 30.0 <= longest <= 30.0 * 1.2
    sink.down = False
    assert agent.publish_pending() and _seqs(sink.delivered) == [0]


def test_backoff_delay_stays_finite_and_capped_after_any_number_of_failures() -> None:
    b = Backoff(0.5, 30.0, jitter=0.0, seed=1)
    b.failures = 10**9
    assert b.next_delay() == 30.0


def test_backoff_with_the_same_seed_gives_the_same_delays() -> None:
    a, b = Backoff(1, 60, seed=3), Backoff(1, 60, seed=3)
    assert [a.next_delay() for _ in range(5)] == [b.next_delay() for _ in range(5)]


def test_health_file_reports_last_publish_depth_and_drops(tmp_path: Path, fake_clock: FakeClock) -> None:
    path = tmp_path / "run" / "health.json"
    sink = FakeSink()
    agent = Agent(_settings(health_file=path, buffer_max_messages=2), [CountingSource()], sink, clock=fake_clock)
    agent.tick()
    agent.publish_pending()
    ok_ts = fake_clock.t
    sink.down = True
    for _ in range(3):
        fake_clock.advance(10)
        agent.tick()
    h = json.loads(path.read_text())
    assert (h["node"], h["last_publish_ok_ts"], h["buffer_depth"], h["dropped_total"]) == ("gpu-node-001", ok_ts, 2, 1)
    assert h["published_total"] == 1 and h["ts"] == fake_clock.t


def test_run_samples_every_interval_until_stopped_then_flushes_and_closes() -> None:
    src = CountingSource()
    sink = FakeSink()
    agent = Agent(_settings(interval_s=0.02, shutdown_flush_timeout_s=5), [src], sink)
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    try:
        wait_until(lambda: len(sink.delivered) >= 5, timeout_s=10, message="5 ticks published")
    finally:
        stop.set()
        runner.join(timeout=10)
    assert not runner.is_alive()
    assert _seqs(sink.delivered) == list(range(src.n))  # everything sampled was published, in order
    assert src.closed and sink.closed and len(agent.buffer) == 0


def test_shutdown_publishes_the_backlog_within_its_timeout(fake_clock: FakeClock) -> None:
    sink = FakeSink()
    sink.down = True
    agent = Agent(_settings(shutdown_flush_timeout_s=5), [CountingSource()], sink, clock=fake_clock)
    for _ in range(3):
        agent.tick()
        agent.publish_pending()
    sink.down = False
    agent.shutdown()
    assert _seqs(sink.delivered) == [0, 1, 2] and sink.closed


def test_shutdown_gives_up_after_its_timeout_when_the_sink_stays_down(fake_clock: FakeClock) -> None:
    sink = FakeSink()
    sink.down = True
    agent = Agent(_settings(shutdown_flush_timeout_s=5), [CountingSource()], sink, clock=fake_clock)
    agent.tick()
    start = fake_clock.monotonic()
    agent.shutdown()
    assert len(agent.buffer) == 1 and 5 <= fake_clock.monotonic() - start <= 6 and sink.closed


def test_settings_come_from_the_environment_with_the_agent_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUOPS_AGENT_INTERVAL_S", "2.5")
    monkeypatch.setenv("GPUOPS_AGENT_SOURCES", "kmsg, infiniband,kmsg")
    monkeypatch.setenv("GPUOPS_AGENT_BUFFER_POLICY", "drop_newest")
    s = AgentSettings()
    assert (s.interval_s, s.source_names, s.buffer_policy) == (2.5, ["kmsg", "infiniband"], "drop_newest")
    monkeypatch.setenv("GPUOPS_AGENT_BUFFER_POLICY", "drop_random")
    with pytest.raises(ValueError, match="buffer_policy"):
        AgentSettings()


def test_every_setting_documents_its_default() -> None:
    for name, field in AgentSettings.model_fields.items():
        assert field.description and len(field.description) > 20, name


def test_events_carry_the_record_fields_on_the_wire(fake_clock: FakeClock, tmp_path: Path) -> None:
    log = tmp_path / "k.log"
    log.write_text("[1.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n")
    sink = FakeSink()
    agent = Agent(_settings(), [KmsgSource("gpu-node-001", log, from_start=True)], sink, clock=fake_clock)
    agent.tick()
    agent.publish_pending()
    [ev] = sink.delivered
    body = orjson.loads(ev.value)
    assert body["schema"] == "gpuops.event" and body["code"] == 79 and body["node"] == "gpu-node-001"


class _SteppedStop(threading.Event):
    """The sampler's wait between ticks, stepped by hand: it runs the publisher once, records
    what the sink holds, advances the fake clock by the wait, and stops after *ticks* waits."""

    def __init__(self, agent: Agent, sink: FakeSink, clock: FakeClock, ticks: int,
                 between: Callable[[int], None] = lambda n: None) -> None:
        super().__init__()
        self.agent, self.sink, self.clock, self.ticks, self.between = agent, sink, clock, ticks, between
        self.delivered_after: list[list[OutboundMessage]] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.agent.publish_pending()
        self.delivered_after.append(list(self.sink.delivered))
        self.between(len(self.delivered_after))
        self.clock.advance(timeout or 0.0)
        if len(self.delivered_after) >= self.ticks:
            self.set()
        return self.is_set()


class _Broken:
    name = "broken"

    def sample(self, now: float) -> SourceBatch:
        raise ZeroDivisionError("a bug in a source")

    def close(self) -> None:
        pass


class _Unencodable:
    """A source (a future one, with a bug) whose event carries a number JSON cannot hold."""

    name = "unencodable"

    def sample(self, now: float) -> SourceBatch:
        return SourceBatch(events=[{"ts": now, "node": "gpu-node-001", "source": "x", "kind": "xid", "code": 2**70}])

    def close(self) -> None:
        pass


def test_sampling_loop_survives_a_raising_source_an_out_of_range_xid_line_and_an_unencodable_event(
        fake_clock: FakeClock, tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("[1.0] NVRM: Xid (PCI:0000:18:00): 99999999999999999999, Graphics Exception\n")
    sink = FakeSink()
    kmsg = KmsgSource("gpu-node-001", log, from_start=True, gpu_index_by_pci={"0000:18:00": 0})
    agent = Agent(_settings(), [_Broken(), kmsg, CountingSource(), _Unencodable()], sink, clock=fake_clock)
    agent.loops = []  # the stepped stop publishes between ticks: no thread, no real time

    def after_tick(n: int) -> None:
        if n == 1:
            with open(log, "a") as f:
                f.write("[2.0] NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n")

    stop = _SteppedStop(agent, sink, fake_clock, ticks=3, between=after_tick)
    agent.run(stop)

    first, second, third = stop.delivered_after
    assert _seqs([m for m in first if m.topic == TOPIC_TELEMETRY]) == [0]
    assert [decode_event(m.value)["code"] for m in first if m.topic == TOPIC_EVENTS] == [None]  # raw line kept
    assert _seqs([m for m in second if m.topic == TOPIC_TELEMETRY]) == [0, 1]  # the next tick still publishes
    assert [decode_event(m.value)["code"] for m in second if m.topic == TOPIC_EVENTS] == [None, 79]
    assert _seqs([m for m in third if m.topic == TOPIC_TELEMETRY]) == [0, 1, 2]
    h = agent.health()
    assert h["ticks"] == 3 and h["source_errors"] == {"broken": 3}
    assert h["tick_errors"] == {"encode_event": 3}
    assert kmsg.problems == {"xid code above 65535": 1}


def test_a_tick_that_fails_outside_any_source_is_logged_counted_and_the_next_tick_runs(
        fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    sink = FakeSink()
    agent = Agent(_settings(), [CountingSource()], sink, clock=fake_clock)
    agent.loops = []
    encode, calls = agent.encode, []

    def encode_failing_once(batch: SourceBatch, now: float) -> list[OutboundMessage]:
        calls.append(now)
        if len(calls) == 1:
            raise RuntimeError("a bug between sampling and buffering")
        return encode(batch, now)

    monkeypatch.setattr(agent, "encode", encode_failing_once)
    stop = _SteppedStop(agent, sink, fake_clock, ticks=3)
    agent.run(stop)
    assert _seqs(sink.delivered) == [1, 2]  # sample 0 was lost with its tick; the loop went on
    assert agent.health()["tick_errors"] == {"tick": 1}
    assert any("a bug between sampling and buffering" in r.getMessage() and r.exc_info for r in caplog.records)
