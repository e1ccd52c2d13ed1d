"""GPU resets through the node agent: the engine's side of ``gpu.commands`` and its answers.

A reset is not a scheduler request: the engine publishes a signed, expiring command
(``collector/commands.py`` owns the format) on ``gpu.commands`` keyed by node, and the
node's agent — if commands are enabled there and it holds the same key — checks the GPU
is idle, resets it and answers with a ``command_result`` event on ``gpu.events``.
:func:`parse_result` picks those answers out of the events the engine already reads,
so the result lands on the action whose id the command carried.

The engine never talks to Kafka itself (import-linter): :class:`CommandSender` produces
through the pipeline's :class:`~pipeline.bus.Bus` (``KafkaBus`` in production,
``InProcessBus`` in dry runs), or through anything with kafka-python's producer
``send(topic, key=, value=)`` / ``flush(timeout=)``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from collector.commands import (MAX_LIFETIME_S, MAX_REASON_CHARS, TOPIC_COMMANDS, Command, CommandResult, Verb,
                                check_key, new_nonce, result_from_event, sign)
from remediation.adapters.base import PermanentAdapterError, TransientAdapterError, validate_node_name

#: Seconds a reset command stays valid. An agent restart or a broker leader election
#: (seconds) fits well inside; a command older than this was decided on stale telemetry
#: and is refused by the agent as ``expired``.
DEFAULT_TTL_S = 300.0


class CommandSender:
    """Signs and publishes agent commands keyed by node; one per engine, holding the shared key."""

    def __init__(self, producer_or_bus: Any, key: bytes, topic: str = TOPIC_COMMANDS, ttl_s: float = DEFAULT_TTL_S,
                 *, flush_timeout_s: float = 10.0, nonce: Callable[[], str] = new_nonce) -> None:
        if not 0 < ttl_s <= MAX_LIFETIME_S:
            raise ValueError(f"ttl_s must be in (0, {MAX_LIFETIME_S:g}] s, got {ttl_s!r}")
        if not (hasattr(producer_or_bus, "produce") or hasattr(producer_or_bus, "send")):
            raise TypeError("producer_or_bus must be a pipeline Bus (produce/flush) or a Kafka producer (send/flush)")
        self._out = producer_or_bus
        self._key = check_key(key)
        self.topic, self.ttl_s, self.flush_timeout_s = topic, ttl_s, flush_timeout_s
        self._nonce = nonce

    def send_reset(self, action_id: str, node: str, gpu: int, reason: str, now: float) -> Command:
        """Publish a signed ``gpu_reset`` of *gpu* on *node*, valid from *now* for ``ttl_s``; the command.

        *now* is the engine's wall time (s since the epoch). Raises
        :class:`PermanentAdapterError` for a bad node, GPU or time and
        :class:`TransientAdapterError` when the message could not be delivered (retry:
        the same action id is refused by the agent only once it was accepted).
        """
        validate_node_name(node)
        if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0:
            raise PermanentAdapterError(f"GPU index must be a non-negative int, got {gpu!r}")
        if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
            raise PermanentAdapterError(f"now must be a finite time in s since the epoch, got {now!r}")
        command = Command(id=action_id, verb=Verb.GPU_RESET.value, node=node, gpu=gpu, issued_at=float(now),
                          expires_at=float(now) + self.ttl_s, nonce=self._nonce(),
                          reason=reason if len(reason) <= MAX_REASON_CHARS else reason[: MAX_REASON_CHARS - 1] + "…")
        self._publish(node, sign(command, self._key))
        return command

    def _publish(self, node: str, value: bytes) -> None:
        try:
            if hasattr(self._out, "produce"):
                self._out.produce(self.topic, node, value)
            else:
                self._out.send(self.topic, key=node.encode(), value=value)
            self._out.flush(self.flush_timeout_s)  # Bus.flush(timeout_s) and KafkaProducer.flush(timeout)
        except Exception as e:  # noqa: BLE001 - any delivery failure is worth a retry by the engine
            raise TransientAdapterError(f"command for {node} not delivered to {self.topic}: {e!r}") from e


def parse_result(event: Mapping[str, Any] | bytes) -> CommandResult | None:
    """The agent's answer to a command in one ``gpu.events`` record (or raw message), else ``None``."""
    return result_from_event(event)
