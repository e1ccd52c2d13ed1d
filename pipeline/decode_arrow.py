"""Arrow telemetry messages → column batches, many messages in one Arrow read.

Each Arrow message (:func:`collector.wire.split_arrow`) holds two IPC streams, each a
schema followed by one record batch. Agents of one version send the same schema, so the
messages of a poll are grouped by their schema bytes and each group's record batches are
joined behind one copy of the schema and read with a single ``pyarrow`` call: no Python
object per sample, and numpy once per column per poll. A schema this path does not know
how to read as numbers (a string where a number belongs, a missing key column) is
reported back, and :class:`~pipeline.decode.MessageDecoder` reads those messages the
general way, sample by sample, so the contract and its dead-letter reasons stay one.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from collector.schema import RecordType, validate_record
from collector.wire import ArrowTelemetry
from pipeline.samples import GPU_VALUE_COLUMNS, NET_STATE_COUNTERS, GpuRows, NetRows, link_active_flags
from pipeline.registry import Keys

_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_NUMERIC = (pa.types.is_integer, pa.types.is_floating, pa.types.is_null)


def _split_stream(data: bytes) -> tuple[bytes, bytes] | None:
    """(schema message, the rest without the end-of-stream marker) of one IPC stream."""
    if len(data) < 8:
        return None
    cont, n = struct.unpack_from("<Ii", data, 0)
    if cont != 0xFFFFFFFF or n <= 0 or 8 + n > len(data):
        return None
    at = 8 + n
    body = data[at:-8] if data.endswith(_EOS) else data[at:]
    return data[:at], body


def _is_numeric(t: pa.DataType) -> bool:
    return any(f(t) for f in _NUMERIC)


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)


def _schema_ok(schema: pa.Schema, rtype: RecordType) -> bool:
    """Whether every sample of this schema can be read as columns (types are per column in Arrow)."""
    types = {f.name: f.type for f in schema}
    key = "gpu" if rtype is RecordType.GPU else "port"
    if key not in types or not pa.types.is_integer(types[key]):
        return False
    if "ts" in types and not (pa.types.is_floating(types["ts"]) or pa.types.is_integer(types["ts"])):
        return False
    names = GPU_VALUE_COLUMNS if rtype is RecordType.GPU else NET_STATE_COUNTERS
    if not all(_is_numeric(types[n]) for n in names if n in types):
        return False
    text = ("pci_bus_id",) if rtype is RecordType.GPU else ("device", "link_state")
    if rtype is RecordType.NET and "device" not in types:
        return False
    return all(_is_text(types[n]) for n in text if n in types)


def _floats(table: pa.Table, name: str, n: int) -> np.ndarray:
    if name not in table.column_names:
        return np.full(n, np.nan)
    col = table.column(name)
    if pa.types.is_null(col.type):
        return np.full(n, np.nan)
    return np.asarray(col.cast(pa.float64()).to_numpy(), np.float64)


def _categorical(table: pa.Table, name: str) -> pd.Categorical:
    """A text column as codes into its distinct values (-1: null), built in Arrow: no Python
    string per sample (a poll of 10-sample messages repeats each bus id and device many times)."""
    col = table.column(name)
    if pa.types.is_null(col.type) or col.null_count == len(col):
        return pd.Categorical.from_codes(np.full(len(col), -1, np.int64), categories=[])
    enc = pc.dictionary_encode(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    codes = pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return pd.Categorical.from_codes(codes, categories=enc.dictionary.to_pylist())


@dataclass
class _Group:
    """Messages sharing one schema: their record batches and which message each came from."""

    schema_msg: bytes
    bodies: list[bytes] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)   # index into ArrowDecoder.messages
    ts: list[float] = field(default_factory=list)     # each message's envelope ts (default for rows)


@dataclass
class ArrowDecoded:
    """Rows of the Arrow messages of one poll, rejects, and the newest sample time per message."""

    gpu: GpuRows
    net: NetRows
    newest: np.ndarray
    rejected: list[tuple[int, str, Any]] = field(default_factory=list)  # (message index, reason, row)


class ArrowDecoder:
    """Collects a poll's Arrow messages (:meth:`add`), then decodes them at once (:meth:`decode`)."""

    def __init__(self, keys: Keys, max_gpus: int) -> None:
        self.keys = keys
        self.max_gpus = max_gpus
        self._schemas: dict[bytes, pa.Schema | None] = {}  # schema bytes -> schema, None: not columnar

    def start(self) -> None:
        self.messages: list[ArrowTelemetry] = []
        self._groups: dict[tuple[RecordType, bytes], _Group] = {}

    def add(self, msg: ArrowTelemetry) -> bool:
        """Take *msg* into this poll's batch; False when it must be read the general way."""
        parts = []
        for rtype, data in ((RecordType.GPU, msg.gpu), (RecordType.NET, msg.net)):
            if not data:
                continue
            split = _split_stream(data)
            if split is None or not self._columnar(split[0], rtype):
                return False
            parts.append((rtype, split))
        k = len(self.messages)
        self.messages.append(msg)
        for rtype, (schema_msg, body) in parts:
            g = self._groups.get((rtype, schema_msg))
            if g is None:
                g = self._groups[(rtype, schema_msg)] = _Group(schema_msg)
            g.bodies.append(body)
            g.owners.append(k)
            g.ts.append(msg.ts)
        return True

    def _columnar(self, schema_msg: bytes, rtype: RecordType) -> bool:
        if schema_msg not in self._schemas:
            try:
                schema = pa.ipc.read_schema(pa.py_buffer(schema_msg))
            except (pa.ArrowInvalid, OSError):
                schema = None
            self._schemas[schema_msg] = schema if schema is not None and _schema_ok(schema, rtype) else None
        return self._schemas[schema_msg] is not None

    def decode(self) -> ArrowDecoded:
        out = ArrowDecoded(GpuRows.empty(), NetRows.empty(), np.full(len(self.messages), -math.inf))
        gpu_parts, net_parts = [], []
        for (rtype, _), g in self._groups.items():
            try:
                table = pa.ipc.open_stream(pa.py_buffer(b"".join([g.schema_msg, *g.bodies]))).read_all()
            except (pa.ArrowInvalid, OSError) as e:
                for k in g.owners:
                    out.rejected.append((k, f"'{rtype.value}' is not a readable Arrow IPC stream: {e}", None))
                continue
            counts = np.array([len(c) for c in table.column(0).chunks], np.int64)
            if len(counts) != len(g.owners):  # an empty batch has no chunk: count rows per message the slow way
                counts = np.array([pa.ipc.open_stream(g.schema_msg + b).read_all().num_rows for b in g.bodies])
            owner = np.repeat(np.array(g.owners, np.int64), counts)
            n = table.num_rows
            ts = _floats(table, "ts", n) if "ts" in table.column_names else np.repeat(np.array(g.ts), counts)
            nodes = np.array([self.keys.nodes.id_of(self.messages[k].node) for k in g.owners], np.int32)
            node = np.repeat(nodes, counts)
            if rtype is RecordType.GPU:
                rows, ok = self._gpu(table, ts, node, n)
                gpu_parts.append(rows)
            else:
                rows, ok = self._net(table, ts, node, n)
                net_parts.append(rows)
            if not ok.all():
                self._reject(out, table, np.flatnonzero(~ok), owner, rtype)
            if ok.any():
                np.maximum.at(out.newest, owner[ok], ts[ok])
        if gpu_parts:
            out.gpu = GpuRows.concat(gpu_parts)
        if net_parts:
            out.net = NetRows.concat(net_parts)
        return out

    def _gpu(self, table: pa.Table, ts: np.ndarray, node: np.ndarray, n: int) -> tuple[GpuRows, np.ndarray]:
        gpu = _floats(table, "gpu", n)
        ok = np.isfinite(ts) & (gpu >= 0) & (gpu < self.max_gpus)  # NaN (null) compares False
        gidx = np.where(ok, gpu, 0).astype(np.int64)
        vals = np.empty((len(GPU_VALUE_COLUMNS), n))
        for j, name in enumerate(GPU_VALUE_COLUMNS):
            vals[j] = _floats(table, name, n)
        if "pci_bus_id" in table.column_names and table.column("pci_bus_id").null_count < n:
            bus = _categorical(table, "pci_bus_id")
            self.keys.pci.learn(node[ok], gidx[ok], bus[ok])
        uuids = (_categorical(table, "gpu_uuid")
                 if "gpu_uuid" in table.column_names and table.column("gpu_uuid").null_count < n else None)
        if ok.all():  # the usual case: no copy of the value block
            slots = self.keys.gpus.slots_of(node, gidx)
            if uuids is not None:
                self.keys.uuids.observe(slots, ts, uuids)
            return GpuRows(ts, slots, vals), ok
        keep = np.flatnonzero(ok)
        slots = self.keys.gpus.slots_of(node[keep], gidx[keep])
        if uuids is not None and len(keep):
            self.keys.uuids.observe(slots, ts[keep], uuids[keep])
        return GpuRows(ts[keep], slots, vals[:, keep]), ok

    def _net(self, table: pa.Table, ts: np.ndarray, node: np.ndarray, n: int) -> tuple[NetRows, np.ndarray]:
        port = _floats(table, "port", n)
        dev = _categorical(table, "device")
        ok = np.isfinite(ts) & (port >= 0) & (dev.codes >= 0)  # a null device is rejected
        keep = np.flatnonzero(ok)
        states = (_categorical(table, "link_state")[keep]
                  if "link_state" in table.column_names else np.full(len(keep), None, object))
        vals = np.empty((len(NET_STATE_COUNTERS), n))
        for j, name in enumerate(NET_STATE_COUNTERS):
            vals[j] = _floats(table, name, n)
        ports = self.keys.ports.slots_of(node[keep], dev[keep], port[keep].astype(np.int64))
        return NetRows(ts[keep], ports, link_active_flags(states), vals[:, keep]), ok

    def _reject(self, out: ArrowDecoded, table: pa.Table, bad: np.ndarray, owner: np.ndarray,
                rtype: RecordType) -> None:
        rows = table.take(pa.array(bad)).to_pylist()
        for i, row in zip(bad, rows):
            k = int(owner[i])
            row["node"] = self.messages[k].node
            row.setdefault("ts", self.messages[k].ts)
            why = validate_record(row, rtype) or _range_reason(row, rtype, self.max_gpus)
            out.rejected.append((k, f"{rtype.value} sample: {why}", row))


def _range_reason(row: dict[str, Any], rtype: RecordType, max_gpus: int) -> str:
    if rtype is RecordType.GPU:
        return f"gpu index {row.get('gpu')} outside [0, {max_gpus})"
    return f"port {row.get('port')} is negative or its device is missing"

