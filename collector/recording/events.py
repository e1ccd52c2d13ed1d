"""A recording's events read by time window, so memory follows the window, not the file.

Since nodes report BMC sensor readings (five sensors a minute per node), ``events.jsonl``
grows ~2.8 MB per node-day: read whole into one DataFrame from a list of dicts, 64
node-days took ~2.8 CPU s and 1 GB, and a 1,000-node-day recording would not fit.

spec/recording.md lets lines come in any order ("readers sort by ts"), so reading by
window is two passes over the file, one JSON parse per line each:

1. :func:`scan_events` keeps nothing per line: the range of the valid events' ``ts`` (the
   window grid starts there, as it did when the whole table was read) and the file's
   *lag*: the most a valid event's ``ts`` falls behind the largest ``ts`` read before
   it (0 for a file in time order, as our writer and the agent write it). Validity is
   checked (:func:`collector.schema.validate_record`) only for a line that would move the
   range or the lag, so a file in time order costs no check per line.
2. :class:`EventWindows` gathers each line into the column lists of its window and hands
   window *k* out once it has read a line ``lag`` seconds past the window's end: no later
   valid line can belong to it (a late invalid one is counted as rejected). It holds
   ``window_s + lag`` of events; a file out of order by more than :data:`MAX_REORDER_LAG_S`
   is read all the same, with a warning, since its windows stay open that long (at worst
   the whole file, as columns).

A window's rows are validated (:func:`collector.schema.validate_frame`) and sorted by
``ts``, stably: the same events in the same order as slicing the whole sorted table.
Frames are built from column lists (:class:`EventColumns`), numbers and strings straight
into arrays, so only odd columns (lists, booleans, mixed types) go through pandas'
per-value inference; fields outside the contract (BMC readings and thresholds, an operator
event's ``nodes``/``start``/``end``) are kept as columns, a field an event lacks reads as null.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from collector.schema import RecordType, empty_frame, validate_frame, validate_record

from .jsonl import iter_jsonl

log = logging.getLogger(__name__)

#: A file whose lines fall behind by more than this (s of telemetry time) is read with its
#: windows held open that long, possibly the whole file: logged as a warning. Writers that
#: merge per-node batches are out of order by seconds to minutes.
MAX_REORDER_LAG_S = 3600.0

_NONE = type(None)


def _is_ts(v: Any) -> bool:
    return (type(v) is float or type(v) is int) and math.isfinite(v)


@dataclass(frozen=True)
class EventScan:
    """What one pass over an events file learnt: valid events' ts range, lag, lines."""

    lo: float    # ts of the first valid event (inf when none)
    hi: float    # ts of the last valid event (-inf when none)
    lag: float   # most a line's ts is behind the largest ts before it, s (0: in time order)
    lines: int   # JSON objects read


def scan_events(path: Path) -> EventScan:
    """One pass over *path*, nothing kept per line (see the module docstring)."""
    lo, hi, top, lag, n = math.inf, -math.inf, -math.inf, 0.0, 0
    for obj in iter_jsonl(path, []):
        n += 1
        ts = obj.get("ts")
        if not _is_ts(ts):
            continue
        if ts >= top:
            top = ts
        elif top - ts > lag and validate_record(obj, RecordType.EVENT) is None:
            lag = top - ts  # a line the contract rejects anyway need not be waited for
        # an extreme counts only if the event is valid (validated only then: rarely in a sorted file)
        if (ts < lo or ts > hi) and validate_record(obj, RecordType.EVENT) is None:
            lo, hi = min(lo, ts), max(hi, ts)
    return EventScan(float(lo), float(hi), float(lag), n)


class EventColumns:
    """Events gathered as one list per field (first-seen order), rows in arrival order."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {}
        self.n = 0

    def append(self, obj: Mapping[str, Any]) -> None:
        n, cols = self.n, self.cols
        for k, v in obj.items():
            col = cols.get(k)
            if col is None:
                col = cols[k] = [None] * n
            elif len(col) < n:  # fields the last rows lacked
                col.extend([None] * (n - len(col)))
            col.append(v)
        self.n = n + 1

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame (not validated); contract columns only when there are none."""
        if not self.n:
            return pd.DataFrame({c: [] for c in RecordType.EVENT.column_names})
        for col in self.cols.values():
            if len(col) < self.n:
                col.extend([None] * (self.n - len(col)))
        return pd.DataFrame({k: _array(v) for k, v in self.cols.items()}, copy=False)


def _array(values: list[Any]) -> Any:
    """A column list as an array without per-value inference where its types allow: numbers
    (null as NaN; integers without null stay integers), strings (object); else the list."""
    types = set(map(type, values))
    has_null = _NONE in types
    types.discard(_NONE)
    if types <= {str}:
        return np.array(values, dtype=object)
    if types == {float} or types == {int, float} or (types == {int} and has_null):
        return np.array(values, dtype=np.float64)
    if types == {int}:
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            return values
    return values  # booleans, lists, objects, mixed: as pandas reads them


def validated(cols: EventColumns, rejected: list[str]) -> pd.DataFrame:
    """*cols* validated against the contract and sorted by ts (stable); a reason for each row
    that breaks the contract is appended to *rejected*."""
    res = validate_frame(cols.frame(), RecordType.EVENT)
    if res.n_rejected:
        rejected.extend(res.rejected["reason"].astype(str))
    valid = res.valid
    ts = valid["ts"].to_numpy()
    if len(ts) > 1 and not (ts[1:] >= ts[:-1]).all():
        valid = valid.sort_values("ts", kind="stable")
    return valid.reset_index(drop=True)


def log_rejected(path: Path, bad_lines: list[str], rejected: list[str]) -> None:
    if bad_lines or rejected:
        log.warning("%s: %d event lines rejected (e.g. %s)", path, len(bad_lines) + len(rejected),
                    (bad_lines or rejected)[:1])


def read_events(path: Path, keep: Callable[[Mapping[str, Any]], bool] | None = None) -> pd.DataFrame:
    """The events of *path* for which *keep* (on the raw object) is true, all when ``None``:
    validated and sorted by ts. Rows left out are never put in a frame."""
    cols, bad = EventColumns(), []
    for obj in iter_jsonl(path, bad):
        if keep is None or keep(obj):
            cols.append(obj)
    rejected: list[str] = []
    out = validated(cols, rejected)
    log_rejected(path, bad, rejected)
    return out


class EventWindows:
    """Window *k* ``[lo + k·w, lo + (k+1)·w)`` of an events file, for k = 0, 1, … in order
    (one streaming pass; see the module docstring). Call :meth:`close` when done."""

    def __init__(self, path: Path, scan: EventScan, lo: float, window_s: float, n_windows: int) -> None:
        self.path, self.lo, self.w, self.n, self.lag = path, lo, window_s, n_windows, scan.lag
        if scan.lag > MAX_REORDER_LAG_S:
            log.warning("%s: lines out of time order by up to %.0f s (over %.0f s): each window's events are "
                        "held until a line %.0f s past its end is read, at worst the whole file",
                        path, scan.lag, MAX_REORDER_LAG_S, scan.lag)
        self._bad: list[str] = []
        self._rejected: list[str] = []
        self._lines = iter_jsonl(path, self._bad)
        self._open: dict[int, EventColumns] = {}
        self._top = -math.inf  # largest ts read
        self._next = 0         # the window asked for next
        self._eof = False

    @property
    def held(self) -> int:
        """Events read and not handed out yet (what this reader holds in memory)."""
        return sum(c.n for c in self._open.values())

    def _index(self, ts: float) -> int:
        """The window of *ts*, with the bounds computed as :meth:`window` computes them."""
        lo, w = self.lo, self.w
        j = math.floor((ts - lo) / w)
        if ts < lo + j * w:
            j -= 1
        elif ts >= lo + (j + 1) * w:
            j += 1
        return j

    def window(self, k: int) -> pd.DataFrame:
        """The valid events of window *k*, sorted by ts (stable); *k* must follow the last one."""
        if k != self._next:
            raise ValueError(f"windows are read in order: asked for {k}, next is {self._next}")
        self._next = k + 1
        b = self.lo + (k + 1) * self.w
        while not self._eof and self._top - self.lag < b:
            obj = next(self._lines, None)
            if obj is None:
                self._eof = True
                break
            ts = obj.get("ts")
            if not _is_ts(ts):
                self._rejected.append(validate_record(obj, RecordType.EVENT) or "ts is not a finite number")
                continue
            self._top = max(self._top, ts)
            j = self._index(ts)
            if j < k or j >= self.n:  # outside the range read, or late: invalid (see the lag)
                why = validate_record(obj, RecordType.EVENT)
                if why or j >= 0 and j < self.n:
                    self._rejected.append(why or f"ts {ts} out of time order by more than the file's scan found "
                                                 f"({self.lag} s): changed while read?")
                continue
            cols = self._open.get(j)
            if cols is None:
                cols = self._open[j] = EventColumns()
            cols.append(obj)
        cols = self._open.pop(k, None)
        if cols is None:
            return empty_frame(RecordType.EVENT)
        return validated(cols, self._rejected)

    def close(self) -> None:
        """Stop reading; log the lines rejected so far (once, as the whole read does)."""
        self._lines.close()
        self._open.clear()
        log_rejected(self.path, self._bad, self._rejected)
        self._bad, self._rejected = [], []
