"""What a BMC event means and what shape it must have: the SEL entries gpuops acts on, as data.

The ``ipmi`` source (:mod:`collector.sources.ipmi`) turns each SEL entry into a ``kind="sel"``
event whose ``sensor_type`` is the IPMI sensor type (``Power Supply``, ``Fan``,
``Temperature``; with the SDR's sensor name after it when ipmitool found one, e.g. ``Fan FAN1``),
``event_text`` the text ipmitool prints for the event offset and
``asserted`` its direction. A class below matches those exactly — the IPMI 2.0 spec's
table 42-3 texts as ipmitool spells them, no pattern — and only *asserted* entries count:
a deassertion says the condition ended. Everything else in a SEL (presence, a fan's
``Lower Non-critical going low``, which healthy fans cross for a moment at low duty,
chassis intrusion, ...) is noise to the models and no rule's business.

Another collector's BMC event carries only what spec/telemetry.md §3 requires: ``source="bmc"``,
a ``kind`` of its own and the raw ``message``. :func:`sel_of_message` reads the same three
facts from that line when it says them the way ipmitool does (``sel elist``: ``ID | DATE |
TIME | SENSOR | EVENT | Asserted``) or names the sensor and quotes an event text above verbatim
(``PSU4 Status: Failure detected, redundancy lost``); anything else stays unread.

``bmc_sensor`` readings carry the BMC's own thresholds; :func:`is_inlet` picks the
temperature sensors that measure the air coming in (where a cooling fault shows first,
before any GPU throttles), by the names BMC vendors give them.

The pipeline counts each class per node (:mod:`pipeline.bmc`); the rules
(:mod:`models.rules`) act on those counts and on the inlet and fan margins.
:func:`bmc_problem` says why a ``source="bmc"`` event does not have the shape the BMC
sources give it (:func:`collector.sources.bmc_common.sensor_event`, ``IpmiSource.sel_event``),
so the pipeline dead-letters it with that reason instead of reading a string as a reading.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from collector.schema import Action, FaultClass


@dataclass(frozen=True)
class SelClass:
    """SEL entries of one ``sensor_type`` with one of ``event_texts``, asserted: evidence of ``fault``."""

    name: str
    sensor_type: str
    event_texts: frozenset[str]
    fault: FaultClass
    #: what the node's rule does: a failure drains, a predictive warning tells a person
    action: Action
    meaning: str


#: Counted classes, in feature order (append only: the pipeline's features follow this order).
SEL_CLASSES: tuple[SelClass, ...] = (
    SelClass("psu_fail", "Power Supply", frozenset({"Failure detected"}), FaultClass.POWER, Action.DRAIN,
             "a power supply failed (sensor-specific offset 01h): the node runs on the rest, without redundancy"),
    SelClass("psu_predictive", "Power Supply", frozenset({"Predictive failure"}), FaultClass.POWER, Action.ALERT,
             "a power supply predicts its own failure (offset 02h): still delivering, replace it"),
    SelClass("fan_fail", "Fan", frozenset({"Lower Critical going low", "Lower Non-recoverable going low"}),
             FaultClass.THERMAL, Action.DRAIN, "a fan's speed fell below the BMC's lower critical threshold"),
    SelClass("temp_critical", "Temperature", frozenset({"Upper Critical going high", "Upper Non-recoverable going high"}),
             FaultClass.THERMAL, Action.DRAIN, "a temperature rose above the BMC's upper critical threshold"),
)
SEL_CLASS_NAMES: tuple[str, ...] = tuple(c.name for c in SEL_CLASSES)
#: The BMC's own thresholds a ``bmc_sensor`` event carries (null where the BMC gives none).
THRESHOLD_KEYS = ("upper_noncritical", "upper_critical", "upper_fatal", "lower_noncritical", "lower_critical",
                  "lower_fatal")

#: Name fragments (lower case) of temperature sensors that read the inlet air.
INLET_NAMES: tuple[str, ...] = ("inlet", "intake", "ambient")


def sel_class(sensor_type: Any, event_text: Any, asserted: Any) -> int:
    """Index into :data:`SEL_CLASSES` of one SEL entry, or -1 (no class, or not asserted).

    The sensor type is the IPMI one, alone or followed by the SDR sensor name (``Fan FAN1``).
    """
    if asserted is not True or not isinstance(sensor_type, str) or not isinstance(event_text, str):
        return -1
    text = event_text.strip()
    for k, c in enumerate(SEL_CLASSES):
        if text in c.event_texts and (sensor_type == c.sensor_type or sensor_type.startswith(c.sensor_type + " ")):
            return k
    return -1


#: How a line names each sensor type when it is not ipmitool's SENSOR column (words, case-insensitive):
#: "PSU" is how BMC vendors and their logs name power supplies.
_TYPE_WORDS: dict[str, "re.Pattern[str]"] = {
    "Power Supply": re.compile(r"\b(power supply|psu\s*\d*)\b", re.I),
    "Fan": re.compile(r"\bfan\s*\d*\b", re.I),
    "Temperature": re.compile(r"\b(temperature|temp)\b", re.I),
}
#: each class's event texts, lower case, in a fixed order (matched inside free text)
_TEXTS_LOWER = tuple((c, tuple((t, t.lower()) for t in sorted(c.event_texts))) for c in SEL_CLASSES)
#: Words after which a line reports a condition ending, not starting.
_ENDED = re.compile(r"\b(deasserted|cleared|recovered|restored|returned to normal)\b", re.I)
_SENSOR_NUM = re.compile(r"\s*#0x[0-9a-fA-F]+$")


@dataclass(frozen=True)
class SelLine:
    """The columns of one ``ipmitool sel elist`` / ``sel list`` line:
    ``ID | DATE | TIME | SENSOR | EVENT [| Asserted/Deasserted [| detail]]``."""

    sel_id: int        # hexadecimal in the line (ipmitool prints ``%4x``)
    date: str
    time: str
    sensor: str        # ``Power Supply #0x01``, or the type and the SDR's name
    event_text: str
    asserted: bool | None

    @property
    def sensor_type(self) -> str:
        return sel_sensor_type(self.sensor)


def sel_sensor_type(sensor: str) -> str:
    """The IPMI sensor type of a SEL line's SENSOR column: ``Power Supply #0x01`` → ``Power Supply``."""
    return _SENSOR_NUM.sub("", sensor)


def parse_sel_line(line: str) -> SelLine | None:
    """The columns of an ipmitool SEL line, or None when *line* is not one (a warning, free text)."""
    parts = [p.strip() for p in line.split("|")]
    if len(parts) < 5:
        return None
    try:
        sel_id = int(parts[0], 16)
    except ValueError:
        return None
    direction = parts[5].lower() if len(parts) > 5 else ""
    asserted = True if direction == "asserted" else False if direction == "deasserted" else None
    return SelLine(sel_id, parts[1], parts[2], parts[3], parts[4], asserted)


def sel_of_message(message: Any) -> tuple[str, str, bool | None] | None:
    """(sensor type, event text, asserted) of a raw BMC line, or None when it says none of them
    as :data:`SEL_CLASSES` spell them.

    An ``ipmitool sel elist`` / ``sel list`` line is read by its columns (:func:`parse_sel_line`,
    as the IPMI source reads it). Any other line counts only when it holds a class's event text
    verbatim (case aside) and names that class's sensor type (``PSU4`` is a power supply); it is
    an assertion unless it says the condition ended (``Deasserted``, ``cleared``, ...). A line
    that names no event text of a class, or another sensor, is None: free text is never guessed at.
    """
    if not isinstance(message, str):
        return None
    sel = parse_sel_line(message)
    if sel is not None:
        return sel.sensor_type, sel.event_text, sel.asserted
    low = message.lower()
    for c, texts in _TEXTS_LOWER:
        text = next((t for t, lower in texts if lower in low), None)
        if text is not None and _TYPE_WORDS[c.sensor_type].search(message):
            return c.sensor_type, text, not _ENDED.search(message)
    return None


def _number_or_null(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)) \
        or (isinstance(v, float) and math.isnan(v))


def bmc_problem(event: Mapping[str, Any]) -> str | None:
    """Why a ``source="bmc"`` event cannot be read as a SEL entry or a sensor reading (None: it can).

    Other kinds from the BMC are kept as they are (nothing reads them yet).
    """
    kind = event.get("kind")
    if kind == "bmc_sensor":
        for key in ("sensor", "sensor_type"):
            if not isinstance(event.get(key), str):
                return f"bmc_sensor event: field '{key}' must be a string, got {type(event.get(key)).__name__}"
        for key in ("value", *THRESHOLD_KEYS):
            if not _number_or_null(event.get(key)):
                return f"bmc_sensor event {event['sensor']!r}: field '{key}' must be a finite number or null, " \
                       f"got {event.get(key)!r}"
    elif kind == "sel":
        if not isinstance(event.get("sensor_type"), str) or not isinstance(event.get("event_text"), str):
            return "sel event: fields 'sensor_type' and 'event_text' must be strings"
        if event.get("asserted") not in (True, False, None):
            return f"sel event: field 'asserted' must be true, false or null, got {event.get('asserted')!r}"
    return None


def is_inlet(sensor: str) -> bool:
    """Whether a temperature sensor named *sensor* reads the inlet air."""
    s = sensor.lower()
    return any(n in s for n in INLET_NAMES)
