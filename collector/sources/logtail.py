"""Follow a log: ``/dev/kmsg`` (one record per read) or a regular file (``tail -F``).

:class:`LogFollower` returns the complete lines written since the last call:

* a regular file is read in binary from our offset; a last line without its newline
  stays buffered until the newline arrives;
* rotation (the path now names another inode) — the old file is read to its end, its
  unterminated last line (if any) is given as a line, then the new file is read from
  its start; a path missing for a while (between ``mv`` and re-create) is waited for;
* truncation (size below our offset, ``copytruncate``) — read again from the start;
* ``/dev/kmsg`` (a character device) is read non-blocking, one record per ``read``;
  ``EPIPE`` means the kernel overwrote records we had not read: counted in ``lost``.

Each call reads at most ``max_bytes_per_read`` (the rest waits for the next call), so
a huge backlog never stalls a sampling tick; ``read_all`` ignores that bound.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_CHUNK = 1 << 16


class LogFollower:
    """Complete new lines of one log, surviving rotation, truncation and partial writes."""

    def __init__(self, path: Path, from_start: bool = False, max_bytes_per_read: int = 8 << 20) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes_per_read
        self.lost = 0  # /dev/kmsg records overwritten before we read them
        self._partial = b""
        self._fd = -1
        self._open(from_start)

    def _open(self, from_start: bool) -> None:
        st = os.stat(self.path)
        self._is_dev = stat.S_ISCHR(st.st_mode)
        flags = os.O_RDONLY | (os.O_NONBLOCK if self._is_dev else 0)
        self._fd = os.open(self.path, flags)
        self._ino = (st.st_dev, st.st_ino)
        self._pos = 0
        if not from_start:
            self._pos = os.lseek(self._fd, 0, os.SEEK_END)
        self._partial = b""

    def read_lines(self) -> list[str]:
        """New complete lines since the last call (at most ``max_bytes_per_read`` of them)."""
        if self._is_dev:
            return self._read_dev(self.max_bytes)
        return self._read_file(self.max_bytes)

    def read_all(self, include_partial: bool = False) -> list[str]:
        """Every line available now, whatever its size; with *include_partial* also an
        unterminated last line (reading a finished file once, ``gpuops agent --once``)."""
        out: list[str] = []
        while True:
            got = self._read_dev(1 << 62) if self._is_dev else self._read_file(self.max_bytes)
            if not got:
                break
            out.extend(got)
        if include_partial and self._partial:
            out.append(self._partial.decode("utf-8", errors="replace").rstrip("\r"))
            self._partial = b""
        return out

    # ------------------------------------------------------------------ /dev/kmsg

    def _read_dev(self, budget: int) -> list[str]:
        lines = []
        used = 0
        while used < budget:
            try:
                rec = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # ring buffer wrapped past our position
                    self.lost += 1
                    continue
                if e.errno == errno.EINVAL:  # record longer than our buffer: skip it
                    continue
                raise
            if not rec:
                break
            used += len(rec)
            text = rec.decode("utf-8", errors="replace").rstrip("\n")
            if text and not text.startswith(" "):  # " KEY=value" lines are record metadata
                lines.append(text)
        return lines

    # ------------------------------------------------------------------ regular file

    def _read_file(self, budget: int) -> list[str]:
        data = self._read_fd(budget)
        if len(data) < budget:  # at EOF: has the file been truncated or rotated?
            size = os.fstat(self._fd).st_size
            if size < self._pos:
                os.lseek(self._fd, 0, os.SEEK_SET)
                self._pos = 0
                self._partial = b""
                data += self._read_fd(budget - len(data))
            elif self._rotated():
                tail = self._split(data)
                if self._partial:
                    tail.append(self._partial.decode("utf-8", errors="replace"))
                os.close(self._fd)
                self._open(from_start=True)
                return tail + self._split(self._read_fd(budget))
        return self._split(data)

    def _read_fd(self, budget: int) -> bytes:
        parts = []
        got = 0
        while got < budget:
            chunk = os.read(self._fd, min(_CHUNK, budget - got))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        self._pos += got
        return b"".join(parts)

    def _rotated(self) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False  # between rotation and re-creation: keep the old file for now
        return (st.st_dev, st.st_ino) != self._ino

    def _split(self, data: bytes) -> list[str]:
        if not data:
            return []
        buf = self._partial + data
        *lines, self._partial = buf.split(b"\n")
        return [ln.decode("utf-8", errors="replace").rstrip("\r") for ln in lines]

    def close(self) -> None:
        """Close the file descriptor (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
