"""Engine tick cost: decide and persist 1,000 node scores per tick, on SQLite and PostgreSQL.

Each tick the engine runs the policy over 1,000 nodes, gates and persists the tick's
decisions (a few rules firing, as on a bad day), upserts every node's latest score, and
passes over its open actions (verification, retries). Target (issue 9): < 50 ms per tick
on both stores. The dry-run adapter stands in for the scheduler, so this measures the
engine and the store, not Slurm (bench_slurm_latency.py measures that).

    python bench/bench_engine.py [--ticks 200] [--nodes 1000] [--shadows K] [--postgres URL] [--write]

``--shadows K`` adds K shadow policies (remediation/shadow.py: decided every tick, never carried out).

``--postgres`` defaults to ``$GPUOPS_TEST_POSTGRES`` (deploy/testservices/postgres_up.sh).
``--write`` records the table in bench/results/engine.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collector.schema import Action  # noqa: E402
from models.base import class_index  # noqa: E402
from models.node_scores import NodeScores  # noqa: E402
from remediation.adapters.dryrun import DryRunAdapter  # noqa: E402
from remediation.config import PolicyConfig  # noqa: E402
from remediation.engine import Engine  # noqa: E402
from remediation.shadow import ShadowPolicies  # noqa: E402
from remediation.safety import SafetyConfig  # noqa: E402
from remediation.store import ActionStore  # noqa: E402

from tests.helpers import postgres_schema  # noqa: E402  (a throwaway schema, dropped afterwards)


def scores(n: int, ts: float, rng: np.random.Generator) -> NodeScores:
    idx = np.arange(n)
    rule = np.full(n, -1)
    rule[rng.choice(n, 3, replace=False)] = 0                       # three rules fire somewhere each tick
    p = rng.beta(0.5, 20, n)                                        # most nodes healthy, a tail of risk
    return NodeScores(ts, np.array([f"gpu-node-{i:05d}" for i in idx], object), p,
                      np.full(n, class_index("nvlink"), np.int8), idx % 8, idx, rule, idx % 8, idx,
                      np.where(rule >= 0, class_index("ib_link"), 0).astype(np.int8),
                      np.array([Action.DRAIN if r >= 0 else None for r in rule], object),
                      np.array([None] * n, object), rng.random(n) * 0.99, idx)


def run(url: str, ticks: int, nodes: int, shadows: int = 0) -> dict[str, float]:
    if url.startswith("postgresql"):
        with postgres_schema(url) as fresh:       # a new empty schema per run, dropped afterwards
            return _run(fresh, ticks, nodes, shadows)
    return _run(url, ticks, nodes, shadows)


def _run(url: str, ticks: int, nodes: int, shadows: int = 0) -> dict[str, float]:
    store = ActionStore(url)
    store.migrate()
    now = [time.time()]
    # shadow k acts a little earlier than the live policy (0.7): a different decision stream, as a real one is
    shadow = ShadowPolicies({f"s{k}": PolicyConfig(act_threshold=0.6 - 0.05 * k, alert_threshold=0.3)
                             for k in range(shadows)}) if shadows else None
    engine = Engine(store, DryRunAdapter(), safety=SafetyConfig(), clock=lambda: now[0], shadow=shadow)
    engine.start()
    rng = np.random.default_rng(1)
    times, cpu = [], []
    for _ in range(ticks):
        now[0] += 60
        s = scores(nodes, now[0], rng)
        t, c = time.perf_counter(), time.process_time()
        engine.tick(s, lambda i, src: f"{src} fired")
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    actions = len(store.query(limit=1_000_000))
    store.close()
    times.sort()
    return {"p50_ms": 1e3 * statistics.median(times), "p99_ms": 1e3 * times[int(0.99 * (len(times) - 1))],
            "max_ms": 1e3 * times[-1], "cpu_ms": 1e3 * statistics.median(cpu), "actions": actions}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ticks", type=int, default=200)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--postgres", default=os.environ.get("GPUOPS_TEST_POSTGRES"))
    ap.add_argument("--shadows", type=int, default=0, help="shadow policies decided beside the live one")
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        backends = [("SQLite (file, WAL)", f"sqlite:///{d}/bench.db")]
        if a.postgres:
            backends.append(("PostgreSQL 15 (127.0.0.1)", a.postgres))
        else:
            print("no --postgres / GPUOPS_TEST_POSTGRES: PostgreSQL not measured", file=sys.stderr)
        rows = [(name, run(url, a.ticks, a.nodes, a.shadows)) for name, url in backends]
    lines = [f"# Engine tick — {date.today()} (CPython {platform.python_version()}, {os.cpu_count()} cores, "
             f"{platform.machine()})", "",
             f"{a.nodes} nodes scored per tick, 3 rules firing per tick (default safety limits: most are held "
             f"for a person after the caps fill), {a.ticks} ticks; dry-run adapter"
             + (f"; {a.shadows} shadow policies" if a.shadows else "") + ". "
             f"`python bench/bench_engine.py --ticks {a.ticks} --nodes {a.nodes}"
             + (f" --shadows {a.shadows}" if a.shadows else "") + "`", "",
             f"Load average at the start: {os.getloadavg()[0]:.1f} (this VM is shared; wall times move with it, "
             "the engine's own CPU per tick much less).", "",
             "| store | p50 per tick (wall) | p99 | max | engine CPU per tick (p50) | action records at the end |",
             "|---|---|---|---|---|---|"]
    for name, r in rows:
        lines.append(f"| {name} | {r['p50_ms']:.1f} ms | {r['p99_ms']:.1f} ms | {r['max_ms']:.1f} ms | "
                     f"{r['cpu_ms']:.1f} ms | {r['actions']} |")
    lines += ["", "Target (issue 9): decide and persist 1,000 node scores per tick in < 50 ms on each store."]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.write:
        (Path(__file__).parent / "results" / "engine.md").write_text(text)


if __name__ == "__main__":
    main()
