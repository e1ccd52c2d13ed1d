"""The simulated fleet as a live telemetry source: every node's messages, tick by tick, sped up.

``gpuops serve`` with no config feeds its in-process bus from a :class:`LiveFleet`, and the
end-to-end tests feed real Kafka from one: each simulated tick becomes one telemetry
message per node (the agent's wire format, :mod:`collector.wire`) and one message per event,
keyed by node, produced through a ``produce(topic, key, value)`` callable. Telemetry time
runs ``speedup`` times faster than the wall clock from ``cfg.start_ts``; :meth:`LiveFleet.now`
is that clock, which the embedded service gives its engine so that cooldowns and freshness
read the same time as the telemetry.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any, Callable, Iterator

from collector.wire import (TOPIC_EVENTS, TOPIC_TELEMETRY, TelemetryMessage, encode_event, encode_telemetry,
                            rows_to_columns)

from . import SimConfig, Simulator

log = logging.getLogger(__name__)

#: produce(topic, key, value): InProcessBus.produce, or a thin wrapper over a Kafka producer
Produce = Callable[[str, str, bytes], None]


class LiveFleet:
    """Plays a :class:`SimConfig` fleet into *produce*, ``speedup`` x real time (see module docstring)."""

    def __init__(self, cfg: SimConfig, produce: Produce, *, speedup: float = 60.0,
                 monotonic: Callable[[], float] = time.monotonic,
                 telemetry_topic: str = TOPIC_TELEMETRY, events_topic: str = TOPIC_EVENTS) -> None:
        if speedup <= 0:
            raise ValueError(f"speedup must be > 0, got {speedup!r}")
        self.cfg = cfg
        self.sim = Simulator(cfg)
        self.produce = produce
        self.speedup = speedup
        self.topics = (telemetry_topic, events_topic)
        self._monotonic = monotonic
        self._t0: float | None = None
        self.ticks = 0
        self.messages = 0
        self.sim_ts = cfg.start_ts

    def now(self) -> float:
        """Telemetry time now: ``start_ts`` + wall seconds since start x ``speedup``."""
        if self._t0 is None:
            return self.cfg.start_ts
        return self.cfg.start_ts + (self._monotonic() - self._t0) * self.speedup

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
                     events: list[dict]) -> None:
        """One tick's messages: one telemetry message per node, then its events."""
        tel, evt = self.topics
        for node in sorted(set(gpu) | set(net)):
            msg = TelemetryMessage(node=node, ts=ts, gpu=rows_to_columns(gpu.get(node, [])),
                                   net=rows_to_columns(net.get(node, [])))
            self.produce(tel, node, encode_telemetry(msg))
            self.messages += 1
        for e in events:
            self.produce(evt, str(e["node"]), encode_event(e))
            self.messages += 1
        self.ticks += 1
        self.sim_ts = ts

    def run(self, stop: threading.Event, episodes: int | None = None) -> None:
        """Publish ticks as telemetry time reaches them, until *stop* is set.

        When the plan (``cfg.hours``) ends, the next one follows on with the next seed —
        planning a short episode is quick, a year of fleet life is not — *episodes* times
        (None: for ever).
        """
        self._t0 = self._monotonic()
        done = 0
        while not stop.is_set() and (episodes is None or done < episodes):
            for ts, gpu, net, events in self.ticks_iter():
                while not stop.is_set() and self.now() < ts:
                    stop.wait(min(0.5, max(0.001, (ts - self.now()) / self.speedup)))
                if stop.is_set():
                    return
                self.publish_tick(ts, gpu, net, events)
            done += 1
            log.info("simulated fleet: episode %d ended after %d ticks; the next one follows", done, self.ticks)
            self.cfg = replace(self.cfg, seed=self.cfg.seed + 1, start_ts=self.cfg.end_ts)
            self.sim = Simulator(self.cfg)
