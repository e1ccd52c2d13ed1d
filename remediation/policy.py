"""The decision policy: (node scores, node state, now, config) → decisions and the new state.

A pure function — no clock, no I/O, no scheduler — so replay, the live engine and
tests all run exactly this. Detection is the models' job; execution (limits, breaker,
approval, adapters) is the engine's; this module only decides, per node and tick, on a
ladder where each harder step needs stronger evidence (research/robust-detection.md §8).
Every decision carries its :class:`~collector.schema.Grade`:

1. a node gpuops already drained or reset is *held*: no new action, and it is
   resumed (ADVISORY) once it has been out ``min_hold_s`` and healthy for
   ``resume_after_s`` — every GPU it has reported from reading again (``resume_needs_every_gpu``:
   a GPU gone silent is not a healthy one); a node held on a prediction alone is escalated once to the
   fault's hard action when the prediction becomes corroborated (see 3); a node held
   on a prediction whose failure then arrives (an acting rule: a fatal XID, a hard
   threshold) takes the rule's action and follow-up once, CERTAIN — the catalogue's
   remedy (reset, reboot) rather than a hold that waits for a failed GPU to look healthy —
   and, the prediction having come true, does not cap the node's next prediction;
2. a rule with a disruptive action (fatal XID, hard threshold) acts at once with the
   rule's action and follow-up: CERTAIN;
3. a predicted failure acts when its calibrated probability stayed above the fault's
   threshold for ``act_sustain_s`` of telemetry time (``now`` deltas, not ticks) — once
   per ``model_retry_window_s``, and only on a node seen for ``model_warmup_s`` whose scores
   are not ``cold`` (a window refilling on a new scoring worker after a rebalance: such a node's
   predictions only alert, and a held one stays as it is until its window is warm again):

   * alone, it *drains* (running jobs finish, no new one lands): PREDICTED — never a
     reset or a requeue;
   * *corroborated* — p above ``corroborate_threshold`` for ``corroborate_sustain_s``
     (a rising trend), or a second independent signal within ``corroborate_window_s``
     (a lower-severity rule of the same fault class, or the anomaly detector at
     ``corroborate_anomaly`` on the same node) — it takes the fault's configured hard
     action and follow-up (``actions``, ``follow_ups``): CORROBORATED;
4. otherwise a probability above ``alert_threshold``, a strong anomaly (on a node past
   ``model_warmup_s``: the anomaly detector reads the same window features) or a rule
   whose action is only an alert tells a person (ADVISORY), changing nothing on the
   cluster. Alerts are merged into episodes per (node, GPU, signal) — a prediction's
   per (node, fault class), as its probability is the node's worst GPU's, and an anomaly
   on a node whose prediction was told joins that story: one alert opens an episode,
   which stays open while the condition is true or comes back within
   ``alert_episode_gap_s`` (an anomaly's: ``anomaly_episode_gap_s``, a day); at most
   ``node_alerts_per_h`` per node and ``fleet_alerts_per_h`` fleet-wide are sent in any hour, and an episode held back
   by a cap is sent later, while still true, once the hour allows. An action on the
   node closes its episodes and clears its hourly count: what comes after it is a new story.

With ``fleet_calibration`` every probability threshold of 3 and 4 (and the anomaly alert
level) is also a *fleet-relative* one: the node must be an outlier against the fleet's own
recent level (:class:`FleetLevel`), so a fleet whose background lifts every node's score
acts only on its outliers. A tick with fewer than ``fleet_min_nodes`` nodes uses the
absolute thresholds alone.

The fleet also keeps a *false-action budget* (:mod:`remediation.budget`): how each hold taken
in 3 ended — resumed healthy by 1, or met by an acting rule — counted per fault class against
the fleet's node-days. A class whose holds ended healthy beyond ``false_budget_per_1k_node_days``
is braked: its predictions alert (4) instead of acting in 3, and say why.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from collector.schema import Action, FaultClass, FollowUp, Grade
from models.node_scores import NodeScores

from .budget import BudgetState, HoldOutcome, braked, confirm_late, observe, record, with_brakes
from .config import PolicyConfig

#: explain(node index, source) -> human reason; source is "rule", "model" or "anomaly"
Explain = Callable[[int, str], str]

#: actions that change what the scheduler may do with a node
_ACTING = tuple(a for a in Action if a.acts)
#: the least disruptive action that protects the next job: all a prediction alone may do
PREDICTION_ALONE = Action.DRAIN
#: holds taken on a prediction: certain evidence arriving later upgrades them to the rule's remedy; they are
#: what the false-action budget counts and what a person's verdict is given on
PREDICTION_GRADES = (Grade.PREDICTED, Grade.CORROBORATED)
#: the window of the alert rate limits, s
RATE_WINDOW_S = 3600.0


@dataclass(frozen=True)
class FleetLevel:
    """The fleet's typical node at one moment: its failure probability and anomaly level."""

    ts: float
    p: float
    anomaly: float


@dataclass(frozen=True)
class Floors:
    """This tick's fleet-relative floors (0: no floor): a probability or anomaly level under them
    is not an outlier in this fleet, whatever its absolute value."""

    p: float = 0.0
    anomaly: float = 0.0
    fleet_p: float = 0.0      # the fleet level they come from (for reasons)

    def act(self, cfg: PolicyConfig, fault: FaultClass) -> float:
        return max(cfg.threshold_for(fault), self.p)

    def reason(self, cfg: PolicyConfig, fault: FaultClass) -> str:
        """Why a prediction acts although the fleet's floor is above the absolute threshold ("" when not)."""
        return (f"; an outlier in this fleet (typical node p {self.fleet_p:.3g}: acting needs p >= {self.p:.3f})"
                if self.p > cfg.threshold_for(fault) else "")


def _raise_odds(level: float, ratio: float) -> float:
    """The probability whose odds are *ratio* times those of *level* (0-1)."""
    if level >= 1.0:
        return 1.0
    o = ratio * level / (1.0 - level)
    return o / (1.0 + o)


def fleet_levels(scores: NodeScores, p: np.ndarray, anomaly: np.ndarray, levels: tuple[FleetLevel, ...],
                 now: float, cfg: PolicyConfig) -> tuple[tuple[FleetLevel, ...], Floors]:
    """The kept fleet levels after this tick, and this tick's floors.

    A level is sampled every ``fleet_step_s`` from a tick with at least ``fleet_min_nodes``
    nodes (the ``fleet_quantile`` node's p and anomaly), and kept ``fleet_window_s``: at most
    window/step samples. The floors come from the median of the kept samples; a small tick,
    or none kept yet, gives no floor (absolute thresholds only).
    """
    if not cfg.fleet_calibration or not cfg.use_model:
        return levels, Floors()
    levels = tuple(x for x in levels if now - x.ts < cfg.fleet_window_s)
    if len(scores) < cfg.fleet_min_nodes:
        return levels, Floors()
    if not levels or now - levels[-1].ts >= cfg.fleet_step_s:
        levels += (FleetLevel(now, float(np.quantile(p, cfg.fleet_quantile)),
                              float(np.quantile(anomaly, cfg.fleet_quantile))),)
    fp = float(np.median([x.p for x in levels]))
    fa = float(np.median([x.anomaly for x in levels]))
    return levels, Floors(_raise_odds(fp, cfg.fleet_odds_ratio), _raise_odds(fa, cfg.fleet_anomaly_odds_ratio), fp)


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
class AlertEpisode:
    """One open alert story: a signal on one part of a node (``part``: GPU index, None: the node)."""

    part: int | None
    signal: str            # "p_fail:<fault>" (per node: part None), "anomaly" or "rule:<rule index>"
    last_true: float       # telemetry time the condition was last seen true
    announced: bool        # False: held back by a rate limit, sent once allowed


@dataclass(frozen=True)
class NodeState:
    """What the policy remembers about one node (telemetry times, s)."""

    above_since: float | None = None        # p first >= the fault's act threshold, in this run
    high_since: float | None = None         # p first >= corroborate_threshold, in this run
    anomaly_at: float | None = None         # anomaly last >= corroborate_anomaly
    strange_since: float | None = None      # start of the current run of ticks with anomaly >= anomaly_alert
    strange_last: float | None = None       # last tick of that run
    rule_signal_at: float | None = None     # a lower-severity (alert-only) rule last fired ...
    rule_signal_fault: FaultClass | None = None  # ... naming this fault class
    held_since: float | None = None         # gpuops drained/reset it
    held_grade: Grade | None = None         # the grade of the decision that holds it
    held_fault: FaultClass | None = None
    held_gpus: int | None = None            # its GPUs with a reading when it was taken out (None: not known)
    healthy_since: float | None = None
    predicted_action_at: float | None = None  # last action taken on a prediction (retry cap)
    predicted_fault: FaultClass | None = None  # ... and the fault class it predicted (model_retry_per_fault)
    sbe_at: float | None = None             # the predicted GPU last logged corrected ECC errors (hbm_recent_sbe_s)
    pcie_at: float | None = None            # the predicted GPU's PCIe replays last read at/above pcie_warn_per_min
    pcie_quiet_at: float | None = None      # ... and last read under it
    storm_ratio: float | None = None        # the predicted GPU's last known SBE rate against its peak (hbm_storm_ratio)
    storm_at: float | None = None           # ... read at this time
    storm_growth: float | None = None       # ... its last known rate against its own hour before (hbm_steady_growth)
    growth_at: float | None = None          # ... read at this time
    episodes: tuple[AlertEpisode, ...] = ()
    alert_times: tuple[float, ...] = ()       # alerts sent in the last RATE_WINDOW_S


@dataclass(frozen=True)
class PolicyState:
    """Per-node memory; only nodes with something to remember are present."""

    nodes: dict[str, NodeState] = field(default_factory=dict)
    #: telemetry time each node was first scored (for the model's warm-up)
    first_seen: dict[str, float] = field(default_factory=dict)
    #: alerts sent fleet-wide in the last RATE_WINDOW_S
    fleet_alert_times: tuple[float, ...] = ()
    #: the fleet's typical node, sampled (fleet calibration): at most fleet_window_s / fleet_step_s
    fleet_levels: tuple[FleetLevel, ...] = ()
    #: the fleet's false-action budget: how its prediction holds ended, and its node-days (remediation/budget.py)
    budget: BudgetState = field(default_factory=BudgetState)

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
    # a remembered node that is not interesting this tick changes only if it is held or is timing a
    # sustained probability; one that merely alerted stays as it is (most of the state, after a day)
    live = [n for n, ns in state.nodes.items()
            if ns.held_since is not None or ns.above_since is not None or ns.high_since is not None]
    if live:
        pos = {str(n): i for i, n in enumerate(scores.node)}
        idx |= {pos[n] for n in live if n in pos}
    nodes = dict(state.nodes)
    first_seen = state.first_seen
    new = [str(n) for n in scores.node if n not in first_seen]
    if new:
        first_seen = {**first_seen, **dict.fromkeys(new, now)}
    fleet = [t for t in state.fleet_alert_times if now - t < RATE_WINDOW_S]
    levels, floors = fleet_levels(scores, p, anomaly, state.fleet_levels, now, cfg)
    budget, brakes = state.budget, {}
    budgeted = cfg.use_model and cfg.false_budget_per_1k_node_days > 0
    if budgeted:
        budget = observe(budget, len(scores), now, cfg)
        brakes = braked(budget, now, cfg)
        budget = with_brakes(budget, brakes)
    out: list[Decision] = []
    for i in sorted(idx):
        name = str(scores.node[i])
        before = ns = nodes.get(name, NodeState())
        seen_s = now - first_seen[name]
        ns, d = _decide_node(i, name, ns, scores, float(p[i]), float(anomaly[i]), now, seen_s, cfg, explain, fleet,
                             floors, brakes)
        out.extend(d)
        if d and budgeted:
            if (outcome := _hold_outcome(name, before, d, now)) is not None:
                budget = record(budget, outcome)
            if budget.outcomes and any(x.source == "rule" and x.action in _ACTING for x in d):
                budget = confirm_late(budget, name, now, cfg)
        if ns == NodeState():
            nodes.pop(name, None)
        else:
            nodes[name] = ns
    return out, PolicyState(nodes, first_seen, tuple(fleet), levels, budget)


def _hold_outcome(name: str, before: NodeState, decisions: list[Decision], now: float) -> HoldOutcome | None:
    """How this tick ended a hold taken on a prediction, if it did: resumed healthy (unconfirmed) or an
    acting rule fired while held (confirmed: the failure came, whatever its class)."""
    if before.held_since is None or before.held_grade not in PREDICTION_GRADES or before.held_fault is None:
        return None
    for d in decisions:
        if d.action is Action.RESUME:
            return HoldOutcome(now, name, before.held_fault, False, before.held_since)
        if d.source == "rule" and d.action in _ACTING:
            return HoldOutcome(now, name, before.held_fault, True, before.held_since)
    return None


def _track(ns: NodeState, s: NodeScores, i: int, p: float, anomaly: float, fault: FaultClass | None,
           rule_acts: bool, warm: bool, now: float, cfg: PolicyConfig, floors: Floors) -> tuple[NodeState, bool]:
    """The evidence timers after this tick: sustained probabilities and second signals, all
    counted from the end of the node's warm-up (young windows are not evidence); and whether this
    tick's prediction is above its act line (a prediction acts only on such a tick)."""
    if not warm:
        return ns, False
    sbe_at = ns.sbe_at
    if cfg.hbm_recent_sbe_s > 0 and s.sbe_now is not None:
        sbe_at = now if s.sbe_now[i] else _recent(sbe_at, now, cfg.hbm_recent_sbe_s)
    pcie_gate = cfg.pcie_warn_per_min > 0 and s.pcie_per_min is not None
    pcie_at, pcie_quiet_at = ns.pcie_at, ns.pcie_quiet_at
    if pcie_gate:  # the last known readings decide; a tick without one (NaN) changes neither
        rate, mem = float(s.pcie_per_min[i]), cfg.pcie_warn_memory_s
        pcie_at = now if rate >= cfg.pcie_warn_per_min else _recent(pcie_at, now, mem)
        pcie_quiet_at = now if rate < cfg.pcie_warn_per_min else _recent(pcie_quiet_at, now, mem)
    storm_ratio, storm_at = ns.storm_ratio, ns.storm_at
    if cfg.hbm_storm_ratio > 0 and s.sbe_of_peak is not None:
        storm_ratio, storm_at = _last_known(float(s.sbe_of_peak[i]), storm_ratio, storm_at, now,
                                            cfg.hbm_storm_memory_s)
    storm_growth, growth_at = ns.storm_growth, ns.growth_at
    if cfg.hbm_steady_growth > 0 and s.sbe_growth is not None:
        storm_growth, growth_at = _last_known(float(s.sbe_growth[i]), storm_growth, growth_at, now,
                                              cfg.hbm_storm_memory_s)
    held_back = (  # a prediction whose own evidence reads benign right now
        (fault is FaultClass.HBM_ECC and cfg.hbm_recent_sbe_s > 0 and s.sbe_now is not None and sbe_at is None)
        or (pcie_gate and fault in cfg.pcie_warn_faults and pcie_at is None and pcie_quiet_at is not None))
    above = fault is not None and p >= floors.act(cfg, fault) and not held_back
    high = fault is not None and p >= cfg.corroborate_threshold
    # a tick without a reading of the GPU is silence: its probability under the line ends no run (FR)
    keep = cfg.stale_tick_keeps_prediction and not s.is_fresh(i)
    above_since, high_since = _run_start(ns.above_since, above, keep, now), _run_start(ns.high_since, high, keep, now)
    window = cfg.corroborate_window_s                # second signals older than this are forgotten
    anomaly_at = now if anomaly >= cfg.corroborate_anomaly else _recent(ns.anomaly_at, now, window)
    rule_at, rule_fault = ns.rule_signal_at, ns.rule_signal_fault
    if s.rule[i] >= 0 and not rule_acts:
        rule_at, rule_fault = now, s.rule_fault_class(i)
    elif rule_at is not None and now - rule_at > window:
        rule_at, rule_fault = None, None
    if (above_since, high_since, anomaly_at, rule_at, rule_fault, sbe_at, pcie_at, pcie_quiet_at, storm_ratio,
            storm_at, storm_growth, growth_at) == (ns.above_since, ns.high_since, ns.anomaly_at, ns.rule_signal_at,
                                                   ns.rule_signal_fault, ns.sbe_at, ns.pcie_at, ns.pcie_quiet_at,
                                                   ns.storm_ratio, ns.storm_at, ns.storm_growth, ns.growth_at):
        return ns, above
    return replace(ns, above_since=above_since, high_since=high_since, anomaly_at=anomaly_at,
                   rule_signal_at=rule_at, rule_signal_fault=rule_fault, sbe_at=sbe_at, pcie_at=pcie_at,
                   pcie_quiet_at=pcie_quiet_at, storm_ratio=storm_ratio, storm_at=storm_at, storm_growth=storm_growth,
                   growth_at=growth_at), above


def _run_start(since: float | None, on: bool, keep: bool, now: float) -> float | None:
    """When a run of ticks above a line began, after this tick: it goes on (or starts now) on a tick above the
    line; a tick under it ends the run unless *keep* (a tick without a reading, which ends nothing)."""
    if on:
        return since if since is not None else now
    return since if keep else None


def _storm_waiting(ns: NodeState, fault: FaultClass | None, now: float, cfg: PolicyConfig) -> str | None:
    """Why an hbm_ecc prediction's action waits, or None when it need not: its GPU's corrected errors are a
    storm falling from its own peak while it still errs (hbm_storm_ratio), or one that still errs at about the
    rate of its hour before, not growing (hbm_steady_growth). A GPU that logged no error in the last 10 minutes
    (0) has stopped, which a failing HBM's precursor does before its failure too: not held by either."""
    if fault is not FaultClass.HBM_ECC:
        return None
    r, mem = ns.storm_ratio, cfg.hbm_storm_memory_s
    if cfg.hbm_storm_ratio > 0 and r is not None and _recent(ns.storm_at, now, mem) is not None \
            and 0.0 < r < cfg.hbm_storm_ratio:  # 0: a stop, not a tail
        return (f"waiting: its GPU's corrected ECC errors of the last 10 min run at {r:.2f} of their own 2 h "
                f"peak, a storm falling (acts if they climb back to {cfg.hbm_storm_ratio:.2f})")
    g = ns.storm_growth
    if cfg.hbm_steady_growth > 0 and g is not None and _recent(ns.growth_at, now, mem) is not None \
            and 0.0 < g < cfg.hbm_steady_growth:
        return (f"waiting: its GPU's corrected ECC errors of the last 10 min run at {g:.2f}x their own rate of the "
                f"hour before, a steady storm, not a growing one (acts if they reach {cfg.hbm_steady_growth:.2f}x)")
    return None


def _last_known(reading: float, value: float | None, at: float | None, now: float,
                memory: float) -> tuple[float | None, float | None]:
    """(value, read at) after a tick whose *reading* is NaN when not known: a known one replaces the
    remembered one; an unknown one changes nothing until the remembered one is *memory* s old."""
    if reading == reading:
        return reading, now
    return (value, at) if _recent(at, now, memory) is not None else (None, None)


def _recent(at: float | None, now: float, within: float) -> float | None:
    """*at* while it is at most *within* seconds before *now*, else None (a remembered signal expires)."""
    return at if at is not None and now - at <= within else None


def _strange_run(ns: NodeState, anomaly: float, now: float, level: float, cfg: PolicyConfig) -> NodeState:
    """The run of consecutive ticks whose anomaly level reaches *level* (``anomaly_alert`` or the fleet's
    floor, the higher): a tick below it
    ends the run, and so does a gap longer than ``anomaly_gap_s`` (ticks the policy did not visit
    this node were not strange), so a stale run never reads as a sustained one."""
    if anomaly < level:
        return ns if ns.strange_since is None else replace(ns, strange_since=None, strange_last=None)
    fresh = ns.strange_last is None or now - ns.strange_last > cfg.anomaly_gap_s
    return replace(ns, strange_since=now if fresh else ns.strange_since, strange_last=now)


def _corroboration(ns: NodeState, fault: FaultClass, anomaly: float, now: float, cfg: PolicyConfig) -> str | None:
    """Why a prediction of *fault* is corroborated now, or None when it stands alone."""
    if ns.high_since is not None and now - ns.high_since >= cfg.corroborate_sustain_s:
        return f"p >= {cfg.corroborate_threshold:.2f} for {(now - ns.high_since) / 60:.0f} min"
    rule_at = ns.rule_signal_at
    if rule_at is not None and ns.rule_signal_fault is fault and now - rule_at <= cfg.corroborate_window_s:
        return f"a lower-severity {fault.value} rule fired {(now - rule_at) / 60:.0f} min ago"
    if ns.anomaly_at is not None and now - ns.anomaly_at <= cfg.corroborate_window_s:
        return ("the anomaly detector agrees" + (f" ({anomaly:.4%})" if anomaly >= cfg.corroborate_anomaly else
                f" ({(now - ns.anomaly_at) / 60:.0f} min ago)"))
    return None


def _hard(cfg: PolicyConfig, fault: FaultClass) -> tuple[Action, FollowUp | None]:
    """The fault's corroborated action and follow-up; (DRAIN, None) is no harder than a prediction alone."""
    action = cfg.action_for(fault)
    return action, cfg.follow_up_for(fault) if action is Action.DRAIN else None


def _decide_node(i: int, name: str, ns: NodeState, s: NodeScores, p: float, anomaly: float, now: float,
                 seen_s: float, cfg: PolicyConfig, explain: Explain,
                 fleet: list[float], floors: Floors,
                 brakes: dict[FaultClass, str]) -> tuple[NodeState, list[Decision]]:
    rule = int(s.rule[i])
    rule_action = s.rule_action[i] if rule >= 0 else None
    rule_acts = rule_action in _ACTING
    fault = s.fault_class(i)
    cold = s.is_cold(i)  # its window is still filling on the worker that scored it (a rebalance moved it)
    warm = seen_s >= cfg.model_warmup_s and not cold
    if cold and ns.held_since is not None:
        return ns, []  # a young window neither escalates a held node nor counts towards its resume
    ns, above = _track(ns, s, i, p, anomaly, fault, rule_acts, warm, now, cfg, floors)
    anomaly_level = max(cfg.anomaly_alert, floors.anomaly)
    ns = _strange_run(ns, anomaly, now, anomaly_level, cfg)
    if ns.held_since is not None:                       # 1. ours already: escalate once, hold, then resume
        if rule_acts and ns.held_grade in PREDICTION_GRADES:  # the failure came: the catalogue's remedy
            # ...and the prediction was right, so it does not cap the node's next one (model_retry_window_s)
            return replace(ns, held_grade=Grade.CERTAIN, held_fault=s.rule_fault_class(i), healthy_since=None,
                           predicted_action_at=None, predicted_fault=None), [
                _rule_decision(i, name, s, rule_action, now, explain)]
        if (ns.held_grade is Grade.PREDICTED and fault is not None and fault is ns.held_fault
                and p >= floors.act(cfg, fault)):
            action, follow_up = _hard(cfg, fault)
            why = _corroboration(ns, fault, anomaly, now, cfg)
            if why is not None and action in _ACTING and (action is not PREDICTION_ALONE or follow_up is not None):
                return replace(ns, held_grade=Grade.CORROBORATED, healthy_since=None), [
                    Decision(now, name, int(s.gpu[i]), action, fault, p, f"{explain(i, 'model')}; corroborated: {why}",
                             "model", Grade.CORROBORATED, follow_up)]
        healthy = (rule < 0 and p < cfg.clear_threshold and not (cfg.vetoed_rule_keeps_hold and s.has_vetoed_rule(i))
                   and not (cfg.resume_needs_every_gpu
                            and gpu_missing(s.lost_gpus(i), s.reading_gpus(i), ns.held_gpus)))
        since = (ns.healthy_since if ns.healthy_since is not None else now) if healthy else None
        if since is not None and now - ns.held_since >= cfg.min_hold_s and now - since >= cfg.resume_after_s:
            reason = f"healthy for {(now - since) / 60:.0f} min after gpuops took it out"
            return NodeState(predicted_action_at=ns.predicted_action_at, predicted_fault=ns.predicted_fault,
                             episodes=ns.episodes,
                             alert_times=ns.alert_times), [
                Decision(now, name, None, Action.RESUME, None, p, reason, "policy")]
        return replace(ns, healthy_since=since), []
    if rule_acts:                                       # 2. hard evidence: act now
        return replace(ns, held_since=now, held_grade=Grade.CERTAIN, held_fault=s.rule_fault_class(i),
                       held_gpus=s.reading_gpus(i), healthy_since=None, above_since=None, high_since=None, episodes=(),
                       alert_times=()), [
            _rule_decision(i, name, s, rule_action, now, explain)]
    retried = _retry_capped(ns, fault, now, cfg)
    waiting = _storm_waiting(ns, fault, now, cfg) or (brakes.get(fault) if fault is not None else None)
    if (above and fault is not None and ns.above_since is not None
            and now - ns.above_since >= cfg.sustain_for(fault)
            and retried is None and waiting is None):   # 3. predicted failure, sustained in telemetry time
        action, follow_up = _hard(cfg, fault)
        if action in _ACTING:
            why = _corroboration(ns, fault, anomaly, now, cfg)
            grade = Grade.CORROBORATED if why is not None else Grade.PREDICTED
            if why is None:
                action, follow_up = PREDICTION_ALONE, None
            reason = explain(i, "model") + floors.reason(cfg, fault) + (f"; corroborated: {why}" if why else "")
            held = now if action in (Action.DRAIN, Action.RESET) else None
            return replace(ns, held_since=held, held_grade=grade if held is not None else None, held_fault=fault,
                           held_gpus=s.reading_gpus(i), healthy_since=None, predicted_action_at=now,
                           predicted_fault=fault, episodes=(),
                           alert_times=()), [
                Decision(now, name, int(s.gpu[i]), action, fault, p, reason, "model", grade, follow_up)]
    return _alerts(i, name, ns, s, p, anomaly, fault, rule, now, seen_s, warm, retried, waiting, cfg, explain, fleet,
                   max(cfg.alert_threshold, floors.p), anomaly_level)


def gpu_missing(lost: int, reading: int | None, held: int | None) -> bool:
    """Whether a held node misses a GPU: one its scorer saw go silent (*lost* > 0), or fewer *reading* than the
    *held* it had when taken out (what a scoring worker that restarted since, and never saw the lost GPU, still
    tells). The resume rule's, and the node page's account of it (api/holds.py)."""
    return lost > 0 or (held is not None and reading is not None and reading < held)


def _rule_decision(i: int, name: str, s: NodeScores, action: Action, now: float, explain: Explain) -> Decision:
    """An acting rule's decision: its action and follow-up, on its GPU or (rule GPU -1) the whole node."""
    gpu = int(s.rule_gpu[i]) if s.rule_gpu[i] >= 0 else None
    return Decision(now, name, gpu, action, s.rule_fault_class(i), 1.0, explain(i, "rule"), "rule",
                    Grade.CERTAIN, s.rule_follow_up[i])


def _retry_capped(ns: NodeState, fault: FaultClass | None, now: float, cfg: PolicyConfig) -> str | None:
    """Why the node's prediction of *fault* only alerts under the retry cap (``model_retry_window_s``), or None:
    gpuops acted on an earlier prediction for it (of the same class, with ``model_retry_per_fault``) within the
    window and the node came back healthy. The reason names that prediction, so on-call sees what was wrong."""
    at = ns.predicted_action_at
    if at is None or now - at >= cfg.model_retry_window_s or (cfg.model_retry_per_fault
                                                              and fault is not ns.predicted_fault):
        return None
    what = "a prediction" + (f" of {ns.predicted_fault.value}" if ns.predicted_fault is not None else "")
    ago = f"{(now - at) / 60:.0f} min" if now - at < 3600 else f"{(now - at) / 3600:.1f} h"
    return (f"gpuops acted on this node on {what} {ago} ago that did not come true: a person decides until "
            f"{cfg.model_retry_window_s / 3600:.0f} h after it")


def _alerts(i: int, name: str, ns: NodeState, s: NodeScores, p: float, anomaly: float, fault: FaultClass | None,
            rule: int, now: float, seen_s: float, warm: bool, retried: str | None, waiting: str | None,
            cfg: PolicyConfig,
            explain: Explain, fleet: list[float], alert_level: float,
            anomaly_level: float) -> tuple[NodeState, list[Decision]]:
    """4. tell a person: one alert per episode of (part, signal), within the node and fleet caps.

    The model's probability is the node's (its worst GPU, which may change from tick to tick),
    so a prediction's episode is per node and fault class; an anomaly's is per GPU, and an
    anomaly on a node whose prediction is already told is merged into that story.
    """
    true: list[tuple[int | None, str, str, int | None]] = []   # (part, signal, source, GPU) true this tick
    if rule >= 0 and s.rule_action[i] is Action.ALERT:
        g = int(s.rule_gpu[i]) if s.rule_gpu[i] >= 0 else None  # -1: the rule acts on the whole node
        true.append((g, f"rule:{rule}", "rule", g))
    if p >= alert_level:
        true.append((None, f"p_fail:{fault.value if fault else 'unknown'}", "model", int(s.gpu[i])))
    if anomaly >= anomaly_level and warm and ns.strange_since is not None and (
            now - ns.strange_since >= cfg.anomaly_sustain_s):  # young windows make any GPU look strange
        gpu = None if s.anomaly_gpu is None else int(s.anomaly_gpu[i])
        true.append((gpu, "anomaly", "anomaly", gpu))
    if not true:
        return ns, []
    episodes = {(e.part, e.signal): e for e in ns.episodes if now - e.last_true <= cfg.episode_gap_for(e.signal)}
    sent = [t for t in ns.alert_times if now - t < RATE_WINDOW_S]
    out: list[Decision] = []
    for part, signal, source, gpu in true:
        ep = episodes.get((part, signal))
        announced = ep is not None and ep.announced
        if source == "anomaly" and any(e.announced and e.signal.startswith("p_fail:") for e in episodes.values()):
            announced = True                            # the node's prediction already tells this story
        if not announced and len(sent) < cfg.node_alerts_per_h and (
                cfg.fleet_alerts_per_h == 0 or len(fleet) < cfg.fleet_alerts_per_h):
            out.append(_alert(i, name, gpu, source, s, p, anomaly, fault, now, seen_s, warm, retried, waiting, cfg,
                              explain))
            sent.append(now)
            fleet.append(now)
            announced = True
        episodes[(part, signal)] = AlertEpisode(part, signal, now, announced)
    return replace(ns, episodes=tuple(episodes.values()), alert_times=tuple(sent)), out


def _alert(i: int, name: str, part: int | None, source: str, s: NodeScores, p: float, anomaly: float,
           fault: FaultClass | None, now: float, seen_s: float, warm: bool, retried: str | None, waiting: str | None,
           cfg: PolicyConfig, explain: Explain) -> Decision:
    if source == "rule":
        return Decision(now, name, part, Action.ALERT, s.rule_fault_class(i), 1.0, explain(i, "rule"), "rule")
    if source == "anomaly":
        return Decision(now, name, part, Action.ALERT, None, anomaly, explain(i, "anomaly"), "anomaly")
    why = explain(i, "model")
    if retried is not None:
        why += f" ({retried})"
    elif s.is_cold(i):
        why += " (warming up: the node's window is refilling on a new scoring worker; predictions only alert)"
    elif not warm:
        why += (f" (warming up: {seen_s / 60:.0f} min of telemetry; predictions act after "
                f"{cfg.model_warmup_s / 60:.0f} min)")
    elif waiting is not None:
        why += f" ({waiting})"
    return Decision(now, name, part, Action.ALERT, fault, p, why, "model")
