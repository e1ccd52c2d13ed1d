"""Contract validation of Arrow tables: :func:`collector.schema.validate_frame` for the read path.

Same rules, same reasons, same result (the valid rows in the contract's dtypes, the
rejected rows with a ``reason``), but checked on the Arrow arrays Parquet decodes
instead of on a pandas copy of them:

* numeric columns are checked only where a rule can fail — required columns with
  nulls, ``ts`` (finite), integer columns stored as floats; an optional float column
  costs nothing;
* string columns are checked once per distinct value (dictionary-encoded) and reach
  pandas as categoricals whose categories are in order of first appearance, as
  ``pd.factorize`` would number them;
* when nothing is rejected and a column already has the contract's type, pandas gets a
  zero-copy, read-only view of the Arrow buffer.

Tables holding a column type this path does not handle (decimals, all-null columns,
half floats, …) go through :func:`validate_frame` unchanged.
"""

from __future__ import annotations

from typing import Any, Collection

import numpy as np
import pandas as pd
import pyarrow as pa

from collector.schema import (
    NODE_NAME_RE,
    NONFINITE_TS_REASON,
    Column,
    FrameValidation,
    RecordType,
    bad_node_reason,
    cast_numeric,
    missing_reason,
    not_integer_reason,
    validate_frame,
)


def validate_table(tbl: pa.Table, rtype: RecordType | str,
                   columns: Collection[str] | None = None) -> FrameValidation:
    """Validate *tbl* against the contract of *rtype* (see the module docstring).

    *columns* limits the contract columns of the result to those named (required
    columns are always checked and kept); ``None`` keeps every contract column. Columns
    the contract does not know are kept as they are. Optional contract columns that are
    asked for but absent read as null.
    """
    rtype = RecordType(rtype)
    wanted = [c for c in rtype.columns if columns is None or c.required or c.name in columns]
    present = set(tbl.column_names)
    if not all(_handled(tbl.schema.field(c.name).type, c) for c in wanted if c.name in present):
        res = validate_frame(tbl.to_pandas(), rtype)  # rare types: the general path, same rules
        dropped = {c.name for c in rtype.columns} - {c.name for c in wanted}
        return FrameValidation(res.valid.drop(columns=list(dropped)), res.rejected)
    n = tbl.num_rows
    rej = _Rejections(n)
    checked: dict[str, Any] = {}
    for col in wanted:
        if col.name not in present:
            if col.required:
                rej.add(np.ones(n, bool), missing_reason(col.name))
            continue
        arr = _one_chunk(tbl.column(col.name))  # dictionaries unified
        checked[col.name] = _check_numeric(col, arr, rej) if col.numeric else _check_strings(col, arr, rej)
    good = rej.good()
    n_good = n if good is None else int(good.sum())
    out: dict[str, Any] = {}
    for col in wanted:
        if col.name not in present:
            out[col.name] = (cast_numeric(col, np.full(n_good, np.nan)) if col.numeric
                             else pd.array([None] * n_good, dtype="string"))
        elif col.numeric:
            out[col.name] = _numeric_values(col, checked[col.name], good)
        else:
            out[col.name] = _categorical(*checked[col.name], good)
    contract = set(rtype.column_names)
    for name in tbl.column_names:
        if name not in contract:
            s = tbl.column(name).to_pandas()
            out[name] = s if good is None else s[good].reset_index(drop=True)
    valid = pd.DataFrame(out, index=pd.RangeIndex(n_good), copy=False)
    return FrameValidation(valid=valid, rejected=rej.rejected_rows(tbl))


class _Rejections:
    """The first reason each row broke the contract for (rules apply in column order)."""

    def __init__(self, n: int):
        self.n = n
        self.bad: np.ndarray | None = None      # allocated at the first rejection
        self.reason: np.ndarray | None = None

    def add(self, mask: np.ndarray, why: str | np.ndarray) -> None:
        if not mask.any():
            return
        if self.bad is None:
            self.bad, self.reason = np.zeros(self.n, bool), np.full(self.n, None, dtype=object)
        m = mask & ~self.bad
        if m.any():
            self.reason[m] = why if isinstance(why, str) else why[m]
            self.bad |= m

    def good(self) -> np.ndarray | None:
        """Mask of the rows kept, or ``None`` when every row is."""
        return None if self.bad is None else ~self.bad

    def rejected_rows(self, tbl: pa.Table) -> pd.DataFrame:
        if self.bad is None:
            return pd.DataFrame(columns=[*tbl.column_names, "reason"])
        df = tbl.filter(pa.array(self.bad)).to_pandas()
        df["reason"] = self.reason[self.bad]
        return df


def _handled(t: pa.DataType, col: Column) -> bool:
    if col.numeric:
        return pa.types.is_integer(t) or pa.types.is_float32(t) or pa.types.is_float64(t)
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _one_chunk(c: pa.ChunkedArray) -> pa.Array:
    """The column as one array (only the columns checked are combined, not the whole table)."""
    return c.chunk(0) if c.num_chunks == 1 else c.combine_chunks()


def _as_float64(arr: pa.Array) -> np.ndarray:
    """Values as float64, nulls as NaN (what :func:`validate_frame` computes from pandas)."""
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.float64)


def _check_numeric(col: Column, arr: pa.Array, rej: _Rejections) -> pa.Array:
    """Reject the rows of a numeric column that break a rule; the column is returned as is."""
    if pa.types.is_integer(arr.type):  # whole numbers, never NaN or infinite: only nulls can fail
        if col.required and arr.null_count:
            rej.add(arr.is_null().to_numpy(zero_copy_only=False), missing_reason(col.name))
        return arr
    is_int = col.dtype.startswith("int")
    if not (col.required or col.name == "ts" or is_int):
        return arr  # optional float: nothing can fail
    num = _as_float64(arr)
    if np.isfinite(num).all():
        if is_int:
            rej.add(np.floor(num) != num, not_integer_reason(col.name))
        return arr
    isnull = np.isnan(num)
    if col.required:
        rej.add(isnull, missing_reason(col.name))
    if col.name == "ts":
        rej.add(np.isinf(num), NONFINITE_TS_REASON)
    if is_int:
        z = np.where(isnull, 0, num)
        rej.add(~isnull & ~np.isinf(num) & (np.floor(z) != z), not_integer_reason(col.name))
    return arr


def _numeric_values(col: Column, arr: pa.Array, good: np.ndarray | None) -> Any:
    """The kept values of a numeric column in its contract dtype (a view when already right)."""
    if good is None and np.dtype(arr.type.to_pandas_dtype()) == col.dtype:
        if arr.null_count == 0:
            return arr.to_numpy(zero_copy_only=True)
        if pa.types.is_floating(arr.type):
            return arr.to_numpy(zero_copy_only=False)  # nulls → NaN, same dtype
    num = _as_float64(arr)
    return cast_numeric(col, num if good is None else num[good])


def _check_strings(col: Column, arr: pa.Array, rej: _Rejections) -> tuple[np.ndarray, np.ndarray]:
    """Reject nulls in a required string column and malformed node names; returns the column
    as (dictionary index per row with -1 for null, dictionary values)."""
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    idx = arr.indices
    idx = idx.fill_null(-1).to_numpy() if idx.null_count else idx.to_numpy()
    values = arr.dictionary.to_numpy(zero_copy_only=False)
    if col.required and arr.null_count:
        rej.add(idx < 0, missing_reason(col.name))
    if col.name == "node":
        u_bad = np.fromiter((NODE_NAME_RE.match(v) is None for v in values), bool, len(values))
        if u_bad.any():
            why = np.array([bad_node_reason(v) for v in values] + [None], dtype=object)
            rej.add(np.append(u_bad, False)[idx], why[idx])
    return idx, values


def _categorical(idx: np.ndarray, values: np.ndarray, good: np.ndarray | None) -> pd.Categorical:
    """The kept rows of a dictionary column as a Categorical, categories in order of first appearance."""
    if good is not None:
        idx = idx[good]
    codes, used = pd.factorize(idx)
    null = np.flatnonzero(used < 0)
    if len(null):  # a null row: code -1, not a category
        k = int(null[0])
        remap = np.arange(len(used)) - (np.arange(len(used)) > k)
        remap[k] = -1
        codes, used = remap[codes], np.delete(used, k)
    return pd.Categorical.from_codes(codes, categories=pd.Index(values[used], dtype=object))
