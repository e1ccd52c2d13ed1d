"""Silences: a person's declared quiet period that the engine respects, visibly.

A :class:`Silence` names a scope — nodes by name, a label selector, or the whole fleet — and
what it mutes (``actions``, ``alerts`` or ``both``) from ``starts_at`` until a required
``ends_at``, with an author and a reason (Alertmanager's silences are the model). While one
is in force the engine records every decision it mutes as rejected with
``blocked_by="silence:<id>"`` (``maintenance:<id>`` for one made from an operator
maintenance event, :attr:`Silence.cause`) instead of carrying it out, and a node gpuops holds is not
resumed (it goes back through the verification window once the silence ends).

Selectors match labels the scheduler reports (:func:`labels_of`): ``partition`` (a Slurm
partition or a Kubernetes node pool: any of the node's), and ``rack`` / ``pool`` when the
adapter puts them in :attr:`NodeStatus.extra`. Every key of a selector must match.

Silences live in the action store (:class:`SilenceBook` over :class:`ActionStore`), so they
survive restarts and every replica sees the same; creation and deletion are audited with
the actor. A silence is never removed: DELETE marks it deleted. It expires on its own:
in force means ``starts_at <= now < ends_at`` and not deleted.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from collector.operator_events import OperatorEventError, maintenance_window

from .actions import ActionKind
from .adapters.base import NodeStatus, PermanentAdapterError, validate_node_name
from .store import ActionStore

log = logging.getLogger(__name__)

#: a silence's default upper bound on its length, s (7 days; SafetyConfig.max_silence_s sets it)
DEFAULT_MAX_SILENCE_S = 7 * 86400.0
#: label keys a selector may use
SELECTOR_KEYS = ("partition", "rack", "pool")
#: the author prefix and reason prefix of a silence made from an operator maintenance event
#: (:meth:`remediation.engine.Engine.on_operator_event`)
OPERATOR_AUTHOR = "operator:"
MAINTENANCE_EVENT_REASON = "maintenance event: "
#: how far in the future a silence may start, s (a typo'd start a year out is refused)
MAX_START_AHEAD_S = 30 * 86400.0


class SilenceError(ValueError):
    """A silence refused as given (permanent: fix the input); the message says what to change."""


class Mutes(str, enum.Enum):
    """What a silence mutes."""

    ACTIONS = "actions"     # every action that touches the cluster (drain, reset, reboot, requeue, resume)
    ALERTS = "alerts"       # alerts only; actions still go
    BOTH = "both"

    def mutes(self, kind: ActionKind) -> bool:
        """Whether a decision of *kind* is muted."""
        if self is Mutes.BOTH:
            return True
        return (kind is ActionKind.ALERT) == (self is Mutes.ALERTS)


@dataclass(frozen=True)
class Silence:
    """One silence (see the module docstring). Times are wall seconds since the epoch."""

    id: str
    starts_at: float
    ends_at: float
    author: str
    reason: str
    created_at: float
    mutes: Mutes = Mutes.BOTH
    nodes: tuple[str, ...] = ()
    selector: Mapping[str, str] = field(default_factory=dict)
    fleet: bool = False
    deleted_at: float | None = None
    deleted_by: str | None = None

    @property
    def cause(self) -> str:
        """What a decision it mutes is counted under (``blocked_by="<cause>:<id>"``): ``maintenance``
        for a silence made from an operator maintenance event — declared maintenance, like a
        Slurm MAINT reservation — else ``silence``."""
        made_from_event = self.author.startswith(OPERATOR_AUTHOR) and self.reason.startswith(MAINTENANCE_EVENT_REASON)
        return "maintenance" if made_from_event else "silence"

    @property
    def scope(self) -> str:
        return "fleet" if self.fleet else "nodes" if self.nodes else "selector"

    def active(self, now: float) -> bool:
        """In force at *now*."""
        return self.deleted_at is None and self.starts_at <= now < self.ends_at

    def covers(self, node: str, status: NodeStatus | None = None) -> bool:
        """Whether *node* is in scope (*status* supplies its labels for a selector)."""
        if self.fleet:
            return True
        if self.nodes:
            return node in self.nodes
        labels = labels_of(status) if status is not None else {}
        return bool(self.selector) and all(v in labels.get(k, ()) for k, v in self.selector.items())

    def describe(self) -> str:
        """A short line for audit notes: the scope, the author, the reason."""
        what = ("the fleet" if self.fleet else ",".join(self.nodes) if self.nodes
                else ",".join(f"{k}={v}" for k, v in sorted(self.selector.items())))
        return f"silence {self.id} on {what} by {self.author} until {_utc(self.ends_at)}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "scope": self.scope, "nodes": list(self.nodes), "selector": dict(self.selector),
                "fleet": self.fleet, "mutes": self.mutes.value, "starts_at": self.starts_at,
                "ends_at": self.ends_at, "author": self.author, "reason": self.reason,
                "created_at": self.created_at, "deleted_at": self.deleted_at, "deleted_by": self.deleted_by}

    def _row(self) -> dict[str, Any]:
        return {"id": self.id, "scope": {"nodes": list(self.nodes), "selector": dict(self.selector),
                                         "fleet": self.fleet},
                "mutes": self.mutes.value, "starts_at": self.starts_at, "ends_at": self.ends_at,
                "author": self.author, "reason": self.reason, "created_at": self.created_at,
                "deleted_at": self.deleted_at, "deleted_by": self.deleted_by}

    @classmethod
    def _of_row(cls, row: Mapping[str, Any]) -> "Silence":
        scope = row["scope"]
        return cls(id=row["id"], starts_at=float(row["starts_at"]), ends_at=float(row["ends_at"]),
                   author=row["author"], reason=row["reason"], created_at=float(row["created_at"]),
                   mutes=Mutes(row["mutes"]), nodes=tuple(scope.get("nodes") or ()),
                   selector=dict(scope.get("selector") or {}), fleet=bool(scope.get("fleet")),
                   deleted_at=row.get("deleted_at"), deleted_by=row.get("deleted_by"))


def labels_of(status: NodeStatus) -> dict[str, tuple[str, ...]]:
    """The labels a selector matches on *status*: its partitions, and rack / pool if reported."""
    labels: dict[str, tuple[str, ...]] = {"partition": tuple(status.partitions)}
    for key in ("rack", "pool"):
        value = status.extra.get(key)
        if value:
            labels[key] = (str(value),)
    return labels


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


class SilenceBook:
    """The stored silences: create (validated), delete, list, and match a node against those in force.

    ``max_silence_s`` caps a silence's length (``SafetyConfig.max_silence_s``); ``clock`` gives
    wall seconds since the epoch.
    """

    def __init__(self, store: ActionStore, *, max_silence_s: float = DEFAULT_MAX_SILENCE_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.max_silence_s = max_silence_s
        self.clock = clock

    def create(self, *, author: str, reason: str, nodes: Iterable[str] = (), selector: Mapping[str, str] | None = None,
               fleet: bool = False, mutes: Mutes | str = Mutes.BOTH, starts_at: float | None = None,
               ends_at: float | None = None, duration_s: float | None = None) -> Silence:
        """A new silence, stored and audited; :class:`SilenceError` says what is wrong with the input.

        Exactly one scope (``nodes``, ``selector`` or ``fleet``); ``ends_at`` or ``duration_s``
        (from ``starts_at``, default now).
        """
        now = self.clock()
        sil = self._validated(author=author, reason=reason, nodes=tuple(nodes), selector=dict(selector or {}),
                              fleet=fleet, mutes=mutes, starts_at=now if starts_at is None else float(starts_at),
                              ends_at=ends_at, duration_s=duration_s, now=now)
        if not self.store.insert_silence(sil._row(), note=sil.reason):
            got = self.get(sil.id)           # the same request again (a retry): its first answer
            if got is not None:
                return got
        return sil

    def _validated(self, *, author: str, reason: str, nodes: tuple[str, ...], selector: dict[str, str],
                   fleet: bool, mutes: Mutes | str, starts_at: float, ends_at: float | None,
                   duration_s: float | None, now: float) -> Silence:
        if not reason or not reason.strip():
            raise SilenceError("a silence needs a reason (what work is going on, and who to ask)")
        scopes = [bool(nodes), bool(selector), bool(fleet)]
        if sum(scopes) != 1:
            raise SilenceError("a silence needs exactly one scope: nodes (a list of names), a selector "
                               f"({'/'.join(SELECTOR_KEYS)}: value) or fleet: true")
        for n in nodes:
            try:
                validate_node_name(n)
            except PermanentAdapterError as e:
                raise SilenceError(str(e)) from None
        bad = sorted(set(selector) - set(SELECTOR_KEYS))
        if bad:
            raise SilenceError(f"selector keys {bad} are not known: use {', '.join(SELECTOR_KEYS)}")
        if any(not isinstance(v, str) or not v.strip() for v in selector.values()):
            raise SilenceError("selector values must be non-empty strings")
        try:
            mutes = Mutes(mutes)
        except ValueError:
            raise SilenceError(f"mutes {mutes!r} is not one of actions, alerts, both") from None
        if (ends_at is None) == (duration_s is None):
            raise SilenceError("a silence needs an end: give ends_at (s since the epoch) or duration_s, not both")
        end = float(ends_at) if ends_at is not None else starts_at + float(duration_s or 0.0)
        if starts_at - now > MAX_START_AHEAD_S:
            raise SilenceError(f"starts_at is more than {MAX_START_AHEAD_S / 86400:.0f} days ahead; "
                               "declare it closer to the work")
        if end <= starts_at:
            raise SilenceError(f"the silence ends ({_utc(end)}) at or before it starts ({_utc(starts_at)})")
        if end <= now:
            raise SilenceError(f"the silence ends in the past ({_utc(end)})")
        if end - starts_at > self.max_silence_s:
            raise SilenceError(f"the silence lasts {(end - starts_at) / 3600:.1f} h, longer than the maximum "
                               f"{self.max_silence_s / 3600:.1f} h (safety.max_silence_s): declare a shorter "
                               "one and extend it later")
        key = json.dumps([author, sorted(nodes), selector, fleet, mutes.value, starts_at, end, reason.strip()],
                         sort_keys=True)
        sid = "sil-" + hashlib.sha256(key.encode()).hexdigest()[:12]
        return Silence(id=sid, starts_at=starts_at, ends_at=end, author=author, reason=reason.strip(),
                       created_at=now, mutes=mutes, nodes=tuple(dict.fromkeys(nodes)), selector=selector, fleet=fleet)

    def delete(self, silence_id: str, actor: str, note: str = "") -> Silence:
        """End a silence now (marked deleted, audited); KeyError if there is none such."""
        got = self.get(silence_id)
        if got is None:
            raise KeyError(f"no silence with id {silence_id!r}")
        if got.deleted_at is None:
            self.store.delete_silence(silence_id, self.clock(), actor, note or "deleted")
            got = self.get(silence_id) or got
        return got

    def from_operator_event(self, event: Mapping[str, Any]) -> Silence | None:
        """An operator maintenance event (collector/operator_events.py) as a silence of actions
        on its nodes for its window (alerts still show what gpuops saw). The silence's id is
        deterministic, so the same event on every replica, or replayed, is one silence. Any
        other event: ``None``. A malformed or refused window is logged, not raised."""
        try:
            window = maintenance_window(event)
        except OperatorEventError as e:
            log.warning("operator event ignored: %s", e)
            return None
        if window is None:
            return None
        author = OPERATOR_AUTHOR + (window.author or "event")
        try:
            return self.create(author=author, reason=MAINTENANCE_EVENT_REASON + window.reason, nodes=window.nodes,
                               mutes=Mutes.ACTIONS, starts_at=window.start, ends_at=window.end)
        except SilenceError as e:
            log.warning("operator maintenance event on %s not turned into a silence: %s", ", ".join(window.nodes), e)
            return None

    def get(self, silence_id: str) -> Silence | None:
        rows = self.store.silence_rows(silence_id=silence_id)
        return Silence._of_row(rows[0]) if rows else None

    def history(self, silence_id: str) -> list[dict[str, Any]]:
        return self.store.silence_history(silence_id)

    def list(self, *, include_all: bool = False, limit: int = 1000) -> list[Silence]:
        """In force now (and those yet to start), or every one with *include_all*; newest first."""
        now = self.clock()
        rows = [Silence._of_row(r) for r in self.store.silence_rows(limit=limit if include_all else 100_000)]
        if include_all:
            return rows
        return [s for s in rows if s.deleted_at is None and now < s.ends_at][:limit]

    def active(self, now: float | None = None) -> list[Silence]:
        """The silences in force at *now* (default: the clock)."""
        t = self.clock() if now is None else now
        return [Silence._of_row(r) for r in self.store.silence_rows(active_at=t)]

    def match(self, node: str, status: NodeStatus | None, now: float | None = None,
              kind: ActionKind | None = None) -> Silence | None:
        """The first silence in force at *now* that covers *node* (and mutes *kind*, if given)."""
        return first_match(self.active(now), node, status, kind)


def first_match(active: Iterable[Silence], node: str, status: NodeStatus | None,
                kind: ActionKind | None = None) -> Silence | None:
    """The first of *active* that covers *node* and mutes *kind* (any kind when None)."""
    for s in active:
        if (kind is None or s.mutes.mutes(kind)) and s.covers(node, status):
            return s
    return None
