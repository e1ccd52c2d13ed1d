"""Shift suite: whole simulated worlds outside the training ranges, for honest evaluation.

Usage:
    python bench/bench_shift.py --write DIR [--only NAME] [--nodes 64] [--hours 24] [--draw K]
    python bench/bench_shift.py --replay DIR [--only NAME] [--model PATH] [--rules-only]

Each world is drawn from one of ``collector.simulator.SHIFTS`` (docs/simulator.md,
"Shift suite"): background rates x10, 60 s sampling, 2 s sampling, an H200 fleet (a
generation the training ranges exclude), messy data, and a mixed fleet. Nothing in
the suite is used for training or tuning. Seeds: training 201–299, tuning 301–399,
this suite 401–499 (one fixed seed per world, below).

``--draw K`` (K ≥ 2) writes another draw of the same six worlds: each world's seed plus
10·(K−1) (draw 2: 411–416, draw 3: 421–426), so the same shifts are judged on more node-days
(a world of 64 node-days cannot tell 0 from 15 false actions per 1,000 node-days). Draw 1 is
the suite itself. Write each draw into its own DIR.

``--write`` writes ``DIR/<name>/`` recordings (64 nodes x 24 h each by default; the
2 s world is about 22 M GPU rows and 1.5 GB). ``--replay`` runs each through
``api.replay`` (the live path, dry run) and prints recall, predictive recall, false
actions per 1,000 node-days, actions on app-XID incidents and alerts, model vs the
rules-only baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: world name -> (ranges in collector.simulator.SHIFTS, seed)
SUITE: dict[str, tuple[str, int]] = {
    "background-x10": ("shift-background-x10", 401),
    "interval-60s": ("shift-interval-60s", 402),
    "interval-2s": ("shift-interval-2s", 403),
    "h200": ("shift-h200", 404),
    "messy": ("shift-messy", 405),
    "mixed-fleet": ("shift-mixed-fleet", 406),
}


#: seeds of one draw of the suite lie this far apart; eight draws stay in the suite's 401-499
DRAW_STEP = 10
MAX_DRAW = 8


def seed_of(name: str, draw: int = 1) -> int:
    """The seed of world *name* in draw *draw* (1: the suite itself)."""
    if not 1 <= draw <= MAX_DRAW:
        raise ValueError(f"draw must be 1..{MAX_DRAW} (seeds stay in the suite's 401-499), got {draw}")
    return SUITE[name][1] + DRAW_STEP * (draw - 1)


def write(out: Path, names: list[str], nodes: int, hours: float, draw: int = 1) -> None:
    from collector.simulator import SimConfig, draw_world, ranges_by_name, simulate_recording, world_config

    for name in names:
        ranges_name, seed = SUITE[name][0], seed_of(name, draw)
        ranges = ranges_by_name(ranges_name)
        cfg = world_config(SimConfig(nodes=nodes, hours=hours, seed=seed), draw_world(seed, ranges, nodes))
        dest = out / name
        shutil.rmtree(dest, ignore_errors=True)
        t0 = time.perf_counter()
        s = simulate_recording(cfg, dest)
        took = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
        w = cfg.world
        print(f"| {name} | {ranges.shift} | {seed} | {'/'.join(f'{v:g}' for v in sorted(set(w.node_interval_s)))} s | "
              f"{'+'.join(sorted(set(w.generation)))} | {s.gpu_samples:,} | {len(s.incidents)} | {took:.0f} s | "
              f"{size / 2**20:.0f} MiB |", flush=True)


def replay(root: Path, names: list[str], model: Path | None, rules_only: bool) -> None:
    from api.replay import Replayer, build_report
    from models.bundle import ModelBundle, default_model_path
    from remediation.config import load_policy_config

    policy = load_policy_config(None)
    bundle = ModelBundle.rules_only() if rules_only else ModelBundle.load(model or default_model_path())
    print("| world | who | recall | predictive recall | false actions / 1k node-days | actions on app XIDs | alerts |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        path = root / name
        if not (path / "manifest.json").exists():
            print(f"| {name} | (not written) | | | | | |")
            continue
        result = Replayer(bundle, policy).run(path)
        rep = build_report(path, result, {}, policy)
        for who, decisions in (("model", rep["decisions"]), ("rules_baseline", rep["baseline_decisions"])):
            m = rep["metrics"][who]
            alerts = sum(1 for d in decisions if str(d.get("action")) in ("alert", "Action.ALERT"))
            print(f"| {name} | {who} | {_f(m['recall'])} | {_f(m['predictive_recall'])} | "
                  f"{_f(m['false_actions_per_1k_node_days'], 1)} | {m['actions_on_app_errors']} | {alerts} |",
                  flush=True)
        (path.parent / f"{name}.report.json").write_text(json.dumps(rep["metrics"], default=str) + "\n")


def _f(x: float | None, nd: int = 3) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", type=Path, help="write the suite's recordings into DIR/<world>/")
    ap.add_argument("--replay", type=Path, help="replay the recordings under DIR and print the table")
    ap.add_argument("--only", action="append", choices=sorted(SUITE), help="only this world (repeatable)")
    ap.add_argument("--nodes", type=int, default=64, help="nodes per world (64 unless disk or time is short)")
    ap.add_argument("--hours", type=float, default=24.0, help="telemetry hours per world")
    ap.add_argument("--draw", type=int, default=1, choices=range(1, MAX_DRAW + 1), metavar="K",
                    help=f"with --write: draw K of the suite, seeds + {DRAW_STEP}(K-1) (1..{MAX_DRAW}; 1 is the suite itself)")
    ap.add_argument("--model", type=Path, help="model directory for --replay (default: the shipped one)")
    ap.add_argument("--rules-only", action="store_true", help="replay with no trained model")
    a = ap.parse_args()
    if not a.write and not a.replay:
        ap.error("give --write DIR and/or --replay DIR")
    names = a.only or list(SUITE)
    if a.write:
        print("| world | shifts | seed | intervals | generations | GPU rows | incidents | took | size |")
        print("|---|---|---|---|---|---|---|---|---|")
        write(a.write, names, a.nodes, a.hours, a.draw)
    if a.replay:
        replay(a.replay, names, a.model, a.rules_only)


if __name__ == "__main__":
    main()
