"""``/v1/engine``: status; arm and disarm (admin); pause and resume; the breaker and its reset (admin); what
the shadow policies would have done."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body

from api.context import AppContext
from api.deps import Admin, Ctx, Operator, Viewer
from api.routes import AUTH_ERRORS, UNAVAILABLE
from api.schemas import Breaker, EngineStatus, Note, RequiredNote, ShadowReport

router = APIRouter(prefix="/v1/engine", tags=["engine"], responses=AUTH_ERRORS | UNAVAILABLE)
OptNote = Annotated[Note | None, Body()]


def _status(ctx: AppContext) -> EngineStatus:
    st: dict[str, Any] = ctx.engine.status()
    return EngineStatus.model_validate({**st, "leader": bool(ctx.is_leader()), "acting": bool(ctx.engine.acting)})


@router.get("", response_model=EngineStatus)
def engine_status(ctx: Ctx, _: Viewer) -> EngineStatus:
    """Armed, paused, the breaker, the adapter, held nodes, counters and the safety limits."""
    return _status(ctx)


@router.post("/arm", response_model=EngineStatus)
def arm(ctx: Ctx, who: Admin, body: OptNote = None) -> EngineStatus:
    """Automation reaches the scheduler from now on (admin)."""
    ctx.engine.arm(who.actor, body.note if body else "")
    return _status(ctx)


@router.post("/disarm", response_model=EngineStatus)
def disarm(ctx: Ctx, who: Admin, body: OptNote = None) -> EngineStatus:
    """Every action goes to the dry-run adapter from now on (admin)."""
    ctx.engine.disarm(who.actor, body.note if body else "")
    return _status(ctx)


@router.post("/pause", response_model=EngineStatus)
def pause(ctx: Ctx, who: Operator, body: OptNote = None) -> EngineStatus:
    """Automatic proposals wait for a person until resumed."""
    ctx.engine.pause(who.actor, body.note if body else "")
    return _status(ctx)


@router.post("/resume", response_model=EngineStatus)
def resume(ctx: Ctx, who: Operator, body: OptNote = None) -> EngineStatus:
    """Automation runs again after a pause."""
    ctx.engine.unpause(who.actor, body.note if body else "")
    return _status(ctx)


def _breaker(ctx: AppContext) -> Breaker:
    st = ctx.engine.breaker
    return Breaker(open=bool(st.get("open")), state=st, history=ctx.store.setting_history("breaker")[-20:])


@router.get("/breaker", response_model=Breaker)
def breaker(ctx: Ctx, _: Viewer) -> Breaker:
    """The circuit breaker: open or closed, why, and its recent changes."""
    return _breaker(ctx)


@router.post("/breaker/reset", response_model=Breaker)
def reset_breaker(ctx: Ctx, who: Admin, body: RequiredNote) -> Breaker:
    """Close the breaker (admin); the note says why it is safe."""
    ctx.engine.reset_breaker(who.actor, body.note)
    return _breaker(ctx)


@router.get("/shadow", response_model=ShadowReport)
def shadow(ctx: Ctx, _: Viewer) -> ShadowReport:
    """The shadow policies (service config ``shadow_policies``) beside the live one: what each decided on the
    same ticks, by action and fault class, and its latest decisions. None is ever carried out."""
    sh = ctx.engine.shadow
    empty: dict[str, Any] = {"decisions": 0, "by_action_and_fault": {}, "recent": []}
    body = sh.summary() if sh is not None else {"since": None, "ticks": 0, "live": empty, "shadows": {}}
    return ShadowReport.model_validate({**body, "leader": bool(ctx.is_leader())})
