"""What gpuops did recently, as the safety limits count it.

The gate (:mod:`remediation.safety`) is a pure function of a :class:`~remediation.safety.Snapshot`;
the counts in it — automatic actions within ``action_window_s`` (the rate cap), each node's
last action (cooldown), take-outs within ``lemon_window_s`` (lemons) — and the circuit
breaker's distinct nodes within ``breaker_window_s`` come from the actions gpuops took.
:class:`RecentActions` keeps them: loaded from the store at start, added to as actions are
taken (an operator's too, marked not automatic: only gpuops' own count against its
limits), and the members of facility events, which the breaker counts though they are
not drained. An escalation (an action on a node gpuops already held, ``ActionRecord.escalates``)
is the same incident going further: it counts towards the rate cap (a reset disrupts too)
but not as a second take-out towards the lemon limit, *provided* the take-out it escalates is
counted. If that hold was rejected after the escalation was approved (a person turned down the
pending drain, and a restart reads back only the escalation), the escalation is the node's
take-out and counts as one. Otherwise a restart would count no take-out for a node gpuops did
take out. Plain bookkeeping: times come in with each call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .actions import ENGINE_ACTOR, ActionKind, ActionRecord, ActionState
from .safety import SafetyConfig, Snapshot


@dataclass(frozen=True)
class PastAction:
    """One earlier action, as the safety limits need it."""

    node: str
    kind: ActionKind
    created_at: float
    automatic: bool
    #: taken on a node gpuops already held: not a new take-out (the lemon limit skips it)
    escalates: bool = False


class RecentActions:
    """gpuops' recent actions and facility-event members (see the module docstring)."""

    def __init__(self) -> None:
        self.past: list[PastAction] = []
        #: facility-event members (node, telemetry time): the breaker counts them like actions
        self.facility_members: list[tuple[str, float]] = []

    def load(self, recs: Iterable[ActionRecord]) -> None:
        """Start over from the store's records (in any order): the cluster actions not rejected or
        cancelled, kept oldest first."""
        self.past = sorted((PastAction(r.node, r.kind, r.created_at, r.actor == ENGINE_ACTOR, r.escalates)
                            for r in recs
                            if r.kind.touches_cluster and r.state not in (ActionState.REJECTED, ActionState.CANCELLED)),
                           key=lambda p: p.created_at)  # time order, which the lemon count reads in

    def add(self, rec: ActionRecord, automatic: bool) -> None:
        """An action that takes a node out (*automatic*: gpuops' own, not a person's)."""
        self.past.append(PastAction(rec.node, rec.kind, rec.created_at, automatic, rec.escalates))

    def add_facility_members(self, nodes: Iterable[str], now: float, window_s: float) -> None:
        """Members of this tick's facility events; those older than *window_s* are let go."""
        self.facility_members.extend((node, now) for node in nodes)
        self.facility_members = [(n, t) for n, t in self.facility_members if now - t < window_s]

    def snapshot(self, now: float, cfg: SafetyConfig, *, fleet_size: int, held: set[str],
                 partition_of: dict[str, tuple[str, ...]], partition_size: dict[str, int],
                 paused: bool, breaker_open: bool) -> Snapshot:
        """The gate's snapshot: the engine's state as given, with the counts of gpuops' own actions.

        Actions older than every window the limits read (rate, cooldown, lemon, breaker) are let
        go here, so an engine that runs for months keeps weeks of them, not all it ever took."""
        horizon = max(cfg.action_window_s, cfg.node_cooldown_s, cfg.lemon_window_s, cfg.breaker_window_s)
        self.past = [p for p in self.past if now - p.created_at < horizon]
        auto = [p for p in self.past if p.automatic]
        last: dict[str, float] = {}
        lemons: dict[str, int] = {}
        for p in auto:  # oldest first: loaded sorted, added as taken
            if p.kind is ActionKind.RESUME:
                continue
            last[p.node] = max(last.get(p.node, 0.0), p.created_at)
            # an escalation adds no take-out to one already counted for its node, and is one when none is
            if now - p.created_at < cfg.lemon_window_s and p.kind.holds_node and not (p.escalates and p.node in lemons):
                lemons[p.node] = lemons.get(p.node, 0) + 1
        return Snapshot(
            now=now, fleet_size=fleet_size, held=held, partition_of=partition_of, partition_size=partition_size,
            actions_in_window=sum(1 for p in auto if p.kind.holds_node and now - p.created_at < cfg.action_window_s),
            last_action_at=last, recent_holds=lemons, paused=paused, breaker_open=breaker_open)

    def breaker_nodes(self, acting: set[str], now: float, cfg: SafetyConfig) -> int:
        """Distinct nodes acted on within ``breaker_window_s``: gpuops' own holds, facility-event
        members (though not drained) and *acting*, this tick's."""
        recent = {p.node for p in self.past
                  if p.automatic and p.kind.holds_node and now - p.created_at < cfg.breaker_window_s}
        recent |= {n for n, _ in self.facility_members}
        return len(recent | acting)
