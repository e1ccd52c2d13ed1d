"""``/v1/coverage``: the precursor signals nodes do not send, and what to enable on them.

A node whose exporter leaves a counter out is one where gpuops sees faults of that class only
when they happen (models/coverage.py): dcgm-exporter's default counter set, for one, sends no
ECC or NVLink error counters. Read from every node's latest scores in the fleet view.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from fastapi import APIRouter

from api.deps import Ctx, Viewer
from api.routes import AUTH_ERRORS
from api.schemas import Coverage
from models.coverage import SIGNALS

router = APIRouter(prefix="/v1/coverage", tags=["nodes"], responses=AUTH_ERRORS)


def fleet_coverage(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Per signal of :data:`models.coverage.SIGNALS`: the nodes whose latest scores say they do not send it
    (sorted), the fault classes it warns of and what to enable; and how many nodes the scorers said anything
    about (a scorer older than the ``blind`` field says nothing)."""
    blind: dict[str, list[str]] = {s.name: [] for s in SIGNALS}
    known = 0
    for r in rows:
        names = r.get("blind_signals")
        if names is None:
            continue
        known += 1
        for n in names:
            blind.setdefault(n, []).append(r["node"])
    signals = [{"signal": s.name, "faults": [f.value for f in s.faults], "enable": s.enable,
                "nodes": sorted(blind[s.name]), "count": len(blind[s.name])} for s in SIGNALS]
    return {"signals": signals, "nodes_known": known}


@router.get("", response_model=Coverage)
def coverage(ctx: Ctx, _: Viewer) -> Coverage:
    """Which nodes send no ECC, NVLink, PCIe, throttle, temperature, power, clock or InfiniBand port telemetry
    (so their faults of those classes are caught only when they happen), and the exporter fields to turn on."""
    return Coverage.model_validate({**fleet_coverage(ctx.nodes.nodes()), "ts": ctx.nodes.ts})
