"""The Arrow telemetry wire format: round trips, the header picks the decoder, bad input says why."""

from __future__ import annotations

import math
import struct

import pytest

from collector.wire import (
    ARROW_MAGIC,
    TelemetryMessage,
    WireError,
    decode_telemetry,
    encode_telemetry,
    encode_telemetry_arrow,
    encode_telemetry_as,
    is_arrow,
)


def message() -> TelemetryMessage:
    return TelemetryMessage(
        node="gpu-node-007", ts=1767225610.5,
        gpu={"ts": [1767225610.0, 1767225610.0], "gpu": [0, 1], "pci_bus_id": ["0000:17:00.0", None],
             "util_gpu": [97.0, None], "temp_gpu_c": [61.0, 63.5], "ecc_sbe_volatile": [3, 4]},
        net={"device": ["mlx5_0"], "port": [1], "link_state": ["ACTIVE"], "symbol_error": [0]})


GPU_AT = 4 + 19 + len("gpu-node-007")  # magic, fixed header, node name: the gpu stream starts here


def same(a: TelemetryMessage, b: TelemetryMessage) -> None:
    assert (a.node, a.ts, a.v) == (b.node, b.ts, b.v)
    for x, y in ((a.gpu, b.gpu), (a.net, b.net)):
        assert list(x) == list(y)
        for k in x:
            norm = [None if isinstance(v, float) and math.isnan(v) else v for v in x[k]]
            assert norm == [None if isinstance(v, float) and math.isnan(v) else v for v in y[k]], k


@pytest.mark.parametrize("fmt", ["json", "arrow"])
def test_a_telemetry_message_survives_the_round_trip_in_each_wire_format(fmt: str) -> None:
    raw = encode_telemetry_as(message(), fmt)
    assert is_arrow(raw) is (fmt == "arrow")
    same(decode_telemetry(raw), message())


def test_nan_travels_as_nan_in_arrow_and_as_null_in_json() -> None:
    m = message()
    m.gpu["temp_gpu_c"] = [float("nan"), 60.0]
    assert decode_telemetry(encode_telemetry(m)).gpu["temp_gpu_c"][0] is None
    assert math.isnan(decode_telemetry(encode_telemetry_arrow(m)).gpu["temp_gpu_c"][0])


def test_a_message_with_only_port_samples_round_trips_in_arrow() -> None:
    m = TelemetryMessage(node="n1", ts=5.0, net={"device": ["mlx5_0"], "port": [1], "symbol_error": [2]})
    same(decode_telemetry(encode_telemetry_arrow(m)), m)


def test_an_unknown_wire_format_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="json, arrow"):
        encode_telemetry_as(message(), "xml")


@pytest.mark.parametrize("mutate, why", [
    (lambda r: r[:-3], "header says"),
    (lambda r: r[:4] + struct.pack("<B", 9) + r[5:], "unsupported schema version 9"),
    (lambda r: r[:GPU_AT] + b"\x07" * 12 + r[GPU_AT + 12:], "'gpu' is not a readable Arrow IPC stream"),
    (lambda r: ARROW_MAGIC + b"\x01", "not an Arrow telemetry message"),
])
def test_a_broken_arrow_message_is_refused_with_its_reason(mutate, why: str) -> None:
    with pytest.raises(WireError, match=why):
        decode_telemetry(mutate(encode_telemetry_arrow(message())))


def test_a_malformed_node_name_in_an_arrow_message_is_refused() -> None:
    m = message()
    m.node = "bad node!"
    with pytest.raises(WireError, match="malformed node name"):
        decode_telemetry(encode_telemetry_arrow(m))


def test_the_agent_sends_arrow_when_configured_and_json_by_default() -> None:
    from collector.agent import Agent
    from collector.agent_settings import AgentSettings
    from collector.sources.base import SourceBatch

    batch = SourceBatch(gpu=[{"ts": 1.0, "node": "n1", "gpu": 0, "util_gpu": 50.0}])
    for fmt in ("json", "arrow"):
        settings = AgentSettings(node="n1", sink="stdout", health_file=None, **({"wire_format": fmt} if fmt != "json" else {}))
        agent = Agent(settings, [], sink=None)
        (out,) = agent.encode(batch, now=1.0)
        assert is_arrow(out.value) is (fmt == "arrow")
        assert decode_telemetry(out.value).gpu["util_gpu"] == [50.0]
