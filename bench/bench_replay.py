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
        [--recording DIR] [--model models/default] [--runs 3] [--compare REV] [--write bench/results/replay.md]

``--compare REV`` measures the code at git revision *REV* (checked out in a temporary
worktree) against this checkout's working tree, one replay per process, alternating
REV / this tree ``--runs`` times after one discarded warm-up run of each (numba loads or
compiles its kernels there), with the same recording and model: these VMs drift by
10-20 % within an hour, so only runs taken side by side compare two versions. A ``--model``
inside this checkout (``models/default``) is each revision's own copy, whose rules name that
revision's features; a model directory outside it is shared.

The glibc settings of shared/PERFORMANCE.md (``MALLOC_MMAP_THRESHOLD_=33554432
MALLOC_TRIM_THRESHOLD_=17179869184 MALLOC_TOP_PAD_=268435456``) cut page-fault time
further; they are not needed to reach the target.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not whatever pip installed

from api.replay import Replayer  # noqa: E402
from bench_detection import recording  # noqa: E402
from models.bundle import ModelBundle  # noqa: E402
from remediation.config import PolicyConfig  # noqa: E402


def run_row(s: dict) -> dict:
    """A replay's stats (``cpu_s``, ``wall_s``, ``gpu_samples``, ``stage_cpu_s``) as one measured run."""
    return {"cpu_s": s["cpu_s"], "wall_s": s["wall_s"], "gpu_samples": s["gpu_samples"],
            "per_cpu_s": s["gpu_samples"] / s["cpu_s"], "per_wall_s": s["gpu_samples"] / s["wall_s"],
            **{f"{k}_s": v for k, v in s["stage_cpu_s"].items()}}


def one_run(bundle: ModelBundle, recording: Path) -> dict:
    return run_row(Replayer(bundle, PolicyConfig()).run(recording).stats)


def measure(name: str, bundle: ModelBundle, recording: Path, runs: int) -> dict:
    rs = [one_run(bundle, recording) for _ in range(runs)]
    for r in rs:
        print(f"  {name}: {r['per_cpu_s']:,.0f} GPU samples/CPU-s ({r['cpu_s']:.1f} s CPU, {r['wall_s']:.1f} s wall)"
              f" read {r['read_s']:.1f} / pipeline {r['pipeline_s']:.1f} / scoring {r['scoring_s']:.1f}"
              f" / policy {r['policy_s']:.1f} s CPU", flush=True)
    med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
    med["name"] = name
    return med


HERE = Path(__file__).resolve().parents[1]
HEADER = f"### {dt.date.today()} — {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}"

#: one replay by the code under ``argv[1]`` (a checkout), printed as one JSON line
ONE_RUN = """
import json, sys
sys.path.insert(0, sys.argv[1])
from api.replay import Replayer
from models.bundle import ModelBundle
from remediation.config import PolicyConfig
bundle = ModelBundle.rules_only() if sys.argv[3] == "-" else ModelBundle.load(sys.argv[3])
s = Replayer(bundle, PolicyConfig()).run(sys.argv[2]).stats
print(json.dumps({k: s[k] for k in ("cpu_s", "wall_s", "gpu_samples", "stage_cpu_s")}))
"""


def run_in(root: Path, recording: Path, model: Path | None) -> dict:
    """One replay in a fresh process with the code of checkout *root*; its stats as :func:`one_run` gives."""
    p = subprocess.run([sys.executable, "-c", ONE_RUN, str(root), str(recording), str(model) if model else "-"],
                       cwd=root, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"replay with the code of {root} failed:\n{p.stderr.strip()[-2000:]}")
    return run_row(json.loads(p.stdout.strip().splitlines()[-1]))


def model_in(root: Path, model: Path | None) -> Path | None:
    """*model* as checkout *root* has it: a model directory inside this checkout (``models/default``) is each
    revision's own, since its rules name the features of that revision's pipeline; one outside is shared."""
    if model is None or not model.is_relative_to(HERE):
        return model
    return root / model.relative_to(HERE)


def compare(rev: str, recording: Path, model: Path | None, runs: int,
            runner=run_in) -> list[dict]:
    """Replays by the code at *rev* and by this working tree, alternating (see the module docstring):
    one summary row per version (medians, and every run's GPU samples per CPU second)."""
    with tempfile.TemporaryDirectory(prefix="gpuops-compare-") as tmp:
        wt = Path(tmp) / "rev"
        add = subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", str(wt), rev],
                             capture_output=True, text=True)
        if add.returncode != 0:
            raise SystemExit(f"--compare {rev}: git could not check it out: {add.stderr.strip()}")
        try:
            sha = subprocess.run(["git", "-C", str(wt), "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip()
            trees = [(rev if rev.startswith(sha) else f"{rev} ({sha})", wt), ("this working tree", HERE)]
            for _, root in trees:
                runner(root, recording, model_in(root, model))  # warm-up, discarded
            got: dict[str, list[dict]] = {name: [] for name, _ in trees}
            for i in range(runs):
                for name, root in trees:
                    got[name].append(r := runner(root, recording, model_in(root, model)))
                    print(f"  run {i + 1}, {name}: {r['per_cpu_s']:,.0f} GPU samples/CPU-s ({r['cpu_s']:.1f} s CPU)",
                          flush=True)
        finally:
            subprocess.run(["git", "-C", str(HERE), "worktree", "remove", "--force", str(wt)], capture_output=True)
    rows = []
    for name, rs in got.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        rows.append(med | {"name": name, "runs": [r["per_cpu_s"] for r in rs]})
    return rows


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
    ap.add_argument("--compare", metavar="REV", help="measure git revision REV against this working tree, "
                    "alternating, one replay per process (with --model: that model, else rules only)")
    a = ap.parse_args()
    if a.runs < 1:
        ap.error("--runs must be at least 1")
    if a.recording is None:
        a.recording = recording(a.seed, a.nodes, a.hours, a.interval)
    elif not (a.recording / "manifest.json").is_file():
        ap.error(f"{a.recording}: not a recording (no manifest.json); omit --recording to simulate one")
    if a.compare:
        model = a.model.resolve() if a.model else None
        rows = compare(a.compare, a.recording.resolve(), model, a.runs)
        lines = [HEADER, f"recording {a.recording}: {rows[0]['gpu_samples']:,.0f} GPU samples; "
                 f"{'model ' + str(a.model) if a.model else 'rules only'}; {a.runs} runs each, alternating, "
                 "one process per run, after a warm-up run of each", "",
                 "| code | GPU samples/CPU-s (median) | every run | CPU s | read | pipeline | scoring | policy |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['name']} | {r['per_cpu_s']:,.0f} | {', '.join(f'{v / 1e3:,.0f} k' for v in r['runs'])} | "
                         f"{r['cpu_s']:.1f} | {r['read_s']:.1f} | {r['pipeline_s']:.1f} | {r['scoring_s']:.1f} | "
                         f"{r['policy_s']:.1f} |")
        emit(lines, a.write)
        return
    rows = [measure("rules only", ModelBundle.rules_only(), a.recording, a.runs)]
    if a.model:
        rows.append(measure(f"model {a.model}", ModelBundle.load(a.model), a.recording, a.runs))
    lines = [HEADER, f"recording {a.recording}: {rows[0]['gpu_samples']:,.0f} GPU samples; median of {a.runs} runs", "",
             "| bundle | GPU samples/CPU-s | GPU samples/wall-s | CPU s | read | pipeline | scoring | policy |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['per_cpu_s']:,.0f} | {r['per_wall_s']:,.0f} | {r['cpu_s']:.1f} | "
                     f"{r['read_s']:.1f} | {r['pipeline_s']:.1f} | {r['scoring_s']:.1f} | {r['policy_s']:.1f} |")
    emit(lines, a.write)


def emit(lines: list[str], write: Path | None) -> None:
    """Print a results table; with *write*, append it to that Markdown file too."""
    print("\n".join(lines))
    if write:
        with write.open("a") as fh:
            fh.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
