"""How a world's exporters sample: per-node cadence, gaps, jitter, clock skew, late rows.

Rendering runs on one base grid (the greatest common step of the nodes' intervals);
each node keeps only its own sample ticks, less the gaps where its exporter was down.
Port counters may run on their own, slower cadence. Timestamps carry the node's clock
skew and a per-sample jitter; a few rows are written late (out of order), which the
recording contract allows.
"""

from __future__ import annotations

import numpy as np

from .world import World


def sample_masks(world: World, n_ticks: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(T, N) bool masks of the base ticks each node's GPU and port samples are taken at."""
    N, base = len(world.node_interval_s), world.base_interval_s
    t = np.arange(n_ticks)[:, None]
    k = np.maximum(1, np.round(np.array(world.node_interval_s) / base)).astype(np.int64)
    kp = np.maximum(1, np.round(np.array(world.port_interval_s) / base)).astype(np.int64)
    phase = (rng.random(N) * k).astype(np.int64)
    gpu = (t + phase) % k == 0
    port = gpu & ((t + phase) % kp == 0)
    days = n_ticks * base / 86400
    for _ in range(rng.poisson(world.rates["gap_per_node_day"] * N * days)):
        n = int(rng.integers(0, N))
        a = int(rng.integers(0, n_ticks))
        b = a + max(1, int(rng.uniform(*world.ranges.gap_s) / base))
        gpu[a:b, n] = False
        port[a:b, n] = False
    return gpu, port


def timestamps(world: World, start_ts: float, a: int, b: int, rng: np.random.Generator) -> np.ndarray:
    """(b - a, N) sample times: base tick + node clock skew + jitter within ± jitter_frac of its interval."""
    N = len(world.node_interval_s)
    iv = np.array(world.node_interval_s)
    j = world.rates["jitter_frac"]
    jitter = rng.uniform(-j, j, (b - a, N)) * iv + 0.05 * np.arange(N) / N
    return start_ts + np.arange(a, b)[:, None] * world.base_interval_s + np.array(world.skew_s) + jitter


def late_order(n_rows: int, frac: float, rng: np.random.Generator) -> np.ndarray | None:
    """A row order that writes a *frac* share of rows after the rest of their chunk (None: keep order)."""
    if frac <= 0 or n_rows == 0:
        return None
    late = rng.random(n_rows) < frac
    if not late.any():
        return None
    idx = np.arange(n_rows)
    return np.concatenate([idx[~late], idx[late]])
