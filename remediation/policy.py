"""The decision policy: (node scores, node state, now, config) → decisions and the new state.

A pure function — no clock, no I/O, no scheduler — so replay, the live engine and
tests all run exactly this. Detection is the models' job; execution (limits, breaker,
approval, adapters) is the engine's; this module only decides, per node and tick:

1. a node gpuops already drained or reset is *held*: no new action, and it is
   resumed once it has been out ``min_hold_s`` and healthy for ``resume_after_s``;
2. a rule that fired (fatal XID, hard threshold) acts at once with the rule's action;
3. a predicted failure acts when its calibrated probability stayed above the fault's
   threshold for ``act_ticks`` ticks, with the action configured for the fault — once
   per ``model_retry_window_s``: a node that came back healthy after a predicted action
   only alerts on the next prediction (the prediction was wrong; a person decides) —
   and only on a node seen for ``model_warmup_s`` (window features need history);
4. otherwise a probability above ``alert_threshold`` or a strong anomaly alerts a
   person (rate-limited per node), changing nothing on the cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from collector.schema import Action, FaultClass, FollowUp, Grade
from models.node_scores import NodeScores

from .config import PolicyConfig

#: explain(node index, source) -> human reason; source is "rule", "model" or "anomaly"
Explain = Callable[[int, str], str]


@dataclass(frozen=True)
class Decision:
    """One decided action (spec/recording.md replay report ``decisions`` entry)."""

    ts: float
    node: str
    gpu: int | None
    action: Action
    fault: FaultClass | None
    score: float
    reason: str
    source: str
    grade: Grade = Grade.ADVISORY
    follow_up: FollowUp | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ts": self.ts, "node": self.node, "gpu": self.gpu, "action": self.action.value,
                "fault": self.fault.value if self.fault else None, "score": round(self.score, 4),
                "reason": self.reason, "source": self.source, "grade": self.grade.value,
                "follow_up": self.follow_up.value if self.follow_up else None}


@dataclass(frozen=True)
class NodeState:
    """What the policy remembers about one node."""

    above_ticks: int = 0
    held_since: float | None = None   # telemetry time gpuops drained/reset it
    healthy_since: float | None = None
    last_alert: float = -math.inf
    predicted_action_at: float | None = None  # last action taken on a prediction (retry cap)


@dataclass(frozen=True)
class PolicyState:
    """Per-node memory; only nodes with something to remember are present."""

    nodes: dict[str, NodeState] = field(default_factory=dict)
    #: telemetry time each node was first scored (for the model's warm-up)
    first_seen: dict[str, float] = field(default_factory=dict)

    def held(self) -> list[str]:
        return [n for n, s in self.nodes.items() if s.held_since is not None]


def decide(scores: NodeScores, state: PolicyState, now: float, cfg: PolicyConfig,
           explain: Explain) -> tuple[list[Decision], PolicyState]:
    """Decisions for one tick of node scores, and the policy state after it."""
    p = scores.p_fail if cfg.use_model else np.zeros(len(scores))
    anomaly = scores.anomaly if cfg.use_model else np.zeros(len(scores))
    low = min(cfg.alert_threshold, cfg.clear_threshold if state.nodes else 1.0)
    interesting = (p >= low) | (scores.rule >= 0) | (anomaly >= cfg.anomaly_alert)
    idx = set(np.flatnonzero(interesting).tolist())
    # a remembered node that is not interesting this tick changes only if it is held or counting
    # ticks; one that merely alerted once stays as it is (most of the state, after a day)
    live = [n for n, ns in state.nodes.items() if ns.held_since is not None or ns.above_ticks]
    if live:
        pos = {str(n): i for i, n in enumerate(scores.node)}
        idx |= {pos[n] for n in live if n in pos}
    nodes = dict(state.nodes)
    first_seen = state.first_seen
    new = [str(n) for n in scores.node if n not in first_seen]
    if new:
        first_seen = {**first_seen, **dict.fromkeys(new, now)}
    out: list[Decision] = []
    for i in sorted(idx):
        name = str(scores.node[i])
        ns = nodes.get(name, NodeState())
        seen_s = now - first_seen[name]
        ns, d = _decide_node(i, name, ns, scores, float(p[i]), float(anomaly[i]), now, seen_s, cfg, explain)
        out.extend(d)
        if ns == NodeState():
            nodes.pop(name, None)
        else:
            nodes[name] = ns
    return out, PolicyState(nodes, first_seen)


def _decide_node(i: int, name: str, ns: NodeState, s: NodeScores, p: float, anomaly: float, now: float,
                 seen_s: float, cfg: PolicyConfig, explain: Explain) -> tuple[NodeState, list[Decision]]:
    rule = int(s.rule[i])
    if ns.held_since is not None:                       # 1. ours already: hold, then resume
        healthy = rule < 0 and p < cfg.clear_threshold
        since = (ns.healthy_since if ns.healthy_since is not None else now) if healthy else None
        if since is not None and now - ns.held_since >= cfg.min_hold_s and now - since >= cfg.resume_after_s:
            reason = f"healthy for {(now - since) / 60:.0f} min after gpuops took it out"
            return NodeState(last_alert=ns.last_alert, predicted_action_at=ns.predicted_action_at), [
                Decision(now, name, None, Action.RESUME, None, p, reason, "policy")]
        return replace(ns, healthy_since=since), []
    if rule >= 0:                                       # 2. hard evidence: act now
        action = s.rule_action[i]
        gpu = int(s.rule_gpu[i]) if s.rule_gpu[i] >= 0 else None  # -1: the rule acts on the whole node
        return NodeState(held_since=now, last_alert=ns.last_alert, predicted_action_at=ns.predicted_action_at), [
            Decision(now, name, gpu, action, s.rule_fault_class(i), 1.0, explain(i, "rule"), "rule",
                     Grade.CERTAIN, s.rule_follow_up[i])]
    fault = s.fault_class(i)
    warm = seen_s >= cfg.model_warmup_s
    if warm and fault is not None and p >= cfg.threshold_for(fault):   # 3. predicted failure, sustained
        ns = replace(ns, above_ticks=ns.above_ticks + 1)
        action = cfg.action_for(fault)
        retried = ns.predicted_action_at is not None and now - ns.predicted_action_at < cfg.model_retry_window_s
        if ns.above_ticks >= cfg.act_ticks and action in (Action.DRAIN, Action.RESET, Action.REQUEUE) and not retried:
            held = now if action in (Action.DRAIN, Action.RESET) else None
            return NodeState(held_since=held, last_alert=ns.last_alert, predicted_action_at=now), [
                Decision(now, name, int(s.gpu[i]), action, fault, p, explain(i, "model"), "model", Grade.PREDICTED)]
    else:
        ns = replace(ns, above_ticks=0)
    if now - ns.last_alert < cfg.alert_interval_s:      # 4. tell a person, rate-limited
        return ns, []
    if p >= cfg.alert_threshold:
        why = explain(i, "model")
        if ns.predicted_action_at is not None and now - ns.predicted_action_at < cfg.model_retry_window_s:
            why += " (gpuops already acted on this node on a prediction that did not come true: a person decides)"
        elif not warm:
            why += (f" (warming up: {seen_s / 60:.0f} min of telemetry; predictions act after "
                    f"{cfg.model_warmup_s / 60:.0f} min)")
        return replace(ns, last_alert=now), [Decision(now, name, int(s.gpu[i]), Action.ALERT, fault, p, why, "model")]
    if anomaly >= cfg.anomaly_alert:
        return replace(ns, last_alert=now), [
            Decision(now, name, None, Action.ALERT, None, anomaly, explain(i, "anomaly"), "anomaly")]
    return ns, []
