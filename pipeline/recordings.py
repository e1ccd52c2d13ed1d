"""Recording DataFrames (spec/recording.md, as :mod:`collector.recording` yields them) → column batches.

The frames are already validated by the recording reader (contract dtypes, bad rows set
aside with a reason), so this is a column-by-column ``to_numpy``: no per-row Python.
Name columns read as categoricals are looked up once per category (node and device names,
link states); the registries number new GPUs and ports once per distinct key. Optional columns a
recording lacks read as NaN; GPU indices outside ``[0, max_gpus_per_node)`` are returned
as a count of rejected rows. GPU samples' ``pci_bus_id`` teaches :class:`pipeline.registry.PciGpuMap`
which GPU each bus id is, so an XID event that names only its bus id is given its GPU; ``gpu_uuid``
tells :class:`pipeline.registry.GpuUuids` when a slot holds a new GPU (a swap). Operator
maintenance events (muted time) and the agent's command results (repairs) are picked out for
:meth:`pipeline.stream.FeaturePipeline.ingest_events` (:func:`operator_context_from_frame`). :data:`RECORDING_COLUMNS`
is what replay needs to read.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from collector.commands import RESULT_KIND, RESULT_SOURCE
from collector.sources.kmsg import parse_xid_line
from pipeline.samples import (
    GPU_VALUE_COLUMNS,
    NET_STATE_COUNTERS,
    GpuRows,
    NetRows,
    XidRows,
    frame_block,
    link_active_flags,
    nullable_ints,
)
from pipeline.registry import Keys

#: The columns the conversions below use, per recording table: pass as
#: ``Recording.iter_windows(columns=RECORDING_COLUMNS)`` so no other column is decoded.
RECORDING_COLUMNS: dict[str, tuple[str, ...]] = {
    "gpu": ("ts", "node", "gpu", "pci_bus_id", "gpu_uuid", *GPU_VALUE_COLUMNS),
    "net": ("ts", "node", "device", "port", "link_state", *NET_STATE_COUNTERS),
}


def _node_ids(s: pd.Series, keys: Keys) -> np.ndarray:
    """Node ids of a node-name column; a categorical one (as recordings are read) is looked
    up once per category instead of once per row."""
    if isinstance(s.dtype, pd.CategoricalDtype) and not s.hasnans:
        return keys.nodes.ids_of(s.cat.categories.to_numpy(object))[s.cat.codes.to_numpy()]
    return keys.nodes.ids_of(s.to_numpy(object))


def _link_flags(s: pd.Series) -> np.ndarray:
    """:func:`link_active_flags` of a ``link_state`` column, once per category when categorical."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        table = np.append(link_active_flags(s.cat.categories.to_numpy(object)), np.int8(-1))
        return table[s.cat.codes.to_numpy()]
    return link_active_flags(s.to_numpy(object))


def _ts(s: pd.Series) -> np.ndarray:
    """A ``ts`` column as float64 (a writable array: the reader may hand out read-only views)."""
    return np.require(s.to_numpy(np.float64), requirements="W")


def _strings(s: pd.Series) -> np.ndarray | pd.Categorical:
    """A string column for factorizing: categorical data as is (no object array per row)."""
    return s.array if isinstance(s.dtype, pd.CategoricalDtype) else s.to_numpy(object)


def gpu_rows_from_frame(df: pd.DataFrame, keys: Keys, max_gpus: int) -> tuple[GpuRows, int]:
    """GPU samples of *df* as :class:`GpuRows`, and how many rows had an unusable GPU index."""
    if df is None or len(df) == 0:
        return GpuRows.empty(), 0
    gpu = nullable_ints(df["gpu"], -1, np.int64)
    ok = (gpu >= 0) & (gpu < max_gpus)
    nodes = _node_ids(df["node"], keys)
    vals = frame_block(df, GPU_VALUE_COLUMNS)
    ts = _ts(df["ts"])
    n_bad = int((~ok).sum())
    if "pci_bus_id" in df.columns and df["pci_bus_id"].notna().any():
        keys.pci.learn(nodes[ok], gpu[ok], _strings(df["pci_bus_id"])[ok])
    if n_bad:
        nodes, gpu, vals, ts = nodes[ok], gpu[ok], vals[:, ok], ts[ok]
    slots = keys.gpus.slots_of(nodes, gpu)
    if "gpu_uuid" in df.columns and len(slots):
        uuids = _strings(df["gpu_uuid"])
        keys.uuids.observe(slots, ts, uuids[ok] if n_bad else uuids)
    return GpuRows(ts, slots, vals), n_bad


def net_rows_from_frame(df: pd.DataFrame | None, keys: Keys) -> NetRows:
    """Port samples of *df* as :class:`NetRows`."""
    if df is None or len(df) == 0:
        return NetRows.empty()
    nodes = _node_ids(df["node"], keys)
    ports = keys.ports.slots_of(nodes, _strings(df["device"]), nullable_ints(df["port"], -1, np.int64))
    active = _link_flags(df["link_state"]) if "link_state" in df.columns else np.full(len(df), -1, np.int8)
    return NetRows(_ts(df["ts"]), ports, active, frame_block(df, NET_STATE_COUNTERS))


def xid_rows_from_frame(df: pd.DataFrame | None, keys: Keys, max_gpus: int) -> XidRows:
    """XID events of *df* (``kind == "xid"``) as :class:`XidRows`; other events are ignored.

    Code, GPU and bus id are the event's own columns. Where another writer left the code null,
    or named neither the GPU nor its bus id, the ``NVRM: Xid`` kernel line in its ``message``
    (spec/telemetry.md §3: the raw line) says them, read as the kmsg source reads it
    (:func:`collector.sources.kmsg.parse_xid_line`); an event with no code either way is ignored."""
    if df is None or len(df) == 0 or "kind" not in df.columns:
        return XidRows.empty()
    n = len(df)
    is_xid = df["kind"].to_numpy(object) == "xid"
    code = nullable_ints(df["code"], -1, np.int64) if "code" in df.columns else np.full(n, -1, np.int64)
    gpu = nullable_ints(df["gpu"], -1, np.int64) if "gpu" in df.columns else np.full(n, -1, np.int64)
    gpu = np.where((gpu >= 0) & (gpu < max_gpus), gpu, -1).astype(np.int16)
    pci = df["pci_bus_id"].to_numpy(object).copy() if "pci_bus_id" in df.columns else np.full(n, None, object)
    asks = np.flatnonzero(is_xid & ((code < 0) | (gpu < 0)))  # few: one Python step each
    unread = [i for i in asks if code[i] < 0 or not isinstance(pci[i], str)]
    if unread and "message" in df.columns:
        for i, m in zip(unread, df["message"].to_numpy(object)[unread]):
            x = parse_xid_line(m) if isinstance(m, str) else None
            if x is None or x.kind != "xid" or x.code is None or (code[i] >= 0 and code[i] != x.code):
                continue  # not an XID line, or one about another code than the event's: not this event's
            code[i] = x.code
            if not isinstance(pci[i], str):
                pci[i] = x.pci_bus_id
    keep = is_xid & (code >= 0)
    if not keep.any():
        return XidRows.empty()
    ts, node, gpu, pci = df["ts"].to_numpy(np.float64)[keep], df["node"].to_numpy(object)[keep], gpu[keep], pci[keep]
    nodes = keys.nodes.ids_of(node)
    unknown = gpu < 0
    if unknown.any():  # the event named only its PCI bus id
        found = keys.pci.resolve(nodes[unknown], pci[unknown])
        gpu[unknown] = np.where(found < max_gpus, found, -1)
    return XidRows(ts, nodes, gpu, code[keep].astype(np.int32))


def operator_context_from_frame(df: pd.DataFrame | None) -> list[dict[str, Any]]:
    """The operator maintenance events and the agent's command results of an events frame as
    records (the bus's shape: a ``nodes`` list, ``start``, ``end``), for
    :meth:`pipeline.stream.FeaturePipeline.ingest_events`."""
    if df is None or len(df) == 0 or "source" not in df.columns or "kind" not in df.columns:
        return []
    source, kind = df["source"].to_numpy(object), df["kind"].to_numpy(object)
    keep = ((source == "operator") & (kind == "maintenance")) | ((source == RESULT_SOURCE) & (kind == RESULT_KIND))
    if not keep.any():
        return []
    out = []
    for row in df[keep].to_dict("records"):
        nodes = row.get("nodes")
        # a field this event lacks but another event of the frame has reads as NaN / NA: absent
        ev = {k: v for k, v in row.items() if not (v is None or v is pd.NA or (isinstance(v, float) and v != v))}
        out.append({**ev, "nodes": list(nodes) if isinstance(nodes, (list, tuple, np.ndarray)) else nodes})
    return out
