"""The tuning ground: the 24 recordings every detection choice since the tenth session was decided on.

Usage::

    python bench/tuning_ground.py --write DIR [--only NAME ...]     # ~1,536 node-days, a few minutes
    python bench/tuning_ground.py --list                             # names, sets and recipes
    python bench/bench_robustness.py --model models/default --tuning DIR/*/ --jobs 2   # + totals per set

A candidate is decided here and only here (bench/results/robustness.md: "decide on tuning-range
worlds only"); the shift suite (bench/bench_shift.py), home seeds 1–6 and ../shared/validation
judge it afterwards, once. Until this script the ground was rebuilt on each fresh machine from
commands spread over that file, docs/simulator.md and the docstrings of ``power_worlds.py`` and
``thin_recording.py``; this is the same recipe in one place, seed for seed:

* **native** (9 × 64 node-days): randomized worlds 301–304 from the training ranges; 311–312 from
  ``tune-background-x3``; 321 with power faults as common as the commonest class
  (``power_worlds.py --power-weight 0.28``, 9 ports per node); the home world at seeds 11 and 12.
* **SBE-burst** (2 × 64): 341–342 from ``tune-sbe-bursts``.
* **thinned** (13 × 64): every k-th sample of a native world (``thin_recording.py``): 302, 303,
  304 and x3-312 at k = 3 and 12; 301 at 6; x3-311 at 4; power-321 at 2; home 11 and 12 at 6.

Seeds 301–399 (and home 11–12) are tuning seeds: never trained on, never judged on. A recording
already written (its ``manifest.json`` exists) is kept; delete it to rebuild.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


@dataclass(frozen=True)
class World:
    name: str
    set: str             # native | sbe-burst
    seed: int
    ranges: str | None   # randomized world's ranges; None: the home world
    power_weight: float | None = None
    ports_per_node: int = 8
    thin: tuple[int, ...] = ()

    @property
    def recipe(self) -> str:
        if self.power_weight is not None:
            return f"bench/power_worlds.py --seeds {self.seed} --power-weight {self.power_weight:g}"
        if self.ranges is None:
            return f"the home world, seed {self.seed} (bench_detection.recording({self.seed}, 64, 24))"
        return (f"gpuops simulate --world randomized --world-ranges {self.ranges} --nodes {NODES} --hours {HOURS:g} "
                f"--seed {self.seed}")


WORLDS: tuple[World, ...] = (
    World("tune-301", "native", 301, "train", thin=(6,)),
    World("tune-302", "native", 302, "train", thin=(3, 12)),
    World("tune-303", "native", 303, "train", thin=(3, 12)),
    World("tune-304", "native", 304, "train", thin=(3, 12)),
    World("tune-x3-311", "native", 311, "tune-background-x3", thin=(4,)),
    World("tune-x3-312", "native", 312, "tune-background-x3", thin=(3, 12)),
    World("tune-power-321", "native", 321, "train", power_weight=0.28, ports_per_node=9, thin=(2,)),
    World("home-11", "native", 11, None, thin=(6,)),
    World("home-12", "native", 12, None, thin=(6,)),
    World("tune-sbe-341", "sbe-burst", 341, "tune-sbe-bursts"),
    World("tune-sbe-342", "sbe-burst", 342, "tune-sbe-bursts"),
)
NODES, HOURS = 64, 24.0


def recordings() -> list[tuple[str, str, World, int]]:
    """(recording name, set, world, k) for the whole ground: natives first, then their thinned copies."""
    out = [(w.name, w.set, w, 1) for w in WORLDS]
    return out + [(f"{w.name}-every{k}", "thinned", w, k) for w in WORLDS for k in w.thin]


def _config(w: World):  # noqa: ANN202 - a SimConfig
    from collector.schema import FaultClass
    from collector.simulator import SimConfig, draw_world, ranges_by_name, world_config
    from collector.simulator.config import DEFAULT_MIX

    cfg = SimConfig(nodes=NODES, hours=HOURS, seed=w.seed, ports_per_node=w.ports_per_node)
    if w.power_weight is not None:
        cfg.mix = {**DEFAULT_MIX, FaultClass.POWER: w.power_weight}
    if w.ranges is None:
        return cfg
    return world_config(cfg, draw_world(w.seed, ranges_by_name(w.ranges), NODES))


def write(out: Path, only: set[str] | None) -> None:
    from bench_resample import thinned

    from collector.simulator import simulate_recording

    out.mkdir(parents=True, exist_ok=True)
    for name, kind, w, k in recordings():
        if only and name not in only and w.name not in only:
            continue
        dest = out / name
        t0 = time.perf_counter()
        if (dest / "manifest.json").exists():
            print(f"{name}: kept ({dest})", flush=True)
            continue
        if k == 1:
            tmp = dest.with_name(dest.name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            simulate_recording(_config(w), tmp)
            tmp.rename(dest)
        else:
            base = out / w.name
            if not (base / "manifest.json").exists():
                sys.exit(f"error: {name} thins {base}, which is not written (write {w.name} too)")
            thinned(base, k)
        print(f"{name} ({kind}): {time.perf_counter() - t0:.0f} s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", type=Path, metavar="DIR", help="write the ground's recordings into DIR/<name>/")
    ap.add_argument("--only", action="append", metavar="NAME",
                    help="only this recording, or a native world and its thinned copies (repeatable)")
    ap.add_argument("--list", action="store_true", help="print the recordings, their sets and recipes")
    a = ap.parse_args()
    names = {n for n, *_ in recordings()}
    if a.only and (bad := sorted(set(a.only) - names)):
        ap.error(f"unknown recording(s) {', '.join(bad)}; valid: {', '.join(sorted(names))}")
    if a.list or not a.write:
        for name, kind, w, k in recordings():
            print(f"{name:24} {kind:9} " + (f"bench/thin_recording.py {w.name} {k}" if k > 1 else w.recipe))
        return 0
    write(a.write, set(a.only) if a.only else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
