"""RecentActions: the counts the safety gate reads, and what it lets go."""

from __future__ import annotations

from remediation.actions import ENGINE_ACTOR, ActionKind, ActionRecord, ActionState
from remediation.recent import RecentActions
from remediation.safety import SafetyConfig

CFG = SafetyConfig(action_window_s=3600, node_cooldown_s=1800, lemon_window_s=7 * 86400, breaker_window_s=600)


def _drain(node: str, at: float, actor: str = ENGINE_ACTOR) -> ActionRecord:
    return ActionRecord(id=f"{node}-{at}", node=node, kind=ActionKind.DRAIN, state=ActionState.SUCCEEDED,
                        reason="test", actor=actor, incident_ts=at, created_at=at, updated_at=at)


def _snap(recent: RecentActions, now: float):
    return recent.snapshot(now, CFG, fleet_size=100, held=set(), partition_of={}, partition_size={},
                           paused=False, breaker_open=False)


def test_counts_come_from_gpuops_own_actions_within_each_window():
    recent = RecentActions()
    recent.load([_drain("a", 0.0), _drain("a", 5000.0), _drain("b", 5000.0, actor="alice")])
    snap = _snap(recent, 6000.0)
    assert snap.actions_in_window == 1                      # a@5000 only: b was a person's, a@0 is out of the hour
    assert snap.last_action_at == {"a": 5000.0} and snap.recent_holds == {"a": 2}


def test_actions_older_than_every_window_are_let_go_and_change_no_count():
    recent = RecentActions()
    week = 7 * 86400
    recent.load([_drain(f"n{i}", float(i)) for i in range(1000)])
    recent.add(_drain("late", week + 500.0), automatic=True)
    snap = _snap(recent, week + 600.0)
    assert [p.node for p in recent.past] == [f"n{i}" for i in range(601, 1000)] + ["late"]
    assert snap.recent_holds["n999"] == 1 and "n0" not in snap.recent_holds
    assert snap.actions_in_window == 1


def test_an_escalation_counts_towards_the_rate_cap_but_is_not_a_second_take_out():
    from dataclasses import replace

    recent = RecentActions()
    recent.load([_drain("a", 0.0), replace(_drain("a", 100.0), kind=ActionKind.RESET, escalates=True)])
    snap = _snap(recent, 200.0)
    assert snap.recent_holds == {"a": 1} and snap.actions_in_window == 2


def test_an_escalation_whose_hold_was_rejected_is_the_nodes_take_out_after_a_restart():
    """A person turned down the pending drain after gpuops' reset escalated it: the store keeps
    the drain rejected and the reset as an escalation; the reset still took the node out."""
    from dataclasses import replace

    rejected = replace(_drain("a", 0.0), state=ActionState.REJECTED)
    reset = replace(_drain("a", 100.0), kind=ActionKind.RESET, escalates=True)
    recent = RecentActions()
    recent.load([rejected, reset])
    assert _snap(recent, 200.0).recent_holds == {"a": 1}
    live = RecentActions()                       # the engine that ran them counted the drain when proposed
    live.add(_drain("a", 0.0), automatic=True)
    live.add(reset, automatic=True)
    assert _snap(live, 200.0).recent_holds == {"a": 1}  # the same count before and after the restart


def test_an_escalation_counts_once_however_the_records_are_ordered_and_only_within_the_lemon_window():
    from dataclasses import replace

    week = CFG.lemon_window_s
    reset = replace(_drain("a", 100.0), kind=ActionKind.RESET, escalates=True)
    recent = RecentActions()
    recent.load([reset, _drain("a", 0.0)])        # store order is not time order
    assert _snap(recent, 200.0).recent_holds == {"a": 1}
    recent = RecentActions()
    recent.load([_drain("a", 0.0), replace(reset, created_at=week + 50.0)])
    # the drain has left the lemon window: the escalation, still in it, is what remains of the take-out
    assert _snap(recent, week + 60.0).recent_holds == {"a": 1}
