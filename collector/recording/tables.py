"""A recording's Parquet table (a file or a directory of files): schema checks and row-group index."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Collection

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from collector.schema import RecordType

from .manifest import RecordingError


@dataclass(frozen=True)
class RowGroup:
    """One Parquet row group: where it is, its ts range from the footer, its size."""

    file: pq.ParquetFile
    index: int
    lo: float   # -inf / +inf when the footer has no usable ts statistics
    hi: float
    nbytes: int

    @property
    def has_range(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)


class ParquetTable:
    """A Parquet file or directory of files, with its unified schema and row-group index."""

    def __init__(self, path: Path, rtype: RecordType, dataset: pads.Dataset, schema: pa.Schema):
        self.path, self.rtype, self.dataset, self.schema = path, rtype, dataset, schema
        self.row_groups: list[RowGroup] = []
        strings = {c.name for c in rtype.columns if not c.numeric}
        for frag in dataset.get_fragments():  # footers only: no data is read here
            file_schema = pq.read_schema(frag.path)
            as_dict = [f.name for f in file_schema if f.name in strings
                       and (pa.types.is_string(f.type) or pa.types.is_large_string(f.type))]
            pf = pq.ParquetFile(frag.path, read_dictionary=as_dict)
            idx = pf.schema_arrow.get_field_index("ts")
            for i in range(pf.metadata.num_row_groups):
                rg = pf.metadata.row_group(i)
                st = rg.column(idx).statistics
                lo, hi = (st.min, st.max) if st is not None and st.has_min_max else (-math.inf, math.inf)
                self.row_groups.append(RowGroup(pf, i, lo, hi, rg.total_byte_size))

    def ordered(self) -> bool:
        """Row groups follow each other in ts order (so windows can be served by pruning)."""
        prev_hi = -math.inf
        for rg in self.row_groups:
            if not rg.has_range or rg.lo < prev_hi:
                return False
            prev_hi = rg.hi
        return True

    def ts_range(self) -> tuple[float, float]:
        if not self.row_groups:
            return math.inf, -math.inf
        if all(rg.has_range for rg in self.row_groups):
            return min(rg.lo for rg in self.row_groups), max(rg.hi for rg in self.row_groups)
        # statistics missing or non-finite ts present: scan; non-finite rows are rejected later
        arr = self.dataset.to_table(columns=["ts"])["ts"].to_numpy(zero_copy_only=False).astype("float64")
        arr = arr[np.isfinite(arr)]
        return (float(arr.min()), float(arr.max())) if arr.size else (math.inf, -math.inf)

    def column_names(self, wanted: Collection[str] | None) -> list[str]:
        """The table's columns to read for *wanted* (``None``: all; required keys always)."""
        index = {c for c in (self.schema.pandas_metadata or {}).get("index_columns", []) if isinstance(c, str)}
        required = {c.name for c in self.rtype.columns if c.required}
        return [n for n in self.schema.names
                if n not in index and (wanted is None or n in wanted or n in required)]


def open_table(path: Path, rtype: RecordType) -> ParquetTable:
    files = sorted(p for p in path.rglob("*.parquet") if p.is_file()) if path.is_dir() else [path]
    if not files:
        raise RecordingError(f"{path}: directory holds no .parquet files")
    try:
        schemas = [pq.read_schema(f) for f in files]
    except (pa.ArrowInvalid, OSError) as e:
        raise RecordingError(f"{path}: not readable as Parquet ({e})") from None
    try:
        schema = pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise RecordingError(f"{path}: files disagree on column types ({e})") from None
    _check_column_types(path, schema, rtype)
    return ParquetTable(path, rtype, pads.dataset([str(f) for f in files], schema=schema, format="parquet"), schema)


def _check_column_types(path: Path, schema: pa.Schema, rtype: RecordType) -> None:
    names = set(schema.names)
    for col in rtype.columns:
        if col.name not in names:
            if col.required:
                raise RecordingError(f"{path}: missing required column '{col.name}'")
            continue
        t = schema.field(col.name).type
        if pa.types.is_null(t):
            continue
        if col.numeric and not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)):
            raise RecordingError(f"{path}: column '{col.name}' has type {t}, expected a number ({col.dtype})")
        if not col.numeric and not (pa.types.is_string(t) or pa.types.is_large_string(t)
                                    or pa.types.is_dictionary(t)):
            raise RecordingError(f"{path}: column '{col.name}' has type {t}, expected a string")
