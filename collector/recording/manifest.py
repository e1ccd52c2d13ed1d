"""``manifest.json`` of a recording, and the error every recording problem raises."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from collector.schema import NODE_NAME_RE

FORMAT_NAME = "gpu-telemetry-recording"
FORMAT_VERSION = 1


class RecordingError(ValueError):
    """A recording that cannot be read as spec/recording.md describes (permanent)."""


@dataclass
class Manifest:
    """``manifest.json``: what the recording covers."""

    start: float
    end: float
    interval_s: float
    nodes: list[str]
    gpus_per_node: int
    source: str = ""
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def node_days(self) -> float:
        return len(self.nodes) * max(self.end - self.start, 0.0) / 86400.0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        extra = d.pop("extra")
        d.update(extra)
        return {k: d[k] for k in ("format", "version", "start", "end", "interval_s", "nodes",
                                  "gpus_per_node", "source")} | extra

    @classmethod
    def from_json(cls, obj: Any, where: str = "manifest.json") -> "Manifest":
        """Validate and build; every problem raises :class:`RecordingError` naming it."""
        if not isinstance(obj, dict):
            raise RecordingError(f"{where}: must be a JSON object")
        if obj.get("format") != FORMAT_NAME:
            raise RecordingError(f"{where}: 'format' is {obj.get('format')!r}, expected {FORMAT_NAME!r}")
        if obj.get("version") != FORMAT_VERSION:
            raise RecordingError(f"{where}: unsupported version {obj.get('version')!r} "
                                 f"(this reader supports {FORMAT_VERSION})")
        for key in ("start", "end", "interval_s"):
            v = obj.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise RecordingError(f"{where}: '{key}' must be a finite number, got {v!r}")
        if obj["end"] < obj["start"]:
            raise RecordingError(f"{where}: 'end' ({obj['end']}) is before 'start' ({obj['start']})")
        if obj["interval_s"] <= 0:
            raise RecordingError(f"{where}: 'interval_s' must be > 0")
        nodes = obj.get("nodes")
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
            raise RecordingError(f"{where}: 'nodes' must be a list of node names")
        bad = [n for n in nodes if not NODE_NAME_RE.match(n)]
        if bad:
            raise RecordingError(f"{where}: malformed node names {bad[:3]}")
        gpn = obj.get("gpus_per_node")
        if isinstance(gpn, bool) or not isinstance(gpn, int) or gpn < 0:
            raise RecordingError(f"{where}: 'gpus_per_node' must be a non-negative integer, got {gpn!r}")
        known = {"format", "version", "start", "end", "interval_s", "nodes", "gpus_per_node", "source"}
        return cls(start=float(obj["start"]), end=float(obj["end"]), interval_s=float(obj["interval_s"]),
                   nodes=list(nodes), gpus_per_node=gpn, source=str(obj.get("source", "")),
                   extra={k: v for k, v in obj.items() if k not in known})
