"""The live scoring worker: bus → pipeline → models → one ``gpu.scores`` message per tick.

:class:`ScoringWorker` wraps :class:`~pipeline.worker.StreamWorker` (which decodes,
dead-letters, builds features and commits) and, for each closed tick, scores it
(:func:`~models.node_scores.score_batches` + :func:`~models.node_scores.aggregate`),
explains the nodes worth a reason (:class:`~models.explainer.Explainer`) and publishes
one :func:`~models.score_wire.encode_scores` message keyed by the worker id. The
``StreamWorker`` flushes the producer and only then commits the offsets of closed ticks,
so a score is out before the samples behind it are marked consumed (at-least-once: a
crash replays, the engine's deterministic action ids make a re-scored tick idempotent).

Scale-out is Kafka's: workers in one consumer group split the partitions. Window state
is per node and lives in the worker that owns the node's partition, so a node that
arrives at a worker with no history is *cold* for ``warmup_s`` of telemetry time: the
message marks it (``cold``), its anomaly level is zeroed (a young window makes any GPU
look strange) and the policy lets its prediction alert but never act. Nodes of a
partition the worker no longer owns are not published (the new owner scores them), so a
revoked node never reads as "silent" here. See docs/scaling.md.

Silences (issue 13): the worker's pipeline freezes the baselines of silenced nodes' parts
(:mod:`pipeline.muted`). Given a ``silences`` source (the service passes its engine's silence
book and node view, :func:`muted_intervals`), the worker re-reads it every
``silence_refresh_s`` of its monotonic clock — one store read per refresh, never per tick.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, fields, replace
from typing import Callable, Iterable, Mapping

import numpy as np

from collector.wire import TOPIC_SCORES
from models.bundle import ModelBundle
from models.explainer import Explainer
from models.node_scores import NodeScores, aggregate, score_batches
from models.score_wire import encode_scores
from pipeline.batch import FeatureBatch
from pipeline.bus import Bus, BusMessage, TopicPartition
from pipeline.muted import MutedInterval
from pipeline.settings import PipelineSettings
from pipeline.stream import FeaturePipeline
from pipeline.worker import StreamTopics, StreamWorker
from remediation.adapters.base import NodeStatus
from remediation.config import PolicyConfig
from remediation.silences import Silence

log = logging.getLogger(__name__)

#: how long :meth:`ScoringWorker.run` waits after a failed poll before the next, s (doubling up to 30)
RETRY_INITIAL_S = 0.5
RETRY_MAX_S = 30.0
#: how often a worker re-reads the service's silences, s (monotonic): a new silence mutes the
#: baselines within this; 30 s is one store read per worker per half minute
SILENCE_REFRESH_S = 30.0


def muted_intervals(silences: Iterable[Silence], statuses: Mapping[str, NodeStatus]) -> list[MutedInterval]:
    """*silences* as the pipeline's muted intervals: node scope as listed, fleet scope as every
    node, a label selector as the nodes of *statuses* (the scheduler's last view) it covers. A
    deleted silence ends when it was deleted. Any silence mutes learning, whatever it mutes of
    the actions: the time is not the parts' normal either way."""
    out = []
    for s in silences:
        end = s.ends_at if s.deleted_at is None else min(s.ends_at, s.deleted_at)
        if end <= s.starts_at:
            continue
        if s.fleet:
            nodes = None
        elif s.nodes:
            nodes = tuple(s.nodes)
        else:
            nodes = tuple(n for n, st in statuses.items() if s.covers(n, st))
            if not nodes:
                continue
        out.append(MutedInterval(nodes, s.starts_at, end))
    return out


@dataclass
class ScoringCounters:
    """What a worker has done (for ``/metrics`` and the benches)."""

    ticks: int = 0
    samples: int = 0            # GPU samples ingested
    messages: int = 0           # bus messages polled
    deadlettered: int = 0
    published: int = 0          # gpu.scores messages
    errors: int = 0             # failed polls/ticks (logged, then the loop goes on)
    reread: int = 0             # messages read again after a rebalance/restart and skipped
    cold_nodes: int = 0         # nodes marked cold in the last tick
    baseline_restarts: int = 0  # parts whose baseline restarted (reset, reboot, GPU swap)
    gpu_swaps: int = 0          # new gpu_uuid at a known (node, index)
    unplanned_resets: int = 0   # parts reset outside a repair: baseline kept
    muted_node_ticks: int = 0   # node-ticks with frozen baselines (maintenance, silences)
    last_tick_ts: float | None = None
    watermark: float | None = None
    lag_s: float | None = None  # wall clock minus the watermark (telemetry time)


class _OwnershipBus:
    """The worker's bus, remembering which partition each node's telemetry came from.

    After a group rebalance or a broker restart the consumer resumes from the committed
    offsets, which lag behind what this worker has already ingested (the open ticks):
    messages it has read before are skipped here, so no sample enters a window twice.
    """

    def __init__(self, bus: Bus, telemetry_topic: str) -> None:
        self.inner = bus
        self.telemetry_topic = telemetry_topic
        self.partition_of: dict[str, TopicPartition] = {}
        self.next_offset: dict[TopicPartition, int] = {}
        self.skipped = 0

    def poll(self, max_records: int, timeout_s: float) -> list[BusMessage]:
        msgs = self.inner.poll(max_records, timeout_s)
        part, seen = self.partition_of, self.next_offset
        fresh = []
        for m in msgs:
            tp = (m.topic, m.partition)
            if m.offset < seen.get(tp, -1):
                self.skipped += 1
                continue
            seen[tp] = m.offset + 1
            fresh.append(m)
            if m.key is not None and m.topic == self.telemetry_topic:
                part[m.key] = tp
        return fresh

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        self.inner.commit(offsets)

    def produce(self, topic: str, key: str | None, value: bytes) -> None:
        self.inner.produce(topic, key, value)

    def flush(self, timeout_s: float = 30.0) -> None:
        self.inner.flush(timeout_s)

    def backlog(self) -> dict[TopicPartition, int | None]:
        return self.inner.backlog()

    def close(self) -> None:
        self.inner.close()


class ScoringWorker:
    """One member of the scoring consumer group (see the module docstring).

    ``warmup_s`` (telemetry time, s; default the pipeline's long window, the time a window
    takes to fill) is how long a node stays cold after it arrives at this worker.
    ``silences`` (optional) returns the service's silences as muted intervals; it is called
    every ``silence_refresh_s`` of ``monotonic`` time (see the module docstring).
    """

    def __init__(self, bus: Bus, bundle: ModelBundle, pipeline_settings: PipelineSettings,
                 policy_cfg: PolicyConfig, *, worker_id: str, scores_topic: str = TOPIC_SCORES,
                 clock: Callable[[], float] = time.time, topics: StreamTopics = StreamTopics(),
                 warmup_s: float | None = None,
                 silences: Callable[[], Iterable[MutedInterval]] | None = None,
                 silence_refresh_s: float = SILENCE_REFRESH_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if not worker_id:
            raise ValueError("worker_id must name this worker (it keys its gpu.scores messages)")
        self.worker_id = worker_id
        #: (bundle, its explainer, its rule names): swapped as one by :meth:`use_bundle`
        self._model = (bundle, Explainer(bundle), [r.name for r in bundle.rules.rules])
        self.policy_cfg = policy_cfg
        self.scores_topic = scores_topic
        self.clock = clock
        self.warmup_s = pipeline_settings.long_window_s if warmup_s is None else float(warmup_s)
        self.bus = _OwnershipBus(bus, topics.telemetry)
        self.pipeline = FeaturePipeline(pipeline_settings)
        self.stream = StreamWorker(self.bus, self.pipeline, self._on_tick, topics)
        self.counters = ScoringCounters()
        #: telemetry time of the first tick this worker scored each node in (its window's start here)
        self.first_seen: dict[str, float] = {}
        #: per tick: the nodes published and which of them were cold (tests, the blind-period measurement)
        self.on_published: Callable[[NodeScores, bytes], None] | None = None
        self.silences = silences
        self.silence_refresh_s = float(silence_refresh_s)
        self._mono = monotonic
        self._silences_read_at: float | None = None

    # ---- the loop ------------------------------------------------------------------------

    def run_once(self) -> list[FeatureBatch]:
        """One poll: decode, ingest, close due ticks, score and publish them, commit."""
        self.refresh_silences()
        batches = self.stream.run_once()
        self._count()
        return batches

    def run(self, stop: threading.Event) -> None:
        """Poll until *stop* is set; a failing poll is logged and retried with a growing pause.

        Open ticks are not scored on the way out: their offsets stay uncommitted, so the
        partition's next owner reads them again and nothing is lost or scored half-full.
        """
        delay = RETRY_INITIAL_S
        try:
            while not stop.is_set():
                try:
                    self.run_once()
                    delay = RETRY_INITIAL_S
                except Exception as e:  # noqa: BLE001 - a long-running loop classifies, logs and goes on
                    self.counters.errors += 1
                    log.warning("scoring worker %s: poll failed (%s: %s); retrying in %.1f s",
                                self.worker_id, type(e).__name__, e, delay, exc_info=log.isEnabledFor(logging.DEBUG))
                    stop.wait(delay)
                    delay = min(delay * 2, RETRY_MAX_S)
        finally:
            self.close()

    def refresh_silences(self, force: bool = False) -> None:
        """Hand the current silences to the pipeline when ``silence_refresh_s`` has passed (or *force*).

        A failing read (the store down) is logged and the last set kept: the pipeline goes on
        with what it knew, and the next refresh tries again.
        """
        if self.silences is None:
            return
        now = self._mono()
        if not force and self._silences_read_at is not None and now - self._silences_read_at < self.silence_refresh_s:
            return
        self._silences_read_at = now
        try:
            self.pipeline.set_silenced(self.silences())
        except Exception as e:  # noqa: BLE001 - a long-running loop classifies, logs and goes on
            log.warning("scoring worker %s: silences not refreshed (%s: %s); keeping the last set",
                        self.worker_id, type(e).__name__, e)

    def drain(self) -> list[FeatureBatch]:
        """Score every open tick and commit all (the end of a finite stream; tests, benches)."""
        out = self.stream.drain()
        self._count()
        return out

    def close(self) -> None:
        """Leave the consumer group (uncommitted offsets go to the partition's next owner)."""
        try:
            self.bus.close()
        except Exception as e:  # noqa: BLE001 - closing twice or on a dead broker is not an error here
            log.info("scoring worker %s: close: %s", self.worker_id, e)

    def use_bundle(self, bundle: ModelBundle) -> None:
        """Score with *bundle* from the next tick on (a model activated at run time).

        The bundle, its explainer and its rule names change together in one assignment, so a
        tick in progress finishes with the model it started with.
        """
        if list(bundle.feature_names) != list(self.bundle.feature_names):
            raise ValueError("the new model reads other features than this pipeline computes: "
                             "it needs a restart with matching pipeline settings")
        self._model = (bundle, Explainer(bundle), [r.name for r in bundle.rules.rules])

    @property
    def bundle(self) -> ModelBundle:
        return self._model[0]

    # ---- one tick ------------------------------------------------------------------------

    def _on_tick(self, batch: FeatureBatch) -> None:
        bundle, explainer, rule_names = self._model
        try:
            ns = self.score(batch, bundle)
        except Exception:  # noqa: BLE001 - a tick that cannot be scored is logged; the next one is
            self.counters.errors += 1
            log.exception("scoring worker %s: tick %s could not be scored; skipped", self.worker_id, batch.ts)
            return
        if len(ns) == 0:
            return
        reasons = explainer.reasons(batch, ns, self._worth_a_reason(ns))
        raw = encode_scores(ns, reasons, worker=self.worker_id, rule_names=rule_names,
                            extra={"published_at": self.clock(), "samples": int(len(batch))})
        self.bus.produce(self.scores_topic, self.worker_id, raw)
        self.counters.published += 1
        self.counters.ticks += 1
        self.counters.last_tick_ts = batch.ts
        if self.on_published is not None:
            self.on_published(ns, raw)

    def score(self, batch: FeatureBatch, bundle: ModelBundle | None = None) -> NodeScores:
        """The tick's node scores, restricted to the nodes this worker owns, with ``cold`` marked."""
        bundle = bundle or self.bundle
        ns = aggregate(batch, score_batches(bundle, [batch])[0], bundle.rules)
        owned = self._owned(ns.node)
        if not owned.all():
            ns = take(ns, np.flatnonzero(owned))
        names = [str(n) for n in ns.node]
        present = set(names)
        for gone in [n for n in self.first_seen if n not in present]:
            del self.first_seen[gone]  # its window here is gone or stale: it starts over if it comes back
        first = np.array([self.first_seen.setdefault(n, batch.ts) for n in names], float)
        cold = (batch.ts - first) < self.warmup_s
        anomaly = np.where(cold, 0.0, ns.anomaly)  # a young window makes any GPU look strange
        self.counters.cold_nodes = int(cold.sum())
        return replace(ns, cold=cold, anomaly=anomaly)

    def _owned(self, nodes: np.ndarray) -> np.ndarray:
        assigned = set(self.bus.backlog())
        part = self.bus.partition_of
        return np.array([part.get(str(n)) in assigned if str(n) in part else True for n in nodes], bool)

    def _worth_a_reason(self, ns: NodeScores) -> list[int]:
        c = self.policy_cfg
        return np.flatnonzero((ns.p_fail >= c.alert_threshold) | (ns.rule >= 0) | (ns.anomaly >= c.anomaly_alert)).tolist()

    def _count(self) -> None:
        c = self.counters
        c.messages = self.stream.messages
        c.deadlettered = self.stream.deadlettered
        pc = self.pipeline.counts
        c.samples = pc.gpu_rows
        c.baseline_restarts, c.gpu_swaps, c.muted_node_ticks = pc.baseline_restarts, pc.gpu_swaps, pc.muted_node_ticks
        c.unplanned_resets = pc.unplanned_resets
        c.reread = self.bus.skipped
        wm = self.stream.watermark()
        if np.isfinite(wm):
            c.watermark = wm
            c.lag_s = self.clock() - wm


def take(ns: NodeScores, idx: np.ndarray) -> NodeScores:
    """The rows *idx* of *ns* (every per-node array indexed; feature-row indexes kept as they are)."""
    out = {}
    for f in fields(ns):
        v = getattr(ns, f.name)
        out[f.name] = v[idx] if isinstance(v, np.ndarray) and len(v) == len(ns.node) else v
    return NodeScores(**out)
