"""BMC sources: the ``sel elist`` / ``sensor`` parsers on captured output, and (marker ``bmc``) the real
ipmi_sim and sushy-emulator services started by deploy/testservices/bmc_up.sh."""

from __future__ import annotations

import calendar
import http.server
import json
import logging
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import pytest

from collector.agent import Agent
from collector.agent_settings import AgentSettings
from collector.bmc_events import sel_of_message
from collector.sources.base import SourceError, TransientSourceError
from collector.sources.bmc_common import SourceBackoff
from collector.sources.ipmi import IpmiSource, parse_sel_elist, parse_sensor_list
from collector.sources.redfish import REDISCOVER_S, RedfishPayloadError, RedfishSource, power_events
from collector.wire import decode_event
from fakes import CountingSource, FakeClock
from test_agent import FakeSink

SEL_ELIST = """\
Unable to Get Channel Cipher Suites
   1 |  Pre-Init  |0000029360| Power Supply #0x01 | Failure detected | Asserted
   a | 03/12/2026 | 07:06:01 | Fan #0x30 | Lower Critical going low  | Asserted | Reading 0 < Threshold 500 RPM
  1b | 03/12/2026 | 07:08:00 | Power Supply #0x01 | Failure detected | Deasserted
SEL has no entries
"""

SENSOR_LIST = """\
Inlet Temp       | 24.000     | degrees C  | ok    | na        | 0.000     | 5.000     | 40.000    | 45.000    | 50.000
FAN1             | 5400.000   | RPM        | ok    | na        | 500.000   | 800.000   | na        | na        | na
PSU1 Status      | 0x0        | discrete   | 0x0100| na        | na        | na        | na        | na        | na
"""


def test_sel_elist_lines_become_entries_with_hex_ids_and_direction() -> None:
    entries = parse_sel_elist(SEL_ELIST)
    assert [e.sel_id for e in entries] == [1, 10, 27]
    psu = entries[0]
    assert (psu.sensor, psu.sensor_type, psu.event_text, psu.asserted, psu.ts) == (
        "Power Supply #0x01", "Power Supply", "Failure detected", True, None)
    assert entries[1].ts == pytest.approx(time.mktime(time.strptime("2026-03-12 07:06:01", "%Y-%m-%d %H:%M:%S"))
                                          - time.timezone, abs=3600)
    assert entries[2].asserted is False


def test_a_raw_sel_line_from_another_collector_reads_as_the_ipmi_source_reads_it() -> None:
    for e in parse_sel_elist(SEL_ELIST):
        assert sel_of_message(e.line) == (e.sensor_type, e.event_text, e.asserted)
    assert sel_of_message("PSU4 Status: Failure detected, redundancy lost") == ("Power Supply", "Failure detected",
                                                                                 True)
    assert sel_of_message("Inlet Temp: Upper Critical going high - Deasserted") == (
        "Temperature", "Upper Critical going high", False)
    for unread in ("PSU2 presence detected", "Failure detected on DIMM A1", "Fan 2 speed low", "", None, 42):
        assert sel_of_message(unread) is None


def test_sensor_list_keeps_the_bmc_thresholds_and_skips_discrete_sensors() -> None:
    readings = parse_sensor_list(SENSOR_LIST)
    assert [r.name for r in readings] == ["Inlet Temp", "FAN1"]
    assert readings[0].value == 24.0
    assert readings[0].thresholds["upper_critical"] == 45.0
    assert readings[1].thresholds["lower_critical"] == 500.0 and readings[1].thresholds["upper_critical"] is None
    assert readings[0].thresholds["upper_fatal"] == 50.0 and readings[0].thresholds["lower_fatal"] is None


def test_backoff_doubles_and_refuses_early_tries() -> None:
    b = SourceBackoff(initial_s=5, max_s=20)
    assert [b.failed(0.0) for _ in range(4)] == [5, 10, 20, 20]
    with pytest.raises(TransientSourceError, match="next try in 20 s"):
        b.check(0.0, "x")
    b.check(20.0, "x")


# ------------------------------------------------------------------------- real BMC services


def _ipmi(bmc: dict, state: Path, **kw) -> IpmiSource:
    pw = Path(bmc["passfile"]).read_text().strip()
    return IpmiSource("gpu-node-001", bmc["ipmi_host"], int(bmc["ipmi_port"]), bmc["user"], pw, state, **kw)


@pytest.mark.bmc
def test_psu_failure_in_the_sel_becomes_one_bmc_event_never_read_twice_across_restarts(bmc, tmp_path: Path) -> None:
    state = tmp_path / "sel.json"
    state.write_text(json.dumps({"last_sel_id": 0}))  # the agent had read the SEL before the entry came
    first = _ipmi(bmc, state).sample(time.time()).events
    sel = [e for e in first if e["kind"] == "sel"]
    psu = [e for e in sel if e["sensor_type"] == "Power Supply" and e["event_text"] == "Failure detected"]
    assert psu and psu[0]["source"] == "bmc" and psu[0]["asserted"] is True
    again = _ipmi(bmc, state).sample(time.time()).events  # a new source: the agent restarted
    assert [e for e in again if e["kind"] == "sel"] == []


#: Add SEL Entry (NetFn storage 0x0a, cmd 0x44): a system event record, power supply sensor 0x01, "Failure detected"
ADD_PSU_FAILURE = ("raw", "0x0a", "0x44", "0x00", "0x00", "0x02", "0x00", "0x00", "0x00", "0x00", "0x20", "0x00",
                   "0x04", "0x08", "0x01", "0x6f", "0x01", "0xff", "0xff")


@pytest.mark.bmc
def test_a_new_install_reads_the_sels_undated_history_as_history_and_a_failure_after_it_as_new(
        bmc, tmp_path: Path, caplog) -> None:
    src = _ipmi(bmc, tmp_path / "sel.json", read_sensors=False)  # no state file: the agent's first start here
    with caplog.at_level(logging.WARNING, logger="collector.sources.ipmi"):
        assert src.sample(time.time()).events == []  # bmc_up.sh's Pre-Init PSU failure is history: no drain
    assert "are the node's history and are not published" in caplog.text
    added = None
    try:
        out = src.run(*ADD_PSU_FAILURE).split()
        added = int(out[1] + out[0], 16)  # the record id the BMC gave it, little-endian
        (new,) = src.sample(time.time()).events
        assert (new["sel_id"], new["sensor_type"], new["event_text"], new["asserted"]) == (
            added, "Power Supply", "Failure detected", True)
    finally:
        if added is not None:
            src.run("sel", "delete", str(added))


class _SelText(IpmiSource):
    """The ipmi source reading a given ``sel elist`` text instead of a BMC."""

    def __init__(self, text: str, state: Path | None) -> None:
        super().__init__("gpu-node-001", "bmc", state_file=state, read_sensors=False)
        self.text = text

    def run(self, *args: str) -> str:
        return self.text


def test_a_sel_entry_is_stamped_when_read_so_the_live_pipeline_counts_it_whatever_the_bmcs_clock(
        tmp_path: Path) -> None:
    from pipeline.settings import PipelineSettings
    from pipeline.stream import FeaturePipeline

    now = float(calendar.timegm((2026, 3, 12, 7, 10, 0)))
    state = tmp_path / "s.json"
    state.write_text(json.dumps({"last_sel_id": 0}))
    text = "   7 | 03/12/2026 | 07:08:50 | Power Supply #0x01 | Failure detected | Asserted\n"  # 70 s before the read
    (e,) = _SelText(text, state).sample(now).events
    assert (e["ts"], e["sel_ts"]) == (now, now - 70.0)
    pipe = FeaturePipeline(PipelineSettings())  # live: ticks up to 30 s before the fleet's newest telemetry closed
    ts = now - 180.0 + 10.0 * np.arange(19)  # three minutes of one GPU's samples, up to the read
    gpu = {"ts": ts, "node": "gpu-node-001", "gpu": 0, "util_gpu": 50.0, "throttle_reasons": 0.0}
    pipe.ingest_frames(pd.DataFrame(gpu), None, None)
    pipe.advance(now - pipe.settings.allowed_lateness_s)
    assert e["sel_ts"] < pipe.closed_until  # stamped by the BMC's clock it would be late, and dropped
    pipe.ingest_frames(None, None, pd.DataFrame([e]))
    assert pipe.counts.late_rows == 0
    last = pipe.flush()[-1].to_frame().iloc[0]
    assert last["node_bmc_psu_fail_count_short"] == 1


def test_the_first_read_publishes_only_entries_dated_within_ten_minutes(tmp_path: Path) -> None:
    now = float(calendar.timegm((2026, 3, 12, 7, 10, 0)))
    text = ("   1 |  Pre-Init  |0000029360| Power Supply #0x01 | Failure detected | Asserted\n"
            "   2 | 03/11/2026 | 07:06:01 | Power Supply #0x01 | Failure detected | Asserted\n"
            "   3 | 03/12/2026 | 07:06:01 | Fan #0x30 | Lower Critical going low | Asserted\n")
    assert [e["sel_id"] for e in _SelText(text, tmp_path / "s.json").sample(now).events] == [3]
    assert json.loads((tmp_path / "s.json").read_text())["last_sel_id"] == 3  # history is passed, not re-read
    later = _SelText(text + "   4 |  Pre-Init  |0000029999| Power Supply #0x01 | Failure detected | Asserted\n",
                     tmp_path / "s.json")
    assert [e["sel_id"] for e in later.sample(now).events] == [4]  # with a position, an undated entry is new
    assert [e["sel_id"] for e in _SelText(text, None).sample(now + 3600).events] == []  # no state file at all


@pytest.mark.bmc
def test_redfish_thermal_readings_carry_the_bmc_thresholds(bmc) -> None:
    events = RedfishSource("gpu-node-001", bmc["redfish"]).sample(time.time()).events
    temps = [e for e in events if e["sensor_type"] == "temperature"]
    assert temps and all(e["source"] == "bmc" and e["kind"] == "bmc_sensor" for e in temps)
    intake = next(e for e in temps if "Intake" in e["sensor"])
    assert intake["value"] is not None and intake["upper_critical"] is not None
    assert intake["upper_noncritical"] <= intake["upper_critical"]


@pytest.mark.bmc
def test_a_bmc_that_does_not_answer_is_a_source_error_and_the_other_sources_still_publish(bmc, tmp_path) -> None:
    dead = IpmiSource("gpu-node-001", "127.0.0.1", 16299, "gpuops", "x", tmp_path / "s.json", timeout_s=3)
    dead_rf = RedfishSource("gpu-node-001", "http://127.0.0.1:16298", timeout_s=2)
    sink = FakeSink()
    # a tick waits for its sources at most source_wait_s (2 s by default): here long enough for the dead BMCs'
    # own timeouts (3 s, 2 s), so their failures are counted in the tick that asked; the BMCs are asked every
    # tick (bmc_interval_s = interval_s), so the second tick shows the backoff, not the BMC interval
    agent = Agent(AgentSettings(node="gpu-node-001", health_file=None, source_wait_s=5, bmc_interval_s=10),
                  [dead, dead_rf, CountingSource()], sink)
    agent.tick()
    agent.publish_pending()
    assert agent.source_errors["ipmi"] == 1 and agent.source_errors["redfish"] == 1
    assert any(m.topic == agent.settings.telemetry_topic for m in sink.delivered)
    t0 = time.monotonic()
    agent.tick()  # backing off: the dead BMCs are not asked again at once
    assert time.monotonic() - t0 < 1.0 and agent.source_errors["ipmi"] == 2


class _CountingBmc(CountingSource):
    name = "ipmi"


def _sampled_at(every_s: float, ticks: list[float], fake_clock: FakeClock) -> tuple[list[float], int]:
    """When a BMC source sampled, and how often the every-tick source did, over ticks at *ticks* s."""
    bmc, other = _CountingBmc(), CountingSource()
    start = fake_clock.t
    agent = Agent(AgentSettings(node="gpu-node-001", health_file=None, interval_s=10, bmc_interval_s=every_s),
                  [bmc, other], FakeSink(), clock=fake_clock)
    seen: list[float] = []
    for t in ticks:
        fake_clock.advance(start + t - fake_clock.t)
        n = bmc.n
        agent.tick()
        if bmc.n > n:
            seen.append(t)
    return seen, other.n


def test_bmc_sources_sample_every_bmc_interval_and_the_others_every_tick(fake_clock: FakeClock) -> None:
    ticks = [10.0 * i for i in range(13)]
    ticks[6] -= 0.3  # a tick a little early (the loop's clock is monotonic, the sample's is wall time)
    seen, others = _sampled_at(60.0, ticks, fake_clock)
    assert seen == [0.0, 59.7, 120.0] and others == 13


def test_a_bmc_interval_at_or_under_the_tick_samples_the_bmc_every_tick(fake_clock: FakeClock) -> None:
    seen, _ = _sampled_at(5.0, [0.0, 10.0, 20.0], fake_clock)
    assert seen == [0.0, 10.0, 20.0]


class _RedfishTree:
    """A Redfish service over HTTP whose resources a test edits (``tree``: path with its query -> JSON object, or
    the raw bytes of a malformed one; ``status``: path -> an HTTP status other than 200), counting GETs."""

    def __init__(self, tree: dict[str, dict | bytes]) -> None:
        self.tree, self.gets, self.status = tree, [], {}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.gets.append(self.path)
                body = outer.tree.get(self.path)
                self.send_response(outer.status.get(self.path, 200 if body is not None else 404))
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body if isinstance(body, bytes) else json.dumps(body or {"error": "not found"}).encode())

            def log_message(self, *args) -> None:
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stop answering (what a dead BMC does); closing twice is fine."""
        if self.srv.fileno() != -1:
            self.srv.shutdown()
            self.srv.server_close()


@pytest.fixture
def bad_redfish() -> Iterator[str]:
    srv = _RedfishTree({"/redfish/v1/Chassis": {"Members": [{"@odata.id": "/redfish/v1/Chassis/1"}]},
                        "/redfish/v1/Chassis/1": b'{"Id": "1", "Thermal": {"@odata.id": "/t"}', "/t": b"[]"})
    yield srv.url
    srv.close()


@pytest.mark.bmc
def test_a_malformed_redfish_payload_is_a_clear_error_and_the_agent_goes_on(bad_redfish: str, bmc) -> None:
    src = RedfishSource("gpu-node-001", bad_redfish)
    with pytest.raises(RedfishPayloadError, match=r"Chassis/1 returned malformed JSON"):
        src.sample(time.time())
    sink = FakeSink()
    good = RedfishSource("gpu-node-001", bmc["redfish"])
    agent = Agent(AgentSettings(node="gpu-node-001", health_file=None), [src, good], sink)
    agent.tick()
    agent.publish_pending()
    assert agent.source_errors["redfish"] == 1
    events = [decode_event(m.value) for m in sink.delivered if m.topic == agent.settings.events_topic]
    assert any(e["kind"] == "bmc_sensor" for e in events)
    assert isinstance(RedfishPayloadError("x"), SourceError)


# ---- sensors on the real emulators (bmc_up.sh: ipmi_sim "Inlet Temp" and "FAN1"; sushy Thermal) ---

def _agent_sensor_events(source) -> dict[str, dict]:
    """What the agent publishes for *source*'s ``bmc_sensor`` readings, by sensor name."""
    sink = FakeSink()
    agent = Agent(AgentSettings(node="gpu-node-001", health_file=None), [source], sink)
    agent.tick()
    agent.publish_pending()
    assert agent.source_errors.get(source.name, 0) == 0
    events = [decode_event(m.value) for m in sink.delivered if m.topic == agent.settings.events_topic]
    return {e["sensor"]: e for e in events if e["kind"] == "bmc_sensor"}


def _thresholds(e: dict) -> tuple:
    return tuple(e[k] for k in ("lower_fatal", "lower_critical", "lower_noncritical",
                                "upper_noncritical", "upper_critical", "upper_fatal"))


@pytest.mark.bmc
def test_ipmi_sensors_become_bmc_sensor_events_with_the_bmcs_own_thresholds(bmc, tmp_path: Path) -> None:
    got = _agent_sensor_events(_ipmi(bmc, tmp_path / "sel.json"))
    inlet, fan = got["Inlet Temp"], got["FAN1"]
    assert (inlet["source"], inlet["protocol"], inlet["sensor_type"], inlet["value"], inlet["unit"], inlet["status"]) \
        == ("bmc", "ipmi", "temperature", 24.0, "degrees C", "ok")
    assert _thresholds(inlet) == (None, None, None, 40.0, 45.0, 50.0)
    assert (fan["sensor_type"], fan["value"], fan["unit"]) == ("fan", 5400.0, "RPM")
    assert _thresholds(fan) == (250.0, 500.0, 800.0, None, None, None)


@pytest.mark.bmc
def test_an_ipmi_threshold_changed_on_the_bmc_is_what_the_next_sample_reports(bmc, tmp_path: Path) -> None:
    src = _ipmi(bmc, tmp_path / "sel.json")
    try:   # the BMC's own thresholds, not a copy: lower Inlet Temp's upper non-critical below its reading
        src.run("sensor", "thresh", "Inlet Temp", "unc", "20")
        inlet = _agent_sensor_events(src)["Inlet Temp"]
        assert inlet["upper_noncritical"] == 20.0 and inlet["value"] == 24.0 and inlet["status"] == "nc"
    finally:
        src.run("sensor", "thresh", "Inlet Temp", "unc", "40")
    assert _agent_sensor_events(src)["Inlet Temp"]["upper_noncritical"] == 40.0


@pytest.mark.bmc
def test_redfish_fans_carry_their_reading_and_fatal_threshold_and_a_chassis_without_power_is_no_error(bmc) -> None:
    got = _agent_sensor_events(RedfishSource("gpu-node-001", bmc["redfish"]))
    fans = {name: e for name, e in got.items() if e["sensor_type"] == "fan"}
    assert fans and all(e["unit"] == "RPM" and e["value"] > 0 and e["status"] == "OK" for e in fans.values())
    assert {_thresholds(e) for e in fans.values()} == {(0.0, None, None, None, None, None)}
    # sushy-emulator --fake links no Power resource from its chassis: no PSU readings, and no error
    assert not [e for e in got.values() if e["sensor_type"] == "power_supply"]


#: a Chassis Power resource shaped after DMTF's public Redfish mockups (sushy --fake serves none)
POWER = {"@odata.id": "/redfish/v1/Chassis/1U/Power", "Id": "Power",
         "PowerControl": [{"MemberId": "0", "Name": "System Power Control", "PowerConsumedWatts": 344,
                           "PowerCapacityWatts": 800,
                           "PowerLimit": {"LimitInWatts": 500, "LimitException": "LogEventOnly"},
                           "Status": {"State": "Enabled", "Health": "OK"}}],
         "PowerSupplies": [{"MemberId": "0", "Name": "Power Supply Bay 1", "LastPowerOutputWatts": 325,
                            "Status": {"State": "Enabled", "Health": "Warning"}},
                           {"MemberId": "1", "Name": "Power Supply Bay 2", "Status": {"State": "Absent"}}]}


def test_redfish_power_gives_each_psus_health_and_the_consumption_against_the_power_cap() -> None:
    events = {e["sensor"]: e for e in power_events("gpu-node-001", 1.0, "1U", POWER, "http://bmc/Power")}
    bay1, bay2 = events["1U/Power Supply Bay 1"], events["1U/Power Supply Bay 2"]
    ctl = events["1U/System Power Control"]
    assert (bay1["sensor_type"], bay1["value"], bay1["status"]) == ("power_supply", 325.0, "Warning")
    assert (bay2["value"], bay2["status"]) == (None, None)
    assert (ctl["sensor_type"], ctl["value"], ctl["unit"], ctl["upper_critical"]) == ("power", 344.0, "W", 500.0)
    with pytest.raises(RedfishPayloadError, match="'PowerControl' is dict"):
        power_events("gpu-node-001", 1.0, "1U", {"PowerControl": {}}, "http://bmc/Power")


def _hgx(board: str = "HGX_Baseboard_0", others: int = 6) -> dict[str, dict]:
    """A chassis collection like an HGX board's: one chassis with Thermal and Power, *others* with neither."""
    members = [board] + [f"HGX_GPU_SXM_{i}" for i in range(1, others + 1)]
    tree: dict[str, dict] = {"/redfish/v1/Chassis": {"Members": [{"@odata.id": f"/redfish/v1/Chassis/{m}"}
                                                                 for m in members]}}
    for m in members:
        tree[f"/redfish/v1/Chassis/{m}"] = {"Id": m}
    c = f"/redfish/v1/Chassis/{board}"
    tree[c] |= {"Thermal": {"@odata.id": f"{c}/Thermal"}, "Power": {"@odata.id": f"{c}/Power"}}
    tree[f"{c}/Thermal"] = {"Temperatures": [{"Name": "Inlet", "ReadingCelsius": 24.0, "UpperThresholdCritical": 45}]}
    tree[f"{c}/Power"] = {"PowerSupplies": [{"Name": "PSU0", "Status": {"Health": "OK"}, "LastPowerOutputWatts": 900}]}
    return tree


@pytest.fixture
def redfish_tree() -> Iterator[_RedfishTree]:
    srv = _RedfishTree(_hgx())
    yield srv
    srv.close()


def test_redfish_walks_the_chassis_once_and_then_reads_only_their_thermal_and_power(redfish_tree) -> None:
    src = RedfishSource("gpu-node-001", redfish_tree.url, timeout_s=2)
    first = src.sample(1000.0).events
    assert len(redfish_tree.gets) == 1 + 7 + 2  # the collection, each chassis, the two resources
    redfish_tree.gets.clear()
    later = src.sample(1060.0).events
    assert sorted(redfish_tree.gets) == ["/redfish/v1/Chassis/HGX_Baseboard_0/Power",
                                         "/redfish/v1/Chassis/HGX_Baseboard_0/Thermal"]
    assert (src.health()["requests_per_sample"], src.health()["schema"]) == (2, ["old"])
    assert [(e["sensor"], e["value"]) for e in later] == [(e["sensor"], e["value"]) for e in first]
    assert {e["sensor"] for e in later} == {"HGX_Baseboard_0/Inlet", "HGX_Baseboard_0/PSU0"}
    redfish_tree.gets.clear()
    src.sample(1000.0 + REDISCOVER_S)  # the walk is old: made again
    assert redfish_tree.gets[0] == "/redfish/v1/Chassis" and len(redfish_tree.gets) == 10


def test_a_chassis_renumbered_on_the_bmc_is_found_again_in_the_same_sample(redfish_tree) -> None:
    src = RedfishSource("gpu-node-001", redfish_tree.url, timeout_s=2)
    src.sample(1000.0)
    redfish_tree.tree = _hgx(board="HGX_Baseboard_1")  # a board swap: the old paths answer 404
    events = src.sample(1060.0).events
    assert {e["sensor"] for e in events} == {"HGX_Baseboard_1/Inlet", "HGX_Baseboard_1/PSU0"}


def test_a_redfish_bmc_that_stops_answering_costs_one_request_and_the_next_sample_walks_again(redfish_tree) -> None:
    src = RedfishSource("gpu-node-001", redfish_tree.url, timeout_s=2)
    src.sample(1000.0)
    redfish_tree.close()  # now nothing answers
    n = src.requests
    with pytest.raises(TransientSourceError, match="did not answer"):
        src.sample(1060.0)
    assert src.requests == n + 1  # no walk behind a BMC that does not answer
    assert src._found is None  # the sample after the backoff walks again
