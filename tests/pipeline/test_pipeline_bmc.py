"""Node-level BMC features: SEL failure classes counted, inlet and fan margins, NaN without BMC data,
malformed BMC events rejected with a reason (live) or counted (replay), never a crash."""

from __future__ import annotations

import math

import numpy as np
import orjson
import pandas as pd

from collector.sources.bmc_common import sensor_event
from collector.wire import TOPIC_DEADLETTER, TOPIC_EVENTS, TOPIC_TELEMETRY
from pipeline.batch import FeatureBatch
from pipeline.bus import InProcessBus
from pipeline.settings import PipelineSettings
from pipeline.stream import FeaturePipeline
from tests.pipeline.synth import Fleet, event_messages, gpu_frame, telemetry_messages
from tests.pipeline.test_pipeline_bus import assert_same, consume_all

SETTINGS = PipelineSettings(cadence_s=60, bucket_s=60, short_window_s=60, long_window_s=600)
FLEET = Fleet(nodes=3, gpus=2, ports=0, samples=120, interval_s=10.0)  # 20 minutes
INLET = {"lower_critical": 0.0, "upper_noncritical": 40.0, "upper_critical": 45.0, "upper_fatal": 50.0}
FAN = {"lower_critical": 1000.0, "lower_noncritical": 1600.0}


def sel(dt: float, node: int, sensor: str, text: str, asserted: bool | None = True) -> dict:
    """A SEL event as IpmiSource.sel_event makes it."""
    return {"ts": FLEET.t0 + dt, "node": f"gpu-node-{node:03d}", "gpu": None, "source": "bmc", "kind": "sel",
            "code": 7, "pci_bus_id": None, "sel_id": 7, "sensor": sensor, "sensor_type": sensor.split(" #")[0],
            "event_text": text, "asserted": asserted, "message": f"   7 | ... | {sensor} | {text} | Asserted"}


def reading(dt: float, node: int, name: str, stype: str, value: float | None, thr: dict) -> dict:
    unit = {"temperature": "degrees C", "fan": "RPM"}.get(stype, "Watts")
    return sensor_event(f"gpu-node-{node:03d}", FLEET.t0 + dt, name, stype, value, unit, "ok", thr, "ipmi")


def features(events: list[dict]) -> pd.DataFrame:
    pipe = FeaturePipeline(SETTINGS)
    pipe.ingest_frames(gpu_frame(FLEET), None, pd.DataFrame(events))
    return pd.concat([b.to_frame() for b in pipe.flush()]).reset_index(drop=True)


def at(f: pd.DataFrame, minute: int, node: int) -> pd.Series:
    """The node's row (GPU 0) of the tick ending *minute* minutes after t0."""
    row = f[(f["ts"] == FLEET.t0 + 60 * minute) & (f["node"] == f"gpu-node-{node:03d}") & (f["gpu"] == 0)]
    return row.iloc[0]


def test_asserted_sel_entries_of_a_failure_class_are_counted_per_node_and_others_are_not():
    f = features([sel(65, 0, "Power Supply #0x01", "Failure detected"),
                  sel(70, 0, "Power Supply #0x01", "Failure detected", asserted=False),
                  sel(75, 0, "Fan FAN2", "Lower Critical going low"),  # SDR name after the type
                  sel(80, 0, "Fan #0x30", "Lower Non-critical going low"),  # benign: not a class
                  sel(130, 1, "Power Supply #0x02", "Predictive failure"),
                  sel(140, 1, "Temperature #0x01", "Upper Critical going high")])
    r = at(f, 2, 0)
    assert (r["node_bmc_psu_fail_count_short"], r["node_bmc_fan_fail_count_short"]) == (1, 1)
    assert r["node_bmc_psu_predictive_count_short"] == 0 and r["node_bmc_temp_critical_count_short"] == 0
    later = at(f, 6, 0)
    assert later["node_bmc_psu_fail_count_short"] == 0 and later["node_bmc_psu_fail_count_long"] == 1
    r1 = at(f, 3, 1)
    assert (r1["node_bmc_psu_predictive_count_short"], r1["node_bmc_temp_critical_count_short"]) == (1, 1)
    assert (f[f["gpu"] == 1]["node_bmc_psu_fail_count_long"].fillna(0) == f[f["gpu"] == 0][
        "node_bmc_psu_fail_count_long"].fillna(0).to_numpy()).all()  # node features: every GPU of the node


def foreign(dt: float, node: int, kind: str, message: str) -> dict:
    """A BMC event as another collector writes it: spec/telemetry.md §3's columns and nothing else."""
    return {"ts": FLEET.t0 + dt, "node": f"gpu-node-{node:03d}", "gpu": None, "source": "bmc", "kind": kind,
            "code": None, "pci_bus_id": None, "message": message}


def test_another_collectors_bmc_lines_count_by_their_raw_message_as_ours_count_by_their_fields():
    f = features([foreign(65, 0, "power", "PSU4 Status: Failure detected, redundancy lost"),
                  foreign(70, 0, "sel_line", "  1c | 03/01/2026 | 10:00:05 | Fan #0x30 | Lower Critical going low "
                                             "| Asserted"),
                  foreign(75, 0, "power", "PSU4 Status: Failure detected cleared"),   # a condition ending
                  foreign(80, 0, "power", "PSU2 presence detected"),                  # no class's event text
                  foreign(85, 0, "memory", "Failure detected on DIMM A1"),            # not a class's sensor
                  foreign(130, 1, "log", "Power Supply 1 Predictive failure")])
    r = at(f, 2, 0)
    assert (r["node_bmc_psu_fail_count_short"], r["node_bmc_fan_fail_count_short"]) == (1, 1)
    assert r["node_bmc_psu_predictive_count_short"] == 0
    assert at(f, 3, 1)["node_bmc_psu_predictive_count_short"] == 1
    assert math.isnan(at(f, 3, 2)["node_bmc_psu_fail_count_short"])  # node 2 has no BMC at all


def test_margins_are_the_worst_sensor_of_the_newest_reading_against_the_bmcs_own_thresholds():
    ev = [reading(10, 0, "Inlet Temp", "temperature", 24.0, INLET),
          reading(10, 0, "Exhaust Temp", "temperature", 60.0, INLET),  # not inlet air
          reading(10, 0, "FAN1", "fan", 7000.0, FAN), reading(10, 0, "FAN2", "fan", 6500.0, FAN),
          reading(70, 0, "Inlet Temp", "temperature", 44.0, INLET), reading(70, 0, "Intake 2", "temperature", 46.0, INLET),
          reading(70, 0, "FAN1", "fan", 900.0, FAN), reading(70, 0, "FAN2", "fan", None, FAN),
          reading(75, 0, "PSU1 Input Power", "power_supply", 3000.0, {"upper_critical": 4000.0})]
    f = features(ev)
    first, second = at(f, 1, 0), at(f, 2, 0)
    assert (first["node_bmc_inlet_margin_c"], first["node_bmc_fan_margin_rpm"]) == (21.0, 5500.0)
    assert (second["node_bmc_inlet_margin_c"], second["node_bmc_fan_margin_rpm"]) == (-1.0, -100.0)
    assert second["node_bmc_psu_fail_count_short"] == 0  # a node with a BMC: counts are 0, not unknown
    # the margins are kept while the BMC is quiet, and forgotten after a long window without readings
    assert at(f, 5, 0)["node_bmc_inlet_margin_c"] == -1.0
    assert math.isnan(at(f, 13, 0)["node_bmc_inlet_margin_c"])
    assert math.isnan(at(f, 13, 0)["node_bmc_psu_fail_count_short"])


def test_a_node_without_bmc_data_has_nan_bmc_features_never_zero():
    f = features([reading(10, 0, "Inlet Temp", "temperature", 24.0, INLET)])
    other = f[f["node"] == "gpu-node-002"]
    cols = [c for c in f.columns if c.startswith("node_bmc_")]
    assert len(cols) == 10 and other[cols].isna().all().all()
    mine = at(f, 1, 0)
    assert math.isnan(mine["node_bmc_fan_margin_rpm"]) and mine["node_bmc_fan_fail_count_short"] == 0


def test_no_bmc_events_at_all_leaves_every_bmc_feature_nan():
    f = features([])
    assert f[[c for c in f.columns if c.startswith("node_bmc_")]].isna().all().all()


def test_a_malformed_bmc_reading_is_counted_as_rejected_in_replay_and_the_rest_is_used():
    bad = reading(70, 0, "Inlet Temp", "temperature", 30.0, INLET) | {"value": "hot"}
    no_name = reading(70, 1, "Inlet Temp", "temperature", 30.0, INLET) | {"sensor": ["Inlet", "Temp"]}
    odd_sel = sel(75, 0, "Power Supply #0x01", "Failure detected") | {"asserted": "yes"}
    pipe = FeaturePipeline(SETTINGS)
    good = [reading(10, 0, "Inlet Temp", "temperature", 24.0, INLET)]
    pipe.ingest_frames(gpu_frame(FLEET), None, pd.DataFrame(good + [bad, no_name, odd_sel]))
    f = pd.concat([b.to_frame() for b in pipe.flush()])
    assert pipe.counts.rejected_rows == 3
    assert at(f, 2, 0)["node_bmc_psu_fail_count_short"] == 0
    assert at(f, 2, 0)["node_bmc_inlet_margin_c"] == 21.0  # the bad reading changed nothing


def _bus_events(events: list[dict]) -> list[tuple[str, bytes]]:
    return event_messages(pd.DataFrame(events))


def test_a_malformed_bmc_event_is_dead_lettered_live_with_the_reason_and_the_rest_equals_replay():
    g = gpu_frame(FLEET)
    good = [reading(10 + 60 * k, n, "Inlet Temp", "temperature", 24.0 + k, INLET) for k in range(5) for n in range(2)]
    good += [sel(200, 1, "Fan #0x31", "Lower Critical going low")]
    bad = [reading(70, 0, "Inlet Temp", "temperature", 30.0, INLET) | {"value": "hot"},
           reading(70, 0, "FAN1", "fan", 900.0, FAN) | {"lower_critical": [1000]},
           sel(75, 0, "Power Supply #0x01", "Failure detected") | {"asserted": "yes"}]
    bus = InProcessBus(partitions=2)
    msgs = telemetry_messages(g, None, FLEET.interval_s)
    for node, raw in msgs:
        bus.produce(TOPIC_TELEMETRY, node, raw)
    for node, raw in _bus_events(good) + [(e["node"], orjson.dumps({"schema": "gpuops.event", "v": 1, **e}))
                                          for e in bad]:
        bus.produce(TOPIC_EVENTS, node, raw)
    worker, got = consume_all(bus, len(msgs) + len(good) + len(bad))
    reasons = [orjson.loads(m.value)["reason"] for m in bus.messages(TOPIC_DEADLETTER)]
    assert worker.deadlettered == 3
    assert any("field 'value' must be a finite number or null, got 'hot'" in r for r in reasons)
    assert any("field 'lower_critical'" in r for r in reasons)
    assert any("field 'asserted' must be true, false or null" in r for r in reasons)
    pipe = FeaturePipeline(SETTINGS)
    pipe.ingest_frames(g, None, pd.DataFrame(good))
    want: list[FeatureBatch] = pipe.flush()
    assert_same(got, want)
    assert at(pd.concat([b.to_frame() for b in got]), 4, 1)["node_bmc_fan_fail_count_short"] == 1


def test_the_bmc_state_stays_small_and_bounded():
    pipe = FeaturePipeline(SETTINGS)
    before = pipe.state_bytes
    pipe.ingest_frames(gpu_frame(FLEET), None, pd.DataFrame(
        [reading(10 + 60 * k, 0, "Inlet Temp", "temperature", 24.0, INLET) for k in range(20)]))
    pipe.flush()
    assert pipe.state_bytes == before
    assert np.isfinite(pipe.node_bmc.margin[0, 0])
