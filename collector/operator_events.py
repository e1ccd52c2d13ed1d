"""Operator events: structured §3 events with ``source="operator"`` (a maintenance window).

Operators (or their tooling: a change calendar, a runbook script) publish these to the event
topic, or write them into a recording's ``events.jsonl``, like any other §3 event. A
maintenance event declares a window of planned work::

    {"schema": "gpuops.event", "v": 1, "ts": 1760000000.0, "node": "gpu-a01",
     "source": "operator", "kind": "maintenance",
     "nodes": ["gpu-a01", "gpu-a02"], "start": 1760000000.0, "end": 1760007200.0,
     "reason": "PDU swap, rack a", "author": "alice", "message": "PDU swap, rack a"}

``node`` is the first of ``nodes`` (every §3 event names a node); ``start`` / ``end`` are
seconds since the epoch (``end`` after ``start``), ``reason`` is required, ``author``
optional. The pipeline keeps these events, the API shows them on each listed node's
timeline, the replay report lists them per node, and the service turns one into a silence
(:mod:`remediation.silences`) for its window. This module owns the format: it builds and
parses one, and says what is wrong with a malformed one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .schema import NODE_NAME_RE

OPERATOR = "operator"
MAINTENANCE = "maintenance"


class OperatorEventError(ValueError):
    """A malformed operator event (permanent: the sender fixes it; the pipeline dead-letters it)."""


@dataclass(frozen=True)
class MaintenanceWindow:
    """Planned work on *nodes* from *start* to *end* (epoch s), with its reason and author."""

    nodes: tuple[str, ...]
    start: float
    end: float
    reason: str
    author: str = ""


def is_operator_maintenance(event: Mapping[str, Any]) -> bool:
    """Whether *event* claims to be an operator maintenance event (valid or not)."""
    return event.get("source") == OPERATOR and event.get("kind") == MAINTENANCE


def maintenance_event(nodes: Sequence[str], start: float, end: float, reason: str, *, author: str = "",
                      ts: float | None = None) -> dict[str, Any]:
    """The §3 event record (without the wire envelope) for one maintenance window; validated."""
    ev = {"ts": float(start if ts is None else ts), "node": nodes[0] if nodes else "", "source": OPERATOR,
          "kind": MAINTENANCE, "nodes": list(nodes), "start": float(start), "end": float(end),
          "reason": reason, "author": author, "message": reason}
    maintenance_window(ev)
    return ev


def maintenance_window(event: Mapping[str, Any]) -> MaintenanceWindow | None:
    """The window an operator maintenance event declares; ``None`` for any other event.

    Raises :class:`OperatorEventError` naming what is wrong with a malformed one.
    """
    if not is_operator_maintenance(event):
        return None
    nodes = event.get("nodes")
    if isinstance(nodes, str) or not isinstance(nodes, Sequence) or not nodes:
        raise OperatorEventError("operator maintenance event: 'nodes' must be a non-empty list of node names")
    bad = [n for n in nodes if not isinstance(n, str) or not NODE_NAME_RE.match(n)]
    if bad:
        raise OperatorEventError(f"operator maintenance event: malformed node names {bad[:5]!r}")
    times = {}
    for key in ("start", "end"):
        v = event.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise OperatorEventError(f"operator maintenance event: '{key}' must be epoch seconds, got {v!r}")
        times[key] = float(v)
    if times["end"] <= times["start"]:
        raise OperatorEventError("operator maintenance event: 'end' must be after 'start'")
    reason = event.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise OperatorEventError("operator maintenance event: a 'reason' is required (what work, by whom)")
    author = event.get("author") or ""
    if not isinstance(author, str):
        raise OperatorEventError("operator maintenance event: 'author' must be a string")
    return MaintenanceWindow(tuple(nodes), times["start"], times["end"], reason.strip(), author)
