"""IPMI BMC source: the System Event Log and the sensors, read with ``ipmitool`` over LAN (lanplus).

Each sample runs ``ipmitool -I lanplus -C 3 -H HOST -p PORT -U USER -E sel elist`` (an
argument list, never a shell; the password goes through the environment variable
``IPMI_PASSWORD`` that ``-E`` reads, never argv) and turns each new SEL entry into an event:
``source="bmc"``, ``kind="sel"``, ``code`` the SEL record id, extra columns ``sel_id``,
``sel_ts`` (the entry's time by the BMC's clock, None for ``Pre-Init``), ``sensor`` (``Power Supply
#0x01``), ``sensor_type`` (``Power Supply``), ``event_text`` (``Failure detected``), ``asserted``
(True / False / None), ``message`` the raw line.

The event's ``ts`` is the sample's, when this node read the entry, not the BMC's time: a BMC's
clock drifts, is often set to local time, and is unset before it boots; and the live pipeline
closes a tick ``allowed_lateness_s`` (30 s) after the fleet's telemetry passes it, so an entry
stamped by the BMC even a minute before the sample that read it (``bmc_interval_s``, 60 s) would
be dropped as late, its failure never counted.

No entry is read twice across restarts: the highest SEL id published is kept in a state
file (``state_file``, written atomically after each sample that saw new entries); a new
source reading the same file starts after it. A SEL whose highest id is below the stored
one was cleared by someone: it is read from its start again.

The first read without a stored position (a new install, the state file deleted, or none
configured) finds the node's history: a SEL keeps entries for months, and those the BMC logged
before its clock was set carry no date (``Pre-Init``), so their event would be stamped now. An old
power-supply failure read as a fresh one would drain a healthy node at install. So that read
publishes only the entries stamped within :data:`FIRST_READ_RECENT_S` of now; the rest are
history, counted in a warning and not published, and the next read starts after them. Entries
that come later are new, dated or not.

Then ``ipmitool sensor`` gives each sensor's reading with the BMC's thresholds; readings
become ``bmc_sensor`` events (see :mod:`collector.sources.bmc_common`). A BMC without
sensor records (``sensor`` fails) still has its SEL read; that is logged once.

``-C 3`` (RMCP+ with HMAC-SHA1 and AES-CBC-128, the suite every IPMI 2.0 BMC supports):
without it ipmitool first asks for the channel's cipher suites, which some BMCs
(OpenIPMI's ipmi_sim) never answer, and a sample then takes seconds of retries.

A BMC that does not answer (ipmitool's exit status, or the timeout) raises
:class:`TransientSourceError` and the source backs off (5 s doubling to 5 min).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
from calendar import timegm
from dataclasses import dataclass
from pathlib import Path
from time import strptime

from collector.bmc_events import parse_sel_line, sel_sensor_type
from collector.sources.base import (PermanentSourceError, Record, SourceBatch, SourceOptions,
                                    TransientSourceError)
from collector.sources.bmc_common import SourceBackoff, read_secret, sensor_event

log = logging.getLogger(__name__)

#: On the first read without a stored position, entries stamped within this many seconds of now are published
#: (a failure just before the agent started); older or undated ones are the node's history.
FIRST_READ_RECENT_S = 600.0


@dataclass(frozen=True)
class SelEntry:
    """One line of ``ipmitool sel elist``."""

    sel_id: int
    ts: float | None  # None for "Pre-Init" times (the BMC's clock was not set yet)
    sensor: str
    event_text: str
    asserted: bool | None
    line: str

    @property
    def sensor_type(self) -> str:
        """``Power Supply #0x01`` → ``Power Supply``."""
        return sel_sensor_type(self.sensor)


def parse_sel_elist(text: str) -> list[SelEntry]:
    """The entries of ``sel elist`` output; lines that are not entries (warnings, blanks) are skipped.

    Each line's columns are read by :func:`collector.bmc_events.parse_sel_line`; dates are
    ``MM/DD/YYYY`` and ``HH:MM:SS``, read as UTC; ``Pre-Init`` dates give ``ts`` None.
    """
    out = []
    for raw in text.splitlines():
        sel = parse_sel_line(raw)
        if sel is None:
            continue
        ts = None
        try:
            ts = float(timegm(strptime(f"{sel.date} {sel.time}", "%m/%d/%Y %H:%M:%S")))
        except ValueError:
            pass
        out.append(SelEntry(sel.sel_id, ts, sel.sensor, sel.event_text, sel.asserted, raw.strip()))
    return out


@dataclass(frozen=True)
class SensorReading:
    """One line of ``ipmitool sensor``: name, value, unit, status and the BMC's thresholds."""

    name: str
    value: float | None
    unit: str
    status: str | None
    thresholds: dict[str, float | None]


def _num(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def parse_sensor_list(text: str) -> list[SensorReading]:
    """``NAME | VALUE | UNIT | STATUS | LNR | LCR | LNC | UNC | UCR | UNR`` lines; ``na`` is None.

    Discrete sensors (value ``0x0``, unit ``discrete``) are skipped: they are not gauges.
    """
    out = []
    for raw in text.splitlines():
        parts = [p.strip() for p in raw.split("|")]
        if len(parts) < 10 or parts[2] == "discrete":
            continue
        lnr, lcr, lnc, unc, ucr, unr = (_num(p) for p in parts[4:10])
        out.append(SensorReading(parts[0], _num(parts[1]), parts[2], parts[3] or None,
                                 {"lower_fatal": lnr, "lower_critical": lcr, "lower_noncritical": lnc,
                                  "upper_noncritical": unc, "upper_critical": ucr, "upper_fatal": unr}))
    return out


def sensor_type_of(unit: str, name: str) -> str:
    """``temperature`` | ``fan`` | ``power_supply`` | ``voltage`` | ``power`` | ``other`` from unit and name."""
    u, n = unit.lower(), name.lower()
    if "degrees" in u:
        return "temperature"
    if "rpm" in u or "fan" in n:
        return "fan"
    if "psu" in n or "power supply" in n:
        return "power_supply"
    if "volts" in u:
        return "voltage"
    if "watts" in u:
        return "power"
    return "other"


class IpmiSource:
    """Reads a BMC's SEL (new entries only) and sensors through ``ipmitool`` over IPMI LAN."""

    name = "ipmi"

    def __init__(self, node: str, host: str, port: int = 623, user: str = "", password: str | None = None,
                 state_file: Path | None = None, timeout_s: float = 10.0, ipmitool: str = "ipmitool",
                 read_sensors: bool = True) -> None:
        self.node, self.host, self.port, self.user = node, host, port, user
        self._password = password
        self.state_file = Path(state_file) if state_file else None
        self.timeout_s = timeout_s
        self.ipmitool = ipmitool
        self.read_sensors = read_sensors
        self.backoff = SourceBackoff()
        self.last_id = self._load_state()
        #: No stored position: the first read's entries so far are history (module doc).
        self._first_read = self.state_file is None or not self.state_file.exists()
        self._sensor_warned = False

    @classmethod
    def from_options(cls, options: SourceOptions) -> "IpmiSource":
        """Build from ``bmc_host``, ``bmc_port``, ``bmc_user``, ``bmc_password_file`` (else $IPMI_PASSWORD)."""
        if not options.bmc_host:
            raise PermanentSourceError("ipmi source needs bmc_host (GPUOPS_AGENT_BMC_HOST or --bmc-host)")
        password = read_secret(options.bmc_password_file, "IPMI_PASSWORD", "ipmi source")
        return cls(options.node, options.bmc_host, options.bmc_port, options.bmc_user or "", password,
                   options.bmc_state_file, options.bmc_timeout_s)

    def _load_state(self) -> int:
        if self.state_file is None or not self.state_file.exists():
            return 0
        try:
            return int(json.loads(self.state_file.read_text())["last_sel_id"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise PermanentSourceError(f"ipmi source: state file {self.state_file} is unreadable ({e}); "
                                       f"fix or delete it (deleting starts after the SEL's present entries, "
                                       f"publishing only those of the last {FIRST_READ_RECENT_S:.0f} s)") from e

    def _save_state(self) -> None:
        if self.state_file is None:
            return
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.state_file.parent, prefix=".ipmi-state-")
        with os.fdopen(fd, "w") as f:
            json.dump({"last_sel_id": self.last_id, "bmc": f"{self.host}:{self.port}"}, f)
        os.replace(tmp, self.state_file)

    def run(self, *args: str) -> str:
        """stdout of one ``ipmitool`` command; :class:`TransientSourceError` when the BMC does not answer."""
        argv = [self.ipmitool, "-I", "lanplus", "-C", "3", "-H", self.host, "-p", str(self.port),
                "-U", self.user, "-E", *args]
        env = dict(os.environ)
        env["IPMI_PASSWORD"] = self._password or ""
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s, env=env,
                                  check=False)
        except FileNotFoundError as e:
            raise PermanentSourceError(f"ipmi source: {self.ipmitool!r} not found; install ipmitool "
                                       f"(apt-get install ipmitool)") from e
        except subprocess.TimeoutExpired as e:
            raise TransientSourceError(f"ipmi: BMC {self.host}:{self.port} did not answer "
                                       f"'{' '.join(args)}' within {self.timeout_s:g} s") from e
        if proc.returncode != 0:
            err = " ".join(proc.stderr.split())[:300]
            raise TransientSourceError(f"ipmi: '{' '.join(args)}' on BMC {self.host}:{self.port} failed "
                                       f"(exit {proc.returncode}): {err}")
        return proc.stdout

    def sample(self, now: float) -> SourceBatch:
        """Events for SEL entries newer than the last one read, then the sensor readings."""
        what = f"ipmi BMC {self.host}:{self.port}"
        self.backoff.check(now, what)
        try:
            entries = parse_sel_elist(self.run("sel", "elist"))
        except TransientSourceError:
            self.backoff.failed(now)
            raise
        self.backoff.ok()
        if entries and max(e.sel_id for e in entries) < self.last_id:
            log.warning("%s: SEL ids now end below %d: the SEL was cleared; reading it from its start",
                        what, self.last_id)
            self.last_id = 0
        new = [e for e in entries if e.sel_id > self.last_id]
        publish = new
        if self._first_read:
            publish = [e for e in new if e.ts is not None and abs(now - e.ts) <= FIRST_READ_RECENT_S]
            if len(publish) < len(new):
                log.warning("%s: first read of its SEL with no stored position (%s): %d entries older than %.0f s or "
                            "undated (Pre-Init) are the node's history and are not published; %d recent ones are",
                            what, self.state_file or "no bmc_state_file", len(new) - len(publish),
                            FIRST_READ_RECENT_S, len(publish))
            self._first_read = False
        events = [self.sel_event(e, now) for e in publish]
        if new:
            self.last_id = max(e.sel_id for e in new)
            self._save_state()
        if self.read_sensors:
            events.extend(self._sensor_events(now))
        return SourceBatch(events=events)

    def sel_event(self, e: SelEntry, now: float) -> Record:
        """The ``kind="sel"`` event of one SEL entry read at *now*: ``ts`` is *now*, when this node's clock saw it;
        the BMC's own time of the entry is ``sel_ts`` (None when undated)."""
        return {"ts": now, "node": self.node, "gpu": None, "source": "bmc",
                "kind": "sel", "code": e.sel_id if e.sel_id < 2**31 else None, "pci_bus_id": None,
                "sel_id": e.sel_id, "sel_ts": e.ts, "sensor": e.sensor, "sensor_type": e.sensor_type,
                "event_text": e.event_text, "asserted": e.asserted, "message": e.line}

    def _sensor_events(self, now: float) -> list[Record]:
        try:
            readings = parse_sensor_list(self.run("sensor"))
        except TransientSourceError as e:
            if not self._sensor_warned:
                log.warning("ipmi: sensors unreadable, reading the SEL only: %s", e)
                self._sensor_warned = True
            return []
        return [sensor_event(self.node, now, r.name, sensor_type_of(r.unit, r.name), r.value, r.unit, r.status,
                             r.thresholds, "ipmi") for r in readings]

    def close(self) -> None:
        """Nothing is held between samples (each runs ipmitool once)."""
