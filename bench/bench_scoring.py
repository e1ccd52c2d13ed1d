"""Scoring throughput of the shipped model: scikit-learn against the compiled tables.

Replays a recording through the pipeline once to get real feature rows (healthy GPUs,
precursors, confounders — tree paths depend on the data, random rows mislead), then
scores them in the replay's 10,000-row chunks on one thread, per estimator, with
scikit-learn's own ``predict`` and with :mod:`models.treeeval`, checks the outputs are
identical and prints rows per CPU second (``time.process_time``; best of ``--runs``:
the machines are shared, the minimum is the least disturbed run).

Usage::

    python bench/bench_scoring.py [--recording DIR] [--rows 200000] [--runs 3]
                                  [--write bench/results/scoring.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_detection import recording  # noqa: E402
from collector.recording import open_recording  # noqa: E402
from models.bundle import ModelBundle, default_model_path  # noqa: E402
from pipeline.stream import FeaturePipeline  # noqa: E402

CHUNK = 10_000


def features(path: Path, rows: int) -> np.ndarray:
    xs, n = [], 0
    for b in FeaturePipeline().replay(open_recording(path).iter_windows(600, align=60)):
        xs.append(b.x)
        n += len(b)
        if n >= rows:
            break
    return np.concatenate(xs)[:rows].astype(np.float32)


def best_rate(fn, x: np.ndarray, runs: int) -> tuple[float, np.ndarray]:
    fn(x[:100])  # compile / warm up
    best, out = np.inf, None
    for _ in range(runs):
        c = time.process_time()
        out = np.concatenate([fn(x[i:i + CHUNK]) for i in range(0, len(x), CHUNK)])
        best = min(best, time.process_time() - c)
    return len(x) / best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recording", type=Path, help="default: home seed 1, 64 nodes x 24 h (the benches' cache)")
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--write", type=Path)
    a = ap.parse_args()
    bundle = ModelBundle.load(a.model or default_model_path())
    clf, an = bundle.classifier, bundle.anomaly
    a.recording = a.recording or recording(1, 64, 24.0)
    x = features(a.recording, a.rows)
    binary, classes = clf._trees()
    xs = clf.select(x)   # the classifier's own inputs, as its trees were fitted on
    risky = xs[clf.score(x).p >= clf.class_min_p]
    v = an._view(x)
    an._forest_scores(v[:10])
    cases = [
        ("failure classifier, binary (every row)", xs,
         lambda z: clf.model._raw_predict(z)[:, 0], lambda z: binary.raw(z)[:, 0]),
        ("fault-class model (rows with p >= 0.02)", risky,
         lambda z: clf.class_model.predict(z), lambda z: classes.predict_class(z, clf.class_model.classes_)),
        ("isolation forest (every row)", v, an.forest.score_samples, an._compiled.score_samples),
    ]
    lines = [f"### {dt.date.today()} — {platform.node()}, Python {platform.python_version()}",
             f"{len(x):,} feature rows of {a.recording}, chunks of {CHUNK:,}, one thread, best of {a.runs}", "",
             "| estimator | rows | scikit-learn rows/CPU-s | compiled rows/CPU-s | speed-up | identical |",
             "|---|---|---|---|---|---|"]
    with threadpool_limits(1):
        for name, data, ref_fn, new_fn in cases:
            if len(data) == 0:
                continue
            r_ref, o_ref = best_rate(ref_fn, data, a.runs)
            r_new, o_new = best_rate(new_fn, data, a.runs)
            lines.append(f"| {name} | {len(data):,} | {r_ref:,.0f} | {r_new:,.0f} | {r_new / r_ref:.1f}x | "
                         f"{np.array_equal(o_ref, o_new)} |")
            print(lines[-1], flush=True)
    print("\n".join(lines))
    if a.write:
        with a.write.open("a") as fh:
            fh.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
