"""A source that hangs (NVML on a GPU off the bus) holds neither the other sources nor shutdown.

Each source samples in its own thread (``collector.source_guard``). These tests block a fake
source on an event, step the agent's clock by hand, and release it; nothing sleeps.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from api.commands.agent import compose_agent
from collector.agent import Agent
from collector.agent_settings import AgentSettings
from collector.source_guard import GuardedSource
from collector.sources.base import SourceBatch, SourceError
from collector.wire import TOPIC_EVENTS, decode_event, decode_telemetry
from fake_nvml import FakeGpu, FakeNvml
from fakes import CountingSource, FakeClock
from test_agent import FakeSink
from tests.helpers import wait_until


class HangingSource:
    """Samples like NVML on a lost GPU: the first call blocks until ``release`` is set."""

    name = "nvml"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.calls: list[float] = []
        self.closed = False

    def sample(self, now: float) -> SourceBatch:
        self.calls.append(now)
        self.entered.set()
        self.release.wait()
        return SourceBatch(gpu=[{"ts": now, "node": "gpu-node-001", "gpu": 7, "util_gpu": 0.0, "seq": -1}],
                           events=[{"ts": now, "node": "gpu-node-001", "gpu": 7, "source": "nvml", "kind": "xid",
                                    "code": 79, "message": "GPU has fallen off the bus"}])

    def close(self) -> None:
        self.closed = True


def _agent(clock: FakeClock, *sources, **kw) -> tuple[Agent, FakeSink]:
    settings = dict(node="gpu-node-001", interval_s=10.0, health_file=None, source_wait_s=0.05, source_stall_s=30.0)
    sink = FakeSink()
    return Agent(AgentSettings(**{**settings, **kw}), list(sources), sink, clock=clock), sink


def _gpu_rows(sink: FakeSink) -> list[tuple[float, int]]:
    out = []
    for m in sink.delivered:
        if m.topic != TOPIC_EVENTS:
            t = decode_telemetry(m.value)
            out += list(zip(t.gpu["ts"], t.gpu["seq"]))
    return out


@pytest.fixture()
def hanging() -> HangingSource:
    src = HangingSource()
    yield src
    src.release.set()  # never leave a test's thread blocked


def test_a_hanging_source_holds_neither_the_other_sources_nor_the_next_ticks(fake_clock: FakeClock,
                                                                           hanging: HangingSource) -> None:
    counting = CountingSource()
    agent, sink = _agent(fake_clock, hanging, counting)
    t0 = fake_clock.time()
    for _ in range(3):
        agent.tick()
        agent.publish_pending()
        fake_clock.advance(10)
    assert _gpu_rows(sink) == [(t0, 0), (t0 + 10, 1), (t0 + 20, 2)]
    assert hanging.calls == [t0]  # asked once: a call in flight is never stacked behind
    health = agent.health()
    assert health["sources_running_s"] == {"nvml": 30.0}
    assert health["source_errors"] == {}  # running 20 s at the last tick: late, not yet stalled


def test_a_call_past_source_stall_s_is_reported_once_and_its_late_result_is_published(
        fake_clock: FakeClock, hanging: HangingSource, caplog: pytest.LogCaptureFixture) -> None:
    agent, sink = _agent(fake_clock, hanging, CountingSource())
    t0 = fake_clock.time()
    agent.tick()
    fake_clock.advance(40)
    with caplog.at_level(logging.WARNING, logger="collector.agent"):
        agent.tick()
        agent.tick()
    assert agent.health()["source_errors"] == {"nvml": 1}
    assert sum("has not returned for 40 s" in r.getMessage() for r in caplog.records) == 1

    hanging.release.set()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="collector.agent"):
        agent.tick()
    while agent.publish_pending() and len(agent.buffer):
        pass
    # the GPU row keeps the time it was sampled for; the XID it read is not lost
    assert (t0, -1) in _gpu_rows(sink)
    xids = [decode_event(m.value) for m in sink.delivered if m.topic == TOPIC_EVENTS]
    assert [(e["code"], e["ts"]) for e in xids] == [(79, t0)]
    assert any("returned after 40 s" in r.getMessage() for r in caplog.records)
    assert agent.health()["sources_running_s"] == {}

    agent.tick()  # sampled again, normally, and nothing more is counted
    assert hanging.calls == [t0, t0 + 40]
    assert agent.health()["source_errors"] == {"nvml": 1}


def test_a_bmc_source_is_stalled_only_once_its_next_sample_is_due(fake_clock: FakeClock,
                                                                   hanging: HangingSource) -> None:
    """A Redfish walk of dozens of chassis takes longer than source_stall_s: slow, not stuck, until the BMC's
    next sample (bmc_interval_s) is due."""
    hanging.name = "redfish"
    agent, _ = _agent(fake_clock, hanging, bmc_interval_s=60.0)
    agent.tick()
    fake_clock.advance(40)
    agent.tick()
    assert agent.health()["source_errors"] == {} and agent.health()["sources_running_s"] == {"redfish": 40.0}
    fake_clock.advance(20)
    agent.tick()
    assert agent.health()["source_errors"] == {"redfish": 1}


def test_shutdown_closes_the_other_sources_without_waiting_for_a_hung_one(fake_clock: FakeClock,
                                                                         hanging: HangingSource) -> None:
    counting = CountingSource()
    agent, sink = _agent(fake_clock, hanging, counting, shutdown_flush_timeout_s=0.0)
    agent.tick()
    assert hanging.entered.wait(5)
    started = time.monotonic()
    agent.shutdown()
    assert time.monotonic() - started < 2.0  # not the 5 s a close waits for a source that answers
    assert counting.closed and sink.closed
    assert not hanging.closed  # never called beside a call that has not returned


def test_shutdown_publishes_a_batch_that_returned_after_the_last_tick(fake_clock: FakeClock,
                                                                      hanging: HangingSource) -> None:
    agent, sink = _agent(fake_clock, hanging)
    t0 = fake_clock.time()
    agent.tick()
    hanging.release.set()
    wait_until(lambda: agent._guards[0]._thread.returned, timeout_s=5)
    agent.shutdown()
    assert _gpu_rows(sink) == [(t0, -1)]
    assert hanging.closed


def test_once_waits_source_stall_s_then_counts_the_source_that_did_not_return(fake_clock: FakeClock,
                                                                             hanging: HangingSource) -> None:
    agent, sink = _agent(fake_clock, hanging, CountingSource(), source_stall_s=0.2)
    assert agent.run_once()
    assert _gpu_rows(sink) == [(fake_clock.time(), 0)]
    assert agent.health()["source_errors"] == {"nvml": 1}


def test_a_source_error_raised_in_its_thread_reaches_the_tick_and_the_next_call_goes_out() -> None:
    class Flaky:
        name = "dcgm"

        def __init__(self) -> None:
            self.n = 0

        def sample(self, now: float) -> SourceBatch:
            self.n += 1
            if self.n == 1:
                raise ConnectionResetError("exporter went away")
            return SourceBatch(gpu=[{"ts": now}])

        def close(self) -> None:
            pass

    guard = GuardedSource(Flaky())
    assert guard.start(1.0)
    with pytest.raises(ConnectionResetError, match="exporter went away"):
        guard.take(5)
    assert not guard.busy and guard.start(2.0)
    assert guard.take(5).gpu == [{"ts": 2.0}]
    assert guard.close() and guard.close()  # closing twice is safe


def test_the_tick_waits_at_most_half_an_interval_for_its_sources() -> None:
    agent = Agent(AgentSettings(node="n", interval_s=1.0, health_file=None, source_wait_s=2.0), [], FakeSink())
    assert agent.wait_s == 0.5
    agent = Agent(AgentSettings(node="n", interval_s=10.0, health_file=None), [], FakeSink())
    assert agent.wait_s == 2.0


class HangingInitNvml(FakeNvml):
    """NVML whose init blocks until ``release`` is set (a driver held by a GPU off the bus)."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__(gpus)
        self.release = threading.Event()

    def nvmlInit(self) -> None:
        self.release.wait()
        super().nvmlInit()


def test_an_agent_whose_nvml_hangs_at_start_starts_the_other_sources_and_nvml_joins_when_it_answers(
        tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    kmsg = tmp_path / "kern.log"
    kmsg.write_text("")
    nvml = HangingInitNvml([FakeGpu(pci_bus_id="00000000:18:00.0")])
    settings = AgentSettings(node="gpu-node-001", sources="nvml,kmsg", kmsg_file=kmsg, health_file=None,
                             source_wait_s=0.05, source_stall_s=0.1)
    sink = FakeSink()
    try:
        with caplog.at_level(logging.WARNING, logger="gpuops.agent"):
            agent = compose_agent(settings, nvml=nvml, sink=sink)
        assert "NVML has not started within 0.1 s" in caplog.text
        with kmsg.open("a") as f:
            f.write("[ 100.0] NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=x, GPU has fallen off the bus.\n")
        agent.tick()
        agent.publish_pending()
        xids = [decode_event(m.value) for m in sink.delivered if m.topic == TOPIC_EVENTS]
        assert [e["code"] for e in xids] == [79]  # the kernel log went out while NVML was still starting
        assert _gpu_rows(sink) == [] and "nvml" in agent.health()["sources_running_s"]
    finally:
        nvml.release.set()
    wait_until(lambda: agent._guards[0]._thread.returned, timeout_s=5)
    agent.tick()
    agent.tick()
    agent.publish_pending()
    assert {m.topic for m in sink.delivered} == {TOPIC_EVENTS, agent.settings.telemetry_topic}
    rows = [decode_telemetry(m.value).gpu for m in sink.delivered if m.topic != TOPIC_EVENTS]
    assert [r["gpu"] for r in rows] == [[0], [0]]  # NVML joined: a GPU row from each tick since
    agent.close()


def test_nvml_that_fails_to_start_after_the_wait_fails_its_samples_with_the_reason() -> None:
    from collector.source_guard import start_bounded

    release = threading.Event()

    def build():
        release.wait()
        raise RuntimeError("NVML_ERROR_DRIVER_NOT_LOADED")

    done, source = start_bounded("nvml", build, 0.01)
    assert not done
    release.set()
    for _ in range(2):
        with pytest.raises(SourceError, match="nvml did not start: RuntimeError: NVML_ERROR_DRIVER_NOT_LOADED"):
            source.sample(1.0)
    source.close()


def test_a_late_started_source_that_was_never_sampled_is_still_closed() -> None:
    """The agent stopped before its first tick reached NVML: the NVML that did start is shut down."""
    from collector.source_guard import start_bounded

    release = threading.Event()
    built = HangingSource()
    built.release.set()

    def build():
        release.wait()
        return built

    done, source = start_bounded("nvml", build, 0.01)
    assert not done
    source.close()  # the start is still running: nothing to close yet, and close does not wait for it
    assert not built.closed
    release.set()
    wait_until(lambda: source._starting.returned, timeout_s=5)
    source.close()
    assert built.closed and built.calls == []
