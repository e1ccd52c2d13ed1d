"""InfiniBand / RoCE source: port counters and states from ``/sys/class/infiniband``.

For every ``<sysfs_root>/class/infiniband/<device>/ports/<port>/`` it reads ``state``
(``4: ACTIVE`` → ``ACTIVE``), ``phys_state`` (``5: LinkUp`` → ``LinkUp``), ``rate``
(``400 Gb/sec (4X NDR)`` → 400.0), every counter of spec §2 from ``counters/`` (a
missing or unreadable file is ``None``, never 0), and every file of ``hw_counters/``
(RoCE: ``out_of_sequence``, ``np_cnp_sent`` …) as an extra counter column. The ports and
their files are listed once at start-up (file paths built once: this source reads ~50
files per port per tick) and again whenever a port directory disappears or every
``rescan_every`` samples, so hot-plugged HCAs are picked up without a restart.

Bounds: a port directory must be named by ASCII digits that fit the int16 ``port``
column, else it is skipped; a counter or rate no float column can hold (a number
beyond float64, garbage such as ``1.2.3 Gb/sec``) reads as ``None``. Nothing read from
sysfs text fails the sample.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from collector.schema import IB_COUNTERS
from collector.sources.base import (INT_RANGES, PermanentSourceError, Record, SourceBatch, SourceOptions,
                                    within_column)

log = logging.getLogger(__name__)

_RATE_RE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")
_PORT_RE = re.compile(r"[0-9]{1,5}")
_IB_COUNTER_SET = frozenset(IB_COUNTERS)
_PORT_KEYS = frozenset({"ts", "node", "device", "port", "link_state", "phys_state", "rate_gbps"})


def _read(path: str) -> str | None:
    """A sysfs attribute's text (one ``read``: sysfs files are small); ``None`` if unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).decode("utf-8", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)


def parse_state(text: str | None) -> str | None:
    """``4: ACTIVE`` → ``ACTIVE``; ``5: LinkUp`` → ``LinkUp``; a bare name stays as is."""
    if not text:
        return None
    return text.split(":", 1)[1].strip() if ":" in text else text.strip()


def parse_rate_gbps(text: str | None) -> float | None:
    """``400 Gb/sec (4X NDR)`` → 400.0; ``2.5 Gb/sec (1X SDR)`` → 2.5; garbage → None."""
    m = _RATE_RE.match(text or "")
    if m is None:
        return None
    try:
        return within_column(float(m.group(1)), "float32")
    except ValueError:  # "1.2.3"
        return None


def parse_counter(text: str | None) -> float | None:
    """A counter file's value; ``None`` for a missing file or a non-number (``N/A (no PMA)``)."""
    if text is None:
        return None
    try:
        return float(int(text.split()[0], 0)) if text else None
    except (ValueError, OverflowError):  # not a number; beyond float64 (or Python's 4,300 digits)
        return None


class InfinibandSource:
    """Reads every HCA port under ``<sysfs_root>/class/infiniband`` (one row per port per tick)."""

    name = "infiniband"

    def __init__(self, node: str, sysfs_root: Path = Path("/sys"), rescan_every: int = 60) -> None:
        self.node = node
        self.base = Path(sysfs_root) / "class" / "infiniband"
        if not self.base.is_dir():
            raise PermanentSourceError(
                f"infiniband source: {self.base} does not exist (no RDMA devices, or the IB "
                f"kernel modules are not loaded); point --sysfs-root at a sysfs tree or leave "
                f"infiniband out of --sources")
        self.rescan_every = rescan_every
        self._ports = self._scan()
        self._samples = 0

    @classmethod
    def from_options(cls, options: SourceOptions) -> "InfinibandSource":
        """Build from agent options (``--sysfs-root``)."""
        return cls(node=options.node, sysfs_root=options.sysfs_root)

    def _scan(self) -> list[tuple[str, int, str, list[tuple[str, str]]]]:
        """(device, port, port dir, [(column, file path)]) for every port; paths built once here."""
        ports = []
        for dev in sorted(os.listdir(self.base)):
            pdir = self.base / dev / "ports"
            try:
                names = os.listdir(pdir)
            except OSError:
                continue
            for p in sorted((n for n in names if _PORT_RE.fullmatch(n) and int(n) <= INT_RANGES["int16"][1]),
                            key=int):
                path = pdir / p
                files = [(name, str(path / "counters" / name)) for name in IB_COUNTERS]
                try:
                    hw_names = sorted(os.listdir(path / "hw_counters"))
                except OSError:
                    hw_names = []
                files += [(name, str(path / "hw_counters" / name)) for name in hw_names
                          if name not in _IB_COUNTER_SET and name not in _PORT_KEYS]
                ports.append((dev, int(p), str(path), files))
        return ports

    @property
    def ports(self) -> list[tuple[str, int]]:
        """(device, port) pairs currently sampled."""
        return [(d, p) for d, p, _, _ in self._ports]

    def sample(self, now: float) -> SourceBatch:
        """One row per port; a port whose directory vanished triggers a rescan."""
        self._samples += 1
        if self._samples % self.rescan_every == 0:
            self._ports = self._scan()
        rows = []
        vanished = False
        for dev, port, path, files in self._ports:
            row = self._read_port(dev, port, path, files, now)
            if row is None:
                vanished = True
                continue
            rows.append(row)
        if vanished:
            self._ports = self._scan()
        return SourceBatch(net=rows)

    def _read_port(self, dev: str, port: int, path: str, files: list[tuple[str, str]],
                   now: float) -> Record | None:
        state = _read(path + "/state")
        if state is None and not os.path.isdir(path):
            return None
        row: Record = {
            "ts": now, "node": self.node, "device": dev, "port": port,
            "link_state": parse_state(state),
            "phys_state": parse_state(_read(path + "/phys_state")),
            "rate_gbps": parse_rate_gbps(_read(path + "/rate")),
        }
        for name, fpath in files:
            row[name] = parse_counter(_read(fpath))
        return row

    def close(self) -> None:
        """Nothing to release: files are opened and closed per read."""
