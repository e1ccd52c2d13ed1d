"""Drain latency through the Slurm adapter: from ``adapter.drain()`` to ``sinfo`` showing DRAIN.

Against the real test cluster (deploy/testservices/slurm_up.sh; ``SLURM_CONF`` in the
environment or ``--slurm-conf``). Each repetition, on an idle node:

1. ``t0``; ``SlurmAdapter.drain(node, reason)`` — reads the node (``sinfo --json``: whose
   drain is it?), then ``scontrol update state=DRAIN``; ``t_call`` when it returns;
2. polls ``sinfo -h -N -n NODE -o %T`` every 10 ms until the state reads drain/draining/
   drained; ``t_seen`` at the first such answer;
3. ``SlurmAdapter.resume`` and waits until the node is idle again (not timed).

Reported: p50 / p99 / max of ``t_call - t0`` (the adapter call) and ``t_seen - t0`` (what an
operator or the engine's verification would see). Target (issue): p99 < 1 s.

Usage::

    python bench/bench_slurm_latency.py --reps 20 --write bench/results/slurm_latency.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from remediation.adapters.slurm import SlurmAdapter  # noqa: E402


def sinfo_state(node: str) -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"], capture_output=True, text=True,
                         timeout=30, check=True).stdout.split()
    return out[0] if out else ""


def wait_for(predicate, timeout_s: float, interval_s: float) -> float:
    """Poll until *predicate* holds; the monotonic time of the first true answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return time.monotonic()
        if time.monotonic() >= deadline:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def measure(adapter: SlurmAdapter, node: str, reps: int) -> tuple[list[float], list[float]]:
    calls, seen = [], []
    for i in range(reps):
        wait_for(lambda: sinfo_state(node) == "idle", 30, 0.05)
        t0 = time.monotonic()
        adapter.drain(node, f"gpuops: bench drain id=bench{i:04d}")
        t_call = time.monotonic()
        t_seen = wait_for(lambda: sinfo_state(node).startswith("drain"), 10, 0.01)
        calls.append(t_call - t0)
        seen.append(t_seen - t0)
        adapter.resume(node, f"gpuops: bench resume id=bench{i:04d}")
    wait_for(lambda: sinfo_state(node) == "idle", 30, 0.05)
    return calls, seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--node", default="gpu-node-04")
    p.add_argument("--slurm-conf", default=os.environ.get("SLURM_CONF"))
    p.add_argument("--write", type=Path, help="write the markdown result here")
    args = p.parse_args()
    if not args.slurm_conf:
        sys.exit("no SLURM_CONF: run deploy/testservices/slurm_up.sh and export the line it prints")
    os.environ["SLURM_CONF"] = args.slurm_conf
    adapter = SlurmAdapter(slurm_conf=args.slurm_conf)

    calls, seen = measure(adapter, args.node, args.reps)
    ms = lambda v: f"{v * 1000:.0f} ms"  # noqa: E731
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        f"# Slurm drain latency — {dt.date.today()} ({platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} cores, {platform.machine()})",
        "",
        f"Real Slurm 22.05 test cluster (`deploy/testservices/slurm_up.sh`), node `{args.node}`, "
        f"{args.reps} repetitions, load average {load}. "
        f"`python bench/bench_slurm_latency.py --reps {args.reps} --node {args.node}`",
        "",
        "| measurement | p50 | p99 | max |",
        "|---|---|---|---|",
        f"| `SlurmAdapter.drain()` returns (`sinfo --json` + `scontrol update`) | {ms(percentile(calls, 50))} "
        f"| {ms(percentile(calls, 99))} | {ms(max(calls))} |",
        f"| drain call → `sinfo` shows drain | {ms(percentile(seen, 50))} | **{ms(percentile(seen, 99))}** "
        f"| {ms(max(seen))} |",
        "",
        f"Target: < 1 s (p99). Mean drain → seen {statistics.mean(seen) * 1000:.0f} ms.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        args.write.write_text(text)


if __name__ == "__main__":
    main()
