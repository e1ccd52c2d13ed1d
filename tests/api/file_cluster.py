"""A scheduler kept in a file, shared by several ``serve`` processes: a fake at our own boundary (Adapter).

The HA test needs one cluster that two service processes act on and that survives one
of them being killed, and a record of every call with the process that made it. State is
a JSON file (node -> drained, reason) under an ``fcntl`` lock; every call appends one JSON
line (pid, verb, node, reason) to ``<path>.calls``. Semantics follow the dry-run adapter.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from remediation.adapters.base import NodeStatus, NotOurs, owned, validate_node_name


class FileClusterAdapter:
    """An Adapter whose cluster is a file (see the module docstring)."""

    name = "filecluster"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.calls_path = Path(f"{path}.calls")

    @contextmanager
    def _state(self) -> Iterator[dict]:
        with open(f"{self.path}.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = json.loads(self.path.read_text()) if self.path.exists() else {}
            yield state
            self.path.write_text(json.dumps(state))

    def _call(self, verb: str, node: str, reason: str) -> None:
        validate_node_name(node)
        with open(self.calls_path, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "verb": verb, "node": node, "reason": reason}) + "\n")

    def drain(self, node: str, reason: str) -> None:
        self._call("drain", node, reason)
        with self._state() as s:
            cur = s.get(node, {})
            if cur.get("drained") and not owned(cur.get("reason")):
                raise NotOurs(f"{node} drained by someone else")
            s[node] = {"drained": True, "reason": reason}

    def requeue(self, node: str, reason: str) -> list[str]:
        self.drain(node, reason)
        return []

    def reboot(self, node: str, reason: str) -> None:
        self._call("reboot", node, reason)
        with self._state() as s:
            s[node] = {"drained": False, "reason": None}

    def resume(self, node: str, reason: str) -> None:
        self._call("resume", node, reason)
        with self._state() as s:
            s[node] = {"drained": False, "reason": None}

    def status(self, node: str) -> NodeStatus:
        validate_node_name(node)
        with self._state() as s:
            cur = s.get(node, {})
        return NodeStatus(name=node, drained=bool(cur.get("drained")), ours=owned(cur.get("reason")),
                          reason=cur.get("reason"))

    def list_nodes(self) -> list[NodeStatus]:
        with self._state() as s:
            names = list(s)
        return [self.status(n) for n in names]

    def calls(self) -> list[dict]:
        if not self.calls_path.exists():
            return []
        return [json.loads(line) for line in self.calls_path.read_text().splitlines() if line.strip()]
