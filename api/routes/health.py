"""``/healthz`` (the process answers), ``/readyz`` (it can serve: store, scorers) and ``/metrics``."""

from __future__ import annotations

import time

from fastapi import APIRouter, Response
from starlette.concurrency import run_in_threadpool

from api.auth import Role
from api.deps import Credentials, Ctx, caller
from api.errors import ApiError
from api.metrics import CONTENT_TYPE
from api.schemas import ErrorBody, Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz(ctx: Ctx) -> Health:
    """The process is alive (no token needed)."""
    return Health(status="ok", uptime_s=round(time.time() - ctx.started_at, 3), version=ctx.version)


@router.get("/readyz", response_model=Health, responses={503: {"model": ErrorBody, "description": "Not ready"}})
def readyz(ctx: Ctx) -> Health:
    """Ready to serve: the store answers, the scorers are caught up (no token needed)."""
    ok, why = ctx.ready()
    if not ok:
        raise ApiError(503, f"not ready: {why}")
    return Health(status="ready", detail=why, uptime_s=round(time.time() - ctx.started_at, 3), version=ctx.version)


_need_viewer = caller(Role.VIEWER)


@router.get("/metrics", response_class=Response, responses={
    200: {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}},
    401: {"model": ErrorBody, "description": "No or unknown token (unless metrics_public)"},
    403: {"model": ErrorBody, "description": "Role too low"}})
async def metrics(ctx: Ctx, cred: Credentials) -> Response:
    """Prometheus metrics. Needs a viewer token unless the service sets ``metrics_public``
    (Prometheus sends one with ``authorization: {credentials_file: ...}`` in its scrape config)."""
    if not ctx.metrics_public:
        await _need_viewer(ctx, cred)
    # rendering reads the engine's switches from the store: off the event loop
    return Response(await run_in_threadpool(ctx.metrics.render), media_type=CONTENT_TYPE)
