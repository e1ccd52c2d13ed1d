"""The control API: :func:`create_app` builds the FastAPI application around an :class:`AppContext`.

Nothing is built at import time; the composition (``api/service.py``) or a test builds the
context and calls :func:`create_app`. Routes live in ``api/routes/`` (one router per
resource), their dependencies in ``api/deps.py``, bodies in ``api/schemas.py`` and the
error answers in ``api/errors.py``. Everything is under ``/v1`` except ``/healthz``,
``/readyz`` and ``/metrics``; the OpenAPI document is ``/openapi.json``, its pages ``/docs``;
the dashboard is ``/ui/`` (``api/routes/ui.py``, ``/`` redirects there).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import errors
from api.context import AppContext
from api.routes import actions, coverage, engine, health, models, nodes, replays, silences, ui

API_VERSION = "1"


class _Latency:
    """Pure ASGI middleware: each request's latency into ``metrics.observe_request``, labelled by
    route template (``/v1/actions/{action_id}``), never by raw path (bounded label values)."""

    def __init__(self, app: ASGIApp, metrics: Any) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [500]

        async def _send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, _send)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.observe_request(scope["method"], path, status[0], time.perf_counter() - t0)


def create_app(ctx: AppContext) -> FastAPI:
    """The API for *ctx* (see the module docstring)."""
    app = FastAPI(title="gpuops", version=ctx.version or API_VERSION,
                  description="Fault prediction and safe auto-remediation for GPU clusters: the fleet, "
                  "actions, the engine, models and replays. Every route but /healthz and /readyz needs "
                  "a bearer token; mutations need the operator or admin role (docs/api.md).",
                  openapi_url="/openapi.json", docs_url="/docs", redoc_url=None)
    app.state.ctx = ctx
    ctx.metrics.bind(nodes=ctx.nodes, engine=ctx.engine, is_leader=ctx.is_leader)
    errors.install(app)
    for r in (nodes.router, coverage.router, actions.router, silences.router, engine.router, models.router,
              replays.router, health.router):
        app.include_router(r)
    ui.mount(app)
    app.add_middleware(_Latency, metrics=ctx.metrics)
    return app
