"""Bus messages → column batches, with validation and dead-lettering reasons.

Telemetry messages (:func:`collector.wire.decode_telemetry`) are column-oriented, so a
poll's worth of messages is concatenated column by column into Python lists and turned
into numpy once per poll — no DataFrame per message, no dict per sample. Each column
is type-checked as a whole (``set(map(type, col))``); only a message that fails that
check is looked at row by row, with :func:`collector.schema.validate_record` giving the
reason, so one bad sample costs only itself. Events (:func:`collector.wire.decode_event`)
are validated the same way; ``kind == "xid"`` events become :class:`XidRows`, an event with
no ``gpu`` getting its GPU from its ``pci_bus_id`` where GPU samples have named that bus id
(:class:`pipeline.registry.PciGpuMap`). Every other valid event (operator maintenance
windows, scheduler and BMC events, ...) is kept as its record in :attr:`Decoded.events`; an
operator maintenance event that does not parse (:mod:`collector.operator_events`) is
rejected with the reason. BMC events (``source == "bmc"``) must also have the BMC sources'
shape (:func:`collector.bmc_events.bmc_problem`: a reading that is not a number is rejected
with the reason); they are also given as :attr:`Decoded.bmc` rows (:mod:`pipeline.bmc`).

Arrow-encoded telemetry (``collector.wire``, picked by its first bytes) skips the Python
lists altogether: :class:`pipeline.decode_arrow.ArrowDecoder` reads a poll's Arrow messages
in one Arrow call per schema; a message it cannot read as columns comes back here and takes
the general path above.

Nothing here produces to the bus: rejects come back as :class:`Rejected` for the
worker to dead-letter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from collector.bmc_events import bmc_problem
from collector.operator_events import OperatorEventError, maintenance_window
from collector.schema import RecordType, validate_record
from collector.wire import WireError, columns_to_rows, decode_event, decode_telemetry, is_arrow, split_arrow
from pipeline.bmc import BmcRows, bmc_rows_from_records
from pipeline.bus import BusMessage, TopicPartition
from pipeline.samples import (
    GPU_VALUE_COLUMNS,
    NET_STATE_COUNTERS,
    GpuRows,
    NetRows,
    XidRows,
    link_active_flags,
)
from pipeline.decode_arrow import ArrowDecoder
from pipeline.registry import Keys

_NUM = {float, int, type(None)}
_INT = {int}


@dataclass
class Rejected:
    """A message or sample that could not be used, and why (the dead-letter reason)."""

    reason: str
    payload: Any
    topic: str
    partition: int
    offset: int


@dataclass
class Decoded:
    """Rows of one poll, what was rejected, and per message its partition, offset and newest ts."""

    gpu: GpuRows
    net: NetRows
    xids: XidRows
    rejected: list[Rejected] = field(default_factory=list)
    #: every other valid event, as its record (operator maintenance windows, scheduler events, ...)
    events: list[dict[str, Any]] = field(default_factory=list)
    #: the BMC events among them, as rows
    bmc: BmcRows = field(default_factory=BmcRows.empty)
    progress: list[tuple[TopicPartition, int, float]] = field(default_factory=list)


class _Columns:
    """Python lists growing by whole message columns; numpy once at the end."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = tuple(names)
        self.lists: dict[str, list[Any]] = {n: [] for n in self.names}
        self.n = 0

    def extend(self, cols: dict[str, list[Any]], n: int, keep: list[int] | None = None) -> None:
        for name in self.names:
            col = cols.get(name)
            if col is None:
                self.lists[name].extend([None] * (n if keep is None else len(keep)))
            else:
                self.lists[name].extend(col if keep is None else [col[i] for i in keep])
        self.n += n if keep is None else len(keep)

    def floats(self, names: Iterable[str]) -> np.ndarray:
        out = np.empty((len(tuple(names)), self.n))
        for j, name in enumerate(names):
            out[j] = np.array(self.lists[name], dtype=np.float64)
        return out


class MessageDecoder:
    """Decodes polled messages into column batches for one pipeline's :class:`Keys`."""

    def __init__(self, keys: Keys, max_gpus: int, telemetry_topics: Iterable[str], event_topics: Iterable[str]) -> None:
        self.keys = keys
        self.max_gpus = max_gpus
        self.telemetry_topics = frozenset(telemetry_topics)
        self.event_topics = frozenset(event_topics)
        self.arrow = ArrowDecoder(keys, max_gpus)

    def decode(self, messages: Iterable[BusMessage]) -> Decoded:
        gpu = _Columns(("ts", "gpu", "pci_bus_id", "gpu_uuid") + GPU_VALUE_COLUMNS)
        net = _Columns(("ts", "device", "port", "link_state") + NET_STATE_COUNTERS)
        gpu_nodes: list[int] = []
        net_nodes: list[int] = []
        xids: list[tuple[float, int, int, int]] = []
        xid_bus: list[Any] = []  # each XID event's pci_bus_id, to resolve a missing gpu
        out = Decoded(GpuRows.empty(), NetRows.empty(), XidRows.empty())
        self.arrow.start()
        arrow_at: list[tuple[int, BusMessage]] = []  # (its place in out.progress, message) per Arrow message
        for m in messages:
            tp = (m.topic, m.partition)

            def reject(reason: str, payload: Any) -> None:
                out.rejected.append(Rejected(reason, payload, m.topic, m.partition, m.offset))

            newest = -math.inf
            if m.topic in self.telemetry_topics:
                try:
                    if is_arrow(m.value) and self.arrow.add(split_arrow(m.value)):
                        arrow_at.append((len(out.progress), m))
                        out.progress.append((tp, m.offset, newest))  # newest: filled in below
                        continue
                    msg = decode_telemetry(m.value)
                except WireError as e:
                    reject(str(e), m.value)
                    out.progress.append((tp, m.offset, newest))
                    continue
                node = self.keys.nodes.id_of(msg.node)
                for cols, acc, nodes, rtype in ((msg.gpu, gpu, gpu_nodes, RecordType.GPU),
                                                (msg.net, net, net_nodes, RecordType.NET)):
                    if not cols:
                        continue
                    cols = cols if "ts" in cols else {**cols, "ts": [msg.ts] * _length(cols)}
                    n = _length(cols)
                    keep = None if self._columns_ok(cols, rtype) else self._good_rows(cols, msg.node, rtype, reject)
                    acc.extend(cols, n, keep)
                    k = n if keep is None else len(keep)
                    nodes.extend([node] * k)
                    if k:
                        newest = max(newest, max(cols["ts"]) if keep is None else max(cols["ts"][i] for i in keep))
            elif m.topic in self.event_topics:
                try:
                    ev = decode_event(m.value)
                except WireError as e:
                    reject(str(e), m.value)
                    out.progress.append((tp, m.offset, newest))
                    continue
                why = validate_record(ev, RecordType.EVENT)
                if why is None and ev.get("source") == "bmc":
                    why = bmc_problem(ev)
                if why:
                    reject(why, ev)
                elif ev.get("kind") == "xid" and ev.get("code") is not None:
                    g = ev.get("gpu")
                    g = g if g is not None and 0 <= g < self.max_gpus else -1
                    xids.append((float(ev["ts"]), self.keys.nodes.id_of(ev["node"]), int(g), int(ev["code"])))
                    xid_bus.append(ev.get("pci_bus_id"))
                    newest = float(ev["ts"])
                else:
                    try:
                        maintenance_window(ev)
                    except OperatorEventError as e:
                        reject(str(e), ev)
                    else:
                        out.events.append(ev)
                        newest = float(ev["ts"])
            else:
                reject(f"unexpected topic {m.topic!r}", m.value)
            out.progress.append((tp, m.offset, newest))
        if arrow_at:
            self._decode_arrow(out, arrow_at)
        out.bmc = bmc_rows_from_records(out.events, self.keys)
        if gpu.n:
            slots = self.keys.gpus.slots_of(np.array(gpu_nodes, np.int32), np.array(gpu.lists["gpu"], np.int64))
            ts = np.array(gpu.lists["ts"], np.float64)
            if any(u is not None for u in gpu.lists["gpu_uuid"]):
                self.keys.uuids.observe(slots, ts, np.array(gpu.lists["gpu_uuid"], object))
            gpu_rows = GpuRows(ts, slots, gpu.floats(GPU_VALUE_COLUMNS))
            out.gpu = GpuRows.concat([r for r in (out.gpu, gpu_rows) if len(r)])
            bus = np.array(gpu.lists["pci_bus_id"], object)
            if any(b is not None for b in bus):
                self.keys.pci.learn(np.array(gpu_nodes, np.int32), np.array(gpu.lists["gpu"], np.int64), bus)
        if net.n:
            ports = self.keys.ports.slots_of(np.array(net_nodes, np.int32), np.array(net.lists["device"], object),
                                             np.array(net.lists["port"], np.int64))
            rows = NetRows(np.array(net.lists["ts"], np.float64), ports,
                           link_active_flags(np.array(net.lists["link_state"], object)), net.floats(NET_STATE_COUNTERS))
            out.net = NetRows.concat([r for r in (out.net, rows) if len(r)])
        if xids:
            ts, nd, g, c = zip(*xids)
            nodes, gpus = np.array(nd, np.int32), np.array(g, np.int16)
            unknown = gpus < 0
            if unknown.any():  # the kernel line named only its PCI bus id: this poll's samples may know it
                found = self.keys.pci.resolve(nodes[unknown], np.array(xid_bus, object)[unknown])
                gpus[unknown] = np.where(found < self.max_gpus, found, -1)
            out.xids = XidRows(np.array(ts), nodes, gpus, np.array(c, np.int32))
        return out

    def _decode_arrow(self, out: Decoded, arrow_at: list[tuple[int, BusMessage]]) -> None:
        got = self.arrow.decode()
        out.gpu, out.net = got.gpu, got.net
        for k, (place, m) in enumerate(arrow_at):
            out.progress[place] = ((m.topic, m.partition), m.offset, float(got.newest[k]))
        for k, reason, row in got.rejected:
            m = arrow_at[k][1]
            out.rejected.append(Rejected(reason, row if row is not None else m.value, m.topic, m.partition, m.offset))

    def _columns_ok(self, cols: dict[str, list[Any]], rtype: RecordType) -> bool:
        """Whole-column check: every value has a valid type, keys present, finite and in range."""
        ts = cols["ts"]
        if not set(map(type, ts)) <= {float, int} or not all(map(math.isfinite, ts)):
            return False
        key = "gpu" if rtype is RecordType.GPU else "port"
        idx = cols.get(key)
        if idx is None or not set(map(type, idx)) <= _INT or (idx and (min(idx) < 0 or
                                                                      (key == "gpu" and max(idx) >= self.max_gpus))):
            return False
        if rtype is RecordType.NET:
            dev = cols.get("device")
            if dev is None or not set(map(type, dev)) <= {str} or not set(map(type, cols.get("link_state", ()))) <= {str, type(None)}:
                return False
        if rtype is RecordType.GPU and not set(map(type, cols.get("pci_bus_id", ()))) <= {str, type(None)}:
            return False
        names = GPU_VALUE_COLUMNS if rtype is RecordType.GPU else NET_STATE_COUNTERS
        return all(set(map(type, cols[n])) <= _NUM for n in names if n in cols)

    def _good_rows(self, cols: dict[str, list[Any]], node: str, rtype: RecordType, reject: Any) -> list[int]:
        """Indices of valid samples; each bad one is rejected with its reason (slow path)."""
        keep = []
        for i, row in enumerate(columns_to_rows(cols, node=node)):
            why = validate_record(row, rtype)
            if why is None and rtype is RecordType.GPU and not 0 <= row["gpu"] < self.max_gpus:
                why = f"gpu index {row['gpu']} outside [0, {self.max_gpus})"
            if why is None and rtype is RecordType.NET and row["port"] < 0:
                why = f"port {row['port']} is negative"
            if why is None:
                keep.append(i)
            else:
                reject(f"{rtype.value} sample {i}: {why}", row)
        return keep


def _length(cols: dict[str, list[Any]]) -> int:
    return len(next(iter(cols.values()))) if cols else 0
