"""Facility events: many nodes of one group showing the same fault at once are one event.

A rack whose power is capped asserts HW power brake on every node in it at the same
moment; a leaf switch's firmware upgrade flaps every link under it; a failed CRAC unit
heats a row. Draining each member one by one would empty the rack for a fault that is
not in any of its nodes. So the engine feeds each tick's *acting* decisions (those that
take a node out of service) through a :class:`FacilityTracker`: when, within
``facility_window_s``, decisions of one fault class hit at least ``facility_min_nodes``
nodes of one group, they become one :class:`FacilityEvent`. The engine then records one
grouped alert for the group, rejects the members' actions with
``blocked_by="facility:<group>"``, and counts the members in the circuit breaker.

Groups, in order (a node joins the first group of its own that qualifies):

1. a label the scheduler reports in ``NodeStatus.extra`` — ``facility_labels``, by default
   ``rack``, ``leaf`` and ``switch`` (group ``rack/r07``): ``facility_min_nodes`` members. The
   Slurm adapter reports ``leaf`` (topology/tree) and ``rack`` (a node feature), the Kubernetes
   adapter what its ``facility_labels`` map node labels to;
2. for a node with none of those labels, each of its partitions / node pools
   (``partition/gpu``): ``facility_min_nodes`` members that are also at least
   ``facility_fraction`` of the partition (a partition is usually far bigger than a rack);
3. for a node with no group information at all, the whole fleet (``fleet``), on the same
   two conditions.

An event stays open while its members keep showing the fault, and closes
``facility_window_s`` after the last one: a power brake that lasts ten minutes is still
one event, and a member that shows it again later is folded in, not drained.

Pure bookkeeping (no clock, no I/O): times come in with each call. An event also says what
the engine records for it — its one grouped alert (:meth:`FacilityEvent.alert`) and the
verdict that blocks each member (:meth:`FacilityEvent.member_verdict`) — so the engine only
feeds onsets in and writes what comes out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .actions import ENGINE_ACTOR, ActionKind, ActionRecord, ActionState, action_id
from .safety import Outcome, Verdict

#: the group of a node with no group information at all
FLEET = "fleet"


@dataclass(frozen=True)
class Onset:
    """One acting decision as the tracker needs it: which node, which fault, when (telemetry s)."""

    node: str
    fault: str
    ts: float


@dataclass(frozen=True)
class NodeGroups:
    """Where a node sits: its labelled groups (``rack/r07``), and its partitions (``partition/gpu``)."""

    labelled: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()

    def candidates(self) -> list[tuple[str, bool]]:
        """The node's groups in order, each with whether it needs the share test as well."""
        if self.labelled:
            return [(g, False) for g in self.labelled]
        if self.partitions:
            return [(g, True) for g in self.partitions]
        return [(FLEET, True)]


@dataclass
class FacilityEvent:
    """One correlated onset: a group, a fault, its members, and when it began and was last seen."""

    group: str
    fault: str
    start: float
    last: float
    members: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        """The alert's node name: ``facility:<group>``."""
        return f"facility:{self.group}"

    def describe(self) -> str:
        return (f"facility event: {len(self.members)} nodes of {self.group} show {self.fault} at once "
                f"({', '.join(sorted(self.members))}); one alert for the group, no drains")

    def alert(self, now: float, *, dry_run: bool, adapter: str) -> ActionRecord:
        """The event's one alert: its node is ``facility:<group>``, its reason names the members.
        Its id comes from the group, fault and start, so the event alerts once however long it lasts."""
        return ActionRecord(
            id=action_id(self.name, ActionKind.ALERT, None, self.fault, self.start), node=self.name,
            kind=ActionKind.ALERT, state=ActionState.PROPOSED, reason=self.describe(), actor=ENGINE_ACTOR,
            incident_ts=self.start, created_at=now, updated_at=now, fault=self.fault, source="facility",
            evidence={"group": self.group, "members": sorted(self.members)}, dry_run=dry_run, adapter=adapter)

    def member_verdict(self) -> Verdict:
        """Why a member's own action is not carried out: ``blocked_by="facility:<group>"``."""
        return Verdict(Outcome.NO, self.name, f"one of {len(self.members)} nodes of {self.group} "
                       f"showing {self.fault} at once: a facility event, alerted for the group")

    def summary(self) -> dict[str, Any]:
        """The event as the engine's status shows it."""
        return {"group": self.group, "fault": self.fault, "start": self.start, "last": self.last,
                "members": sorted(self.members)}


class FacilityTracker:
    """Remembers recent onsets and open events across ticks (see the module docstring)."""

    def __init__(self, *, window_s: float, min_nodes: int, fraction: float) -> None:
        self.window_s, self.min_nodes, self.fraction = window_s, min_nodes, fraction
        self._recent: list[tuple[Onset, NodeGroups]] = []
        self.events: dict[tuple[str, str], FacilityEvent] = {}

    def observe(self, now: float, onsets: Sequence[tuple[Onset, NodeGroups]], sizes: Mapping[str, int]
                ) -> dict[tuple[str, str], FacilityEvent]:
        """Add this tick's onsets; returns ``(node, fault) -> event`` for each onset in an event.

        *sizes* gives each group's node count (``partition/gpu``, ``fleet``) for the share test.
        """
        self._expire(now)
        self._recent.extend(onsets)
        out: dict[tuple[str, str], FacilityEvent] = {}
        for onset, groups in onsets:
            ev = self._join_open(onset, groups)
            if ev is not None:
                ev.members.add(onset.node)
                ev.last = max(ev.last, onset.ts)
                out[(onset.node, onset.fault)] = ev
        for onset, groups in onsets:
            if (onset.node, onset.fault) in out:
                continue
            for group, share in groups.candidates():
                members = {o.node for o, g in self._recent
                           if o.fault == onset.fault and group in {c for c, _ in g.candidates()}}
                if len(members) < self.min_nodes:
                    continue
                if share and len(members) < self.fraction * max(1, sizes.get(group, 0)):
                    continue
                start = min(o.ts for o, _ in self._recent if o.node in members and o.fault == onset.fault)
                ev = FacilityEvent(group, onset.fault, start, onset.ts, members)
                self.events[(group, onset.fault)] = ev
                for o, _ in onsets:
                    if o.node in members and o.fault == onset.fault:
                        out[(o.node, o.fault)] = ev
                break
        return out

    def _join_open(self, onset: Onset, groups: NodeGroups) -> FacilityEvent | None:
        for group, _ in groups.candidates():
            ev = self.events.get((group, onset.fault))
            if ev is not None:
                return ev
        return None

    def _expire(self, now: float) -> None:
        self._recent = [(o, g) for o, g in self._recent if now - o.ts <= self.window_s]
        self.events = {k: ev for k, ev in self.events.items() if now - ev.last <= self.window_s}
