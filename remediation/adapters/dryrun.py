"""The dry-run adapter: records what would have happened, touches nothing.

The default back-end (the engine uses it until automation is armed), and the one replay
and the embedded service run. It keeps an in-memory picture of the nodes it "drained" so
that the engine's verification and resume logic run exactly as against a real scheduler,
and a list of every call (``calls``) for reports and tests. Nodes it has never seen exist
and are idle; ``known`` seeds a fleet (names, partitions) when a test or the embedded
service wants the caps per partition to mean something.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Iterable

from .base import NodeStatus, NotOurs, PermanentAdapterError, owned, validate_node_name


@dataclass(frozen=True)
class DryRunCall:
    verb: str
    node: str
    reason: str


class DryRunAdapter:
    """An :class:`~remediation.adapters.base.Adapter` that only remembers."""

    name = "dryrun"

    def __init__(self, known: Iterable[NodeStatus] = ()) -> None:
        self._nodes: dict[str, NodeStatus] = {n.name: n for n in known}
        self._lock = threading.Lock()
        self.calls: list[DryRunCall] = []

    def _get(self, node: str) -> NodeStatus:
        return self._nodes.get(node) or NodeStatus(name=node)

    def _record(self, verb: str, node: str, reason: str) -> NodeStatus:
        validate_node_name(node)
        if verb != "resume" and not owned(reason):
            raise PermanentAdapterError(f"reason {reason!r} must start with the gpuops prefix")
        self.calls.append(DryRunCall(verb, node, reason))
        return self._get(node)

    def drain(self, node: str, reason: str) -> None:
        with self._lock:
            cur = self._record("drain", node, reason)
            if cur.drained and not cur.ours:
                raise NotOurs(f"{node} is drained by someone else ({cur.reason!r})")
            self._nodes[node] = replace(cur, drained=True, ours=True, reason=reason)

    def requeue(self, node: str, reason: str) -> list[str]:
        with self._lock:
            cur = self._record("requeue", node, reason)
            if cur.drained and not cur.ours:
                raise NotOurs(f"{node} is drained by someone else ({cur.reason!r})")
            self._nodes[node] = replace(cur, drained=True, ours=True, reason=reason, jobs=())
            return list(cur.jobs)

    def reboot(self, node: str, reason: str) -> None:
        with self._lock:
            cur = self._record("reboot", node, reason)
            self._nodes[node] = replace(cur, drained=False, ours=False, reason=None, jobs=())

    def resume(self, node: str, reason: str) -> None:
        with self._lock:
            cur = self._record("resume", node, reason)
            if not cur.drained:
                return
            if not cur.ours:
                raise NotOurs(f"{node} is drained by someone else ({cur.reason!r}): gpuops leaves it")
            self._nodes[node] = replace(cur, drained=False, ours=False, reason=None)

    def status(self, node: str) -> NodeStatus:
        validate_node_name(node)
        with self._lock:
            return self._get(node)

    def list_nodes(self) -> list[NodeStatus]:
        with self._lock:
            return list(self._nodes.values())

    # ---- for tests and the embedded fleet: what the "cluster" looks like ----

    def set_status(self, status: NodeStatus) -> None:
        with self._lock:
            self._nodes[status.name] = status
