"""The action record: what gpuops does to a node, its states and its deterministic id.

Every action — automatic or an operator's — is one :class:`ActionRecord`, persisted
(``remediation/store.py``) *before* any adapter is called, and moved through its states
only along :data:`TRANSITIONS`::

    proposed ──► approved ──► executing ──► succeeded ──► verified
       │            │             │
       │            │             └──► failed
       ├──► rejected│
       └──► cancelled◄┘

``succeeded`` means the scheduler took the action; ``verified`` means the engine saw its
effect in the cluster's real state (the node drained, the jobs requeued, the node back in
service after a resume). ``failed`` carries the adapter's error. ``rejected`` is a person's
(or the safety layer's) no; ``cancelled`` withdraws an action that has not started.

The id is a hash of the incident (node, kind, GPU, fault, the telemetry time of the
decision, and who asked), so replaying the same telemetry after a restart, or the same
operator request twice, lands on the same record instead of a second drain.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

#: the prefix of every reason gpuops writes to a scheduler (Slurm drain reason, Kubernetes
#: taint/annotation value): gpuops resumes and untaints only what carries it
REASON_PREFIX = "gpuops:"
#: the actor of everything the engine decides by itself; an operator's actions carry
#: ``operator:<name>`` (the API's authenticated caller)
ENGINE_ACTOR = "engine"


class ActionKind(str, enum.Enum):
    """What an action does to a node (DESIGN.md, "Safety of actions")."""

    DRAIN = "drain"                  # no new jobs; running ones finish
    DRAIN_RESET = "drain_reset"      # drain, then reset the GPU once the node is idle
    DRAIN_REBOOT = "drain_reboot"    # drain, then reboot the node once idle (scontrol reboot ASAP)
    REQUEUE = "requeue"              # drain and requeue the node's jobs at once
    RESET = "reset"                  # reset one GPU now, through the node agent (gpu.commands)
    REBOOT = "reboot"                # reboot the node
    RESUME = "resume"                # return a node gpuops holds to service
    ALERT = "alert"                  # tell a person; changes nothing on the cluster

    @property
    def disruptive(self) -> bool:
        """Kills or interrupts running work (approval applies when configured)."""
        return self in (ActionKind.RESET, ActionKind.REBOOT, ActionKind.REQUEUE,
                        ActionKind.DRAIN_RESET, ActionKind.DRAIN_REBOOT)

    @property
    def holds_node(self) -> bool:
        """Takes the node out of service until gpuops resumes it."""
        return self in (ActionKind.DRAIN, ActionKind.DRAIN_RESET, ActionKind.DRAIN_REBOOT,
                        ActionKind.REQUEUE, ActionKind.RESET, ActionKind.REBOOT)

    @property
    def touches_cluster(self) -> bool:
        return self is not ActionKind.ALERT


class ActionState(str, enum.Enum):
    PROPOSED = "proposed"
    APPROVED = "approved"
    EXECUTING = "executing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    VERIFIED = "verified"
    REJECTED = "rejected"
    CANCELLED = "cancelled"


#: the states of an action the cluster carried out (a resume in one of them put the node back)
CARRIED_OUT: frozenset[ActionState] = frozenset({ActionState.SUCCEEDED, ActionState.VERIFIED})

#: the allowed moves; anything else is a bug (or a stale writer) and is refused
TRANSITIONS: dict[ActionState, frozenset[ActionState]] = {
    ActionState.PROPOSED: frozenset({ActionState.APPROVED, ActionState.REJECTED, ActionState.CANCELLED}),
    ActionState.APPROVED: frozenset({ActionState.EXECUTING, ActionState.CANCELLED}),
    ActionState.EXECUTING: frozenset({ActionState.SUCCEEDED, ActionState.FAILED}),
    ActionState.SUCCEEDED: frozenset({ActionState.VERIFIED, ActionState.FAILED}),
    ActionState.FAILED: frozenset(),
    ActionState.VERIFIED: frozenset(),
    ActionState.REJECTED: frozenset(),
    ActionState.CANCELLED: frozenset(),
}


class InvalidTransition(ValueError):
    """A state change that :data:`TRANSITIONS` does not allow (permanent)."""

    def __init__(self, action_id: str, frm: ActionState, to: ActionState) -> None:
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[frm])) or "none (terminal)"
        super().__init__(f"action {action_id}: {frm.value} -> {to.value} is not allowed "
                         f"(from {frm.value}: {allowed})")
        self.action_id, self.frm, self.to = action_id, frm, to


def check_transition(action_id: str, frm: ActionState, to: ActionState) -> None:
    if to not in TRANSITIONS[frm]:
        raise InvalidTransition(action_id, frm, to)


def action_id(node: str, kind: ActionKind, gpu: int | None, fault: str | None,
              incident_ts: float, actor: str = ENGINE_ACTOR) -> str:
    """The deterministic id of one incident's action: 20 hex characters of SHA-256.

    ``incident_ts`` is the telemetry time of the decision (engine) or the request's
    idempotency time (an operator's request, rounded by the caller), so the same decision
    replayed after a crash hashes to the same id.
    """
    key = f"{node}|{kind.value}|{'' if gpu is None else gpu}|{fault or ''}|{incident_ts:.3f}|{actor}"
    return hashlib.sha256(key.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class ActionRecord:
    """One action and everything needed to audit it.

    Times: ``incident_ts`` is telemetry time (the decision's ``now``); ``created_at`` and
    ``updated_at`` are wall time of the engine's host, s since the epoch.
    """

    id: str
    node: str
    kind: ActionKind
    state: ActionState
    reason: str
    actor: str
    incident_ts: float
    created_at: float
    updated_at: float
    gpu: int | None = None
    fault: str | None = None
    grade: str | None = None           # collector.schema.Grade value
    source: str | None = None          # "rule", "model", "anomaly", "operator", "engine"
    score: float | None = None
    #: the evidence: model scores and the features behind them (JSON-able)
    evidence: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = True
    adapter: str = "dryrun"
    attempts: int = 0
    error: str | None = None
    #: what the adapter answered (jobs requeued, the command's result, ...)
    result: dict[str, Any] = field(default_factory=dict)
    #: set when safety held the action back or refused it: why
    blocked_by: str | None = None
    #: gpuops already held the node when it took this action (the same incident going further, not a
    #: new take-out: the lemon limit does not count it)
    escalates: bool = False
    #: a person's verdict on a hold taken on a prediction: "healthy" (it was false) or "faulty" (it came
    #: true); it counts against the fleet's false-action budget (remediation/budget.py)
    verdict: str | None = None

    def moved(self, to: ActionState, now: float, **changes: Any) -> "ActionRecord":
        """This record in state *to* (checked against :data:`TRANSITIONS`)."""
        check_transition(self.id, self.state, to)
        return replace(self, state=to, updated_at=now, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "node": self.node, "kind": self.kind.value, "state": self.state.value,
                "reason": self.reason, "actor": self.actor, "incident_ts": self.incident_ts,
                "created_at": self.created_at, "updated_at": self.updated_at, "gpu": self.gpu,
                "fault": self.fault, "grade": self.grade, "source": self.source, "score": self.score,
                "evidence": self.evidence, "dry_run": self.dry_run, "adapter": self.adapter,
                "attempts": self.attempts, "error": self.error, "result": self.result,
                "blocked_by": self.blocked_by, "escalates": self.escalates, "verdict": self.verdict}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ActionRecord":
        d = dict(d)
        d["kind"] = ActionKind(d["kind"])
        d["state"] = ActionState(d["state"])
        return cls(**d)


def scheduler_reason(kind: ActionKind, fault: str | None, action: str, detail: str = "") -> str:
    """The reason gpuops writes to the scheduler: ``gpuops: <kind> <fault> <id> <detail>``.

    Slurm keeps reasons short and appends ``[user@time]``; the id lets an operator look the
    action up (``gpuops actions --id``). Characters a shell or Slurm would mangle are dropped.
    """
    text = f"{REASON_PREFIX} {kind.value}"
    if fault:
        text += f" {fault}"
    text += f" id={action}"
    if detail:
        text += f" {detail}"
    safe = "".join(c if c.isprintable() and c not in "\"'`\\;|&$<>" else " " for c in text)
    return " ".join(safe.split())[:200]
