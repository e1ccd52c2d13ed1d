"""The node agent: sample sources every interval, buffer, publish to a sink, report health.

One :class:`Agent` per GPU node. Each tick it asks every source for a sample (the BMC
sources only every ``bmc_interval_s``, a minute by default), builds
ONE telemetry message for the node (all its GPU and port rows, ``collector.wire``) plus
one message per event, and appends them to a bounded :class:`OutboundBuffer`. A
publisher thread drains the buffer into the sink in order; when the sink is down it
waits with exponential backoff (jittered, seeded) and the buffer absorbs the outage,
dropping (and counting) by its policy when full. On shutdown it publishes the backlog
for at most ``shutdown_flush_timeout_s``.

Batching (``publish_every_ticks`` N > 1): the GPU and port rows of N ticks, each with its
own ``ts``, go out as one telemetry message on every N-th tick (a scoring worker's cost is
per message); events are never held. The rows of a partial batch are published on
shutdown and by ``--once``. N x ``interval_s`` must stay below the scoring workers'
allowed lateness (checked by :class:`AgentSettings`).

Loops (:meth:`Agent.run`): the sampler runs in the caller's thread, each entry of
``Agent.loops`` in its own thread, all stopped by one ``threading.Event``. The command
consumer (GPU reset through ``gpu.commands``, ``collector/command_loop.py``) is one more
entry there when commands are enabled; it answers through :meth:`Agent.enqueue_event`
and reports into the health record through ``Agent.health_extras``.

Failures at run time are classified, logged and counted; the loop goes on (only
start-up fails fast: building sources and sink). A source failing is counted in
``health()["source_errors"]`` and the other sources still publish. Each source samples
in its own thread (``collector.source_guard``) and a tick waits for them at most
``source_wait_s``, so a source that hangs (NVML on a GPU off the bus) holds neither the
others nor shutdown; what it returns late goes out with a later tick. A message that
cannot be encoded (a value the wire format cannot carry) is dropped and counted in
``health()["tick_errors"]`` under ``encode_telemetry`` / ``encode_event``; the rest of
the tick is published. Anything else escaping a tick is a bug: logged with its
traceback, counted under ``tick``, and the next tick runs on time. Each log line comes
the first time, when the cause changes, then every 60th time. Time comes from an
injected :class:`Clock`; tests call :meth:`tick` and :meth:`publish_pending` directly
and need no threads.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from collector.agent_settings import AgentSettings
from collector.sd_notify import Notifier
from collector.sinks.base import OutboundMessage, Sink, SinkRejected, SinkUnavailable
from collector.sinks.buffer import OutboundBuffer
from collector.source_guard import GuardedSource, SourceStalled
from collector.sources.base import Source, SourceBatch, SourceError
from collector.wire import TelemetryMessage, encode_event, encode_telemetry_as, rows_to_columns

log = logging.getLogger(__name__)


class Clock(Protocol):
    """Wall time for timestamps, monotonic time for scheduling."""

    def time(self) -> float: ...

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


#: Largest exponent :class:`Backoff` raises 2 to: 2.0 ** 1023 is the largest finite power of
#: two, and any delay cap is reached long before it, so capping here changes no delay.
_MAX_BACKOFF_EXPONENT = 1023


class Backoff:
    """Exponential backoff with ±``jitter`` (fraction), seeded so tests are reproducible.

    The exponent is capped, so any number of failures in a row (days of broker outage)
    gives ``max_s``; it never overflows a float.
    """

    def __init__(self, initial_s: float, max_s: float, jitter: float = 0.2, seed: int | None = None) -> None:
        self.initial_s, self.max_s, self.jitter = initial_s, max_s, jitter
        self._rng = random.Random(seed)
        self.failures = 0

    def next_delay(self) -> float:
        """Delay before the next attempt after one more failure."""
        base = min(self.max_s, self.initial_s * 2.0 ** min(self.failures, _MAX_BACKOFF_EXPONENT))
        self.failures += 1
        return base * (1 + self.jitter * (2 * self._rng.random() - 1))

    def reset(self) -> None:
        self.failures = 0


class Agent:
    """Samples *sources* each ``settings.interval_s`` and publishes through *sink*."""

    def __init__(self, settings: AgentSettings, sources: Sequence[Source], sink: Sink,
                 clock: Clock | None = None, seed: int | None = None) -> None:
        self.settings = settings
        self.node = settings.node
        self.sources = list(sources)
        self.sink = sink
        self.clock = clock or SystemClock()
        self.buffer = OutboundBuffer(settings.buffer_max_messages, settings.buffer_max_bytes,
                                     settings.buffer_policy)
        self.backoff = Backoff(settings.backoff_initial_s, settings.backoff_max_s, seed=seed)
        self._retry_at = 0.0  # monotonic time before which the publisher does not try
        self._lock = threading.Lock()
        self._key = self.node.encode()
        self.ticks = 0
        self.published = 0
        self.rejected = 0
        self.last_publish_ok_ts: float | None = None
        self.last_publish_error: str | None = None
        self.source_errors: Counter[str] = Counter()
        self._last_source_error: dict[str, str] = {}
        #: Failures in a tick other than a source's, by stage (encode_telemetry, encode_event, tick).
        self.tick_errors: Counter[str] = Counter()
        self._last_tick_error: dict[str, str] = {}
        #: Rows of the ticks not yet published (``publish_every_ticks`` > 1), and how many ticks.
        self._held_gpu: list[dict] = []
        self._held_net: list[dict] = []
        self._held_ticks = 0
        #: Background loops run by :meth:`run` beside the sampler, each ``f(stop)``.
        self.loops: list[Callable[[threading.Event], None]] = [self._publish_loop]
        #: Extra sections of :meth:`health` by name, each a function returning JSON-able counters.
        self.health_extras: dict[str, Callable[[], dict]] = {}
        #: Each source with the thread that samples it (``collector.source_guard``).
        #: The BMC sources sample every ``bmc_interval_s``, not every tick.
        self._guards = [GuardedSource(s, self.clock.monotonic, settings.sample_every_s(s.name), settings.interval_s / 2,
                                      settings.source_stall_s) for s in self.sources]
        #: Seconds a tick waits for its sources: ``source_wait_s``, at most half an interval.
        self.wait_s = min(settings.source_wait_s, settings.interval_s / 2)

    # ------------------------------------------------------------------ sampling

    def tick(self, wait_s: float | None = None) -> int:
        """Sample every source that is due once (the BMC sources every ``bmc_interval_s``, the others every
        tick) and enqueue this tick's messages; return how many.

        Each source samples in its own thread (``collector.source_guard``); the tick waits for
        them at most *wait_s* (default: ``source_wait_s``, at most half an interval). A source
        still running then is left running, and what it returns goes out with a later tick.
        """
        now = self.clock.time()
        for g in self._guards:
            g.start(now)  # one still running from an earlier tick is not asked again
        deadline = time.monotonic() + (self.wait_s if wait_s is None else wait_s)
        batch = SourceBatch()
        for g in self._guards:
            stalled, ran_s, sampled_for = g.stall_reported, g.running_s(), g.sampled_for
            try:
                got = g.take(deadline - time.monotonic())
            except Exception as e:  # noqa: BLE001 - a broken source must not stop the others
                self._source_failed(g.name, e)
                continue
            if got is None:
                self._source_running(g)
                continue
            batch.extend(got)
            if stalled:
                log.warning("source %s returned after %.0f s; what it sampled for %.0f goes out with this tick",
                            g.name, ran_s, sampled_for)
            if g.name in self._last_source_error:
                log.info("source %s recovered", g.name)
                del self._last_source_error[g.name]
        self.ticks += 1
        msgs = self.encode(self._batched(batch, now), now)
        for m in msgs:
            self.buffer.put(m)
        self.write_health()
        return len(msgs)

    def _batched(self, batch: SourceBatch, now: float) -> SourceBatch:
        """This tick's rows to publish now: events always; GPU and port rows every N-th tick.

        With ``publish_every_ticks`` N > 1 the rows of N ticks are held (each with its own
        ``ts``) and come out together in the N-th tick's batch, so they travel as one message.
        """
        n = self.settings.publish_every_ticks
        if n == 1:
            return batch
        for rows in (batch.gpu, batch.net):
            for r in rows:
                r.setdefault("ts", now)  # rows of several ticks share one message: each keeps its time
        self._held_gpu.extend(batch.gpu)
        self._held_net.extend(batch.net)
        self._held_ticks += 1
        if self._held_ticks < n:
            return SourceBatch(events=batch.events)
        return self._take_held(batch.events)

    def _take_held(self, events: list | None = None) -> SourceBatch:
        out = SourceBatch(gpu=self._held_gpu, net=self._held_net, events=events or [])
        self._held_gpu, self._held_net, self._held_ticks = [], [], 0
        return out

    def flush_held(self) -> int:
        """Enqueue the rows held for a partial batch (shutdown); return the messages enqueued."""
        if not self._held_ticks:
            return 0
        msgs = self.encode(self._take_held(), self.clock.time())
        for m in msgs:
            self.buffer.put(m)
        return len(msgs)

    def encode(self, batch: SourceBatch, now: float) -> list[OutboundMessage]:
        """One telemetry message for the node's rows, then one message per event.

        A message that cannot be encoded is left out, logged and counted (module doc);
        the others are still returned.
        """
        out = []
        if batch.gpu or batch.net:
            try:
                msg = TelemetryMessage(node=self.node, ts=now, gpu=rows_to_columns(batch.gpu) if batch.gpu else {},
                                       net=rows_to_columns(batch.net) if batch.net else {})
                out.append(OutboundMessage(self.settings.telemetry_topic, self._key,
                                           encode_telemetry_as(msg, self.settings.wire_format)))
            except (TypeError, ValueError, AttributeError) as e:  # orjson's and pyarrow's errors are these
                self._tick_failed("encode_telemetry", e,
                                  f"{len(batch.gpu)} GPU and {len(batch.net)} port rows dropped")
        for ev in batch.events:
            try:
                out.append(OutboundMessage(self.settings.events_topic, self._key, encode_event(ev)))
            except (TypeError, ValueError, AttributeError) as e:
                self._tick_failed("encode_event", e, f"event dropped: {str(ev)[:300]}")
        return out

    def enqueue_event(self, event: Mapping[str, Any]) -> None:
        """Queue one event record for the events topic outside a tick (a command's result).

        It goes through the same buffer, order and backoff as the sampled events.
        """
        self.buffer.put(OutboundMessage(self.settings.events_topic, self._key, encode_event(event)))

    def _tick_failed(self, stage: str, e: BaseException, detail: str = "") -> None:
        """Count and log (first time, on change, every 60th) one failure of a tick's *stage*."""
        with self._lock:
            self.tick_errors[stage] += 1
            n = self.tick_errors[stage]
        text = f"{type(e).__name__}: {e}"
        if self._last_tick_error.get(stage) != text or n % 60 == 1:
            log.error("%s failed (%d so far): %s%s", stage, n, text, f"; {detail}" if detail else "",
                      exc_info=stage == "tick")  # encoding errors have a known cause; anything else is a bug
        self._last_tick_error[stage] = text

    def _source_running(self, g: GuardedSource) -> None:
        """*g*'s call missed its tick: report it stalled once it has run its ``stall_s`` (``source_stall_s``, or
        for a source sampled every ``bmc_interval_s``, until its next sample is due)."""
        if not g.stall_reported and g.running_s() >= g.stall_s:
            g.stall_reported = True
            self._source_failed(g.name, SourceStalled(
                f"{g.name}: sample() has not returned for {g.running_s():.0f} s; the other sources go on, "
                "and it is not asked again until it returns"))

    def _source_failed(self, name: str, e: Exception) -> None:
        self.source_errors[name] += 1
        text = f"{type(e).__name__}: {e}"
        n = self.source_errors[name]
        if self._last_source_error.get(name) != text or n % 60 == 1:
            # our own SourceErrors are expected states; anything else is a bug worth a traceback
            log.warning("source %s failed (%d so far): %s", name, n, text, exc_info=not isinstance(e, SourceError))
        self._last_source_error[name] = text

    # ------------------------------------------------------------------ publishing

    def publish_pending(self) -> bool:
        """One publish attempt of up to ``publish_batch_max`` messages, unless backing off.

        Returns True when the attempt delivered everything it took (or nothing was due).
        """
        if self.clock.monotonic() < self._retry_at:
            return False
        batch = self.buffer.peek(self.settings.publish_batch_max)
        if not batch:
            return True
        try:
            self.sink.publish(batch)
        except SinkRejected as e:
            self._delivered(batch, e.delivered)
            self.buffer.pop_through(batch[e.delivered].seq)
            with self._lock:
                self.rejected += 1
            log.error("dropped a message the sink will never accept: %s", e)
            return False
        except SinkUnavailable as e:
            self._delivered(batch, e.delivered)
            delay = e.retry_after_s or self.backoff.next_delay()
            self._retry_at = self.clock.monotonic() + delay
            with self._lock:
                self.last_publish_error = str(e)
            if self.backoff.failures == 1 or self.backoff.failures % 20 == 0:
                log.warning("publish failed (%d in a row), retrying in %.1f s; buffer %d msgs: %s",
                            self.backoff.failures, delay, len(self.buffer), e)
            return False
        self._delivered(batch, len(batch))
        if self.backoff.failures:
            log.info("publishing again after %d failed attempts", self.backoff.failures)
        self.backoff.reset()
        return True

    def _delivered(self, batch: list[OutboundMessage], n: int) -> None:
        if n <= 0:
            return
        self.buffer.pop_through(batch[n - 1].seq)
        with self._lock:
            self.published += n
            self.last_publish_ok_ts = self.clock.time()
            self.last_publish_error = None

    def flush(self, timeout_s: float) -> bool:
        """Publish until the buffer is empty or *timeout_s* passes; True if emptied."""
        deadline = self.clock.monotonic() + timeout_s
        while len(self.buffer) and self.clock.monotonic() < deadline:
            if not self.publish_pending():
                wait = min(self._retry_at, deadline) - self.clock.monotonic()
                if wait > 0:
                    self.clock.sleep(min(wait, 0.5))
        return not len(self.buffer)

    def _publish_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            wait = self._retry_at - self.clock.monotonic()
            if wait > 0:
                stop.wait(wait)
                continue
            if self.buffer.wait(timeout_s=1.0):
                try:
                    self.publish_pending()
                except Exception:  # noqa: BLE001 - classify, log and continue: never die silently
                    log.exception("publisher: unexpected error; backing off")
                    self._retry_at = self.clock.monotonic() + self.backoff.next_delay()

    # ------------------------------------------------------------------ running

    def run(self, stop: threading.Event, notifier: Notifier | None = None) -> None:
        """Sample every interval until *stop* is set, then flush (bounded) and close.

        Under systemd (``Type=notify``) it says ``READY=1`` once its loops run, ``WATCHDOG=1`` after
        every tick and ``STOPPING=1`` on the way out (``collector.sd_notify``).
        """
        sd = notifier or Notifier()
        interval = self.settings.interval_s
        if sd.watchdog_s is not None and sd.watchdog_s < 3 * interval:
            log.warning("systemd's WatchdogSec (%.0f s) is under 3 intervals (%.0f s): a slow tick could get a "
                        "healthy agent restarted; raise WatchdogSec", sd.watchdog_s, 3 * interval)
        threads = [threading.Thread(target=f, args=(stop,), name=f"gpuops-agent-{f.__name__.strip('_')}",
                                    daemon=True) for f in self.loops]
        for t in threads:
            t.start()
        sd.notify("READY=1")
        next_tick = self.clock.monotonic()
        try:
            while not stop.is_set():
                try:
                    self.tick()
                except Exception as e:  # noqa: BLE001 - classify, log and continue: one bad tick must not stop sampling
                    self._tick_failed("tick", e)
                    self.write_health()
                sd.notify("WATCHDOG=1")
                next_tick += interval
                late = self.clock.monotonic() - next_tick
                if late > 0:  # a tick took longer than an interval: skip, never burst
                    skipped = int(late // interval) + 1
                    log.warning("sampling %.1f s late; skipping %d tick(s)", late, skipped)
                    next_tick += skipped * interval
                stop.wait(max(0.0, next_tick - self.clock.monotonic()))
        finally:
            sd.notify("STOPPING=1")
            stop.set()
            self.buffer.wake()
            for t in threads:
                t.join(timeout=self.settings.kafka_request_timeout_s + self.settings.kafka_max_block_s + 5)
            self.shutdown()

    def run_once(self) -> bool:
        """``--once``: one tick, publish it (bounded by the shutdown timeout), close.

        The tick waits up to ``source_stall_s`` for its sources; one that has not returned by
        then is counted as failed (there is no later tick to carry its result).
        """
        self.tick(wait_s=self.settings.source_stall_s)
        for g in self._guards:
            if g.busy:
                self._source_failed(g.name, SourceStalled(
                    f"{g.name}: sample() did not return within {self.settings.source_stall_s:g} s"))
        self.flush_held()
        try:
            return self.flush(self.settings.shutdown_flush_timeout_s)
        finally:
            self.close()

    def shutdown(self) -> None:
        """Publish held rows and the backlog for at most ``shutdown_flush_timeout_s``, then close.

        A source that returned after the last tick has its batch published too.
        """
        late = SourceBatch()
        for g in self._guards:
            try:
                got = g.take(0.0)
            except Exception as e:  # noqa: BLE001 - stopping; count it like any failed sample
                self._source_failed(g.name, e)
                continue
            if got is not None:
                late.extend(got)
        if late:
            for m in self.encode(late, self.clock.time()):
                self.buffer.put(m)
        self.flush_held()
        self._retry_at = 0.0
        if not self.flush(self.settings.shutdown_flush_timeout_s):
            log.warning("shutdown: %d messages not published", len(self.buffer))
        self.close()

    def close(self) -> None:
        """Close sources and sink; write a last health record."""
        for g in self._guards:
            try:
                if not g.close():
                    log.warning("source %s: not closed, its call of %.0f s has not returned", g.name, g.running_s())
            except Exception:  # noqa: BLE001 - closing; nothing left to save
                log.debug("closing source %s failed", g.name, exc_info=True)
        self.sink.close()
        self.write_health()

    # ------------------------------------------------------------------ health

    def health(self) -> dict:
        """Last successful publish, buffer depth and dropped count, and the other counters."""
        with self._lock:
            return {
                "node": self.node, "ts": self.clock.time(), "ticks": self.ticks,
                "last_publish_ok_ts": self.last_publish_ok_ts, "last_publish_error": self.last_publish_error,
                "published_total": self.published, "buffer_depth": len(self.buffer),
                "buffer_bytes": self.buffer.bytes, "dropped_total": self.buffer.dropped,
                "rejected_total": self.rejected, "source_errors": dict(self.source_errors),
                "tick_errors": dict(self.tick_errors), "held_ticks": self._held_ticks,
                "sources_running_s": {g.name: round(g.running_s(), 1) for g in self._guards if g.busy},
            } | {name: extra() for name, extra in self.health_extras.items()}

    def write_health(self) -> None:
        """Rewrite the health file atomically (if configured); a failure is logged, not fatal."""
        path: Path | None = self.settings.health_file
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(self.health()))
            os.replace(tmp, path)
        except OSError as e:
            if not getattr(self, "_health_warned", False):
                log.warning("cannot write health file %s: %s", path, e)
                self._health_warned = True
