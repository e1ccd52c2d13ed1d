"""NVIDIA's XID catalogue as data, and what each XID means for gpuops.

``models/data/xid_catalog.csv`` is extracted from NVIDIA's XID catalogue workbook
(``Xid-Catalog.xlsx``: code, mnemonic, description, immediate and investigatory
resolution buckets) by :func:`extract_catalog`; a test keeps the two in step. On top of
the catalogue, :data:`FAULT_OF_XID` maps the codes that matter to a fault class of
spec/telemetry.md §4, and :func:`rule_for_xid` turns an XID into the reactive rule
that NVSentinel / NHC-style tools apply (the baseline gpuops must beat).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from collector.schema import APP_XIDS, Action, FaultClass

CATALOG_COLUMNS = ("code", "mnemonic", "description", "immediate_action", "investigatory_action")


@dataclass(frozen=True)
class XidEntry:
    """One row of the catalogue."""

    code: int
    mnemonic: str
    description: str
    immediate_action: str      # NVIDIA resolution bucket, e.g. RESET_GPU, RESTART_APP, IGNORE
    investigatory_action: str


#: XIDs whose fault class is known. Everything else is left to the models.
FAULT_OF_XID: dict[int, FaultClass] = {
    **{c: FaultClass.APP_ERROR for c in APP_XIDS},
    48: FaultClass.HBM_ECC,   # double-bit ECC error
    63: FaultClass.HBM_ECC,   # row remapping event (informational: pending until reset)
    64: FaultClass.HBM_ECC,   # row remapping failure
    92: FaultClass.HBM_ECC,   # excessive SBE interrupts
    94: FaultClass.HBM_ECC,   # contained ECC error
    95: FaultClass.HBM_ECC,   # uncontained ECC error
    140: FaultClass.HBM_ECC,  # unrecovered ECC error escape
    74: FaultClass.NVLINK,
    79: FaultClass.GPU_OFF_BUS,
    62: FaultClass.GPU_OFF_BUS,   # PMU halt: the GPU stops answering
    119: FaultClass.GPU_OFF_BUS,  # GSP RPC timeout
    120: FaultClass.GPU_OFF_BUS,  # GSP error
}

#: XIDs that are evidence of a failure now (the reactive rules act on these).
FATAL_XIDS = frozenset({48, 64, 74, 79, 95, 119, 120, 62, 140})


def rule_for_xid(code: int) -> tuple[FaultClass, Action] | None:
    """The reactive action for an XID: None for informational ones and the job's own faults."""
    fault = FAULT_OF_XID.get(code)
    if fault is None or fault is FaultClass.APP_ERROR or code not in FATAL_XIDS:
        return None
    if code in (48, 95, 140):
        return fault, Action.RESET
    return fault, Action.DRAIN


@lru_cache(maxsize=1)
def catalog() -> dict[int, XidEntry]:
    """The shipped catalogue, by code."""
    text = resources.files("models").joinpath("data/xid_catalog.csv").read_text(encoding="utf-8")
    rows = csv.DictReader(text.splitlines())
    return {int(r["code"]): XidEntry(int(r["code"]), r["mnemonic"], r["description"], r["immediate_action"],
                                     r["investigatory_action"]) for r in rows}


def describe(code: int) -> str:
    """``"XID 79 (GPU has fallen off the bus)"`` for reasons shown to people."""
    e = catalog().get(code)
    return f"XID {code} ({e.description})" if e and e.description else f"XID {code}"


def extract_catalog(xlsx: Path) -> list[dict[str, str]]:
    """Read NVIDIA's workbook (sheet ``Xids``) into catalogue rows; needs ``openpyxl``."""
    import openpyxl  # test/dev dependency only: the runtime reads the CSV

    wb = openpyxl.load_workbook(xlsx, read_only=True)
    out = []
    for row in list(wb["Xids"].iter_rows(values_only=True))[1:]:
        if row[0] != "XID" or row[1] is None:
            continue
        clean = lambda v: " ".join(str(v).split()) if v is not None else ""  # noqa: E731
        out.append({"code": str(int(row[1])), "mnemonic": clean(row[2]), "description": clean(row[3]),
                    "immediate_action": clean(row[8]), "investigatory_action": clean(row[9])})
    return out


def write_catalog_csv(rows: list[dict[str, str]], path: Path) -> None:
    """Write catalogue rows as the shipped CSV (``python -m models.xid XLSX``)."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=CATALOG_COLUMNS)
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    import sys

    write_catalog_csv(extract_catalog(Path(sys.argv[1])), Path(__file__).parent / "data" / "xid_catalog.csv")
