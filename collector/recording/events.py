"""A recording's events read by time window, so memory follows the window, not the file.

Since nodes report BMC sensor readings (five sensors a minute per node), ``events.jsonl``
grows ~2.8 MB per node-day: read whole into one DataFrame from a list of dicts, 64
node-days took ~3 CPU s and ~1 GB, and a 1,000-node-day recording would not fit.

spec/recording.md lets lines come in any order ("readers sort by ts"), so reading by
window is two passes over the file:

1. :func:`scan_events` keeps nothing per line: the range of the valid events' ``ts`` (the
   window grid starts there, as it did when the whole table was read) and the file's
   *lag*: the most a valid event's ``ts`` falls behind the largest ``ts`` read before
   it (0 for a file in time order, as our writer and the agent write it). A line is
   parsed and validated (:func:`collector.schema.validate_record`) only when it would
   move the range or the lag, or its ``ts`` is not the plain number it starts with. The
   file is read a block at a time, and a block of such lines is scanned in bulk
   (:mod:`.blocks`). A replay's few operator events are picked out in the same pass
   (:func:`scan_and_read_events`).
2. :class:`EventWindows` parses each line into the rows of its window and hands window
   *k* out once it has read a line ``lag`` seconds past the window's end: no later valid
   line can belong to it (a late invalid one is counted as rejected). It holds
   ``window_s + lag`` of events; a file out of order by more than :data:`MAX_REORDER_LAG_S`
   is read all the same, with a warning, since its windows stay open that long (at worst
   the whole file, as value tuples).

A window's rows are validated (:func:`collector.schema.validate_frame`) and sorted by
``ts``, stably: the same events in the same order as slicing the whole sorted table.
Fields outside the contract (BMC readings and thresholds, an operator event's
``nodes``/``start``/``end``/``reason``) are kept as columns; a field an event lacks reads as
null. :func:`read_events` reads the whole file, or only some sources and kinds.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Mapping

import numpy as np
import orjson
import pandas as pd

from collector.schema import RecordType, empty_frame, validate_frame, validate_record

from .blocks import iter_blocks, leading_ts
from .jsonl import iter_jsonl, parse_lines

log = logging.getLogger(__name__)

#: A file whose lines fall behind by more than this (s of telemetry time) is read with its
#: windows held open that long, possibly the whole file: logged as a warning. Writers that
#: merge per-node batches are out of order by seconds to minutes.
MAX_REORDER_LAG_S = 3600.0

def _is_ts(v: Any) -> bool:
    return (type(v) is float or type(v) is int) and math.isfinite(v)


@dataclass(frozen=True)
class EventScan:
    """What one pass over an events file learnt: valid events' ts range, lag, lines."""

    lo: float    # ts of the first valid event (inf when none)
    hi: float    # ts of the last valid event (-inf when none)
    lag: float   # most a valid event's ts is behind the largest ts before it, s (0: in time order)
    lines: int   # lines holding something (JSON objects, and lines that only look like one)


def scan_events(path: Path) -> EventScan:
    """One pass over *path*, nothing kept per line (see the module docstring).

    A line is parsed only when its ``ts`` cannot be read from its start (:func:`_leading_ts`)
    or it would move the range or the lag, so a file in time order costs a float per line
    (read a block at a time: :mod:`.blocks`).
    """
    return _scan(path, None)[0]


def _scan(path: Path, keep: Callable[[bytes], bool] | None) -> tuple[EventScan, list[tuple[int, bytes]]]:
    """:func:`scan_events`, and the (line number, line) of the lines *keep* passes."""
    st = _ScanState()
    kept: list[tuple[int, bytes]] = []
    for block in iter_blocks(path):
        if keep is not None and keep(block.raw):  # no line of a block without the words holds them
            kept.extend((block.first + i, ln) for i, ln in enumerate(block.lines) if keep(ln))
        ts = leading_ts(block)
        if ts is None:
            for ln in block.lines:
                st.line(ln)
        else:
            st.bulk(block.lines, ts)
    return EventScan(float(st.lo), float(st.hi), float(st.lag), st.n), kept


class _ScanState:
    """What :func:`scan_events` carries from line to line: valid events' range, largest ts, lag."""

    def __init__(self) -> None:
        self.lo, self.hi, self.top, self.lag, self.n = math.inf, -math.inf, -math.inf, 0.0, 0

    def line(self, line: bytes) -> None:
        obj = None
        ts = _leading_ts(line)
        if ts is None:
            obj = _loads(line)
            if obj is None:
                return
            ts = obj.get("ts")
            if not _is_ts(ts):
                self.n += 1
                return
        self.n += 1
        if ts >= self.top:
            self.top = ts
        elif self.top - ts > self.lag:  # a valid line this far behind: windows wait that long for it
            obj = obj or _loads(line)
            if _valid(obj):
                self.lag = max(self.lag, self.top - obj["ts"])
        if ts < self.lo or ts > self.hi:  # an extreme counts only if its event is valid
            obj = obj or _loads(line)
            if _valid(obj):
                self.lo, self.hi = min(self.lo, obj["ts"]), max(self.hi, obj["ts"])

    def bulk(self, lines: list[bytes], ts: np.ndarray) -> None:
        """Lines that all start with their ts (:func:`.blocks.leading_ts`): the same outcome as
        :meth:`line` on each in turn. The lag is the most a valid line falls behind the largest
        ts before it, and the range the extreme valid ts: only the candidates for those are
        parsed, the most extreme first, until one is valid."""
        self.n += len(lines)
        before = np.maximum.accumulate(np.concatenate(([self.top], ts[:-1])))
        behind = before - ts
        if (found := _valid_first(lines, behind, behind > self.lag)) is not None:
            self.lag = max(self.lag, float(before[found[0]]) - found[1]["ts"])
        if (found := _valid_first(lines, ts, ts > self.hi)) is not None:
            self.hi = max(self.hi, found[1]["ts"])
        if (found := _valid_first(lines, -ts, ts < self.lo)) is not None:
            self.lo = min(self.lo, found[1]["ts"])
        self.top = max(self.top, float(ts.max()))


def _valid_first(lines: list[bytes], key: np.ndarray, candidate: np.ndarray) -> tuple[int, dict[str, Any]] | None:
    """The candidate line with the largest *key* whose event is valid, and its event (None when
    no candidate is valid), trying candidates from the largest key down."""
    idx = np.flatnonzero(candidate)
    for i in idx[np.argsort(-key[idx], kind="stable")]:
        obj = _loads(lines[i])
        if _valid(obj):
            return int(i), obj
    return None


def _leading_ts(line: bytes) -> float | None:
    """The ts of a line that starts ``{"ts":<number>,`` and names ts once (as our writer and
    the agent write every event); ``None`` when it must be parsed to tell. A line that only
    looks so (not valid JSON) can only make the lag larger: windows wait longer, never less."""
    if line.startswith(b'{"ts":') and line.count(b'"ts"') == 1:
        end = line.find(b",", 6)
        if end > 0:
            try:
                ts = float(line[6:end])
            except ValueError:
                return None
            return ts if math.isfinite(ts) else None
    return None


def _loads(line: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _valid(obj: dict[str, Any] | None) -> bool:
    return obj is not None and _is_ts(obj.get("ts")) and validate_record(obj, RecordType.EVENT) is None


class EventColumns:
    """Events gathered for one frame, the frame's rows sorted by ts (stable: ties in arrival order).

    Events come in a few shapes (the same fields in the same order: a BMC reading, a SEL
    entry, an XID). Each row is kept as the tuple of its values under its shape, about half
    the memory of the dict it came from. A frame is one pandas construction from the tuples
    (read column by column in C, as pandas reads a list of dicts; rows of a shape lacking a
    field of the most common one are padded, one step per row), and the rows are put in
    order with one ``lexsort`` on (ts, arrival).
    """

    def __init__(self) -> None:
        self._shapes: dict[tuple[str, ...], tuple[list[int], list[tuple[Any, ...]]]] = {}
        self.n = 0

    def append(self, obj: Mapping[str, Any]) -> None:
        names = tuple(obj)
        shape = self._shapes.get(names)
        if shape is None:
            shape = self._shapes[names] = ([], [])
        shape[0].append(self.n)
        shape[1].append(tuple(obj.values()))
        self.n += 1

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame (not validated) sorted by ts, arrival order within a ts (a
        row whose ts is not a number goes last): a column per field any row has, null where a
        row lacks it; the contract's columns only when there are no rows."""
        if not self.n:
            return pd.DataFrame({c: [] for c in RecordType.EVENT.column_names})
        shapes = sorted(self._shapes.items(), key=lambda s: -len(s[1][0]))  # the most common first
        names = list(dict.fromkeys(k for shape, _ in shapes for k in shape))
        rows: list[tuple[Any, ...]] = []
        arrival: list[int] = []
        for shape, (pos, values) in shapes:
            arrival.extend(pos)
            if list(shape) == names[:len(shape)]:  # the same fields first: pad the others
                pad = (None,) * (len(names) - len(shape))
                rows.extend([v + pad for v in values] if pad else values)
            else:  # a rarer shape: one Python step per row
                where = [shape.index(k) if k in shape else -1 for k in names]
                rows.extend([tuple(v[i] if i >= 0 else None for i in where) for v in values])
        df = pd.DataFrame(rows, columns=names)  # pandas reads the tuples column by column in C
        key = _sort_key(df["ts"].to_numpy()) if "ts" in df.columns else np.zeros(self.n)
        order = np.lexsort((np.array(arrival), key))
        if (order[1:] > order[:-1]).all():
            return df
        return df.take(order).reset_index(drop=True)


def _sort_key(ts: np.ndarray) -> np.ndarray:
    """ts as float64 for ordering; a value that is not a number (a row to be rejected) as NaN."""
    if ts.dtype.kind in "fiu":
        return ts.astype(np.float64, copy=False)
    return np.array([float(v) if _is_ts(v) else np.nan for v in ts], dtype=np.float64)


def validated(cols: EventColumns, rejected: list[str]) -> pd.DataFrame:
    """*cols* validated against the contract and sorted by ts (stable); a reason for each row
    that breaks the contract is appended to *rejected*."""
    res = validate_frame(cols.frame(), RecordType.EVENT)  # keeps the frame's order: by ts, stable
    if res.n_rejected:
        rejected.extend(res.rejected["reason"].astype(str))
    return res.valid


def log_rejected(path: Path, bad_lines: list[str], rejected: list[str]) -> None:
    if bad_lines or rejected:
        log.warning("%s: %d event lines rejected (e.g. %s)", path, len(bad_lines) + len(rejected),
                    (bad_lines or rejected)[:1])


def read_events(path: Path, sources: Collection[str] | None = None, kinds: Collection[str] | None = None
                ) -> pd.DataFrame:
    """The events of *path* whose ``source`` is one of *sources* and whose ``kind`` is one of
    *kinds* (``None``: any), validated and sorted by ts. Rows left out never reach a frame,
    and a line that does not hold one of the names as a JSON string is not even parsed
    (JSON writers escape no letter, digit, ``_`` or ``-``, so such names are written as is)."""
    maybe, wanted = _selection(sources, kinds)
    bad: list[str] = []
    return _selected_frame(path, iter_jsonl(path, bad, maybe), wanted, bad)


def scan_and_read_events(path: Path, sources: Collection[str] | None = None,
                         kinds: Collection[str] | None = None) -> tuple[EventScan, pd.DataFrame]:
    """:func:`scan_events` and :func:`read_events` (*sources*, *kinds*) in one pass over the file:
    a replay needs the scan and the few operator events, and a second pass over a file of BMC
    readings cost as much as the scan."""
    maybe, wanted = _selection(sources, kinds)
    scan, kept = _scan(path, maybe or (lambda line: True))
    bad: list[str] = []
    return scan, _selected_frame(path, parse_lines(kept, bad), wanted, bad)


def _selection(sources: Collection[str] | None, kinds: Collection[str] | None
               ) -> tuple[Callable[[bytes], bool] | None, Callable[[dict[str, Any]], bool]]:
    """A test on a line's bytes that every wanted event passes (``None`` when it cannot be
    told from the bytes), and the test on the parsed event."""
    src = None if sources is None else frozenset(sources)
    knd = None if kinds is None else frozenset(kinds)
    groups = [g for g in (src, knd) if g is not None]
    needles = [[orjson.dumps(v) for v in g] for g in groups]
    plain = all(isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_.-]*", v) for g in groups for v in g)

    def maybe(line: bytes) -> bool:
        return all(any(x in line for x in group) for group in needles)

    def wanted(obj: dict[str, Any]) -> bool:
        return (src is None or obj.get("source") in src) and (knd is None or obj.get("kind") in knd)

    return (maybe if needles and plain else None), wanted


def _selected_frame(path: Path, objs: Any, wanted: Callable[[dict[str, Any]], bool], bad: list[str]
                    ) -> pd.DataFrame:
    """The *wanted* of *objs* as a validated frame sorted by ts; bad lines and rejections logged once."""
    cols = EventColumns()
    for obj in objs:
        if wanted(obj):
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

    def _outside(self, obj: Mapping[str, Any], ts: float, late: bool) -> None:
        """A line no window takes: before or after the range read (counted when invalid), or
        behind a window already handed out: invalid, or the file changed since it was scanned."""
        why = validate_record(obj, RecordType.EVENT)
        if why or late:
            self._rejected.append(why or f"ts {ts} out of time order by more than the scan found ({self.lag} s): "
                                         "file changed while read?")

    def window(self, k: int) -> pd.DataFrame:
        """The valid events of window *k*, sorted by ts (stable); *k* must follow the last one."""
        if k != self._next:
            raise ValueError(f"windows are read in order: asked for {k}, next is {self._next}")
        self._next = k + 1
        lo, w, lag, n_windows, top = self.lo, self.w, self.lag, self.n, self._top
        b = lo + (k + 1) * w
        if not self._eof and top - lag < b:
            self._eof = True  # unless a line past the window's end (plus lag) stops the read first
            for obj in self._lines:  # one step per line: kept lean (hundreds of thousands a day)
                ts = obj.get("ts")
                if not _is_ts(ts):
                    self._rejected.append(validate_record(obj, RecordType.EVENT) or "ts is not a finite number")
                    continue
                j = math.floor((ts - lo) / w)
                if ts < lo + j * w:  # the bounds exactly as the windows compute them
                    j -= 1
                elif ts >= lo + (j + 1) * w:
                    j += 1
                if j < k or j >= n_windows:  # outside the range read, or late: invalid (see the lag)
                    self._outside(obj, ts, 0 <= j < n_windows)
                else:
                    cols = self._open.get(j)
                    if cols is None:
                        cols = self._open[j] = EventColumns()
                    cols.append(obj)
                if ts > top:
                    top = ts
                    if top - lag >= b:
                        self._eof = False
                        break
            self._top = top
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
