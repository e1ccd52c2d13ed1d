"""What an XID means: NVIDIA's catalogue as data, and gpuops' reading of it (the one home).

``collector/data/xid_catalog.csv`` is extracted from NVIDIA's XID catalogue workbook
(``Xid-Catalog.xlsx``: code, mnemonic, description, immediate and investigatory
resolution buckets) by :func:`extract_catalog` (``python -m collector.xid XLSX``); a test
keeps the two in step. Every other module — the pipeline's XID feature classes, the
rules, the simulator, the kernel-log source — takes XID meaning from here.

Each code falls in one :class:`XidClass`, chosen from its *immediate* bucket; the class
carries gpuops' meaning: the fault class it is evidence of and the node action. The
choices, bucket by bucket:

* ``RESTART_APP`` and ``WORKFLOW_XID_45`` → ``app`` (fault ``app_error``); ``IGNORE`` →
  ``informational``. Never an action on the node: the job restarts, the GPU is healthy.
  Two of them are split out because, *together*, they are HBM evidence: 63 (row-remap
  event, IGNORE) → ``remap_event`` and 94 (contained ECC error, RESTART_APP) →
  ``contained_ecc``. Alone each is still no action; 63 with 94 on the same GPU (or the
  ``row_remap_pending`` flag with a new uncorrectable error) is a remap waiting for a
  reset: drain, then reset when idle (the rule ``remap_pending_*`` in
  :mod:`models.rules`), not an immediate reset.
* ``RESET_GPU`` → reset that GPU (grade CERTAIN). Split by what failed: 64, 95, 140
  (remap failure, uncontained / escaped ECC) → ``hbm_fatal`` (``hbm_ecc``); the rest
  (62 PMU halt, 119/120 GSP, 46, 110, 136, …) → ``gpu_reset`` (``gpu_off_bus``: the GPU
  stops answering).
* ``WORKFLOW_XID_48`` (48, a double-bit ECC error) → ``dbe``: reset the GPU.
* ``RESTART_BM`` (79, fallen off the bus) → ``off_bus``: drain, then reboot
  (``FollowUp.REBOOT``).
* ``WORKFLOW_NVLINK_ERR`` (74) and ``WORKFLOW_NVLINK5_ERR`` (144–150) → ``nvlink``: drain.
* ``CONTACT_SUPPORT``, every other bucket (``CHECK_MECHANICALS``, ``UPDATE_SWFW``,
  ``RESTART_VM``, ``XID_154``, ``CHECK_UVM``, blank) and codes not in the catalogue →
  ``other``: no automatic action; worth telling a person (:attr:`Action.ALERT`).
* **109** (context-switch timeout) is disputed: RESET_GPU in the catalogue, an
  application error for the Kubernetes device plugin, "typically not fatal" for Nebius.
  gpuops takes no automatic action on it (class ``other``: alert-worthy): a reset on a
  job's own hang would be a false action, and a GPU that really hangs shows GSP / PMU
  XIDs or stops sampling, which do act.

The few codes read differently from the rest of their bucket (63, 94, 64, 95, 140, 109) name
the bucket that reading assumes; a catalogue that moves one of them fails at load rather than
silently keeping the old action.

An XID that names no GPU (its PCI bus id could not be resolved) acts on the node:
:attr:`XidClass.node_action` is the class's action with ``gpu`` unknown — a reset becomes
"drain, then reset the node's GPUs when idle", since no single GPU can be named.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from collector.schema import Action, FaultClass, FollowUp

CATALOG_COLUMNS = ("code", "mnemonic", "description", "immediate_action", "investigatory_action")


@dataclass(frozen=True)
class XidEntry:
    """One row of NVIDIA's catalogue."""

    code: int
    mnemonic: str
    description: str
    immediate_action: str      # NVIDIA resolution bucket, e.g. RESET_GPU, RESTART_APP, IGNORE
    investigatory_action: str


@dataclass(frozen=True)
class XidClass:
    """A group of XIDs with one meaning for gpuops (one window count per class in the pipeline)."""

    name: str
    #: the fault class the XID is evidence of (None: not a fault of anything we track)
    fault: FaultClass | None
    #: what gpuops does on it, for the GPU that raised it (NONE: nothing; ALERT: tell a person only)
    action: Action
    #: what a drain leads to once the node is idle (None: nothing more)
    follow_up: FollowUp | None
    meaning: str

    @property
    def acts(self) -> bool:
        """Whether the class alone takes capacity away (drain or reset)."""
        return self.action.is_disruptive

    @property
    def node_action(self) -> tuple[Action, FollowUp | None]:
        """The action when the XID names no GPU: a GPU reset becomes drain + reset when idle."""
        if self.action is Action.RESET:
            return Action.DRAIN, FollowUp.RESET_WHEN_IDLE
        return self.action, self.follow_up


_F, _A = FaultClass, Action
#: Every class, in feature order; the last (``other``) also takes codes outside the catalogue.
XID_CLASSES: tuple[XidClass, ...] = (
    XidClass("app", _F.APP_ERROR, _A.NONE, None, "the job's own fault (RESTART_APP, WORKFLOW_XID_45): no node action"),
    XidClass("informational", _F.APP_ERROR, _A.NONE, None, "logged only (IGNORE): no node action"),
    XidClass("remap_event", _F.HBM_ECC, _A.NONE, None, "XID 63, HBM row remap recorded (IGNORE; with 94: pending)"),
    XidClass("contained_ecc", _F.HBM_ECC, _A.NONE, None, "XID 94, contained ECC error (RESTART_APP; with 63: pending)"),
    XidClass("dbe", _F.HBM_ECC, _A.RESET, None, "XID 48, double-bit ECC error (WORKFLOW_XID_48): reset the GPU"),
    XidClass("hbm_fatal", _F.HBM_ECC, _A.RESET, None, "XID 64/95/140, remap failure or uncontained ECC (RESET_GPU)"),
    XidClass("gpu_reset", _F.GPU_OFF_BUS, _A.RESET, None, "GPU firmware / GSP stopped answering (RESET_GPU)"),
    XidClass("off_bus", _F.GPU_OFF_BUS, _A.DRAIN, FollowUp.REBOOT, "XID 79, GPU fallen off the bus (RESTART_BM)"),
    XidClass("nvlink", _F.NVLINK, _A.DRAIN, None, "XID 74 / 144-150, NVLink error (WORKFLOW_NVLINK(5)_ERR): drain"),
    XidClass("other", None, _A.ALERT, None, "CONTACT_SUPPORT, other buckets, 109, unknown codes: no automatic action"),
)
CLASS_BY_NAME: dict[str, XidClass] = {c.name: c for c in XID_CLASSES}
#: Feature-name fragments of the XID classes that are evidence of a hardware fault
#: (``xid_dbe`` matches ``xid_dbe_count_short`` and ``node_xid_dbe_count_short``).
HARDWARE_XID_KEYS: tuple[str, ...] = tuple(f"xid_{c.name}_" for c in XID_CLASSES
                                           if c.fault not in (None, FaultClass.APP_ERROR))
OTHER = XID_CLASSES[-1]

#: Codes whose class is gpuops' reading within their bucket (see the module docstring): code →
#: (the bucket that reading assumes, class). A catalogue that moves one of them fails at load.
_BY_CODE = {63: ("IGNORE", "remap_event"), 94: ("RESTART_APP", "contained_ecc"), 64: ("RESET_GPU", "hbm_fatal"),
            95: ("RESET_GPU", "hbm_fatal"), 140: ("RESET_GPU", "hbm_fatal"), 109: ("RESET_GPU", "other")}
_BY_BUCKET = {"RESTART_APP": "app", "WORKFLOW_XID_45": "app", "IGNORE": "informational", "RESET_GPU": "gpu_reset",
              "WORKFLOW_XID_48": "dbe", "RESTART_BM": "off_bus", "WORKFLOW_NVLINK_ERR": "nvlink",
              "WORKFLOW_NVLINK5_ERR": "nvlink"}


@lru_cache(maxsize=1)
def catalog() -> dict[int, XidEntry]:
    """The shipped catalogue, by code."""
    text = resources.files("collector").joinpath("data/xid_catalog.csv").read_text(encoding="utf-8")
    rows = csv.DictReader(text.splitlines())
    out = {int(r["code"]): XidEntry(int(r["code"]), r["mnemonic"], r["description"], r["immediate_action"],
                                    r["investigatory_action"]) for r in rows}
    moved = {c: (b, out[c].immediate_action if c in out else None) for c, (b, _) in _BY_CODE.items()
             if c not in out or out[c].immediate_action != b}
    if moved:
        raise ValueError(f"XID catalogue disagrees with gpuops' reading (code: (assumed, catalogue)): {moved}")
    return out


def restart_app_codes() -> tuple[int, ...]:
    """Every code whose catalogue immediate action is RESTART_APP (the job's own fault)."""
    return tuple(sorted(code for code, e in catalog().items() if e.immediate_action == "RESTART_APP"))


def class_of(code: int) -> XidClass:
    """gpuops' class of one XID code (``other`` for codes outside the catalogue)."""
    e = catalog().get(code)
    if e is None:
        return OTHER
    name = _BY_CODE[code][1] if code in _BY_CODE else _BY_BUCKET.get(e.immediate_action, OTHER.name)
    return CLASS_BY_NAME[name]


@lru_cache(maxsize=1)
def codes_by_class() -> dict[str, frozenset[int]]:
    """Catalogue codes of each class (``other`` also takes every code not listed)."""
    out: dict[str, set[int]] = {c.name: set() for c in XID_CLASSES}
    for code in catalog():
        out[class_of(code).name].add(code)
    return {k: frozenset(v) for k, v in out.items()}


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
    """Write catalogue rows as the shipped CSV (``python -m collector.xid XLSX``)."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=CATALOG_COLUMNS)
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    import sys

    write_catalog_csv(extract_catalog(Path(sys.argv[1])), Path(__file__).parent / "data" / "xid_catalog.csv")
