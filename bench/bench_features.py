"""Benchmark of the streaming feature pipeline on one core.

Measures, side by side in one run (these machines are noisy; compare within a run):

1. window-state update throughput — :meth:`GpuWindowState.update` on whole ticks of
   GPU samples (target ≥ 1,000,000 samples/s, issue 3);
2. feature cost per tick — :func:`compute_features` for every GPU of the fleet;
3. the whole driver — ``FeaturePipeline.ingest`` + ``advance`` (tick split, sort,
   state, ports, features) per telemetry sample;
4. a pandas ``groupby`` recompute of the same gauge means per tick, the ruled-out design.

Usage::

    MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184 \\
    MALLOC_TOP_PAD_=268435456 OMP_NUM_THREADS=1 \\
    python bench/bench_features.py --gpus 4096 --interval 1 --ticks 6 --write bench/results/features.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not whatever pip installed

from collector.schema import GPU_COUNTERS  # noqa: E402
from pipeline.samples import GPU_COL, GPU_VALUE_COLUMNS, GpuRows, NetRows, NET_STATE_COUNTERS  # noqa: E402
from pipeline.features import FEATURE_NAMES, compute_features  # noqa: E402
from pipeline.settings import PipelineSettings  # noqa: E402
from pipeline.stream import FeaturePipeline  # noqa: E402

T0 = 1_767_225_600.0


def tick_rows(pipe: FeaturePipeline, n_gpus: int, interval: float, k: int, rng: np.random.Generator) -> GpuRows:
    """One tick (cadence) of samples for n_gpus GPUs, 8 per node, rows in arrival order (ts, then GPU)."""
    cad = pipe.settings.cadence_s
    per = int(cad / interval)
    nodes = np.repeat(np.arange(n_gpus // 8), 8)
    if pipe.keys.gpus.n < n_gpus:
        for i in range(n_gpus // 8):
            pipe.keys.nodes.id_of(f"gpu-node-{i:05d}")
        pipe.keys.gpus.slots_of(nodes, np.tile(np.arange(8), n_gpus // 8))
    slots = pipe.keys.gpus.slots_of(nodes, np.tile(np.arange(8), n_gpus // 8))
    ts = T0 + k * cad + np.repeat(np.arange(per) * interval, n_gpus) + rng.uniform(0, 0.2, per * n_gpus)
    n = len(ts)
    vals = rng.uniform(20, 90, (len(GPU_VALUE_COLUMNS), n))
    step = np.repeat(np.arange(per) + k * per, n_gpus).astype(np.float64)
    for c in GPU_COUNTERS:  # cumulative counters grow (resets are rare in real telemetry)
        vals[GPU_COL[c]] = step * 3
    vals[GPU_COL["throttle_reasons"]] = rng.choice([0.0, 4.0, 8.0, 64.0], n)
    return GpuRows(ts, np.tile(slots, per), vals)


def net_rows(pipe: FeaturePipeline, n_gpus: int, interval: float, k: int) -> NetRows:
    n_nodes = n_gpus // 8
    cad = pipe.settings.cadence_s
    per = int(cad / interval)
    node_ids = np.repeat(np.arange(n_nodes, dtype=np.int32), 8)
    ports = pipe.keys.ports.slots_of(node_ids, np.tile(np.array([f"mlx5_{i}" for i in range(8)], object), n_nodes),
                                     np.ones(8 * n_nodes, np.int64))
    ts = T0 + k * cad + np.repeat(np.arange(per) * interval, len(ports)) + 0.5
    vals = np.repeat((np.arange(per) + k * per)[None, :], len(NET_STATE_COUNTERS), 0).repeat(len(ports), 1).astype(float)
    return NetRows(ts, np.tile(ports, per), np.ones(len(ts), np.int8), vals)


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=4096)
    ap.add_argument("--interval", type=float, default=1.0, help="sampling interval, s")
    ap.add_argument("--ticks", type=int, default=6, help="ticks timed per measurement")
    ap.add_argument("--write", default="")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    settings = PipelineSettings(expected_gpus=a.gpus, expected_nodes=a.gpus // 8, expected_ports=a.gpus)
    pipe = FeaturePipeline(settings)
    warm = settings.n_buckets  # fill the whole long window first
    ticks = [tick_rows(pipe, a.gpus, a.interval, k, rng) for k in range(warm + 2 * a.ticks)]
    for k in range(warm):
        pipe.gpu_state.update(ticks[k])
    rows_per_tick = len(ticks[0])

    t = time.perf_counter()
    for k in range(warm, warm + a.ticks):
        pipe.gpu_state.update(ticks[k])
    upd_s = (time.perf_counter() - t) / a.ticks
    tick_end = T0 + (warm + a.ticks) * settings.cadence_s
    for k in range(warm):
        pipe.port_state.update(net_rows(pipe, a.gpus, a.interval, k))
    slots = pipe.keys.gpus.canonical_order()
    feat_s = best(lambda: compute_features(pipe.gpu_state, pipe.port_state, pipe.node_xids, pipe.keys.gpus,
                                           pipe.keys.ports, slots, tick_end, settings.n_short_buckets), 5)

    # whole driver on fresh ticks (state continues)
    t = time.perf_counter()
    n_out = 0
    for k in range(warm + a.ticks, warm + 2 * a.ticks):
        pipe.ingest(ticks[k], net_rows(pipe, a.gpus, a.interval, k))
        n_out += len(pipe.advance(T0 + (k + 1) * settings.cadence_s))
    drv_s = (time.perf_counter() - t) / a.ticks
    assert n_out == a.ticks

    # ruled-out design: pandas groupby recompute of 5 gauge means over the long window each tick
    small = min(a.gpus, 512)
    df = pd.DataFrame({"slot": np.concatenate([r.slot[r.slot < small] for r in ticks[:warm]]),
                       **{g: np.concatenate([r.vals[GPU_COL[g]][r.slot < small] for r in ticks[:warm]])
                          for g in ("temp_gpu_c", "temp_mem_c", "power_w", "sm_clock_mhz", "util_gpu")}})
    pd_s = best(lambda: df.groupby("slot").agg(["mean", "std"]), 3)
    pd_rate = len(df) / pd_s

    lines = [
        "# Feature pipeline benchmark",
        "",
        f"- date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {platform.machine()}, {_cpu()}, {os.cpu_count()} CPUs (one core used), "
        f"Python {platform.python_version()}, numpy {np.__version__}, pandas {pd.__version__}",
        f"- glibc malloc settings from PERFORMANCE.md: {'on' if os.environ.get('MALLOC_MMAP_THRESHOLD_') else 'off'}",
        f"- fleet: {a.gpus} GPUs ({a.gpus // 8} nodes × 8, 8 ports each), sampled every {a.interval:g} s; "
        f"cadence {settings.cadence_s:g} s, long window {settings.long_window_s:g} s "
        f"({settings.n_buckets} buckets), {len(FEATURE_NAMES)} features",
        f"- command: `python bench/bench_features.py --gpus {a.gpus} --interval {a.interval:g} --ticks {a.ticks}`",
        "",
        "| measurement | result |",
        "|---|---|",
        f"| state update (GpuWindowState.update, {rows_per_tick:,} samples per tick) | "
        f"**{rows_per_tick / upd_s / 1e6:.2f} M GPU samples/s** ({upd_s * 1e3:.0f} ms per tick) |",
        f"| features per tick, all {a.gpus} GPUs (compute_features) | **{feat_s * 1e3:.1f} ms** "
        f"({feat_s / a.gpus * 1e6:.2f} µs per GPU) |",
        f"| whole driver (ingest + advance: split, state, ports, features) | "
        f"**{rows_per_tick / drv_s / 1e6:.2f} M GPU samples/s** ({drv_s * 1e3:.0f} ms per tick) |",
        f"| ruled out: pandas groupby recompute of 5 gauge means/std over the long window | "
        f"{pd_rate / 1e6:.2f} M rows/s re-read every tick, i.e. {pd_rate / settings.n_buckets / 1e3:.0f} k new samples/s |",
        f"| window state held | {pipe.state_bytes / 2**20:.1f} MiB ({pipe.state_bytes / a.gpus / 1024:.1f} KiB per GPU incl. ports), "
        "independent of stream length |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if a.write:
        with open(a.write, "w") as fh:
            fh.write(text)


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    main()
