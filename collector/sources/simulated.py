"""The fleet simulator as a live source, for demos and end-to-end tests.

The agent's node is played by one simulated node (same dynamics, incidents and
confounders as ``gpuops simulate``, seeded). Each ``sample(now)`` returns the next
tick of that node's GPU and port samples and the events of that tick, re-stamped to
*now*; rendering happens a chunk of ticks at a time, so a tick costs a slice.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

from collector.simulator import SimChunk, SimConfig, Simulator

from .base import SourceBatch, SourceOptions


class SimulatedSource:
    """One simulated GPU node, tick by tick."""

    name = "simulated"

    def __init__(self, node: str, *, seed: int = 0, interval_s: float = 10.0, hours: float = 24 * 365,
                 rate_multiplier: float = 150.0, gpus: int = 8, ports: int = 8):
        self.cfg = SimConfig(nodes=1, names=(node,), gpus_per_node=gpus, ports_per_node=ports, hours=hours,
                             interval_s=interval_s, seed=seed, rate_multiplier=rate_multiplier)
        self.sim = Simulator(self.cfg)
        self._chunks: Iterator[SimChunk] = self.sim.chunks()
        self._rows: list[tuple[list[dict], list[dict], list[dict]]] = []
        self.ticks = 0

    @classmethod
    def from_options(cls, options: SourceOptions) -> "SimulatedSource":
        seed = int(os.environ.get("GPUOPS_SIM_SEED", "0"))
        return cls(options.node, seed=seed)

    def _refill(self) -> None:
        ch = next(self._chunks)
        gpu, net = ch.gpu.to_pylist(), ch.net.to_pylist()
        g, p = self.cfg.gpus_per_node, self.cfg.ports_per_node
        ticks = len(gpu) // g
        t0 = self.cfg.start_ts + self.ticks * self.cfg.interval_s
        for k in range(ticks):
            lo, hi = t0 + k * self.cfg.interval_s, t0 + (k + 1) * self.cfg.interval_s
            ev = [e for e in ch.events if lo <= e["ts"] < hi]
            self._rows.append((gpu[k * g:(k + 1) * g], net[k * p:(k + 1) * p], ev))
        self._rows.reverse()

    def sample(self, now: float) -> SourceBatch:
        if not self._rows:
            self._refill()
        gpu, net, events = self._rows.pop()
        self.ticks += 1
        restamp: Any = lambda rows: [r | {"ts": now} for r in rows]  # noqa: E731
        return SourceBatch(restamp(gpu), restamp(net), restamp(events))

    def close(self) -> None:
        self._rows.clear()
