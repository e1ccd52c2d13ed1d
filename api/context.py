"""What the API's routes read and call: one object, built by the composition (``api/service.py``).

Routes stay thin (STYLE.md): they check the caller and the input, then call what this
context holds. Tests build one from small real parts (an SQLite store, the dry-run
adapter, a :class:`~api.nodeview.NodeView` fed by hand).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from api.nodeview import NodeView
from remediation.engine import Engine
from remediation.store import ActionStore


class ModelRegistry(Protocol):
    """The model bundles on disk and which one scores (``/v1/models``)."""

    def list(self) -> list[dict[str, Any]]: ...

    def metrics(self, name: str) -> dict[str, Any]: ...

    def activate(self, name: str, actor: str) -> dict[str, Any]: ...

    def train(self, params: dict[str, Any], actor: str) -> dict[str, Any]: ...

    def job(self, job_id: str) -> dict[str, Any] | None: ...


class ReplayJobs(Protocol):
    """Replays run in the background (``/v1/replays``)."""

    def start(self, recording: str, params: dict[str, Any], actor: str) -> dict[str, Any]: ...

    def get(self, job_id: str) -> dict[str, Any] | None: ...

    def report(self, job_id: str) -> dict[str, Any] | None: ...

    def list(self) -> list[dict[str, Any]]: ...


@dataclass
class AppContext:
    """Everything a request may touch. ``engine`` exists on every replica; only the leader acts
    (``engine.acting``): elsewhere people's decisions are recorded and the leader carries them out."""

    store: ActionStore
    engine: Engine
    nodes: NodeView
    models: ModelRegistry
    replays: ReplayJobs
    #: api.auth.Auth (tokens with roles); typed loosely here so this module stays import-light
    auth: Any
    #: api.metrics.Metrics (prometheus-client registry and the gauges/counters the service updates)
    metrics: Any
    is_leader: Callable[[], bool] = lambda: True
    #: (ready, why) for /readyz: the store answers, the scorers are caught up, ...
    ready: Callable[[], tuple[bool, str]] = lambda: (True, "ok")
    started_at: float = field(default_factory=time.time)
    version: str = ""
    #: /metrics without a token (a Prometheus on a trusted network); False: a viewer token is needed
    metrics_public: bool = False
