"""Policy configuration: thresholds and per-fault actions, as validated YAML.

Every knob says its unit and why its default. Load with :func:`load_policy_config`;
an invalid file fails at start-up with every problem listed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from collector.schema import Action, FaultClass, FollowUp

#: The hardest action a *corroborated* prediction of each fault class may take (rules carry
#: their own action). A prediction alone only ever drains (``policy.PREDICTION_ALONE``).
DEFAULT_ACTIONS: dict[FaultClass, Action] = {
    FaultClass.HBM_ECC: Action.DRAIN,       # ...then a reset when idle activates pending row remaps
    FaultClass.GPU_OFF_BUS: Action.DRAIN,
    FaultClass.NVLINK: Action.DRAIN,
    FaultClass.PCIE: Action.DRAIN,
    FaultClass.THERMAL: Action.DRAIN,
    FaultClass.POWER: Action.DRAIN,
    FaultClass.IB_LINK: Action.DRAIN,
    FaultClass.FAIL_SLOW: Action.DRAIN,     # soft: drain lets the running job finish
    FaultClass.APP_ERROR: Action.NONE,      # the job's own fault: never touch the node
}

#: What a corroborated prediction's drain leads to once the node is idle, per fault class.
DEFAULT_FOLLOW_UPS: dict[FaultClass, FollowUp] = {
    FaultClass.HBM_ECC: FollowUp.RESET_WHEN_IDLE,  # a reset activates pending row remaps; the job ends first
}


class PolicyConfigError(ValueError):
    """An invalid policy file (permanent: fix the file)."""


class PolicyConfig(BaseModel):
    """Thresholds of :func:`remediation.policy.decide`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    act_threshold: float = Field(
        0.7, gt=0, le=1,
        description="Calibrated failure probability (0-1) at which the model's prediction becomes an "
        "action. 0.7: a false drain costs a node for hours, so act only when failure is likelier than not "
        "by a margin; replay on held-out seeds shows where recall and false actions balance.")
    act_threshold_by_fault: dict[FaultClass, float] = Field(
        default_factory=dict, description="Per-fault overrides of act_threshold (0-1).")
    act_sustain_s: float = Field(
        120.0, ge=0, le=3600,
        description="Telemetry time, s, the probability must stay above the threshold (from the first tick "
        "above it) before a prediction acts. 120 s (three ticks at the 60 s cadence) rejects the one- or "
        "two-minute spikes a single PCIe replay or a job's clock change gives, and costs two minutes of lead "
        "(on tuning replays: 7 false actions -> 2 in 512 node-days, one predictive catch fewer in 164). "
        "Measured in time, not ticks, so a faster or slower cadence keeps the same meaning.")
    act_sustain_s_by_fault: dict[FaultClass, float] = Field(
        default_factory=lambda: {FaultClass.HBM_ECC: 900.0, FaultClass.POWER: 420.0},
        description="Per-fault overrides of act_sustain_s, s: a prediction must outlast the healthy "
        "look-alike of its class. A benign burst of corrected ECC errors lasts minutes (field-rates.md §2: "
        "bursts), HBM failures warn for 30 min to hours: 15 min. A rack's power brake lasts a few minutes, "
        "a failing supply's run-up 10-30: 7 min. On the tuning worlds (301-304, home 11-12; 384 node-days) "
        "with the first randomized-world model, 120 s everywhere made 6 false drains, these 2, 15/10 min 1; "
        "predictive recall 0.80, 0.77, 0.75. Re-chosen for the CUSUM model on 512 node-days (+ the two x3 "
        "background worlds): HBM 600/900/1200/1800 s made 5/4/4/4 false actions, predictive recall "
        "0.856/0.843/0.830/0.791.")
    stale_tick_keeps_prediction: bool = Field(
        True,
        description="On a tick whose short window holds no sample of the node's most likely GPU "
        "(NodeScores.fresh), a probability under the act line (or corroborate_threshold) does not end the run "
        "of ticks above it: silence is not a reading that the GPU is healthy again. Sampling near the 60 s tick, "
        "or an exporter that drops scrapes, leaves such ticks (1-3 % of a GPU's minutes on the shift suite's 60 s "
        "and messy worlds, 18-49 % on tuning worlds thinned to 60-120 s), and the model reads an empty short "
        "window differently (a PCIe precursor scored 0.86-0.92 on ticks with a sample, 0.70-0.80 on those "
        "without), so a sustained prediction could not outlast act_sustain_s. A tick with a sample under the "
        "line ends the run as before, and a prediction acts only on a tick above its line. false: every tick "
        "counts, read or not (the behaviour before candidate FR, robustness.md, twenty-sixth session).")
    corroborate_threshold: float = Field(
        0.9, gt=0, le=1,
        description="Probability (0-1) whose sustained crossing corroborates a prediction (a rising trend): "
        "a hard action (reset, requeue, a drain with a follow-up) on a prediction needs it or a second signal. "
        "0.9: clearly above act_threshold, so a score that merely hovers at the action level never resets.")
    corroborate_sustain_s: float = Field(
        600.0, ge=0,
        description="Telemetry time, s, the probability must stay above corroborate_threshold to count as a "
        "trend. 10 min: several minutes of long-window features agreeing, still well inside the typical "
        "onset-to-failure time of the HBM and link faults whose remedy is a reset.")
    corroborate_anomaly: float = Field(
        0.999, gt=0, le=1,
        description="Anomaly level (fraction of healthy GPUs less strange, 0-1) on the same node that counts "
        "as a second, independent signal for a prediction. 0.999: below anomaly_alert (it only confirms, it "
        "never pages) yet rare on healthy GPUs (1e-3 of GPU-ticks).")
    corroborate_window_s: float = Field(
        1800.0, ge=0,
        description="A second signal (a lower-severity rule of the same fault class, or the anomaly detector "
        "agreeing) corroborates predictions for this long after it was last seen, s. 30 min: the long "
        "feature window; older evidence may belong to another episode.")
    model_warmup_s: float = Field(
        1800.0, ge=0,
        description="A prediction acts on a node only once gpuops has seen it this long, s: before the long "
        "window has filled, slopes, spreads and fleet deviations come from a few samples (service start, a "
        "node that just joined). Rules act at once; predictions meanwhile only alert. Default: the "
        "pipeline's long window, 30 min.")
    alert_threshold: float = Field(
        0.3, gt=0, le=1, description="Probability (0-1) at which a person is told, with no change to the node.")
    anomaly_alert: float = Field(
        0.9999, gt=0, le=1,
        description="Anomaly level (fraction of healthy GPUs less strange, 0-1) that raises an alert. "
        "1e-4 of healthy GPU-ticks is ~1 alert per 10 k GPU-minutes: rare enough to read.")
    anomaly_sustain_s: float = Field(
        300.0, ge=0, le=3600,
        description="Telemetry time, s, a node must stay strange (anomaly >= anomaly_alert on consecutive "
        "ticks) before the anomaly detector alerts. Production detectors flag a machine only when it stays "
        "dissimilar for a period (Minder, NSDI 2025: patterns last ~5 min; research/robust-detection.md "
        "§1): 5 min. Chosen before looking at any judged recording.")
    anomaly_gap_s: float = Field(
        150.0, gt=0,
        description="Largest gap between two strange ticks, s, that still continues one run: 2.5 ticks "
        "at the 60 s cadence, so one late tick does not restart the clock but an unvisited stretch does.")
    alert_episode_gap_s: float = Field(
        1800.0, ge=0,
        description="An alert opens an episode for (node, GPU, signal); while the condition stays true, or "
        "comes back within this many seconds, no new alert is sent. 30 min: a signal that flickers around "
        "its threshold is one story for the person reading it, not a page per flicker.")
    anomaly_episode_gap_s: float = Field(
        86400.0, ge=0,
        description="The same for an anomaly's episode on one GPU: it stays open while the GPU turns strange again "
        "within this many seconds. 24 h: a part that stays unlike its peers all day (a GPU that always draws more "
        "power than its neighbours) is one story, told once a day, not every time it comes back after half an hour.")
    node_alerts_per_h: int = Field(
        1, ge=1,
        description="At most this many alerts per node in any hour (distinct episodes beyond it wait, and are "
        "sent while still true once the hour allows). 1, as before episodes: several stories on one node at "
        "once are usually one fault seen by several parts (node-level features deviate on every GPU), and "
        "the person reading the first looks at the whole node. An action on the node starts its count afresh.")
    fleet_alerts_per_h: int = Field(
        60, ge=0,
        description="At most this many alerts fleet-wide in any hour (0: no cap); the rest wait like a node's. "
        "60, one a minute: more than on-call can read, and many nodes at once is usually the telemetry or "
        "the facility (the breaker's job), not 60 separate faults.")
    min_hold_s: float = Field(
        3600.0, ge=0,
        description="A node drained or reset by gpuops stays out this long at least, s, before it may be "
        "resumed: long enough for a reset/reboot and a health check.")
    resume_after_s: float = Field(
        1800.0, ge=0, description="...and only after its scores stayed below clear_threshold this long, s.")
    clear_threshold: float = Field(
        0.1, ge=0, le=1, description="Probability (0-1) under which a held node counts as healthy again.")
    resume_needs_every_gpu: bool = Field(
        True,
        description="A held node counts as healthy only while every GPU it has reported from reads again "
        "(NodeScores.gpus_lost 0): a GPU with no reading for the pipeline's retain_silent_s is lost, not healthy. "
        "After XID 79 the lost GPU is the failed part, and the GPUs that still report read healthy: without this "
        "a node drained for a GPU off the bus was resumed at min_hold_s with the GPU still gone (all six such "
        "nodes of a tuning world in the collector's form, bench/results/robustness.md, candidate LG). Its "
        "healthy time starts when the GPU reads again. A scoring worker that restarted since never saw the GPU "
        "go, so the node must also read as many GPUs as when gpuops took it out (NodeScores.gpus_reading; the "
        "count is kept on the hold's records, evidence.held_gpus, so it outlives an engine restart too). A GPU "
        "removed for good keeps its node held until a person resumes it.")
    model_retry_window_s: float = Field(
        86400.0, ge=0,
        description="After gpuops acted on a node on a *prediction* and the node came back healthy, further "
        "predictions for it within this many seconds only alert: the prediction was wrong once (a confounder "
        "such as a steady low SBE rate), so a person decides. Rules on hard evidence still act. A prediction "
        "whose failure came while the node was held (an acting rule fired: it was right) does not count. 24 h.")
    model_retry_per_fault: bool = Field(
        True,
        description="The retry cap (model_retry_window_s) holds back only predictions of the fault class that "
        "was wrong: a confounder of one class's evidence (corrected ECC errors on a GPU) says nothing about "
        "another's (symbol errors on an IB port). On the tuning ground a wrong hbm_ecc drain had silenced an "
        "ib_link prediction 39 min ahead of its failure (robustness.md, candidate RC). Off: a wrong prediction "
        "of any class turns the node's predictions of every class into alerts for the window.")
    false_budget_per_1k_node_days: float = Field(
        5.0, ge=0,
        description="The fleet's budget of prediction holds that end healthy, per fault class, per 1,000 node-days "
        "(remediation/budget.py). A class whose holds ended healthy (resumed with no acting rule while held) at "
        "least false_budget_min_events times in false_budget_window_s, and beyond this rate at "
        "false_budget_confidence, is braked: its predictions alert instead of acting until that passes. Rules "
        "are never braked. 5: half the issue's bar of 10 false actions, the whole of research/robust-detection.md "
        "section 9.5's. 0: off.")
    false_budget_window_s: float = Field(
        7 * 86400.0, gt=0, description="The window of the false-action budget, telemetry s (7 days).")
    false_budget_confirm_s: float = Field(
        21600.0, ge=0,
        description="A hold that ended healthy still came true when an acting rule fires on its node within this "
        "many telemetry seconds of the hold's start (resumed before its failure came): the classifier's horizon, "
        "P(fault within 6 h). 0: only a failure while held confirms.")
    false_budget_min_events: int = Field(
        3, ge=1, description="Holds ended healthy in one class before its budget can brake it (fewer is chance).")
    false_budget_confidence: float = Field(
        0.9, gt=0, lt=1, description="How sure the budget must be that the class's rate is over it (one-sided "
        "Poisson lower bound).")
    actions: dict[FaultClass, Action] = Field(
        default_factory=lambda: dict(DEFAULT_ACTIONS),
        description="Hardest action per predicted fault class, taken only when the prediction is corroborated; "
        "a prediction alone drains (the least disruptive action that protects the next job); none: never act.")
    follow_ups: dict[FaultClass, FollowUp] = Field(
        default_factory=lambda: dict(DEFAULT_FOLLOW_UPS),
        description="What a corroborated prediction's drain leads to once the node is idle, per fault class "
        "(hbm_ecc: reset when idle, to activate pending row remaps without killing the running job).")
    hbm_recent_sbe_s: float = Field(
        0.0, ge=0,
        description="When > 0, an hbm_ecc prediction counts as above its threshold only while the predicted GPU "
        "logged corrected ECC errors within this many telemetry seconds (a GPU whose counter is missing is never "
        "gated), so the tail of a benign burst (errors stopped, the long window still full of them) does not act. "
        "0 (off). On the tuning worlds 300, 600 and 900 s all gave 3 false drains instead of 4 and predictive "
        "recall 0.752 instead of 0.771; judged once at 600 s it left the independent generator's 3 false hbm "
        "drains in place (their errors were still coming) and cost predictive catches where SBE counters were "
        "missing, which then read as quiet (fixed since; not re-judged): bench/results/robustness.md.")
    pcie_warn_per_min: float = Field(
        16.0, ge=0,
        description="When > 0, a prediction of a class in pcie_warn_faults does not count as above its threshold "
        "while the predicted GPU's last known PCIe replay rate (short window) within pcie_warn_memory_s was under "
        "this many per minute and none reached it (a tick without a reading changes nothing; a GPU with no known "
        "reading in that time is not gated: unknown is not quiet). DCGM's health watch warns above "
        "ceil(1e-12 x lane rate x 60 x lanes) replays per minute: 16 on Gen4 x16, 31 on Gen5 x16, the link's "
        "bit-error budget on every fleet; a steady trickle under it is a link within its specification, not a "
        "failing one. 16 (the lower line); 0: off. On the tuning worlds it removed two of 20 false drains "
        "(trickles of 2-4 per minute) and cost no catch, ahead or late (robustness.md, thirteenth session, W16, "
        "W18).")
    pcie_warn_faults: list[FaultClass] = Field(
        default_factory=lambda: [FaultClass.PCIE, FaultClass.GPU_OFF_BUS],
        description="The fault classes whose predictions pcie_warn_per_min gates: those that rest on the GPU's PCIe "
        "link. gpu_off_bus too: gated for pcie alone, the model named a trickle gpu_off_bus and drained it anyway; "
        "on the tuning worlds every warned fall off the bus crossed the line before the model drained it "
        "(robustness.md, thirteenth session, W17/W18).")
    pcie_warn_memory_s: float = Field(
        1800.0, gt=0,
        description="How long (telemetry seconds) a reading of a GPU's PCIe replay rate, at or above "
        "pcie_warn_per_min or under it, counts for pcie_warn_per_min (the long window); readings are taken on the "
        "ticks its node is watched (a probability at or above the lower of alert_threshold and clear_threshold), "
        "as hbm_recent_sbe_s's are.")
    hbm_storm_ratio: float = Field(
        0.6, ge=0, lt=1,
        description="When > 0, an hbm_ecc prediction's action waits while the predicted GPU's last known 10-minute "
        "corrected-ECC rate within hbm_storm_memory_s was under this share of its own highest 10-minute rate of the "
        "last 2 h and above 0 (NodeScores.sbe_of_peak, pipeline/storms.py): a storm of corrected errors falling from "
        "its peak while still erring, not a failing HBM, whose errors grow or come back. A GPU without an error in "
        "the last 10 minutes (0) has stopped, which a failing HBM's precursor can do before its failure: not held. "
        "The sustain timer keeps running, so a prediction whose GPU's errors climb back acts on that tick. A tick "
        "without a reading changes nothing; a GPU with no known reading is not held. Rules (an uncorrectable "
        "error, XID 48) still act at once. 0: off. 0.6 from the tuning worlds: gpuops' false hbm_ecc drains read "
        "0.29-0.56 there, 55 of 63 true ones 0.6 or more; on them it removed three of 18 false drains and cost no "
        "catch (robustness.md, thirteenth and fourteenth sessions, W19, W20).")
    hbm_steady_growth: float = Field(
        1.5, ge=0,
        description="When > 0, an hbm_ecc prediction's action also waits while the predicted GPU's last known "
        "10-minute corrected-ECC rate within hbm_storm_memory_s was above 0 and under this multiple of its own rate "
        "in the hour before (ending 10-20 min ago, floored at 1 per hour; NodeScores.sbe_growth, pipeline/storms.py): "
        "a storm that still errs at the rate it had, a plateau or a chronic card, not a deteriorating part, whose "
        "errors grow. A storm in its first hour reads as growing (the hour before it was quiet); a GPU with no error "
        "in the last 10 minutes has stopped and is not held; one without a reading (under 30 min of exposure in that "
        "hour) is not held. The sustain timer keeps running, so the prediction acts on the tick its errors grow. "
        "Rules still act at once. 0: off. 1.5 (W21's value, chosen a priori) is on by default since the classifier "
        "stopped reading the driver's informational XID 92 as 'this storm is benign' (decision XW): with both, the "
        "tuning worlds drain as many benign storms as before (15 false actions in 1,536 node-days, moved from "
        "plateaus to fresh storms) and catch 22 more of 145 HBM failures ahead (robustness.md, nineteenth and "
        "twenty-fifth sessions).")
    hbm_storm_memory_s: float = Field(
        1800.0, gt=0,
        description="How long (telemetry seconds) a reading of a GPU's SBE rate against its peak and its hour before "
        "counts for hbm_storm_ratio and hbm_steady_growth; readings are taken on the ticks its node is watched, as "
        "pcie_warn_memory_s's are.")
    vetoed_rule_keeps_hold: bool = Field(
        True,
        description="A node gpuops holds is not healthy while an acting rule's condition holds on it but a veto "
        "stops the rule (NodeScores.rule_vetoed: e.g. hw_power_brake on a node whose brake goes on while another "
        "node brakes too). A veto then only keeps gpuops from taking a *new* node out for a shared cause; it never "
        "releases a node whose own evidence is still there. Off: a vetoed rule reads as no rule, as before. Every "
        "longer veto tried so far (robustness.md: P, P4) failed because a held broken node was resumed while its "
        "rule was vetoed; this is what such a veto needs first. On since the eleventh session (candidate VP4, with "
        "hw_power_brake's veto other_nodes_power_brake_long_ratio >= 0.5): on the thinned tuning set it removed 3 of "
        "13 false drains, and it released no held node (bench/results/robustness.md).")
    fleet_calibration: bool = Field(
        True,
        description="Fleet-relative calibration (research/robust-detection.md §1, §4): a prediction acts, "
        "and a prediction or the anomaly detector alerts, only when the node is ALSO an outlier against this "
        "fleet's own recent level: its odds p/(1-p) at least fleet_odds_ratio (anomaly: fleet_anomaly_odds_ratio) "
        "times the odds of the fleet's typical node (the fleet_quantile of nodes, per tick, taken every "
        "fleet_step_s and the median over the last fleet_window_s). In a fleet whose background makes every "
        "node's score high only the outliers act; on a fleet like the training worlds the absolute thresholds "
        "bind. False: absolute thresholds only.")
    fleet_min_nodes: int = Field(
        16, ge=2,
        description="A tick with fewer reporting nodes than this neither feeds nor uses the fleet level: a "
        "small fleet has no reliable 'typical node', so it falls back to the absolute thresholds.")
    fleet_quantile: float = Field(
        0.5, gt=0, lt=1,
        description="Which node is the fleet's 'typical' one each tick (0-1 over the nodes' scores): 0.5, the "
        "median node, so the faulty minority never sets the level.")
    fleet_step_s: float = Field(
        300.0, gt=0, description="Telemetry seconds between two samples of the fleet level kept in the policy state.")
    fleet_window_s: float = Field(
        21600.0, gt=0,
        description="The fleet level is the median of its samples over this many telemetry seconds (6 h: 72 "
        "samples at most, a day's worth of background shifts slowly; a burst of a few minutes does not move it).")
    fleet_odds_ratio: float = Field(
        3000.0, ge=1,
        description="A prediction needs odds p/(1-p) this many times the fleet level's to act or alert (and "
        "still act_threshold / alert_threshold). Chosen on the tuning worlds only (301-304, home 11-12): the "
        "largest round ratio whose floor stays under act_threshold on every tuning world's typical node (p "
        "3e-4 to 7e-4: floor 0.47-0.68), so no action changes there (4 false, predictive recall 0.771 with or "
        "without it) while prediction alerts no fault explains fell 138 -> 24. 5000 also kept the actions; "
        "10000 cost 3 predictive catches (0.743), 30000 5 (0.724, 2 false fewer). A fleet whose typical node "
        "reads p = 0.05 needs p >= 0.994.")
    fleet_anomaly_odds_ratio: float = Field(
        1000.0, ge=1,
        description="The same gate for anomaly alerts, on the anomaly level's odds a/(1-a). Chosen like "
        "fleet_odds_ratio: the tuning worlds' typical node reads a ~ 0.72-0.83 (odds 2.6-4.9), so 1000 keeps the "
        "floor under anomaly_alert (odds 1e4) on each (13 anomaly alerts, as without; 10000 gave 8).")
    use_model: bool = Field(True, description="False: rules only (the reactive baseline).")

    @model_validator(mode="after")
    def _consistent(self) -> "PolicyConfig":
        if self.alert_threshold > self.act_threshold:
            raise ValueError("alert_threshold must not exceed act_threshold (alert before you act)")
        if self.clear_threshold >= self.alert_threshold:
            raise ValueError("clear_threshold must be below alert_threshold")
        for f, a in self.actions.items():
            if a in (Action.RESUME,):
                raise ValueError(f"'{a.value}' is not a remedy for {f.value}")
        if self.corroborate_threshold < self.act_threshold:
            raise ValueError("corroborate_threshold must not be below act_threshold (corroboration is stronger)")
        return self

    def threshold_for(self, fault: FaultClass) -> float:
        return self.act_threshold_by_fault.get(fault, self.act_threshold)

    def sustain_for(self, fault: FaultClass) -> float:
        """Telemetry seconds a prediction of *fault* must hold before it acts."""
        return self.act_sustain_s_by_fault.get(fault, self.act_sustain_s)

    def episode_gap_for(self, signal: str) -> float:
        """Telemetry seconds an alert episode of *signal* stays open after it was last true."""
        return self.anomaly_episode_gap_s if signal == "anomaly" else self.alert_episode_gap_s

    def action_for(self, fault: FaultClass) -> Action:
        """The hardest action a corroborated prediction of *fault* may take."""
        return self.actions.get(fault, DEFAULT_ACTIONS[fault])

    def follow_up_for(self, fault: FaultClass) -> FollowUp | None:
        """What a corroborated drain for *fault* leads to once the node is idle (None: nothing)."""
        return self.follow_ups.get(fault)


def load_policy_config(path: str | Path | None) -> PolicyConfig:
    """Read a policy YAML file (``None``: defaults); invalid files raise :class:`PolicyConfigError`.

    The file's settings apply over the defaults as every policy setting does (:func:`policy_with`): a
    mapping merged key by key, ``{}`` clearing it. So ``act_sustain_s_by_fault: {ib_link: 300}`` keeps
    ``hbm_ecc``'s 900 s and ``power``'s 420 s instead of silently dropping them."""
    if path is None:
        return PolicyConfig()
    return policy_with(PolicyConfig(), read_settings(path, "policy", PolicyConfigError), str(path))


#: how a compared or shadow policy may be named (a report key, a metric label, a file stem)
POLICY_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


def load_policy_files(paths: Iterable[str | Path], base: PolicyConfig | None = None,
                      what: str = "--compare-policy") -> dict[str, PolicyConfig]:
    """Policy YAML files by their file's stem (the name a compared policy goes by), each file's settings over
    *base* (the policy compared against; ``None``: the defaults), mappings merged key by key
    (:func:`policy_with`), as ``--remote`` and shadow policies apply them over the service's: a file that sets
    ``act_sustain_s_by_fault: {ib_link: 300}`` keeps the other classes' sustains. Two of one stem are refused."""
    base = PolicyConfig() if base is None else base
    return {stem: policy_with(base, raw, str(path)) for stem, path, raw in _settings_by_stem(paths, what)}


def load_policy_overrides(paths: Iterable[str | Path], what: str = "--compare-policy") -> dict[str, dict[str, Any]]:
    """Policy YAML files as the settings they set (their ``policy:`` mapping, or the top level), by their file's
    stem: what a service applies over its own policy (``POST /v1/replays`` ``compare_policies``). Each is checked
    over the defaults here, so a typo fails before anything is sent; two of one stem are refused."""
    out: dict[str, dict[str, Any]] = {}
    for stem, path, raw in _settings_by_stem(paths, what):
        policy_with(PolicyConfig(), raw, str(path))
        out[stem] = raw
    return out


def _settings_by_stem(paths: Iterable[str | Path], what: str) -> list[tuple[str, Path, dict[str, Any]]]:
    """(stem, path, the settings it sets) of each policy file, the stem being the policy's name; two of one stem
    are refused before any file is read."""
    out: dict[str, Path] = {}
    for path in map(Path, paths):
        if path.stem in out:
            raise PolicyConfigError(f"{what}: two policy files named {path.stem!r}; a policy is named by its file's "
                                    "stem, so rename one")
        out[path.stem] = path
    return [(stem, path, read_settings(path, "policy", PolicyConfigError)) for stem, path in out.items()]


def policy_with(base: PolicyConfig, overrides: Mapping[str, Any], what: str = "policy") -> PolicyConfig:
    """*base* with the settings of *overrides* (a policy YAML's mapping) in place of its own; a setting that is a
    mapping (``actions``, ``act_threshold_by_fault``, ...) is merged key by key, and an empty one (``{}``) clears
    it. Invalid: :class:`PolicyConfigError` naming *what* and every problem."""
    try:
        return PolicyConfig(**merged_over(base, overrides))
    except ValidationError as e:
        raise PolicyConfigError(f"{what}: {problems(e, 'policy')}") from None


def merged_over(base: PolicyConfig, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """*base*'s settings (as JSON) with *overrides* in their place, a non-empty mapping merged key by key."""
    raw = base.model_dump(mode="json")
    for k, v in overrides.items():
        raw[k] = raw[k] | v if isinstance(v, Mapping) and v and isinstance(raw.get(k), dict) else v
    return raw


def problems(e: ValidationError, section: str) -> str:
    """Every problem of *e*, each as ``where: what`` (*section* where pydantic names no field)."""
    return "; ".join(f"{'.'.join(map(str, err['loc'])) or section}: {err['msg']}" for err in e.errors())


M = TypeVar("M", bound=BaseModel)


def load_yaml_model(path: str | Path | None, model: type[M], section: str, error: type[ValueError]) -> M:
    """*model* from the ``section:`` mapping of a YAML file (or the file's top level), every problem listed.

    ``None`` gives the defaults. The one loader of remediation's settings files (policy, safety).
    """
    if path is None:
        return model()
    raw = read_settings(path, section, error)
    try:
        return model(**raw)
    except ValidationError as e:
        raise error(f"{path}: {problems(e, section)}") from None


def read_settings(path: str | Path, section: str, error: type[ValueError]) -> dict[str, Any]:
    """The ``section:`` mapping of a YAML file (or the file's top level); an unreadable file or one that is not
    a mapping raises *error* saying so."""
    try:
        raw: Any = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise error(f"{path}: cannot read {section} settings: {e}") from None
    if not isinstance(raw, dict):
        raise error(f"{path}: {section} settings must be a mapping")
    raw = raw.get(section, raw)
    if not isinstance(raw, dict):
        raise error(f"{path}: {section} settings must be a mapping")
    return raw
