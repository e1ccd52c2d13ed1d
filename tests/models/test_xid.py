"""The XID catalogue shipped with gpuops matches NVIDIA's workbook, and rules follow it."""

from __future__ import annotations

import pytest

from collector.schema import Action, FaultClass
from models.xid import FAULT_OF_XID, catalog, describe, extract_catalog, rule_for_xid


def test_shipped_catalogue_equals_nvidias_workbook(shared_fixtures):
    rows = extract_catalog(shared_fixtures / "xid" / "catalog" / "Xid-Catalog.xlsx")
    shipped = catalog()
    assert len(rows) == len(shipped) > 150
    for r in rows:
        e = shipped[int(r["code"])]
        assert (e.mnemonic, e.immediate_action) == (r["mnemonic"], r["immediate_action"])


def test_every_mapped_xid_is_in_the_catalogue():
    missing = [c for c in FAULT_OF_XID if c not in catalog()]
    assert missing == []


@pytest.mark.parametrize("code, expected", [
    (79, (FaultClass.GPU_OFF_BUS, Action.DRAIN)),
    (48, (FaultClass.HBM_ECC, Action.RESET)),
    (74, (FaultClass.NVLINK, Action.DRAIN)),
    (64, (FaultClass.HBM_ECC, Action.DRAIN)),
    (13, None), (31, None), (43, None), (45, None),  # the job's own fault
    (63, None), (92, None),                          # informational / precursors, not failures
    (9999, None),
])
def test_reactive_rule_of_an_xid(code, expected):
    assert rule_for_xid(code) == expected


def test_descriptions_come_from_the_catalogue():
    assert "fallen off the bus" in describe(79).lower()
    assert describe(424242) == "XID 424242"
