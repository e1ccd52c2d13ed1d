"""The remediation engine: decide → gate → persist → act → verify → reconcile.

One :class:`Engine` per cluster (one leader across replicas, issue 10). Each tick of node
scores it runs the pure policy (:func:`remediation.policy.decide`), turns each decision
into an :class:`~remediation.actions.ActionRecord`, passes it through the safety gate
(:mod:`remediation.safety`), **writes it to the store before any adapter is called**, and
carries it out through the scheduler adapter — the dry-run adapter unless automation is
armed. Afterwards it watches every action it has taken until the cluster shows its effect
(``verified``), retries transient adapter failures with backoff, runs drains' follow-ups
(a GPU reset once the node is idle), expires proposals nobody answered, and fails a GPU
reset whose agent never replied.

After a crash or restart, :meth:`Engine.start` reconciles: an action left ``executing`` is
checked against the cluster's real state — done there: marked succeeded, not repeated;
not done and still fresh: carried out once more (adapters are idempotent); stale: failed
for a person. Then the policy's memory (which nodes gpuops holds) is rebuilt from the
store and from the scheduler's own view of gpuops-owned drains.

Run-time switches (armed, paused, the breaker) live in the store, so they survive restarts
and every replica sees the same; each change is audited with its actor. Time comes from an
injected clock (wall seconds); replay passes one that returns telemetry time.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Protocol, Sequence

from collector.operator_events import OperatorEventError, maintenance_window
from collector.schema import Action, FaultClass, FollowUp, Grade
from models.base import CLASSES
from models.node_scores import NodeScores

from .actions import ENGINE_ACTOR, ActionKind, ActionRecord, ActionState, action_id, scheduler_reason
from .adapters.base import Adapter, AdapterError, NodeStatus, TransientAdapterError
from .adapters.dryrun import DryRunAdapter
from .config import PolicyConfig
from .facility import FLEET, FacilityEvent, FacilityTracker, NodeGroups, Onset
from .policy import Decision, Explain, NodeState, PolicyState, decide
from .safety import GO, Outcome, SafetyConfig, Snapshot, Verdict, breaker_limit, gate
from .silences import (MAINTENANCE_EVENT_REASON, OPERATOR_AUTHOR, Mutes, Silence, SilenceBook, SilenceError,
                       first_match)
from .store import ActionStore, NodeScoreRow

log = logging.getLogger(__name__)

#: states an action is in while the engine still has work to do on it (besides proposals)
_IN_FLIGHT = (ActionState.APPROVED, ActionState.EXECUTING, ActionState.SUCCEEDED)
#: kinds that touch the cluster: an alert is done once recorded and never needs verifying
_CLUSTER_KINDS = tuple(k for k in ActionKind if k.touches_cluster)
#: how far back the engine reads its own history at start (holds, lemons, cooldowns), s
HISTORY_S = 30 * 86400.0
_MAX_BACKOFF_S = 300.0


class CommandChannel(Protocol):
    """Sends a signed GPU reset to a node agent (remediation/adapters/agent_commands.py)."""

    def send_reset(self, action_id: str, node: str, gpu: int, reason: str, now: float) -> Any: ...


def kind_of(d: Decision) -> ActionKind:
    """The action a policy decision asks for."""
    if d.action is Action.DRAIN:
        if d.follow_up is FollowUp.RESET_WHEN_IDLE:
            return ActionKind.DRAIN_RESET
        if d.follow_up is FollowUp.REBOOT:
            return ActionKind.DRAIN_REBOOT
        return ActionKind.DRAIN
    return {Action.RESET: ActionKind.RESET, Action.REQUEUE: ActionKind.REQUEUE,
            Action.RESUME: ActionKind.RESUME, Action.ALERT: ActionKind.ALERT}[d.action]


@dataclass(frozen=True)
class _Past:
    """One earlier action, as the safety limits need it."""

    node: str
    kind: ActionKind
    created_at: float
    automatic: bool


class Engine:
    """See the module docstring. Thread-safe: the API may call in while the tick runs."""

    def __init__(self, store: ActionStore, adapter: Adapter, *, policy: PolicyConfig | None = None,
                 safety: SafetyConfig | None = None, dry: DryRunAdapter | None = None,
                 commands: CommandChannel | None = None, clock: Callable[[], float] = time.time,
                 silences: SilenceBook | None = None) -> None:
        self.store = store
        self.adapter = adapter
        self.dry = dry if dry is not None else (
            adapter if isinstance(adapter, DryRunAdapter) and adapter.name == "dryrun" else DryRunAdapter())
        self.policy = policy or PolicyConfig()
        self.safety = safety or SafetyConfig()
        self.commands = commands
        self.clock = clock
        #: people's silences (in the store): a decision they mute is recorded, not carried out
        self.silences = silences or SilenceBook(store, max_silence_s=self.safety.max_silence_s, clock=clock)
        #: each node as the scheduler last listed it (labels for silence selectors)
        self._known: dict[str, NodeStatus] = {}
        self.state = PolicyState()
        #: False on a standby replica: people's approvals and requests are recorded (approved), and
        #: the leader — whose :meth:`maintain` executes approved actions — carries them out
        self.acting = True
        self._lock = threading.RLock()
        #: node -> the action that holds it out of service (open or verified, not yet resumed)
        self.holds: dict[str, ActionRecord] = {}
        self._past: list[_Past] = []
        self._fleet_size = 0
        self._partitions: dict[str, tuple[str, ...]] = {}
        self.counts: dict[str, int] = {}
        #: the policy's decisions of the last tick (replay reports them beside the records)
        self.last_decisions: list[Decision] = []
        #: correlated onsets (a rack's power brake): one alert for the group, members not drained
        self.facility = FacilityTracker(window_s=self.safety.facility_window_s,
                                        min_nodes=self.safety.facility_min_nodes,
                                        fraction=self.safety.facility_fraction)
        #: facility-event members (node, telemetry time): the breaker counts them like actions
        self._facility_past: list[tuple[str, float]] = []

    # ---- run-time switches (in the store: shared, audited, survive restarts) --------------

    @property
    def armed(self) -> bool:
        return bool(self.store.get_setting("armed", self.safety.armed))

    @property
    def paused(self) -> bool:
        return bool(self.store.get_setting("paused", False))

    @property
    def breaker(self) -> dict[str, Any]:
        return dict(self.store.get_setting("breaker", {"open": False}))

    def arm(self, actor: str, note: str = "") -> None:
        self.store.set_setting("armed", True, actor, note or "armed")
        log.warning("automation ARMED by %s: actions now reach %s", actor, self.adapter.name)

    def disarm(self, actor: str, note: str = "") -> None:
        self.store.set_setting("armed", False, actor, note or "disarmed")
        log.warning("automation disarmed by %s: actions go to the dry-run adapter", actor)

    def pause(self, actor: str, note: str = "") -> None:
        self.store.set_setting("paused", True, actor, note or "paused")

    def unpause(self, actor: str, note: str = "") -> None:
        self.store.set_setting("paused", False, actor, note or "resumed")

    def reset_breaker(self, actor: str, note: str) -> None:
        """A person closes the breaker (a note saying why is required)."""
        if not note.strip():
            raise ValueError("closing the breaker needs a note saying why it is safe")
        self.store.set_setting("breaker", {"open": False, "closed_at": self.clock(), "closed_by": actor},
                               actor, note)
        log.warning("circuit breaker closed by %s: %s", actor, note)

    def _open_breaker(self, nodes: int, limit: int) -> None:
        why = (f"{nodes} distinct nodes acted on within {self.safety.breaker_window_s:.0f} s "
               f"(limit {limit}): usually the telemetry, not the fleet")
        self.store.set_setting("breaker", {"open": True, "opened_at": self.clock(), "why": why}, ENGINE_ACTOR, why)
        self._count("breaker_opened")
        log.error("circuit breaker OPEN: %s; automation stops until a person closes it", why)

    # ---- start-up ---------------------------------------------------------------------------

    def start(self) -> None:
        """After a (re)start: load history, reconcile in-flight actions, rebuild the policy state."""
        with self._lock:
            self._load_history()
            self.reconcile()
            self.state = self.rebuild_state()
            if self._adapter(self.armed) is not self.adapter:
                try:                         # disarmed: the real scheduler's view (groups, maintenance) all the same
                    self.refresh_view()
                except AdapterError as e:
                    log.warning("cannot list the scheduler's nodes at start (%s); the maintenance_view job retries", e)

    def _load_history(self) -> None:
        now = self.clock()
        recs = self.store.query(since=now - HISTORY_S, limit=1_000_000)
        recs.sort(key=lambda r: r.created_at)
        self._past = [_Past(r.node, r.kind, r.created_at, r.actor == ENGINE_ACTOR) for r in recs
                      if r.kind.touches_cluster and r.state not in (ActionState.REJECTED, ActionState.CANCELLED)]
        self.holds = {}
        for r in recs:
            if r.state in (ActionState.REJECTED, ActionState.CANCELLED, ActionState.FAILED):
                continue
            if r.kind is ActionKind.RESUME and r.state in (ActionState.SUCCEEDED, ActionState.VERIFIED):
                self.holds.pop(r.node, None)
            elif r.kind.holds_node:
                self.holds[r.node] = r

    def rebuild_state(self) -> PolicyState:
        """The policy's memory from the store's holds and the scheduler's gpuops-owned drains."""
        nodes: dict[str, NodeState] = {}
        for name, r in self.holds.items():
            nodes[name] = NodeState(held_since=r.incident_ts,
                                    held_grade=Grade(r.grade) if r.grade else Grade.CERTAIN,
                                    held_fault=FaultClass(r.fault) if r.fault in FaultClass._value2member_map_ else None)
        try:
            listed = self._adapter(self.armed).list_nodes()
        except AdapterError as e:
            log.warning("cannot list the scheduler's nodes to rebuild state (%s); using the store alone", e)
            listed = []
        now = self.clock()
        for st in listed:
            self._partitions[st.name] = st.partitions
            self._known[st.name] = st
            if st.drained and st.ours and st.name not in nodes:
                # drained by gpuops but unknown to this store (a lost store, another installation):
                # held, so that the policy's verification decides when it goes back
                log.warning("%s: drained by gpuops (%r) without a record here: held until verified", st.name, st.reason)
                nodes[st.name] = NodeState(held_since=now, held_grade=Grade.CERTAIN)
        return PolicyState(nodes=nodes)

    def refresh_view(self) -> int:
        """Re-read the scheduler's nodes: partitions, labels and declared maintenance (the
        APScheduler job ``maintenance_view`` calls this; the check before each action reads
        the node's status anew anyway). Returns how many nodes were listed; an adapter error
        leaves the last view in place and is raised for the job to log."""
        listed = self.adapter.list_nodes()
        with self._lock:
            for st in listed:
                self._partitions[st.name] = st.partitions
                self._known[st.name] = st
        return len(listed)

    def on_operator_event(self, event: dict[str, Any]) -> Silence | None:
        """An operator maintenance event (collector/operator_events.py) becomes a silence of
        actions on its nodes for its window (alerts still show what gpuops saw). The silence's
        id is deterministic, so the same event on every replica, or replayed, is one silence.
        Any other event: ``None``. A malformed or refused window is logged, not raised."""
        try:
            window = maintenance_window(event)
        except OperatorEventError as e:
            log.warning("operator event ignored: %s", e)
            return None
        if window is None:
            return None
        author = OPERATOR_AUTHOR + (window.author or "event")
        try:
            sil = self.silences.create(author=author, reason=MAINTENANCE_EVENT_REASON + window.reason,
                                       nodes=window.nodes, mutes=Mutes.ACTIONS, starts_at=window.start,
                                       ends_at=window.end)
        except SilenceError as e:
            log.warning("operator maintenance event on %s not turned into a silence: %s", ", ".join(window.nodes), e)
            return None
        self._count("operator_maintenance")
        return sil

    def under_maintenance(self) -> list[str]:
        """The nodes the last view showed under declared maintenance or drained by someone else."""
        return sorted(n for n, st in self._known.items() if st.maintenance or (st.drained and not st.ours))

    def reconcile(self) -> int:
        """Bring every in-flight action in line with the cluster; returns how many it moved."""
        moved = 0
        for rec in self.store.open_actions():
            if rec.state is ActionState.EXECUTING:
                moved += self._reconcile_executing(rec, restart=True)
            elif rec.state is ActionState.APPROVED:
                moved += 1
                self._execute(rec)
        return moved

    # ---- one tick ---------------------------------------------------------------------------

    def tick(self, scores: NodeScores, explain: Explain) -> list[ActionRecord]:
        """Decide on one tick of node scores and act on the decisions; returns the new records."""
        with self._lock:
            self._fleet_size = max(self._fleet_size, len(scores))
            decisions, self.state = decide(scores, self.state, scores.ts, self.policy, explain)
            self._hold_silenced(self.silences.active(self.clock()))
            self.last_decisions = decisions
            evidence = self._evidence(scores, decisions)
            recs = self.submit(decisions, evidence)
            self._put_scores(scores)
            self.maintain()
            return recs

    def _evidence(self, s: NodeScores, decisions: list[Decision]) -> dict[str, dict[str, Any]]:
        if not decisions:
            return {}
        pos = {str(n): i for i, n in enumerate(s.node)}
        out = {}
        for d in decisions:
            i = pos.get(d.node)
            if i is not None:
                out[d.node] = {"p_fail": round(float(s.p_fail[i]), 4), "anomaly": round(float(s.anomaly[i]), 6),
                               "fault": (s.fault_class(i).value if s.fault_class(i) else None),
                               "gpu": int(s.gpu[i]), "rule": int(s.rule[i])}
        return out

    def _put_scores(self, s: NodeScores) -> None:
        held = self.holds
        faults = [CLASSES[f] if f > 0 else None for f in s.fault.tolist()]
        ts = float(s.ts)
        rows = [NodeScoreRow(node=n, ts=ts, risk=p, fault=f, anomaly=a, rule=str(r) if r >= 0 else None,
                             state="held" if n in held else "ok")
                for n, p, f, a, r in zip(map(str, s.node), s.p_fail.tolist(), faults, s.anomaly.tolist(),
                                         s.rule.tolist())]
        self.store.put_scores(rows)

    def submit(self, decisions: Iterable[Decision], evidence: dict[str, dict[str, Any]] | None = None
               ) -> list[ActionRecord]:
        """Gate, persist and carry out the policy's decisions (one tick)."""
        decisions = list(decisions)
        if not decisions:
            return []
        with self._lock:
            now = self.clock()
            armed = self.armed
            snap = self._snapshot(now)
            active = self.silences.active(now)
            unmuted = [d for d in decisions if not first_match(active, d.node, self._known.get(d.node), kind_of(d))]
            events = self._facility_events(unmuted)
            self._check_breaker(unmuted, snap)
            out: list[ActionRecord] = []
            for ev in {id(e): e for e in events.values()}.values():
                rec = self._admit(self._facility_alert(ev, now, armed), snap, active)
                if rec is not None:
                    out.append(rec)
            for d in decisions:
                rec = self._record(d, now, armed, (evidence or {}).get(d.node, {}))
                ev = events.get((d.node, d.fault.value if d.fault else ""))
                rec = self._admit(rec, snap, active, facility=ev if kind_of(d).holds_node else None)
                if rec is not None:
                    out.append(rec)
            return out

    # ---- facility events (remediation/facility.py) --------------------------------------------

    def groups_of(self, node: str) -> NodeGroups:
        """Where the scheduler says *node* sits: labelled groups (rack, switch), then its partitions."""
        st = self._known.get(node)
        extra = st.extra if st is not None else {}
        labelled = tuple(f"{k}/{extra[k]}" for k in self.safety.facility_labels if extra.get(k))
        parts = st.partitions if st is not None and st.partitions else self._partitions.get(node, ())
        return NodeGroups(labelled, tuple(f"partition/{p}" for p in parts))

    def _facility_events(self, decisions: Sequence[Decision]) -> dict[tuple[str, str], FacilityEvent]:
        onsets = [(Onset(d.node, d.fault.value, d.ts), self.groups_of(d.node))
                  for d in decisions if d.fault is not None and kind_of(d).holds_node]
        if not onsets:
            return {}
        sizes: dict[str, int] = {FLEET: max(self._fleet_size, len(self._partitions), len(self._known))}
        for parts in self._partitions.values():
            for part in parts:
                sizes[f"partition/{part}"] = sizes.get(f"partition/{part}", 0) + 1
        now = max(o.ts for o, _ in onsets)
        events = self.facility.observe(now, onsets, sizes)
        self._facility_past.extend((node, now) for node, _ in events)
        self._facility_past = [(n, t) for n, t in self._facility_past if now - t < self.safety.breaker_window_s]
        return events

    def _facility_alert(self, ev: FacilityEvent, now: float, armed: bool) -> ActionRecord:
        """The one alert of a facility event: its node is ``facility:<group>``, its reason names the members."""
        return ActionRecord(
            id=action_id(ev.name, ActionKind.ALERT, None, ev.fault, ev.start), node=ev.name, kind=ActionKind.ALERT,
            state=ActionState.PROPOSED, reason=ev.describe(), actor=ENGINE_ACTOR, incident_ts=ev.start,
            created_at=now, updated_at=now, fault=ev.fault, source="facility",
            evidence={"group": ev.group, "members": sorted(ev.members)},
            dry_run=not armed, adapter=self.adapter.name if armed else self.dry.name)

    def _record(self, d: Decision, now: float, armed: bool, evidence: dict[str, Any]) -> ActionRecord:
        kind = kind_of(d)
        fault = d.fault.value if d.fault else None
        aid = action_id(d.node, kind, d.gpu, fault, d.ts)
        return ActionRecord(
            id=aid, node=d.node, kind=kind, state=ActionState.PROPOSED, reason=d.reason, actor=ENGINE_ACTOR,
            incident_ts=d.ts, created_at=now, updated_at=now, gpu=d.gpu, fault=fault, grade=d.grade.value,
            source=d.source, score=float(d.score), evidence={**evidence, "follow_up": d.follow_up.value if d.follow_up else None},
            dry_run=not armed, adapter=self.adapter.name if armed else self.dry.name)

    def _snapshot(self, now: float) -> Snapshot:
        cfg = self.safety
        auto = [p for p in self._past if p.automatic]
        last: dict[str, float] = {}
        lemons: dict[str, int] = {}
        for p in auto:
            if p.kind is ActionKind.RESUME:
                continue
            last[p.node] = max(last.get(p.node, 0.0), p.created_at)
            if now - p.created_at < cfg.lemon_window_s and p.kind.holds_node:
                lemons[p.node] = lemons.get(p.node, 0) + 1
        sizes: dict[str, int] = {}
        for parts in self._partitions.values():
            for part in parts:
                sizes[part] = sizes.get(part, 0) + 1
        breaker = self.breaker
        return Snapshot(
            now=now, fleet_size=max(self._fleet_size, len(self._partitions)), held=set(self.holds),
            partition_of=self._partitions, partition_size=sizes,
            actions_in_window=sum(1 for p in auto if p.kind.holds_node and now - p.created_at < cfg.action_window_s),
            last_action_at=last, recent_holds=lemons, paused=self.paused, breaker_open=bool(breaker.get("open")))

    def _check_breaker(self, decisions: list[Decision], snap: Snapshot) -> None:
        if snap.breaker_open:
            return
        cfg = self.safety
        acting = {d.node for d in decisions if kind_of(d).holds_node}
        if not acting:
            return
        recent = {p.node for p in self._past
                  if p.automatic and p.kind.holds_node and snap.now - p.created_at < cfg.breaker_window_s}
        recent |= {n for n, _ in self._facility_past}     # a facility event's members count, though not drained
        limit = breaker_limit(cfg, snap.fleet_size)
        if len(recent | acting) > limit:
            self._open_breaker(len(recent | acting), limit)
            snap.breaker_open = True

    def _admit(self, rec: ActionRecord, snap: Snapshot, active: Sequence[Silence] = (),
               facility: FacilityEvent | None = None) -> ActionRecord | None:
        """Gate one new record, persist it, and execute it if it may go now.

        A silence in force that mutes the record's kind comes first: the record is written
        rejected with ``blocked_by="silence:<id>"`` (``maintenance:<id>`` for a silence made from an
        operator maintenance event). Then the safety gate; a Slurm MAINT
        reservation is named in ``blocked_by`` (``maintenance:<reservation>``). A member of a
        facility event (*facility*) is rejected with ``blocked_by="facility:<group>"``.
        """
        if rec.kind is ActionKind.ALERT:
            sil = first_match(active, rec.node, self._known.get(rec.node), rec.kind)
            if sil is not None:
                rec = replace(rec, state=ActionState.REJECTED, blocked_by=f"{sil.cause}:{sil.id}")
                if self.store.insert(rec, note=f"muted by {sil.describe()}"):
                    self._count("rejected_silence")
                    return rec
                return None
            rec = replace(rec, state=ActionState.SUCCEEDED)
            if self.store.insert(rec, note="alert"):
                self._count("alert")
                return rec
            return None
        if rec.kind is ActionKind.RESUME and rec.node not in self.holds:
            self._unhold(rec.node)            # the policy held it, but gpuops never took it out
            return None
        status = self._status(rec)
        sil = first_match(active, rec.node, status or self._known.get(rec.node), rec.kind)
        if sil is not None:
            verdict = Verdict(Outcome.NO, f"{sil.cause}:{sil.id}", f"muted by {sil.describe()}")
        elif facility is not None:
            verdict = Verdict(Outcome.NO, facility.name, f"one of {len(facility.members)} nodes of {facility.group} "
                              f"showing {facility.fault} at once: a facility event, alerted for the group")
        else:
            verdict = _named(gate(rec.kind, rec.node, rec.incident_ts, snap, self.safety,
                                  maintenance=bool(status and status.maintenance),
                                  not_ours=bool(status and status.drained and not status.ours
                                                and rec.kind.holds_node)), status)
        rec = replace(rec, blocked_by=verdict.blocked_by)
        if not self.store.insert(rec, note=verdict.why or "proposed by the policy"):
            self._count("duplicate")
            return None                      # the same incident again (a replay after a restart)
        if rec.kind.holds_node and verdict.outcome is not Outcome.NO:
            self.holds[rec.node] = rec
            snap.held.add(rec.node)
            snap.actions_in_window += verdict.outcome is Outcome.GO
            snap.last_action_at[rec.node] = snap.now
            self._past.append(_Past(rec.node, rec.kind, rec.created_at, True))
        if verdict.outcome is Outcome.NO:
            rec = self._move(rec, ActionState.REJECTED, ENGINE_ACTOR, f"{verdict.blocked_by}: {verdict.why}")
            cause = (verdict.blocked_by or "").split(":")[0]
            if rec.kind is ActionKind.RESUME and cause in ("silence", "maintenance"):
                self._keep_held(rec.node)    # back through verification once the silence/maintenance ends
            else:
                self._unhold(rec.node)
            self._count(f"rejected_{cause}")
            return rec
        if verdict.outcome is Outcome.PERSON:
            self._count(f"held_for_person_{verdict.blocked_by}")
            log.info("%s %s on %s waits for a person: %s", rec.id, rec.kind.value, rec.node, verdict.why)
            return rec
        rec = self._move(rec, ActionState.APPROVED, ENGINE_ACTOR, "within every safety limit")
        return self._execute(rec)

    def _hold_silenced(self, active: Sequence[Silence]) -> None:
        """A node gpuops holds is not resumed while a silence mutes actions on it: its clean time
        restarts each tick, so the verification window runs in full after the silence ends."""
        nodes = None
        for name, ns in self.state.nodes.items():
            if ns.held_since is None or ns.healthy_since is None:
                continue
            if first_match(active, name, self._known.get(name), ActionKind.RESUME) is not None:
                nodes = nodes if nodes is not None else dict(self.state.nodes)
                nodes[name] = replace(ns, healthy_since=None)
        if nodes is not None:
            self.state = replace(self.state, nodes=nodes)

    def _keep_held(self, node: str) -> None:
        """The policy let go of *node* (it decided a resume) but the resume was suppressed: held again."""
        hold = self.holds.get(node)
        if hold is None:
            return
        nodes = dict(self.state.nodes)
        ns = nodes.get(node) or NodeState()
        nodes[node] = replace(ns, held_since=hold.incident_ts,
                              held_grade=Grade(hold.grade) if hold.grade else Grade.CERTAIN,
                              held_fault=FaultClass(hold.fault) if hold.fault in FaultClass._value2member_map_ else None,
                              healthy_since=None)
        self.state = replace(self.state, nodes=nodes)

    def _status(self, rec: ActionRecord) -> NodeStatus | None:
        try:
            return self._adapter(not rec.dry_run).status(rec.node)
        except AdapterError as e:
            log.warning("%s: cannot read node state before %s (%s)", rec.node, rec.kind.value, e)
            return None

    # ---- execution ----------------------------------------------------------------------------

    def _adapter(self, armed: bool) -> Adapter:
        return self.adapter if armed else self.dry

    def _execute(self, rec: ActionRecord) -> ActionRecord:
        """approved → executing (persisted) → the adapter → succeeded | failed | retry later."""
        if not self.acting:
            return rec                       # a standby: the leader's next pass executes it
        rec = self._move(rec, ActionState.EXECUTING, ENGINE_ACTOR, "calling " + rec.adapter,
                         attempts=rec.attempts + 1)
        return self._call(rec)

    def _call(self, rec: ActionRecord) -> ActionRecord:
        adapter = self._adapter(not rec.dry_run)
        reason = scheduler_reason(rec.kind, rec.fault, rec.id)
        try:
            result = self._carry_out(adapter, rec, reason)
        except TransientAdapterError as e:
            return self._transient(rec, e)
        except AdapterError as e:
            self._unhold(rec.node)
            self._count(f"failed_{rec.kind.value}")
            return self._move(rec, ActionState.FAILED, ENGINE_ACTOR, str(e), error=str(e))
        if result.get("awaiting"):
            return self._save(rec, f"waiting for {result['awaiting']}", result={**rec.result, **result}, error=None)
        self._count(f"succeeded_{rec.kind.value}")
        if rec.kind is ActionKind.RESUME:
            self.holds.pop(rec.node, None)
            self._unhold(rec.node)
        return self._move(rec, ActionState.SUCCEEDED, ENGINE_ACTOR, "done by " + adapter.name,
                          result={**rec.result, **result}, error=None)

    def _carry_out(self, adapter: Adapter, rec: ActionRecord, reason: str) -> dict[str, Any]:
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
            return self._send_reset(rec, reason)
        return {}

    def _send_reset(self, rec: ActionRecord, reason: str) -> dict[str, Any]:
        if rec.dry_run:
            return {"reset": "dry-run: a signed reset would go to the node agent"}
        if self.commands is None:
            raise _NoChannel(f"{rec.node}: a GPU reset needs the node agent's command channel "
                             "(commands: in the service config); the node stays drained for a person")
        if rec.gpu is None:
            raise _NoChannel(f"{rec.node}: the reset names no GPU; the node stays drained for a person")
        self.commands.send_reset(rec.id, rec.node, rec.gpu, reason, self.clock())
        return {"awaiting": "the node agent's reset result", "command_sent_at": self.clock()}

    def _transient(self, rec: ActionRecord, e: TransientAdapterError) -> ActionRecord:
        self._count(f"transient_{rec.kind.value}")
        if rec.attempts >= self.safety.max_attempts:
            self._unhold(rec.node)
            return self._move(rec, ActionState.FAILED, ENGINE_ACTOR,
                              f"gave up after {rec.attempts} attempts: {e}", error=str(e))
        wait = e.retry_after_s or min(_MAX_BACKOFF_S, self.safety.retry_backoff_s * 2 ** min(rec.attempts - 1, 16))
        return self._save(rec, f"attempt {rec.attempts} failed ({e}); retry in {wait:.0f} s", error=str(e),
                          result={**rec.result, "retry_at": self.clock() + wait})

    def on_command_result(self, action: str, status: str, detail: str = "") -> ActionRecord | None:
        """The node agent's answer to a reset (gpu.events): records it on its action."""
        with self._lock:
            rec = self.store.get(action)
            if rec is None:
                log.warning("command result for unknown action %s (%s): ignored", action, status)
                return None
            if rec.kind is ActionKind.RESET and rec.state is ActionState.EXECUTING:
                if status == "succeeded":
                    return self._move(rec, ActionState.SUCCEEDED, ENGINE_ACTOR, "agent: " + detail,
                                      result={**rec.result, "reset": detail or "succeeded", "awaiting": None})
                return self._move(rec, ActionState.FAILED, ENGINE_ACTOR, f"agent {status}: {detail}",
                                  error=f"{status}: {detail}")
            if rec.kind is ActionKind.DRAIN_RESET:
                return self._save(rec, f"follow-up reset {status}: {detail}",
                                  result={**rec.result, "follow_up_state": status, "follow_up_detail": detail})
            log.info("command result for %s in state %s: recorded only in the log", action, rec.state.value)
            return rec

    # ---- after the fact: retry, verify, follow up, expire -------------------------------------

    def maintain(self) -> None:
        """One pass over every open action (each tick, and from the scheduler's job); leader only."""
        if not self.acting:
            return
        with self._lock:
            now = self.clock()
            # proposals wait for a person: only the expired ones need this pass
            live = self.store.query(states=_IN_FLIGHT, kinds=_CLUSTER_KINDS, limit=1_000_000)
            expired = self.store.query(states=[ActionState.PROPOSED], kinds=_CLUSTER_KINDS,
                                       until=now - self.safety.proposal_ttl_s, limit=1_000_000)
            for rec in sorted(live + expired, key=lambda r: r.created_at):
                try:
                    if rec.state is ActionState.PROPOSED:
                        if now - rec.created_at > self.safety.proposal_ttl_s:
                            self._move(rec, ActionState.CANCELLED, ENGINE_ACTOR,
                                       f"expired: nobody approved it within {self.safety.proposal_ttl_s:.0f} s")
                            self._unhold(rec.node)
                    elif rec.state is ActionState.APPROVED:
                        if rec.kind.holds_node:
                            self.holds[rec.node] = rec
                        self._execute(rec)             # approved on another replica, or before a crash
                    elif rec.state is ActionState.EXECUTING:
                        self._reconcile_executing(rec, restart=False)
                    elif rec.state is ActionState.SUCCEEDED:
                        self._verify(rec)
                except AdapterError as e:
                    log.warning("%s %s on %s: %s (next pass retries)", rec.id, rec.kind.value, rec.node, e)

    def _reconcile_executing(self, rec: ActionRecord, restart: bool) -> int:
        now = self.clock()
        if rec.result.get("awaiting"):
            sent = float(rec.result.get("command_sent_at") or rec.updated_at)
            if now - sent > self.safety.reset_timeout_s:
                self._unhold(rec.node)
                self._move(rec, ActionState.FAILED, ENGINE_ACTOR,
                           f"no result from the node agent within {self.safety.reset_timeout_s:.0f} s "
                           "(not sent again: a person checks the GPU)", error="reset timed out")
                return 1
            return 0
        if not restart and now < float(rec.result.get("retry_at") or 0.0):
            return 0
        adapter = self._adapter(not rec.dry_run)
        st = adapter.status(rec.node)
        if _done(rec.kind, st):
            why = "reconciled: the cluster shows it done" + (" (after a restart)" if restart else "")
            if rec.kind is ActionKind.RESET:
                return 0 if not restart else self._restart_reset(rec)
            self._move(rec, ActionState.SUCCEEDED, ENGINE_ACTOR, why)
            if rec.kind is ActionKind.RESUME:
                self.holds.pop(rec.node, None)
                self._unhold(rec.node)
            return 1
        if now - rec.incident_ts > self.safety.freshness_s and restart:
            self._unhold(rec.node)
            self._move(rec, ActionState.FAILED, ENGINE_ACTOR, "not repeated after a restart: the decision is stale",
                       error="stale after restart")
            return 1
        rec = self._save(rec, "attempt again" + (" after a restart" if restart else ""), attempts=rec.attempts + 1)
        self._call(rec)
        return 1

    def _restart_reset(self, rec: ActionRecord) -> int:
        # drained, but was the command sent? Without a record of it, sending once is safe: the
        # agent refuses a busy GPU and a command id it has already executed
        self._call(rec)
        return 1

    def _verify(self, rec: ActionRecord) -> None:
        adapter = self._adapter(not rec.dry_run)
        st = adapter.status(rec.node)
        if rec.kind is ActionKind.DRAIN_RESET and rec.result.get("follow_up_state") is None:
            if _done(rec.kind, st) and st.idle:
                self._follow_up_reset(rec)
            return
        if _done(rec.kind, st):
            self._move(rec, ActionState.VERIFIED, ENGINE_ACTOR, f"verified: {st.raw_state or 'as expected'}")

    def _follow_up_reset(self, rec: ActionRecord) -> None:
        if rec.dry_run or self.commands is None or rec.gpu is None:
            why = ("dry-run" if rec.dry_run else "no command channel" if self.commands is None else "no GPU named")
            self._save(rec, f"node idle: reset {'recorded' if rec.dry_run else 'left to a person'} ({why})",
                       result={**rec.result, "follow_up_state": "dry-run" if rec.dry_run else "skipped",
                               "follow_up_detail": why})
            return
        self.commands.send_reset(rec.id, rec.node, rec.gpu, scheduler_reason(rec.kind, rec.fault, rec.id), self.clock())
        self._save(rec, "node idle: GPU reset sent to the agent", result={**rec.result, "follow_up_state": "sent"})

    # ---- people -------------------------------------------------------------------------------

    def request(self, kind: ActionKind, node: str, reason: str, actor: str, *, gpu: int | None = None,
                dry_run: bool = True, force: bool = False) -> ActionRecord:
        """An operator's action: recorded, approved by the caller, carried out (dry run by default).

        The id is deterministic per (node, kind, GPU, actor, minute), so a retried request
        returns the first one's record. Maintenance and, for a resume, the verification window
        are checked unless ``force``.
        """
        if not reason.strip():
            raise ValueError("a reason is required")
        with self._lock:
            now = self.clock()
            aid = action_id(node, kind, gpu, None, float(int(now // 60) * 60), actor)
            existing = self.store.get(aid)
            if existing is not None:
                return existing
            rec = ActionRecord(id=aid, node=node, kind=kind, state=ActionState.PROPOSED, reason=reason, actor=actor,
                               incident_ts=now, created_at=now, updated_at=now, gpu=gpu, source="operator",
                               dry_run=dry_run, adapter=self.dry.name if dry_run else self.adapter.name)
            st = self._status(rec)
            why = ""
            if st is not None and not st.exists:
                why = f"{node} is not a node the scheduler knows"
            elif st is not None and st.maintenance and not force:
                why = f"{node} is under declared maintenance (force to override)"
            elif kind is ActionKind.RESUME and not force:
                why = self._unclean(node, now)
            self.store.insert(rec, note="requested by " + actor)
            if why:
                return self._move(rec, ActionState.REJECTED, actor, why, blocked_by="operator_check")
            if kind.holds_node:
                self.holds[node] = rec
                self._past.append(_Past(node, kind, now, False))
            rec = self._move(rec, ActionState.APPROVED, actor, "operator request")
            return self._execute(rec)

    def _unclean(self, node: str, now: float) -> str:
        hold = self.holds.get(node)
        ns = self.state.nodes.get(node)
        if hold is None:
            return ""
        clean_since = ns.healthy_since if ns is not None else None
        if clean_since is None or now - clean_since < self.safety.verify_window_s:
            return (f"{node} has not had {self.safety.verify_window_s / 60:.0f} min of clean telemetry "
                    "since gpuops took it out (force to override)")
        return ""

    def approve(self, aid: str, actor: str, note: str = "") -> ActionRecord:
        with self._lock:
            rec = self._get(aid)
            override = f" (overrides {rec.blocked_by})" if rec.blocked_by else ""
            rec = self._move(rec, ActionState.APPROVED, actor, (note or "approved") + override)
            if rec.kind.holds_node:
                self.holds[rec.node] = rec
            return self._execute(rec)

    def reject(self, aid: str, actor: str, note: str = "") -> ActionRecord:
        with self._lock:
            rec = self._move(self._get(aid), ActionState.REJECTED, actor, note or "rejected")
            self._unhold(rec.node, rec.id)
            return rec

    def cancel(self, aid: str, actor: str, note: str = "") -> ActionRecord:
        with self._lock:
            rec = self._move(self._get(aid), ActionState.CANCELLED, actor, note or "cancelled")
            self._unhold(rec.node, rec.id)
            return rec

    def _get(self, aid: str) -> ActionRecord:
        rec = self.store.get(aid)
        if rec is None:
            raise KeyError(f"no action with id {aid!r}")
        return rec

    # ---- bookkeeping --------------------------------------------------------------------------

    def _move(self, rec: ActionRecord, to: ActionState, actor: str, note: str, **changes: Any) -> ActionRecord:
        new = rec.moved(to, self.clock(), **changes)
        return self.store.update(new, expect=rec.state, actor=actor, note=note)

    def _save(self, rec: ActionRecord, note: str, **changes: Any) -> ActionRecord:
        new = replace(rec, updated_at=self.clock(), **changes)
        return self.store.update(new, expect=rec.state, actor=ENGINE_ACTOR, note=note)

    def _unhold(self, node: str, only: str | None = None) -> None:
        """The node is not (or no longer) held by gpuops: tell the policy so it may decide again."""
        hold = self.holds.get(node)
        if hold is not None and (only is None or hold.id == only) and hold.state is not ActionState.VERIFIED:
            self.holds.pop(node, None)
        if node in self.holds:
            return
        ns = self.state.nodes.get(node)
        if ns is not None and ns.held_since is not None:
            nodes = dict(self.state.nodes)
            nodes[node] = replace(ns, held_since=None, held_grade=None, held_fault=None, healthy_since=None)
            self.state = replace(self.state, nodes=nodes)

    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def status(self) -> dict[str, Any]:
        """What the engine is doing, for the API and the CLI."""
        return {"armed": self.armed, "paused": self.paused, "breaker": self.breaker,
                "adapter": self.adapter.name, "held": sorted(self.holds), "counts": dict(self.counts),
                "silences": [s.id for s in self.silences.active(self.clock())],
                "facility_events": [{"group": ev.group, "fault": ev.fault, "start": ev.start, "last": ev.last,
                                     "members": sorted(ev.members)} for ev in self.facility.events.values()],
                "safety": self.safety.model_dump(mode="json")}


def _named(verdict: Verdict, status: NodeStatus | None) -> Verdict:
    """The gate's verdict with the scheduler's own words: which MAINT reservation, whose drain."""
    if status is None:
        return verdict
    if verdict.blocked_by == "maintenance":
        resv = status.extra.get("maintenance_reservation")
        if resv:
            return Verdict(verdict.outcome, f"maintenance:{resv}",
                           f"the node is in the Slurm maintenance reservation {resv} (Flags=MAINT)")
        until = status.extra.get("maintenance_until")
        if until:
            return Verdict(verdict.outcome, "maintenance",
                           f"the node is annotated gpuops.io/maintenance-until={until}")
    if verdict.blocked_by == "not_ours" and status.reason:
        return Verdict(verdict.outcome, "not_ours",
                       f"{verdict.why} (reason {status.reason!r}: only its owner returns it to service)")
    return verdict


class _NoChannel(AdapterError):
    """A reset that cannot be sent (permanent)."""


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
