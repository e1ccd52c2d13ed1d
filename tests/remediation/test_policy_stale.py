"""Candidate FR: a tick whose short window holds no sample of the node's most likely GPU is silence, not a
reading that the GPU is healthy again, so its probability under the act line does not end a prediction."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from collector.schema import Action, FaultClass, Grade
from remediation.config import PolicyConfig
from remediation.policy import PolicyState, decide

from test_policy import CFG, explain, scores

SUSTAIN = CFG.model_copy(update={"act_sustain_s": 120})


def tick(p: float, fresh: bool, fault: str = "pcie"):
    return replace(scores(p=(p,), fault=(fault,)), fresh=np.array([fresh]))


def run(ticks, cfg: PolicyConfig = SUSTAIN) -> list:
    st, out = PolicyState(), []
    for k, s in enumerate(ticks, 1):
        d, st = decide(s, st, 60.0 * k, cfg, explain)
        out += d
    return out


def drains(out) -> list[tuple[float, FaultClass | None, Grade]]:
    return [(x.ts, x.fault, x.grade) for x in out if x.action is Action.DRAIN]


# a GPU read every other tick: high on the ticks with a sample, lower (another class) on those without
ALTERNATING = [tick(0.9, True), tick(0.5, False, "gpu_off_bus"), tick(0.9, True), tick(0.5, False, "gpu_off_bus"),
               tick(0.9, True)]


def test_a_prediction_high_on_every_tick_with_a_reading_outlasts_the_ticks_without_one():
    assert drains(run(ALTERNATING)) == [(180.0, FaultClass.PCIE, Grade.PREDICTED)]  # 120 s after the first reading


def test_turned_off_every_tick_counts_and_the_alternating_prediction_never_acts():
    off = SUSTAIN.model_copy(update={"stale_tick_keeps_prediction": False})
    assert drains(run(ALTERNATING, off)) == []


def test_a_reading_under_the_line_still_ends_the_prediction():
    out = run([tick(0.9, True), tick(0.5, True), tick(0.9, True), tick(0.9, True), tick(0.9, True)])
    assert drains(out) == [(300.0, FaultClass.PCIE, Grade.PREDICTED)]  # counted afresh from 180 s


def test_a_tick_without_a_reading_under_the_line_never_acts_itself():
    quiet = [tick(0.9, True)] + [tick(0.5, False, "gpu_off_bus")] * 4   # sustain long elapsed, but p is under it
    assert drains(run(quiet)) == []
    assert drains(run(quiet + [tick(0.9, True)])) == [(360.0, FaultClass.PCIE, Grade.PREDICTED)]


def test_a_gpu_gone_silent_with_its_probability_high_acts_as_before():
    silent = [tick(0.95, False, "gpu_off_bus")] * 3
    assert drains(run(silent)) == [(180.0, FaultClass.GPU_OFF_BUS, Grade.PREDICTED)]
    off = SUSTAIN.model_copy(update={"stale_tick_keeps_prediction": False})
    assert drains(run(silent, off)) == drains(run(silent))


def test_a_trend_for_corroboration_is_not_ended_by_a_tick_without_a_reading():
    cfg = SUSTAIN.model_copy(update={"actions": {FaultClass.PCIE: Action.RESET}, "corroborate_sustain_s": 180})
    ticks = [tick(0.95, True), tick(0.5, False), tick(0.95, True), tick(0.5, False), tick(0.95, True)]
    out = run(ticks, cfg)
    # drained at 180 s (predicted), then the trend p >= 0.9 since 60 s corroborates the reset at 300 s
    assert [(x.ts, x.action, x.grade) for x in out if x.action in (Action.DRAIN, Action.RESET)] == [
        (180.0, Action.DRAIN, Grade.PREDICTED), (300.0, Action.RESET, Grade.CORROBORATED)]
    off = cfg.model_copy(update={"stale_tick_keeps_prediction": False})
    assert [x for x in run(ticks, off) if x.action in (Action.DRAIN, Action.RESET)] == []
