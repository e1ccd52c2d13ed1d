"""The scheduler adapter contract: what the engine may ask of Slurm, Kubernetes or a dry run.

One small :class:`Adapter` protocol, one module per back-end, picked by name from
:data:`ADAPTERS` (an unknown name fails at start-up listing the valid ones). Adapters do
no policy: they carry out one request, report the node's real state, and classify their
failures as :class:`TransientAdapterError` (retry later: controller down, timeout,
PodDisruptionBudget 429) or :class:`PermanentAdapterError` (do not retry: unknown node,
a drain someone else owns, bad input).

Ownership: gpuops only undoes what it did. A drain reason or taint gpuops set starts
with :data:`~remediation.actions.REASON_PREFIX`; :meth:`Adapter.resume` refuses
(:class:`NotOurs`) a node drained or cordoned by anyone else.

GPU resets do not go through the scheduler: the engine sends a signed command to the
node agent (``remediation/adapters/agent_commands.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from remediation.actions import REASON_PREFIX

#: a node name a scheduler accepts: hostname characters only (no shell, no Slurm hostlist
#: expression, no option); checked before any name reaches a command line or an API path
_NODE_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$")


class AdapterError(Exception):
    """An adapter request failed; ``transient`` says whether retrying may help."""

    transient = False

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TransientAdapterError(AdapterError):
    """Retry later: controller unreachable, timeout, eviction blocked by a PDB (429)."""

    transient = True


class PermanentAdapterError(AdapterError):
    """Retrying will not help: unknown node, invalid request, refused by the scheduler."""


class UnknownNode(PermanentAdapterError):
    """The scheduler does not know this node."""


class NotOurs(PermanentAdapterError):
    """The node is drained/cordoned/tainted by someone else: gpuops leaves it alone."""


def validate_node_name(name: str) -> str:
    """*name* if it is a plain host name, else :class:`PermanentAdapterError`."""
    if not isinstance(name, str) or not _NODE_NAME.fullmatch(name):
        raise PermanentAdapterError(f"invalid node name {name!r}: expected host name characters "
                                    "[A-Za-z0-9._-], starting and ending with a letter or digit")
    return name


@dataclass(frozen=True)
class NodeStatus:
    """A node as the scheduler sees it now (read before and after every action)."""

    name: str
    exists: bool = True
    #: the scheduler will not place new work here (Slurm DRAIN/DRAINING/DRAINED, k8s cordoned)
    drained: bool = False
    #: ... and the drain/cordon is gpuops' own (reason or taint carries REASON_PREFIX)
    ours: bool = False
    #: the drain reason / taint value as the scheduler reports it
    reason: str | None = None
    #: running work on the node (Slurm job ids, k8s "namespace/pod")
    jobs: tuple[str, ...] = ()
    #: declared maintenance: a Slurm MAINT reservation, a maintenance-until annotation
    maintenance: bool = False
    #: rebooting, or a reboot is pending
    rebooting: bool = False
    #: unreachable / down in the scheduler's eyes (Slurm DOWN, NotReady)
    down: bool = False
    #: partition(s) / node pool(s): the unit of the per-partition drain cap
    partitions: tuple[str, ...] = ()
    #: the raw state string(s), for the audit record
    raw_state: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def idle(self) -> bool:
        return not self.jobs


@runtime_checkable
class Adapter(Protocol):
    """One scheduler back-end. Every method validates the node name first.

    All methods are idempotent: draining a node already drained by gpuops succeeds; resuming
    a node that is not drained succeeds. ``reason`` always starts with REASON_PREFIX.
    """

    name: str

    def drain(self, node: str, reason: str) -> None:
        """No new work on *node*; running work continues."""

    def requeue(self, node: str, reason: str) -> list[str]:
        """Drain *node* and send its running work elsewhere now; returns the work moved."""

    def reboot(self, node: str, reason: str) -> None:
        """Reboot *node* once idle and return it to service afterwards (Slurm ``reboot ASAP``)."""

    def resume(self, node: str, reason: str) -> None:
        """Return *node* to service; :class:`NotOurs` if the drain/cordon is not gpuops'."""

    def status(self, node: str) -> NodeStatus:
        """The node now; ``exists=False`` (not an error) for a node the scheduler lacks."""

    def list_nodes(self) -> list[NodeStatus]:
        """Every node the scheduler knows (one call; used to rebuild state after a restart)."""


def owned(reason: str | None) -> bool:
    """Whether a scheduler reason (Slurm may append ``[user@time]``) is gpuops' own."""
    return bool(reason) and reason.lstrip().startswith(REASON_PREFIX)


#: adapter name -> "module:Class"; imported only when chosen (the kubernetes client is heavy)
ADAPTERS: dict[str, str] = {
    "dryrun": "remediation.adapters.dryrun:DryRunAdapter",
    "slurm": "remediation.adapters.slurm:SlurmAdapter",
    "kubernetes": "remediation.adapters.kubernetes:KubernetesAdapter",
}


def adapter_class(name: str) -> type:
    """The class registered under *name*; ValueError listing the valid names otherwise."""
    import importlib

    try:
        target = ADAPTERS[name]
    except KeyError:
        raise ValueError(f"unknown adapter {name!r}; valid: {', '.join(sorted(ADAPTERS))}") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)
