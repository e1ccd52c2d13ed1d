"""The agent's command consumer: read ``gpu.commands``, hand this node's messages to the handler, commit.

One Kafka consumer group per node (``gpuops-agent-<node>``) subscribed to the whole
topic. Commands are keyed by node, so the loop drops every other node's message by its
key before even parsing it; commands are rare (a handful a day per cluster), so reading
the others' is cheap, and subscribing (rather than assigning the key's partition) keeps
working when the topic's partition count changes. A new group starts at the earliest
offset, so a command sent while the agent was restarting is still seen; an old one is
refused as ``expired``.

Offsets are committed after each polled batch is handled (at least once). An agent that
dies between a reset and the commit sees the command again on restart: it is carried
out again only while unexpired and only if the GPU is still idle (the replay memory is
in-process). A broker outage, a failed commit or anything unexpected is logged and the
loop goes on after a backoff; it never dies on one message (the handler never raises).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Protocol

from collector.agent import Agent, Backoff
from collector.agent_settings import AgentSettings
from collector.command_handler import CommandHandler, GpuOps
from collector.commands import CommandResult, load_key, result_event
from collector.gpu_reset import RESET_TIMEOUT_S, NvmlGpuOps

log = logging.getLogger(__name__)

#: Records per poll. Each may be a reset of up to RESET_TIMEOUT_S, so the poll interval the
#: group allows is sized from it: the broker must not think a busy agent has died.
MAX_POLL_RECORDS = 8
_MAX_POLL_INTERVAL_MS = int(MAX_POLL_RECORDS * (RESET_TIMEOUT_S + 10) * 1000)
#: the most a commit and a close wait on the broker (kafka-python's own default: for ever, while the
#: group's coordinator does not answer): the loop then logs, backs off and goes on
BROKER_WAIT_MS = 10_000


class CommandConsumer(Protocol):
    """The part of kafka-python's ``KafkaConsumer`` the loop uses."""

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, list[Any]]: ...

    def commit(self, timeout_ms: int | None = None) -> None: ...

    def close(self, timeout_ms: int | None = None) -> None: ...


def command_group(node: str) -> str:
    """The consumer group of *node*'s agent: one per node, so every agent reads the whole topic."""
    return f"gpuops-agent-{node}"


def kafka_consumer(settings: AgentSettings) -> CommandConsumer:
    """A kafka-python consumer of ``settings.command_topic`` in this node's group, auto-commit off."""
    from kafka import KafkaConsumer

    return KafkaConsumer(settings.command_topic, bootstrap_servers=settings.bootstrap.split(","),
                         group_id=command_group(settings.node), client_id=f"gpuops-agent-{settings.node}-commands",
                         enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=MAX_POLL_RECORDS,
                         max_poll_interval_ms=_MAX_POLL_INTERVAL_MS)


class CommandLoop:
    """Feeds this node's ``gpu.commands`` messages to a :class:`CommandHandler`; one of ``Agent.loops``."""

    def __init__(self, node: str, handler: CommandHandler, consumer_factory: Callable[[], CommandConsumer], *,
                 poll_timeout_s: float = 1.0, backoff: Backoff | None = None) -> None:
        self.node = node
        self._key = node.encode()
        self.handler = handler
        self._factory = consumer_factory
        self._consumer: CommandConsumer | None = None
        self.poll_timeout_s = poll_timeout_s
        self.backoff = backoff or Backoff(0.5, 30.0)
        self.handled = 0
        self.skipped_other_nodes = 0
        self.loop_errors = 0

    def poll_once(self) -> int:
        """Poll once, handle this node's messages in order, commit; return how many were handled.

        Raises what the consumer raises (connecting, polling); :meth:`consume_commands`
        classifies it. A failed commit is logged: the batch comes back and is refused as
        ``replayed``.
        """
        if self._consumer is None:
            self._consumer = self._factory()
        batches = self._consumer.poll(timeout_ms=int(self.poll_timeout_s * 1000), max_records=MAX_POLL_RECORDS)
        if not batches:
            return 0
        n = 0
        for records in batches.values():
            for record in records:
                if record.key != self._key:
                    self.skipped_other_nodes += 1
                    continue
                self.handler.handle(record.value)
                n += 1
        self.handled += n
        try:
            self._consumer.commit(timeout_ms=BROKER_WAIT_MS)
        except Exception as e:  # noqa: BLE001 - a rebalance or a broker blip: the batch is redelivered
            log.warning("commands: commit failed (%s); these commands may be delivered again", e)
        return n

    def consume_commands(self, stop: threading.Event) -> None:
        """Run :meth:`poll_once` until *stop* is set; classify, log and continue on any failure."""
        try:
            while not stop.is_set():
                try:
                    self.poll_once()
                except Exception as e:  # noqa: BLE001 - the loop must outlive any broker trouble
                    self.loop_errors += 1
                    delay = self.backoff.next_delay()
                    if self.backoff.failures == 1 or self.backoff.failures % 20 == 0:
                        log.warning("commands: consumer failed (%d in a row), retrying in %.1f s: %r",
                                    self.backoff.failures, delay, e)
                    self._drop_consumer()
                    stop.wait(delay)
                else:
                    self.backoff.reset()
        finally:
            self.close()

    def stats(self) -> dict[str, Any]:
        """Counters for the agent's health record."""
        return {"handled": self.handled, "skipped_other_nodes": self.skipped_other_nodes,
                "loop_errors": self.loop_errors, **self.handler.stats()}

    def _drop_consumer(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close(timeout_ms=BROKER_WAIT_MS)
            except Exception:  # noqa: BLE001 - already failing; a fresh consumer comes next
                log.debug("commands: closing a failed consumer raised", exc_info=True)
            self._consumer = None

    def close(self) -> None:
        """Leave the group; safe to call twice."""
        self._drop_consumer()


def attach_commands(agent: Agent, gpu_ops: GpuOps | None = None, *, nvml: Any = None,
                    consumer_factory: Callable[[], CommandConsumer] | None = None) -> CommandLoop:
    """Add the command consumer to *agent* (settings: ``command_*``); start-up errors raise.

    Reads the key file first (:func:`~collector.commands.load_key`, :class:`CommandKeyError`
    when unusable), then, without *gpu_ops*, opens NVML (*nvml*: the module, default
    pynvml; :class:`~collector.gpu_reset.GpuOpsError` without a driver). Results go out
    through the agent's buffer on its events topic; the loop's counters appear under
    ``health()["commands"]``.
    """
    settings = agent.settings
    if settings.command_key_file is None:
        raise ValueError("commands need command_key_file (GPUOPS_AGENT_COMMAND_KEY_FILE)")
    key = load_key(settings.command_key_file)
    if gpu_ops is None:
        gpu_ops = NvmlGpuOps(nvml)

    def publish(result: CommandResult) -> None:
        agent.enqueue_event(result_event(result))

    handler = CommandHandler(agent.node, key, gpu_ops, agent.clock, publish, max_skew_s=settings.command_max_skew_s)
    loop = CommandLoop(agent.node, handler, consumer_factory or (lambda: kafka_consumer(settings)),
                       backoff=Backoff(settings.backoff_initial_s, settings.backoff_max_s))
    agent.loops.append(loop.consume_commands)
    agent.health_extras["commands"] = loop.stats
    return loop
