"""``/v1/coverage``: the precursor signals nodes do not send, and what to enable on them.

A node whose exporter leaves a counter out is one where gpuops sees faults of that class only
when they happen (models/coverage.py): dcgm-exporter's default counter set, for one, sends no
ECC or NVLink error counters, and a node whose BMC the agent does not read gives no witness of a
supply failure. Read from every node's latest scores in the fleet view
(:meth:`api.nodeview.NodeView.coverage`).
"""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import Ctx, Viewer
from api.routes import AUTH_ERRORS
from api.schemas import Coverage

router = APIRouter(prefix="/v1/coverage", tags=["nodes"], responses=AUTH_ERRORS)


@router.get("", response_model=Coverage)
def coverage(ctx: Ctx, _: Viewer) -> Coverage:
    """Which nodes send no ECC, NVLink, PCIe, throttle, temperature, power, clock, InfiniBand port or BMC telemetry
    (so their faults of those classes are caught only when they happen), and the exporter fields or agent sources to
    turn on."""
    return Coverage.model_validate(ctx.nodes.coverage())
