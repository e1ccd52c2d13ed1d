"""The simulated fleet as a live telemetry source: every node's messages, tick by tick, sped up.

``gpuops serve`` with no config feeds its in-process bus from a :class:`LiveFleet`, and the
end-to-end tests feed real Kafka from one: each simulated tick becomes one telemetry
message per node (the agent's wire format, :mod:`collector.wire`) and one message per event,
keyed by node, produced through a ``produce(topic, key, value)`` callable.

Telemetry time runs ``speedup`` times faster than the wall clock from ``cfg.start_ts``, but
never ahead of the fleet itself: :meth:`LiveFleet.now` is that clock, which the embedded
service gives its engine so that cooldowns and freshness read the same time as the telemetry,
and it stops at the next tick still to be published. Simulating a chunk of ticks, or a
scorer that cannot keep up, therefore pauses telemetry time instead of letting it run ahead
of what was scored (a drain decided on a tick would otherwise reach an engine whose clock
already reads it as stale). With a *backlog* callable (messages not yet read downstream) the
fleet also waits before publishing while more than ``max_backlog_ticks`` ticks' worth are
unread. When the fleet runs under ~80 % of the speedup asked, it says so once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from dataclasses import replace
from typing import Any, Callable, Iterator

from collector.wire import (TOPIC_EVENTS, TOPIC_TELEMETRY, TelemetryMessage, encode_event, encode_telemetry,
                            rows_to_columns)

from . import SimConfig, Simulator

log = logging.getLogger(__name__)

#: produce(topic, key, value): InProcessBus.produce, or a thin wrapper over a Kafka producer
Produce = Callable[[str, str, bytes], None]
#: messages produced but not yet read by whoever consumes them (0 when caught up)
Backlog = Callable[[], int]

#: the effective speedup is measured over this much wall time before it is judged
SPEED_WINDOW_S = 30.0
#: under this share of the speedup asked, the fleet warns (once)
SLOW_SHARE = 0.8
#: a back-pressure wait longer than this (wall seconds) is logged, once per wait
STALL_LOG_S = 30.0


class LiveFleet:
    """Plays a :class:`SimConfig` fleet into *produce*, ``speedup`` x real time (see module docstring)."""

    def __init__(self, cfg: SimConfig, produce: Produce, *, speedup: float = 60.0,
                 monotonic: Callable[[], float] = time.monotonic,
                 telemetry_topic: str = TOPIC_TELEMETRY, events_topic: str = TOPIC_EVENTS,
                 backlog: Backlog | None = None, max_backlog_ticks: float = 3.0) -> None:
        if speedup <= 0:
            raise ValueError(f"speedup must be > 0, got {speedup!r}")
        if max_backlog_ticks <= 0:
            raise ValueError(f"max_backlog_ticks must be > 0, got {max_backlog_ticks!r}")
        self.cfg = cfg
        self.sim = Simulator(cfg)
        self.produce = produce
        self.speedup = speedup
        self.topics = (telemetry_topic, events_topic)
        self.backlog = backlog
        self.max_backlog_ticks = max_backlog_ticks
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._base_ts = cfg.start_ts           # telemetry time at wall time _base_mono
        self._base_mono: float | None = None   # None: not started, the clock reads start_ts
        self._ceiling = cfg.start_ts           # the next tick to publish: the clock stops there
        self._speed: deque[tuple[float, float]] = deque()   # (wall, telemetry) at recent publishes
        self._warned_slow = False
        self.effective_speedup: float | None = None
        self.ticks = 0
        self.messages = 0
        self.sim_ts = cfg.start_ts

    def now(self) -> float:
        """Telemetry time now: ``speedup`` x wall time since start, never past the next tick to publish."""
        with self._lock:
            return self._read(self._monotonic())

    def _read(self, mono: float) -> float:
        if self._base_mono is None:
            return self._base_ts
        t = self._base_ts + (mono - self._base_mono) * self.speedup
        if t >= self._ceiling:   # held: restart from here, so that it resumes without a jump
            self._base_ts, self._base_mono = self._ceiling, mono
            return self._ceiling
        return t

    def _allow(self, ts: float) -> None:
        """Let the clock run up to *ts* (the next tick to publish), from where it stands now."""
        with self._lock:
            mono = self._monotonic()
            if self._base_mono is None:
                self._base_ts, self._base_mono = self.cfg.start_ts, mono
            self._read(mono)
            self._ceiling = max(self._ceiling, ts)

    def incidents(self) -> list[dict[str, Any]]:
        """The simulator's ground truth (what faults will happen, when)."""
        return self.sim.incidents()

    def ticks_iter(self) -> Iterator[tuple[float, dict[str, list[dict]], dict[str, list[dict]], list[dict]]]:
        """(end of tick, gpu rows by node, port rows by node, events) per simulated tick, in order."""
        t0, step = self.cfg.start_ts, self.cfg.interval_s

        def tick(ts: float) -> int:      # samples carry jittered times; group them by tick
            return int((ts - t0) // step)

        for ch in self.sim.chunks():
            gpu: dict[int, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
            net: dict[int, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
            for r in ch.gpu.to_pylist():
                gpu[tick(r["ts"])][r["node"]].append(r)
            for r in ch.net.to_pylist():
                net[tick(r["ts"])][r["node"]].append(r)
            events: dict[int, list[dict]] = defaultdict(list)
            for e in ch.events:
                events[tick(e["ts"])].append(e)
            for k in sorted(gpu):
                yield t0 + (k + 1) * step, gpu[k], net.get(k, {}), events.get(k, [])

    def publish_tick(self, ts: float, gpu: dict[str, list[dict]], net: dict[str, list[dict]],
                     events: list[dict]) -> int:
        """One tick's messages: one telemetry message per node, then its events. Returns how many."""
        tel, evt = self.topics
        n = 0
        for node in sorted(set(gpu) | set(net)):
            msg = TelemetryMessage(node=node, ts=ts, gpu=rows_to_columns(gpu.get(node, [])),
                                   net=rows_to_columns(net.get(node, [])))
            self.produce(tel, node, encode_telemetry(msg))
            n += 1
        for e in events:
            self.produce(evt, str(e["node"]), encode_event(e))
            n += 1
        self.messages += n
        self.ticks += 1
        self.sim_ts = ts
        self._measure(ts)
        return n

    def _measure(self, ts: float) -> None:
        """Telemetry seconds per wall second over the last ~SPEED_WINDOW_S; warn once when slow."""
        mono = self._monotonic()
        w = self._speed
        w.append((mono, ts))
        while len(w) > 2 and mono - w[1][0] >= SPEED_WINDOW_S:
            w.popleft()
        span = mono - w[0][0]
        if span < SPEED_WINDOW_S:
            return
        self.effective_speedup = (ts - w[0][1]) / span
        if not self._warned_slow and self.effective_speedup < SLOW_SHARE * self.speedup:
            self._warned_slow = True
            log.warning("simulated fleet: telemetry time runs at %.0fx, not the %.0fx asked: this machine (or "
                        "the scorer) cannot keep up, so the fleet's clock waits for it; lower simulate.speedup "
                        "for the speed asked", self.effective_speedup, self.speedup)

    def _wait_downstream(self, stop: threading.Event, bound: float) -> None:
        """Before publishing: wait while more than *bound* messages are unread downstream."""
        if self.backlog is None:
            return
        started, logged = self._monotonic(), False
        while not stop.is_set():
            unread = self.backlog()
            if unread <= bound:
                return
            if not logged and self._monotonic() - started >= STALL_LOG_S:
                logged = True
                log.warning("simulated fleet: waiting for the scorer, %d messages unread (bound %d); "
                            "telemetry time is held meanwhile", unread, bound)
            stop.wait(0.05)

    def run(self, stop: threading.Event, episodes: int | None = None) -> None:
        """Publish ticks as telemetry time reaches them, until *stop* is set.

        When the plan (``cfg.hours``) ends, the next one follows on with the next seed —
        planning a short episode is quick, a year of fleet life is not — *episodes* times
        (None: for ever).
        """
        done = 0
        per_tick = float(max(1, self.cfg.nodes))   # messages a tick brings, from the last one published
        while not stop.is_set() and (episodes is None or done < episodes):
            for ts, gpu, net, events in self.ticks_iter():
                self._allow(ts)
                while not stop.is_set() and (behind := ts - self.now()) > 0:
                    stop.wait(min(0.5, max(0.001, behind / self.speedup)))
                self._wait_downstream(stop, self.max_backlog_ticks * per_tick)
                if stop.is_set():
                    return
                per_tick = float(max(1, self.publish_tick(ts, gpu, net, events)))
            done += 1
            log.info("simulated fleet: episode %d ended after %d ticks; the next one follows", done, self.ticks)
            self.cfg = replace(self.cfg, seed=self.cfg.seed + 1, start_ts=self.cfg.end_ts)
            self.sim = Simulator(self.cfg)
