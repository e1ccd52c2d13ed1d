"""The decision policy: rules act at once, predictions act when sustained, alerts are rate-limited,
held nodes are not acted on twice and are resumed only when healthy."""

from __future__ import annotations

import numpy as np
import pytest

from collector.schema import Action, FaultClass
from models.base import class_index
from models.node_scores import NodeScores
from remediation.config import PolicyConfig, PolicyConfigError, load_policy_config
from remediation.policy import PolicyState, decide


def scores(ts=0.0, p=(0.0,), fault=("nvlink",), rule=(-1,), rule_fault=(None,), rule_action=(None,), anomaly=(0.0,),
           rule_follow_up=None):
    n = len(p)
    idx = np.arange(n)
    return NodeScores(
        ts, np.array([f"n{i}" for i in range(n)], object), np.array(p, float),
        np.array([class_index(f) if f else 0 for f in fault], np.int8), idx, idx,
        np.array(rule, int), idx, idx, np.array([class_index(f) if f else 0 for f in rule_fault], np.int8),
        np.array(rule_action, object), np.array(rule_follow_up or [None] * n, object), np.array(anomaly, float), idx)


def explain(i, source):
    return f"{source} says so"


CFG = PolicyConfig(act_threshold=0.7, act_ticks=2, alert_threshold=0.3, min_hold_s=600, resume_after_s=300,
                   clear_threshold=0.1, alert_interval_s=3600, model_warmup_s=0)


def test_a_fired_rule_acts_at_once_with_the_rules_action_and_fault():
    s = scores(rule=(3,), rule_fault=("hbm_ecc",), rule_action=(Action.RESET,))
    d, st = decide(s, PolicyState(), 100.0, CFG, explain)
    assert [(x.action, x.fault, x.source, x.node) for x in d] == [(Action.RESET, FaultClass.HBM_ECC, "rule", "n0")]
    assert st.held() == ["n0"]


def test_a_prediction_acts_only_after_act_ticks_consecutive_ticks():
    st = PolicyState()
    d1, st = decide(scores(p=(0.9,)), st, 60.0, CFG, explain)
    d2, st = decide(scores(p=(0.9,)), st, 120.0, CFG, explain)
    assert [x.action for x in d1] == [Action.ALERT]
    assert [(x.action, x.fault, x.ts) for x in d2] == [(Action.DRAIN, FaultClass.NVLINK, 120.0)]


def test_predictions_only_alert_until_the_node_has_been_seen_for_the_warmup():
    cfg = CFG.model_copy(update={"model_warmup_s": 600, "alert_interval_s": 0})

    def two(p, rule=(-1, -1), rule_fault=(None, None), rule_action=(None, None)):
        return scores(p=p, fault=("nvlink", "nvlink"), rule=rule, rule_fault=rule_fault, rule_action=rule_action,
                      anomaly=(0.0, 0.0))

    st = PolicyState()
    d, st = decide(two((0.0, 0.0)), st, 0.0, cfg, explain)                  # n0, n1 first seen at 0
    assert d == []
    for t in (60.0, 120.0, 180.0):                                             # both look sure to fail
        d, st = decide(two((0.95, 0.95)), st, t, cfg, explain)
        assert [x.action for x in d] == [Action.ALERT, Action.ALERT]
        assert all("warming up" in x.reason for x in d)
    d, st = decide(two((0.95, 0.95), rule=(-1, 2), rule_fault=(None, "nvlink"), rule_action=(None, Action.DRAIN)),
                   st, 240.0, cfg, explain)                                    # a rule does not wait
    assert [(x.node, x.action, x.source) for x in d] == [("n0", Action.ALERT, "model"), ("n1", Action.DRAIN, "rule")]
    for t in (600.0, 660.0):                                                   # warm from 600 s on
        d, st = decide(two((0.95, 0.95)), st, t, cfg, explain)
    assert [(x.node, x.action, x.source) for x in d] == [("n0", Action.DRAIN, "model")]
    assert st.first_seen == {"n0": 0.0, "n1": 0.0}


def test_a_dip_below_threshold_restarts_the_count():
    st = PolicyState()
    for t, p in ((60, 0.9), (120, 0.5), (180, 0.9)):
        d, st = decide(scores(p=(p,)), st, float(t), CFG, explain)
        assert all(x.action is not Action.DRAIN for x in d)


def test_hbm_prediction_resets_the_gpu_by_default_and_app_errors_never_act():
    st = PolicyState()
    for t in (60.0, 120.0):
        d, st = decide(scores(p=(0.95,), fault=("hbm_ecc",)), st, t, CFG, explain)
    assert d[0].action is Action.RESET
    cfg = CFG.model_copy(update={"actions": {FaultClass.NVLINK: Action.NONE}})
    st = PolicyState()
    for t in (60.0, 120.0, 180.0):
        d, st = decide(scores(p=(0.95,)), st, t, cfg, explain)
        assert all(x.action in (Action.ALERT,) for x in d)


def test_a_held_node_gets_no_second_action_and_is_resumed_once_healthy():
    st = PolicyState()
    d, st = decide(scores(rule=(0,), rule_fault=("gpu_off_bus",), rule_action=(Action.DRAIN,)), st, 0.0, CFG, explain)
    assert d[0].action is Action.DRAIN
    d, st = decide(scores(rule=(0,), rule_fault=("gpu_off_bus",), rule_action=(Action.DRAIN,)), st, 60.0, CFG, explain)
    assert d == []
    actions = []
    for t in range(120, 1500, 60):
        d, st = decide(scores(p=(0.01,)), st, float(t), CFG, explain)
        actions += [(x.ts, x.action) for x in d]
    assert actions == [(600.0, Action.RESUME)]  # held 600 s; healthy since 120 s (>= 300 s by then)
    assert st.nodes == {}


def test_alerts_are_rate_limited_per_node():
    st = PolicyState()
    out = []
    for t in range(0, 7200, 60):
        d, st = decide(scores(p=(0.4,)), st, float(t), CFG, explain)
        out += d
    assert [x.ts for x in out] == [0.0, 3600.0]


def test_a_strong_anomaly_alerts_but_never_drains():
    st = PolicyState()
    out = []
    for t in range(0, 600, 60):
        d, st = decide(scores(anomaly=(0.99999,)), st, float(t), CFG, explain)
        out += d
    assert [x.action for x in out] == [Action.ALERT] and out[0].source == "anomaly"


def test_rules_only_config_ignores_the_models():
    st = PolicyState()
    cfg = CFG.model_copy(update={"use_model": False})
    for t in (60.0, 120.0, 180.0):
        d, st = decide(scores(p=(0.99,), anomaly=(1.0,)), st, t, cfg, explain)
        assert d == []


def test_decide_does_not_change_the_state_it_was_given():
    st = PolicyState()
    decide(scores(rule=(0,), rule_fault=("pcie",), rule_action=(Action.DRAIN,)), st, 0.0, CFG, explain)
    assert st.nodes == {}


@pytest.mark.parametrize("text, message", [
    ("act_threshold: 2\n", "act_threshold"),
    ("alert_threshold: 0.9\nact_threshold: 0.5\n", "alert_threshold must not exceed act_threshold"),
    ("actions: {nvlink: explode}\n", "actions"),
    ("no_such_knob: 1\n", "no_such_knob"),
    ("- a list\n", "must be a mapping"),
])
def test_invalid_policy_file_fails_naming_the_problem(tmp_path, text, message):
    p = tmp_path / "policy.yaml"
    p.write_text(text)
    with pytest.raises(PolicyConfigError, match=message):
        load_policy_config(p)


def test_policy_file_overrides_defaults(tmp_path):
    p = tmp_path / "policy.yaml"
    p.write_text("policy:\n  act_threshold: 0.9\n  act_threshold_by_fault: {thermal: 0.5}\n")
    cfg = load_policy_config(p)
    assert cfg.threshold_for(FaultClass.THERMAL) == 0.5 and cfg.threshold_for(FaultClass.NVLINK) == 0.9


def test_the_shipped_example_policy_is_valid():
    from pathlib import Path

    cfg = load_policy_config(Path(__file__).resolve().parents[2] / "deploy" / "config" / "policy.example.yaml")
    assert cfg.action_for(FaultClass.APP_ERROR) is Action.NONE and cfg.threshold_for(FaultClass.FAIL_SLOW) == 0.8


def test_a_node_that_came_back_healthy_after_a_predicted_action_only_alerts_on_the_next_prediction():
    cfg = CFG.model_copy(update={"model_retry_window_s": 86400.0, "alert_interval_s": 0.0})
    st, out = PolicyState(), []
    timeline = [0.9, 0.9] + [0.01] * 20 + [0.9] * 5   # act, hold + resume, then predicted again
    for k, p in enumerate(timeline):
        d, st = decide(scores(p=(p,)), st, 60.0 * k, cfg, explain)
        out += [(x.action, x.source) for x in d]
    assert out[0] == (Action.ALERT, "model") and out[1] == (Action.DRAIN, "model")
    assert (Action.RESUME, "policy") in out
    after = out[out.index((Action.RESUME, "policy")) + 1:]
    assert Action.DRAIN not in [a for a, _ in after] and (Action.ALERT, "model") in after


def test_hard_evidence_still_acts_after_a_wrong_prediction():
    st = PolicyState()
    for k, p in enumerate([0.9, 0.9] + [0.01] * 20):
        _, st = decide(scores(p=(p,)), st, 60.0 * k, CFG, explain)
    d, st = decide(scores(rule=(0,), rule_fault=("gpu_off_bus",), rule_action=(Action.DRAIN,)), st, 3000.0, CFG,
                   explain)
    assert [x.action for x in d] == [Action.DRAIN]
