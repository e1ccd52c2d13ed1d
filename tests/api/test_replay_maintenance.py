"""Replay honours operator maintenance events: a link flap inside a declared maintenance window gives
no action, and the report counts the held-back decision under ``maintenance`` (gpuops issue 13).

The recording is the simulator's: a small fleet whose only incidents are InfiniBand link faults
(symbol errors and link recoveries, then the link goes down), so the ``ib_port_down`` rule drains
each failing node. One copy of it gets an operator maintenance event (collector/operator_events.py
format, in ``events.jsonl``) around one node's failure; the other copy is the control.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from api.commands.replay import engine_summary
from api.replay import Replayer, build_report, dry_run_engine, headline
from collector.operator_events import maintenance_event
from collector.schema import FaultClass
from collector.simulator import SimConfig, simulate_recording
from models.bundle import ModelBundle
from remediation.actions import ActionKind, ActionState
from remediation.config import PolicyConfig
from remediation.safety import SafetyConfig

REPO = Path(__file__).resolve().parents[2]
SIM = SimConfig(nodes=4, hours=4, seed=7, rate_multiplier=3000, mix={FaultClass.IB_LINK: 1.0})


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> tuple[Path, Path, dict]:
    """(control, with a maintenance window on the first incident's node, that incident)."""
    root = tmp_path_factory.mktemp("maint")
    control = root / "control"
    simulate_recording(SIM, control)
    incidents = [json.loads(line) for line in (control / "incidents.jsonl").read_text().splitlines()]
    inc = min(incidents, key=lambda i: i["failure_ts"])
    assert inc["fault"] == "ib_link"
    maint = root / "maintenance"
    shutil.copytree(control, maint)
    ev = maintenance_event([inc["node"]], *_window(inc), "leaf switch firmware upgrade", author="alice")
    with (maint / "events.jsonl").open("a") as f:
        f.write(json.dumps(ev) + "\n")
    return control, maint, inc


def _acting(decisions, node: str, inside: tuple[float, float] | None = None) -> list:
    lo, hi = inside or (float("-inf"), float("inf"))
    return [d for d in decisions if d.node == node and d.action.value != "alert" and lo <= d.ts < hi]


def _window(inc: dict) -> tuple[float, float]:
    return inc["onset_ts"] - 600, inc["failure_ts"] + 3600


def test_a_link_fault_inside_a_maintenance_window_gives_no_action_in_a_policy_replay(recordings) -> None:
    control, maint, inc = recordings
    node = inc["node"]
    base = Replayer(ModelBundle.rules_only(), PolicyConfig()).run(control)
    got = Replayer(ModelBundle.rules_only(), PolicyConfig()).run(maint)
    # the control acts on the node once its link is down ...
    assert [(d.action.value, d.fault.value) for d in _acting(base.decisions, node)][:1] == [("drain", "ib_link")]
    assert base.stats["suppressed_by_cause"] == {} and base.suppressed == []
    # ... the declared window holds that back, on the model path and the rules-only baseline alike
    inside = _window(inc)
    assert _acting(got.decisions, node, inside) == [] and _acting(got.baseline_decisions, node, inside) == []
    # and once it has ended, the link still down, gpuops acts: the window let go of the node
    assert _acting(got.decisions, node)[0].ts >= _window(inc)[1]
    assert got.suppressed and {(s.decision.node, s.cause) for s in got.suppressed} == {(node, "maintenance")}
    assert got.stats["suppressed_by_cause"] == {"maintenance": len(got.suppressed)}
    assert got.stats["baseline_suppressed_by_cause"] == {"maintenance": len(got.baseline_suppressed)}
    # the other nodes are untouched by the window
    others = lambda ds: [(d.ts, d.node, d.action) for d in ds if d.node != node]  # noqa: E731
    assert others(got.decisions) == others(base.decisions) and others(got.decisions)


def test_the_replay_report_lists_what_maintenance_held_back(recordings) -> None:
    _, maint, inc = recordings
    result = Replayer(ModelBundle.rules_only(), PolicyConfig()).run(maint)
    report = build_report(maint, result, {}, PolicyConfig())
    held = report["suppressed"]["model"]
    assert held and {(h["node"], h["action"], h["cause"]) for h in held} == {(inc["node"], "drain", "maintenance")}
    assert held[0]["window"]["reason"] == "leaf switch firmware upgrade"
    assert report["summary"]["maintenance_windows"] == 1
    assert [e["kind"] for e in report["operator_events"][inc["node"]]] == ["maintenance"]
    assert headline(report)["suppressed_by_cause"] == {"maintenance": len(held)}


@pytest.mark.parametrize("with_window", [False, True])
def test_the_dry_run_engine_records_the_drain_as_suppressed_by_maintenance(recordings, with_window) -> None:
    control, maint, inc = recordings
    node = inc["node"]
    engine = dry_run_engine(PolicyConfig(), SafetyConfig())
    result = Replayer(ModelBundle.rules_only(), PolicyConfig(), engine=engine).run(maint if with_window else control)
    drains = [c for c in engine[0].dry.calls if c.node == node and c.verb == "drain"]
    lo, hi = _window(inc)
    mine = [a for a in result.actions if a.node == node and a.kind is not ActionKind.ALERT and lo <= a.incident_ts < hi]
    summary = engine_summary(engine[0].store.query(limit=100_000))
    if not with_window:                                    # the control: the engine drains the node
        assert len(drains) == 1 and "maintenance" not in summary["suppressed_by_cause"]
        return
    assert drains == [] and mine                        # every decision in the window recorded, none carried out
    assert all(a.state is ActionState.REJECTED and a.blocked_by.startswith("maintenance:sil-") for a in mine)
    assert summary["suppressed_by_cause"]["maintenance"] == len(mine)
    later = [a for a in result.actions if a.node == node and a.incident_ts >= hi]
    assert later and not any((a.blocked_by or "").startswith("maintenance") for a in later)


def test_the_replay_command_with_safety_counts_the_window_under_maintenance(recordings, tmp_path) -> None:
    from typer.testing import CliRunner

    from api.cli import build_cli

    _, maint, _ = recordings
    res = CliRunner().invoke(build_cli(), ["replay", str(maint), "--rules-only", "--report", str(tmp_path / "r.json"),
                                           "--safety", str(REPO / "deploy/config/safety.example.yaml")])
    assert res.exit_code == 0, res.output
    engine = json.loads((tmp_path / "r.json").read_text())["engine"]
    assert engine["suppressed_by_cause"].get("maintenance", 0) >= 1
    assert all(k.startswith("maintenance:sil-") for k in engine["blocked_by"] if k.startswith("maintenance"))
