"""Redfish BMC source: each chassis' temperatures, fans and power supplies as sensor events.

``GET {url}/redfish/v1/Chassis``, then each member (urllib, HTTP basic auth when a user is set, a
timeout on every request). A chassis is read through the schema it offers:

* **``Thermal`` and ``Power``** (the schema before Redfish 2020.4): temperatures from
  ``ReadingCelsius`` and ``Upper/LowerThreshold*``; fans from ``Reading`` (``ReadingUnits``) and
  their thresholds; power supplies from ``Status.Health`` (``status``; value
  ``LastPowerOutputWatts``), and each PowerControl's ``PowerConsumedWatts`` against its ``PowerLimit``.
* **``Sensors`` and ``PowerSubsystem``**, for a chassis that links neither of the old two (OpenBMC's
  bmcweb builds without them by default): temperature, RPM fan and power sensors with their
  ``Thresholds``, and each power supply's health (:mod:`collector.sources.redfish_sensors`). Where
  the service root says the BMC expands collections (``ProtocolFeaturesSupported.ExpandQuery``), a
  collection and all its members cost one request (``$expand=.($levels=1)``); otherwise each sensor
  read is a request of its own, and the walk logs how many a sample makes. A BMC that advertises the
  query but refuses it (an HTTP error) or ignores it (members as bare links) is read member by member,
  with one warning.

Readings become ``bmc_sensor`` events with the BMC's own thresholds (:mod:`collector.sources.bmc_common`).

A BMC can take a second or more per request, and an HGX board lists dozens of chassis
(baseboard, GPUs, NVSwitches, retimers), many with nothing to read. So the walk (the collection,
each member, and which sensors and supplies they hold) is made once and kept: a sample asks only
for the resources found, and the walk is made again after :data:`REDISCOVER_S`, or within the
same sample when a resource it found stops answering (HTTP 404 or 410: a chassis replaced or
renumbered). Any other failure drops the walk too, so the sample after it walks again. Chassis whose Id (the
last segment of the member's URL) matches a ``redfish_skip_chassis`` pattern are left out before the walk asks
for them: an HGX board's GPU and NVSwitch chassis, whose sensors NVML reads already.

The password comes from ``redfish_password_file`` or ``$REDFISH_PASSWORD``, never argv. An ``https://``
BMC's certificate is checked against ``redfish_ca_file`` (its CA, or the BMC's own self-signed
certificate) or else the system's CAs; a certificate that does not verify is an error saying which
setting to give, and ``redfish_tls_verify: false`` skips the check with a warning.
A BMC that does not answer raises :class:`TransientSourceError` (the source backs off);
a payload that is not the JSON object Redfish promises raises one naming the URL and what
is wrong, and the agent's other sources go on.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import logging
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from collector.sources.base import PermanentSourceError, Record, SourceBatch, SourceOptions, TransientSourceError
from collector.sources.bmc_common import SourceBackoff, read_secret, sensor_event
from collector.sources.redfish_sensors import (RedfishPayloadError, as_object, expand_query, expanded_members,
                                               number, power_supply_events, sensor_events, sensor_type_of)

__all__ = ["REDISCOVER_S", "RedfishGone", "RedfishHTTPError", "RedfishPayloadError", "RedfishSource",
           "power_events", "thermal_events"]

log = logging.getLogger(__name__)

_THRESHOLDS = {"UpperThresholdNonCritical": "upper_noncritical", "UpperThresholdCritical": "upper_critical",
               "UpperThresholdFatal": "upper_fatal", "LowerThresholdNonCritical": "lower_noncritical",
               "LowerThresholdCritical": "lower_critical", "LowerThresholdFatal": "lower_fatal"}


#: Seconds (sample clock) a walk of the chassis collection is kept before it is made again.
REDISCOVER_S = 3600.0


class RedfishHTTPError(TransientSourceError):
    """The BMC answered a request with an HTTP error status (``code``)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class RedfishGone(RedfishHTTPError):
    """The BMC answered that a resource is not there (HTTP 404 or 410): its chassis were renumbered or replaced."""


def _tls_context(url: str, ca_file: Path | None, verify: bool) -> ssl.SSLContext | None:
    """The TLS context of an ``https://`` BMC (``None`` for ``http://``); a CA file that cannot be read is a
    :class:`PermanentSourceError` naming it."""
    if not url.startswith("https://"):
        return None
    if not verify:
        log.warning("redfish: not checking the HTTPS certificate of %s (redfish_tls_verify false): anyone on the "
                    "management network can impersonate the BMC and read the Redfish password", url)
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        return ctx
    try:
        return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    except (OSError, ssl.SSLError) as e:
        raise PermanentSourceError(f"redfish source: cannot read redfish_ca_file {ca_file} as PEM certificates: "
                                   f"{getattr(e, 'strerror', None) or e}") from e


def _ids(resources: Any) -> tuple[str, ...]:
    """The ``@odata.id`` of each of *resources* that has one (what a sample reads again)."""
    return tuple(r["@odata.id"] for r in resources if isinstance(r.get("@odata.id"), str))


class _Found(NamedTuple):
    """One resource the walk found: its chassis, what it is (``Thermal``, ``Power``, ``Sensors``,
    ``PowerSupplies``), its path, and for the two collections the members a sample reads when it does
    not expand them."""

    chassis: str
    kind: str
    path: str
    members: tuple[str, ...] = ()


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
            value = number(t.get("ReadingCelsius") if stype == "temperature" else t.get("Reading"))
            unit = "Cel" if stype == "temperature" else str(t.get("ReadingUnits") or "RPM")
            status = as_object(t.get("Status"))
            thresholds = {ours: number(t.get(theirs)) for theirs, ours in _THRESHOLDS.items()}
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
            status = as_object(p.get("Status"))
            name = f"{chassis}/{p.get('Name') or f'{unnamed}{i}'}"
            if stype == "power_supply":
                value, thresholds = number(p.get("LastPowerOutputWatts")), {}
            else:
                limit = as_object(p.get("PowerLimit"))
                value, thresholds = number(p.get("PowerConsumedWatts")), {"upper_critical": limit.get("LimitInWatts")}
            out.append(sensor_event(node, ts, name, stype, value, "W", status.get("Health"), thresholds, "redfish"))
    return out


class RedfishSource:
    """Reads every chassis' Thermal and Power resources, or its Sensors and power supplies, from a Redfish service."""

    name = "redfish"

    def __init__(self, node: str, url: str, user: str | None = None, password: str | None = None,
                 timeout_s: float = 5.0, ca_file: Path | None = None, verify_tls: bool = True,
                 skip_chassis: Sequence[str] = ()) -> None:
        if not url.startswith(("http://", "https://")):
            raise PermanentSourceError(f"redfish source: {url!r} is not an http(s) URL "
                                       f"(expected e.g. https://bmc-host)")
        self.node, self.url, self.timeout_s = node, url.rstrip("/"), timeout_s
        self._tls = _tls_context(self.url, ca_file, verify_tls)
        self._auth = None
        if user:
            self._auth = "Basic " + base64.b64encode(f"{user}:{password or ''}".encode()).decode()
        self.backoff = SourceBackoff()
        #: Patterns of chassis Ids not read (fnmatch), and how many chassis the last walk skipped.
        self.skip_chassis = tuple(skip_chassis)
        self._skipped = 0
        #: The walk's resources, and when it was made.
        self._found: list[_Found] | None = None
        self._found_at = 0.0
        #: The query that expands a collection on this BMC ("" when it cannot); None until a walk needs it.
        self._expand: str | None = None
        #: GET requests made (what a sample costs the BMC).
        self.requests = 0

    @classmethod
    def from_options(cls, options: SourceOptions) -> "RedfishSource":
        """Build from ``redfish_url``, ``redfish_user``, ``redfish_password_file`` (else $REDFISH_PASSWORD)."""
        if not options.redfish_url:
            raise PermanentSourceError("redfish source needs redfish_url (GPUOPS_AGENT_REDFISH_URL or --redfish-url)")
        password = read_secret(options.redfish_password_file, "REDFISH_PASSWORD", "redfish source")
        return cls(options.node, options.redfish_url, options.redfish_user, password, options.bmc_timeout_s,
                   options.redfish_ca_file, options.redfish_tls_verify, options.redfish_skip_chassis)

    def get(self, path: str) -> dict[str, Any]:
        """The JSON object at *path*; :class:`TransientSourceError` / :class:`RedfishPayloadError`."""
        url = self.url + path
        self.requests += 1
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        if self._auth:
            req.add_header("Authorization", self._auth)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self._tls) as resp:  # noqa: S310
                raw = resp.read()
        except urllib.error.HTTPError as e:
            gone = RedfishGone if e.code in (404, 410) else RedfishHTTPError
            raise gone(f"redfish: GET {url} answered HTTP {e.code} {e.reason}", e.code) from e
        except urllib.error.URLError as e:
            if isinstance(e.reason, ssl.SSLCertVerificationError):
                raise TransientSourceError(
                    f"redfish: the BMC at {self.url} presented an HTTPS certificate that does not verify "
                    f"({e.reason.verify_message or e.reason}); give its CA, or the BMC's own self-signed certificate, "
                    f"as redfish_ca_file (GPUOPS_AGENT_REDFISH_CA_FILE), or set redfish_tls_verify false") from e
            raise TransientSourceError(f"redfish: BMC at {self.url} did not answer GET {path}: {e}") from e
        except (OSError, ValueError) as e:
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

    def _member_links(self, path: str) -> list[str]:
        """The member links of the collection at *path*; :class:`RedfishPayloadError` naming what is malformed."""
        members = self.get(path).get("Members")
        if not isinstance(members, list):
            raise RedfishPayloadError(f"redfish: {self.url}{path} has no 'Members' list")
        for i, m in enumerate(members):
            if not isinstance(m, dict) or not isinstance(m.get("@odata.id"), str):
                raise RedfishPayloadError(f"redfish: {self.url}{path}: Members[{i}] has no '@odata.id'")
        return [m["@odata.id"] for m in members]

    def _walk(self, now: float) -> None:
        self._found, self._expand = None, None
        listed = self._member_links("/redfish/v1/Chassis")
        members = [p for p in listed if not self._skips(p)]
        self._skipped = len(listed) - len(members)
        if listed and not members:
            log.warning("redfish: redfish_skip_chassis %s skips all %d chassis at %s, so this source reads no sensor",
                        ",".join(self.skip_chassis), len(listed), self.url)
        found: list[_Found] = []
        for path in members:
            chassis = self.get(path)
            cid = str(chassis.get("Id") or path.rsplit("/", 1)[-1])
            old = [_Found(cid, kind, link) for kind in ("Thermal", "Power") if (link := self._link(chassis, kind, path))]
            found.extend(old or self._walk_newer(cid, chassis, path))
        if not found and (members or not listed):  # a source that samples nothing must say so, not look healthy
            log.warning("redfish: none of the %d chassis at %s links a Thermal, Power, Sensors or PowerSubsystem "
                        "resource, so this source reads no sensor; the ipmi source reads the same BMC's sensors",
                        len(members), self.url)
        self._found, self._found_at = found, now
        if found and not self._expand and (each := sum(len(f.members) for f in found)):
            log.info("redfish: %s reads %d sensors and power supplies one request each (the BMC does not expand "
                     "collections): %d requests a sample", self.url, each, self.health()["requests_per_sample"])

    def _skips(self, path: str) -> bool:
        """Whether the chassis at *path* is one redfish_skip_chassis names (its Id is the URL's last segment)."""
        cid = path.rstrip("/").rsplit("/", 1)[-1]
        return any(fnmatch.fnmatchcase(cid, p) for p in self.skip_chassis)

    def _walk_newer(self, cid: str, chassis: dict[str, Any], path: str) -> list[_Found]:
        """A chassis without Thermal or Power: its Sensors gpuops reads, and its power supplies."""
        found = []
        if link := self._link(chassis, "Sensors", path):
            found.append(_Found(cid, "Sensors", link, _ids(s for s in self._collection(link) if sensor_type_of(s))))
        if link := self._link(chassis, "PowerSubsystem", path):
            if psus := self._link(self.get(link), "PowerSupplies", self.url + link):
                found.append(_Found(cid, "PowerSupplies", psus, _ids(self._collection(psus))))
        return [f for f in found if f.members]  # a collection with nothing gpuops reads costs no request

    def _collection(self, path: str) -> list[dict[str, Any]]:
        """Every member of the collection at *path*: expanded in one request where the BMC can, else one each."""
        if self._expand is None:
            self._expand = expand_query(self.get("/redfish/v1"))
        if (items := self._expanded(path, walking=True)) is not None:
            return items
        return [self.get(link) for link in self._member_links(path)]

    def _expanded(self, path: str, walking: bool) -> list[dict[str, Any]] | None:
        """The members of *path* in one expanded request; ``None`` when the BMC cannot expand, or refuses the
        query it advertises (an HTTP error) or ignores it (bare links): then it is read member by member until
        the next walk, with a warning. In a sample a 404 or 410 is the collection gone (:class:`RedfishGone`, the
        sample walks again); in the walk it is the query refused, as the plain request that follows tells apart."""
        if not self._expand:
            return None
        query = self._expand
        try:
            members = expanded_members(self.get(path + query))
            why = f"answered {self.url}{path}{query} with links only"
        except RedfishHTTPError as e:
            if isinstance(e, RedfishGone) and not walking:
                raise
            members, why = None, f"refused it ({e})"
        if members is None:
            log.warning("redfish: the BMC at %s advertises $expand but %s; reading each member instead", self.url, why)
            self._expand = ""
        return members

    def _readings(self, now: float) -> list[Record]:
        events: list[Record] = []
        for f in self._found or ():
            url = self.url + f.path
            if f.kind in ("Thermal", "Power"):
                read = thermal_events if f.kind == "Thermal" else power_events
                events.extend(read(self.node, now, f.chassis, self.get(f.path), url))
                continue
            items = self._members_now(f)
            if f.kind == "Sensors":
                events.extend(sensor_events(self.node, now, f.chassis, items, url))
            else:
                events.extend(power_supply_events(self.node, now, f.chassis, items))
        return events

    def _members_now(self, f: _Found) -> list[dict[str, Any]]:
        """The members of a found collection, read now: expanded, else (or once the BMC refuses it) one by one."""
        items = self._expanded(f.path, walking=False)
        return items if items is not None else [self.get(m) for m in f.members]

    def health(self) -> dict[str, Any]:
        """The health record's ``redfish`` section: what the last walk found and what a sample costs the BMC."""
        found = self._found or []
        per_sample = sum(len(f.members) if f.members and not self._expand else 1 for f in found)
        return {"walked_at": self._found_at if self._found is not None else None,
                "chassis": len({f.chassis for f in found}), "skipped_chassis": self._skipped,
                "schema": sorted({"old" if f.kind in ("Thermal", "Power") else "newer" for f in found}),
                "expand": bool(self._expand), "requests_per_sample": per_sample, "requests_total": self.requests}

    def close(self) -> None:
        """No connection is held between samples (only the walk's paths)."""
