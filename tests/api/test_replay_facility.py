"""Replay: healthy nodes of one rack that show the same signal at the same moment give one grouped
alert and no drains, and the report's engine summary counts the held-back drains under ``facility``.

The ticks are NodeScores built here and run through the replay's own dry-run engine
(:func:`api.replay.dry_run_engine`, telemetry-time clock, default safety limits), not a simulator
recording: the simulator's rack-wide power brake is already absorbed by the ``hw_power_brake``
rule's own guard (``unless_at_least other_nodes_power_brake_short``), so no decision from it ever
reaches the engine; these ticks stand for a signal with no such guard (a model score, a rule
without it) arriving on a whole rack at once."""

from __future__ import annotations

from api.commands.replay import engine_summary
from api.replay import dry_run_engine
from remediation.actions import ActionKind
from remediation.adapters.base import NodeStatus
from remediation.safety import SafetyConfig

from tests.remediation.test_engine import POLICY, explain, fleet

T0 = 1_760_000_000.0


def test_a_rack_showing_the_same_signal_at_once_gives_one_grouped_alert_and_no_drains() -> None:
    engine, clock = dry_run_engine(POLICY, SafetyConfig())
    for i in range(32):
        engine.adapter.set_status(NodeStatus(name=f"n{i:05d}", extra={"rack": f"r{i // 8}"}))
    engine.refresh_view()
    actions = []
    for k in range(10):                                  # 10 ticks, 60 s apart; the brake from tick 3 to 7
        clock.now = T0 + 60 * k
        braking = [8, 9, 10, 11, 12] if 3 <= k <= 7 else []
        actions += engine.tick(fleet(32, clock.now, rule_nodes=braking, rule_fault="power", fault="power"), explain)
    alerts = [a for a in actions if a.kind is ActionKind.ALERT]
    assert [(a.node, a.fault) for a in alerts] == [("facility:rack/r1", "power")]
    assert [c for c in engine.dry.calls if c.verb == "drain"] == []
    summary = engine_summary(actions)
    assert set(summary["suppressed_by_cause"]) == {"facility"} and summary["suppressed_by_cause"]["facility"] >= 5
    assert summary["by_kind_state"]["alert:succeeded"] == 1
