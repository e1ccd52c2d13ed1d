"""Redfish BMC source: each chassis' Thermal (temperatures, fans) and Power (PSUs) as sensor events.

``GET {url}/redfish/v1/Chassis``, then for each member its ``Thermal`` and, where linked,
``Power`` resource (urllib, HTTP basic auth when a user is set, a timeout on every request).
Readings become ``bmc_sensor`` events with the BMC's own thresholds
(:mod:`collector.sources.bmc_common`): temperatures from ``ReadingCelsius`` and
``Upper/LowerThreshold*``; fans from ``Reading`` (``ReadingUnits``) and their thresholds;
power supplies from ``Status.Health`` (``status``; value ``LastPowerOutputWatts``), and
each PowerControl's ``PowerConsumedWatts`` against its ``PowerLimit``.

A BMC can take a second or more per request, and an HGX board lists dozens of chassis
(baseboard, GPUs, NVSwitches, retimers), many with neither resource. So the walk (the
collection and each member) is made once and kept: a sample asks only for the
``Thermal`` and ``Power`` resources found, and the walk is made again after
:data:`REDISCOVER_S`, or within the same sample when a resource it found stops answering
(HTTP 404 or 410: a chassis replaced or renumbered). Any other failure drops the walk too,
so the sample after it walks again.

The password comes from ``redfish_password_file`` or ``$REDFISH_PASSWORD``, never argv.
A BMC that does not answer raises :class:`TransientSourceError` (the source backs off);
a payload that is not the JSON object Redfish promises raises one naming the URL and what
is wrong, and the agent's other sources go on.
"""

from __future__ import annotations

import base64
import json
import logging
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from collector.sources.base import PermanentSourceError, Record, SourceBatch, SourceOptions, TransientSourceError
from collector.sources.bmc_common import SourceBackoff, read_secret, sensor_event

log = logging.getLogger(__name__)

#: Links of the newer Redfish schema (which deprecates Thermal and Power) that this source does not read yet.
_NEWER = ("ThermalSubsystem", "PowerSubsystem", "Sensors", "EnvironmentMetrics")

_THRESHOLDS = {"UpperThresholdNonCritical": "upper_noncritical", "UpperThresholdCritical": "upper_critical",
               "UpperThresholdFatal": "upper_fatal", "LowerThresholdNonCritical": "lower_noncritical",
               "LowerThresholdCritical": "lower_critical", "LowerThresholdFatal": "lower_fatal"}


#: Seconds (sample clock) a walk of the chassis collection is kept before it is made again.
REDISCOVER_S = 3600.0


class RedfishPayloadError(TransientSourceError):
    """The BMC answered with something that is not the Redfish resource expected."""


class RedfishGone(TransientSourceError):
    """The BMC answered that a resource is not there (HTTP 404 or 410): its chassis were renumbered or replaced."""


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _members(resource: dict[str, Any], key: str, url: str) -> list[tuple[int, dict[str, Any]]]:
    """The objects of the list *key* of a Redfish *resource* (none when absent), with their index;
    :class:`RedfishPayloadError` naming the URL when it is not a list of objects."""
    items = resource.get(key, [])
    if not isinstance(items, list):
        raise RedfishPayloadError(f"redfish: {url}: '{key}' is {type(items).__name__}, not a list")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise RedfishPayloadError(f"redfish: {url}: {key}[{i}] is {type(item).__name__}, not an object")
    return list(enumerate(items))


def thermal_events(node: str, ts: float, chassis: str, thermal: dict[str, Any], url: str) -> list[Record]:
    """``bmc_sensor`` events of one Thermal resource; :class:`RedfishPayloadError` if malformed."""
    out = []
    for key, stype in (("Temperatures", "temperature"), ("Fans", "fan")):
        for i, t in _members(thermal, key, url):
            name = str(t.get("Name") or t.get("FanName") or f"{key}[{i}]")
            value = _number(t.get("ReadingCelsius") if stype == "temperature" else t.get("Reading"))
            unit = "Cel" if stype == "temperature" else str(t.get("ReadingUnits") or "RPM")
            status = t.get("Status") if isinstance(t.get("Status"), dict) else {}
            thresholds = {ours: _number(t.get(theirs)) for theirs, ours in _THRESHOLDS.items()}
            out.append(sensor_event(node, ts, f"{chassis}/{name}", stype, value, unit, status.get("Health"),
                                    thresholds, "redfish"))
    return out


def power_events(node: str, ts: float, chassis: str, power: dict[str, Any], url: str) -> list[Record]:
    """One ``bmc_sensor`` event per power supply (value ``LastPowerOutputWatts``, status
    ``Status.Health``) and per PowerControl (``power``: ``PowerConsumedWatts``; the BMC's power
    cap ``PowerLimit.LimitInWatts`` as its ``upper_critical``)."""
    out = []
    for key, stype, unnamed in (("PowerSupplies", "power_supply", "PSU"), ("PowerControl", "power", "PowerControl")):
        for i, p in _members(power, key, url):
            status = p.get("Status") if isinstance(p.get("Status"), dict) else {}
            name = f"{chassis}/{p.get('Name') or f'{unnamed}{i}'}"
            if stype == "power_supply":
                value, thresholds = _number(p.get("LastPowerOutputWatts")), {}
            else:
                limit = p.get("PowerLimit") if isinstance(p.get("PowerLimit"), dict) else {}
                value, thresholds = _number(p.get("PowerConsumedWatts")), {"upper_critical": limit.get("LimitInWatts")}
            out.append(sensor_event(node, ts, name, stype, value, "W", status.get("Health"), thresholds, "redfish"))
    return out


class RedfishSource:
    """Reads every chassis' Thermal and Power resources from a Redfish service."""

    name = "redfish"

    def __init__(self, node: str, url: str, user: str | None = None, password: str | None = None,
                 timeout_s: float = 5.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise PermanentSourceError(f"redfish source: {url!r} is not an http(s) URL "
                                       f"(expected e.g. https://bmc-host)")
        self.node, self.url, self.timeout_s = node, url.rstrip("/"), timeout_s
        self._auth = None
        if user:
            self._auth = "Basic " + base64.b64encode(f"{user}:{password or ''}".encode()).decode()
        self.backoff = SourceBackoff()
        #: The walk's Thermal and Power resources: (chassis id, "Thermal" | "Power", path); when it was made.
        self._found: list[tuple[str, str, str]] | None = None
        self._found_at = 0.0
        #: GET requests made (what a sample costs the BMC).
        self.requests = 0

    @classmethod
    def from_options(cls, options: SourceOptions) -> "RedfishSource":
        """Build from ``redfish_url``, ``redfish_user``, ``redfish_password_file`` (else $REDFISH_PASSWORD)."""
        if not options.redfish_url:
            raise PermanentSourceError("redfish source needs redfish_url (GPUOPS_AGENT_REDFISH_URL or --redfish-url)")
        password = read_secret(options.redfish_password_file, "REDFISH_PASSWORD", "redfish source")
        return cls(options.node, options.redfish_url, options.redfish_user, password, options.bmc_timeout_s)

    def get(self, path: str) -> dict[str, Any]:
        """The JSON object at *path*; :class:`TransientSourceError` / :class:`RedfishPayloadError`."""
        url = self.url + path
        self.requests += 1
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        if self._auth:
            req.add_header("Authorization", self._auth)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310 - operator's URL
                raw = resp.read()
        except urllib.error.HTTPError as e:
            gone = RedfishGone if e.code in (404, 410) else TransientSourceError
            raise gone(f"redfish: GET {url} answered HTTP {e.code} {e.reason}") from e
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise TransientSourceError(f"redfish: BMC at {self.url} did not answer GET {path}: {e}") from e
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise RedfishPayloadError(f"redfish: GET {url} returned malformed JSON ({e}): "
                                      f"{raw[:120]!r}") from e
        if not isinstance(body, dict):
            raise RedfishPayloadError(f"redfish: GET {url} returned a JSON {type(body).__name__}, not an object")
        return body

    @staticmethod
    def _link(body: dict[str, Any], key: str, url: str) -> str | None:
        link = body.get(key)
        if link is None:
            return None
        if not isinstance(link, dict) or not isinstance(link.get("@odata.id"), str):
            raise RedfishPayloadError(f"redfish: {url}: '{key}' has no '@odata.id' link")
        return link["@odata.id"]

    def sample(self, now: float) -> SourceBatch:
        """Sensor events for every chassis."""
        self.backoff.check(now, f"redfish BMC {self.url}")
        try:
            events = self._read(now)
        except RedfishPayloadError:
            raise  # it answered: no backoff, the error says what is wrong
        except TransientSourceError:
            self.backoff.failed(now)
            raise
        self.backoff.ok()
        return SourceBatch(events=events)

    def _read(self, now: float) -> list[Record]:
        """Every found resource's readings; walks the collection first when the walk is missing or old, and
        again (once) when the BMC says a resource it found is gone."""
        fresh = self._found is None or now - self._found_at >= REDISCOVER_S
        if fresh:
            self._walk(now)
        try:
            return self._readings(now)
        except TransientSourceError as e:
            self._found = None  # the next sample walks again, whatever happens here
            if fresh or not isinstance(e, RedfishGone):  # a BMC that does not answer is not asked again now
                raise
        self._walk(now)
        return self._readings(now)

    def _walk(self, now: float) -> None:
        self._found = None
        coll = self.get("/redfish/v1/Chassis")
        members = coll.get("Members")
        if not isinstance(members, list):
            raise RedfishPayloadError(f"redfish: {self.url}/redfish/v1/Chassis has no 'Members' list")
        found: list[tuple[str, str, str]] = []
        newer: set[str] = set()
        for i, m in enumerate(members):
            if not isinstance(m, dict) or not isinstance(m.get("@odata.id"), str):
                raise RedfishPayloadError(f"redfish: Chassis Members[{i}] has no '@odata.id'")
            path = m["@odata.id"]
            chassis = self.get(path)
            cid = str(chassis.get("Id") or path.rsplit("/", 1)[-1])
            for kind in ("Thermal", "Power"):
                if link := self._link(chassis, kind, path):
                    found.append((cid, kind, link))
            newer.update(k for k in _NEWER if k in chassis)
        if not found:  # a source that samples nothing must say so, not look healthy
            log.warning("redfish: none of the %d chassis at %s links a Thermal or Power resource, so this source "
                        "reads no sensor%s; the ipmi source reads the same BMC's sensors", len(members), self.url,
                        f" (the BMC offers {', '.join(sorted(newer))}, the newer schema, not read yet)" if newer else "")
        self._found, self._found_at = found, now

    def _readings(self, now: float) -> list[Record]:
        events: list[Record] = []
        for cid, kind, path in self._found or ():
            read = thermal_events if kind == "Thermal" else power_events
            events.extend(read(self.node, now, cid, self.get(path), self.url + path))
        return events

    def close(self) -> None:
        """No connection is held between samples (only the walk's paths)."""
