"""What healthy nodes are doing: GPU generation operating points, workload and power events.

A world gives each node a generation (:data:`~.ranges.GENERATIONS`) and a workload:
``training`` (jobs that start and stop, checkpoint dips: the home timelines of
:mod:`.plan`), ``inference`` (always on, load following the day), or ``idle`` (idle
clocks, near-ambient temperature). Hot-but-healthy nodes run within a few °C of the
generation's max operating temperature, so they touch SW thermal slowdown now and
then; rack-wide HW power-brake events last minutes and end on their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ranges import GENERATIONS
from .world import World, log_uniform


@dataclass(frozen=True)
class GpuTraits:
    """Operating points per GPU: scalars in the home world, (G,) arrays in a drawn one."""

    idle_power_w: float | np.ndarray
    busy_power_w: float | np.ndarray
    power_limit_w: float | np.ndarray
    max_sm_clock_mhz: float | np.ndarray
    idle_sm_clock_mhz: float | np.ndarray
    mem_clock_mhz: float | np.ndarray
    fb_busy_mib: float | np.ndarray
    fb_total_mib: float | np.ndarray
    idle_c: float | np.ndarray
    busy_rise_c: float | np.ndarray
    sw_thermal_c: float | np.ndarray   # SW thermal slowdown bit above this
    hw_thermal_c: float | np.ndarray   # HW thermal + HW slowdown above this
    power_cap_frac: float              # share of busy samples at the SW power cap


#: The home world: one H100 fleet as the simulator has always rendered it.
HOME_TRAITS = GpuTraits(65, 560, 700.0, 1980.0, 345.0, 2619.0, 72000, 81559.0, 30, 38, 87, 92, 0.08)


def draw_traits(world: World, rng: np.random.Generator, gpus_per_node: int) -> GpuTraits:
    """Per-GPU operating points from each node's generation (small per-part spread)."""
    gens = np.repeat(np.array(world.generation), gpus_per_node)
    G = gens.size

    def per_gpu(attr: str) -> np.ndarray:
        return np.array([getattr(GENERATIONS[g], attr) for g in gens], np.float32)

    idle_c = np.array([rng.uniform(*GENERATIONS[g].idle_c) for g in gens], np.float32)
    rise = np.array([rng.uniform(*GENERATIONS[g].busy_rise_c) for g in gens], np.float32)
    fb_total = per_gpu("fb_total_mib")
    return GpuTraits(per_gpu("idle_power_w"), per_gpu("busy_power_w") * rng.uniform(0.85, 1.0, G).astype(np.float32),
                     per_gpu("power_limit_w"), per_gpu("max_sm_clock_mhz").astype(np.float64),
                     per_gpu("idle_sm_clock_mhz").astype(np.float64), per_gpu("mem_clock_mhz"),
                     fb_total * rng.uniform(0.5, 0.95, G).astype(np.float32), fb_total, idle_c, rise,
                     per_gpu("max_operating_c"), per_gpu("slowdown_c"), float(world.rates["power_cap_frac"]))


def hot_offsets(world: World, traits: GpuTraits, rng: np.random.Generator, gpus_per_node: int,
                temp_offset: np.ndarray | float = 0.0) -> np.ndarray:
    """°C added to hot-but-healthy nodes: their *hottest* busy GPU (with its own cooling offset)
    sits just past SW thermal slowdown, less than halfway to HW slowdown, so the node touches SW
    slowdown but never reaches HW slowdown, which field data treats as anomalous (field-rates.md
    §2 Throttling)."""
    N = len(world.generation)
    busy = (np.asarray(traits.idle_c) + np.asarray(traits.busy_rise_c) + temp_offset).reshape(N, gpus_per_node).max(axis=1)
    sw = np.asarray(traits.sw_thermal_c).reshape(N, gpus_per_node).min(axis=1)
    hw = np.asarray(traits.hw_thermal_c).reshape(N, gpus_per_node).min(axis=1)
    hottest = sw + rng.uniform(0.2, 1.0, N) * np.maximum((hw - sw) / 2, 0.2)  # past SW slowdown, short of HW
    off = np.clip(hottest - busy, 0, None)
    return np.where(np.array(world.hot_node), off, 0.0).astype(np.float32)


def load_levels(world: World, job: np.ndarray, ckpt: np.ndarray, *, dt: float, start_ts: float,
                rng: np.random.Generator) -> np.ndarray:
    """(T, N) load 0..1: training as the home timelines, inference diurnal, idle zero.

    *job* must already be free of failed periods (a failed node serves nothing).
    """
    T, N = job.shape
    level = np.where(job, np.where(ckpt, 0.2, 1.0), 0.0).astype(np.float32)
    hours = (start_ts + np.arange(T) * dt) / 3600.0
    for n, w in enumerate(world.workload):
        if w == "idle":
            level[:, n] = 0.0
        elif w == "inference":
            peak = rng.uniform(13, 17)   # local afternoon peak, h
            day = 0.5 + 0.5 * np.cos(2 * np.pi * (hours - peak) / 24)
            level[:, n] = np.where(job[:, n], 0.25 + 0.65 * day, 0.0)
    return level


def shared_occupancy(world: World, seed: int, n_ticks: int, dt: float, gpus_per_node: int) -> np.ndarray | None:
    """(T, G) bool: False while a *shared* node's GPU (ranges ``shared_*``) idles, True elsewhere; None
    when the world has no shared node. A shared node's GPUs each alternate their own jobs and idle
    gaps, so its GPUs are not one job's peers. Own random stream: no other draw changes."""
    rng = np.random.default_rng([seed, 0x5AEE])
    training = [n for n, w in enumerate(world.workload) if w == "training"]
    pick = [n for n in training if rng.random() < world.rates["shared_node_frac"]]
    if not pick:
        return None
    occ = np.ones((n_ticks, len(world.workload) * gpus_per_node), bool)
    for n in pick:
        for g in range(n * gpus_per_node, (n + 1) * gpus_per_node):
            t, busy = 0, bool(rng.random() < 0.6)
            while t < n_ticks:
                span_s = log_uniform(rng, world.ranges.shared_job_s if busy else world.ranges.shared_gap_s)
                span = max(1, int(span_s / dt))
                occ[t:t + span, g] = busy
                t, busy = t + span, not busy
    return occ


def serving_timelines(world: World, job: np.ndarray, ckpt: np.ndarray) -> None:
    """Before failures are carved out: inference nodes always serve, idle nodes never run a job."""
    for n, w in enumerate(world.workload):
        if w != "training":
            job[:, n] = w == "inference"
            ckpt[:, n] = False


def power_brakes(world: World, rng: np.random.Generator, n_ticks: int, dt: float) -> list[tuple[int, int, list[int]]]:
    """Rack-wide HW power-brake events on healthy nodes: (first tick, end tick, nodes)."""
    racks = sorted(set(world.rack_of_node))
    days = n_ticks * dt / 86400
    out = []
    for _ in range(rng.poisson(world.rates["power_brake_per_rack_day"] * len(racks) * days)):
        rack = racks[int(rng.integers(0, len(racks)))]
        a = int(rng.integers(0, n_ticks))
        b = min(n_ticks, a + max(1, int(rng.uniform(*world.ranges.power_brake_s) / dt)))
        out.append((a, b, [n for n, r in enumerate(world.rack_of_node) if r == rack]))
    return out
