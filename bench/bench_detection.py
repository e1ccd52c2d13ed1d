"""Detection quality and replay speed on simulator seeds the shipped model never saw.

Usage: python bench/bench_detection.py [--seeds 1 2 3] [--nodes 64] [--hours 24] [--model DIR]
                                       [--foreign] [--out bench/results/detection.md]

For each seed: simulate (cached under /tmp/gpuops-bench/, :func:`cached_recording`), replay
through the model and the rules-only baseline (one pass), score per spec/recording.md. With --foreign, also
replay the first seed rewritten as another tool would (renamed nodes, shuffled rows in
several files, gzip JSONL) and degraded (optional columns dropped, NaN fields), and a
copy sampled every 30 s. Prints and writes a Markdown table with totals over seeds.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from api.replay import Replayer, build_report  # noqa: E402
from collector.simulator import SimConfig, simulate_recording  # noqa: E402
from models.bundle import ModelBundle, default_model_path  # noqa: E402
from models.evaluation import score_replay  # noqa: E402
from remediation.config import PolicyConfig  # noqa: E402

CACHE = Path("/tmp/gpuops-bench")
KEYS = ("node_fault_incidents", "caught", "predictable", "caught_predictively", "false_actions",
        "actions_on_app_errors")


@functools.cache
def simulator_digest() -> str:
    """8 hex digits of the simulator's source and the record contract it writes: a cached recording is
    reused only by the code that would write it again byte for byte (a changed renderer makes new ones)."""
    root = Path(__file__).resolve().parents[1] / "collector"
    h = hashlib.sha256()
    for f in sorted([*(root / "simulator").glob("*.py"), root / "schema.py", root / "xid.py"]):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:8]


def cached_recording(out: Path, cfg: SimConfig) -> Path:
    """*cfg* simulated into ``<out>-<simulator digest>`` once, and reused after: the benches' one cache.
    Written under a ``.partial`` name and renamed, so an interrupted run never leaves a recording
    that looks whole."""
    out = out.with_name(f"{out.name}-{simulator_digest()}")
    if not (out / "manifest.json").exists():
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        simulate_recording(cfg, tmp)
        tmp.rename(out)
    return out


def recording(seed: int, nodes: int, hours: float, interval: float = 10.0) -> Path:
    """The home world's recording of *seed* (cached)."""
    return cached_recording(CACHE / f"sim-n{nodes}-h{hours:g}-i{interval:g}-s{seed}",
                            SimConfig(nodes=nodes, hours=hours, interval_s=interval, seed=seed))


def run(path: Path, bundle: ModelBundle, cfg: PolicyConfig) -> dict:
    res = Replayer(bundle, cfg).run(path)
    rep = build_report(path, res, {}, cfg)
    return {"model": rep["metrics"]["model"], "rules": rep["metrics"]["rules_baseline"], "stats": res.stats,
            "decisions": rep["decisions"], "incidents": rep["incidents"], "node_days": rep["metrics"]["model"]["node_days"]}


def row(name: str, r: dict) -> str:
    m, b, s = r["model"], r["rules"], r["stats"]
    pct = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    lead = "-" if m["median_lead_s"] is None else f"{m['median_lead_s'] / 60:.1f} min"
    return (f"| {name} | {m['node_fault_incidents']} | {pct(m['recall'])} / {pct(b['recall'])} | "
            f"{pct(m['predictive_recall'])} / {pct(b['predictive_recall'])} | {lead} | "
            f"{m['false_actions']} ({m['false_actions_per_1k_node_days'] or 0:.1f}) / {b['false_actions']} | "
            f"{m['actions_on_app_errors']} | {m['saved_gpu_h']:.0f} / {m['idle_gpu_h']:.0f} | "
            f"{s['gpu_samples_per_s']:,} ({s['gpu_samples'] / max(s['cpu_s'], 1e-9):,.0f} cpu) |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--foreign", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    bundle = ModelBundle.load(a.model or default_model_path())
    cfg = PolicyConfig()
    header = ("| recording | node-fault incidents | recall (model / rules) | predictive recall (model / rules) | "
              "median lead | false actions (per 1k node-days) / rules | on app errors | GPU-h saved / idled | "
              "GPU samples/s wall (cpu) |\n|---|---|---|---|---|---|---|---|---|")
    lines, results = [header], []
    for seed in a.seeds:
        r = run(recording(seed, a.nodes, a.hours), bundle, cfg)
        results.append(r)
        lines.append(row(f"seed {seed}", r))
        print(lines[-1], flush=True)
    decisions = [d for r in results for d in r["decisions"]]
    # totals: score all seeds as one recording (node names are per seed, so prefix them)
    inc, dec = [], []
    for k, r in enumerate(results):
        inc += [i | {"node": f"{k}/{i['node']}"} for i in r["incidents"]]
        dec += [d | {"node": f"{k}/{d['node']}"} for d in r["decisions"]]
    nd = sum(r["node_days"] for r in results)
    tot = score_replay(dec, inc, node_days=nd, gpus_per_node=8)
    print(json.dumps({k: tot[k] for k in ("recall", "predictive_recall", "median_lead_s", "false_actions",
                                          "false_actions_per_1k_node_days")}))
    lines.append(f"| **all {len(a.seeds)} seeds ({nd:.0f} node-days)** | {tot['node_fault_incidents']} | "
                 f"{tot['recall']:.3f} | {tot['predictive_recall']:.3f} | {tot['median_lead_s'] / 60:.1f} min | "
                 f"{tot['false_actions']} ({tot['false_actions_per_1k_node_days']:.1f}) | "
                 f"{tot['actions_on_app_errors']} | | |")
    if a.foreign:
        from tests.foreign import write_foreign
        src = recording(a.seeds[0], a.nodes, a.hours)
        for name, kw in (("foreign layout", {}), ("foreign + degraded fields", {"degrade": True})):
            dst = write_foreign(src, CACHE / f"foreign-{kw.get('degrade', False)}-{src.name}", **kw)
            lines.append(row(f"seed {a.seeds[0]}, {name}", run(dst, bundle, cfg)))
            print(lines[-1], flush=True)
        r30 = run(recording(a.seeds[0], a.nodes, a.hours, interval=30.0), bundle, cfg)
        lines.append(row(f"seed {a.seeds[0]} sampled every 30 s", r30))
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if a.out:
        a.out.write_text(f"<!-- {time.strftime('%Y-%m-%d')} {' '.join(sys.argv[1:])} -->\n" + text)
    _ = decisions


if __name__ == "__main__":
    main()
