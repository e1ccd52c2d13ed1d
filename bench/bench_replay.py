"""End-to-end replay throughput on one core: recording → pipeline → models → policy.

Simulates the recording once (or reuses it), then runs :class:`api.replay.Replayer`
with the rules-only bundle and, when ``--model DIR`` is given, with a trained one.
Prints GPU samples per CPU second (``time.process_time``: these machines are shared,
so wall time is reported but not the target) and where the CPU went: read (Parquet →
validated frames), pipeline (frames → window state → features), scoring (detectors
and per-node aggregation) and policy (decisions with explanations).

Target (issue 3): ≥ 250,000 GPU samples/s end to end with the default 60 s cadence.

Usage::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python bench/bench_replay.py \\
        [--recording DIR] [--model models/default] [--runs 3] [--write bench/results/replay.md]

The glibc settings of shared/PERFORMANCE.md (``MALLOC_MMAP_THRESHOLD_=33554432
MALLOC_TRIM_THRESHOLD_=17179869184 MALLOC_TOP_PAD_=268435456``) cut page-fault time
further; they are not needed to reach the target.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not whatever pip installed

from api.replay import Replayer  # noqa: E402
from bench_detection import recording  # noqa: E402
from models.bundle import ModelBundle  # noqa: E402
from remediation.config import PolicyConfig  # noqa: E402


def one_run(bundle: ModelBundle, recording: Path) -> dict:
    s = Replayer(bundle, PolicyConfig()).run(recording).stats
    return {"cpu_s": s["cpu_s"], "wall_s": s["wall_s"], "gpu_samples": s["gpu_samples"],
            "per_cpu_s": s["gpu_samples"] / s["cpu_s"], "per_wall_s": s["gpu_samples"] / s["wall_s"],
            **{f"{k}_s": v for k, v in s["stage_cpu_s"].items()}}


def measure(name: str, bundle: ModelBundle, recording: Path, runs: int) -> dict:
    rs = [one_run(bundle, recording) for _ in range(runs)]
    for r in rs:
        print(f"  {name}: {r['per_cpu_s']:,.0f} GPU samples/CPU-s ({r['cpu_s']:.1f} s CPU, {r['wall_s']:.1f} s wall)"
              f" read {r['read_s']:.1f} / pipeline {r['pipeline_s']:.1f} / scoring {r['scoring_s']:.1f}"
              f" / policy {r['policy_s']:.1f} s CPU", flush=True)
    med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
    med["name"] = name
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recording", type=Path, help="a recording to replay (default: the home world of --seed, "
                    "--nodes, --hours, --interval, simulated once into the benches' cache)")
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--interval", type=float, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--model", type=Path, help="trained model directory (also run it, besides rules only)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--write", type=Path, help="append a results table to this Markdown file")
    a = ap.parse_args()
    if a.recording is None:
        a.recording = recording(a.seed, a.nodes, a.hours, a.interval)
    elif not (a.recording / "manifest.json").is_file():
        ap.error(f"{a.recording}: not a recording (no manifest.json); omit --recording to simulate one")
    rows = [measure("rules only", ModelBundle.rules_only(), a.recording, a.runs)]
    if a.model:
        rows.append(measure(f"model {a.model}", ModelBundle.load(a.model), a.recording, a.runs))
    lines = [f"### {dt.date.today()} — {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}",
             f"recording {a.recording}: {rows[0]['gpu_samples']:,.0f} GPU samples; median of {a.runs} runs", "",
             "| bundle | GPU samples/CPU-s | GPU samples/wall-s | CPU s | read | pipeline | scoring | policy |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['per_cpu_s']:,.0f} | {r['per_wall_s']:,.0f} | {r['cpu_s']:.1f} | "
                     f"{r['read_s']:.1f} | {r['pipeline_s']:.1f} | {r['scoring_s']:.1f} | {r['policy_s']:.1f} |")
    print("\n".join(lines))
    if a.write:
        with a.write.open("a") as fh:
            fh.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
