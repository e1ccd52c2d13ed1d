"""The decision policy: rules act at once, predictions drain when sustained and take hard actions only
when corroborated, alerts are merged per episode and rate-limited, held nodes are not acted on twice
and are resumed only when healthy."""

from __future__ import annotations

import numpy as np
import pytest

from collector.schema import NODE_FAULTS, Action, FaultClass, FollowUp, Grade
from models.base import class_index
from models.node_scores import NodeScores
from remediation.config import PolicyConfig, PolicyConfigError, load_policy_config
from remediation.policy import PolicyState, decide


def scores(ts=0.0, p=(0.0,), fault=("nvlink",), rule=(-1,), rule_fault=(None,), rule_action=(None,), anomaly=(0.0,),
           rule_follow_up=None, anomaly_gpu=None):
    n = len(p)
    idx = np.arange(n)
    return NodeScores(
        ts, np.array([f"n{i}" for i in range(n)], object), np.array(p, float),
        np.array([class_index(f) if f else 0 for f in fault], np.int8), idx, idx,
        np.array(rule, int), idx, idx, np.array([class_index(f) if f else 0 for f in rule_fault], np.int8),
        np.array(rule_action, object), np.array(rule_follow_up or [None] * n, object), np.array(anomaly, float), idx,
        None if anomaly_gpu is None else np.array(anomaly_gpu, int))


def explain(i, source):
    return f"{source} says so"


CFG = PolicyConfig(act_threshold=0.7, act_sustain_s=60, alert_threshold=0.3, min_hold_s=600, resume_after_s=300,
                   clear_threshold=0.1, model_warmup_s=0, corroborate_threshold=0.9, corroborate_sustain_s=600,
                   act_sustain_s_by_fault={}, anomaly_sustain_s=0)


def test_a_fired_rule_acts_at_once_with_the_rules_action_and_fault():
    s = scores(rule=(3,), rule_fault=("hbm_ecc",), rule_action=(Action.RESET,))
    d, st = decide(s, PolicyState(), 100.0, CFG, explain)
    assert [(x.action, x.fault, x.source, x.node, x.grade) for x in d] == [
        (Action.RESET, FaultClass.HBM_ECC, "rule", "n0", Grade.CERTAIN)]
    assert st.held() == ["n0"]


def test_a_fired_rule_carries_its_follow_up():
    s = scores(rule=(0,), rule_fault=("gpu_off_bus",), rule_action=(Action.DRAIN,), rule_follow_up=[FollowUp.REBOOT])
    d, _ = decide(s, PolicyState(), 100.0, CFG, explain)
    assert [(x.action, x.follow_up, x.grade) for x in d] == [(Action.DRAIN, FollowUp.REBOOT, Grade.CERTAIN)]


def test_a_prediction_acts_only_after_it_was_sustained_for_act_sustain_s():
    st = PolicyState()
    d1, st = decide(scores(p=(0.9,)), st, 60.0, CFG, explain)
    d2, st = decide(scores(p=(0.9,)), st, 120.0, CFG, explain)
    assert [(x.action, x.grade) for x in d1] == [(Action.ALERT, Grade.ADVISORY)]
    assert [(x.action, x.fault, x.ts, x.grade) for x in d2] == [
        (Action.DRAIN, FaultClass.NVLINK, 120.0, Grade.PREDICTED)]


def test_predictions_only_alert_until_the_node_has_been_seen_for_the_warmup():
    cfg = CFG.model_copy(update={"model_warmup_s": 600})

    def two(p, rule=(-1, -1), rule_fault=(None, None), rule_action=(None, None)):
        return scores(p=p, fault=("nvlink", "nvlink"), rule=rule, rule_fault=rule_fault, rule_action=rule_action,
                      anomaly=(0.0, 0.0))

    st, out = PolicyState(), []
    d, st = decide(two((0.0, 0.0)), st, 0.0, cfg, explain)                  # n0, n1 first seen at 0
    assert d == []
    for t in (60.0, 120.0, 180.0):                                             # both look sure to fail
        d, st = decide(two((0.95, 0.95)), st, t, cfg, explain)
        out += d
    assert [(x.node, x.action, x.ts) for x in out] == [("n0", Action.ALERT, 60.0), ("n1", Action.ALERT, 60.0)]
    assert all("warming up" in x.reason for x in out)
    d, st = decide(two((0.95, 0.95), rule=(-1, 2), rule_fault=(None, "nvlink"), rule_action=(None, Action.DRAIN)),
                   st, 240.0, cfg, explain)                                    # a rule does not wait
    assert [(x.node, x.action, x.source) for x in d] == [("n1", Action.DRAIN, "rule")]
    for t in (300.0, 360.0, 420.0, 480.0, 540.0):                              # still warming up: no action
        d, st = decide(two((0.95, 0.95)), st, t, cfg, explain)
        assert d == []
    d, st = decide(two((0.95, 0.95)), st, 600.0, cfg, explain)                # warm from 600 s on ...
    assert d == []
    d, st = decide(two((0.95, 0.95)), st, 660.0, cfg, explain)                # ... and sustained from there
    assert [(x.node, x.action, x.source, x.ts) for x in d] == [("n0", Action.DRAIN, "model", 660.0)]
    assert st.first_seen == {"n0": 0.0, "n1": 0.0}


def test_a_dip_below_threshold_restarts_the_count():
    st = PolicyState()
    for t, p in ((60, 0.9), (120, 0.5), (180, 0.9)):
        d, st = decide(scores(p=(p,)), st, float(t), CFG, explain)
        assert all(x.action is not Action.DRAIN for x in d)


def test_an_hbm_prediction_alone_drains_and_app_errors_never_act():
    st = PolicyState()
    for t in (60.0, 120.0):
        d, st = decide(scores(p=(0.8,), fault=("hbm_ecc",)), st, t, CFG, explain)
    assert [(x.action, x.grade, x.follow_up) for x in d] == [(Action.DRAIN, Grade.PREDICTED, None)]
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


def _resumes_of_a_held_node(cfg: PolicyConfig, rule: int, fault: str, at_hold: dict | None = None, **present) -> list:
    """A node drained by *rule* (of *fault*; NodeScores fields *at_hold* then), then healthy (p 0.01) for 40 minutes
    with the NodeScores fields *present* (name: value while it lasts, value otherwise) set for its first 20: the
    resumes."""
    from dataclasses import replace

    st = PolicyState()
    held = replace(scores(rule=(rule,), rule_fault=(fault,), rule_action=(Action.DRAIN,)),
                   **{k: np.array([v]) for k, v in (at_hold or {}).items()})
    d, st = decide(held, st, 0.0, cfg, explain)
    assert d[0].action is Action.DRAIN
    actions = []
    for t in range(60, 2400, 60):
        s = replace(scores(p=(0.01,)), **{k: np.array([v[0] if t < 1200 else v[1]]) for k, v in present.items()})
        d, st = decide(s, st, float(t), cfg, explain)
        actions += [(x.ts, x.action) for x in d]
    return actions


@pytest.mark.parametrize("keeps", [False, True])
def test_a_held_node_whose_rule_is_only_vetoed_stays_held_when_configured(keeps):
    """The rule that drained the node still holds on it but a veto (a shared cause) stops it: with
    vetoed_rule_keeps_hold that is evidence still present, and the node is resumed only once it is gone."""
    cfg = CFG.model_copy(update={"vetoed_rule_keeps_hold": keeps})
    actions = _resumes_of_a_held_node(cfg, 4, "power", rule_vetoed=(True, False))  # the brake ends after 20 min
    assert actions == ([(1500.0, Action.RESUME)] if keeps else [(600.0, Action.RESUME)])


@pytest.mark.parametrize("needs_every_gpu", [False, True])
@pytest.mark.parametrize("scorer", ["saw it go", "restarted since"])
def test_a_held_node_with_a_lost_gpu_is_not_resumed_until_it_reads_again(needs_every_gpu, scorer):
    """Drained on XID 79, the GPUs still reporting read healthy while the lost one is gone for 20 minutes: with
    resume_needs_every_gpu the node is resumed only once it reads again and has stayed healthy resume_after_s. The
    scorer that saw the GPU go says so (gpus_lost); one that restarted since never saw it, and the node reads fewer
    GPUs than when it was taken out."""
    cfg = CFG.model_copy(update={"resume_needs_every_gpu": needs_every_gpu})
    if scorer == "saw it go":
        actions = _resumes_of_a_held_node(cfg, 0, "gpu_off_bus", gpus_lost=(1, 0))
    else:
        actions = _resumes_of_a_held_node(cfg, 0, "gpu_off_bus", {"gpus_reading": 8}, gpus_lost=(0, 0),
                                          gpus_reading=(7, 8))
    assert actions == ([(1500.0, Action.RESUME)] if needs_every_gpu else [(600.0, Action.RESUME)])


def test_a_prediction_that_stays_above_the_alert_level_alerts_once():
    st = PolicyState()
    out = []
    for t in range(0, 7200, 60):
        d, st = decide(scores(p=(0.4,)), st, float(t), CFG, explain)
        out += d
    assert [(x.ts, x.action, x.grade) for x in out] == [(0.0, Action.ALERT, Grade.ADVISORY)]


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
    ("corroborate_threshold: 0.6\n", "corroborate_threshold must not be below act_threshold"),
    ("follow_ups: {hbm_ecc: reboot_twice}\n", "follow_ups"),
    ("actions: {nvlink: explode}\n", "actions"),
    ("no_such_knob: 1\n", "no_such_knob"),
    ("- a list\n", "must be a mapping"),
])
def test_invalid_policy_file_fails_naming_the_problem(tmp_path, text, message):
    p = tmp_path / "policy.yaml"
    p.write_text(text)
    with pytest.raises(PolicyConfigError, match=message):
        load_policy_config(p)


def test_a_policy_with_overrides_merges_mappings_key_by_key_and_names_every_problem():
    from remediation.config import policy_with

    base = PolicyConfig(actions={"pcie": "alert"})
    p = policy_with(base, {"actions": {"hbm_ecc": "alert"}, "act_threshold": 0.8})
    assert p.action_for(FaultClass.HBM_ECC) is Action.ALERT and p.action_for(FaultClass.PCIE) is Action.ALERT
    assert p.act_threshold == 0.8 and base.act_threshold != 0.8
    with pytest.raises(PolicyConfigError, match=r"^alt: act_threshold: .*; no_such: Extra inputs"):
        policy_with(base, {"act_threshold": 2, "no_such": 1}, "alt")


def test_a_compared_policy_file_applies_over_the_policy_it_is_compared_with_as_the_service_applies_it(tmp_path):
    """``gpuops replay --compare-policy`` reads a file as ``--remote`` and shadow policies do: its settings over
    the policy it is compared with, mappings merged key by key, so naming one class's sustain keeps the
    others' (a file read from the defaults would have dropped HBM's 900 s and made the comparison wrong)."""
    from remediation.config import load_policy_files, load_policy_overrides, policy_with

    alt = tmp_path / "ib-300.yaml"
    alt.write_text("policy:\n  act_sustain_s_by_fault:\n    ib_link: 300\n")
    base = PolicyConfig(act_threshold=0.8)
    got = load_policy_files([alt], base)["ib-300"]
    assert got.sustain_for(FaultClass.IB_LINK) == 300.0 and got.sustain_for(FaultClass.HBM_ECC) == 900.0
    assert got.sustain_for(FaultClass.POWER) == 420.0 and got.act_threshold == 0.8
    assert got == policy_with(base, load_policy_overrides([alt])["ib-300"])    # what the service would run
    assert load_policy_files([alt])["ib-300"].act_threshold == PolicyConfig().act_threshold   # no base: defaults
    none = tmp_path / "no-sustains.yaml"
    none.write_text("policy:\n  act_sustain_s_by_fault: {}\n")                       # an empty mapping clears it
    assert load_policy_files([none], base)["no-sustains"].sustain_for(FaultClass.HBM_ECC) == base.act_sustain_s
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy:\n  act_threshold: 2\n")
    with pytest.raises(PolicyConfigError, match="bad.yaml: act_threshold"):
        load_policy_files([bad], base)


def test_policy_file_overrides_defaults(tmp_path):
    p = tmp_path / "policy.yaml"
    p.write_text("policy:\n  act_threshold: 0.9\n  act_threshold_by_fault: {thermal: 0.5}\n")
    cfg = load_policy_config(p)
    assert cfg.threshold_for(FaultClass.THERMAL) == 0.5 and cfg.threshold_for(FaultClass.NVLINK) == 0.9


def test_a_mapping_in_a_policy_file_is_merged_over_the_defaults_key_by_key_and_an_empty_one_clears_it(tmp_path):
    p = tmp_path / "policy.yaml"
    p.write_text("policy:\n  act_sustain_s_by_fault: {ib_link: 300}\n")
    cfg = load_policy_config(p)
    assert cfg.sustain_for(FaultClass.IB_LINK) == 300.0
    assert cfg.sustain_for(FaultClass.HBM_ECC) == 900.0 and cfg.sustain_for(FaultClass.POWER) == 420.0
    p.write_text("policy:\n  act_sustain_s_by_fault: {}\n  follow_ups: {}\n")
    cfg = load_policy_config(p)
    assert cfg.sustain_for(FaultClass.HBM_ECC) == cfg.act_sustain_s and cfg.follow_up_for(FaultClass.HBM_ECC) is None


def test_the_shipped_example_policy_is_valid():
    from pathlib import Path

    cfg = load_policy_config(Path(__file__).resolve().parents[2] / "deploy" / "config" / "policy.example.yaml")
    assert cfg.action_for(FaultClass.APP_ERROR) is Action.NONE and cfg.threshold_for(FaultClass.FAIL_SLOW) == 0.8


def test_a_node_that_came_back_healthy_after_a_predicted_action_only_alerts_on_the_next_prediction():
    cfg = CFG.model_copy(update={"model_retry_window_s": 86400.0})
    st, out = PolicyState(), []
    timeline = [0.9, 0.9] + [0.01] * 20 + [0.9] * 5   # act, hold + resume, then predicted again
    for k, p in enumerate(timeline):
        d, st = decide(scores(p=(p,)), st, 60.0 * k, cfg, explain)
        out += [(x.action, x.source) for x in d]
    assert out[0] == (Action.ALERT, "model") and out[1] == (Action.DRAIN, "model")
    assert (Action.RESUME, "policy") in out
    after = out[out.index((Action.RESUME, "policy")) + 1:]
    assert Action.DRAIN not in [a for a, _ in after] and (Action.ALERT, "model") in after


@pytest.mark.parametrize("per_fault", [False, True])
def test_the_retry_cap_can_hold_back_only_the_fault_class_that_was_wrong(per_fault):
    cfg = CFG.model_copy(update={"model_retry_window_s": 86400.0, "model_retry_per_fault": per_fault})
    st, out = PolicyState(), []
    timeline = [(0.9, "hbm_ecc")] * 2 + [(0.01, "hbm_ecc")] * 20 + [(0.9, "ib_link")] * 3 + [(0.9, "hbm_ecc")] * 3
    for k, (p, fault) in enumerate(timeline):
        d, st = decide(scores(p=(p,), fault=(fault,)), st, 60.0 * k, cfg, explain)
        out += [(x.action, x.fault) for x in d]
    assert out[1] == (Action.DRAIN, FaultClass.HBM_ECC) and (Action.RESUME, None) in out   # wrong: resumed healthy
    after = out[out.index((Action.RESUME, None)) + 1:]
    # another class's prediction acts only when the cap is per class; then the node is held, so nothing more
    assert ((Action.DRAIN, FaultClass.IB_LINK) in after) is per_fault
    assert (Action.ALERT, FaultClass.IB_LINK) in after   # per class: its first tick, before its sustain; else all
    assert (Action.DRAIN, FaultClass.HBM_ECC) not in after


def test_the_retry_cap_per_class_still_holds_back_the_class_that_was_wrong():
    cfg = CFG.model_copy(update={"model_retry_window_s": 86400.0, "model_retry_per_fault": True})
    st, out = PolicyState(), []
    for k, p in enumerate([0.9, 0.9] + [0.01] * 20 + [0.9] * 5):
        d, st = decide(scores(p=(p,), fault=("hbm_ecc",)), st, 60.0 * k, cfg, explain)
        out += [x.action for x in d]
    after = out[out.index(Action.RESUME) + 1:]
    assert Action.DRAIN not in after and Action.ALERT in after


def test_an_alert_held_back_by_the_retry_cap_names_the_prediction_that_was_wrong_and_when():
    cfg = CFG.model_copy(update={"model_retry_window_s": 86400.0, "model_retry_per_fault": True})
    st, out = PolicyState(), []
    for k, p in enumerate([0.9, 0.9] + [0.01] * 20 + [0.9] * 5):
        d, st = decide(scores(p=(p,), fault=("hbm_ecc",)), st, 60.0 * k, cfg, explain)
        out += d
    capped = [x.reason for x in out if x.action is Action.ALERT and x.ts > 60.0 * 21]
    assert capped and all("on a prediction of hbm_ecc 21 min ago that did not come true" in r
                          and "until 24 h after it" in r for r in capped)


def test_hard_evidence_still_acts_after_a_wrong_prediction():
    st = PolicyState()
    for k, p in enumerate([0.9, 0.9] + [0.01] * 20):
        _, st = decide(scores(p=(p,)), st, 60.0 * k, CFG, explain)
    d, st = decide(scores(rule=(0,), rule_fault=("gpu_off_bus",), rule_action=(Action.DRAIN,)), st, 3000.0, CFG,
                   explain)
    assert [x.action for x in d] == [Action.DRAIN]


# ---------------------------------------------------------------- graded actions by evidence


def run(timeline, cfg=CFG, start=0.0, step=60.0, **kw):
    """Decide a timeline of per-tick scores() keyword dicts (or p values); all decisions, in order."""
    st, out = PolicyState(), []
    for k, x in enumerate(timeline):
        d, st = decide(scores(**(x if isinstance(x, dict) else {"p": (x,), **kw})), st, start + step * k, cfg, explain)
        out += d
    return out, st


@pytest.mark.parametrize("fault", [f for f in FaultClass if f is not FaultClass.APP_ERROR])
@pytest.mark.parametrize("configured", [Action.DRAIN, Action.RESET, Action.REQUEUE])
def test_a_prediction_alone_drains_and_never_resets_or_requeues_for_every_fault_class(fault, configured):
    cfg = CFG.model_copy(update={"actions": {fault: configured}, "corroborate_threshold": 0.99})
    out, st = run([0.95] * 30, cfg, fault=(fault.value,))
    acted = [(x.action, x.grade, x.follow_up, x.fault) for x in out if x.action is not Action.ALERT]
    assert acted == [(Action.DRAIN, Grade.PREDICTED, None, fault)]
    assert st.held() == ["n0"]


def test_every_node_fault_class_has_a_default_that_a_prediction_alone_turns_into_a_drain():
    for fault in NODE_FAULTS:
        out, _ = run([0.8] * 3, fault=(fault.value,))
        assert [x.action for x in out if x.source == "model" and x.action is not Action.ALERT] == [Action.DRAIN]


def test_a_reset_on_a_prediction_needs_a_sustained_rise_and_is_graded_corroborated():
    cfg = CFG.model_copy(update={"actions": {FaultClass.HBM_ECC: Action.RESET}})
    out, _ = run([0.8] * 3 + [0.95] * 12, cfg, fault=("hbm_ecc",))
    acted = [(x.ts, x.action, x.grade) for x in out if x.action is not Action.ALERT]
    # drains on the prediction at 60 s; p >= 0.9 from 180 s, for 600 s: escalates to the reset at 780 s
    assert acted == [(60.0, Action.DRAIN, Grade.PREDICTED), (780.0, Action.RESET, Grade.CORROBORATED)]
    assert "corroborated: p >= 0.90 for 10 min" in out[-1].reason


#: one tick of a predicted off-bus failure arriving: the XID 79 rule fires, the prediction still high
OFF_BUS_XID = {"p": (0.95,), "fault": ("gpu_off_bus",), "rule": (0,), "rule_fault": ("gpu_off_bus",),
               "rule_action": (Action.DRAIN,)}


def test_a_node_held_on_a_prediction_takes_the_rules_remedy_once_when_its_failure_comes():
    """Drained on a prediction, then the fatal XID: the catalogue's follow-up (here a reboot) is issued
    at once, CERTAIN, and the hold is never escalated again by the still-high prediction."""
    fatal = {**OFF_BUS_XID, "rule_follow_up": [FollowUp.REBOOT]}
    out, st = run([{"p": (0.8,), "fault": ("gpu_off_bus",)}] * 3 + [fatal] * 20)
    acted = [(x.ts, x.action, x.grade, x.follow_up, x.source) for x in out if x.action is not Action.ALERT]
    assert acted == [(60.0, Action.DRAIN, Grade.PREDICTED, None, "model"),
                     (180.0, Action.DRAIN, Grade.CERTAIN, FollowUp.REBOOT, "rule")]
    assert st.nodes["n0"].held_grade is Grade.CERTAIN


def test_a_prediction_that_came_true_does_not_cap_the_nodes_next_one():
    """The retry cap is for predictions that were wrong. One whose failure came while the node was held
    was right: after the node is resumed, its next sustained prediction drains again."""
    healthy = {"p": (0.01,), "fault": ("gpu_off_bus",)}
    off_bus = {"p": (0.8,), "fault": ("gpu_off_bus",)}
    # the next prediction is of the same class, which the cap holds back (model_retry_per_fault) had it been wrong
    timeline = [off_bus] * 3 + [OFF_BUS_XID] * 3 + [healthy] * 30 + [off_bus] * 3
    acted = [(x.action, x.source, x.fault) for x in run(timeline)[0] if x.action is not Action.ALERT]
    assert acted == [(Action.DRAIN, "model", FaultClass.GPU_OFF_BUS), (Action.DRAIN, "rule", FaultClass.GPU_OFF_BUS),
                     (Action.RESUME, "policy", None), (Action.DRAIN, "model", FaultClass.GPU_OFF_BUS)]
    # no failure came: the next prediction of the class that was wrong only alerts (another class's would act:
    # test_the_retry_cap_can_hold_back_only_the_fault_class_that_was_wrong)
    wrong = [off_bus] * 3 + [healthy] * 33 + [off_bus] * 3
    assert [x.action for x in run(wrong)[0] if x.action is not Action.ALERT] == [Action.DRAIN, Action.RESUME]


def test_a_prediction_with_the_anomaly_detector_agreeing_takes_the_hard_action_at_once():
    cfg = CFG.model_copy(update={"actions": {FaultClass.HBM_ECC: Action.RESET}})
    out, _ = run([{"p": (0.8,), "fault": ("hbm_ecc",), "anomaly": (0.9995,)}] * 2, cfg)
    assert [(x.action, x.grade) for x in out if x.action is not Action.ALERT] == [(Action.RESET, Grade.CORROBORATED)]
    assert "anomaly detector agrees" in out[-1].reason


def test_an_hbm_prediction_corroborated_drains_and_resets_when_idle_by_default():
    out, _ = run([{"p": (0.8,), "fault": ("hbm_ecc",), "anomaly": (0.9995,)}] * 2)
    assert [(x.action, x.grade, x.follow_up) for x in out if x.action is not Action.ALERT] == [
        (Action.DRAIN, Grade.CORROBORATED, FollowUp.RESET_WHEN_IDLE)]
    out, _ = run([{"p": (0.8,), "fault": ("hbm_ecc",), "anomaly": (0.9995,)}] * 2,
                 CFG.model_copy(update={"follow_ups": {}}))                 # a site that resets by hand
    assert [(x.action, x.follow_up) for x in out if x.action is not Action.ALERT] == [(Action.DRAIN, None)]


def test_a_lower_severity_rule_of_the_same_fault_corroborates_and_one_of_another_fault_does_not():
    cfg = CFG.model_copy(update={"actions": {FaultClass.HBM_ECC: Action.RESET}})
    for rule_fault, expected in (("hbm_ecc", Grade.CORROBORATED), ("nvlink", Grade.PREDICTED)):
        warn = {"rule": (7,), "rule_fault": (rule_fault,), "rule_action": (Action.ALERT,), "p": (0.2,),
                "fault": ("hbm_ecc",)}
        out, st = run([warn] + [{"p": (0.8,), "fault": ("hbm_ecc",)}] * 2, cfg)
        assert [x.grade for x in out if x.action not in (Action.ALERT,)] == [expected]
        assert out[0].action is Action.ALERT and out[0].source == "rule"   # the rule itself only tells a person


def test_a_rule_whose_action_is_an_alert_tells_a_person_and_does_not_hold_the_node():
    out, st = run([{"rule": (7,), "rule_fault": ("hbm_ecc",), "rule_action": (Action.ALERT,)}] * 30)
    assert [(x.action, x.source, x.grade) for x in out] == [(Action.ALERT, "rule", Grade.ADVISORY)]
    assert st.held() == []


@pytest.mark.parametrize("step", [30.0, 60.0, 120.0])
def test_the_sustain_is_measured_in_telemetry_time_whatever_the_tick_spacing(step):
    cfg = CFG.model_copy(update={"act_sustain_s": 240.0})
    n = int(600 / step)
    out, _ = run([0.0] + [0.8] * n, cfg, start=-step, step=step)   # first above the threshold at t = 0
    assert [x.ts for x in out if x.action is Action.DRAIN] == [240.0]


@pytest.mark.parametrize("step", [30.0, 120.0])
def test_the_corroboration_sustain_is_measured_in_telemetry_time_too(step):
    cfg = CFG.model_copy(update={"actions": {FaultClass.HBM_ECC: Action.RESET}, "act_sustain_s": 0.0})
    out, _ = run([0.95] * int(1200 / step), cfg, step=step, fault=("hbm_ecc",))
    assert [(x.ts, x.action) for x in out] == [(0.0, Action.DRAIN), (600.0, Action.RESET)]


def test_resumes_and_alerts_are_advisory():
    out, _ = run([{"rule": (0,), "rule_fault": ("pcie",), "rule_action": (Action.DRAIN,)}] + [0.01] * 20 + [0.4])
    assert [(x.action, x.grade) for x in out] == [(Action.DRAIN, Grade.CERTAIN), (Action.RESUME, Grade.ADVISORY),
                                                  (Action.ALERT, Grade.ADVISORY)]


# ---------------------------------------------------------------- alerts people can read


def test_a_five_hour_anomaly_is_one_alert_and_a_new_one_comes_after_the_episode_ends_and_the_gap():
    cfg = CFG.model_copy(update={"anomaly_episode_gap_s": 1800.0})
    on, off = {"anomaly": (0.99999,), "anomaly_gpu": (3,)}, {"anomaly": (0.0,)}
    timeline = [on] * 300 + [off] * 20 + [on] * 10 + [off] * 31 + [on] * 5   # 5 h; 20 min off; 31 min off
    out, _ = run(timeline, cfg)
    assert [(x.ts, x.gpu, x.source) for x in out] == [(0.0, 3, "anomaly"), (60.0 * 361, 3, "anomaly")]


def test_a_gpu_that_stays_unlike_its_peers_all_day_is_one_anomaly_alert_a_day():
    on, off = {"anomaly": (0.99999,), "anomaly_gpu": (2,)}, {"anomaly": (0.0,)}
    day = ([on] * 10 + [off] * 120) * 11          # strange 10 min every 2 h 10 min, for a day
    out, _ = run(day + [off] * 1330 + [on] * 10)  # ... and again over 24 h after it was last strange
    assert [(x.ts, x.gpu) for x in out] == [(0.0, 2), (60.0 * (len(day) + 1330), 2)]
    p_first = [{"p": (0.5,), "fault": ("thermal",)}] * 3 + [{"p": (0.0,)}] * 70 + [{"p": (0.5,), "fault": ("thermal",)}]
    assert len(run(p_first)[0]) == 2              # a prediction's episode still ends after alert_episode_gap_s


def test_anomaly_episodes_are_per_gpu():
    cfg = CFG.model_copy(update={"node_alerts_per_h": 3})
    out, _ = run([{"anomaly": (0.99999,), "anomaly_gpu": (g,)} for g in (1, 1, 2, 2, 1)], cfg)
    assert [(x.ts, x.gpu, x.source) for x in out] == [(0.0, 1, "anomaly"), (120.0, 2, "anomaly")]


def test_a_prediction_is_one_episode_per_node_and_fault_and_an_anomaly_beside_it_joins_its_story():
    cfg = CFG.model_copy(update={"node_alerts_per_h": 3, "act_threshold": 0.95, "corroborate_threshold": 0.95})
    timeline = [{"p": (0.5,), "fault": ("ib_link",), "anomaly": (0.99999,), "anomaly_gpu": (g,)} for g in (1, 4, 6)]
    timeline += [{"p": (0.5,), "fault": ("thermal",)}]
    out, _ = run(timeline, cfg)
    assert [(x.ts, x.source, x.fault) for x in out] == [(0.0, "model", FaultClass.IB_LINK),
                                                        (180.0, "model", FaultClass.THERMAL)]


def test_the_node_rate_limit_holds_under_a_burst_and_sends_the_rest_later_while_still_true():
    cfg = CFG.model_copy(update={"node_alerts_per_h": 2})
    burst = [{"anomaly": (0.99999,), "anomaly_gpu": (g,)} for g in range(8)]       # 8 parts in 8 minutes
    out, _ = run(burst + [{"anomaly": (0.99999,), "anomaly_gpu": (7,)}] * 60, cfg)
    assert [(x.ts, x.gpu) for x in out] == [(0.0, 0), (60.0, 1), (3600.0, 7)]


def test_the_fleet_rate_limit_holds_under_a_burst():
    cfg = CFG.model_copy(update={"fleet_alerts_per_h": 5, "fleet_calibration": False})  # all 40 alike: no outlier
    n = 40
    st, out = PolicyState(), []
    for k in range(70):
        d, st = decide(scores(p=(0.0,) * n, fault=("nvlink",) * n, rule=(-1,) * n, rule_fault=(None,) * n,
                              rule_action=(None,) * n, anomaly=(0.99999,) * n), st, 60.0 * k, cfg, explain)
        out += d
    assert len([x for x in out if x.ts < 3600]) == 5
    assert len([x for x in out if 3600 <= x.ts < 7200]) == 5


def test_every_policy_setting_documents_its_default():
    for name, f in PolicyConfig.model_fields.items():
        assert f.description and len(f.description) > 20, name


def test_a_prediction_must_outlast_the_healthy_look_alike_of_its_class():
    cfg = CFG.model_copy(update={"act_sustain_s_by_fault": {FaultClass.HBM_ECC: 600.0}})
    st, acted = PolicyState(), {}
    for fault in ("hbm_ecc", "nvlink"):
        st = PolicyState()
        for t in range(0, 900, 60):
            d, st = decide(scores(p=(0.95,), fault=(fault,)), st, float(t), cfg, explain)
            if any(x.action is Action.DRAIN for x in d):
                acted[fault] = t
                break
    assert acted == {"nvlink": 60, "hbm_ecc": 600}


def test_an_anomaly_alerts_only_once_it_has_lasted_and_a_stale_run_does_not_count():
    cfg = CFG.model_copy(update={"anomaly_sustain_s": 300.0})
    st, first = PolicyState(), None
    for t in range(0, 600, 60):
        d, st = decide(scores(anomaly=(0.99999,)), st, float(t), cfg, explain)
        if d and first is None:
            first = t
    assert first == 300
    st = PolicyState()
    _, st = decide(scores(anomaly=(0.99999,)), st, 0.0, cfg, explain)        # strange once ...
    d, st = decide(scores(anomaly=(0.99999,)), st, 3600.0, cfg, explain)     # ... and again an hour later
    assert d == []
