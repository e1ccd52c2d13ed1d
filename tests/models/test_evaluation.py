"""Scoring a replay by spec/recording.md: catch windows, recall, false actions, cost."""

from __future__ import annotations

import json

import pytest

from collector.schema import NODE_FAULTS
from models.evaluation import EvalSettings, compare, score_replay

ONSET, FAILURE = 10_000.0, 20_000.0


def inc(id="i1", node="n1", fault="hbm_ecc", onset=ONSET, failure=FAILURE, predictable=True, gpu=0):
    return {"id": id, "node": node, "gpu": gpu, "fault": fault, "onset_ts": onset,
            "failure_ts": failure, "predictable": predictable, "action": "reset", "note": ""}


def dec(ts, node="n1", action="drain", fault="hbm_ecc"):
    return {"ts": ts, "node": node, "gpu": 0, "action": action, "fault": fault, "score": 0.9, "reason": "r"}


def score(decisions, incidents, node_days=100.0, gpus_per_node=8, **kw):
    return score_replay(decisions, incidents, node_days=node_days, gpus_per_node=gpus_per_node, **kw)


# ---------------------------------------------------------------- catch window


@pytest.mark.parametrize("t, caught", [
    (FAILURE + 300, True), (FAILURE + 300.001, False),
    (ONSET - 3600, True), (ONSET - 3600.001, False),
    (FAILURE - 1, True),
])
def test_a_drain_catches_only_inside_the_window_bounds_included(t, caught):
    m = score([dec(t)], [inc()])
    assert m["per_incident"][0]["caught"] is caught
    assert m["false_actions"] == (0 if caught else 1)


def test_without_onset_the_window_opens_an_hour_before_the_failure():
    i = inc(onset=None, predictable=False)
    assert score([dec(FAILURE - 3600)], [i])["caught"] == 1
    assert score([dec(FAILURE - 3601)], [i])["caught"] == 0


def test_a_decision_on_another_node_does_not_catch():
    m = score([dec(FAILURE - 10, node="n2")], [inc()])
    assert m["caught"] == 0 and m["false_actions"] == 1


def test_reset_catches_like_drain():
    assert score([dec(FAILURE - 100, action="reset")], [inc()])["caught"] == 1


@pytest.mark.parametrize("action", ["requeue", "alert", "none"])
def test_requeue_alert_and_none_never_catch_and_are_never_false(action):
    m = score([dec(FAILURE - 100, action=action)], [inc()])
    assert m["caught"] == 0 and m["false_actions"] == 0 and m["disruptive_decisions"] == 0


def test_an_unknown_action_is_refused():
    with pytest.raises(ValueError, match="unknown action"):
        score([dec(FAILURE, action="reboot-everything")], [inc()])


# ---------------------------------------------------------------- earliest counts once


def test_the_earliest_of_several_catching_decisions_counts_once_and_gives_the_lead():
    decisions = [dec(FAILURE - 100), dec(FAILURE - 2000), dec(FAILURE + 200, action="reset")]
    m = score(decisions, [inc()])
    row = m["per_incident"][0]
    assert m["caught"] == 1 and m["false_actions"] == 0
    assert row["lead_s"] == 2000.0 and row["decision"] == 1
    assert m["median_lead_s"] == 2000.0


def test_a_reactive_catch_has_a_negative_lead():
    m = score([dec(FAILURE + 120)], [inc()])
    assert m["per_incident"][0]["lead_s"] == -120.0 and m["caught_predictively"] == 0


# ---------------------------------------------------------------- app errors


def test_app_error_incidents_are_never_caught_and_drains_on_them_are_false():
    m = score([dec(FAILURE - 100, fault="hbm_ecc")], [inc(fault="app_error", predictable=False)])
    assert m["caught"] == 0 and m["recall"] is None
    assert m["node_fault_incidents"] == 0 and m["app_error_incidents"] == 1
    assert m["false_actions"] == 1 and m["actions_on_app_errors"] == 1
    assert m["per_incident"][0]["caught"] is False


def test_a_drain_that_catches_a_real_fault_is_not_an_action_on_an_app_error():
    incidents = [inc("hw"), inc("app", fault="app_error")]
    m = score([dec(FAILURE - 100)], incidents)
    assert m["caught"] == 1 and m["false_actions"] == 0 and m["actions_on_app_errors"] == 0


# ---------------------------------------------------------------- recall


def test_predictive_recall_counts_only_predictable_incidents_caught_a_minute_ahead():
    incidents = [inc("p-early", node="a"), inc("p-late", node="b"), inc("p-missed", node="c"),
                 inc("u-early", node="d", onset=None, predictable=False)]
    decisions = [dec(FAILURE - 60, node="a"), dec(FAILURE - 59, node="b"), dec(FAILURE - 600, node="d")]
    m = score(decisions, incidents)
    assert m["predictable"] == 3 and m["caught_predictively"] == 1
    assert m["predictive_recall"] == pytest.approx(1 / 3)
    assert m["recall"] == pytest.approx(3 / 4)
    assert m["caught_early_unpredictable"] == 1


def test_per_class_numbers_add_up_to_the_totals():
    faults = [f.value for f in NODE_FAULTS]
    incidents = [inc(f"i{k}", node=f"n{k}", fault=faults[k % len(faults)], predictable=k % 3 != 0)
                 for k in range(20)] + [inc("app", node="n0", fault="app_error")]
    decisions = [dec(FAILURE - 30 * k, node=f"n{k}", fault=faults[k % len(faults)]) for k in range(0, 20, 2)]
    decisions += [dec(5.0, node="n99", fault="nvlink"), dec(6.0, node="n98", fault=None),
                  dec(7.0, node="n97", fault="anomaly")]
    m = score(decisions, incidents)
    for key in ("incidents", "caught", "predictable", "caught_predictively"):
        total = m["node_fault_incidents"] if key == "incidents" else m[key]
        assert sum(c[key] for c in m["per_class"].values()) == total, key
    assert sum(m["false_actions_by_fault"].values()) == m["false_actions"] == 3
    assert m["false_actions_by_fault"] == {"anomaly": 1, "nvlink": 1, "unknown": 1}
    assert m["per_class"]["nvlink"]["false_actions"] == 1


def test_false_actions_are_counted_per_thousand_node_days():
    decisions = [dec(float(k), node="idle") for k in range(6)]
    m = score(decisions, [], node_days=250.0)
    assert m["false_actions"] == 6
    assert m["false_actions_per_1k_node_days"] == pytest.approx(24.0)


def test_undefined_ratios_are_none_and_the_result_is_json():
    m = score([], [], node_days=0.0)
    for key in ("recall", "predictive_recall", "median_lead_s", "p10_lead_s", "p90_lead_s",
                "false_actions_per_1k_node_days"):
        assert m[key] is None, key
    assert m["per_class"]["hbm_ecc"]["recall"] is None
    json.loads(json.dumps(m, allow_nan=False))


def test_lead_percentiles_cover_the_caught_incidents():
    incidents = [inc(f"i{k}", node=f"n{k}") for k in range(11)]
    decisions = [dec(FAILURE - 100 * k, node=f"n{k}") for k in range(11)]
    m = score(decisions, incidents)
    assert (m["p10_lead_s"], m["median_lead_s"], m["p90_lead_s"]) == (100.0, 500.0, 900.0)


# ---------------------------------------------------------------- cost


def test_cost_counts_idle_capacity_against_work_saved():
    s = EvalSettings(false_drain_hold_h=2.0, reset_cost_gpu_h=1.5, checkpoint_interval_h=0.5, restart_h=0.25)
    incidents = [inc("early", node="a"), inc("reactive", node="b")]
    decisions = [dec(FAILURE - 1800, node="a"),                 # 0.5 h ahead: 8 * 0.5 = 4 GPU-h idle
                 dec(FAILURE + 100, node="b"),                  # reactive: no idle, nothing saved
                 dec(100.0, node="c"),                          # false drain: 8 * 2 = 16 GPU-h
                 dec(200.0, node="d", action="reset")]          # false reset: 1.5 GPU-h
    m = score(decisions, incidents, gpus_per_node=8, settings=s)
    assert m["cost_breakdown"]["idle_before_failure_gpu_h"] == pytest.approx(4.0)
    assert m["cost_breakdown"]["false_drain_gpu_h"] == pytest.approx(16.0)
    assert m["cost_breakdown"]["reset_gpu_h"] == pytest.approx(1.5)
    assert m["idle_gpu_h"] == pytest.approx(21.5)
    assert m["saved_gpu_h"] == pytest.approx(8 * (0.25 + 0.25))   # one predictive catch
    assert m["net_gpu_h"] == pytest.approx(4.0 - 21.5)


# ---------------------------------------------------------------- compare


def test_compare_gives_model_minus_baseline_and_the_incidents_only_one_caught():
    incidents = [inc("a", node="a"), inc("b", node="b")]
    model = score([dec(FAILURE - 600, node="a")], incidents)
    base = score([dec(FAILURE + 10, node="b"), dec(1.0, node="z")], incidents)
    c = compare(model, base)
    assert c["headline"]["recall"]["delta"] == 0.0
    assert c["headline"]["predictive_recall"]["delta"] == pytest.approx(0.5)
    assert c["headline"]["false_actions_per_1k_node_days"]["delta"] == pytest.approx(-10.0)
    assert c["headline"]["false_actions_per_1k_node_days"]["better"] == "lower"
    assert c["per_class"]["nvlink"]["recall"]["delta"] is None
    assert (c["caught_only_by_model"], c["caught_only_by_baseline"]) == (["a"], ["b"])
    json.loads(json.dumps(c, allow_nan=False))


# ---------------------------------------------------------------- grades, follow-ups and alerts


def test_the_report_counts_decisions_per_grade_and_follow_up():
    decs = [dec(ONSET, action="drain") | {"grade": "predicted"},
            dec(ONSET + 600, action="reset") | {"grade": "corroborated"},
            dec(ONSET + 900, node="n2", action="drain") | {"grade": "corroborated", "follow_up": "reset_when_idle"},
            dec(ONSET + 5, node="n3", action="drain") | {"grade": "certain", "follow_up": "reboot"},
            dec(ONSET - 60, action="alert") | {"grade": "advisory"},
            dec(FAILURE + 9000, action="resume") | {"grade": "advisory"},
            dec(ONSET, node="n9", action="alert")]            # a report from before grades
    m = score(decs, [inc()])
    assert m["actions_by_grade"] == {"advisory": {"alert": 1, "resume": 1}, "certain": {"drain": 1},
                                     "corroborated": {"drain": 1, "reset": 1}, "predicted": {"drain": 1},
                                     "unknown": {"alert": 1}}
    assert m["actions_by_follow_up"] == {"reboot": 1, "reset_when_idle": 1}
    json.dumps(m)


def test_alerts_are_counted_per_1000_node_days_beside_false_actions():
    decs = [dec(ONSET + 60 * k, node=f"n{k}", action="alert") for k in range(5)] + [dec(ONSET - 99_999, node="n7")]
    m = score(decs, [inc()], node_days=250.0)
    assert m["alerts"] == 5 and m["alerts_per_1k_node_days"] == pytest.approx(20.0)
    assert m["false_actions_per_1k_node_days"] == pytest.approx(4.0)
    assert score([], [inc()], node_days=0.0)["alerts_per_1k_node_days"] is None


def test_the_comparison_sets_alerts_of_the_model_beside_the_baseline_lower_is_better():
    m = score([dec(ONSET, action="alert")] * 3, [inc()], node_days=100.0)
    b = score([], [inc()], node_days=100.0)
    h = compare(m, b)["headline"]["alerts_per_1k_node_days"]
    assert h == {"model": pytest.approx(30.0), "baseline": 0.0, "delta": pytest.approx(30.0), "better": "lower"}


def test_alerts_are_counted_as_anomaly_alerts_and_as_unexplained_when_no_fault_is_near():
    from models.evaluation import score_replay

    inc = [{"id": "i1", "node": "n1", "gpu": 0, "fault": "nvlink", "onset_ts": 10_000.0, "failure_ts": 12_000.0}]
    decs = [{"ts": 9_500.0, "node": "n1", "gpu": 0, "action": "alert", "source": "anomaly"},   # before onset: explained
            {"ts": 50_000.0, "node": "n1", "gpu": 0, "action": "alert", "source": "model"},    # long after: not
            {"ts": 9_500.0, "node": "n2", "gpu": 0, "action": "alert", "source": "anomaly"}]   # other node: not
    m = score_replay(decs, inc, node_days=2.0, gpus_per_node=8)
    assert (m["anomaly_alerts"], m["unexplained_alerts"]) == (2, 2)
    assert m["unexplained_alerts_per_1k_node_days"] == 1000.0
