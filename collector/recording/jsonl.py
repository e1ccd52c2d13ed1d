"""JSON-lines files of a recording (events, incidents), plain or gzip."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson

def jsonl_path(root: Path, stem: str) -> Path | None:
    for name in (f"{stem}.jsonl", f"{stem}.jsonl.gz"):
        if (root / name).is_file():
            return root / name
    return None


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Parse a JSON-lines file (plain or gzip); returns (objects, reasons for bad lines)."""
    opener = gzip.open if path.suffix == ".gz" else open
    rows, bad = [], []
    with opener(path, "rb") as fh:
        for i, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                bad.append(f"line {i}: not valid JSON ({e})")
                continue
            if not isinstance(obj, dict):
                bad.append(f"line {i}: not a JSON object")
                continue
            rows.append(obj)
    return rows, bad
