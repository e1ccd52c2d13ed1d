"""Throughput and latency of the control API: ``GET /v1/nodes`` for 1,000 nodes, and one ``POST /v1/actions``.

The server is the real application (:func:`api.app.create_app`) with one uvicorn worker in a
subprocess on 127.0.0.1, around a context of real parts: a SQLite action store (migrated),
the engine on the dry-run adapter, and a :class:`~api.nodeview.NodeView` fed one tick of
``--nodes`` nodes (so the list body is the one prepared at that tick, ~110 bytes a node).

The load generator is a ``wrk``-like loop in this process: ``--connections`` keep-alive
HTTP/1.1 connections on raw sockets, one thread each, each sending the next request as soon
as the previous answer is read in full, for ``--seconds``. Socket I/O releases the GIL, so
the client costs little next to the server; every answer's status and length are checked.
Reported: requests/s over all connections, and p50/p99/max latency (send to last byte).
Target (issue 10): >= 1,000 requests/s with p99 < 25 ms.

``POST /v1/actions`` (a dry-run drain through the engine, the store's writes included) is
timed ``--posts`` times, one after another, on distinct nodes.

Usage::

    python bench/bench_api.py [--nodes 1000] [--seconds 10] [--connections 4] [--posts 50]
                              [--write bench/results/api.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOKEN_ENV = "GPUOPS_BENCH_TOKEN"


# ---- the server (subprocess) ----------------------------------------------------------------

def build_app(nodes: int, db: Path, token: str):
    """The real application around real parts, with one tick of *nodes* nodes in the fleet view."""
    import numpy as np

    from api.app import create_app
    from api.auth import Auth, Role, TokenEntry, token_hash
    from api.context import AppContext
    from api.metrics import Metrics
    from api.model_registry import DirModelRegistry
    from api.nodeview import NodeView
    from api.replay_jobs import ThreadReplayJobs
    from models.bundle import ModelBundle
    from models.node_scores import NodeScores
    from remediation.adapters.dryrun import DryRunAdapter
    from remediation.config import PolicyConfig
    from remediation.engine import Engine
    from remediation.store import ActionStore

    store = ActionStore(f"sqlite:///{db}")
    store.migrate()
    engine = Engine(store, DryRunAdapter())
    engine.start()
    rng = np.random.default_rng(0)
    idx = np.arange(nodes)
    rule = np.where(rng.random(nodes) < 0.01, 0, -1)
    ns = NodeScores(time.time(), np.array([f"gpu-node-{i:05d}" for i in idx], object), rng.beta(0.5, 8, nodes),
                    rng.integers(0, 5, nodes).astype(np.int8), idx % 8, idx, rule, idx % 8, idx,
                    np.zeros(nodes, np.int8), np.array([None] * nodes, object), np.array([None] * nodes, object),
                    rng.random(nodes) * 0.2, idx)
    view = NodeView()
    view.update(ns)
    root = db.parent / "models"
    root.mkdir(exist_ok=True)
    ctx = AppContext(store=store, engine=engine, nodes=view, models=DirModelRegistry(root, root / "ACTIVE"),
                     replays=ThreadReplayJobs(ModelBundle.rules_only, PolicyConfig()),
                     auth=Auth([TokenEntry("bench", Role.OPERATOR, token_hash(token))]), metrics=Metrics())
    return create_app(ctx)


def serve(port: int, nodes: int, db: Path) -> None:
    import uvicorn

    app = build_app(nodes, db, os.environ[TOKEN_ENV])
    uvicorn.run(app, host="127.0.0.1", port=port, workers=1, log_level="warning", access_log=False)


# ---- the load generator -------------------------------------------------------------------------

def _read_response(sock: socket.socket, buf: bytearray) -> tuple[int, int, bytearray]:
    """Read one HTTP/1.1 response with a Content-Length; returns (status, body length, leftover)."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(262144)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = next(int(ln.split(b":", 1)[1]) for ln in lines[1:] if ln.lower().startswith(b"content-length:"))
    rest = bytearray(rest)
    while len(rest) < length:
        chunk = sock.recv(262144)
        if not chunk:
            raise ConnectionError("server closed the connection mid-body")
        rest += chunk
    return status, length, rest[length:]


def load(port: int, path: str, token: str, connections: int, seconds: float) -> dict:
    request = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
               "Accept: application/json\r\n\r\n").encode()
    latencies: list[list[float]] = [[] for _ in range(connections)]
    lengths: set[int] = set()
    errors: list[str] = []
    start = threading.Barrier(connections + 1)
    stop_at = [0.0]

    def worker(k: int) -> None:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        mine = latencies[k]
        start.wait()
        try:
            while time.perf_counter() < stop_at[0]:
                t0 = time.perf_counter()
                sock.sendall(request)
                status, length, buf = _read_response(sock, buf)
                mine.append(time.perf_counter() - t0)
                if status != 200:
                    errors.append(f"HTTP {status}")
                    return
                lengths.add(length)
        except OSError as e:
            errors.append(str(e))
        finally:
            sock.close()

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(connections)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    stop_at[0] = t0 + seconds
    start.wait()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    all_ms = sorted(x * 1000 for lat in latencies for x in lat)
    if errors or not all_ms:
        raise SystemExit(f"load failed: {errors[:3]}")
    q = statistics.quantiles(all_ms, n=100)
    return {"requests": len(all_ms), "seconds": wall, "rps": len(all_ms) / wall, "p50_ms": q[49], "p99_ms": q[98],
            "max_ms": all_ms[-1], "body_bytes": sorted(lengths)}


def time_posts(url: str, token: str, n: int) -> dict:
    import httpx

    ms = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as c:
        for i in range(n):
            t0 = time.perf_counter()
            r = c.post("/v1/actions", json={"kind": "drain", "node": f"gpu-node-{i:05d}", "reason": "bench"})
            ms.append((time.perf_counter() - t0) * 1000)
            if r.status_code != 202:
                raise SystemExit(f"POST /v1/actions: HTTP {r.status_code}: {r.text[:200]}")
    return {"n": n, "p50_ms": statistics.median(ms), "max_ms": max(ms), "first_ms": ms[0]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--posts", type=int, default=50)
    ap.add_argument("--write", type=Path, help="Append the results to this markdown file.")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)   # the server subprocess
    ap.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(a.serve, a.nodes, a.db)
        return

    import secrets

    import httpx

    token = secrets.token_urlsafe(24)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp:
        proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--nodes", str(a.nodes),
                                 "--db", str(Path(tmp) / "actions.db")], env={**os.environ, TOKEN_ENV: token})
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the server did not start")
                time.sleep(0.2)
            count = httpx.get(url + "/v1/nodes", headers={"Authorization": f"Bearer {token}"}).json()["count"]
            assert count == a.nodes, count
            load(port, "/v1/nodes", token, a.connections, 1.0)                 # warm-up
            res = load(port, "/v1/nodes", token, a.connections, a.seconds)
            filt = load(port, "/v1/nodes?state=at_risk", token, a.connections, min(a.seconds, 5.0))
            posts = time_posts(url, token, a.posts)
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    ok = res["rps"] >= 1000 and res["p99_ms"] < 25
    lines = [
        f"### {dt.date.today()} — {platform.node()}, Python {platform.python_version()}, {os.cpu_count()} CPUs",
        f"{a.nodes:,} nodes, uvicorn 1 worker ({_uvicorn_http()}), {a.connections} keep-alive connections, "
        f"{a.seconds:g} s",
        "",
        "| request | requests/s | p50 ms | p99 ms | max ms | body bytes |",
        "|---|---|---|---|---|---|",
        f"| GET /v1/nodes (prepared body) | {res['rps']:,.0f} | {res['p50_ms']:.2f} | {res['p99_ms']:.2f} | "
        f"{res['max_ms']:.1f} | {res['body_bytes'][0]:,} |",
        f"| GET /v1/nodes?state=at_risk (built per request) | {filt['rps']:,.0f} | {filt['p50_ms']:.2f} | "
        f"{filt['p99_ms']:.2f} | {filt['max_ms']:.1f} | {filt['body_bytes'][0]:,} |",
        "",
        f"POST /v1/actions (dry-run drain through the engine, SQLite writes): median {posts['p50_ms']:.1f} ms, "
        f"max {posts['max_ms']:.1f} ms over {posts['n']} (first {posts['first_ms']:.1f} ms).",
        "",
        f"Target >= 1,000 requests/s with p99 < 25 ms: **{'met' if ok else 'NOT met'}**.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if a.write:
        with a.write.open("a") as f:
            f.write(text + "\n")


def _uvicorn_http() -> str:
    try:
        import httptools  # noqa: F401
        return "httptools"
    except ImportError:
        return "h11"


if __name__ == "__main__":
    main()
