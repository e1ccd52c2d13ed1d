"""Replay end to end: the report of spec/recording.md, the baseline beside it, and decisions that
do not depend on how another tool laid the recording out."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from api.cli import build_cli
from api.replay import Replayer, build_report, dry_run_engine
from collector.simulator import SimConfig, simulate_recording
from models.bundle import ModelBundle, default_model_path
from remediation.config import PolicyConfig
from remediation.safety import SafetyConfig
from tests.foreign import rename, write_foreign


@pytest.fixture(scope="module")
def small_recording(tmp_path_factory):
    out = tmp_path_factory.mktemp("rec") / "sim"
    simulate_recording(SimConfig(nodes=10, hours=8, seed=4, rate_multiplier=1500), out)
    return out


@pytest.fixture(scope="module")
def bundle():
    return ModelBundle.load(default_model_path())


def test_replay_command_writes_the_spec_report_with_metrics_and_html(small_recording, tmp_path):
    res = CliRunner().invoke(build_cli(), ["replay", str(small_recording), "--report", str(tmp_path / "r.json"),
                                           "--html", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["recording"] == str(small_recording)
    ts = [d["ts"] for d in rep["decisions"]]
    assert ts == sorted(ts) and rep["decisions"]
    assert set(rep["decisions"][0]) >= {"ts", "node", "gpu", "action", "fault", "score", "reason"}
    for who in ("model", "rules_baseline"):
        assert {"recall", "predictive_recall", "median_lead_s", "false_actions_per_1k_node_days",
                "alerts_per_1k_node_days", "actions_by_grade", "actions_by_follow_up",
                "per_class", "idle_gpu_h", "saved_gpu_h"} <= set(rep["metrics"][who])
    assert {d["grade"] for d in rep["decisions"]} <= {"certain", "corroborated", "predicted", "advisory"}
    assert "alerts_per_1k_node_days" in res.output
    assert "<img" in (tmp_path / "r.html").read_text()


def test_replay_of_a_missing_recording_fails_with_a_clear_error(tmp_path):
    res = CliRunner().invoke(build_cli(), ["replay", str(tmp_path / "nope"), "--report", str(tmp_path / "r.json")])
    assert res.exit_code == 2 and "not a directory" in " ".join(res.output.split())


def test_decisions_do_not_depend_on_the_recording_layout(small_recording, bundle, tmp_path):
    foreign = write_foreign(small_recording, tmp_path / "foreign")
    cfg = PolicyConfig()
    a = Replayer(bundle, cfg).run(small_recording)
    b = Replayer(bundle, cfg).run(foreign)
    key = lambda d: (d.ts, d.action, d.fault, d.gpu)  # noqa: E731
    assert [key(d) for d in a.decisions] == [key(d) for d in b.decisions]
    assert [rename(d.node) for d in a.decisions] == [d.node for d in b.decisions]
    rep = build_report(foreign, b, {}, cfg)
    assert rep["metrics"]["model"]["recall"] == build_report(small_recording, a, {}, cfg)["metrics"]["model"]["recall"]


def test_missing_optional_columns_and_unsupported_fields_catch_what_the_full_recording_catches(
        small_recording, bundle, tmp_path):
    degraded = write_foreign(small_recording, tmp_path / "degraded", degrade=True, keep_net=True)
    cfg = PolicyConfig()
    full = build_report(small_recording, Replayer(bundle, cfg).run(small_recording), {}, cfg)["metrics"]["model"]
    m = build_report(degraded, Replayer(bundle, cfg).run(degraded), {}, cfg)["metrics"]["model"]
    caught = lambda r: {i["id"] for i in r["per_incident"] if i["caught"]}  # noqa: E731
    assert caught(m) >= caught(full) and m["false_actions"] <= full["false_actions"]
    assert m["actions_on_app_errors"] == 0


def test_the_model_catches_more_failures_early_than_the_rules(small_recording, bundle):
    cfg = PolicyConfig()
    rep = build_report(small_recording, Replayer(bundle, cfg).run(small_recording), {}, cfg)
    m, b = rep["metrics"]["model"], rep["metrics"]["rules_baseline"]
    assert m["node_fault_incidents"] >= 5
    assert m["recall"] >= b["recall"]
    assert m["caught_predictively"] > b["caught_predictively"]
    assert m["actions_on_app_errors"] == 0
    for d in rep["decisions"]:
        if d["source"] == "model" and d["action"] in ("reset", "requeue"):
            assert d["grade"] == "corroborated", d           # never a hard action on a prediction alone
        if d["source"] == "anomaly":
            assert "most off" in d["reason"] and ("healthy p" in d["reason"] or "baseline" in d["reason"]), d


def test_a_replay_through_the_dry_run_engine_takes_the_same_actions_as_the_replay_report(small_recording, bundle):
    cfg = PolicyConfig()
    plain = Replayer(bundle, cfg).run(small_recording)
    wide_open = SafetyConfig(max_held_nodes=10_000, max_held_fraction=1, max_held_fraction_per_partition=1,
                             max_actions_per_window=10_000, breaker_nodes=10_000, breaker_fraction=1,
                             node_cooldown_s=0, lemon_actions=10_000)
    engine = dry_run_engine(cfg, wide_open)
    through = Replayer(bundle, cfg, engine=engine).run(small_recording)
    assert [d.to_dict() for d in through.decisions] == [d.to_dict() for d in plain.decisions]
    acting = [(d.node, d.ts, d.action.value) for d in plain.decisions if d.action.value != "alert"]
    assert acting, "the recording must make the policy act"
    recorded = [(r.node, r.incident_ts, "drain" if r.kind.value.startswith("drain") else r.kind.value)
                for r in through.actions if r.kind.value != "alert"]
    assert recorded == acting
    assert {r.dry_run for r in through.actions} == {True}
    assert all(r.state.value in ("succeeded", "verified") for r in through.actions)
    assert len(engine[0].store.query(limit=100_000)) == len(through.actions)


def test_a_replay_through_the_engine_with_default_limits_shows_what_safety_held_back(small_recording, bundle):
    cfg = PolicyConfig()
    tight = SafetyConfig(max_held_nodes=1)
    through = Replayer(bundle, cfg, engine=dry_run_engine(cfg, tight)).run(small_recording)
    held = [r for r in through.actions if r.blocked_by == "cap_held"]
    assert held and all(r.state.value in ("proposed", "cancelled") for r in held)


def test_replay_with_a_safety_file_runs_through_the_engine_and_reports_what_it_held_back(small_recording, tmp_path):
    (tmp_path / "s.yaml").write_text("safety: {max_held_nodes: 1}\n")
    res = CliRunner().invoke(build_cli(), ["replay", str(small_recording), "--report", str(tmp_path / "r.json"),
                                           "--safety", str(tmp_path / "s.yaml")])
    assert res.exit_code == 0, res.output
    eng = json.loads((tmp_path / "r.json").read_text())["engine"]
    assert eng["actions"] > 0 and eng["blocked_by"].get("cap_held", 0) > 0
    bad = CliRunner().invoke(build_cli(), ["replay", str(small_recording), "--report", str(tmp_path / "r2.json"),
                                           "--safety", str(tmp_path / "nope.yaml")])
    assert bad.exit_code == 2 and "cannot read safety" in " ".join(bad.output.split())


def test_an_observer_sees_every_scored_tick_with_the_scores_the_decisions_came_from(small_recording, bundle):
    seen = []
    result = Replayer(bundle, PolicyConfig(), observe=lambda b, s: seen.append((b.ts, len(b), len(s.p_fail)))).run(
        small_recording)
    ts = [t for t, _, _ in seen]
    assert ts == sorted(ts) and len(ts) == result.stats["ticks"]
    assert all(rows == scores > 0 for _, rows, scores in seen)
    assert result.decisions == Replayer(bundle, PolicyConfig()).run(small_recording).decisions  # it only watches


def test_a_node_drained_for_a_gpu_off_the_bus_is_not_resumed_while_the_gpu_sends_nothing(small_recording, bundle,
                                                                                       tmp_path):
    """The collector's form of a lost GPU: no row at all (the simulator writes rows of nulls). Without
    resume_needs_every_gpu the drained node came back at min_hold_s with its GPU still gone."""
    import shutil

    import pandas as pd

    lost = tmp_path / "lost"
    shutil.copytree(small_recording, lost)
    g = pd.read_parquet(lost / "gpu.parquet")
    values = [c for c in g.columns if c not in ("ts", "node", "gpu", "gpu_uuid", "pci_bus_id")]
    nulls = g[values].isna().all(axis=1)
    gone = g[nulls].groupby(["node", "gpu"]).ts.agg(["min", "max"])
    assert len(gone) >= 1                                        # the recording has a GPU off the bus
    g[~nulls].to_parquet(lost / "gpu.parquet", index=False)
    before = Replayer(bundle, PolicyConfig(resume_needs_every_gpu=False)).run(lost)
    assert before.stats["resumed_with_gpu_lost"]["model"] >= 1
    after = Replayer(bundle, PolicyConfig()).run(lost)
    assert after.stats["resumed_with_gpu_lost"] == {"model": 0, "rules_baseline": 0}
    for (node, _), (_, back) in gone.iterrows():
        assert all(d.ts >= back for d in after.decisions if d.node == node and d.action.value == "resume")
