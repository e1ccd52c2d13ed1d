"""A replay names the nodes that did not send a precursor signal: default-exporter nodes, and nodes without a BMC."""

from __future__ import annotations

from dataclasses import replace

from api.replay import Replayer, build_report, headline
from collector.simulator import simulate_recording
from models.bundle import ModelBundle
from remediation.config import PolicyConfig
from tests.collector.test_worlds import BUSY, _cfg


def test_the_report_names_the_nodes_on_dcgm_exporters_default_counters_and_without_a_bmc_and_nothing_else(tmp_path):
    cfg = _cfg(seed=213, ranges=replace(BUSY, rate_multiplier=(5000, 5000)), nodes=12, hours=2.0)  # faults on both
    simulate_recording(cfg, tmp_path / "rec")
    default = sorted(n for n, d in zip(cfg.node_names(), cfg.world.exporter_default) if d)
    no_bmc = sorted(n for n, b in zip(cfg.node_names(), cfg.world.bmc_node) if not b)
    assert default and no_bmc, "the test world has no node on the default exporter set, or none without a BMC"
    policy = PolicyConfig()
    rep = build_report(tmp_path / "rec", Replayer(ModelBundle.rules_only(), policy).run(tmp_path / "rec"), {}, policy)
    cov = rep["coverage"]
    assert cov["nodes_scored"] == 12
    lacking = ("ecc", "nvlink", "throttle")   # the counters file sends no ECC, NVLink-error or clock-event fields
    assert all(cov["signals"][k]["nodes"] == default for k in lacking)
    assert cov["signals"]["bmc"]["nodes"] == no_bmc
    assert {k for k, v in cov["signals"].items() if v["nodes"]} == {*lacking, "bmc"}
    on_blind = {i["id"] for i in cov["incidents_on_blind_nodes"]}
    assert {s for i in cov["incidents_on_blind_nodes"] for s in i["signals"]} >= {"ecc", "bmc"}
    warned = ("hbm_ecc", "nvlink", "power")   # a straggler and a hot GPU are read by their temperature there (ST, TT)
    assert on_blind == {i["id"] for i in rep["incidents"] if i["node"] in default and i["fault"] in warned
                        or i["node"] in no_bmc and i["fault"] in ("power", "thermal")}
    assert headline(rep)["signals_not_sent"] == {"nodes": {**dict.fromkeys(lacking, len(default)), "bmc": len(no_bmc)},
                                                 "incidents_there": len(on_blind)}
