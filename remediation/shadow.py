"""Shadow policies: other policies decided on every live tick, recorded and never carried out.

"Run the new policy in dry run beside the old one before arming it" (docs/operations.md): the
engine's leader decides each tick of node scores with its own policy and acts; with
``shadow_policies`` in the service config it also decides the same scores with each shadow
policy (its own memory of which nodes it would hold, as a replay's alternative has) and only
counts and keeps what that policy would have done. ``GET /v1/engine/shadow`` shows them beside
the live policy's, and ``gpuops_shadow_decisions_total`` counts them for dashboards.

A shadow decision is the policy alone: no safety limit, silence, maintenance window or approval
applies (those gate actions, and a shadow takes none), so it reads as "what this policy asks
for", as a replay's ``--compare-policy`` does. The record lives in the leader's memory: a
failover starts it afresh, and :attr:`ShadowPolicies.since` says when it started.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Any, Mapping

from models.node_scores import NodeScores

from .config import PolicyConfig
from .policy import Decision, Explain, PolicyState, decide

#: decisions kept per shadow policy (and for the live one beside them), newest last
RECENT = 200


class ShadowPolicies:
    """See the module docstring. Thread-safe: the API reads while the tick runs."""

    def __init__(self, policies: Mapping[str, PolicyConfig], recent: int = RECENT) -> None:
        self.policies = dict(policies)
        self._state = {name: PolicyState() for name in self.policies}
        self._counts: dict[str, Counter[tuple[str, str]]] = {name: Counter() for name in ["live", *self.policies]}
        self._recent: dict[str, deque[dict[str, Any]]] = {name: deque(maxlen=recent) for name in ["live", *self.policies]}
        self._lock = threading.Lock()
        #: telemetry time of the first tick recorded (None: none yet)
        self.since: float | None = None
        self.ticks = 0

    def tick(self, scores: NodeScores, explain: Explain, live: list[Decision]) -> None:
        """Decide *scores* with every shadow policy; record theirs and the live policy's *live* decisions."""
        decided = {"live": live}
        for name, cfg in self.policies.items():
            decided[name], self._state[name] = decide(scores, self._state[name], scores.ts, cfg, explain)
        with self._lock:
            self.since = scores.ts if self.since is None else self.since
            self.ticks += 1
            for name, decisions in decided.items():
                for d in decisions:
                    self._counts[name][(d.action.value, d.fault.value if d.fault else "none")] += 1
                    self._recent[name].append(d.to_dict())

    def counts(self) -> dict[str, dict[tuple[str, str], int]]:
        """Decisions so far per policy ("live" and each shadow) by (action, fault)."""
        with self._lock:
            return {name: dict(c) for name, c in self._counts.items()}

    def summary(self) -> dict[str, Any]:
        """JSON: since when, how many ticks, and per policy its settings (shadows), counts and recent decisions."""
        with self._lock:
            def one(name: str) -> dict[str, Any]:
                by: dict[str, dict[str, int]] = {}
                for (action, fault), n in sorted(self._counts[name].items()):
                    by.setdefault(action, {})[fault] = n
                return {"decisions": sum(self._counts[name].values()), "by_action_and_fault": by,
                        "recent": list(self._recent[name])}

            return {"since": self.since, "ticks": self.ticks, "live": one("live"),
                    "shadows": {name: {"policy": cfg.model_dump(mode="json")} | one(name)
                                for name, cfg in self.policies.items()}}
