"""The reactive baseline: XID-catalogue and hard-threshold rules.

This is what NVSentinel, NHC and DCGM health watches do today: act when a catalogue XID
says so or a counter crosses a hard limit. Rules are data (:data:`DEFAULT_RULES`),
validated against the feature names when the detector is built; each fires on one
feature crossing a threshold (and, where it names them, further features crossing
theirs) and names a fault class, an action, a follow-up and a reason. The first rule
that fires on a row wins (order = priority).

What an XID means — fault class, action, follow-up — is read from :mod:`collector.xid`
(one home); the XID rules here only say which class they watch and in which scope: a
GPU's own XIDs (``xid_<class>_count_short``) act on that GPU, XIDs that name no GPU
(``node_xid_<class>_count_short``) act on the node (``on_node``: the decision carries no GPU,
and a reset becomes drain + reset when idle). Classes whose catalogue bucket is
RESTART_APP or IGNORE have no rule: they never act on the node. A pending row remap
(63 with 94 on one GPU, or the ``row_remap_pending`` flag with a new uncorrectable
error) drains and resets when idle rather than at once.

The node's BMC (:mod:`collector.bmc_events`, features ``node_bmc_*``) acts on the node too:
an asserted SEL entry of an exact catalogue class — a power supply's *Failure detected*
(power), a fan's *Lower Critical going low*, a temperature's *Upper Critical going high*
(thermal) — drains; so do readings at or past the BMC's own thresholds (inlet air at its upper
critical, a fan at its lower critical; ``below`` rules on the margins). A supply's
*Predictive failure* only alerts: it still delivers, and the alert corroborates a power
prediction. Every BMC feature is NaN without BMC data, and NaN never fires.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from collector.bmc_events import SEL_CLASSES
from collector.schema import Action, FaultClass, FollowUp
from collector.xid import CLASS_BY_NAME
from pipeline.features import BRAKE_LONG_FRAC, HW_SLOWDOWN_C, SLOW_DEFICIT

from .base import Detector, DetectorOutput, FeatureMismatch, class_index


@dataclass(frozen=True)
class Rule:
    """``feature > threshold`` (or ``>=``; with ``below``, ``<`` or ``<=``), every ``requires`` feature
    above its threshold and every ``unless_at_least`` feature below its own,
    means ``fault`` now; remedy ``action``, then ``follow_up``. A NaN feature (unknown) never fires."""

    name: str
    feature: str
    threshold: float
    fault: FaultClass
    action: Action
    reason: str  # format string; ``{value}`` is the feature value
    inclusive: bool = False
    #: what the drain leads to once the node is idle (None: nothing more)
    follow_up: FollowUp | None = None
    #: further (feature, threshold) pairs that must all be exceeded (``>``) too
    requires: tuple[tuple[str, float], ...] = ()
    #: (feature, threshold) pairs that veto the rule when the feature reaches the threshold (``>=``)
    unless_at_least: tuple[tuple[str, float], ...] = ()
    #: the evidence names no GPU: the decision is for the node (no GPU), never a guessed one
    on_node: bool = False
    #: fire when the feature is *below* the threshold (a margin used up) rather than above it
    below: bool = False

    def fires(self, col: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            if self.below:
                return (col <= self.threshold) if self.inclusive else (col < self.threshold)
            return (col >= self.threshold) if self.inclusive else (col > self.threshold)

    @property
    def features(self) -> tuple[str, ...]:
        return (self.feature, *(f for f, _ in self.requires), *(f for f, _ in self.unless_at_least))


def xid_rule(cls: str, reason: str, *, on_node: bool = False) -> Rule:
    """The rule for XID class *cls* of :mod:`collector.xid`: its fault, action and follow-up,
    for the GPU that raised it or, *on_node*, for a node whose XID named no GPU."""
    c = CLASS_BY_NAME[cls]
    if not c.acts or c.fault is None:
        raise ValueError(f"XID class {cls!r} takes no action on the node: it has no rule")
    action, follow_up = c.node_action if on_node else (c.action, c.follow_up)
    feature = f"node_xid_{cls}_count_short" if on_node else f"xid_{cls}_count_short"
    where = " (XID names no GPU: the node)" if on_node else ""
    return Rule(f"{'node_' if on_node else ''}xid_{cls}", feature, 0, c.fault, action,
                reason + where + " ({value:.0f} in the short window)", follow_up=follow_up, on_node=on_node)


def bmc_sel_rule(cls: str, reason: str) -> Rule:
    """The rule for SEL class *cls* of :mod:`collector.bmc_events`: its fault and action, for the node
    (a BMC entry names no GPU), on any asserted entry of the class in the short window."""
    c = next(c for c in SEL_CLASSES if c.name == cls)
    return Rule(f"bmc_{cls}", f"node_bmc_{cls}_count_short", 0, c.fault, c.action,
                f"BMC SEL: {c.sensor_type} '{' / '.join(sorted(c.event_texts))}' asserted: {reason} "
                "({value:.0f} in the short window)", on_node=True)


def _remap_pending(name: str, feature: str, with_feature: str, why: str) -> Rule:
    """A pending row remap made urgent by an uncorrectable error: drain, reset when idle."""
    return Rule(name, feature, 0, FaultClass.HBM_ECC, Action.DRAIN, f"HBM row remap pending{why}; reset when idle",
                follow_up=FollowUp.RESET_WHEN_IDLE, requires=((with_feature, 0),))


_F, _A = FaultClass, Action
#: at least this long not ACTIVE, after having been ACTIVE, before a port drains its node (a flap recovers sooner)
PORT_DOWN_SUSTAINED_S = 120.0
#: a GPU's busy-peer clock deficit, averaged over its busy time, at which it is a straggler: twice the
#: most any healthy GPU of the tuning worlds reached (0.050 over 987 GPUs), where 0.15 missed 5 of 14
#: stragglers (robustness.md, twelfth session, S5) ...
STRAGGLER_TREND = 0.10
#: ... while this tick's deficit is still above this (it has not recovered)
STRAGGLER_NOW = SLOW_DEFICIT   # the line sm_clock_slow_share counts a slow minute at (0.10)
#: ... and its utilisation is no more than this many points under its node's median (it is not idling)
STRAGGLER_UTIL_BEHIND = 10.0
#: a GPU slow (>= 10 % under its busy peers, not at its power cap) this share of its steady time is a straggler
#: slow in spells, whose trend averages its slow minutes with its fast ones: twice the most any healthy GPU of
#: the native tuning worlds reached (0.162 over 5,608 GPUs), rounded up (robustness.md, candidate IS2)
STRAGGLER_SHARE = 0.35
#: both straggler rules: slow now (not recovered), and not working less than its node's median (sharing, finishing)
_STRAGGLER_GUARDS: dict[str, Any] = dict(inclusive=True, requires=(("sm_clock_deficit_vs_busy_peers", STRAGGLER_NOW),),
                                         unless_at_least=(("util_deficit_vs_peers", STRAGGLER_UTIL_BEHIND),))
#: another node braked at least this share of this node's own brake in the long window: a shared cause
SHARED_BRAKE_RATIO = 0.5
#: a node silent this long (every GPU) after braking alone has lost its power: 3 samples at 60 s, the
#: slowest cadence exporters run at, so a missed scrape or two never reads as a lost node
POWER_LOST_SILENT_S = 180.0
#: PCIe replays a minute over which a GPU's link is unhealthy: DCGM 4.6's health-watch line for a Gen4 x16 link
#: (ceil(1e-12 x lane rate x 60 x lanes); 31 on Gen5 x16, so the lower one holds on either; field-rates.md §4)
PCIE_REPLAY_LINE = 16.0
#: Default rules, in priority order.
DEFAULT_RULES: tuple[Rule, ...] = (
    xid_rule("off_bus", "XID 79: GPU has fallen off the bus"),
    xid_rule("off_bus", "XID 79: a GPU has fallen off the bus", on_node=True),
    xid_rule("hbm_fatal", "XID 64/95/140: remap failure or uncontained ECC error"),
    xid_rule("hbm_fatal", "XID 64/95/140: remap failure or uncontained ECC error", on_node=True),
    xid_rule("gpu_reset", "GPU firmware / GSP XID (catalogue RESET_GPU)"),
    xid_rule("gpu_reset", "GPU firmware / GSP XID (catalogue RESET_GPU)", on_node=True),
    Rule("row_remap_failure", "row_remap_failure", 0, _F.HBM_ECC, _A.RESET,
         "HBM row remap failure: no spare rows left (as XID 64: reset, then RMA)"),
    _remap_pending("remap_pending_xid", "xid_remap_event_count_short", "xid_contained_ecc_count_short",
                   ": XID 63 with XID 94 on this GPU"),
    _remap_pending("remap_pending_contained", "row_remap_pending", "xid_contained_ecc_count_short",
                   " after a contained ECC error (XID 94)"),
    _remap_pending("remap_pending_dbe", "row_remap_pending", "ecc_dbe_per_h_short",
                   " after a new uncorrectable ECC error"),
    _remap_pending("remap_pending_xid_dbe", "row_remap_pending", "xid_dbe_count_short", " after XID 48"),
    xid_rule("dbe", "XID 48: double-bit ECC error"),
    xid_rule("dbe", "XID 48: double-bit ECC error", on_node=True),
    Rule("ecc_dbe", "ecc_dbe_per_h_short", 0, _F.HBM_ECC, _A.RESET,
         "uncorrectable (double-bit) ECC errors: {value:.0f}/h"),
    xid_rule("nvlink", "XID 74 / 144-150: NVLink error"),
    xid_rule("nvlink", "XID 74 / 144-150: NVLink error", on_node=True),
    Rule("ib_port_not_active", "net_port_down_after_active_s", PORT_DOWN_SUSTAINED_S, _F.IB_LINK, _A.DRAIN,
         "InfiniBand port not ACTIVE for {value:.0f} s after being ACTIVE", inclusive=True),
    # the node's BMC names the cause (a supply, a fan, the inlet air) before or as the GPUs feel it:
    # exact SEL entries (collector.bmc_events), and readings against the BMC's own thresholds
    bmc_sel_rule("psu_fail", "a power supply failed, the node has lost power redundancy"),
    bmc_sel_rule("fan_fail", "a fan is below the BMC's lower critical threshold"),
    bmc_sel_rule("temp_critical", "a temperature sensor is above the BMC's upper critical threshold"),
    Rule("bmc_inlet_critical", "node_bmc_inlet_margin_c", 0, _F.THERMAL, _A.DRAIN,
         "BMC inlet temperature at or above the BMC's upper critical threshold (margin {value:+.0f} degC)",
         inclusive=True, on_node=True, below=True),
    Rule("bmc_fan_critical", "node_bmc_fan_margin_rpm", 0, _F.THERMAL, _A.DRAIN,
         "BMC fan speed at or below the BMC's lower critical threshold (slowest fan's margin {value:+.0f} RPM)",
         inclusive=True, on_node=True, below=True),
    # HW thermal slowdown over half of the minute. At 60 s sampling one sample is the whole minute, so a
    # hot but healthy GPU touching its limit once drains (tuning worlds at 80-360 s). Asking for the
    # slowdown held across samples for more than 20 s (candidate VT) fixed that on the tuning worlds
    # but lost a real cooling failure on an independent fleet, whose slowdown comes and goes as the
    # GPU throttles and cools: taken back (bench/results/robustness.md, eleventh session)
    Rule("hw_thermal", "throttle_hw_thermal_frac_short", 0.5, _F.THERMAL, _A.DRAIN,
         "hardware thermal slowdown {value:.0%} of the time"),
    # the same evidence from a GPU whose exporter sends no throttle reasons (dcgm-exporter's default
    # counters): at NVIDIA's HW slowdown temperature it is in HW thermal slowdown, flag or not (TT)
    Rule("hw_thermal_by_temperature", "temp_gpu_c_without_reasons_short", HW_SLOWDOWN_C, _F.THERMAL, _A.DRAIN,
         "GPU at {value:.0f} degC, at or over NVIDIA's HW slowdown temperature, on an exporter that sends no "
         "throttle reasons", inclusive=True),
    # a power brake on two or more nodes at once is a shared cause (a rack's PSU shelf or PDU, a
    # power-capping test; a rack holds a few nodes, a fleet's last rack maybe two): healthy nodes ride
    # it out, so it never drains them one by one. A node's own supply fails independently of its
    # neighbours', so one braking alone for 90 s of the last 30 minutes, and still, has lost its own
    # power delivery
    # A shared brake's edge looks like one node's own: at its last tick one node's sample may still
    # brake while its peers' no longer do (sampling phase; at 60 s one sample is the minute). So the
    # brake must also be this node's *in proportion*: another node that braked at least half as much
    # in the same 30 min shares the cause. A failing supply brakes far more than a neighbour's episode
    Rule("hw_power_brake", "throttle_hw_power_brake_frac_long", BRAKE_LONG_FRAC, _F.POWER, _A.DRAIN,
         "hardware power brake {value:.0%} of the last 30 min, still on, and on no other node",
         requires=(("throttle_hw_power_brake_frac_short", 0.5),),
         unless_at_least=(("other_nodes_power_brake_short", 1),
                          ("other_nodes_power_brake_long_ratio", SHARED_BRAKE_RATIO))),
    # a supply that has lost its redundancy brakes the node, then the node loses power and stops
    # reporting: every GPU silent at once. Silence alone is usually the agent or the network (the
    # stale-telemetry job alerts on it and never drains by default); silence right after this node, and
    # no other, braked is its power. A brake shared with any other node in the last 30 min (a rack's
    # shelf, a capping test) explains the node's own, so it vetoes: an exporter gap after a rack brake
    # is not a lost node. Drain: it keeps work off the node when it comes back, until a person has
    # looked (the node resumes once it reports healthy)
    Rule("power_lost", "node_silent_s", POWER_LOST_SILENT_S, _F.POWER, _A.DRAIN,
         "every GPU of the node silent for {value:.0f} s right after a hardware power brake on this node alone: "
         "power lost", inclusive=True, on_node=True,
         requires=(("throttle_hw_power_brake_frac_long", BRAKE_LONG_FRAC),),
         unless_at_least=(("other_nodes_power_brake_long", 1), ("other_nodes_power_brake_short", 1))),
    Rule("pcie_replay_storm", "pcie_replay_per_min_short", 1000, _F.PCIE, _A.DRAIN,
         "PCIe replay storm: {value:.0f}/min"),
    # a GPU about to fall off the bus replays more and more on its link for minutes first (4-10 on the tuning
    # worlds, from none to tens a minute). Over DCGM's line alone is not it: a fleet's or a generation's links may
    # replay that steadily (the 3x background worlds' healthy GPUs trickle at 17-20/min). Over the line *and*
    # rising against the GPU's own rate is: its replay CUSUM (10x its own rate, pipeline.baselines) past its
    # alarm level. Both lines a priori (robustness.md, candidate PR). Drain: the job finishes, no new one lands
    # on a link that may be going; DCGM and NVSentinel only report this evidence, so nothing harder
    Rule("pcie_replay_rising", "pcie_replay_per_min_short", PCIE_REPLAY_LINE, _F.PCIE, _A.DRAIN,
         "PCIe replays {value:.0f}/min, over DCGM's health line (16/min) and rising against this GPU's own rate",
         requires=(("pcie_replay_cusum", 0),)),
    # a straggler (fail-slow): a busy GPU whose clock stays well under its busy peers'. The trend is
    # its deficit averaged over its own busy time from 0 (time constant 10 min), so a deficit d
    # reaches the threshold after 10 min x ln(d / (d - 0.15)) of busy time: 4 min at 45 %, 14 min at
    # 20 %, never under 15 %. A GPU at its power cap dips and comes back (DVFS); healthy parts of one
    # SKU at one cap sit within a few per cent of each other. Still slow now, so a GPU that has just
    # recovered does not drain. The trend reads only minutes of steady work without thermal slowdown
    # (a hot GPU slows itself and says so; hot healthy GPUs touch SW thermal slowdown); a GPU that sends
    # no throttle reasons says so by its temperature, under 80 degC, or has none (SU, ST). A straggler is
    # its job's bottleneck, at least as busy as its peers (they wait for it): a GPU that works less than
    # its node's median is sharing or finishing. Drain lets the job finish; nothing here justifies a reset
    Rule("fail_slow_sustained", "sm_clock_deficit_vs_busy_peers_trend", STRAGGLER_TREND, _F.FAIL_SLOW, _A.DRAIN,
         "GPU clock {value:.0%} under its busy peers' over its minutes of steady work (10 min average), "
         "still slow, as busy as they are, and not from heat", **_STRAGGLER_GUARDS),
    # a straggler slow in spells (a few minutes slow, a few at speed): its trend stays shallow, but the share of
    # its steady minutes it runs slow does not. A minute at the power cap or braked is not counted (a healthy GPU
    # at its cap dips in spells too, and says so)
    Rule("fail_slow_spells", "sm_clock_slow_share", STRAGGLER_SHARE, _F.FAIL_SLOW, _A.DRAIN,
         "GPU slow (10 % or more under its busy peers' clock, not at its power cap) in {value:.0%} of its minutes "
         "of steady work (10 min average), slow now, and as busy as they are", **_STRAGGLER_GUARDS),
    # alert-only rules come last: on a row where an acting rule fires too, the acting rule wins.
    # A link that went down and came back is a flap: healthy fabrics flap thousands of times a
    # day (field-rates.md §2) and nobody acts on one (ByteRobust evicts for network alerts only on
    # repetition; NVSentinel calls > 2 carrier changes degraded). A port that flaps again and
    # again (3 in 30 min) tells a person and corroborates an ib_link prediction; a port that
    # stays down drains (above)
    Rule("ib_link_flapping", "net_link_downed_per_min_port_max_long", 0.1, _F.IB_LINK, _A.ALERT,
         "InfiniBand port flapping: {value:.2f} link downs/min over the last 30 min", inclusive=True,
         requires=(("net_link_downed_per_min_short", 0),)),
    # a supply that predicts its own failure still delivers: a person schedules its replacement, and the
    # alert corroborates a power prediction of the models (remediation.policy, step 3)
    bmc_sel_rule("psu_predictive", "a power supply predicts its own failure"),
)


class RulesDetector(Detector):
    """Scores 1.0 where a rule fires (with its fault, action and reason), else 0."""

    kind = "rules"

    def __init__(self, feature_names: Sequence[str], rules: Sequence[Rule] = DEFAULT_RULES):
        super().__init__(feature_names)
        missing = [f for r in rules for f in r.features if f not in self.feature_names]
        if missing:
            raise FeatureMismatch(f"rules refer to unknown features: {missing}")
        self.rules = tuple(rules)
        self._cols = [self.feature_names.index(r.feature) for r in rules]
        self._requires = [[(self.feature_names.index(f), t) for f, t in r.requires] for r in rules]
        self._vetoes = [[(self.feature_names.index(f), t) for f, t in r.unless_at_least] for r in rules]
        self.fitted = True  # rules need no training

    def _fit(self, x: np.ndarray, y: np.ndarray | None, *, sample_weight: np.ndarray | None, **kw: Any) -> None:
        return None

    def _score(self, x: np.ndarray) -> DetectorOutput:
        """``detail["rule"]``: the highest-priority rule that fires (-1: none); ``detail["vetoed"]``: the
        highest-priority rule whose condition holds but a veto (``unless_at_least``) stops it (-1: none)."""
        n = len(x)
        rule = np.full(n, -1, np.int16)
        vetoed = np.full(n, -1, np.int16)
        for k in range(len(self.rules) - 1, -1, -1):  # last assignment wins: iterate lowest priority first
            hit = self.rules[k].fires(x[:, self._cols[k]])
            with np.errstate(invalid="ignore"):
                for col, t in self._requires[k]:
                    hit &= x[:, col] > t
                if self._vetoes[k]:
                    veto = np.zeros(n, bool)
                    for col, t in self._vetoes[k]:
                        veto |= x[:, col] >= t
                    vetoed[hit & veto] = k
                    hit &= ~veto
            rule[hit] = k
        fault = np.zeros(n, np.int8)
        hit = rule >= 0
        if hit.any():
            fault_of_rule = np.array([class_index(r.fault) for r in self.rules], np.int8)
            fault[hit] = fault_of_rule[rule[hit]]
        return DetectorOutput(hit.astype(np.float32), fault, {"rule": rule, "vetoed": vetoed})

    def reason(self, rule_index: int, row: np.ndarray) -> str:
        """The human reason of rule *rule_index* on one feature row."""
        r = self.rules[rule_index]
        return r.reason.format(value=float(row[self._cols[rule_index]]))

    def action(self, rule_index: int) -> Action:
        return self.rules[rule_index].action

    def follow_up(self, rule_index: int) -> FollowUp | None:
        return self.rules[rule_index].follow_up

    def on_node(self, rule_index: int) -> bool:
        """Whether rule *rule_index* acts on the node as a whole (its evidence names no GPU)."""
        return self.rules[rule_index].on_node

    def get_state(self) -> dict[str, Any]:
        return {"rules": [asdict(r) | {"fault": r.fault.value, "action": r.action.value,
                                     "follow_up": r.follow_up.value if r.follow_up else None} for r in self.rules]}

    def set_state(self, state: dict[str, Any]) -> None:
        rules = [Rule(**(r | {"fault": FaultClass(r["fault"]), "action": Action(r["action"]),
                              "follow_up": FollowUp(r["follow_up"]) if r.get("follow_up") else None,
                              "requires": tuple((f, float(t)) for f, t in r.get("requires", ())),
                              "unless_at_least": tuple((f, float(t)) for f, t in r.get("unless_at_least", ()))}))
                 for r in state["rules"]]
        self.__init__(self.feature_names, rules)  # type: ignore[misc]
