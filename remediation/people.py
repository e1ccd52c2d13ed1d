"""People's operations on actions: an operator's request, approve, reject, cancel, and a verdict.

The engine's tick acts on the policy's decisions through the safety gate; what a person
does comes in from the API or the CLI with an actor and a note, and is checked
differently: an operator's request skips the gate's fleet limits (the person is the
judge) but not the checks that protect the person from a slip — the node must exist,
declared maintenance is respected, and a resume waits for the verification window since
gpuops took the node out — each overridable with ``force``. Approving a proposal the gate
held back overrides its ``blocked_by`` on the record. Kept apart from the tick loop so
that :mod:`remediation.engine` reads as the automatic path alone; these functions share
the engine's lock and bookkeeping (holds, the record's moves) and are reached through the
engine's public methods (:meth:`~remediation.engine.Engine.request` and the rest).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from . import execution
from .actions import ENGINE_ACTOR, ActionKind, ActionRecord, ActionState, action_id
from .budget import VERDICTS
from .policy import PREDICTION_GRADES

if TYPE_CHECKING:
    from .engine import Engine


def request(engine: Engine, kind: ActionKind, node: str, reason: str, actor: str, *, gpu: int | None,
            dry_run: bool, force: bool) -> ActionRecord:
    """An operator's action: recorded, approved by the caller, carried out (dry run by default).

    The id is deterministic per (node, kind, GPU, actor, minute), so a retried request
    returns the first one's record. Maintenance and, for a resume, the verification window
    are checked unless ``force``.
    """
    if not reason.strip():
        raise ValueError("a reason is required")
    with engine._lock:
        now = engine.clock()
        aid = action_id(node, kind, gpu, None, float(int(now // 60) * 60), actor)
        existing = engine.store.get(aid)
        if existing is not None:
            return existing
        rec = ActionRecord(id=aid, node=node, kind=kind, state=ActionState.PROPOSED, reason=reason, actor=actor,
                           incident_ts=now, created_at=now, updated_at=now, gpu=gpu, source="operator",
                           dry_run=dry_run, adapter=engine.dry.name if dry_run else engine.adapter.name)
        why = _refusal(engine, rec, force, now)
        engine.store.insert(rec, note="requested by " + actor)
        if why:
            return engine._move(rec, ActionState.REJECTED, actor, why, blocked_by="operator_check")
        if kind.holds_node:
            engine.holds[node] = rec
            engine.recent.add(rec, automatic=False)
        rec = engine._move(rec, ActionState.APPROVED, actor, "operator request")
        return execution.execute(engine, rec)


def _refusal(engine: Engine, rec: ActionRecord, force: bool, now: float) -> str:
    """Why an operator's request is refused (empty: it may go): an unknown node, maintenance, unclean."""
    st = engine._status(rec)
    if st is not None and not st.exists:
        return f"{rec.node} is not a node the scheduler knows"
    if st is not None and st.maintenance and not force:
        return f"{rec.node} is under declared maintenance (force to override)"
    if rec.kind is ActionKind.RESUME and not force:
        return _unclean(engine, rec.node, now)
    return ""


def _unclean(engine: Engine, node: str, now: float) -> str:
    """Why a resume of a node gpuops holds is too early: not the verification window's clean time yet."""
    hold = engine.holds.get(node)
    ns = engine.state.nodes.get(node)
    if hold is None:
        return ""
    if (ns is None or ns.held_since is None) and hold.actor != ENGINE_ACTOR:
        return (f"{node} was taken out by {hold.actor}: gpuops keeps no clean telemetry for a person's hold "
                "(force to resume it once the work is done)")
    clean_since = ns.healthy_since if ns is not None else None
    window = engine.safety.verify_window_s
    if clean_since is None or now - clean_since < window:
        return (f"{node} has not had {window / 60:.0f} min of clean telemetry "
                "since gpuops took it out (force to override)")
    return ""


def approve(engine: Engine, aid: str, actor: str, note: str) -> ActionRecord:
    """A person approves a proposal (overriding what held it back, named on the record) and it is carried out."""
    with engine._lock:
        rec = _get(engine, aid)
        override = f" (overrides {rec.blocked_by})" if rec.blocked_by else ""
        rec = engine._move(rec, ActionState.APPROVED, actor, (note or "approved") + override)
        if rec.kind.holds_node:
            engine.holds[rec.node] = rec
        return execution.execute(engine, rec)


def close(engine: Engine, aid: str, to: ActionState, actor: str, note: str) -> ActionRecord:
    """A person rejects or cancels an action: the node is no longer held for it."""
    with engine._lock:
        rec = engine._move(_get(engine, aid), to, actor, note or to.value)
        engine._unhold(rec.node, rec.id)
        return rec


def verdict(engine: Engine, aid: str, verdict: str, actor: str, note: str) -> ActionRecord:
    """What a person found on a node gpuops took out on a prediction: ``healthy`` (the prediction was
    false) or ``faulty`` (it came true). Recorded on the action (audited) and counted towards the fleet's
    false-action budget at once, in place of what the policy would see for itself later (a healthy
    resume, a rule). Refused (ValueError) for anything but a hold taken on a prediction."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {', '.join(VERDICTS)} (got {verdict!r})")
    with engine._lock:
        rec = _get(engine, aid)
        predicted = rec.grade in {g.value for g in PREDICTION_GRADES}
        if rec.source != "model" or not rec.kind.holds_node or not predicted:
            raise ValueError(f"{aid} is a {rec.source or 'person'}'s {rec.kind.value}: verdicts are given on holds "
                             "gpuops took on a prediction (they count against its false-action budget; rules "
                             "follow the XID catalogue and the operators' own thresholds)")
        if rec.state in (ActionState.PROPOSED, ActionState.REJECTED, ActionState.CANCELLED):
            raise ValueError(f"{aid} is {rec.state.value}: it never took {rec.node} out")
        if rec.verdict != verdict:
            rec = engine.store.update(replace(rec, verdict=verdict, updated_at=engine.clock()), expect=rec.state,
                                      actor=actor, note=f"verdict: {verdict}" + (f" ({note})" if note else ""))
        engine.budget.apply(engine, [rec])
        return rec


def _get(engine: Engine, aid: str) -> ActionRecord:
    rec = engine.store.get(aid)
    if rec is None:
        raise KeyError(f"no action with id {aid!r}")
    return rec
