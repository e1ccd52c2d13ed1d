"""Silences: stored and audited on every store backend, validated, expiring on their own; the engine
records each decision a silence mutes (``blocked_by: silence:<id>``) and acts again once it ends; a
silenced or maintained node gpuops holds is not resumed until verification after the end; and the
scheduler's own maintenance is named in the record."""

from __future__ import annotations

from pathlib import Path

import pytest

from remediation.actions import ActionKind, ActionState
from remediation.adapters.base import NodeStatus
from remediation.adapters.slurm_state import maintenance_reservations, node_status
from remediation.silences import Mutes, SilenceBook, SilenceError
from tests.remediation.test_engine import Clock, Cluster, engine, explain, fleet

DATA = Path(__file__).parent / "data"
HOUR = 3600.0


def book(store, clock, **kw) -> SilenceBook:
    return SilenceBook(store, clock=clock, **kw)


def test_a_silence_round_trips_through_the_store_with_its_audit_and_expires_on_its_own(store):
    clock = Clock()
    b = book(store, clock)
    s = b.create(author="operator:ann", reason="switch firmware upgrade", nodes=["n00001", "n00002"],
                 mutes="actions", duration_s=2 * HOUR)
    assert b.get(s.id) == s and s.ends_at == clock.t + 2 * HOUR and s.mutes is Mutes.ACTIONS
    assert [x.id for x in b.active()] == [s.id] and [x.id for x in b.list()] == [s.id]
    assert b.match("n00002", None, kind=ActionKind.DRAIN) == s
    assert b.match("n00002", None, kind=ActionKind.ALERT) is None           # actions only
    assert b.match("n00003", None) is None
    clock.t += 2 * HOUR                                                       # ends_at is exclusive
    assert b.active() == [] and b.list() == [] and [x.id for x in b.list(include_all=True)] == [s.id]
    assert [(h["event"], h["actor"], h["note"]) for h in b.history(s.id)] == [
        ("created", "operator:ann", "switch firmware upgrade")]


def test_deleting_a_silence_ends_it_now_keeps_it_and_audits_who(store):
    clock = Clock()
    b = book(store, clock)
    s = b.create(author="operator:ann", reason="burn-in", fleet=True, duration_s=HOUR)
    clock.t += 60
    gone = b.delete(s.id, "operator:bob", "burn-in done early")
    assert (gone.deleted_at, gone.deleted_by) == (clock.t, "operator:bob") and not gone.active(clock.t)
    assert b.active() == [] and b.delete(s.id, "operator:bob").deleted_by == "operator:bob"   # idempotent
    assert [h["event"] for h in b.history(s.id)] == ["created", "deleted"]
    with pytest.raises(KeyError, match="no silence"):
        b.delete("sil-nope", "operator:bob")


def test_the_same_request_twice_is_one_silence(store):
    clock = Clock()
    b = book(store, clock)
    one = b.create(author="operator:ann", reason="r", nodes=["n1"], duration_s=HOUR)
    assert b.create(author="operator:ann", reason="r", nodes=["n1"], duration_s=HOUR) == one
    assert len(b.list(include_all=True)) == 1


@pytest.mark.parametrize("kw, message", [
    ({"nodes": ["n1"], "duration_s": HOUR, "reason": "  "}, "needs a reason"),
    ({"nodes": ["n1"], "reason": "r"}, "needs an end"),
    ({"nodes": ["n1"], "reason": "r", "ends_at": 1_000_000.0 - 10}, "at or before it starts"),
    ({"nodes": ["n1"], "reason": "r", "duration_s": 8 * 86400.0}, "longer than the maximum"),
    ({"nodes": ["bad;name"], "reason": "r", "duration_s": HOUR}, "invalid node name"),
    ({"reason": "r", "duration_s": HOUR}, "exactly one scope"),
    ({"nodes": ["n1"], "fleet": True, "reason": "r", "duration_s": HOUR}, "exactly one scope"),
    ({"selector": {"colour": "red"}, "reason": "r", "duration_s": HOUR}, "not known"),
    ({"nodes": ["n1"], "reason": "r", "duration_s": HOUR, "mutes": "pages"}, "mutes"),
])
def test_a_bad_silence_is_refused_saying_what_to_fix(tmp_path, kw, message):
    from remediation.store import ActionStore

    store = ActionStore(f"sqlite:///{tmp_path / 'a.db'}")
    store.migrate()
    with pytest.raises(SilenceError, match=message):
        book(store, Clock()).create(author="operator:ann", **kw)
    assert store.silence_rows() == []


def test_a_selector_matches_partition_rack_and_pool_labels(store):
    b = book(store, Clock())
    s = b.create(author="operator:ann", reason="power test", selector={"partition": "gpu", "rack": "r12"},
                 duration_s=HOUR)
    inside = NodeStatus("a", partitions=("debug", "gpu"), extra={"rack": "r12"})
    assert s.covers("a", inside)
    assert not s.covers("b", NodeStatus("b", partitions=("gpu",), extra={"rack": "r13"}))
    assert not s.covers("c", NodeStatus("c", partitions=("gpu",)))           # no rack label: not in scope
    assert not s.covers("d", None)


def test_a_silenced_node_gets_no_action_the_record_names_the_silence_and_actions_return_after_it(store):
    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster, armed=True)
    s = e.silences.create(author="operator:ann", reason="cabling", nodes=["n00001"], duration_s=HOUR)
    recs = e.tick(fleet(3, clock.t, rule_nodes=[1]), explain)
    assert [(r.node, r.kind, r.state, r.blocked_by) for r in recs] == [
        ("n00001", ActionKind.DRAIN, ActionState.REJECTED, f"silence:{s.id}")]
    assert cluster.calls == [] and "cabling" in store.history(recs[0].id)[-1]["note"]
    assert e.status()["silences"] == [s.id]
    clock.t = s.ends_at                                                     # the silence ran out
    recs = e.tick(fleet(3, clock.t, rule_nodes=[1]), explain)
    assert [(r.node, r.state, r.blocked_by) for r in recs] == [("n00001", ActionState.SUCCEEDED, None)]
    assert [(c.verb, c.node) for c in cluster.calls] == [("drain", "n00001")]


def test_an_alerts_only_silence_mutes_alerts_and_lets_actions_through(store):
    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster, armed=True)
    s = e.silences.create(author="operator:ann", reason="noisy", fleet=True, mutes="alerts", duration_s=HOUR)
    d_alert = e.tick(fleet(3, clock.t, p=[0.0, 0.5, 0.0]), explain)       # above alert_threshold only
    clock.t += 120
    d_alert += e.tick(fleet(3, clock.t, p=[0.0, 0.5, 0.0]), explain)
    alerts = [r for r in d_alert if r.kind is ActionKind.ALERT]
    assert alerts and all((r.state, r.blocked_by) == (ActionState.REJECTED, f"silence:{s.id}") for r in alerts)
    clock.t += 60
    recs = e.tick(fleet(3, clock.t, rule_nodes=[2]), explain)
    assert [(r.node, r.kind, r.blocked_by) for r in recs] == [("n00002", ActionKind.DRAIN, None)]


def test_a_held_node_is_not_resumed_while_silenced_and_goes_through_verification_after(store):
    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster, armed=True)
    e.tick(fleet(2, clock.t, rule_nodes=[0]), explain)                     # gpuops drains n00000
    s = e.silences.create(author="operator:ann", reason="vendor on site", nodes=["n00000"], duration_s=HOUR)
    resumed = []
    while clock.t < s.ends_at:
        clock.t += 60
        resumed += [r for r in e.tick(fleet(2, clock.t), explain) if r.kind is ActionKind.RESUME]
    assert resumed == [] and cluster.status("n00000").drained and "n00000" in e.holds
    ended = clock.t
    for _ in range(10):
        clock.t += 60
        resumed += [r for r in e.tick(fleet(2, clock.t), explain) if r.kind is ActionKind.RESUME]
    assert [(r.node, r.state) for r in resumed] == [("n00000", ActionState.SUCCEEDED)]
    assert resumed[0].created_at - ended >= 300                            # resume_after_s of clean time after


def test_silences_survive_an_engine_restart(store):
    clock, cluster = Clock(), Cluster()
    first = engine(store, clock, cluster, armed=True)
    s = first.silences.create(author="operator:ann", reason="rack power test", nodes=["n00001"], duration_s=HOUR)
    restarted = engine(store, clock, cluster)
    clock.t += 60
    recs = restarted.tick(fleet(2, clock.t, rule_nodes=[1]), explain)
    assert [(r.state, r.blocked_by) for r in recs] == [(ActionState.REJECTED, f"silence:{s.id}")]
    assert cluster.calls == []


def test_a_maintenance_reservation_is_named_and_a_held_node_is_not_resumed_during_it(store):
    clock = Clock()
    cluster = Cluster([NodeStatus("n00001", maintenance=True, extra={"maintenance_reservation": "fw_upgrade"})])
    e = engine(store, clock, cluster, armed=True)
    recs = e.tick(fleet(2, clock.t, rule_nodes=[1]), explain)
    assert [(r.state, r.blocked_by) for r in recs] == [(ActionState.REJECTED, "maintenance:fw_upgrade")]
    assert "fw_upgrade" in store.history(recs[0].id)[-1]["note"]
    e.tick(fleet(2, clock.t, rule_nodes=[0]), explain)                     # gpuops drains n00000 ...
    cluster.set_status(NodeStatus("n00000", drained=True, ours=True, reason="gpuops: drain", maintenance=True,
                                  extra={"maintenance_reservation": "fw_upgrade"}))   # ... then it is reserved
    kinds = []
    for _ in range(20):
        clock.t += 60
        kinds += [(r.kind, r.blocked_by) for r in e.tick(fleet(2, clock.t), explain)]
    assert (ActionKind.RESUME, "maintenance:fw_upgrade") in kinds and cluster.status("n00000").drained
    cluster.set_status(NodeStatus("n00000", drained=True, ours=True, reason="gpuops: drain"))  # reservation over
    for _ in range(10):
        clock.t += 60
        e.tick(fleet(2, clock.t), explain)
    assert not cluster.status("n00000").drained and "n00000" not in e.holds


def test_a_drain_set_by_an_admin_is_never_resumed(store):
    clock = Clock()
    cluster = Cluster([NodeStatus("n00000", drained=True, ours=False, reason="admin: reseating GPUs")])
    e = engine(store, clock, cluster, armed=True)
    for _ in range(40):
        clock.t += 60
        e.tick(fleet(2, clock.t), explain)
    assert cluster.calls == [] and cluster.status("n00000").drained


def test_slurm_maint_reservations_are_read_with_their_names():
    text = (DATA / "scontrol_show_reservation_22.05.txt").read_text()
    assert maintenance_reservations(text) == {"gpu-node-02": "maint-02"}
    st = node_status({"name": "gpu-node-02", "state": "idle"}, (), maintenance_reservations(text))
    assert st.maintenance and st.extra["maintenance_reservation"] == "maint-02"


def test_the_replay_summary_counts_suppressed_decisions_by_cause(store):
    from api.commands.replay import engine_summary

    clock = Clock()
    cluster = Cluster([NodeStatus("n00002", maintenance=True, extra={"maintenance_reservation": "fw"})])
    e = engine(store, clock, cluster, armed=True)
    s = e.silences.create(author="operator:ann", reason="cabling", nodes=["n00001"], duration_s=HOUR)
    recs = e.tick(fleet(3, clock.t, rule_nodes=[0, 1, 2]), explain)
    got = engine_summary(recs)
    assert got["suppressed_by_cause"] == {"maintenance": 1, "silence": 1}
    assert got["blocked_by"] == {"maintenance:fw": 1, f"silence:{s.id}": 1}
