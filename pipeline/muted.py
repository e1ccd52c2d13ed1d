"""Muted time: when a node's parts must not learn what normal is (issue 13).

A node under maintenance or silenced by a person is not doing its normal work: a burn-in
after a repair, a firmware flash, a reseat that throws link errors on purpose. What its parts
do then says nothing about their usual rate, so while a node is muted the per-part baselines
of its GPUs and ports are frozen (:meth:`pipeline.baselines.RateBaselines.update`): nothing
learnt, nothing forgotten. Features are still computed, against the frozen baseline.

Two sources of muted intervals, kept apart because they change differently:

* operator maintenance events in the stream itself (:mod:`collector.operator_events`): live
  from the bus's events, in replay from the recording's events — the same intervals either
  way, so live and replay stay identical. They accumulate and are dropped once past.
* the service's silences, handed in as a whole set from time to time by the scoring worker
  (:meth:`MutedTime.replace_service`); a set replaced, so a deleted silence stops muting.

A node is muted in a tick when an interval overlaps the tick ``[end - cadence, end)``.

The same intervals say when a reset or reboot is a *repair* (:meth:`MutedTime.nodes_repairing`):
inside a muted interval or up to :data:`REPAIR_GRACE_S` after it ended (the reboot that closes
a maintenance), or within :data:`REPAIR_GRACE_S` of a command gpuops' agent carried out on the
node (:meth:`MutedTime.add_repair`: a GPU reset by the remediation engine). A reset outside
that context is not a repair: a GPU that resets or a node that reboots on its own is the same
part with the same history, and that history is the evidence a failing part leaves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from pipeline.registry import NodeRegistry

#: How long after a muted interval ends, or after gpuops' agent carried out a command on a node,
#: a reset or reboot of its parts counts as the repair (s): the reboot that ends a maintenance.
REPAIR_GRACE_S = 3600.0


@dataclass(frozen=True)
class MutedInterval:
    """*nodes* (``None``: the whole fleet) are muted from *start* to *end* (telemetry/epoch s)."""

    nodes: tuple[str, ...] | None
    start: float
    end: float

    def overlaps(self, start: float, end: float) -> bool:
        return self.start < end and self.end > start


class MutedTime:
    """The muted intervals of one pipeline: from the stream, and from the service's silences."""

    def __init__(self) -> None:
        self._stream: dict[MutedInterval, None] = {}  # insertion-ordered set: a re-read event is one interval
        self._service: tuple[MutedInterval, ...] = ()
        self._repairs: dict[MutedInterval, None] = {}  # [command time, + grace) per node

    def __len__(self) -> int:
        return len(self._stream) + len(self._service)

    def add_repair(self, node: str, ts: float) -> None:
        """gpuops' agent carried out a command on *node* at *ts*: a reset there is a repair."""
        self._repairs[MutedInterval((node,), float(ts), float(ts) + REPAIR_GRACE_S)] = None

    def add(self, nodes: Iterable[str] | None, start: float, end: float) -> None:
        """Mute *nodes* (``None``: every node) from *start* to *end* (a maintenance event)."""
        self._stream[MutedInterval(None if nodes is None else tuple(nodes), float(start), float(end))] = None

    def replace_service(self, intervals: Iterable[MutedInterval]) -> None:
        """The service's silences as muted intervals, replacing the previous set."""
        self._service = tuple(intervals)

    def prune(self, before: float) -> None:
        """Forget stream intervals and repairs that no later tick can overlap, grace included."""
        if any(iv.end + REPAIR_GRACE_S <= before for iv in self._stream):
            self._stream = {iv: None for iv in self._stream if iv.end + REPAIR_GRACE_S > before}
        if any(iv.end <= before for iv in self._repairs):
            self._repairs = {iv: None for iv in self._repairs if iv.end > before}

    def nodes_muted(self, nodes: NodeRegistry, start: float, end: float) -> np.ndarray | None:
        """Per node id, whether it is muted somewhere in ``[start, end)``; ``None`` when no node is
        (the usual case: nothing to allocate)."""
        return _mask(nodes, [iv for iv in (*self._stream, *self._service) if iv.overlaps(start, end)])

    def nodes_repairing(self, nodes: NodeRegistry, start: float, end: float) -> np.ndarray | None:
        """Per node id, whether a reset in ``[start, end)`` is a repair (see the module doc);
        ``None`` when no node is."""
        hits = [iv for iv in (*self._stream, *self._service) if iv.overlaps(start - REPAIR_GRACE_S, end)]
        return _mask(nodes, hits + [iv for iv in self._repairs if iv.overlaps(start, end)])


def _mask(nodes: NodeRegistry, hits: list[MutedInterval]) -> np.ndarray | None:
    """Per node id, whether one of *hits* names it; ``None`` when there are none."""
    if not hits:
        return None
    mask = np.zeros(len(nodes), bool)
    for iv in hits:
        if iv.nodes is None:
            mask[:] = True
            break
        mask[nodes.known_ids(iv.nodes)] = True
    return mask
