"""Every route of the control API: what it answers, who may call it (no token 401, a role too low
403), and bad input refused with a 4xx in the one error shape, never a 500."""

from __future__ import annotations

import orjson
import pytest

from api.routes.nodes import NODE_ACTIONS
from remediation.actions import ActionKind, ActionRecord, ActionState
from tests.api.conftest import FLEET, headers
from tests.helpers import wait_until

# (method, path, json body, the lowest role that may call it)
ROUTES = [
    ("GET", "/v1/nodes", None, "viewer"),
    ("GET", "/v1/nodes/n00001", None, "viewer"),
    ("GET", "/v1/actions", None, "viewer"),
    ("GET", "/v1/actions/ID", None, "viewer"),
    ("POST", "/v1/actions", {"kind": "drain", "node": "n00003", "reason": "ECC storm"}, "operator"),
    ("POST", "/v1/actions/ID/approve", {"note": ""}, "operator"),
    ("POST", "/v1/actions/ID/reject", {"note": ""}, "operator"),
    ("POST", "/v1/actions/ID/cancel", {"note": ""}, "operator"),
    ("POST", "/v1/actions/ID/verdict", {"verdict": "healthy"}, "operator"),
    ("GET", "/v1/engine", None, "viewer"),
    ("POST", "/v1/engine/arm", {"note": "go"}, "admin"),
    ("POST", "/v1/engine/disarm", {"note": "stop"}, "admin"),
    ("POST", "/v1/engine/pause", {"note": "maintenance"}, "operator"),
    ("POST", "/v1/engine/resume", {"note": "done"}, "operator"),
    ("GET", "/v1/engine/breaker", None, "viewer"),
    ("GET", "/v1/coverage", None, "viewer"),
    ("POST", "/v1/engine/breaker/reset", {"note": "telemetry fixed"}, "admin"),
    ("GET", "/v1/models", None, "viewer"),
    ("GET", "/v1/models/default/metrics", None, "viewer"),
    ("POST", "/v1/models/default/activate", None, "admin"),
    ("POST", "/v1/models/train", {"recordings": ["/nonexistent"]}, "admin"),
    ("GET", "/v1/models/train/JOB", None, "viewer"),
    ("GET", "/v1/replays", None, "viewer"),
    ("POST", "/v1/replays", {"recording": "/nonexistent"}, "operator"),
    ("GET", "/v1/replays/JOB", None, "viewer"),
    ("GET", "/v1/replays/JOB/report", None, "viewer"),
    ("GET", "/v1/replays/JOB/report.html", None, "viewer"),
    ("GET", "/metrics", None, "viewer"),
]
LOWER = {"viewer": None, "operator": "viewer", "admin": "operator"}


def _call(client, method, path, body, role):
    return client.request(method, path, json=body, headers=headers(role))


def assert_error(r, status):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] and err["message"], err
    return err


@pytest.mark.parametrize("method,path,body,role", ROUTES, ids=[f"{m} {p}" for m, p, _, _ in ROUTES])
def test_a_call_without_a_token_gets_401_with_a_bearer_challenge(client, method, path, body, role):
    r = _call(client, method, path, body, None)
    assert_error(r, 401)
    assert r.headers["www-authenticate"] == "Bearer"
    r = client.request(method, path, json=body, headers={"Authorization": "Bearer not-a-token"})
    assert_error(r, 401)


@pytest.mark.parametrize("method,path,body,role", [r for r in ROUTES if r[3] != "viewer"],
                         ids=[f"{m} {p}" for m, p, _, role in ROUTES if role != "viewer"])
def test_a_role_below_the_route_s_gets_403_and_changes_nothing(client, api_ctx, method, path, body, role):
    before = (api_ctx.engine.status(), len(api_ctx.store.query(limit=1000)))
    err = assert_error(_call(client, method, path, body, LOWER[role]), 403)
    assert role in err["message"]
    assert (api_ctx.engine.status(), len(api_ctx.store.query(limit=1000))) == before


def test_health_and_readiness_need_no_token_and_readiness_says_why_not(client, api_ctx):
    assert client.get("/healthz").json()["status"] == "ok"
    assert client.get("/readyz").json()["status"] == "ready"
    api_ctx.ready = lambda: (False, "scorers 40 s behind")
    assert "scorers 40 s behind" in assert_error(client.get("/readyz"), 503)["message"]


# ---- nodes --------------------------------------------------------------------------------------

def test_the_node_list_is_the_body_prepared_at_the_last_tick(client, api_ctx):
    r = client.get("/v1/nodes", headers=headers("viewer"))
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.content == api_ctx.nodes.list_body()
    body = r.json()
    assert body["count"] == FLEET and {n["node"]: n["state"] for n in body["nodes"]}["n00001"] == "held"


def test_the_node_list_filters_by_state_and_risk_and_refuses_unknown_states(client):
    at_risk = client.get("/v1/nodes?state=at_risk", headers=headers("viewer")).json()
    assert [n["node"] for n in at_risk["nodes"]] == ["n00002"] and at_risk["count"] == 1
    risky = client.get("/v1/nodes?min_risk=0.1", headers=headers("viewer")).json()
    assert [n["node"] for n in risky["nodes"]] == ["n00001", "n00002", "n00005"]
    assert_error(client.get("/v1/nodes?state=melting", headers=headers("viewer")), 422)
    assert_error(client.get("/v1/nodes?min_risk=2", headers=headers("viewer")), 422)


def test_one_node_shows_reasons_features_history_events_and_its_actions(client):
    n = client.get("/v1/nodes/n00001", headers=headers("viewer")).json()
    assert n["state"] == "held" and n["reasons"] == {"rule": "XID 79 fell off the bus"}
    assert len(n["history"]) == 3 and n["events"][0]["xid"] == 79
    assert [(a["kind"], a["actor"]) for a in n["actions"]] == [("drain", "engine")]
    assert (n["hold"]["actor"], n["hold"]["action"]) == ("engine", n["actions"][0]["id"])
    assert "a rule still fires: XID 79 fell off the bus" in n["hold"]["waiting_for"]
    assert client.get("/v1/nodes/n00002", headers=headers("viewer")).json()["hold"] is None
    assert client.get("/v1/nodes/n00002", headers=headers("viewer")).json()["detail"] == {"ecc_sbe_rate_per_h": 12.0}


def test_a_held_node_keeps_its_hold_on_the_page_after_more_actions_than_the_page_lists(client, api_ctx):
    drain = api_ctx.store.query(node="n00001", kinds=[ActionKind.DRAIN])[0]
    t = drain.created_at
    alerts = [ActionRecord(id=f"alert-{k}", node="n00001", kind=ActionKind.ALERT, state=ActionState.SUCCEEDED,
                           reason="still fell off the bus", actor="engine", incident_ts=t + k, created_at=t + 1 + k,
                           updated_at=t + 1 + k) for k in range(NODE_ACTIONS + 5)]
    api_ctx.store.insert_many(alerts)
    n = client.get("/v1/nodes/n00001", headers=headers("viewer")).json()
    assert len(n["actions"]) == NODE_ACTIONS and drain.id not in [a["id"] for a in n["actions"]]
    assert (n["hold"]["action"], n["hold"]["kind"]) == (drain.id, "drain")
    resumed = ActionRecord(id="resume-1", node="n00001", kind=ActionKind.RESUME, state=ActionState.SUCCEEDED,
                           reason="healthy", actor="operator:ana", incident_ts=t + 99, created_at=t + 99, updated_at=t + 99)
    api_ctx.store.insert(resumed)
    assert client.get("/v1/nodes/n00001", headers=headers("viewer")).json()["hold"] is None


def test_a_node_whose_prediction_did_not_come_true_says_which_predictions_only_alert_until_when(client, api_ctx):
    ts = client.get("/v1/nodes/n00002", headers=headers("viewer")).json()["ts"]
    wrong = ActionRecord(id="drain-wrong", node="n00002", kind=ActionKind.DRAIN, state=ActionState.SUCCEEDED,
                         reason="hbm_ecc risk 90%", actor="engine", incident_ts=ts - 7200, created_at=ts - 7200,
                         updated_at=ts - 7200, fault="hbm_ecc", grade="predicted", source="model")
    api_ctx.store.insert(wrong)
    assert client.get("/v1/nodes/n00002", headers=headers("viewer")).json()["retry_cap"] is None   # still held
    api_ctx.store.insert(ActionRecord(id="resume-healthy", node="n00002", kind=ActionKind.RESUME,
                                      state=ActionState.SUCCEEDED, reason="healthy for 30 min", actor="engine",
                                      incident_ts=ts - 3600, created_at=ts - 3600, updated_at=ts - 3600,
                                      source="policy"))
    cap = client.get("/v1/nodes/n00002", headers=headers("viewer")).json()["retry_cap"]
    assert (cap["fault"], cap["action"], cap["since"], cap["until"]) == ("hbm_ecc", "drain-wrong", ts - 7200,
                                                                        ts - 7200 + 86400)
    assert cap["reason"].startswith("predictions of hbm_ecc only alert for 22.0 h more: gpuops acted on a "
                                    "prediction of hbm_ecc 2.0 h ago that did not come true")
    assert client.get("/v1/nodes/n00003", headers=headers("viewer")).json()["retry_cap"] is None


def test_an_unknown_node_is_a_404_naming_it(client):
    assert "nope" in assert_error(client.get("/v1/nodes/nope", headers=headers("viewer")), 404)["message"]


# ---- actions ------------------------------------------------------------------------------------

def test_a_manual_drain_is_a_dry_run_by_default_answers_202_and_records_the_caller(client, api_ctx):
    r = client.post("/v1/actions", json={"kind": "drain", "node": "n00003", "reason": "  ECC storm "},
                    headers=headers("operator"))
    assert r.status_code == 202, r.text
    rec = r.json()
    assert r.headers["location"] == f"/v1/actions/{rec['id']}"
    assert (rec["dry_run"], rec["adapter"], rec["actor"], rec["reason"]) == (True, "dryrun", "operator:operator",
                                                                              "ECC storm")
    polled = client.get(r.headers["location"], headers=headers("viewer")).json()
    assert polled["state"] in ("succeeded", "verified")
    assert {h["actor"] for h in polled["history"]} >= {"operator:operator"}
    assert [c.verb for c in api_ctx.engine.dry.calls][-1] == "drain"


def test_the_same_request_twice_lands_on_one_record(client):
    body = {"kind": "drain", "node": "n00004", "reason": "flaky NVLink"}
    a = client.post("/v1/actions", json=body, headers=headers("operator")).json()
    b = client.post("/v1/actions", json=body, headers=headers("operator")).json()
    assert a["id"] == b["id"]


@pytest.mark.parametrize("body,where", [
    ({"kind": "drain", "node": "n00003"}, "reason"),
    ({"kind": "drain", "node": "n00003", "reason": "   "}, "reason"),
    ({"kind": "drain", "node": "n0; rm -rf /", "reason": "x"}, "node"),
    ({"kind": "drain", "node": "-n0", "reason": "x"}, "node"),
    ({"kind": "explode", "node": "n00003", "reason": "x"}, "kind"),
    ({"kind": "alert", "node": "n00003", "reason": "x"}, "kind"),
    ({"kind": "reset", "node": "n00003", "reason": "x"}, "gpu"),
    ({"kind": "reset", "node": "n00003", "reason": "x", "gpu": -1}, "gpu"),
    ({"kind": "drain", "node": "n00003", "reason": "x", "dry_run": "maybe"}, "dry_run"),
    ({"kind": "drain", "node": "n00003", "reason": "x", "surprise": 1}, "surprise"),
])
def test_a_bad_action_request_is_a_422_saying_what_is_wrong(client, api_ctx, body, where):
    n = len(api_ctx.store.query(limit=1000))
    err = assert_error(client.post("/v1/actions", json=body, headers=headers("operator")), 422)
    assert where in err["message"] + str(err["detail"])
    assert len(api_ctx.store.query(limit=1000)) == n


def test_a_body_that_is_not_json_is_a_422_not_a_500(client):
    r = client.post("/v1/actions", content=b"{nope", headers={**headers("operator"), "content-type": "application/json"})
    assert_error(r, 422)


def test_actions_filter_by_node_state_kind_actor_and_time_and_refuse_bad_values(client, api_ctx):
    client.post("/v1/actions", json={"kind": "requeue", "node": "n00003", "reason": "hung job"},
                headers=headers("operator"))
    v = headers("viewer")
    assert [a["kind"] for a in client.get("/v1/actions?node=n00003", headers=v).json()["actions"]] == ["requeue"]
    assert {a["actor"] for a in client.get("/v1/actions?actor=engine", headers=v).json()["actions"]} == {"engine"}
    both = client.get("/v1/actions?kind=drain&kind=requeue", headers=v).json()
    assert {a["kind"] for a in both["actions"]} == {"drain", "requeue"}
    assert client.get("/v1/actions?state=proposed", headers=v).json()["actions"] == []
    assert client.get("/v1/actions?since=9999999999", headers=v).json()["count"] == 0
    page = client.get("/v1/actions?limit=1&offset=1", headers=v).json()
    assert (page["count"], page["limit"], page["offset"]) == (1, 1, 1)
    for bad in ("state=melting", "kind=explode", "limit=0", "limit=100000", "offset=-1", "since=yesterday"):
        assert_error(client.get(f"/v1/actions?{bad}", headers=v), 422)


def test_approving_a_held_proposal_runs_it_and_a_finished_one_cannot_be_approved_again(client, api_ctx):
    api_ctx.engine.pause("operator:test")                    # automatic drains now wait for a person
    api_ctx.clock.t += 60
    from tests.remediation.test_engine import explain, fleet
    (rec,) = [r for r in api_ctx.engine.tick(fleet(FLEET, api_ctx.clock.t, rule_nodes=[4]), explain)
              if r.node == "n00004"]
    assert rec.state is ActionState.PROPOSED and rec.blocked_by == "paused"
    r = client.post(f"/v1/actions/{rec.id}/approve", json={"note": "looked at it"}, headers=headers("operator"))
    assert r.status_code == 200 and r.json()["state"] in ("succeeded", "verified")
    hist = client.get(f"/v1/actions/{rec.id}", headers=headers("viewer")).json()["history"]
    assert any(h["actor"] == "operator:operator" and "looked at it" in h["note"] for h in hist)
    err = assert_error(client.post(f"/v1/actions/{rec.id}/cancel", headers=headers("operator")), 409)
    assert "not allowed" in err["message"]


def test_rejecting_and_cancelling_proposals_record_the_person(client, api_ctx):
    api_ctx.engine.pause("operator:test")
    api_ctx.clock.t += 60
    from tests.remediation.test_engine import explain, fleet
    # faults of their own: with the fixture's ib_link on n00001, one fault on 3 of 6 nodes would be a facility event
    tick = fleet(FLEET, api_ctx.clock.t, rule_nodes=[3, 4], rule_fault=["nvlink", "pcie"])
    recs = {r.node: r for r in api_ctx.engine.tick(tick, explain)}
    r = client.post(f"/v1/actions/{recs['n00003'].id}/reject", json={"note": "false alarm"}, headers=headers("operator"))
    assert r.json()["state"] == "rejected"
    r = client.post(f"/v1/actions/{recs['n00004'].id}/cancel", headers=headers("admin"))
    assert r.json()["state"] == "cancelled"
    assert api_ctx.store.history(recs["n00004"].id)[-1]["actor"] == "operator:admin"


def _prediction_drain(api_ctx, node="n00005"):
    from collector.schema import Action, FaultClass, Grade
    from remediation.policy import Decision

    api_ctx.clock.t += 60
    d = Decision(api_ctx.clock.t, node, 2, Action.DRAIN, FaultClass.HBM_ECC, 0.9, "hbm_ecc risk 90%", "model",
                 Grade.PREDICTED)
    (rec,) = api_ctx.engine.submit([d])
    return rec


def test_a_verdict_on_a_prediction_hold_is_recorded_and_counted_and_refused_on_anything_else(client, api_ctx):
    rec = _prediction_drain(api_ctx)
    r = client.post(f"/v1/actions/{rec.id}/verdict", json={"verdict": "healthy", "note": "dcgmi diag clean"},
                    headers=headers("operator"))
    assert r.status_code == 200 and r.json()["verdict"] == "healthy"
    budget = client.get("/v1/engine", headers=headers("viewer")).json()["budget"]
    assert budget["outcomes"] == {"hbm_ecc": {"unconfirmed": 1, "confirmed": 0}} and budget["braked"] == {}
    hist = client.get(f"/v1/actions/{rec.id}", headers=headers("viewer")).json()["history"]
    assert hist[-1]["actor"] == "operator:operator" and hist[-1]["note"] == "verdict: healthy (dcgmi diag clean)"
    assert "verdict" in assert_error(client.post(f"/v1/actions/{rec.id}/verdict", json={"verdict": "fine"},
                                                 headers=headers("operator")), 422)["message"]
    assert_error(client.post("/v1/actions/feedbeef/verdict", json={"verdict": "faulty"},
                             headers=headers("operator")), 404)
    (rule_drain,) = [a for a in api_ctx.store.query(node="n00001") if a.kind.value == "drain"]  # the fixture's XID 79
    err = assert_error(client.post(f"/v1/actions/{rule_drain.id}/verdict", json={"verdict": "healthy"},
                                   headers=headers("operator")), 422)
    assert "holds gpuops took on a prediction" in err["message"]


def test_deciding_on_an_unknown_action_is_a_404(client):
    for verb in ("approve", "reject", "cancel"):
        assert_error(client.post(f"/v1/actions/feedbeef/{verb}", headers=headers("operator")), 404)
    assert_error(client.get("/v1/actions/feedbeef", headers=headers("viewer")), 404)


# ---- engine -------------------------------------------------------------------------------------

def test_the_engine_is_armed_disarmed_paused_and_resumed_by_the_right_roles(client, api_ctx):
    st = client.get("/v1/engine", headers=headers("viewer")).json()
    assert (st["armed"], st["paused"], st["leader"], st["held"]) == (False, False, True, ["n00001"])
    assert client.post("/v1/engine/arm", json={"note": "go live"}, headers=headers("admin")).json()["armed"] is True
    assert api_ctx.store.setting_history("armed")[-1]["actor"] == "operator:admin"
    assert client.post("/v1/engine/pause", headers=headers("operator")).json()["paused"] is True
    assert client.post("/v1/engine/resume", json={"note": ""}, headers=headers("operator")).json()["paused"] is False
    assert client.post("/v1/engine/disarm", headers=headers("admin")).json()["armed"] is False


def test_closing_the_breaker_needs_an_admin_and_a_note(client, api_ctx):
    api_ctx.engine._open_breaker(50, 10)
    br = client.get("/v1/engine/breaker", headers=headers("viewer")).json()
    assert br["open"] is True and "telemetry" in br["state"]["why"]
    for bad in ({}, {"note": "  "}, {"note": "x", "extra": 1}):
        assert_error(client.post("/v1/engine/breaker/reset", json=bad, headers=headers("admin")), 422)
    br = client.post("/v1/engine/breaker/reset", json={"note": "the collector was fixed"}, headers=headers("admin")).json()
    assert br["open"] is False and br["history"][-1]["actor"] == "operator:admin"


# ---- models -------------------------------------------------------------------------------------

def test_models_are_listed_with_their_metrics_and_the_active_one(client):
    body = client.get("/v1/models", headers=headers("viewer")).json()
    assert body["active"] == "default" and [m["name"] for m in body["models"]] == ["default"]
    assert "classifier" in body["models"][0]["detectors"]
    # inputs the shipped classifier reads as a constant, so on-call can see what a model no longer trusts
    assert body["models"][0]["metadata"]["held_inputs"]["classifier"]["xid_informational_count_short"] == 0
    m = client.get("/v1/models/default/metrics", headers=headers("viewer")).json()
    assert m["name"] == "default" and m["metrics"]
    assert_error(client.get("/v1/models/nope/metrics", headers=headers("viewer")), 404)
    assert_error(client.get("/v1/models/..%2F..%2Fetc/metrics", headers=headers("viewer")), 404)


def test_activating_a_model_records_it_and_tells_the_service(client, api_ctx, tmp_path):
    r = client.post("/v1/models/default/activate", headers=headers("admin"))
    assert r.status_code == 200 and r.json()["actor"] == "operator:admin"
    assert api_ctx.models.active_file.read_text().strip() == "default"
    assert [p.name for p in api_ctx.activated] == ["default"]
    broken = api_ctx.models.root / "broken"
    broken.mkdir()
    (broken / "model.json").write_text('{"format": "something-else"}')
    err = assert_error(client.post("/v1/models/broken/activate", headers=headers("admin")), 422)
    assert "unsupported model format" in err["message"]
    assert api_ctx.models.active() == "default" and len(api_ctx.activated) == 1
    assert_error(client.post("/v1/models/nope/activate", headers=headers("admin")), 404)


def test_training_on_a_path_that_is_no_recording_is_a_422(client, tmp_path):
    err = assert_error(client.post("/v1/models/train", json={"recordings": [str(tmp_path)]}, headers=headers("admin")),
                       422)
    assert str(tmp_path) in err["message"]
    assert_error(client.post("/v1/models/train", json={"recordings": []}, headers=headers("admin")), 422)
    assert_error(client.post("/v1/models/train", json={"recordings": ["/x"], "name": "../up"},
                             headers=headers("admin")), 422)
    assert_error(client.get("/v1/models/train/nope", headers=headers("viewer")), 404)


# ---- replays ------------------------------------------------------------------------------------

def test_a_replay_of_a_path_that_is_no_recording_is_a_422(client, tmp_path):
    for path in ("/nonexistent/rec", str(tmp_path), ""):
        assert_error(client.post("/v1/replays", json={"recording": path}, headers=headers("operator")), 422)
    assert_error(client.get("/v1/replays/nope", headers=headers("viewer")), 404)
    assert_error(client.get("/v1/replays/nope/report", headers=headers("viewer")), 404)
    assert_error(client.get("/v1/replays/nope/report.html", headers=headers("viewer")), 404)


def test_a_replay_job_runs_in_the_background_and_its_report_is_the_spec_report(client, small_recording):
    r = client.post("/v1/replays", json={"recording": str(small_recording)}, headers=headers("operator"))
    assert r.status_code == 202, r.text
    loc, job = r.headers["location"], r.json()
    assert job["actor"] == "operator:operator" and job["state"] in ("queued", "running", "succeeded")
    done = wait_until(lambda: (j := client.get(loc, headers=headers("viewer")).json())["state"]
                      in ("succeeded", "failed") and j, timeout_s=120)
    assert done["state"] == "succeeded" and done["progress"] == 1.0, done
    rep = orjson.loads(client.get(loc + "/report", headers=headers("viewer")).content)
    assert rep["recording"] == str(small_recording) and "decisions" in rep and "metrics" in rep
    page = client.get(loc + "/report.html", headers=headers("viewer"))
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.text.startswith("<!DOCTYPE html>") and str(small_recording) in page.text
    assert [j["id"] for j in client.get("/v1/replays", headers=headers("viewer")).json()["jobs"]] == [job["id"]]


def test_a_replay_job_decides_alternative_policies_beside_the_services_and_refuses_an_invalid_one(
        client, small_recording):
    bad = [{"x": {"act_threshold": 2}}, {"x": {"no_such_setting": 1}}, {"../up": {}},
           {f"p{k}": {} for k in range(9)}]
    for alternatives in bad:
        assert_error(client.post("/v1/replays", json={"recording": str(small_recording), "compare_policies": alternatives},
                                 headers=headers("operator")), 422)
    assert client.get("/v1/replays", headers=headers("viewer")).json()["jobs"] == []   # nothing was queued
    body = {"recording": str(small_recording), "compare_policies": {"quiet": {"actions": {"hbm_ecc": "none"}}}}
    r = client.post("/v1/replays", json=body, headers=headers("operator"))
    assert r.status_code == 202, r.text
    loc = r.headers["location"]
    done = wait_until(lambda: (j := client.get(loc, headers=headers("viewer")).json())["state"]
                      in ("succeeded", "failed") and j, timeout_s=120)
    assert done["state"] == "succeeded", done
    assert done["params"]["compare_policies"] == body["compare_policies"]
    assert "quiet" in done["result"]["alternatives"]
    rep = orjson.loads(client.get(loc + "/report", headers=headers("viewer")).content)
    alt = rep["alternatives"]["quiet"]
    # merged onto the service's policy: its other actions are kept, only hbm_ecc changed
    assert alt["policy"]["actions"]["hbm_ecc"] == "none"
    assert {k: v for k, v in alt["policy"]["actions"].items() if k != "hbm_ecc"} == \
        {k: v for k, v in rep["policy"]["actions"].items() if k != "hbm_ecc"}
    assert {k: v for k, v in alt["policy"].items() if k != "actions"} == \
        {k: v for k, v in rep["policy"].items() if k != "actions"}


def test_the_shadow_report_shows_each_shadow_policy_beside_the_live_one(client, api_ctx):
    from remediation.config import policy_with
    from remediation.shadow import ShadowPolicies
    from tests.remediation.test_engine import explain, fleet

    empty = client.get("/v1/engine/shadow", headers=headers("viewer")).json()
    assert empty["shadows"] == {} and empty["ticks"] == 0 and empty["leader"] is True
    live = api_ctx.engine.policy
    api_ctx.engine.shadow = ShadowPolicies({
        "rules-only": policy_with(live, {"use_model": False}),
        "eager": policy_with(live, {"alert_threshold": 0.3, "act_threshold": 0.4, "corroborate_threshold": 0.4})})
    for k in range(4):
        api_ctx.clock.t += 60.0
        api_ctx.engine.tick(fleet(FLEET, api_ctx.clock.t, rule_nodes=[3], p=[0, 0, 0.99, 0, 0.5, 0]), explain)
    body = client.get("/v1/engine/shadow", headers=headers("viewer")).json()
    assert body["ticks"] == 4 and body["live"]["by_action_and_fault"]["drain"] == {"ib_link": 1, "nvlink": 1}
    assert body["shadows"]["rules-only"]["by_action_and_fault"]["drain"] == {"ib_link": 1}
    assert body["shadows"]["rules-only"]["policy"]["use_model"] is False
    assert body["shadows"]["eager"]["by_action_and_fault"]["drain"] == {"ib_link": 1, "nvlink": 2}
    assert [d["node"] for d in body["shadows"]["eager"]["recent"] if d["action"] == "drain" and d["node"] == "n00004"]
    # ... and no shadow decision became an action: n00004 was only ever alerted by the live policy
    assert {a.kind.value for a in api_ctx.store.query(node="n00004")} <= {"alert"}
    assert client.get("/v1/engine/shadow").status_code == 401
