"""Kernel-log source: ``NVRM: Xid`` and ``SXid`` lines become events (spec §3).

It follows ``/dev/kmsg`` (one record per read, ``prio,seq,usec,flags;message``) or a
plain log file written by ``dmesg`` / syslog, in any of the formats seen on GPU nodes:
``[ 123.456789] …``, ``[Sun Feb 23 16:24:18 2025] …``, ISO (``2024-11-15T12:02:03,470068+00:00 …``),
``dmesg --decode`` (``kern  :warn  : <iso> …``). Following a file survives rotation (the
path now names another inode: the old file is read to its end, then the new one from
its start) and truncation (size below our offset: start again), and buffers a partial
last line until its newline arrives. :mod:`collector.sources.logtail` does the reading.

Each event: ``kind`` ``xid`` or ``sxid``, ``code``, ``pci_bus_id`` as written in the line,
``gpu`` resolved through the PCI bus id → index map (NVML's, else sysfs PCI order),
``message`` the raw line unchanged, ``source`` ``kmsg``. ``ts`` is the line's own time
when it has one (absolute, or boot time + seconds since boot), else the sample time.

Bounds: nothing parsed from a line can overflow the contract's columns or stop the
source. A code above :data:`MAX_XID_CODE` (XIDs are below 200, SXids five digits) keeps
its event with ``code`` null, so the raw line still reaches people while consumers,
which use only events with a code, ignore it. A time that is not a plausible number (a
``[`` timestamp beyond :data:`MAX_SINCE_BOOT_S`, a date ``mktime`` cannot represent)
is dropped and the sample time used. A line longer than :data:`MAX_LINE_CHARS` is not
one kernel record and is rejected. Each of these is counted by reason in
``KmsgSource.problems`` and logged (the first time, then every 100th).
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Mapping

from collector.sources.base import (PermanentSourceError, Record, SourceBatch, SourceOptions,
                                    TransientSourceError, normalize_pci_bus_id)
from collector.sources.logtail import LogFollower

log = logging.getLogger(__name__)

DEV_KMSG = Path("/dev/kmsg")

_XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?)\): "
                     r"(?P<code>\d+)")
_SXID_RE = re.compile(r"SXid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?)\): "
                      r"(?P<code>\d+)")
_KMSG_RE = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;")
_MONO_RE = re.compile(r"^\[\s*(?P<s>\d+\.\d+)\]")
_CTIME_RE = re.compile(r"^\[(?P<t>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\]")
_ISO_RE = re.compile(r"^(?P<t>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:[+-]\d\d:?\d\d|Z)?)")
_DECODE_RE = re.compile(r"^[a-z]+\s*:[a-z]+\s*: ")

#: Largest XID / SXid code kept: XIDs are below 200 and SXids have five digits today, so
#: anything above 16 bits is a corrupt line (its event keeps ``code`` null). Well inside
#: the contract's int32 ``code`` column.
MAX_XID_CODE = 0xFFFF
#: Longest line parsed: printk records are under 1 KiB, so a longer "line" is not one kernel
#: record, and its event would not fit Kafka's 1 MiB message limit anyway.
MAX_LINE_CHARS = 16 * 1024
#: Largest seconds-since-boot taken from a line (100 years); beyond it the sample time is used.
MAX_SINCE_BOOT_S = 100 * 365.25 * 86400.0


@dataclass(frozen=True)
class XidLine:
    """What one kernel line says about an XID / SXid."""

    kind: str  # "xid" | "sxid"
    code: int | None  # None when the line's number is above MAX_XID_CODE
    pci_bus_id: str
    ts: float | None  # absolute time from the line, if it has one
    since_boot_s: float | None  # kernel monotonic time, if that is all it has
    problem: str | None = None  # why ``code`` is None, if it is


def parse_xid_line(line: str) -> XidLine | None:
    """An :class:`XidLine` for an ``NVRM: Xid`` / ``SXid`` line, else ``None``.

    Never raises, whatever the line; a code above :data:`MAX_XID_CODE` gives ``code``
    None and says so in ``problem``.
    """
    m = _XID_RE.search(line)
    kind = "xid"
    if m is None:
        m = _SXID_RE.search(line)
        kind = "sxid"
        if m is None:
            return None
    ts, mono = line_time(line)
    code = parse_code(m.group("code"))
    problem = None if code is not None else f"{kind} code above {MAX_XID_CODE}"
    return XidLine(kind, code, m.group("pci"), ts, mono, problem)


def parse_code(digits: str) -> int | None:
    """The code written as ASCII *digits*, or ``None`` above :data:`MAX_XID_CODE`.

    The length is checked before ``int``: a line of a million digits neither overflows
    anything downstream nor meets Python's 4,300-digit ``int`` limit.
    """
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(MAX_XID_CODE)):
        return None
    code = int(significant)
    return code if code <= MAX_XID_CODE else None


def _since_boot(text: str, scale: float) -> float | None:
    """``float(text) * scale`` if finite and within [0, MAX_SINCE_BOOT_S], else None."""
    v = float(text) * scale  # [0-9.] text: float() gives inf for huge values, never raises
    return v if math.isfinite(v) and 0.0 <= v <= MAX_SINCE_BOOT_S else None


def line_time(line: str) -> tuple[float | None, float | None]:
    """(absolute epoch seconds, seconds since boot) carried by a log line; either may be None.

    A time that is out of range (see the module doc) is None; this never raises.
    """
    s = line.lstrip("> ")
    m = _KMSG_RE.match(s)
    if m:
        return None, _since_boot(m.group("usec"), 1e-6)
    s = _DECODE_RE.sub("", s, count=1)
    m = _MONO_RE.match(s)
    if m:
        return None, _since_boot(m.group("s"), 1.0)
    m = _ISO_RE.match(s)
    if m:
        try:
            dt = datetime.fromisoformat(m.group("t").replace(",", "."))
            if dt.tzinfo is None:  # dmesg prints local time without an offset only in odd setups
                return time.mktime(dt.timetuple()) + dt.microsecond / 1e6, None
            return dt.timestamp(), None
        except (ValueError, OverflowError, OSError):  # a date the platform's time_t cannot hold
            return None, None
    m = _CTIME_RE.match(s)
    if m:  # dmesg -T: the host's local time
        try:
            return time.mktime(time.strptime(m.group("t"), "%a %b %d %H:%M:%S %Y")), None
        except (ValueError, OverflowError, OSError):
            return None, None
    return None, None


def boot_time(proc_root: Path = Path("/proc")) -> float | None:
    """Boot time (epoch s) from ``/proc/stat`` ``btime``; ``None`` if unreadable."""
    try:
        for line in (proc_root / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except OSError:
        return None
    return None


def gpu_index_from_sysfs(sysfs_root: Path = Path("/sys")) -> dict[str, int]:
    """PCI bus id → GPU index for NVIDIA display/3D controllers, in PCI order (NVML's default)."""
    devices = Path(sysfs_root) / "bus" / "pci" / "devices"
    found = []
    try:
        names = sorted(os.listdir(devices))
    except OSError:
        return {}
    for name in names:
        try:
            vendor = (devices / name / "vendor").read_text().strip()
            klass = (devices / name / "class").read_text().strip()
        except OSError:
            continue
        if vendor == "0x10de" and klass[:6] in ("0x0300", "0x0302"):
            found.append(normalize_pci_bus_id(name))
    return {bus: i for i, bus in enumerate(found)}


class KmsgSource:
    """Turns XID / SXid kernel lines into events; follows ``/dev/kmsg`` or a log file."""

    name = "kmsg"

    def __init__(self, node: str, path: Path = DEV_KMSG, *, from_start: bool = False,
                 gpu_index_by_pci: Mapping[str, int] | None = None, boot_ts: float | None = None,
                 max_bytes_per_sample: int = 8 * 2**20, drain: bool = False) -> None:
        self.node = node
        self.drain = drain  # read everything available on each sample (``--once``)
        self.path = Path(path)
        self.gpu_index_by_pci = {normalize_pci_bus_id(k): v for k, v in (gpu_index_by_pci or {}).items()}
        self.boot_ts = boot_ts
        try:
            self._follower = LogFollower(self.path, from_start=from_start,
                                         max_bytes_per_read=max_bytes_per_sample)
        except OSError as e:
            raise PermanentSourceError(
                f"kmsg source cannot open {self.path}: {e.strerror or e}; run as root (or with "
                f"CAP_SYSLOG) for /dev/kmsg, or pass --kmsg-file PATH") from e
        self.lines_seen = 0
        #: Lines rejected or kept with fields dropped, by reason (see the module doc).
        self.problems: Counter[str] = Counter()

    @classmethod
    def from_options(cls, options: SourceOptions) -> "KmsgSource":
        """Build from agent options: ``--kmsg-file`` (else /dev/kmsg); ``--once`` reads it all."""
        path = options.kmsg_path or DEV_KMSG
        index = options.gpu_index_by_pci or gpu_index_from_sysfs(options.sysfs_root)
        return cls(options.node, path, from_start=options.once or options.kmsg_from_start,
                   gpu_index_by_pci=index, boot_ts=boot_time() if path == DEV_KMSG else None,
                   drain=options.once)

    def sample(self, now: float) -> SourceBatch:
        """Events for every XID / SXid line written since the last sample."""
        try:
            lines = self._follower.read_all(include_partial=True) if self.drain else self._follower.read_lines()
        except OSError as e:
            raise TransientSourceError(f"kmsg: reading {self.path} failed: {e}") from e
        self.lines_seen += len(lines)
        events = [ev for ev in (self.event(line, now) for line in lines) if ev is not None]
        return SourceBatch(events=events)

    def event(self, line: str, now: float) -> Record | None:
        """The event record for one kernel line, or ``None`` if it is not an XID / SXid.

        Never raises; lines out of bounds are counted in :attr:`problems` (module doc).
        """
        if len(line) > MAX_LINE_CHARS:
            if "Xid (" in line:
                self._problem(f"line longer than {MAX_LINE_CHARS} characters", line)
            return None
        x = parse_xid_line(line)
        if x is None:
            return None
        if x.problem:
            self._problem(x.problem, line)
        ts = x.ts
        if ts is None:
            ts = self.boot_ts + x.since_boot_s if (self.boot_ts and x.since_boot_s is not None) else now
            if not math.isfinite(ts):
                ts = now
        gpu = self.gpu_index_by_pci.get(normalize_pci_bus_id(x.pci_bus_id)) if x.kind == "xid" else None
        return {"ts": ts, "node": self.node, "gpu": gpu, "source": "kmsg", "kind": x.kind,
                "code": x.code, "pci_bus_id": x.pci_bus_id, "message": _utf8(line)}

    def _problem(self, reason: str, line: str) -> None:
        self.problems[reason] += 1
        n = self.problems[reason]
        if n == 1 or n % 100 == 0:
            log.warning("kmsg: %s (%d so far): %.200r", reason, n, line)

    def close(self) -> None:
        """Close the followed file."""
        self._follower.close()


def _utf8(line: str) -> str:
    """*line*, with anything that is not encodable as UTF-8 (lone surrogates) replaced."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return line.encode("utf-8", "replace").decode("utf-8")
    return line

