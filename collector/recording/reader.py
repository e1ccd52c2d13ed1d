"""Streaming reads of a recording by time window (pruned, sorted in memory, or spilled to disk)."""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Iterator, Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from collector.schema import RecordType, empty_frame, validate_frame, validate_incident

from .arrow_validation import validate_table
from .jsonl import jsonl_path, read_jsonl
from .manifest import Manifest, RecordingError

log = logging.getLogger(__name__)

#: Unsorted tables estimated below this many bytes in memory are sorted in RAM;
#: above it they are spilled to disk by window. 2 GiB leaves room on a 24 GiB box
#: for the pipeline while covering a day of a 256-GPU fleet at 10 s.
DEFAULT_SORT_BUDGET_BYTES = 2 << 30

#: Arrow type the contract's string columns are read as in time order: dictionary-encoded,
#: as Parquet stores them, so node and device names are decoded once per distinct value.
_DICT_STRING = pa.dictionary(pa.int32(), pa.string())

#: Which columns to read, per table (``{"gpu": [...], "net": [...]}``); see :meth:`Recording.iter_windows`.
ColumnSelection = Mapping["RecordType | str", Collection[str]]


@dataclass
class RecordingWindow:
    """One time window ``[start, end)`` of a recording, rows sorted by ``ts``."""

    start: float
    end: float
    gpu: pd.DataFrame
    net: pd.DataFrame
    events: pd.DataFrame
    rejected: pd.DataFrame  # rows that broke the contract: original columns + ``reason`` + ``table``

    # ``gpu`` and ``net`` columns may be read-only views of the decoded Parquet data: copy before writing to them.


class Recording:
    """An opened recording directory (cheap: opening reads only the manifest and schemas)."""

    def __init__(self, path: str | Path, *, sort_budget_bytes: int = DEFAULT_SORT_BUDGET_BYTES):
        self.path = Path(path)
        if not self.path.is_dir():
            raise RecordingError(f"{self.path}: not a directory (a recording is a directory with manifest.json)")
        mpath = self.path / "manifest.json"
        if not mpath.is_file():
            raise RecordingError(f"{self.path}: missing manifest.json")
        try:
            raw = json.loads(mpath.read_text())
        except json.JSONDecodeError as e:
            raise RecordingError(f"{mpath}: not valid JSON ({e})") from None
        self.manifest = Manifest.from_json(raw, str(mpath))
        self.sort_budget_bytes = sort_budget_bytes
        gpu = self.path / "gpu.parquet"
        if not gpu.exists():
            raise RecordingError(f"{self.path}: missing gpu.parquet (required)")
        self._tables = {RecordType.GPU: _open_table(gpu, RecordType.GPU)}
        net = self.path / "net.parquet"
        if net.exists():
            self._tables[RecordType.NET] = _open_table(net, RecordType.NET)
        self._events: pd.DataFrame | None = None

    # -- small tables, read whole

    def events(self) -> pd.DataFrame:
        """All events (validated, sorted by ts); empty when the recording has none."""
        if self._events is None:
            p = jsonl_path(self.path, "events")
            if p is None:
                self._events = empty_frame(RecordType.EVENT)
            else:
                rows, bad = read_jsonl(p)
                df = pd.DataFrame(rows) if rows else pd.DataFrame({c: [] for c in RecordType.EVENT.column_names})
                res = validate_frame(df, RecordType.EVENT)
                if res.n_rejected or bad:
                    log.warning("%s: %d event lines rejected (e.g. %s)", p, res.n_rejected + len(bad),
                                (bad or list(res.rejected["reason"]))[:1])
                self._events = res.valid.sort_values("ts", kind="stable").reset_index(drop=True)
        return self._events

    def incidents(self) -> list[dict[str, Any]] | None:
        """Ground-truth incidents, or ``None`` when the recording has no incidents file."""
        p = jsonl_path(self.path, "incidents")
        if p is None:
            return None
        rows, bad = read_jsonl(p)
        out = []
        for i, r in enumerate(rows):
            why = validate_incident(r)
            if why:
                raise RecordingError(f"{p}: incident {i + 1}: {why}")
            out.append(r)
        if bad:
            raise RecordingError(f"{p}: {bad[0]}")
        return out

    @property
    def has_net(self) -> bool:
        return RecordType.NET in self._tables

    def count_rows(self, rtype: RecordType | str = RecordType.GPU) -> int:
        t = self._tables.get(RecordType(rtype))
        return 0 if t is None else t.dataset.count_rows()

    # -- streaming

    def iter_windows(self, window_s: float, *, start: float | None = None, end: float | None = None,
                     align: float | None = None, columns: ColumnSelection | None = None) -> Iterator[RecordingWindow]:
        """Yield consecutive windows of *window_s* seconds covering the recording.

        The range defaults to the data's own [min ts, max ts] (falling back to the
        manifest). Each window holds only its own rows; empty windows are skipped.
        With *align*, window bounds are multiples of it (the start is rounded down), so a
        consumer with *align*-second ticks never sees a tick split across two windows.

        *columns* maps a table (``"gpu"``, ``"net"``) to the columns to read from it; the
        others are never decoded. Required key columns are always read (they are
        validated); an optional contract column asked for but absent from the files reads
        as null; names neither in the contract nor in the files are ignored. Tables not
        named, and every table when *columns* is ``None``, read all their columns,
        unknown extra ones included. Events are small and always read whole.
        """
        if not window_s > 0:
            raise ValueError("window_s must be > 0")
        lo, hi = self._time_range()
        lo = lo if start is None else start
        if align:
            lo = math.floor(lo / align) * align
        hi = hi if end is None else end
        events = self.events()
        wanted = {RecordType(k): set(v) for k, v in (columns or {}).items()}
        readers = {rt: _WindowReader(t, lo, window_s, self.sort_budget_bytes, wanted.get(rt))
                   for rt, t in self._tables.items()}
        try:
            n_windows = int(math.floor((hi - lo) / window_s)) + 1
            ev_ts = events["ts"].to_numpy()
            for k in range(n_windows):
                a, b = lo + k * window_s, lo + (k + 1) * window_s
                parts = {rt: r.window(k) for rt, r in readers.items()}
                gpu, gbad = parts[RecordType.GPU]
                net, nbad = parts.get(RecordType.NET, (empty_frame(RecordType.NET), None))
                i0, i1 = np.searchsorted(ev_ts, [a, b])
                ev = events.iloc[i0:i1]
                if gpu.empty and net.empty and ev.empty and gbad is None and nbad is None:
                    continue
                rejected = pd.concat([x for x in (gbad, nbad) if x is not None and len(x)], ignore_index=True) \
                    if (gbad is not None or nbad is not None) else pd.DataFrame()
                yield RecordingWindow(a, b, gpu, net, ev.reset_index(drop=True), rejected)
        finally:
            for r in readers.values():
                r.close()

    def read_all(self, rtype: RecordType | str = RecordType.GPU) -> pd.DataFrame:
        """The whole table, validated and sorted (small recordings, tests, training)."""
        rtype = RecordType(rtype)
        t = self._tables.get(rtype)
        if t is None:
            return empty_frame(rtype)
        df = t.dataset.to_table().to_pandas()
        res = validate_frame(df, rtype)
        return res.valid.sort_values("ts", kind="stable").reset_index(drop=True)

    def _time_range(self) -> tuple[float, float]:
        lo, hi = math.inf, -math.inf
        for t in self._tables.values():
            a, b = t.ts_range()
            lo, hi = min(lo, a), max(hi, b)
        ev = self.events()
        if len(ev):
            lo, hi = min(lo, float(ev["ts"].iloc[0])), max(hi, float(ev["ts"].iloc[-1]))
        if not math.isfinite(lo):
            return self.manifest.start, self.manifest.end
        return lo, hi


def open_recording(path: str | Path, **kw: Any) -> Recording:
    """Open and validate a recording directory (see :class:`Recording`)."""
    return Recording(path, **kw)


@dataclass(frozen=True)
class _RowGroup:
    """One Parquet row group: where it is, its ts range from the footer, its size."""

    file: pq.ParquetFile
    index: int
    lo: float   # -inf / +inf when the footer has no usable ts statistics
    hi: float
    nbytes: int

    @property
    def has_range(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)


class _Table:
    """A Parquet file or directory of files, with its unified schema and row-group index."""

    def __init__(self, path: Path, rtype: RecordType, dataset: pads.Dataset, schema: pa.Schema):
        self.path, self.rtype, self.dataset, self.schema = path, rtype, dataset, schema
        self.row_groups: list[_RowGroup] = []
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
                self.row_groups.append(_RowGroup(pf, i, lo, hi, rg.total_byte_size))

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


def _open_table(path: Path, rtype: RecordType) -> _Table:
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
    return _Table(path, rtype, pads.dataset([str(f) for f in files], schema=schema, format="parquet"), schema)


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


class _WindowReader:
    """Serves window k of one table, choosing pruning, in-memory sort or spill.

    Windows are assembled as Arrow tables of the selected columns and validated there
    (:func:`validate_table`); pandas sees only the valid rows, mostly as zero-copy views.
    """

    def __init__(self, table: _Table, lo: float, window_s: float, budget: int, wanted: Collection[str] | None):
        self.t, self.lo, self.w, self.wanted = table, lo, window_s, wanted
        self.names = table.column_names(wanted)
        fields = [table.schema.field(n) for n in self.names]
        strings = {c.name for c in table.rtype.columns if not c.numeric}
        # time-ordered reads get the contract's strings dictionary-encoded (see _Table)
        self.pruned_schema = pa.schema([f.with_type(_DICT_STRING) if f.name in strings else f for f in fields])
        self._mem: pa.Table | None = None
        self._spill: Path | None = None
        self._cache: dict[tuple[int, int], pa.Table] = {}
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
            if first:  # rows without a usable ts fall in no window: surface them once, to be rejected
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
            c = c.cast(pa.string()).dictionary_encode() if f.type == _DICT_STRING else c.cast(f.type)
        cols.append(c)
    return pa.Table.from_arrays(cols, schema=schema)
