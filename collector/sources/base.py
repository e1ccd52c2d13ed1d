"""The source contract: one ``sample(now)`` method, a batch of records, errors, a registry.

A source reads one kind of hardware (NVML, InfiniBand sysfs, the kernel log, a
dcgm-exporter scrape, the simulator) and returns a :class:`SourceBatch` of plain
dicts whose keys are the column names of ``collector.schema`` (GPU samples §1,
network port samples §2, events §3). Sources never talk to Kafka and never decide
anything; the agent (``collector.agent``) owns timing, buffering and publishing.

Sources are picked by name from :data:`SOURCES`; each class builds itself from
:class:`SourceOptions` (``from_options``), so the agent needs no per-source code.
An unknown name fails at start-up with the list of valid names.

Errors: :class:`PermanentSourceError` (cannot work on this host as configured: no
driver, no sysfs tree, unreadable log) fails start-up; :class:`TransientSourceError`
(one scrape timed out, the log is mid-rotation) is logged, counted and retried on the
next tick while the other sources keep publishing.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol, runtime_checkable

Record = dict[str, Any]


class SourceError(Exception):
    """Base of every error a source raises on purpose."""


class PermanentSourceError(SourceError):
    """The source cannot work on this host as configured; retrying will not help."""


class TransientSourceError(SourceError):
    """This sample failed; the next one may work. ``retry_after_s`` is a hint, not a promise."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UnknownSourceError(PermanentSourceError):
    """A source name that is not in :data:`SOURCES`."""


@dataclass
class SourceBatch:
    """What one source saw at one sampling time: GPU rows, port rows, events.

    Rows carry ``ts`` and ``node``; column names are those of ``collector.schema``.
    """

    gpu: list[Record] = field(default_factory=list)
    net: list[Record] = field(default_factory=list)
    events: list[Record] = field(default_factory=list)

    def extend(self, other: "SourceBatch") -> None:
        """Append *other*'s rows to this batch (used to merge sources per tick)."""
        self.gpu.extend(other.gpu)
        self.net.extend(other.net)
        self.events.extend(other.events)

    def __len__(self) -> int:
        return len(self.gpu) + len(self.net) + len(self.events)


@runtime_checkable
class Source(Protocol):
    """A telemetry source. ``sample`` must be cheap: it runs on every tick of a GPU node."""

    name: str

    def sample(self, now: float) -> SourceBatch:
        """Read the hardware once; *now* is the sample time (s since the epoch, UTC)."""
        ...

    def close(self) -> None:
        """Release file handles / library state; safe to call twice."""
        ...


@dataclass(frozen=True)
class SourceOptions:
    """Everything a source may need to build itself (filled from ``AgentSettings``).

    ``once`` means one pass over everything available (``gpuops agent --once``): the
    kernel-log source then reads its whole file instead of starting at its end.
    ``gpu_index_by_pci`` maps a normalised PCI bus id (``0000:3b:00``) to a GPU index;
    the agent fills it from NVML when that source runs, else from sysfs.
    """

    node: str
    sysfs_root: Path = Path("/sys")
    kmsg_path: Path | None = None
    dcgm_url: str | None = None
    dcgm_timeout_s: float = 2.0
    once: bool = False
    kmsg_from_start: bool = False
    gpu_index_by_pci: Mapping[str, int] = field(default_factory=dict)
    bmc_host: str | None = None
    bmc_port: int = 623
    bmc_user: str | None = None
    bmc_password_file: Path | None = None
    bmc_state_file: Path | None = None
    bmc_timeout_s: float = 10.0
    redfish_url: str | None = None
    redfish_user: str | None = None
    redfish_password_file: Path | None = None
    redfish_ca_file: Path | None = None
    redfish_tls_verify: bool = True
    redfish_skip_chassis: tuple[str, ...] = ()


#: Source name → "module:Class". Imported lazily so that ``gpuops agent --sources
#: infiniband`` never imports pynvml. A new source adds one line here.
SOURCES: dict[str, str] = {
    "nvml": "collector.sources.nvml:NvmlSource",
    "infiniband": "collector.sources.infiniband:InfinibandSource",
    "kmsg": "collector.sources.kmsg:KmsgSource",
    "dcgm": "collector.sources.dcgm:DcgmSource",
    "simulated": "collector.sources.simulated:SimulatedSource",
    "ipmi": "collector.sources.ipmi:IpmiSource",
    "redfish": "collector.sources.redfish:RedfishSource",
}


def source_class(name: str) -> Any:
    """The class registered under *name*; :class:`UnknownSourceError` lists the valid names."""
    try:
        target = SOURCES[name]
    except KeyError:
        raise UnknownSourceError(
            f"unknown source {name!r}; valid sources: {', '.join(sorted(SOURCES))}") from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def build_sources(names: list[str], options: SourceOptions) -> list[Source]:
    """Build every named source; the first that cannot start raises (start-up fails fast).

    Names are checked before anything is built, so a typo never half-starts the agent.
    Sources already built are closed when a later one fails.
    """
    classes = [(n, source_class(n)) for n in names]
    built: list[Source] = []
    try:
        for name, cls in classes:
            built.append(cls.from_options(options))
    except BaseException:
        for s in built:
            s.close()
        raise
    return built


def normalize_pci_bus_id(bus_id: str) -> str:
    """``00000000:3B:00.0`` / ``0000:3b:00`` / ``3b:00.0`` → ``0000:3b:00`` (domain:bus:device).

    Kernel XID lines name a GPU by ``domain:bus:device`` without the function; NVML
    pads the domain to 8 digits and adds ``.function``. One key form lets them meet.
    """
    s = bus_id.strip().lower()
    s = s.split(".", 1)[0]
    parts = s.split(":")
    if len(parts) == 2:
        parts = ["0000"] + parts
    if len(parts) != 3:
        return s
    domain, bus, dev = parts
    try:
        return f"{int(domain, 16):04x}:{bus.zfill(2)}:{dev.zfill(2)}"
    except ValueError:  # not hex (a stray sysfs name): left as is, it matches nothing
        return s


def read_text(path: Path) -> str | None:
    """Contents of a small sysfs / procfs file, stripped; ``None`` if absent or unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", errors="replace").strip()
    except OSError:
        return None


#: Inclusive range of every integer dtype of the contract (spec/telemetry.md).
INT_RANGES: dict[str, tuple[int, int]] = {"int16": (-(2**15), 2**15 - 1), "int32": (-(2**31), 2**31 - 1),
                                          "int64": (-(2**63), 2**63 - 1)}
_FLOAT32_MAX = 3.4028234663852886e38


def within_column(value: float | int | None, dtype: str) -> float | int | None:
    """*value* unchanged if a contract column of *dtype* holds it, else ``None``; never raises.

    Sources parse numbers from text (a scrape, a sysfs file); a number no column can hold
    (beyond int16/int32/int64, float32, or not finite) is "unknown", never a reason to fail
    the sample or a cast downstream.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if dtype in INT_RANGES:
        lo, hi = INT_RANGES[dtype]
        return value if lo <= value <= hi else None  # int/float comparison is exact in Python
    if dtype == "float32":
        return value if abs(value) <= _FLOAT32_MAX else None
    if dtype == "float64" and isinstance(value, int):
        return value if abs(value) < 2**1023 else None
    return value
