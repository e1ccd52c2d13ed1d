"""``/v1/nodes``: the fleet (state, risk, top fault) and one node in detail."""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Path, Query, Response

from api.context import AppContext
from api.deps import Ctx, Viewer
from api.errors import ApiError
from api.holds import hold_status, retry_cap
from api.routes import AUTH_ERRORS, NOT_FOUND
from api.schemas import ActionPublic, NodeDetail, NodeList
from remediation.actions import CARRIED_OUT, ActionKind, ActionRecord
from remediation.recovery import HISTORY_S

router = APIRouter(prefix="/v1/nodes", tags=["nodes"], responses=AUTH_ERRORS)

#: actions shown on a node's page
NODE_ACTIONS = 20
#: most records read to tell what holds a node (those since its last resume that can hold or resume it)
HOLD_RECORDS = 10_000
_STATES = "^(ok|at_risk|held|unknown)$"


@router.get("", response_class=Response, responses={200: {"model": NodeList}})
async def list_nodes(ctx: Ctx, _: Viewer,
               state: Annotated[str | None, Query(pattern=_STATES, description="Only nodes in this state.")] = None,
               min_risk: Annotated[float | None, Query(ge=0, le=1, description="Only nodes at or above this risk.")] = None,
               ) -> Response:
    """Every node with its state, risk and top fault. Unfiltered, the body is the one prepared at the
    last scoring tick (no encoding per request)."""
    # async: it reads the fleet view's current snapshot (no I/O, no lock), so it runs inline
    if state is None and min_risk is None:
        return Response(ctx.nodes.list_body(), media_type="application/json")
    rows = [r for r in ctx.nodes.nodes()
            if (state is None or r["state"] == state) and (min_risk is None or r["risk"] >= min_risk)]
    rows.sort(key=lambda r: r["node"])
    keep = ("node", "state", "risk", "fault", "gpu", "anomaly", "rule", "ts")
    return Response(orjson.dumps({"nodes": [{k: r[k] for k in keep} for r in rows], "count": len(rows),
                                  "ts": ctx.nodes.ts}), media_type="application/json")


@router.get("/{name}", response_model=NodeDetail, responses=NOT_FOUND)
def get_node(ctx: Ctx, _: Viewer, name: Annotated[str, Path(max_length=253)]) -> NodeDetail:
    """One node: GPU detail, score history, the features behind the score, recent events and actions, while
    gpuops holds it what its resume waits for (``hold``), and after a prediction that did not come true which of
    its predictions only alert, until when (``retry_cap``)."""
    row = ctx.nodes.get(name)
    if row is None:
        raise ApiError(404, f"no node named {name!r} has reported (GET /v1/nodes lists them)")
    records = ctx.store.query(node=name, limit=NODE_ACTIONS)
    state = ctx.engine.state.nodes.get(name) if ctx.is_leader() else None   # the policy's memory: the leader's
    hold = hold_status(_since_last_resume(ctx, name), row, ctx.engine.policy, state)
    acting = [k for k in ActionKind if k is not ActionKind.ALERT]   # what the retry cap is rebuilt from
    cap = retry_cap(ctx.store.query(node=name, kinds=acting, since=ctx.engine.clock() - HISTORY_S, limit=HOLD_RECORDS),
                    float(row["ts"]), ctx.engine.policy)
    return NodeDetail.model_validate({**row, "actions": [ActionPublic.of(r) for r in records], "hold": hold,
                                      "retry_cap": cap})


def _since_last_resume(ctx: AppContext, name: str) -> list[ActionRecord]:
    """*name*'s records that can hold it, from its last resume on (newest first): what holds it now, however
    many alerts and other actions came after the drain (the page lists only the latest ``NODE_ACTIONS``)."""
    last = ctx.store.query(node=name, kinds=[ActionKind.RESUME], states=list(CARRIED_OUT), limit=1)
    kinds = [k for k in ActionKind if k.holds_node or k is ActionKind.RESUME]
    return ctx.store.query(node=name, kinds=kinds, since=last[0].created_at if last else None, limit=HOLD_RECORDS)
