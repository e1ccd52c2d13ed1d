"""The people's commands against the real API (uvicorn on 127.0.0.1): readable tables, ``--json`` for
scripts, URL and token from the environment, the server's message and exit 2 on refusal, and the
token never printed."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from api.cli import build_cli
from tests.api.conftest import TOKENS


@pytest.fixture
def gpuops(live_api):
    runner = CliRunner()
    app = build_cli()

    def run(*args: str, role: str | None = "operator", env: dict | None = None):
        base = {"GPUOPS_URL": live_api, "COLUMNS": "200"}
        if role is not None:
            base["GPUOPS_TOKEN"] = TOKENS[role]
        return runner.invoke(app, list(args), env={**base, **(env or {})})

    return run


def test_nodes_prints_the_fleet_riskiest_first_and_json_for_scripts(gpuops):
    r = gpuops("nodes", role="viewer")
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if " n0000" in ln]
    assert "n00002" in lines[0] and "at_risk" in lines[0]
    body = json.loads(gpuops("nodes", "--json", "--state", "held", role="viewer").stdout)
    assert [n["node"] for n in body["nodes"]] == ["n00001"]


def test_node_shows_why_and_its_actions(gpuops):
    r = gpuops("node", "n00001", role="viewer")
    assert r.exit_code == 0, r.output
    assert "XID 79 fell off the bus" in r.output and "drain" in r.output and "held" in r.output
    assert "resume waits for: a rule still fires: XID 79 fell off the bus" in r.output


def test_node_says_which_predictions_only_alert_after_one_that_did_not_come_true(gpuops, api_ctx):
    from remediation.actions import ActionKind, ActionRecord, ActionState

    ts = json.loads(gpuops("node", "n00002", "--json", role="viewer").stdout)["ts"]
    common = {"node": "n00002", "state": ActionState.SUCCEEDED, "actor": "engine"}
    api_ctx.store.insert_many([
        ActionRecord(id="cli-wrong", kind=ActionKind.DRAIN, reason="hbm_ecc risk 90%", incident_ts=ts - 7200,
                     created_at=ts - 7200, updated_at=ts - 7200, fault="hbm_ecc", grade="predicted", source="model",
                     **common),
        ActionRecord(id="cli-healthy", kind=ActionKind.RESUME, reason="healthy for 30 min", incident_ts=ts - 3600,
                     created_at=ts - 3600, updated_at=ts - 3600, source="policy", **common)])
    r = gpuops("node", "n00002", role="viewer")
    assert r.exit_code == 0, r.output
    assert "retry cap until" in r.output and "predictions of hbm_ecc only alert for 22.0 h more" in r.output


def test_coverage_and_node_name_the_signals_a_node_does_not_send_and_what_to_enable(gpuops, api_ctx):
    from tests.api.test_coverage_api import feed

    feed(api_ctx, [{3: ["ecc", "nvlink"]}] * 3)
    r = gpuops("coverage", role="viewer")
    assert r.exit_code == 0, r.output
    ecc = next(ln for ln in r.output.splitlines() if ln.strip("│ ").startswith("ecc"))
    assert "1: n00003" in ecc and "hbm_ecc" in ecc and "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" in ecc
    body = json.loads(gpuops("coverage", "--json", role="viewer").stdout)
    assert {s["signal"]: s["count"] for s in body["signals"]}["nvlink"] == 1
    assert "does not send: ecc, nvlink" in gpuops("node", "n00003", role="viewer").output
    assert "does not send" not in gpuops("node", "n00002", role="viewer").output


def test_drain_is_a_dry_run_recorded_as_the_caller_and_listed_afterwards(gpuops, api_ctx):
    r = gpuops("drain", "n00003", "--reason", "ECC storm", "--json")
    assert r.exit_code == 0, r.output
    rec = json.loads(r.stdout)
    assert (rec["kind"], rec["dry_run"], rec["actor"]) == ("drain", True, "operator:operator")
    listed = gpuops("actions", "--node", "n00003", role="viewer")
    assert rec["id"] in listed.output and "ECC storm" in listed.output
    one = gpuops("actions", "--id", rec["id"], role="viewer")
    assert "operator:operator" in one.output and "-> executing" in one.output


def test_reset_needs_a_gpu_and_requeue_and_resume_go_through(gpuops):
    assert gpuops("reset", "n00003", "--reason", "stuck").exit_code == 2      # typer: --gpu missing
    r = gpuops("reset", "n00003", "--gpu", "2", "--reason", "stuck", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["gpu"] == 2
    assert gpuops("requeue", "n00004", "--reason", "hung").exit_code == 0


def test_a_refused_request_exits_2_with_the_server_s_message_and_never_the_token(gpuops):
    r = gpuops("drain", "n00003", "--reason", "x", role="viewer")
    assert r.exit_code == 2 and "role viewer" in r.output and "HTTP 403" in r.output
    r = gpuops("drain", "bad;node", "--reason", "x")
    assert r.exit_code == 2 and "invalid node name" in r.output
    r = gpuops("approve", "feedbeef")
    assert r.exit_code == 2 and "no action" in r.output
    r = gpuops("nodes", role=None, env={"GPUOPS_TOKEN": "wrong-secret-token"})
    assert r.exit_code == 2 and "bearer token" in r.output and "wrong-secret-token" not in r.output


def test_an_unreachable_server_is_a_clear_error(gpuops):
    r = gpuops("nodes", env={"GPUOPS_URL": "http://127.0.0.1:9"})
    assert r.exit_code == 2 and "cannot reach the gpuops API" in r.output


def test_engine_status_arm_pause_and_breaker_reset_by_role(gpuops, api_ctx):
    r = gpuops("engine", role="viewer")
    assert r.exit_code == 0 and "disarmed" in r.output and "n00001" in r.output
    assert gpuops("engine", "arm").exit_code == 2                              # operator: admin only
    assert "ARMED" in gpuops("engine", "arm", "--note", "go", role="admin").output
    assert "PAUSED" in gpuops("engine", "pause").output
    assert json.loads(gpuops("engine", "resume", "--json").stdout)["paused"] is False
    api_ctx.engine._open_breaker(20, 10)
    assert "OPEN" in gpuops("engine", role="viewer").output
    assert gpuops("engine", "breaker-reset", role="admin").exit_code == 2       # no note
    r = gpuops("engine", "breaker-reset", "--note", "collector fixed", role="admin")
    assert r.exit_code == 0 and "breaker: closed" in r.output


def test_approve_reject_and_cancel_act_on_proposals(gpuops, api_ctx):
    from tests.api.conftest import FLEET
    from tests.remediation.test_engine import explain, fleet

    api_ctx.engine.pause("operator:test")
    api_ctx.clock.t += 60
    # three independent faults (one fault on 3 of the 6 nodes at once would be a facility event)
    tick = fleet(FLEET, api_ctx.clock.t, rule_nodes=[3, 4, 5], rule_fault=["ib_link", "nvlink", "pcie"])
    recs = {r.node: r for r in api_ctx.engine.tick(tick, explain)}
    assert gpuops("approve", recs["n00003"].id, "--note", "ok").exit_code == 0
    assert json.loads(gpuops("reject", recs["n00004"].id, "--json").stdout)["state"] == "rejected"
    assert "cancelled" in gpuops("cancel", recs["n00005"].id).output
    assert gpuops("cancel", recs["n00005"].id).exit_code == 2                   # already cancelled: 409


def test_verdict_records_what_a_person_found_and_engine_shows_the_budget(gpuops, api_ctx):
    from tests.api.test_routes import _prediction_drain

    rec = _prediction_drain(api_ctx, "n00004")
    assert gpuops("verdict", rec.id, "fine").exit_code == 2                    # neither healthy nor faulty
    r = gpuops("verdict", rec.id, "healthy", "--note", "diag clean")
    assert r.exit_code == 0, r.output
    assert "[verdict: healthy]" in r.output
    r = gpuops("engine", role="viewer")
    assert "false-action budget: 5 per 1,000 node-days" in r.output and "hbm_ecc 1 ended healthy / 0 came true" \
        in r.output


def test_the_action_table_marks_an_escalation_of_a_held_node():
    from rich.console import Console

    from api.commands.remote import action_table

    base = {"node": "n1", "state": "succeeded", "actor": "engine", "created_at": 0.0, "dry_run": True, "reason": "r"}
    rows = [{**base, "id": "a1", "kind": "drain"}, {**base, "id": "a2", "kind": "reset", "gpu": 3, "escalates": True}]
    console = Console(width=200, record=True)
    console.print(action_table(rows))
    lines = {ln.split()[1]: ln for ln in console.export_text().splitlines() if ln.split()[1:2] in (["a1"], ["a2"])}
    assert "reset (escalation)" in lines["a2"] and "escalation" not in lines["a1"]


def test_the_client_starts_a_replay_with_alternative_policies_and_reads_its_summary(live_api, small_recording):
    from api.client import ApiError, GpuopsClient
    from tests.helpers import wait_until

    with GpuopsClient(live_api, TOKENS["operator"]) as c:
        with pytest.raises(ApiError, match="act_threshold") as bad:
            c.start_replay(str(small_recording), {"x": {"act_threshold": 2}})
        assert bad.value.status == 422
        job = c.start_replay(str(small_recording), {"quiet": {"actions": {"hbm_ecc": "none"}}})
        done = wait_until(lambda: (j := c.replay(job["id"]))["state"] in ("succeeded", "failed") and j, timeout_s=120)
    assert done["state"] == "succeeded", done
    assert done["params"]["compare_policies"] == {"quiet": {"actions": {"hbm_ecc": "none"}}}
    assert set(done["result"]["alternatives"]) == {"quiet"}


def test_replay_remote_has_the_service_replay_and_writes_its_report_here(gpuops, small_recording, tmp_path):
    quiet = tmp_path / "quiet.yaml"
    quiet.write_text("policy:\n  actions: {hbm_ecc: none}\n")
    report, html = tmp_path / "r.json", tmp_path / "r.html"
    r = gpuops("replay", str(small_recording), "--remote", "--compare-policy", str(quiet), "--report", str(report),
               "--html", str(html))
    assert r.exit_code == 0, r.output
    rep = json.loads(report.read_text())
    assert rep["recording"] == str(small_recording) and set(rep["alternatives"]) == {"quiet"}
    assert rep["alternatives"]["quiet"]["policy"]["actions"]["hbm_ecc"] == "none"
    assert html.read_text().startswith("<!DOCTYPE html>") and '"recall"' in r.output


def test_replay_remote_refuses_local_settings_and_a_bad_policy_before_sending(gpuops, small_recording, tmp_path):
    r = gpuops("replay", str(small_recording), "--remote", "--model", "models/default")
    assert r.exit_code == 2 and "--model cannot go with it" in r.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy:\n  act_threshold: 2\n")
    r = gpuops("replay", str(small_recording), "--remote", "--compare-policy", str(bad))
    assert r.exit_code == 2 and "act_threshold" in r.output
    r = gpuops("replay", "/nonexistent/recording", "--remote", "--report", str(tmp_path / "x.json"))
    assert r.exit_code == 2 and not (tmp_path / "x.json").exists()      # the server's 4xx, said


def test_engine_shadow_prints_each_policy_beside_the_live_one(gpuops, api_ctx):
    from remediation.config import policy_with
    from remediation.shadow import ShadowPolicies
    from tests.api.conftest import FLEET
    from tests.remediation.test_engine import explain, fleet

    assert "no shadow policies" in gpuops("engine", "shadow", role="viewer").output
    api_ctx.engine.shadow = ShadowPolicies({"rules-only": policy_with(api_ctx.engine.policy, {"use_model": False})})
    for _ in range(3):
        api_ctx.clock.t += 60.0
        api_ctx.engine.tick(fleet(FLEET, api_ctx.clock.t, rule_nodes=[3], p=[0, 0, 0.99, 0, 0, 0]), explain)
    r = gpuops("engine", "shadow", role="viewer")
    assert r.exit_code == 0, r.output
    rows = {ln.split("│")[1].strip(): ln for ln in r.output.splitlines() if ln.count("│") > 3}
    assert "ib_link 1, nvlink 1" in rows["live"] and "ib_link 1" in rows["rules-only"]
    assert "nvlink" not in rows["rules-only"]
    body = json.loads(gpuops("engine", "shadow", "--json", role="viewer").stdout)
    assert body["ticks"] == 3 and list(body["shadows"]) == ["rules-only"]
