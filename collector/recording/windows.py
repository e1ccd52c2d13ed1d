"""Window k of one recording table as validated rows: by row-group pruning, in-memory sort or spill."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Collection

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .arrow_validation import validate_table
from .tables import ParquetTable

log = logging.getLogger(__name__)

#: Arrow type the contract's string columns are read as in time order: dictionary-encoded,
#: as Parquet stores them, so node and device names are decoded once per distinct value.
DICT_STRING = pa.dictionary(pa.int32(), pa.string())


class WindowReader:
    """Serves window k of one table, choosing pruning, in-memory sort or spill.

    Windows are assembled as Arrow tables of the selected columns and validated there
    (:func:`validate_table`); pandas sees only the valid rows, mostly as zero-copy views.
    """

    def __init__(self, table: ParquetTable, lo: float, window_s: float, budget: int, wanted: Collection[str] | None):
        self.t, self.lo, self.w, self.wanted = table, lo, window_s, wanted
        self.names = table.column_names(wanted)
        fields = [table.schema.field(n) for n in self.names]
        strings = {c.name for c in table.rtype.columns if not c.numeric}
        # time-ordered reads get the contract's strings dictionary-encoded (see ParquetTable)
        self.pruned_schema = pa.schema([f.with_type(DICT_STRING) if f.name in strings else f for f in fields])
        self._mem: pa.Table | None = None
        self._spill: Path | None = None
        self._cache: dict[tuple[int, int], pa.Table] = {}
        self._surfaced: set[tuple[int, int]] = set()  # row groups whose non-finite ts rows were reported
        self.mode = "prune"
        if not table.ordered():
            est = 2 * sum(rg.nbytes for rg in table.row_groups)  # Arrow -> pandas roughly doubles
            if est <= budget:
                self.mode = "memory"
            else:
                self.mode = "spill"
                log.info("%s: unsorted and ~%.1f GiB; partitioning by window on disk", table.path, est / 2**30)
                self._spill = Path(tempfile.mkdtemp(prefix="gpuops-recording-"))
                self._partition()

    def _pruned(self, a: float, b: float, first: bool) -> pa.Table:
        """Rows with a <= ts < b, reading only the row groups whose ts range overlaps."""
        tables = []
        cache: dict[tuple[int, int], pa.Table] = {}
        for rg in self.t.row_groups:
            if (rg.hi < a or rg.lo >= b) and not (first and not rg.has_range):
                continue
            key = (id(rg.file), rg.index)
            tbl = self._cache.get(key)
            if tbl is None:
                in_file = set(rg.file.schema_arrow.names)
                tbl = rg.file.read_row_group(rg.index, columns=[n for n in self.names if n in in_file],
                                             use_threads=False)
            cache[key] = tbl
            ts = tbl.column("ts").to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
            with np.errstate(invalid="ignore"):
                mask = (ts >= a) & (ts < b)
            if key not in self._surfaced:  # rows without a usable ts fall in no window (and Parquet
                self._surfaced.add(key)     # statistics leave them out): surface them once, to be rejected
                mask |= ~np.isfinite(ts)
            tables.extend(_rows_where(tbl, mask))
        self._cache = cache  # keep only the row groups this window touched (the next may reuse the last)
        if not tables:
            return self.pruned_schema.empty_table()
        return pa.concat_tables([_conform_table(t, self.pruned_schema) for t in tables])

    def _partition(self) -> None:
        assert self._spill is not None
        writers: dict[int, pq.ParquetWriter] = {}
        try:
            for batch in self.t.dataset.to_batches(columns=self.names, batch_size=1 << 18):
                ts = batch.column("ts").to_numpy(zero_copy_only=False).astype("float64")
                k = np.floor((np.nan_to_num(ts, nan=self.lo, posinf=self.lo, neginf=self.lo) - self.lo) / self.w)
                k = k.astype(np.int64)
                tbl = pa.Table.from_batches([batch])
                for key in np.unique(k):
                    w = writers.get(int(key))
                    if w is None:
                        w = writers[int(key)] = pq.ParquetWriter(self._spill / f"w{int(key)}.parquet", tbl.schema)
                    w.write_table(tbl.filter(pa.array(k == key)))
        finally:
            for w in writers.values():
                w.close()

    def _sorted_in_memory(self, a: float, b: float, first: bool) -> pa.Table:
        if self._mem is None:
            tbl = self.t.dataset.to_table(columns=self.names)
            ts = np.asarray(tbl.column("ts").to_numpy(), dtype=np.float64)
            order = np.argsort(ts, kind="stable")  # NaN last, as pandas sorts
            self._mem, self._mem_ts = tbl.take(order), ts[order]
        i0, i1 = np.searchsorted(self._mem_ts, [a, b])
        tbl = self._mem.slice(i0, i1 - i0)
        if first:  # non-finite ts rows sort to the ends; report them once
            nonfinite = np.flatnonzero(~np.isfinite(self._mem_ts))
            if len(nonfinite):
                tbl = pa.concat_tables([tbl, self._mem.take(nonfinite)])
        return tbl

    def window(self, k: int) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        a, b = self.lo + k * self.w, self.lo + (k + 1) * self.w
        if self.mode == "prune":
            tbl = self._pruned(a, b, k == 0)
        elif self.mode == "memory":
            tbl = self._sorted_in_memory(a, b, k == 0)
        else:
            f = self._spill / f"w{k}.parquet"
            tbl = pq.read_table(f) if f.exists() else pa.schema(
                [self.t.schema.field(n) for n in self.names]).empty_table()
        res = validate_table(tbl, self.t.rtype, self.wanted)
        valid = res.valid
        ts = valid["ts"].to_numpy()
        if len(ts) > 1 and not (ts[1:] >= ts[:-1]).all():  # files written in time order skip the sort
            valid = valid.sort_values("ts", kind="stable").reset_index(drop=True)
        bad = None
        if res.n_rejected:
            bad = res.rejected.assign(table=self.t.rtype.value)
        return valid, bad

    def close(self) -> None:
        if self._spill is not None:
            shutil.rmtree(self._spill, ignore_errors=True)
            self._spill = None
        self._mem = None


def _rows_where(tbl: pa.Table, mask: np.ndarray) -> list[pa.Table]:
    """The rows of *tbl* where *mask* holds: the table itself, a zero-copy slice when the rows
    are contiguous (a time-ordered row group), else a filtered copy; [] when none."""
    idx = np.flatnonzero(mask)
    if len(idx) == 0:
        return []
    if len(idx) == len(mask):
        return [tbl]
    if idx[-1] - idx[0] + 1 == len(idx):
        return [tbl.slice(int(idx[0]), len(idx))]
    return [tbl.filter(pa.array(mask))]


def _conform_table(tbl: pa.Table, schema: pa.Schema) -> pa.Table:
    """A table in *schema*: columns this file lacks become nulls, others are cast to its types."""
    if tbl.schema == schema:
        return tbl
    cols = []
    for f in schema:
        if f.name not in tbl.schema.names:
            cols.append(pa.nulls(tbl.num_rows, f.type))
            continue
        c = tbl.column(f.name)
        if c.type != f.type:
            c = c.cast(pa.string()).dictionary_encode() if f.type == DICT_STRING else c.cast(f.type)
        cols.append(c)
    return pa.Table.from_arrays(cols, schema=schema)
