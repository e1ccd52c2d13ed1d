"""Tuning worlds with power faults common: the ground a power rule is tested on.

    python bench/power_worlds.py OUT_DIR --seeds 331 332 333 334 [--power-weight 0.5] [--nodes 64] [--hours 24]

Each seed is a world drawn from the training ranges (docs/simulator.md), simulated with the default
fault mix except power, whose weight is set to ``--power-weight`` (the default mix sums to 1, so 0.5
makes about a third of node faults power; half of those are warned). Written to ``OUT_DIR/tune-power-<seed>``.
Seeds 301-399 are tuning seeds: never trained on, never judged on.

The tenth session's tune-power-321 is ``--seeds 321 --power-weight 0.28`` (power as common as the
most common class); the eleventh session's tune-power-331 to 334 use the default 0.5
(bench/results/robustness.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from collector.schema import FaultClass
from collector.simulator import TRAINING, SimConfig, draw_world, simulate_recording, world_config
from collector.simulator.config import DEFAULT_MIX


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seeds", type=int, nargs="+", required=True, help="tuning seeds (301-399)")
    ap.add_argument("--power-weight", type=float, default=0.5, help="power's weight in the fault mix (default mix sums to 1)")
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--ports-per-node", type=int, default=9)
    a = ap.parse_args()
    if a.power_weight <= 0:
        ap.error("--power-weight must be > 0")
    mix = {**DEFAULT_MIX, FaultClass.POWER: a.power_weight}
    for seed in a.seeds:
        if not 301 <= seed <= 399:
            ap.error(f"seed {seed} is not a tuning seed (301-399)")
        out = a.out / f"tune-power-{seed}"
        t = time.perf_counter()
        cfg = SimConfig(nodes=a.nodes, hours=a.hours, seed=seed, ports_per_node=a.ports_per_node, mix=mix)
        simulate_recording(world_config(cfg, draw_world(seed, TRAINING, a.nodes)), out)
        print(f"{out} ({time.perf_counter() - t:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
