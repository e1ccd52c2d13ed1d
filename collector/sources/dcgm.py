"""dcgm-exporter source: scrape ``/metrics`` (or read a file) and map ``DCGM_FI_*`` to §1.

Most Kubernetes GPU clusters already run NVIDIA's dcgm-exporter; this source lets the
agent reuse it instead of opening NVML a second time. The Prometheus text exposition
is parsed here (no client library), series are grouped per ``gpu`` label, and each
DCGM field of spec §1's table fills its column (units are already the contract's:
MiB, W, °C, MHz, µs). ``DCGM_FI_DEV_XID_ERRORS`` (the last XID, 0 = none) fills
``xid_last``. Series without a ``gpu`` label are ignored; when a field appears more
than once for a GPU (per-pod or MIG-instance series) the one without ``GPU_I_ID`` wins,
else the first. Fields the exporter does not export are ``None``.

A missing file or a malformed URL fails at start; an exporter that is down (it may
start after the agent) is a transient error on each tick until it answers.

Bounds: a ``gpu`` label must be ASCII digits that fit the int16 ``gpu`` column, else the
series is ignored; a value its column cannot hold (``throttle_reasons`` beyond int64, a
gauge beyond float32, NaN or ±Inf) is ``None``, never a reason to fail the scrape.
"""

from __future__ import annotations

import logging
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

from collector.schema import GPU_COLUMNS
from collector.sources.base import (INT_RANGES, PermanentSourceError, Record, SourceBatch, SourceOptions,
                                    TransientSourceError, within_column)

log = logging.getLogger(__name__)

#: DCGM field → schema column (spec §1), plus the renamed throttle field of newer DCGM.
DCGM_FIELDS: dict[str, str] = {
    "DCGM_FI_DEV_GPU_UTIL": "util_gpu",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "util_mem",
    "DCGM_FI_DEV_FB_USED": "fb_used_mib",
    "DCGM_FI_DEV_FB_FREE": "fb_free_mib",
    "DCGM_FI_DEV_GPU_TEMP": "temp_gpu_c",
    "DCGM_FI_DEV_MEMORY_TEMP": "temp_mem_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "power_limit_w",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_MEM_CLOCK": "mem_clock_mhz",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "throttle_reasons",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "throttle_reasons",
    "DCGM_FI_DEV_THERMAL_VIOLATION": "thermal_violation_us",
    "DCGM_FI_DEV_POWER_VIOLATION": "power_violation_us",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_sbe_vol",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_dbe_vol",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "ecc_sbe_agg",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "ecc_dbe_agg",
    "DCGM_FI_DEV_RETIRED_SBE": "retired_pages_sbe",
    "DCGM_FI_DEV_RETIRED_DBE": "retired_pages_dbe",
    "DCGM_FI_DEV_RETIRED_PENDING": "retired_pages_pending",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "remapped_rows_corr",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "remapped_rows_uncorr",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "row_remap_pending",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "row_remap_failure",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replay",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "nvlink_crc_flit_err",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "nvlink_crc_data_err",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "nvlink_replay_err",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "nvlink_recovery_err",
    "DCGM_FI_DEV_XID_ERRORS": "xid_last",
}

#: The precursor signals gpuops predicts from (models/coverage.py), by the DCGM fields that carry each. dcgm-exporter's
#: default counters file sends none of the ECC, NVLink-error or clock-event ones (the first two are commented out
#: there, the last is not listed), and a node without them has its HBM and NVLink faults seen only when their XID
#: arrives.
PRECURSOR_FIELDS: dict[str, tuple[str, ...]] = {
    "ecc": ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),
    "nvlink": ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
               "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
    "pcie": ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER",),
    "throttle": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
    "temperature": ("DCGM_FI_DEV_GPU_TEMP",),
    "power": ("DCGM_FI_DEV_POWER_USAGE",),
    "clocks": ("DCGM_FI_DEV_SM_CLOCK",),
}

_GPU_VALUE_COLUMNS = tuple(c.name for c in GPU_COLUMNS if c.name not in ("ts", "node", "gpu", "gpu_uuid", "pci_bus_id"))
_DTYPE = {c.name: c.dtype for c in GPU_COLUMNS}
_GPU_LABEL_RE = re.compile(r"[0-9]{1,5}")
_SAMPLE_RE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_exposition(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(metric name, labels, value) for every sample line of Prometheus text exposition."""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\")
                  for k, v in _LABEL_RE.findall(m.group("labels") or "")}
        yield m.group("name"), labels, value


#: the row columns each precursor signal arrives in
_PRECURSOR_COLUMNS = {name: {DCGM_FIELDS[f] for f in fields} for name, fields in PRECURSOR_FIELDS.items()}


def missing_signals(rows: list[Record]) -> tuple[str, ...]:
    """The precursor signals of :data:`PRECURSOR_FIELDS` no GPU of a scrape's *rows* has a value for (none when
    there is no GPU)."""
    if not rows:
        return ()
    return tuple(name for name, cs in _PRECURSOR_COLUMNS.items() if all(r.get(c) is None for r in rows for c in cs))


def scrape_to_rows(text: str, node: str, now: float) -> list[Record]:
    """GPU rows (one per ``gpu`` label, ordered by index) from one dcgm-exporter scrape."""
    rows: dict[int, Record] = {}
    seen: dict[tuple[int, str], bool] = {}  # (gpu, column) → value came from a MIG-instance series
    for name, labels, value in parse_exposition(text):
        col = DCGM_FIELDS.get(name)
        gpu_label = labels.get("gpu", "")
        if col is None or not _GPU_LABEL_RE.fullmatch(gpu_label) or int(gpu_label) > INT_RANGES["int16"][1]:
            continue
        gpu = int(gpu_label)
        row = rows.get(gpu)
        if row is None:
            row = rows[gpu] = {"ts": now, "node": node, "gpu": gpu, "gpu_uuid": labels.get("UUID") or None,
                                  "pci_bus_id": labels.get("pci_bus_id") or None}
            row.update(dict.fromkeys(_GPU_VALUE_COLUMNS))
        instance = bool(labels.get("GPU_I_ID"))
        key = (gpu, col)
        if key in seen and not (seen[key] and not instance):
            continue  # keep the first, unless a whole-GPU series replaces an instance one
        seen[key] = instance
        row[col] = within_column(value, _DTYPE[col])
    return [rows[g] for g in sorted(rows)]


class DcgmSource:
    """Reads a dcgm-exporter endpoint (``http://host:9400/metrics``) or a saved scrape file."""

    name = "dcgm"

    def __init__(self, node: str, url: str, timeout_s: float = 2.0) -> None:
        self.node = node
        self.url = url
        self.timeout_s = timeout_s
        self._is_http = url.startswith(("http://", "https://"))
        #: the precursor signals the exporter's last scrape had no value for (None: no scrape yet)
        self.missing: tuple[str, ...] | None = None
        if not self._is_http:
            path = Path(url.removeprefix("file://"))
            if not path.is_file():
                raise PermanentSourceError(
                    f"dcgm source: {url!r} is neither an http(s) URL nor an existing file "
                    f"(expected e.g. --dcgm-url http://localhost:9400/metrics)")
            self._path: Path | None = path
        else:
            self._path = None

    @classmethod
    def from_options(cls, options: SourceOptions) -> "DcgmSource":
        """Build from agent options (``--dcgm-url``, required for this source)."""
        if not options.dcgm_url:
            raise PermanentSourceError("dcgm source needs --dcgm-url URL_OR_FILE "
                                       "(e.g. http://localhost:9400/metrics)")
        return cls(options.node, options.dcgm_url, options.dcgm_timeout_s)

    def fetch(self) -> str:
        """The exposition text; :class:`TransientSourceError` if the exporter does not answer."""
        if self._path is not None:
            try:
                return self._path.read_text(errors="replace")
            except OSError as e:
                raise TransientSourceError(f"dcgm: cannot read {self._path}: {e}") from e
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as resp:  # noqa: S310 - operator's URL
                return resp.read().decode("utf-8", errors="replace")
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise TransientSourceError(f"dcgm: scrape of {self.url} failed: {e}", retry_after_s=None) from e

    def sample(self, now: float) -> SourceBatch:
        """One row per GPU the exporter reports. The first scrape, and any that changes it, logs the precursor
        signals it has no value for (a warning: gpuops cannot predict their faults on this node)."""
        rows = scrape_to_rows(self.fetch(), self.node, now)
        missing = missing_signals(rows)
        if rows and missing != self.missing:
            if missing:
                log.warning("dcgm: %s sends no %s counters: gpuops sees this node's faults of those classes only when "
                            "they happen. Turn on %s in the exporter's counters file (docs/operations.md, "
                            "\"What gpuops cannot see on your fleet\")", self.url, ", ".join(missing),
                            ", ".join(f for m in missing for f in PRECURSOR_FIELDS[m]))
            elif self.missing:
                log.info("dcgm: %s now sends every precursor signal", self.url)
            self.missing = missing
        return SourceBatch(gpu=rows)

    def health(self) -> dict:
        """The agent health record's ``dcgm`` section: the precursor signals the last scrape had no value for
        (``missing_signals``; null before the first scrape)."""
        return {"missing_signals": None if self.missing is None else list(self.missing)}

    def close(self) -> None:
        """Nothing held between scrapes."""

