"""``/v1/silences`` and ``gpuops silence|silences|unsilence`` against the real app: operators create
and end silences, viewers only read, bad input is a 422 in the app's error shape, and the engine's
records of muted decisions name the silence."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from api.cli import build_cli
from tests.api.conftest import FLEET, TOKENS, headers
from tests.remediation.test_engine import explain, fleet


def test_an_operator_creates_lists_reads_and_deletes_a_silence_with_its_audit(client, api_ctx):
    r = client.post("/v1/silences", json={"nodes": ["n00003"], "duration_s": 7200, "reason": "switch upgrade"},
                    headers=headers("operator"))
    assert r.status_code == 201, r.text
    s = r.json()
    assert (s["author"], s["mutes"], s["active"], s["scope"]) == ("operator:operator", "both", True, "nodes")
    assert r.headers["Location"] == f"/v1/silences/{s['id']}"
    assert [x["id"] for x in client.get("/v1/silences", headers=headers("viewer")).json()["silences"]] == [s["id"]]
    gone = client.request("DELETE", f"/v1/silences/{s['id']}", json={"note": "done"}, headers=headers("operator"))
    assert gone.status_code == 200 and gone.json()["deleted_by"] == "operator:operator"
    assert client.get("/v1/silences", headers=headers("viewer")).json()["count"] == 0
    assert client.get("/v1/silences?all=true", headers=headers("viewer")).json()["count"] == 1
    one = client.get(f"/v1/silences/{s['id']}", headers=headers("viewer")).json()
    assert [(h["event"], h["actor"], h["note"]) for h in one["history"]] == [
        ("created", "operator:operator", "switch upgrade"), ("deleted", "operator:operator", "done")]


def test_the_engine_records_a_muted_decision_with_the_silence_id_and_the_api_shows_it(client, api_ctx):
    s = client.post("/v1/silences", json={"fleet": True, "mutes": "actions", "duration_s": 600, "reason": "test"},
                    headers=headers("operator")).json()
    clock = api_ctx.clock
    clock.t += 60
    api_ctx.engine.tick(fleet(FLEET, clock.t, rule_nodes=[4]), explain)
    got = client.get("/v1/actions", params={"node": "n00004"}, headers=headers("viewer")).json()["actions"]
    assert [(a["state"], a["blocked_by"]) for a in got] == [("rejected", f"silence:{s['id']}")]
    assert client.get("/v1/engine", headers=headers("viewer")).json()["silences"] == [s["id"]]


def test_silences_need_a_token_and_the_operator_role_to_create_or_delete(client):
    body = {"nodes": ["n00003"], "duration_s": 60, "reason": "x"}
    assert client.post("/v1/silences", json=body).status_code == 401
    r = client.post("/v1/silences", json=body, headers=headers("viewer"))
    assert r.status_code == 403 and "operator" in r.json()["error"]["message"]
    s = client.post("/v1/silences", json=body, headers=headers("operator")).json()
    assert client.request("DELETE", f"/v1/silences/{s['id']}", headers=headers("viewer")).status_code == 403
    assert client.get("/v1/silences").status_code == 401
    assert client.request("DELETE", "/v1/silences/sil-none", headers=headers("operator")).status_code == 404


@pytest.mark.parametrize("body, message", [
    ({"nodes": ["n1"], "duration_s": 60, "reason": "   "}, "reason"),
    ({"nodes": ["n1"], "reason": "r"}, "needs an end"),
    ({"nodes": ["n1"], "reason": "r", "starts_at": 1_001_000.0, "ends_at": 1_000_900.0}, "before it starts"),
    ({"nodes": ["n1"], "reason": "r", "duration_s": 30 * 86400}, "longer than the maximum"),
    ({"nodes": ["bad;name"], "reason": "r", "duration_s": 60}, "invalid node name"),
    ({"reason": "r", "duration_s": 60}, "exactly one scope"),
    ({"nodes": ["n1"], "reason": "r", "duration_s": 60, "mutes": "pages"}, "mutes"),
])
def test_bad_silences_are_422_in_the_error_shape(client, body, message):
    r = client.post("/v1/silences", json=body, headers=headers("operator"))
    assert r.status_code == 422, r.text
    assert message in r.json()["error"]["message"] or message in json.dumps(r.json()["error"]["detail"])
    assert r.json()["error"]["code"] == "invalid"


@pytest.fixture
def gpuops(live_api):
    runner = CliRunner()
    app = build_cli()

    def run(*args: str, role: str = "operator"):
        return runner.invoke(app, list(args), env={"GPUOPS_URL": live_api, "GPUOPS_TOKEN": TOKENS[role],
                                                   "COLUMNS": "200"})
    return run


def test_the_cli_silences_lists_and_unsilences_through_the_api(gpuops, api_ctx):
    r = gpuops("silence", "n00002", "n00003", "--for", "2h", "--reason", "PSU swap", "--mutes", "actions", "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["nodes"] == ["n00002", "n00003"] and s["ends_at"] - s["starts_at"] == 7200 and s["mutes"] == "actions"
    listed = gpuops("silences", role="viewer")
    assert listed.exit_code == 0 and s["id"] in listed.output and "PSU swap" in listed.output
    assert gpuops("unsilence", s["id"], role="viewer").exit_code == 2               # a viewer may not
    r = gpuops("unsilence", s["id"])
    assert r.exit_code == 0 and "deleted" in r.output
    assert s["id"] not in gpuops("silences", role="viewer").output
    assert s["id"] in gpuops("silences", "--all", role="viewer").output


def test_the_cli_refuses_a_bad_duration_and_shows_the_server_s_message(gpuops):
    assert gpuops("silence", "n00002", "--for", "soon", "--reason", "x").exit_code == 2
    r = gpuops("silence", "n00002", "--for", "30d", "--reason", "x")
    assert r.exit_code == 2 and "longer than the maximum" in r.output
    r = gpuops("silence", "n00002", "--for", "1h", "--reason", "x", role="viewer")
    assert r.exit_code == 2 and "HTTP 403" in r.output
