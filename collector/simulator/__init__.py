"""Fleet simulator: realistic GPU-cluster telemetry with labelled failures.

``simulate_recording(cfg, out_dir)`` writes a recording (spec/recording.md) with
``incidents.jsonl`` ground truth; :class:`Simulator` also serves the same data chunk
by chunk for the live ``simulated`` source. See docs/simulator.md for the fault
models and their sources.

The home world (``SimConfig.world is None``) is one H100 fleet at one interval with a
few confounders. A randomized world (``world_config(cfg, draw_world(seed, ranges,
nodes))``) draws generations, workloads, sampling defects, benign background and fault
shapes from :mod:`.ranges`, and is recorded under ``"world"`` in manifest.json.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from collector.recording import Manifest, RecordingWriter
from collector.schema import FaultClass, RecordType

from .config import SimConfig
from .generate import Renderer, SimChunk
from .plan import FleetPlan, Incident, plan_fleet
from .ranges import RANGES, SHIFTS, TRAINING, WorldRanges, ranges_by_name
from .world import World, draw_world, world_config

__all__ = ["SimConfig", "Simulator", "SimSummary", "simulate_recording", "FleetPlan", "Incident", "SimChunk",
           "World", "WorldRanges", "draw_world", "world_config", "ranges_by_name", "RANGES", "SHIFTS", "TRAINING"]


class Simulator:
    """A planned fleet that renders into chunks of samples (deterministic per seed)."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.plan = plan_fleet(cfg)

    def chunks(self) -> Iterator[SimChunk]:
        return Renderer(self.plan).chunks()

    def incidents(self) -> list[dict[str, Any]]:
        return [i.label(self.cfg, self.plan.node_names) for i in self.plan.incidents]

    def manifest(self) -> Manifest:
        c = self.cfg
        extra: dict[str, Any] = {"simulator": {"seed": c.seed, "ports_per_node": c.ports_per_node,
                                               "rate_multiplier": c.rate_multiplier, "bmc": c.bmc,
                                               "bmc_sensor_period_s": c.bmc_sensor_period_s}}
        interval, source = c.interval_s, f"gpuops simulator seed={c.seed} rate_multiplier={c.rate_multiplier}"
        if c.world is not None:
            interval = c.world.typical_interval_s
            source += f" world={c.world.ranges.name}"
            extra["world"] = c.world.to_json()
        return Manifest(start=c.start_ts, end=c.end_ts, interval_s=interval, nodes=self.plan.node_names,
                        gpus_per_node=c.gpus_per_node, source=source, extra=extra)


@dataclass
class SimSummary:
    """What happened in a simulated fleet, for people and for benchmarks."""

    gpu_samples: int = 0
    net_samples: int = 0
    events: int = 0
    incidents: list[dict[str, Any]] = field(default_factory=list)

    def by_fault(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for f in FaultClass:
            rows = [i for i in self.incidents if i["fault"] == f.value]
            out[f.value] = {"incidents": len(rows), "predictable": sum(bool(i["predictable"]) for i in rows)}
        return out

    def actions(self) -> Counter:
        return Counter(i["action"] for i in self.incidents)


def simulate_recording(cfg: SimConfig, out: str | Path, *, progress: Callable[[int, int], None] | None = None,
                       gzip_jsonl: bool = False) -> SimSummary:
    """Simulate *cfg* and write the recording to *out*; returns a summary.

    *progress* is called with (ticks done, ticks total) after each chunk.
    """
    sim = Simulator(cfg)
    summary = SimSummary(incidents=sim.incidents())
    done = 0
    with RecordingWriter(out, sim.manifest(), gzip_jsonl=gzip_jsonl) as w:
        for ch in sim.chunks():
            w.write_arrow(RecordType.GPU, ch.gpu)
            w.write_arrow(RecordType.NET, ch.net)
            w.write_events(ch.events)
            summary.gpu_samples += ch.gpu.num_rows
            summary.net_samples += ch.net.num_rows
            summary.events += len(ch.events)
            done = min(done + cfg.chunk_ticks, cfg.n_ticks)
            if progress:
                progress(done, cfg.n_ticks)
        w.write_incidents(summary.incidents)
    return summary
