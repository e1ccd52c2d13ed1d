"""Which precursor signals a node does not send (models/coverage.py), read from one tick's features."""

from __future__ import annotations

import numpy as np

from models.coverage import SIGNALS, CoverageTally, bits_of, blind_bits, blind_to, names_of
from pipeline.batch import FeatureBatch
from pipeline.features import FEATURE_NAMES

READ = ("util_gpu_slope_long", "temp_gpu_c_slope_long", "power_w_slope_long", "sm_clock_mhz_slope_long")


def batch(rows: list[dict[str, float]], nodes: list[str]) -> FeatureBatch:
    """A tick whose every feature is 1.0 unless a row says otherwise (every signal sent, every GPU read)."""
    x = np.ones((len(rows), len(FEATURE_NAMES)), np.float32)
    for i, r in enumerate(rows):
        for k, v in r.items():
            x[i, FEATURE_NAMES.index(k)] = v
    return FeatureBatch(100.0, np.array(nodes, object), np.arange(len(rows), dtype=np.int16), x)


def starts(nodes: list[str]) -> np.ndarray:
    return np.flatnonzero(np.r_[True, np.array(nodes[1:]) != np.array(nodes[:-1])])


def test_a_gpu_being_read_without_a_counter_makes_its_node_blind_to_that_signal_only():
    nodes = ["a", "a", "b", "c"]
    rows = [{}, {"ecc_sbe_per_h_long": np.nan, "nvlink_crc_per_min_long": np.nan},   # a: GPU 1 on default counters
            {"net_ports": np.nan},                                                  # b: no port reports
            {"pcie_replay_per_min_long": np.nan, **{f: np.nan for f in READ}}]      # c: its one GPU not read at all
    bits = blind_bits(batch(rows, nodes), starts(nodes))
    assert [names_of(int(b)) for b in bits] == [["ecc", "nvlink"], ["ib_ports"], []]


def test_a_gpu_with_one_sample_in_the_long_window_is_not_yet_read_so_a_counter_without_a_delta_is_not_blind():
    one_sample = {f: np.nan for f in READ} | {"temp_gpu_c_mean_long": 60.0, "ecc_sbe_per_h_long": np.nan}
    assert names_of(int(blind_bits(batch([one_sample], ["a"]), starts(["a"]))[0])) == []
    two = dict(one_sample, temp_gpu_c_slope_long=0.0)   # a second sample of a gauge: a counter it sends has a delta
    assert names_of(int(blind_bits(batch([two], ["a"]), starts(["a"]))[0])) == ["ecc"]


def test_a_node_with_zero_ports_reporting_is_blind_to_its_ports():
    assert names_of(int(blind_bits(batch([{"net_ports": 0.0}], ["a"]), starts(["a"]))[0])) == ["ib_ports"]


def test_a_node_with_no_bmc_event_in_the_long_window_is_blind_to_its_bmc_and_one_with_no_failure_is_not():
    nodes = ["a", "b"]
    rows = [{"node_bmc_psu_fail_count_long": np.nan}, {"node_bmc_psu_fail_count_long": 0.0}]
    bits = blind_bits(batch(rows, nodes), starts(nodes))
    assert [names_of(int(b)) for b in bits] == [["bmc"], []]
    assert blind_to(int(bits[0]), "power") == ["bmc"] and blind_to(int(bits[0]), "thermal") == ["bmc"]


def test_signal_names_and_bits_round_trip_and_name_the_fault_classes_they_warn_of():
    assert names_of(bits_of([s.name for s in SIGNALS])) == [s.name for s in SIGNALS]
    assert bits_of(["no_such_signal"]) == 0
    b = bits_of(["ecc", "pcie"])
    assert blind_to(b, "hbm_ecc") == ["ecc"] and blind_to(b, "gpu_off_bus") == ["pcie"]
    assert blind_to(b, "nvlink") == [] and blind_to(b, "app_error") == [] and blind_to(b, None) == []


def test_a_replay_counts_a_node_blind_to_a_signal_it_did_not_send_on_half_its_ticks_and_names_the_incidents_there():
    tally = CoverageTally()
    nodes = np.array(["a", "b"], object)
    ecc, ports = bits_of(["ecc"]), bits_of(["ib_ports"])
    tally.add(nodes, np.array([ecc, ports]))       # b: its ports missed one tick of four (read slower than its GPUs)
    for _ in range(3):
        tally.add(nodes, np.array([ecc, 0]))
    tally.add(nodes, None)                         # a scorer that did not say: not counted
    assert tally.node_bits() == {"a": ecc}
    incidents = [{"id": "i1", "node": "a", "fault": "hbm_ecc", "predictable": True},
                 {"id": "i2", "node": "a", "fault": "nvlink", "predictable": True},
                 {"id": "i3", "node": "b", "fault": "ib_link", "predictable": False}]
    rep = tally.report(incidents)
    assert rep["nodes_scored"] == 2 and rep["signals"]["ecc"]["nodes"] == ["a"] and rep["signals"]["ib_ports"]["nodes"] == []
    assert rep["incidents_on_blind_nodes"] == [{"id": "i1", "node": "a", "fault": "hbm_ecc", "predictable": True,
                                                "signals": ["ecc"]}]


def test_every_signal_the_dcgm_source_warns_of_is_one_the_scores_name_with_the_same_fields():
    from collector.sources.dcgm import PRECURSOR_FIELDS

    by = {s.name: s for s in SIGNALS}
    for name, fields in PRECURSOR_FIELDS.items():
        assert all(f in by[name].enable for f in fields if "THROTTLE" not in f and "EVENT" not in f), name
