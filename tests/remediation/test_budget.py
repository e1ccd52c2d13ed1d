"""The fleet's false-action budget: holds taken on predictions that end healthy brake their fault class
once the fleet has shown, beyond chance, more of them than the budget allows; rules are never braked."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import chi2

from collector.schema import Action, FaultClass, Grade
from remediation.budget import BudgetState, HoldOutcome, braked, lower_bound, observe, record, status
from remediation.config import PolicyConfig
from remediation.policy import PolicyState, decide

from tests.remediation.test_policy import explain, scores

HBM = FaultClass.HBM_ECC
DAY = 86400.0
# a budget that 3 healthy resumes on a small fleet within hours exceed; no fleet floors, no warm-up
CFG = PolicyConfig(act_threshold=0.7, act_sustain_s=60, alert_threshold=0.3, min_hold_s=600, resume_after_s=300,
                   clear_threshold=0.1, model_warmup_s=0, corroborate_threshold=0.99, act_sustain_s_by_fault={},
                   anomaly_sustain_s=0, fleet_calibration=False, hbm_storm_ratio=0)


@pytest.mark.parametrize("k", [1, 3, 10, 40])
def test_the_lower_bound_is_the_chi_square_one(k):
    assert lower_bound(k, 0.9) == pytest.approx(chi2.ppf(0.1, 2 * k) / 2, rel=1e-9)
    assert lower_bound(k, 0.99) < lower_bound(k, 0.9) < k


def test_no_event_bounds_nothing():
    assert lower_bound(0, 0.9) == 0.0


def test_exposure_is_nodes_times_time_with_long_gaps_cut_short():
    st = observe(BudgetState(), 100, 0.0, CFG)           # the first tick starts the clock
    st = observe(st, 100, 60.0, CFG)                     # 100 nodes x 60 s
    st = observe(st, 50, 60.0 + 3600.0, CFG)            # a one-hour hole counts 600 s
    assert st.node_days(3700.0, CFG.false_budget_window_s) == pytest.approx((100 * 60 + 50 * 600) / DAY)
    before = st
    assert observe(st, 100, 10.0, CFG) is before         # a tick from the past changes nothing


def test_exposure_older_than_the_window_is_forgotten():
    cfg = CFG.model_copy(update={"false_budget_window_s": 2 * 3600.0})
    st = observe(BudgetState(), 10, 0.0, cfg)
    for t in np.arange(600.0, 6 * 3600.0 + 1, 600.0):
        st = observe(st, 10, float(t), cfg)
    assert len(st.exposure) <= 4                         # the window's buckets and the one it began in
    # whole hours overlapping the last 2 h: 4-5 h and 5-6 h, and the tick at 6 h that opened the next
    assert st.node_days(6 * 3600.0, cfg.false_budget_window_s) == pytest.approx(10 * (2 * 3600.0 + 600.0) / DAY)


def _with(outcomes, node_days, now=DAY):
    st = BudgetState(exposure=((now - 3600.0, node_days * DAY),), last_tick=now)
    for i, (fault, confirmed) in enumerate(outcomes):
        st = record(st, HoldOutcome(now - 60.0 * i, f"n{i}", fault, confirmed))
    return st


def test_a_class_is_braked_only_with_enough_healthy_holds_beyond_its_budget():
    cfg = CFG.model_copy(update={"false_budget_per_1k_node_days": 5.0})
    # 3 healthy holds in 100 node-days: the lower bound 1.10 is over the 0.5 allowed
    st = _with([(HBM, False)] * 3, 100.0)
    assert set(braked(st, DAY, cfg)) == {HBM}
    assert "3 of this fleet's hbm_ecc prediction holds" in braked(st, DAY, cfg)[HBM]
    # ...but not in 1,000 node-days (5 allowed), and 2 are chance whatever the exposure
    assert braked(_with([(HBM, False)] * 3, 1000.0), DAY, cfg) == {}
    assert braked(_with([(HBM, False)] * 2, 1.0), DAY, cfg) == {}
    # holds whose failure came are not against the budget; other classes are counted apart
    assert braked(_with([(HBM, True)] * 5 + [(FaultClass.NVLINK, False)] * 2, 1.0), DAY, cfg) == {}
    assert braked(st, DAY, cfg.model_copy(update={"false_budget_per_1k_node_days": 0.0})) == {}


def test_the_brake_lifts_when_its_outcomes_leave_the_window():
    st = _with([(HBM, False)] * 3, 1.0)
    assert braked(st, DAY, CFG)
    assert braked(st, DAY + CFG.false_budget_window_s + 1.0, CFG) == {}
    later = observe(st, 10, DAY + CFG.false_budget_window_s + 1.0, CFG)
    assert later.outcomes == ()


def test_status_counts_outcomes_per_class_and_names_the_braked():
    st = _with([(HBM, False)] * 3 + [(HBM, True)], 10.0)
    out = status(st, DAY, CFG)
    assert out["outcomes"] == {"hbm_ecc": {"unconfirmed": 3, "confirmed": 1}}
    assert out["node_days"] == 10.0 and list(out["braked"]) == ["hbm_ecc"]


# ---- in the policy ------------------------------------------------------------------------------

N = 20  # nodes


def tick(st, t, hot=(), p_hot=0.9, rule=None, cfg=CFG):
    """One tick of N nodes: *hot* predicted hbm_ecc at *p_hot*; *rule*: (node, action) an acting hbm rule fires."""
    p = [p_hot if i in hot else 0.0 for i in range(N)]
    r, rf, ra = [-1] * N, [None] * N, [None] * N
    if rule is not None:
        r[rule[0]], rf[rule[0]], ra[rule[0]] = 3, "hbm_ecc", rule[1]
    return decide(scores(ts=t, p=p, fault=["hbm_ecc"] * N, rule=r, rule_fault=rf, rule_action=ra, anomaly=[0.0] * N),
                  st, t, cfg, explain)


def run(st, t, node, minutes, cfg=CFG, **kw):
    """*minutes* one-minute ticks from *t*; returns (decisions, state, t after)."""
    out = []
    for _ in range(minutes):
        d, st = tick(st, t, cfg=cfg, **kw)
        out += d
        t += 60.0
    return out, st, t


def false_drain(st, t, node, cfg=CFG):
    """*node* predicted for 2 min (drained), then healthy until gpuops resumes it."""
    d1, st, t = run(st, t, node, 2, hot={node}, cfg=cfg)
    d2, st, t = run(st, t, node, 15, cfg=cfg)
    return d1 + d2, st, t


def test_healthy_resumes_brake_the_class_and_its_next_prediction_alerts_saying_why():
    st, t = PolicyState(), 0.0
    actions = []
    for node in (1, 2, 3):
        d, st, t = false_drain(st, t, node)
        actions += [(x.node, x.action) for x in d if x.action is not Action.ALERT]
    assert actions == [(f"n{n}", a) for n in (1, 2, 3) for a in (Action.DRAIN, Action.RESUME)]
    assert [(o.node, o.fault, o.confirmed) for o in st.budget.outcomes] == [(f"n{n}", HBM, False) for n in (1, 2, 3)]
    d, st, t = run(st, t, 4, 5, hot={4})
    assert {x.action for x in d} == {Action.ALERT}
    assert "braked: 3 of this fleet's hbm_ecc prediction holds" in d[0].reason
    # a rule on certain evidence is not braked
    d, st, t = run(st, t, 5, 1, rule=(5, Action.RESET))
    assert [(x.node, x.action, x.source) for x in d] == [("n5", Action.RESET, "rule")]


def test_with_the_budget_off_the_same_fleet_keeps_draining():
    cfg = CFG.model_copy(update={"false_budget_per_1k_node_days": 0.0})
    st, t = PolicyState(), 0.0
    for node in (1, 2, 3):
        _, st, t = false_drain(st, t, node, cfg)
    d, st, t = run(st, t, 4, 5, hot={4}, cfg=cfg)
    assert (("n4", Action.DRAIN)) in [(x.node, x.action) for x in d]
    assert st.budget == BudgetState()


def test_a_prediction_whose_failure_came_while_held_is_confirmed_and_does_not_brake():
    st, t = PolicyState(), 0.0
    for node in (1, 2, 3, 4):
        _, st, t = run(st, t, node, 2, hot={node})               # drained on the prediction
        d, st, t = run(st, t, node, 1, rule=(node, Action.RESET))  # the failure: the catalogue's remedy
        assert [(x.action, x.grade) for x in d] == [(Action.RESET, Grade.CERTAIN)]
        _, st, t = run(st, t, node, 15)                           # resumed later: not a second outcome
    assert [(o.node, o.confirmed) for o in st.budget.outcomes] == [(f"n{n}", True) for n in (1, 2, 3, 4)]
    d, st, t = run(st, t, 5, 3, hot={5})
    assert ("n5", Action.DRAIN) in [(x.node, x.action) for x in d]


def test_a_hold_resumed_before_its_failure_came_within_the_horizon_is_confirmed():
    st, t = PolicyState(), 0.0
    _, st, t = false_drain(st, t, 1)                              # resumed healthy at ~13 min
    assert [(o.node, o.confirmed) for o in st.budget.outcomes] == [("n1", False)]
    _, st, t = run(st, t, 1, 60)                                 # an hour later ...
    d, st, t = run(st, t, 1, 1, rule=(1, Action.RESET))          # ... the failure: within 6 h of the drain
    assert [(x.action, x.source) for x in d] == [(Action.RESET, "rule")]
    assert [(o.node, o.confirmed) for o in st.budget.outcomes] == [("n1", True)]


def test_a_failure_past_the_horizon_or_a_persons_verdict_is_not_a_late_confirmation():
    from remediation.budget import confirm_late

    cfg = CFG.model_copy(update={"false_budget_confirm_s": 3600.0})
    st = record(record(BudgetState(), HoldOutcome(600.0, "n1", HBM, False, 0.0)),
                HoldOutcome(600.0, "n2", HBM, False, 0.0, by="operator:alice"))
    assert confirm_late(st, "n1", 4000.0, cfg) is st                 # 4,000 s after the hold: past 1 h
    assert confirm_late(st, "n2", 1000.0, cfg) is st                 # a person said healthy
    assert [o.confirmed for o in confirm_late(st, "n1", 1000.0, cfg).outcomes] == [True, False]


def test_a_braked_class_stays_braked_until_its_rate_is_under_the_budget_not_just_its_lower_bound():
    from remediation.budget import with_brakes

    cfg = CFG.model_copy(update={"false_budget_per_1k_node_days": 5.0})
    st = _with([(HBM, False)] * 4, 300.0)      # 4 in 300 node-days: lower bound 1.74 > 1.5 allowed: braked
    brakes = braked(st, DAY, cfg)
    assert set(brakes) == {HBM}
    st = with_brakes(st, brakes)
    assert st.braked == ("hbm_ecc",)
    more = replace(st, exposure=((DAY - 3600.0, 400.0 * DAY),))   # 400 node-days: 2.0 allowed, 1.74 < 2.0 ...
    assert set(braked(more, DAY, cfg)) == {HBM}                   # ... but 4 is still over it: held
    assert braked(replace(more, braked=()), DAY, cfg) == {}       # (not braked before: it would not engage now)
    enough = replace(st, exposure=((DAY - 3600.0, 801.0 * DAY),))  # 4 under the 4.005 allowed: lifted
    assert braked(enough, DAY, cfg) == {}
    assert with_brakes(enough, {}).braked == ()


def test_the_budget_state_survives_its_json_with_its_brakes():
    st = replace(_with([(HBM, False)] * 3 + [(HBM, True)], 10.0), braked=("hbm_ecc",))
    assert BudgetState.from_json(json.loads(json.dumps(st.to_json()))) == st
    assert BudgetState.from_json({"outcomes": [["x"]]}) == BudgetState()        # another version's: empty
