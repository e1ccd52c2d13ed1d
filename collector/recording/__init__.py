"""Recordings: read and write shared/spec/recording.md exactly.

A recording is a directory::

    manifest.json     required
    gpu.parquet       required   (a file, or a directory of Parquet files)
    net.parquet       optional   (idem)
    events.jsonl      optional   (or events.jsonl.gz)
    incidents.jsonl   optional   (or incidents.jsonl.gz)

Reading is streaming: :func:`iter_windows` yields consecutive time windows, sorted
by ``ts``, holding only one window in memory. Files written in time order (this
module's writer, most collectors) are read with Parquet row-group pruning; unsorted
files small enough to sort in memory are sorted once; larger unsorted ones are
first partitioned by window into a temporary directory (one sequential pass), so a
recording larger than memory can be replayed. ``events.jsonl`` is streamed by window
too (:mod:`.events`), so a file of BMC readings is never held whole.

Rows that break the telemetry contract are not fatal: they are counted and kept,
with their reason, in :attr:`RecordingWindow.rejected` (the caller dead-letters them).
"""

from .manifest import FORMAT_NAME, FORMAT_VERSION, Manifest, RecordingError
from .reader import DEFAULT_SORT_BUDGET_BYTES, Recording, RecordingWindow, open_recording
from .writer import RecordingWriter, write_recording

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "DEFAULT_SORT_BUDGET_BYTES", "Manifest", "Recording", "RecordingError",
           "RecordingWindow", "RecordingWriter", "open_recording", "write_recording"]
