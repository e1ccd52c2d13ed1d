"""The live simulated fleet's clock: sped up, but never ahead of what it has published.

A fake monotonic clock that moves only when the fleet waits (``FakeStop.wait``) or when a
test says so (a stall in ``produce``), so every assertion is about the fleet's own logic.
"""

from __future__ import annotations

import logging

import pytest

from collector.simulator import SimConfig
from collector.simulator.live import SPEED_WINDOW_S, LiveFleet

NODES = ("gpu-a", "gpu-b")
START = 1_767_225_600.0


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeStop:
    """A stop event whose waits move the fake clock instead of sleeping."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self._set = clock, False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True

    def wait(self, timeout: float) -> bool:
        self.clock.t += timeout
        return self._set


def fleet_cfg(hours: float = 1.0) -> SimConfig:
    return SimConfig(nodes=len(NODES), names=NODES, hours=hours, seed=3, rate_multiplier=0.0,
                     app_xid_per_node_day=0.0, reboot_per_node_day=0.0, congestion_per_day=0.0,
                     bmc=False, start_ts=START)


class Recorder:
    """produce(): counts messages and reads the fleet's clock at each one."""

    def __init__(self) -> None:
        self.fleet: LiveFleet | None = None
        self.seen: list[tuple[float, float]] = []   # (fleet.now(), last published tick) per message
        self.produced = 0
        self.on_message = lambda n: None

    def __call__(self, topic: str, key: str, value: bytes) -> None:
        assert self.fleet is not None
        self.produced += 1
        self.on_message(self.produced)
        self.seen.append((self.fleet.now(), self.fleet.sim_ts))


def make(speedup: float = 60.0, **kw):  # noqa: ANN201
    clock, rec = FakeClock(), Recorder()
    fleet = LiveFleet(fleet_cfg(), rec, speedup=speedup, monotonic=clock, **kw)
    rec.fleet = fleet
    return fleet, clock, rec, FakeStop(clock)


def test_the_clock_reads_start_until_the_fleet_runs_and_then_moves_at_the_speedup() -> None:
    fleet, clock, rec, stop = make(speedup=60.0)
    clock.t += 500.0
    assert fleet.now() == START
    fleet.run(stop, episodes=1)
    step = fleet.cfg.interval_s
    assert fleet.ticks == int(3600.0 / step) and fleet.sim_ts == START + 3600.0
    assert rec.produced == fleet.messages == fleet.ticks * len(NODES)
    assert fleet.effective_speedup == pytest.approx(60.0, rel=0.02)


def test_a_stall_holds_telemetry_time_at_the_next_tick_and_it_resumes_without_a_jump() -> None:
    fleet, clock, rec, stop = make(speedup=60.0)
    step = fleet.cfg.interval_s

    def stall(n: int) -> None:       # the 21st message: 5 wall minutes go by inside produce
        if n == 21:
            clock.t += 300.0
    rec.on_message = stall
    fleet.run(stop, episodes=1)
    clocks = [c for c, _ in rec.seen]
    assert clocks == sorted(clocks), "telemetry time went backwards"
    assert all(c <= published + step + 1e-6 for c, published in rec.seen), \
        "the clock ran more than one tick ahead of what was published"
    # 300 wall-s at 60x would be 18,000 telemetry-s: none of it shows, the episode ends on time
    assert fleet.now() == pytest.approx(START + 3600.0, abs=step)
    assert fleet.ticks == int(3600.0 / step)


def test_a_slow_reader_holds_the_fleet_within_its_bound_and_is_reported_once(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    rec = Recorder()
    read_per_s = 2.0                 # the reader: 2 messages a wall second; the fleet brings 12 at 60x
    t0 = clock.t
    unread_at_publish: list[int] = []

    def unread() -> int:
        return max(0, rec.produced - int((clock.t - t0) * read_per_s))
    fleet = LiveFleet(fleet_cfg(), rec, speedup=60.0, monotonic=clock, backlog=unread, max_backlog_ticks=3.0)
    rec.fleet = fleet
    rec.on_message = lambda n: unread_at_publish.append(unread()) if (n - 1) % len(NODES) == 0 else None
    step = fleet.cfg.interval_s
    with caplog.at_level(logging.WARNING, logger="collector.simulator.live"):
        fleet.run(FakeStop(clock), episodes=1)
    bound = 3.0 * len(NODES)
    # before each tick's first message at most `bound` were unread (then this tick's own first one)
    assert max(unread_at_publish) <= bound + 1
    # telemetry time kept to the reader's pace, not the speedup asked: 2 msg/s of 2 per 10 s tick = 10x
    assert fleet.effective_speedup == pytest.approx(10.0, rel=0.1)
    slow = [r for r in caplog.records if "cannot keep up" in r.getMessage()]
    assert len(slow) == 1 and "10x, not the 60x asked" in slow[0].getMessage()
    # and the clock still never ran ahead of the fleet
    assert all(c <= published + step + 1e-6 for c, published in rec.seen)


def test_a_reader_that_keeps_up_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    fleet, clock, rec, stop = make(speedup=60.0, backlog=lambda: 0)
    with caplog.at_level(logging.WARNING, logger="collector.simulator.live"):
        fleet.run(stop, episodes=1)
    assert fleet.effective_speedup == pytest.approx(60.0, rel=0.02)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_reader_stuck_for_long_is_logged_and_stop_still_ends_the_run(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    rec = Recorder()
    stop = FakeStop(clock)
    started = clock.t

    def stuck() -> int:              # never drains; the operator stops the service after 2 wall minutes
        if clock.t - started > 120.0:
            stop.set()
        return 10_000
    fleet = LiveFleet(fleet_cfg(), rec, speedup=60.0, monotonic=clock, backlog=stuck)
    rec.fleet = fleet
    with caplog.at_level(logging.WARNING, logger="collector.simulator.live"):
        fleet.run(stop)
    assert fleet.ticks == 0 and rec.produced == 0
    assert fleet.now() <= START + fleet.cfg.interval_s
    waits = [r for r in caplog.records if "waiting for the scorer" in r.getMessage()]
    assert len(waits) == 1 and "10000 messages unread" in waits[0].getMessage()


def test_the_speed_is_judged_only_over_a_full_window() -> None:
    fleet, clock, rec, stop = make(speedup=60.0)
    fleet.cfg = fleet_cfg(hours=SPEED_WINDOW_S * 60.0 / 2 / 3600)   # half a window of wall time
    fleet.sim = type(fleet.sim)(fleet.cfg)
    fleet.run(stop, episodes=1)
    assert fleet.ticks > 0 and fleet.effective_speedup is None


@pytest.mark.parametrize("bad", [{"speedup": 0.0}, {"max_backlog_ticks": 0.0}])
def test_bad_settings_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        LiveFleet(fleet_cfg(), lambda *a: None, **bad)
