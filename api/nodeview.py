"""The fleet as the API shows it: every node's latest score, state and recent history.

Fed once per scoring tick from ``gpu.scores`` (every API replica keeps its own, the
engine leader's included) and from the engine's view of held nodes; read by
``GET /v1/nodes`` and ``GET /v1/nodes/{name}``. Reads never wait for the scoring loop
or the store: :meth:`NodeView.update` builds new immutable snapshots and swaps them in
with one reference assignment, and the node list's JSON body is rendered once per
update (orjson), not once per request — FastAPI's default encoding of 1,000 nodes
manages about 66 requests/s here, a prepared body thousands (PERFORMANCE.md).

A node that stops reporting for ``stale_after_s`` is shown ``unknown`` (the stale
telemetry job calls :meth:`mark_stale`); it is never drained for silence alone.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import orjson

from models.base import CLASSES
from models.coverage import SIGNALS, names_of
from models.node_scores import NodeScores

#: node states the API shows
OK, AT_RISK, HELD, UNKNOWN = "ok", "at_risk", "held", "unknown"
#: a node shows a precursor signal as not sent once it was not on this many scored ticks in a row
BLIND_TICKS = 3


@dataclass(frozen=True)
class _Snapshot:
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    body: bytes = b'{"nodes":[],"count":0,"ts":null}'
    ts: float | None = None


class NodeView:
    """See the module docstring. One writer (the scores consumer), any number of readers."""

    def __init__(self, history_points: int = 360, events_per_node: int = 50, at_risk: float = 0.3) -> None:
        self.history_points = history_points
        self.events_per_node = events_per_node
        self.at_risk = at_risk
        self._snap = _Snapshot()
        self._history: dict[str, deque] = {}
        self._events: dict[str, deque] = {}
        self._blind: dict[str, tuple[int, ...]] = {}
        self._held: frozenset[str] = frozenset()
        self._stale: frozenset[str] = frozenset()
        self._write = threading.Lock()

    # ---- writers ---------------------------------------------------------------------------

    def update(self, ns: NodeScores, reasons: Mapping[str, Mapping[str, str]] | None = None,
               detail: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """One tick of scores (a worker's share of the fleet); nodes not in it keep their last row."""
        reasons = reasons or {}
        detail = detail or {}
        with self._write:
            nodes = dict(self._snap.nodes)
            for i, name in enumerate(ns.node):
                name = str(name)
                risk = float(ns.p_fail[i])
                fault = CLASSES[int(ns.fault[i])] if ns.fault[i] > 0 else None
                row = {"node": name, "ts": float(ns.ts), "risk": round(risk, 4), "fault": fault,
                       "gpu": int(ns.gpu[i]), "anomaly": round(float(ns.anomaly[i]), 6),
                       "rule": int(ns.rule[i]) if ns.rule[i] >= 0 else None,
                       "reasons": dict(reasons.get(name, {})), "detail": dict(detail.get(name, {})),
                       "gpus_reading": ns.reading_gpus(i),
                       "gpus_lost": None if ns.gpus_lost is None else ns.lost_gpus(i),
                       "blind_signals": self._blind_signals(name, ns, i)}
                row["state"] = self._state(name, risk, row["rule"])
                nodes[name] = row
                h = self._history.get(name)
                if h is None:
                    h = self._history[name] = deque(maxlen=self.history_points)
                h.append((float(ns.ts), round(risk, 4), round(float(ns.anomaly[i]), 6)))
            self._stale = self._stale - {str(n) for n in ns.node}
            self._publish(nodes, float(ns.ts))

    def _blind_signals(self, name: str, ns: NodeScores, i: int) -> list[str] | None:
        """The precursor signals *name* did not send on each of its last :data:`BLIND_TICKS` scored ticks (one tick
        without a counter's delta, a GPU's first or a port read slower than its GPUs, is not a blind spot); None
        until that many ticks said (or when the scorer does not say)."""
        if ns.blind is None:
            self._blind.pop(name, None)
            return None
        last = (*self._blind.get(name, ())[1 - BLIND_TICKS:], int(ns.blind[i]))
        self._blind[name] = last
        if len(last) < BLIND_TICKS:
            return None
        bits = last[0]
        for b in last[1:]:
            bits &= b
        return names_of(bits)

    def set_held(self, held: Iterable[str]) -> None:
        """The nodes gpuops holds out of service now (the engine's view)."""
        with self._write:
            self._held = frozenset(held)
            self._restate()

    def mark_stale(self, nodes: Iterable[str]) -> None:
        """Nodes whose telemetry stopped: shown ``unknown`` until they report again."""
        with self._write:
            self._stale = frozenset(nodes)
            self._restate()

    def add_events(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Recent events per node (XIDs, operator events, command results) for the node page."""
        with self._write:
            for e in events:
                # an operator maintenance event lists its nodes: it shows on each one's timeline
                listed = e.get("nodes") if isinstance(e.get("nodes"), list) else [e.get("node", "")]
                for node in dict.fromkeys(str(n) for n in listed if n):
                    q = self._events.get(node)
                    if q is None:
                        q = self._events[node] = deque(maxlen=self.events_per_node)
                    q.append(dict(e))

    def _state(self, name: str, risk: float, rule: int | None) -> str:
        if name in self._stale:
            return UNKNOWN
        if name in self._held:
            return HELD
        return AT_RISK if (risk >= self.at_risk or rule is not None) else OK

    def _restate(self) -> None:
        nodes = {n: {**r, "state": self._state(n, r["risk"], r["rule"])} for n, r in self._snap.nodes.items()}
        self._publish(nodes, self._snap.ts)

    def _publish(self, nodes: dict[str, dict[str, Any]], ts: float | None) -> None:
        rows = [{k: r[k] for k in ("node", "state", "risk", "fault", "gpu", "anomaly", "rule", "ts")}
                for r in sorted(nodes.values(), key=lambda r: r["node"])]
        body = orjson.dumps({"nodes": rows, "count": len(rows), "ts": ts})
        self._snap = _Snapshot(nodes, body, ts)         # one assignment: readers see old or new, never half

    # ---- readers (no locks) ----------------------------------------------------------------

    def list_body(self) -> bytes:
        """``GET /v1/nodes``'s JSON body, rendered at the last update."""
        return self._snap.body

    def nodes(self) -> list[dict[str, Any]]:
        return list(self._snap.nodes.values())

    def get(self, name: str) -> dict[str, Any] | None:
        """One node's latest row with its history and recent events; None if never seen."""
        row = self._snap.nodes.get(name)
        if row is None:
            return None
        history = list(self._history.get(name, ()))
        events = list(self._events.get(name, ()))
        return {**row, "history": [{"ts": t, "risk": r, "anomaly": a} for t, r, a in history], "events": events}

    def coverage(self) -> dict[str, Any]:
        """Per signal of :data:`models.coverage.SIGNALS`: the nodes whose latest row says they do not send it
        (sorted), the fault classes it warns of and what to enable; how many nodes the scorers said anything about
        (a scorer older than the ``blind`` field says nothing), and when. ``GET /v1/coverage`` and ``/metrics``."""
        snap = self._snap
        blind: dict[str, list[str]] = {s.name: [] for s in SIGNALS}
        known = 0
        for name, r in snap.nodes.items():
            if r.get("blind_signals") is None:
                continue
            known += 1
            for n in r["blind_signals"]:
                blind[n].append(name)
        signals = [{"signal": s.name, "faults": [f.value for f in s.faults], "enable": s.enable,
                    "nodes": sorted(blind[s.name]), "count": len(blind[s.name])} for s in SIGNALS]
        return {"signals": signals, "nodes_known": known, "ts": snap.ts}

    def __len__(self) -> int:
        return len(self._snap.nodes)

    @property
    def ts(self) -> float | None:
        """Telemetry time of the newest update (None before the first)."""
        return self._snap.ts
