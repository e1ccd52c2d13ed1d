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

This module is the tick's core — decide, gate, persist — and the state every step shares
(the holds, the policy's memory, a record's moves, the counters). The rest of an action's
life sits beside it, each module taking the engine and using that bookkeeping:
:mod:`~remediation.execution` (carry out, retry, verify, follow up, expire),
:mod:`~remediation.resets` (GPU resets through the node agent), :mod:`~remediation.people`
(an operator's request, approve, reject, cancel, a verdict), :mod:`~remediation.recovery` (after a
restart), :mod:`~remediation.budget_keeper` (the false-action budget kept in the store, people's
verdicts read back), :mod:`~remediation.recent` (what the safety limits count) and
:mod:`~remediation.cluster_view` (the scheduler's nodes). Callers use :class:`Engine` alone.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Iterable, Sequence

from collector.schema import Action, FollowUp
from models.base import CLASSES
from models.node_scores import NodeScores

from . import execution, people, recovery, resets
from .actions import ENGINE_ACTOR, ActionKind, ActionRecord, ActionState, action_id
from .adapters.base import Adapter, AdapterError, NodeStatus
from .adapters.dryrun import DryRunAdapter
from .budget_keeper import BudgetKeeper
from .cluster_view import ClusterView
from .config import PolicyConfig
from .facility import FacilityEvent, FacilityTracker, NodeGroups, Onset
from .policy import Decision, Explain, NodeState, PolicyState, decide
from .recent import RecentActions
from .resets import CommandChannel
from .safety import Outcome, SafetyConfig, Snapshot, Verdict, breaker_limit, gate, named
from .shadow import ShadowPolicies
from .silences import Silence, SilenceBook, first_match
from .store import ActionStore, NodeScoreRow

log = logging.getLogger(__name__)


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


class Engine:
    """See the module docstring. Thread-safe: the API may call in while the tick runs."""

    def __init__(self, store: ActionStore, adapter: Adapter, *, policy: PolicyConfig | None = None,
                 safety: SafetyConfig | None = None, dry: DryRunAdapter | None = None,
                 commands: CommandChannel | None = None, clock: Callable[[], float] = time.time,
                 silences: SilenceBook | None = None, shadow: ShadowPolicies | None = None) -> None:
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
        #: each node as the scheduler last listed it: partitions, labels, maintenance
        self.view = ClusterView()
        self.state = PolicyState()
        #: False on a standby replica: people's approvals and requests are recorded (approved), and
        #: the leader — whose :meth:`maintain` executes approved actions — carries them out
        self.acting = True
        self._lock = threading.RLock()
        #: node -> the action that holds it out of service (open or verified, not yet resumed)
        self.holds: dict[str, ActionRecord] = {}
        #: gpuops' recent actions (and facility members) as the safety limits count them
        self.recent = RecentActions()
        self._fleet_size = 0
        self.counts: dict[str, int] = {}
        #: the policy's decisions of the last tick (replay reports them beside the records)
        self.last_decisions: list[Decision] = []
        #: other policies decided on every tick and only recorded (:mod:`remediation.shadow`); None: none
        self.shadow = shadow
        #: the fleet's false-action budget kept in the store, and people's verdicts read back into it
        self.budget = BudgetKeeper()
        #: correlated onsets (a rack's power brake): one alert for the group, members not drained
        self.facility = FacilityTracker(window_s=self.safety.facility_window_s,
                                        min_nodes=self.safety.facility_min_nodes,
                                        fraction=self.safety.facility_fraction)

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

    # ---- start-up (remediation/recovery.py) and the scheduler's view --------------------------

    def start(self) -> None:
        """After a (re)start: load history, reconcile in-flight actions, rebuild the policy state."""
        recovery.start(self)

    def reconcile(self) -> int:
        """Bring every in-flight action in line with the cluster; returns how many it moved."""
        return recovery.reconcile(self)

    def refresh_view(self) -> int:
        """Re-read the scheduler's nodes: partitions, labels and declared maintenance (the
        APScheduler job ``maintenance_view`` calls this; the check before each action reads
        the node's status anew anyway). Returns how many nodes were listed; an adapter error
        leaves the last view in place and is raised for the job to log."""
        listed = self.adapter.list_nodes()
        with self._lock:
            self.view.update(listed)
        return len(listed)

    def node_statuses(self) -> dict[str, NodeStatus]:
        """Each node as the scheduler last listed it (labels for silence selectors), a copy."""
        with self._lock:
            return dict(self.view.known)

    def on_operator_event(self, event: dict[str, Any]) -> Silence | None:
        """An operator maintenance event becomes a silence of actions on its nodes for its
        window (:meth:`SilenceBook.from_operator_event`); any other event: ``None``."""
        sil = self.silences.from_operator_event(event)
        if sil is not None:
            self._count("operator_maintenance")
        return sil

    def under_maintenance(self) -> list[str]:
        """The nodes the last view showed under declared maintenance or drained by someone else."""
        return self.view.under_maintenance()

    # ---- one tick ---------------------------------------------------------------------------

    def tick(self, scores: NodeScores, explain: Explain) -> list[ActionRecord]:
        """Decide on one tick of node scores and act on the decisions; returns the new records."""
        with self._lock:
            self._fleet_size = max(self._fleet_size, len(scores))
            decisions, self.state = decide(scores, self.state, scores.ts, self.policy, explain)
            self.budget.keep(self)
            self._hold_silenced(self.silences.active(self.clock()))
            self.last_decisions = decisions
            evidence = self._evidence(scores, decisions)
            recs = self.submit(decisions, evidence)
            self._put_scores(scores)
            self.maintain()
        if self.shadow is not None:   # touches no engine state: the API need not wait for it
            self.shadow.tick(scores, explain, decisions)
        return recs

    # ---- the fleet's false-action budget (remediation/budget_keeper.py) ------------------------

    def budget_status(self) -> dict[str, Any]:
        """The false-action budget: outcomes per class in its window, the exposure, what it brakes."""
        return self.budget.status(self)

    def verdict(self, aid: str, verdict: str, actor: str, note: str = "") -> ActionRecord:
        """A person's verdict on a prediction hold (:func:`people.verdict`)."""
        return people.verdict(self, aid, verdict, actor, note)

    def sync_verdicts(self, every_s: float = 60.0) -> int:
        """People's verdicts given on any replica since the last read (:meth:`BudgetKeeper.sync`)."""
        return self.budget.sync(self, every_s)

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
                ns = self.state.nodes.get(d.node)
                if ns is not None and ns.held_since is not None and ns.held_gpus is not None:
                    out[d.node]["held_gpus"] = ns.held_gpus   # read back by recovery.held_fields after a restart
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
            unmuted = [d for d in decisions if not first_match(active, d.node, self.view.get(d.node), kind_of(d))]
            events = self._facility_events(unmuted)
            self._check_breaker(unmuted, snap)
            out: list[ActionRecord] = []
            for ev in {id(e): e for e in events.values()}.values():
                rec = self._admit(ev.alert(now, dry_run=not armed, adapter=self._adapter(armed).name), snap, active)
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
        return self.view.groups_of(node, self.safety.facility_labels)

    def _facility_events(self, decisions: Sequence[Decision]) -> dict[tuple[str, str], FacilityEvent]:
        onsets = [(Onset(d.node, d.fault.value, d.ts), self.groups_of(d.node))
                  for d in decisions if d.fault is not None and kind_of(d).holds_node]
        if not onsets:
            return {}
        now = max(o.ts for o, _ in onsets)
        events = self.facility.observe(now, onsets, self.view.group_sizes(self._fleet_size))
        self.recent.add_facility_members((node for node, _ in events), now, self.safety.breaker_window_s)
        return events

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
        breaker = self.breaker
        return self.recent.snapshot(
            now, self.safety, fleet_size=max(self._fleet_size, len(self.view.partitions)), held=set(self.holds),
            partition_of=self.view.partitions, partition_size=self.view.partition_sizes(), paused=self.paused,
            breaker_open=bool(breaker.get("open")))

    def _check_breaker(self, decisions: list[Decision], snap: Snapshot) -> None:
        if snap.breaker_open:
            return
        acting = {d.node for d in decisions if kind_of(d).holds_node}
        if not acting:
            return
        nodes = self.recent.breaker_nodes(acting, snap.now, self.safety)
        limit = breaker_limit(self.safety, snap.fleet_size)
        if nodes > limit:
            self._open_breaker(nodes, limit)
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
            sil = first_match(active, rec.node, self.view.get(rec.node), rec.kind)
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
        sil = first_match(active, rec.node, status or self.view.get(rec.node), rec.kind)
        if sil is not None:
            verdict = Verdict(Outcome.NO, f"{sil.cause}:{sil.id}", f"muted by {sil.describe()}")
        elif facility is not None:
            verdict = facility.member_verdict()
        else:
            verdict = named(gate(rec.kind, rec.node, rec.incident_ts, snap, self.safety,
                                 maintenance=bool(status and status.maintenance),
                                 not_ours=bool(status and status.drained and not status.ours
                                               and rec.kind.holds_node)), status)
        rec = replace(rec, blocked_by=verdict.blocked_by, escalates=rec.kind.holds_node and rec.node in self.holds)
        if not self.store.insert(rec, note=verdict.why or "proposed by the policy"):
            self._count("duplicate")
            return None                      # the same incident again (a replay after a restart)
        if rec.kind.holds_node and verdict.outcome is not Outcome.NO:
            self.holds[rec.node] = rec
            snap.held.add(rec.node)
            snap.actions_in_window += verdict.outcome is Outcome.GO
            snap.last_action_at[rec.node] = snap.now
            self.recent.add(rec, automatic=True)
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
        return execution.execute(self, rec)

    def _hold_silenced(self, active: Sequence[Silence]) -> None:
        """A node gpuops holds is not resumed while a silence mutes actions on it: its clean time
        restarts each tick, so the verification window runs in full after the silence ends."""
        nodes = None
        for name, ns in self.state.nodes.items():
            if ns.held_since is None or ns.healthy_since is None:
                continue
            if first_match(active, name, self.view.get(name), ActionKind.RESUME) is not None:
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
        nodes[node] = replace(ns, **recovery.held_fields(hold), healthy_since=None)
        self.state = replace(self.state, nodes=nodes)

    def _status(self, rec: ActionRecord) -> NodeStatus | None:
        try:
            return self._adapter(not rec.dry_run).status(rec.node)
        except AdapterError as e:
            log.warning("%s: cannot read node state before %s (%s)", rec.node, rec.kind.value, e)
            return None

    # ---- execution (remediation/execution.py, remediation/resets.py) ---------------------------

    def _adapter(self, armed: bool) -> Adapter:
        return self.adapter if armed else self.dry

    def maintain(self) -> None:
        """One pass over every open action: retry, verify, follow up, expire (leader only)."""
        execution.maintain(self)

    def on_command_result(self, action: str, status: str, detail: str = "") -> ActionRecord | None:
        """The node agent's answer to a reset (gpu.events): records it on its action."""
        return resets.on_result(self, action, status, detail)

    # ---- people (remediation/people.py) -------------------------------------------------------

    def request(self, kind: ActionKind, node: str, reason: str, actor: str, *, gpu: int | None = None,
                dry_run: bool = True, force: bool = False) -> ActionRecord:
        """An operator's action, checked and carried out (dry run by default): :func:`people.request`."""
        return people.request(self, kind, node, reason, actor, gpu=gpu, dry_run=dry_run, force=force)

    def approve(self, aid: str, actor: str, note: str = "") -> ActionRecord:
        return people.approve(self, aid, actor, note)

    def reject(self, aid: str, actor: str, note: str = "") -> ActionRecord:
        return people.close(self, aid, ActionState.REJECTED, actor, note)

    def cancel(self, aid: str, actor: str, note: str = "") -> ActionRecord:
        return people.close(self, aid, ActionState.CANCELLED, actor, note)

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
                "facility_events": [ev.summary() for ev in self.facility.events.values()],
                "budget": self.budget_status(),
                "safety": self.safety.model_dump(mode="json")}
