"""The safety gate's order and caps as a pure function, and the safety file's validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from remediation.actions import ActionKind
from remediation.safety import (Outcome, SafetyConfig, SafetyConfigError, Snapshot, breaker_limit, gate, held_cap,
                                load_safety_config)

REPO = Path(__file__).resolve().parents[2]


def snap(**kw) -> Snapshot:
    return Snapshot(now=1000.0, fleet_size=kw.pop("fleet_size", 100), **kw)


def test_maintenance_and_someone_elses_drain_win_over_everything_else():
    v = gate(ActionKind.DRAIN, "a", 1000.0, snap(breaker_open=True), SafetyConfig(), maintenance=True)
    assert (v.outcome, v.blocked_by) == (Outcome.NO, "maintenance")
    v = gate(ActionKind.DRAIN, "a", 1000.0, snap(), SafetyConfig(), not_ours=True)
    assert (v.outcome, v.blocked_by) == (Outcome.NO, "not_ours")


def test_resumes_and_alerts_are_never_held_by_caps_or_the_breaker():
    s = snap(breaker_open=True, paused=True, held={f"n{i}" for i in range(50)})
    assert gate(ActionKind.RESUME, "n1", 1000.0, s, SafetyConfig()).outcome is Outcome.GO
    assert gate(ActionKind.ALERT, "n1", 1000.0, s, SafetyConfig()).outcome is Outcome.GO


def test_the_held_cap_is_the_smaller_of_the_absolute_and_fractional_caps():
    cfg = SafetyConfig(max_held_nodes=8, max_held_fraction=0.05)
    assert held_cap(cfg, 40) == 2 and held_cap(cfg, 10_000) == 8 and held_cap(cfg, 3) == 1
    assert held_cap(SafetyConfig(max_held_nodes=0), 1000) == 0
    assert gate(ActionKind.DRAIN, "c", 1000.0, snap(fleet_size=40, held={"a", "b"}), cfg).blocked_by == "cap_held"
    # a node already held may get its follow-up action without counting twice
    assert gate(ActionKind.RESET, "a", 1000.0, snap(fleet_size=40, held={"a", "b"}), cfg).outcome is Outcome.GO


def test_a_partition_is_never_emptied():
    cfg = SafetyConfig(max_held_fraction_per_partition=0.25, max_held_nodes=100, max_held_fraction=1)
    parts = {f"n{i}": ("small",) for i in range(8)}
    s = snap(held={"n0", "n1"}, partition_of=parts, partition_size={"small": 8})
    assert gate(ActionKind.DRAIN, "n2", 1000.0, s, cfg).blocked_by == "cap_partition"


def test_the_breaker_limit_scales_with_the_fleet():
    cfg = SafetyConfig(breaker_nodes=10, breaker_fraction=0.1)
    assert breaker_limit(cfg, 50) == 10 and breaker_limit(cfg, 1000) == 100


def test_stale_decisions_are_refused_and_approval_is_asked_last():
    cfg = SafetyConfig(require_approval=frozenset({ActionKind.REBOOT}))
    assert gate(ActionKind.REBOOT, "a", 0.0, snap(), cfg).blocked_by == "stale"
    assert gate(ActionKind.REBOOT, "a", 1000.0, snap(), cfg).blocked_by == "approval"
    assert gate(ActionKind.DRAIN, "a", 1000.0, snap(), cfg).outcome is Outcome.GO


def test_the_shipped_safety_example_is_valid_and_equals_the_defaults():
    assert load_safety_config(REPO / "deploy" / "config" / "safety.example.yaml") == SafetyConfig()


@pytest.mark.parametrize("text, message", [
    ("safety: {max_held_fraction: 2}", "max_held_fraction"),
    ("safety: {require_approval: [explode]}", "require_approval"),
    ("safety: {armd: true}", "armd"),
    ("- a list", "mapping"),
])
def test_an_invalid_safety_file_fails_naming_the_problem(tmp_path, text, message):
    f = tmp_path / "s.yaml"
    f.write_text(text)
    with pytest.raises(SafetyConfigError, match=message):
        load_safety_config(f)


def test_the_cooldown_holds_a_new_action_but_not_the_escalation_of_a_node_gpuops_holds():
    cfg = SafetyConfig(node_cooldown_s=1800)
    s = snap(last_action_at={"a": 900.0, "b": 900.0}, held={"a"})
    assert gate(ActionKind.DRAIN_RESET, "a", 1000.0, s, cfg).outcome is Outcome.GO
    assert gate(ActionKind.DRAIN, "b", 1000.0, s, cfg).blocked_by == "cooldown"
