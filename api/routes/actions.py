"""``/v1/actions``: list and filter, create a person's action (202, poll it), approve, reject, cancel, and
a person's verdict on a hold gpuops took on a prediction."""

from __future__ import annotations

from typing import Annotated, Callable, TypeVar

from fastapi import APIRouter, Body, Path, Query, Response, status

from api.deps import Ctx, Operator, Viewer
from api.errors import ApiError
from api.routes import AUTH_ERRORS, CONFLICT, NOT_FOUND, UNAVAILABLE
from api.schemas import ActionCreate, ActionDetail, ActionList, ActionPublic, Note, VerdictIn
from remediation.actions import ActionKind, ActionState

router = APIRouter(prefix="/v1/actions", tags=["actions"], responses=AUTH_ERRORS | UNAVAILABLE)
T = TypeVar("T")
ActionId = Annotated[str, Path(min_length=1, max_length=64, description="The action's id.")]


def _engine_call(fn: Callable[[], T]) -> T:
    """An engine call; an unknown id is a 404, a refused input a 422 (moves: 409, api/errors.py)."""
    try:
        return fn()
    except KeyError as e:
        raise ApiError(404, str(e.args[0]) if e.args else "no such action") from None
    except ValueError as e:
        if type(e) is not ValueError:
            raise                                   # InvalidTransition: 409 in api/errors.py
        raise ApiError(422, str(e)) from None


@router.get("", response_model=ActionList)
def list_actions(ctx: Ctx, _: Viewer,
                 node: Annotated[str | None, Query(max_length=253)] = None,
                 state: Annotated[list[ActionState] | None, Query()] = None,
                 kind: Annotated[list[ActionKind] | None, Query()] = None,
                 actor: Annotated[str | None, Query(max_length=255)] = None,
                 since: Annotated[float | None, Query(ge=0, description="created_at >= since, s since the epoch")] = None,
                 until: Annotated[float | None, Query(ge=0, description="created_at < until, s since the epoch")] = None,
                 limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                 offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0) -> ActionList:
    """Action records matching every filter given, newest first."""
    recs = ctx.store.query(node=node, states=state, kinds=kind, actor=actor, since=since, until=until,
                           limit=limit, offset=offset)
    return ActionList(actions=[ActionPublic.of(r) for r in recs], count=len(recs), limit=limit, offset=offset)


@router.get("/{action_id}", response_model=ActionDetail, responses=NOT_FOUND)
def get_action(ctx: Ctx, _: Viewer, action_id: ActionId) -> ActionDetail:
    """One record with its audit trail (who moved it, when, why)."""
    rec = ctx.store.get(action_id)
    if rec is None:
        raise ApiError(404, f"no action with id {action_id!r}")
    return ActionDetail.model_validate({**rec.to_dict(), "history": ctx.store.history(action_id)})


@router.post("", response_model=ActionPublic, status_code=status.HTTP_202_ACCEPTED, responses=CONFLICT)
def create_action(ctx: Ctx, who: Operator, body: ActionCreate, response: Response) -> ActionPublic:
    """A person's drain, resume, requeue, reset or reboot. A reason is required and ``dry_run``
    defaults to true. Answers 202 with the record; poll ``Location`` for its state."""
    rec = _engine_call(lambda: ctx.engine.request(ActionKind(body.kind), body.node, body.reason, who.actor,
                                                  gpu=body.gpu, dry_run=body.dry_run, force=body.force))
    response.headers["Location"] = f"/v1/actions/{rec.id}"
    return ActionPublic.of(rec)


def _decide(verb: str) -> Callable[..., ActionPublic]:
    def decide(ctx: Ctx, who: Operator, action_id: ActionId,
               body: Annotated[Note | None, Body()] = None) -> ActionPublic:
        note = body.note if body is not None else ""
        return ActionPublic.of(_engine_call(lambda: getattr(ctx.engine, verb)(action_id, who.actor, note)))

    decide.__name__ = f"{verb}_action"
    decide.__doc__ = {"approve": "Approve a proposal (an override when safety held it back); it runs at once.",
                      "reject": "Say no to a proposal.",
                      "cancel": "Withdraw an action that has not started."}[verb]
    return decide


for _verb in ("approve", "reject", "cancel"):
    router.post(f"/{{action_id}}/{_verb}", response_model=ActionPublic, responses=NOT_FOUND | CONFLICT)(_decide(_verb))


@router.post("/{action_id}/verdict", response_model=ActionPublic, responses=NOT_FOUND | CONFLICT)
def give_verdict(ctx: Ctx, who: Operator, action_id: ActionId, body: VerdictIn) -> ActionPublic:
    """What a person found on a node gpuops took out on a prediction: ``healthy`` (the prediction was
    false) or ``faulty`` (it came true). Recorded on the action and counted towards the fleet's
    false-action budget; a class whose predictions end healthy beyond the budget only alerts until that
    passes. 422 for an action that is not a hold taken on a prediction."""
    return ActionPublic.of(_engine_call(lambda: ctx.engine.verdict(action_id, body.verdict, who.actor, body.note)))
