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

Wire formats (:data:`WIRE_FORMATS`): ``json`` above, readable and the agent's default, and
``arrow``, the same message whose ``gpu`` and ``net`` tables are Arrow IPC streams, which
a consumer decodes straight into numpy columns (many messages in one Arrow read: see
:mod:`pipeline.decode`). An Arrow message starts with :data:`ARROW_MAGIC` (a JSON one with
``{``), so the decoder picks the format by the first bytes::

    b"GPAR" | u8 version | u16 node length | f64 ts | u32 gpu length | u32 net length
           | node (UTF-8) | gpu IPC stream (may be empty) | net IPC stream (may be empty)

(little-endian). The version byte is the telemetry schema version (``"v"`` in JSON).
"""

from __future__ import annotations

import math
import struct
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

#: telemetry encodings a collector may send; every consumer reads both
WIRE_FORMATS = ("json", "arrow")
#: first bytes of an Arrow-encoded telemetry message
ARROW_MAGIC = b"GPAR"
_ARROW_HEADER = struct.Struct("<BHdII")
_ARROW_PREFIX = len(ARROW_MAGIC) + _ARROW_HEADER.size


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


def encode_telemetry_as(msg: TelemetryMessage, wire_format: str = "json") -> bytes:
    """Serialise *msg* in *wire_format* (one of :data:`WIRE_FORMATS`)."""
    if wire_format == "json":
        return encode_telemetry(msg)
    if wire_format == "arrow":
        return encode_telemetry_arrow(msg)
    raise ValueError(f"unknown wire format {wire_format!r} (valid: {', '.join(WIRE_FORMATS)})")


def _ipc_stream(cols: Mapping[str, Sequence[Any]]) -> bytes:
    import pyarrow as pa  # loaded only by those who send or read Arrow

    if not cols:
        return b""
    table = pa.table({k: pa.array(list(v) if not hasattr(v, "dtype") else v) for k, v in cols.items()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def encode_telemetry_arrow(msg: TelemetryMessage) -> bytes:
    """Serialise *msg* in the Arrow wire format (see the module docstring). NaN stays NaN."""
    node = msg.node.encode()
    gpu, net = _ipc_stream(msg.gpu), _ipc_stream(msg.net)
    return b"".join((ARROW_MAGIC, _ARROW_HEADER.pack(msg.v, len(node), msg.ts, len(gpu), len(net)), node, gpu, net))


def is_arrow(raw: bytes | str) -> bool:
    """Whether *raw* is an Arrow-encoded telemetry message (else JSON)."""
    return isinstance(raw, (bytes, bytearray, memoryview)) and bytes(raw[:4]) == ARROW_MAGIC


@dataclass(frozen=True)
class ArrowTelemetry:
    """The envelope of an Arrow telemetry message, its tables still as IPC stream bytes."""

    node: str
    ts: float
    v: int
    gpu: bytes
    net: bytes


def split_arrow(raw: bytes) -> ArrowTelemetry:
    """The checked envelope of an Arrow telemetry message; raise :class:`WireError`."""
    if len(raw) < _ARROW_PREFIX or raw[:4] != ARROW_MAGIC:
        raise WireError(f"not an Arrow telemetry message ({len(raw)} bytes, starts {bytes(raw[:4])!r})")
    v, n_node, ts, n_gpu, n_net = _ARROW_HEADER.unpack_from(raw, 4)
    if v not in SUPPORTED_VERSIONS:
        raise WireError(f"unsupported schema version {v!r} (supported: {sorted(SUPPORTED_VERSIONS)})")
    end = _ARROW_PREFIX + n_node + n_gpu + n_net
    if end != len(raw):
        raise WireError(f"Arrow message is {len(raw)} bytes, its header says {end}")
    at = _ARROW_PREFIX + n_node
    try:
        node = raw[_ARROW_PREFIX:at].decode()
    except UnicodeDecodeError:
        raise WireError("node name is not UTF-8") from None
    if not NODE_NAME_RE.match(node):
        raise WireError(f"malformed node name {node!r}")
    if not math.isfinite(ts):
        raise WireError(f"non-finite timestamp {ts!r}")
    return ArrowTelemetry(node, ts, v, raw[at:at + n_gpu], raw[at + n_gpu:end])


def _read_ipc(data: bytes, name: str) -> dict[str, list[Any]]:
    import pyarrow as pa

    if not data:
        return {}
    try:
        table = pa.ipc.open_stream(data).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise WireError(f"'{name}' is not a readable Arrow IPC stream: {e}") from None
    return table.to_pydict()


def decode_telemetry(raw: bytes | str) -> TelemetryMessage:
    """Parse and check the envelope of a telemetry message, JSON or Arrow; raise :class:`WireError`.

    Only the envelope is checked here (JSON, schema tag, version, node, ts, column
    shapes); per-sample validation is the pipeline's job, so one bad sample does not
    cost the rest of the message.
    """
    if is_arrow(raw):
        a = split_arrow(bytes(raw))
        return TelemetryMessage(node=a.node, ts=a.ts, gpu=_read_ipc(a.gpu, "gpu"), net=_read_ipc(a.net, "net"), v=a.v)
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
