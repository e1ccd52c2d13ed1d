"""Replay: a recording through the live path (pipeline → models → policy) in telemetry time.

The same :class:`~pipeline.stream.FeaturePipeline`, :func:`~models.node_scores.score_batches`,
:func:`~models.node_scores.aggregate` and :func:`~remediation.policy.decide` as the live
service, with adapters out of the loop (nothing touches a cluster). Ticks are scored in
stacks of ~``score_rows`` rows (one scikit-learn call per detector for many ticks) and
then decided one tick at a time, in order. The rules-only baseline is decided on the
same scores in the same pass, so the report compares like with like, and so is any
alternative policy (``alternatives``, ``gpuops replay --compare-policy``).

A recording with no GPU sample to score (``gpu.parquet`` with zero rows, or every row
breaking the contract) is a :class:`~collector.recording.RecordingError` naming why:
there is nothing to replay. Port samples and events before the tick of the first GPU
sample are not replayed (there is no GPU yet to score); they are counted in the
summary's ``not_replayed_before_first_gpu_sample``.

Operator maintenance events in the recording hold actions back on their nodes for their
windows, on the engine path and the policy-only path alike (:mod:`api.replay_maintenance`);
the summary counts what they held back in ``suppressed_by_cause``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from api.replay_maintenance import MaintenanceSchedule, Suppressed, by_cause
from collector.recording import RecordingError, RecordingWindow, open_recording
from collector.schema import Action, RecordType
from models.bundle import ModelBundle, ScoreBatch
from models.coverage import CoverageTally
from models.explainer import Explainer
from models.node_scores import NodeScores, aggregate, score_batches
from pipeline.batch import FeatureBatch
from pipeline.recordings import RECORDING_COLUMNS
from pipeline.settings import PipelineSettings
from pipeline.stream import FeaturePipeline
from remediation.config import PolicyConfig
from remediation.actions import ActionRecord
from remediation.adapters.dryrun import DryRunAdapter
from remediation.engine import Engine
from remediation.policy import Decision, PolicyState, decide
from remediation.budget import report as budget_report
from remediation.safety import SafetyConfig
from remediation.store import ActionStore

#: recording read window, s: bounds memory to one window of rows
READ_WINDOW_S = 3600.0

T = TypeVar("T")

log = logging.getLogger(__name__)


class StageClock:
    """CPU seconds (``time.process_time``) spent per stage of a replay: read, scoring, policy;
    the pipeline is the rest. A few calls per scored stack: no cost on the hot path."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {"read": 0.0, "scoring": 0.0, "policy": 0.0}

    def timed(self, stage: str, items: Iterable[T]) -> Iterator[T]:
        """*items*, with the time spent producing each one charged to *stage*."""
        it = iter(items)
        while True:
            c = time.process_time()
            try:
                item = next(it)
            except StopIteration:
                self.cpu[stage] += time.process_time() - c
                return
            self.cpu[stage] += time.process_time() - c
            yield item


@dataclass
class PolicyRun:
    """What one more policy decided on the same scores (``Replayer(alternatives=...)``)."""

    policy: PolicyConfig
    decisions: list[Decision] = field(default_factory=list)
    #: decisions a maintenance window kept from acting
    suppressed: list[Suppressed] = field(default_factory=list)
    #: its false-action budget at the end (:func:`remediation.budget.report`)
    budget: dict[str, Any] = field(default_factory=dict)


@dataclass
class ReplayResult:
    """Decisions of the model policy and of the rules-only baseline, with run statistics."""

    decisions: list[Decision] = field(default_factory=list)
    baseline_decisions: list[Decision] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    #: the engine's action records (only when replayed through an engine, :func:`dry_run_engine`)
    actions: list[ActionRecord] = field(default_factory=list)
    #: decisions a maintenance window kept from acting, policy-only path (the engine records its own)
    suppressed: list[Suppressed] = field(default_factory=list)
    baseline_suppressed: list[Suppressed] = field(default_factory=list)
    #: the recording's operator events on each node's timeline (:func:`operator_timeline`)
    operator_events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: other policies decided on the same scores, by name (``gpuops replay --compare-policy``)
    alternatives: dict[str, PolicyRun] = field(default_factory=dict)
    #: the model policy's false-action budget at the end (:func:`remediation.budget.report`)
    budget: dict[str, Any] = field(default_factory=dict)
    #: resumes of a node that had a lost GPU at that tick (NodeScores.gpus_lost), model policy and rules-only
    resumed_with_gpu_lost: list[int] = field(default_factory=lambda: [0, 0])
    #: the precursor signals each node did not send (NodeScores.blind), for the report's ``coverage``
    coverage: CoverageTally = field(default_factory=CoverageTally)


class TelemetryClock:
    """The engine's clock during replay: the telemetry time of the tick being decided."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def dry_run_engine(policy: PolicyConfig, safety: SafetyConfig | None = None,
                   store_url: str = "sqlite://") -> tuple[Engine, TelemetryClock]:
    """An engine for replay: the dry-run adapter, an in-memory store unless given, telemetry time.

    With the default safety limits the replay shows what gpuops would really have done,
    limits included; ``SafetyConfig(max_held_nodes=..., ...)`` wide open shows the policy alone.
    """
    clock = TelemetryClock()
    store = ActionStore(store_url)
    store.migrate()
    engine = Engine(store, DryRunAdapter(), policy=policy, safety=safety, clock=clock)
    engine.start()
    return engine, clock


class Replayer:
    """Pushes recordings through pipeline, models and policy (dry run, telemetry time)."""

    def __init__(self, bundle: ModelBundle, policy: PolicyConfig, pipeline: PipelineSettings | None = None,
                 score_rows: int = 10_000, engine: tuple[Engine, TelemetryClock] | None = None,
                 observe: Callable[[FeatureBatch, ScoreBatch], None] | None = None,
                 trace: Callable[[FeatureBatch, ScoreBatch, Sequence[Decision]], None] | None = None,
                 alternatives: Mapping[str, PolicyConfig] | None = None):
        self.bundle = bundle
        self.policy = engine[0].policy if engine is not None else policy
        #: when given, the model policy's decisions are the engine's (safety, store, dry-run adapter)
        self.engine = engine
        self.baseline_policy = policy.model_copy(update={"use_model": False})
        self.pipeline_settings = pipeline or PipelineSettings()
        self.score_rows = score_rows
        self.clock = StageClock()
        self.explainer = Explainer(bundle)
        self.maintenance = MaintenanceSchedule()
        #: called with every scored tick's features and scores, in time order (benches read them here
        #: instead of running the pipeline a second time)
        self.observe = observe
        #: called like *observe*, with the model policy's decisions of that tick too (``--trace``)
        self.trace = trace
        #: more policies decided on the same scores, by the policy alone (no engine), as the baseline is: the
        #: policy stage is 1-2 % of a replay's CPU, so comparing policies costs one replay, not one each
        self.alternatives = dict(alternatives or {})

    def run(self, path: str | Path, progress: Callable[[float], None] | None = None) -> ReplayResult:
        """Replay one recording; *progress* gets the fraction of telemetry time done."""
        rec = open_recording(path)
        if rec.count_rows(RecordType.GPU) == 0:
            raise RecordingError(f"{rec.path / 'gpu.parquet'}: zero rows, so no GPU samples: nothing to replay")
        if rec.has_net and rec.count_rows(RecordType.NET) == 0:
            log.warning("%s: zero rows; replaying without port samples (port features unknown)",
                        rec.path / "net.parquet")
        m = rec.manifest
        pipe = FeaturePipeline(self.pipeline_settings)
        clock = self.clock = StageClock()
        t0, c0 = time.perf_counter(), time.process_time()
        operator = rec.events(sources=("operator",))  # with the scan the event windows need: one pass
        clock.cpu["read"] += time.process_time() - c0
        self.maintenance = MaintenanceSchedule.from_frame(operator)
        result = ReplayResult(operator_events=operator_timeline(operator),
                              alternatives={k: PolicyRun(cfg) for k, cfg in self.alternatives.items()})
        states = [PolicyState() for _ in range(2 + len(self.alternatives))]
        pending: list[FeatureBatch] = []
        rows = 0
        cad = self.pipeline_settings.cadence_s
        window_s = max(1, round(READ_WINDOW_S / cad)) * cad  # whole ticks per read window
        windows = rec.iter_windows(window_s, align=cad, columns=RECORDING_COLUMNS)  # only what the pipeline uses
        before_gpu: Counter[str] = Counter()
        windows = from_first_gpu_sample(windows, cad, before_gpu, rec.path)
        for batch in pipe.replay(clock.timed("read", windows)):
            pending.append(batch)
            rows += len(batch)
            if rows >= self.score_rows:
                self._decide(pending, states, result)
                pending, rows = [], 0
                if progress:
                    progress(min(1.0, (batch.ts - m.start) / max(m.end - m.start, 1.0)))
        self._decide(pending, states, result)
        final = self.engine[0].state if self.engine is not None else states[0]
        result.budget = budget_report(final.budget, self.policy)
        for run, st in zip(result.alternatives.values(), states[2:]):
            run.budget = budget_report(st.budget, run.policy)
        if progress:
            progress(1.0)
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - c0
        stages = {k: round(v, 2) for k, v in clock.cpu.items()}
        stages["pipeline"] = round(cpu - sum(clock.cpu.values()), 2)
        c = pipe.counts
        result.stats = {"gpu_samples": c.gpu_rows, "port_samples": c.net_rows, "xid_events": c.xid_rows,
                        "rejected_rows": c.rejected_rows, "late_rows": c.late_rows, "ticks": c.ticks,
                        "baseline_restarts": c.baseline_restarts, "unplanned_resets": c.unplanned_resets,
                        "gpu_swaps": c.gpu_swaps,
                        "muted_node_ticks": c.muted_node_ticks,
                        "wall_s": round(seconds, 2), "cpu_s": round(cpu, 2), "stage_cpu_s": stages,
                        "gpu_samples_per_s": round(c.gpu_rows / max(seconds, 1e-9)),
                        "state_bytes": pipe.state_bytes, "cadence_s": self.pipeline_settings.cadence_s,
                        "held_at_end": states[0].held(),
                        "maintenance_windows": len(self.maintenance),
                        "suppressed_by_cause": by_cause(result.suppressed),
                        "baseline_suppressed_by_cause": by_cause(result.baseline_suppressed),
                        "not_replayed_before_first_gpu_sample": dict(before_gpu),
                        "resumed_with_gpu_lost": dict(zip(("model", "rules_baseline"), result.resumed_with_gpu_lost))}
        return result

    def _decide(self, batches: list[FeatureBatch], states: list[PolicyState], result: ReplayResult) -> None:
        c = time.process_time()
        scores = score_batches(self.bundle, batches)
        scored = [(b, aggregate(b, s, self.bundle.rules)) for b, s in zip(batches, scores)]
        c1 = time.process_time()
        self.clock.cpu["scoring"] += c1 - c
        maint = self.maintenance
        decided: list[Sequence[Decision]] = []
        runs = [(self.policy, result.decisions, result.suppressed),
                (self.baseline_policy, result.baseline_decisions, result.baseline_suppressed),
                *((r.policy, r.decisions, r.suppressed) for r in result.alternatives.values())]
        for batch, ns in scored:
            result.coverage.add(ns.node, ns.blind)
            explain = self.explainer.for_tick(batch, ns)
            first = len(result.decisions)
            for k, (cfg, out, held_back) in enumerate(runs):
                if k == 0 and self.engine is not None:
                    engine, clock = self.engine
                    clock.now = batch.ts
                    for ev in maint.due(batch.ts):   # declared before this tick is decided, as live
                        engine.on_operator_event(ev)
                    result.actions.extend(engine.tick(ns, explain))
                    out.extend(engine.last_decisions)
                    result.resumed_with_gpu_lost[0] += _resumed_with_gpu_lost(engine.last_decisions, ns)
                    continue
                d, after = decide(ns, states[k], batch.ts, cfg, explain)
                d, held, states[k] = maint.hold_back(d, states[k], after, batch.ts)
                out.extend(d)
                held_back.extend(held)
                if k < 2:
                    result.resumed_with_gpu_lost[k] += _resumed_with_gpu_lost(d, ns)
            if self.trace is not None:
                decided.append(result.decisions[first:])
        self.clock.cpu["policy"] += time.process_time() - c1
        if self.observe is not None:
            for b, s in zip(batches, scores):
                self.observe(b, s)
        if self.trace is not None:
            for b, s, d in zip(batches, scores, decided):
                self.trace(b, s, d)

def from_first_gpu_sample(windows: Iterable[RecordingWindow], cadence_s: float, skipped: Counter[str],
                          where: Path | str = "recording") -> Iterator[RecordingWindow]:
    """*windows* without the port samples and events before the tick of the first valid GPU sample.

    Before it there is no GPU to score, and the pipeline cannot close a tick without one.
    What is left out is counted in *skipped* (``port_samples``, ``events``) and logged;
    rejected rows still pass through, so the pipeline counts them. When no window holds
    a valid GPU sample, :class:`RecordingError` says so, with the first rejection reason.
    """
    started = False
    rejected = 0
    reason = ""
    for w in windows:
        if started:
            yield w
            continue
        if len(w.gpu) == 0:
            n_rej = len(w.rejected)
            if n_rej and "table" in w.rejected and "reason" in w.rejected:
                gpu_rej = w.rejected[w.rejected["table"].astype(str) == RecordType.GPU.value]
                rejected += len(gpu_rej)
                reason = reason or (str(gpu_rej["reason"].iloc[0]) if len(gpu_rej) else "")
            skipped["port_samples"] += len(w.net)
            skipped["events"] += len(w.events)
            yield replace(w, net=w.net.iloc[:0], events=w.events.iloc[:0])
            continue
        started = True
        tick_start = math.floor(float(w.gpu["ts"].min()) / cadence_s) * cadence_s
        net, events = w.net[w.net["ts"] >= tick_start], w.events[w.events["ts"] >= tick_start]
        skipped["port_samples"] += len(w.net) - len(net)
        skipped["events"] += len(w.events) - len(events)
        if sum(skipped.values()):
            log.warning("%s: %d port samples and %d events before the first GPU sample (%s) are not replayed",
                        where, skipped["port_samples"], skipped["events"], tick_start)
        yield replace(w, net=net, events=events)
    if not started:
        why = f"all {rejected} GPU rows break the telemetry contract (e.g. {reason})" if rejected else \
            "its GPU rows are outside every window"
        raise RecordingError(f"{where}: no valid GPU sample to replay: {why}")


def build_report(path: str | Path, result: ReplayResult, bundle_info: dict[str, Any],
                 policy: PolicyConfig) -> dict[str, Any]:
    """The replay report of spec/recording.md, with metrics when the recording has incidents."""
    from models.evaluation import compare, score_replay

    rec = open_recording(path)
    decisions = [d.to_dict() for d in result.decisions]
    baseline = [d.to_dict() for d in result.baseline_decisions]
    report: dict[str, Any] = {"recording": str(path), "decisions": decisions, "baseline_decisions": baseline,
                              "model": bundle_info, "policy": policy.model_dump(mode="json"),
                              "summary": result.stats}
    report["operator_events"] = result.operator_events
    report["false_budget"] = result.budget
    report["suppressed"] = {"model": [s.to_dict() for s in result.suppressed],
                            "rules_baseline": [s.to_dict() for s in result.baseline_suppressed]}
    incidents = rec.incidents()
    report["coverage"] = result.coverage.report(incidents)
    if incidents is not None:
        kw = dict(node_days=rec.manifest.node_days, gpus_per_node=rec.manifest.gpus_per_node)
        model_m = score_replay(decisions, incidents, **kw)
        base_m = score_replay(baseline, incidents, **kw)
        report["incidents"] = incidents
        report["metrics"] = {"model": model_m, "rules_baseline": base_m, "comparison": compare(model_m, base_m)}
    if result.alternatives:
        report["alternatives"] = {}
    for name, run in result.alternatives.items():
        alt: dict[str, Any] = {"policy": run.policy.model_dump(mode="json"),
                               "decisions": [d.to_dict() for d in run.decisions],
                               "suppressed": [s.to_dict() for s in run.suppressed], "false_budget": run.budget}
        if incidents is not None:
            alt["metrics"] = score_replay(alt["decisions"], incidents, **kw)
            alt["against_policy"] = compare(alt["metrics"], report["metrics"]["model"], names=("alternative", "policy"))
        report["alternatives"][name] = alt
    return report


def operator_timeline(events: Any) -> dict[str, list[dict[str, Any]]]:
    """The recording's ``source=operator`` events on each node's timeline (a maintenance event on
    every node it lists), in time order; JSON-ready."""
    import math

    out: dict[str, list[dict[str, Any]]] = {}
    if events is None or not len(events) or "source" not in events:
        return out
    for row in events[events["source"] == "operator"].to_dict("records"):
        ev = {k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v)) and v is not None}
        ev = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in ev.items()}
        nodes = ev.get("nodes") if isinstance(ev.get("nodes"), list) else [ev.get("node")]
        for node in dict.fromkeys(str(n) for n in nodes if n):
            out.setdefault(node, []).append(ev)
    return out


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """The few numbers an operator reads first (for the CLI and bench/)."""
    m = report.get("metrics")
    s = report["summary"]
    out = {"decisions": len(report["decisions"]), "gpu_samples_per_s": s["gpu_samples_per_s"]}
    if s.get("suppressed_by_cause"):     # what declared maintenance held back (policy-only path)
        out["suppressed_by_cause"] = s["suppressed_by_cause"]
    cov = report.get("coverage") or {}
    if blind := {k: len(v["nodes"]) for k, v in (cov.get("signals") or {}).items() if v.get("nodes")}:
        # nodes that did not send a precursor signal: their faults of its classes are seen only when they happen
        out["signals_not_sent"] = {"nodes": blind, "incidents_there": len(cov.get("incidents_on_blind_nodes") or [])}
    keys = ("recall", "predictive_recall", "median_lead_s", "false_actions_per_1k_node_days", "alerts_per_1k_node_days",
            "caught", "node_fault_incidents", "actions_by_grade", "actions_by_follow_up")
    if m:
        for who in ("model", "rules_baseline"):
            out[who] = {k: m[who].get(k) for k in keys}
    if (fb := report.get("false_budget")) and fb.get("outcomes"):   # how the policy's prediction holds ended
        out["false_budget"] = {"outcomes": fb["outcomes"], "braked": sorted(fb.get("braked", {}))}
    for name, alt in report.get("alternatives", {}).items():
        x = alt.get("metrics")
        if x:   # its headline, and the incidents one of the two policies caught (ahead) and the other did not
            only = {k: v for k, v in alt["against_policy"].items() if "_only_by_" in k}
            out.setdefault("alternatives", {})[name] = {k: x.get(k) for k in keys} | only
        else:
            acts = Counter(d["action"] for d in alt["decisions"])
            out.setdefault("alternatives", {})[name] = {"decisions": len(alt["decisions"]), "actions": dict(acts)}
    return out


def _resumed_with_gpu_lost(decisions: Sequence[Decision], ns: NodeScores) -> int:
    """How many of one tick's *decisions* resume a node with a lost GPU in that tick's scores."""
    resumed = [d.node for d in decisions if d.action is Action.RESUME]
    if not resumed or ns.gpus_lost is None:
        return 0
    at = {str(n): i for i, n in enumerate(ns.node)}
    return sum(1 for n in resumed if n in at and ns.lost_gpus(at[n]) > 0)
