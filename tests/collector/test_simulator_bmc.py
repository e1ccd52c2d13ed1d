"""The simulated BMC: the agent's exact event shapes, precursors before power and thermal failures,
a benign background on healthy nodes, and GPU/port rows that do not move when it is switched on."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from collector.bmc_events import SEL_CLASSES, bmc_problem, sel_class
from collector.schema import FaultClass
from collector.simulator import SimConfig, Simulator
from collector.simulator.bmc import SENSORS
from collector.sources.bmc_common import sensor_event
from collector.sources.ipmi import IpmiSource, parse_sel_elist

POWER_THERMAL = {FaultClass.POWER: 1.0, FaultClass.THERMAL: 1.0}


def _run(**kw):
    cfg = SimConfig(**({"nodes": 24, "hours": 12, "seed": 5, "mix": POWER_THERMAL, "rate_multiplier": 300} | kw))
    sim = Simulator(cfg)
    gpu, net, events = [], [], []
    for ch in sim.chunks():
        gpu.append(ch.gpu)
        net.append(ch.net)
        events += ch.events
    return sim, pa.concat_tables(gpu), pa.concat_tables(net), events


@pytest.fixture(scope="module")
def fleet():
    return _run()


def _cls(e) -> int:
    return sel_class(e["sensor_type"], e["event_text"], e["asserted"])


def test_bmc_events_have_exactly_the_shapes_the_agents_bmc_sources_give(fleet):
    _, _, _, events = fleet
    bmc = [e for e in events if e["source"] == "bmc"]
    sensors = [e for e in bmc if e["kind"] == "bmc_sensor"]
    shape = set(sensor_event("n", 0.0, "s", "fan", 1.0, "RPM", "ok", {}, "ipmi"))
    assert sensors and all(set(e) == shape for e in sensors)
    assert all(bmc_problem(e) is None for e in bmc)
    sel = [e for e in bmc if e["kind"] == "sel"]
    assert sel
    # each SEL event is exactly what IpmiSource.sel_event makes of its own `sel elist` line, read by the node's
    # BMC sample that follows the entry: the sample's time is `ts`, the entry's own `sel_ts`
    reads = {(e["node"], e["ts"]) for e in sensors}
    for e in sel:
        (entry,) = parse_sel_elist(e["message"])
        assert IpmiSource(e["node"], "bmc").sel_event(entry, e["ts"]) == e
        assert (e["node"], e["ts"]) in reads
        assert 0 <= e["ts"] - e["sel_ts"] < 61  # the SEL keeps whole seconds
    lag = [e["ts"] - e["sel_ts"] for e in sel]
    assert max(lag) > 30 and min(lag) < 30  # spread over the reading minute, not stamped at the entry


def test_readings_come_once_a_minute_per_node_and_sensor(fleet):
    sim, _, _, events = fleet
    sensors = [e for e in events if e["kind"] == "bmc_sensor"]
    minutes = sim.cfg.hours * 3600 / 60
    assert len(sensors) == pytest.approx(sim.cfg.nodes * len(SENSORS) * minutes, abs=sim.cfg.nodes * len(SENSORS))
    slow = [e for e in _run(nodes=4, hours=2, bmc_sensor_period_s=300)[3] if e["kind"] == "bmc_sensor"]
    assert len(slow) == pytest.approx(4 * len(SENSORS) * 2 * 3600 / 300, abs=4 * len(SENSORS))


def test_each_power_and_thermal_incident_shows_in_its_bmc_before_the_failure(fleet):
    sim, _, _, events = fleet
    incs = [i for i in sim.plan.incidents if i.fault in (FaultClass.POWER, FaultClass.THERMAL)]
    warned = [i for i in incs if i.variant == "warned"]
    assert len(warned) >= 4 and {i.fault for i in warned} == {FaultClass.POWER, FaultClass.THERMAL}
    start, dt = sim.cfg.start_ts, sim.cfg.interval_s
    names = sim.plan.node_names
    for inc in warned:
        onset, failure = start + inc.onset * dt, start + inc.failure * dt
        mine = [e for e in events if e["source"] == "bmc" and e["node"] == names[inc.node]]
        early = [SEL_CLASSES[_cls(e)].name for e in mine if e["kind"] == "sel" and onset <= e["ts"] < failure
                 and _cls(e) >= 0]
        # a failure-class SEL entry (or, for hot inlet air, a reading past upper critical) before the failure
        inlet_hot = [e for e in mine if e["sensor"] == "Inlet Temp" and onset <= e["ts"] < failure
                     and e["value"] >= e["upper_critical"]]
        if inc.fault is FaultClass.POWER:
            assert "psu_fail" in early, inc
        else:
            assert {"fan_fail", "temp_critical"} & set(early), inc
            assert "temp_critical" not in early or inlet_hot, inc
    power = [i for i in warned if i.fault is FaultClass.POWER]
    # the failing supply's share of the node's load drifts away before it fails
    for inc in power:
        onset, failure = start + inc.onset * dt, start + inc.failure * dt
        psu = [e for e in events if e["node"] == names[inc.node] and e.get("sensor", "").startswith("PSU")
               and onset <= e["ts"] < failure and e["value"] > 0]
        by_ts: dict[float, list[float]] = {}
        for e in psu:
            by_ts.setdefault(e["ts"], []).append(e["value"])
        pairs = [v for v in by_ts.values() if len(v) == 2 and sum(v) > 0]
        if len(pairs) >= 4:
            spread = [abs(a - b) / (a + b) for a, b in pairs]
            assert np.mean(spread[-len(spread) // 3:]) > np.mean(spread[: len(spread) // 3]), inc


def test_healthy_nodes_log_only_benign_sel_entries_and_readings_inside_the_bmc_thresholds(fleet):
    sim, _, _, events = fleet
    sick = {sim.plan.node_names[i.node] for i in sim.plan.incidents}
    healthy = [e for e in events if e["source"] == "bmc" and e["node"] not in sick]
    assert healthy
    assert all(_cls(e) < 0 for e in healthy if e["kind"] == "sel")
    for e in healthy:
        if e["kind"] != "bmc_sensor":
            continue
        assert e["upper_critical"] is None or e["value"] < e["upper_critical"], e
        assert e["lower_critical"] is None or e["value"] > e["lower_critical"], e


def test_a_benign_sel_background_exists_and_each_assert_is_deasserted():
    _, _, _, events = _run(nodes=32, hours=24, rate_multiplier=0)
    sel = [e for e in events if e["kind"] == "sel"]
    assert sel and all(_cls(e) < 0 for e in sel)
    up = sorted((e["node"], e["sensor"]) for e in sel if e["asserted"])
    down = sorted((e["node"], e["sensor"]) for e in sel if not e["asserted"])
    assert up == down


def test_switching_the_bmc_on_moves_no_gpu_or_port_row_and_no_xid():
    _, g_on, n_on, ev_on = _run(nodes=6, hours=4)
    _, g_off, n_off, ev_off = _run(nodes=6, hours=4, bmc=False)
    assert g_on.equals(g_off) and n_on.equals(n_off)
    assert [e for e in ev_on if e["source"] != "bmc"] == ev_off
    assert all(e["source"] != "bmc" for e in ev_off) and any(e["source"] == "bmc" for e in ev_on)


def test_bmc_events_do_not_depend_on_the_chunk_size():
    _, _, _, a = _run(nodes=4, hours=3)
    _, _, _, b = _run(nodes=4, hours=3, chunk_ticks=97)
    key = lambda e: (e["ts"], e["node"], e.get("sensor") or "", e.get("event_text") or "")  # noqa: E731
    assert sorted((e for e in a if e["source"] == "bmc"), key=key) == \
        sorted((e for e in b if e["source"] == "bmc"), key=key)
