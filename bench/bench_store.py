"""Latency of the action store on SQLite (a file) and PostgreSQL: can it keep up with a tick?

Every tick the engine upserts the latest score of every node, inserts the few actions it
decided, and reads the open actions back. This measures those calls, and the tick they make
together, on a store that already holds a history (``--history`` closed records) so the
indexes do real work:

- ``insert_many(1,000)``: one transaction of 1,000 new records (a replay's backlog);
- ``put_scores(1,000)``: the upsert of 1,000 nodes' scores (all rows exist after the first);
- ``open_actions()``: the ~20 open records among the history;
- ``update`` (compare-and-set, with its audit event), one record;
- the **tick**: ``put_scores(1,000)`` + 10 × ``insert`` + ``open_actions()``; target < 50 ms.

Wall time (``time.perf_counter``: the database's I/O and the server's work count), median and
worst of ``--runs``. SQLite runs with the store's settings (WAL, ``synchronous=FULL``: each
commit is fsync'ed); PostgreSQL is the test server of ``deploy/testservices/postgres_up.sh``
(default settings, fsync on), reached over TCP on 127.0.0.1, in a fresh schema dropped after.

Usage::

    python bench/bench_store.py [--postgres URL] [--runs 30] [--history 5000]
                                [--write bench/results/store.md]

``--postgres`` defaults to ``$GPUOPS_TEST_POSTGRES``; without either only SQLite runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sqlalchemy as sa  # noqa: E402

from remediation.actions import ActionKind, ActionRecord, ActionState  # noqa: E402
from remediation.store import ActionStore, NodeScoreRow  # noqa: E402
from tests.helpers import postgres_schema  # noqa: E402  (a throwaway schema, dropped afterwards)

NODES = 1_000
T0 = 1_800_000_000.0


class Ids:
    """Fresh record ids, unique across the whole run."""

    def __init__(self) -> None:
        self.n = 0

    def records(self, k: int, state: ActionState, at: float) -> list[ActionRecord]:
        out = []
        for _ in range(k):
            self.n += 1
            node = f"gpu-node-{self.n % NODES:04d}"
            out.append(ActionRecord(
                id=f"bench{self.n:015d}", node=node, kind=ActionKind.DRAIN, state=state,
                reason="gpuops: drain xid79", actor="engine", incident_ts=at, created_at=at + self.n * 1e-3,
                updated_at=at, fault="xid79", grade="confirmed", source="model", score=0.9,
                evidence={"risk": 0.9, "features": {"xid79_count": 2, "sbe_rate_per_h": 0.0}},
                adapter="slurm", dry_run=False))
        return out


def scores(tick: int) -> list[NodeScoreRow]:
    return [NodeScoreRow(f"gpu-node-{i:04d}", T0 + 60 * tick, (i * 7919 % 1000) / 1000, None,
                         (i * 104729 % 1000) / 1000, None, "ok") for i in range(NODES)]


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def bench(url: str, runs: int, history: int) -> dict[str, list[float]]:
    store = ActionStore(url)
    store.migrate()
    ids = Ids()
    try:
        for i in range(0, history, 1000):  # closed history, so open_actions has something to skip
            store.insert_many(ids.records(min(1000, history - i), ActionState.VERIFIED, T0))
        store.insert_many(ids.records(20, ActionState.EXECUTING, T0))
        store.put_scores(scores(0))
        res: dict[str, list[float]] = {}
        res["insert_many(1,000)"] = timed(
            lambda: store.insert_many(ids.records(1000, ActionState.CANCELLED, T0)), max(3, runs // 5))
        tick = iter(range(1, 10 ** 6))
        res["put_scores(1,000)"] = timed(lambda: store.put_scores(scores(next(tick))), runs)
        res["open_actions() (20 open)"] = timed(store.open_actions, runs)

        def one_update() -> None:
            (rec,) = ids.records(1, ActionState.PROPOSED, T0)
            store.insert(rec)
            t = time.perf_counter()
            store.update(rec.moved(ActionState.CANCELLED, T0 + 1), ActionState.PROPOSED, "engine")
            res.setdefault("update (compare-and-set)", []).append((time.perf_counter() - t) * 1000)

        for _ in range(runs):
            one_update()
        res["insert (one record)"] = timed(lambda: store.insert(ids.records(1, ActionState.CANCELLED, T0)[0]), runs)

        def a_tick() -> None:
            store.put_scores(scores(next(tick)))
            for rec in ids.records(10, ActionState.CANCELLED, T0):
                store.insert(rec)
            store.open_actions()

        res["tick: put_scores(1,000) + 10 x insert + open_actions()"] = timed(a_tick, runs)
        return res
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--postgres", default=os.environ.get("GPUOPS_TEST_POSTGRES", ""))
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--history", type=int, default=5000)
    ap.add_argument("--write", type=Path)
    a = ap.parse_args()
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        print("sqlite ...", file=sys.stderr, flush=True)
        results["SQLite file"] = bench(f"sqlite:///{tmp}/actions.db", a.runs, a.history)
    if a.postgres:
        print("postgres ...", file=sys.stderr, flush=True)
        with postgres_schema(a.postgres) as url:
            engine = sa.create_engine(url)
            with engine.connect() as c:
                version = c.exec_driver_sql("SHOW server_version").scalar()
            engine.dispose()
            results[f"PostgreSQL {version.split()[0]}"] = bench(url, a.runs, a.history)
    else:
        print("no --postgres URL and no GPUOPS_TEST_POSTGRES: SQLite only", file=sys.stderr)

    backends = list(results)
    lines = [f"### {dt.date.today()} — {platform.node()}, Python {platform.python_version()}, "
             f"SQLAlchemy {sa.__version__}, SQLite {__import__('sqlite3').sqlite_version}",
             f"{a.history:,} closed records + 20 open in the store, {NODES:,} nodes; "
             f"ms wall time, median / worst of {a.runs} runs (insert_many: {max(3, a.runs // 5)})", "",
             "| operation | " + " | ".join(backends) + " |",
             "|---|" + "---|" * len(backends)]
    for op in results[backends[0]]:
        cells = [f"{statistics.median(results[b][op]):.1f} / {max(results[b][op]):.1f}" for b in backends]
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    if a.write:
        with a.write.open("a") as fh:
            fh.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
