"""Column batches: the one input shape of window state, from the bus or a recording.

A batch holds rows of one record type as numpy arrays — keys already turned into
dense ids by :mod:`pipeline.registry`, values as a column-major float64 block
(``vals[j]`` is one contiguous column). Decoded Kafka messages and recording windows
both end up here; everything downstream sees only these three types.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from collector.schema import GPU_COLUMNS, IB_COUNTERS, ColumnKind

#: Numeric GPU columns carried into window state, in contract order (all but keys).
GPU_VALUE_COLUMNS: tuple[str, ...] = tuple(
    c.name for c in GPU_COLUMNS if c.numeric and c.kind is not ColumnKind.KEY)
GPU_COL = {name: j for j, name in enumerate(GPU_VALUE_COLUMNS)}

#: Port counters kept per port (IB_COUNTERS subset; the others are bulk traffic).
NET_STATE_COUNTERS: tuple[str, ...] = tuple(c for c in IB_COUNTERS if c in (
    "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
    "port_rcv_remote_physical_errors", "local_link_integrity_errors", "port_xmit_discards",
    "port_xmit_wait"))
NET_COL = {name: j for j, name in enumerate(NET_STATE_COUNTERS)}


class RowBatch:
    """What every row batch shares: ``ts`` first, then one array per field; a 1-D field has one
    value per row, a 2-D field is a (column, row) block. Subclasses are dataclasses that add
    their fields and an ``empty()`` with their dtypes."""

    ts: np.ndarray

    def __len__(self) -> int:
        return len(self.ts)

    def _arrays(self) -> tuple[np.ndarray, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]

    def take(self, idx: np.ndarray) -> Any:
        """The rows at the integer positions *idx*."""
        return type(self)(*(np.take(a, idx, axis=a.ndim - 1) for a in self._arrays()))

    @classmethod
    def concat(cls, parts: Sequence[Any]) -> Any:
        """The rows of *parts*, in order (the one part itself when there is one)."""
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate(col, axis=col[0].ndim - 1) for col in zip(*(p._arrays() for p in parts))))


@dataclass
class GpuRows(RowBatch):
    """GPU samples: ts (s), slot, and ``vals[GPU_COL[name]]`` per numeric column."""

    ts: np.ndarray      # float64 (n,)
    slot: np.ndarray    # int32 (n,)
    vals: np.ndarray    # float64 (len(GPU_VALUE_COLUMNS), n); NaN = unsupported / missing

    @staticmethod
    def empty() -> "GpuRows":
        return GpuRows(np.zeros(0), np.zeros(0, np.int32), np.zeros((len(GPU_VALUE_COLUMNS), 0)))


@dataclass
class NetRows(RowBatch):
    """Port samples: ts, port slot, link ACTIVE flag (1/0/-1 unknown), counter block."""

    ts: np.ndarray      # float64 (n,)
    port: np.ndarray    # int32 (n,)
    active: np.ndarray  # int8 (n,)
    vals: np.ndarray    # float64 (len(NET_STATE_COUNTERS), n)

    @staticmethod
    def empty() -> "NetRows":
        return NetRows(np.zeros(0), np.zeros(0, np.int32), np.zeros(0, np.int8),
                       np.zeros((len(NET_STATE_COUNTERS), 0)))


@dataclass
class XidRows(RowBatch):
    """XID events: ts, node id, gpu index (-1 = not resolved to a GPU), XID code."""

    ts: np.ndarray      # float64
    node: np.ndarray    # int32
    gpu: np.ndarray     # int16, -1 unknown
    code: np.ndarray    # int32

    @staticmethod
    def empty() -> "XidRows":
        return XidRows(np.zeros(0), np.zeros(0, np.int32), np.zeros(0, np.int16), np.zeros(0, np.int32))


def link_active_flags(states: np.ndarray) -> np.ndarray:
    """``link_state`` strings → 1 (ACTIVE), 0 (any other state), -1 (null). Accepts sysfs '4: ACTIVE'."""
    codes, uniques = pd.factorize(states, use_na_sentinel=True)
    table = np.array([1 if str(u).upper().endswith("ACTIVE") else 0 for u in uniques] + [-1], np.int8)
    return table[codes]


def frame_block(df: pd.DataFrame, names: Sequence[str]) -> np.ndarray:
    """Numeric columns of *df* as a (len(names), n) float64 block; absent columns are NaN."""
    out = pooled_block(len(names), len(df))
    for j, name in enumerate(names):
        if name not in df.columns:
            out[j] = np.nan
            continue
        s = df[name]
        if isinstance(s.dtype, np.dtype) and s.dtype.kind in "fiub":
            out[j] = s.to_numpy()  # cast straight into the block: no float64 temporary
        else:  # nullable extension types: nulls → NaN
            out[j] = s.to_numpy(np.float64, na_value=np.nan)
    return out


def pooled_block(n_cols: int, n_rows: int) -> np.ndarray:
    """An uninitialised float64 ``(n_cols, n_rows)`` array in Arrow's memory pool.

    A value block of a replay window is tens of MB; numpy takes memory that size fresh
    from the kernel each time and pays a page fault per page on first touch
    (shared/PERFORMANCE.md), while the Arrow pool hands the previous window's freed
    block back. The array owns a reference to its buffer, so it lives as long as needed.
    """
    buf = pa.allocate_buffer(n_cols * n_rows * 8)
    return np.frombuffer(buf, np.float64).reshape(n_cols, n_rows)


def nullable_ints(s: Any, fill: int, dtype: Any) -> np.ndarray:
    """A nullable integer column (pandas Int16/float/object) → numpy ints, null → *fill*."""
    s = pd.Series(s)
    if isinstance(s.dtype, np.dtype) and s.dtype.kind in "iu":  # plain numpy integers: no nulls
        return s.to_numpy().astype(dtype, copy=False)
    return s.astype("Float64").fillna(fill).to_numpy(np.float64).astype(dtype)
