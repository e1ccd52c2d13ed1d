"""The API's test context, built from small real parts: an SQLite action store, the engine on the
dry-run adapter, a fleet view fed a few ticks, a model registry on a temp dir holding the shipped
model, and replay jobs. Tokens for each role are known to the tests (the config holds their hashes)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.auth import Auth, Role, TokenEntry, token_hash
from api.context import AppContext
from api.metrics import Metrics
from api.model_registry import DirModelRegistry
from api.nodeview import NodeView
from api.replay_jobs import ThreadReplayJobs
from models.bundle import ModelBundle, default_model_path
from remediation.adapters.dryrun import DryRunAdapter
from remediation.engine import Engine
from remediation.store import ActionStore
from tests.remediation.test_engine import LOOSE, POLICY, Clock, explain, fleet

TOKENS = {"viewer": "viewer-token-0123456789", "operator": "operator-token-0123456789",
          "admin": "admin-token-0123456789"}
#: nodes the fixture's fleet reports (n00000 .. n00005); n00001 has a rule firing
FLEET = 6


def headers(role: str | None) -> dict[str, str]:
    """The Authorization header of the test token of *role* (None: no header)."""
    return {} if role is None else {"Authorization": f"Bearer {TOKENS[role]}"}


def make_auth() -> Auth:
    return Auth([TokenEntry(role, Role.parse(role), token_hash(t)) for role, t in TOKENS.items()])




@pytest.fixture
def api_ctx(tmp_path: Path) -> Iterator[AppContext]:
    clock = Clock()
    store = ActionStore(f"sqlite:///{tmp_path / 'actions.db'}")
    store.migrate()
    engine = Engine(store, DryRunAdapter(), policy=POLICY, safety=LOOSE, clock=clock)
    engine.start()
    nodes = NodeView()
    for k in range(3):
        t = clock.t + 60.0 * k
        ns = fleet(FLEET, t, rule_nodes=[1], p=[0.0, 0.2, 0.9, 0.0, 0.05, 0.1])
        nodes.update(ns, {"n00001": {"rule": "XID 79 fell off the bus"}}, {"n00002": {"ecc_sbe_rate_per_h": 12.0}})
    clock.t += 180.0
    engine.tick(fleet(FLEET, clock.t, rule_nodes=[1]), explain)       # a drain of n00001 (dry run)
    nodes.set_held(engine.holds)
    nodes.add_events([{"node": "n00001", "kind": "xid", "xid": 79, "ts": clock.t}])
    root = tmp_path / "models"
    root.mkdir()
    (root / "default").symlink_to(default_model_path(), target_is_directory=True)
    activated: list[Path] = []
    registry = DirModelRegistry(root, root / "ACTIVE", activated.append, default="default")
    replays = ThreadReplayJobs(ModelBundle.rules_only, POLICY)
    ctx = AppContext(store=store, engine=engine, nodes=nodes, models=registry, replays=replays,
                     auth=make_auth(), metrics=Metrics(), version="test")
    ctx.activated = activated                  # type: ignore[attr-defined]   (what on_activate saw)
    ctx.clock = clock                          # type: ignore[attr-defined]
    yield ctx
    replays.close()
    store.close()


@pytest.fixture
def client(api_ctx: AppContext) -> Iterator[TestClient]:
    with TestClient(create_app(api_ctx), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="session")
def small_recording(tmp_path_factory) -> Path:
    """A small simulated recording with incidents (10 nodes, 8 h)."""
    from collector.simulator import SimConfig, simulate_recording

    out = tmp_path_factory.mktemp("rec") / "small"
    simulate_recording(SimConfig(nodes=10, hours=8, seed=4, rate_multiplier=1500), out)
    return out


@pytest.fixture
def live_api(api_ctx: AppContext) -> Iterator[str]:
    """The API served by a real uvicorn on 127.0.0.1 (a free port) in a thread; yields its URL."""
    import socket
    import threading

    import uvicorn

    from tests.helpers import wait_until

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(api_ctx), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn-test", daemon=True)
    thread.start()
    wait_until(lambda: server.started, timeout_s=20, message="uvicorn started")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()
