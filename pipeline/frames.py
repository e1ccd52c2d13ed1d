"""Recording DataFrames (spec/recording.md, as :mod:`collector.recording` yields them) → column batches.

The frames are already validated by the recording reader (contract dtypes, bad rows set
aside with a reason), so this is a column-by-column ``to_numpy``: no per-row Python.
Optional columns a recording lacks read as NaN; GPU indices outside
``[0, max_gpus_per_node)`` are returned as a count of rejected rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.columns import (
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


def _node_ids(s: pd.Series, keys: Keys) -> np.ndarray:
    """Node ids of a node-name column; a categorical one (as recordings are read) is looked
    up once per category instead of once per row."""
    if isinstance(s.dtype, pd.CategoricalDtype) and not s.hasnans:
        return keys.nodes.ids_of(s.cat.categories.to_numpy(object))[s.cat.codes.to_numpy()]
    return keys.nodes.ids_of(s.to_numpy(object))


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
    ts = df["ts"].to_numpy(np.float64)
    n_bad = int((~ok).sum())
    if n_bad:
        nodes, gpu, vals, ts = nodes[ok], gpu[ok], vals[:, ok], ts[ok]
    return GpuRows(ts, keys.gpus.slots_of(nodes, gpu), vals), n_bad


def net_rows_from_frame(df: pd.DataFrame | None, keys: Keys) -> NetRows:
    """Port samples of *df* as :class:`NetRows`."""
    if df is None or len(df) == 0:
        return NetRows.empty()
    nodes = _node_ids(df["node"], keys)
    ports = keys.ports.slots_of(nodes, _strings(df["device"]), nullable_ints(df["port"], -1, np.int64))
    state = df["link_state"].to_numpy(object) if "link_state" in df.columns else np.full(len(df), None, object)
    return NetRows(df["ts"].to_numpy(np.float64), ports, link_active_flags(state),
                   frame_block(df, NET_STATE_COUNTERS))


def xid_rows_from_frame(df: pd.DataFrame | None, keys: Keys, max_gpus: int) -> XidRows:
    """XID events of *df* (``kind == "xid"`` with a code) as :class:`XidRows`; other events are ignored."""
    if df is None or len(df) == 0 or "kind" not in df.columns or "code" not in df.columns:
        return XidRows.empty()
    code = nullable_ints(df["code"], -1, np.int64)
    keep = (df["kind"].to_numpy(object) == "xid") & (code >= 0)
    if not keep.any():
        return XidRows.empty()
    df = df[keep]
    gpu = nullable_ints(df["gpu"], -1, np.int64) if "gpu" in df.columns else np.full(len(df), -1)
    gpu = np.where((gpu >= 0) & (gpu < max_gpus), gpu, -1).astype(np.int16)
    return XidRows(df["ts"].to_numpy(np.float64), keys.nodes.ids_of(df["node"].to_numpy(object)),
                   gpu, code[keep].astype(np.int32))
