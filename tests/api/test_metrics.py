"""``/metrics``: Prometheus text that promtool accepts, with per-node risk, actions by kind and
outcome, pipeline lag, dead-lettered records, breaker, armed and leader; a viewer token unless public."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.api.conftest import headers
from tests.conftest import service_missing


@pytest.fixture(scope="session")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        service_missing("promtool not found: apt-get install prometheus (Debian ships promtool with it)")
    return path


def test_metrics_pass_promtool_and_carry_the_fleet_the_engine_and_the_pipeline(client, api_ctx, promtool):
    api_ctx.metrics.observe_lag(1.25)
    api_ctx.metrics.deadlettered(3, "bad_schema")
    client.get("/v1/nodes", headers=headers("viewer"))
    r = client.get("/metrics", headers=headers("viewer"))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    for line in ('gpuops_node_risk{node="n00002"} 0.9', 'gpuops_actions_total{kind="drain",outcome="succeeded"} 1.0',
                 "gpuops_pipeline_lag_seconds 1.25", 'gpuops_deadlettered_records_total{reason="bad_schema"} 3.0',
                 "gpuops_breaker_open 0.0", "gpuops_armed 0.0", "gpuops_leader 1.0", 'gpuops_nodes{state="held"} 1.0',
                 'gpuops_api_request_duration_seconds_count{method="GET",route="/v1/nodes",status="200"} 1.0'):
        assert line in text, line


def test_metrics_need_a_viewer_token_unless_the_service_makes_them_public(client, api_ctx):
    assert client.get("/metrics").status_code == 401
    api_ctx.metrics_public = True
    assert client.get("/metrics").status_code == 200


def test_breaker_and_armed_follow_the_engine_at_scrape_time(client, api_ctx):
    api_ctx.engine.arm("operator:test")
    api_ctx.engine._open_breaker(20, 10)
    text = client.get("/metrics", headers=headers("viewer")).text
    assert "gpuops_breaker_open 1.0" in text and "gpuops_armed 1.0" in text
    assert "gpuops_breaker_opened_total 1.0" in text


def test_shadow_decisions_are_counted_per_policy_and_pass_promtool(client, api_ctx, promtool):
    from remediation.config import policy_with
    from remediation.shadow import ShadowPolicies
    from tests.api.conftest import FLEET
    from tests.remediation.test_engine import explain, fleet

    api_ctx.engine.shadow = ShadowPolicies({"rules-only": policy_with(api_ctx.engine.policy, {"use_model": False})})
    for _ in range(3):
        api_ctx.clock.t += 60.0
        api_ctx.engine.tick(fleet(FLEET, api_ctx.clock.t, rule_nodes=[3], p=[0, 0, 0.99, 0, 0, 0]), explain)
    text = client.get("/metrics", headers=headers("viewer")).text
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    assert 'gpuops_shadow_decisions_total{action="drain",fault="nvlink",policy="live"} 1.0' in text
    assert 'gpuops_shadow_decisions_total{action="drain",fault="ib_link",policy="rules-only"} 1.0' in text
    assert 'gpuops_shadow_decisions_total{action="drain",fault="nvlink",policy="rules-only"}' not in text
