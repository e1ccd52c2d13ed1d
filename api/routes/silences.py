"""``/v1/silences``: declare a silence (operator+), list those in force (or all), read one, end one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Query, Response, status

from api.deps import Ctx, Operator, Viewer
from api.errors import ApiError
from api.routes import AUTH_ERRORS, NOT_FOUND, UNAVAILABLE
from api.schemas import Note, SilenceCreate, SilenceDetail, SilenceList, SilencePublic
from remediation.silences import Silence, SilenceError

router = APIRouter(prefix="/v1/silences", tags=["silences"], responses=AUTH_ERRORS | UNAVAILABLE)
SilenceId = Annotated[str, Path(min_length=1, max_length=64, description="The silence's id.")]


def _public(s: Silence, now: float) -> SilencePublic:
    return SilencePublic.model_validate({**s.to_dict(), "active": s.active(now)})


@router.post("", response_model=SilencePublic, status_code=status.HTTP_201_CREATED)
def create_silence(ctx: Ctx, who: Operator, body: SilenceCreate, response: Response) -> SilencePublic:
    """Mute actions, alerts or both on nodes, a label selector or the fleet until a required end.
    The engine records each decision it mutes as rejected with ``blocked_by: silence:<id>``."""
    book = ctx.engine.silences
    try:
        s = book.create(author=who.actor, reason=body.reason, nodes=body.nodes or (), selector=body.selector,
                        fleet=body.fleet, mutes=body.mutes, starts_at=body.starts_at, ends_at=body.ends_at,
                        duration_s=body.duration_s)
    except SilenceError as e:
        raise ApiError(422, str(e)) from None
    response.headers["Location"] = f"/v1/silences/{s.id}"
    return _public(s, book.clock())


@router.get("", response_model=SilenceList)
def list_silences(ctx: Ctx, _: Viewer,
                  all: Annotated[bool, Query(description="Include expired and deleted silences.")] = False,
                  limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> SilenceList:
    """Silences in force or yet to start, newest first (``all=true``: every one ever declared)."""
    book = ctx.engine.silences
    got = book.list(include_all=all, limit=limit)
    now = book.clock()
    return SilenceList(silences=[_public(s, now) for s in got], count=len(got))


@router.get("/{silence_id}", response_model=SilenceDetail, responses=NOT_FOUND)
def get_silence(ctx: Ctx, _: Viewer, silence_id: SilenceId) -> SilenceDetail:
    """One silence with its audit trail (created, deleted: who, when, why)."""
    book = ctx.engine.silences
    s = book.get(silence_id)
    if s is None:
        raise ApiError(404, f"no silence with id {silence_id!r} (gpuops silences --all lists them)")
    return SilenceDetail.model_validate({**_public(s, book.clock()).model_dump(), "history": book.history(s.id)})


@router.delete("/{silence_id}", response_model=SilencePublic, responses=NOT_FOUND)
def delete_silence(ctx: Ctx, who: Operator, silence_id: SilenceId,
                   body: Annotated[Note | None, Body()] = None) -> SilencePublic:
    """End a silence now (it is kept, marked deleted, with the caller recorded)."""
    book = ctx.engine.silences
    try:
        s = book.delete(silence_id, who.actor, body.note if body is not None and body.note else "deleted")
    except KeyError:
        raise ApiError(404, f"no silence with id {silence_id!r} (gpuops silences --all lists them)") from None
    return _public(s, book.clock())
