"""The engine: dry-run by default, one action per incident, safety limits that hold under bursts, a
breaker only a person closes, records written before the adapter is called and reconciled after a
crash, and the policy's memory rebuilt from the store after a restart. Runs on every store backend
(the ``store`` fixture: SQLite and PostgreSQL)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from collector.schema import Action, FaultClass, FollowUp, Grade
from models.base import class_index
from models.node_scores import NodeScores
from remediation.actions import ENGINE_ACTOR, ActionKind, ActionState
from remediation.adapters.base import NodeStatus, TransientAdapterError, UnknownNode
from remediation.adapters.dryrun import DryRunAdapter
from remediation.config import PolicyConfig
from remediation.engine import Engine
from remediation.policy import Decision
from remediation.safety import SafetyConfig

POLICY = PolicyConfig(act_threshold=0.7, act_sustain_s=60, alert_threshold=0.3, min_hold_s=600, resume_after_s=300,
                      clear_threshold=0.1, model_warmup_s=0, act_sustain_s_by_fault={}, anomaly_sustain_s=0)
LOOSE = SafetyConfig(max_held_nodes=1000, max_held_fraction=1.0, max_held_fraction_per_partition=1.0,
                     max_actions_per_window=10_000, breaker_nodes=10_000, breaker_fraction=1.0, node_cooldown_s=0)


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Cluster(DryRunAdapter):
    """The 'real' scheduler in engine tests: a dry-run adapter under another name, with failure injection."""

    name = "cluster"

    def __init__(self, nodes=(), fail: list[Exception] | None = None) -> None:
        super().__init__(nodes)
        self.fail = fail or []

    def drain(self, node, reason):
        if self.fail:
            raise self.fail.pop(0)
        super().drain(node, reason)


def fleet(n: int, ts: float, rule_nodes=(), p=None, fault="nvlink", rule_action=Action.DRAIN,
          rule_fault="ib_link", follow_up=None) -> NodeScores:
    idx = np.arange(n)
    rule = np.full(n, -1)
    rule[list(rule_nodes)] = 0
    acts = np.array([rule_action if r >= 0 else None for r in rule], object)
    # rule_fault: one fault for every rule node, or one per rule node (independent faults, not a facility event)
    faults = [rule_fault] * n if isinstance(rule_fault, str) else dict(zip(list(rule_nodes), rule_fault))
    rf = np.array([class_index(faults[i]) if r >= 0 else 0 for i, r in enumerate(rule)], np.int8)
    return NodeScores(ts, np.array([f"n{i:05d}" for i in idx], object),
                      np.zeros(n) if p is None else np.asarray(p, float),
                      np.full(n, class_index(fault), np.int8), idx % 8, idx, rule, idx % 8, idx, rf, acts,
                      np.array([follow_up if r >= 0 else None for r in rule], object), np.zeros(n), idx)


def explain(i, source):
    return f"{source} says so"


def engine(store, clock, cluster=None, safety=LOOSE, armed=False, policy=POLICY, **kw) -> Engine:
    e = Engine(store, cluster if cluster is not None else Cluster(), policy=policy, safety=safety, clock=clock, **kw)
    e.start()
    if armed:
        e.arm("operator:test")
    return e


def test_nothing_reaches_the_cluster_until_automation_is_armed(store):
    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster)
    recs = e.tick(fleet(4, clock.t, rule_nodes=[1]), explain)
    assert [(r.node, r.kind, r.dry_run, r.adapter) for r in recs] == [("n00001", ActionKind.DRAIN, True, "dryrun")]
    assert cluster.calls == [] and [c.verb for c in e.dry.calls] == ["drain"]
    assert store.get(recs[0].id).state is ActionState.VERIFIED       # the dry-run "cluster" shows it drained

    e.arm("operator:alice")
    clock.t += 60
    recs = e.tick(fleet(4, clock.t, rule_nodes=[2]), explain)
    assert [(c.verb, c.node) for c in cluster.calls] == [("drain", "n00002")]
    assert recs[0].dry_run is False and recs[0].adapter == "cluster"
    assert [h["actor"] for h in store.setting_history("armed")] == ["operator:alice"]


def test_every_record_is_written_before_the_adapter_is_called_and_audited_through_its_states(store):
    clock = Clock()
    seen: list[ActionState] = []

    class Watching(Cluster):
        def drain(self, node, reason):
            seen.extend(r.state for r in store.query(node=node))
            super().drain(node, reason)

    e = engine(store, clock, Watching(), armed=True)
    rec = e.tick(fleet(2, clock.t, rule_nodes=[0]), explain)[0]
    assert seen == [ActionState.EXECUTING]
    clock.t += 60
    e.maintain()
    assert [(h["from_state"], h["to_state"]) for h in store.history(rec.id)] == [
        (None, "proposed"), ("proposed", "approved"), ("approved", "executing"), ("executing", "succeeded"),
        ("succeeded", "verified")]
    assert rec.reason == "rule says so" and rec.grade == Grade.CERTAIN.value and rec.evidence["rule"] == 0


def test_the_same_incident_twice_gives_one_action(store):
    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster, armed=True)
    d = Decision(clock.t, "n00003", 2, Action.DRAIN, FaultClass.NVLINK, 0.9, "because", "model", Grade.PREDICTED)
    first = e.submit([d])
    again = e.submit([d])                            # e.g. the same telemetry replayed after a restart
    assert len(first) == 1 and again == []
    assert len(store.query(node="n00003")) == 1 and len(cluster.calls) == 1


def test_the_breaker_opens_on_a_mass_anomaly_and_blocks_actions_until_a_person_closes_it(store):
    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster, safety=SafetyConfig(breaker_nodes=10, breaker_fraction=0.05), armed=True)
    recs = e.tick(fleet(1000, clock.t, rule_nodes=range(0, 1000, 10)), explain)   # 100 nodes at once
    assert e.breaker["open"] is True
    assert cluster.calls == []
    assert {r.blocked_by for r in recs} == {"breaker"} and {r.state for r in recs} == {ActionState.PROPOSED}

    clock.t += 3600 * 2                                 # it stays open however long it waits
    assert e.tick(fleet(1000, clock.t, rule_nodes=[5]), explain)[0].blocked_by == "breaker"
    assert cluster.calls == []
    with pytest.raises(ValueError):
        e.reset_breaker("operator:bob", "")
    e.reset_breaker("operator:bob", "collector bug fixed, fleet fine")
    clock.t += 60
    recs = e.tick(fleet(1000, clock.t, rule_nodes=[7]), explain)
    assert [c.node for c in cluster.calls] == ["n00007"] and recs[0].state is ActionState.SUCCEEDED
    assert store.setting_history("breaker")[-1]["actor"] == "operator:bob"


def test_caps_and_cooldowns_hold_under_a_burst_of_10000_scores(store):
    clock, cluster = Clock(), Cluster()
    cfg = SafetyConfig(max_held_nodes=8, max_held_fraction=0.05, max_actions_per_window=20, breaker_nodes=100_000,
                       breaker_fraction=1.0, node_cooldown_s=1800)
    e = engine(store, clock, cluster, safety=cfg, armed=True)
    rng = np.random.default_rng(7)
    for tick in range(10):                               # 10 ticks x 1,000 nodes, 30 rules firing per tick
        clock.t += 60
        e.tick(fleet(1000, clock.t, rule_nodes=rng.choice(1000, 30, replace=False)), explain)
    drained = {c.node for c in cluster.calls if c.verb == "drain"}
    assert len(drained) == 8 == len(cluster.calls)       # the held-node cap, never exceeded
    held = store.query(states=[ActionState.PROPOSED], limit=10_000)
    assert held and {r.blocked_by for r in held} <= {"cap_held", "cooldown", "cap_rate"}
    assert all(r.dry_run is False for r in held)


def test_the_action_rate_cap_and_node_cooldown_each_hold_actions_for_a_person(store):
    clock, cluster = Clock(), Cluster()
    cfg = LOOSE.model_copy(update={"max_actions_per_window": 2, "node_cooldown_s": 600})
    e = engine(store, clock, cluster, safety=cfg, armed=True)
    # 20 nodes: 3 of 10 at once with one fault and no rack known would be a facility event (test_facility.py)
    recs = e.tick(fleet(20, clock.t, rule_nodes=[0, 1, 2]), explain)
    assert [r.blocked_by for r in recs] == [None, None, "cap_rate"]
    e.request(ActionKind.RESUME, "n00000", "false alarm", "operator:carol", dry_run=False, force=True)
    clock.t += 60
    rec = e.tick(fleet(20, clock.t, rule_nodes=[0]), explain)[0]
    assert rec.blocked_by == "cooldown"


def test_a_node_taken_out_too_often_goes_to_a_person(store):
    clock, cluster = Clock(), Cluster()
    cfg = LOOSE.model_copy(update={"lemon_actions": 2})
    e = engine(store, clock, cluster, safety=cfg, armed=True)
    for _ in range(2):
        rec = e.tick(fleet(3, clock.t, rule_nodes=[1]), explain)[0]
        assert rec.blocked_by is None
        clock.t += 60
        e.request(ActionKind.RESUME, "n00001", "fixed", "operator:dan", dry_run=False, force=True)
        clock.t += 60
    rec = e.tick(fleet(3, clock.t, rule_nodes=[1]), explain)[0]
    assert (rec.blocked_by, rec.state) == ("lemon", ActionState.PROPOSED)
    assert e.approve(rec.id, "operator:dan").state is ActionState.SUCCEEDED
    assert "overrides lemon" in store.history(rec.id)[1]["note"]


def test_an_escalation_of_a_held_node_is_not_a_second_take_out_and_a_restart_reads_it_back(store):
    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster, armed=True)
    taken = []
    for _ in range(4):                                     # the prediction holds act_sustain_s (60 s), then drains
        taken += [r for r in e.tick(fleet(3, clock.t, p=[0.9, 0, 0]), explain) if r.kind.holds_node]
        clock.t += 30
    assert [(r.node, r.kind, r.escalates) for r in taken] == [("n00000", ActionKind.DRAIN, False)]
    # the failure comes: the rule's certain evidence on the node gpuops holds is the same incident going further
    more = [r for r in e.tick(fleet(3, clock.t, p=[0.9, 0, 0], rule_nodes=[0]), explain) if r.kind.holds_node]
    assert [(r.node, r.escalates) for r in more] == [("n00000", True)]
    assert e._snapshot(clock.t).recent_holds == {"n00000": 1}        # one take-out, not two
    assert e._snapshot(clock.t).actions_in_window == 2               # the rate cap counts both: each disrupts
    restarted = engine(store, clock, cluster, armed=True)
    assert restarted._snapshot(clock.t).recent_holds == {"n00000": 1}


def test_disruptive_kinds_wait_for_approval_when_configured(store):
    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster, safety=LOOSE.model_copy(update={"require_approval": frozenset({ActionKind.RESET})}),
               armed=True)
    rec = e.tick(fleet(2, clock.t, rule_nodes=[0], rule_action=Action.RESET, rule_fault="hbm_ecc"), explain)[0]
    assert (rec.kind, rec.state, rec.blocked_by) == (ActionKind.RESET, ActionState.PROPOSED, "approval")
    assert cluster.calls == []
    rejected = e.reject(rec.id, "operator:erin", "job owner asked to wait")
    assert rejected.state is ActionState.REJECTED and "n00000" not in e.holds


def test_nodes_under_maintenance_or_drained_by_someone_else_are_left_alone(store):
    clock = Clock()
    cluster = Cluster([NodeStatus("n00000", maintenance=True),
                       NodeStatus("n00001", drained=True, ours=False, reason="admin: new cables")])
    e = engine(store, clock, cluster, armed=True)
    recs = e.tick(fleet(3, clock.t, rule_nodes=[0, 1]), explain)
    assert [(r.node, r.state, r.blocked_by) for r in recs] == [
        ("n00000", ActionState.REJECTED, "maintenance"), ("n00001", ActionState.REJECTED, "not_ours")]
    assert cluster.calls == []


def test_stale_decisions_are_not_acted_on(store):
    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster, armed=True)
    recs = e.tick(fleet(2, clock.t - 3600, rule_nodes=[0]), explain)     # an hour-old backlog
    assert (recs[0].state, recs[0].blocked_by) == (ActionState.REJECTED, "stale") and cluster.calls == []


def test_a_transient_adapter_error_is_retried_with_backoff_and_a_permanent_one_fails_for_a_person(store):
    clock = Clock()
    cluster = Cluster(fail=[TransientAdapterError("controller down"), TransientAdapterError("timeout")])
    e = engine(store, clock, cluster, armed=True)
    rec = e.tick(fleet(3, clock.t, rule_nodes=[0]), explain)[0]
    assert rec.state is ActionState.EXECUTING and rec.error == "controller down"
    e.maintain()                                          # not due yet: no second call
    assert store.get(rec.id).attempts == 1
    clock.t += 11
    e.maintain()
    assert store.get(rec.id).attempts == 2
    clock.t += 21
    e.maintain()
    assert store.get(rec.id).state is ActionState.SUCCEEDED and store.get(rec.id).attempts == 3

    cluster.fail = [UnknownNode("no such node")]
    rec = e.tick(fleet(3, clock.t, rule_nodes=[2]), explain)[0]
    assert rec.state is ActionState.FAILED and "no such node" in rec.error and "n00002" not in e.holds


def test_after_a_crash_an_action_in_flight_is_reconciled_never_repeated_and_never_lost(store):
    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster, armed=True)
    # two crashes between "executing" and the adapter's answer: n00000's drain reached the cluster,
    # n00001's did not
    for node in ("n00000", "n00001"):
        d = Decision(clock.t, node, None, Action.DRAIN, FaultClass.IB_LINK, 1.0, "x", "rule", Grade.CERTAIN)
        rec = e._record(d, clock.t, True, {})
        store.insert(replace(rec, state=ActionState.EXECUTING, attempts=1))
    cluster.set_status(NodeStatus("n00000", drained=True, ours=True, reason="gpuops: drain"))
    clock.t += 30
    restarted = engine(store, clock, cluster)             # a new process: same store, same cluster
    assert [(c.verb, c.node) for c in cluster.calls] == [("drain", "n00001")]
    assert {r.node: r.state for r in store.query()} == {"n00000": ActionState.SUCCEEDED,
                                                      "n00001": ActionState.SUCCEEDED}
    assert sorted(restarted.state.held()) == ["n00000", "n00001"]


def test_an_action_in_flight_too_old_to_trust_is_failed_for_a_person_after_a_restart(store):
    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster, armed=True)
    d = Decision(clock.t, "n00001", None, Action.DRAIN, FaultClass.IB_LINK, 1.0, "x", "rule", Grade.CERTAIN)
    store.insert(replace(e._record(d, clock.t, True, {}), state=ActionState.EXECUTING, attempts=1))
    clock.t += 7200                                       # down for two hours
    restarted = engine(store, clock, cluster)
    assert cluster.calls == [] and store.query()[0].state is ActionState.FAILED
    assert restarted.state.held() == []


def test_a_restart_remembers_the_nodes_gpuops_holds_and_does_not_drain_them_again(store):
    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster, armed=True)
    e.tick(fleet(3, clock.t, rule_nodes=[0]), explain)
    cluster.set_status(NodeStatus("n00002", drained=True, ours=True, reason="gpuops: drain id=lost"))
    restarted = engine(store, clock, cluster)
    assert sorted(restarted.state.held()) == ["n00000", "n00002"]
    clock.t += 60
    assert [r.kind for r in restarted.tick(fleet(3, clock.t, rule_nodes=[0]), explain)] == []
    assert [c.node for c in cluster.calls] == ["n00000"]


def test_a_held_node_is_resumed_after_clean_telemetry_and_only_its_own_drain(store):
    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster, armed=True)
    e.tick(fleet(2, clock.t, rule_nodes=[0]), explain)
    resumed = []
    for _ in range(20):
        clock.t += 60
        resumed += [r for r in e.tick(fleet(2, clock.t), explain) if r.kind is ActionKind.RESUME]
    assert [(r.node, r.state) for r in resumed] == [("n00000", ActionState.SUCCEEDED)]
    assert not cluster.status("n00000").drained and "n00000" not in e.holds


def test_a_node_whose_gpu_is_gone_for_good_stays_held_until_a_person_forces_its_resume(store):
    from dataclasses import replace

    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster, armed=True)
    e.tick(fleet(2, clock.t, rule_nodes=[0], rule_fault="gpu_off_bus"), explain)   # XID 79: drained
    resumed = []
    for _ in range(40):                         # the other GPUs read healthy; the lost one never comes back
        clock.t += 60
        scores = replace(fleet(2, clock.t), gpus_lost=np.array([1, 0]))
        resumed += [r for r in e.tick(scores, explain) if r.kind is ActionKind.RESUME]
    assert resumed == [] and "n00000" in e.holds
    plain = e.request(ActionKind.RESUME, "n00000", "GPU 3 pulled for RMA", "operator:fay", dry_run=False)
    assert plain.state is ActionState.REJECTED and "clean telemetry" in store.history(plain.id)[-1]["note"]
    clock.t += 60                                # a retry within the minute is the same request
    forced = e.request(ActionKind.RESUME, "n00000", "GPU 3 pulled for RMA", "operator:fay", dry_run=False,
                       force=True)
    assert forced.state is ActionState.SUCCEEDED and not cluster.status("n00000").drained


@pytest.mark.parametrize("last_record", ["the engine's drain", "a person's drain after it"])
def test_a_restart_of_both_the_engine_and_its_scorer_during_a_repair_still_waits_for_every_gpu(store, last_record):
    """Drained on XID 79 with 8 GPUs reading; the engine and the scoring worker both restart while the GPU is away,
    so the new scorer never saw it go (gpus_lost 0) and the node reads 7. The engine's hold record carries the count
    (read back even when a person's drain came after it), and the node is resumed only once it reads 8 again and
    stays healthy."""
    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster, armed=True)
    e.tick(replace(fleet(2, clock.t, rule_nodes=[0], rule_fault="gpu_off_bus"), gpus_reading=np.array([8, 8])),
           explain)
    if last_record == "a person's drain after it":
        clock.t += 60
        e.request(ActionKind.DRAIN, "n00000", "GPU 3 reseat scheduled", "operator:fay", dry_run=False)
    assert [r.evidence.get("held_gpus") for r in store.query() if r.actor == ENGINE_ACTOR] == [8]
    clock.t += 60
    restarted = engine(store, clock, cluster)
    assert restarted.state.nodes["n00000"].held_gpus == 8
    resumed_at = []
    for minute in range(60):                     # the GPU reads again after 30 minutes
        clock.t += 60
        reading = np.array([7 if minute < 30 else 8, 8])
        scores = replace(fleet(2, clock.t), gpus_lost=np.array([0, 0]), gpus_reading=reading)
        resumed_at += [minute for r in restarted.tick(scores, explain) if r.kind is ActionKind.RESUME]
    assert resumed_at == [30 + POLICY.resume_after_s // 60]
    assert not cluster.status("n00000").drained


def test_a_node_a_person_took_out_stays_theirs_after_a_restart(store):
    """gpuops never resumes a node a person drained; an engine restart does not turn that drain into one of its
    own holds (it used to, and then resumed the node once its telemetry read clean). The person resumes it."""
    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster, armed=True)
    e.tick(fleet(2, clock.t), explain)
    e.request(ActionKind.DRAIN, "n00000", "fan replaced, burn-in pending", "operator:fay", dry_run=False)
    for restart in (False, True):
        if restart:
            e = engine(store, clock, cluster)
        assert "n00000" in e.holds and "n00000" not in e.state.held()
        for _ in range(60):                       # an hour of clean telemetry
            clock.t += 60
            assert [r.kind for r in e.tick(fleet(2, clock.t), explain)] == []
        assert cluster.status("n00000").drained
    plain = e.request(ActionKind.RESUME, "n00000", "burn-in passed", "operator:fay", dry_run=False)
    assert plain.state is ActionState.REJECTED and "taken out by operator:fay" in store.history(plain.id)[-1]["note"]
    clock.t += 60                                # a retry within the minute is the same request
    forced = e.request(ActionKind.RESUME, "n00000", "burn-in passed", "operator:fay", dry_run=False, force=True)
    assert forced.state is ActionState.SUCCEEDED and not cluster.status("n00000").drained


@pytest.mark.parametrize("came_true", [False, True])
def test_a_restart_keeps_the_retry_cap_of_a_prediction_that_came_back_healthy(store, came_true):
    """A node drained on an nvlink prediction and resumed healthy is not drained again on the next one within
    model_retry_window_s, restart or not (the cap is rebuilt from the store); another class's prediction still
    drains it (model_retry_per_fault). A prediction whose failure came while the node was held caps nothing."""
    clock, cluster = Clock(), Cluster()
    policy = POLICY.model_copy(update={"false_budget_per_1k_node_days": 0.0})   # the cap alone, not the brake
    e = engine(store, clock, cluster, armed=True, policy=policy)
    for p in [0.9] * 3:                               # predicted: drained
        clock.t += 60
        e.tick(fleet(2, clock.t, p=[p, 0.0]), explain)
    if came_true:                                     # the failure came while it was held: a rule acted
        clock.t += 60
        e.tick(fleet(2, clock.t, rule_nodes=[0], rule_fault="nvlink", p=[0.9, 0.0]), explain)
    resumed = []
    for _ in range(30):                               # healthy again: resumed
        clock.t += 60
        resumed += [r.node for r in e.tick(fleet(2, clock.t), explain) if r.kind is ActionKind.RESUME]
    assert resumed == ["n00000"] and not cluster.status("n00000").drained
    e = engine(store, clock, cluster, armed=True, policy=policy)
    acted = []
    for fault in ["nvlink"] * 4 + ["ib_link"] * 3:    # the same class again, then another
        clock.t += 60
        acted += [(r.kind, r.fault) for r in e.tick(fleet(2, clock.t, p=[0.9, 0.0], fault=fault), explain)
                  if r.kind is not ActionKind.ALERT]
    first = ("nvlink" if came_true else "ib_link")
    assert acted[:1] == [(ActionKind.DRAIN, first)] and cluster.status("n00000").drained


@pytest.mark.parametrize("restart", [False, True])
@pytest.mark.parametrize("found", ["healthy", "faulty"])
def test_a_person_who_found_the_node_faulty_lifts_the_retry_cap_of_its_prediction(store, found, restart):
    """A person's verdict on a prediction hold: "faulty" proves the prediction right, so after the node is back the
    next prediction of that class drains as on any node; "healthy" leaves the cap (it only alerts). Kept across a
    restart, which rebuilds the cap from the records and their verdicts."""
    clock, cluster = Clock(), Cluster()
    policy = POLICY.model_copy(update={"false_budget_per_1k_node_days": 0.0})
    e = engine(store, clock, cluster, armed=True, policy=policy)
    drains = []
    for _ in range(3):
        clock.t += 60
        drains += [r for r in e.tick(fleet(2, clock.t, p=[0.9, 0.0]), explain) if r.kind is ActionKind.DRAIN]
    e.verdict(drains[0].id, found, "operator:fay", "dcgmi diag")
    for _ in range(30):                               # repaired or not, it reads healthy: resumed
        clock.t += 60
        e.tick(fleet(2, clock.t), explain)
    assert not cluster.status("n00000").drained
    if restart:
        e = engine(store, clock, cluster, armed=True, policy=policy)
    acted = []
    for _ in range(4):
        clock.t += 60
        acted += [r.kind for r in e.tick(fleet(2, clock.t, p=[0.9, 0.0]), explain) if r.kind is not ActionKind.ALERT]
    assert (ActionKind.DRAIN in acted) is (found == "faulty")


def test_an_operator_request_is_a_dry_run_unless_asked_and_resume_waits_for_clean_telemetry(store):
    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster, armed=True)
    rec = e.request(ActionKind.DRAIN, "n00004", "bad fan noticed on the floor", "operator:fay")
    assert rec.dry_run and rec.actor == "operator:fay" and cluster.calls == []
    assert e.request(ActionKind.DRAIN, "n00004", "bad fan noticed on the floor", "operator:fay").id == rec.id
    real = e.request(ActionKind.DRAIN, "n00005", "bad fan", "operator:fay", dry_run=False)
    assert real.state is ActionState.SUCCEEDED and [c.node for c in cluster.calls] == ["n00005"]
    clock.t += 60
    early = e.request(ActionKind.RESUME, "n00005", "looks fine", "operator:fay", dry_run=False)
    assert early.state is ActionState.REJECTED and "clean telemetry" in store.history(early.id)[-1]["note"]
    with pytest.raises(ValueError):
        e.request(ActionKind.DRAIN, "n00005", "  ", "operator:fay")


def test_a_gpu_reset_goes_to_the_agent_and_its_result_is_recorded(store):
    clock, cluster = Clock(), Cluster()
    sent = []

    class Channel:
        def send_reset(self, aid, node, gpu, reason, now):
            sent.append((aid, node, gpu))

    e = engine(store, clock, cluster, armed=True, commands=Channel())
    rec = e.tick(fleet(2, clock.t, rule_nodes=[1], rule_action=Action.RESET, rule_fault="hbm_ecc"), explain)[0]
    assert rec.state is ActionState.EXECUTING and sent == [(rec.id, "n00001", 1)]
    assert e.on_command_result(rec.id, "succeeded", "reset in 4.1 s").state is ActionState.SUCCEEDED

    rec2 = e.request(ActionKind.RESET, "n00000", "reset by hand", "operator:gil", gpu=0, dry_run=False)
    clock.t += 301
    e.maintain()
    assert store.get(rec2.id).state is ActionState.FAILED and len(sent) == 2     # timed out, never re-sent


def test_a_drain_with_a_reset_when_idle_sends_the_reset_once_the_node_is_idle(store):
    clock = Clock()
    cluster = Cluster([NodeStatus("n00000", jobs=("1234",))])
    sent = []

    class Channel:
        def send_reset(self, aid, node, gpu, reason, now):
            sent.append(node)

    e = engine(store, clock, cluster, armed=True, commands=Channel())
    rec = e.tick(fleet(2, clock.t, rule_nodes=[0], rule_fault="hbm_ecc", follow_up=FollowUp.RESET_WHEN_IDLE),
                 explain)[0]
    assert rec.kind is ActionKind.DRAIN_RESET and rec.state is ActionState.SUCCEEDED
    e.maintain()
    assert sent == []                                     # the job still runs
    cluster.set_status(NodeStatus("n00000", drained=True, ours=True, reason="gpuops: x"))
    e.maintain()
    e.maintain()
    assert sent == ["n00000"]
    e.on_command_result(rec.id, "succeeded", "ok")
    assert store.get(rec.id).result["follow_up_state"] == "succeeded"


def test_a_standby_records_a_persons_approval_and_the_leader_carries_it_out(store):
    clock, cluster = Clock(), Cluster()
    leader = engine(store, clock, cluster, safety=LOOSE.model_copy(update={"require_approval": frozenset({ActionKind.DRAIN})}),
                    armed=True)
    rec = leader.tick(fleet(2, clock.t, rule_nodes=[0]), explain)[0]
    assert rec.blocked_by == "approval"
    standby = engine(store, clock, cluster)
    standby.acting = False
    assert standby.approve(rec.id, "operator:hal").state is ActionState.APPROVED
    standby.maintain()
    assert cluster.calls == []
    leader.maintain()
    assert [c.node for c in cluster.calls] == ["n00000"] and store.get(rec.id).state is ActionState.SUCCEEDED
    leader.maintain()
    assert store.get(rec.id).state is ActionState.VERIFIED


def test_alerts_are_recorded_once_and_never_revisited_by_the_maintenance_pass(store):
    clock, cluster = Clock(), Cluster()
    e = engine(store, clock, cluster, armed=True)
    alert = e.tick(fleet(3, clock.t, rule_nodes=[1], rule_action=Action.ALERT), explain)[0]
    assert (alert.kind, alert.state) == (ActionKind.ALERT, ActionState.SUCCEEDED)
    e.tick(fleet(3, clock.t + 60, rule_nodes=[1]), explain)           # now the node is drained by gpuops
    for _ in range(3):
        e.maintain()
    assert store.get(alert.id).state is ActionState.SUCCEEDED and len(store.history(alert.id)) == 1
