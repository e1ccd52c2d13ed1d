"""The agent's batching: N ticks of rows in one telemetry message, events at once, a partial
batch published on shutdown, and a batch span the scoring workers' lateness allows."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from collector.agent import Agent
from collector.agent_settings import AgentSettings
from collector.sources.base import SourceBatch
from collector.wire import TOPIC_EVENTS, TOPIC_TELEMETRY, decode_telemetry, is_arrow
from fakes import CountingSource, FakeClock
from test_agent import FakeSink


def _settings(**kw) -> AgentSettings:
    base = dict(node="gpu-node-001", interval_s=1.0, health_file=None)
    return AgentSettings(**{**base, **kw})


class _WithEvents(CountingSource):
    """A counting source that also reports one event on the ticks listed in *event_ticks*."""

    def __init__(self, event_ticks: set[int]) -> None:
        super().__init__()
        self.event_ticks = event_ticks

    def sample(self, now: float) -> SourceBatch:
        k = self.n
        batch = super().sample(now)
        if k in self.event_ticks:
            batch.events.append({"ts": now, "node": self.node, "source": "kmsg", "kind": "xid", "code": 79,
                                 "gpu": 0, "message": f"tick {k}"})
        return batch


def _run(agent: Agent, clock: FakeClock, ticks: int) -> None:
    for _ in range(ticks):
        agent.tick()
        assert agent.publish_pending()
        clock.advance(agent.settings.interval_s)


@pytest.mark.parametrize("wire_format", ["json", "arrow"])
def test_four_ticks_of_rows_travel_as_one_message_each_row_with_its_own_time(fake_clock: FakeClock,
                                                                             wire_format: str) -> None:
    sink = FakeSink()
    agent = Agent(_settings(publish_every_ticks=4, wire_format=wire_format), [CountingSource()], sink,
                  clock=fake_clock)
    t0 = fake_clock.t
    _run(agent, fake_clock, 3)
    assert sink.delivered == [] and agent.health()["held_ticks"] == 3
    _run(agent, fake_clock, 5)
    assert len(sink.delivered) == 2 and all(m.topic == TOPIC_TELEMETRY for m in sink.delivered)
    assert all(is_arrow(m.value) == (wire_format == "arrow") for m in sink.delivered)
    first, second = (decode_telemetry(m.value) for m in sink.delivered)
    assert first.gpu["seq"] == [0, 1, 2, 3] and second.gpu["seq"] == [4, 5, 6, 7]
    assert first.gpu["ts"] == [t0, t0 + 1, t0 + 2, t0 + 3] and first.ts == t0 + 3
    assert agent.ticks == 8 and agent.health()["held_ticks"] == 0


def test_events_are_not_held_for_the_batch(fake_clock: FakeClock) -> None:
    sink = FakeSink()
    agent = Agent(_settings(publish_every_ticks=5), [_WithEvents({1})], sink, clock=fake_clock)
    _run(agent, fake_clock, 2)
    assert [m.topic for m in sink.delivered] == [TOPIC_EVENTS]
    _run(agent, fake_clock, 3)
    assert [m.topic for m in sink.delivered] == [TOPIC_EVENTS, TOPIC_TELEMETRY]


def test_shutdown_publishes_the_rows_of_a_partial_batch(fake_clock: FakeClock) -> None:
    sink = FakeSink()
    agent = Agent(_settings(publish_every_ticks=10), [CountingSource()], sink, clock=fake_clock)
    _run(agent, fake_clock, 3)
    assert sink.delivered == []
    agent.shutdown()
    assert [decode_telemetry(m.value).gpu["seq"] for m in sink.delivered] == [[0, 1, 2]] and sink.closed


def test_run_once_publishes_its_single_tick_even_when_batching(fake_clock: FakeClock) -> None:
    sink = FakeSink()
    agent = Agent(_settings(publish_every_ticks=10), [CountingSource()], sink, clock=fake_clock)
    assert agent.run_once()
    assert [decode_telemetry(m.value).gpu["seq"] for m in sink.delivered] == [[0]]


def test_one_tick_per_message_is_the_default_and_unchanged(fake_clock: FakeClock) -> None:
    sink = FakeSink()
    agent = Agent(_settings(), [CountingSource()], sink, clock=fake_clock)
    assert agent.settings.publish_every_ticks == 1
    _run(agent, fake_clock, 3)
    assert [decode_telemetry(m.value).gpu["seq"] for m in sink.delivered] == [[0], [1], [2]]


def test_a_batch_spanning_the_scoring_lateness_is_refused_with_what_to_change() -> None:
    with pytest.raises(ValidationError, match="publish_every_ticks=3 x interval_s=10 spans 30 s.*allowed lateness"):
        _settings(interval_s=10.0, publish_every_ticks=3)
    assert _settings(interval_s=10.0, publish_every_ticks=2).batch_span_s == 20.0
    assert _settings(interval_s=10.0, publish_every_ticks=3, scoring_lateness_s=60).batch_span_s == 30.0
    assert _settings(interval_s=60.0).publish_every_ticks == 1  # no batching: nothing to check


def test_batching_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUOPS_AGENT_PUBLISH_EVERY_TICKS", "4")
    assert AgentSettings(node="gpu-node-001", interval_s=1.0, health_file=None).publish_every_ticks == 4
