"""The same fleet at three sampling intervals: does gpuops read it the same way?

Usage::

    python bench/bench_resample.py [--nodes 32] [--hours 24] [--seed 501] [--factors 1 3 12]
        [--model DIR] [--policy FILE] [--dir /tmp/gpuops-resample] [--write bench/results/resample.md]

research/robust-detection.md §9.1 asks for this test: resampling a recording at 5/15/60 s must
leave scores unchanged within noise. The shift suite's 60 s and 2 s worlds are other fleets
(other seeds), so they mix the interval with everything else; here one fleet is simulated
once at 5 s in a world drawn from the *training* ranges (benign background, sampling defects,
missing fields; only the interval fixed at 5 s, ports read with the GPUs), and thinned to
every 3rd and every 12th sample of each GPU and port (15 s, 60 s). Events and incidents are
the same. Seeds 501–599 belong to this bench: no model was trained or tuned on them.

For each interval it prints:

* the replay's recall, predictive recall, false drains/resets and alerts per 1,000 node-days
  (model and rules-only, :class:`api.replay.Replayer`, dry run);
* how healthy GPUs' scores move: the 99th and 99.9th percentile of the classifier's
  failure probability and of the anomaly level, on nodes with no incident;
* the model inputs that move most between 5 s and 60 s on those healthy GPUs, at the ticks
  both score: the median and 99th percentile of the absolute difference, against the
  feature's healthy spread at 5 s (its 1st–99th percentile range).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not whatever pip installed

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bench_detection import cached_recording  # noqa: E402
from bench_robustness import _f, _one  # noqa: E402  (one replay, scored as the judged suite is)
from collector.simulator import SimConfig, TRAINING, draw_world, world_config  # noqa: E402
from models.bundle import ModelBundle, ScoreBatch, default_model_path  # noqa: E402
from pipeline.batch import FeatureBatch  # noqa: E402

BASE_INTERVAL_S = 5.0


def base_recording(out: Path, nodes: int, hours: float, seed: int) -> Path:
    """One fleet at 5 s in a world from the training ranges (interval fixed, ports with the GPUs)."""
    ranges = replace(TRAINING, name="resample-5s", interval_choices_s=(BASE_INTERVAL_S,), mixed_interval_prob=0.0,
                     port_interval_choices_s=(0,))
    return cached_recording(out, world_config(SimConfig(nodes=nodes, hours=hours, seed=seed),
                                              draw_world(seed, ranges, nodes)))


def _every_kth(tbl: pa.Table, keys: list[str], k: int) -> pa.Table:
    """Every k-th row of each key (node and GPU, or node, device and port), in time order."""
    order = pc.sort_indices(tbl, [(c, "ascending") for c in keys] + [("ts", "ascending")])
    tbl = tbl.take(order)
    cols = [tbl[c].to_numpy(zero_copy_only=False) for c in keys]
    new_key = np.zeros(len(tbl), bool)
    new_key[0] = True
    for c in cols:
        new_key[1:] |= c[1:] != c[:-1]
    starts = np.flatnonzero(new_key)
    rank = np.arange(len(tbl)) - np.repeat(starts, np.diff(np.append(starts, len(tbl))))
    return tbl.filter(pa.array(rank % k == 0))


def thinned(base: Path, k: int) -> Path:
    """*base* with every k-th sample of each GPU and port kept (k = 1: *base* itself)."""
    if k == 1:
        return base
    out = base.with_name(f"{base.name}-every{k}")
    if (out / "manifest.json").exists():
        return out
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, keys in (("gpu", ["node", "gpu"]), ("net", ["node", "device", "port"])):
        src = base / f"{name}.parquet"
        if src.exists():
            pq.write_table(_every_kth(pq.read_table(src), keys, k), tmp / f"{name}.parquet", compression="zstd")
    for f in base.iterdir():
        if f.suffix != ".parquet" and f.name != "manifest.json":
            shutil.copy2(f, tmp / f.name)
    man = json.loads((base / "manifest.json").read_text())
    man["interval_s"] = man["interval_s"] * k
    (tmp / "manifest.json").write_text(json.dumps(man, indent=2) + "\n")
    tmp.rename(out)
    return out


class HealthyFeatures:
    """Collects, from a replay's scored ticks (``Replayer(observe=...)``), the model's inputs and scores
    of the GPUs on healthy nodes, per (tick, node, gpu): what the drift table compares."""

    def __init__(self, bundle: ModelBundle, healthy_nodes: set[str]) -> None:
        self.healthy = np.array(sorted(healthy_nodes), dtype=object)
        self.names = list(bundle.classifier.inputs) if bundle.classifier is not None else []
        self.cols = [bundle.feature_names.index(n) for n in self.names]
        self.keys: list[tuple[float, str, int]] = []
        self.xs: list[np.ndarray] = []
        self.ps: list[np.ndarray] = []
        self.anos: list[np.ndarray] = []

    def __call__(self, batch: FeatureBatch, scores: ScoreBatch) -> None:
        keep = np.isin(batch.node, self.healthy)
        if not keep.any():
            return
        self.keys.extend(zip([batch.ts] * int(keep.sum()), batch.node[keep], batch.gpu[keep].tolist()))
        self.xs.append(batch.x[keep][:, self.cols])
        self.ps.append(scores.p_fail[keep])
        self.anos.append(scores.anomaly[keep])

    def result(self) -> dict:
        return {"keys": self.keys, "x": np.vstack(self.xs), "p": np.concatenate(self.ps),
                "anomaly": np.concatenate(self.anos), "names": self.names}


def drift(a: dict, b: dict, top: int) -> tuple[list[tuple[str, float, float, float]], int]:
    """Inputs that move most from *a* to *b* at the (tick, node, gpu) both score, and how many they share."""
    ia = {k: i for i, k in enumerate(a["keys"])}
    pairs = [(ia[k], j) for j, k in enumerate(b["keys"]) if k in ia]
    ai, bj = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    xa, xb = a["x"][ai].astype(np.float64), b["x"][bj].astype(np.float64)
    rows = []
    for f, name in enumerate(a["names"]):
        va, vb = xa[:, f], xb[:, f]
        both = np.isfinite(va) & np.isfinite(vb)
        if both.sum() < 100:
            continue
        lo, hi = np.nanpercentile(a["x"][:, f], [1, 99])
        spread = hi - lo
        d = np.abs(va[both] - vb[both])
        if spread <= 0:
            spread = max(float(np.nanmax(np.abs(a["x"][:, f]))), 1e-9)
        rows.append((name, float(np.median(d) / spread), float(np.percentile(d, 99) / spread),
                     float(1.0 - both.mean())))
    rows.sort(key=lambda r: -r[2])
    return rows[:top], len(pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--seed", type=int, default=501, help="501-599: this bench's seeds")
    ap.add_argument("--factors", type=int, nargs="+", default=[1, 3, 12], help="keep every k-th sample (1 = 5 s)")
    ap.add_argument("--model", type=Path, help="model directory (default: the shipped one)")
    ap.add_argument("--policy", type=Path, help="policy YAML (default: built-in)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/gpuops-resample"))
    ap.add_argument("--top", type=int, default=10, help="inputs listed in the drift table")
    ap.add_argument("--write", type=Path, help="append the tables, dated, to this Markdown file")
    a = ap.parse_args()
    bundle = ModelBundle.load(a.model or default_model_path())
    t0 = time.perf_counter()
    base = base_recording(a.dir / f"train-ranges-n{a.nodes}-h{a.hours:g}-s{a.seed}", a.nodes, a.hours, a.seed)
    print(f"base recording {base} ({time.perf_counter() - t0:.0f} s)", flush=True)
    incidents = [json.loads(line) for line in (base / "incidents.jsonl").read_text().splitlines() if line.strip()]
    nodes = json.loads((base / "manifest.json").read_text())["nodes"]
    healthy = set(nodes) - {i["node"] for i in incidents}
    paths = {k: thinned(base, k) for k in a.factors}
    rows, feats = [], {}
    for k, p in paths.items():
        t = time.perf_counter()
        seen = HealthyFeatures(bundle, healthy)  # read from the replay's own ticks: one pipeline pass
        m = _one(("resample", f"every {k}", str(p), str(a.model) if a.model else None,
                   str(a.policy) if a.policy else None, ()), observe=seen)
        feats[k] = seen.result()
        rows.append((k, m))
        print(f"every {k}: replayed and scored in {time.perf_counter() - t:.0f} s", flush=True)

    lines = [f"Fleet: {a.nodes} nodes x {a.hours:g} h, training-range world drawn with seed {a.seed}, sampled at "
             f"5 s and thinned; {len(incidents)} incidents, {len(healthy)} nodes with none (the healthy set). "
             f"Model `{a.model or 'models/default'}`"
             + (f", policy `{a.policy}`" if a.policy else "") + ".", "",
             "| interval | GPU samples | recall model / rules | predictive model / rules | false drains+resets "
             "per 1k node-days (count) model / rules | alerts per 1k: anomaly / unexplained / all | healthy p_fail "
             "p99 / p99.9 / max | healthy anomaly p99 / p99.9 |",
             "|---|---|---|---|---|---|---|---|"]
    for k, m in rows:
        mo, ru, f = m["model"], m["rules_baseline"], feats[k]
        q = np.percentile(f["p"], [99, 99.9])
        qa = np.percentile(f["anomaly"], [99, 99.9])
        lines.append(
            f"| {BASE_INTERVAL_S * k:g} s | {m['stats']['gpu_samples']:,} | {_f(mo['recall'])} ({mo['caught']}/"
            f"{mo['node_fault_incidents']}) / {_f(ru['recall'])} | {_f(mo['predictive_recall'])} "
            f"({mo['caught_predictively']}/{mo['predictable']}) / {_f(ru['predictive_recall'])} | "
            f"{_f(mo['false_actions_per_1k_node_days'], 1)} ({mo['false_actions']}) / "
            f"{_f(ru['false_actions_per_1k_node_days'], 1)} ({ru['false_actions']}) | "
            f"{_f(mo['anomaly_alerts_per_1k_node_days'], 0)} / {_f(mo['unexplained_alerts_per_1k_node_days'], 0)} / "
            f"{_f(mo['alerts_per_1k_node_days'], 0)} | {q[0]:.3f} / {q[1]:.3f} / {f['p'].max():.3f} | "
            f"{qa[0]:.3f} / {qa[1]:.3f} |")
    lo, hi = min(a.factors), max(a.factors)
    top, n = drift(feats[lo], feats[hi], a.top)
    lines += ["", f"Model inputs that move most from {BASE_INTERVAL_S * lo:g} s to {BASE_INTERVAL_S * hi:g} s on "
              f"healthy GPUs ({n:,} GPU-ticks scored in both), as a fraction of the input's healthy 1st–99th "
              "percentile range at the shorter interval:", "",
              "| input | median abs. difference | p99 abs. difference | known in one only |", "|---|---|---|---|"]
    lines += [f"| `{name}` | {med:.3f} | {p99:.3f} | {one:.1%} |" for name, med, p99, one in top]
    text = "\n".join(lines)
    print(text)
    if a.write:
        with open(a.write, "a") as fh:
            fh.write(f"\n<!-- {dt.date.today()} python bench/bench_resample.py {' '.join(sys.argv[1:])} -->\n{text}\n")


if __name__ == "__main__":
    main()
