"""The sink contract: deliver encoded messages in order, or say how many got through.

``publish(messages)`` either delivers every message in order, or raises
:class:`SinkUnavailable` (transient: broker down, timeout — retry later with backoff)
or :class:`SinkRejected` (the message at ``delivered`` can never be accepted, e.g. too
large — drop it and go on), both carrying ``delivered``: how many leading messages did
get through, so the caller removes exactly those from its buffer and keeps order.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class OutboundMessage:
    """One encoded Kafka message: topic, key (node), value (wire-format JSON bytes)."""

    topic: str
    key: bytes
    value: bytes
    seq: int = 0  # position in the agent's buffer (assigned by the buffer)


class SinkError(Exception):
    """Base of every error a sink raises on purpose."""


class SinkConfigError(SinkError):
    """The sink cannot work as configured (bad bootstrap address, unknown sink name)."""


class SinkUnavailable(SinkError):
    """Transient: nothing (or only the first ``delivered`` messages) got through; retry later."""

    def __init__(self, message: str, delivered: int = 0, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.delivered = delivered
        self.retry_after_s = retry_after_s


class SinkRejected(SinkError):
    """Permanent for one message: the one at index ``delivered`` will never be accepted."""

    def __init__(self, message: str, delivered: int = 0) -> None:
        super().__init__(message)
        self.delivered = delivered


@runtime_checkable
class Sink(Protocol):
    """Delivers batches of :class:`OutboundMessage` in order (see the module docstring)."""

    name: str

    def publish(self, messages: Sequence[OutboundMessage]) -> None:
        """Deliver all *messages* in order, or raise with ``delivered`` set."""
        ...

    def close(self) -> None:
        """Release connections; safe to call twice."""
        ...


#: Sink name → "module:Class"; imported lazily (stdout never imports kafka-python).
SINKS: dict[str, str] = {
    "kafka": "collector.sinks.kafka:KafkaSink",
    "stdout": "collector.sinks.stdout:StdoutSink",
}


def sink_class(name: str) -> Any:
    """The class registered under *name*; :class:`SinkConfigError` lists the valid names."""
    try:
        target = SINKS[name]
    except KeyError:
        raise SinkConfigError(f"unknown sink {name!r}; valid sinks: {', '.join(sorted(SINKS))}") from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)
