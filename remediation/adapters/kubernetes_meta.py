"""What the Kubernetes adapter writes on a node and reads back: reasons, times, facility labels.

Pure functions of strings, kept apart from the API calls (:mod:`remediation.adapters.kubernetes`):
the fault class and action kind in a gpuops reason (``gpuops: <kind> [<fault>] id=...``, which
becomes a taint value), RFC 3339 times (the action annotation, the maintenance annotation), and
the facility labels (rack, leaf) a node's labels carry.
"""

from __future__ import annotations

import datetime as dt

from remediation.actions import REASON_PREFIX, ActionKind

#: the taint value when a reason names no fault
UNKNOWN_FAULT = "unknown"
_KINDS = {k.value for k in ActionKind}


def facility_of(labels: dict[str, str], keys: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """The facility labels (``{"leaf": "s1"}``) a node's labels give: for each, the first key present."""
    out = {}
    for name, candidates in keys.items():
        value = next((labels[k] for k in candidates if labels.get(k)), None)
        if value:
            out[name] = value
    return out


def fault_of(reason: str) -> str:
    """The fault class in a reason ``gpuops: <kind> [<fault>] id=...``; ``"unknown"`` if absent.

    The result is a valid label value (it becomes a taint value): letters, digits, ``-_.``.
    """
    words = reason.split()
    if len(words) < 3 or words[0] != REASON_PREFIX or words[1] not in _KINDS or words[2].startswith("id="):
        return UNKNOWN_FAULT
    fault = "".join(c if c.isalnum() or c in "-_." else "_" for c in words[2])[:63].strip("-_.")
    return fault or UNKNOWN_FAULT


def kind_of(reason: str) -> str | None:
    """The action kind in a gpuops reason, or None."""
    words = reason.split()
    return words[1] if len(words) >= 2 and words[0] == REASON_PREFIX and words[1] in _KINDS else None


def rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 time (``Z`` or an offset); None if unreadable."""
    try:
        parsed = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except (ValueError, AttributeError):
        return None
    if parsed.tzinfo is None:
        return None  # RFC 3339 requires an offset; a bare local time is ambiguous
    return parsed.timestamp()
