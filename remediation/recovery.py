"""After a crash or restart: what the engine rebuilds before it decides anything.

The store is the engine's memory; nothing in the process survives a restart. So
:func:`start` reads the last :data:`HISTORY_S` of actions back — which nodes gpuops holds,
and its recent actions for the safety limits — then :func:`reconcile` checks every action
left in flight against the cluster's real state: ``executing`` and done there → succeeded,
not repeated; not done and still fresh → carried out once more (adapters are idempotent);
stale → failed for a person; ``approved`` → carried out. Last, :func:`rebuild_state` gives
the policy its memory of held nodes, from the store and from the scheduler's own view of
gpuops-owned drains (a drain gpuops made but this store has no record of stays held until
verification lets it go), and of its last prediction on each node (:func:`retry_caps`: after
a prediction that came back healthy, the node's next one of that class only alerts for
``model_retry_window_s``, restart or not). Kept apart from the tick loop because it runs
once, under the engine's lock, before the first tick.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from collector.schema import FaultClass, Grade

from . import execution
from .actions import CARRIED_OUT, ENGINE_ACTOR, ActionKind, ActionRecord, ActionState
from .adapters.base import AdapterError
from .policy import NodeState, PolicyState

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger(__name__)

#: how far back the engine reads its own history at start (holds, lemons, cooldowns), s
HISTORY_S = 30 * 86400.0


def start(engine: Engine) -> None:
    """Load history, reconcile in-flight actions, rebuild the policy state (and, disarmed, the view)."""
    with engine._lock:
        recs = engine.store.query(since=engine.clock() - HISTORY_S, limit=1_000_000)
        recs.sort(key=lambda r: r.created_at)
        engine.recent.load(recs)
        engine.holds = holds_of(recs)
        reconcile(engine)
        engine.state = rebuild_state(engine, holds_of(recs, ENGINE_ACTOR), retry_caps(recs))
        engine.sync_verdicts(0.0)       # people's verdicts of the budget's window, given on any replica
        if engine._adapter(engine.armed) is not engine.adapter:
            try:                         # disarmed: the real scheduler's view (groups, maintenance) all the same
                engine.refresh_view()
            except AdapterError as e:
                log.warning("cannot list the scheduler's nodes at start (%s); the maintenance_view job retries", e)


def holds_of(recs: Iterable[ActionRecord], actor: str | None = None) -> dict[str, ActionRecord]:
    """node -> the action that holds it out of service, from its records oldest first; with *actor*,
    only nodes that actor took out since their last resume, each with that actor's latest hold."""
    holds: dict[str, ActionRecord] = {}
    for r in recs:
        if r.state in (ActionState.REJECTED, ActionState.CANCELLED, ActionState.FAILED):
            continue
        if r.kind is ActionKind.RESUME and r.state in CARRIED_OUT:
            holds.pop(r.node, None)
        elif r.kind.holds_node and (actor is None or r.actor == actor):
            holds[r.node] = r
    return holds


def held_fields(hold: ActionRecord) -> dict[str, Any]:
    """The policy's memory of a node *hold* keeps out: since when, at which grade, for which fault, and how many
    GPUs it read when it was taken out (``held_gpus`` in the record's evidence; None for a person's drain or a
    record written before the engine kept it)."""
    gpus = hold.evidence.get("held_gpus")
    return {"held_since": hold.incident_ts, "held_grade": Grade(hold.grade) if hold.grade else Grade.CERTAIN,
            "held_fault": FaultClass(hold.fault) if hold.fault in FaultClass._value2member_map_ else None,
            "held_gpus": gpus if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0 else None}


def retry_caps(recs: Iterable[ActionRecord]) -> dict[str, dict[str, Any]]:
    """node -> the policy's retry cap (``predicted_action_at``, ``predicted_fault``: its last action on a
    prediction, :attr:`PolicyConfig.model_retry_window_s`) from the engine's records oldest first, as the policy
    kept it: set by the action that took the node out on a prediction (in whatever state safety left it: the policy
    decided it all the same), cleared when a rule acted while that hold lasted or a person's verdict on it is
    ``faulty`` (the failure came: the prediction was right), kept through the node's resume."""
    caps: dict[str, dict[str, Any]] = {}
    on_prediction: set[str] = set()     # nodes the policy holds on a prediction
    for r in recs:
        if r.kind is ActionKind.RESUME:
            if r.state in CARRIED_OUT:
                on_prediction.discard(r.node)
        elif r.actor != ENGINE_ACTOR or r.kind is ActionKind.ALERT:
            continue
        elif r.source == "model" and r.node not in on_prediction:   # (one held already is escalated: no new cap)
            fault = FaultClass(r.fault) if r.fault in FaultClass._value2member_map_ else None
            caps[r.node] = {"predicted_action_at": r.incident_ts, "predicted_fault": fault}
            on_prediction.add(r.node)
            if r.verdict == "faulty":                # a person found it faulty: the prediction was right
                caps.pop(r.node)
        elif r.source == "rule" and r.node in on_prediction:
            caps.pop(r.node, None)
            on_prediction.discard(r.node)
    return caps


def rebuild_state(engine: Engine, taken: Mapping[str, ActionRecord],
                  caps: Mapping[str, Mapping[str, Any]] | None = None) -> PolicyState:
    """The policy's memory from the holds the engine itself *taken* (node -> its latest hold record), the
    scheduler's gpuops-owned drains and the retry *caps* (:func:`retry_caps`). A node only a person took out is
    not the policy's: it never resumed one before the restart (the person does), so it does not after."""
    caps = caps or {}
    nodes = {name: NodeState(**cap) for name, cap in caps.items()}
    nodes.update({name: NodeState(**held_fields(r), **caps.get(name, {})) for name, r in taken.items()
                  if name in engine.holds})
    try:
        listed = engine._adapter(engine.armed).list_nodes()
    except AdapterError as e:
        log.warning("cannot list the scheduler's nodes to rebuild state (%s); using the store alone", e)
        listed = []
    now = engine.clock()
    engine.view.update(listed)
    for st in listed:
        if st.drained and st.ours and st.name not in engine.holds:
            # drained by gpuops but unknown to this store (a lost store, another installation):
            # held, so that the policy's verification decides when it goes back
            log.warning("%s: drained by gpuops (%r) without a record here: held until verified", st.name, st.reason)
            nodes[st.name] = NodeState(held_since=now, held_grade=Grade.CERTAIN, **caps.get(st.name, {}))
    return PolicyState(nodes=nodes, budget=engine.budget.restore(engine))


def reconcile(engine: Engine) -> int:
    """Bring every in-flight action in line with the cluster; returns how many it moved."""
    moved = 0
    for rec in engine.store.open_actions():
        if rec.state is ActionState.EXECUTING:
            moved += execution.reconcile_executing(engine, rec, restart=True)
        elif rec.state is ActionState.APPROVED:
            moved += 1
            execution.execute(engine, rec)
    return moved
