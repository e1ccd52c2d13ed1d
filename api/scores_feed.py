"""What every replica reads back from the bus: ``gpu.scores`` into the fleet view and the engine,
``gpu.events`` into the node pages and, for GPU resets, the engine's records (on every replica:
the store's compare-and-set lets one of them move the action, and a result that arrives during
a failover is not lost).

Each replica consumes with a consumer group of its own (``gpuops-view-<replica>``), so every
replica sees every tick. On each decoded tick the feed updates the :class:`~api.nodeview.NodeView`;
the engine leader (``is_leader()``) additionally runs ``engine.tick`` with the reasons the
scoring worker shipped (:func:`models.score_wire.explain_from`) and publishes its holds to the
view. An unreadable message is counted and logged (:class:`~models.score_wire.ScoresFormatError`)
and never stops the loop; neither does a failing tick (the store or adapter down): the next
tick decides again, and the leader's verification job retries what is open.

Offsets are committed after each batch is handled, so a crash replays at most one batch
into the engine, whose action ids are deterministic (a replayed decision is a duplicate,
not a second action).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from collector.wire import TOPIC_EVENTS, TOPIC_SCORES, WireError, decode_event
from models.score_wire import ScoresFormatError, decode_scores, explain_from
from pipeline.bus import Bus
from remediation.adapters.agent_commands import parse_result
from remediation.engine import Engine
from remediation.store import StaleRecord

from api.nodeview import NodeView

log = logging.getLogger(__name__)


class ScoresFeed:
    """Consumes ``gpu.scores`` and ``gpu.events`` from *bus* (see the module docstring)."""

    def __init__(self, bus: Bus, nodes: NodeView, engine: Engine, is_leader: Callable[[], bool], *,
                 scores_topic: str = TOPIC_SCORES, events_topic: str = TOPIC_EVENTS,
                 monotonic: Callable[[], float] = time.monotonic, poll_timeout_s: float = 0.5) -> None:
        self.bus, self.nodes, self.engine, self.is_leader = bus, nodes, engine, is_leader
        self.scores_topic, self.events_topic = scores_topic, events_topic
        self._mono = monotonic
        self.poll_timeout_s = poll_timeout_s
        #: node -> monotonic time its last score arrived (the stale-telemetry job reads it)
        self.last_seen: dict[str, float] = {}
        self.ticks = 0
        self.ticks_decided = 0
        self.unreadable = 0
        self.tick_errors = 0
        self.last_tick_at: float | None = None
        #: wall seconds the last engine tick took
        self.last_decide_s = 0.0

    def run_once(self) -> int:
        """Poll one batch, handle it, commit; how many messages were handled."""
        msgs = self.bus.poll(500, self.poll_timeout_s)
        for m in msgs:
            if m.topic == self.scores_topic:
                self._scores(m.value)
            elif m.topic == self.events_topic:
                self._event(m.value)
        if msgs:
            self.bus.commit()
        return len(msgs)

    def run(self, stop: threading.Event) -> None:
        """Handle batches until *stop* is set; the batch in hand is finished first."""
        while not stop.is_set():
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - a long-running loop logs and continues (STYLE.md 9)
                log.exception("scores feed: batch failed; continuing")
                stop.wait(1.0)

    def _scores(self, raw: bytes) -> None:
        try:
            ns, reasons, msg = decode_scores(raw)
        except ScoresFormatError as e:
            self.unreadable += 1
            log.warning("unreadable gpu.scores message skipped: %s", e)
            return
        detail = msg.get("detail") if isinstance(msg.get("detail"), dict) else None
        self.nodes.update(ns, reasons, detail)
        now = self._mono()
        for n in ns.node:
            self.last_seen[str(n)] = now
        self.ticks += 1
        self.last_tick_at = now
        if not self.is_leader():
            return
        t = time.perf_counter()
        try:
            self.engine.tick(ns, explain_from(ns, reasons))
            self.ticks_decided += 1
        except Exception:  # noqa: BLE001 - the store or adapter down: the next tick decides again
            self.tick_errors += 1
            log.exception("engine tick at %s failed; the next tick decides again", ns.ts)
        self.last_decide_s = time.perf_counter() - t
        self.nodes.set_held(self.engine.holds)

    def _event(self, raw: bytes) -> None:
        result = parse_result(raw)
        if result is not None:
            # every replica records it (a result that arrives during a failover is not lost);
            # the store's compare-and-set lets exactly one of them move the action
            try:
                self.engine.on_command_result(result.command_id, result.status.value, result.detail)
            except StaleRecord as e:
                log.info("command result already recorded by another replica: %s", e)
            return
        try:
            event: dict[str, Any] = decode_event(raw)
        except WireError:
            return                           # the scoring workers dead-letter what they cannot read
        self.nodes.add_events([event])
        if event.get("source") == "operator":
            self.engine.on_operator_event(event)   # a maintenance window: a silence (same id on every replica)
