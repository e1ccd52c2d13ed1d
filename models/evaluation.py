"""Scoring a replay against ground truth (spec/recording.md, "How a replay is scored").

Pure functions, no I/O: :func:`score_replay` turns the decisions of one replay and the
incidents of its recording into plain, JSON-serialisable metrics; :func:`compare` puts
a model's metrics beside the rules baseline's for the report.

Catch rule (fixed by the spec, so constants here rather than settings): a decision with
action ``drain`` or ``reset`` on node N at telemetry time t catches incident I when
``I.node == N``, ``I.fault != "app_error"`` and
``(I.onset_ts or I.failure_ts) - 3600 <= t <= I.failure_ts + 300``. An incident caught
by several decisions counts once, by the earliest (ties: the lower decision index);
lead time is ``failure_ts - t``. A drain/reset that catches no incident is a false
action; those inside an ``app_error`` incident's window on its node are also counted as
``actions_on_app_errors`` (a subset of the false actions).

Interpretations the spec leaves open:

* predictive recall counts, in its numerator, only *predictable* incidents caught with
  lead >= 60 s, so it stays a fraction of its denominator; non-predictable incidents
  caught that early are reported as ``caught_early_unpredictable``;
* an incident without a ``predictable`` field is predictable when it has an ``onset_ts``;
* a false action is attributed to the class named by the decision's ``fault``
  (``"unknown"`` when missing); ``per_class`` lists the node-fault classes, and
  ``false_actions_by_fault`` holds every name seen, so its values sum to the total.

Cost model (GPU-hours; every assumption is a field of :class:`EvalSettings`):

* idle: a drain that catches an incident removes the node's capacity from the decision
  until the failure would have removed it anyway, ``gpus_per_node * max(lead, 0)``, taken
  from the earliest catching *drain* of each incident (overlapping incidents on one node
  would count their overlap twice); a false drain holds the node for
  ``gpus_per_node * false_drain_hold_h``; every reset costs ``reset_cost_gpu_h``;
* saved: an incident caught with lead >= 60 s lets the job checkpoint and move before
  the failure, so it saves the work a crash loses, on average half a checkpoint interval,
  plus the restart: ``gpus_per_node * (checkpoint_interval_h / 2 + restart_h)``. A
  reactive catch (lead < 60 s) saves nothing: the job dies either way;
* net = saved - idle (positive: the actions paid for themselves).

Beside the catches, :func:`count_actions` counts every decision by evidence grade and
action (``actions_by_grade``: certain, corroborated, predicted, advisory; ``unknown`` for
reports written before grades) and by follow-up, and ``alerts_per_1k_node_days`` sets
the alerts a person has to read beside the false actions; ``anomaly_alerts_per_1k_node_days``
counts those of the anomaly detector, and ``unexplained_alerts_per_1k_node_days`` those that
fall in no node fault's catch window (the ones that cost a person time for nothing).
"""

from __future__ import annotations

import enum
import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from collector.schema import NODE_FAULTS, Action, FaultClass

#: spec/recording.md: a catch may come up to this long after the failure (seconds).
CATCH_AFTER_FAILURE_S = 300.0
#: spec/recording.md: ... and from this long before the onset (or the failure) (seconds).
CATCH_BEFORE_ONSET_S = 3600.0
#: spec/recording.md: a catch with at least this lead time is predictive (seconds).
PREDICTIVE_LEAD_S = 60.0

_DISRUPTIVE = (Action.DRAIN, Action.RESET)


@dataclass(frozen=True)
class EvalSettings:
    """Assumptions of the GPU-hour cost model; each field gives its unit and why."""

    #: hours a false drain holds a node before a person checks and resumes it: on-call
    #: triage of a drained node that looks healthy takes about one to a few hours.
    false_drain_hold_h: float = 2.0
    #: GPU-hours one reset (GPU reset or node reboot) costs: about 7.5 min of a node's
    #: 8 GPUs idle while it resets and passes its health check; a predictive reset is
    #: assumed scheduled at a checkpoint, so it loses no job work.
    reset_cost_gpu_h: float = 1.0
    #: hours between checkpoints of the running job; a crash at a random time loses half
    #: of it on average. Large training jobs checkpoint every few tens of minutes so that
    #: frequent hardware interruptions stay affordable (the Llama 3 report, Meta 2024,
    #: counts 419 unexpected interruptions in 54 days, about 78 % hardware).
    checkpoint_interval_h: float = 0.5
    #: hours to detect the crash, reschedule and reload the last checkpoint.
    restart_h: float = 0.25


@dataclass(frozen=True)
class _Incident:
    index: int
    id: str
    node: str
    gpu: int | None
    fault: FaultClass
    onset_ts: float | None
    failure_ts: float
    predictable: bool

    @classmethod
    def parse(cls, index: int, obj: Mapping[str, Any]) -> "_Incident":
        try:
            fault = FaultClass(_name(obj["fault"]))
            failure_ts = float(obj["failure_ts"])
            node = _name(obj["node"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"incident {index} ({obj.get('id')!r}) is not scorable: {e!r}") from e
        onset = obj.get("onset_ts")
        onset_ts = None if onset is None else float(onset)
        pred = obj.get("predictable")
        gpu = obj.get("gpu")
        return cls(index, _name(obj.get("id") or f"#{index}"), node, None if gpu is None else int(gpu),
                   fault, onset_ts, failure_ts, onset_ts is not None if pred is None else bool(pred))

    def window_holds(self, t: float) -> bool:
        """True when time *t* lies in this incident's catch window (bounds included)."""
        start = self.failure_ts if self.onset_ts is None else self.onset_ts
        return start - CATCH_BEFORE_ONSET_S <= t <= self.failure_ts + CATCH_AFTER_FAILURE_S


def _name(x: Any) -> str:
    return x.value if isinstance(x, enum.Enum) else str(x)


def _ratio(num: float, den: float) -> float | None:
    return None if den <= 0 else num / den


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _per_1k(count: int, node_days: float) -> float | None:
    return None if not node_days > 0 else 1000.0 * count / node_days


def count_actions(decisions: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Decisions counted by evidence grade and action, and by follow-up (JSON-ready, sorted)."""
    by_grade: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    by_follow_up: dict[str, int] = defaultdict(int)
    alerts = 0
    for d in decisions:
        action = _name(d.get("action") or Action.NONE)
        by_grade[_name(d.get("grade") or "unknown")][action] += 1
        if d.get("follow_up"):
            by_follow_up[_name(d["follow_up"])] += 1
        alerts += action == Action.ALERT.value
    return {"actions_by_grade": {g: dict(sorted(a.items())) for g, a in sorted(by_grade.items())},
            "actions_by_follow_up": dict(sorted(by_follow_up.items())), "alerts": alerts}


def score_replay(decisions: Iterable[Mapping[str, Any]], incidents: Iterable[Mapping[str, Any]], *,
                 node_days: float, gpus_per_node: int,
                 settings: EvalSettings = EvalSettings()) -> dict[str, Any]:
    """Score one replay's *decisions* against *incidents* by the spec's rules.

    *node_days* (``Manifest.node_days``) normalises false actions; *gpus_per_node*
    scales the cost model. Returns a JSON-serialisable dict (see the module docstring
    for the rules); undefined ratios and percentiles are ``None``. Raises ``ValueError``
    for a decision with an unknown action or an incident that cannot be scored.
    """
    decs = list(decisions)
    incs = [_Incident.parse(i, obj) for i, obj in enumerate(incidents)]
    by_node: dict[str, list[_Incident]] = defaultdict(list)
    for inc in incs:
        by_node[inc.node].append(inc)

    disruptive: list[tuple[float, int, Action]] = []
    for i, d in enumerate(decs):
        try:
            action = Action(_name(d.get("action") or Action.NONE))
        except ValueError as e:
            raise ValueError(f"decision {i} has an unknown action {d.get('action')!r}") from e
        if action in _DISRUPTIVE:
            disruptive.append((float(d["ts"]), i, action))
    disruptive.sort(key=lambda x: (x[0], x[1]))

    first: dict[int, tuple[float, int]] = {}      # incident index -> (ts, decision index)
    first_drain: dict[int, float] = {}            # incident index -> ts of earliest drain
    false_idx: list[int] = []
    on_app_errors = 0
    false_by_fault: dict[str, int] = defaultdict(int)
    resets = false_drains = 0
    for ts, di, action in disruptive:
        resets += action is Action.RESET
        caught_any = in_app_window = False
        for inc in by_node.get(_name(decs[di].get("node")), ()):
            if not inc.window_holds(ts):
                continue
            if inc.fault is FaultClass.APP_ERROR:
                in_app_window = True
                continue
            caught_any = True
            first.setdefault(inc.index, (ts, di))
            if action is Action.DRAIN:
                first_drain.setdefault(inc.index, ts)
        if not caught_any:
            false_idx.append(di)
            on_app_errors += in_app_window
            false_drains += action is Action.DRAIN
            false_by_fault[_name(decs[di].get("fault") or "unknown")] += 1

    per_incident = []
    for inc in incs:
        hit = first.get(inc.index)
        lead = None if hit is None else inc.failure_ts - hit[0]
        per_incident.append({
            "id": inc.id, "node": inc.node, "gpu": inc.gpu, "fault": inc.fault.value,
            "onset_ts": inc.onset_ts, "failure_ts": inc.failure_ts, "predictable": inc.predictable,
            "caught": hit is not None, "lead_s": lead, "decision": None if hit is None else hit[1],
        })

    def summary(rows: list[dict[str, Any]], false_actions: int) -> dict[str, Any]:
        leads = [r["lead_s"] for r in rows if r["caught"]]
        predictable = [r for r in rows if r["predictable"]]
        early = [r for r in predictable if r["caught"] and r["lead_s"] >= PREDICTIVE_LEAD_S]
        return {
            "incidents": len(rows), "caught": len(leads), "predictable": len(predictable),
            "caught_predictively": len(early), "recall": _ratio(len(leads), len(rows)),
            "predictive_recall": _ratio(len(early), len(predictable)),
            "median_lead_s": _pct(leads, 50), "false_actions": false_actions,
            "false_actions_per_1k_node_days": _per_1k(false_actions, node_days),
        }

    node_rows = [r for r in per_incident if r["fault"] != FaultClass.APP_ERROR.value]
    total = summary(node_rows, len(false_idx))
    leads = [r["lead_s"] for r in node_rows if r["caught"]]
    early_all = [r for r in node_rows if r["caught"] and r["lead_s"] >= PREDICTIVE_LEAD_S]

    h = 1 / 3600.0
    idle_lead = sum(gpus_per_node * max(inc.failure_ts - first_drain[inc.index], 0.0) * h
                    for inc in incs if inc.index in first_drain)
    idle_false = gpus_per_node * settings.false_drain_hold_h * false_drains
    reset_cost = settings.reset_cost_gpu_h * resets
    idle = idle_lead + idle_false + reset_cost
    saved = len(early_all) * gpus_per_node * (settings.checkpoint_interval_h / 2 + settings.restart_h)

    counts = count_actions(decs)
    # alerts a person reads that no node fault explains (outside every catch window on the node)
    unexplained = anomaly_alerts = 0
    for d in decs:
        if _name(d.get("action") or "") != Action.ALERT.value:
            continue
        anomaly_alerts += _name(d.get("source") or "") == "anomaly"
        t = float(d["ts"])
        unexplained += not any(inc.fault is not FaultClass.APP_ERROR and inc.window_holds(t)
                               for inc in by_node.get(_name(d.get("node")), ()))
    return {
        "anomaly_alerts": anomaly_alerts, "unexplained_alerts": unexplained,
        "anomaly_alerts_per_1k_node_days": _per_1k(anomaly_alerts, node_days),
        "unexplained_alerts_per_1k_node_days": _per_1k(unexplained, node_days),
        "node_days": float(node_days), "gpus_per_node": int(gpus_per_node),
        "decisions": len(decs), "disruptive_decisions": len(disruptive),
        **counts, "alerts_per_1k_node_days": _per_1k(counts["alerts"], node_days),
        "node_fault_incidents": total.pop("incidents"),
        "app_error_incidents": len(per_incident) - len(node_rows),
        **total,
        "caught_early_unpredictable": len(early_all) - total["caught_predictively"],
        "p10_lead_s": _pct(leads, 10), "p90_lead_s": _pct(leads, 90),
        "actions_on_app_errors": on_app_errors,
        "false_actions_by_fault": dict(sorted(false_by_fault.items())),
        "idle_gpu_h": idle, "saved_gpu_h": saved, "net_gpu_h": saved - idle,
        "cost_breakdown": {"idle_before_failure_gpu_h": idle_lead, "false_drain_gpu_h": idle_false,
                           "reset_gpu_h": reset_cost, "settings": asdict(settings)},
        "per_class": {f.value: summary([r for r in node_rows if r["fault"] == f.value],
                                       false_by_fault.get(f.value, 0)) for f in NODE_FAULTS},
        "per_incident": per_incident,
        "false_decisions": sorted(false_idx),
    }


#: Headline metrics of the side-by-side, each with the direction that is better.
HEADLINE: dict[str, str] = {
    "recall": "higher", "predictive_recall": "higher", "median_lead_s": "higher",
    "false_actions_per_1k_node_days": "lower", "alerts_per_1k_node_days": "lower", "actions_on_app_errors": "lower",
    "idle_gpu_h": "lower", "saved_gpu_h": "higher", "net_gpu_h": "higher",
}


def _delta(a: Any, b: Any, better: str, names: tuple[str, str] = ("model", "baseline")) -> dict[str, Any]:
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (a, b))
    return {names[0]: a, names[1]: b, "delta": a - b if ok else None, "better": better}


def compare(first: Mapping[str, Any], second: Mapping[str, Any],
            names: tuple[str, str] = ("model", "baseline")) -> dict[str, Any]:
    """Side-by-side of two :func:`score_replay` results (the first minus the second), each side
    named by *names* (the report's model and rules baseline by default; a policy and an
    alternative policy for ``gpuops replay --compare-policy``).

    ``headline`` maps each metric of :data:`HEADLINE` to ``{<first>, <second>, delta,
    better}`` (``delta`` is ``None`` when either side is undefined); ``per_class`` does
    the same for recall and predictive recall of each class; ``caught_only_by_<name>``
    list incident ids one caught and the other missed, and ``ahead_only_by_<name>`` the
    predictable ones one caught at least 60 s ahead and the other did not.
    """
    a, b = names
    headline = {k: _delta(first.get(k), second.get(k), d, names) for k, d in HEADLINE.items()}
    per_class = {}
    mc, bc = first.get("per_class", {}), second.get("per_class", {})
    for cls in sorted(set(mc) | set(bc)):
        m, o = mc.get(cls, {}), bc.get(cls, {})
        per_class[cls] = {k: _delta(m.get(k), o.get(k), "higher", names) for k in ("recall", "predictive_recall")}

    def caught(metrics: Mapping[str, Any], ahead: bool = False) -> set[str]:
        return {r["id"] for r in metrics.get("per_incident", []) if r["caught"] and (
            not ahead or (r.get("predictable") and r["fault"] != FaultClass.APP_ERROR.value
                          and r["lead_s"] >= PREDICTIVE_LEAD_S))}

    m_ids, b_ids = caught(first), caught(second)
    m_early, b_early = caught(first, True), caught(second, True)
    return {"headline": headline, "per_class": per_class,
            f"caught_only_by_{a}": sorted(m_ids - b_ids), f"caught_only_by_{b}": sorted(b_ids - m_ids),
            f"ahead_only_by_{a}": sorted(m_early - b_early), f"ahead_only_by_{b}": sorted(b_early - m_early)}
