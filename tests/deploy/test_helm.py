"""The Helm chart (deploy/helm/gpuops): lint, render, and apply by server-side dry run.

The helm binary is built once from the Go module proxy (deploy/testservices/helm_build.sh,
GPUOPS_HELM); the dry run goes to the real kube-apiserver of the test services (GPUOPS_TEST_K8S,
fixture ``kube_api``), object by object with ``dryRun=All`` and strict field validation.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import service_missing

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuops"
NAMESPACE = "default"   # the test API server runs no namespace controller: never create one to delete
ALL_ON = ["--set", "safety.armed=true", "--set", "serviceMonitor.enabled=true", "--set", "grafanaDashboard.enabled=true",
          "--set", "commands.enabled=true", "--set", "commands.key=test-key", "--set", "agent.kmsgFile=/var/log/kern.log",
          "--set", "auth.tokens[0].name=oncall", "--set", "auth.tokens[0].role=operator",
          "--set", f"auth.tokens[0].sha256={'a' * 64}"]
#: the node's BMC over Redfish, {node} in its URL
BMC = ["--set", "agent.sources=nvml\\,infiniband\\,kmsg\\,redfish",
       "--set", "agent.bmc.redfishUrl=https://{node}-bmc.mgmt.example",
       "--set", "agent.bmc.user=gpuops", "--set", "agent.bmc.password=bmc-secret"]


def _bmc_values(ca: str | None = None) -> list[str]:
    return BMC + (["--set-file", f"agent.bmc.ca={ca}"] if ca else ["--set", "agent.bmc.ca=PEM"])


@pytest.fixture(scope="module")
def helm() -> str:
    """Path of the helm binary: GPUOPS_HELM, else the cache helm_build.sh fills."""
    path = os.environ.get("GPUOPS_HELM") or str(
        Path(os.environ.get("GPUOPS_CACHE", Path.home() / ".cache" / "gpuops")) / "helm" / "v4.3.2" / "helm")
    if not os.access(path, os.X_OK):
        service_missing(f"no helm binary at {path}: run deploy/testservices/helm_build.sh and export GPUOPS_HELM=<its last line>")
    return path


def render(helm: str, *args: str) -> list[dict[str, Any]]:
    out = subprocess.run([helm, "template", "t", str(CHART), "--namespace", NAMESPACE, *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_helm_lint_passes_with_default_and_all_toggles_on(helm: str) -> None:
    for args in ([], ALL_ON, ALL_ON + _bmc_values()):
        out = subprocess.run([helm, "lint", "--strict", str(CHART), *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr


def test_default_values_render_a_dry_run_without_monitoring_objects(helm: str) -> None:
    docs = render(helm)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Deployment", "Deployment",
                     "Secret", "Service", "ServiceAccount"]
    config = by_kind(docs, "ConfigMap")[0]["data"]
    for name in ("control-plane.yaml", "scoring.yaml"):
        assert yaml.safe_load(config[name])["safety"]["armed"] is False
    assert yaml.safe_load(config["control-plane.yaml"])["scoring"]["enabled"] is False   # workers score
    assert yaml.safe_load(config["scoring.yaml"])["scoring"]["enabled"] is True


def test_toggles_arm_and_add_the_service_monitor_and_dashboard(helm: str) -> None:
    docs = render(helm, *ALL_ON)
    assert len(by_kind(docs, "ServiceMonitor")) == 1
    dashboards = [d for d in by_kind(docs, "ConfigMap") if "gpuops.json" in d.get("data", {})]
    assert len(dashboards) == 1 and dashboards[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
    cfg = yaml.safe_load(by_kind(docs, "ConfigMap")[0]["data"]["control-plane.yaml"])
    assert cfg["safety"]["armed"] is True and cfg["commands"]["key_file"] == "/etc/gpuops/secrets/commands.key"
    agent = by_kind(docs, "DaemonSet")[0]["spec"]["template"]["spec"]["containers"][0]
    assert "SYS_ADMIN" in agent["securityContext"]["capabilities"]["add"]   # GPU reset, only with commands


def test_rendered_service_config_loads_in_gpuops_serve(helm: str, tmp_path: Path, monkeypatch) -> None:
    from api.config import load_service_config

    docs = render(helm, *ALL_ON)
    (tmp_path / "commands.key").write_text("k")
    for name, text in by_kind(docs, "ConfigMap")[0]["data"].items():
        raw = yaml.safe_load(text)
        raw["commands"]["key_file"] = str(tmp_path / "commands.key")   # the Secret's mount, here
        raw["state_dir"] = str(tmp_path)
        path = tmp_path / name
        path.write_text(yaml.safe_dump(raw))
        monkeypatch.setenv("GPUOPS_AUTH__TOKENS", by_kind(docs, "Secret")[0]["stringData"]["auth-tokens"])
        cfg = load_service_config(path)
        assert cfg.adapter.name == "kubernetes" and cfg.adapter.options == {"in_cluster": True}
        assert cfg.auth.tokens[0].role == "operator" and cfg.host == "0.0.0.0"


def test_agent_env_names_only_real_agent_settings_and_mounts_host_paths_read_only(helm: str) -> None:
    from collector.agent_settings import AgentSettings

    ds = by_kind(render(helm, *ALL_ON), "DaemonSet")[0]["spec"]["template"]["spec"]
    c = ds["containers"][0]
    fields = {f.upper() for f in AgentSettings.model_fields}
    for env in c["env"]:
        if env["name"].startswith("GPUOPS_AGENT_"):
            assert env["name"].removeprefix("GPUOPS_AGENT_") in fields, env["name"]
    host_volumes = {v["name"] for v in ds["volumes"] if "hostPath" in v}
    assert host_volumes == {"sys", "kmsg", "varlog"}
    for m in c["volumeMounts"]:
        if m["name"] in host_volumes:
            assert m["readOnly"] is True, m
    assert c["securityContext"]["privileged"] is False and c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["args"] == ["agent"]


@pytest.mark.parametrize("interval_s, stale_after_s", [(10, 125), (60, 245)])
def test_the_agents_liveness_probe_passes_on_a_fresh_health_file_and_fails_on_a_stale_or_missing_one(
        helm: str, tmp_path: Path, interval_s: int, stale_after_s: int) -> None:
    ds = by_kind(render(helm, "--set", f"agent.interval_s={interval_s}"), "DaemonSet")[0]["spec"]["template"]["spec"]
    probe = ds["containers"][0]["livenessProbe"]["exec"]["command"]
    health = tmp_path / "health.json"
    command = [part.replace("/run/gpuops-agent/health.json", str(health)) for part in probe]
    assert command != probe  # the probe reads the file the agent's env names
    env = {e["name"]: e.get("value") for e in ds["containers"][0]["env"]}
    assert env["GPUOPS_AGENT_HEALTH_FILE"] == "/run/gpuops-agent/health.json"

    def alive() -> bool:
        return subprocess.run(command, capture_output=True, timeout=30).returncode == 0

    assert not alive()  # no file yet
    health.write_text("{}")
    assert alive()
    now = time.time()
    os.utime(health, (now - 3 * interval_s - 20, now - 3 * interval_s - 20))  # 3 intervals + 20 s: still alive
    assert alive()
    os.utime(health, (now - stale_after_s, now - stale_after_s))
    assert not alive()


# the adapter's CoreV1Api calls -> the (resource, verb) the ClusterRole must grant
ADAPTER_CALLS = {"read_node": ("nodes", "get"), "list_node": ("nodes", "list"), "patch_node": ("nodes", "patch"),
                 "patch_node_status": ("nodes/status", "patch"), "list_pod_for_all_namespaces": ("pods", "list"),
                 "create_namespaced_pod_eviction": ("pods/eviction", "create")}


def test_cluster_role_grants_every_call_of_the_kubernetes_adapter_and_no_write_beyond_them(helm: str) -> None:
    src = (ROOT / "remediation" / "adapters" / "kubernetes.py").read_text()
    calls = set(re.findall(r"self\._core\.([a-z_]+)", src))
    assert calls and calls <= set(ADAPTER_CALLS), f"a call this test does not map yet: {calls - set(ADAPTER_CALLS)}"
    role = by_kind(render(helm), "ClusterRole")[0]
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    for call in calls:
        assert ADAPTER_CALLS[call] in granted, call
    writes = {(r, v) for r, v in granted if v not in ("get", "list", "watch")}
    assert writes == {("nodes", "patch"), ("nodes/status", "patch"), ("pods/eviction", "create"), ("events", "create")}
    assert not any("*" in rule["resources"] or "*" in rule["verbs"] for rule in role["rules"])


def test_grafana_dashboard_queries_only_metrics_the_service_exports() -> None:
    import json

    exported = set(re.findall(r'"(gpuops_[a-z_]+)"', (ROOT / "api" / "metrics.py").read_text()))
    dash = json.loads((CHART / "dashboards" / "gpuops.json").read_text())
    used = {m for p in dash["panels"] for t in p["targets"] for m in re.findall(r"gpuops_[a-z_]+", t["expr"])}
    suffixes = ("_total", "_bucket", "_count", "_sum")
    base = {next((u.removesuffix(s) for s in suffixes if u.endswith(s) and u.removesuffix(s) in exported), u) for u in used}
    assert base <= exported, base - exported
    assert len(base) >= 10


def _create(api: Any, doc: dict[str, Any]) -> None:
    """Create *doc* with dryRun=All and strict field validation, through the typed client."""
    from kubernetes import client

    kind, ns = doc["kind"], doc["metadata"].get("namespace", NAMESPACE)
    kw = {"dry_run": "All", "field_validation": "Strict"}
    core, apps, rbac = client.CoreV1Api(api), client.AppsV1Api(api), client.RbacAuthorizationV1Api(api)
    calls = {
        "ServiceAccount": lambda: core.create_namespaced_service_account(ns, doc, **kw),
        "Secret": lambda: core.create_namespaced_secret(ns, doc, **kw),
        "ConfigMap": lambda: core.create_namespaced_config_map(ns, doc, **kw),
        "Service": lambda: core.create_namespaced_service(ns, doc, **kw),
        "DaemonSet": lambda: apps.create_namespaced_daemon_set(ns, doc, **kw),
        "Deployment": lambda: apps.create_namespaced_deployment(ns, doc, **kw),
        "ClusterRole": lambda: rbac.create_cluster_role(doc, **kw),
        "ClusterRoleBinding": lambda: rbac.create_cluster_role_binding(doc, **kw),
        "ServiceMonitor": lambda: client.CustomObjectsApi(api).create_namespaced_custom_object(
            "monitoring.coreos.com", "v1", ns, "servicemonitors", doc, **kw),
    }
    calls[kind]()


def _has_crd(api: Any, name: str) -> bool:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        client.ApiextensionsV1Api(api).read_custom_resource_definition(name)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


@pytest.mark.bmc
def test_the_charts_bmc_values_give_an_agent_that_reads_the_https_bmc_with_the_secrets_password_and_ca(
        helm: str, bmc: dict, tmp_path: Path, monkeypatch) -> None:
    """Chart -> the agent's env and Secret files -> AgentSettings -> the redfish source -> the real HTTPS test BMC."""
    from api.commands.agent import compose_agent
    from collector.agent_settings import AgentSettings

    # the HTTPS test BMC (bmc_up.sh) named by {node}, its self-signed certificate as the CA
    url = bmc["redfish_newer"].replace("127.0.0.1", "{node}")
    docs = render(helm, *_bmc_values(bmc["redfish_ca"]), "--set", f"agent.bmc.redfishUrl={url}",
                  "--set", "agent.bmc.skipChassis=HGX_GPU_*\\,HGX_NVSwitch_*")
    ds = by_kind(docs, "DaemonSet")[0]["spec"]["template"]["spec"]
    secret = by_kind(docs, "Secret")[0]
    files = {k: v for k, v in secret["stringData"].items() if k in ("bmc.pass", "bmc-ca.crt")}
    volume = next(v for v in ds["volumes"] if v["name"] == "bmc")
    assert {i["key"] for i in volume["secret"]["items"]} == set(files) == {"bmc.pass", "bmc-ca.crt"}
    mount = next(m for m in ds["containers"][0]["volumeMounts"] if m["name"] == "bmc")
    assert mount["readOnly"] is True and volume["secret"]["defaultMode"] == 0o400
    for name, text in files.items():  # what the kubelet writes into the mount
        (tmp_path / name).write_text(text)
    env = {e["name"]: e.get("value") for e in ds["containers"][0]["env"] if "value" in e}
    for name, value in env.items():
        if name.startswith("GPUOPS_AGENT_"):
            monkeypatch.setenv(name, value.replace(mount["mountPath"], str(tmp_path)))
    monkeypatch.setenv("GPUOPS_AGENT_NODE", "127.0.0.1")  # spec.nodeName: here the test BMC's address
    settings = AgentSettings(sources="redfish", sink="stdout", health_file=None)
    assert settings.redfish_url == bmc["redfish_newer"] and settings.bmc_interval_s == 60
    assert settings.redfish_skip_patterns == ("HGX_GPU_*", "HGX_NVSwitch_*")
    assert (tmp_path / "bmc.pass").read_text() == "bmc-secret" and "BEGIN CERTIFICATE" in files["bmc-ca.crt"]
    agent = compose_agent(settings, once=True)
    try:
        (source,) = agent.sources
        read = {e["sensor"] for e in source.sample(1000.0).events}
        assert "chassis/Inlet Temp" in read and not any(s.startswith("HGX_GPU_") for s in read)
        assert source.health()["skipped_chassis"] == 1
    finally:
        agent.close()
    # the password from the Secret reached the BMC, inside TLS: sushy-static logs each request's headers
    basic = base64.b64encode(b"gpuops:bmc-secret").decode()
    log = Path(bmc["redfish_ca"]).parent / "log" / "sushy_static.log"
    assert f"Authorization: Basic {basic}" in log.read_text(errors="replace")


def test_the_charts_bmc_values_fail_with_what_to_set_when_they_do_not_fit_together(helm: str) -> None:
    for args, says in ((["--set", "agent.sources=nvml\\,redfish"], "give agent.bmc.redfishUrl"),
                       (["--set", "agent.bmc.redfishUrl=https://{node}-bmc"], "agent.sources has no redfish"),
                       (BMC[:6], "agent.bmc.user needs agent.bmc.password"),
                       (BMC + ["--set", "agent.bmc.caInExistingSecret=true"], "caInExistingSecret needs existingSecret")):
        out = subprocess.run([helm, "template", "t", str(CHART), *args], capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and says in out.stderr, (args, out.stderr)


@pytest.mark.kubernetes
@pytest.mark.parametrize("toggles", [[], ALL_ON, ALL_ON + _bmc_values()], ids=["defaults", "all-toggles", "bmc"])
def test_rendered_chart_applies_by_server_side_dry_run(helm: str, kube_api: Any, toggles: list[str]) -> None:
    from kubernetes.client.rest import ApiException

    docs = render(helm, *toggles)
    monitors = _has_crd(kube_api, "servicemonitors.monitoring.coreos.com")
    applied = []
    for doc in docs:
        if doc["kind"] == "ServiceMonitor" and not monitors:
            continue   # the Prometheus Operator's CRD is not installed on the test server
        try:
            _create(kube_api, doc)
        except ApiException as e:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} refused by the API server: {e.status} {e.body}")
        applied.append(doc["kind"])
    assert {"DaemonSet", "Deployment", "ClusterRole", "Secret"} <= set(applied)
