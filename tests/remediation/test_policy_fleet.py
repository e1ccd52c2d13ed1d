"""Fleet-relative calibration: in a fleet whose background lifts every node's score, only outliers act or alert."""

from __future__ import annotations

import numpy as np
import pytest

from collector.schema import Action
from models.base import class_index
from models.node_scores import NodeScores
from remediation.config import PolicyConfig
from remediation.policy import PolicyState, decide, fleet_levels

CFG = PolicyConfig(act_threshold=0.7, act_sustain_s=60, alert_threshold=0.3, min_hold_s=600, resume_after_s=300,
                   clear_threshold=0.1, model_warmup_s=0, corroborate_threshold=0.9, corroborate_sustain_s=600,
                   act_sustain_s_by_fault={}, anomaly_sustain_s=0, fleet_min_nodes=16)


def fleet(p: list[float], anomaly: list[float] | None = None, fault: str = "ib_link") -> NodeScores:
    n = len(p)
    idx = np.arange(n)
    return NodeScores(0.0, np.array([f"n{i:02d}" for i in range(n)], object), np.array(p, float),
                      np.full(n, class_index(fault), np.int8), idx, idx, np.full(n, -1), idx, idx,
                      np.zeros(n, np.int8), np.array([None] * n, object), np.array([None] * n, object),
                      np.array(anomaly if anomaly is not None else [0.0] * n, float), idx, np.zeros(n, int))


def run(ticks: list[NodeScores], cfg: PolicyConfig = CFG) -> tuple[list, PolicyState]:
    st, out = PolicyState(), []
    for k, s in enumerate(ticks):
        d, st = decide(s, st, 60.0 * k, cfg, lambda i, source: source)
        out += d
    return out, st


def test_in_a_fleet_whose_typical_node_reads_high_a_node_at_the_absolute_threshold_does_not_act():
    p = [0.1] * 39 + [0.8]                         # every node reads 0.1: 0.8 is background here, not an outlier
    out, _ = run([fleet(p)] * 10)
    assert out == []


def test_in_the_same_fleet_a_clear_outlier_still_acts_and_says_why():
    p = [0.1] * 39 + [0.99999]
    out, _ = run([fleet(p)] * 10)
    drains = [x for x in out if x.action is Action.DRAIN]
    assert [(x.node, x.action) for x in drains] == [("n39", Action.DRAIN)]
    assert "an outlier in this fleet" in drains[0].reason


def test_in_a_quiet_fleet_the_absolute_threshold_binds_as_before():
    p = [0.0005] * 39 + [0.8]
    out, _ = run([fleet(p)] * 10)
    assert [(x.node, x.action) for x in out if x.action is Action.DRAIN] == [("n39", Action.DRAIN)]
    assert all("outlier" not in x.reason for x in out)


def test_a_small_fleet_falls_back_to_the_absolute_thresholds():
    p = [0.1] * 7 + [0.8]                          # 8 nodes < fleet_min_nodes: no typical node to compare with
    out, st = run([fleet(p)] * 10)
    assert [(x.node, x.action) for x in out if x.action is Action.DRAIN] == [("n07", Action.DRAIN)]
    assert st.fleet_levels == ()


def test_turned_off_it_acts_on_the_absolute_threshold_alone():
    p = [0.1] * 39 + [0.8]
    out, _ = run([fleet(p)] * 10, CFG.model_copy(update={"fleet_calibration": False}))
    assert [(x.node, x.action) for x in out if x.action is Action.DRAIN] == [("n39", Action.DRAIN)]


def test_anomaly_alerts_go_only_to_nodes_strange_against_the_fleets_own_level():
    a = [0.99] * 38 + [0.99995, 0.9999999]        # the whole fleet is strange to the training world
    out, _ = run([fleet([0.0] * 40, a)] * 5)
    assert [(x.node, x.source) for x in out] == [("n39", "anomaly")]


def test_the_fleet_level_is_sampled_every_step_and_kept_for_the_window_only():
    cfg = CFG.model_copy(update={"fleet_step_s": 300.0, "fleet_window_s": 3600.0})
    levels = ()
    for k in range(200):                           # 200 min at 60 s
        levels, floors = fleet_levels(fleet([0.01] * 20), np.full(20, 0.01), np.zeros(20), levels, 60.0 * k, cfg)
    assert len(levels) == 12                       # window / step: bounded, whatever the run's length
    assert all(60.0 * 199 - x.ts < 3600 for x in levels)
    assert floors.p == pytest.approx(3000 * 0.01 / 0.99 / (1 + 3000 * 0.01 / 0.99))


def test_a_burst_across_the_fleet_for_minutes_does_not_move_the_level():
    quiet, burst = [0.0005] * 40, [0.2] * 40
    ticks = [fleet(quiet)] * 120 + [fleet(burst)] * 5 + [fleet([0.0005] * 39 + [0.8])] * 5
    out, st = run(ticks)
    assert [(x.node, x.action) for x in out if x.action is Action.DRAIN] == [("n39", Action.DRAIN)]


def hbm(p: float, sbe: bool | None) -> NodeScores:
    s = fleet([p], fault="hbm_ecc")
    s.sbe_now = None if sbe is None else np.array([sbe])
    return s


SBE_GATE = CFG.model_copy(update={"hbm_recent_sbe_s": 300.0})


def test_an_hbm_prediction_after_the_corrected_errors_stopped_does_not_act_with_the_recent_sbe_gate():
    ticks = [hbm(0.05, True)] * 10 + [hbm(0.95, False)] * 20   # a burst, then the tail of its long window
    out, _ = run(ticks, SBE_GATE)
    assert [x.action for x in out if x.action is Action.DRAIN] == []
    out, _ = run(ticks, CFG.model_copy(update={"hbm_recent_sbe_s": 0.0}))  # off: it drains
    assert [x.action for x in out if x.action is Action.DRAIN][:1] == [Action.DRAIN]


def test_an_hbm_prediction_with_errors_still_coming_acts_with_the_recent_sbe_gate():
    ticks = [hbm(0.95, k % 3 == 0) for k in range(10)]         # intermittent: an error every 3 min
    out, _ = run(ticks, SBE_GATE)
    assert [x.action for x in out if x.action is Action.DRAIN] == [Action.DRAIN]


def test_scores_without_the_sbe_signal_are_never_gated():
    out, _ = run([hbm(0.95, None)] * 5, SBE_GATE)
    assert [x.action for x in out if x.action is Action.DRAIN] == [Action.DRAIN]


def pcie(p: float, per_min: float | None) -> NodeScores:
    s = fleet([p], fault="pcie")
    s.pcie_per_min = None if per_min is None else np.array([per_min])
    return s


PCIE_GATE = CFG  # on by default: DCGM's Gen4 x16 line, remembered for the long window


def drains(out: list) -> list:
    return [x for x in out if x.action is Action.DRAIN]


def test_a_pcie_prediction_on_a_trickle_under_the_dcgm_line_does_not_act_with_the_gate():
    assert (PCIE_GATE.pcie_warn_per_min, PCIE_GATE.pcie_warn_memory_s) == (16.0, 1800.0)
    assert [f.value for f in PCIE_GATE.pcie_warn_faults] == ["pcie", "gpu_off_bus"]
    ticks = [pcie(0.95, 3.9)] * 30                             # a steady benign trickle, 4 per minute
    assert drains(run(ticks, PCIE_GATE)[0]) == []
    assert len(drains(run(ticks, CFG.model_copy(update={"pcie_warn_per_min": 0.0}))[0])) == 1  # off: it drains


def test_a_pcie_prediction_acts_while_the_link_ran_above_the_line_within_the_memory():
    burst = [pcie(0.5, 40.0)]                                 # one minute above the line, watched ...
    late = burst + [pcie(0.95, 8.0)] * 35                      # ... then a prediction on a rate under it
    out = drains(run(late, PCIE_GATE)[0])
    assert len(out) == 1 and out[0].ts <= 60.0 * 30            # within the 30 min the line is remembered
    forgotten = burst + [pcie(0.5, 8.0)] * 31 + [pcie(0.95, 8.0)] * 5
    assert drains(run(forgotten, PCIE_GATE)[0]) == []          # past the memory: a trickle again


def test_only_predictions_resting_on_the_link_are_gated_and_a_missing_counter_never_is():
    assert len(drains(run([pcie(0.95, float("nan"))] * 5, PCIE_GATE)[0])) == 1  # unknown is not quiet
    assert len(drains(run([pcie(0.95, None)] * 5, PCIE_GATE)[0])) == 1          # an older scorer: no gate
    other = fleet([0.95], fault="nvlink")
    other.pcie_per_min = np.array([0.0])
    assert len(drains(run([other] * 5, PCIE_GATE)[0])) == 1
    off_bus = fleet([0.95], fault="gpu_off_bus")
    off_bus.pcie_per_min = np.array([2.0])
    assert drains(run([off_bus] * 5, PCIE_GATE)[0]) == []


def test_a_tick_without_a_reading_leaves_the_pcie_gate_as_the_last_reading_left_it():
    quiet = [pcie(0.5, 2.0)] * 3                              # watched, reading under the line
    nan = float("nan")
    assert drains(run(quiet + [pcie(0.95, nan)] * 5, PCIE_GATE)[0]) == []      # an empty short window is not news
    assert len(drains(run([pcie(0.5, 40.0)] + [pcie(0.95, nan)] * 5, PCIE_GATE)[0])) == 1  # nor is it after the line
    stale = quiet + [pcie(0.5, nan)] * 31 + [pcie(0.95, nan)] * 5             # the quiet reading is 30 min old ...
    assert len(drains(run(stale, PCIE_GATE)[0])) == 1                          # ... so unknown again: not gated


def storm(p: float, ratio: float | None, fault: str = "hbm_ecc") -> NodeScores:
    s = fleet([p], fault=fault)
    s.sbe_of_peak = None if ratio is None else np.array([ratio])
    return s


STORM = CFG  # on by default: 0.6 of the GPU's own 2 h peak, remembered for the long window


def test_an_hbm_prediction_on_a_storm_falling_from_its_peak_waits_and_says_why():
    assert (STORM.hbm_storm_ratio, STORM.hbm_storm_memory_s) == (0.6, 1800.0)
    out, _ = run([storm(0.95, 0.4)] * 30, STORM)                  # the tail of a benign storm
    assert drains(out) == []
    assert any("a storm falling" in x.reason for x in out if x.action is Action.ALERT)
    assert drains(run([storm(0.95, 0.4)] * 30, CFG.model_copy(update={"hbm_storm_ratio": 0.0}))[0])[0].ts == 60.0


def test_an_hbm_prediction_acts_on_the_tick_its_errors_climb_back_without_a_new_sustain():
    cfg = STORM.model_copy(update={"act_sustain_s_by_fault": {"hbm_ecc": 900.0}})
    out, _ = run([storm(0.95, 0.4)] * 20 + [storm(0.95, 0.9)] * 3, cfg)  # a lull, then the errors come back
    assert [x.ts for x in drains(out)] == [60.0 * 20]
    assert drains(run([storm(0.95, 0.9)] * 16, cfg)[0])[0].ts == 900.0  # growing all along: the sustain alone


def test_a_tick_without_a_reading_leaves_the_storm_gate_as_the_last_reading_left_it():
    nan = float("nan")
    assert drains(run([storm(0.5, 0.4)] * 3 + [storm(0.95, nan)] * 5, STORM)[0]) == []
    stale = [storm(0.5, 0.4)] * 3 + [storm(0.5, nan)] * 31 + [storm(0.95, nan)] * 5  # the reading is 30 min old
    assert len(drains(run(stale, STORM)[0])) == 1
    assert len(drains(run([storm(0.95, nan)] * 5, STORM)[0])) == 1    # never known: not held
    assert len(drains(run([storm(0.95, None)] * 5, STORM)[0])) == 1   # an older scorer: no gate


def test_the_storm_gate_holds_back_hbm_predictions_only():
    assert len(drains(run([storm(0.95, 0.1, fault="nvlink")] * 5, STORM)[0])) == 1


def test_a_gpu_whose_errors_stopped_is_not_a_falling_storm_and_its_prediction_acts():
    out, _ = run([storm(0.95, 0.4)] * 5 + [storm(0.95, 0.0)] * 3, STORM)  # the 10-min window emptied: a stop
    assert [x.ts for x in drains(out)][:1] == [60.0 * 5]


def steady(p: float, ratio: float, growth: float | None) -> NodeScores:
    s = storm(p, ratio)
    s.sbe_growth = None if growth is None else np.array([growth])
    return s


STEADY = CFG.model_copy(update={"hbm_steady_growth": 1.5})  # the default since decision XW
UNGATED = CFG.model_copy(update={"hbm_steady_growth": 0.0})


def test_an_hbm_prediction_on_a_storm_that_holds_its_rate_waits_and_says_why():
    assert CFG.hbm_steady_growth == 1.5
    assert drains(run([steady(0.95, 0.9, 1.1)] * 30, UNGATED)[0])[0].ts == 60.0  # off: a plateau drains
    out, _ = run([steady(0.95, 0.9, 1.1)] * 30, STEADY)         # a plateau: near its peak, as it was an hour ago
    assert drains(out) == []
    assert any("a steady storm" in x.reason for x in out if x.action is Action.ALERT)
    assert drains(run([steady(0.95, 0.9, 2.0)] * 3, STEADY)[0])[0].ts == 60.0  # growing: acts
    assert drains(run([steady(0.95, 0.0, 0.0)] * 3, STEADY)[0])[0].ts == 60.0  # stopped: acts (W20's lesson)
    assert drains(run([steady(0.95, 0.9, None)] * 3, STEADY)[0])[0].ts == 60.0  # an older scorer: no gate
    alone = STEADY.model_copy(update={"hbm_storm_ratio": 0.0})                 # either gate works alone
    assert drains(run([steady(0.95, 0.4, 1.1)] * 30, alone)[0]) == []
    assert drains(run([steady(0.95, 0.4, 2.0)] * 3, alone)[0])[0].ts == 60.0


def test_a_steady_storm_acts_on_the_tick_its_errors_grow_and_a_nan_keeps_the_last_growth():
    cfg = STEADY.model_copy(update={"act_sustain_s_by_fault": {"hbm_ecc": 900.0}})
    out, _ = run([steady(0.95, 1.0, 1.0)] * 20 + [steady(0.95, 1.0, 1.6)] * 3, cfg)
    assert [x.ts for x in drains(out)] == [60.0 * 20]             # the sustain ran all along
    nan = float("nan")
    assert drains(run([steady(0.95, 1.0, 1.0)] * 3 + [steady(0.95, 1.0, nan)] * 10, STEADY)[0]) == []
    assert len(drains(run([steady(0.95, 1.0, nan)] * 5, STEADY)[0])) == 1     # never known: not held
    stale = [steady(0.5, 1.0, 1.0)] * 3 + [steady(0.5, nan, nan)] * 31 + [steady(0.95, nan, nan)] * 5
    assert len(drains(run(stale, STEADY)[0])) == 1                             # 30 min old: forgotten
    old_growth = [steady(0.5, 1.0, 1.0)] * 3 + [steady(0.5, 1.0, nan)] * 31 + [steady(0.95, 1.0, nan)] * 5
    assert len(drains(run(old_growth, STEADY)[0])) == 1   # the growth ages on its own, whatever the peak ratio does
