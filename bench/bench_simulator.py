"""Simulator throughput: GPU samples rendered per second on one core, and a full `gpuops simulate` run.

Usage: python bench/bench_simulator.py [--nodes 64] [--hours 24] [--interval 10] [--repeats 3] [--write DIR]
       [--world-ranges train|shift-NAME]   (a randomized world drawn with seed 1; --interval then comes from it)

Rendering (plan + vectorised chunks, GPU *and* port samples) is timed on CPU time of
this process with BLAS/OpenMP pinned to one thread; writing the Parquet recording is
timed separately when --write is given. Results go to stdout as a Markdown row.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collector.simulator import (  # noqa: E402
    SimConfig,
    Simulator,
    draw_world,
    ranges_by_name,
    simulate_recording,
    world_config,
)


def render_once(cfg: SimConfig) -> tuple[int, float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    n = 0
    for ch in Simulator(cfg).chunks():
        n += ch.gpu.num_rows
    return n, time.process_time() - c0, time.perf_counter() - w0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--interval", type=float, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write", type=Path, help="also time a full recording write into this directory")
    ap.add_argument("--world-ranges", help="time a randomized world drawn from these ranges instead of home")
    a = ap.parse_args()
    cfg = SimConfig(nodes=a.nodes, hours=a.hours, interval_s=a.interval, seed=1)
    if a.world_ranges:
        cfg = world_config(cfg, draw_world(1, ranges_by_name(a.world_ranges), a.nodes))
    cadence = f"{cfg.interval_s:g} s"
    if cfg.world is not None:
        cadence = f"{'/'.join(f'{v:g}' for v in sorted(set(cfg.world.node_interval_s)))} s ({a.world_ranges} world)"
    runs = [render_once(cfg) for _ in range(a.repeats)]
    n = runs[0][0]
    cpu = statistics.median(r[1] for r in runs)
    wall = statistics.median(r[2] for r in runs)
    print(f"| {time.strftime('%Y-%m-%d')} | {platform.processor() or platform.machine()} | {a.nodes}x8 GPUs, "
          f"{a.hours:g} h @ {cadence} | {n:,} | {n / cpu:,.0f} (cpu) | {n / wall:,.0f} (wall) |")
    if a.write:
        shutil.rmtree(a.write, ignore_errors=True)
        w0 = time.perf_counter()
        simulate_recording(cfg, a.write)
        took = time.perf_counter() - w0
        size = sum(p.stat().st_size for p in a.write.rglob("*") if p.is_file())
        print(f"full `gpuops simulate` incl. Parquet write: {took:.1f} s wall, {size / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
