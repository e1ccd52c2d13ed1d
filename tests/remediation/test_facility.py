"""Correlated onsets are facility events: many nodes of one rack (or switch, partition) showing the
same fault at once give one alert for the group, no drains, and count in the breaker; a single node,
or nodes in different racks, are handled one by one as before."""

from __future__ import annotations

from remediation.actions import ActionKind, ActionState
from remediation.adapters.base import NodeStatus
from remediation.facility import FacilityTracker, NodeGroups, Onset
from remediation.safety import SafetyConfig

from tests.remediation.test_engine import LOOSE, Clock, Cluster, engine, explain, fleet


def racked(n: int, rack_of) -> Cluster:
    return Cluster([NodeStatus(name=f"n{i:05d}", extra={"rack": rack_of(i)}) for i in range(n)])


def power_brake(n: int, ts: float, nodes) -> object:
    return fleet(n, ts, rule_nodes=nodes, rule_fault="power", fault="power")


def armed_engine(store, clock, cluster, safety=LOOSE):
    return engine(store, clock, cluster, safety=safety, armed=True)     # start() reads the racks


def test_four_nodes_of_one_rack_with_a_power_brake_at_once_give_one_grouped_alert_and_no_drains(store):
    clock = Clock()
    cluster = racked(16, lambda i: f"r{i // 8}")
    e = armed_engine(store, clock, cluster)
    recs = e.tick(power_brake(16, clock.t, [0, 1, 2, 3]), explain)
    assert cluster.calls == []
    alerts = [r for r in recs if r.kind is ActionKind.ALERT]
    assert [(a.node, a.fault, a.source) for a in alerts] == [("facility:rack/r0", "power", "facility")]
    assert all(f"n0000{i}" in alerts[0].reason for i in range(4)) and "power" in alerts[0].reason
    drains = [r for r in recs if r.kind is not ActionKind.ALERT]
    assert {(r.state, r.blocked_by) for r in drains} == {(ActionState.REJECTED, "facility:rack/r0")}
    assert len(drains) == 4 and e.counts["rejected_facility"] == 4

    clock.t += 60                                   # the brake goes on: folded in, no second alert
    recs = e.tick(power_brake(16, clock.t, [0, 1, 2, 3, 4]), explain)
    assert cluster.calls == [] and not [r for r in recs if r.kind is ActionKind.ALERT]
    assert {r.blocked_by for r in recs} == {"facility:rack/r0"}
    assert len(store.query(kinds=[ActionKind.ALERT])) == 1


def test_a_single_node_with_the_fault_is_drained_as_usual(store):
    clock = Clock()
    cluster = racked(16, lambda i: f"r{i // 8}")
    e = armed_engine(store, clock, cluster)
    recs = e.tick(power_brake(16, clock.t, [2]), explain)
    assert [(c.verb, c.node) for c in cluster.calls] == [("drain", "n00002")]
    assert [(r.kind, r.state, r.blocked_by) for r in recs] == [(ActionKind.DRAIN, ActionState.SUCCEEDED, None)]


def test_nodes_with_the_same_fault_in_different_racks_are_handled_one_by_one(store):
    clock = Clock()
    cluster = racked(16, lambda i: f"r{i}")
    e = armed_engine(store, clock, cluster)
    recs = e.tick(power_brake(16, clock.t, [0, 1, 2, 3]), explain)
    assert sorted(c.node for c in cluster.calls) == ["n00000", "n00001", "n00002", "n00003"]
    assert not [r for r in recs if r.kind is ActionKind.ALERT or r.blocked_by]


def test_onsets_spread_over_a_few_ticks_within_the_window_are_one_event(store):
    clock = Clock()
    cluster = racked(16, lambda i: f"r{i // 8}")
    e = armed_engine(store, clock, cluster)
    e.tick(power_brake(16, clock.t, [0]), explain)
    clock.t += 60
    e.tick(power_brake(16, clock.t, [1]), explain)
    clock.t += 60
    recs = e.tick(power_brake(16, clock.t, [2, 3]), explain)
    assert sorted(c.node for c in cluster.calls) == ["n00000", "n00001"]   # before it looked like an event
    assert [r.node for r in recs if r.kind is ActionKind.ALERT] == ["facility:rack/r0"]
    assert {r.blocked_by for r in recs if r.kind is ActionKind.DRAIN} == {"facility:rack/r0"}


def test_without_group_information_a_large_share_of_the_fleet_is_one_event(store):
    clock, cluster = Clock(), Cluster()
    e = armed_engine(store, clock, cluster)
    recs = e.tick(power_brake(8, clock.t, [0, 1, 2]), explain)       # 3 of 8: 37 % >= 25 %
    assert cluster.calls == [] and [r.node for r in recs if r.kind is ActionKind.ALERT] == ["facility:fleet"]
    clock.t += 3600
    recs = e.tick(power_brake(100, clock.t, [10, 11, 12]), explain)  # 3 of 100: one by one
    assert len(cluster.calls) == 3


def test_a_facility_events_members_count_in_the_breaker(store):
    clock = Clock()
    cluster = racked(40, lambda i: f"r{i // 20}")
    safety = LOOSE.model_copy(update={"breaker_nodes": 10, "breaker_fraction": 0.1})
    e = armed_engine(store, clock, cluster, safety)
    e.tick(power_brake(40, clock.t, range(12)), explain)               # 12 nodes of rack r0
    assert cluster.calls == [] and e.breaker["open"] is True


def test_the_tracker_needs_the_share_for_a_partition_but_not_for_a_rack():
    t = FacilityTracker(window_s=300, min_nodes=3, fraction=0.25)
    part = NodeGroups(partitions=("partition/gpu",))
    out = t.observe(10, [(Onset(f"n{i}", "power", 10), part) for i in range(3)], {"partition/gpu": 100})
    assert out == {}
    rack = NodeGroups(labelled=("rack/r1",))
    out = t.observe(20, [(Onset(f"m{i}", "power", 20), rack) for i in range(3)], {})
    assert {ev.group for ev in out.values()} == {"rack/r1"}
    assert t.observe(1000, [(Onset("m9", "power", 1000), rack)], {}) == {}   # the event closed


def test_the_facility_knobs_are_validated():
    assert SafetyConfig().facility_min_nodes == 3 and SafetyConfig().facility_window_s == 300
    try:
        SafetyConfig(facility_min_nodes=1)
    except ValueError:
        pass
    else:
        raise AssertionError("facility_min_nodes=1 must be refused")


