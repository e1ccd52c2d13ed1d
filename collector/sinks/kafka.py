"""Kafka sink: kafka-python producer, lz4, ``acks=all``, keyed by node, in order.

The producer retries only what Kafka itself calls retriable (a leader election, a topic
being auto-created) a few times, with one request in flight so a retry never reorders,
and every send resolves — acknowledged or failed — within ``delivery_timeout_ms``.
Longer outages are the agent's business: ``publish`` sends a batch, flushes, counts
the leading messages that were acknowledged, and on the first failure drops the
producer (a fresh one, with fresh connections and metadata, is made on the next
attempt after the agent's backoff) and raises
:class:`~collector.sinks.base.SinkUnavailable` with that count. The agent's buffer
keeps the rest, in order. Delivery is at least once: a message is duplicated only when
the broker stored it but its acknowledgement was lost.

A message the broker will never take (larger than ``max_request_size``) raises
:class:`~collector.sinks.base.SinkRejected`, so one bad message cannot block the rest.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from collector.sinks.base import OutboundMessage, SinkConfigError, SinkRejected, SinkUnavailable

log = logging.getLogger(__name__)


class KafkaSink:
    """Publishes to a Kafka cluster (``bootstrap`` ``host:port[,host:port…]``)."""

    name = "kafka"

    def __init__(self, bootstrap: str, client_id: str = "gpuops-agent", request_timeout_s: float = 10.0,
                 max_block_s: float = 5.0, linger_ms: int = 20, max_request_bytes: int = 1 << 20) -> None:
        if not bootstrap or any(":" not in b for b in bootstrap.split(",")):
            raise SinkConfigError(f"kafka sink: bootstrap {bootstrap!r} must be host:port[,host:port…]")
        self.bootstrap = bootstrap
        self.config: dict[str, Any] = dict(
            bootstrap_servers=bootstrap.split(","),
            client_id=client_id,
            acks="all",
            compression_type="lz4",
            retries=5,  # retriable errors only (NotLeader, NotEnoughReplicas); the agent owns outages
            retry_backoff_ms=200,
            max_in_flight_requests_per_connection=1,  # a retry never overtakes a later batch
            linger_ms=linger_ms,
            request_timeout_ms=int(request_timeout_s * 1000),
            delivery_timeout_ms=int(request_timeout_s * 1000) + linger_ms + 2000,
            max_block_ms=int(max_block_s * 1000),
            max_request_size=max_request_bytes,
            reconnect_backoff_ms=200,
            reconnect_backoff_max_ms=5000,
        )
        # every future resolves within delivery_timeout_ms; wait a little longer than that
        self.flush_timeout_s = self.config["delivery_timeout_ms"] / 1000 + max_block_s + 2.0
        self._producer: Any = None

    @classmethod
    def from_settings(cls, settings: Any) -> "KafkaSink":
        """Build from ``AgentSettings``."""
        return cls(settings.bootstrap, client_id=f"gpuops-agent-{settings.node}",
                   request_timeout_s=settings.kafka_request_timeout_s, max_block_s=settings.kafka_max_block_s)

    def _connect(self) -> Any:
        from kafka import KafkaProducer
        from kafka.errors import KafkaError

        try:
            self._producer = KafkaProducer(**self.config)
        except KafkaError as e:  # NoBrokersAvailable and friends: the broker may come back
            raise SinkUnavailable(f"kafka: cannot connect to {self.bootstrap}: {e!r}") from e
        return self._producer

    def publish(self, messages: Sequence[OutboundMessage]) -> None:
        """Send *messages* in order; raise with ``delivered`` = acknowledged prefix length."""
        from kafka.errors import KafkaError, MessageSizeTooLargeError

        if not messages:
            return
        producer = self._producer or self._connect()
        futures = []
        send_error: Exception | None = None
        for m in messages:
            try:
                futures.append(producer.send(m.topic, key=m.key, value=m.value))
            except MessageSizeTooLargeError as e:
                send_error = e
                break
            except KafkaError as e:  # metadata not available within max_block_ms: broker down
                send_error = e
                break
        try:
            producer.flush(timeout=self.flush_timeout_s)
        except KafkaError as e:
            send_error = send_error or e
        delivered = 0
        failure: Exception | None = None
        for f in futures:
            if f.is_done and f.succeeded():
                delivered += 1
                continue
            failure = f.exception if f.is_done else TimeoutError("not acknowledged before flush timeout")
            break
        if failure is None and send_error is None:
            return
        error = failure or send_error
        if isinstance(error, MessageSizeTooLargeError):
            raise SinkRejected(f"kafka: message too large for the broker: {error!r}", delivered=delivered)
        self._drop_producer()
        raise SinkUnavailable(f"kafka: {len(messages) - delivered} of {len(messages)} not delivered: {error!r}",
                              delivered=delivered)

    def _drop_producer(self) -> None:
        if self._producer is not None:
            try:
                self._producer.close(timeout=0)
            except Exception:  # noqa: BLE001 - already failing; a fresh producer comes next
                log.debug("kafka: closing a failed producer raised", exc_info=True)
            self._producer = None

    def close(self, timeout_s: float = 5.0) -> None:
        """Flush what the producer holds (bounded) and close it."""
        if self._producer is not None:
            try:
                self._producer.close(timeout=timeout_s)
            except Exception:  # noqa: BLE001 - shutting down
                log.warning("kafka: close failed", exc_info=True)
            self._producer = None
