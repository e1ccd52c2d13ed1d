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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from pipeline.registry import NodeRegistry


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

    def __len__(self) -> int:
        return len(self._stream) + len(self._service)

    def add(self, nodes: Iterable[str] | None, start: float, end: float) -> None:
        """Mute *nodes* (``None``: every node) from *start* to *end* (a maintenance event)."""
        self._stream[MutedInterval(None if nodes is None else tuple(nodes), float(start), float(end))] = None

    def replace_service(self, intervals: Iterable[MutedInterval]) -> None:
        """The service's silences as muted intervals, replacing the previous set."""
        self._service = tuple(intervals)

    def prune(self, before: float) -> None:
        """Forget stream intervals that end at or before *before* (no later tick overlaps them)."""
        if any(iv.end <= before for iv in self._stream):
            self._stream = {iv: None for iv in self._stream if iv.end > before}

    def nodes_muted(self, nodes: NodeRegistry, start: float, end: float) -> np.ndarray | None:
        """Per node id, whether it is muted somewhere in ``[start, end)``; ``None`` when no node is
        (the usual case: nothing to allocate)."""
        hits = [iv for iv in (*self._stream, *self._service) if iv.overlaps(start, end)]
        if not hits:
            return None
        mask = np.zeros(len(nodes), bool)
        for iv in hits:
            if iv.nodes is None:
                mask[:] = True
                break
            mask[nodes.known_ids(iv.nodes)] = True
        return mask
