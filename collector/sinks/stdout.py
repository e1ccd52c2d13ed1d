"""Stdout sink: one JSON object per record (``type`` = ``gpu`` | ``net`` | ``event``).

For debugging and for other tools (``gpuops agent --once --sink stdout | jq``). It
decodes the same wire messages the Kafka sink sends, so what it prints is exactly what
would have been published, one flat record per line with ``node`` included.
"""

from __future__ import annotations

import sys
from typing import IO, Any, Sequence

import orjson

from collector.sinks.base import OutboundMessage, SinkUnavailable
from collector.wire import SCHEMA_EVENT, SCHEMA_TELEMETRY, columns_to_rows, decode_event, decode_telemetry


def message_records(msg: OutboundMessage) -> list[dict[str, Any]]:
    """Flat records of one wire message, each with ``type`` first and ``node`` included."""
    schema = orjson.loads(msg.value).get("schema")
    if schema == SCHEMA_TELEMETRY:
        t = decode_telemetry(msg.value)
        out = [{"type": "gpu", **r} for r in columns_to_rows(t.gpu, node=t.node)] if t.gpu else []
        out += [{"type": "net", **r} for r in columns_to_rows(t.net, node=t.node)] if t.net else []
        return out
    if schema == SCHEMA_EVENT:
        return [{"type": "event", **decode_event(msg.value)}]
    return [{"type": "unknown", "topic": msg.topic, "value": msg.value.decode("utf-8", "replace")}]


class StdoutSink:
    """Writes every record as one JSON line to *stream* (default ``sys.stdout``)."""

    name = "stdout"

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout

    @classmethod
    def from_settings(cls, settings: Any) -> "StdoutSink":
        """Build from ``AgentSettings`` (nothing to configure)."""
        return cls()

    def publish(self, messages: Sequence[OutboundMessage]) -> None:
        """Print each message's records; a closed pipe is a transient failure."""
        for i, msg in enumerate(messages):
            try:
                for rec in message_records(msg):
                    self.stream.write(orjson.dumps(rec).decode() + "\n")
                self.stream.flush()
            except (BrokenPipeError, ValueError) as e:
                raise SinkUnavailable(f"stdout: {e}", delivered=i) from e

    def close(self) -> None:
        """Flush the stream (it is not ours to close)."""
        try:
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            pass
