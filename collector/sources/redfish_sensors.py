"""The newer Redfish schema as sensor events: a chassis' ``Sensors`` and its ``PowerSubsystem``'s power supplies.

Redfish deprecated a chassis' ``Thermal`` and ``Power`` resources (2020.4) for ``ThermalSubsystem``,
``PowerSubsystem`` and ``Sensors``, and OpenBMC's web server, bmcweb, builds without the old two
by default (its ``redfish-allow-deprecated-power-thermal`` option). On such a BMC every reading is a
``Sensor`` resource: ``Reading``, ``ReadingType`` / ``ReadingUnits``, ``PhysicalContext``,
``Status.Health`` and ``Thresholds`` (``UpperCaution``, ``UpperCritical``, ``UpperFatal`` and the
``Lower*`` three, each an object with its ``Reading``).

Read here, as the old schema is read by :mod:`collector.sources.redfish`:

* temperatures (``ReadingType`` ``Temperature`` or units ``Cel``), fans read in RPM (``Rotational``
  or ``RPM``) and power (``Power`` or ``W``) become ``bmc_sensor`` events with the BMC's thresholds
  (caution is IPMI's non-critical); every other kind of sensor (voltage, current, energy, fan duty
  in percent, ...) is left out, as the old schema's ``Thermal`` and ``Power`` carry none of them;
* each power supply of ``PowerSubsystem/PowerSupplies`` becomes a ``power_supply`` event carrying its
  ``Status.Health`` (its output is in a ``Metrics`` resource not read: one request more per supply).

Which resources to ask for, and how often, is the source's business (:class:`RedfishSource`); these
functions only read payloads, and raise :class:`RedfishPayloadError` (the source's too) naming the URL
when one is not what the schema promises.
"""

from __future__ import annotations

from typing import Any

from collector.sources.base import Record, TransientSourceError
from collector.sources.bmc_common import sensor_event

#: Sensor thresholds of the newer schema → the event's threshold columns (caution = IPMI's non-critical).
SENSOR_THRESHOLDS = {"UpperCaution": "upper_noncritical", "UpperCritical": "upper_critical", "UpperFatal": "upper_fatal",
                     "LowerCaution": "lower_noncritical", "LowerCritical": "lower_critical", "LowerFatal": "lower_fatal"}


class RedfishPayloadError(TransientSourceError):
    """The BMC answered with something that is not the Redfish resource expected."""


def number(v: Any) -> float | None:
    """*v* as a float when it is a JSON number (not a boolean), else ``None``."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def as_object(v: Any) -> dict[str, Any]:
    """*v* when it is a JSON object, else an empty one (an optional sub-object such as ``Status``)."""
    return v if isinstance(v, dict) else {}


def sensor_type_of(sensor: dict[str, Any]) -> str | None:
    """``temperature`` | ``fan`` | ``power`` for a Sensor resource gpuops reads, ``None`` for the rest."""
    kind, unit = sensor.get("ReadingType"), sensor.get("ReadingUnits")
    if kind == "Temperature" or unit == "Cel":
        return "temperature"
    if kind == "Rotational" or unit == "RPM":
        return "fan"
    if kind == "Power" or unit == "W":
        return "power"
    return None


_UNITS = {"temperature": "Cel", "fan": "RPM", "power": "W"}


def sensor_events(node: str, ts: float, chassis: str, sensors: list[dict[str, Any]], url: str) -> list[Record]:
    """``bmc_sensor`` events of the Sensor resources gpuops reads (:func:`sensor_type_of`) among *sensors*."""
    out = []
    for s in sensors:
        stype = sensor_type_of(s)
        if stype is None:
            continue
        where = f"{url} sensor {s.get('@odata.id') or s.get('Id') or '?'}"
        limits = s.get("Thresholds", {})
        if not isinstance(limits, dict):
            raise RedfishPayloadError(f"redfish: {where}: 'Thresholds' is {type(limits).__name__}, not an object")
        thresholds = {}
        for theirs, ours in SENSOR_THRESHOLDS.items():
            t = limits.get(theirs)
            if t is not None and not isinstance(t, dict):
                raise RedfishPayloadError(f"redfish: {where}: Thresholds.{theirs} is {type(t).__name__}, "
                                          f"not an object with a 'Reading'")
            thresholds[ours] = number(as_object(t).get("Reading"))
        name = str(s.get("Name") or s.get("Id") or "sensor")
        unit = str(s.get("ReadingUnits") or _UNITS[stype])
        out.append(sensor_event(node, ts, f"{chassis}/{name}", stype, number(s.get("Reading")), unit,
                                as_object(s.get("Status")).get("Health"), thresholds, "redfish"))
    return out


def power_supply_events(node: str, ts: float, chassis: str, supplies: list[dict[str, Any]]) -> list[Record]:
    """One ``power_supply`` event per PowerSupply resource: its ``Status.Health`` (``None`` when absent)."""
    return [sensor_event(node, ts, f"{chassis}/{p.get('Name') or p.get('Id') or f'PSU{i}'}", "power_supply", None,
                         "W", as_object(p.get("Status")).get("Health"), {}, "redfish")
            for i, p in enumerate(supplies)]


def expand_query(service_root: dict[str, Any]) -> str:
    """The query that expands a collection's members in its own response, as the service root says this BMC
    supports it (``ProtocolFeaturesSupported.ExpandQuery``), or ``""`` when it does not say so."""
    q = as_object(as_object(service_root.get("ProtocolFeaturesSupported")).get("ExpandQuery"))
    levels = "($levels=1)" if q.get("Levels") is True else ""
    if q.get("NoLinks") is True:
        return f"?$expand=.{levels}"
    if q.get("ExpandAll") is True:
        return f"?$expand=*{levels}"
    return ""


def expanded_members(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A collection response's members when they came expanded (each more than its ``@odata.id`` link), else
    ``None`` (a BMC that ignored the query)."""
    members = body.get("Members")
    if not isinstance(members, list) or not all(isinstance(m, dict) for m in members):
        return None
    if any(set(m) <= {"@odata.id"} for m in members):
        return None
    return members
