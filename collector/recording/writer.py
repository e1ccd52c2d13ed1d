"""Writing recordings: incrementally (in time order) or all at once."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from collector.schema import RecordType, arrow_schema

from .manifest import Manifest


class RecordingWriter:
    """Writes a recording incrementally (tables appended in chunks, in time order).

    Use as a context manager; the manifest is written last, on a clean close, so a
    crashed writer leaves no directory that looks complete.
    """

    def __init__(self, path: str | Path, manifest: Manifest, *, compression: str = "lz4",
                 gzip_jsonl: bool = False, row_group_rows: int = 1 << 17):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.manifest = manifest
        self.compression = compression
        self.row_group_rows = row_group_rows
        self._writers: dict[RecordType, pq.ParquetWriter] = {}
        self._schemas: dict[RecordType, pa.Schema] = {}
        suffix = ".jsonl.gz" if gzip_jsonl else ".jsonl"
        self._jsonl = {"events": self.path / f"events{suffix}", "incidents": self.path / f"incidents{suffix}"}
        self._jsonl_fh: dict[str, Any] = {}

    def write_table(self, rtype: RecordType | str, df: pd.DataFrame) -> None:
        """Append rows of a GPU or net table (columns per the contract, extras kept)."""
        rtype = RecordType(rtype)
        if rtype is RecordType.EVENT:
            raise ValueError("events go to write_events()")
        if df.empty:
            return
        if rtype not in self._writers:
            extra = [(c, pa.Schema.from_pandas(df[[c]], preserve_index=False).field(c).type)
                     for c in df.columns if c not in rtype.column_names]
            self._schemas[rtype] = arrow_schema(rtype, extra)
            self._writers[rtype] = pq.ParquetWriter(self.path / f"{rtype.value}.parquet",
                                                    self._schemas[rtype], compression=self.compression)
        schema = self._schemas[rtype]
        tbl = pa.Table.from_pandas(_conform(df, schema), schema=schema, preserve_index=False)
        self._writers[rtype].write_table(tbl, row_group_size=self.row_group_rows)

    def write_arrow(self, rtype: RecordType | str, table: pa.Table) -> None:
        """Append an Arrow table already in the contract's schema (the simulator's fast path)."""
        rtype = RecordType(rtype)
        if table.num_rows == 0:
            return
        if rtype not in self._writers:
            self._schemas[rtype] = table.schema
            self._writers[rtype] = pq.ParquetWriter(self.path / f"{rtype.value}.parquet", table.schema,
                                                    compression=self.compression)
        self._writers[rtype].write_table(table.cast(self._schemas[rtype]), row_group_size=self.row_group_rows)

    def write_events(self, events: Iterable[Mapping[str, Any]]) -> None:
        self._write_jsonl("events", events)

    def write_incidents(self, incidents: Iterable[Mapping[str, Any]]) -> None:
        self._write_jsonl("incidents", incidents)

    def _write_jsonl(self, stem: str, rows: Iterable[Mapping[str, Any]]) -> None:
        fh = self._jsonl_fh.get(stem)
        if fh is None:
            p = self._jsonl[stem]
            fh = self._jsonl_fh[stem] = gzip.open(p, "wb") if p.suffix == ".gz" else open(p, "wb")
        for r in rows:
            clean = {k: _json_value(v) for k, v in r.items()}
            fh.write(orjson.dumps(clean, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")

    def close(self) -> None:
        for w in self._writers.values():
            w.close()
        for fh in self._jsonl_fh.values():
            fh.close()
        if RecordType.GPU not in self._writers:  # spec: gpu.parquet is required, even if empty
            schema = arrow_schema(RecordType.GPU)
            pq.write_table(schema.empty_table(), self.path / "gpu.parquet")
        (self.path / "manifest.json").write_text(json.dumps(self.manifest.to_json(), indent=2) + "\n")

    def __enter__(self) -> "RecordingWriter":
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            for w in self._writers.values():
                w.close()
            for fh in self._jsonl_fh.values():
                fh.close()


def _json_value(v: Any) -> Any:
    if v is None or v is pd.NA or (isinstance(v, float) and not math.isfinite(v)):
        return None
    return v


def _conform(df: pd.DataFrame, schema: pa.Schema) -> pd.DataFrame:
    """Columns in schema order; missing optional ones added as null."""
    out = {}
    n = len(df)
    for f in schema:
        if f.name in df.columns:
            out[f.name] = df[f.name]
        else:
            out[f.name] = pd.Series([None] * n, dtype=object) if pa.types.is_string(f.type) else np.full(n, np.nan)
    return pd.DataFrame(out)


def write_recording(path: str | Path, manifest: Manifest, gpu: pd.DataFrame, net: pd.DataFrame | None = None,
                    events: Sequence[Mapping[str, Any]] | pd.DataFrame | None = None,
                    incidents: Sequence[Mapping[str, Any]] | None = None, **kw: Any) -> Path:
    """Write a whole recording at once (small recordings, tests, conversions)."""
    with RecordingWriter(path, manifest, **kw) as w:
        w.write_table(RecordType.GPU, gpu)
        if net is not None:
            w.write_table(RecordType.NET, net)
        if events is not None:
            rows = events.to_dict("records") if isinstance(events, pd.DataFrame) else events
            w.write_events(rows)
        if incidents is not None:
            w.write_incidents(incidents)
    return Path(path)
