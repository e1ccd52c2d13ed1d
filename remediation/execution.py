"""Carrying out approved actions, and following them up until the cluster shows them done.

The engine decides, gates and records; this module does the rest of an action's life:
``approved → executing`` (persisted before the adapter is called) → the adapter →
``succeeded`` | ``failed`` | a retry with backoff for a transient error; then, on every
pass of :func:`maintain`, it verifies what succeeded against the node's real state, runs a
``drain_reset``'s follow-up once the node is idle, expires proposals nobody answered, and
reconciles what a crash left ``executing``. These are the steps that talk to the adapters
(and, for GPU resets, :mod:`remediation.resets`); kept apart so the engine's core reads as
the tick: decide → gate → persist. The functions share the engine's lock and bookkeeping
(its holds, the record's moves, its counters) and run on the leader only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from . import resets
from .actions import ENGINE_ACTOR, ActionKind, ActionRecord, ActionState, scheduler_reason
from .adapters.base import Adapter, AdapterError, NodeStatus, TransientAdapterError

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger(__name__)

#: states an action is in while the engine still has work to do on it (besides proposals)
_IN_FLIGHT = (ActionState.APPROVED, ActionState.EXECUTING, ActionState.SUCCEEDED)
#: kinds that touch the cluster: an alert is done once recorded and never needs verifying
_CLUSTER_KINDS = tuple(k for k in ActionKind if k.touches_cluster)
_MAX_BACKOFF_S = 300.0


def execute(engine: Engine, rec: ActionRecord) -> ActionRecord:
    """approved → executing (persisted) → the adapter → succeeded | failed | retry later."""
    if not engine.acting:
        return rec                       # a standby: the leader's next pass executes it
    rec = engine._move(rec, ActionState.EXECUTING, ENGINE_ACTOR, "calling " + rec.adapter,
                       attempts=rec.attempts + 1)
    return _call(engine, rec)


def _call(engine: Engine, rec: ActionRecord) -> ActionRecord:
    adapter = engine._adapter(not rec.dry_run)
    reason = scheduler_reason(rec.kind, rec.fault, rec.id)
    try:
        result = _carry_out(engine, adapter, rec, reason)
    except TransientAdapterError as e:
        return _transient(engine, rec, e)
    except AdapterError as e:
        engine._unhold(rec.node)
        engine._count(f"failed_{rec.kind.value}")
        return engine._move(rec, ActionState.FAILED, ENGINE_ACTOR, str(e), error=str(e))
    if result.get("awaiting"):
        return engine._save(rec, f"waiting for {result['awaiting']}", result={**rec.result, **result}, error=None)
    engine._count(f"succeeded_{rec.kind.value}")
    if rec.kind is ActionKind.RESUME:
        engine.holds.pop(rec.node, None)
        engine._unhold(rec.node)
    return engine._move(rec, ActionState.SUCCEEDED, ENGINE_ACTOR, "done by " + adapter.name,
                        result={**rec.result, **result}, error=None)


def _carry_out(engine: Engine, adapter: Adapter, rec: ActionRecord, reason: str) -> dict[str, Any]:
    k = rec.kind
    if k is ActionKind.RESUME:
        adapter.resume(rec.node, reason)
        return {}
    if k is ActionKind.REQUEUE:
        return {"requeued": adapter.requeue(rec.node, reason)}
    if k is ActionKind.REBOOT:
        adapter.reboot(rec.node, reason)
        return {}
    adapter.drain(rec.node, reason)
    if k is ActionKind.DRAIN_REBOOT:
        adapter.reboot(rec.node, reason)      # Slurm: `reboot ASAP` waits for the jobs itself
        return {"follow_up": "reboot"}
    if k is ActionKind.DRAIN_RESET:
        return {"follow_up": "reset_when_idle"}
    if k is ActionKind.RESET:
        return resets.send(engine, rec, reason)
    return {}


def _transient(engine: Engine, rec: ActionRecord, e: TransientAdapterError) -> ActionRecord:
    engine._count(f"transient_{rec.kind.value}")
    cfg = engine.safety
    if rec.attempts >= cfg.max_attempts:
        engine._unhold(rec.node)
        return engine._move(rec, ActionState.FAILED, ENGINE_ACTOR,
                            f"gave up after {rec.attempts} attempts: {e}", error=str(e))
    wait = e.retry_after_s or min(_MAX_BACKOFF_S, cfg.retry_backoff_s * 2 ** min(rec.attempts - 1, 16))
    return engine._save(rec, f"attempt {rec.attempts} failed ({e}); retry in {wait:.0f} s", error=str(e),
                        result={**rec.result, "retry_at": engine.clock() + wait})


# ---- after the fact: retry, verify, follow up, expire ------------------------------------------

def maintain(engine: Engine) -> None:
    """One pass over every open action (each tick, and from the scheduler's job); leader only."""
    if not engine.acting:
        return
    with engine._lock:
        engine.sync_verdicts()   # people's verdicts given on any replica count towards the budget
        now = engine.clock()
        ttl = engine.safety.proposal_ttl_s
        # proposals wait for a person: only the expired ones need this pass
        live = engine.store.query(states=_IN_FLIGHT, kinds=_CLUSTER_KINDS, limit=1_000_000)
        expired = engine.store.query(states=[ActionState.PROPOSED], kinds=_CLUSTER_KINDS,
                                     until=now - ttl, limit=1_000_000)
        for rec in sorted(live + expired, key=lambda r: r.created_at):
            try:
                if rec.state is ActionState.PROPOSED:
                    if now - rec.created_at > ttl:
                        engine._move(rec, ActionState.CANCELLED, ENGINE_ACTOR,
                                     f"expired: nobody approved it within {ttl:.0f} s")
                        engine._unhold(rec.node)
                elif rec.state is ActionState.APPROVED:
                    if rec.kind.holds_node:
                        engine.holds[rec.node] = rec
                    execute(engine, rec)             # approved on another replica, or before a crash
                elif rec.state is ActionState.EXECUTING:
                    reconcile_executing(engine, rec, restart=False)
                elif rec.state is ActionState.SUCCEEDED:
                    _verify(engine, rec)
            except AdapterError as e:
                log.warning("%s %s on %s: %s (next pass retries)", rec.id, rec.kind.value, rec.node, e)


def reconcile_executing(engine: Engine, rec: ActionRecord, restart: bool) -> int:
    """An ``executing`` action against the cluster's real state; returns 1 if it moved (or went again)."""
    now = engine.clock()
    if rec.result.get("awaiting"):
        return resets.expire(engine, rec, now)
    if not restart and now < float(rec.result.get("retry_at") or 0.0):
        return 0
    adapter = engine._adapter(not rec.dry_run)
    st = adapter.status(rec.node)
    if _done(rec.kind, st):
        why = "reconciled: the cluster shows it done" + (" (after a restart)" if restart else "")
        if rec.kind is ActionKind.RESET:
            return 0 if not restart else _restart_reset(engine, rec)
        engine._move(rec, ActionState.SUCCEEDED, ENGINE_ACTOR, why)
        if rec.kind is ActionKind.RESUME:
            engine.holds.pop(rec.node, None)
            engine._unhold(rec.node)
        return 1
    if now - rec.incident_ts > engine.safety.freshness_s and restart:
        engine._unhold(rec.node)
        engine._move(rec, ActionState.FAILED, ENGINE_ACTOR, "not repeated after a restart: the decision is stale",
                     error="stale after restart")
        return 1
    rec = engine._save(rec, "attempt again" + (" after a restart" if restart else ""), attempts=rec.attempts + 1)
    _call(engine, rec)
    return 1


def _restart_reset(engine: Engine, rec: ActionRecord) -> int:
    # drained, but was the command sent? Without a record of it, sending once is safe: the
    # agent refuses a busy GPU and a command id it has already executed
    _call(engine, rec)
    return 1


def _verify(engine: Engine, rec: ActionRecord) -> None:
    adapter = engine._adapter(not rec.dry_run)
    st = adapter.status(rec.node)
    if rec.kind is ActionKind.DRAIN_RESET and rec.result.get("follow_up_state") is None:
        if _done(rec.kind, st) and st.idle:
            resets.follow_up(engine, rec)
        return
    if _done(rec.kind, st):
        engine._move(rec, ActionState.VERIFIED, ENGINE_ACTOR, f"verified: {st.raw_state or 'as expected'}")


def _done(kind: ActionKind, st: NodeStatus) -> bool:
    """Whether the node's real state shows *kind* carried out."""
    if not st.exists:
        return False
    if kind is ActionKind.RESUME:
        return not st.drained
    if kind is ActionKind.REBOOT:
        return not st.rebooting and not st.down
    if kind is ActionKind.DRAIN_REBOOT:
        return st.rebooting or (st.drained and st.ours)
    return st.drained and st.ours
