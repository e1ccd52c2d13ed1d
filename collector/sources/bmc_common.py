"""What the BMC sources (``ipmi``, ``redfish``) share: credentials, per-source backoff, sensor events.

Credentials come from a file (mode 600, first line) or the environment, never the command
line: argv is readable by every user of the node (``ps``).

Backoff: a BMC that does not answer is tried again after 5 s, 10 s, 20 s ... up to
:data:`BACKOFF_MAX_S` (a BMC rebooting its firmware takes minutes; asking every tick only
queues requests on it). While waiting, ``sample`` raises :class:`TransientSourceError` at
once (the agent counts it; the other sources go on) without touching the BMC.

Where sensor readings go: the telemetry contract (spec/telemetry.md) has GPU rows (§1),
port rows (§2) and events (§3), and no node-level gauge record. Rather than change the
spec, each reading is an event with ``kind="bmc_sensor"``, ``source="bmc"``, and extra
columns (which the contract allows and the wire keeps): ``sensor``, ``sensor_type``
(``temperature`` | ``fan`` | ``power_supply`` | …), ``value``, ``unit``, ``status`` and the
BMC's own thresholds ``upper_noncritical``, ``upper_critical``, ``upper_fatal``,
``lower_noncritical``, ``lower_critical``, ``lower_fatal`` (null where the BMC gives none;
"fatal" is IPMI's non-recoverable, Redfish's ``*ThresholdFatal``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from collector.bmc_events import THRESHOLD_KEYS
from collector.sources.base import PermanentSourceError, Record, TransientSourceError

#: First wait after a BMC failed to answer, and the longest wait between tries (seconds).
BACKOFF_INITIAL_S = 5.0
BACKOFF_MAX_S = 300.0

__all__ = ["THRESHOLD_KEYS", "SourceBackoff", "read_secret", "sensor_event"]


def read_secret(path: Path | None, env_var: str, what: str) -> str | None:
    """The secret in *path* (first line, stripped), else ``$env_var``, else ``None``."""
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise PermanentSourceError(f"{what}: cannot read the password file {path}: {e.strerror or e}; "
                                       f"create it (mode 600) or set {env_var}") from e
        lines = text.splitlines()
        return lines[0].strip() if lines else ""
    return os.environ.get(env_var)


class SourceBackoff:
    """Exponential backoff of one source, on the sample clock (*now*), no jitter needed per node."""

    def __init__(self, initial_s: float = BACKOFF_INITIAL_S, max_s: float = BACKOFF_MAX_S) -> None:
        self.initial_s, self.max_s = initial_s, max_s
        self.failures = 0
        self.next_try = 0.0

    def check(self, now: float, what: str) -> None:
        """Raise :class:`TransientSourceError` if *now* is before the next allowed try."""
        if now < self.next_try:
            wait = self.next_try - now
            raise TransientSourceError(f"{what}: not answering ({self.failures} failures in a row); "
                                       f"next try in {wait:.0f} s", retry_after_s=wait)

    def failed(self, now: float) -> float:
        """Record one failure at *now*; return the delay before the next try."""
        delay = min(self.max_s, self.initial_s * 2.0 ** min(self.failures, 32))
        self.failures += 1
        self.next_try = now + delay
        return delay

    def ok(self) -> None:
        """The BMC answered: the next failure starts from the initial delay again."""
        self.failures = 0
        self.next_try = 0.0


def sensor_event(node: str, ts: float, sensor: str, sensor_type: str, value: float | None, unit: str,
                 status: str | None, thresholds: dict[str, Any], protocol: str) -> Record:
    """One ``bmc_sensor`` event (module doc): a reading with the BMC's own thresholds."""
    ev: Record = {"ts": ts, "node": node, "gpu": None, "source": "bmc", "kind": "bmc_sensor", "code": None,
                  "pci_bus_id": None, "sensor": sensor, "sensor_type": sensor_type, "value": value, "unit": unit,
                  "status": status, "protocol": protocol}
    for k in THRESHOLD_KEYS:
        v = thresholds.get(k)
        ev[k] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    shown = "no reading" if value is None else f"{value:g} {unit}"
    ev["message"] = f"{sensor}: {shown} ({status or 'status unknown'})"
    return ev
