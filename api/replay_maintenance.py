"""Maintenance in replay: a recording's operator maintenance events hold actions back, as live.

Live, an operator maintenance event (:mod:`collector.operator_events`) becomes a silence of
actions on its nodes for its window (:meth:`remediation.engine.Engine.on_operator_event`).
A replay that ignored them would report drains an operator had declared away: a link
flapping while its switch is being upgraded would count as a false action. So the
:class:`~api.replay.Replayer` reads the recording's maintenance events up front
(:class:`MaintenanceSchedule`) and honours them on both of its paths:

- through the dry-run engine (``--safety``): each event goes to ``on_operator_event`` when
  telemetry time reaches its ``ts``, before that tick is decided. The engine records each
  decision the window mutes as rejected with ``blocked_by="maintenance:<silence id>"``, so
  the report's ``engine.suppressed_by_cause`` counts it under ``maintenance``;
- policy only (the model without an engine, and always the rules-only baseline): a decision
  that would act on a node inside a window (anything but an alert: the silence mutes
  actions, alerts still show what gpuops saw) is taken out of the decisions and kept as a
  :class:`Suppressed` with cause ``maintenance``; the policy state lets go of the node as
  the engine does after a rejected action, so it may act once the window has ended.

Inside a window means ``start <= ts < end`` (a silence's "in force"). A malformed
maintenance event is logged and skipped, as the live engine does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Iterable

from collector.operator_events import MaintenanceWindow, OperatorEventError, maintenance_window
from pipeline.recordings import operator_context_from_frame
from remediation.policy import Action, Decision, PolicyState

log = logging.getLogger(__name__)

#: the cause a held-back decision is counted under (as the engine's ``blocked_by`` prefix)
MAINTENANCE = "maintenance"


@dataclass(frozen=True)
class Suppressed:
    """A decision the policy made that a maintenance window kept from becoming an action."""

    decision: Decision
    window: MaintenanceWindow
    cause: str = MAINTENANCE

    def to_dict(self) -> dict[str, Any]:
        w = self.window
        return {**self.decision.to_dict(), "cause": self.cause,
                "window": {"start": w.start, "end": w.end, "reason": w.reason, "author": w.author}}


class MaintenanceSchedule:
    """The recording's maintenance events in time order, with the windows they declare."""

    def __init__(self, events: Iterable[dict[str, Any]] = ()) -> None:
        self.events: list[dict[str, Any]] = []
        self.windows: list[MaintenanceWindow] = []
        for ev in sorted(events, key=lambda e: float(e["ts"])):
            try:
                window = maintenance_window(ev)
            except OperatorEventError as e:
                log.warning("replay: operator event at %s ignored: %s", ev.get("ts"), e)
                continue
            if window is not None:
                self.events.append(ev)
                self.windows.append(window)
        self._delivered = 0
        self._by_node: dict[str, list[MaintenanceWindow]] = {}
        for w in self.windows:
            for node in w.nodes:
                self._by_node.setdefault(node, []).append(w)

    @classmethod
    def from_frame(cls, events: Any) -> "MaintenanceSchedule":
        """From a recording's events table (:meth:`Recording.events`), read into records as the
        pipeline reads them (:func:`pipeline.recordings.operator_context_from_frame`; the agent's
        command results among them declare no window); empty when it has none."""
        return cls(operator_context_from_frame(events))

    def __len__(self) -> int:
        return len(self.windows)

    def due(self, ts: float) -> list[dict[str, Any]]:
        """The events not handed out yet whose ``ts`` is at or before *ts* (each once, in order)."""
        start = self._delivered
        while self._delivered < len(self.events) and float(self.events[self._delivered]["ts"]) <= ts:
            self._delivered += 1
        return self.events[start:self._delivered]

    def covering(self, node: str, ts: float) -> MaintenanceWindow | None:
        """The first window in force on *node* at *ts*, if any."""
        return next((w for w in self._by_node.get(node, ()) if w.start <= ts < w.end), None)

    def hold_back(self, decisions: list[Decision], before: PolicyState, state: PolicyState, ts: float
                  ) -> tuple[list[Decision], list[Suppressed], PolicyState]:
        """*decisions* (made on *before*, giving *state*) without those that would act inside a
        window, those held back, and the policy state fixed up as the engine's would be: a node
        whose action was held back is let go, a node whose resume was held back stays held with
        its clean time restarted (policy-only replay; see the module docstring)."""
        if not self._by_node:
            return decisions, [], state
        kept: list[Decision] = []
        held_back: list[Suppressed] = []
        nodes = None
        for d in decisions:
            window = None if d.action is Action.ALERT else self.covering(d.node, ts)
            if window is None:
                kept.append(d)
                continue
            held_back.append(Suppressed(d, window))
            ns = state.nodes.get(d.node)
            if d.action is not Action.RESUME and ns is not None and ns.held_since is not None:
                nodes = nodes if nodes is not None else dict(state.nodes)
                nodes[d.node] = replace(ns, held_since=None, held_grade=None, held_fault=None, healthy_since=None)
            elif d.action is Action.RESUME and d.node in before.nodes:
                nodes = nodes if nodes is not None else dict(state.nodes)
                nodes[d.node] = replace(before.nodes[d.node], healthy_since=None)
        return kept, held_back, (state if nodes is None else replace(state, nodes=nodes))


def by_cause(suppressed: Iterable[Suppressed]) -> dict[str, int]:
    """How many decisions were held back, by cause (the report's ``suppressed_by_cause``)."""
    out: dict[str, int] = {}
    for s in suppressed:
        out[s.cause] = out.get(s.cause, 0) + 1
    return dict(sorted(out.items()))

