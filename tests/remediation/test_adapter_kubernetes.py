"""The Kubernetes adapter against a real kube-apiserver (``deploy/testservices/k8s_up.sh``).

No controllers and no kubelet run there, so the tests play their part: they create the
ServiceAccount ``default`` before any Pod, bind Pods to a Node by ``spec.nodeName``, set a
Pod's status Running/Ready by hand (else eviction ignores PodDisruptionBudgets) and a PDB's
status (``observedGeneration``, ``disruptionsAllowed``; else every eviction gets 429). An
evicted Pod keeps its deletionTimestamp for ever (no kubelet), which is what a pod still
shutting down looks like. Each test has its own namespace and node names and removes them.

The parsing and error-mapping tests at the end need no server.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from remediation.actions import ActionKind, scheduler_reason
from remediation.adapters.base import (
    Adapter,
    NotOurs,
    PermanentAdapterError,
    TransientAdapterError,
    UnknownNode,
    adapter_class,
)
from remediation.adapters.kubernetes import (
    ACTION_ANNOTATION,
    CONDITION_TYPE,
    FAULT_TAINT,
    MAINTENANCE_ANNOTATION,
    KubernetesAdapter,
    KubernetesAdapterConfig,
)
from remediation.adapters.kubernetes_errors import map_api_error
from remediation.adapters.kubernetes_meta import fault_of, parse_rfc3339, rfc3339

k8s = pytest.mark.kubernetes
NOW = 1_760_000_000.0  # the adapter's clock in these tests (2025-10-09)
DRAIN_REASON = scheduler_reason(ActionKind.DRAIN, "hbm_ecc", "a1b2c3")
REQUEUE_REASON = scheduler_reason(ActionKind.REQUEUE, "nvlink", "d4e5f6")


@dataclass
class World:
    """One test's namespace and nodes on the real API server, and what it created there."""

    api: Any
    ns: str
    suffix: str
    nodes: list[str] = field(default_factory=list)
    pods: list[tuple[str, str]] = field(default_factory=list)

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    def adapter(self, **config: Any) -> KubernetesAdapter:
        cfg = KubernetesAdapterConfig(**config)
        return KubernetesAdapter(self.api, config=cfg, clock=lambda: NOW)

    def node(self, stem: str = "gpu", *, unschedulable: bool = False, taints: list[dict] | None = None,
             labels: dict | None = None, annotations: dict | None = None, ready: bool = True) -> str:
        name = f"{stem}-{self.suffix}"
        body = {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
                "spec": {"unschedulable": unschedulable, "taints": taints or []}}
        self.core.create_node(body)
        self.nodes.append(name)
        now = rfc3339(NOW)
        self.core.patch_node_status(name, {"status": {"conditions": [
            {"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady",
             "message": "test", "lastHeartbeatTime": now, "lastTransitionTime": now}]}})
        return name

    def pod(self, name: str, node: str, *, owner: str | None = None, ns: str | None = None,
            labels: dict | None = None, annotations: dict | None = None, phase: str = "Running") -> str:
        ns = ns or self.ns
        meta: dict[str, Any] = {"name": name, "labels": labels or {}, "annotations": annotations or {}}
        if owner:
            meta["ownerReferences"] = [{"apiVersion": "batch/v1" if owner == "Job" else "apps/v1",
                                        "kind": owner, "name": f"{name}-owner", "uid": str(uuid.uuid4()),
                                        "controller": True}]
        self.core.create_namespaced_pod(ns, {"metadata": meta, "spec": {
            "nodeName": node, "containers": [{"name": "main", "image": "registry.invalid/train:1"}]}})
        self.pods.append((ns, name))
        now = rfc3339(NOW)
        ready = "True" if phase == "Running" else "False"
        self.core.patch_namespaced_pod_status(name, ns, {"status": {"phase": phase, "conditions": [
            {"type": "Ready", "status": ready, "lastTransitionTime": now}]}})
        return f"{ns}/{name}"

    def pdb(self, name: str, app: str, disruptions_allowed: int) -> None:
        from kubernetes import client

        policy = client.PolicyV1Api(self.api)
        created = policy.create_namespaced_pod_disruption_budget(self.ns, {
            "metadata": {"name": name},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}}})
        self.pdb_status(name, created.metadata.generation, disruptions_allowed)

    def pdb_status(self, name: str, generation: int, disruptions_allowed: int) -> None:
        """Play the disruption controller: the PDB has been processed and allows this many."""
        from kubernetes import client

        client.PolicyV1Api(self.api).patch_namespaced_pod_disruption_budget_status(name, self.ns, {"status": {
            "observedGeneration": generation, "disruptionsAllowed": disruptions_allowed,
            "currentHealthy": 1 + disruptions_allowed, "desiredHealthy": 1, "expectedPods": 1 + disruptions_allowed}})

    def read_node(self, name: str) -> Any:
        return self.core.read_node(name)

    def terminating(self, ref: str) -> bool:
        ns, name = ref.split("/")
        return self.core.read_namespaced_pod(name, ns).metadata.deletion_timestamp is not None


@pytest.fixture
def world(kube_api: Any) -> Iterator[World]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(kube_api)
    suffix = uuid.uuid4().hex[:8]
    ns = f"t-{suffix}"
    core.create_namespace({"metadata": {"name": ns}})
    # no service-account controller runs: without `default` every Pod create is refused (403)
    for namespace in (ns, "kube-system"):
        try:
            core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
        except ApiException as e:
            if e.status != 409:
                raise
    w = World(api=kube_api, ns=ns, suffix=suffix)
    yield w
    for pod_ns, name in w.pods:  # grace 0: without a kubelet nothing else would ever remove them
        try:
            core.delete_namespaced_pod(name, pod_ns, grace_period_seconds=0)
        except ApiException:
            pass
    for node in w.nodes:
        try:
            core.delete_node(node)
        except ApiException:
            pass
    try:
        core.delete_namespace(ns)  # stays Terminating (no namespace controller); k8s_down --purge clears it
    except ApiException:
        pass


def _taints(node_obj: Any) -> dict[str, tuple[str | None, str]]:
    return {t.key: (t.value, t.effect) for t in node_obj.spec.taints or []}


def _condition(node_obj: Any) -> Any:
    return next((c for c in node_obj.status.conditions or [] if c.type == CONDITION_TYPE), None)


# ---- drain ---------------------------------------------------------------------------------

@k8s
def test_adapter_is_registered_and_meets_the_protocol(world: World) -> None:
    assert adapter_class("kubernetes") is KubernetesAdapter
    assert isinstance(world.adapter(), Adapter)


@k8s
def test_drain_cordons_taints_and_records_condition_and_annotation(world: World) -> None:
    node = world.node(taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    before = _taints(world.read_node(node))  # + node.kubernetes.io/not-ready from admission
    assert before["nvidia.com/gpu"] == ("present", "NoSchedule")
    world.adapter().drain(node, DRAIN_REASON)

    obj = world.read_node(node)
    assert obj.spec.unschedulable is True
    assert _taints(obj) == {**before, FAULT_TAINT: ("hbm_ecc", "NoSchedule")}
    cond = _condition(obj)
    assert (cond.status, cond.reason, cond.message) == ("True", "GpuopsDrain", DRAIN_REASON)
    assert json.loads(obj.metadata.annotations[ACTION_ANNOTATION]) == {"reason": DRAIN_REASON, "at": rfc3339(NOW)}
    status = world.adapter().status(node)
    assert (status.drained, status.ours, status.reason, status.down) == (True, True, DRAIN_REASON, False)


@k8s
def test_drain_twice_is_idempotent_and_keeps_the_first_time(world: World) -> None:
    node = world.node()
    world.adapter().drain(node, DRAIN_REASON)
    later = KubernetesAdapter(world.api, clock=lambda: NOW + 600)
    later.drain(node, DRAIN_REASON)

    obj = world.read_node(node)
    assert [t.key for t in obj.spec.taints].count(FAULT_TAINT) == 1
    assert json.loads(obj.metadata.annotations[ACTION_ANNOTATION])["at"] == rfc3339(NOW)


@k8s
def test_drain_of_a_node_someone_else_cordoned_is_not_ours_and_changes_nothing(world: World) -> None:
    node = world.node(unschedulable=True)
    before = world.read_node(node)
    with pytest.raises(NotOurs):
        world.adapter().drain(node, DRAIN_REASON)

    after = world.read_node(node)
    assert after.metadata.resource_version == before.metadata.resource_version
    assert world.adapter().status(node).ours is False


@k8s
def test_drain_evicts_replicated_pods_and_leaves_infrastructure_and_work_running(world: World) -> None:
    node = world.node()
    web = world.pod("web-1", node, owner="ReplicaSet")
    job = world.pod("train-1", node, owner="Job")
    ds = world.pod("dcgm-exporter", node, owner="DaemonSet")
    mirror = world.pod("static-1", node, annotations={"kubernetes.io/config.mirror": "abc"})
    system = world.pod(f"dns-{world.suffix}", node, owner="ReplicaSet", ns="kube-system")
    bare = world.pod("debug", node)
    done = world.pod("finished", node, owner="ReplicaSet", phase="Succeeded")

    world.adapter().drain(node, DRAIN_REASON)

    assert world.terminating(web)
    for untouched in (job, ds, mirror, system, bare, done):
        assert not world.terminating(untouched), untouched
    jobs = world.adapter().status(node).jobs
    assert job in jobs and bare in jobs and web in jobs  # web still shutting down (no kubelet)
    assert ds not in jobs and mirror not in jobs and system not in jobs and done not in jobs


@k8s
def test_eviction_a_pdb_refuses_is_transient_and_a_recall_evicts_once_allowed(world: World) -> None:
    node = world.node()
    guarded = world.pod("api-1", node, owner="ReplicaSet", labels={"app": "api"})
    free = world.pod("cache-1", node, owner="ReplicaSet", labels={"app": "cache"})
    world.pdb("api-pdb", "api", disruptions_allowed=0)
    adapter = world.adapter(pdb_retry_after_s=45)

    with pytest.raises(TransientAdapterError) as err:
        adapter.drain(node, DRAIN_REASON)
    assert err.value.retry_after_s is not None and err.value.retry_after_s > 0
    assert guarded in str(err.value)
    assert not world.terminating(guarded)
    assert world.terminating(free)  # the refusal did not stop the other evictions
    assert world.read_node(node).spec.unschedulable is True

    from kubernetes import client

    gen = client.PolicyV1Api(world.api).read_namespaced_pod_disruption_budget("api-pdb", world.ns).metadata.generation
    world.pdb_status("api-pdb", gen, disruptions_allowed=1)
    adapter.drain(node, DRAIN_REASON)
    assert world.terminating(guarded)


@k8s
def test_requeue_evicts_the_pods_jobs_own_and_returns_them(world: World) -> None:
    node = world.node()
    train = world.pod("train-1", node, owner="Job")
    web = world.pod("web-1", node, owner="ReplicaSet")
    ds = world.pod("dcgm-exporter", node, owner="DaemonSet")

    moved = world.adapter(eviction_grace_period_s=0).requeue(node, REQUEUE_REASON)

    assert moved == sorted([train, web])
    assert not world.terminating(ds)
    assert _taints(world.read_node(node))[FAULT_TAINT] == ("nvlink", "NoSchedule")
    assert _condition(world.read_node(node)).reason == "GpuopsRequeue"
    assert world.adapter().requeue(node, REQUEUE_REASON) == []  # nothing left to move


# ---- resume --------------------------------------------------------------------------------

@k8s
def test_resume_uncordons_and_removes_only_gpuops_taints(world: World) -> None:
    node = world.node(taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    before = _taints(world.read_node(node))
    adapter = world.adapter()
    adapter.drain(node, DRAIN_REASON)
    world.core.patch_node(node, {"spec": {"taints": [
        {"key": t.key, "value": t.value, "effect": t.effect} for t in world.read_node(node).spec.taints]
        + [{"key": "gpuops.io/extra", "value": "x", "effect": "PreferNoSchedule"}]}})

    adapter.resume(node, scheduler_reason(ActionKind.RESUME, None, "f00"))

    obj = world.read_node(node)
    assert not obj.spec.unschedulable
    assert _taints(obj) == before and "nvidia.com/gpu" in before
    assert ACTION_ANNOTATION not in (obj.metadata.annotations or {})
    assert _condition(obj).status == "False"
    status = adapter.status(node)
    assert (status.drained, status.ours, status.reason) == (False, False, None)


@k8s
def test_resume_of_a_cordon_someone_else_set_is_not_ours_and_keeps_it(world: World) -> None:
    node = world.node(unschedulable=True, taints=[{"key": "ops/maintenance", "effect": "NoSchedule"}])
    with pytest.raises(NotOurs):
        world.adapter().resume(node, "gpuops: resume id=1")
    obj = world.read_node(node)
    assert obj.spec.unschedulable is True and "ops/maintenance" in _taints(obj)


@k8s
def test_resume_of_a_node_in_service_changes_nothing(world: World) -> None:
    node = world.node()
    before = world.read_node(node).metadata.resource_version
    world.adapter().resume(node, "gpuops: resume id=1")
    assert world.read_node(node).metadata.resource_version == before


# ---- status, errors ---------------------------------------------------------------------------

@k8s
def test_unknown_node_is_unknown_to_requests_and_absent_in_status(world: World) -> None:
    adapter = world.adapter()
    missing = f"nowhere-{world.suffix}"
    for request in (adapter.drain, adapter.resume, adapter.requeue):
        with pytest.raises(UnknownNode):
            request(missing, DRAIN_REASON)
    assert adapter.status(missing).exists is False


@k8s
def test_reboot_is_refused_permanently_without_touching_the_node(world: World) -> None:
    node = world.node()
    with pytest.raises(PermanentAdapterError, match="no reboot API"):
        world.adapter().reboot(node, "gpuops: reboot id=1")
    assert not world.read_node(node).spec.unschedulable


@k8s
def test_maintenance_annotation_counts_only_while_in_the_future(world: World) -> None:
    future = world.node("m1", annotations={MAINTENANCE_ANNOTATION: rfc3339(NOW + 3600)})
    past = world.node("m2", annotations={MAINTENANCE_ANNOTATION: "2020-01-01T00:00:00+00:00"})
    garbage = world.node("m3", annotations={MAINTENANCE_ANNOTATION: "tomorrow"})
    adapter = world.adapter()
    assert adapter.status(future).maintenance is True
    assert adapter.status(past).maintenance is False
    assert adapter.status(garbage).maintenance is False


@k8s
def test_list_nodes_reports_pools_readiness_and_running_pods(world: World) -> None:
    ready = world.node("r", labels={"pool": "h100-a"})
    down = world.node("d", ready=False)
    pod = world.pod("train-1", ready, owner="Job")
    world.pod("dcgm-exporter", ready, owner="DaemonSet")

    by_name = {s.name: s for s in world.adapter(pool_label="pool").list_nodes()}
    assert (by_name[ready].partitions, by_name[ready].down, by_name[ready].jobs) == (("h100-a",), False, (pod,))
    assert (by_name[down].down, by_name[down].jobs, by_name[down].raw_state) == (True, (), "NotReady")


@k8s
def test_a_refused_credential_is_permanent(world: World) -> None:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = world.api.configuration.host
    cfg.ssl_ca_cert = world.api.configuration.ssl_ca_cert
    cfg.api_key = {"authorization": "Bearer not-a-valid-token"}
    adapter = KubernetesAdapter(client.ApiClient(cfg), clock=lambda: NOW)
    with pytest.raises(PermanentAdapterError, match="HTTP 401") as err:
        adapter.drain(world.node(), DRAIN_REASON)
    assert not err.value.transient


def test_an_unreachable_api_server_is_transient() -> None:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:9"  # discard port: nothing listens
    cfg.verify_ssl = False
    cfg.retries = 0
    adapter = KubernetesAdapter(client.ApiClient(cfg), config=KubernetesAdapterConfig(request_timeout_s=2))
    with pytest.raises(TransientAdapterError, match="unreachable"):
        adapter.status("gpu-node-01")


def test_invalid_node_names_are_refused_before_any_request() -> None:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:9"
    adapter = KubernetesAdapter(client.ApiClient(cfg))
    for bad in ("", "-rf", "a/b", "node;reboot", "../nodes"):
        with pytest.raises(PermanentAdapterError, match="invalid node name"):
            adapter.drain(bad, DRAIN_REASON)


# ---- reasons and errors without a server ---------------------------------------------------------

def test_fault_class_is_read_from_the_scheduler_reason() -> None:
    assert fault_of(scheduler_reason(ActionKind.DRAIN, "hbm_ecc", "abc", "gpu 3")) == "hbm_ecc"
    assert fault_of(scheduler_reason(ActionKind.DRAIN_REBOOT, "gpu_off_bus", "abc")) == "gpu_off_bus"
    assert fault_of(scheduler_reason(ActionKind.DRAIN, None, "abc")) == "unknown"
    assert fault_of("maintenance by ops") == "unknown"
    assert fault_of("gpuops: drain") == "unknown"
    assert fault_of("gpuops: drain weird/fault! id=1") == "weird_fault"


def test_rfc3339_times_need_an_offset() -> None:
    assert parse_rfc3339("2025-10-09T08:53:20Z") == 1_760_000_000.0
    assert parse_rfc3339("2025-10-09T10:53:20+02:00") == 1_760_000_000.0
    assert parse_rfc3339("2025-10-09T08:53:20") is None
    assert parse_rfc3339("soon") is None
    assert rfc3339(NOW) == "2025-10-09T08:53:20Z"


@pytest.mark.parametrize(("status", "error", "transient"), [
    (404, UnknownNode, False),
    (403, PermanentAdapterError, False),
    (422, PermanentAdapterError, False),
    (400, PermanentAdapterError, False),
    (409, TransientAdapterError, True),
    (429, TransientAdapterError, True),
    (500, TransientAdapterError, True),
    (503, TransientAdapterError, True),
])
def test_api_errors_map_to_transient_or_permanent(status: int, error: type, transient: bool) -> None:
    from kubernetes.client.exceptions import ApiException

    exc = ApiException(status=status, reason="Reason")
    exc.body = json.dumps({"message": "what the server said"})
    exc.headers = {"Retry-After": "7"}
    mapped = map_api_error(exc, "patch node gpu-1", node="gpu-1")
    assert type(mapped) is error and mapped.transient is transient
    assert "what the server said" in str(mapped)
    if transient and status != 409:
        assert mapped.retry_after_s == 7.0


def test_a_404_of_something_other_than_the_node_is_not_unknown_node() -> None:
    from kubernetes.client.exceptions import ApiException

    mapped = map_api_error(ApiException(status=404, reason="Not Found"), "read pdb")
    assert type(mapped) is PermanentAdapterError


def test_every_kubernetes_setting_documents_its_default() -> None:
    for name, f in KubernetesAdapterConfig.model_fields.items():
        assert f.description and len(f.description) > 20, name
