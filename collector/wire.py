"""Kafka wire format of the telemetry contract (versioned, owned by the collector).

Topics (shared/DESIGN.md): ``gpu.telemetry`` carries one message per node per tick
holding that node's GPU and port samples; ``gpu.events`` one message per event;
``gpu.deadletter`` what a consumer could not use, with the reason. Every message is
keyed by node name, so one node's data stays in order on one partition.

A telemetry message is JSON, column-oriented so a consumer turns it into numpy
arrays without a dict per sample::

    {"schema": "gpuops.telemetry", "v": 1, "node": "gpu-node-001", "ts": 1767225600.0,
     "gpu": {"ts": [...], "gpu": [0, 1, ...], "util_gpu": [...], ...},
     "net": {"ts": [...], "device": ["mlx5_0"], "port": [1], ...}}

Columns inside ``gpu``/``net`` are those of spec/telemetry.md (the ``node`` column is
implied by the message); unknown extra columns are allowed and passed through.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import orjson

from collector.schema import NODE_NAME_RE, SCHEMA_VERSION, SUPPORTED_VERSIONS

TOPIC_TELEMETRY = "gpu.telemetry"
TOPIC_EVENTS = "gpu.events"
TOPIC_SCORES = "gpu.scores"
TOPIC_DEADLETTER = "gpu.deadletter"

SCHEMA_TELEMETRY = "gpuops.telemetry"
SCHEMA_EVENT = "gpuops.event"
SCHEMA_DEADLETTER = "gpuops.deadletter"


class WireError(ValueError):
    """A message that cannot be decoded; ``str(err)`` is the dead-letter reason."""


@dataclass
class TelemetryMessage:
    """One node's samples for one tick, column-oriented."""

    node: str
    ts: float
    gpu: dict[str, list[Any]] = field(default_factory=dict)
    net: dict[str, list[Any]] = field(default_factory=dict)
    v: int = SCHEMA_VERSION

    @property
    def n_gpu(self) -> int:
        return len(self.gpu.get("gpu", ()))

    @property
    def n_net(self) -> int:
        return len(self.net.get("port", ()))


def rows_to_columns(rows: Sequence[Mapping[str, Any]], drop: Sequence[str] = ("node", "type")) -> dict[str, list[Any]]:
    """Turn sample dicts into the column dict of a message (keys in first-seen order)."""
    keys: dict[str, None] = {}
    for r in rows:
        keys.update(dict.fromkeys(r))
    for d in drop:
        keys.pop(d, None)
    return {k: [r.get(k) for r in rows] for k in keys}


def columns_to_rows(cols: Mapping[str, Sequence[Any]], node: str | None = None) -> list[dict[str, Any]]:
    """Inverse of :func:`rows_to_columns`; adds ``node`` to each row when given."""
    names = list(cols)
    n = len(cols[names[0]]) if names else 0
    rows = []
    for i in range(n):
        r = {k: cols[k][i] for k in names}
        if node is not None:
            r["node"] = node
        rows.append(r)
    return rows


def _clean(v: Any) -> Any:
    # JSON has no NaN: a field the device does not support travels as null.
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def encode_telemetry(msg: TelemetryMessage) -> bytes:
    """Serialise a :class:`TelemetryMessage` (NaN → null)."""
    body = {
        "schema": SCHEMA_TELEMETRY,
        "v": msg.v,
        "node": msg.node,
        "ts": msg.ts,
        "gpu": {k: [_clean(x) for x in col] for k, col in msg.gpu.items()},
        "net": {k: [_clean(x) for x in col] for k, col in msg.net.items()},
    }
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def decode_telemetry(raw: bytes | str) -> TelemetryMessage:
    """Parse and check the envelope of a telemetry message; raise :class:`WireError`.

    Only the envelope is checked here (JSON, schema tag, version, node, ts, column
    shapes); per-sample validation is the pipeline's job, so one bad sample does not
    cost the rest of the message.
    """
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise WireError(f"not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise WireError(f"message is a JSON {type(body).__name__}, not an object")
    if body.get("schema") != SCHEMA_TELEMETRY:
        raise WireError(f"schema is {body.get('schema')!r}, expected {SCHEMA_TELEMETRY!r}")
    v = body.get("v")
    if v not in SUPPORTED_VERSIONS:
        raise WireError(f"unsupported schema version {v!r} (supported: {sorted(SUPPORTED_VERSIONS)})")
    node = body.get("node")
    if not isinstance(node, str) or not NODE_NAME_RE.match(node):
        raise WireError(f"malformed node name {node!r}")
    ts = body.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        raise WireError(f"non-finite or missing timestamp {ts!r}")
    gpu = body.get("gpu") or {}
    net = body.get("net") or {}
    for name, cols in (("gpu", gpu), ("net", net)):
        if not isinstance(cols, dict):
            raise WireError(f"'{name}' must be an object of columns")
        lengths = {len(c) if isinstance(c, list) else -1 for c in cols.values()}
        if -1 in lengths:
            raise WireError(f"'{name}' columns must be arrays")
        if len(lengths) > 1:
            raise WireError(f"'{name}' columns have different lengths {sorted(lengths)}")
    return TelemetryMessage(node=node, ts=float(ts), gpu=gpu, net=net, v=v)


def encode_event(event: Mapping[str, Any]) -> bytes:
    """Serialise one event record (§3) for ``gpu.events``."""
    body = {"schema": SCHEMA_EVENT, "v": SCHEMA_VERSION}
    body.update({k: _clean(v) for k, v in event.items() if k != "type"})
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def decode_event(raw: bytes | str) -> dict[str, Any]:
    """Parse an event message into a record dict; raise :class:`WireError`."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise WireError(f"not valid JSON: {e}") from None
    if not isinstance(body, dict) or body.get("schema") != SCHEMA_EVENT:
        raise WireError(f"not a {SCHEMA_EVENT} message")
    if body.get("v") not in SUPPORTED_VERSIONS:
        raise WireError(f"unsupported schema version {body.get('v')!r}")
    body.pop("schema")
    body.pop("v")
    return body


def encode_deadletter(reason: str, payload: bytes | str | Any, *, topic: str = "",
                      partition: int | None = None, offset: int | None = None) -> bytes:
    """A dead-letter message: the reason, where it came from, and the payload unchanged."""
    if isinstance(payload, bytes):
        payload = payload.decode("utf-8", errors="replace")
    elif not isinstance(payload, str):
        payload = orjson.dumps(payload, default=str, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    return orjson.dumps({"schema": SCHEMA_DEADLETTER, "v": SCHEMA_VERSION, "reason": reason,
                         "topic": topic, "partition": partition, "offset": offset, "payload": payload})
