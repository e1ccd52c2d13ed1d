"""Prometheus metrics of the service (``GET /metrics``), on their own registry.

Two kinds: what the service pushes as it runs (pipeline lag, dead-lettered records, API
latency) and what is read at scrape time from the objects that already know it (each
node's risk from the :class:`~api.nodeview.NodeView`, actions by kind and outcome from the
engine's counters, the breaker, armed, paused, leadership) — a custom collector, so the
scoring tick does no metrics work at all.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: engine.counts keys that are an action's outcome: "<outcome>_<kind>"
_OUTCOMES = ("succeeded", "failed", "transient")
_BLOCKED = ("rejected", "held_for_person")
#: API latency buckets, s: the node list answers in ~1 ms; 25 ms is its p99 target
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _Live(Collector):
    """Reads the fleet view and the engine when Prometheus scrapes."""

    def __init__(self, owner: "Metrics") -> None:
        self.owner = owner

    def collect(self) -> Iterator[Any]:
        o = self.owner
        risk = GaugeMetricFamily("gpuops_node_risk", "Latest calibrated P(node fault within the horizon), 0-1.",
                                 labels=["node"])
        anomaly = GaugeMetricFamily("gpuops_node_anomaly", "Latest anomaly level of the node, 0-1.", labels=["node"])
        states = GaugeMetricFamily("gpuops_nodes", "Nodes by state (ok, at_risk, held, unknown).", labels=["state"])
        blind = GaugeMetricFamily("gpuops_nodes_blind", "Nodes that do not send a precursor signal (ecc, nvlink, "
                                  "pcie, ...): their faults of its classes are seen only when they happen "
                                  "(GET /v1/coverage).", labels=["signal"])
        by_state: dict[str, int] = {"ok": 0, "at_risk": 0, "held": 0, "unknown": 0}
        if o.nodes is not None:
            for r in o.nodes.nodes():
                risk.add_metric([r["node"]], float(r["risk"]))
                anomaly.add_metric([r["node"]], float(r["anomaly"]))
                by_state[r["state"]] = by_state.get(r["state"], 0) + 1
            for sig in o.nodes.coverage()["signals"]:
                blind.add_metric([sig["signal"]], sig["count"])
        for s, n in sorted(by_state.items()):
            states.add_metric([s], n)
        yield risk
        yield anomaly
        yield states
        yield blind
        eng = o.engine
        if eng is None:
            return
        acts = CounterMetricFamily("gpuops_actions", "Actions carried out by this engine, by kind and outcome.",
                                   labels=["kind", "outcome"])
        blocked = CounterMetricFamily("gpuops_actions_blocked", "Automatic actions the safety limits held back, "
                                      "by limit and outcome.", labels=["blocked_by", "outcome"])
        breaker_trips = CounterMetricFamily("gpuops_breaker_opened", "Times the circuit breaker opened.")
        trips = 0
        for key, n in sorted(dict(eng.counts).items()):
            if key == "alert":
                acts.add_metric(["alert", "succeeded"], n)
            elif key == "breaker_opened":
                trips = n
            else:
                for out in _OUTCOMES:
                    if key.startswith(out + "_"):
                        acts.add_metric([key[len(out) + 1:], out], n)
                        break
                else:
                    for out in _BLOCKED:
                        if key.startswith(out + "_"):
                            blocked.add_metric([key[len(out) + 1:], out], n)
                            break
        breaker_trips.add_metric([], trips)
        yield acts
        yield blocked
        yield breaker_trips
        if getattr(eng, "shadow", None) is not None:   # in memory: answers with the store down
            shadow = CounterMetricFamily("gpuops_shadow_decisions", "Decisions of the live policy ('live') and of "
                                         "each shadow policy (decided, never carried out), by action and fault.",
                                         labels=["policy", "action", "fault"])
            for policy, by in sorted(eng.shadow.counts().items()):
                for (action, fault), n in sorted(by.items()):
                    shadow.add_metric([policy, action, fault], n)
            yield shadow
        if hasattr(eng, "budget_status"):               # in memory: answers with the store down
            b = eng.budget_status()
            holds = GaugeMetricFamily("gpuops_budget_prediction_holds", "Holds gpuops took on a prediction that "
                                      "ended in the false-action budget's window, by fault class and outcome "
                                      "(unconfirmed: resumed healthy or a person's verdict healthy).",
                                      labels=["fault", "outcome"])
            braked = GaugeMetricFamily("gpuops_budget_braked", "1 while a fault class's predictions only alert "
                                       "because they ended healthy beyond the false-action budget.", labels=["fault"])
            for f, c in sorted(b["outcomes"].items()):
                for outcome in ("unconfirmed", "confirmed"):
                    holds.add_metric([f, outcome], c[outcome])
                braked.add_metric([f], 1.0 if f in b["braked"] else 0.0)
            yield holds
            yield braked
            yield GaugeMetricFamily("gpuops_budget_exposure_node_seconds", "The fleet's exposure in the "
                                    "false-action budget's window, node-seconds scored (its rate is per 1,000 "
                                    "node-days of it).", value=float(b["node_days"]) * 86400.0)
        try:
            br, armed, paused = eng.breaker, eng.armed, eng.paused
        except Exception:                      # the store is down: the scrape still answers
            o.store_errors.inc()
            return
        yield GaugeMetricFamily("gpuops_breaker_open", "1 while the circuit breaker is open (automation stopped).",
                                value=1.0 if br.get("open") else 0.0)
        yield GaugeMetricFamily("gpuops_armed", "1 while automation is armed (actions reach the scheduler).",
                                value=1.0 if armed else 0.0)
        yield GaugeMetricFamily("gpuops_paused", "1 while automation is paused by a person.",
                                value=1.0 if paused else 0.0)
        yield GaugeMetricFamily("gpuops_leader", "1 on the replica whose engine acts (the lease holder).",
                                value=1.0 if o.is_leader() else 0.0)
        yield GaugeMetricFamily("gpuops_held_nodes", "Nodes gpuops holds out of service now.",
                                value=float(len(eng.holds)))


class Metrics:
    """The service's Prometheus registry and what the composition updates.

    ``nodes``, ``engine`` and ``is_leader`` are read at scrape time (set by :meth:`bind`); the rest
    is pushed by the service.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.nodes: Any = None
        self.engine: Any = None
        self.is_leader: Callable[[], bool] = lambda: False
        r = self.registry
        self.lag = Gauge("gpuops_pipeline_lag_seconds", "Wall time between a sample's arrival and its score, s "
                         "(the last scoring tick).", registry=r)
        self.dead = Counter("gpuops_deadlettered_records", "Records the pipeline refused and dead-lettered, "
                            "by reason.", ["reason"], registry=r)
        self.request_latency = Histogram("gpuops_api_request_duration_seconds", "API request latency, s, by "
                                         "method, route template and status.", ["method", "route", "status"],
                                         buckets=_LATENCY_BUCKETS, registry=r)
        self.store_errors = Counter("gpuops_metrics_store_errors", "Scrapes that could not read the engine's "
                                    "switches from the store.", registry=r)
        r.register(_Live(self))

    def bind(self, *, nodes: Any = None, engine: Any = None, is_leader: Callable[[], bool] | None = None) -> None:
        """What to read at scrape time (the API's :class:`~api.context.AppContext` parts)."""
        if nodes is not None:
            self.nodes = nodes
        if engine is not None:
            self.engine = engine
        if is_leader is not None:
            self.is_leader = is_leader

    # ---- pushed by the service --------------------------------------------------------------

    def observe_lag(self, seconds: float) -> None:
        self.lag.set(max(0.0, float(seconds)))

    def deadlettered(self, n: int, reason: str) -> None:
        if n > 0:
            self.dead.labels(reason=reason).inc(n)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.request_latency.labels(method=method, route=route, status=str(status)).observe(seconds)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
