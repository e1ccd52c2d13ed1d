"""JSON-lines files of a recording (events, incidents), plain or gzip."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import orjson

def jsonl_path(root: Path, stem: str) -> Path | None:
    for name in (f"{stem}.jsonl", f"{stem}.jsonl.gz"):
        if (root / name).is_file():
            return root / name
    return None


def iter_jsonl(path: Path, bad: list[str], line_filter: Callable[[bytes], bool] | None = None
               ) -> Iterator[dict[str, Any]]:
    """The objects of a JSON-lines file (plain or gzip), one at a time, in file order; the
    reason for each line that is not a JSON object is appended to *bad*. With *line_filter*,
    only the lines it passes (raw bytes) are parsed at all."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        numbered = enumerate(fh, 1)
        if line_filter is not None:
            numbered = ((i, line) for i, line in numbered if line_filter(line))
        yield from parse_lines(numbered, bad)


def parse_lines(numbered: Iterable[tuple[int, bytes]], bad: list[str]) -> Iterator[dict[str, Any]]:
    """The objects of (line number, line) pairs; blank lines skipped, the reason for each line
    that is not a JSON object appended to *bad*."""
    for i, line in numbered:
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
        yield obj


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Parse a JSON-lines file (plain or gzip); returns (objects, reasons for bad lines)."""
    bad: list[str] = []
    rows = list(iter_jsonl(path, bad))
    return rows, bad
