"""The engine's view of the scheduler's nodes: partitions, labels, declared maintenance.

The policy decides from telemetry alone; the engine's checks around it need what the
scheduler says of each node — which partitions / node pools it is in (fleet-share limits,
facility groups), its labels (silence selectors, racks and switches for facility events),
and whether someone declared maintenance on it or drained it themselves. Listing every
node on each tick would put the scheduler's API in the hot path, so the view is filled at
start (:func:`remediation.recovery.rebuild_state`) and by the APScheduler job
``maintenance_view`` (:meth:`~remediation.engine.Engine.refresh_view`); the check before
each action reads that node's status anew anyway. Plain bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from .adapters.base import NodeStatus
from .facility import FLEET, NodeGroups


class ClusterView:
    """Each node as the scheduler last listed it (see the module docstring)."""

    def __init__(self) -> None:
        #: node -> its status as last listed (labels in ``extra`` for selectors and groups)
        self.known: dict[str, NodeStatus] = {}
        #: node -> its partitions / node pools
        self.partitions: dict[str, tuple[str, ...]] = {}

    def update(self, listed: Iterable[NodeStatus]) -> None:
        """Take in a listing; nodes it leaves out keep their last status."""
        for st in listed:
            self.partitions[st.name] = st.partitions
            self.known[st.name] = st

    def get(self, node: str) -> NodeStatus | None:
        return self.known.get(node)

    def under_maintenance(self) -> list[str]:
        """The nodes the last view showed under declared maintenance or drained by someone else."""
        return sorted(n for n, st in self.known.items() if st.maintenance or (st.drained and not st.ours))

    def partition_sizes(self, prefix: str = "") -> dict[str, int]:
        """Each partition's node count, keyed ``prefix + name``."""
        sizes: dict[str, int] = {}
        for parts in self.partitions.values():
            for part in parts:
                sizes[prefix + part] = sizes.get(prefix + part, 0) + 1
        return sizes

    def group_sizes(self, fleet_size: int) -> dict[str, int]:
        """Each facility group's node count for the share test: ``fleet`` (at least *fleet_size*,
        the most nodes a tick has scored) and ``partition/<name>``."""
        return {FLEET: max(fleet_size, len(self.partitions), len(self.known)), **self.partition_sizes("partition/")}

    def groups_of(self, node: str, labels: Sequence[str]) -> NodeGroups:
        """Where *node* sits: its labelled groups (``rack/r07`` for each key of *labels* it has),
        then its partitions (``partition/gpu``)."""
        st = self.known.get(node)
        extra = st.extra if st is not None else {}
        labelled = tuple(f"{k}/{extra[k]}" for k in labels if extra.get(k))
        parts = st.partitions if st is not None and st.partitions else self.partitions.get(node, ())
        return NodeGroups(labelled, tuple(f"partition/{p}" for p in parts))
