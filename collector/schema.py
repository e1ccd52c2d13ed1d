"""The telemetry contract (shared/spec/telemetry.md), owned by the collector.

Everything downstream (pipeline, models, remediation, recordings, the Kafka wire
format) reads these definitions; nothing else in the code base spells a column
name or a fault class by hand.

Three record types are defined — GPU sample (§1), network port sample (§2) and
event (§3) — each as an ordered table of :class:`Column`. Validation comes in two
shapes with the same rules:

* :func:`validate_record` — one ``dict`` at a time (the stream / dead-letter path);
* :func:`validate_frame` — a whole ``DataFrame`` at once (recordings, batches).

Both return a reason for every rejected record and keep unknown extra columns.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:  # pandas is imported where frames are validated: the node agent never loads it
    import pandas as pd

#: Version of the records and of the Kafka messages built from them. Bump on any
#: incompatible change; decoders accept every version listed in SUPPORTED_VERSIONS.
SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})

NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class FaultClass(str, enum.Enum):
    """Fault vocabulary shared by labels, detections and actions (§4)."""

    HBM_ECC = "hbm_ecc"
    GPU_OFF_BUS = "gpu_off_bus"
    NVLINK = "nvlink"
    PCIE = "pcie"
    THERMAL = "thermal"
    POWER = "power"
    IB_LINK = "ib_link"
    FAIL_SLOW = "fail_slow"
    APP_ERROR = "app_error"

    @property
    def is_node_fault(self) -> bool:
        """True for faults of the hardware; ``app_error`` is the job's own fault."""
        return self is not FaultClass.APP_ERROR


NODE_FAULTS: tuple[FaultClass, ...] = tuple(f for f in FaultClass if f.is_node_fault)


class Action(str, enum.Enum):
    """What the remediation engine can do (§5); ``none`` means decide nothing."""

    DRAIN = "drain"
    REQUEUE = "requeue"
    RESET = "reset"
    RESUME = "resume"
    ALERT = "alert"
    NONE = "none"

    @property
    def is_disruptive(self) -> bool:
        """Actions that take capacity away from the scheduler (scored as catches)."""
        return self in (Action.DRAIN, Action.RESET)

    @property
    def acts(self) -> bool:
        """Actions that change the node (drain, reset, requeue), as against telling a person or nothing."""
        return self in (Action.DRAIN, Action.RESET, Action.REQUEUE)


class FollowUp(str, enum.Enum):
    """What a drain leads to once the node's running jobs have ended (§5 "when idle")."""

    RESET_WHEN_IDLE = "reset_when_idle"  # e.g. a pending row remap: drain, jobs end, reset, verify, resume
    REBOOT = "reboot"                    # catalogue RESTART_BM (XID 79): drain, then reboot the node


class Grade(str, enum.Enum):
    """How strong the evidence behind a decision is; harder actions need a higher grade."""

    CERTAIN = "certain"            # a catalogue XID or a hard limit: acts at once
    CORROBORATED = "corroborated"  # a prediction backed by a rising trend or a second signal
    PREDICTED = "predicted"        # a prediction alone: the least disruptive protective action (drain)
    ADVISORY = "advisory"          # alerts and resumes: nothing taken away from the scheduler


class ColumnKind(str, enum.Enum):
    KEY = "key"
    LABEL = "label"
    GAUGE = "gauge"
    COUNTER = "counter"


@dataclass(frozen=True)
class Column:
    """One column of a record type: name, numpy/pandas dtype, unit and kind."""

    name: str
    dtype: str  # "float64", "float32", "int16", "int32", "int64", "string"
    kind: ColumnKind
    unit: str = ""
    required: bool = False
    nullable: bool = True

    @property
    def numeric(self) -> bool:
        return self.dtype != "string"


def _c(name: str, dtype: str, kind: str, unit: str = "", required: bool = False) -> Column:
    return Column(name, dtype, ColumnKind(kind), unit, required, nullable=not required)


_KEYS = (_c("ts", "float64", "key", "s", True), _c("node", "string", "key", "", True))

#: §1 — one per GPU per sampling interval.
GPU_COLUMNS: tuple[Column, ...] = _KEYS + (
    _c("gpu", "int16", "key", "", True),
    _c("gpu_uuid", "string", "label"),
    _c("pci_bus_id", "string", "label"),  # NVML form 00000000:4E:00.0: lets node-level XIDs find their GPU
    _c("util_gpu", "float32", "gauge", "%"),
    _c("util_mem", "float32", "gauge", "%"),
    _c("fb_used_mib", "float32", "gauge", "MiB"),
    _c("fb_free_mib", "float32", "gauge", "MiB"),
    _c("temp_gpu_c", "float32", "gauge", "degC"),
    _c("temp_mem_c", "float32", "gauge", "degC"),
    _c("power_w", "float32", "gauge", "W"),
    _c("power_limit_w", "float32", "gauge", "W"),
    _c("sm_clock_mhz", "float32", "gauge", "MHz"),
    _c("mem_clock_mhz", "float32", "gauge", "MHz"),
    _c("throttle_reasons", "int64", "gauge", "bitmask"),
    _c("thermal_violation_us", "float64", "counter", "us"),
    _c("power_violation_us", "float64", "counter", "us"),
    _c("ecc_sbe_vol", "float64", "counter", "count"),
    _c("ecc_dbe_vol", "float64", "counter", "count"),
    _c("ecc_sbe_agg", "float64", "counter", "count"),
    _c("ecc_dbe_agg", "float64", "counter", "count"),
    _c("retired_pages_sbe", "float64", "counter", "count"),
    _c("retired_pages_dbe", "float64", "counter", "count"),
    _c("retired_pages_pending", "float32", "gauge", "0/1"),
    _c("remapped_rows_corr", "float64", "counter", "count"),
    _c("remapped_rows_uncorr", "float64", "counter", "count"),
    _c("row_remap_pending", "float32", "gauge", "0/1"),
    _c("row_remap_failure", "float32", "gauge", "0/1"),
    _c("pcie_replay", "float64", "counter", "count"),
    _c("nvlink_crc_flit_err", "float64", "counter", "count"),
    _c("nvlink_crc_data_err", "float64", "counter", "count"),
    _c("nvlink_replay_err", "float64", "counter", "count"),
    _c("nvlink_recovery_err", "float64", "counter", "count"),
    _c("xid_last", "float32", "gauge", "code"),
)

#: §2 — counter file names under /sys/class/infiniband/<dev>/ports/<n>/counters/.
IB_COUNTERS: tuple[str, ...] = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "port_xmit_wait",
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
)

#: §2 — one per HCA/NIC port per interval.
NET_COLUMNS: tuple[Column, ...] = _KEYS + (
    _c("device", "string", "key", "", True),
    _c("port", "int16", "key", "", True),
    _c("link_state", "string", "label"),
    _c("phys_state", "string", "label"),
    _c("rate_gbps", "float32", "gauge", "Gb/s"),
) + tuple(_c(n, "float64", "counter", "count") for n in IB_COUNTERS)

#: §3 — discrete things that happened.
EVENT_COLUMNS: tuple[Column, ...] = _KEYS + (
    _c("gpu", "int16", "key"),
    _c("source", "string", "label", "", True),
    _c("kind", "string", "label", "", True),
    _c("code", "int32", "gauge"),
    _c("pci_bus_id", "string", "label"),
    _c("message", "string", "label"),
)


class RecordType(str, enum.Enum):
    """The three record types; the value is the ``type`` tag in flat JSON records."""

    GPU = "gpu"
    NET = "net"
    EVENT = "event"

    @property
    def columns(self) -> tuple[Column, ...]:
        return _COLUMNS[self]

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in _COLUMNS[self])


_COLUMNS = {RecordType.GPU: GPU_COLUMNS, RecordType.NET: NET_COLUMNS, RecordType.EVENT: EVENT_COLUMNS}

GPU_COUNTERS: tuple[str, ...] = tuple(c.name for c in GPU_COLUMNS if c.kind is ColumnKind.COUNTER)
GPU_GAUGES: tuple[str, ...] = tuple(c.name for c in GPU_COLUMNS if c.kind is ColumnKind.GAUGE)

# nvmlClocksEventReasons bits named in §1.
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80

# --------------------------------------------------------------------------- validation


def validate_record(record: Mapping[str, Any], rtype: RecordType | str) -> str | None:
    """Return ``None`` when *record* satisfies the contract, else the reason it does not.

    Extra keys are allowed (kept by the caller). Required keys must be present and
    well-typed; optional numeric fields may be null but never a non-number.
    """
    rtype = RecordType(rtype)
    if not isinstance(record, Mapping):
        return f"record is {type(record).__name__}, not an object"
    for col in rtype.columns:
        value = record.get(col.name)
        if value is None:
            if col.required:
                return missing_reason(col.name)
            continue
        reason = _check_value(col, value)
        if reason:
            return reason
    return None


def _check_value(col: Column, value: Any) -> str | None:
    name = col.name
    if col.dtype == "string":
        if not isinstance(value, str):
            return f"field '{name}' must be a string, got {type(value).__name__}"
        if name == "node" and not NODE_NAME_RE.match(value):
            return f"malformed node name {value!r} (must match {NODE_NAME_RE.pattern})"
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return f"field '{name}' must be a number, got {type(value).__name__}"
    if name == "ts":
        if not math.isfinite(value):
            return f"non-finite timestamp {value!r}"
        return None
    if col.dtype.startswith("int"):
        if isinstance(value, float) and not value.is_integer():
            return f"field '{name}' must be an integer, got {value!r}"
    return None


@dataclass
class FrameValidation:
    """Result of validating a batch: the good rows, and the rejected rows with a reason."""

    valid: pd.DataFrame
    rejected: pd.DataFrame  # the bad rows, plus a ``reason`` column

    @property
    def n_rejected(self) -> int:
        return len(self.rejected)


def missing_reason(name: str) -> str:
    """Why a row is rejected when required field *name* is null or absent (frame and Arrow checks)."""
    return f"missing required field '{name}'"


def not_integer_reason(name: str) -> str:
    return f"field '{name}' must be an integer"


def bad_node_reason(value: Any) -> str:
    return f"malformed node name {value!r}"


#: why a row with an infinite ``ts`` is rejected (frame and Arrow checks)
NONFINITE_TS_REASON = "non-finite timestamp"


def validate_frame(df: pd.DataFrame, rtype: RecordType | str) -> FrameValidation:
    """Vectorised :func:`validate_record` for a whole DataFrame.

    Returns the valid rows coerced to the contract's dtypes (extra columns kept,
    missing optional columns added as null) and the rejected rows with ``reason``.
    A column of the wrong type as a whole (strings in a numeric column) rejects the
    rows whose value cannot be read as a number.
    """
    import pandas as pd

    rtype = RecordType(rtype)
    n = len(df)
    reason = np.full(n, None, dtype=object)
    bad = np.zeros(n, bool)

    def reject(mask: np.ndarray, why: str | np.ndarray) -> None:
        m = mask & ~bad
        if m.any():
            reason[m] = why if isinstance(why, str) else why[m]
            bad[m] = True

    out: dict[str, Any] = {}
    for col in rtype.columns:
        if col.name not in df.columns:
            if col.required:
                reject(np.ones(n, bool), missing_reason(col.name))
                out[col.name] = pd.Series([None] * n, dtype=object, index=df.index)
            else:
                out[col.name] = _null_series(col, n, df.index)
            continue
        s = df[col.name]
        if col.dtype == "string":
            isnull, nonstr, badnode = _check_strings(s, col.name == "node")
            if col.required:
                reject(isnull, missing_reason(col.name))
            reject(nonstr, f"field '{col.name}' must be a string")
            if badnode is not None and badnode.any():
                why = np.array([bad_node_reason(v) for v in s.to_numpy(object)], dtype=object)
                reject(badnode, why)
            out[col.name] = s.where(~nonstr) if nonstr.any() else s
        else:
            num, badtype = _to_numeric(s)
            isnull = np.isnan(num)
            reject(badtype, f"field '{col.name}' must be a number")
            if col.required:
                reject(isnull & ~badtype, missing_reason(col.name))
            if col.name == "ts":
                reject(np.isinf(num), NONFINITE_TS_REASON)
            if col.dtype.startswith("int"):
                frac = ~isnull & ~np.isinf(num) & (np.floor(np.where(isnull, 0, num)) != np.where(isnull, 0, num))
                reject(frac, not_integer_reason(col.name))
            out[col.name] = num
    good = ~bad
    everything_valid = not bad.any()
    cols = {}
    for col in rtype.columns:
        v = out[col.name]
        if isinstance(v, np.ndarray):
            if everything_valid and col.name in df.columns and df[col.name].dtype == col.dtype:
                cols[col.name] = df[col.name].reset_index(drop=True)  # already right: no copy, no cast
            else:
                cols[col.name] = cast_numeric(col, v if everything_valid else v[good])
        else:
            cols[col.name] = (v if everything_valid else v[good]).reset_index(drop=True)
    contract = set(rtype.column_names)
    for extra in df.columns:
        if extra not in contract:
            cols[extra] = (df[extra] if everything_valid else df[extra][good]).reset_index(drop=True)
    valid = pd.DataFrame(cols, copy=False)
    rejected = df[bad].copy()
    rejected["reason"] = reason[bad]
    return FrameValidation(valid=valid, rejected=rejected.reset_index(drop=True))


def _check_strings(s: pd.Series, is_node: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Null / non-string / malformed-node masks, checking each distinct value once."""
    import pandas as pd

    if isinstance(s.dtype, pd.CategoricalDtype):
        codes, uniques = s.cat.codes.to_numpy(), s.cat.categories.to_numpy(object)
    else:
        codes, uniques = pd.factorize(s, use_na_sentinel=True)
        uniques = np.asarray(uniques, dtype=object)
    isnull = codes < 0
    u_nonstr = np.fromiter((not isinstance(u, str) for u in uniques), bool, len(uniques))
    nonstr = ~isnull & np.append(u_nonstr, False)[codes]
    badnode = None
    if is_node:
        u_bad = np.fromiter((isinstance(u, str) and NODE_NAME_RE.match(u) is None for u in uniques), bool,
                            len(uniques))
        badnode = ~isnull & np.append(u_bad, False)[codes]
    return isnull, nonstr, badnode


def _to_numeric(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Column → float64 array, plus a mask of values that are not numbers at all."""
    import pandas as pd

    if pd.api.types.is_bool_dtype(s):
        return np.full(len(s), np.nan), np.ones(len(s), bool)
    if pd.api.types.is_numeric_dtype(s):
        return s.to_numpy(dtype="float64", na_value=np.nan), np.zeros(len(s), bool)
    coerced = pd.to_numeric(s, errors="coerce")
    arr = coerced.to_numpy(dtype="float64", na_value=np.nan)
    was_null = s.isna().to_numpy()
    # strings like "12" are not numbers on the wire: a JSON producer that sends them is wrong
    is_str = s.map(lambda v: isinstance(v, (str, bytes, bool))).to_numpy(bool)
    bad = (np.isnan(arr) & ~was_null) | is_str
    arr[bad] = np.nan
    return arr, bad


def _null_series(col: Column, n: int, index: pd.Index) -> Any:
    import pandas as pd

    if col.dtype == "string":
        return pd.Series(pd.array([None] * n, dtype="string"), index=index)
    return np.full(n, np.nan)


def cast_numeric(col: Column, v: np.ndarray) -> Any:
    """Float64 values (NaN = null) in *col*'s contract dtype, as :func:`validate_frame` returns them."""
    import pandas as pd

    if col.dtype.startswith("int"):
        # required keys are never null; optional ones use pandas' nullable integers
        return v.astype(col.dtype) if col.required else pd.array(v, dtype=col.dtype.capitalize())
    return v.astype(col.dtype)


def empty_frame(rtype: RecordType | str) -> pd.DataFrame:
    """A zero-row DataFrame with the contract's columns and dtypes."""
    import pandas as pd

    return validate_frame(pd.DataFrame({c: [] for c in RecordType(rtype).column_names}), rtype).valid


def arrow_schema(rtype: RecordType | str, extra: Iterable[tuple[str, pa.DataType]] = ()) -> pa.Schema:
    """Arrow schema of a record type (used for Parquet recordings)."""
    m = {"float64": pa.float64(), "float32": pa.float32(), "int16": pa.int16(), "int32": pa.int32(),
         "int64": pa.int64(), "string": pa.string()}
    fields = [pa.field(c.name, m[c.dtype], nullable=c.nullable) for c in RecordType(rtype).columns]
    return pa.schema(fields + [pa.field(n, t) for n, t in extra])


# --------------------------------------------------------------------------- incidents

INCIDENT_FIELDS = ("id", "node", "gpu", "fault", "onset_ts", "failure_ts", "predictable", "action", "note")


def validate_incident(obj: Mapping[str, Any]) -> str | None:
    """Reason an ``incidents.jsonl`` line breaks spec/recording.md, or ``None``."""
    for key in ("node", "fault", "failure_ts"):
        if obj.get(key) is None:
            return f"incident missing '{key}'"
    try:
        FaultClass(obj["fault"])
    except ValueError:
        return f"unknown fault class {obj['fault']!r} (valid: {', '.join(f.value for f in FaultClass)})"
    for key in ("failure_ts", "onset_ts"):
        v = obj.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            return f"incident field '{key}' must be a finite number"
    return None
