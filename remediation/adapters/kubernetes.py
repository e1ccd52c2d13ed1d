"""The Kubernetes adapter: cordon, taint, evict and uncordon nodes through the API server.

What each request does to a node (all idempotent; a re-call continues where the last one
stopped):

- ``drain``: cordon (``spec.unschedulable``), the taint ``gpuops.io/fault=<fault>:NoSchedule``,
  the node condition ``GpuopsRemediation=True`` and the annotation ``gpuops.io/action``
  (JSON ``{"reason", "at"}``: what gpuops did and why). Then it evicts, through the Eviction
  API so PodDisruptionBudgets hold, the pods a controller recreates elsewhere (ReplicaSet,
  StatefulSet, ...). The node's *work* — pods a Job (or another ``work_owner_kinds``)
  owns, and bare pods nothing would recreate — keeps running, as a Slurm drain lets its
  jobs finish.
- ``requeue``: drain, and evict the work pods too, so their Job controllers start them
  elsewhere; returns ``namespace/name`` of every pod evicted by the call.
- ``reboot``: Kubernetes has no reboot API; :class:`PermanentAdapterError` (reboots go
  through the node agent or the BMC).
- ``resume``: only a cordon gpuops owns (its taint or annotation present): uncordon, drop
  the taints whose key starts with ``gpuops.io/`` (others are kept), set the condition to
  False and remove the annotation. Someone else's cordon is :class:`NotOurs`.

Never evicted: DaemonSet pods, mirror (static) pods, pods in ``system_namespaces`` and
pods already terminating or finished. A PodDisruptionBudget that refuses an eviction
(HTTP 429) does not stop the others: the refused pods are collected and the call ends in
:class:`TransientAdapterError` with ``retry_after_s``; the engine retries later.

Where a node sits, for facility grouping (:mod:`remediation.facility`): ``facility_labels``
maps a facility label (``rack``, ``leaf``, ``switch``) to the node label keys that carry it;
the first key the node has wins, and its value goes to ``NodeStatus.extra``. The default
reads the leaf switch from NVIDIA Topograph's labels (``network.topology.nvidia.com/leaf``,
or ``fabric.topograph.run/tier-0`` in Topograph 1.1). Kubernetes has no well-known rack
label (``topology.kubernetes.io/`` defines only region and zone), so a site adds its own,
e.g. ``{"rack": "example.com/rack"}``.

Errors (:mod:`.kubernetes_errors`): 404 on the node -> :class:`UnknownNode`; 409/429/5xx,
connection errors and timeouts -> :class:`TransientAdapterError`; 403, 422 and other 4xx ->
:class:`PermanentAdapterError`. Reasons, times and facility labels as written on a node and
read back: :mod:`.kubernetes_meta`.

Measured against the test service (``deploy/testservices/k8s_up.sh``, docs/testing.md) on
loopback: a drain that evicts 5 pods 48 ms, a status 8 ms, a resume 10 ms.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from remediation.adapters.base import (
    NodeStatus,
    NotOurs,
    PermanentAdapterError,
    TransientAdapterError,
    UnknownNode,
    validate_node_name,
)
from remediation.adapters.kubernetes_errors import map_api_error, retry_after, transient_exceptions
from remediation.adapters.kubernetes_meta import facility_of, fault_of, kind_of, parse_rfc3339, rfc3339

#: every taint, annotation and label gpuops writes has this key prefix; resume removes only these
KEY_PREFIX = "gpuops.io/"
FAULT_TAINT = "gpuops.io/fault"
ACTION_ANNOTATION = "gpuops.io/action"
MAINTENANCE_ANNOTATION = "gpuops.io/maintenance-until"
CONDITION_TYPE = "GpuopsRemediation"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


class KubernetesAdapterConfig(BaseModel):
    """Knobs of :class:`KubernetesAdapter`; each says its unit and why its default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    system_namespaces: tuple[str, ...] = Field(
        ("kube-system",),
        description="Namespaces whose pods are never evicted nor counted as work: the cluster's own "
        "components (CNI, DNS, device plugins) must stay on the node. Add e.g. gpu-operator.")
    work_owner_kinds: tuple[str, ...] = Field(
        ("Job",),
        description="Owner kinds whose pods are the node's work: a drain lets them finish, a requeue "
        "evicts them so their controller starts them elsewhere. Add e.g. PyTorchJob, MPIJob.")
    pool_label: str | None = Field(
        None, description="Node label whose value is the node's pool (NodeStatus.partitions: the unit of "
        "the per-partition drain cap), e.g. cloud.google.com/gke-nodepool. None: no pools.")
    facility_labels: dict[str, tuple[str, ...]] = Field(
        {"leaf": ("network.topology.nvidia.com/leaf", "fabric.topograph.run/tier-0")},
        description="Facility label (rack, leaf, switch: SafetyConfig.facility_labels) -> the node label "
        "keys that carry it, first present wins. Default: the leaf switch NVIDIA Topograph writes (its "
        "0.x/1.0 key, then its 1.1 key); Kubernetes has no well-known rack label, so add your site's.")
    eviction_grace_period_s: int | None = Field(
        None, ge=0, description="Grace period, s, passed with each eviction. None: the pod's own "
        "terminationGracePeriodSeconds, so a job gets the time it asked for to checkpoint.")
    pdb_retry_after_s: float = Field(
        30.0, gt=0, description="Retry hint, s, when a PodDisruptionBudget refuses an eviction and the "
        "server sends no Retry-After: about the time a replacement pod takes to become ready.")
    request_timeout_s: float = Field(
        10.0, gt=0, description="Timeout, s, of each API request: a healthy API server answers in ms; "
        "10 s rides out a leader change without stalling the engine's loop.")
    max_conflict_retries: int = Field(
        3, ge=0, description="Re-reads after a 409 conflict (someone else wrote the node meanwhile) "
        "before the request counts as transient.")


    @field_validator("facility_labels", mode="before")
    @classmethod
    def _one_key_or_several(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {k: (keys,) if isinstance(keys, str) else keys for k, keys in v.items()}
        return v


# ---- pure helpers (unit-tested without a server) ----------------------------------------

# ---- the adapter --------------------------------------------------------------------------

class KubernetesAdapter:
    """The :class:`~remediation.adapters.base.Adapter` for Kubernetes (module docstring).

    ``api_client``: a configured ``kubernetes.client.ApiClient``; else ``kubeconfig`` (a path),
    else the in-cluster service account when ``in_cluster``, else the default kubeconfig.
    ``clock``: seconds since the epoch (the annotation's time, maintenance windows).
    """

    name = "kubernetes"

    def __init__(self, api_client: Any = None, *, kubeconfig: str | None = None, in_cluster: bool = False,
                 config: KubernetesAdapterConfig | None = None,
                 system_namespaces: Iterable[str] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        from kubernetes import client

        self.config = config or KubernetesAdapterConfig()
        if system_namespaces is not None:
            self.config = self.config.model_copy(update={"system_namespaces": tuple(system_namespaces)})
        if api_client is None:
            api_client = _load_api_client(kubeconfig, in_cluster)
        self._client = client
        self._core = client.CoreV1Api(api_client)
        self._clock = clock
        self._timeout = self.config.request_timeout_s

    # -- requests --

    def drain(self, node: str, reason: str) -> None:
        self._drain(node, reason, evict_work=False)

    def requeue(self, node: str, reason: str) -> list[str]:
        return self._drain(node, reason, evict_work=True)

    def reboot(self, node: str, reason: str) -> None:
        validate_node_name(node)
        raise PermanentAdapterError(
            f"cannot reboot {node}: Kubernetes has no reboot API; reboots go through the node agent "
            "or the BMC (drain first with the kubernetes adapter)")

    def resume(self, node: str, reason: str) -> None:
        validate_node_name(node)
        for attempt in range(self.config.max_conflict_retries + 1):
            obj = self._read_node(node)
            ours, cordoned = self._ours(obj), bool(obj.spec.unschedulable)
            if not ours:
                if cordoned:
                    raise NotOurs(f"{node} is cordoned by someone else (no {FAULT_TAINT} taint or "
                                  f"{ACTION_ANNOTATION} annotation): gpuops leaves it cordoned")
                return  # not cordoned, nothing of ours: already in service
            taints = [self._taint_dict(t) for t in (obj.spec.taints or []) if not t.key.startswith(KEY_PREFIX)]
            body = {"metadata": {"resourceVersion": obj.metadata.resource_version,
                                 "annotations": {ACTION_ANNOTATION: None}},
                    "spec": {"unschedulable": None, "taints": taints or None}}
            if self._patch_node(node, body, "resume", attempt):
                break
        self._set_condition(node, False, reason)

    def status(self, node: str) -> NodeStatus:
        validate_node_name(node)
        try:
            obj = self._call(self._core.read_node, node, what=f"read node {node}", node=node)
        except UnknownNode:
            return NodeStatus(name=node, exists=False)
        return self._node_status(obj, self._work_by_node(node).get(node, ()))

    def list_nodes(self) -> list[NodeStatus]:
        nodes = self._call(self._core.list_node, what="list nodes").items
        work = self._work_by_node(None)
        return [self._node_status(n, work.get(n.metadata.name, ())) for n in nodes]

    # -- drain and evictions --

    def _drain(self, node: str, reason: str, evict_work: bool) -> list[str]:
        validate_node_name(node)
        self._cordon(node, reason)
        self._set_condition(node, True, reason)
        evicted: list[str] = []
        blocked: list[str] = []
        retry_after = self.config.pdb_retry_after_s
        for pod in self._pods_on(node):
            if self._infrastructure(pod) or self._finished(pod) or pod.metadata.deletion_timestamp:
                continue
            owner = self._owner_kind(pod)
            if owner is None:
                continue  # a bare pod: nothing would recreate it, evicting it kills the work
            if owner in self.config.work_owner_kinds and not evict_work:
                continue  # the node's work finishes here (a drain, not a requeue)
            ref = f"{pod.metadata.namespace}/{pod.metadata.name}"
            refused_retry_s = self._evict(pod)
            if refused_retry_s is None:
                evicted.append(ref)
            else:
                blocked.append(ref)
                retry_after = refused_retry_s
        if blocked:
            raise TransientAdapterError(
                f"drain of {node}: a PodDisruptionBudget refused the eviction of {', '.join(sorted(blocked))} "
                f"(evicted now: {', '.join(sorted(evicted)) or 'none'}); the node stays cordoned, retry later",
                retry_after_s=retry_after)
        return sorted(evicted)

    def _evict(self, pod: Any) -> float | None:
        """Evict one pod: None when done (or already gone), else the retry hint, s, of the
        PodDisruptionBudget that refused it (HTTP 429)."""
        from kubernetes.client.exceptions import ApiException

        name, ns = pod.metadata.name, pod.metadata.namespace
        grace = self.config.eviction_grace_period_s
        body = self._client.V1Eviction(
            metadata=self._client.V1ObjectMeta(name=name, namespace=ns),
            delete_options=None if grace is None else self._client.V1DeleteOptions(grace_period_seconds=grace))
        try:
            self._core.create_namespaced_pod_eviction(name, ns, body, _request_timeout=self._timeout)
        except ApiException as e:
            if e.status == 404:
                return None  # gone already
            if e.status == 429:
                return retry_after(e, self.config.pdb_retry_after_s)
            raise map_api_error(e, f"evict pod {ns}/{name}", default_retry_s=self.config.pdb_retry_after_s) from e
        except transient_exceptions() as e:
            raise map_api_error(e, f"evict pod {ns}/{name}") from e
        return None

    # -- node writes --

    def _cordon(self, node: str, reason: str) -> None:
        for attempt in range(self.config.max_conflict_retries + 1):
            obj = self._read_node(node)
            if obj.spec.unschedulable and not self._ours(obj):
                raise NotOurs(f"{node} is already cordoned by someone else (no {FAULT_TAINT} taint or "
                              f"{ACTION_ANNOTATION} annotation): gpuops does not take it over")
            fault = fault_of(reason)
            taints = [self._taint_dict(t) for t in (obj.spec.taints or []) if t.key != FAULT_TAINT]
            taints.append({"key": FAULT_TAINT, "value": fault, "effect": "NoSchedule"})
            previous = self._action_annotation(obj)
            at = previous.get("at") if previous.get("reason") == reason else None
            action = json.dumps({"reason": reason, "at": at or rfc3339(self._clock())}, sort_keys=True)
            body = {"metadata": {"resourceVersion": obj.metadata.resource_version,
                                 "annotations": {ACTION_ANNOTATION: action}},
                    "spec": {"unschedulable": True, "taints": taints}}
            if self._patch_node(node, body, "cordon", attempt):
                return

    def _patch_node(self, node: str, body: dict[str, Any], what: str, attempt: int) -> bool:
        """Patch the node; False on a 409 conflict that may be retried (re-read, recompute)."""
        from kubernetes.client.exceptions import ApiException

        try:
            self._core.patch_node(node, body, _request_timeout=self._timeout)
        except ApiException as e:
            if e.status == 409 and attempt < self.config.max_conflict_retries:
                return False
            raise map_api_error(e, f"{what} node {node}", node=node) from e
        except transient_exceptions() as e:
            raise map_api_error(e, f"{what} node {node}", node=node) from e
        return True

    def _set_condition(self, node: str, active: bool, reason: str) -> None:
        now = rfc3339(self._clock())
        kind = kind_of(reason) or "action"
        cond_reason = "Gpuops" + "".join(w.capitalize() for w in kind.split("_"))
        condition = {"type": CONDITION_TYPE, "status": "True" if active else "False",
                     "reason": cond_reason if active else "GpuopsResumed", "message": reason,
                     "lastHeartbeatTime": now, "lastTransitionTime": now}
        current = self._read_node(node)
        for c in current.status.conditions or []:
            if c.type == CONDITION_TYPE and c.status == condition["status"] and c.message == reason:
                return  # already says this: keep its transition time
        self._call(self._core.patch_node_status, node, {"status": {"conditions": [condition]}},
                   what=f"set condition {CONDITION_TYPE} on {node}", node=node)

    # -- reads --

    def _read_node(self, node: str) -> Any:
        return self._call(self._core.read_node, node, what=f"read node {node}", node=node)

    def _pods_on(self, node: str | None) -> list[Any]:
        selector = f"spec.nodeName={node}" if node else "spec.nodeName!="
        where = f"on {node}" if node else "on any node"
        return self._call(self._core.list_pod_for_all_namespaces, field_selector=selector,
                          what=f"list pods {where}").items

    def _work_by_node(self, node: str | None) -> dict[str, tuple[str, ...]]:
        """Running pods per node, less the node's own infrastructure (NodeStatus.jobs)."""
        work: dict[str, list[str]] = {}
        for pod in self._pods_on(node):
            if self._infrastructure(pod) or self._finished(pod):
                continue
            work.setdefault(pod.spec.node_name, []).append(f"{pod.metadata.namespace}/{pod.metadata.name}")
        return {n: tuple(sorted(p)) for n, p in work.items()}

    def _node_status(self, obj: Any, jobs: tuple[str, ...]) -> NodeStatus:
        name, labels = obj.metadata.name, obj.metadata.labels or {}
        annotations = obj.metadata.annotations or {}
        ours = self._ours(obj)
        fault = next((t.value for t in obj.spec.taints or [] if t.key == FAULT_TAINT), None)
        reason = self._action_annotation(obj).get("reason") or fault
        until = parse_rfc3339(annotations.get(MAINTENANCE_ANNOTATION, "") or "")
        ready = next((c.status for c in (obj.status.conditions if obj.status else None) or []
                      if c.type == "Ready"), None)
        pool = labels.get(self.config.pool_label) if self.config.pool_label else None
        raw = ("Ready" if ready == "True" else "NotReady") + (",SchedulingDisabled" if obj.spec.unschedulable else "")
        return NodeStatus(name=name, drained=bool(obj.spec.unschedulable), ours=ours,
                          reason=reason if ours else None, jobs=jobs,
                          maintenance=until is not None and until > self._clock(),
                          down=ready != "True", partitions=(pool,) if pool else (), raw_state=raw,
                          extra={**facility_of(labels, self.config.facility_labels),
                                 **({"fault": fault} if fault else {}),
                                 **({"maintenance_until": annotations[MAINTENANCE_ANNOTATION]}
                                    if until is not None and until > self._clock() else {})})

    # -- classification --

    def _ours(self, obj: Any) -> bool:
        taints = obj.spec.taints or []
        return any(t.key.startswith(KEY_PREFIX) for t in taints) or bool(self._action_annotation(obj))

    @staticmethod
    def _action_annotation(obj: Any) -> dict[str, Any]:
        text = (obj.metadata.annotations or {}).get(ACTION_ANNOTATION)
        if not text:
            return {}
        try:
            value = json.loads(text)
        except ValueError:
            return {"reason": text}
        return value if isinstance(value, dict) else {"reason": text}

    def _infrastructure(self, pod: Any) -> bool:
        """DaemonSet, mirror (static) or system-namespace pods: part of the node, never moved."""
        return (pod.metadata.namespace in self.config.system_namespaces
                or MIRROR_ANNOTATION in (pod.metadata.annotations or {})
                or self._owner_kind(pod) == "DaemonSet")

    @staticmethod
    def _finished(pod: Any) -> bool:
        return bool(pod.status) and pod.status.phase in ("Succeeded", "Failed")

    @staticmethod
    def _owner_kind(pod: Any) -> str | None:
        refs = pod.metadata.owner_references or []
        controller = next((r for r in refs if r.controller), refs[0] if refs else None)
        return controller.kind if controller else None

    @staticmethod
    def _taint_dict(t: Any) -> dict[str, Any]:
        d = {"key": t.key, "effect": t.effect}
        if t.value is not None:
            d["value"] = t.value
        if t.time_added is not None:
            d["timeAdded"] = rfc3339(t.time_added.timestamp())
        return d

    def _call(self, fn: Callable[..., Any], *args: Any, what: str, node: str | None = None, **kw: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, _request_timeout=self._timeout, **kw)
        except ApiException as e:
            raise map_api_error(e, what, node=node) from e
        except transient_exceptions() as e:
            raise map_api_error(e, what, node=node) from e


def _load_api_client(kubeconfig: str | None, in_cluster: bool) -> Any:
    from kubernetes import client, config

    try:
        if in_cluster:
            config.load_incluster_config()
            return client.ApiClient()
        return config.new_client_from_config(config_file=kubeconfig)
    except config.ConfigException as e:
        where = "the in-cluster service account" if in_cluster else (kubeconfig or "the default kubeconfig")
        raise PermanentAdapterError(f"cannot configure the Kubernetes client from {where}: {e}") from e
