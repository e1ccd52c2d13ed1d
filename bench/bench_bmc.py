"""How early the BMC rules see power and thermal failures, and how often they fire on healthy nodes.

Simulates a fleet whose incidents are all power or thermal (default field shares of warned and
sudden ones), replays it through the pipeline and the rules-only bundle, and reports per class:
incidents, the share the BMC rules catch before the failure (lead >= 60 s, as
``predictive_recall``) and at it (within 5 min after: the sudden ones), their median and minimum
lead, the same for the GPU-level rules (``hw_thermal``, ``hw_power_brake``), and the ticks on
which a BMC rule fired on a node with no incident.

Usage::

    OMP_NUM_THREADS=1 python bench/bench_bmc.py [--nodes 32] [--hours 24] [--seed 7] [--out /tmp/bmc-rec]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not whatever pip installed

from collector.recording import open_recording  # noqa: E402
from collector.schema import FaultClass  # noqa: E402
from collector.simulator import SimConfig, simulate_recording  # noqa: E402
from models.bundle import ModelBundle  # noqa: E402
from models.node_scores import score_batches  # noqa: E402
from models.rules import RulesDetector  # noqa: E402
from pipeline.features import FEATURE_NAMES  # noqa: E402
from pipeline.recordings import RECORDING_COLUMNS  # noqa: E402
from pipeline.stream import FeaturePipeline  # noqa: E402

GPU_RULES = ("hw_thermal", "hw_power_brake")
CATCH_AFTER_S = 300.0


def fired_rules(path: Path) -> tuple[pd.DataFrame, float, int]:
    """(ts, node, rule) of every tick a rule fired on a node; CPU seconds; GPU samples."""
    rec = open_recording(path)
    pipe, bundle = FeaturePipeline(), ModelBundle.rules_only()
    # each rule on its own: on a node where several fire, the priority order would hide the later ones
    alone = [(r.name, RulesDetector(FEATURE_NAMES, (r,))) for r in bundle.rules.rules
             if r.feature.startswith("node_bmc_") or r.name in GPU_RULES]
    rows = []
    t0 = time.process_time()
    for batch in pipe.replay(rec.iter_windows(1800, align=60, columns=RECORDING_COLUMNS)):
        score_batches(bundle, [batch])  # what a replay costs (the rules-only bundle), for the throughput
        for name, det in alone:
            hit = det.score(batch.x).p > 0
            rows += [(batch.ts, node, name) for node in set(batch.node[hit])]
    return pd.DataFrame(rows, columns=["ts", "node", "rule"]), time.process_time() - t0, pipe.counts.gpu_rows


def first_fire(fired: pd.DataFrame, node: str, rules: set[str], lo: float, hi: float) -> float | None:
    f = fired[(fired["node"] == node) & fired["rule"].isin(rules) & (fired["ts"] >= lo) & (fired["ts"] <= hi)]
    return None if f.empty else float(f["ts"].min())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rate-multiplier", type=float, default=300)
    ap.add_argument("--out", type=Path, default=Path("/tmp/bmc-bench-rec"))
    a = ap.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    cfg = SimConfig(nodes=a.nodes, hours=a.hours, seed=a.seed, rate_multiplier=a.rate_multiplier,
                    mix={FaultClass.POWER: 1.0, FaultClass.THERMAL: 1.0})
    summary = simulate_recording(cfg, a.out)
    bundle = ModelBundle.rules_only()
    bmc = {r.name for r in bundle.rules.rules if r.feature.startswith("node_bmc_")}
    fired, cpu, samples = fired_rules(a.out)
    print(f"{a.nodes} nodes x {a.hours:g} h, seed {a.seed}: {summary.events:,} events, "
          f"replay {samples / cpu:,.0f} GPU samples/CPU-s")
    print("| class | incidents (warned/sudden) | BMC before (>=60 s) | BMC median / min lead | BMC at sudden "
          "| GPU rules before | GPU median lead |")
    print("|---|---|---|---|---|---|---|")
    for fault in ("power", "thermal"):
        incs = [i for i in summary.incidents if i["fault"] == fault]
        warned = [i for i in incs if i["onset_ts"] is not None]
        sudden = [i for i in incs if i["onset_ts"] is None]
        leads, gpu_leads, at = [], [], 0
        for i in warned:
            f = first_fire(fired, i["node"], bmc, i["onset_ts"], i["failure_ts"])
            g = first_fire(fired, i["node"], set(GPU_RULES), i["onset_ts"], i["failure_ts"])
            leads += [i["failure_ts"] - f] if f is not None else []
            gpu_leads += [i["failure_ts"] - g] if g is not None else []
        for i in sudden:
            at += first_fire(fired, i["node"], bmc, i["failure_ts"] - 60, i["failure_ts"] + CATCH_AFTER_S) is not None
        caught = sum(x >= 60 for x in leads)
        med = f"{statistics.median(leads) / 60:.1f} / {min(leads) / 60:.1f} min" if leads else "-"
        gmed = f"{statistics.median(gpu_leads) / 60:.1f} min" if gpu_leads else "-"
        print(f"| {fault} | {len(incs)} ({len(warned)}/{len(sudden)}) | {caught}/{len(warned)} | {med} | "
              f"{at}/{len(sudden)} | {sum(x >= 60 for x in gpu_leads)}/{len(warned)} | {gmed} |")
    sick = {i["node"] for i in summary.incidents}
    false = fired[fired["rule"].isin(bmc) & ~fired["node"].isin(sick)]
    print(f"BMC rule ticks on nodes with no incident: {len(false)} "
          f"({a.nodes - len(sick)} such nodes, {(a.nodes - len(sick)) * a.hours / 24:.1f} node-days)")


if __name__ == "__main__":
    main()
