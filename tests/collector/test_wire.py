"""The Kafka wire format: round trips, NaN as null, and envelope errors as dead-letter reasons."""

from __future__ import annotations

import math

import orjson
import pytest

from collector.wire import (
    TelemetryMessage,
    WireError,
    columns_to_rows,
    decode_event,
    decode_telemetry,
    encode_deadletter,
    encode_event,
    encode_telemetry,
    rows_to_columns,
)


def test_telemetry_message_round_trips_with_nan_as_null():
    rows = [{"ts": 5.0, "node": "n1", "gpu": i, "util_gpu": float("nan") if i else 90.0} for i in range(3)]
    msg = TelemetryMessage(node="n1", ts=5.0, gpu=rows_to_columns(rows))
    back = decode_telemetry(encode_telemetry(msg))
    assert back.node == "n1" and back.n_gpu == 3
    assert back.gpu["util_gpu"] == [90.0, None, None]
    assert columns_to_rows(back.gpu, node="n1")[0] == {"ts": 5.0, "gpu": 0, "util_gpu": 90.0, "node": "n1"}


@pytest.mark.parametrize(
    "body, reason",
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "not an object"),
        ({"schema": "other"}, "schema is 'other'"),
        ({"v": 99}, "unsupported schema version 99"),
        ({"node": "bad node"}, "malformed node name"),
        ({"ts": None}, "non-finite or missing timestamp"),
        ({"gpu": {"gpu": [0, 1], "util_gpu": [1.0]}}, "different lengths"),
    ],
)
def test_bad_telemetry_message_raises_with_a_reason(body, reason):
    if isinstance(body, dict):
        base = {"schema": "gpuops.telemetry", "v": 1, "node": "n1", "ts": 1.0, "gpu": {}, "net": {}}
        body = orjson.dumps(base | body)
    with pytest.raises(WireError, match=reason):
        decode_telemetry(body)


def test_event_round_trips_and_deadletter_keeps_payload_and_reason():
    ev = {"type": "event", "ts": 1.0, "node": "n1", "gpu": None, "source": "kmsg", "kind": "xid", "code": 79,
          "message": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."}
    back = decode_event(encode_event(ev))
    assert back["code"] == 79 and "type" not in back and back["message"] == ev["message"]
    dl = orjson.loads(encode_deadletter("bad node", b"\x00raw", topic="gpu.telemetry", partition=2, offset=7))
    assert dl["reason"] == "bad node" and dl["offset"] == 7 and dl["payload"].endswith("raw")
    assert not math.isnan(back["ts"])
