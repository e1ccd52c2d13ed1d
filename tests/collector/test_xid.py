"""The XID catalogue shipped with gpuops matches NVIDIA's workbook, and each code's meaning follows its bucket."""

from __future__ import annotations

import pytest

from collector.schema import Action, FaultClass, FollowUp
from collector.simulator.plan import APP_XID_CODES
from collector.xid import XID_CLASSES, catalog, class_of, codes_by_class, extract_catalog


def test_shipped_catalogue_equals_nvidias_workbook(shared_fixtures):
    rows = extract_catalog(shared_fixtures / "xid" / "catalog" / "Xid-Catalog.xlsx")
    shipped = catalog()
    assert len(rows) == len(shipped) > 150
    for r in rows:
        e = shipped[int(r["code"])]
        assert (e.mnemonic, e.immediate_action) == (r["mnemonic"], r["immediate_action"])


def test_every_catalogue_code_has_exactly_one_class():
    seen = [c for codes in codes_by_class().values() for c in codes]
    assert sorted(seen) == sorted(catalog())


def test_restart_app_and_ignore_codes_never_act_on_the_node():
    for code, e in catalog().items():
        if e.immediate_action in ("RESTART_APP", "IGNORE", "WORKFLOW_XID_45"):
            assert not class_of(code).acts, code


def test_reset_gpu_codes_reset_the_gpu_except_the_disputed_109():
    for code, e in catalog().items():
        if e.immediate_action == "RESET_GPU" and code != 109:
            assert class_of(code).action is Action.RESET, code
    assert class_of(109).action is Action.ALERT


@pytest.mark.parametrize("code, action, follow_up, fault", [
    (79, Action.DRAIN, FollowUp.REBOOT, FaultClass.GPU_OFF_BUS),
    (48, Action.RESET, None, FaultClass.HBM_ECC),
    (74, Action.DRAIN, None, FaultClass.NVLINK),
    (145, Action.DRAIN, None, FaultClass.NVLINK),
    (64, Action.RESET, None, FaultClass.HBM_ECC),
    (95, Action.RESET, None, FaultClass.HBM_ECC),
    (119, Action.RESET, None, FaultClass.GPU_OFF_BUS),
    (62, Action.RESET, None, FaultClass.GPU_OFF_BUS),
    (94, Action.NONE, None, FaultClass.HBM_ECC),
    (63, Action.NONE, None, FaultClass.HBM_ECC),
    (92, Action.NONE, None, FaultClass.APP_ERROR),
    (13, Action.NONE, None, FaultClass.APP_ERROR),
    (45, Action.NONE, None, FaultClass.APP_ERROR),
    (1, Action.ALERT, None, None),       # CONTACT_SUPPORT: tell a person, change nothing
    (424242, Action.ALERT, None, None),  # not in the catalogue
])
def test_meaning_of_an_xid_follows_its_catalogue_bucket(code, action, follow_up, fault):
    c = class_of(code)
    assert (c.action, c.follow_up, c.fault) == (action, follow_up, fault)


def test_a_reset_for_an_unknown_gpu_becomes_drain_and_reset_when_idle():
    assert class_of(95).node_action == (Action.DRAIN, FollowUp.RESET_WHEN_IDLE)
    assert class_of(79).node_action == (Action.DRAIN, FollowUp.REBOOT)


def test_the_simulators_application_xids_never_act_on_the_node():
    assert APP_XID_CODES and not any(class_of(c).acts for c in APP_XID_CODES)


def test_class_names_are_unique():
    assert len({c.name for c in XID_CLASSES}) == len(XID_CLASSES)


def test_a_catalogue_that_moves_a_code_gpuops_reads_specially_fails_at_load(monkeypatch):
    from collector import xid

    text = xid.resources.files("collector").joinpath("data/xid_catalog.csv").read_text(encoding="utf-8")
    moved = text.replace("Uncontained memory error,RESET_GPU", "Uncontained memory error,RESTART_APP")
    assert moved != text

    class _Files:
        def joinpath(self, _):
            return self

        def read_text(self, encoding):
            return moved

    monkeypatch.setattr(xid.resources, "files", lambda _: _Files())
    xid.catalog.cache_clear()
    try:
        with pytest.raises(ValueError, match="95"):
            xid.catalog()
    finally:
        monkeypatch.undo()
        xid.catalog.cache_clear()
