"""An events file read in blocks of whole lines, so its scan takes a few bulk steps per block.

The scan of :mod:`.events` reads every line's ``ts``. Read by block (:data:`BLOCK_BYTES` of
whole lines), the common case is settled for the whole block at once (:func:`leading_ts`):
every line is an event as our writer and the agent write it (``{"ts":<number>,`` first,
``ts`` named once), told by a few byte counts over the block, and the lines' ``ts`` are read
in one comprehension. A block that is not the common case gets ``None``, and the scan reads
it line by line as before: an odd file gets the same answer, only slower.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

#: bytes read at a time (then up to the end of the line): big enough that a block's bulk
#: steps cost little per line, small enough to cost no memory worth counting
BLOCK_BYTES = 1 << 22

_PREFIX = b'{"ts":'


@dataclass
class Block:
    """Whole lines of a file, without their ``\\n``; ``first`` is the line number of
    ``lines[0]``, counted from 1 as a line-by-line read counts."""

    first: int
    lines: list[bytes]
    raw: bytes


def iter_blocks(path: Path) -> Iterator[Block]:
    """*path* (plain or gzip) as blocks of whole lines (:data:`BLOCK_BYTES` and the rest of the
    last line), in file order."""
    opener = gzip.open if path.suffix == ".gz" else open
    first = 1
    with opener(path, "rb") as fh:
        while True:
            raw = fh.read(BLOCK_BYTES)
            if not raw:
                return
            if not raw.endswith(b"\n"):
                raw += fh.readline()
            lines = raw.split(b"\n")
            if not lines[-1]:  # the empty piece after the last newline, not a line
                lines.pop()
            yield Block(first, lines, raw)
            first += len(lines)


def leading_ts(block: Block) -> np.ndarray | None:
    """The ``ts`` every line of *block* starts with, when every line starts ``{"ts":<finite
    number>,`` and names ``ts`` once (exactly the lines :func:`.events._leading_ts` reads
    without parsing, with the same values); ``None`` when any line does not."""
    lines, raw = block.lines, block.raw
    n = len(lines)
    if not n or raw.count(b'"ts"') != n or raw.startswith(_PREFIX) + raw.count(b"\n" + _PREFIX) != n:
        return None
    ends = [ln.find(b",", 6) for ln in lines]
    if -1 in ends:
        return None
    try:
        ts = np.fromiter(map(float, [ln[6:e] for ln, e in zip(lines, ends)]), np.float64, n)
    except ValueError:
        return None
    return ts if np.isfinite(ts).all() else None

