"""Slurm's view of nodes and jobs, read from ``sinfo --json``, ``squeue --json`` and reservations.

Pure functions over the text Slurm prints, so they are tested against real captures
(``tests/remediation/data/*_22.05_*``) without a cluster. What Slurm 22.05 prints, and
what these functions rely on:

- ``sinfo --json`` → ``{"nodes": [...]}``: ``state`` is the base state in lower case
  (``idle``, ``mixed``, ``allocated``, ``down``), ``state_flags`` the flags (``DRAIN``,
  ``REBOOT_REQUESTED``, ``REBOOT_ISSUED``, ``MAINTENANCE``, ``RESERVED``,
  ``NOT_RESPONDING``), ``reason`` the drain/down reason *without* the ``[user@time]``
  suffix ``scontrol show node`` appends. "draining"/"drained" are not states here: a node
  is draining while it has jobs and DRAIN set.
- ``squeue --json`` → ``{"jobs": [...]}`` with every job (22.05 ignores ``-j``/``-n`` with
  ``--json``: filter here); ``nodes`` is a hostlist expression (``gpu-node-[01-02]``).
- ``scontrol -o show reservation``: one ``Key=Value`` line per reservation, or
  ``No reservations in the system``. ``Nodes`` is a hostlist expression.
- ``scontrol show topology`` (topology/tree): one line per switch, ``SwitchName=leaf-01
  Level=0 LinkSpeed=1 Nodes=gpu-node-[01-02]`` (a higher ``Level`` lists ``Switches=`` too and
  every node below it). Without a topology plugin it prints nothing on stdout, exit status 0,
  and ``No topology information available`` on stderr. Node ``features`` in ``sinfo --json``
  is a comma-separated string (``rack_r01,h100``); Slurm prints ``(null)`` elsewhere for none.
- A JSON answer from a controller that is down has exit status 0, no nodes/jobs and a
  non-empty ``errors`` list (``"Unspecified error"``): :func:`json_errors` reports it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from remediation.adapters.base import NodeStatus, owned

#: job states that still occupy the node: the job runs, starts, or is being killed
#: (COMPLETING: a requeued or cancelled job's processes are still on the node)
OCCUPYING_JOB_STATES = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"})
#: node state flags meaning a reboot is pending or under way
REBOOT_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})
#: base states / flags meaning no new work is placed on the node (other Slurm versions print
#: the derived names as the state itself)
DRAIN_MARKS = frozenset({"DRAIN", "DRAINING", "DRAINED"})

_KEY_VALUE = re.compile(r"(\w+)=(\S*)")


def expand_hostlist(expression: str) -> list[str]:
    """The host names of a Slurm hostlist expression (``gpu-node-[01-03,07],login1``).

    Ranges keep their zero padding; several bracket groups in one name multiply out.
    """
    names: list[str] = []
    for part in _split_top_level(expression.strip()):
        names.extend(_expand_one(part))
    return names


def _split_top_level(expression: str) -> Iterable[str]:
    depth, start = 0, 0
    for i, c in enumerate(expression):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif c == "," and depth == 0:
            if expression[start:i]:
                yield expression[start:i]
            start = i + 1
    if expression[start:]:
        yield expression[start:]


def _expand_one(name: str) -> list[str]:
    open_at = name.find("[")
    if open_at < 0:
        return [name]
    close_at = name.find("]", open_at)
    if close_at < 0:
        return [name]  # not a hostlist: leave it for the name check to refuse
    head, body, tail = name[:open_at], name[open_at + 1:close_at], name[close_at + 1:]
    out: list[str] = []
    for item in body.split(","):
        lo, _, hi = item.partition("-")
        if hi and lo.isdigit() and hi.isdigit():
            width = len(lo)
            values = [str(v).zfill(width) for v in range(int(lo), int(hi) + 1)]
        else:
            values = [item]
        for value in values:
            out.extend(head + value + rest for rest in _expand_one(tail))
    return out


def json_errors(document: dict[str, Any]) -> list[str]:
    """The ``errors`` of a Slurm ``--json`` answer as readable strings (empty when none)."""
    found = []
    for err in document.get("errors") or []:
        if isinstance(err, dict):
            parts = [str(err[k]) for k in ("source", "description", "error") if err.get(k)]
            found.append(": ".join(parts) or json.dumps(err))
        else:
            found.append(str(err))
    return found


@dataclass(frozen=True)
class SlurmJob:
    """One job from ``squeue --json``, reduced to what the adapter needs."""

    job_id: str
    state: str
    nodes: tuple[str, ...]
    batch: bool
    requeueable: bool
    reason: str = ""

    @classmethod
    def from_json(cls, job: dict[str, Any]) -> "SlurmJob":
        nodes = job.get("nodes") or ""
        return cls(job_id=str(job["job_id"]), state=str(job.get("job_state", "")).upper(),
                   nodes=tuple(expand_hostlist(nodes)) if nodes else (),
                   batch=bool(job.get("batch_flag")), requeueable=bool(job.get("requeue")),
                   reason=str(job.get("state_reason") or ""))

    @property
    def occupies_node(self) -> bool:
        return self.state in OCCUPYING_JOB_STATES


def parse_jobs(document: dict[str, Any]) -> list[SlurmJob]:
    """Every job of a ``squeue --json`` answer."""
    return [SlurmJob.from_json(j) for j in document.get("jobs") or []]


def jobs_on(jobs: Iterable[SlurmJob], node: str) -> list[SlurmJob]:
    """The jobs occupying *node* (running, starting, completing, suspended)."""
    return [j for j in jobs if j.occupies_node and node in j.nodes]


def maintenance_reservations(reservations_text: str) -> dict[str, str]:
    """Node -> the name of the ACTIVE reservation with the MAINT flag it is in
    (``scontrol -o show reservation``; the first listed wins when several overlap).

    A reservation that has not started yet (``State=INACTIVE``) is not maintenance now.
    """
    found: dict[str, str] = {}
    for line in reservations_text.splitlines():
        fields = dict(_KEY_VALUE.findall(line))
        if "ReservationName" not in fields:
            continue
        if fields.get("State") != "ACTIVE" or "MAINT" not in fields.get("Flags", "").split(","):
            continue
        if fields.get("Nodes") and fields["Nodes"] != "(null)":
            for node in expand_hostlist(fields["Nodes"]):
                found.setdefault(node, fields["ReservationName"])
    return found


def maintenance_nodes(reservations_text: str) -> set[str]:
    """Nodes in an ACTIVE reservation with the MAINT flag (see :func:`maintenance_reservations`)."""
    return set(maintenance_reservations(reservations_text))


def leaf_switches(topology_text: str) -> dict[str, str]:
    """Node -> its leaf: the lowest-level switch it is in (``scontrol show topology``,
    topology/tree). Empty when the cluster has no topology plugin (Slurm prints nothing)."""
    best: dict[str, tuple[int, str]] = {}
    for line in topology_text.splitlines():
        fields = dict(_KEY_VALUE.findall(line))
        name, nodes = fields.get("SwitchName"), fields.get("Nodes")
        if not name or not nodes or nodes == "(null)":
            continue
        level = int(fields["Level"]) if fields.get("Level", "").isdigit() else (1 if fields.get("Switches") else 0)
        for node in expand_hostlist(nodes):
            if node not in best or level < best[node][0]:
                best[node] = (level, name)
    return {node: name for node, (_, name) in best.items()}


def rack_of(features: Any, prefix: str) -> str | None:
    """The rack a node's Slurm features name by the site's convention: the first feature that
    starts with *prefix* (``rack_`` → ``rack_r07`` is rack ``r07``); None when none does."""
    if not prefix or not features:
        return None
    items = features if isinstance(features, (list, tuple)) else str(features).split(",")
    for feature in (str(f).strip() for f in items):
        if feature.startswith(prefix) and len(feature) > len(prefix):
            return feature[len(prefix):]
    return None


@dataclass(frozen=True)
class Facility:
    """Where the scheduler places nodes: leaf switch per node (topology), the rack feature's prefix."""

    leaves: Mapping[str, str]
    rack_prefix: str | None = "rack_"

    def labels(self, node: dict[str, Any]) -> dict[str, str]:
        """``rack`` and ``leaf`` for :attr:`NodeStatus.extra` (only those known)."""
        out = {}
        rack = rack_of(node.get("active_features") or node.get("features"), self.rack_prefix or "")
        if rack:
            out["rack"] = rack
        leaf = self.leaves.get(str(node.get("name")))
        if leaf:
            out["leaf"] = leaf
        return out


def node_status(node: dict[str, Any], jobs: Iterable[SlurmJob],
                maintenance: set[str] | Mapping[str, str], facility: Facility | None = None) -> NodeStatus:
    """A :class:`NodeStatus` from one ``sinfo --json`` node record and the cluster's jobs.

    *maintenance*: the nodes under a MAINT reservation, or node -> reservation name (then
    ``extra["maintenance_reservation"]`` names it, for the record of a suppressed action).
    *facility*: where the node sits (``extra["rack"]``, ``extra["leaf"]``; facility grouping).
    """
    name = str(node["name"])
    base = str(node.get("state", "")).upper()
    flags = tuple(str(f).upper() for f in node.get("state_flags") or ())
    reason = str(node.get("reason") or "").strip() or None
    drained = base in DRAIN_MARKS or any(f in DRAIN_MARKS for f in flags)
    return NodeStatus(
        name=name, exists=True, drained=drained,
        # ours: gpuops' reason on a node it holds (drained, down, or rebooting through gpuops)
        ours=owned(reason),
        reason=reason,
        jobs=tuple(j.job_id for j in jobs_on(jobs, name)),
        # MAINTENANCE appears on the node only at the reservation timer's next pass: the
        # reservation list is the authority, the flag a second witness
        maintenance=name in maintenance or "MAINTENANCE" in flags,
        rebooting=any(f in REBOOT_FLAGS for f in flags),
        down=base == "DOWN",
        partitions=tuple(str(p) for p in node.get("partitions") or ()),
        raw_state="+".join((base, *flags)),
        extra={"reason_set_by_user": node.get("reason_set_by_user"),
               "reason_changed_at": node.get("reason_changed_at"),
               "boot_time": node.get("boot_time"),
               "next_state_after_reboot": node.get("next_state_after_reboot"),
               **({"maintenance_reservation": maintenance[name]}
                  if isinstance(maintenance, Mapping) and name in maintenance else {}),
               **(facility.labels(node) if facility is not None else {})},
    )


def parse_nodes(sinfo: dict[str, Any], squeue: dict[str, Any], reservations_text: str,
                facility: Facility | None = None) -> list[NodeStatus]:
    """Every node of a ``sinfo --json`` answer with its jobs, maintenance and place."""
    jobs = parse_jobs(squeue)
    maintenance = maintenance_reservations(reservations_text)
    return [node_status(n, jobs, maintenance, facility) for n in sinfo.get("nodes") or []]
