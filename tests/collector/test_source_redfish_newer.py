"""The Redfish source on BMCs with only the newer schema (Sensors, PowerSubsystem) and behind HTTPS: the real
sushy-static responder serving bmc_up.sh's bmcweb-shaped mockup with a self-signed certificate (marker
``bmc``), and an HTTP fake for what that responder cannot do (``$expand``, refusing it, malformed sensors)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Iterator

import pytest

from collector.sources.base import PermanentSourceError, SourceOptions, TransientSourceError
from collector.sources.redfish import RedfishPayloadError, RedfishSource
from collector.sources.redfish_sensors import expand_query, sensor_type_of
from pipeline.bmc import KIND_FAN, KIND_INLET, bmc_rows_from_records
from pipeline.registry import Keys
from test_source_bmc import _RedfishTree, _agent_sensor_events, _thresholds

C = "/redfish/v1/Chassis"
EXPAND = "?$expand=.($levels=1)"


def _newer_bmc(bmc: dict, **kw) -> RedfishSource:
    """The source on the HTTPS test BMC, its self-signed certificate as the CA (as an operator configures it)."""
    opts = SourceOptions(node="gpu-node-001", redfish_url=bmc["redfish_newer"], redfish_ca_file=Path(bmc["redfish_ca"]),
                         bmc_timeout_s=5)
    return RedfishSource.from_options(dataclasses.replace(opts, **kw))


@pytest.mark.bmc
def test_a_bmc_with_only_the_newer_schema_gives_its_readings_thresholds_and_power_supplies(bmc) -> None:
    got = _agent_sensor_events(_newer_bmc(bmc))
    assert set(got) == {"chassis/Inlet Temp", "chassis/CPU0 Temp", "chassis/Fan0 Tach", "chassis/Total Power",
                        "chassis/PSU0", "chassis/PSU1", "HGX_GPU_SXM_1/HGX GPU SXM 1 TEMP 0"}  # no volts, %, joules
    inlet, fan = got["chassis/Inlet Temp"], got["chassis/Fan0 Tach"]
    assert (inlet["protocol"], inlet["sensor_type"], inlet["value"], inlet["unit"], inlet["status"]) == (
        "redfish", "temperature", 24.5, "Cel", "OK")
    assert _thresholds(inlet) == (None, None, None, 40.0, 45.0, 50.0)
    assert (fan["sensor_type"], fan["value"], fan["unit"]) == ("fan", 5400.0, "RPM")
    assert _thresholds(fan) == (None, 500.0, 800.0, None, None, None)
    assert (got["chassis/Total Power"]["sensor_type"], got["chassis/Total Power"]["value"]) == ("power", 3120.0)
    assert [(got[p]["sensor_type"], got[p]["status"]) for p in ("chassis/PSU0", "chassis/PSU1")] == [
        ("power_supply", "OK"), ("power_supply", "Critical")]
    # the pipeline reads them as it reads the old schema's: the inlet's margin to critical, the fan's above it
    rows = bmc_rows_from_records(list(got.values()), Keys())
    margins = {int(k): float(m) for k, m in zip(rows.kind, rows.margin) if k in (KIND_INLET, KIND_FAN)}
    assert margins == {KIND_INLET: 45.0 - 24.5, KIND_FAN: 5400.0 - 500.0}


@pytest.mark.bmc
def test_without_expand_a_sample_asks_only_for_the_sensors_and_supplies_the_walk_kept(bmc) -> None:
    src = _newer_bmc(bmc)
    first = src.sample(1000.0).events
    n = src.requests
    later = src.sample(1060.0).events
    assert src.requests - n == 7  # 5 sensors read, 2 supplies; no collection, chassis or skipped sensor
    assert [(e["sensor"], e["value"], e["status"]) for e in later] == [(e["sensor"], e["value"], e["status"])
                                                                      for e in first]


@pytest.mark.bmc
def test_chassis_named_by_redfish_skip_chassis_cost_no_request_and_give_no_reading(bmc, caplog) -> None:
    src = _newer_bmc(bmc, redfish_skip_chassis=("HGX_GPU_*",))  # NVML reads the GPUs
    got = _agent_sensor_events(src)
    assert set(got) == {"chassis/Inlet Temp", "chassis/CPU0 Temp", "chassis/Fan0 Tach", "chassis/Total Power",
                        "chassis/PSU0", "chassis/PSU1"}
    assert (src.health()["chassis"], src.health()["skipped_chassis"], src.health()["requests_per_sample"]) == (1, 1, 6)
    n = src.requests
    src.sample(1060.0)
    assert src.requests - n == 6  # the GPU chassis' sensor is no longer read (7 without the setting)
    with caplog.at_level(logging.WARNING, logger="collector.sources.redfish"):
        everything = _newer_bmc(bmc, redfish_skip_chassis=("chassis", "HGX_*"))
        assert everything.sample(1000.0).events == []
    assert "skips all 2 chassis" in caplog.text and everything.health()["skipped_chassis"] == 2


@pytest.mark.bmc
def test_a_bmc_certificate_that_does_not_verify_is_an_error_that_names_the_setting(bmc, caplog) -> None:
    for src in (_newer_bmc(bmc, redfish_ca_file=None),  # the system's CAs do not know a self-signed BMC
                _newer_bmc(bmc, redfish_url=bmc["redfish_newer"].replace("127.0.0.1", "localhost"))):  # not its name
        with pytest.raises(TransientSourceError, match=r"certificate that does not verify .*redfish_ca_file"):
            src.sample(1000.0)
    with caplog.at_level(logging.WARNING, logger="collector.sources.redfish"):
        unchecked = _newer_bmc(bmc, redfish_ca_file=None, redfish_tls_verify=False)
    assert "not checking the HTTPS certificate" in caplog.text
    assert any(e["sensor"] == "chassis/Inlet Temp" for e in unchecked.sample(1000.0).events)


def test_a_ca_file_that_is_not_a_certificate_stops_the_source_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "bmc.crt"
    bad.write_text("not a certificate\n")
    for ca in (bad, tmp_path / "missing.crt"):
        with pytest.raises(PermanentSourceError, match=f"cannot read redfish_ca_file {ca}"):
            RedfishSource("gpu-node-001", "https://bmc.example", ca_file=ca)
    RedfishSource("gpu-node-001", "http://bmc.example", ca_file=bad)  # plain HTTP has no certificate to check


def _newer(expand: dict | None = None, cid: str = "1") -> dict[str, dict]:
    """A BMC with one newer-schema chassis *cid* (an inlet, a fan in %, one supply), and with *expand* as its
    service root's ExpandQuery; the expanded collections answer where the query is advertised."""
    c = f"{C}/{cid}"
    s = f"{c}/Sensors"
    inlet = {"@odata.id": f"{s}/inlet", "Name": "Inlet", "ReadingType": "Temperature", "ReadingUnits": "Cel",
             "Reading": 30.0, "Thresholds": {"UpperCritical": {"Reading": 42.0}}}
    duty = {"@odata.id": f"{s}/duty", "Name": "Fan duty", "ReadingType": "Percent", "ReadingUnits": "%", "Reading": 40}
    psu = {"@odata.id": f"{c}/PowerSubsystem/PowerSupplies/0", "Name": "PSU 0", "Status": {"Health": "Warning"}}
    tree: dict[str, dict] = {
        "/redfish/v1": {"ProtocolFeaturesSupported": {"ExpandQuery": expand or {}}},
        C: {"Members": [{"@odata.id": c}]},
        c: {"Id": cid, "Sensors": {"@odata.id": s}, "PowerSubsystem": {"@odata.id": f"{c}/PowerSubsystem"}},
        s: {"Members": [{"@odata.id": inlet["@odata.id"]}, {"@odata.id": duty["@odata.id"]}]},
        inlet["@odata.id"]: inlet, duty["@odata.id"]: duty,
        f"{c}/PowerSubsystem": {"PowerSupplies": {"@odata.id": f"{c}/PowerSubsystem/PowerSupplies"}},
        f"{c}/PowerSubsystem/PowerSupplies": {"Members": [{"@odata.id": psu["@odata.id"]}]},
        psu["@odata.id"]: psu,
    }
    if expand:
        tree[s + EXPAND] = {"Members": [inlet, duty]}
        tree[f"{c}/PowerSubsystem/PowerSupplies" + EXPAND] = {"Members": [psu]}
    return tree


@pytest.fixture
def tree() -> Iterator[_RedfishTree]:
    srv = _RedfishTree({})
    yield srv
    srv.close()


def _readings(events: list[dict]) -> list[tuple]:
    return sorted((e["sensor"], e["sensor_type"], e["value"], e["status"], e["upper_critical"]) for e in events)


WANT = [("1/Inlet", "temperature", 30.0, None, 42.0), ("1/PSU 0", "power_supply", None, "Warning", None)]


def test_a_bmc_that_expands_collections_is_read_in_one_request_per_collection(tree: _RedfishTree) -> None:
    tree.tree = _newer({"NoLinks": True, "Levels": True})
    src = RedfishSource("gpu-node-001", tree.url, timeout_s=2)
    assert _readings(src.sample(1000.0).events) == WANT
    assert f"{C}/1/Sensors/inlet" not in tree.gets  # the walk read the members expanded too
    tree.gets.clear()
    assert _readings(src.sample(1060.0).events) == WANT
    assert sorted(tree.gets) == [f"{C}/1/PowerSubsystem/PowerSupplies" + EXPAND, f"{C}/1/Sensors" + EXPAND]
    assert (src.health()["expand"], src.health()["requests_per_sample"]) == (True, 2)


@pytest.mark.parametrize("how", ["refused", "ignored"])
def test_a_bmc_that_advertises_expand_and_then_refuses_or_ignores_it_is_read_member_by_member(
        tree: _RedfishTree, how: str, caplog) -> None:
    tree.tree = _newer({"NoLinks": True, "Levels": True})
    src = RedfishSource("gpu-node-001", tree.url, timeout_s=2)
    src.sample(1000.0)
    if how == "refused":  # a firmware update turned the query off: HTTP 501, as the spec asks for an unsupported one
        tree.tree[f"{C}/1/Sensors" + EXPAND] = b'{"error": "query not supported"}'
        tree.status[f"{C}/1/Sensors" + EXPAND] = 501
    else:  # answered as if there were no query: the members as bare links
        tree.tree[f"{C}/1/Sensors" + EXPAND] = tree.tree[f"{C}/1/Sensors"]
    tree.gets.clear()
    with caplog.at_level(logging.WARNING, logger="collector.sources.redfish"):
        assert _readings(src.sample(1060.0).events) == WANT
    assert "advertises $expand but" in caplog.text
    tree.gets.clear()
    assert _readings(src.sample(1120.0).events) == WANT  # and from now on, without asking for it again
    assert sorted(tree.gets) == [f"{C}/1/PowerSubsystem/PowerSupplies/0", f"{C}/1/Sensors/inlet"]


def test_an_expanded_collection_gone_in_a_sample_is_a_renumbered_chassis_found_again_not_a_refusal(
        tree: _RedfishTree, caplog) -> None:
    tree.tree = _newer({"NoLinks": True, "Levels": True})
    src = RedfishSource("gpu-node-001", tree.url, timeout_s=2)
    src.sample(1000.0)
    tree.tree = _newer({"NoLinks": True, "Levels": True}, cid="2")  # the old paths answer 404 now
    tree.gets.clear()
    with caplog.at_level(logging.WARNING, logger="collector.sources.redfish"):
        assert _readings(src.sample(1060.0).events) == [("2/Inlet",) + WANT[0][1:], ("2/PSU 0",) + WANT[1][1:]]
    assert "advertises $expand" not in caplog.text
    tree.gets.clear()
    src.sample(1120.0)
    assert sorted(tree.gets) == [f"{C}/2/PowerSubsystem/PowerSupplies" + EXPAND, f"{C}/2/Sensors" + EXPAND]


def test_a_chassis_with_the_old_schema_too_is_read_through_it_alone(tree: _RedfishTree) -> None:
    tree.tree = _newer()
    tree.tree[f"{C}/1"]["Thermal"] = {"@odata.id": f"{C}/1/Thermal"}
    tree.tree[f"{C}/1/Thermal"] = {"Temperatures": [{"Name": "Inlet", "ReadingCelsius": 29.0}]}
    src = RedfishSource("gpu-node-001", tree.url, timeout_s=2)
    assert [(e["sensor"], e["value"]) for e in src.sample(1000.0).events] == [("1/Inlet", 29.0)]
    assert not [g for g in tree.gets if "Sensors" in g or "PowerSubsystem" in g or g == "/redfish/v1"]


def test_a_malformed_sensor_is_a_clear_error_naming_it(tree: _RedfishTree) -> None:
    tree.tree = _newer()
    tree.tree[f"{C}/1/Sensors/inlet"]["Thresholds"] = {"UpperCritical": 42.0}
    with pytest.raises(RedfishPayloadError, match=r"Sensors/inlet: Thresholds.UpperCritical is float"):
        RedfishSource("gpu-node-001", tree.url, timeout_s=2).sample(1000.0)


def test_a_bmc_with_nothing_readable_says_so(tree: _RedfishTree, caplog) -> None:
    tree.tree = {C: {"Members": [{"@odata.id": f"{C}/HGX_GPU_SXM_1"}]},
                 f"{C}/HGX_GPU_SXM_1": {"Id": "HGX_GPU_SXM_1", "ThermalSubsystem": {"@odata.id": "/x"}}}
    src = RedfishSource("gpu-node-001", tree.url, timeout_s=2)
    with caplog.at_level(logging.WARNING, logger="collector.sources.redfish"):
        assert src.sample(1000.0).events == []
    assert "none of the 1 chassis" in caplog.text and "reads no sensor" in caplog.text


def test_the_expand_query_and_sensor_kinds_follow_the_schema() -> None:
    q = lambda **e: expand_query({"ProtocolFeaturesSupported": {"ExpandQuery": e}})  # noqa: E731
    assert (q(NoLinks=True, Levels=True), q(NoLinks=True), q(ExpandAll=True, Levels=True), q(Links=True), q()) == (
        "?$expand=.($levels=1)", "?$expand=.", "?$expand=*($levels=1)", "", "")
    assert expand_query({}) == "" and expand_query({"ProtocolFeaturesSupported": []}) == ""
    kinds = [sensor_type_of(s) for s in ({"ReadingUnits": "Cel"}, {"ReadingType": "Rotational"},
                                         {"ReadingType": "Power", "ReadingUnits": "W"}, {"ReadingType": "Voltage"},
                                         {"ReadingType": "Percent", "ReadingUnits": "%"}, {})]
    assert kinds == ["temperature", "fan", "power", None, None, None]


@pytest.mark.bmc
def test_the_agents_health_record_says_what_the_redfish_walk_found_and_what_a_sample_costs(bmc, tmp_path) -> None:
    from api.commands.agent import compose_agent
    from collector.agent_settings import AgentSettings

    settings = AgentSettings(node="gpu-node-001", sources="redfish", sink="stdout", health_file=None,
                             redfish_url=bmc["redfish_newer"], redfish_ca_file=Path(bmc["redfish_ca"]))
    agent = compose_agent(settings, once=True)
    try:
        assert agent.health()["redfish"]["walked_at"] is None
        agent.sources[0].sample(1000.0)
        assert agent.health()["redfish"] | {"requests_total": 0} == {
            "walked_at": 1000.0, "chassis": 2, "skipped_chassis": 0, "schema": ["newer"], "expand": False,
            "requests_per_sample": 7, "requests_total": 0}
    finally:
        agent.close()
