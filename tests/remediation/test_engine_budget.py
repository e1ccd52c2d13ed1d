"""The false-action budget in the engine: a class whose prediction holds end healthy beyond the budget only
alerts; the brake is audited, shown, kept across a restart; people's verdicts count, from any replica.
Runs on every store backend (the ``store`` fixture: SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from remediation.actions import ActionKind, ActionState
from remediation.engine import Engine
from tests.remediation.test_engine import LOOSE, POLICY, Clock, Cluster, explain, fleet

N = 20
CFG = POLICY.model_copy(update={"fleet_calibration": False, "corroborate_threshold": 0.99})


def engine(store, clock, **kw) -> Engine:
    e = Engine(store, Cluster(), policy=CFG, safety=LOOSE, clock=clock, **kw)
    e.start()
    return e


def minutes(e, clock, n, hot=(), rule=()):
    """*n* one-minute ticks of the fleet, nodes *hot* predicted nvlink at 0.9, *rule* an acting rule."""
    recs = []
    for _ in range(n):
        p = [0.9 if i in hot else 0.0 for i in range(N)]
        recs += e.tick(fleet(N, clock.t, p=p, rule_nodes=list(rule)), explain)
        clock.t += 60.0
    return recs


def false_hold(e, clock, node):
    """*node* predicted (drained), then healthy until gpuops resumes it; returns the drain."""
    drain = [r for r in minutes(e, clock, 2, hot={node}) if r.kind is ActionKind.DRAIN]
    resumed = [r for r in minutes(e, clock, 15) if r.kind is ActionKind.RESUME]
    assert [r.node for r in drain] == [f"n{node:05d}"] and [r.node for r in resumed] == [f"n{node:05d}"]
    return drain[0]


def test_healthy_resumes_brake_the_class_audited_shown_and_kept_across_a_restart(store):
    clock = Clock()
    e = engine(store, clock)
    for node in (1, 2, 3):
        false_hold(e, clock, node)
    st = e.status()["budget"]
    assert st["outcomes"] == {"nvlink": {"unconfirmed": 3, "confirmed": 0}} and list(st["braked"]) == ["nvlink"]
    assert e.counts["budget_braked_nvlink"] == 1
    audited = store.setting_history("false_budget")
    assert len(audited) == 1 and audited[0]["actor"] == "engine" and "nvlink braked: 3 of this fleet" in \
        audited[0]["note"]
    recs = minutes(e, clock, 3, hot={4})
    assert {r.kind for r in recs} == {ActionKind.ALERT} and "braked" in recs[0].reason
    # a rule still acts
    assert [r.kind for r in minutes(e, clock, 1, rule={5})] == [ActionKind.DRAIN]

    again = engine(store, clock)                       # a restart, or the next leader
    assert list(again.status()["budget"]["braked"]) == ["nvlink"]
    recs = minutes(again, clock, 3, hot={6})
    assert {r.kind for r in recs} == {ActionKind.ALERT}
    assert len(store.setting_history("false_budget")) == 1   # checkpoints since were not audited


def test_a_persons_verdict_counts_at_once_and_wins_over_what_the_policy_sees(store):
    clock = Clock()
    e = engine(store, clock)
    a = [r for r in minutes(e, clock, 2, hot={1}) if r.kind is ActionKind.DRAIN][0]
    b = [r for r in minutes(e, clock, 2, hot={2}) if r.kind is ActionKind.DRAIN][0]
    rec = e.verdict(a.id, "healthy", "operator:alice", "dcgmi diag -r 3 clean")
    assert rec.verdict == "healthy" and store.get(a.id).verdict == "healthy"
    assert store.history(a.id)[-1]["note"] == "verdict: healthy (dcgmi diag -r 3 clean)"
    e.verdict(b.id, "faulty", "operator:bob")
    assert e.status()["budget"]["outcomes"] == {"nvlink": {"unconfirmed": 1, "confirmed": 1}}
    minutes(e, clock, 15)                              # both resumed healthy: the verdicts stand
    assert e.status()["budget"]["outcomes"] == {"nvlink": {"unconfirmed": 1, "confirmed": 1}}
    assert e.verdict(b.id, "faulty", "operator:bob").verdict == "faulty"   # the same again: no change
    assert len([h for h in store.history(b.id) if h["note"].startswith("verdict")]) == 1


def test_a_verdict_is_refused_for_anything_but_a_prediction_hold(store):
    clock = Clock()
    e = engine(store, clock)
    rule_drain = minutes(e, clock, 1, rule={3})[0]
    with pytest.raises(ValueError, match="verdicts are given on holds gpuops took on a prediction"):
        e.verdict(rule_drain.id, "healthy", "operator:alice")
    with pytest.raises(KeyError):
        e.verdict("no-such-id", "healthy", "operator:alice")
    drain = [r for r in minutes(e, clock, 2, hot={1}) if r.kind is ActionKind.DRAIN][0]
    with pytest.raises(ValueError, match="healthy, faulty"):
        e.verdict(drain.id, "fine", "operator:alice")
    assert store.get(drain.id).verdict is None and store.get(drain.id).state is ActionState.VERIFIED


def test_verdicts_given_on_another_replica_reach_the_leader(store):
    clock = Clock()
    leader = engine(store, clock)
    standby = engine(store, clock)
    standby.acting = False
    drains = []
    for node in (1, 2, 3):
        drains += [r for r in minutes(leader, clock, 2, hot={node}) if r.kind is ActionKind.DRAIN]
    for d in drains:
        standby.verdict(d.id, "healthy", "operator:alice")
    assert leader.status()["budget"]["outcomes"] == {}
    clock.t += 61.0
    leader.maintain()                                  # the leader reads them back (at most once a minute)
    assert leader.status()["budget"]["outcomes"] == {"nvlink": {"unconfirmed": 3, "confirmed": 0}}
    assert list(leader.status()["budget"]["braked"]) == ["nvlink"]


def test_a_standby_shows_the_leaders_budget_read_at_most_once_a_minute(store):
    clock = Clock()
    leader = engine(store, clock)
    standby = Engine(store, Cluster(), policy=CFG, safety=LOOSE, clock=clock)   # never started: decides nothing
    standby.acting = False
    assert standby.status()["budget"]["outcomes"] == {}                         # read now: nothing kept yet
    drains = [false_hold(leader, clock, node) for node in (1, 2, 3)]          # minutes pass: it reads again
    shown, own = standby.status()["budget"], leader.status()["budget"]
    assert (shown["outcomes"], shown["braked"]) == (own["outcomes"], own["braked"]) and list(own["braked"]) == ["nvlink"]
    assert 0 < shown["node_days"] <= own["node_days"]         # the exposure as last kept (hourly, and on a change)
    leader.verdict(drains[0].id, "faulty", "operator:alice")                    # the leader's budget moves on
    before = standby.status()["budget"]
    clock.t += 30.0
    assert standby.status()["budget"] == before                                 # within the minute: not read
    clock.t += 31.0
    assert standby.status()["budget"]["outcomes"]["nvlink"]["confirmed"] == 1   # a minute on: the leader's


def test_a_standby_keeps_the_budget_it_last_read_while_the_store_is_down(store, monkeypatch, caplog):
    clock = Clock()
    leader = engine(store, clock)
    for node in (1, 2, 3):
        false_hold(leader, clock, node)
    standby = Engine(store, Cluster(), policy=CFG, safety=LOOSE, clock=clock)
    standby.acting = False
    shown = standby.status()["budget"]
    assert list(shown["braked"]) == ["nvlink"]

    def down(*a, **kw):
        raise ConnectionError("store unreachable")

    monkeypatch.setattr(store, "get_setting", down)
    clock.t += 120.0
    assert standby.budget_status()["outcomes"] == shown["outcomes"]   # what /metrics shows with the store down
    assert "cannot read the leader's false-action budget" in caplog.text
