"""Streaming reads of a recording by time window (pruned, sorted in memory, or spilled to disk)."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Iterator, Mapping

import pandas as pd

from collector.schema import RecordType, empty_frame, validate_frame, validate_incident

from .events import EventScan, EventWindows, read_events, scan_and_read_events, scan_events
from .jsonl import jsonl_path, read_jsonl
from .manifest import Manifest, RecordingError
from .tables import open_table
from .windows import WindowReader

log = logging.getLogger(__name__)

#: Unsorted tables estimated below this many bytes in memory are sorted in RAM;
#: above it they are spilled to disk by window. 2 GiB leaves room on a 24 GiB box
#: for the pipeline while covering a day of a 256-GPU fleet at 10 s.
DEFAULT_SORT_BUDGET_BYTES = 2 << 30

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
        self._tables = {RecordType.GPU: open_table(gpu, RecordType.GPU)}
        net = self.path / "net.parquet"
        if net.exists():
            self._tables[RecordType.NET] = open_table(net, RecordType.NET)
        self._events: pd.DataFrame | None = None
        self._event_scan: EventScan | None = None

    # -- events read whole (iter_windows streams them by window)

    def events(self, *, sources: Collection[str] | None = None, kinds: Collection[str] | None = None
               ) -> pd.DataFrame:
        """Events (validated, sorted by ts); empty when the recording has none.

        All of them by default: the whole file in memory (kept for the next call). With
        *sources* and/or *kinds*, only the events whose ``source`` / ``kind`` is one of them,
        chosen line by line before any frame is built (``sources=("operator",)`` reads the few
        operator events of a file of BMC readings in little memory); not kept. The first such
        read also scans the file for :meth:`iter_windows` (:func:`.events.scan_and_read_events`),
        so a replay passes over the file twice, not three times.
        """
        p = jsonl_path(self.path, "events")
        if p is None:
            return empty_frame(RecordType.EVENT)
        if sources is None and kinds is None:
            if self._events is None:
                self._events = read_events(p)
            return self._events
        if self._event_scan is None:
            self._event_scan, selected = scan_and_read_events(p, sources, kinds)
            return selected
        return read_events(p, sources, kinds)

    def _events_scanned(self) -> tuple[Path, EventScan] | None:
        """The events file and its scan (range, lag; see :mod:`.events`), scanned once."""
        p = jsonl_path(self.path, "events")
        if p is None:
            return None
        if self._event_scan is None:
            self._event_scan = scan_events(p)
        return p, self._event_scan

    # -- small tables, read whole

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
        unknown extra ones included.

        Events are streamed too (:class:`.events.EventWindows`): each window gets only its own
        events, validated and sorted by ts (stable), in memory proportional to the window
        (plus how far out of time order the file's lines are), not to the file.
        """
        if not window_s > 0:
            raise ValueError("window_s must be > 0")
        lo, hi = self._time_range()
        lo = lo if start is None else start
        if align:
            lo = math.floor(lo / align) * align
        hi = hi if end is None else end
        scanned = self._events_scanned()
        wanted = {RecordType(k): set(v) for k, v in (columns or {}).items()}
        readers = {rt: WindowReader(t, lo, window_s, self.sort_budget_bytes, wanted.get(rt))
                   for rt, t in self._tables.items()}
        n_windows = int(math.floor((hi - lo) / window_s)) + 1
        events = None if scanned is None else EventWindows(*scanned, lo, window_s, n_windows)
        try:
            for k in range(n_windows):
                a, b = lo + k * window_s, lo + (k + 1) * window_s
                parts = {rt: r.window(k) for rt, r in readers.items()}
                gpu, gbad = parts[RecordType.GPU]
                net, nbad = parts.get(RecordType.NET, (empty_frame(RecordType.NET), None))
                ev = empty_frame(RecordType.EVENT) if events is None else events.window(k)
                if gpu.empty and net.empty and ev.empty and gbad is None and nbad is None:
                    continue
                rejected = pd.concat([x for x in (gbad, nbad) if x is not None and len(x)], ignore_index=True) \
                    if (gbad is not None or nbad is not None) else pd.DataFrame()
                yield RecordingWindow(a, b, gpu, net, ev, rejected)
        finally:
            for r in readers.values():
                r.close()
            if events is not None:
                events.close()

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
        scanned = self._events_scanned()
        if scanned is not None:
            lo, hi = min(lo, scanned[1].lo), max(hi, scanned[1].hi)
        if not math.isfinite(lo):
            return self.manifest.start, self.manifest.end
        return lo, hi


def open_recording(path: str | Path, **kw: Any) -> Recording:
    """Open and validate a recording directory (see :class:`Recording`)."""
    return Recording(path, **kw)
